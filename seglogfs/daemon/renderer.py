"""The daemon's side of the render process (``seglogfs.daemon.render_process``).

``Renderer`` starts the process, shares an arena of ``SLOTS`` slots of ``SLOT_BYTES``
with it (an anonymous ``memfd``, mapped by both), and turns fill requests into awaitable
results on the daemon's trio loop: one task (``run``) receives every answer, so a
request costs no thread. An open file that reads sequentially holds ``SLOTS_PER_FILE``
slots and has the process render into one while the daemon replies from another
(``seglogfs.daemon``).

Slot ownership is what keeps replies correct: the process writes a slot only while a
fill the daemon sent is outstanding, and the daemon sends a fill into a slot only when
no byte of it can still be returned (``PositionReader.release_slot``). A reply is a
``memoryview`` of the arena that pyfuse3 copies before the next request runs.

If the process dies or cannot start, every fill answers ``None`` and the daemon renders
in its own threads as before: slower, never wrong. Not thread-safe: used on the trio
thread only.
"""

from __future__ import annotations

import itertools
import logging
import mmap
import os
import pickle
import socket
import subprocess
import sys
import weakref
from pathlib import Path
from typing import Any

import trio

from storage.log.segment import LogSegment

from ..positions import Rendering
from .render_process import FillRequest, FillResult

__all__ = ["SLOTS", "SLOTS_PER_FILE", "SLOT_BYTES", "Renderer"]

logger = logging.getLogger(__name__)

SLOT_BYTES = 8 << 20
"""Bytes a fill renders at most: eight 1 MiB replies, a millisecond or two of
rendering, so the request's round trip (the daemon's loop noticing the answer, the
process waking for the next request) is a small part of it. Measured on 4 KiB records:
``dd bs=1M`` 3.6-4.0 GB/s with 4 MiB slots, 4.0-4.5 GB/s with 8 MiB."""

SLOTS_PER_FILE = 3
"""Slots an open file streams through: while the reader is in one, the two after it are
rendered or being rendered, so the render process rarely waits for the reader to move
on (with two, it idled while the reader finished the older slot)."""

SLOTS = 4 * SLOTS_PER_FILE
"""Slots of the arena (96 MiB of shared memory, touched only as used): four open files
stream at once; others render in the daemon's threads, as without the process."""

_FRAME_BYTES = 4


class Renderer:
    """A running render process and its arena. See the module docstring."""

    def __init__(
        self, process: subprocess.Popen[bytes], sock: socket.socket, arena: mmap.mmap
    ) -> None:
        self._process = process
        self._sock = trio.socket.from_stdlib_socket(sock)
        self._arena = arena
        self._view = memoryview(arena)
        self._free = list(range(len(arena) // SLOT_BYTES))
        self._pending: dict[int, tuple[trio.Event, list[FillResult | str | None]]] = {}
        self._ids = itertools.count(1)
        self._send_lock = trio.StrictFIFOLock()
        self._tokens: weakref.WeakKeyDictionary[LogSegment, int] = weakref.WeakKeyDictionary()
        self._next_token = itertools.count(1)
        self._closing = False
        self.alive = True
        # Fills sent; those answered with bytes, and the bytes (for tests and --debug).
        self.requests = 0
        self.fills = 0
        self.filled_bytes = 0

    @classmethod
    def start(cls, slots: int = SLOTS) -> Renderer:
        """Start the process (inside ``trio.run``).

        Raises:
            OSError: the arena or the process could not be made.
        """
        size = slots * SLOT_BYTES
        fd = os.memfd_create("seglogfs-render", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, size)
            arena = mmap.mmap(fd, size)
            ours, theirs = socket.socketpair()
            with theirs:
                process = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "seglogfs.daemon.render_process",
                        str(theirs.fileno()),
                        str(fd),
                        str(size),
                    ],
                    pass_fds=(theirs.fileno(), fd),
                    stdin=subprocess.DEVNULL,
                    cwd="/",
                    env=_child_environment(),
                )
        finally:
            os.close(fd)
        logger.debug("render process %d started, %d slots", process.pid, slots)
        return cls(process, ours, arena)

    async def run(self) -> None:
        """Receive the process's answers until it exits (a task of the daemon's nursery).

        Never raises but ``Cancelled``: a dead process only means reads render in the
        daemon again.
        """
        try:
            while True:
                message = await self._receive()
                if message is None:
                    break
                request_id, result = message
                waiter = self._pending.pop(request_id, None)
                if waiter is not None:
                    waiter[1].append(result)
                    waiter[0].set()
        except trio.ClosedResourceError:
            pass  # close(): the daemon is stopping
        except (OSError, pickle.UnpicklingError, ValueError, TypeError) as exc:
            logger.warning("render process: %s", exc)
        finally:
            self._stop_serving()

    def _stop_serving(self) -> None:
        if self.alive:
            self.alive = False
            code = self._process.poll()
            if not self._closing:
                logger.warning(
                    "render process ended%s: partitions render in the daemon's threads",
                    "" if code is None else f" (exit code {code})",
                )
        for event, result in self._pending.values():
            result.append(None)
            event.set()
        self._pending.clear()

    # -- slots -----------------------------------------------------------------------

    def allocate(self) -> int | None:
        """A free slot, or ``None`` when all are taken (or the process is gone)."""
        if not self.alive or not self._free:
            return None
        return self._free.pop()

    def free(self, slot: int) -> None:
        """Give back a slot no fill is outstanding for and no kept chunk refers to."""
        self._free.append(slot)

    def bytes_of(self, slot: int, length: int) -> memoryview:
        """The first ``length`` bytes of ``slot``, as the last fill into it left them."""
        start = slot * SLOT_BYTES
        return self._view[start : start + length]

    # -- fills -----------------------------------------------------------------------

    async def fill(
        self,
        slot: int,
        segment: LogSegment,
        position: int,
        end: int,
        next_offset: int,
        skip: int,
        capacity: int,
        rendering: Rendering,
    ) -> FillResult | None:
        """Render into ``slot`` (see ``FillRequest``); ``None`` when the process failed
        (the reason logged at DEBUG) or is gone. The slot is the process's until this
        returns, also when the caller is cancelled meanwhile: do not free it then.
        """
        if not self.alive:
            return None
        token = self._tokens.get(segment)
        if token is None:
            token = self._tokens[segment] = next(self._next_token)
        request = FillRequest(
            next(self._ids),
            str(segment.path),
            token,
            position,
            end,
            next_offset,
            skip,
            slot * SLOT_BYTES,
            min(capacity, SLOT_BYTES),
            rendering.raw,
            rendering.key_separator,
            # The daemon's own segments end at a batch end; a read-only mount's view
            # of one another process appends to may end inside the batch in flight.
            end_is_final=segment.log.writable,
            json_of=rendering.json_of,
        )
        self.requests += 1
        event = trio.Event()
        result: list[FillResult | str | None] = []
        self._pending[request.request_id] = (event, result)
        payload = pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            async with self._send_lock:
                await self._send_all(len(payload).to_bytes(_FRAME_BYTES, "little") + payload)
        except (OSError, trio.ClosedResourceError) as exc:
            logger.debug("render process: %s", exc)
            self._pending.pop(request.request_id, None)
            self._stop_serving()
            return None
        with trio.CancelScope(shield=True):
            # The process writes the slot until it answers: wait for it even when the
            # reader is gone, so the slot is never handed out while being written.
            await event.wait()
        answer = result[0] if result else None
        if isinstance(answer, str):
            logger.debug("render process: %s", answer)
            return None
        if answer is not None:
            self.fills += 1
            self.filled_bytes += answer.written
        return answer

    def owns(self, data: object) -> bool:
        """Whether ``data`` is a view of the arena (a reply served without a copy)."""
        return isinstance(data, memoryview) and data.obj is self._arena

    async def _send_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            sent = await self._sock.send(view)
            view = view[sent:]

    async def _receive(self) -> Any:
        header = await self._receive_exactly(_FRAME_BYTES)
        if header is None:
            return None
        payload = await self._receive_exactly(int.from_bytes(header, "little"))
        if payload is None:
            return None
        return pickle.loads(payload)

    async def _receive_exactly(self, size: int) -> bytes | None:
        parts = []
        while size:
            part = await self._sock.recv(size)
            if not part:
                return None
            parts.append(part)
            size -= len(part)
        return b"".join(parts)

    def close(self) -> None:
        """Stop the process (it exits when its socket closes) and wait for it."""
        self._closing = True
        self._sock.close()
        try:
            self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        # The arena stays mapped while replies may still refer to it; the mapping goes
        # with the daemon.


def _child_environment() -> dict[str, str]:
    # The child imports seglogfs from where this process did (an editable install, a
    # checkout on PYTHONPATH).
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[1])
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = root if not path else f"{root}{os.pathsep}{path}"
    return env

"""The render process: renders partition bytes into memory the daemon shares.

The daemon answers a sequential reader's requests from bytes rendered ahead. Rendered in
a thread of the daemon, they cost as much as the replies themselves: the daemon's event
loop holds the GIL while libfuse copies a reply into the reader's buffer (pyfuse3 does
not release it), so rendering and replying take turns on one core. Rendered here, in a
process of its own, they are made on the other core while the daemon replies, and the
daemon replies straight from the shared memory (a ``memoryview``, no copy).

A request names a segment file, where to start in it, how far the daemon knows it to be
complete, and a slot of the shared arena; ``fill`` renders whole batches from there into
the slot, cutting the last one when the slot is full, and says where to go on. The
process knows nothing of logs or indexes: the daemon, which owns the engine, tells it
exactly which bytes of which file to render, and bounds every read by the size it has
committed (a batch being appended is never read). Segment files are append-only while
the daemon runs (recovery truncates only before it starts), so the bytes at a file
position never change; a file that retention renames or deletes stays readable through
the descriptor kept open here, with the same bytes.

Protocol (``seglogfs.daemon.renderer`` is the other side): length-prefixed pickles over a
socket pair, one ``FillRequest`` in, one ``(request_id, FillResult | str)`` out (a
string is an error: the daemon then renders those bytes itself). The process ignores
SIGINT and SIGHUP (a terminal's Ctrl-C or hangup is for the daemon, which stops it) and
exits when the daemon closes the socket.

Run as ``python -m seglogfs.daemon.render_process SOCKET_FD ARENA_FD ARENA_BYTES``.
"""

from __future__ import annotations

import mmap
import os
import pickle
import signal
import socket
import struct
import sys
from collections import OrderedDict
from collections.abc import Sequence
from typing import NamedTuple

from storage import CompressionType, CorruptRecordError
from storage.log.segment import gap_disproved
from storage.record.json_format import render_json_data
from storage.record.record_batch import (
    HEADER_SIZE_UP_TO_MAGIC,
    MAGIC_V2,
    RecordBatch,
    batch_size_at,
    iter_batches,
    read_batch,
)
from storage.record.render import render_batch

from .malloc_tuning import tune_malloc

__all__ = ["FillRequest", "FillResult", "SegmentFiles", "fill", "main", "receive", "send"]

READ_BYTES = 2 << 20
"""Bytes of a segment file read at a time (a batch larger than this is read whole). A
read ends inside a batch, which the next read takes again: with 2 MiB rather than 1 MiB
less is read twice (fills of 4 KiB records 4.8 -> 5.2 GB/s in one process; 4 MiB reads
leave the CPU's cache and gain nothing more)."""

MAX_OPEN_FILES = 64
"""Segment descriptors kept open (least recently used closed first)."""

_FRAME = struct.Struct("<I")


class FillRequest(NamedTuple):
    """Render the batches of segment file ``path`` from file position ``position`` (the
    batch holding ``next_offset``, of which the first ``skip`` rendered bytes are already
    the daemon's) up to ``end`` (bytes the daemon knows complete), into
    ``arena[slot_start:slot_start + capacity]``. ``token`` tells apart two files that
    had the same path (a topic deleted and created again). ``end_is_final``: ``end`` is
    the end of a batch (the daemon writes the log), so a batch running past it is
    damage; else (a read-only mount's view of a segment another process appends to) the
    fill just stops before it."""

    request_id: int
    path: str
    token: int
    position: int
    end: int
    next_offset: int
    skip: int
    slot_start: int
    capacity: int
    raw: bool
    key_separator: bytes | None
    end_is_final: bool = True
    json_of: tuple[str, int] | None = None
    """``(topic, partition)`` of a ``json`` topic (which renders them in every record);
    ``raw`` and ``key_separator`` then do not apply."""


class FillResult(NamedTuple):
    """``written`` bytes rendered into the slot; go on at ``position`` (the batch holding
    ``next_offset``), ``skip`` of its rendered bytes already written."""

    written: int
    next_offset: int
    position: int
    skip: int


class SegmentFiles:
    """Open segment descriptors by ``(path, token)``, the least recently used closed
    past ``MAX_OPEN_FILES``. Not thread-safe (the render process has one thread)."""

    def __init__(self) -> None:
        self._fds: OrderedDict[tuple[str, int], int] = OrderedDict()

    def fd(self, path: str, token: int) -> int:
        key = (path, token)
        fd = self._fds.get(key)
        if fd is None:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            self._fds[key] = fd
            if len(self._fds) > MAX_OPEN_FILES:
                _key, oldest = self._fds.popitem(last=False)
                os.close(oldest)
        else:
            self._fds.move_to_end(key)
        return fd

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


def fill(files: SegmentFiles, request: FillRequest, arena: memoryview) -> FillResult:
    """Render ``request`` into its slot of ``arena``; see ``FillRequest``.

    Cost: O(bytes): one ``pread`` per MiB, the CRC and one rendering per batch, one copy
    into the slot.

    Every batch's offsets must go on from the ones before (``next_offset``): a base
    offset lies outside the CRC, and a flipped bit there would serve the batch's records
    under offsets they never had (a ``json`` topic prints them; every other format loses
    their place). A batch after a gap of offsets (compaction's) is rendered only when
    the batch after it in the same read does not disprove the gap (``gap_disproved``,
    as the daemon's own read, ``Log.batches``, judges it); any other batch whose offsets
    do not follow ends the fill before it, or, as the first, makes it render nothing:
    the daemon's own read renders those bytes, and reports the damage if there is any.

    Raises:
        CorruptRecordError: the first batch fails its CRC, does not parse or runs past
            a final ``end``, or the batch at ``position`` is not the one holding
            ``next_offset`` (the daemon's view and the file disagree, or its base
            offset is damaged downwards). A bad batch after good ones ends the fill
            early instead: the next fill begins with it and raises (or renders
            nothing).
        OSError: the file cannot be opened or read.
    """
    out = arena[request.slot_start : request.slot_start + request.capacity]
    fd = files.fd(request.path, request.token)
    capacity = request.capacity
    written = 0
    position = request.position
    next_offset = request.next_offset
    skip = request.skip
    first = True
    while written < capacity and request.end - position > 0:
        try:
            batches = _batches(fd, position, request.end, request.end_is_final)
        except CorruptRecordError:
            if written == 0:
                raise
            break  # the bytes before it are good: the next fill starts there and fails
        if not batches:
            break  # no further complete batch below `end`
        for n, batch in enumerate(batches):
            after = batches[n + 1] if n + 1 < len(batches) else None
            if first:
                first = False
                # The batch holding next_offset, which begins there (the daemon's view
                # and the file agree); with nothing of it taken yet, a later one after
                # a gap also fits (offsets a compacted log no longer has) when nothing
                # disproves the gap.
                if skip:
                    # The one the fill before cut: its rest.
                    wrong = batch.base_offset != next_offset
                else:
                    wrong = batch.last_offset < next_offset or (
                        batch.magic >= MAGIC_V2 and batch.base_offset < next_offset
                    )
                if wrong:
                    raise CorruptRecordError(
                        f"the batch at {position} holds offsets {batch.base_offset}.."
                        f"{batch.last_offset}, not {next_offset}",
                        position=position,
                    )
                if not skip and not _follows(batch, next_offset, after):
                    return FillResult(0, next_offset, position, skip)  # the daemon judges
            elif not _follows(batch, next_offset, after):
                # Not the offsets after the ones served: the next fill begins with it
                # (and renders nothing), so the daemon's own read judges it.
                return FillResult(written, next_offset, position, skip)
            if not batch.is_valid():
                if written:
                    # Serve what came before, as the daemon's own read does; the next
                    # fill starts at this batch and reports it.
                    return FillResult(written, next_offset, position, skip)
                raise CorruptRecordError("CRC mismatch", position=batch.position)
            if request.json_of is not None:
                data = memoryview(render_json_data(batch, *request.json_of))[skip:]
            else:
                rendered = render_batch(batch, raw=request.raw, key_separator=request.key_separator)
                data = memoryview(rendered.data)[skip:]
            take = min(len(data), capacity - written)
            out[written : written + take] = data[:take]
            written += take
            if take < len(data):
                # The slot is full inside this batch: the next fill renders it again
                # and skips what this one took.
                return FillResult(written, batch.base_offset, batch.position, skip + take)
            skip = 0
            next_offset = batch.next_offset
            position = batch.position + batch.size
            if written == capacity:
                break
    return FillResult(written, next_offset, position, skip)


def _follows(batch: RecordBatch, next_offset: int, after: RecordBatch | None) -> bool:
    # Whether ``batch`` may come right after the offsets before ``next_offset``. A v2
    # batch begins at ``next_offset``, or past it after a gap that ``after`` (the next
    # batch of the same read; None: not known) does not disprove. A legacy entry is
    # known by its last offset (its own, outside the CRC; a v0 wrapper's inner offsets
    # may be relative, as kafka-python writes them): one message at ``next_offset``, a
    # compressed wrapper's last within as many offsets as it holds messages. Anything
    # else (a legacy entry after a gap, a gap with no batch after it in this read) is
    # left to the daemon's read (``Log.batches``), which judges it.
    # Cost: a few header fields (a legacy wrapper is decompressed once: its rendering
    # uses the same records).
    if batch.magic < MAGIC_V2:
        last = batch.last_offset
        try:
            if batch.codec is CompressionType.NONE:
                return last == next_offset
            return next_offset <= last < next_offset + len(batch.records())
        except CorruptRecordError:
            return False  # does not decode: the daemon's read reports it
    base = batch.base_offset
    if base == next_offset:
        return True
    if base < next_offset or after is None:
        return False
    return gap_disproved(batch, next_offset - 1, after, None) is None


def _batches(fd: int, position: int, end: int, end_is_final: bool) -> list[RecordBatch]:
    # The complete batches of one read at ``position`` (at least one unless the file
    # holds no complete batch below ``end`` there: then damage when ``end`` is final).
    chunk = os.pread(fd, min(READ_BYTES, end - position), position)
    batches = list(iter_batches(chunk, position))
    if batches:
        return batches
    if len(chunk) >= HEADER_SIZE_UP_TO_MAGIC:
        size, _magic = batch_size_at(chunk, 0)
        if position + size <= end:
            data = os.pread(fd, size, position)
            if len(data) == size:
                return [read_batch(data, 0, position)]
        elif end_is_final:
            raise CorruptRecordError(
                f"a batch of {size} bytes runs past the end of the segment at byte {end}",
                position=position,
            )
    elif end_is_final and chunk and position + len(chunk) == end:
        raise CorruptRecordError(
            f"{len(chunk)} bytes at the end of the segment, fewer than a batch header",
            position=position,
        )
    return batches


def send(sock: socket.socket, message: object) -> None:
    """Send one length-prefixed pickle (blocking)."""
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(_FRAME.pack(len(payload)) + payload)


def receive(sock: socket.socket) -> object | None:
    """Receive one message (blocking); ``None`` when the other side closed."""
    header = _receive_exactly(sock, _FRAME.size)
    if header is None:
        return None
    (length,) = _FRAME.unpack(header)
    payload = _receive_exactly(sock, length)
    if payload is None:
        return None
    message: object = pickle.loads(payload)
    return message


def _receive_exactly(sock: socket.socket, size: int) -> bytes | None:
    parts = []
    while size:
        part = sock.recv(size)
        if not part:
            return None
        parts.append(part)
        size -= len(part)
    return b"".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    sock_fd, arena_fd, arena_bytes = (int(arg) for arg in args)
    # A terminal's Ctrl-C or hangup reaches the whole process group: they are the
    # daemon's to handle; this process ends when the daemon closes the socket.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    tune_malloc()  # one 1 MiB read buffer and rendering after another, as the daemon
    sock = socket.socket(fileno=sock_fd)
    arena = mmap.mmap(arena_fd, arena_bytes)
    view = memoryview(arena)
    files = SegmentFiles()
    try:
        while True:
            request = receive(sock)
            if request is None:
                return 0
            assert isinstance(request, FillRequest)
            result: FillResult | str
            try:
                result = fill(files, request, view)
            except Exception as exc:  # the daemon renders these bytes itself
                result = f"{type(exc).__name__}: {exc}"
            send(sock, (request.request_id, result))
    except (BrokenPipeError, ConnectionResetError):
        return 0
    finally:
        files.close()


if __name__ == "__main__":
    # Run the module's own copy, not __main__'s: the requests unpickle as
    # seglogfs.daemon.render_process.FillRequest.
    from seglogfs.daemon.render_process import main as _main

    sys.exit(_main())

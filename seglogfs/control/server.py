"""The control socket's server: the daemon answers the command line's requests.

Binds ``LOGDIR/.seglog.sock``, serves each connection in its own task of the daemon's
nursery and runs every engine call through the daemon's ``run_sync`` bridge, so a
request never blocks the event loop. The wire format is ``seglogfs.control.protocol``.

What a client can make the server hold is bounded (``seglogfs.control.config``, with
Kafka's names, as Kafka's ``SocketServer`` bounds a broker's sockets):

- descriptors: at most ``max.connections`` connections; at the limit the server stops
  accepting (new connections wait in the listen backlog, as Kafka's acceptor waits for
  a slot) and, when one is waiting, closes the connection idle longest (at least a
  second); it also stops accepting while fewer than ``control.reserved.fds``
  descriptors are free, so that ``cat`` and ``mkdir`` on the mount, appends and
  checkpoints always find one, and an ``accept`` that fails for want of descriptors
  (``EMFILE``) is retried a second later without a traceback;
- time: a connection waiting ``connections.max.idle.ms`` for a frame is closed, and so
  is one whose frame (or reply) is not complete ``control.frame.timeout.ms`` after its
  first byte (a client that sent 3 bytes and went silent held its descriptor forever);
- memory: a frame declaring more than ``socket.request.max.bytes`` is answered with a
  ``ProtocolError`` and closed before any of it is read (a frame could declare 2 GiB
  and was buffered whole); frames being read or served hold at most
  ``queued.max.request.bytes`` together (a frame that does not fit waits, unread, as
  Kafka's memory pool mutes a channel); a compressed produce payload inflates to at
  most the topic's ``max.message.bytes``; after a frame of ``RELEASE_AFTER_BYTES`` or
  more the heaps' free pages are given back (``release_memory``);
- work: at most ``REQUESTS_AT_ONCE`` requests run in the bridge's worker threads at a
  time, so the mount's reads and writes always have threads left.

Each condition is logged on one line at most once a minute (``_Throttled``), with the
count of those not logged; none of them logs a traceback. A request that raises
anything but the engine's, the protocol's or an OS error is a bug: it is answered with
``InternalError`` and logged with its traceback.

Thread-safety: the server and its handlers run on the trio thread; the engine calls
they hand to worker threads are thread-safe (one sticky partitioner per topic, under
its own lock).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import resource
import socket
import stat
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from time import perf_counter
from typing import Any, Final

import trio

from storage import LogManager, OffsetStore, StickyPartitioner, StorageError

from ..byte_budget import ByteBudget
from ..daemon import metrics
from ..producer import append_records
from . import admin
from .config import ControlConfig
from .protocol import (
    FRAME,
    ControlError,
    check_lengths,
    decode_records,
    delete_records,
    describe_result,
    error_header,
    frame,
    group_result,
    parse_header,
    parse_partition_offsets,
    parse_request,
    socket_address,
    socket_path,
)

__all__ = ["RELEASE_AFTER_BYTES", "REQUESTS_AT_ONCE", "SOCKET_BIND_MODE", "SOCKET_MODE", "serve"]

logger = logging.getLogger(__name__)

SOCKET_MODE: Final = 0o660
"""The control socket's mode: the daemon's user and group (operators) may write
through the daemon; others cannot connect (nor enter a 0750 log directory)."""
SOCKET_BIND_MODE: Final = 0o600
"""The mode the socket file is born with, before ``SOCKET_MODE`` is set."""
REQUESTS_AT_ONCE: Final = 4
"""Requests of all connections running engine calls at once (the bridge has 16 threads,
shared with the mount)."""
RELEASE_AFTER_BYTES: Final = 16 << 20
"""A frame at least this large is followed by ``release_memory`` once no other such
frame is being served."""
LOG_INTERVAL_S: Final = 60.0
"""Each condition is logged at most once per interval."""
_EVICT_IDLE_S = 1.0  # a client sends its frame right after connecting: never evicted
_RETRY_S = 1.0  # accept again after EMFILE, or look at free descriptors again
_LISTEN_BACKLOG = 64
_CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_GONE_ERRNOS = frozenset({errno.ECONNABORTED, errno.EPROTO, errno.EAGAIN})


class _Handlers:
    """The ops: each runs one engine call in a worker thread through ``run_sync``; the
    arguments were checked against ``protocol.OPS``."""

    def __init__(self, manager: LogManager, run_sync: Callable[..., Awaitable[object]]) -> None:
        self.manager = manager
        self.run_sync = run_sync
        self._partitioners: dict[str, tuple[StickyPartitioner, threading.Lock]] = {}
        self._partitioners_lock = threading.Lock()

    async def call(self, op: str, args: dict[str, Any], payload: bytes) -> object:
        manager = self.manager
        if op == "ping":
            return "pong"
        if op == "list_topics":
            return await self.run_sync(manager.topics)
        if op == "create_topic":
            name = args["name"]
            partitions = args["partitions"]
            config = args["config"] or {}
            fmt = args["format"] or None  # None: the daemon's default_format
            separator = args["key_separator"]

            def create() -> object:
                admin.create_topic(
                    manager, name, partitions, config, format=fmt, key_separator=separator
                )
                return describe_result(manager.describe_topic(name))

            return await self.run_sync(create)
        if op == "alter_topic":
            name = args["name"]
            to_set = args["set"] or {}
            to_delete = args["delete"] or []

            def alter() -> object:
                admin.alter_topic_config(manager, name, to_set, to_delete)
                return dict(sorted(manager.topic(name).overrides.items()))

            return await self.run_sync(alter)
        if op == "add_partitions":
            name, count = args["name"], args["partitions"]

            def add() -> object:
                return manager.add_partitions(name, count).partitions

            # The sticky partitioner of the topic follows the new count by itself
            # (``_produce`` replaces it when the count differs).
            return await self.run_sync(add)
        if op == "delete_topic":
            name = args["name"]
            await self.run_sync(manager.delete_topic, name)
            with self._partitioners_lock:
                self._partitioners.pop(name, None)
            return None
        if op == "describe_topic":
            name = args["name"]
            return await self.run_sync(lambda: describe_result(manager.describe_topic(name)))
        if op == "produce":
            return await self.run_sync(self._produce, args["topic"], args["partition"], payload)
        if op == "delete_records":
            try:
                partitions = parse_partition_offsets(args["partitions"])
            except ValueError as exc:
                raise ControlError("ProtocolError", str(exc)) from None
            return await self.run_sync(delete_records, manager, partitions)
        if op == "compact":
            # A worker thread for as long as the passes take; it waits first for a
            # background pass in progress (admin.CLEANING).
            return await self.run_sync(admin.compact, manager, args["topics"] or [])
        if op in _GROUP_OPS:
            return await self.run_sync(self._group_op, op, args)
        raise ControlError("ProtocolError", f"unknown op {op!r}")

    def _group_op(self, op: str, args: dict[str, Any]) -> object:
        # The daemon's one store (OffsetStore.shared): the mount's P@group= views and
        # these requests see the same members and commits.
        store = OffsetStore.shared(self.manager)
        group: str = args.get("group") or ""
        if op == "list_groups":
            return store.list_groups()
        if op == "describe_group":
            return group_result(store.describe_group(group))
        if op == "delete_group":
            store.delete_group(group)
            return None
        if op == "join_group":
            member_id, partitions = store.join(
                group,
                args["topic"],
                args["partitions"],
                client_id=args["client_id"],
                host=args["host"] or "localhost",
                pid=args["pid"],
            )
            return {"member_id": member_id, "partitions": partitions}
        if op == "heartbeat":
            return store.heartbeat(group, args["member_id"])
        if op == "leave_group":
            store.leave(group, args["member_id"])
            return None
        try:
            offsets = {(t, p): o for t, p, o in parse_partition_offsets(args["offsets"])}
        except ValueError as exc:
            raise ControlError("ProtocolError", str(exc)) from None
        if op == "reset_offsets":
            store.reset_offsets(group, offsets)
        else:
            store.commit(
                group, offsets, member_id=args["member_id"], metadata=args["metadata"] or ""
            )
        return None

    def _produce(self, topic: str, partition: int | None, payload: bytes) -> object:
        # A compressed payload (this client never sends one) inflates to at most what
        # one batch of the topic may hold.
        limit = self.manager.topic_config(topic).max_message_bytes
        values, keys, headers, timestamps = decode_records(
            payload, self.manager.clock.milliseconds(), limit
        )
        count = self.manager.topic(topic).partitions
        # One sticky partitioner per topic, as one producer's: keyless calls spread.
        # Its lock is the topic's alone (StickyPartitioner is not thread-safe): other
        # topics' producers append meanwhile; each Log serialises its own appends.
        with self._partitioners_lock:
            entry = self._partitioners.get(topic)
            if entry is None or entry[0].num_partitions != count:
                entry = self._partitioners[topic] = (StickyPartitioner(count), threading.Lock())
        sticky, lock = entry
        with lock:
            written = append_records(
                self.manager,
                topic,
                values,
                keys=keys,
                headers=headers,
                timestamps=timestamps,
                partition=partition,
                partitioner=sticky,
            )
        counters = metrics.COUNTERS
        if counters is not None:
            records = sum(last - first + 1 for _, first, last in written)
            counters.appended(topic, records, None, metrics.CONTROL)
        return [list(entry) for entry in written]


_GROUP_OPS = frozenset(
    {
        "list_groups",
        "describe_group",
        "commit_offsets",
        "reset_offsets",
        "delete_group",
        "join_group",
        "heartbeat",
        "leave_group",
    }
)


class _Throttled:
    """One log line per condition per ``LOG_INTERVAL_S``; the next one says how many
    were left out. Not thread-safe (the trio thread's)."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}
        self._left_out: dict[str, int] = {}

    def log(self, condition: str, level: int, message: str, *args: object) -> None:
        now = time.monotonic()
        last = self._last.get(condition)
        if last is not None and now - last < LOG_INTERVAL_S:
            self._left_out[condition] = self._left_out.get(condition, 0) + 1
            return
        self._last[condition] = now
        left_out = self._left_out.pop(condition, 0)
        if left_out:
            message += " (and %d more times since the last such line)"
            args = (*args, left_out)
        logger.log(level, message, *args)


class _Connection:
    """One accepted connection: the scope that closes it, and since when it has been
    waiting for a frame (None while one is read or served)."""

    __slots__ = ("idle_since", "scope")

    def __init__(self) -> None:
        self.scope = trio.CancelScope()
        self.idle_since: float | None = trio.current_time()


def _free_descriptors() -> int | None:
    """Descriptors this process may still open (None: no limit, or no ``/proc``).

    Cost: one ``listdir`` of ``/proc/self/fd``, O(open descriptors)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        open_now = len(os.listdir("/proc/self/fd")) - 1  # less the listing's own
    except OSError as exc:
        return 0 if exc.errno in _CAPACITY_ERRNOS else None
    return soft - open_now


class _Server:
    """Accepts and serves connections within ``config``'s bounds."""

    def __init__(
        self,
        handlers: _Handlers,
        config: ControlConfig,
        release_memory: Callable[[], object] | None,
    ) -> None:
        self.handlers = handlers
        self.config = config
        self.release_memory = release_memory
        self.connections: set[_Connection] = set()
        self.slots = trio.Semaphore(config.max_connections)
        self.budget = ByteBudget(config.queued_bytes_bound, "control socket")
        self.requests = trio.CapacityLimiter(REQUESTS_AT_ONCE)
        self.large_frames = 0  # frames of RELEASE_AFTER_BYTES or more being served
        self.throttled = _Throttled()
        self.idle_s = config.connections_max_idle_ms / 1000
        self.frame_s = config.control_frame_timeout_ms / 1000

    # -- accepting ----------------------------------------------------------------------

    async def accept_forever(self, listener: trio.socket.SocketType) -> None:
        async with trio.open_nursery() as nursery:
            while True:
                await self._take_slot(listener)
                try:
                    await self._wait_for_descriptors()
                    connection, _address = await listener.accept()
                except OSError as exc:
                    self.slots.release()
                    if exc.errno in _GONE_ERRNOS:
                        continue
                    if exc.errno not in _CAPACITY_ERRNOS:
                        raise
                    self.throttled.log(
                        "accept",
                        logging.WARNING,
                        "control socket: accept failed (%s); trying again in %.0f s",
                        os.strerror(exc.errno),
                        _RETRY_S,
                    )
                    await trio.sleep(_RETRY_S)
                    continue
                except BaseException:
                    self.slots.release()
                    raise
                nursery.start_soon(self._serve, connection)

    async def _take_slot(self, listener: trio.socket.SocketType) -> None:
        while True:
            if self.slots.value == 0:
                # Someone waits to connect: make room if a connection is only idling.
                await trio.lowlevel.wait_readable(listener)
                self._close_idlest()
            with trio.move_on_after(_RETRY_S):
                await self.slots.acquire()
                return

    def _close_idlest(self) -> None:
        now = trio.current_time()
        idlest: _Connection | None = None
        longest = _EVICT_IDLE_S
        for connection in self.connections:
            if connection.idle_since is not None and now - connection.idle_since >= longest:
                idlest, longest = connection, now - connection.idle_since
        if idlest is None:
            self.throttled.log(
                "max.connections",
                logging.WARNING,
                "control socket: max.connections=%d connections are busy: new connections "
                "wait until one closes",
                self.config.max_connections,
            )
            return
        self.throttled.log(
            "evict",
            logging.INFO,
            "control socket: max.connections=%d reached: closed the connection idle "
            "longest (%.1f s) for a waiting one",
            self.config.max_connections,
            longest,
        )
        idlest.idle_since = None  # closed once
        idlest.scope.cancel()

    async def _wait_for_descriptors(self) -> None:
        reserved = self.config.control_reserved_fds
        if not reserved:
            return
        while True:
            free = await self.handlers.run_sync(_free_descriptors)
            assert free is None or isinstance(free, int)
            if free is None or free > reserved:
                return
            self.throttled.log(
                "descriptors",
                logging.WARNING,
                "control socket: %d descriptors free, control.reserved.fds=%d: not "
                "accepting connections until more are free",
                free,
                reserved,
            )
            await trio.sleep(_RETRY_S)

    # -- serving ------------------------------------------------------------------------

    async def _serve(self, connection: trio.socket.SocketType) -> None:
        state = _Connection()
        self.connections.add(state)
        try:
            with state.scope:
                async with trio.SocketStream(connection) as stream:
                    while await self._exchange(stream, state):
                        pass
        except (ControlError, trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the client closed the connection inside a frame, or went away
        finally:
            self.connections.discard(state)
            self.slots.release()

    async def _exchange(self, stream: trio.SocketStream, state: _Connection) -> bool:
        """Read one frame and answer it; whether the connection stays open.

        Raises:
            ControlError: the client closed the connection inside a frame.
        """
        state.idle_since = trio.current_time()
        first = b""
        with trio.move_on_after(self.idle_s) as idling:
            first = await stream.receive_some(FRAME.size)
        if idling.cancelled_caught:
            self.throttled.log(
                "idle",
                logging.INFO,
                "control socket: closed a connection idle for connections.max.idle.ms=%d",
                self.config.connections_max_idle_ms,
            )
            return False
        if not first:
            return False  # the client is done
        prefix = b""
        with trio.move_on_after(self.frame_s):
            prefix = await _receive_rest(stream, first, FRAME.size)
        if not prefix:
            return self._timed_out("a frame's first 12 bytes")
        header_length, payload_length = FRAME.unpack(prefix)
        size = header_length + payload_length
        try:
            check_lengths(header_length, payload_length, self.config.socket_request_max_bytes)
        except ControlError as exc:
            self.throttled.log(
                "frame size", logging.WARNING, "control socket: refused a frame: %s", exc
            )
            # The client reads this reply even when its send fails: the rest of its
            # frame is never read.
            with trio.move_on_after(self.frame_s):
                await stream.send_all(frame(error_header(exc)))
            return False
        state.idle_since = None
        if not self.budget.fits(size):
            self.throttled.log(
                "queued",
                logging.INFO,
                "control socket: queued.max.request.bytes=%d held by frames being served: "
                "a frame of %d bytes waits",
                self.config.queued_max_request_bytes,
                size,
            )
        large = size >= RELEASE_AFTER_BYTES
        self.large_frames += large
        try:
            async with self.budget.hold(size):
                keep_open = await self._answer(stream, header_length, payload_length)
        finally:
            self.large_frames -= large
        if large and not self.large_frames and self.release_memory is not None:
            # The frame is freed; the heaps of the worker threads that decoded and
            # appended it are never trimmed otherwise (see malloc_tuning).
            await self.handlers.run_sync(self.release_memory)
        return keep_open

    async def _answer(
        self, stream: trio.SocketStream, header_length: int, payload_length: int
    ) -> bool:
        """Read the rest of a frame (within ``control.frame.timeout.ms``), run it, send
        the reply; whether the connection stays open. The frame is freed on return."""
        raw_header = payload = b""
        with trio.move_on_after(self.frame_s) as reading:
            raw_header = await _receive_rest(stream, b"", header_length)
            payload = await _receive_rest(stream, b"", payload_length)
        if reading.cancelled_caught:
            return self._timed_out(f"a frame of {header_length + payload_length} bytes")
        response = await self._respond(raw_header, payload)
        with trio.move_on_after(self.frame_s) as sending:
            await stream.send_all(frame(response))
        return not sending.cancelled_caught or self._timed_out("a reply")

    def _timed_out(self, what: str) -> bool:
        self.throttled.log(
            "frame timeout",
            logging.WARNING,
            "control socket: closed a connection: %s not complete within "
            "control.frame.timeout.ms=%d",
            what,
            self.config.control_frame_timeout_ms,
        )
        return False

    async def _respond(self, raw_header: bytes, payload: bytes) -> dict[str, object]:
        try:
            op, args = parse_request(parse_header(raw_header))
            async with self.requests:
                counters = metrics.COUNTERS  # None unless --metrics
                started = perf_counter()
                try:
                    result = await self.handlers.call(op, args, payload)
                finally:
                    if counters is not None:
                        counters.control_request(op, perf_counter() - started)
            return {"ok": True, "result": result}
        except Exception as exc:
            if not isinstance(exc, ControlError | StorageError | OSError):
                logger.exception("control request failed")
            return error_header(exc)


async def _receive_rest(stream: trio.SocketStream, start: bytes, n: int) -> bytes:
    """``start`` and what follows it on ``stream`` up to ``n`` bytes in all.

    Raises:
        ControlError: the client closed the connection first.
    """
    parts = [start]
    got = len(start)
    while got < n:
        chunk = await stream.receive_some(min(n - got, 1 << 20))
        if not chunk:
            raise ControlError("ProtocolError", "connection closed inside a frame")
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def _set_socket_mode(path: Path, mode: int) -> None:
    """``chmod`` the socket at ``path`` itself, never what a symlink there names.

    Raises:
        OSError: ``path`` is no longer a socket (a symlink, or anything else put
            there), or the chmod failed.
    """
    fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            raise OSError(errno.EEXIST, "not the socket just bound", str(path))
        # chmod of an O_PATH descriptor goes through /proc (as glibc's lchmod does).
        os.chmod(f"/proc/self/fd/{fd}", mode)
    finally:
        os.close(fd)


async def serve(
    log_dir: Path,
    manager: LogManager,
    run_sync: Callable[..., Awaitable[object]],
    *,
    config: ControlConfig | None = None,
    release_memory: Callable[[], object] | None = None,
    task_status: trio.TaskStatus[Path] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the control socket of ``log_dir`` until cancelled.

    Binds ``LOGDIR/.seglog.sock`` (replacing a stale socket: the caller holds the
    writer lock, so no other daemon can be serving this directory; born 0600, then
    ``SOCKET_MODE``: connectable by no other user at any moment), reports the path
    through ``task_status`` once clients can connect, serves each connection in its
    own task within ``config``'s bounds (the defaults without one) and removes the
    socket on the way out. Every engine call goes through ``run_sync`` (the daemon's
    bridge to worker threads); so does ``release_memory`` (the daemon's
    ``malloc_tuning.release_free_memory``), after large frames.

    Raises:
        OSError: the socket cannot be bound.
    """
    log_dir = Path(log_dir)
    path = socket_path(log_dir)
    listener = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(path.lstat().st_mode):
                path.unlink()
        # The order is important below: the socket is never connectable by anyone but
        # the daemon's user, not even for an instant. Connecting needs write permission
        # on the socket file, and bind() creates that file with the mode of the
        # socket's own inode less the umask (Linux's unix_bind: S_IFSOCK |
        # (SOCK_INODE(sock)->i_mode & ~current_umask())). That inode starts at 0777,
        # so a chmod after bind left a window in which a umask of 000 or 002 let
        # others (or the group) connect. fchmod on the unbound socket narrows it
        # first, so the file is born 0600 or less. This touches only this socket:
        # os.umask around bind would be process-wide, and the daemon's worker threads
        # create segment files at any moment (a roll), which would be born 0600 too.
        # Only then is the intended mode set; without following a symlink, so that
        # nothing a writer of the log directory put at that name in between is
        # chmod'ed in its place.
        os.fchmod(listener.fileno(), SOCKET_BIND_MODE)
        with socket_address(log_dir) as address:
            await listener.bind(address)
        _set_socket_mode(path, SOCKET_MODE)
        bound = path.lstat().st_ino
        listener.listen(_LISTEN_BACKLOG)
    except BaseException:
        listener.close()
        raise
    server = _Server(_Handlers(manager, run_sync), config or ControlConfig(), release_memory)
    try:
        task_status.started(path)
        await server.accept_forever(listener)
    finally:
        # No await here: cancellation is how the daemon stops us, and a checkpoint
        # would raise Cancelled before the socket file is gone. Remove only our own
        # socket, never one a later daemon bound.
        with contextlib.suppress(FileNotFoundError):
            if path.lstat().st_ino == bound:
                path.unlink()
        listener.close()

"""The control socket: how commands write to a log directory a daemon owns.

One process writes a log directory (the engine's lock enforces it). While the FUSE
daemon runs, ``seglogfs topics`` and ``seglogfs produce`` must not open the directory
for writing; they send their request to the daemon instead, over the Unix socket
``LOGDIR/.seglog.sock`` (a name Kafka never uses, so the directory stays a Kafka log
directory). The daemon runs the same engine call the command would have run itself,
so results and errors are the same with or without a daemon.

Wire format (both directions, one request and one response per exchange, any number
of exchanges per connection)::

    header_length uint32 | payload_length uint64 | header (UTF-8 JSON) | payload bytes

A request header is ``{"op": NAME, "args": {...}}``. A response header is
``{"ok": true, "result": ...}`` or ``{"ok": false, "kind": ERROR_CLASS, "message":
TEXT, "errno": N or null}``. Only ``produce`` carries a payload: the records as one
uncompressed v2 record batch (Kafka's own encoding, so headers, null keys and values
and timestamps need no second format); a timestamp of -1 means "the daemon's now".

Ops: ``ping``, ``list_topics``, ``create_topic(name, partitions, config, format,
key_separator)``, ``alter_topic(name, set, delete)``, ``delete_topic(name)``,
``describe_topic(name)``, ``produce(topic, partition)``.

Thread-safety: the client functions open their own connection per call and are
thread-safe. The server serves each connection in its own task and runs every engine
call through the daemon's ``run_sync`` bridge.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import stat
import struct
import threading
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from storage import (
    DefaultRecordBatch,
    Header,
    LogManager,
    StickyPartitioner,
    StorageError,
    TopicDescription,
    TopicMetadata,
    UnknownTopicError,
    build_record_batch,
    partition_for_key,
)

if TYPE_CHECKING:
    import trio

logger = logging.getLogger(__name__)

SOCKET_NAME = ".seglog.sock"
"""The control socket's name inside the log directory (Kafka never uses it)."""

_FRAME = struct.Struct(">IQ")
_MAX_HEADER = 1 << 20
_MAX_PAYLOAD = 1 << 31
_CONNECT_TIMEOUT_S = 2.0
# The socket path must fit sockaddr_un (108 bytes with the NUL); longer log-dir paths
# are reached through /proc/self/fd/N of an O_PATH descriptor of the directory.
_MAX_SUN_PATH = 107

ProduceRecord = tuple[bytes | None, bytes | None, Sequence[Header], int | None]
"""(key, value, headers, timestamp or None for now): one record to produce."""


class ControlError(Exception):
    """The daemon refused a request: ``kind`` names the engine error class
    (``"TopicExistsError"``, ``"ConfigError"``, ...) or ``"OSError"``, ``"ProtocolError"``,
    ``"InternalError"``; ``message`` is the error's text, ``errno`` set for OSError."""

    def __init__(self, kind: str, message: str, errno: int | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.errno = errno


def socket_path(log_dir: Path) -> Path:
    """Where a daemon owning ``log_dir`` listens."""
    return Path(log_dir) / SOCKET_NAME


# -- the records of one produce call --------------------------------------------------


def append_records(
    manager: LogManager,
    topic: str,
    values: Sequence[bytes | None],
    *,
    keys: Sequence[bytes | None] | None = None,
    headers: Sequence[Sequence[Header]] | None = None,
    timestamps: Sequence[int] | None = None,
    partition: int | None = None,
    partitioner: StickyPartitioner | None = None,
) -> list[tuple[int, int, int]]:
    """Append one producer call's records; return (partition, first, last offset) for
    each partition written, in partition order.

    This is the single produce path: ``seglogfs produce`` calls it on a log directory
    it opened itself, and the control server calls it for a client, so both give the
    same partitions, offsets and errors. Without ``partition``, a record with a key
    goes to ``toPositive(murmur2(key)) % partitions`` (Kafka's producer) and keyless
    records go to the ``partitioner``'s sticky partition, which moves on after the
    call (one call is one producer batch).

    Cost: O(records) to partition (murmur2 per key), then one ``Log.append`` per
    partition written.

    Raises:
        UnknownTopicError: no such topic or partition.
        RecordTooLargeError: a record over ``max.message.bytes`` (that partition's
            records are not appended; partitions written before it stay written).
        ReadOnlyLogError: the manager is read-only or closed.
        OSError: the write failed (e.g. ENOSPC); nothing of that partition appended.
    """
    metadata = manager.topic(topic)
    n = len(values)
    if n == 0:
        return []
    if partition is not None:
        if not 0 <= partition < metadata.partitions:
            raise UnknownTopicError(topic, partition)
        groups: dict[int, list[int] | None] = {partition: None}
    else:
        sticky = partitioner if partitioner is not None else StickyPartitioner(metadata.partitions)
        if sticky.num_partitions != metadata.partitions:
            sticky = StickyPartitioner(metadata.partitions)
        if keys is None or all(key is None for key in keys):
            groups = {sticky.partition(): None}
        else:
            count = metadata.partitions
            sticky_partition = sticky.partition()
            groups = {}
            for i, key in enumerate(keys):
                p = sticky_partition if key is None else partition_for_key(key, count)
                indices = groups.setdefault(p, [])
                assert indices is not None
                indices.append(i)
        sticky.next_batch()
    written = []
    for p in sorted(groups):
        indices = groups[p]
        log = manager.log(topic, p)
        if indices is None or len(indices) == n:
            info = log.append(
                values,
                keys=keys,
                timestamps=timestamps,
                headers=headers,
                units=rendered_units(metadata, values, keys),
            )
        else:
            part_values = [values[i] for i in indices]
            part_keys = None if keys is None else [keys[i] for i in indices]
            info = log.append(
                part_values,
                keys=part_keys,
                timestamps=None if timestamps is None else [timestamps[i] for i in indices],
                headers=None if headers is None else [headers[i] for i in indices],
                units=rendered_units(metadata, part_values, part_keys),
            )
        written.append((p, info.first_offset, info.last_offset))
    return written


def rendered_units(
    metadata: TopicMetadata,
    values: Sequence[bytes | None],
    keys: Sequence[bytes | None] | None,
) -> int:
    """The bytes these records add to the partition file (SPEC §3, as
    ``storage.render`` renders them), handed to ``Log.append(units=)`` so the engine
    need not decode the batch it just encoded to measure it. ``seglogfs verify``
    recomputes every position from ``storage.render`` and reports any difference.

    Cost: O(records), with no object per record.
    """
    if None in values:
        total = sum(len(value) for value in values if value is not None)
    else:
        total = sum(map(len, values))  # type: ignore[arg-type]
    if metadata.format == "raw":
        return total
    total += len(values)  # one newline per record
    separator = metadata.key_separator
    if separator is not None and keys is not None:
        width = len(separator.encode())
        total += sum(len(key) + width for key in keys if key is not None)
    return total


def describe_result(description: TopicDescription) -> dict[str, object]:
    """A topic description as the JSON the ``describe_topic`` op returns."""
    metadata = description.metadata
    return {
        "name": metadata.name,
        "partitions": metadata.partitions,
        "format": metadata.format,
        "key_separator": metadata.key_separator,
        "config": dict(sorted(metadata.overrides.items())),
        "partition_states": [
            {
                "partition": p.partition,
                "log_start_offset": p.log_start_offset,
                "log_end_offset": p.log_end_offset,
                "segment_count": p.segment_count,
                "size": p.size,
                "first_timestamp": p.first_timestamp,
                "last_timestamp": p.last_timestamp,
            }
            for p in description.partitions
        ],
    }


def _encode_records(records: Sequence[ProduceRecord]) -> bytes:
    keys = [r[0] for r in records]
    values = [r[1] for r in records]
    headers = [tuple(r[2]) for r in records]
    stamps = [r[3] for r in records]
    timestamps: list[int] | int
    if all(t is None for t in stamps):
        timestamps = -1
    else:
        timestamps = [-1 if t is None else t for t in stamps]
        if any(t < 0 for t in timestamps if t != -1):
            raise ValueError("record timestamps must not be negative")
    return build_record_batch(
        values,
        timestamps=timestamps,
        keys=None if all(k is None for k in keys) else keys,
        headers=None if not any(headers) else headers,
    )


def _decode_records(
    payload: bytes, now_ms: int
) -> tuple[
    Sequence[bytes | None],
    Sequence[bytes | None] | None,
    Sequence[Sequence[Header]] | None,
    Sequence[int] | None,
]:
    batch = DefaultRecordBatch(payload)
    if batch.size != len(payload) or not batch.is_valid():
        raise ControlError("ProtocolError", "produce payload is not one valid record batch")
    columns = batch.columns()
    keys = columns.keys if any(k is not None for k in columns.keys) else None
    headers = columns.headers if any(columns.headers) else None
    timestamps: Sequence[int] | None = None
    if batch.max_timestamp != -1:
        timestamps = [now_ms if t == -1 else t for t in columns.timestamps]
    return columns.values, keys, headers, timestamps


# -- framing ----------------------------------------------------------------------------


def _frame(header: Mapping[str, object], payload: bytes = b"") -> bytes:
    encoded = json.dumps(header, separators=(",", ":")).encode()
    return _FRAME.pack(len(encoded), len(payload)) + encoded + payload


def _check_lengths(header_length: int, payload_length: int) -> None:
    if header_length > _MAX_HEADER or payload_length > _MAX_PAYLOAD:
        raise ControlError(
            "ProtocolError", f"frame too large ({header_length} + {payload_length} bytes)"
        )


def _parse_header(data: bytes) -> dict[str, Any]:
    try:
        header = json.loads(data.decode())
    except (UnicodeDecodeError, ValueError) as exc:
        raise ControlError("ProtocolError", f"malformed frame header: {exc}") from None
    if not isinstance(header, dict):
        raise ControlError("ProtocolError", "frame header is not a JSON object")
    return header


# -- client ---------------------------------------------------------------------------


@contextlib.contextmanager
def _socket_address(log_dir: Path) -> Iterator[str]:
    path = str(socket_path(log_dir))
    if len(os.fsencode(path)) <= _MAX_SUN_PATH:
        yield path
        return
    fd = os.open(log_dir, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{fd}/{SOCKET_NAME}"
    finally:
        os.close(fd)


def _connect(log_dir: Path, timeout: float | None) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.settimeout(timeout)
        with _socket_address(Path(log_dir)) as address:
            sock.connect(address)
        sock.settimeout(None)
    except BaseException:
        sock.close()
        raise
    return sock


def daemon_socket(log_dir: Path) -> Path | None:
    """The control socket of ``log_dir`` if a live daemon accepts connections there.

    A socket file left by a killed daemon refuses connections and gives None.
    Cost: one ``connect`` (no request).
    """
    path = socket_path(log_dir)
    try:
        if not stat.S_ISSOCK(path.stat().st_mode):
            return None
        _connect(Path(log_dir), _CONNECT_TIMEOUT_S).close()
    except OSError:
        return None
    return path


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    buffer = bytearray(n)
    view = memoryview(buffer)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ControlError("ProtocolError", "the daemon closed the connection")
        got += k
    return bytes(buffer)


def _exchange(log_dir: Path, op: str, args: Mapping[str, object], payload: bytes = b"") -> object:
    try:
        sock = _connect(Path(log_dir), _CONNECT_TIMEOUT_S)
    except OSError as exc:
        raise ControlError(
            "OSError", f"no daemon answers on {socket_path(log_dir)}: {exc.strerror}", exc.errno
        ) from None
    with sock:
        try:
            sock.sendall(_frame({"op": op, "args": dict(args)}, payload))
            header_length, payload_length = _FRAME.unpack(_recv_exactly(sock, _FRAME.size))
            _check_lengths(header_length, payload_length)
            header = _parse_header(_recv_exactly(sock, header_length))
            _recv_exactly(sock, payload_length)
        except OSError as exc:
            raise ControlError(
                "OSError", f"lost the daemon on {socket_path(log_dir)}: {exc}", exc.errno
            ) from None
    if header.get("ok"):
        return header.get("result")
    raise ControlError(
        str(header.get("kind", "InternalError")),
        str(header.get("message", "the daemon gave no reason")),
        header.get("errno") if isinstance(header.get("errno"), int) else None,
    )


def request(log_dir: Path, op: str, **args: object) -> object:
    """Send one admin request to the daemon owning ``log_dir``; return its result.

    Raises:
        ControlError: the daemon refused (``kind`` names the engine's error class) or
            no daemon answers (``kind == "OSError"``).
    """
    return _exchange(log_dir, op, args)


def produce(
    log_dir: Path,
    topic: str,
    records: Sequence[ProduceRecord],
    *,
    partition: int | None = None,
) -> list[tuple[int, int, int]]:
    """Append ``records`` through the daemon, partitioned as ``append_records`` does;
    return (partition, first offset, last offset) per partition written.

    Raises:
        ControlError: as ``request`` (e.g. ``RecordTooLargeError``, ``UnknownTopicError``).
        ValueError: a negative timestamp.
    """
    if not records:
        return []
    result = _exchange(
        log_dir, "produce", {"topic": topic, "partition": partition}, _encode_records(records)
    )
    assert isinstance(result, list)
    return [(int(p), int(first), int(last)) for p, first, last in result]


# -- server ---------------------------------------------------------------------------


class _Handlers:
    """The ops: each runs one engine call in a worker thread through ``run_sync``."""

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
            name = _arg(args, "name", str)
            partitions = _arg(args, "partitions", int, optional=True)
            config = _arg(args, "config", dict, optional=True) or {}
            fmt = _arg(args, "format", str, optional=True) or "lines"
            separator = _arg(args, "key_separator", str, optional=True)

            def create() -> object:
                manager.create_topic(name, partitions, config, format=fmt, key_separator=separator)
                return describe_result(manager.describe_topic(name))

            return await self.run_sync(create)
        if op == "alter_topic":
            name = _arg(args, "name", str)
            to_set = _arg(args, "set", dict, optional=True) or {}
            to_delete = _arg(args, "delete", list, optional=True) or []

            def alter() -> object:
                manager.alter_topic_config(name, to_set, to_delete)
                return dict(sorted(manager.topic(name).overrides.items()))

            return await self.run_sync(alter)
        if op == "delete_topic":
            name = _arg(args, "name", str)
            await self.run_sync(manager.delete_topic, name)
            with self._partitioners_lock:
                self._partitioners.pop(name, None)
            return None
        if op == "describe_topic":
            name = _arg(args, "name", str)
            return await self.run_sync(lambda: describe_result(manager.describe_topic(name)))
        if op == "produce":
            topic = _arg(args, "topic", str)
            partition = _arg(args, "partition", int, optional=True)
            return await self.run_sync(self._produce, topic, partition, payload)
        raise ControlError("ProtocolError", f"unknown op {op!r}")

    def _produce(self, topic: str, partition: int | None, payload: bytes) -> object:
        values, keys, headers, timestamps = _decode_records(
            payload, self.manager.clock.milliseconds()
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
        return [list(entry) for entry in written]


def _arg(args: dict[str, Any], name: str, kind: type, *, optional: bool = False) -> Any:
    value = args.get(name)
    if value is None and optional:
        return None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ControlError("ProtocolError", f"argument {name!r} must be a {kind.__name__}")
    return value


def _error_header(exc: BaseException) -> dict[str, object]:
    if isinstance(exc, ControlError):
        return {"ok": False, "kind": exc.kind, "message": exc.message, "errno": exc.errno}
    if isinstance(exc, StorageError):
        return {"ok": False, "kind": type(exc).__name__, "message": str(exc), "errno": None}
    if isinstance(exc, OSError):
        message = exc.strerror or str(exc)
        if exc.filename is not None:
            message = f"{exc.filename}: {message}"
        return {"ok": False, "kind": "OSError", "message": message, "errno": exc.errno}
    return {"ok": False, "kind": "InternalError", "message": f"{type(exc).__name__}: {exc}"}


async def _receive_exactly(stream: trio.abc.Stream, n: int) -> bytes | None:
    # None: the peer closed cleanly before the first byte of a frame.
    parts = bytearray()
    while len(parts) < n:
        chunk = await stream.receive_some(min(n - len(parts), 1 << 20))
        if not chunk:
            if parts:
                raise ControlError("ProtocolError", "connection closed inside a frame")
            return None
        parts += chunk
    return bytes(parts)


async def _serve_connection(stream: trio.abc.Stream, handlers: _Handlers) -> None:
    import trio

    async with stream:
        while True:
            try:
                prefix = await _receive_exactly(stream, _FRAME.size)
                if prefix is None:
                    return
                header_length, payload_length = _FRAME.unpack(prefix)
                _check_lengths(header_length, payload_length)
                raw_header = await _receive_exactly(stream, header_length) or b""
                payload = await _receive_exactly(stream, payload_length) or b""
            except (ControlError, trio.BrokenResourceError, trio.ClosedResourceError):
                return
            try:
                request_header = _parse_header(raw_header)
                op = request_header.get("op")
                args = request_header.get("args", {})
                if not isinstance(op, str) or not isinstance(args, dict):
                    raise ControlError("ProtocolError", "a request needs 'op' and 'args'")
                response: dict[str, object] = {
                    "ok": True,
                    "result": await handlers.call(op, args, payload),
                }
            except Exception as exc:
                if not isinstance(exc, ControlError | StorageError | OSError):
                    logger.exception("control request failed")
                response = _error_header(exc)
            try:
                await stream.send_all(_frame(response))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return


class _StatusIgnored:
    """``trio.TASK_STATUS_IGNORED`` without importing trio: the command line imports
    this module for its client and should not pay for trio (a seventh of its start)."""

    def started(self, value: object = None) -> None:
        pass


_TASK_STATUS_IGNORED: Any = _StatusIgnored()


async def serve(
    log_dir: Path,
    manager: LogManager,
    run_sync: Callable[..., Awaitable[object]],
    *,
    task_status: trio.TaskStatus[Path] = _TASK_STATUS_IGNORED,
) -> None:
    """Serve the control socket of ``log_dir`` until cancelled.

    Binds ``LOGDIR/.seglog.sock`` (replacing a stale socket: the caller holds the
    writer lock, so no other daemon can be serving this directory), reports the path
    through ``task_status`` once clients can connect, serves each connection in its
    own task and removes the socket on the way out. Every engine call goes through
    ``run_sync`` (the daemon's bridge to worker threads).

    Raises:
        OSError: the socket cannot be bound.
    """
    import trio

    log_dir = Path(log_dir)
    path = socket_path(log_dir)
    listener_socket = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(path.lstat().st_mode):
                path.unlink()
        with _socket_address(log_dir) as address:
            await listener_socket.bind(address)
        # The daemon's user and group (operators) may write through the daemon; others
        # cannot write the log directory anyway.
        os.chmod(path, 0o660)
        bound = path.lstat().st_ino
        listener_socket.listen(64)
    except BaseException:
        listener_socket.close()
        raise
    handlers = _Handlers(manager, run_sync)
    listener = trio.SocketListener(listener_socket)

    async def handle(stream: trio.SocketStream) -> None:
        await _serve_connection(stream, handlers)

    try:
        async with trio.open_nursery() as nursery:
            task_status.started(path)
            await trio.serve_listeners(
                handle,
                [listener],
                handler_nursery=nursery,
            )
    finally:
        # No await here: cancellation is how the daemon stops us, and a checkpoint
        # would raise Cancelled before the socket file is gone. Remove only our own
        # socket, never one a later daemon bound.
        with contextlib.suppress(FileNotFoundError):
            if path.lstat().st_ino == bound:
                path.unlink()
        listener_socket.close()


__all__ = [
    "SOCKET_NAME",
    "ControlError",
    "ProduceRecord",
    "append_records",
    "daemon_socket",
    "describe_result",
    "produce",
    "rendered_units",
    "request",
    "serve",
    "socket_path",
]

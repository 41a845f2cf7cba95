"""The control socket's server: the daemon answers the command line's requests.

Binds ``LOGDIR/.seglog.sock``, serves each connection in its own task of the daemon's
nursery and runs every engine call through the daemon's ``run_sync`` bridge, so a
request never blocks the event loop. The wire format is ``seglogfs.control.protocol``.

Thread-safety: the handlers run on the trio thread; the engine calls they hand to
worker threads are thread-safe (one sticky partitioner per topic, under its own lock).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import stat
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

from storage import LogManager, StickyPartitioner, StorageError

from ..producer import append_records
from .protocol import (
    FRAME,
    ControlError,
    check_lengths,
    decode_records,
    delete_records,
    describe_result,
    error_header,
    frame,
    parse_header,
    parse_partition_offsets,
    socket_address,
    socket_path,
)

__all__ = ["serve"]

logger = logging.getLogger(__name__)


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
        if op == "delete_records":
            try:
                partitions = parse_partition_offsets(_arg(args, "partitions", list))
            except ValueError as exc:
                raise ControlError("ProtocolError", str(exc)) from None
            return await self.run_sync(delete_records, manager, partitions)
        raise ControlError("ProtocolError", f"unknown op {op!r}")

    def _produce(self, topic: str, partition: int | None, payload: bytes) -> object:
        values, keys, headers, timestamps = decode_records(
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
    async with stream:
        while True:
            try:
                prefix = await _receive_exactly(stream, FRAME.size)
                if prefix is None:
                    return
                header_length, payload_length = FRAME.unpack(prefix)
                check_lengths(header_length, payload_length)
                raw_header = await _receive_exactly(stream, header_length) or b""
                payload = await _receive_exactly(stream, payload_length) or b""
            except (ControlError, trio.BrokenResourceError, trio.ClosedResourceError):
                return
            try:
                request_header = parse_header(raw_header)
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
                response = error_header(exc)
            try:
                await stream.send_all(frame(response))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return


async def serve(
    log_dir: Path,
    manager: LogManager,
    run_sync: Callable[..., Awaitable[object]],
    *,
    task_status: trio.TaskStatus[Path] = trio.TASK_STATUS_IGNORED,
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
    log_dir = Path(log_dir)
    path = socket_path(log_dir)
    listener_socket = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(path.lstat().st_mode):
                path.unlink()
        with socket_address(log_dir) as address:
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

"""The Kafka listener: a TCP server in the daemon's trio nursery.

Each connection is served in its own task, one request at a time, in order (as a
Kafka broker mutes a connection while it handles its request: clients pipeline, and
their responses must come back in order). Bounds: a frame declaring more than
``socket.request.max.bytes`` (or a negative size) closes its connection before any of
it is read; a frame that does not decode as its API's schema closes its connection
(Kafka's ``InvalidRequestException``); each is logged once per connection, at WARNING,
and the other connections go on. A connection waits at most
``connections.max.idle.ms`` (default ``CONNECTIONS_MAX_IDLE_S``) for its next request,
and as long for the rest of a frame it started (a client that stops inside a frame
cannot hold its descriptor for ever). At most ``max.connections`` (default 256)
connections are served at once: one more is closed as soon as it is accepted, with a
WARNING at most once a minute, so that clients cannot take the descriptors the file
system needs. The frames being read or served hold at most
``queued.max.request.bytes`` (default 100 MiB; Kafka: unbounded) together: a
connection whose next frame does not fit waits, its frame unread, until others are
answered (a WARNING at most once a minute), so many clients cannot make the daemon
hold ``max.connections`` x ``socket.request.max.bytes``.
Connections are logged at INFO when they open and close, with their requests and
bytes.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import socket
from collections.abc import Awaitable, Callable
from time import perf_counter
from typing import Any, Final

import trio

from storage import LogManager

from ..byte_budget import ByteBudget
from .broker import Broker, BrokerCounters
from .codec import (
    FRAME_SIZE,
    ErrorCode,
    MalformedRequest,
    Request,
    ResponseFrame,
    decode_request,
    encode_response,
    error_response,
)
from .config import KafkaConfig
from .dispatch import respond
from .send import send_frame
from .versions import API_NAMES, supported

__all__ = ["CONNECTIONS_MAX_IDLE_S", "serve"]

logger = logging.getLogger(__name__)

CONNECTIONS_MAX_IDLE_S: Final = 600.0
"""Kafka's ``connections.max.idle.ms`` default."""

_RECEIVE_CHUNK = 1 << 20


class _ConnectionClosed(Exception):
    """The client closed the connection (inside a frame when ``partial``)."""

    def __init__(self, partial: bool) -> None:
        super().__init__("inside a frame" if partial else "between frames")
        self.partial = partial


class _FrameReader:
    """Whole frames from a stream, keeping what a receive brought beyond one."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buffer = bytearray()
        self.bytes_in = 0

    async def exactly(self, n: int) -> bytes:
        """The next ``n`` bytes.

        Raises:
            _ConnectionClosed: the client closed the connection first.
        """
        while len(self.buffer) < n:
            chunk = await self.stream.receive_some(max(_RECEIVE_CHUNK, n - len(self.buffer)))
            if not chunk:
                raise _ConnectionClosed(partial=bool(self.buffer))
            self.bytes_in += len(chunk)
            self.buffer += chunk
        data = bytes(self.buffer[:n])
        del self.buffer[:n]
        return data


class _Listener:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.budget = ByteBudget(broker.config.queued_bytes_bound, "kafka")
        # (api key, exception type) whose traceback was logged: once each, so a bug
        # every consumer's Fetch meets logs one traceback, then one line a request.
        self._logged: set[tuple[int, type[BaseException]]] = set()
        self._open = 0  # connections being served
        self._refused = 0  # refused since the last WARNING
        self._refused_logged_at = -math.inf

    def _failed(self, name: str, request: Request, exc: Exception) -> ResponseFrame | None:
        """The UNKNOWN_SERVER_ERROR response to a request whose handler raised ``exc``
        (None when no schema can carry it: the connection is then closed)."""
        api = API_NAMES.get(request.api_key, f"key {request.api_key}")
        key = (request.api_key, type(exc))
        if key in self._logged:
            logger.error("kafka: %s: %s v%d failed: %r", name, api, request.api_version, exc)
        else:
            self._logged.add(key)
            logger.exception("kafka: %s: %s v%d failed", name, api, request.api_version)
        response = error_response(
            request.api_key, request.api_version, ErrorCode.unknown_server_error
        )
        if response is None:
            return None
        return encode_response(request.correlation_id, response)

    async def connection(self, stream: trio.SocketStream) -> None:
        limit = self.broker.config.max_connections
        if self._open >= limit:
            self._refused += 1
            now = trio.current_time()
            if now - self._refused_logged_at >= 60:
                logger.warning(
                    "kafka: %d connection(s) refused: max.connections=%d are open",
                    self._refused,
                    limit,
                )
                self._refused, self._refused_logged_at = 0, now
            await trio.aclose_forcefully(stream)
            return
        self._open += 1
        try:
            await self._serve_connection(stream)
        finally:
            self._open -= 1

    async def _serve_connection(self, stream: trio.SocketStream) -> None:
        idle_s = self.broker.config.connections_max_idle_ms / 1000
        try:
            peer = stream.socket.getpeername()
            peer_host, peer_port = str(peer[0]), int(peer[1])
        except OSError:
            peer_host, peer_port = "?", 0
        name = f"{peer_host}:{peer_port}"
        logger.info("kafka: connection from %s", name)
        reader = _FrameReader(stream)
        requests = bytes_out = 0
        reason = "closed by the client"
        try:
            while True:
                with trio.move_on_after(idle_s) as idle:
                    prefix = await reader.exactly(FRAME_SIZE.size)
                if idle.cancelled_caught:
                    reason = "idle for connections.max.idle.ms"
                    break
                (size,) = FRAME_SIZE.unpack(prefix)
                limit = self.broker.config.socket_request_max_bytes
                if size < 0 or size > limit:
                    reason = f"a frame of {size} bytes (socket.request.max.bytes={limit})"
                    logger.warning("kafka: %s: closing the connection: %s", name, reason)
                    break
                async with self.budget.hold(size):
                    with trio.move_on_after(idle_s) as stalled:
                        frame = await reader.exactly(size)
                    if stalled.cancelled_caught:
                        reason = "silent inside a frame for connections.max.idle.ms"
                        logger.warning("kafka: %s: closing the connection: %s", name, reason)
                        break
                    try:
                        request = decode_request(frame, supported)
                    except MalformedRequest as exc:
                        reason = f"malformed request: {exc}"
                        logger.warning(
                            "kafka: %s: closing the connection: %s (frame starts %s)",
                            name,
                            reason,
                            frame[:64].hex(),
                        )
                        break
                    request = dataclasses.replace(request, peer_host=peer_host)
                    if logger.isEnabledFor(logging.DEBUG):
                        logger.debug(
                            "kafka: %s: %s v%d (correlation %d)",
                            name,
                            API_NAMES.get(request.api_key, f"key {request.api_key}"),
                            request.api_version,
                            request.correlation_id,
                        )
                    counters = self.broker.counters  # None unless --metrics
                    started = perf_counter()
                    try:
                        response = await respond(self.broker, request)
                    except Exception as exc:
                        # A bug (here or in the engine): answer the request as Kafka's
                        # KafkaApis.handleError does, with UNKNOWN_SERVER_ERROR, and go on.
                        response = self._failed(name, request, exc)
                        if response is None:
                            raise
                    if counters is not None:
                        api = API_NAMES.get(request.api_key, str(request.api_key))
                        counters.kafka_request(api, perf_counter() - started)
                    requests += 1
                    if response is not None:
                        try:
                            await send_frame(stream, response)
                        finally:
                            response.close()
                        bytes_out += response.size
        except _ConnectionClosed as exc:
            if exc.partial:
                reason = "closed by the client inside a frame"
                logger.warning("kafka: %s: %s", name, reason)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            reason = "broken by the client"
        except Exception:
            # A bug with no response to carry it: the connection cannot go on.
            logger.exception("kafka: %s: closing the connection", name)
            reason = "internal error"
        except trio.Cancelled:
            reason = "the daemon is stopping"
            raise
        finally:
            # Logged before the close: on shutdown the close's checkpoint raises
            # Cancelled again.
            logger.info(
                "kafka: connection from %s closed (%s): %d requests, %d bytes in, %d out",
                name,
                reason,
                requests,
                reader.bytes_in,
                bytes_out,
            )
            await trio.aclose_forcefully(stream)


def _advertisable(host: str) -> str:
    """The host to advertise for a bound ``host``: a wildcard address names no host
    clients can connect to, so the machine's name stands for it (as Kafka advertises
    its canonical host name for a listener without a host)."""
    if host in ("0.0.0.0", "::"):
        return socket.gethostname()
    return host


async def serve(
    manager: LogManager,
    run_sync: Callable[..., Awaitable[Any]],
    config: KafkaConfig,
    *,
    counters: BrokerCounters | None = None,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Listen on ``config``'s address until cancelled; report the bound (host, port)
    through ``task_status`` once clients can connect. Requests, records and bytes are
    counted into ``counters`` when given (the daemon's metrics).

    Raises:
        OSError: the address cannot be bound.
    """
    listeners = await trio.open_tcp_listeners(config.port, host=config.host)
    try:
        sockname = listeners[0].socket.getsockname()
        port = int(sockname[1])
        broker = Broker(
            manager,
            run_sync,
            config,
            config.advertised_host or _advertisable(config.host),
            config.advertised_port or port,
            counters=counters,
        )
        listener = _Listener(broker)
        logger.info(
            "kafka: listening on %s:%d (advertised %s:%d)",
            config.host,
            port,
            broker.advertised_host,
            broker.advertised_port,
        )
        async with trio.open_nursery() as nursery:
            nursery.start_soon(broker.groups.expire_forever)
            await nursery.start(trio.serve_listeners, listener.connection, listeners)
            task_status.started((config.host, port))
    finally:
        for each in listeners:
            await trio.aclose_forcefully(each)

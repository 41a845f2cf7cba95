"""The bounded HTTP server of ``/metrics``: one thread, one selector, a fixed ceiling.

``prometheus_client``'s own server (``start_http_server``) starts a thread per
connection and waits for a request for ever: a client that opens connections and says
nothing held a descriptor and a thread each, without limit, in the process that serves
the file system. This server is what the Kafka listener and the control socket are
(README "Limits"): every resource a client can make it hold has a bound, and reaching
one refuses that client only.

- ``seglog.metrics.max.connections`` (default 16): at most that many connections are
  served at once; one more is answered ``503 Service Unavailable`` (if its socket takes
  those few bytes at once) and closed as soon as it is accepted.
- ``seglog.metrics.connections.max.idle.ms`` (default 10,000): a connection must have
  sent its whole request that long after it was accepted, and taken its whole response
  that long after the response was ready; else it is closed. A deadline, not an idle
  timer: a client that sends one byte a second cannot hold its slot any longer.
- ``seglog.metrics.request.max.bytes`` (default 8,192): a request line and headers
  longer than that are answered ``431`` and closed; no more than that is ever buffered
  per connection.

One request per connection (``Connection: close``, as ``prometheus_client``'s HTTP/1.0
server does); ``GET`` and ``HEAD`` of ``/metrics`` (or ``/``), the page made by
``prometheus_client`` itself (``choose_encoder``: the text format or OpenMetrics as the
``Accept`` header asks, gzip when accepted, ``name[]`` to restrict it). Everything,
accepting, reading, rendering the page, writing, runs in the server's one thread:
a scrape never runs on the daemon's event loop, and a slow or hostile client costs
that thread nothing but a registered descriptor until its deadline.

Descriptors: the listening socket, a socket pair to wake the thread, and at most
``max.connections`` connections. When ``accept`` meets ``EMFILE``/``ENFILE`` the
server stops accepting for a second (the file system needs the descriptors more) and
counts it; conditions are logged at WARNING at most once a minute.

Thread-safety: ``close`` may be called from any thread; the counters
(``refused``, ``timed_out``, ...) are read by the collector in the server's own thread.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import logging
import math
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final
from urllib.parse import parse_qs

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder, gzip_accepted

__all__ = ["MetricsServer", "ServerBounds"]

logger = logging.getLogger(__name__)

BACKLOG: Final = 16
"""Connections the kernel queues before ``accept``: held by the kernel, not the daemon."""

_RECEIVE_CHUNK: Final = 4096
_ACCEPT_PAUSE_S: Final = 1.0
_WARN_EVERY_S: Final = 60.0


@dataclass(frozen=True)
class ServerBounds:
    """What one client can make the server hold (see the module)."""

    max_connections: int = 16
    connections_max_idle_ms: int = 10_000
    request_max_bytes: int = 8192


class _Connection:
    """One client: its request bytes, then its response, and its deadline."""

    __slots__ = ("deadline", "received", "response", "sent", "sock")

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.deadline = deadline
        self.received = bytearray()
        self.response: memoryview | None = None
        self.sent = 0


class _Warning:
    """A WARNING at most once a minute, counting the occurrences left out."""

    def __init__(self, message: str) -> None:
        self._message = message
        self._count = 0
        self._logged_at = -math.inf

    def note(self, *args: object) -> None:
        self._count += 1
        now = time.monotonic()
        if now - self._logged_at >= _WARN_EVERY_S:
            logger.warning(
                "metrics: " + self._message + " (%d time(s) since the last line)",
                *args,
                self._count,
            )
            self._count, self._logged_at = 0, now


_REASONS: Final = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


def _response(
    status: int, headers: list[tuple[str, str]], body: bytes, head: bool = False
) -> bytes:
    lines = [f"HTTP/1.1 {status} {_REASONS[status]}"]
    lines += [f"{name}: {value}" for name, value in headers]
    lines += [f"Content-Length: {len(body)}", "Connection: close", "", ""]
    return "\r\n".join(lines).encode("latin-1") + (b"" if head else body)


_REFUSAL: Final = _response(
    503, [("Content-Type", "text/plain")], b"seglog.metrics.max.connections reached\n"
)


class MetricsServer:
    """Serves ``registry`` at ``http://host:port/metrics`` from a thread of its own
    until ``close`` (see the module).

    Raises:
        OSError: the address cannot be bound (``__init__``).
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        host: str,
        port: int,
        bounds: ServerBounds,
        *,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        self._registry = registry
        self._on_close = on_close
        self.bounds = bounds
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[
            0
        ][0]
        self._listener = socket.create_server((host, port), family=family, backlog=BACKLOG)
        try:
            self._listener.setblocking(False)
            self._wake_receiver, self._wake_sender = socket.socketpair()
            self._wake_receiver.setblocking(False)
            self._selector = selectors.DefaultSelector()
            self._selector.register(self._listener, selectors.EVENT_READ, "listener")
            self._selector.register(self._wake_receiver, selectors.EVENT_READ, "wake")
        except BaseException:
            self._listener.close()
            raise
        self._connections: dict[socket.socket, _Connection] = {}
        self._accept_paused_until: float | None = None
        self._stopping = False
        self.accepted = 0
        """Connections served so far (the refused ones excluded)."""
        self.refused = 0
        """Connections closed at accept because ``max.connections`` were open."""
        self.timed_out = 0
        """Connections closed at their deadline (``connections.max.idle.ms``)."""
        self.too_large = 0
        """Requests answered 431 (``request.max.bytes``)."""
        self.accept_failures = 0
        """``accept`` calls that met ``EMFILE``/``ENFILE`` (accepting paused a second)."""
        self._refused_warning = _Warning("connection(s) refused: max.connections=%d are open")
        self._timeout_warning = _Warning(
            "connection(s) closed: no whole request within connections.max.idle.ms=%d"
        )
        self._large_warning = _Warning("request(s) over request.max.bytes=%d refused")
        self._accept_warning = _Warning("cannot accept: %s; accepting again in a second")
        self._failure_logged = False
        self._thread = threading.Thread(target=self._run, name="seglogfs-metrics", daemon=True)
        self._thread.start()

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._listener.getsockname()[:2]
        return str(host), int(port)

    @property
    def open_connections(self) -> int:
        return len(self._connections)

    def close(self) -> None:
        """Stop serving: ``on_close`` is called, the thread ends, every connection and
        the listener are closed."""
        if self._on_close is not None:
            self._on_close()
        self._stopping = True
        with contextlib.suppress(OSError):
            self._wake_sender.send(b"x")
        self._thread.join(5.0)

    # -- the thread ------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stopping:
                self._poll()
        except Exception:
            # A bug: /metrics stops answering, the mount goes on; say so once, loudly.
            logger.exception("metrics: the server stopped")
        finally:
            for connection in list(self._connections.values()):
                self._close(connection)
            self._selector.close()
            self._listener.close()
            self._wake_receiver.close()
            self._wake_sender.close()

    def _poll(self) -> None:
        now = time.monotonic()
        deadlines = [c.deadline for c in self._connections.values()]
        if self._accept_paused_until is not None:
            deadlines.append(self._accept_paused_until)
        timeout = max(0.0, min(deadlines) - now) if deadlines else None
        for key, mask in self._selector.select(timeout):
            if key.data == "listener":
                self._accept()
            elif key.data == "wake":
                with contextlib.suppress(OSError):
                    self._wake_receiver.recv(64)
            else:
                connection: _Connection = key.data
                if mask & selectors.EVENT_READ:
                    self._receive(connection)
                if mask & selectors.EVENT_WRITE and connection.sock in self._connections:
                    self._send(connection)
        now = time.monotonic()
        for connection in [c for c in self._connections.values() if c.deadline <= now]:
            self.timed_out += 1
            self._timeout_warning.note(self.bounds.connections_max_idle_ms)
            self._close(connection)
        if self._accept_paused_until is not None and self._accept_paused_until <= now:
            self._accept_paused_until = None
            self._selector.register(self._listener, selectors.EVENT_READ, "listener")

    def _accept(self) -> None:
        bounds = self.bounds
        while True:
            try:
                sock, _ = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    # The listener stays readable: stop looking at it for a second
                    # rather than spin, and leave the descriptors to the file system.
                    self.accept_failures += 1
                    self._accept_warning.note(exc.strerror or exc)
                    self._selector.unregister(self._listener)
                    self._accept_paused_until = time.monotonic() + _ACCEPT_PAUSE_S
                return  # ECONNABORTED and the like: the client gave up
            if len(self._connections) >= bounds.max_connections:
                self.refused += 1
                self._refused_warning.note(bounds.max_connections)
                try:
                    sock.setblocking(False)
                    sock.send(_REFUSAL)
                except OSError:
                    pass
                sock.close()
                continue
            sock.setblocking(False)
            connection = _Connection(sock, time.monotonic() + bounds.connections_max_idle_ms / 1000)
            self._connections[sock] = connection
            self._selector.register(sock, selectors.EVENT_READ, connection)
            self.accepted += 1

    def _receive(self, connection: _Connection) -> None:
        received = connection.received
        limit = self.bounds.request_max_bytes
        try:
            chunk = connection.sock.recv(min(_RECEIVE_CHUNK, limit + 1 - len(received)))
        except BlockingIOError:
            return
        except OSError:
            self._close(connection)
            return
        if not chunk:
            self._close(connection)  # gone before its request was whole
            return
        searched = max(0, len(received) - 3)
        received += chunk
        end = received.find(b"\r\n\r\n", searched)
        if 0 <= end <= limit - 4:
            self._answer(connection, bytes(received[:end]))
        elif len(received) > limit or end >= 0:
            self.too_large += 1
            self._large_warning.note(limit)
            body = f"the request is over seglog.metrics.request.max.bytes={limit}\n".encode()
            self._reply(connection, _response(431, [("Content-Type", "text/plain")], body))

    def _answer(self, connection: _Connection, head: bytes) -> None:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            self._reply(connection, _response(400, [], b""))
            return
        method, target, _ = parts
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        if method not in ("GET", "HEAD"):
            self._reply(connection, _response(405, [("Allow", "GET, HEAD")], b""))
            return
        path, _, query = target.partition("?")
        if path not in ("/metrics", "/"):
            self._reply(connection, _response(404, [], b"", method == "HEAD"))
            return
        try:
            encoder, content_type = choose_encoder(headers.get("accept", ""))
            registry = self._registry
            names = parse_qs(query).get("name[]")
            body = encoder(registry if names is None else registry.restricted_registry(names))
            response_headers = [("Content-Type", content_type)]
            if gzip_accepted(headers.get("accept-encoding", "")):
                body = gzip.compress(body, compresslevel=6)
                response_headers.append(("Content-Encoding", "gzip"))
        except Exception:
            # A collector's bug: this scrape fails, the next may not; the traceback once.
            if not self._failure_logged:
                self._failure_logged = True
                logger.exception("metrics: the page could not be made: answered 500")
            self._reply(connection, _response(500, [], b""))
            return
        self._reply(connection, _response(200, response_headers, body, method == "HEAD"))

    def _reply(self, connection: _Connection, response: bytes) -> None:
        """Send ``response`` (as much as the socket takes now, the rest when writable),
        then close; whatever else the client sends is not read."""
        connection.response = memoryview(response)
        connection.deadline = time.monotonic() + self.bounds.connections_max_idle_ms / 1000
        self._selector.modify(connection.sock, selectors.EVENT_WRITE, connection)
        self._send(connection)

    def _send(self, connection: _Connection) -> None:
        response = connection.response
        assert response is not None
        try:
            connection.sent += connection.sock.send(response[connection.sent :])
        except BlockingIOError:
            return
        except OSError:
            self._close(connection)
            return
        if connection.sent == len(response):
            self._close(connection)

    def _close(self, connection: _Connection) -> None:
        sock = connection.sock
        if self._connections.pop(sock, None) is None:
            return
        self._selector.unregister(sock)
        sock.close()

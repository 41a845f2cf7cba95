"""The control socket's client: the command line and Spark talk to a running daemon.

Each call opens its own connection (thread-safe), sends one request frame
(``seglogfs.control.protocol``) and waits for its answer. Importing this module does
not import trio: the command line starts faster without it.

Timeouts: connecting may take ``CONNECT_TIMEOUT_S`` (a daemon at ``max.connections``
leaves new connections in its listen backlog; a full backlog refuses them with
``EAGAIN``, and the client tries again); the whole exchange after that may take
``REQUEST_TIMEOUT_S``, Kafka's producer ``delivery.timeout.ms``: a produce legitimately
waits for the daemon's ``queued.max.request.bytes``, for a roll that fsyncs up to a
segment (seconds on a slow disk) or for a topic creation of a thousand partitions. A
daemon that does not answer in time is an ``OSError`` ``ControlError`` (``ETIMEDOUT``),
never a hang; the outcome of that request is unknown.
"""

from __future__ import annotations

import errno
import socket
import stat
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from .protocol import (
    FRAME,
    ControlError,
    ProduceRecord,
    encode_records,
    frame,
    parse_header,
    socket_address,
    socket_path,
)

__all__ = [
    "CONNECT_TIMEOUT_S",
    "PRODUCE_REQUEST_BYTES",
    "REQUEST_TIMEOUT_S",
    "daemon_socket",
    "produce",
    "request",
]

CONNECT_TIMEOUT_S = 10.0
"""How long a connection may take, the daemon's backlog full meanwhile."""
REQUEST_TIMEOUT_S = 120.0
"""How long one request may take once connected (sending it, the daemon's work, the
reply)."""
PRODUCE_REQUEST_BYTES = 8 << 20
"""``produce`` sends its records in requests of at most about this many bytes (a larger
record alone): a block of ``seglogfs produce`` (256 KiB of input) is always one request,
as it is one engine call without a daemon."""
RESPONSE_MAX_BYTES = 100 << 20
"""The largest reply this client reads."""

_RECORD_OVERHEAD = 24  # a v2 record's own fields, at most, beside key, value and headers
_STALE_ERRNOS = frozenset({errno.ECONNREFUSED, errno.ENOENT, errno.ENOTSOCK})


def _connect(log_dir: Path, timeout: float) -> socket.socket:
    """A connection to the daemon's socket, trying again while its backlog is full.

    Raises:
        OSError: ``ECONNREFUSED`` (a stale socket), ``ETIMEDOUT`` (still full after
            ``timeout``), or whatever ``connect`` says.
    """
    deadline = time.monotonic() + timeout
    pause = 0.005
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            sock.settimeout(timeout)
            with socket_address(Path(log_dir)) as address:
                sock.connect(address)
            return sock
        except BlockingIOError:
            sock.close()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(errno.ETIMEDOUT, "the daemon's backlog stays full") from None
            time.sleep(min(pause, remaining))
            pause = min(pause * 2, 0.2)
        except BaseException:
            sock.close()
            raise


def daemon_socket(log_dir: Path) -> Path | None:
    """The control socket of ``log_dir`` if a live daemon listens there.

    A socket file left by a killed daemon refuses connections and gives None; a daemon
    too busy to take the connection now (its backlog full) is still a daemon.
    Cost: one ``connect`` (no request).
    """
    path = socket_path(log_dir)
    try:
        if not stat.S_ISSOCK(path.stat().st_mode):
            return None
        _connect(Path(log_dir), 0).close()
    except (BlockingIOError, TimeoutError):
        return path
    except OSError:
        return None
    return path


def _recv_exactly(sock: socket.socket, n: int, deadline: float) -> bytes:
    buffer = bytearray(n)
    view = memoryview(buffer)
    got = 0
    while got < n:
        sock.settimeout(max(deadline - time.monotonic(), 0.001))
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ControlError("ProtocolError", "the daemon closed the connection")
        got += k
    return bytes(buffer)


def _exchange(
    log_dir: Path, op: str, args: Mapping[str, object], payload: bytes, timeout: float
) -> object:
    path = socket_path(log_dir)
    try:
        sock = _connect(Path(log_dir), CONNECT_TIMEOUT_S)
    except OSError as exc:
        if exc.errno in _STALE_ERRNOS:
            reason = f"no daemon answers on {path}: {exc.strerror}"
        else:
            reason = f"cannot connect to the daemon on {path}: {exc.strerror or exc}"
        raise ControlError("OSError", reason, exc.errno) from None
    deadline = time.monotonic() + timeout
    with sock:
        try:
            try:
                sock.settimeout(timeout)
                sock.sendall(frame({"op": op, "args": dict(args)}, payload))
            except (BrokenPipeError, ConnectionResetError):
                pass  # the daemon refused the frame unread: its reply says why
            header_length, payload_length = FRAME.unpack(_recv_exactly(sock, FRAME.size, deadline))
            if header_length + payload_length > RESPONSE_MAX_BYTES:
                raise ControlError(
                    "ProtocolError", f"a reply of {header_length + payload_length} bytes"
                )
            header = parse_header(_recv_exactly(sock, header_length, deadline))
            _recv_exactly(sock, payload_length, deadline)
        except TimeoutError:
            raise ControlError(
                "OSError",
                f"the daemon on {path} did not answer {op} within {timeout:g} s "
                "(its outcome is unknown)",
                errno.ETIMEDOUT,
            ) from None
        except OSError as exc:
            raise ControlError("OSError", f"lost the daemon on {path}: {exc}", exc.errno) from None
    if header.get("ok"):
        return header.get("result")
    raise ControlError(
        str(header.get("kind", "InternalError")),
        str(header.get("message", "the daemon gave no reason")),
        header.get("errno") if isinstance(header.get("errno"), int) else None,
    )


def request(
    log_dir: Path, op: str, *, timeout: float = REQUEST_TIMEOUT_S, **args: object
) -> object:
    """Send one admin request to the daemon owning ``log_dir``; return its result.

    Raises:
        ControlError: the daemon refused (``kind`` names the engine's error class) or
            no daemon answers, or not within ``timeout`` seconds (``kind == "OSError"``).
    """
    return _exchange(log_dir, op, args, b"", timeout)


def produce(
    log_dir: Path,
    topic: str,
    records: Sequence[ProduceRecord],
    *,
    partition: int | None = None,
    timeout: float = REQUEST_TIMEOUT_S,
) -> list[tuple[int, int, int]]:
    """Append ``records`` through the daemon, partitioned as ``append_records`` does;
    return (partition, first offset, last offset) per partition written by each request.

    The records go in order, in requests of at most about ``PRODUCE_REQUEST_BYTES``,
    halved while the daemon refuses them unread as over its ``socket.request.max.bytes``
    (each request is one producer call: keyless records of the next one may go to the
    next sticky partition, as a Kafka producer moves on when a batch is full). A
    request that fails otherwise stops the call; those before it stay appended.

    Raises:
        ControlError: as ``request`` (e.g. ``RecordTooLargeError``, ``UnknownTopicError``;
            ``ProtocolError`` for one record over ``socket.request.max.bytes``).
        ValueError: a negative timestamp.
    """
    written: list[tuple[int, int, int]] = []
    for part in _produce_requests(records):
        written += _produce_request(log_dir, topic, part, partition, timeout)
    return written


def _produce_request(
    log_dir: Path,
    topic: str,
    records: Sequence[ProduceRecord],
    partition: int | None,
    timeout: float,
) -> list[tuple[int, int, int]]:
    try:
        result = _exchange(
            log_dir,
            "produce",
            {"topic": topic, "partition": partition},
            encode_records(records),
            timeout,
        )
    except ControlError as exc:
        if exc.errno != errno.EMSGSIZE or len(records) < 2:
            raise
        middle = len(records) // 2
        return [
            *_produce_request(log_dir, topic, records[:middle], partition, timeout),
            *_produce_request(log_dir, topic, records[middle:], partition, timeout),
        ]
    assert isinstance(result, list)
    return [(int(p), int(first), int(last)) for p, first, last in result]


def _produce_requests(records: Sequence[ProduceRecord]) -> Iterator[Sequence[ProduceRecord]]:
    """``records`` cut into runs of about ``PRODUCE_REQUEST_BYTES`` once encoded."""
    start = 0
    size = 0
    for i, (key, value, headers, _timestamp) in enumerate(records):
        n = _RECORD_OVERHEAD + len(key or b"") + len(value or b"")
        n += sum(len(name) + len(data or b"") + 10 for name, data in headers)
        if size and size + n > PRODUCE_REQUEST_BYTES:
            yield records[start:i]
            start, size = i, 0
        size += n
    if start < len(records):
        yield records[start:]

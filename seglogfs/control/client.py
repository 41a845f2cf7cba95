"""The control socket's client: the command line and Spark talk to a running daemon.

Each call opens its own connection (thread-safe), sends one request frame
(``seglogfs.control.protocol``) and waits for its answer. Importing this module does
not import trio: the command line starts faster without it.
"""

from __future__ import annotations

import socket
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path

from .protocol import (
    FRAME,
    ControlError,
    ProduceRecord,
    check_lengths,
    encode_records,
    frame,
    parse_header,
    socket_address,
    socket_path,
)

__all__ = ["daemon_socket", "produce", "request"]

_CONNECT_TIMEOUT_S = 2.0


def _connect(log_dir: Path, timeout: float | None) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.settimeout(timeout)
        with socket_address(Path(log_dir)) as address:
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
            sock.sendall(frame({"op": op, "args": dict(args)}, payload))
            header_length, payload_length = FRAME.unpack(_recv_exactly(sock, FRAME.size))
            check_lengths(header_length, payload_length)
            header = parse_header(_recv_exactly(sock, header_length))
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
        log_dir, "produce", {"topic": topic, "partition": partition}, encode_records(records)
    )
    assert isinstance(result, list)
    return [(int(p), int(first), int(last)) for p, first, last in result]

"""The control socket's bounds: what one client, or many, can make the daemon hold.

Read from the ``server.properties`` the daemon loads (``seglogfs mount --config``), with
Kafka's broker names where Kafka has the setting (its ``SocketServer`` bounds a broker's
sockets with them) and a ``control.`` name where it has none:

=============================  ==========  ==============================================
setting                        default     reaching it
=============================  ==========  ==============================================
``socket.request.max.bytes``   104857600   a frame (JSON header + payload) declaring more
                                           is answered with a ``ProtocolError`` before any
                                           of it is read, and the connection is closed
``queued.max.request.bytes``   104857600   frames being read or served hold at most this
                                           much in all: a connection whose frame does not
                                           fit waits (unread) until others finish; -1:
                                           no bound (Kafka's default)
``max.connections``            64          the server stops accepting (connections wait
                                           in the listen backlog); if a connection is
                                           waiting, the one idle longest (a second at
                                           least) is closed
``connections.max.idle.ms``    600000      a connection without a frame in progress for
                                           that long is closed
``control.frame.timeout.ms``   30000       a frame (or its reply) not complete that long
                                           after its first byte: connection closed
``control.reserved.fds``       256         the server stops accepting while fewer
                                           descriptors than this are free, so the file
                                           system always has some
=============================  ==========  ==============================================

Kafka's defaults are kept except ``max.connections`` (Kafka: unbounded) and
``queued.max.request.bytes`` (Kafka: unbounded): every connection is a descriptor and
every frame is memory. Immutable: thread-safe.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from storage import ConfigError
from storage.number import INT_MAX, LONG_MAX, abbreviated, parse_java_integer

__all__ = ["ControlConfig"]

_UNBOUNDED = -1

# (lowest, highest) value of each field: Kafka's types (INT, LONG) and bounds.
_RANGES: dict[str, tuple[int, int]] = {
    "socket_request_max_bytes": (1, INT_MAX),
    "queued_max_request_bytes": (_UNBOUNDED, LONG_MAX),
    "max_connections": (1, INT_MAX),
    "connections_max_idle_ms": (1, LONG_MAX),
    "control_frame_timeout_ms": (1, LONG_MAX),
    "control_reserved_fds": (0, INT_MAX),
}


def _key(attr: str) -> str:
    return attr.replace("_", ".")


@dataclass(frozen=True)
class ControlConfig:
    """The control server's limits (see the module docstring for each)."""

    socket_request_max_bytes: int = 104857600
    queued_max_request_bytes: int = 104857600
    max_connections: int = 64
    connections_max_idle_ms: int = 600000
    control_frame_timeout_ms: int = 30000
    control_reserved_fds: int = 256

    def __post_init__(self) -> None:
        for attr, (low, high) in _RANGES.items():
            value = getattr(self, attr)
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
                raise ConfigError(_key(attr), value, f"must be a whole number from {low} to {high}")
        queued = self.queued_max_request_bytes
        if queued == 0:
            raise ConfigError("queued.max.request.bytes", 0, "must be positive, or -1 for no bound")
        if queued != _UNBOUNDED and queued < self.socket_request_max_bytes:
            # A frame of the largest size could never be read.
            raise ConfigError(
                "queued.max.request.bytes",
                queued,
                f"less than socket.request.max.bytes ({self.socket_request_max_bytes})",
            )

    @property
    def queued_bytes_bound(self) -> int | None:
        """``queued.max.request.bytes``, None when unbounded."""
        queued = self.queued_max_request_bytes
        return None if queued == _UNBOUNDED else queued

    @classmethod
    def from_properties(cls, props: Mapping[str, str]) -> ControlConfig:
        """The settings above found in ``server.properties``; others keep their default
        (every other key is someone else's and is ignored here).

        Raises:
            ConfigError: a value that is not a whole number in its range, naming the key.
        """
        values: dict[str, int] = {}
        for attr in _RANGES:
            raw = props.get(_key(attr))
            if raw is None:
                continue
            value = parse_java_integer(raw.strip())
            if value is None:
                raise ConfigError(_key(attr), abbreviated(raw), "Not a number of type LONG")
            values[attr] = value
        return cls(**values)

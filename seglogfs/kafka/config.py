"""Where the Kafka listener binds and what it advertises, with Kafka's broker names.

=============================  ==========  ==============================================
setting                        default     what it does
=============================  ==========  ==============================================
``listeners``                  (none)      ``PLAINTEXT://HOST:PORT``: the listener's
                                           address (``seglogfs mount --kafka HOST:PORT``
                                           overrides it); none: no listener. An empty
                                           host binds 127.0.0.1 (Kafka: every address),
                                           ``0.0.0.0`` every address
``advertised.listeners``       listeners   ``PLAINTEXT://HOST:PORT`` the Metadata and
                                           FindCoordinator answers name (also
                                           ``--kafka-advertised HOST:PORT``); clients
                                           connect there after bootstrapping
``node.id`` / ``broker.id``    0           the one broker's id
``socket.request.max.bytes``   104857600   a request frame declaring more closes its
                                           connection before any of it is read
``auto.create.topics.enable``  true        a Metadata request for a missing topic that
                                           allows it creates it (``num.partitions``)
``fetch.max.bytes``            57671680    the most one Fetch response carries, whatever
                                           the client asks (its first batch excepted)
``queued.max.request.bytes``   104857600   request frames being read or served hold at
                                           most this much in all: a frame that does not
                                           fit waits (unread) until others are answered;
                                           -1: no bound (Kafka's default). Not below
                                           ``socket.request.max.bytes``
=============================  ==========  ==============================================

Only the ``PLAINTEXT`` security protocol exists here (no TLS, no SASL): bind to
loopback unless the network is trusted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from storage import ConfigError
from storage.number import LONG_MAX

from ..properties import bounded_int

__all__ = ["DEFAULT_HOST", "KafkaConfig", "parse_host_port"]

DEFAULT_HOST = "127.0.0.1"
"""Bound when no host is given: the listener has no authentication."""

_TRUE_FALSE = {"true": True, "false": False}


def parse_host_port(value: str, key: str) -> tuple[str, int]:
    """``HOST:PORT``, ``:PORT``, ``[V6]:PORT`` or ``PLAINTEXT://HOST:PORT`` as (host,
    port); an empty host is ``DEFAULT_HOST``.

    Raises:
        ConfigError: not of that form, another security protocol, a port outside 0-65535.
    """
    text = value.strip()
    if "://" in text:
        scheme, _, text = text.partition("://")
        if scheme.upper() != "PLAINTEXT":
            raise ConfigError(key, value, "only PLAINTEXT://HOST:PORT is supported")
    if "," in text:
        raise ConfigError(key, value, "one listener only")
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit():
        raise ConfigError(key, value, "expected HOST:PORT")
    port = int(port_text)
    if port > 65535:
        raise ConfigError(key, value, "the port must be 0-65535")
    host = host.strip("[]") or DEFAULT_HOST
    return host, port


@dataclass(frozen=True)
class KafkaConfig:
    """The listener's settings (see the module). ``port`` 0 binds a free port, and the
    advertised port is then the bound one."""

    host: str = DEFAULT_HOST
    port: int = 9092
    advertised_host: str | None = None
    advertised_port: int | None = None
    node_id: int = 0
    socket_request_max_bytes: int = 104857600
    auto_create_topics: bool = True
    fetch_max_bytes: int = 57671680
    # Unbounded in Kafka; here each connection is a descriptor of the daemon, which
    # the file system needs too (the control socket is bounded the same way).
    max_connections: int = 256
    connections_max_idle_ms: int = 600_000
    # Kafka: -1 (unbounded); bounded here as on the control socket: every frame is
    # memory of the daemon, which the file system shares.
    queued_max_request_bytes: int = 104857600

    def __post_init__(self) -> None:
        queued = self.queued_max_request_bytes
        if queued == 0 or queued < -1:
            raise ConfigError("queued.max.request.bytes", queued, "must be positive, or -1")
        if queued != -1 and queued < self.socket_request_max_bytes:
            raise ConfigError(
                "queued.max.request.bytes",
                queued,
                f"must not be below socket.request.max.bytes ({self.socket_request_max_bytes}):"
                " a frame of that size could never be read",
            )

    @property
    def queued_bytes_bound(self) -> int | None:
        """``queued.max.request.bytes``, None when unbounded (-1)."""
        return None if self.queued_max_request_bytes == -1 else self.queued_max_request_bytes

    @classmethod
    def from_settings(
        cls,
        properties: Mapping[str, str],
        listener: str | None = None,
        advertised: str | None = None,
    ) -> KafkaConfig | None:
        """The config from ``server.properties`` and the command line's ``--kafka``
        (``listener``) and ``--kafka-advertised``; None when neither names a listener.

        Raises:
            ConfigError: a bad value (the error names the key).
        """
        if listener is not None:
            host, port = parse_host_port(listener, "--kafka")
        elif properties.get("listeners", "").strip():
            host, port = parse_host_port(properties["listeners"], "listeners")
        else:
            return None
        advertised_host = advertised_port = None
        if advertised is None and properties.get("advertised.listeners", "").strip():
            advertised = properties["advertised.listeners"]
        if advertised is not None:
            advertised_host, advertised_port = parse_host_port(advertised, "advertised.listeners")
        node_id = bounded_int(properties, "node.id", bounded_int(properties, "broker.id", 0, 0), 0)
        max_bytes = bounded_int(properties, "socket.request.max.bytes", 104857600, 1)
        fetch_max = bounded_int(properties, "fetch.max.bytes", 57671680, 0)
        auto_text = properties.get("auto.create.topics.enable", "true").strip().lower()
        if auto_text not in _TRUE_FALSE:
            raise ConfigError("auto.create.topics.enable", auto_text, "must be true or false")
        return cls(
            host,
            port,
            advertised_host,
            advertised_port,
            node_id,
            max_bytes,
            _TRUE_FALSE[auto_text],
            fetch_max,
            bounded_int(properties, "max.connections", 256, 1),
            bounded_int(properties, "connections.max.idle.ms", 600_000, 1),
            bounded_int(properties, "queued.max.request.bytes", 104857600, -1, LONG_MAX),
        )

"""Prometheus metrics of the daemon (``seglogfs mount --metrics HOST:PORT``).

Off by default. When on, ``/metrics`` is served by ``prometheus_client``'s HTTP server
in a thread of its own (``serve``): a scrape never runs on the trio thread, so it can
never stall a FUSE request, and it takes no lock of the write path.

Two kinds of metric:

- per topic-partition gauges read from the engine's own state at scrape time
  (``LogCollector``: log start and end offsets, size in bytes, number of segments),
  named as Kafka's JMX exporter names them (``kafka.log:type=Log,name=LogEndOffset``
  becomes ``kafka_log_log_logendoffset``);
- counters incremented where the work happens (``MountCounters``): FUSE requests by
  operation and their errors by errno (``handler``), records and bytes appended per
  topic through the mount (``write_path``), bytes read per topic through the mount
  (``read_path``), segments rolled on time and deleted by retention (``maintenance``).
  Each increment is one ``prometheus_client`` counter's add: a dict lookup and a
  private mutex held for the add, nothing shared with the engine.

``COUNTERS`` is ``None`` when metrics are off: the hot paths then check one global.

Thread-safety: the counters may be incremented from any thread (the write path counts
in worker threads, the rest on the trio thread); the collector runs in the HTTP
server's thread and only reads the engine's thread-safe properties.
"""

from __future__ import annotations

import errno
import logging
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

from storage import LogManager, StorageError

if TYPE_CHECKING:  # prometheus_client is loaded only when metrics are on
    from wsgiref.simple_server import WSGIServer

    from prometheus_client import CollectorRegistry
    from prometheus_client.core import GaugeMetricFamily

__all__ = [
    "COUNTERS",
    "METRICS_KEY",
    "LogCollector",
    "MetricsServer",
    "MountCounters",
    "parse_listener",
    "serve",
]

logger = logging.getLogger(__name__)

METRICS_KEY = "seglog.metrics.listener"
"""The ``--config`` key of ``--metrics`` (the option wins when both are given)."""

DEFAULT_HOST = "127.0.0.1"

MOUNT = "mount"
"""The ``path`` label of what came through the file system (the control socket and
the Kafka listener are other paths, not counted yet)."""


def parse_listener(value: str, where: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``:PORT`` or ``PORT`` (host 127.0.0.1); ``[v6]:PORT``.

    Raises:
        ValueError: not an address, the message naming ``where``.
    """
    host, sep, port_text = value.strip().rpartition(":")
    if not sep:
        host = ""
    host = host.strip("[]") or DEFAULT_HOST
    try:
        port = int(port_text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise ValueError(f"{where}={value!r}: expected HOST:PORT with a port 0-65535")
    return host, port


class MountCounters:
    """The counters incremented on the FUSE path and by the background work."""

    def __init__(self, registry: CollectorRegistry) -> None:
        from prometheus_client import Counter

        self.fuse_requests = Counter(
            "seglogfs_fuse_requests",
            "FUSE requests answered, by operation",
            ["operation"],
            registry=registry,
        )
        self.fuse_errors = Counter(
            "seglogfs_fuse_errors",
            "FUSE requests answered with an error, by operation and errno",
            ["operation", "errno"],
            registry=registry,
        )
        self.messages_in = Counter(
            "kafka_server_brokertopicmetrics_messagesin",
            "Records appended, per topic and path (Kafka's MessagesInPerSec)",
            ["topic", "path"],
            registry=registry,
        )
        self.bytes_in = Counter(
            "kafka_server_brokertopicmetrics_bytesin",
            "Record-batch bytes appended, per topic and path (Kafka's BytesInPerSec)",
            ["topic", "path"],
            registry=registry,
        )
        self.bytes_read = Counter(
            "seglogfs_read_bytes",
            "Bytes answered to reads, per topic and path (rendered as the topic's format)",
            ["topic", "path"],
            registry=registry,
        )
        self.segments_rolled = Counter(
            "seglogfs_segments_rolled_on_time",
            "Segments rolled by the background work because segment.ms passed",
            registry=registry,
        )
        self.segments_deleted = Counter(
            "seglogfs_retention_segments_deleted",
            "Segments deleted by retention passes",
            registry=registry,
        )

    def fuse_request(self, operation: str) -> None:
        self.fuse_requests.labels(operation).inc()

    def fuse_error(self, operation: str, code: int) -> None:
        self.fuse_errors.labels(operation, errno.errorcode.get(code, str(code))).inc()

    def appended(self, topic: str, records: int, size: int) -> None:
        self.messages_in.labels(topic, MOUNT).inc(records)
        self.bytes_in.labels(topic, MOUNT).inc(size)

    def read(self, topic: str, size: int) -> None:
        self.bytes_read.labels(topic, MOUNT).inc(size)


COUNTERS: MountCounters | None = None
"""The daemon's counters; ``None`` while metrics are off."""


class LogCollector:
    """Per topic-partition gauges read from the engine at scrape time."""

    def __init__(self, manager: LogManager) -> None:
        self._manager = manager

    def collect(self) -> Iterator[GaugeMetricFamily]:
        from prometheus_client.core import GaugeMetricFamily

        labels = ["topic", "partition"]
        start = GaugeMetricFamily(
            "kafka_log_log_logstartoffset",
            "The log start offset (Kafka's LogStartOffset)",
            labels=labels,
        )
        end = GaugeMetricFamily(
            "kafka_log_log_logendoffset",
            "The offset the next record gets (Kafka's LogEndOffset)",
            labels=labels,
        )
        size = GaugeMetricFamily(
            "kafka_log_log_size",
            "Bytes in the partition's .log files (Kafka's Size)",
            labels=labels,
        )
        segments = GaugeMetricFamily(
            "kafka_log_log_numlogsegments",
            "Segments of the partition (Kafka's NumLogSegments)",
            labels=labels,
        )
        try:
            logs = self._manager.logs()
        except (StorageError, OSError) as exc:
            logger.warning("metrics: the logs could not be listed: %s", exc)
            logs = []
        for log in logs:
            if log.closed:
                continue  # its topic was deleted since the snapshot
            values = [log.topic, str(log.partition)]
            try:
                start.add_metric(values, log.log_start_offset)
                end.add_metric(values, log.log_end_offset)
                size.add_metric(values, log.size)
                segments.add_metric(values, log.number_of_segments)
            except (StorageError, OSError):
                continue  # deleted under the scrape
        yield from (start, end, size, segments)


class MetricsServer:
    """The HTTP server of ``/metrics`` in its own thread; ``close`` stops it."""

    def __init__(self, server: WSGIServer, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def close(self) -> None:
        global COUNTERS
        COUNTERS = None
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5.0)


def serve(manager: LogManager, host: str, port: int) -> MetricsServer:
    """Start counting and serve ``/metrics`` on ``host:port``.

    Raises:
        OSError: the address cannot be bound.
    """
    from prometheus_client import CollectorRegistry, start_http_server

    global COUNTERS
    registry = CollectorRegistry(auto_describe=False)
    registry.register(LogCollector(manager))
    counters = MountCounters(registry)
    server, thread = start_http_server(port, host, registry=registry)
    COUNTERS = counters
    return MetricsServer(server, thread)

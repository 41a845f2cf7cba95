"""Prometheus metrics of the daemon (``seglogfs mount --metrics HOST:PORT``).

Off by default. When on, ``/metrics`` is served by ``metrics_server.MetricsServer``, a
bounded HTTP server in a thread of its own (at most ``seglog.metrics.max.connections``
connections, each with a deadline and a request size bound): a scrape never runs on
the trio thread, so it can never stall a FUSE request, and it takes no lock of the
write path. The page itself is made by ``prometheus_client``.

Three kinds of metric:

- read at scrape time from state that exists anyway: per topic-partition gauges from
  the engine (``LogCollector``: log start and end offsets, size in bytes, number of
  segments), named as Kafka's JMX exporter names them (``kafka.log:type=Log,
  name=LogEndOffset`` becomes ``kafka_log_log_logendoffset``); consumer groups'
  committed offsets and lag (``GroupCollector``, named as kafka_exporter names them);
  the process (``prometheus_client``'s ``ProcessCollector``: descriptors, RSS, CPU)
  and the segment files it holds open or mapped (``SegmentFilesCollector``, from
  ``/proc/self``); the render process's fills (``RendererCollector``); the metrics
  server's own refusals;
- requests, timed where they are answered: FUSE requests by operation (``handler``),
  Kafka requests by API (``seglogfs.kafka.server``, given these counters as its
  ``BrokerCounters``), control-socket requests by op (``seglogfs.control.server``).
  ``RequestTimes`` keeps one histogram per kind in plain lists, updated on the trio
  thread only without a lock (a ``perf_counter`` pair, a dict lookup, a ``bisect`` and
  two adds) and turned into ``prometheus_client`` metric families at scrape time;
- counters incremented where the work happens (``MountCounters``): FUSE errors by
  errno (``handler``), records and bytes appended per topic and path (the mount's
  ``write_path``, the Kafka listener's Produce, the control socket's produce: records
  only), bytes read per topic through the mount (``read_path``) and fetched through
  the Kafka listener, segments rolled on time and deleted by retention, cleaning
  passes and the bytes they reclaimed (``maintenance``). Each increment is one
  ``prometheus_client`` counter's add (on the hot paths to a labelled child cached by
  its labels: a dict lookup and the child's private mutex), nothing shared with the
  engine.

``COUNTERS`` is ``None`` when metrics are off: the hot paths then check one global.

Thread-safety: the counters may be incremented from any thread (the write path counts
in worker threads, the rest on the trio thread); ``RequestTimes`` is written on the trio
thread only and read by the scrape (a list copy is atomic under the GIL; a scrape may
see a request in ``_count`` and not yet in ``_sum``); the collectors run in the HTTP
server's thread and read the engine's thread-safe properties, the group store under
its own lock.
"""

from __future__ import annotations

import bisect
import errno
import logging
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from storage import OFFSETS_TOPIC, LogManager, OffsetStore, StorageError

from ..properties import bounded_int

if TYPE_CHECKING:  # prometheus_client is loaded only when metrics are on
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import Metric

    from .metrics_server import MetricsServer
    from .renderer import Renderer

__all__ = [
    "COUNTERS",
    "FUSE_BUCKETS",
    "METRICS_KEY",
    "GroupCollector",
    "LogCollector",
    "MetricsConfig",
    "MountCounters",
    "RequestTimes",
    "SegmentFilesCollector",
    "parse_listener",
    "serve",
    "watch_renderer",
]

logger = logging.getLogger(__name__)

METRICS_KEY = "seglog.metrics.listener"
"""The ``--config`` key of ``--metrics`` (the option wins when both are given)."""

MAX_CONNECTIONS_KEY = "seglog.metrics.max.connections"
IDLE_KEY = "seglog.metrics.connections.max.idle.ms"
REQUEST_MAX_BYTES_KEY = "seglog.metrics.request.max.bytes"

DEFAULT_HOST = "127.0.0.1"

MOUNT = "mount"
"""The ``path`` label of what came through the file system."""
KAFKA = "kafka"
"""The ``path`` label of what came through the Kafka listener."""
CONTROL = "control"
"""The ``path`` label of what came through the control socket (``seglogfs produce``,
the Spark sink)."""

FUSE_BUCKETS: Final = (
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
"""Upper bounds (seconds) of the FUSE latency histogram: a request answered from
memory takes tens of microseconds, one that waits for a roll's fsync or a cold disk
milliseconds to seconds."""

BACKGROUND_BUCKETS: Final = (0.001, 0.01, 0.1, 0.5, 1.0, 5.0, 30.0, 120.0, 600.0, 3600.0)
"""Upper bounds (seconds) of the background passes' histogram: a retention pass over a
few logs takes milliseconds, a cleaning pass over gigabytes minutes."""


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


@dataclass(frozen=True)
class MetricsConfig:
    """Where ``/metrics`` is served and the server's bounds (``metrics_server``)."""

    host: str
    port: int
    max_connections: int = 16
    connections_max_idle_ms: int = 10_000
    request_max_bytes: int = 8192

    @classmethod
    def from_settings(
        cls, properties: Mapping[str, str], listener: str | None, where: str
    ) -> MetricsConfig | None:
        """The config from ``--metrics`` (``listener``, found at ``where``) and the
        ``seglog.metrics.*`` keys of ``server.properties``; None without a listener.

        Raises:
            ValueError: a bad listener, naming ``where``.
            ConfigError: a bound that is not a whole number in its range.
        """
        if listener is None:
            return None
        host, port = parse_listener(listener, where)
        return cls(
            host,
            port,
            bounded_int(properties, MAX_CONNECTIONS_KEY, 16, 1),
            bounded_int(properties, IDLE_KEY, 10_000, 1),
            bounded_int(properties, REQUEST_MAX_BYTES_KEY, 8192, 256),
        )


class RequestTimes:
    """Per kind of request (a FUSE operation, a Kafka API, a control-socket op): a
    histogram of answer times (``FUSE_BUCKETS``) and the sum, exported as a counter of
    requests and a histogram.

    Not thread-safe for writers: ``observe`` runs on the trio thread only (where FUSE
    handlers, the Kafka listener and the control socket answer). Cost: O(log buckets)
    per request, no lock, no allocation after a kind's first request.
    """

    __slots__ = ("_counts", "_help", "_label", "_names", "_sums")

    def __init__(self, names: tuple[str, str], helps: tuple[str, str], label: str) -> None:
        self._names = names
        self._help = helps
        self._label = label
        self._counts: dict[str, list[int]] = {}  # per bucket, not cumulative; last: +Inf
        self._sums: dict[str, list[float]] = {}  # one element: a list so it is shared

    def observe(self, kind: str, seconds: float) -> None:
        counts = self._counts.get(kind)
        if counts is None:
            counts = self._counts[kind] = [0] * (len(FUSE_BUCKETS) + 1)
            self._sums[kind] = [0.0]
        counts[bisect.bisect_left(FUSE_BUCKETS, seconds)] += 1
        self._sums[kind][0] += seconds

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

        requests = CounterMetricFamily(self._names[0], self._help[0], labels=[self._label])
        times = HistogramMetricFamily(self._names[1], self._help[1], labels=[self._label])
        for kind in sorted(self._counts):
            counts = list(self._counts[kind])  # one atomic copy: consistent buckets
            total = 0
            buckets: list[tuple[str, float]] = []
            for bound, count in zip((*map(str, FUSE_BUCKETS), "+Inf"), counts, strict=True):
                total += count
                buckets.append((bound, total))
            requests.add_metric([kind], total)
            times.add_metric([kind], buckets, self._sums[kind][0])
        yield requests
        yield times


class MountCounters:
    """The counters incremented on the FUSE path and by the background work."""

    def __init__(self, registry: CollectorRegistry) -> None:
        from prometheus_client import Counter, Histogram

        self.fuse_times = RequestTimes(
            ("seglogfs_fuse_requests", "seglogfs_fuse_request_duration_seconds"),
            (
                "FUSE requests answered, by operation",
                "Time from a FUSE request's arrival in its handler to its answer",
            ),
            "operation",
        )
        self.kafka_times = RequestTimes(
            ("kafka_network_requestmetrics_requests", "seglogfs_kafka_request_duration_seconds"),
            (
                "Kafka requests answered, by API (Kafka's RequestsPerSec)",
                "Time from a Kafka request decoded to its response made (Kafka's TotalTimeMs "
                "without the network)",
            ),
            "request",
        )
        self.control_times = RequestTimes(
            ("seglogfs_control_requests", "seglogfs_control_request_duration_seconds"),
            (
                "Control-socket requests answered, by op",
                "Time from a control-socket request read to its answer made",
            ),
            "op",
        )
        self.renderer: Renderer | None = None
        # Labelled children by their labels: ``labels()`` takes the family's lock and
        # builds a key on every call (3 us where the child's ``inc`` takes 1). Two
        # threads that both miss get the same child from ``labels()``.
        self._in: dict[tuple[str, str], tuple[Counter, Counter]] = {}
        self._read: dict[str, Counter] = {}
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
        self.bytes_out = Counter(
            "kafka_server_brokertopicmetrics_bytesout",
            "Record-batch bytes sent to Kafka consumers, per topic (Kafka's BytesOutPerSec)",
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
        self.cleaner_passes = Counter(
            "seglogfs_cleaner_passes",
            "Log cleaning passes (compaction) run by the background work, per log",
            registry=registry,
        )
        self.cleaner_bytes_reclaimed = Counter(
            "seglogfs_cleaner_bytes_reclaimed",
            "Bytes of .log files the background cleaning passes removed",
            registry=registry,
        )
        self.background_seconds = Histogram(
            "seglogfs_background_pass_seconds",
            "Duration of the background passes: every retention pass, and the roll and "
            "cleaning passes that rolled or cleaned something",
            ["task"],
            buckets=BACKGROUND_BUCKETS,
            registry=registry,
        )

    def fuse_request(self, operation: str, seconds: float) -> None:
        """A request answered (also with an error) ``seconds`` after it arrived."""
        self.fuse_times.observe(operation, seconds)

    def kafka_request(self, api: str, seconds: float) -> None:
        self.kafka_times.observe(api, seconds)

    def control_request(self, op: str, seconds: float) -> None:
        self.control_times.observe(op, seconds)

    def fuse_error(self, operation: str, code: int) -> None:
        self.fuse_errors.labels(operation, errno.errorcode.get(code, str(code))).inc()

    def appended(self, topic: str, records: int, size: int | None, path: str = MOUNT) -> None:
        """Records appended (``size``: their batches' bytes; None where the path does
        not know them: the control socket's produce)."""
        children = self._in.get((topic, path))
        if children is None:
            children = self._in[topic, path] = (
                self.messages_in.labels(topic, path),
                self.bytes_in.labels(topic, path),
            )
        children[0].inc(records)
        if size is not None:
            children[1].inc(size)

    def read(self, topic: str, size: int) -> None:
        child = self._read.get(topic)
        if child is None:
            child = self._read[topic] = self.bytes_read.labels(topic, MOUNT)
        child.inc(size)

    def fetched(self, topic: str, size: int) -> None:
        self.bytes_out.labels(topic, KAFKA).inc(size)

    def cleaned(self, passes: int, reclaimed: int) -> None:
        self.cleaner_passes.inc(passes)
        self.cleaner_bytes_reclaimed.inc(reclaimed)

    def background(self, task: str, seconds: float) -> None:
        """A background pass (``retention``, ``roll``, ``clean``) took ``seconds``."""
        self.background_seconds.labels(task).observe(seconds)


COUNTERS: MountCounters | None = None
"""The daemon's counters; ``None`` while metrics are off."""


def watch_renderer(renderer: Renderer | None) -> None:
    """Export the render process's fills (nothing while metrics are off)."""
    counters = COUNTERS
    if counters is not None:
        counters.renderer = renderer


class LogCollector:
    """Per topic-partition gauges read from the engine at scrape time."""

    def __init__(self, manager: LogManager) -> None:
        self._manager = manager

    def collect(self) -> Iterator[Metric]:
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


class GroupCollector:
    """Per consumer group and partition: the committed offset and the lag (log end
    offset - committed, what ``seglogfs groups describe`` prints as LAG), named as
    kafka_exporter names them. Nothing is read, and no group store made, while the
    log directory has no ``__consumer_offsets``.

    Cost: the store's first use reads the offsets topic; then O(groups x partitions)
    under the store's lock.
    """

    def __init__(self, manager: LogManager) -> None:
        self._manager = manager

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        labels = ["consumergroup", "topic", "partition"]
        current = GaugeMetricFamily(
            "kafka_consumergroup_current_offset",
            "The group's committed offset of the partition (kafka_exporter's name)",
            labels=labels,
        )
        lag = GaugeMetricFamily(
            "kafka_consumergroup_lag",
            "Log end offset minus the group's committed offset (kafka_exporter's name)",
            labels=labels,
        )
        manager = self._manager
        try:
            if OFFSETS_TOPIC in manager.topics():
                store = OffsetStore.shared(manager)
                for group in store.list_groups():
                    for (topic, partition), value in sorted(store.committed(group).items()):
                        values = [group, topic, str(partition)]
                        current.add_metric(values, value.offset)
                        try:
                            log = manager.log(topic, partition)
                            end = log.log_end_offset
                        except (StorageError, OSError):
                            continue  # the topic is gone: no end to measure against
                        lag.add_metric(values, end - value.offset)
        except (StorageError, OSError) as exc:
            logger.warning("metrics: consumer groups could not be read: %s", exc)
        yield current
        yield lag


_SEGMENT_SUFFIXES: Final = (".log",)
_INDEX_SUFFIXES: Final = (".index", ".timeindex", ".seglogpos")


def _is_segment_file(path: str, suffixes: tuple[str, ...]) -> bool:
    """Whether ``path`` names a segment's file (``<20-digit base offset><suffix>``):
    not any ``.log`` (the daemon's own output may go to one)."""
    if not path.endswith(suffixes):
        return False
    name = path.rpartition("/")[2]
    return len(name) > 20 and name[:20].isdigit() and name[20] == "."


class SegmentFilesCollector:
    """The segment files the process holds: descriptors of ``.log`` files and mapped
    index files, as the kernel sees them (``/proc/self/fd``, ``/proc/self/maps``), so
    whatever the engine's bookkeeping, this is what counts against ``LimitNOFILE`` and
    ``vm.max_map_count``.

    Cost: one ``readlink`` per open descriptor and one pass over the mappings, in the
    server's thread (the descriptors are bounded by ``log.segment.open.max``).
    """

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        logs = 0
        try:
            names = os.listdir("/proc/self/fd")
        except OSError:
            names = []
        for name in names:
            try:
                target = os.readlink(f"/proc/self/fd/{name}")
            except OSError:
                continue  # closed since the listing
            if _is_segment_file(target, _SEGMENT_SUFFIXES):
                logs += 1
        mapped: set[str] = set()
        mappings = 0
        try:
            with open("/proc/self/maps", "rb") as maps:
                for line in maps:
                    path = line.rstrip().rsplit(b" ", 1)[-1].decode(errors="replace")
                    if _is_segment_file(path, _INDEX_SUFFIXES):
                        mapped.add(path)
                        mappings += 1
        except OSError:
            pass
        yield GaugeMetricFamily(
            "seglogfs_segment_log_files_open",
            "Descriptors the daemon holds on segments' .log files (reads in progress included)",
            value=logs,
        )
        yield GaugeMetricFamily(
            "seglogfs_index_files_mapped",
            "Index files (.index, .timeindex, .seglogpos) the daemon has mapped",
            value=len(mapped),
        )
        yield GaugeMetricFamily(
            "seglogfs_index_mappings",
            "Memory mappings of index files (what counts against vm.max_map_count)",
            value=mappings,
        )


class RendererCollector:
    """The render process's fills (``renderer.Renderer``), read at scrape time."""

    def __init__(self, counters: MountCounters) -> None:
        self._counters = counters

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        renderer = self._counters.renderer
        up = renderer is not None and renderer.alive
        yield GaugeMetricFamily(
            "seglogfs_render_process_up",
            "1 while the render process renders sequential reads, 0 when reads render "
            "in the daemon's threads",
            value=1 if up else 0,
        )
        yield CounterMetricFamily(
            "seglogfs_render_fills",
            "Slots the render process filled for sequential readers",
            value=0 if renderer is None else renderer.fills,
        )
        yield CounterMetricFamily(
            "seglogfs_render_filled_bytes",
            "Bytes the render process rendered into slots",
            value=0 if renderer is None else renderer.filled_bytes,
        )


class ServerCollector:
    """The metrics server's own refusals (its bounds reached)."""

    def __init__(self) -> None:
        self.server: MetricsServer | None = None

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        server = self.server
        if server is None:
            return
        yield GaugeMetricFamily(
            "seglogfs_metrics_connections",
            "Connections to the metrics server open now (this scrape's included)",
            value=server.open_connections,
        )
        closed = CounterMetricFamily(
            "seglogfs_metrics_connections_closed",
            "Connections the metrics server closed because a bound was reached",
            labels=["reason"],
        )
        closed.add_metric(["max_connections"], server.refused)
        closed.add_metric(["idle_timeout"], server.timed_out)
        closed.add_metric(["request_too_large"], server.too_large)
        closed.add_metric(["accept_failed"], server.accept_failures)
        yield closed


class _RequestCollector:
    def __init__(self, counters: MountCounters) -> None:
        self._counters = counters

    def collect(self) -> Iterator[Metric]:
        counters = self._counters
        for times in (counters.fuse_times, counters.kafka_times, counters.control_times):
            yield from times.collect()


def serve(manager: LogManager, config: MetricsConfig) -> MetricsServer:
    """Start counting and serve ``/metrics`` at ``config``'s address.

    Raises:
        OSError: the address cannot be bound.
    """
    from prometheus_client import CollectorRegistry, ProcessCollector

    from .metrics_server import MetricsServer, ServerBounds

    global COUNTERS
    try:
        # Collectors that make their families at scrape time are then also asked when
        # a scraper restricts the page (``?name[]=``); older prometheus-client: not.
        registry = CollectorRegistry(auto_describe=False, support_collectors_without_names=True)
    except TypeError:
        registry = CollectorRegistry(auto_describe=False)
    registry.register(LogCollector(manager))
    registry.register(GroupCollector(manager))
    counters = MountCounters(registry)
    registry.register(_RequestCollector(counters))
    registry.register(RendererCollector(counters))
    registry.register(SegmentFilesCollector())
    ProcessCollector(registry=registry)
    server_collector = ServerCollector()
    registry.register(server_collector)
    bounds = ServerBounds(
        config.max_connections, config.connections_max_idle_ms, config.request_max_bytes
    )
    server = MetricsServer(registry, config.host, config.port, bounds, on_close=_stop_counting)
    server_collector.server = server
    COUNTERS = counters
    return server


def _stop_counting() -> None:
    global COUNTERS
    COUNTERS = None

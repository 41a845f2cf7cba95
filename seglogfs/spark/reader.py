"""Batch reads: plan offset ranges on the driver, read them from segment files in tasks.

Planning (``SeglogBatchReader.partitions``, in Spark's planner process) opens the log
directory read-only, resolves the subscription and the starting/ending offsets to one
``OffsetRange`` per topic-partition, and narrows them with the filters Spark pushes
down. The ranges then become Spark tasks: with ``minPartitions`` as Kafka's
``KafkaOffsetRangeCalculator`` does (split to at least that many); without it by size,
as Spark plans the files of ``spark.read.text`` (``plan_tasks``: a large range split by
offsets, small ones packed into one task, ``OffsetRanges``). Each task
(``read_offset_range``, once per range) then reads straight from the segment files
through a read-only ``LogManager`` (no daemon, no socket: readers never need the
writer) and yields Arrow record batches built from the engine's columns.

Filter pushdown (Spark 4.1+ ``pushFilters``, enabled by ``register``): ``topic`` and
``partition`` (=, IN, comparisons) select partitions and ``offset`` comparisons narrow
ranges exactly, so Spark does not re-check them; ``timestamp >=``/``>`` moves each
range's start to the first record at or after that time through the time index, and
Spark still re-checks it (record timestamps need not be monotonic). Other filters are
left to Spark.

Thread-safety: a reader object is used by one Spark planner or task at a time. The
per-process ``LogManager`` cache is guarded by a lock.
"""

from __future__ import annotations

import datetime as dt
import gc
import itertools
import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import pyarrow as pa
from librt.strings import BytesWriter
from pyspark.sql.datasource import (
    DataSourceReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    IsNotNull,
    LessThan,
    LessThanOrEqual,
)

from storage import (
    CorruptRecordError,
    DefaultRecordBatch,
    LogManager,
    OffsetOutOfRangeError,
    RecordBatch,
    RecordColumns,
    StorageError,
    UnknownTopicError,
)
from storage.record.record_columns import PackedColumns

from .arrow import SMALL_BATCH_ROWS, Projection, RecordSpan, arrow_batches
from .errors import CorruptDataError, DataLossError, OptionError
from .options import (
    PartitionOffsets,
    ReadOptions,
    TopicPartition,
    partition_counts,
    resolve_ending_offsets,
    resolve_starting_offsets,
)
from .worker_socket import UnpickledInTasks

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class OffsetRange(InputPartition):
    """Records ``[start, end)`` of one topic-partition: one Spark task's input."""

    topic: str
    partition: int
    start: int
    end: int
    min_timestamp: int | None = None  # pushed down: start at the first record at/after it

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class OffsetRanges(InputPartition):
    """Several small ranges one Spark task reads one after the other (``plan_tasks``),
    as Spark packs small files into one task of ``spark.read.text``."""

    ranges: tuple[OffsetRange, ...]


MAX_PACKED_BYTES: Final = 128 << 20
"""Ranges are packed into one task up to this many bytes of segments (``plan_tasks``):
Spark's ``spark.sql.files.maxPartitionBytes`` default, up to which
``spark.read.text`` packs small files into one task."""
OPEN_COST_BYTES: Final = 4 << 20
"""What a range costs beyond its bytes when ranges are packed into tasks: Spark's
``spark.sql.files.openCostInBytes`` default."""


TOPICS_FILE = "seglog-topics.json"
"""The log directory's topic metadata (README, "Layout"): rewritten on every topic
create, alter and delete."""


class ReadOnlyLogDir:
    """A read-only ``LogManager`` kept open across calls and brought up to date at each.

    ``LogManager.refresh`` picks up new data, segments and partitions, but keeps the
    logs it already has: after a topic is deleted and created again it would go on
    serving the deleted records from their still-open files. So the manager is opened
    afresh whenever the topic metadata file has changed (another inode or mtime), and
    merely refreshed otherwise.

    Not thread-safe: one per thread, or guarded by the caller.
    """

    def __init__(self, log_dir: str) -> None:
        self.log_dir = log_dir
        self._manager: LogManager | None = None
        self._stamp: tuple[int, int] | None = None

    def _topics_stamp(self) -> tuple[int, int] | None:
        try:
            st = os.stat(os.path.join(self.log_dir, TOPICS_FILE))
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns)

    def get(self) -> LogManager:
        """The manager, current as of this call.

        Cost: one ``stat``, then a ``refresh`` (O(partitions)), or a full read-only
        open when topics changed.

        Raises:
            OptionError: the path is not a log directory.
        """
        # The stamp is taken before opening: a change racing with the open is seen
        # (as a different stamp) by the next call, never missed.
        stamp = self._topics_stamp()
        if self._manager is not None and stamp == self._stamp:
            self._manager.refresh()
            return self._manager
        self.close()
        self._manager = open_read_only(self.log_dir)
        self._stamp = stamp
        return self._manager

    def close(self) -> None:
        if self._manager is not None:
            self._manager.close()
            self._manager = None


_managers: dict[str, ReadOnlyLogDir] = {}
_managers_lock = threading.Lock()
_heap_frozen = False


def freeze_worker_heap() -> None:
    """Once in a reused Spark Python worker: collect, then move every object alive now
    (the modules of pyspark, pyarrow, numpy, the engine and this package, about 48,000
    objects) to the garbage collector's permanent generation (``gc.freeze``).

    Spark's daemon runs a full ``gc.collect()`` in a reused worker after every task,
    and the worker takes no next task until it is done; each such collection scanned
    those long-lived objects again (16 ms of CPU per planner call and 33 ms per read
    task, measured in this source's workers: at 10^6 records about a third of a
    query's Python time). Frozen objects are still freed by reference counting when
    they are dropped; only a reference cycle among them is never collected, at most
    what was alive at this one moment.

    A no-op outside a reused Spark worker (``SPARK_REUSE_WORKER``, which Spark sets
    for those processes alone): the driver and other programs keep their collector
    as it was. Cost: one ``gc.collect()``, once per process.
    """
    global _heap_frozen
    if _heap_frozen or not os.environ.get("SPARK_REUSE_WORKER"):
        return
    _heap_frozen = True
    gc.collect()
    gc.freeze()


def shared_manager(log_dir: str) -> LogManager:
    """A read-only ``LogManager`` of ``log_dir`` for this process, current as of this
    call (``ReadOnlyLogDir``).

    Spark reuses its Python workers across tasks, so the cost of opening every
    partition is paid once per worker (and again after a topic change), and each task
    then pays one ``refresh``.

    Raises:
        OptionError: the directory does not exist or its metadata is unreadable.
    """
    with _managers_lock:
        view = _managers.get(log_dir)
        if view is None:
            view = _managers[log_dir] = ReadOnlyLogDir(log_dir)
        return view.get()


def engine_columns(
    manager: LogManager, r: OffsetRange, *, fail_on_data_loss: bool, records: bool = True
) -> Iterator[RecordColumns | PackedColumns | RecordSpan]:
    """The columns of every consumer-visible record of ``r``, one engine batch at a time
    (see ``_columns`` for which are packed). With ``records`` false (a projection that
    needs no record: ``Projection.needs_records``), a v2 batch whose offsets have no
    gap comes as a ``RecordSpan`` read from its header, its records never decoded
    (its CRC is still checked, as on every read).

    Control batches (transaction markers) are skipped, as a Kafka consumer skips them;
    compaction gaps are simply absent. Records removed by retention before or while
    the range is read are data loss: ``DataLossError`` when ``fail_on_data_loss``,
    else the read continues at the oldest retained record. A damaged batch (a CRC or
    framing the engine refuses) is ``CorruptDataError`` when ``fail_on_data_loss``,
    else the read skips the damaged range (to the next batch it can frame, or the next
    segment) and logs a warning naming it.

    Cost: O(log n) to position, then sequential.

    Raises:
        DataLossError, CorruptDataError: see above.
    """
    try:
        log = manager.log(r.topic, r.partition)
    except UnknownTopicError:
        # Deleted after the query was planned: every record of the range is gone.
        if fail_on_data_loss:
            raise DataLossError(
                r.topic, r.partition, r.start, r.end, "belong to a partition that was deleted"
            ) from None
        return
    start, end = r.start, r.end
    scratch = BytesWriter()  # reused for every batch's values (see packed_columns)
    on_corrupt = None if fail_on_data_loss else _skip_damage(r)
    if r.min_timestamp is not None:
        try:
            found: int | None = log.offset_for_timestamp(r.min_timestamp)
        except CorruptRecordError as exc:
            if fail_on_data_loss:
                raise CorruptDataError(r.topic, r.partition, max(exc.offset, start), exc) from None
            found = start  # no narrowing: Spark re-checks the timestamp filter anyway
        start = max(start, end if found is None else found)
    while start < end:
        if start < log.log_start_offset:
            if fail_on_data_loss:
                raise DataLossError(
                    r.topic, r.partition, start, min(end, log.log_start_offset),
                    f"are below the log start offset {log.log_start_offset}",
                )  # fmt: skip
            start = log.log_start_offset
            continue
        if log.log_end_offset < end:
            if fail_on_data_loss:
                raise DataLossError(
                    r.topic, r.partition, max(start, log.log_end_offset), end,
                    f"are past the log end offset {log.log_end_offset}",
                )  # fmt: skip
            end = log.log_end_offset
            continue
        try:
            for batch in log.batches(start, on_corrupt=on_corrupt):
                if batch.base_offset >= end:
                    return
                if batch.is_control:
                    start = batch.next_offset
                    continue
                columns = (
                    _columns(batch, start, end, scratch)
                    if records
                    else _span(batch, start, end) or _columns(batch, start, end, scratch)
                )
                start = batch.next_offset
                if len(columns):
                    yield columns
            return
        except OffsetOutOfRangeError:
            # Retention moved the log start past ``start`` between the check and the
            # read: the loop reports it (or skips ahead) like any other loss.
            continue
        except CorruptRecordError as exc:
            offset = exc.offset if exc.offset >= 0 else start
            raise CorruptDataError(r.topic, r.partition, offset, exc) from None


def _skip_damage(r: OffsetRange) -> Callable[[CorruptRecordError, int], None]:
    """``failOnDataLoss=false``: log each damaged range the read of ``r`` skips."""

    def skipped(error: CorruptRecordError, resume: int) -> None:
        first = max(error.offset, r.start)
        if first < r.end:
            logger.warning(
                "seglog: skipping offsets [%d, %d) of topic %s partition %s: %s "
                "(failOnDataLoss=false)",
                first,
                min(max(resume, first), r.end),
                r.topic,
                r.partition,
                error,
            )

    return skipped


def _columns(
    batch: RecordBatch, start: int, end: int, scratch: BytesWriter
) -> RecordColumns | PackedColumns:
    """The records of ``batch`` with ``start <= offset < end``.

    A v2 batch of ``SMALL_BATCH_ROWS`` records or more comes packed (its values and
    keys in one buffer each, no Python object per record: Arrow wraps the buffers);
    smaller batches come as ``RecordColumns``, which the batcher gathers in lists, as a
    few Arrow calls per batch would cost more than their rows.
    """
    first = start if batch.base_offset < start else None
    stop = end if batch.last_offset >= end else None
    if isinstance(batch, DefaultRecordBatch) and batch.records_count >= SMALL_BATCH_ROWS:
        try:
            return batch.packed_columns(first, stop, scratch)
        except OverflowError:  # 2 GiB of values in one batch: beyond int32 bounds
            pass
    columns = batch.columns()
    if first is not None or stop is not None:
        columns = columns.slice(start, end)
    return columns


def _span(batch: RecordBatch, start: int, end: int) -> RecordSpan | None:
    """The records of ``batch`` with ``start <= offset < end`` from its header alone: a
    v2 batch holding one record per offset it spans (none compacted away), else None.
    """
    if (
        not isinstance(batch, DefaultRecordBatch)
        or batch.records_count != batch.last_offset_delta + 1
    ):
        return None
    offsets = range(max(start, batch.base_offset), min(end, batch.next_offset))
    return RecordSpan(offsets, batch.timestamp_type)


def read_offset_range(
    log_dir: str, r: OffsetRange, *, projection: Projection, fail_on_data_loss: bool
) -> Iterator[pa.RecordBatch]:
    """Arrow batches of ``r`` holding the columns of ``projection``, read from the
    segment files in this process."""
    freeze_worker_heap()
    if r.start >= r.end:
        return iter(())
    manager = shared_manager(log_dir)
    columns = engine_columns(
        manager, r, fail_on_data_loss=fail_on_data_loss, records=projection.needs_records
    )
    return arrow_batches(r.topic, r.partition, columns, projection=projection)


def plan_tasks(
    ranges: Sequence[OffsetRange], sizes: Sequence[int], cores: int
) -> list[OffsetRange | OffsetRanges]:
    """The read tasks of a batch query without ``minPartitions``, planned by size, as
    Spark plans the files of ``spark.read.text`` (``FilePartition``), ``sizes`` being
    the estimated segment bytes of ``ranges`` and each range counting
    ``OPEN_COST_BYTES`` more:

    - a range larger than the bytes per core (at least ``OPEN_COST_BYTES``) is split
      by offsets into that many equal parts, so a topic of fewer partitions than
      cores still keeps every core busy (a 1 GB partition on 2 cores: 2 tasks);
    - ranges and parts, largest first, are packed into one task while it holds no more
      than the bytes per core and ``MAX_PACKED_BYTES``, so many small partitions are
      read by a few tasks (every task of a Python source pays a round trip to a
      Python worker: 4 partitions of 25 MB on 2 cores are 2 tasks).

    Unlike ``spark.read.text`` a range is not split below the bytes per core to
    ``spark.sql.files.maxPartitionBytes`` (128 MiB): measured on 2 cores, 10^7 records
    in 4 partitions read as 12 tasks took 3.07 s against 2.62 s as 4 (medians of 7).
    Empty ranges are dropped.

    Cost: O(parts log parts).
    """
    kept = [(r, max(size, 0)) for r, size in zip(ranges, sizes, strict=True) if r.size > 0]
    if not kept:
        return []
    per_core = sum(size + OPEN_COST_BYTES for _, size in kept) / max(cores, 1)
    split_bytes = int(max(OPEN_COST_BYTES, per_core))
    packed_bytes = min(MAX_PACKED_BYTES, split_bytes)
    parts: list[tuple[OffsetRange, float]] = []
    for r, size in kept:
        n = min(max(-(-size // split_bytes), 1), r.size)
        step = r.size / n
        bounds = [r.start + round(i * step) for i in range(n)] + [r.end]
        parts += [
            (OffsetRange(r.topic, r.partition, lo, hi, r.min_timestamp), size * (hi - lo) / r.size)
            for lo, hi in itertools.pairwise(bounds)
            if hi > lo
        ]
    parts.sort(key=lambda part: part[1], reverse=True)
    tasks: list[list[OffsetRange]] = []
    current: list[OffsetRange] = []
    current_bytes = 0.0
    for part, part_bytes in parts:
        if current and current_bytes + part_bytes > packed_bytes:
            tasks.append(current)
            current, current_bytes = [], 0.0
        current.append(part)
        current_bytes += part_bytes + OPEN_COST_BYTES
    tasks.append(current)
    for task in tasks:
        task.sort(key=_position)
    tasks.sort(key=lambda task: _position(task[0]))
    return [task[0] if len(task) == 1 else OffsetRanges(tuple(task)) for task in tasks]


def _position(r: OffsetRange) -> tuple[str, int, int]:
    return (r.topic, r.partition, r.start)


def planner_cores() -> int:
    """The cores Spark's tasks may use, as far as the planner can tell: its own (Spark
    runs the planner of a Python source in a Python worker beside the driver, so this is
    ``local[*]``'s parallelism; on a cluster the driver's cores only set the least
    number of tasks a query gets, and partitions of ``MAX_PACKED_BYTES`` or more are
    never packed, each read by one task or more as by Kafka's source)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def estimated_bytes(manager: LogManager, r: OffsetRange) -> int:
    """The segment bytes of ``r``: its share of its log's bytes, by offsets (the
    average record size of the retained log). Cost: O(segments of the log)."""
    log = manager.log(r.topic, r.partition)
    retained = log.log_end_offset - log.log_start_offset
    if retained <= 0:
        return 0
    return log.size * r.size // retained


def split_ranges(ranges: Sequence[OffsetRange], min_partitions: int | None) -> list[OffsetRange]:
    """Split ranges so that there are at least ``min_partitions`` (when they hold that
    many records), each range into parts in proportion to its size, as Kafka's
    ``KafkaOffsetRangeCalculator`` does; the parts left over by rounding go to the
    ranges with the largest remainders, so the total is never short. Empty ranges are
    dropped.

    Cost: O(ranges log ranges + parts).
    """
    ranges = [r for r in ranges if r.size > 0]
    if min_partitions is None or len(ranges) >= min_partitions:
        return ranges
    total = sum(r.size for r in ranges)
    shares = [r.size / total * min_partitions for r in ranges]
    parts = [max(int(share), 1) for share in shares]
    by_remainder = sorted(
        range(len(ranges)), key=lambda i: shares[i] - int(shares[i]), reverse=True
    )
    for i in by_remainder[: max(min_partitions - sum(parts), 0)]:
        parts[i] += 1
    result = []
    for r, n in zip(ranges, parts, strict=True):
        n = min(n, r.size)
        step = r.size / n
        bounds = [r.start + round(i * step) for i in range(n)] + [r.end]
        result += [
            OffsetRange(r.topic, r.partition, lo, hi, r.min_timestamp)
            for lo, hi in itertools.pairwise(bounds)
            if hi > lo
        ]
    return result


def _millis(value: Any) -> int | None:
    # Spark hands timestamp literals over as aware datetimes (UTC).
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        return int(value.timestamp() * 1000)  # floor to ms: Spark re-checks the filter
    return None


@dataclass
class Pushdown:
    """What the pushed filters allow: topic and partition sets, an offset interval and
    a minimum timestamp, all of them ANDed."""

    topics: set[str] | None = None
    partitions: set[int] | None = None
    min_offset: int = 0
    max_offset: int | None = None  # exclusive
    min_timestamp: int | None = None
    partition_bounds: list[tuple[int, int | None]] = field(default_factory=list)

    def accept(self, f: Filter) -> bool:
        """Record ``f`` if it narrows the read; True when it is applied exactly (Spark
        need not evaluate it again)."""
        column = getattr(f, "attribute", None)
        if column == ("topic",):
            if isinstance(f, EqualTo) and isinstance(f.value, str):
                return self._topics({f.value})
            if isinstance(f, In) and all(isinstance(v, str) for v in f.value):
                return self._topics(set(f.value))
        elif column == ("partition",):
            return self._partition_filter(f)
        elif column == ("offset",):
            return self._offset_filter(f)
        elif column == ("timestamp",) and isinstance(f, GreaterThan | GreaterThanOrEqual):
            ms = _millis(f.value)
            if ms is not None:
                self.min_timestamp = max(self.min_timestamp or ms, ms)
            return False
        # These columns are never null.
        return isinstance(f, IsNotNull) and column in (("topic",), ("partition",), ("offset",))

    def _topics(self, topics: set[str]) -> bool:
        self.topics = topics if self.topics is None else self.topics & topics
        return True

    def _partitions(self, partitions: set[int]) -> bool:
        self.partitions = partitions if self.partitions is None else self.partitions & partitions
        return True

    def _partition_filter(self, f: Filter) -> bool:
        if isinstance(f, EqualTo) and isinstance(f.value, int):
            return self._partitions({f.value})
        if isinstance(f, In) and all(isinstance(v, int) for v in f.value):
            return self._partitions(set(f.value))
        value = getattr(f, "value", None)
        if not isinstance(value, int):
            return False
        # Kafka has at most 2^31 partitions; comparisons become a set over that bound.
        lo, hi = {
            GreaterThan: (value + 1, None),
            GreaterThanOrEqual: (value, None),
            LessThan: (0, value),
            LessThanOrEqual: (0, value + 1),
        }.get(type(f), (None, None))
        if lo is None and hi is None:
            return False
        self.partition_bounds.append((lo or 0, hi))
        return True

    def partition_allowed(self, partition: int) -> bool:
        if self.partitions is not None and partition not in self.partitions:
            return False
        return all(
            lo <= partition and (hi is None or partition < hi) for lo, hi in self.partition_bounds
        )

    def _offset_filter(self, f: Filter) -> bool:
        value = getattr(f, "value", None)
        if isinstance(f, In):
            values = [v for v in f.value if isinstance(v, int)]
            if len(values) != len(f.value) or not values:
                return False
            self._offset_bounds(min(values), max(values) + 1)
            return False  # the interval covers more than the set: Spark re-checks
        if not isinstance(value, int):
            return False
        if isinstance(f, EqualTo):
            self._offset_bounds(value, value + 1)
        elif isinstance(f, GreaterThan):
            self._offset_bounds(value + 1, None)
        elif isinstance(f, GreaterThanOrEqual):
            self._offset_bounds(value, None)
        elif isinstance(f, LessThan):
            self._offset_bounds(0, value)
        elif isinstance(f, LessThanOrEqual):
            self._offset_bounds(0, value + 1)
        else:
            return False
        return True

    def _offset_bounds(self, lo: int, hi: int | None) -> None:
        self.min_offset = max(self.min_offset, lo)
        if hi is not None:
            self.max_offset = hi if self.max_offset is None else min(self.max_offset, hi)

    def narrow(self, r: OffsetRange) -> OffsetRange | None:
        """``r`` restricted by the filters, or None when nothing of it can match."""
        if self.topics is not None and r.topic not in self.topics:
            return None
        if not self.partition_allowed(r.partition):
            return None
        start = max(r.start, self.min_offset)
        end = r.end if self.max_offset is None else min(r.end, self.max_offset)
        if end <= start:
            return None
        return OffsetRange(r.topic, r.partition, start, end, self.min_timestamp)


class SeglogBatchReader(UnpickledInTasks, DataSourceReader):
    """The batch reader of the ``seglog`` source (see the module docstring).

    Picklable: Spark ships it to its tasks; it holds options, the projection and
    pushed filters only. Unpickling it in a task avoids Spark's socket stalls
    (``worker_socket``).
    """

    def __init__(self, opts: ReadOptions, projection: Projection | None = None) -> None:
        self.opts = opts
        # None: the whole Kafka schema, as a query without .schema(...) reads.
        if projection is None:
            projection = Projection.full(opts.include_headers)
        self.projection = projection
        self.pushdown = Pushdown()

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        for f in filters:
            if not self.pushdown.accept(f):
                yield f

    def offset_ranges(self, manager: LogManager) -> list[OffsetRange]:
        """The planned ranges (before ``minPartitions``), one per topic-partition.

        Raises:
            OptionError: offsets out of order or assigned partitions that do not exist.
            DataLossError: starting offsets below a log start with ``failOnDataLoss``.
        """
        opts = self.opts
        counts = partition_counts(manager)
        tps = opts.subscription.topic_partitions(counts)
        absent = [t for t in opts.subscription.topics if t not in counts]
        if absent:
            # A streaming query waits for such a topic; a batch query would silently
            # read nothing, which is almost always a typo.
            raise OptionError(
                "subscribe", ",".join(opts.subscription.topics),
                f"no topic {', '.join(map(repr, absent))} in {opts.log_dir}",
            )  # fmt: skip
        missing = sorted(set(opts.subscription.assigned) - set(tps))
        if missing:
            raise OptionError(
                "assign",
                ", ".join(f"{t}-{p}" for t, p in missing),
                "these partitions do not exist in " + opts.log_dir,
            )
        tps = [tp for tp in tps if self.pushdown.narrow(OffsetRange(*tp, 0, 1 << 62)) is not None]
        starts = resolve_starting_offsets(opts, manager, tps)
        ends = resolve_ending_offsets(opts, manager, tps)
        return [self._range(manager, tp, starts, ends) for tp in tps]

    def _range(
        self,
        manager: LogManager,
        tp: TopicPartition,
        starts: PartitionOffsets,
        ends: PartitionOffsets,
    ) -> OffsetRange:
        start, end = starts[tp], ends[tp]
        log = manager.log(*tp)
        if start < log.log_start_offset:
            if self.opts.fail_on_data_loss:
                raise DataLossError(
                    tp[0], tp[1], start, log.log_start_offset,
                    f"are below the log start offset {log.log_start_offset}",
                )  # fmt: skip
            start = log.log_start_offset
        if end > log.log_end_offset:
            raise OptionError(
                "endingOffsets", end,
                f"past the log end offset {log.log_end_offset} of {tp[0]}-{tp[1]}",
            )  # fmt: skip
        if start > end:
            raise OptionError(
                "startingOffsets", start,
                f"after the ending offset {end} of {tp[0]}-{tp[1]}",
            )  # fmt: skip
        return OffsetRange(tp[0], tp[1], start, end)

    def partitions(self) -> list[InputPartition]:
        """The read tasks: with ``minPartitions``, Kafka's plan (one range per
        topic-partition, split to at least that many, ``split_ranges``); without it,
        ranges split and packed by size as ``spark.read.text`` plans files
        (``plan_tasks``)."""
        freeze_worker_heap()  # Spark's planner process
        manager = open_read_only(self.opts.log_dir)
        try:
            planned = self.offset_ranges(manager)
            narrowed = [n for r in planned if (n := self.pushdown.narrow(r)) is not None]
            if self.opts.min_partitions is not None:
                return list(split_ranges(narrowed, self.opts.min_partitions))
            sizes = [estimated_bytes(manager, r) for r in narrowed]
        finally:
            manager.close()
        return list(plan_tasks(narrowed, sizes, planner_cores()))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, OffsetRanges):
            return itertools.chain.from_iterable(map(self._read_range, partition.ranges))
        if not isinstance(partition, OffsetRange):
            return iter(())  # Spark's single placeholder partition of an empty plan
        return self._read_range(partition)

    def _read_range(self, r: OffsetRange) -> Iterator[pa.RecordBatch]:
        return read_offset_range(
            self.opts.log_dir,
            r,
            projection=self.projection,
            fail_on_data_loss=self.opts.fail_on_data_loss,
        )


def open_read_only(log_dir: str) -> LogManager:
    """Open ``log_dir`` read-only for planning, with a clear error if it is missing.

    Raises:
        OptionError: the path is not a log directory.
    """
    try:
        return LogManager.open(log_dir, read_only=True)
    except StorageError as exc:
        raise OptionError("path", log_dir, str(exc)) from exc
    except OSError as exc:  # a path the system refuses (too long, not searchable, ...)
        raise OptionError("path", log_dir, exc.strerror or str(exc)) from exc

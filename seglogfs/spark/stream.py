"""Streaming reads: Kafka-style offsets in Spark's checkpoint, ranges read by tasks.

Spark drives the reader (``SeglogStreamReader``) from one long-lived planner process on
the driver: ``initialOffset`` once for a new query, then for every micro-batch
``latestOffset(start, limit)`` and ``partitions(start, end)``. Offsets are Kafka's JSON
(``{"topic": {"0": 42}}``, the next offset to read per partition), which Spark writes
to the checkpoint's offset log before the batch runs; a restarted query resumes from
the last checkpointed end, so every record is delivered once per query (a micro-batch
that failed is replayed with the same offsets: Spark's exactly-once contract).

- Admission control: ``maxOffsetsPerTrigger`` becomes Spark's ``ReadMaxRows`` limit,
  shared between partitions in proportion to their backlog (Kafka's ``rateLimit``).
- ``trigger(availableNow=True)``: ``prepareForTriggerAvailableNow`` fixes the target
  at the log ends of that moment; later appends wait for the next run.
- New partitions (a new topic matching ``subscribePattern``) start at their earliest
  offset, as in Kafka.
- ``failOnDataLoss``: offsets of a checkpoint that retention removed since, or a log
  now shorter than the checkpoint, raise ``DataLossError`` (or are skipped).
- ``commitOffsets=true`` with ``kafka.group.id``: each finished micro-batch's end is
  also committed to that consumer group (``group_commit``), for ``groups describe``.

Thread-safety: Spark calls one reader from one thread. Tasks get a pickled copy that
holds only the options and the projection.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from storage import LogManager

from .arrow import Projection
from .errors import DataLossError
from .group_commit import commit_progress
from .options import (
    PartitionOffsets,
    ReadOptions,
    TopicPartition,
    from_json_offsets,
    partition_counts,
    resolve_starting_offsets,
    to_json_offsets,
)
from .reader import OffsetRange, ReadOnlyLogDir, read_offset_range
from .worker_socket import UnpickledInTasks


def rate_limit(limit: int, start: PartitionOffsets, until: PartitionOffsets) -> PartitionOffsets:
    """Kafka's ``rateLimit``: move each partition from ``start`` towards ``until`` by
    its share of ``limit``, in proportion to its backlog (a share under one record is
    rounded up, so a small partition is never starved).

    Cost: O(partitions).
    """
    sizes = {tp: end - start[tp] for tp, end in until.items() if end - start[tp] > 0}
    total = sum(sizes.values())
    if total < 1:
        return dict(until)
    result = {}
    for tp, end in until.items():
        size = sizes.get(tp)
        if size is None:
            result[tp] = end
            continue
        prorate = limit * (size / total)
        step = math.ceil(prorate) if prorate < 1 else math.floor(prorate)
        result[tp] = min(end, start[tp] + step)
    return result


class SeglogStreamReader(UnpickledInTasks, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The streaming reader of the ``seglog`` source (see the module docstring)."""

    def __init__(self, opts: ReadOptions, projection: Projection | None = None) -> None:
        self.opts = opts
        # None: the whole Kafka schema, as a query without .schema(...) reads.
        if projection is None:
            projection = Projection.full(opts.include_headers)
        self.projection = projection
        self._view: ReadOnlyLogDir | None = None
        self._manager: LogManager | None = None
        self._target: PartitionOffsets | None = None  # availableNow's end

    def __getstate__(self) -> dict[str, Any]:
        # Tasks get the options and the projection: the manager stays with the planner.
        state = dict(self.__dict__)
        state["_view"] = None
        state["_manager"] = None
        return state

    def _log_ends(self) -> PartitionOffsets:
        """The log end of every subscribed partition now (refreshing the manager)."""
        if self._view is None:
            self._view = ReadOnlyLogDir(self.opts.log_dir)
        manager = self._manager = self._view.get()
        tps = self.opts.subscription.topic_partitions(partition_counts(manager))
        return {tp: manager.log(*tp).log_end_offset for tp in tps}

    def _earliest(self, tp: TopicPartition) -> int:
        assert self._manager is not None
        return self._manager.log(*tp).log_start_offset

    def initialOffset(self) -> dict[str, Any]:
        ends = self._log_ends()
        assert self._manager is not None
        return to_json_offsets(resolve_starting_offsets(self.opts, self._manager, ends))

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.opts.max_offsets_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._log_ends()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        begin = from_json_offsets(start)
        until = self._log_ends()
        if self._target is not None:
            # availableNow: nothing past the ends seen when the trigger started, and no
            # partition that appeared after it.
            target = self._target
            until = {tp: min(end, target[tp]) for tp, end in until.items() if tp in target}
        # A partition new to this query starts at its earliest offset.
        start_of = {tp: begin[tp] if tp in begin else self._earliest(tp) for tp in until}
        # Never move backwards here: a log shorter than the checkpoint is reported by
        # partitions() as data loss, and Spark must not see an end before its start.
        until = {tp: max(end, start_of[tp]) for tp, end in until.items()}
        if isinstance(limit, ReadMaxRows):
            until = rate_limit(limit.max_rows, start_of, until)
        for tp, offset in begin.items():
            until.setdefault(tp, offset)  # a deleted topic keeps its last offset
        return to_json_offsets(until)

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return to_json_offsets(self._log_ends())

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        begin = from_json_offsets(start)
        until = from_json_offsets(end)
        self._log_ends()
        assert self._manager is not None
        ranges: list[InputPartition] = []
        for tp, stop in sorted(until.items()):
            first = begin.get(tp, 0)
            if tp[0] not in self._manager.topics():
                continue  # deleted: no range to read (its offsets stay in the checkpoint)
            log = self._manager.log(*tp)
            if log.log_end_offset < first:
                if self.opts.fail_on_data_loss:
                    raise DataLossError(
                        tp[0], tp[1], log.log_end_offset, first,
                        "were in the checkpoint but the log now ends before them",
                    )  # fmt: skip
                continue
            if stop > first:
                ranges.append(OffsetRange(tp[0], tp[1], first, stop))
        return ranges

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, OffsetRange)
        return read_offset_range(
            self.opts.log_dir,
            partition,
            projection=self.projection,
            fail_on_data_loss=self.opts.fail_on_data_loss,
        )

    def commit(self, end: dict[str, Any]) -> None:
        """The offsets live in Spark's checkpoint; with ``commitOffsets`` the end of
        each finished micro-batch also goes to the consumer group (``group_commit``)."""
        if self.opts.commit_group is not None:
            commit_progress(self.opts.log_dir, self.opts.commit_group, from_json_offsets(end))

    def stop(self) -> None:
        if self._view is not None:
            self._view.close()
        self._view = None
        self._manager = None

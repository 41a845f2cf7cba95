"""Which log to clean next, and how far each is cleaned (Kafka's ``LogCleanerManager``).

- ``cleanable_offsets``: a log's dirty section. It starts at the cleaner checkpoint
  (reset to the log start when the checkpoint is below it or past the log end) and
  ends at the first uncleanable offset: the active segment's base, or the first
  segment whose newest record is younger than ``min.compaction.lag.ms``.
- ``LogToClean``: a log with its clean and cleanable bytes; its ``cleanable_ratio``
  (cleanable / all) is the "dirty ratio" ``min.cleanable.dirty.ratio`` is held to.
- ``LogCleanerManager.grab_filthiest``: the compacted log with the highest ratio among
  those above their ``min.cleanable.dirty.ratio`` or with a record older than
  ``max.compaction.lag.ms`` in a sealed dirty segment; ``done_cleaning`` records the
  pass's end in ``cleaner-offset-checkpoint`` (Kafka's checkpoint file format).

Thread-safety: ``LogCleanerManager`` serialises its state with a lock; a log being
cleaned is not handed out twice. The functions are pure over a log's snapshot.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .checkpoint import read_offset_checkpoint, write_offset_checkpoint

if TYPE_CHECKING:
    from .log import Log
    from .segment import LogSegment

logger = logging.getLogger(__name__)

__all__ = [
    "CLEANER_OFFSET_CHECKPOINT",
    "CleanSummary",
    "LogCleanResult",
    "LogCleanerManager",
    "LogToClean",
    "cleanable_offsets",
    "max_compaction_delay",
]

CLEANER_OFFSET_CHECKPOINT = "cleaner-offset-checkpoint"
"""Kafka's file of each compacted partition's first dirty offset, in the log directory."""

TopicPartition = tuple[str, int]


@dataclass(frozen=True)
class LogToClean:
    """A log and its cleanable range (Kafka's ``LogToClean``).

    ``clean_bytes``: the segments below ``first_dirty_offset``; ``cleanable_bytes``:
    those from it up to the segment holding ``first_uncleanable_offset``.
    """

    log: Log
    first_dirty_offset: int
    first_uncleanable_offset: int
    need_compaction_now: bool = False
    clean_bytes: int = 0
    cleanable_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return self.clean_bytes + self.cleanable_bytes

    @property
    def cleanable_ratio(self) -> float:
        """The dirty ratio: cleanable bytes over all bytes (0 for an empty log)."""
        total = self.total_bytes
        return self.cleanable_bytes / total if total else 0.0

    @property
    def cleanable(self) -> bool:
        """Whether the manager cleans it (Kafka's filter in ``grabFilthiestCompactedLog``):
        dirty ratio above ``min.cleanable.dirty.ratio``, or a record due by
        ``max.compaction.lag.ms`` with something to clean."""
        if self.need_compaction_now and self.cleanable_bytes > 0:
            return True
        return self.cleanable_ratio > self.log.config.min_cleanable_dirty_ratio


def _non_active_from(log: Log, offset: int) -> list[LogSegment]:
    # Kafka's nonActiveLogSegmentsFrom: from the segment holding ``offset`` on, the
    # active segment excluded.
    segments = log.segments.values(offset)
    return segments[:-1] if segments and segments[-1] is log.active_segment else segments


def max_compaction_delay(log: Log, first_dirty_offset: int, now: int) -> int:
    """How long past ``max.compaction.lag.ms`` the oldest sealed dirty record is (0:
    not overdue). Measured on each sealed dirty segment's first batch timestamp (Kafka's
    ``maxCompactionDelay``; a segment without a positive timestamp does not count).

    Cost: the first batch of each sealed dirty segment (cached by the segment).
    """
    stamps = [
        ts
        for segment in _non_active_from(log, first_dirty_offset)
        if (ts := segment.first_batch_timestamp()) is not None and ts > 0
    ]
    earliest = min(stamps, default=2**63 - 1)
    clean_until = now - max(log.config.max_compaction_lag_ms, 0)
    return clean_until - earliest if earliest < clean_until else 0


def cleanable_offsets(log: Log, last_clean_offset: int | None, now: int) -> LogToClean:
    """The cleanable range of ``log`` given its checkpoint (Kafka's ``cleanableOffsets``
    and ``calculateCleanableBytes``). Cost: O(segments), reading cached facts.
    """
    start = log.log_start_offset
    checkpoint = start if last_clean_offset is None else last_clean_offset
    if checkpoint < start or checkpoint > log.log_end_offset:
        if checkpoint > log.log_end_offset or not log.config.delete:
            logger.warning(
                "%s: resetting the first dirty offset to the log start %d (checkpoint %d)",
                log.dir.name,
                start,
                checkpoint,
            )
        checkpoint = start
    first_dirty = checkpoint
    active = log.active_segment
    uncleanable = min(log.log_end_offset, active.base_offset)
    min_lag = max(log.config.min_compaction_lag_ms, 0)
    if min_lag > 0:
        for segment in _non_active_from(log, first_dirty):
            if segment.largest_timestamp() > now - min_lag:
                uncleanable = min(uncleanable, segment.base_offset)
                break
    uncleanable = max(first_dirty, uncleanable)
    segments = log.segments.values()
    clean_bytes = sum(s.size for s in segments if _next_base(segments, s) <= first_dirty)
    # Kafka's calculateCleanableBytes: up to the first segment at/after the uncleanable
    # offset (its base), from the segment holding the first dirty offset.
    cleanable_bytes = sum(
        s.size
        for s in segments
        if s is not active and _next_base(segments, s) > first_dirty and s.base_offset < uncleanable
    )
    return LogToClean(
        log,
        first_dirty,
        uncleanable,
        need_compaction_now=max_compaction_delay(log, first_dirty, now) > 0,
        clean_bytes=clean_bytes,
        cleanable_bytes=cleanable_bytes,
    )


def _next_base(segments: list[LogSegment], segment: LogSegment) -> int:
    # Where the segment's offsets end at the latest: the next one's base (the active
    # segment: never).
    i = segments.index(segment)
    return segments[i + 1].base_offset if i + 1 < len(segments) else 2**63 - 1


class LogCleanerManager:
    """The cleaner's bookkeeping for one log directory: checkpoints and choice.

    Args:
        log_dir: holds ``cleaner-offset-checkpoint``.
    """

    def __init__(self, log_dir: Path) -> None:
        self.checkpoint_path = log_dir / CLEANER_OFFSET_CHECKPOINT
        self._lock = threading.Lock()
        self._in_progress: set[TopicPartition] = set()

    def checkpoints(self) -> dict[TopicPartition, int]:
        """Each partition's first dirty offset, as last checkpointed.

        Raises:
            CorruptCheckpointError: the file does not parse.
            OSError: it cannot be read.
        """
        return read_offset_checkpoint(self.checkpoint_path)

    def logs_to_clean(
        self, logs: Iterable[Log], now: int, *, force: bool = False
    ) -> list[LogToClean]:
        """The compacted logs worth a pass, dirtiest first, not being cleaned. With
        ``force``, every compacted log with cleanable bytes, whatever its ratio.

        Cost: O(segments) over all logs; reads the checkpoint file once.
        """
        checkpoints = self.checkpoints()
        found: list[LogToClean] = []
        with self._lock:
            for log in logs:
                tp = (log.topic, log.partition)
                if not log.config.compact or tp in self._in_progress or log.closed:
                    continue
                to_clean = cleanable_offsets(log, checkpoints.get(tp), now)
                if to_clean.total_bytes == 0:
                    continue
                if to_clean.cleanable if not force else to_clean.cleanable_bytes > 0:
                    found.append(to_clean)
        found.sort(key=lambda t: t.cleanable_ratio, reverse=True)
        return found

    def grab_filthiest(self, logs: Iterable[Log], now: int) -> LogToClean | None:
        """The dirtiest cleanable compacted log, marked in progress (Kafka's
        ``grabFilthiestCompactedLog``); None when none is due. Release it with
        ``done_cleaning``."""
        found = self.logs_to_clean(logs, now)
        with self._lock:
            for to_clean in found:
                tp = (to_clean.log.topic, to_clean.log.partition)
                if tp not in self._in_progress:
                    self._in_progress.add(tp)
                    return to_clean
        return None

    def begin_cleaning(self, log: Log) -> bool:
        """Mark ``log`` in progress; False when it already is."""
        tp = (log.topic, log.partition)
        with self._lock:
            if tp in self._in_progress:
                return False
            self._in_progress.add(tp)
            return True

    def update_checkpoint(self, log: Log, end_offset: int) -> None:
        """Checkpoint ``end_offset`` as the log's first dirty offset.

        Raises:
            OSError: the checkpoint could not be written.
        """
        with self._lock:
            offsets = self.checkpoints()
            offsets[(log.topic, log.partition)] = end_offset
            write_offset_checkpoint(self.checkpoint_path, offsets)

    def done_cleaning(self, log: Log, end_offset: int | None) -> None:
        """Release ``log``; with ``end_offset``, checkpoint it first (Kafka's
        ``doneCleaning``).

        Raises:
            OSError: the checkpoint could not be written (the log is released).
        """
        try:
            if end_offset is not None:
                self.update_checkpoint(log, end_offset)
        finally:
            with self._lock:
                self._in_progress.discard((log.topic, log.partition))

    def retain_only(self, partitions: Iterable[TopicPartition]) -> None:
        """Drop the checkpoints of partitions not in ``partitions`` (deleted topics: a
        topic created again must not inherit them, as Kafka's ``updateCheckpoints``
        with a removed partition). Nothing is written when nothing is dropped.

        Raises:
            OSError: the checkpoint could not be written.
        """
        keep = set(partitions)
        with self._lock:
            offsets = self.checkpoints()
            kept = {tp: offset for tp, offset in offsets.items() if tp in keep}
            if kept != offsets:
                write_offset_checkpoint(self.checkpoint_path, kept)


@dataclass(frozen=True)
class LogCleanResult:
    """One log's cleaning (``LogManager.clean``): its size before and after, the
    records the passes read below their end and kept, and where the next pass starts."""

    topic: str
    partition: int
    passes: int
    segments_before: int
    segments_after: int
    bytes_before: int
    bytes_after: int
    records_read: int
    records_kept: int
    first_dirty_offset: int
    more_to_clean: bool
    """True when the passes stopped before the first uncleanable offset (the offset map
    was full): another pass has work now."""


@dataclass(frozen=True)
class CleanSummary:
    """What ``LogManager.clean`` did: one result per log cleaned, and the logs it left
    alone with why (``(topic, partition, reason)``)."""

    cleaned: tuple[LogCleanResult, ...] = ()
    skipped: tuple[tuple[str, int, str], ...] = ()

    @property
    def segments_before(self) -> int:
        return sum(r.segments_before for r in self.cleaned)

    @property
    def segments_after(self) -> int:
        return sum(r.segments_after for r in self.cleaned)

    @property
    def bytes_before(self) -> int:
        return sum(r.bytes_before for r in self.cleaned)

    @property
    def bytes_after(self) -> int:
        return sum(r.bytes_after for r in self.cleaned)

    @property
    def records_read(self) -> int:
        return sum(r.records_read for r in self.cleaned)

    @property
    def records_kept(self) -> int:
        return sum(r.records_kept for r in self.cleaned)

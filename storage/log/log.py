"""A partition's log: its segments, its offsets, append, read, roll and retention.

This is Kafka's ``UnifiedLog`` + ``LocalLog`` for one ``<topic>-<partition>`` directory.
Offsets are assigned on append; reads go offset -> segment (bisection over base
offsets) -> index entry -> forward scan. Roll, retention, flush and delayed deletion
are methods the owner runs when each says it is due (``next_roll_due_ms`` ...: the
daemon sleeps until the earliest); the time comes from an injectable ``Clock``.
``Log.open`` builds a log from what ``log_loader.load_log`` found on disk.

Thread-safety: thread-safe. Appends, roll, retention, truncation, flush and close
take the log's lock. Reads do not: any number of threads read concurrently with them,
on a snapshot of the segment map and ``pread`` below sizes that only grow. Segments
removed by retention stay readable for ``file.delete.delay.ms`` (a read in progress
holds its descriptor; a new one opens the ``.deleted`` file) so that a read in
progress can finish; a read still in a segment after that raises
``SegmentDeletedError`` (an ``OffsetOutOfRangeError``: reposition at the log start).
Their descriptors and mappings are released at the rename, not held for the delay.

Descriptors: a writable log pins its active segment (its files stay open and mapped);
every other segment's files are opened on use and released when the process has more
than its bound of segments open (``segment.OpenSegments``, ``log.segment.open.max``).

A log opened with ``writable=False`` never changes a file: it is how another process
reads a log directory a writer owns (``refresh()`` picks up new data and segments) and
how a copy of a Kafka broker's directory is browsed.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import random
import shutil
import threading
from bisect import bisect_right
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from itertools import chain
from pathlib import Path

from ..atomic_file import fsync_directory
from ..clock import SYSTEM_CLOCK, Clock
from ..errors import (
    CorruptRecordError,
    InvalidOffsetError,
    InvalidRecordError,
    LogCleaningAbortedError,
    OffsetOutOfRangeError,
    ReadOnlyLogError,
    RecordTooLargeError,
    SegmentDeletedError,
    StorageError,
)
from ..record.batch_builder import build_record_batch
from ..record.compression import codec_from_name
from ..record.file_records import Tail
from ..record.record import CompressionType, Header, Record, TimestampType
from ..record.record_batch import (
    MAGIC_V2,
    DefaultRecordBatch,
    RecordBatch,
    iter_batches,
    patch_base_offset,
    patch_log_append_time,
    read_batch,
    validate_client_batch,
)
from ..record.record_columns import RecordColumns
from .checkpoint import write_extension_start_checkpoint
from .cleaner import CleanedGroup, Cleaner, CleanerStats, CleaningStep, StepHook
from .cleaner_manager import cleanable_offsets
from .extension_index import ExtensionIndexSpec
from .fetch_data import REGION_MIN_BYTES, FetchData, FileRegion
from .file_names import (
    CLEANED_FILE_SUFFIX,
    DELETED_FILE_SUFFIX,
    SWAP_FILE_SUFFIX,
    parse_topic_partition_name,
)
from .log_config import LogConfig
from .log_loader import load_log, refresh_segments
from .log_segments import LogSegments
from .offset_map import OffsetMap
from .segment import AppendedBatch, LogSegment, gap_disproved

logger = logging.getLogger(__name__)

FIRST_RUN_RECORDS = 8
"""``records()`` decodes this many offsets of its first batch before the rest."""

CorruptRangeHandler = Callable[[CorruptRecordError, int], None]
"""Told of damage a read skips (``Log.batches(on_corrupt=...)``): the error, whose
``offset`` is the first offset skipped, and the offset the read goes on at."""

SegmentPredicate = Callable[[LogSegment, "LogSegment | None"], bool]
"""A retention rule: is this segment (followed by that one, None for the active
segment) deletable? Kafka's ``shouldDelete``."""

_RELATIVE_OFFSETS = 1 << 31
"""A segment holds offsets below its base offset plus this: index entries store them
relative to it in 32 bits (Kafka's ``LogSegment.ensureOffsetInRange``)."""


def _misplaced(
    batch: RecordBatch, expected: int, segment_base: int, limit: int, *, first: bool
) -> str | None:
    """Why ``batch``'s offsets cannot be where a read meets it (None: they can, unless
    a gap before it is disproved: ``segment.gap_disproved``).

    A v2 batch's base offset lies outside its CRC (Kafka's too: the CRC starts at the
    attributes), so a flipped bit there would serve every record of the batch under a
    wrong offset. Its offsets must lie in its segment (at or above the segment's base
    offset, below ``limit``: the next segment's base offset or the 32-bit relative
    range) and go on from ``expected``, the offset after the last one served (at it,
    or past it where compaction removed batches). The first batch of a read may start
    before ``expected`` (the read starts inside it). Legacy entries are checked on
    their last offset only: a compressed wrapper's first offset costs a decompression.

    Cost: a few comparisons of header fields.
    """
    last = batch.last_offset
    if last < expected:
        return f"offsets up to {last} go back (the read is at offset {expected})"
    if last >= limit:
        return f"offset {last} is past the segment's offsets (which end below {limit})"
    if batch.magic < MAGIC_V2:
        return None
    base = batch.base_offset
    if base < segment_base or base > last:
        return f"offsets {base}..{last} are not the segment's (it starts at {segment_base})"
    if not first and base < expected:
        return f"offsets {base}..{last} go back (the read is at offset {expected})"
    return None


def _framed(
    scan: Iterator[RecordBatch],
) -> Generator[RecordBatch | CorruptRecordError, None, None]:
    """The batches of ``scan``, then the ``CorruptRecordError`` that ended it, if any:
    a read that looks one batch ahead keeps the error for when it gets there."""
    try:
        yield from scan
    except CorruptRecordError as exc:
        yield exc


def _batch_ending_at(segment: LogSegment, position: int) -> RecordBatch | None:
    """The batch of ``segment`` that ends at byte ``position`` (None: none that a scan
    from the last offset-index entry before it frames, or ``position`` is 0). Cost: a
    scan of about ``index.interval.bytes``."""
    if position <= 0:
        return None
    index = segment.offset_index
    try:
        n = index.first_entry_after(position - 1) - 1
        start = index.entry(n)[1] if n >= 0 else 0
    except (IndexError, ValueError):
        return None
    if not 0 <= start < position:
        start = 0
    try:
        for batch in segment.batches(start):
            end = batch.position + batch.size
            if end >= position:
                return batch if end == position else None
    except CorruptRecordError:
        return None
    return None


def _offset_span(batch: RecordBatch) -> int:
    """How many offsets ``batch`` spans by its last offset delta (covered by the CRC,
    unlike its base offset); 1 for a legacy entry."""
    if batch.magic < MAGIC_V2:
        return 1
    return batch.last_offset - batch.base_offset + 1


@dataclass(frozen=True)
class AppendInfo:
    """What an append did: the offsets it assigned and where the bytes went."""

    first_offset: int
    last_offset: int
    max_timestamp: int
    record_count: int
    size: int
    segment_base_offset: int
    position: int


class Log:
    """The log of one topic-partition. Open it with ``Log.open``."""

    def __init__(
        self,
        directory: Path,
        config: LogConfig,
        segments: LogSegments,
        *,
        log_start_offset: int,
        recovery_point: int,
        next_offset: int,
        clock: Clock = SYSTEM_CLOCK,
        writable: bool = True,
        extension: ExtensionIndexSpec | None = None,
        scratch_dirs: Sequence[Path] = (),
    ) -> None:
        self.dir = directory
        parsed = parse_topic_partition_name(directory.name)
        self.topic, self.partition = parsed if parsed is not None else (directory.name, 0)
        self.config = config
        self.segments = segments
        self.log_start_offset = log_start_offset
        self.recovery_point = recovery_point
        self._next_offset = next_offset
        self.clock = clock
        self.writable = writable
        self.extension = extension
        self._lock = threading.RLock()
        self._pending_deletes: list[tuple[int, LogSegment]] = []
        self.layout_epoch = 0
        """How many cleaning passes moved extension units (``replace_segments``): a
        reader that positions in them (the file system's open files) compares it to
        what it saw and finds its place again by offset when it changed."""
        self._closed = False
        self._last_flush_ms = clock.milliseconds()
        # Private directories holding indexes a read-only log had to rebuild.
        self._scratch_dirs = list(scratch_dirs)
        if writable:
            # The writer's active segment keeps its files: appends never reopen them.
            self.active_segment.pin()

    @classmethod
    def open(
        cls,
        directory: Path,
        config: LogConfig,
        *,
        log_start_offset: int = 0,
        recovery_point: int = 0,
        had_clean_shutdown: bool = True,
        clock: Clock = SYSTEM_CLOCK,
        writable: bool = True,
        extension: ExtensionIndexSpec | None = None,
    ) -> Log:
        """Open (creating if needed, when writable) the log in ``directory``, recovering
        it after an unclean shutdown (see ``log_loader.load_log``).

        Raises:
            ConfigError: (writable) a setting the engine does not honour yet.
            StorageError: a read-only open of a directory that does not exist.
            OSError: the directory cannot be read or written.
        """
        if writable:
            config.require_supported()
        loaded = load_log(
            directory,
            config,
            log_start_offset=log_start_offset,
            recovery_point=recovery_point,
            had_clean_shutdown=had_clean_shutdown,
            clock=clock,
            writable=writable,
            extension=extension,
        )
        return cls(
            directory,
            config,
            loaded.segments,
            log_start_offset=loaded.log_start_offset,
            recovery_point=loaded.recovery_point,
            next_offset=loaded.next_offset,
            clock=clock,
            writable=writable,
            extension=extension,
            scratch_dirs=loaded.scratch_dirs,
        )

    # -- offsets and facts -----------------------------------------------------------

    @property
    def log_end_offset(self) -> int:
        """The offset the next appended record gets."""
        return self._next_offset

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def active_segment(self) -> LogSegment:
        segment = self.segments.last_segment
        assert segment is not None, "a log always has an active segment"
        return segment

    @property
    def size(self) -> int:
        """Bytes in all ``.log`` files. Cost: O(number of segments)."""
        return self.segments.size_in_bytes()

    @property
    def number_of_segments(self) -> int:
        return len(self.segments)

    def first_timestamp(self) -> int:
        """Timestamp of the oldest retained record, -1 if the log is empty."""
        try:
            for record in self.records(self.log_start_offset):
                return record.timestamp
        except OffsetOutOfRangeError:
            pass  # retention moved the start meanwhile: as if empty, for a snapshot
        return -1

    def last_timestamp(self) -> int:
        """The largest record timestamp in the active segment (or earlier ones if empty)."""
        for segment in reversed(self.segments.values()):
            ts = segment.max_timestamp
            if ts >= 0 or segment.size > 0:
                return ts
        return -1

    # -- the extension index -----------------------------------------------------------

    @property
    def extension_end(self) -> int:
        """Cumulative extension units at the log end (0 without an extension index)."""
        return self.active_segment.extension_end

    @property
    def extension_start(self) -> int:
        """Cumulative extension units at the start of the oldest retained segment."""
        first = self.segments.first_segment
        return 0 if first is None else first.extension_start

    def extension_floor(self, units: int) -> tuple[int, int]:
        """(offset, units before it) of an indexed batch start at or below ``units``.

        Scan forward from it with ``batches(offset)``. Below the oldest retained
        segment the answer is that segment's start (the caller skips the gap).

        Cost: O(segments) to snapshot and bisect the map, O(log n) in the index.
        """
        segments = self.segments.values()
        i = bisect_right(segments, units, key=lambda segment: segment.extension_start) - 1
        return segments[max(i, 0)].extension_floor_by_units(units)

    def extension_position(self, offset: int) -> tuple[int, int]:
        """(batch start offset <= ``offset``, units before that batch).

        Cost: O(log n) in the segment map and the index.
        """
        segment = self.segments.floor_segment(offset) or self.segments.first_segment
        assert segment is not None
        return segment.extension_floor_by_offset(offset)

    # -- appending -------------------------------------------------------------------

    def _check_writable(self) -> None:
        if not self.writable:
            raise ReadOnlyLogError(f"log {self.dir} is open read-only")
        if self._closed:
            raise ReadOnlyLogError(f"log {self.dir} is closed")

    def append(
        self,
        values: Sequence[bytes | None],
        *,
        keys: Sequence[bytes | None] | None = None,
        timestamps: Sequence[int] | int | None = None,
        headers: Sequence[Sequence[Header]] | None = None,
        units: int | None = None,
    ) -> AppendInfo:
        """Append records as one batch (several if one would exceed ``max.message.bytes``).

        ``timestamps`` default to the clock's now; under ``message.timestamp.type=
        LogAppendTime`` the log's time replaces them. The batch is compressed with the
        topic's ``compression.type`` (``producer`` and ``uncompressed`` mean none here).
        All batches of one call go out in one ``write``: a failure appends nothing.
        ``units`` is what the records measure in the extension index's units (e.g. the
        bytes a file-system write carried); None measures the built batches.

        Blocking: one ``write``; when the append rolls the segment, also the ``fsync``
        of the sealed segment (up to ``segment.bytes`` of dirty pages: tens of ms for
        MiBs, seconds for a full GiB on a slow disk); with ``flush.messages`` reached, an
        ``fsync`` of the unflushed segments.

        Cost: O(bytes appended); O(log n) roll check.

        Raises:
            RecordTooLargeError: a single record's batch exceeds ``max.message.bytes``.
            InvalidRecordError: a record without a key in a compacted log (Kafka's
                rule); nothing was appended.
            OSError: the write failed, or a page of an index the append writes had no
                block (``ENOSPC``: a full disk); nothing was appended.
            ReadOnlyLogError: the log is read-only or closed.
        """
        n = len(values)
        if n == 0:
            raise ValueError("append needs at least one record")
        with self._lock:
            self._check_writable()
            if self.config.compact and (keys is None or None in keys):
                raise self._keyless()
            now = self.clock.milliseconds()
            timestamp_type = self._timestamp_type
            if timestamps is None or timestamp_type is TimestampType.LOG_APPEND_TIME:
                timestamps = now
            codec = self._codec
            base_offset = self._next_offset
            data_parts: list[bytes] = []
            appended: list[AppendedBatch] = []
            self._build_batches(
                values, keys, timestamps, headers, 0, n, base_offset, codec, timestamp_type,
                data_parts, appended,
            )  # fmt: skip
            if self.extension is not None:
                if units is not None and len(appended) == 1:
                    appended[0] = appended[0]._replace(units=units)
                else:
                    measure = self.extension.measure
                    appended = [
                        batch._replace(units=measure(read_batch(part)))
                        for batch, part in zip(appended, data_parts, strict=True)
                    ]
            return self._append_built(base_offset, data_parts, appended, n, now)

    def _keyless(self, position: int = -1) -> InvalidRecordError:
        # Kafka's LogValidator.validateKey: the latest value of no key is no value.
        return InvalidRecordError(
            "Compacted topic cannot accept message without key in topic partition "
            f"{self.topic}-{self.partition}.",
            position,
        )

    @property
    def _codec(self) -> CompressionType:
        name = self.config.compression_type
        return CompressionType.NONE if name == "producer" else codec_from_name(name)

    @property
    def _timestamp_type(self) -> TimestampType:
        if self.config.message_timestamp_type == "LogAppendTime":
            return TimestampType.LOG_APPEND_TIME
        return TimestampType.CREATE_TIME

    def _build_batches(
        self,
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None] | None,
        timestamps: Sequence[int] | int,
        headers: Sequence[Sequence[Header]] | None,
        start: int,
        end: int,
        base_offset: int,
        codec: CompressionType,
        timestamp_type: TimestampType,
        data_parts: list[bytes],
        appended: list[AppendedBatch],
    ) -> None:
        # Build one batch for values[start:end]; if it is over max.message.bytes, split
        # the range in halves (a record alone over the limit is the producer's error).
        whole = start == 0 and end == len(values)
        batch_timestamps = timestamps if isinstance(timestamps, int) else timestamps[start:end]
        data = build_record_batch(
            values if whole else values[start:end],
            keys=None if keys is None else (keys if whole else keys[start:end]),
            headers=None if headers is None else (headers if whole else headers[start:end]),
            timestamps=batch_timestamps,
            base_offset=base_offset + start,
            codec=codec,
            timestamp_type=timestamp_type,
        )
        limit = self.config.max_message_bytes
        if len(data) > limit:
            if end - start == 1:
                raise RecordTooLargeError(len(data), limit)
            middle = (start + end) // 2
            for lo, hi in ((start, middle), (middle, end)):
                self._build_batches(
                    values, keys, timestamps, headers, lo, hi, base_offset, codec,
                    timestamp_type, data_parts, appended,
                )  # fmt: skip
            return
        max_ts = batch_timestamps if isinstance(batch_timestamps, int) else max(batch_timestamps)
        data_parts.append(data)
        first, last = base_offset + start, base_offset + end - 1
        appended.append(AppendedBatch(first, last, max_ts, len(data)))

    def append_batches(self, data: bytes, *, assign_offsets: bool = True) -> AppendInfo:
        """Append client-built v2 batches (back to back in ``data``), as a broker does.

        With ``assign_offsets`` (a producer's batches) each batch is validated as
        Kafka's ``LogValidator`` does (``validate_client_batch``: CRC, size, count vs
        offset deltas, no control or transactional batch) and its base offset rewritten
        to the log end offset (bytes 0-7, outside the CRC). Without it (copying a log,
        gaps included, as replication does) only the CRC and size are checked, and the
        batches must start at or after the log end offset and increase. Under
        ``LogAppendTime`` each batch's max timestamp is set to now and its CRC
        recomputed. Nothing is appended unless every batch passes.

        Raises:
            CorruptRecordError: a batch is partial, not v2, or fails its CRC.
            RecordTooLargeError: a batch exceeds ``max.message.bytes``.
            InvalidRecordError: a producer batch breaks a ``LogValidator`` rule (in a
                compacted log: a record without a key).
            InvalidOffsetError: without ``assign_offsets``, offsets do not follow the log end.
            OSError: as ``append`` (``ENOSPC``); nothing was appended.
            ReadOnlyLogError: the log is read-only or closed.
        """
        with self._lock:
            self._check_writable()
            now = self.clock.milliseconds()
            limit = self.config.max_message_bytes
            log_append_time = self._timestamp_type is TimestampType.LOG_APPEND_TIME
            measure = None if self.extension is None else self.extension.measure
            next_offset = self._next_offset
            parts: list[bytes] = []
            appended: list[AppendedBatch] = []
            consumed = 0
            count = 0
            first_base_offset = -1
            for batch in iter_batches(data):
                if assign_offsets:
                    batch = validate_client_batch(batch, limit)
                    if self.config.compact and None in batch.columns().keys:
                        raise self._keyless(batch.position)
                elif batch.magic != MAGIC_V2 or not batch.is_valid():
                    raise CorruptRecordError(
                        "batch is not a valid v2 batch", position=batch.position
                    )
                elif batch.size > limit:
                    raise RecordTooLargeError(batch.size, limit)
                raw = bytearray(batch.to_bytes())
                if assign_offsets:
                    patch_base_offset(raw, next_offset)
                    base_offset = next_offset
                    last_offset = next_offset + batch.last_offset - batch.base_offset
                elif batch.base_offset < next_offset:
                    raise InvalidOffsetError(
                        f"batch base offset {batch.base_offset} is below the log end "
                        f"offset {next_offset}"
                    )
                else:
                    base_offset, last_offset = batch.base_offset, batch.last_offset
                if first_base_offset < 0:
                    first_base_offset = base_offset
                max_ts = batch.max_timestamp
                if log_append_time:
                    max_ts = now
                    patch_log_append_time(raw, now)
                units = 0 if measure is None else measure(batch)
                parts.append(bytes(raw))
                appended.append(AppendedBatch(base_offset, last_offset, max_ts, batch.size, units))
                next_offset = last_offset + 1
                consumed += batch.size
                assert isinstance(batch, DefaultRecordBatch)  # v2, checked above
                count += batch.records_count
            if consumed != len(data) or not parts:
                raise CorruptRecordError(
                    f"{len(data) - consumed} bytes after the last complete batch",
                    position=consumed,
                )
            return self._append_built(first_base_offset, parts, appended, count, now)

    def _append_built(
        self,
        first_offset: int,
        parts: list[bytes],
        appended: list[AppendedBatch],
        count: int,
        now: int,
    ) -> AppendInfo:
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        last_offset = appended[-1].last_offset
        max_ts = max(batch.max_timestamp for batch in appended)
        segment = self._maybe_roll(len(data), max_ts, last_offset, now)
        # Full disk: every index page this append may write gets its blocks before any
        # log byte is written (each batch adds at most one entry to each index), so an
        # append is acknowledged with all of its index entries or fails whole.
        for index in segment.indexes():
            index.reserve(len(appended))
        position = segment.append(data, appended)
        self._next_offset = last_offset + 1
        if self._next_offset - self.recovery_point >= self.config.flush_messages:
            self.flush()
        return AppendInfo(
            first_offset, last_offset, max_ts, count, len(data), segment.base_offset, position
        )

    @contextlib.contextmanager
    def reserved(self, size: int, records: int) -> Iterator[None]:
        """Hold the log for appends that must not fail for want of room: at most
        ``records`` records in at most ``size`` bytes of batches.

        For the block the log's lock is held (this thread's appends go on, other
        threads' wait), the appends' segment is the active one (rolled to now if they
        would roll it), and the blocks they need are allocated: the ``.log``'s after
        its end (``fallocate`` keeping the size: appends write into them later, and
        what they leave unused the next appends do) and the index pages their entries
        may need. An append of several partitions that must be all or nothing as far
        as room goes (the file system's ``produce`` file) reserves each partition, in
        one order (sorted: no two such writers wait for each other), then appends to
        each. A roll by ``segment.ms`` falling due between the reservation and the
        append would still need blocks of its own.

        Raises:
            OSError: ``ENOSPC``: not enough room; nothing was appended (a roll the
                appends needed may have happened).
            ReadOnlyLogError: the log is read-only or closed.
        """
        with self._lock:
            self._check_writable()
            now = self.clock.milliseconds()
            segment = self._maybe_roll(size, now, self._next_offset + records - 1, now)
            for index in segment.indexes():
                index.reserve(records)
            _allocate_after_end(segment.path, segment.size, size)
            yield

    # -- roll ------------------------------------------------------------------------

    def _maybe_roll(
        self, messages_size: int, max_timestamp: int, max_offset: int, now: int
    ) -> LogSegment:
        segment = self.active_segment
        config = self.config
        if segment.should_roll(
            messages_size,
            max_timestamp,
            max_offset,
            now,
            config.segment_bytes,
            config.max_segment_ms,
        ):
            return self.roll()
        return segment

    def roll(self) -> LogSegment:
        """Seal the active segment and start a new one at the log end offset.

        The sealed segment is fsynced and the recovery point moves to the new segment.
        A roll of an empty active segment is a no-op (Kafka would recreate it). A roll
        that fails (``EMFILE``, ``ENOSPC``, ``EIO``) changes nothing: the active segment
        stays active, its indexes as they were, no file of the new one is left, and the
        next append tries again.

        Blocking: the ``fsync`` of the sealed segment (see ``append``).

        Raises:
            ReadOnlyLogError: the log is read-only or closed.
            OSError: the new segment's files could not be made, or the sealed segment's
                ``.log`` not fsynced.
        """
        with self._lock:
            self._check_writable()
            active = self.active_segment
            new_offset = self._next_offset
            if active.base_offset == new_offset:
                return active
            # The order is important below. Everything that can fail comes before any
            # change to the active segment. (1) The fsync of the active segment's .log,
            # the only durability that matters, before any file of the new segment
            # exists: a power cut after the new, empty .log became durable but before
            # the sealed tail did would leave a hole of offsets that recovery cannot
            # see (it cuts a torn batch, not a missing one). Doing it here (Kafka
            # flushes the sealed segment asynchronously) keeps the crash guarantee
            # simple: only the active segment can lose unflushed data, so recovery
            # always leaves a prefix of what was appended. (2) The new segment's files,
            # indexes first and the .log last (a crash leaves orphan indexes that the
            # loader removes; a failure deletes what was made), and an fsync of the
            # partition directory, without which the new name may vanish in a power
            # cut along with everything later flushed into it (POSIX makes a name
            # durable only through its directory; ext4 happens to commit it with the
            # file). Then (3) the active segment is sealed (final time-index entry,
            # indexes trimmed), which needs no descriptor and only writes hints: a
            # failure there is logged, not raised; (4) the recovery point moves and the
            # new segment is published. Kafka seals first and then opens the new
            # segment, and takes the log directory offline on any IOException between.
            active.flush_log()
            segment = LogSegment.create(
                self.dir,
                new_offset,
                self.config,
                self.clock.milliseconds(),
                rolling_jitter_ms=self._random_jitter(),
                extension_spec=self.extension,
                extension_start=active.extension_end,
            )
            try:
                fsync_directory(self.dir)
            except BaseException:
                segment.delete_if_exists()
                raise
            try:
                active.on_becoming_inactive()
                for index in active.indexes():
                    index.flush()
            except (StorageError, OSError) as exc:
                logger.warning(
                    "%s: segment %d sealed with its indexes as they were: %s",
                    self.dir.name,
                    active.base_offset,
                    exc,
                )
            self.recovery_point = max(self.recovery_point, new_offset)
            self.segments.add(segment)
            active.unpin()
            logger.debug("%s: rolled to segment %d", self.dir.name, new_offset)
            return segment

    def _random_jitter(self) -> int:
        jitter = self.config.segment_jitter_ms
        if jitter == 0:
            return 0
        return random.randrange(min(jitter, self.config.max_segment_ms))

    def next_roll_due_ms(self) -> int | None:
        """When ``roll_if_due`` will next roll the active segment on ``segment.ms``;
        None while it is empty (a new append may change the answer)."""
        active = self.active_segment
        if active.size == 0:
            return None
        first = active.first_batch_timestamp()
        since = first if first is not None and first >= 0 else active.created_ms
        return since + self.config.max_segment_ms - active.rolling_jitter_ms + 1

    def roll_if_due(self) -> bool:
        """Roll when the active segment is non-empty and older than ``segment.ms``.

        Kafka rolls on time only when a new append arrives; the daemon calls this when
        ``next_roll_due_ms`` says, so that a quiet partition's segment still seals on
        time. A closed log is skipped.

        Raises:
            ReadOnlyLogError: the log is read-only.
        """
        with self._lock:
            if self._closed:
                return False
            self._check_writable()
            now = self.clock.milliseconds()
            active = self.active_segment
            if active.size > 0 and active.time_waited_for_roll(now, now) > (
                self.config.max_segment_ms - active.rolling_jitter_ms
            ):
                self.roll()
                return True
            return False

    # -- reading ---------------------------------------------------------------------

    def _check_offset(self, offset: int) -> None:
        if offset < self.log_start_offset or offset > self._next_offset:
            raise OffsetOutOfRangeError(offset, self.log_start_offset, self._next_offset)

    def _deleted(self, segment: LogSegment, offset: int) -> SegmentDeletedError:
        error = SegmentDeletedError(segment.path, offset)
        error.log_start_offset = self.log_start_offset
        error.log_end_offset = self._next_offset
        return error

    def batches(
        self,
        start_offset: int,
        *,
        check_crc: bool = True,
        on_corrupt: CorruptRangeHandler | None = None,
    ) -> Iterator[RecordBatch]:
        """Batches from the one holding ``start_offset`` to the log end, validated.

        The first batch may start before ``start_offset``; callers filter records.
        Segments deleted by retention during the iteration are read to their end while
        their descriptors stay open; later segments are picked up as they appear.

        Damage is never passed over in silence: a batch that fails its CRC, whose
        offsets are not where it lies (``_misplaced``: they go back, leave its segment,
        or, where holes are damage, do not follow the offsets before), or that its
        segment cannot hold (outside the unflushed tail: see ``Tail``; a sealed segment
        never has one) raises ``CorruptRecordError`` naming its file, byte position and
        the first offset not served; the batches before it were served. With
        ``on_corrupt`` the read instead reports the damage there and goes on at the
        next batch it can frame: the one after a damaged batch (which may start past
        the offsets it claimed); after damaged framing, the first batch an
        offset-index entry names past it, else the next segment (else the log end).
        Kafka has no such mode; it is Spark's ``failOnDataLoss=false``.

        Cost: O(log n) to position (segment bisection, index lookup), then sequential.

        Raises:
            OffsetOutOfRangeError: ``start_offset`` outside [log start, log end].
            SegmentDeletedError: retention deleted the records the iteration needed
                next while it ran (reposition at ``log_start_offset``).
            CorruptRecordError: damage, as above (never served).
        """
        for _segment, batch in self._located_batches(start_offset, check_crc, on_corrupt):
            yield batch

    def _located_batches(
        self,
        start_offset: int,
        check_crc: bool = True,
        on_corrupt: CorruptRangeHandler | None = None,
    ) -> Generator[tuple[LogSegment, RecordBatch], None, None]:
        """``batches``, each with the segment it lies in."""
        self._check_offset(start_offset)
        offset = start_offset
        segment = self.segments.floor_segment(offset)
        if segment is None:
            # Retention moved the start past ``offset`` since the check above.
            first = self.segments.first_segment
            assert first is not None
            raise self._deleted(first, offset)
        # The first batch of the read holds ``start_offset`` (it may start before it);
        # every later one goes on from the offset after the last one served.
        first_batch = True
        after_damage = False
        # A read at the offset after a batch (where a reader that read on goes on) also
        # scans that batch, to judge the next one as coming after it: a base offset
        # damaged downwards (outside the CRC) otherwise made the read serve that batch
        # under offsets it never had (it seemed to hold ``start_offset``), or skip it
        # (its offsets seemed to end below) and go on after a gap.
        look_back = offset > segment.base_offset
        before: RecordBatch | None = None  # that batch, until the next item
        while True:
            following = self.segments.higher_segment(segment.base_offset)
            tail = Tail.ACTIVE if following is None else Tail.SEALED
            # Offsets a batch of this segment may hold lie below ``limit``: the next
            # segment's base offset, and 32 bits relative to this one's.
            limit = segment.base_offset + _RELATIVE_OFFSETS
            if following is not None:
                limit = min(limit, following.base_offset)
            # A read that enters the segment at its base offset takes its batches from
            # its first byte: a batch there whose offsets seem to end below the base
            # offset (its base offset damaged downwards) was passed over in silence.
            entering = offset <= segment.base_offset
            items: Generator[RecordBatch | CorruptRecordError, None, None] | None = None
            try:
                items = _framed(
                    segment.batches_from(offset - 1 if look_back else offset, tail=tail)
                )
                # The item after a batch after a gap, read ahead to judge that batch.
                ahead: RecordBatch | CorruptRecordError | None = None
                peeked = False
                while True:
                    if peeked:
                        item, ahead, peeked = ahead, None, False
                    else:
                        item = next(items, None)
                    if look_back:
                        look_back = False
                        if (
                            item is not None
                            and not isinstance(item, CorruptRecordError)
                            and item.last_offset < offset
                        ):
                            # The batch before ``start_offset``: not served (nor its
                            # CRC checked); the next one must go on after it.
                            first_batch = False
                            before = item
                            continue
                        if (
                            item is not None
                            and not isinstance(item, CorruptRecordError)
                            and item.magic >= MAGIC_V2
                            and item.base_offset < offset
                        ):
                            # The read starts inside this batch: judge it as a read
                            # from the batch before it would (a base offset damaged
                            # upwards made it seem to hold offsets past its own, to be
                            # served under them). Errors name no offset below
                            # ``start_offset`` still.
                            previous = _batch_ending_at(segment, item.position)
                            if previous is not None or item.position == 0:
                                first_batch = False
                                offset = (
                                    segment.base_offset
                                    if previous is None
                                    else previous.next_offset
                                )
                                items.close()
                                items = _framed(segment.batches(item.position, tail=tail))
                                continue
                        if isinstance(item, CorruptRecordError):
                            # Damaged framing before the batch holding the offset: no
                            # batch before to judge by; read from the offset as it is.
                            items.close()
                            items = _framed(segment.batches_from(offset, tail=tail))
                            continue
                    if entering:
                        entering = False
                        if (
                            item is not None
                            and not isinstance(item, CorruptRecordError)
                            and item.position > 0
                        ):
                            error = CorruptRecordError(
                                f"the batches before byte {item.position} hold offsets "
                                f"below the segment's base offset {segment.base_offset}",
                                segment.path,
                                0,
                                offset=offset,
                            )
                            if on_corrupt is None:
                                raise error
                            first_batch, after_damage = False, True
                            on_corrupt(error, offset)
                    if isinstance(item, CorruptRecordError):
                        # Damaged framing: this scan can go no further.
                        error = CorruptRecordError(
                            item.reason,
                            segment.path,
                            item.position,
                            offset=max(offset, start_offset),
                        )
                        if (
                            before is not None
                            and before.position + before.size == item.position
                            and not before.is_valid()
                        ):
                            # Right after the batch before the read, which fails its
                            # CRC: its damaged length framed the garbage (as
                            # ``LogSegment.batches_from`` blames a batch it passed over).
                            error = CorruptRecordError(
                                "CRC mismatch",
                                segment.path,
                                before.position,
                                offset=max(offset, start_offset),
                            )
                        before = None
                        if on_corrupt is None:
                            raise error from None
                        resume = segment.resume_after(item.position, tail)
                        if resume is None:
                            later = self.segments.higher_segment(segment.base_offset)
                            offset = self._next_offset if later is None else later.base_offset
                            on_corrupt(error, offset)
                            break
                        on_corrupt(error, resume[1])
                        offset = resume[1]
                        items = _framed(segment.batches(resume[0], tail=tail))
                        continue
                    batch, before = item, None
                    if batch is None:
                        if tail is Tail.ACTIVE:
                            later = self.segments.higher_segment(segment.base_offset)
                            if later is not None and offset < later.base_offset:
                                # A roll sealed the segment while it was read as the
                                # active one: a batch this reader took for the writer's
                                # append in flight is whole now (or damage).
                                tail = Tail.SEALED
                                limit = min(limit, later.base_offset)
                                items = _framed(segment.batches_from(offset, tail=tail))
                                continue
                        break
                    base = segment.base_offset
                    problem = _misplaced(batch, offset, base, limit, first=first_batch)
                    if (
                        problem is None
                        and not after_damage
                        and batch.magic >= MAGIC_V2
                        and batch.base_offset > offset
                    ):
                        # A gap: only compaction makes one, and a damaged base offset
                        # (outside the CRC) too. The next batch tells them apart.
                        ahead, peeked = next(items, None), True
                        problem = gap_disproved(
                            batch,
                            offset - 1,
                            None if isinstance(ahead, CorruptRecordError) else ahead,
                            limit if following is not None else self._active_end(limit),
                        )
                    if problem is not None:
                        # Its offsets are not to be trusted: the first one not served
                        # is the one expected, and the batch spans as many offsets as
                        # its (CRC-covered) last offset delta says.
                        error_offset = max(offset, start_offset)
                        resume_at = min(offset + max(_offset_span(batch), 1), limit)
                    elif check_crc and not batch.is_valid():
                        # Not its base offset: outside the CRC, damaged too maybe.
                        problem = "CRC mismatch"
                        error_offset = max(offset, start_offset)
                        resume_at = max(offset, min(batch.next_offset, limit))
                    else:
                        yield segment, batch
                        offset = batch.next_offset
                        first_batch = after_damage = False
                        continue
                    error = CorruptRecordError(
                        problem, segment.path, batch.position, offset=error_offset
                    )
                    if on_corrupt is None:
                        raise error
                    offset = resume_at
                    first_batch, after_damage = False, True
                    on_corrupt(error, offset)
            except SegmentDeletedError:
                raise self._deleted(segment, offset) from None
            finally:
                # Its descriptor now: an error raised here holds this frame in a
                # reference cycle (error -> traceback -> frame -> error) that only the
                # garbage collector would break, and the scan with it.
                if items is not None:
                    items.close()
            following = self.segments.higher_segment(segment.base_offset)
            if following is None:
                return
            if following.base_offset > offset and offset < self.log_start_offset:
                # The segments between this one and ``following`` were deleted while
                # this one was read: a gap retention made, not one in the data.
                raise self._deleted(segment, offset)
            offset = max(offset, following.base_offset)
            segment = following
            first_batch = False

    def fetch(self, start_offset: int, max_bytes: int, *, min_one_batch: bool = True) -> FetchData:
        """The stored batches from the one holding ``start_offset`` (which may start
        before it), whole, up to ``max_bytes`` in all, as they lie in their files, for a
        Kafka Fetch to send as stored (see ``fetch_data``). With ``min_one_batch`` the
        first batch comes even when it alone is larger (Kafka's ``minOneMessage``,
        KIP-74: a consumer never stalls on a large batch). Every batch is checked as
        ``batches`` checks it; damage or a deletion met after some batches ends the
        fetch before it (the next fetch, starting there, raises). Close the result.

        Cost: as ``batches`` over the bytes returned, plus one descriptor duplicated per
        run of ``REGION_MIN_BYTES`` or more (a run: batches back to back in one file).

        Raises:
            OffsetOutOfRangeError: ``start_offset`` outside [log start, log end].
            SegmentDeletedError: retention deleted the first batch meanwhile.
            CorruptRecordError: the first batch is damaged (never served).
        """
        data = FetchData()
        run_segment: LogSegment | None = None
        run_start = run_end = -1
        run_copies: list[bytes] = []  # the current run, until it is long enough
        region: FileRegion | None = None  # the current run, once it is
        may_open = True  # False once out of descriptors: copy the rest

        def end_run() -> None:
            nonlocal region, run_copies
            if region is not None:
                data.parts.append(region)
            elif run_copies:
                data.parts.append(b"".join(run_copies))
            region, run_copies = None, []

        try:
            with contextlib.closing(self._located_batches(start_offset)) as located:
                for segment, batch in located:
                    if (data.size or not min_one_batch) and data.size + batch.size > max_bytes:
                        break
                    if segment is not run_segment or batch.position != run_end:
                        end_run()
                        run_segment, run_start = segment, batch.position
                    run_end = batch.position + batch.size
                    data.size += batch.size
                    if region is not None:
                        region.size += batch.size
                    else:
                        run_copies.append(batch.to_bytes())
                        run_size = run_end - run_start
                        if may_open and batch.position >= 0 and run_size >= REGION_MIN_BYTES:
                            try:
                                fd = segment.log.open_reader()
                            except (OSError, SegmentDeletedError):
                                # Out of descriptors, or the file went since the scan
                                # read it: the copies are what was checked; keep copying.
                                may_open = False
                            else:
                                region = FileRegion(fd, run_start, run_size, segment.path)
                                run_copies = []
                    if data.size >= max_bytes:
                        break
        except (OffsetOutOfRangeError, CorruptRecordError):
            # SegmentDeletedError is an OffsetOutOfRangeError.
            if not data.size:
                data.close()
                raise
        except BaseException:
            data.close()
            if region is not None:
                region.close()
            raise
        end_run()
        return data

    def _active_end(self, limit: int) -> int:
        """The offsets the active segment holds end below this: the log end offset,
        read under the lock (an append in flight has its bytes in the file before it
        moves the log end; the lock waits for it), within ``limit``."""
        with self._lock:
            return min(limit, self._next_offset)

    def record_columns(
        self, start_offset: int, end_offset: int | None = None
    ) -> Iterator[RecordColumns]:
        """The records with ``start_offset <= offset < end_offset``, a batch of columns
        at a time: the bulk read path (rendering, Arrow), with no object per record.

        Records of the first and last batch outside the range are skipped, not
        decoded (``RecordBatch.columns``); the CRC covers them all.

        Raises:
            OffsetOutOfRangeError, SegmentDeletedError, CorruptRecordError: as ``batches``.
        """
        return self._column_runs(start_offset, end_offset, 0)

    def records(self, start_offset: int, end_offset: int | None = None) -> Iterator[Record]:
        """Records with ``start_offset <= offset < end_offset`` (to the log end by default).

        Decoding is lazy at the start: the first ``FIRST_RUN_RECORDS`` records come
        from a decode of their own, so ``next(log.records(offset))`` (a lookup) does not
        decode the rest of the batch it lands in. A malformed record there raises when
        the iteration reaches it.

        Raises:
            OffsetOutOfRangeError, SegmentDeletedError, CorruptRecordError: as ``batches``.
        """
        # chain.from_iterable hands records over at C speed; a ``yield from`` here
        # would add a generator resumption per record to the read path.
        return chain.from_iterable(self._column_runs(start_offset, end_offset, FIRST_RUN_RECORDS))

    def _column_runs(
        self, start_offset: int, end_offset: int | None, first_run: int
    ) -> Iterator[RecordColumns]:
        # ``first_run`` > 0: the first batch's records from ``start_offset`` come as two
        # decodes, its first ``first_run`` offsets, then the rest.
        for batch in self.batches(start_offset):
            if end_offset is not None and batch.base_offset >= end_offset:
                return
            if first_run > 0:
                split = max(start_offset, batch.base_offset) + first_run
                first_run = 0
                if split <= batch.last_offset and (end_offset is None or split < end_offset):
                    columns = batch.columns(start_offset, split)
                    if len(columns):
                        yield columns
                    start_offset = split
            columns = batch.columns(start_offset, end_offset)
            if len(columns):
                yield columns

    def read(self, start_offset: int, max_records: int) -> list[Record]:
        """Up to ``max_records`` records from ``start_offset``."""
        out: list[Record] = []
        for record in self.records(start_offset):
            out.append(record)
            if len(out) >= max_records:
                break
        return out

    def offset_for_timestamp(self, timestamp: int) -> int | None:
        """The first offset whose record timestamp is >= ``timestamp`` (Kafka's
        ``ListOffsets`` by time), or None when every record is older.

        Timestamps may go back (``CreateTime`` is the producer's): the answer is the
        first offset, not the earliest time, and the segment searched is the first
        (from the log start) whose max timestamp reaches the target, as in Kafka; a
        segment wholly below the log start is never searched. Records the search
        passes over are proven older by their segment's max timestamp or its time
        index; every batch it reads is checked as ``batches`` checks it (CRC, offsets
        where they belong: a damaged base offset is outside the CRC), and offsets in no
        segment file it passes over (a segment missing from the middle, under
        ``cleanup.policy=delete``) could hold the answer: both raise, never answer.

        Cost: O(segments) to find the segment by its max timestamp, then O(log n)
        through its time and offset indexes and a short scan.

        Raises:
            SegmentDeletedError: the segment searched was deleted meanwhile.
            CorruptRecordError: damage the search reads or passes over, as above.
        """
        start = self.log_start_offset
        segments = self.segments.values()
        for i, segment in enumerate(segments):
            end = segments[i + 1].base_offset if i + 1 < len(segments) else None
            if end is not None and end <= start:
                continue  # wholly below the log start: its records are not served
            if segment.max_timestamp < timestamp:
                hole = segment.hole_after_error()
                if hole is not None:
                    raise hole
                continue
            # ``batches`` goes on into the next segments; the search of this one ends
            # with its last batch (the next has a time index of its own).
            for batch in self.batches(max(segment.timestamp_scan_start(timestamp), start)):
                if batch.max_timestamp >= timestamp:
                    for record in batch.records():
                        if record.offset >= start and record.timestamp >= timestamp:
                            return record.offset
                if end is not None and batch.next_offset >= end:
                    break
        return None

    # -- retention -------------------------------------------------------------------

    def delete_old_segments(self) -> int:
        """Apply retention; return the number of segments deleted. A closed log is skipped.

        Deletes oldest first, as Kafka's ``deleteOldSegments``: segments wholly below
        the log start offset; with ``cleanup.policy`` containing ``delete``, segments
        whose newest record is older than ``retention.ms`` and the oldest segments
        while the log exceeds ``retention.bytes``. The non-empty active segment is
        deletable too: when every segment is, the log first rolls (so a quiet
        partition does not serve expired records forever). The log start offset moves
        to the first retained segment. Files are renamed ``.deleted`` and removed after
        ``file.delete.delay.ms`` (``delete_expired_files``).

        Raises:
            ReadOnlyLogError: the log is read-only.
        """
        with self._lock:
            if self._closed:
                return 0
            self._check_writable()
            deleted = self._delete_old(self._below_log_start)
            if self.config.delete:
                now = self.clock.milliseconds()
                deleted += self._delete_old(self._retention_ms_breached(now))
                deleted += self._delete_old(self._retention_size_breached())
            self.delete_expired_files()
            return deleted

    def _below_log_start(self, segment: LogSegment, following: LogSegment | None) -> bool:
        return following is not None and following.base_offset <= self.log_start_offset

    def _retention_ms_breached(self, now: int) -> SegmentPredicate:
        retention_ms = self.config.retention_ms

        def expired(segment: LogSegment, following: LogSegment | None) -> bool:
            return retention_ms >= 0 and now - segment.largest_timestamp() > retention_ms

        return expired

    def _retention_size_breached(self) -> SegmentPredicate:
        retention_bytes = self.config.retention_bytes
        excess = self.size - retention_bytes if retention_bytes >= 0 else 0

        def over_size(segment: LogSegment, following: LogSegment | None) -> bool:
            nonlocal excess
            if excess > 0 and excess - segment.size >= 0:
                excess -= segment.size
                return True
            return False

        return over_size

    def _delete_old(self, predicate: SegmentPredicate) -> int:
        # Kafka's LocalLog.deletableSegments: oldest first while the predicate holds,
        # never an empty active segment.
        segments = self.segments.values()
        deletable: list[LogSegment] = []
        for i, segment in enumerate(segments):
            following = segments[i + 1] if i + 1 < len(segments) else None
            if (following is None and segment.size == 0) or not predicate(segment, following):
                break
            deletable.append(segment)
        if not deletable:
            return 0
        if len(deletable) == len(segments):
            # A log always has a segment: roll so the expired active one can go.
            self.roll()
        self._delete_segments(deletable)
        return len(deletable)

    def _delete_segments(self, segments: list[LogSegment]) -> None:
        # The order is important: the extension-start checkpoint names the new oldest
        # segment first, while the units before it are still on disk (a crash after it
        # leaves a checkpoint naming a later segment, which the loader computes back
        # from; a crash before it, the old checkpoint and all the old segments). Then
        # the log start offset moves, so a reader that finds the segment map changed
        # also finds the start moved (and reports the
        # deletion instead of skipping it as a gap in the data); then the segments
        # leave the map, so no new read starts in them; then the files are renamed
        # .deleted (a crash from here on leaves files that recovery removes); the
        # unlink waits file.delete.delay.ms for reads already under way. A rename can
        # fail on a full disk (the longer name may need a new block of the directory):
        # that segment's files are unlinked at once instead, which needs no room and
        # gives some back; they must not stay behind, out of the map yet on disk, to
        # come back at the next open.
        following = self.segments.higher_segment(segments[-1].base_offset)
        assert following is not None, "the active segment is never deleted"
        self._checkpoint_extension_start(following)
        self.log_start_offset = max(self.log_start_offset, following.base_offset)
        for segment in segments:
            self.segments.remove(segment.base_offset)
        due = self.clock.milliseconds() + self.config.file_delete_delay_ms
        for segment in segments:
            try:
                segment.change_file_suffixes("", DELETED_FILE_SUFFIX)
            except OSError as exc:
                logger.warning(
                    "%s: segment %d deleted at once, its files could not be renamed: %s",
                    self.dir.name,
                    segment.base_offset,
                    exc,
                )
                _delete_segment_files(segment)
            else:
                # Its descriptors and mappings go now, not after the delay: under
                # churn (a roll and a deletion a second) they would pile up for
                # file.delete.delay.ms (60 s), 4 a segment, and fill the bound of open
                # segments. Released, not closed, as the least recently used are: a
                # scan under way reads on through its own duplicate of the descriptor,
                # a lookup through the mapping it holds (dropped, not unmapped); a read
                # that starts in the segment during the delay opens the ``.deleted``
                # file again by name (and it joins the bound again), one after the
                # unlink raises SegmentDeletedError. Never another file's bytes: a
                # reopen checks the inode.
                segment.open_segments.discard(segment)
                try:
                    segment.release_handles()
                except OSError as exc:  # a close that failed: the descriptor is gone anyway
                    logger.warning("%s: releasing deleted segment: %s", segment.path, exc)
                self._pending_deletes.append((due, segment))
            # Oldest first, each durable before the next: a power cut must never keep a
            # later segment's rename and lose an earlier one's (the older segment would
            # come back behind a hole of offsets).
            fsync_directory(self.dir)
        logger.info(
            "%s: deleted %d segment(s); log start offset %d",
            self.dir.name,
            len(segments),
            self.log_start_offset,
        )

    def next_retention_due_ms(self) -> int | None:
        """When the oldest segment's records pass ``retention.ms`` (None: never by
        time). Size-based retention is due whenever an append made the log too big."""
        if not self.config.delete or self.config.retention_ms < 0:
            return None
        first = self.segments.first_segment
        if first is None or first.size == 0:
            return None
        return first.largest_timestamp() + self.config.retention_ms + 1

    def next_file_deletion_due_ms(self) -> int | None:
        """When ``delete_expired_files`` next has a file to remove."""
        with self._lock:
            return min((due for due, _segment in self._pending_deletes), default=None)

    def delete_expired_files(self) -> int:
        """Unlink ``.deleted`` files whose ``file.delete.delay.ms`` has passed."""
        with self._lock:
            now = self.clock.milliseconds()
            keep: list[tuple[int, LogSegment]] = []
            removed = 0
            for due, segment in self._pending_deletes:
                if due <= now:
                    segment.delete_if_exists()
                    removed += 1
                else:
                    keep.append((due, segment))
            self._pending_deletes = keep
            return removed

    def advance_log_start_offset(self, offset: int) -> None:
        """Move the log start offset forward (Kafka's ``DeleteRecords``); whole
        segments below it go at the next ``delete_old_segments``.

        Raises:
            OffsetOutOfRangeError: ``offset`` is past the log end.
            ReadOnlyLogError: the log is read-only or closed.
        """
        with self._lock:
            self._check_writable()
            if offset > self._next_offset:
                raise OffsetOutOfRangeError(offset, self.log_start_offset, self._next_offset)
            self.log_start_offset = max(self.log_start_offset, offset)

    # -- compaction (storage/log/cleaner.py does the work) -----------------------------

    def clean(
        self,
        offset_map: OffsetMap,
        *,
        first_dirty_offset: int | None = None,
        on_step: StepHook | None = None,
        abort: threading.Event | None = None,
    ) -> tuple[int, CleanerStats]:
        """Run one cleaning pass (Kafka's log compaction) from ``first_dirty_offset``
        (the cleaner checkpoint; None: the log start); return the first offset not
        cleaned (the next pass's first dirty offset) and what the pass did.

        Cleans up to the first uncleanable offset (the active segment, the first
        segment younger than ``min.compaction.lag.ms``) or as far as ``offset_map``
        holds keys; a log with more keys is cleaned in several passes. Any log may be
        cleaned, whatever its ``cleanup.policy`` (the manager picks the compacted ones).
        Appends and reads go on meanwhile; the lock is taken for each swap only.
        ``abort``, once set, stops the pass at its next batch (nothing committed
        stays: see ``Cleaner``).

        Cost: see ``storage/log/cleaner.py``.

        Raises:
            LogCleaningAbortedError: the log changed under the pass (see ``Cleaner``).
            CorruptRecordError: a batch to clean is damaged (that group is unchanged).
            ReadOnlyLogError: the log is read-only or closed.
            OSError: a cleaned segment could not be written (the log is unchanged).
        """
        self._check_writable()
        to_clean = cleanable_offsets(self, first_dirty_offset, self.clock.milliseconds())
        if to_clean.first_uncleanable_offset <= to_clean.first_dirty_offset:
            return to_clean.first_dirty_offset, CleanerStats(
                segments_before=self.number_of_segments, segments_after=self.number_of_segments
            )
        return Cleaner(offset_map, clock=self.clock, on_step=on_step, abort=abort).clean(to_clean)

    def replace_segments(
        self, groups: Sequence[CleanedGroup], on_step: Callable[..., None]
    ) -> None:
        """Swap each cleaned segment (written as ``.cleaned``, fsynced) in for the old
        segments of its group (Kafka's ``replaceSegments``), all in one publish,
        telling ``on_step`` after each ``CleaningStep`` of each segment.

        The order is important, and each step is durable (the directory fsynced)
        before the next. (0) With an extension index, the extension-start checkpoint
        names the first segment the groups leave in place (its units hold before and
        after). (1) ``.cleaned`` -> ``.swap``: the commit point of each
        segment. Before it a crash leaves ``.cleaned`` files the loader removes, and
        the old segments whole; after it the loader completes the swap
        (``log_loader._complete_swaps``). (2) The new segments take the old ones'
        place in the segment map (one publish: no reader ever finds a range without a
        segment, or a mix of old and new units), the old segments' files are renamed
        ``.deleted``; reads already in them finish on their descriptors, the files go
        after ``file.delete.delay.ms``. (3) ``.swap`` -> final names. A crash between
        (2) and (3) leaves the ``.swap`` and maybe some old segments: the loader
        deletes what the swap covers and renames it. Each group is whole on its own:
        a crash part way through several leaves some groups cleaned, some not, every
        record that was the latest of its key still there.

        With an extension index the groups must be every segment from the log start
        up: their units are laid end to end so that the last ends where the first
        segment after them begins, and the units the pass removed leave from the
        front (``extension_start`` moves up, as retention moves it; checkpointed).
        ``layout_epoch`` then counts one more: positions of records in the cleaned
        segments changed, those of every later record did not.

        Raises:
            LogCleaningAbortedError: the log is closed, or an old segment is no longer
                in the map or not of its size (retention or truncation got there
                first); the cleaned segments are deleted, nothing else changed.
            OSError: a rename failed: before a commit point nothing of that segment
                changed (the others stay as they are); after it the next open completes
                the swap.
        """
        with self._lock:
            if self._closed or any(self._group_changed(group) for group in groups):
                for group in groups:
                    group.segment.delete_if_exists()
                raise LogCleaningAbortedError(
                    f"{self.dir.name}: segments "
                    f"{[s.base_offset for group in groups for s in group.old]} changed "
                    "while they were cleaned"
                )
            relaid = self._lay_out_units(groups)
            try:
                if self.extension is not None:
                    # Before any commit point, the extension-start checkpoint names the
                    # first segment the pass keeps (its units stay): right for the old
                    # segments and the new alike, and for any mix a power cut leaves
                    # (each .swap rename is a commit point of its own, and the loader
                    # rebuilds a completed swap's index from this anchor: neither the
                    # old checkpoint, naming the oldest segment's old units, nor the
                    # kept segment's entry 0, maybe never synced, can say).
                    following = self.segments.higher_segment(groups[-1].old[-1].base_offset)
                    assert following is not None, "the groups end before a kept segment"
                    write_extension_start_checkpoint(
                        self.dir / self.extension.start_checkpoint_name,
                        following.base_offset,
                        following.extension_start,
                    )
                for group in groups:
                    group.segment.change_file_suffixes(CLEANED_FILE_SUFFIX, SWAP_FILE_SUFFIX)
                fsync_directory(self.dir)
            except Exception:
                # Nothing is published yet: take every commit back (a crash before the
                # directory is synced may keep some .swap names: each is whole).
                for group in groups:
                    _delete_cleaned_files(group.segment)
                raise
            for group in groups:
                on_step(CleaningStep.SWAP_RENAMED, group.segment)
            self.segments.replace(
                [group.segment for group in groups],
                [segment.base_offset for group in groups for segment in group.old],
            )
            if relaid:
                self.layout_epoch += 1
                first = self.segments.first_segment
                if first is not None:
                    self._checkpoint_extension_start(first)
            due = self.clock.milliseconds() + self.config.file_delete_delay_ms
            for segment in (segment for group in groups for segment in group.old):
                try:
                    segment.change_file_suffixes("", DELETED_FILE_SUFFIX)
                except OSError as exc:
                    logger.warning(
                        "%s: segment %s deleted at once: %s", self.dir.name, segment, exc
                    )
                    _delete_segment_files(segment)
                else:
                    self._pending_deletes.append((due, segment))
            fsync_directory(self.dir)
            for group in groups:
                on_step(CleaningStep.OLD_DELETED, group.segment)
            for group in groups:
                group.segment.change_file_suffixes(SWAP_FILE_SUFFIX, "")
            fsync_directory(self.dir)
            for group in groups:
                on_step(CleaningStep.SWAPPED_IN, group.segment)
                logger.info(
                    "%s: cleaned segments %s into %s",
                    self.dir.name,
                    [segment.base_offset for segment in group.old],
                    group.segment,
                )

    def _group_changed(self, group: CleanedGroup) -> bool:
        # Under the lock: an old segment left the map or shrank since it was read.
        current = [self.segments.get(segment.base_offset) for segment in group.old]
        return any(c is not s for c, s in zip(current, group.old, strict=True)) or (
            group.sizes != [segment.size for segment in group.old]
        )

    def _lay_out_units(self, groups: Sequence[CleanedGroup]) -> bool:
        """Under the lock, before the commit point: lay the cleaned segments' extension
        units end to end, the last ending where the segment after the groups begins
        (see ``replace_segments``). Returns whether any unit moved.

        Raises:
            LogCleaningAbortedError: the groups are not every segment from the log start
                up to a segment that stays (nothing was changed).
        """
        if self.extension is None or not groups:
            return False
        old = [segment for group in groups for segment in group.old]
        segments = self.segments.values()
        if segments[: len(old)] != old or len(segments) == len(old):
            for group in groups:
                group.segment.delete_if_exists()
            raise LogCleaningAbortedError(
                f"{self.dir.name}: cleaned groups with positions must cover the log from its start"
            )
        end = segments[len(old)].extension_start
        moved = False
        for group in reversed(groups):
            cleaned = group.segment
            start = end - (cleaned.extension_end - cleaned.extension_start)
            if start != cleaned.extension_start:
                moved = True
                cleaned.rebase_extension(start)
                # Durable before the commit point: a swap completed at the next open
                # must not come with an index of the provisional units (they would be
                # out of step, and rebuilt, but that is a full measure of the segment).
                if cleaned.extension is not None:
                    cleaned.extension.flush()
            end = start
        return moved

    # -- truncation, flush, close ----------------------------------------------------

    def truncate_to(self, offset: int) -> None:
        """Remove every record at ``offset`` and after (batch granularity, as Kafka).

        Raises:
            ReadOnlyLogError: the log is read-only or closed.
        """
        with self._lock:
            self._check_writable()
            if offset >= self._next_offset:
                return
            if offset <= self.log_start_offset:
                offset = self.log_start_offset
            previous_active = self.active_segment
            for segment in reversed(self.segments.values()):
                if segment.base_offset > offset and len(self.segments) > 1:
                    self.segments.remove(segment.base_offset)
                    segment.delete_if_exists()
            active = self.active_segment
            if active is not previous_active:
                active.pin()
            active.truncate_to(offset)
            for index in active.indexes():
                index.resize(self.config.segment_index_bytes)
            self._next_offset = active.read_next_offset()
            self.recovery_point = min(self.recovery_point, self._next_offset)

    def flush(self) -> None:
        """fsync every segment holding offsets at or after the recovery point, then move
        the recovery point to the log end (the caller checkpoints it). A closed or
        read-only log is skipped."""
        with self._lock:
            if not self.writable or self._closed:
                return
            self._last_flush_ms = self.clock.milliseconds()
            end = self._next_offset
            start = self.recovery_point
            if end <= start:
                return
            flushed = self.segments.values(start)
            for segment in flushed:
                segment.flush()
            # A segment that begins at or after the old recovery point may have been
            # created since the last flush (a new partition's first segment, one a
            # truncation started): its name is durable only once the directory is
            # (Kafka's LocalLog.flush does the same).
            if any(segment.base_offset >= start for segment in flushed):
                fsync_directory(self.dir)
            self.recovery_point = end

    def next_flush_due_ms(self) -> int | None:
        """When ``flush.ms`` asks for a flush of the data appended since the last one;
        None when nothing is unflushed or ``flush.ms`` is unlimited."""
        if self._next_offset <= self.recovery_point or not self.writable:
            return None
        flush_ms = self.config.flush_ms
        if flush_ms >= 2**62:
            return None
        return self._last_flush_ms + flush_ms

    def refresh(self) -> None:
        """For a read-only log another process writes: pick up new bytes and segments."""
        with self._lock:
            if self._closed:
                return
            refreshed = refresh_segments(
                self.dir,
                self.segments,
                self.config,
                self.clock,
                self._scratch_dirs,
                self.extension,
            )
            if refreshed is None:
                return  # the topic was deleted; keep serving what we had
            self._next_offset, replaced = refreshed
            if replaced and self.extension is not None:
                self.layout_epoch += 1  # the writer's cleaner moved positions
            first = self.segments.first_segment
            if first is not None:
                self.log_start_offset = max(self.log_start_offset, first.base_offset)

    def close(self) -> None:
        """Flush and close every segment (indexes trimmed); pending deletes complete."""
        with self._lock:
            if self._closed:
                return
            if self.writable:
                self.flush()
                first = self.segments.first_segment
                # A log whose oldest segment starts at (0, 0) lost nothing: no file.
                if first is not None and (first.base_offset, first.extension_start) != (0, 0):
                    self._checkpoint_extension_start(first)
                for _due, segment in self._pending_deletes:
                    segment.delete_if_exists()
                self._pending_deletes.clear()
            for segment in self.segments.values():
                segment.close()
            for path in self._scratch_dirs:
                shutil.rmtree(path, ignore_errors=True)
            self._closed = True

    def _checkpoint_extension_start(self, first: LogSegment) -> None:
        # The units before the oldest segment are in no log once retention deleted its
        # predecessors: this file is what a rebuild of its extension index starts from.
        # A failed write must not stop retention (a full disk is when it matters most):
        # the segment's own index still holds its start, and close writes again.
        if self.extension is None:
            return
        try:
            write_extension_start_checkpoint(
                self.dir / self.extension.start_checkpoint_name,
                first.base_offset,
                first.extension_start,
            )
        except OSError as exc:
            logger.warning("%s: extension start not checkpointed: %s", self.dir.name, exc)

    def _check(self) -> None:
        """Assert every invariant (for tests)."""
        self.segments._check()
        assert self.log_start_offset <= self._next_offset
        assert self.recovery_point <= self._next_offset
        assert self.active_segment.read_next_offset() == self._next_offset
        previous_end: int | None = None
        for segment in self.segments.values():
            for index in segment.indexes():
                index._check()
            if segment.extension is not None:
                if previous_end is not None:
                    assert segment.extension_start == previous_end, (segment, previous_end)
                previous_end = segment.extension_end

    def __repr__(self) -> str:
        return (
            f"Log({self.dir.name}, start={self.log_start_offset}, end={self._next_offset},"
            f" segments={len(self.segments)})"
        )


def _delete_cleaned_files(segment: LogSegment) -> None:
    """Close a cleaned segment that is not swapped in and unlink its files, under
    either temporary name (``.cleaned`` or ``.swap``: a rename may have failed part
    way). Never the name without a suffix: that is the old segment's."""
    segment.close_handlers()
    for path in (segment.log.path, *(index.path for index in segment.indexes())):
        stem = path.name.removesuffix(SWAP_FILE_SUFFIX).removesuffix(CLEANED_FILE_SUFFIX)
        for suffix in (CLEANED_FILE_SUFFIX, SWAP_FILE_SUFFIX):
            with contextlib.suppress(FileNotFoundError):
                path.with_name(stem + suffix).unlink()


def _delete_segment_files(segment: LogSegment) -> None:
    """Close a segment whose rename to ``.deleted`` failed part way and unlink its files,
    under either name (a file adopts its new name even when the rename failed).

    Raises:
        OSError: a file exists but cannot be unlinked.
    """
    segment.close_handlers()
    for path in (segment.log.path, *(index.path for index in segment.indexes())):
        original = path.with_name(path.name.removesuffix(DELETED_FILE_SUFFIX))
        for name in {path, original}:
            name.unlink(missing_ok=True)


_FALLOC_FL_KEEP_SIZE = 1
_libc = ctypes.CDLL(None, use_errno=True)
_fallocate = _libc.fallocate
_fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
_fallocate.restype = ctypes.c_int


def _allocate_after_end(path: Path, offset: int, length: int) -> None:
    """Allocate the blocks of ``length`` bytes at ``offset`` of the file, at or past its
    end, without changing its size (Linux's ``fallocate`` with ``FALLOC_FL_KEEP_SIZE``;
    ``os.posix_fallocate`` would grow the file). A file system that cannot is skipped:
    the write finds out.

    Raises:
        OSError: ``ENOSPC``, or the file cannot be opened.
    """
    if length <= 0:
        return
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        if _fallocate(fd, _FALLOC_FL_KEEP_SIZE, offset, length) != 0:
            code = ctypes.get_errno()
            if code not in (errno.EOPNOTSUPP, errno.ENOSYS):
                raise OSError(code, os.strerror(code), str(path))
    finally:
        os.close(fd)

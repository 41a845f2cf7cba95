"""One segment: a ``.log`` file and its ``.index`` / ``.timeindex`` (Kafka's ``LogSegment``).

The segment appends batches, keeps the sparse indexes in step (an offset-index entry
whenever more than ``index.interval.bytes`` were appended since the last one, keyed by
the batch's last offset and pointing at the batch's start; a time-index entry for each
new maximum timestamp at those points), translates an offset to a file position, and
recovers itself by re-validating every batch.

Crash safety: log bytes are written before the index entries that point at them, and
indexes are never trusted over the log: a missing or corrupt index is rebuilt by
``recover()``.

Thread-safety: not thread-safe for mutation; the owning ``Log`` serialises appends,
truncation and roll. Reads (``batches``, ``translate_offset``) may run concurrently
with an append.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Sequence
from itertools import chain, dropwhile
from pathlib import Path
from typing import NamedTuple, Protocol

from .errors import CorruptIndexError, CorruptRecordError
from .file_names import (
    log_file,
    offset_index_file,
    time_index_file,
)
from .file_records import FileRecords, OffsetPosition, TimestampAndOffset
from .log_config import LogConfig
from .offset_index import OffsetIndex
from .record_batch import RecordBatch
from .time_index import TimeIndex

logger = logging.getLogger(__name__)

INT32_MAX = 2**31 - 1


def _from_offset(offset: int, batches: Iterator[RecordBatch]) -> Iterator[RecordBatch]:
    return dropwhile(lambda batch: batch.last_offset < offset, batches)


class AppendedBatch(NamedTuple):
    """What the segment needs to know of each batch it appends."""

    last_offset: int
    max_timestamp: int
    size: int


class _SegmentFile(Protocol):
    @property
    def path(self) -> Path: ...

    def rename_to(self, path: Path) -> None: ...


class LogSegment:
    """A segment of a partition log, named by its ``base_offset``.

    Args:
        log: the ``.log`` file.
        offset_index, time_index: its indexes (rebuildable).
        base_offset: the first offset the segment may hold.
        index_interval_bytes: bytes between offset-index entries.
        rolling_jitter_ms: subtracted from ``segment.ms`` for this segment.
        created_ms: when the segment was created (for time-based roll of segments
            whose records carry no timestamp).
    """

    def __init__(
        self,
        log: FileRecords,
        offset_index: OffsetIndex,
        time_index: TimeIndex,
        base_offset: int,
        index_interval_bytes: int,
        rolling_jitter_ms: int,
        created_ms: int,
    ) -> None:
        self.log = log
        self.offset_index = offset_index
        self.time_index = time_index
        self.base_offset = base_offset
        self.index_interval_bytes = index_interval_bytes
        self.rolling_jitter_ms = rolling_jitter_ms
        self.created_ms = created_ms
        self._bytes_since_last_index_entry = 0
        # (max timestamp, shallow offset of it) over the segment; loaded lazily since
        # it costs a scan past the last time-index entry.
        self._max_timestamp_and_offset: TimestampAndOffset | None = None
        self._rolling_based_timestamp: int | None = None

    @classmethod
    def open(
        cls,
        directory: Path,
        base_offset: int,
        config: LogConfig,
        created_ms: int,
        *,
        writable: bool = True,
        file_suffix: str = "",
        rolling_jitter_ms: int = 0,
    ) -> LogSegment:
        """Open (creating if missing, when writable) the segment at ``base_offset``."""
        log = FileRecords(log_file(directory, base_offset, file_suffix), writable=writable)
        try:
            offset_index = OffsetIndex(
                offset_index_file(directory, base_offset, file_suffix),
                base_offset,
                config.segment_index_bytes,
                writable=writable,
            )
            try:
                time_index = TimeIndex(
                    time_index_file(directory, base_offset, file_suffix),
                    base_offset,
                    config.segment_index_bytes,
                    writable=writable,
                )
            except BaseException:
                offset_index.close_handler()
                raise
        except BaseException:
            log.close()
            raise
        return cls(
            log,
            offset_index,
            time_index,
            base_offset,
            config.index_interval_bytes,
            rolling_jitter_ms,
            created_ms,
        )

    # -- facts -----------------------------------------------------------------------

    @property
    def size(self) -> int:
        """Bytes of the ``.log`` file."""
        return self.log.size

    @property
    def path(self) -> Path:
        return self.log.path

    def max_timestamp_and_offset(self) -> TimestampAndOffset:
        """The largest batch timestamp in the segment and the last offset of its batch.

        Cost: the first call scans the batches after the last time-index entry.
        """
        if self._max_timestamp_and_offset is None:
            last_ts, last_offset = self.time_index.last_entry
            best = TimestampAndOffset(last_ts, last_offset)
            start = self.offset_index.lookup(last_offset)[1] if last_ts >= 0 else 0
            tail = self.log.largest_timestamp_after(start)
            if tail.timestamp > best.timestamp:
                best = tail
            self._max_timestamp_and_offset = best
        return self._max_timestamp_and_offset

    @property
    def max_timestamp(self) -> int:
        return self.max_timestamp_and_offset().timestamp

    def largest_timestamp(self) -> int:
        """What time retention measures: the max record timestamp, else the file mtime."""
        ts = self.max_timestamp
        if ts >= 0:
            return ts
        return self.last_modified_ms()

    def last_modified_ms(self) -> int:
        try:
            return os.stat(self.log.path).st_mtime_ns // 1_000_000
        except FileNotFoundError:
            return self.created_ms

    def first_batch_timestamp(self) -> int | None:
        """Max timestamp of the first batch: what ``segment.ms`` is measured from."""
        if self._rolling_based_timestamp is None:
            for batch in self.log.batches(0):
                self._rolling_based_timestamp = batch.max_timestamp
                break
        return self._rolling_based_timestamp

    # -- appending -------------------------------------------------------------------

    def can_convert_to_relative_offset(self, offset: int) -> bool:
        return 0 <= offset - self.base_offset <= INT32_MAX

    def append(self, data: bytes, batches: Sequence[AppendedBatch]) -> int:
        """Append ``data``: the batches described by ``batches``, back to back.

        Returns the position of the first batch. One ``write`` for all of them, so a
        failed append leaves nothing behind. Log bytes are written before index entries:
        an index entry must never point past the end of the log (a crash between the
        two leaves an index that merely lacks its newest entry, which lookups tolerate).

        Raises:
            OSError: the write failed; the segment is unchanged.
        """
        # Loaded before the write: a lazy load afterwards would scan the new batches
        # too and index early batches with a later batch's max timestamp.
        current = self.max_timestamp_and_offset()
        position = self.log.append(data)
        batch_position = position
        for last_offset, max_timestamp, size in batches:
            if max_timestamp > current.timestamp:
                current = TimestampAndOffset(max_timestamp, last_offset)
            if self._rolling_based_timestamp is None and batch_position == 0:
                self._rolling_based_timestamp = max_timestamp
            self._max_timestamp_and_offset = current
            self._maybe_index(last_offset, batch_position, size)
            batch_position += size
        return position

    def _maybe_index(self, last_offset: int, position: int, size: int) -> None:
        # Checked before counting this batch: the first batch of a segment is never
        # indexed, exactly as Kafka does, so index files are byte-identical to Kafka's.
        if self._bytes_since_last_index_entry > self.index_interval_bytes:
            self.offset_index.append(last_offset, position)
            max_ts = self.max_timestamp_and_offset()
            self.time_index.maybe_append(max_ts.timestamp, max_ts.offset)
            self._bytes_since_last_index_entry = 0
        self._bytes_since_last_index_entry += size

    # -- reading ---------------------------------------------------------------------

    def batches_from(self, offset: int, starting_position: int = 0) -> Iterator[RecordBatch]:
        """The batches from the one holding ``offset`` (or the first after it) on.

        Cost: O(log n) index lookup, then a scan of about ``index.interval.bytes``
        before the first batch (of the whole segment when the index entry proves wrong).
        """
        indexed_offset, position = self.offset_index.lookup(offset)
        if starting_position < position < self.size:
            # Indexes carry no checksum: the entry must name the batch found at its
            # position (same last offset), else it is ignored and the segment scanned.
            try:
                batches = self.log.batches(position)
                first = next(batches, None)
                if first is not None and first.last_offset == indexed_offset:
                    return _from_offset(offset, chain((first,), batches))
            except CorruptRecordError:
                pass
            logger.warning(
                "%s: ignoring wrong index entry (%d, %d)", self.path, indexed_offset, position
            )
        return _from_offset(offset, self.log.batches(starting_position))

    def translate_offset(self, offset: int, starting_position: int = 0) -> OffsetPosition | None:
        """Where the batch holding ``offset`` (or the first after it) starts.

        Cost: as ``batches_from``.
        """
        batch = next(self.batches_from(offset, starting_position), None)
        if batch is None:
            return None
        return OffsetPosition(batch.last_offset, batch.position, batch.size)

    def batches(self, start_position: int = 0) -> Iterator[RecordBatch]:
        return self.log.batches(start_position)

    def read_next_offset(self) -> int:
        """The offset after the last complete batch (``base_offset`` when empty).

        Cost: O(log n) for the last index entry, then a scan of the tail after it.
        """
        _last_offset, position = self.offset_index.lookup(2**63 - 1)
        if position >= self.size:
            # The entry names a batch past the valid data (a reader's view of a crashed
            # log hides an invalid tail the on-disk index still covers): scan it all.
            position = 0
        next_offset = self.base_offset
        for batch in self.log.batches(position):
            next_offset = batch.next_offset
        return next_offset

    def find_offset_by_timestamp(
        self, timestamp: int, starting_offset: int
    ) -> TimestampAndOffset | None:
        """The first record with timestamp >= ``timestamp`` and offset >= ``starting_offset``.

        Cost: O(log n) in both indexes, then a scan from the indexed position (from
        the segment start when the time-index entry proves wrong).
        """
        indexed_timestamp, offset = self.time_index.lookup(timestamp)
        if offset != self.base_offset and not self._time_entry_matches(indexed_timestamp, offset):
            logger.warning(
                "%s: ignoring wrong time index entry (%d, %d)", self.path, indexed_timestamp, offset
            )
            offset = self.base_offset
        found = self.translate_offset(max(offset, starting_offset))
        if found is None:
            return None
        return self.log.search_for_timestamp(timestamp, found.position, starting_offset)

    def _time_entry_matches(self, timestamp: int, offset: int) -> bool:
        # A time-index entry (T, O) names the first batch whose max timestamp reached T,
        # by its last offset O: every earlier record is older than T. Check that the
        # batch ending at O exists and has that max timestamp before trusting it.
        batch = next(self.batches_from(offset), None)
        return (
            batch is not None and batch.last_offset == offset and batch.max_timestamp == timestamp
        )

    # -- recovery, truncation, roll ------------------------------------------------

    def sanity_check(self) -> None:
        """Raise ``CorruptIndexError`` when an index fails Kafka's sanity check."""
        self.offset_index.sanity_check()
        self.time_index.sanity_check()

    def indexes_plausible(self) -> bool:
        """Whether the indexes agree with the log, beyond Kafka's format sanity check.

        Indexes carry no checksum; a cheap cross-check catches garbage that is still
        well-formed: the last offset entry must name the batch that starts at its
        position, and the last time entry an offset inside the segment. (An empty
        index is always plausible: how many entries a segment gets depends on where
        appends resumed after each reopen, as in Kafka.)

        Cost: one short scan from the last entry's position, one of the log tail.
        """
        index = self.offset_index
        if index.entries == 0:
            return True
        offset, position = index.entry(index.entries - 1)
        if not 0 <= position < self.size:
            return False
        try:
            found = self.log.search_for_offset(offset, position)
            if found is None or found.position != position or found.offset != offset:
                return False
            if self.time_index.entries:
                _ts, time_offset = self.time_index.last_entry
                if time_offset >= self.read_next_offset():
                    return False
        except CorruptRecordError:
            return False
        return True

    def recover(self, *, rebuild_indexes: bool = True) -> int:
        """Re-validate every batch and cut the log after the last valid one.

        Returns the number of bytes cut. A batch is invalid when its header is
        impossible (size, magic), its CRC does not match, its offsets go backwards or
        leave the segment's 32-bit relative range, or (legacy formats) it does not
        decode. A partial batch at the end is cut as well. With ``rebuild_indexes``
        both indexes are rebuilt from the log on the way; without it (a reader that
        found plausible indexes) they are kept, since an entry never points past a
        valid batch. A read-only segment's "cut" only hides the tail from its readers.
        """
        if rebuild_indexes:
            self.offset_index.reset()
            self.time_index.reset()
        self._bytes_since_last_index_entry = 0
        self._max_timestamp_and_offset = TimestampAndOffset(-1, -1)
        self._rolling_based_timestamp = None
        valid_bytes = 0
        previous_last_offset = self.base_offset - 1
        try:
            for batch in self.log.batches(0):
                if not batch.is_valid():
                    logger.warning(
                        "%s: invalid batch (CRC mismatch) at byte %d", self.path, batch.position
                    )
                    break
                last_offset = batch.last_offset
                if last_offset <= previous_last_offset or not self.can_convert_to_relative_offset(
                    last_offset
                ):
                    logger.warning(
                        "%s: batch at byte %d has out-of-order offset %d",
                        self.path,
                        batch.position,
                        last_offset,
                    )
                    break
                if batch.magic < 2:
                    # Legacy entries are whole messages; decode to prove they parse.
                    batch.records()
                previous_last_offset = last_offset
                if self._rolling_based_timestamp is None:
                    self._rolling_based_timestamp = batch.max_timestamp
                if batch.max_timestamp > self._max_timestamp_and_offset.timestamp:
                    self._max_timestamp_and_offset = TimestampAndOffset(
                        batch.max_timestamp, last_offset
                    )
                if rebuild_indexes:
                    self._maybe_index(last_offset, batch.position, batch.size)
                valid_bytes = batch.position + batch.size
        except CorruptRecordError as exc:
            logger.warning("%s: %s", self.path, exc)
        truncated = self.log.truncate_to(valid_bytes)
        if rebuild_indexes:
            self.offset_index.trim_to_valid_size()
            self.time_index.trim_to_valid_size()
        return truncated

    def truncate_to(self, offset: int) -> int:
        """Remove every batch whose offsets reach ``offset`` or beyond; return bytes removed.

        Truncation is at batch granularity: a batch holding ``offset`` goes entirely
        (as in Kafka, where truncation points are batch boundaries).
        """
        found = self.translate_offset(offset)
        if found is None:
            return 0
        cut = found.position
        self.offset_index.truncate_to(offset)
        self.time_index.truncate_to(offset)
        removed = self.log.truncate_to(cut)
        self._bytes_since_last_index_entry = 0
        self._max_timestamp_and_offset = None
        if cut == 0:
            self._rolling_based_timestamp = None
        return removed

    def should_roll(
        self,
        messages_size: int,
        max_timestamp_in_messages: int,
        max_offset_in_messages: int,
        now_ms: int,
        segment_bytes: int,
        segment_ms: int,
    ) -> bool:
        """Kafka's roll predicate, checked before an append of ``messages_size`` bytes.

        Roll when the segment would exceed ``segment.bytes``, is non-empty and older than
        ``segment.ms`` minus its jitter, has a full index, or cannot express the new
        offsets relative to its base.
        """
        reached_roll_ms = (
            self.time_waited_for_roll(now_ms, max_timestamp_in_messages)
            > segment_ms - self.rolling_jitter_ms
        )
        return (
            self.size > segment_bytes - messages_size
            or (self.size > 0 and reached_roll_ms)
            or self.offset_index.is_full
            or self.time_index.is_full
            or not self.can_convert_to_relative_offset(max_offset_in_messages)
        )

    def time_waited_for_roll(self, now_ms: int, message_timestamp: int) -> int:
        """How long this segment has been filling, Kafka-style.

        Measured on record timestamps (new message's minus the first batch's) when the
        segment's first batch has one, else on the wall clock since creation.
        """
        first = self.first_batch_timestamp()
        if first is not None and first >= 0:
            return message_timestamp - first
        return now_ms - self.created_ms

    def on_becoming_inactive(self) -> None:
        """Seal the segment on roll: final time-index entry, indexes trimmed to size."""
        max_ts = self.max_timestamp_and_offset()
        if max_ts.timestamp >= 0:
            # Kafka appends the final (maxTimestamp, offset) entry even if the index is
            # full; there is always room since ``is_full`` triggered the roll first.
            self.time_index.maybe_append(max_ts.timestamp, max_ts.offset, skip_full_check=True)
        self.offset_index.trim_to_valid_size()
        self.time_index.trim_to_valid_size()

    def flush(self) -> None:
        """fsync the log, then the indexes (log first: indexes are rebuildable)."""
        self.log.flush()
        self.offset_index.flush()
        self.time_index.flush()

    def change_file_suffixes(self, old_suffix: str, new_suffix: str) -> None:
        """Rename all three files, e.g. to ``.deleted`` before asynchronous removal.

        Open descriptors stay valid, so readers in the middle of a read finish it.
        """
        parts: tuple[_SegmentFile, ...] = (self.log, self.offset_index, self.time_index)
        for part in parts:
            renamed = part.path.with_name(part.path.name.removesuffix(old_suffix) + new_suffix)
            with contextlib.suppress(FileNotFoundError):
                part.rename_to(renamed)

    def close(self) -> None:
        """Close files; a writable segment's indexes are trimmed (Kafka trims on close)."""
        with contextlib.suppress(CorruptIndexError):
            self.offset_index.close()
            self.time_index.close()
        self.log.close()

    def close_handlers(self) -> None:
        """Release file handles without touching the files (after rename to .deleted)."""
        self.offset_index.close_handler()
        self.time_index.close_handler()
        self.log.close()

    def delete_if_exists(self) -> None:
        self.close_handlers()
        for path in (self.log.path, self.offset_index.path, self.time_index.path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def __repr__(self) -> str:
        return f"LogSegment(base_offset={self.base_offset}, size={self.size})"

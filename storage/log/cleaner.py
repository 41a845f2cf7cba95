"""One cleaning pass over one log: Kafka's ``Cleaner`` (log compaction).

A pass (``Cleaner.clean``), as Kafka's ``doClean``:

1. **Map** the dirty section ``[first dirty, first uncleanable)`` (``build_offset_map``):
   key -> latest offset, until the map is full. ``latest_offset + 1`` is where this
   pass stops; what follows waits for the next pass (a log with more keys than the map
   holds is cleaned in several).
2. **Group** the segments below that offset, clean part included
   (``group_segments_by_size``: Kafka's ``groupSegmentsBySize``, within
   ``segment.bytes``, ``segment.index.bytes`` and 2^31 offsets a group).
3. **Recopy** each group into one new segment (``Cleaner.write_group``), batch by batch
   (``filter_batch``): a record is kept when its offset is past the map, or it is the
   latest of its key and it has a value or its tombstone's delete horizon has not
   passed. A batch keeps its base offset, last offset, producer id, epoch, base
   sequence, leader epoch, codec and timestamp type; a batch whose records all stay
   and that needs no horizon is copied byte for byte. The first pass that keeps a
   tombstone writes the delete horizon (``now + delete.retention.ms``) into its batch
   as Kafka 2.8+ does (attribute bit 6, ``baseTimestamp`` = the horizon, record
   timestamps relative to it); a pass after the horizon drops the tombstone.
4. **Swap** the new segment in (``Log.replace_segments``): ``.cleaned`` -> ``.swap``
   (the commit point) -> old segments out -> final names. ``CleaningStep`` names each
   step; the loader finishes or rolls back each (``log_loader``).

Deliberate differences from Kafka, each for a reason:

- The last batch of every group is kept, empty if none of its records stay (Kafka
  keeps only the pass's last batch so). Every cleaned segment then ends exactly where
  its group ended: recovery of a ``.swap`` knows exactly which segments it replaces
  (Kafka's loader uses the swap's end and can leave a superseded segment behind), and
  the log never has a hole between segments, whatever its policy later becomes.
- Transactional and control batches, and legacy (v0/v1) message sets, are copied
  whole: this engine keeps no transaction index (it refuses transactional produce),
  so it cannot tell aborted data or expired markers (Kafka removes both), and it does
  not rebuild legacy sets. Transactional keys do not enter the map either (aborted
  data must not supersede anything); legacy keys do. Nothing is lost; these batches
  are only not compacted themselves.
- A log with an extension index (the file system's positions) has its groups
  written first and swapped in together, so that its units stay laid end to end and
  the removed ones leave from the front (``Log.replace_segments``). Kafka swaps each
  group as it is written; here the pass's whole cleaned copy is on disk for a moment.
- Producer state is not kept either, so the batch Kafka keeps empty to hold a
  producer's last sequence is not kept for that reason.

Costs: the map pass decodes every dirty record's key; the recopy decodes every record
below the pass's end and writes what stays (one ``write`` a batch into the new
segment, one ``fsync`` a group). Memory: the map (see ``offset_map``) and one batch.

Thread-safety: a ``Cleaner`` is one thread's. It reads sealed segments without the
log's lock (appends go on in the active segment meanwhile) and takes the lock only to
swap; a group whose segments changed meanwhile (retention, truncation) is abandoned
(``LogCleaningAbortedError``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING, Final

import crc32c

from ..clock import SYSTEM_CLOCK, Clock
from ..errors import CorruptRecordError, LogCleaningAbortedError, SegmentDeletedError
from ..number import INT_MAX
from ..record.batch_builder import _encode_records
from ..record.compression import compress
from ..record.record import CompressionType, Header, TimestampType
from ..record.record_batch import (
    ATTRIBUTES_OFFSET,
    BATCH_HEADER,
    COMPRESSION_CODEC_MASK,
    CONTROL_FLAG_MASK,
    CRC_OFFSET,
    DELETE_HORIZON_FLAG_MASK,
    LOG_OVERHEAD,
    MAGIC_V2,
    RECORD_BATCH_OVERHEAD,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_FLAG_MASK,
    DefaultRecordBatch,
    RecordBatch,
    read_batch,
)
from .compaction_scan import batch_keys
from .file_names import CLEANED_FILE_SUFFIX, SWAP_FILE_SUFFIX
from .offset_map import OffsetMap
from .segment import AppendedBatch, LogSegment

if TYPE_CHECKING:
    from .cleaner_manager import LogToClean
    from .log import Log

logger = logging.getLogger(__name__)

__all__ = [
    "Cleaner",
    "CleanerStats",
    "CleaningStep",
    "StepHook",
    "filter_batch",
    "group_segments_by_size",
]

_CRC: Final = struct.Struct(">I")
_KEEP_FLAGS: Final = COMPRESSION_CODEC_MASK | TIMESTAMP_TYPE_MASK | TRANSACTIONAL_FLAG_MASK


class CleaningStep(IntEnum):
    """The steps of swapping one cleaned group in, each durable before the next.

    A crash after step k leaves (the loader makes of it):

    - ``CLEANED_WRITTEN``: the new segment's ``.cleaned`` files, fsynced (removed: the
      old segments are whole, nothing was committed).
    - ``SWAP_RENAMED``: ``.log.swap`` durable, the commit point (the old segments it
      covers are deleted and the swap renamed into place).
    - ``OLD_DELETED``: the old segments renamed ``.deleted`` (removed; the swap
      completed as above).
    - ``SWAPPED_IN``: the new segment under its final names (nothing left to do).
    """

    CLEANED_WRITTEN = 1
    SWAP_RENAMED = 2
    OLD_DELETED = 3
    SWAPPED_IN = 4


@dataclass(frozen=True)
class CleanedGroup:
    """A group recopied into ``segment`` (``.cleaned``, fsynced, pinned): it replaces
    ``old``, whose ``.log`` sizes were ``sizes`` when they were read."""

    segment: LogSegment
    old: list[LogSegment]
    sizes: list[int]


StepHook = Callable[[CleaningStep, LogSegment], None]
"""Told after each ``CleaningStep`` of a group (with the new segment). Tests stop a
pass there by raising a ``BaseException`` that is not an ``Exception``: cleanup
handlers catch ``Exception`` only, so the files stay as a crash would leave them."""


@dataclass
class CleanerStats:
    """What a pass read and wrote (Kafka's ``CleanerStats``)."""

    map_records_read: int = 0
    map_bytes_read: int = 0
    records_read: int = 0
    bytes_read: int = 0
    records_written: int = 0
    bytes_written: int = 0
    batches_rebuilt: int = 0
    segments_before: int = 0
    segments_after: int = 0
    groups: int = 0
    buffer_utilization: float = 0.0


class Cleaner:
    """Cleans logs with one offset map (Kafka's ``Cleaner``).

    Args:
        offset_map: the map a pass fills (bounded: see ``OffsetMap``).
        clock: the time tombstone horizons are measured against.
        on_step: told after each swap step (see ``StepHook``).
        abort: once set, the pass stops before its next segment of the map and its
            next batch of the recopy (``LogCleaningAbortedError``; the groups not yet
            swapped are removed, as after any failure).
    """

    def __init__(
        self,
        offset_map: OffsetMap,
        *,
        clock: Clock = SYSTEM_CLOCK,
        on_step: StepHook | None = None,
        abort: threading.Event | None = None,
    ) -> None:
        self.offset_map = offset_map
        self.clock = clock
        self.on_step = on_step
        self.abort = abort

    def _check_abort(self, log: Log) -> None:
        abort = self.abort
        if abort is not None and abort.is_set():
            raise LogCleaningAbortedError(f"{log.dir.name}: cleaning aborted (shutting down)")

    def clean(self, to_clean: LogToClean) -> tuple[int, CleanerStats]:
        """One pass over ``to_clean.log``; returns the first offset not cleaned (the
        next pass's first dirty offset) and the pass's stats.

        Raises:
            LogCleaningAbortedError: the log changed under the pass (a segment of a
                group deleted or truncated, the log closed); groups already swapped
                stay swapped, the rest is as it was.
            CorruptRecordError: a batch of the log is damaged; nothing of the group
                holding it was changed.
            OSError: a file could not be written; the group's ``.cleaned`` files are
                removed, the log is as it was.
        """
        log = to_clean.log
        self._check_abort(log)
        now = self.clock.milliseconds()
        stats = CleanerStats(segments_before=log.number_of_segments)
        offset_map = self.offset_map
        try:
            build_offset_map(
                log,
                to_clean.first_dirty_offset,
                to_clean.first_uncleanable_offset,
                offset_map,
                stats,
            )
        except SegmentDeletedError as exc:
            raise LogCleaningAbortedError(
                f"{log.dir.name}: a segment was deleted while the offset map was built"
            ) from exc
        self._check_abort(log)
        end_offset = offset_map.latest_offset + 1
        segments = [s for s in log.segments.values() if s.base_offset < end_offset]
        active = log.active_segment
        segments = [s for s in segments if s is not active]
        groups = group_segments_by_size(
            segments,
            log.config.segment_bytes,
            log.config.segment_index_bytes,
            to_clean.first_uncleanable_offset,
        )
        if log.extension is None:
            # Kafka's way: each group swapped in as soon as it is written (one group's
            # copy on disk at a time).
            for group in groups:
                cleaned = self.write_group(log, group, now, stats)
                stats.groups += 1
                if cleaned is not None:
                    try:
                        log.replace_segments([cleaned], self._step)
                    finally:
                        cleaned.segment.unpin()
        else:
            self._clean_positioned(log, groups, now, stats)
        stats.buffer_utilization = offset_map.utilization
        stats.segments_after = log.number_of_segments
        return end_offset, stats

    def _clean_positioned(
        self, log: Log, groups: list[list[LogSegment]], now: int, stats: CleanerStats
    ) -> None:
        # A log with an extension index (the file system's positions) has its units
        # laid end to end from the log start: the units a pass removes must vanish
        # from the front, as retention's do, never leave a hole in the middle, or
        # every position after the hole would move. So every group is written first,
        # then all are swapped in together (``Log.replace_segments`` lays them so that
        # the last ends where the first segment it did not clean begins). The cost:
        # the pass's whole cleaned copy is on disk before the old segments go.
        written: list[CleanedGroup] = []
        try:
            for group in _fold_empty_groups(groups):
                cleaned = self.write_group(log, group, now, stats)
                stats.groups += 1
                if cleaned is not None:
                    written.append(cleaned)
            if written:
                log.replace_segments(written, self._step)
        except Exception:
            for cleaned in written:
                cleaned.segment.delete_if_exists()
            raise
        finally:
            for cleaned in written:
                cleaned.segment.unpin()

    def write_group(
        self, log: Log, group: list[LogSegment], now: int, stats: CleanerStats
    ) -> CleanedGroup | None:
        """Recopy ``group`` into one ``.cleaned`` segment, fsynced, and return it
        pinned (the caller swaps it in and unpins it); None when the group holds no
        batch (nothing to recopy: a swap must cover at least one batch).

        Raises:
            LogCleaningAbortedError, CorruptRecordError, OSError: as ``clean``; the
                ``.cleaned`` files are removed, the log is as it was.
        """
        config = log.config
        base_offset = group[0].base_offset
        if not any(segment.size for segment in group):
            return None
        _remove_stale(log, base_offset)
        cleaned = LogSegment.open(
            log.dir,
            base_offset,
            config,
            now,
            file_suffix=CLEANED_FILE_SUFFIX,
            extension_spec=log.extension,
            open_segments=group[0].open_segments,
        )
        # Pinned until swapped in: a released segment would reopen its files by a
        # name the swap is about to change.
        cleaned.pin()
        # Sealed segments only change by shrinking (truncation) or going (retention):
        # the swap checks that each is still in the map at this size.
        sizes = [segment.size for segment in group]
        try:
            try:
                # Provisional units: where the group starts now; the swap moves them.
                cleaned.start_extension(group[0].extension_start)
                self._recopy(log, group, cleaned, now, stats)
                cleaned.on_becoming_inactive()
                cleaned.flush()  # durable before it can become the commit point
                _keep_mtime(cleaned, group[-1])
            except SegmentDeletedError as exc:
                raise LogCleaningAbortedError(
                    f"{log.dir.name}: a segment was deleted while it was cleaned"
                ) from exc
            self._step(CleaningStep.CLEANED_WRITTEN, cleaned)
        except Exception:
            # Nothing was committed: the old segments serve on, the copy goes.
            cleaned.delete_if_exists()
            cleaned.unpin()
            raise
        return CleanedGroup(cleaned, group, sizes)

    def _step(self, step: CleaningStep, segment: LogSegment) -> None:
        if self.on_step is not None:
            self.on_step(step, segment)

    def _recopy(
        self, log: Log, group: list[LogSegment], cleaned: LogSegment, now: int, stats: CleanerStats
    ) -> None:
        offset_map = self.offset_map
        delete_retention_ms = log.config.delete_retention_ms
        measure = None if log.extension is None else log.extension.measure
        # The group's last batch is in its last non-empty segment (see the module doc).
        last = max(i for i, segment in enumerate(group) if segment.size > 0)
        for i, segment in enumerate(group[: last + 1]):
            batches = list(_segment_batches(segment)) if i == last else None
            scan = iter(batches) if batches is not None else _segment_batches(segment)
            final = batches[-1] if batches else None
            for batch in scan:
                self._check_abort(log)
                stats.bytes_read += batch.size
                data, read, kept = filter_batch(
                    batch, offset_map, now, delete_retention_ms, keep_empty=batch is final
                )
                stats.records_read += read
                stats.records_written += kept
                if data is None:
                    continue
                if data is not _ORIGINAL:
                    stats.batches_rebuilt += 1
                raw = batch.to_bytes() if data is _ORIGINAL else data
                stats.bytes_written += len(raw)
                appended = AppendedBatch(
                    batch.base_offset,
                    batch.last_offset,
                    _max_timestamp(raw),
                    len(raw),
                    0
                    if measure is None
                    else measure(batch if data is _ORIGINAL else read_batch(raw)),
                )
                if not cleaned.can_convert_to_relative_offset(batch.last_offset):
                    raise LogCleaningAbortedError(
                        f"{log.dir.name}: offset {batch.last_offset} does not fit the cleaned "
                        f"segment {cleaned.base_offset}"
                    )
                cleaned.append(raw, [appended])


_ORIGINAL: Final = b"\x00original"
"""``filter_batch``'s answer for "write the batch as it is" (compared by identity)."""


def _segment_batches(segment: LogSegment) -> Iterator[RecordBatch]:
    # A sealed segment's every batch, CRC checked: the cleaner must never copy damage
    # into a segment that would then look whole (Kafka's cleaner fails the partition).
    for batch in segment.batches():
        if not batch.is_valid():
            raise CorruptRecordError(
                "CRC mismatch", segment.path, batch.position, offset=batch.base_offset
            )
        yield batch


def _max_timestamp(raw: bytes) -> int:
    if raw[16] != MAGIC_V2:
        return -1  # legacy: the segment loads its own facts lazily
    return int(BATCH_HEADER.unpack_from(raw, 0)[8])


def filter_batch(
    batch: RecordBatch,
    offset_map: OffsetMap,
    now: int,
    delete_retention_ms: int,
    *,
    keep_empty: bool = False,
) -> tuple[bytes | None, int, int]:
    """What of ``batch`` a cleaning pass keeps (Kafka's ``MemoryRecords.filterTo`` with
    the cleaner's filter): ``(bytes, records read, records kept)``, the bytes being
    ``_ORIGINAL`` (the batch as it is), a rebuilt batch, or None (drop it).

    ``keep_empty``: the group's last batch, kept as an empty batch (Kafka's
    ``writeEmptyHeader``) when no record of it stays.

    Cost: a scan of the batch's keys (``compaction_scan``: values are not copied)
    and a map lookup each; a rebuild decodes the batch, then encodes (and compresses)
    the kept records.

    Raises:
        CorruptRecordError: the records do not decode.
    """
    if not isinstance(batch, DefaultRecordBatch) or batch.attributes & (
        CONTROL_FLAG_MASK | TRANSACTIONAL_FLAG_MASK
    ):
        return _ORIGINAL, 0, 0  # see the module doc: copied whole
    scanned = batch_keys(batch)
    n = len(scanned)
    horizon = batch.delete_horizon_ms
    tombstones_stay = horizon is None or now < horizon
    kept, has_tombstone = offset_map.retained(
        scanned.keys, scanned.offsets, scanned.nulls, tombstones_stay
    )
    set_horizon = has_tombstone and horizon is None
    if len(kept) == n and not set_horizon:
        return _ORIGINAL, n, n
    if not kept:
        return (_empty_batch(batch) if keep_empty else None), n, 0
    new_horizon = now + delete_retention_ms if set_horizon else horizon
    # Only now the values, timestamps and headers: the same records as the scan's.
    columns = batch.columns()
    values = columns.values if isinstance(columns.values, list) else list(columns.values)
    return _rebuild(batch, columns.timestamps, scanned.keys, values, columns.headers,
                    scanned.offsets, kept, new_horizon), n, len(kept)  # fmt: skip


def _rebuild(
    batch: DefaultRecordBatch,
    timestamps: Sequence[int],
    keys: list[bytes | None],
    values: Sequence[bytes | None],
    headers: Sequence[tuple[Header, ...]],
    offsets: list[int],
    kept: list[int],
    delete_horizon: int | None,
) -> bytes:
    # Kafka's buildRetainedRecordsInto: the batch's own header fields, its kept
    # records at their offsets; baseTimestamp is the delete horizon when there is one
    # (record timestamps are deltas from it), else the first kept record's.
    kept_ts = [timestamps[i] for i in kept]
    kept_values: list[bytes | None] = [values[i] for i in kept]
    kept_keys = [keys[i] for i in kept]
    kept_headers = [headers[i] for i in kept]
    base_timestamp = delete_horizon if delete_horizon is not None else kept_ts[0]
    ts_deltas = [t - base_timestamp for t in kept_ts]
    offset_deltas = [offsets[i] - batch.base_offset for i in kept]
    body = _encode_records(kept_values, kept_keys, kept_headers, ts_deltas, offset_deltas)
    codec = batch.codec
    if codec is not CompressionType.NONE:
        body = compress(codec, body)
    attributes = batch.attributes & _KEEP_FLAGS
    if delete_horizon is not None:
        attributes |= DELETE_HORIZON_FLAG_MASK
    if batch.timestamp_type is TimestampType.LOG_APPEND_TIME:
        max_timestamp = batch.max_timestamp
    else:
        max_timestamp = max(kept_ts)
    return _assemble(batch, attributes, base_timestamp, max_timestamp, len(kept), body)


def _empty_batch(batch: DefaultRecordBatch) -> bytes:
    # Kafka's DefaultRecordBatch.writeEmptyHeader: no codec, no records, both
    # timestamps the batch's max, the producer fields and offsets as they were.
    attributes = batch.attributes & (TIMESTAMP_TYPE_MASK | TRANSACTIONAL_FLAG_MASK)
    ts = batch.max_timestamp
    return _assemble(batch, attributes, ts, ts, 0, b"")


def _assemble(
    batch: DefaultRecordBatch,
    attributes: int,
    base_timestamp: int,
    max_timestamp: int,
    count: int,
    body: bytes,
) -> bytes:
    header = bytearray(
        BATCH_HEADER.pack(
            batch.base_offset,
            RECORD_BATCH_OVERHEAD - LOG_OVERHEAD + len(body),
            batch.partition_leader_epoch,
            MAGIC_V2,
            0,  # the CRC, patched once the bytes it covers are final
            attributes,
            batch.last_offset_delta,
            base_timestamp,
            max_timestamp,
            batch.producer_id,
            batch.producer_epoch,
            batch.base_sequence,
            count,
        )
    )
    crc = crc32c.crc32c(body, crc32c.crc32c(header[ATTRIBUTES_OFFSET:]))
    _CRC.pack_into(header, CRC_OFFSET, crc)
    return b"".join((header, body))


def build_offset_map(
    log: Log, start: int, end: int, offset_map: OffsetMap, stats: CleanerStats
) -> None:
    """Fill ``offset_map`` with the keys of ``[start, end)`` (Kafka's
    ``buildOffsetMap``), stopping when it is full; ``latest_offset`` is then the last
    offset mapped (the pass cleans up to it), else ``end - 1``.

    Cost: a scan of every record's key in the range (``compaction_scan``).

    Raises:
        CorruptRecordError: a batch in the range is damaged.
    """
    offset_map.clear()
    segments = [s for s in log.segments.values(start) if s.base_offset < end]
    for i, segment in enumerate(segments):
        following = segments[i + 1].base_offset if i + 1 < len(segments) else end
        if _map_segment(segment, offset_map, start, stats):
            return
        # A gap at the segment's end (an earlier pass's): the map covers it too.
        offset_map.update_latest_offset(following - 1)


def _map_segment(
    segment: LogSegment, offset_map: OffsetMap, start: int, stats: CleanerStats
) -> bool:
    # True when the map filled up inside this segment.
    for batch in segment.batches_from(start):
        if not batch.is_valid():
            raise CorruptRecordError(
                "CRC mismatch", segment.path, batch.position, offset=batch.base_offset
            )
        stats.map_bytes_read += batch.size
        if batch.last_offset < start:
            continue
        if isinstance(batch, DefaultRecordBatch) and batch.attributes & (
            CONTROL_FLAG_MASK | TRANSACTIONAL_FLAG_MASK
        ):
            # Markers, and transactional data that may have been aborted (no
            # transaction index here to tell): they supersede nothing.
            stats.map_records_read += batch.records_count
        else:
            scanned = batch_keys(batch)
            taken = offset_map.put_all(scanned.keys, scanned.offsets, start)
            stats.map_records_read += taken
            if taken < len(scanned):
                return True
        offset_map.update_latest_offset(batch.last_offset)
    return False


def group_segments_by_size(
    segments: list[LogSegment],
    max_size: int,
    max_index_size: int,
    first_uncleanable_offset: int,
) -> list[list[LogSegment]]:
    """Consecutive groups of ``segments`` whose ``.log`` bytes total at most
    ``max_size`` and whose offset and time index bytes each total at most
    ``max_index_size``, and whose offsets fit 32 bits relative to the group's base
    (Kafka's ``groupSegmentsBySize``). A segment alone over a limit is a group of one.

    Cost: O(segments); index sizes are file sizes (no read).
    """
    grouped: list[list[LogSegment]] = []
    i = 0
    n = len(segments)
    while i < n:
        group = [segments[i]]
        log_size = segments[i].size
        index_size = _index_bytes(segments[i], 0)
        time_index_size = _index_bytes(segments[i], 1)
        i += 1
        while i < n:
            candidate = segments[i]
            # The candidate's last offset, bounded without a scan (Kafka's
            # lastOffsetForFirstSegment): the next segment's base - 1, or the first
            # uncleanable offset - 1 for the last.
            last = segments[i + 1].base_offset - 1 if i + 1 < n else first_uncleanable_offset - 1
            if (
                log_size + candidate.size > max_size
                or index_size + _index_bytes(candidate, 0) > max_index_size
                or time_index_size + _index_bytes(candidate, 1) > max_index_size
                or (candidate.size != 0 and last - group[0].base_offset > INT_MAX)
            ):
                break
            group.append(candidate)
            log_size += candidate.size
            index_size += _index_bytes(candidate, 0)
            time_index_size += _index_bytes(candidate, 1)
            i += 1
        grouped.append(group)
    return grouped


def _fold_empty_groups(groups: list[list[LogSegment]]) -> list[list[LogSegment]]:
    """``groups`` with each group of empty segments only joined to the next group (the
    last to the one before): a log laid out in extension units cannot leave a segment
    in place between swapped ones (its units would be out of step), and a swap needs a
    batch. Grouping puts empty segments with their neighbours anyway (they add no
    bytes); an empty group only comes of the 2^31 relative-offset bound or of a range
    of empty segments, and a folded group breaking that bound aborts the pass
    (``can_convert_to_relative_offset``). Cost: O(segments)."""
    folded: list[list[LogSegment]] = []
    carried: list[LogSegment] = []
    for group in groups:
        if not any(segment.size for segment in group):
            carried.extend(group)
            continue
        folded.append(carried + group)
        carried = []
    if carried:
        if folded:
            folded[-1].extend(carried)
        else:
            folded.append(carried)
    return folded


def _index_bytes(segment: LogSegment, which: int) -> int:
    # Kafka's offsetIndex().sizeInBytes(): entries * entry size (a sealed index is
    # trimmed to its entries, so this is its file size).
    index = segment.offset_index if which == 0 else segment.time_index
    return index.size_in_bytes


def _remove_stale(log: Log, base_offset: int) -> None:
    # ``.cleaned`` files of an attempt that failed in this process (the loader removes
    # a crash's): the new segment must start empty.
    prefix = f"{base_offset:020d}."
    for name in os.listdir(log.dir):
        if name.startswith(prefix) and name.endswith((CLEANED_FILE_SUFFIX, SWAP_FILE_SUFFIX)):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(log.dir / name)


def _keep_mtime(cleaned: LogSegment, last_old: LogSegment) -> None:
    # Kafka keeps the replaced segments' last modification time: retention of
    # segments without timestamps measures it.
    with contextlib.suppress(OSError):
        mtime = os.stat(last_old.path).st_mtime_ns
        os.utime(cleaned.path, ns=(mtime, mtime))

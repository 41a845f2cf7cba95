"""Opening a partition log from its directory, with crash recovery (Kafka's ``LogLoader``).

Writable open, in order:

1. Remove ``.deleted`` and ``.cleaned`` files (retention and the cleaner only create
   them once the data is unreachable or not yet committed) and index ``.swap`` files;
   complete each ``.log.swap`` (a cleaned segment whose rename to ``.swap`` was the
   cleaner's commit point): drop the segments it replaces, rename it into place.
2. Open every segment, once, oldest first (``_Pass``). A segment whose data is final
   (sealed, or below the recovery point) is trusted as Kafka trusts it: its indexes
   are not checked; missing ones are rebuilt from the log without cutting it
   (``LogSegment.rebuild_indexes``: a damaged batch stays, and reads raise there).
   The active segment after a clean shutdown gets the sanity and plausibility checks
   (indexes rebuilt the same way when they fail), and when its batches stop framing
   before its end it is recovered like an unflushed tail. Segments recovery will
   re-validate get no checks (recovery rebuilds their indexes). Each segment's end
   offset is measured, and its extension units settled, in the same pass.
3. After an unclean shutdown, re-validate every segment from the one holding the
   recovery point, batch by batch; cut at the first partial or invalid batch and
   delete all later segments (their data cannot be trusted to follow on). Only this,
   and the damaged active segment of step 2, ever cut data, and each cut is logged
   at WARNING with its bytes and offsets.
4. Mark holes of offsets between segments (``_mark_holes``): a missing segment file.
5. Make room in the active segment's indexes; derive the log end offset.

A read-only open changes no file: stale temporaries are ignored, a committed cleaning
swap is read in place of the segments it covers (``_swapped_view``), indexes that need
a rebuild are rebuilt in a private scratch directory (after an unclean shutdown, the
extension index of every segment recovery re-validates), and an invalid tail is hidden
from readers instead of cut; the hidden tail stays hidden on ``refresh_segments`` until
a writer has recovered the log (``HiddenTail``).

Cost (a log of n segments): each segment's files are opened once, in one pass (Kafka
maps an index on first use; here the process's ``OpenSegments`` bound releases them
again as the pass goes on), and each is read only at its tail (the batches after its
last offset-index and extension-index entries); segments recovery re-validates are read
whole.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path

from ..atomic_file import fsync_directory
from ..clock import Clock
from ..errors import CorruptCheckpointError, CorruptIndexError, CorruptRecordError, StorageError
from ..record.file_records import FileRecords
from ..record.record_batch import (
    HEADER_SIZE_UP_TO_MAGIC,
    MAGIC_V2,
    RECORD_BATCH_OVERHEAD,
    RecordBatch,
    batch_size_at,
    read_batch,
)
from .checkpoint import read_extension_start_checkpoint
from .extension_index import ExtensionIndex, ExtensionIndexSpec
from .file_names import (
    CLEANED_FILE_SUFFIX,
    DELETED_FILE_SUFFIX,
    INDEX_FILE_SUFFIX,
    LOG_FILE_SUFFIX,
    SWAP_FILE_SUFFIX,
    TIME_INDEX_FILE_SUFFIX,
    extension_index_file,
    filename_prefix_from_offset,
    log_file,
    offset_from_file_name,
    offset_index_file,
    time_index_file,
)
from .log_config import LogConfig
from .log_segments import HiddenTail, LogSegments
from .offset_index import OffsetIndex
from .segment import LogSegment, Revalidation
from .time_index import TimeIndex

logger = logging.getLogger(__name__)

_LOG_SWAP = LOG_FILE_SUFFIX + SWAP_FILE_SUFFIX

BROKER_PARTITION_FILES = ("leader-epoch-checkpoint", "partition.metadata")
"""Files a Kafka broker writes into every partition directory (the leader-epoch cache
since 0.11, the topic id since 2.8) and seglogfs never does: a directory holding one
is a broker's, whose topic configuration (its ``cleanup.policy``) stayed in the
broker's metadata."""


def holes_are_damage(file_names: Collection[str], compact: bool) -> bool:
    """Whether a hole of offsets between two segments of a partition directory holding
    ``file_names`` can only be a missing segment file.

    Under ``cleanup.policy=delete`` a partition's segments are contiguous: a roll
    starts the new segment at the log end offset (a batch appended past it, as
    replication copies a compacted log, lands inside the new segment), retention
    deletes whole segments from the front, DeleteRecords moves the log start (the
    segments below it then go from the front), truncation and recovery remove a
    suffix. Only compaction leaves holes at a segment's end (Kafka's cleaner drops the
    batches whose keys come again later), so holes are legal when the policy includes
    ``compact``, and in a broker's directory (``BROKER_PARTITION_FILES``), whose topic
    may be compacted without seglogfs knowing.
    """
    return not compact and not any(name in file_names for name in BROKER_PARTITION_FILES)


@dataclass
class LoadedLog:
    """What ``load_log`` found: the state a ``Log`` is built from."""

    segments: LogSegments
    log_start_offset: int
    recovery_point: int
    next_offset: int
    scratch_dirs: list[Path] = field(default_factory=list)


def load_log(
    directory: Path,
    config: LogConfig,
    *,
    log_start_offset: int,
    recovery_point: int,
    had_clean_shutdown: bool,
    clock: Clock,
    writable: bool,
    extension: ExtensionIndexSpec | None = None,
) -> LoadedLog:
    """Load the log in ``directory`` (see the module doc for the steps).

    Offsets are never handed out twice: when what survives recovery ends below the
    checkpointed ``log_start_offset`` (the tail that a ``DeleteRecords`` or retention
    had moved past was lost), every segment is deleted and the log restarts at the log
    start offset, as Kafka's loader does.

    A load that fails releases what it opened (descriptors, mappings, scratch space):
    on a full disk the files of a directory being removed (a failed ``create_topic``
    undone) only give their blocks back once nothing holds them.

    Raises:
        StorageError: a read-only open of a directory that does not exist.
        OSError: the directory cannot be read or written.
    """
    opened: list[LogSegment] = []
    scratch: list[Path] = []
    try:
        return _load_log(
            directory,
            config,
            log_start_offset=log_start_offset,
            recovery_point=recovery_point,
            had_clean_shutdown=had_clean_shutdown,
            clock=clock,
            writable=writable,
            extension=extension,
            opened=opened,
            scratch=scratch,
        )
    except BaseException:
        for segment in opened:
            try:
                segment.close_handlers()
            except OSError as exc:  # the descriptor is gone anyway
                logger.warning("%s: closing it after a failed load: %s", segment.path, exc)
        for path in scratch:
            shutil.rmtree(path, ignore_errors=True)
        raise


def _load_log(
    directory: Path,
    config: LogConfig,
    *,
    log_start_offset: int,
    recovery_point: int,
    had_clean_shutdown: bool,
    clock: Clock,
    writable: bool,
    extension: ExtensionIndexSpec | None,
    opened: list[LogSegment],
    scratch: list[Path],
) -> LoadedLog:
    # ``load_log``; every segment it opens goes into ``opened`` (to be closed if it
    # fails), every scratch directory into ``scratch``.
    if writable:
        directory.mkdir(parents=True, exist_ok=True)
        _remove_temporary_files(directory)
        _complete_swaps(directory, extension)
        _remove_orphan_indexes(directory, extension)
    elif not directory.is_dir():
        raise StorageError(f"log directory {directory} does not exist")
    names = set(os.listdir(directory))
    suffixes: dict[int, str] = {}
    if not writable:
        names, suffixes = _swapped_view(directory, names, extension)
    load = _Pass(
        directory,
        config,
        names,
        clock.milliseconds(),
        writable,
        scratch,
        extension,
        recovery_point=None if had_clean_shutdown else recovery_point,
        clean_end=recovery_point if had_clean_shutdown and recovery_point > 0 else None,
        opened=opened,
        suffixes=suffixes,
    )
    segments = load.run()
    if not had_clean_shutdown:
        _recover_from(segments, recovery_point, writable, load)
    load.settle_remaining_extensions(segments)
    _mark_holes(segments, load.ends, holes_are_damage(names, config.compact))

    last = segments.last_segment
    if writable and last is not None and last.read_next_offset() < log_start_offset:
        logger.warning(
            "%s: the log ends at offset %d, below its log start offset %d: deleting its "
            "segments and restarting it at the log start offset",
            directory.name,
            last.read_next_offset(),
            log_start_offset,
        )
        for segment in segments.remove_all(segments.base_offsets()):
            segment.delete_if_exists()

    now = clock.milliseconds()
    if len(segments) == 0:
        start = max(log_start_offset, 0)
        if writable:
            empty = LogSegment.open(directory, start, config, now, extension_spec=extension)
        else:
            empty = _empty_scratch_segment(start, config, now, scratch, extension)
        opened.append(empty)
        segments.add(empty)
        if extension is not None:
            _load_extensions(segments.values(), config, writable, scratch, None, set())
    active = segments.last_segment
    assert active is not None
    if writable:
        for index in active.indexes():
            index.resize(config.segment_index_bytes)
    next_offset = active.read_next_offset()
    first = segments.first_segment
    assert first is not None
    log_start_offset = min(max(log_start_offset, first.base_offset), next_offset)
    if had_clean_shutdown:
        recovery_point = min(recovery_point, next_offset)
    else:
        # Everything left was re-validated (or lies below the old recovery point).
        if writable:
            for segment in segments.values(recovery_point):
                segment.flush()
        recovery_point = next_offset
    return LoadedLog(segments, log_start_offset, recovery_point, next_offset, scratch)


class _Pass:
    """Step 2 of the module doc: open every segment once, oldest first.

    For each segment: open it; unless recovery will re-validate it, rebuild missing
    indexes (without a cut) and, for the active segment after a clean shutdown, check
    its indexes and recover it when its batches stop framing before its end; measure
    its end offset (``ends``); settle its extension units against the previous
    segment's end. The oldest segment's extension start may need later segments
    (``_oldest_extension_start``): then every extension is settled after the pass.
    """

    def __init__(
        self,
        directory: Path,
        config: LogConfig,
        names: set[str],
        now: int,
        writable: bool,
        scratch: list[Path],
        extension: ExtensionIndexSpec | None,
        *,
        recovery_point: int | None,
        clean_end: int | None,
        opened: list[LogSegment],
        suffixes: dict[int, str] | None = None,
    ) -> None:
        self.directory = directory
        self.suffixes = suffixes or {}
        """A read-only open's segments read from a committed ``.swap`` (``_swapped_view``)."""
        self.opened = opened
        """Every segment the pass opens (the caller's: closed if the load fails)."""
        self.config = config
        self.names = names
        self.now = now
        self.writable = writable
        self.scratch = scratch
        self.extension = extension
        self.recovery_point = recovery_point
        """None after a clean shutdown: no segment is recovered."""
        self.clean_end = clean_end
        """After a clean shutdown, the checkpointed recovery point: the log end then (a
        clean shutdown flushes every log before it checkpoints). None when unknown."""
        self.gaps_suspect = holes_are_damage(names, config.compact)
        """Whether a gap of offsets before the log's last batch is suspect enough for
        recovery to cut it (``LogSegment.recover_tail``'s ``confirm_last_gap``): not in a
        compacted log, nor in a broker's directory, where followers copy gaps."""
        self.ends: dict[int, int] = {}
        """The offset after the last batch of each segment whose batches frame to its
        end (by base offset); a segment whose framing breaks has none."""
        self.extension_missing: set[int] = set()
        """Segments whose extension index file did not exist (its start is unknown: an
        index created empty now would read as "starts at 0")."""
        self.extension_checkpoint: tuple[int, int] | None = None
        self.settled: set[int] = set()
        """Segments whose extension units are settled."""
        self.extension_rebuilds: set[int] = set()
        """A reader's re-validated segments: their extension index is rebuilt (in scratch
        space) whatever it holds (``_recover_from``)."""
        self.hidden_tail: HiddenTail | None = None
        """A reader's: the active segment's tail it hides (see ``_check``)."""

    def run(self) -> LogSegments:
        bases = _segment_base_offsets(self.names)
        extension = self.extension
        if extension is not None:
            self.extension_missing = {
                base
                for base in bases
                if filename_prefix_from_offset(base) + extension.suffix not in self.names
            }
            self.extension_checkpoint = _extension_start_checkpoint(
                self.directory / extension.start_checkpoint_name
            )
        checkpoint = self.extension_checkpoint
        in_pass = extension is not None and (
            not bases
            or (checkpoint is not None and checkpoint[0] == bases[0])
            or (
                bases[0] not in self.extension_missing
                and not (checkpoint is not None and checkpoint[0] in bases[1:])
            )
        )
        opened: list[LogSegment] = []
        previous: LogSegment | None = None
        for i, base in enumerate(bases):
            following = bases[i + 1] if i + 1 < len(bases) else None
            segment = LogSegment.open(
                self.directory,
                base,
                self.config,
                self.now,
                writable=self.writable,
                file_suffix=self.suffixes.get(base, ""),
                extension_spec=extension,
            )
            opened.append(segment)
            self.opened.append(segment)
            if self._recovered(following):
                in_pass = False  # settled after recovery, from here on
                continue
            self._check(segment, following)
            if in_pass:
                self._settle_extension(segment, previous)
            previous = segment
        segments = LogSegments()
        segments.add_all(opened)
        segments.hidden_tail = self.hidden_tail
        return segments

    def _recovered(self, following: int | None) -> bool:
        # Kafka's recoverLog: the segments from the one holding the recovery point on.
        point = self.recovery_point
        return point is not None and (following is None or following > point)

    def _check(self, segment: LogSegment, following: int | None) -> None:
        active = following is None
        prefix = filename_prefix_from_offset(segment.base_offset)
        missing = [
            name
            for name in (prefix + INDEX_FILE_SUFFIX, prefix + TIME_INDEX_FILE_SUFFIX)
            if name not in self.names
        ]
        problem = f"missing {' and '.join(missing)}" if missing and segment.size > 0 else None
        if problem is None and active:
            try:
                segment.sanity_check()
                if not segment.indexes_plausible():
                    raise CorruptIndexError(segment.offset_index.path, "disagrees with the log")
            except CorruptIndexError as exc:
                problem = str(exc)
        if problem is not None:
            self._rebuild_indexes(segment, problem, following)
        if following is not None and _ends_before(segment, following):
            # Contiguous with the next segment (as the engine always leaves it): no
            # scan needed to know where it ends.
            self.ends[segment.base_offset] = following
            return
        end, framed_to = _framed_end(segment)
        clean_end = self.clean_end
        if active and (framed_to < segment.size or (clean_end is not None and end > clean_end)):
            # A clean shutdown does not make the active segment's tail trustworthy:
            # past bytes that do not frame, appends would hand out offsets again. Nor
            # past the log end the shutdown checkpointed: there a last batch after a
            # gap (``gap_disproved``: no batch after it can disprove a base offset
            # damaged upwards) is damage; contiguous batches (a checkpoint older than
            # the marker says) are kept.
            if not self.writable:
                _use_scratch_indexes(segment, self.config, self.scratch)
            found = segment.recover_tail(rebuild_indexes=True, end_offset=clean_end)
            _log_cut(segment, found, self.writable, hidden=0)
            if not self.writable:
                self.hidden_tail = HiddenTail(
                    segment.base_offset,
                    found.valid_bytes,
                    frozenset(),
                    _bytes_at(segment.path, found.valid_bytes),
                )
            end, framed_to = found.next_offset, found.valid_bytes
        if framed_to == segment.size:
            self.ends[segment.base_offset] = end

    def _rebuild_indexes(self, segment: LogSegment, problem: str, following: int | None) -> None:
        if not self.writable:
            _use_scratch_indexes(segment, self.config, self.scratch)
        found = segment.rebuild_indexes(end_offset=following)
        damage = found.damage
        if damage is None:
            logger.warning("%s: %s; indexes rebuilt", segment.path, problem)
            return
        logger.warning(
            "%s: %s; indexes rebuilt without cutting the log: %s at byte %d (offset %d); "
            "the %d bytes from there (offsets up to %d as far as batch headers frame) stay "
            "as they are: reads that reach them raise CorruptRecordError (seglogfs "
            "delete-records moves the log start past them)",
            segment.path,
            problem,
            damage.reason,
            damage.position,
            damage.offset,
            found.size - damage.position,
            found.last_framed_offset,
        )

    def _settle_extension(self, segment: LogSegment, previous: LogSegment | None) -> None:
        if previous is None:
            expected = _oldest_extension_start(
                [segment], self.extension_missing, self.extension_checkpoint
            )
        else:
            expected = previous.extension_end
            previous_end = self.ends.get(previous.base_offset)
            if previous_end is not None and previous_end < segment.base_offset:
                expected = self._start_after_hole(segment, expected)
            else:
                expected = _expected_after(previous, segment)
        _settle_extension(segment, expected, self.config, self.writable, self.scratch)
        self.settled.add(segment.base_offset)

    def _start_after_hole(self, segment: LogSegment, previous_end: int) -> int | None:
        # Offsets are missing before this segment (``_mark_holes`` decides whether that
        # is damage): its own entry 0 keeps its positions where they were when it was
        # created, so the records after the hole keep theirs. Without a usable one,
        # the positions go on from the previous segment's end.
        extension = segment.extension
        if segment.base_offset in self.extension_missing or extension is None:
            return previous_end
        return None if extension.first_units >= previous_end else previous_end

    def settle_remaining_extensions(self, segments: LogSegments) -> None:
        """Settle the extension units of the segments the pass left (recovered ones, or
        all of them when the oldest start needed later segments)."""
        if self.extension is None:
            return
        values = segments.values()
        todo = [k for k, segment in enumerate(values) if segment.base_offset not in self.settled]
        if not todo:
            return
        first = todo[0]
        if first == 0:
            expected = _oldest_extension_start(
                values, self.extension_missing, self.extension_checkpoint
            )
        else:
            expected = self._expected_after(values[first - 1], values[first])
        _load_extensions(
            values[first:],
            self.config,
            self.writable,
            self.scratch,
            expected,
            self.settled,
            self.extension_rebuilds,
            expected_after=self._expected_after,
        )

    def _expected_after(self, previous: LogSegment, segment: LogSegment) -> int | None:
        # ``_expected_after``, but after a hole of offsets (a missing segment) as the
        # pass settles it (``_start_after_hole``): the segments recovery re-validated
        # went on from the previous segment's end, and every position after a missing
        # segment moved back by its bytes (a crashed log's reader, through the mount).
        previous_end = self.ends.get(previous.base_offset)
        if previous_end is not None and previous_end < segment.base_offset:
            return self._start_after_hole(segment, previous.extension_end)
        return _expected_after(previous, segment)


def _ends_before(segment: LogSegment, following: int) -> bool:
    """Whether the segment's last batch ends right before the next segment (no hole),
    proven without a scan: its last offset-index entry names offset ``following - 1``,
    and the batch there ends at that offset and at the end of the file. (An index entry
    alone is no proof: a sealed segment cut at a batch boundary kept index entries, the
    time index's final one among them, naming the batches it lost, and the read went on
    at the next segment without them, in silence.) Otherwise the caller scans the tail.
    Cost: the last index entry, in memory, and one batch read."""
    last = following - 1
    offset_index = segment.offset_index
    if offset_index.entries == 0 or offset_index.last_offset != last:
        return False
    _offset, position = offset_index.lookup(last)
    if not 0 <= position < segment.size:
        return False
    try:
        batch = next(segment.batches(position), None)
    except CorruptRecordError:
        return False
    return (
        batch is not None
        and batch.last_offset == last
        and batch.position + batch.size == segment.size
    )


def _framed_end(segment: LogSegment) -> tuple[int, int]:
    """(offset after the last batch, byte where framing stops) of a segment, scanning
    batch headers (no CRC) from its last offset-index entry, checked against the batch
    it names (a wrong one is ignored and the segment scanned whole): ``read_next_offset``
    that a damaged index cannot misdirect, and that says whether the batches frame to
    the end. Framing also stops at a batch whose offsets cannot be where it lies
    (``_offsets_impossible``): its end offset would be garbage (a flipped last offset
    delta, inside the CRC but not checked here, made the log end -2147483251 and every
    offset out of range; a base offset flipped downwards, outside the CRC, would hand
    out offsets again). Cost: a scan of the batches after the last index entry."""
    entry_offset, position = segment.offset_index.lookup(2**63 - 1)
    if not 0 < position < segment.size:
        # No entry, or one past the end of the file (a segment cut short keeps index
        # entries naming the batches it lost: an offset lookup scanned the whole
        # segment for them, found none, and the segment seemed to frame nothing, so a
        # hole after it went unmarked and reads passed over it in silence).
        position = 0
    else:
        try:
            named = next(segment.batches(position), None)
        except CorruptRecordError:
            named = None
        if named is None or named.last_offset != entry_offset:
            position = 0  # a wrong entry: scan it all
    end, framed_to = segment.base_offset, 0
    try:
        for batch in segment.batches(position):
            if _offsets_impossible(batch, end):
                break
            end, framed_to = batch.next_offset, batch.position + batch.size
    except CorruptRecordError:
        pass  # an impossible header: framing stops at the batch before it
    return end, framed_to


def _offsets_impossible(batch: RecordBatch, after: int) -> bool:
    """Whether ``batch``'s header offsets cannot follow offset ``after - 1`` (the batch
    before it ends there; the segment's base offset for its first batch): they go
    back, or (v2) its last offset lies before its base offset. Legacy entries are
    judged by their last offset (a compressed wrapper's first costs a decompression).
    A gap (compaction's) is not impossible. Cost: a few header fields."""
    if batch.last_offset < after:
        return True
    return batch.magic >= MAGIC_V2 and not after <= batch.base_offset <= batch.last_offset


def _settle_extension(
    segment: LogSegment,
    expected: int | None,
    config: LogConfig,
    writable: bool,
    scratch: list[Path],
    *,
    rebuild: bool = False,
) -> None:
    # A segment's extension index must start where ``expected`` says (None: trust its
    # own entry 0); one that is missing, corrupt or out of step is rebuilt from its log
    # (in scratch space for a reader), as is one the caller says to (``rebuild``).
    extension = segment.extension
    if extension is None:
        return
    if not rebuild and segment.load_extension(expected):
        segment.write_extension_entry0()
        return
    if not rebuild:
        logger.warning(
            "%s: rebuilding extension index %s", segment.path.parent.name, extension.path
        )
    start = expected if expected is not None else max(extension.first_units, 0)
    if not writable:
        _use_scratch_extension(segment, config, scratch)
    segment.rebuild_extension(start)


def _log_cut(segment: LogSegment, found: Revalidation, writable: bool, hidden: int) -> None:
    # What recovery cut (or, for a reader, hides): bytes, where, and the offsets.
    cut = found.size - found.valid_bytes
    if cut <= 0:
        return
    damage = found.damage
    reason = damage.reason if damage is not None else "invalid tail"
    beyond = (
        f"offsets {found.next_offset}..{found.last_framed_offset} as far as batch headers frame"
        if found.last_framed_offset >= found.next_offset
        else f"no whole batch (offsets from {found.next_offset} on)"
    )
    later = f"; the {hidden} later segment(s) go with it" if hidden else ""
    if writable:
        logger.warning(
            "%s: recovery cut %d bytes at byte %d (%s): %s; the log ends at offset %d%s",
            segment.path,
            cut,
            found.valid_bytes,
            reason,
            beyond,
            found.next_offset,
            later,
        )
    elif hidden or (damage is not None and damage.position < found.framed_to):
        # A reader changes no file: it reads up to the last valid batch, as the writer's
        # recovery will cut there.
        logger.warning(
            "%s: reading up to byte %d, the last valid batch (%s at byte %d: %s)%s",
            segment.path,
            found.valid_bytes,
            reason,
            found.valid_bytes,
            beyond,
            later,
        )
    else:
        # Only a batch cut off at the end: usually a live writer's append caught
        # half-written (the next refresh sees it whole).
        logger.debug(
            "%s: reading up to its last valid batch (%d bytes after it)", segment.path, cut
        )


def _mark_holes(segments: LogSegments, ends: dict[int, int], damage: bool) -> None:
    """Tell each segment followed by a hole of offsets no segment file holds
    (``LogSegment.missing_after``), when ``damage`` (``holes_are_damage``): reads that
    reach the hole raise ``CorruptRecordError`` naming it, as for a damaged batch."""
    values = segments.values()
    for segment, following in itertools.pairwise(values):
        end = ends.get(segment.base_offset)
        if end is None or end >= following.base_offset:
            continue
        missing = f"offsets {end}..{following.base_offset - 1}"
        if not damage:
            logger.info(
                "%s: %s are in no segment file (compaction's gap, or a missing segment)",
                segment.path.parent.name,
                missing,
            )
            continue
        segment.missing_after = following.base_offset
        logger.warning(
            "%s: %s are in no segment file: a segment between %s and %s is missing; reads "
            "that reach them raise CorruptRecordError (seglogfs delete-records moves the "
            "log start past them)",
            segment.path.parent.name,
            missing,
            segment.path.name,
            following.path.name,
        )


def _extension_start_checkpoint(path: Path) -> tuple[int, int] | None:
    # A hint like the indexes: a corrupt one is ignored (the log still opens), and the
    # next retention or close replaces it.
    try:
        return read_extension_start_checkpoint(path)
    except CorruptCheckpointError as exc:
        logger.warning("%s: ignoring %s", path.parent.name, exc)
        return None


def _load_extensions(
    segments: list[LogSegment],
    config: LogConfig,
    writable: bool,
    scratch: list[Path],
    expected: int | None,
    settled: set[int],
    rebuild: Collection[int] = (),
    *,
    expected_after: Callable[[LogSegment, LogSegment], int | None] | None = None,
) -> None:
    # Each segment's extension index must start where the previous one ends
    # (``expected`` for the first: None to trust its own entry 0; ``expected_after``
    # for the others, default ``_expected_after``); those of ``rebuild`` are rebuilt
    # whatever they hold.
    after = _expected_after if expected_after is None else expected_after
    previous: LogSegment | None = None
    for segment in segments:
        if segment.extension is None:
            return
        if previous is not None:
            expected = after(previous, segment)
        _settle_extension(
            segment, expected, config, writable, scratch, rebuild=segment.base_offset in rebuild
        )
        settled.add(segment.base_offset)
        previous = segment


def _expected_after(previous: LogSegment, segment: LogSegment) -> int | None:
    """Where ``segment``'s extension units must start: where ``previous``'s end. When a
    damaged batch of ``previous`` could not be measured (``extension_exact``: its end
    is a lower bound), where the segment's own entry 0 says when it has one at or above
    that end (None: trust it; it was written when the segment was created, so the
    records after the damage keep their positions), as after a hole."""
    end = previous.extension_end
    extension = segment.extension
    if previous.extension_exact or extension is None:
        return end
    return None if extension.first_units >= end else end


def _oldest_extension_start(
    segments: list[LogSegment], missing: set[int], checkpoint: tuple[int, int] | None
) -> int | None:
    """The units at the start of the oldest segment, or None to trust its own index.

    The units before the oldest retained segment went with the segments retention
    deleted, so its log alone cannot say where it starts. In order of trust: the
    extension-start checkpoint when it names this segment (written by retention before
    the segments go, and on close); when it names a later segment, that segment's
    units minus what the segments before it measure (retention and a cleaning pass
    write it so before they change those segments: a crash then leaves some of them
    old, some gone or swapped in, and only the later segment's units are known to
    stay); the segment's own index when its file existed; else the first later segment
    whose index file existed with an entry 0, minus the units the segments before it
    measure (Kafka keeps its log start offset the same way: durable state, not a scan).
    None when nothing is left (a log that never lost a segment starts at 0, which is
    what its index says).

    Cost: ``measure`` of every batch of the segments before that later one (only when
    the oldest segment's index file was missing, or the checkpoint names a later
    segment: after a crash in retention or a cleaning pass).
    """
    if not segments:
        return None
    if checkpoint is not None:
        for k, segment in enumerate(segments):
            if segment.base_offset == checkpoint[0]:
                return checkpoint[1] if k == 0 else _start_before(segments, k, checkpoint[1])
    if segments[0].base_offset not in missing:
        return None
    for k, segment in enumerate(segments[1:], start=1):
        if segment.extension is not None and segment.base_offset not in missing:
            anchor = segment.extension.first_units
            if anchor < 0:
                continue  # no entry 0 (it reads as none when it is (base, 0))
        else:
            continue
        return _start_before(segments, k, anchor)
    return None


def _start_before(segments: list[LogSegment], k: int, anchor: int) -> int | None:
    """Where the oldest segment starts when ``segments[k]`` starts at ``anchor`` units:
    ``anchor`` minus what the segments before it measure (None: they measure more;
    rebuilt from 0)."""
    segment = segments[k]
    spec = segment.extension_spec
    assert spec is not None
    before = _measure_all(spec, segments[:k])
    if before > anchor:
        logger.warning(
            "%s: the extension index of segment %d starts at %d, below the %d units "
            "of the segments before it; rebuilding from 0",
            segment.path.parent.name,
            segment.base_offset,
            anchor,
            before,
        )
        return None
    return anchor - before


def _measure_all(spec: ExtensionIndexSpec, segments: list[LogSegment]) -> int:
    """What the batches of ``segments`` measure in ``spec``'s units. A damaged batch
    measures nothing, and damaged framing ends a segment's measure (reads stop there;
    the open of the log must not fail on it). Cost: ``measure`` of every batch."""
    total = 0
    for segment in segments:
        with contextlib.suppress(CorruptRecordError):
            for batch in segment.batches():
                with contextlib.suppress(CorruptRecordError):
                    total += spec.measure(batch)
    return total


def _segment_base_offsets(names: Collection[str]) -> list[int]:
    offsets = []
    for name in names:
        if name.endswith(LOG_FILE_SUFFIX):
            offset = offset_from_file_name(name)
            if offset is not None:
                offsets.append(offset)
    return sorted(offsets)


def _remove_temporary_files(directory: Path) -> None:
    for name in os.listdir(directory):
        if name.endswith((DELETED_FILE_SUFFIX, CLEANED_FILE_SUFFIX)) or (
            name.endswith(SWAP_FILE_SUFFIX) and not name.endswith(_LOG_SWAP)
        ):
            logger.info("%s: removing leftover %s", directory.name, name)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(directory / name)


def _complete_swaps(directory: Path, extension: ExtensionIndexSpec | None) -> None:
    """Finish each cleaning swap a crash interrupted (Kafka's ``completeSwapOperations``).

    The cleaner (``Log.replace_segments``, ``cleaner.CleaningStep``) commits a cleaned
    group by renaming its ``.log.cleaned`` to ``.log.swap`` once the file is fsynced:
    a ``.log.swap`` here is committed, whole, and covers exactly the offsets of the
    segments it replaces (the cleaner keeps each group's last batch, empty if need be,
    so the swap ends where its group ended). Whatever of those old segments is still
    here (none renamed ``.deleted`` yet, some, or all: ``_remove_temporary_files``
    removed those) is deleted, then the swap takes its final name; a crash in between
    finds the ``.swap`` again and repeats this. An uncommitted group left only
    ``.cleaned`` files, which ``_remove_temporary_files`` removed: a roll back. The
    swap's indexes are rebuilt from it (their ``.swap`` files were removed with the
    temporary files: indexes are rebuildable, the ``.log`` is what counts).

    Raises:
        OSError: a file cannot be read, deleted or renamed.
    """
    for name in sorted(os.listdir(directory)):
        if not name.endswith(_LOG_SWAP):
            continue
        base_offset = offset_from_file_name(name)
        if base_offset is None:
            continue
        swap = directory / name
        next_offset = _swap_end(swap, base_offset)
        # The order is important: the replaced segments go first, then the swap file
        # takes its final name. A crash in between leaves the .swap, and this runs again.
        # The unlinks are made durable before the rename: a power cut may otherwise keep
        # the rename and lose an unlink, and a replaced segment comes back beside the
        # cleaned one that holds its offsets (the rename's own target needs no care: its
        # unlink and the rename replace the same name, in order).
        for replaced in _segment_base_offsets(os.listdir(directory)):
            if base_offset <= replaced < next_offset:
                paths = [
                    log_file(directory, replaced),
                    offset_index_file(directory, replaced),
                    time_index_file(directory, replaced),
                ]
                if extension is not None:
                    # Its units are the old segment's: the swap's are rebuilt.
                    paths.append(extension_index_file(directory, replaced, extension.suffix))
                for path in paths:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)
        fsync_directory(directory)
        os.rename(swap, log_file(directory, base_offset))
        logger.info("%s: completed swap of segment %d", directory.name, base_offset)


def _swap_end(swap: Path, base_offset: int) -> int:
    """The offset after the last batch of a ``.log.swap`` (its base when it has none).

    Raises:
        OSError: it cannot be read.
    """
    records = FileRecords(swap, writable=False)
    try:
        next_offset = base_offset
        for batch in records.batches():
            next_offset = batch.next_offset
    finally:
        records.close()
    return next_offset


def _swapped_view(
    directory: Path, names: set[str], extension: ExtensionIndexSpec | None
) -> tuple[set[str], dict[int, str]]:
    """A read-only open's view of the swaps a crash interrupted: what a writable open
    makes of them (``_complete_swaps``), without changing a file. Each ``.log.swap`` is
    committed: it stands for the segments it covers (they, whatever is left of them,
    leave the view; some may be renamed ``.deleted`` already, and their records are in
    the swap only) and is read under its ``.swap`` name (the returned suffix by base
    offset). Its indexes are left out of the view, so the pass rebuilds them in scratch
    space, as the writable open rebuilds them.

    Raises:
        OSError: a swap file cannot be read.
    """
    swaps = sorted(
        (base, name)
        for name in names
        if name.endswith(_LOG_SWAP) and (base := offset_from_file_name(name)) is not None
    )
    if not swaps:
        return names, {}
    view = set(names)
    suffixes: dict[int, str] = {}
    index_suffixes = [LOG_FILE_SUFFIX, INDEX_FILE_SUFFIX, TIME_INDEX_FILE_SUFFIX]
    if extension is not None:
        index_suffixes.append(extension.suffix)
    for base, name in swaps:
        try:
            end = _swap_end(directory / name, base)
        except FileNotFoundError:
            continue  # a writer completed it meanwhile: the segment is in place
        for replaced in _segment_base_offsets(view):
            if base <= replaced < end:
                prefix = filename_prefix_from_offset(replaced)
                view -= {prefix + suffix for suffix in index_suffixes}
        view.add(filename_prefix_from_offset(base) + LOG_FILE_SUFFIX)
        suffixes[base] = SWAP_FILE_SUFFIX
    return view, suffixes


def _remove_orphan_indexes(directory: Path, extension: ExtensionIndexSpec | None) -> None:
    logs = set(_segment_base_offsets(os.listdir(directory)))
    suffixes: tuple[str, ...] = (INDEX_FILE_SUFFIX, TIME_INDEX_FILE_SUFFIX)
    if extension is not None:
        suffixes += (extension.suffix,)
    for name in os.listdir(directory):
        if name.endswith(suffixes):
            offset = offset_from_file_name(name)
            if offset is not None and offset not in logs:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(directory / name)


def _open_appeared_segment(
    directory: Path,
    base_offset: int,
    config: LogConfig,
    now: int,
    scratch: list[Path],
    extension: ExtensionIndexSpec | None,
) -> LogSegment:
    # A segment a reader's refresh finds: the writer's, trusted as the loader trusts a
    # sealed segment; indexes the writer has not made (yet) are rebuilt in scratch
    # space, without a cut.
    indexes = (offset_index_file(directory, base_offset), time_index_file(directory, base_offset))
    missing = not all(path.exists() for path in indexes)
    segment = LogSegment.open(
        directory, base_offset, config, now, writable=False, extension_spec=extension
    )
    if missing and segment.size > 0:
        _use_scratch_indexes(segment, config, scratch)
        segment.rebuild_indexes()
    return segment


def _recover_from(segments: LogSegments, recovery_point: int, writable: bool, load: _Pass) -> None:
    # Kafka's recoverLog: re-validate from the segment holding the recovery point; the
    # first cut ends the log there.
    for segment in segments.values():
        following = segments.higher_segment(segment.base_offset)
        if following is not None and following.base_offset <= recovery_point:
            continue  # flushed before the crash: trusted, as Kafka trusts it
        # A reader keeps the on-disk indexes (a writer never indexes a batch it has not
        # written): it only needs to know where the valid data ends. Unless they are
        # damaged: then it rebuilds them, in scratch space.
        rebuild = writable or not _indexes_sound(segment)
        if rebuild and not writable:
            _use_scratch_indexes(segment, load.config, load.scratch)
        found = segment.recover_tail(
            rebuild_indexes=rebuild,
            end_offset=None if following is None else following.base_offset,
            confirm_last_gap=following is None and load.gaps_suspect,
        )
        load.ends[segment.base_offset] = found.next_offset
        if not writable and segment.extension is not None:
            # Nor its extension index: a power cut keeps mapped index stores apart from
            # the log bytes they describe (pages are written back when the kernel
            # likes), so an entry may name a batch that never reached the disk, or
            # follow one that was lost. The writer's recovery rebuilds it; a reader
            # rebuilds it in scratch space, from its entry 0 (``settle_remaining``).
            load.extension_rebuilds.add(segment.base_offset)
        if found.valid_bytes < found.size:
            later = [s.base_offset for s in segments.values(segment.base_offset + 1)]
            later = [offset for offset in later if offset > segment.base_offset]
            _log_cut(segment, found, writable, hidden=len(later))
            for removed in segments.remove_all(later):
                if writable:
                    removed.delete_if_exists()
                else:
                    removed.close_handlers()
            if not writable:
                segments.hidden_tail = HiddenTail(
                    segment.base_offset,
                    found.valid_bytes,
                    frozenset(later),
                    _bytes_at(segment.path, found.valid_bytes),
                )
            return


def _indexes_sound(segment: LogSegment) -> bool:
    """Whether a segment's offset and time indexes pass Kafka's sanity check and agree
    with its log (``LogSegment.indexes_plausible``). Cost: a short scan."""
    try:
        segment.sanity_check()
    except CorruptIndexError:
        return False
    return segment.indexes_plausible()


def _scratch_dir(scratch: list[Path]) -> Path:
    if not scratch:
        scratch.append(Path(tempfile.mkdtemp(prefix="seglog-index-")))
    return scratch[0]


def _use_scratch_indexes(segment: LogSegment, config: LogConfig, scratch: list[Path]) -> None:
    # A read-only log never writes its directory: rebuilt indexes live in a private
    # temporary directory, removed when the log closes.
    directory = _scratch_dir(scratch) / segment.path.parent.name
    directory.mkdir(exist_ok=True)
    if segment.offset_index.writable:
        return
    segment.offset_index.close_handler()
    segment.time_index.close_handler()
    base = segment.base_offset
    segment.offset_index = OffsetIndex(
        offset_index_file(directory, base), base, config.segment_index_bytes, writable=True
    )
    segment.time_index = TimeIndex(
        time_index_file(directory, base), base, config.segment_index_bytes, writable=True
    )


def _use_scratch_extension(segment: LogSegment, config: LogConfig, scratch: list[Path]) -> None:
    # As ``_use_scratch_indexes``, for the extension index alone.
    extension, spec = segment.extension, segment.extension_spec
    if extension is None or spec is None or extension.writable:
        return
    directory = _scratch_dir(scratch) / segment.path.parent.name
    directory.mkdir(exist_ok=True)
    extension.close_handler()
    base = segment.base_offset
    segment.extension = ExtensionIndex(
        extension_index_file(directory, base, spec.suffix),
        base,
        config.segment_index_bytes,
        writable=True,
    )


def _empty_scratch_segment(
    base_offset: int,
    config: LogConfig,
    now: int,
    scratch: list[Path],
    extension: ExtensionIndexSpec | None,
) -> LogSegment:
    directory = _scratch_dir(scratch)
    return LogSegment.open(directory, base_offset, config, now, extension_spec=extension)


def refresh_segments(
    directory: Path,
    segments: LogSegments,
    config: LogConfig,
    clock: Clock,
    scratch: list[Path],
    extension: ExtensionIndexSpec | None,
) -> tuple[int, bool] | None:
    """Bring a read-only log's segments up to date with the writer's files.

    Segments that appeared are opened, those renamed away by retention are closed, the
    newest segments' indexes and sizes are re-read (indexes first, so no entry ever
    points past the size this reader trusts). Segments the writer's cleaner replaced
    (another file under the same name: ``Log.replace_segments``) are opened anew with their
    indexes, and the units of every segment after them settled again. A tail the reader's
    recovery hid (``LogSegments.hidden_tail``) stays hidden, its later segments unopened,
    until a writer's recovery has changed the bytes there: the view does not change from
    quiet to damaged while the files stay as they were. Returns the log end offset
    and whether segments were replaced, or None when the directory is gone (the topic
    was deleted: the reader keeps what it had).

    Cost: a ``listdir``; when the directory changed since the last refresh (a roll,
    retention, a cleaning swap), a ``stat`` of each segment.
    """
    now = clock.milliseconds()
    try:
        on_disk = set(_segment_base_offsets(os.listdir(directory)))
    except FileNotFoundError:
        return None
    hidden = segments.hidden_tail
    if hidden is not None and not _still_hidden(directory, hidden):
        segments.hidden_tail = hidden = None
    if hidden is not None:
        on_disk = {offset for offset in on_disk if offset <= hidden.base_offset}
    replaced = _replaced_segments(directory, segments, on_disk)
    if on_disk:
        # Drop segments retention renamed away, and the stand-in empty segment a
        # reader uses before the writer's first segment exists.
        for segment in segments.values():
            if segment.base_offset not in on_disk or segment.path.parent != directory:
                segments.remove(segment.base_offset)
                segment.close_handlers()
    known = set(segments.base_offsets())
    previous_active = segments.last_segment
    appeared: list[LogSegment] = []
    for base_offset in sorted(on_disk - known):
        try:
            appeared.append(
                _open_appeared_segment(directory, base_offset, config, now, scratch, extension)
            )
        except FileNotFoundError:
            continue  # deleted between listdir and open
    segments.add_all(appeared)
    refresh_from = previous_active.base_offset if previous_active is not None else 0
    if replaced:
        # Settle from the first replaced segment on: its units are the writer's now.
        refresh_from = min(refresh_from, replaced[0])
    refreshed = segments.values(refresh_from)
    for segment in refreshed:
        for index in segment.indexes():
            if not index.writable:
                index.refresh()
        if hidden is None or segment.base_offset != hidden.base_offset:
            segment.log.refresh_size()
        segment.forget_max_timestamp()
    if extension is not None:
        before = segments.lower_segment(refreshed[0].base_offset) if refreshed else None
        for segment in refreshed:
            expected = None if before is None else _expected_after(before, segment)
            if not segment.load_extension(expected):
                _use_scratch_extension(segment, config, scratch)
                # The oldest segment keeps the start it was loaded with (its units
                # before it are not in any log).
                start = expected if expected is not None else segment.extension_start
                segment.rebuild_extension(start)
            before = segment
    active = segments.last_segment
    assert active is not None
    return active.read_next_offset(), bool(replaced)


def _replaced_segments(directory: Path, segments: LogSegments, on_disk: set[int]) -> list[int]:
    """Remove (and close) the sealed segments whose file is no longer the one they
    opened: the writer's cleaner swapped a new segment in under the same name (they
    reopen as segments that appeared). Only looked for when the directory changed
    since the last look (its mtime: every rename and new file changes it). Returns
    their base offsets, in order."""
    try:
        mtime = os.stat(directory).st_mtime_ns
    except FileNotFoundError:
        return []
    if mtime == segments.listed_mtime_ns:
        return []
    segments.listed_mtime_ns = mtime
    replaced: list[int] = []
    for segment in segments.values()[:-1]:
        if segment.base_offset not in on_disk or segment.path.parent != directory:
            continue
        try:
            stat = os.stat(segment.path)
        except FileNotFoundError:
            continue  # renamed away: dropped as retention's are
        # FileRecords keeps the (device, inode) it opened, to refuse a reopen of
        # another file by the same name; the same test tells a swap here.
        if (stat.st_dev, stat.st_ino) != segment.log.identity:
            replaced.append(segment.base_offset)
    for segment in segments.remove_all(replaced):
        segment.close_handlers()
    return replaced


def _bytes_at(path: Path, position: int) -> bytes:
    """Up to a batch header's bytes of ``path`` at ``position`` (b"" when unreadable)."""
    try:
        with open(path, "rb") as f:
            f.seek(position)
            return f.read(RECORD_BATCH_OVERHEAD)
    except OSError:
        return b""


def _still_hidden(directory: Path, hidden: HiddenTail) -> bool:
    """Whether the bytes a reader's recovery hid are still as the writer's recovery
    would cut them: the file is there, longer than the valid prefix, and what follows
    it is the batch that was hidden (its first bytes unchanged: a batch hidden for a
    base offset after a gap passes its CRC) or still no whole valid batch (a writer
    that recovered cut it, then may have appended a valid batch there). Cost: one open
    and one or two ``pread`` calls."""
    try:
        fd = os.open(log_file(directory, hidden.base_offset), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        size = os.fstat(fd).st_size
        start = hidden.valid_bytes
        if size <= start:
            return False
        if hidden.first_hidden and (
            os.pread(fd, len(hidden.first_hidden), start) == hidden.first_hidden
        ):
            return True
        header = os.pread(fd, HEADER_SIZE_UP_TO_MAGIC, start)
        if len(header) < HEADER_SIZE_UP_TO_MAGIC:
            return True
        try:
            batch_size, _magic = batch_size_at(header, 0)
        except CorruptRecordError:
            return True
        if start + batch_size > size:
            return True
        data = os.pread(fd, batch_size, start)
        try:
            return len(data) < batch_size or not read_batch(data).is_valid()
        except CorruptRecordError:
            return True
    finally:
        os.close(fd)

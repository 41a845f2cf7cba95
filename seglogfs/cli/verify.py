"""``seglogfs verify``: check every invariant of a log directory, from the bytes on disk.

What is checked, each problem reported with its file and byte position:

- metadata: ``seglog-topics.json`` and both offset checkpoints parse; checkpointed
  recovery points and log start offsets lie within their partition's log;
- segments: names are 20-digit base offsets; every batch has a known magic, a sane
  size and a matching CRC (CRC-32C for v2, CRC-32 for v0/v1) and its records decode;
  offsets increase from batch to batch and across segments, never below the segment's
  base offset (the file name) nor at or past the next segment's; relative offsets fit
  32 bits; a partial batch at the end of a segment is a problem, except at the end of
  the active segment while a writer holds the lock (it is being written); a hole of
  offsets between two segments is a missing segment file unless compaction may have
  left it (``storage.log.log_loader.holes_are_damage``: a topic whose
  ``cleanup.policy`` includes ``compact``, or a broker's partition directory);
- ``.index``: whole 8-byte entries, offsets and positions increasing, each entry
  pointing at the start of a batch whose last offset is the entry's offset (what
  Kafka's ``--verify-index-only`` checks);
- ``.timeindex``: whole 12-byte entries, timestamps and offsets never decreasing, each
  entry naming a batch by its last offset whose max timestamp is the entry's;
- the position index (``.seglogpos``, the file system's extension index): whole
  12-byte entries; entry 0 names the segment's start (its base offset, with or
  without a batch there: a new or rolled segment is empty) at the units where the
  previous segment ended, or, for the oldest segment, where
  ``seglogpos-start-checkpoint`` says when it names the segment (that file must
  parse; retention and cleaning passes write it), else at 0 when it starts at offset
  0; every later entry at a batch start with exactly the rendered bytes of every
  earlier record of the partition as its units.

Missing indexes are not problems: the engine rebuilds them. Partition directories of
a deleted topic whose removal is still pending (``deleting`` in ``seglog-topics.json``)
are skipped, as the engine skips them. Files are read directly
(index files before their ``.log``, so that a writer appending meanwhile never makes
an entry look dangling); no ``Log`` is opened, so verification sees the bytes as they
are, not as recovery would make them, and it runs beside a writer.

Cost: one read and one decode of every batch; the indexes are read whole.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import struct
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from seglogfs.positions import Rendering, position_index_spec
from seglogfs.setup_check import check_log_dir, log_dir_error
from storage import CorruptRecordError, RecordBatch, StorageError, TopicMetadata, iter_batches
from storage.log.checkpoint import read_extension_start_checkpoint, read_offset_checkpoint
from storage.log.file_names import (
    CLEAN_SHUTDOWN_FILE,
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    SEGLOG_LOCK_FILE,
    SEGLOG_TOPICS_FILE,
    offset_from_file_name,
    parse_topic_partition_name,
)
from storage.log.log_loader import holes_are_damage
from storage.log.topic import read_topics_document

from .common import (
    EXIT_ERROR,
    EXIT_OK,
    LOG_DIR_ENV,
    Parents,
    Parser,
    UsageError,
    silence_stdout,
    stdout_reader_gone,
)

POSITION_INDEX_SUFFIX = ".seglogpos"
"""The file system's position index (``seglogfs.positions``): units = rendered bytes."""

_OFFSET_ENTRY = struct.Struct(">ii")
_TIME_ENTRY = struct.Struct(">qi")
_POSITION_ENTRY = struct.Struct(">qi")
_INT32_MAX = 0x7FFFFFFF


@dataclass(frozen=True)
class Problem:
    """One broken invariant: where (file, byte position if known) and what."""

    path: Path
    position: int | None
    message: str

    def __str__(self) -> str:
        where = f"{self.path}" if self.position is None else f"{self.path}: byte {self.position}"
        return f"{where}: {self.message}"


@dataclass
class _Batch:
    position: int
    base_offset: int
    last_offset: int
    max_timestamp: int
    units: int  # rendered bytes of the batch; -1 when it did not decode


@dataclass
class _Segment:
    base_offset: int
    log_path: Path
    batches: list[_Batch]
    next_offset: int  # after the last complete batch (base offset when empty)
    framed: bool = True  # its batch headers frame to the end of the file
    size: int = 0  # bytes of the .log as read
    cut_reported: bool = False  # "the log was cut short" said once per segment


def _read(path: Path) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def _writer_holds_lock(log_dir: Path) -> bool:
    """Whether some process holds the writer's flock, read from /proc/locks so that
    verification never takes the lock itself (a daemon starting now must get it)."""
    try:
        st = os.stat(log_dir / SEGLOG_LOCK_FILE)
        locks = Path("/proc/locks").read_text()
    except OSError:
        return False
    wanted = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    return any(
        fields[1] == "FLOCK" and wanted in fields
        for fields in (line.split() for line in locks.splitlines())
        if len(fields) > 5
    )


def _segment_bytes(directory: Path) -> int:
    # A writer's retention may rename or remove files while we look: skip those.
    total = 0
    with contextlib.suppress(FileNotFoundError):
        for path in directory.iterdir():
            if path.name.endswith(".log"):
                with contextlib.suppress(FileNotFoundError):
                    total += path.stat().st_size
    return total


def verify_log_dir(log_dir: Path, *, progress: bool = False) -> list[Problem]:
    """Every problem found in ``log_dir`` (empty when all invariants hold).

    ``progress`` shows a tqdm bar over the bytes of the segment files on stderr.
    """
    problems: list[Problem] = []
    topics: dict[str, TopicMetadata] = {}
    deleting: frozenset[str] = frozenset()
    try:
        document = read_topics_document(log_dir / SEGLOG_TOPICS_FILE)
        topics, deleting = document.topics, document.deleting
    except StorageError as exc:
        problems.append(Problem(log_dir / SEGLOG_TOPICS_FILE, None, str(exc)))
    checkpoints: dict[str, dict[tuple[str, int], int]] = {}
    for name in (RECOVERY_POINT_CHECKPOINT, LOG_START_OFFSET_CHECKPOINT):
        try:
            checkpoints[name] = read_offset_checkpoint(log_dir / name)
        except StorageError as exc:
            problems.append(Problem(log_dir / name, None, str(exc)))
            checkpoints[name] = {}
    writer = _writer_holds_lock(log_dir)

    partitions: list[tuple[tuple[str, int], Path]] = []
    for entry in sorted(os.listdir(log_dir)):
        parsed = parse_topic_partition_name(entry)
        if parsed is not None and parsed[0] not in deleting and (log_dir / entry).is_dir():
            partitions.append((parsed, log_dir / entry))
    total = sum(_segment_bytes(directory) for _tp, directory in partitions)
    with tqdm(total=total, unit="B", unit_scale=True, desc="verify", disable=not progress) as bar:
        for tp, directory in partitions:
            metadata = topics.get(tp[0])
            if metadata is None:
                try:
                    metadata = TopicMetadata(tp[0], tp[1] + 1)  # a topic Kafka made
                except StorageError as exc:
                    # The engine skips such a directory too (with a warning).
                    problems.append(Problem(directory, None, f"not a partition directory: {exc}"))
                    continue
            trusted_end: int | None = 0  # no marker: recovery re-validates the tail
            if (log_dir / CLEAN_SHUTDOWN_FILE).exists():
                # The loader trusts the active segment up to the recovery point only.
                point = checkpoints[RECOVERY_POINT_CHECKPOINT].get(tp, 0)
                trusted_end = point if point > 0 else None
            verifier = _PartitionVerifier(
                directory, metadata, writer, problems, bar, trusted_end=trusted_end
            )
            end = verifier.run()
            if not directory.is_dir():
                continue  # deleted while we looked: its checkpoint entries go next
            for name, limit_name in (
                (RECOVERY_POINT_CHECKPOINT, "recovery point"),
                (LOG_START_OFFSET_CHECKPOINT, "log start offset"),
            ):
                offset = checkpoints[name].get(tp)
                if offset is not None and offset > end:
                    problems.append(
                        Problem(
                            log_dir / name,
                            None,
                            f"{limit_name} {offset} of {tp[0]}-{tp[1]} is past its log end "
                            f"offset {end}",
                        )
                    )
    return problems


class _PartitionVerifier:
    """The checks of one ``<topic>-<partition>`` directory."""

    def __init__(
        self,
        directory: Path,
        metadata: TopicMetadata,
        writer: bool,
        problems: list[Problem],
        bar: tqdm,
        *,
        trusted_end: int | None = None,
    ) -> None:
        self.directory = directory
        # The position index's units: this partition's rendered bytes (a json topic's
        # records name their partition, the number after the directory's last '-').
        partition = int(directory.name.rpartition("-")[2])
        self.rendering = Rendering.of(metadata, partition)
        self.start_checkpoint = directory / position_index_spec(metadata).start_checkpoint_name
        self.checkpointed_start: tuple[int, int] | None = None  # read by ``run``
        self.compact = "compact" in metadata.overrides.get("cleanup.policy", "delete").split(",")
        self.writer = writer
        # Where the next open stops trusting the active segment without re-validating
        # it (``log_loader``: the recovery point after a clean shutdown, 0 after a
        # crash; None: everything is trusted).
        self.trusted_end = trusted_end
        self.problems = problems
        self.bar = bar

    def problem(self, path: Path, position: int | None, message: str) -> None:
        self.problems.append(Problem(path, position, message))

    def run(self) -> int:
        """Check every segment; return the log end offset."""
        # The units at the start of the segment it names never change: a writer
        # replacing it meanwhile (retention, close) never makes it disagree.
        try:
            self.checkpointed_start = read_extension_start_checkpoint(self.start_checkpoint)
        except StorageError as exc:
            self.problem(self.start_checkpoint, None, str(exc))
            self.checkpointed_start = None
        bases: list[int] = []
        try:
            names = list(self.directory.iterdir())
        except FileNotFoundError:
            return 0  # the topic was deleted while we looked
        for path in names:
            if path.name.endswith(".log"):
                base = offset_from_file_name(path.name)
                if base is None or path.name != f"{base:020d}.log":
                    self.problem(path, None, "segment name is not a 20-digit base offset")
                    continue
                bases.append(base)
        bases.sort()
        holes_damage = holes_are_damage([path.name for path in names], self.compact)
        previous: _Segment | None = None
        units_end: int | None = None
        for i, base in enumerate(bases):
            last = i == len(bases) - 1
            if holes_damage and previous is not None and self.check_hole(previous, base):
                units_end = None  # the positions of the missing offsets went with them
            mark = len(self.problems)
            segment, end_units = self.check_segment(base, last, previous, units_end)
            if self.writer and len(self.problems) > mark and i >= len(bases) - 2:
                # The writer may have rolled (trimming this segment's indexes) or
                # appended while we read: judge a fresh read, once.
                del self.problems[mark:]
                segment, end_units = self.check_segment(
                    base, last, previous, units_end, progress=False
                )
            if segment is not None:
                previous, units_end = segment, end_units
                if last and holes_damage and not self.writer:
                    self.check_unconfirmed_gap(segment)
        return previous.next_offset if previous is not None else 0

    def check_unconfirmed_gap(self, active: _Segment) -> None:
        """Report the active segment's last batch when it starts after a gap of offsets
        under ``cleanup.policy=delete`` and ends past what the next open trusts (no
        clean-shutdown marker, or past the checkpointed recovery point): only a base
        offset damaged upwards (outside the CRC) makes such a gap, and no batch after
        it can disprove it (``storage.log.segment.gap_disproved``), so readers hide it
        and recovery cuts it; without this, verify found nothing in the ``.log`` where
        readers lose the batch."""
        if not active.batches or self.trusted_end is None:
            return
        final = active.batches[-1]
        if final.last_offset + 1 <= self.trusted_end:
            return
        batches = active.batches
        expected = batches[-2].last_offset + 1 if len(batches) > 1 else active.base_offset
        if final.base_offset > expected:
            self.problem(
                active.log_path,
                final.position,
                f"batch offsets {final.base_offset}..{final.last_offset} leave out offsets "
                f"{expected}..{final.base_offset - 1} and no batch after it confirms the "
                "gap (its base offset may be damaged): recovery cuts it",
            )

    def check_hole(self, previous: _Segment, base: int) -> bool:
        """Report a hole of offsets before segment ``base``; return whether there is one.

        Under cleanup.policy=delete segments are contiguous (see ``holes_are_damage``):
        offsets between the previous segment's end and this base offset were in a
        segment file that is gone. (A previous segment whose batches stop framing was
        reported already: where it would have ended is unknown.)
        """
        if not previous.framed or previous.next_offset >= base:
            return False
        self.problem(
            self.directory / f"{base:020d}.log",
            None,
            f"offsets {previous.next_offset}..{base - 1} are in no segment file: a segment "
            f"between {previous.log_path.name} and this one is missing",
        )
        return True

    def check_segment(
        self,
        base: int,
        last: bool,
        previous: _Segment | None,
        units_start: int | None,
        *,
        progress: bool = True,
    ) -> tuple[_Segment | None, int | None]:
        """Check one segment and its indexes; return it (None when retention deleted
        it meanwhile) and the position-index units at its end (None when unknown)."""
        # Indexes before the log: every entry a writer added before we read the index
        # points at bytes that are in the log when we read it.
        indexes = {
            suffix: _read(self.directory / f"{base:020d}{suffix}")
            for suffix in (".index", ".timeindex", POSITION_INDEX_SUFFIX)
        }
        segment = self.scan_log(base, last, progress=progress)
        if segment is None:
            return None, units_start
        if previous is not None and previous.next_offset > base:
            self.problem(
                segment.log_path,
                None,
                f"the previous segment holds offsets up to {previous.next_offset - 1}, "
                f"at or past this segment's base offset {base}",
            )
            if previous.batches:
                # Named in the segment that holds them too: a base offset damaged
                # upwards (outside the CRC) makes its batch reach past the segment.
                final = previous.batches[-1]
                self.problem(
                    previous.log_path,
                    final.position,
                    f"batch offsets {final.base_offset}..{final.last_offset} reach the next "
                    f"segment's base offset {base}",
                )
        if indexes[".index"] is not None:
            self.check_offset_index(segment, indexes[".index"])
        if indexes[".timeindex"] is not None:
            self.check_time_index(segment, indexes[".timeindex"])
        units = indexes[POSITION_INDEX_SUFFIX]
        if units is None:
            return segment, None
        return segment, self.check_position_index(segment, units, units_start)

    # -- the log ----------------------------------------------------------------------

    def scan_log(self, base: int, active: bool, *, progress: bool = True) -> _Segment | None:
        path = self.directory / f"{base:020d}.log"
        data = _read(path)
        if data is None:
            return None
        segment = _Segment(base, path, [], base, size=len(data))
        consumed = 0
        try:
            for batch in iter_batches(data):
                consumed = batch.position + batch.size
                self.check_batch(segment, batch)
        except CorruptRecordError as exc:
            self.problem(path, exc.position, f"unreadable batch header: {exc.reason}")
            consumed = len(data)
        if progress:
            self.bar.update(len(data))
        segment.framed = consumed == len(data)
        if consumed < len(data) and not (active and self.writer):
            self.problem(
                path,
                consumed,
                f"partial batch: {len(data) - consumed} bytes after the last complete batch "
                "(recovery truncates them)",
            )
        return segment

    def check_batch(self, segment: _Segment, batch: RecordBatch) -> None:
        path = segment.log_path
        position = batch.position
        if not batch.is_valid():
            last_offset = batch.last_offset
            self.problem(
                path, position, f"CRC mismatch in the batch ending at offset {last_offset}"
            )
            # Its header still says which offsets it held: later checks (the next
            # batch, the checkpoints) judge against that rather than report this again.
            segment.next_offset = max(segment.next_offset, last_offset + 1)
            return
        try:
            base_offset = batch.base_offset
            units = self.rendering.measure(batch)
        except CorruptRecordError as exc:
            self.problem(path, position, f"records do not decode: {exc.reason}")
            return
        last_offset = batch.last_offset
        if base_offset < segment.base_offset:
            self.problem(
                path,
                position,
                f"batch offset {base_offset} is below the segment's base offset "
                f"{segment.base_offset}",
            )
        if base_offset < segment.next_offset and segment.batches:
            self.problem(
                path,
                position,
                f"batch offset {base_offset} does not follow the previous batch's last "
                f"offset {segment.next_offset - 1}",
            )
            batches = segment.batches
            before = batches[-2].last_offset if len(batches) > 1 else segment.base_offset - 1
            if batches[-1].base_offset > before + 1:
                # The previous batch left a gap, and this one starts inside its offsets:
                # a base offset damaged upwards (outside the CRC) makes both, so the
                # previous batch is named too (``storage.log.segment.gap_disproved``).
                self.problem(
                    path,
                    batches[-1].position,
                    f"batch offsets {batches[-1].base_offset}..{batches[-1].last_offset} "
                    f"leave out offsets {before + 1}..{batches[-1].base_offset - 1}, but "
                    f"the next batch starts at offset {base_offset}",
                )
        if last_offset < base_offset:
            self.problem(path, position, f"last offset {last_offset} below base {base_offset}")
        if last_offset - segment.base_offset > _INT32_MAX:
            self.problem(
                path, position, f"offset {last_offset} does not fit a 32-bit relative offset"
            )
        segment.batches.append(
            _Batch(position, base_offset, last_offset, batch.max_timestamp, units)
        )
        segment.next_offset = max(segment.next_offset, last_offset + 1)

    # -- indexes ----------------------------------------------------------------------

    @staticmethod
    def _entries(
        data: bytes, layout: struct.Struct, offset_field: int, *, zero_first: bool = False
    ) -> Iterator[tuple[int, int, tuple[int, ...]]]:
        """(slot, byte position, fields) of the valid prefix, as Kafka reads a
        preallocated index: a zero relative offset after slot 0 ends it, and so does
        an all-zero slot 0 unless ``zero_first`` says that is a real entry."""
        usable = len(data) - len(data) % layout.size
        for slot, fields in enumerate(layout.iter_unpack(data[:usable])):
            if slot > 0 and fields[offset_field] == 0:
                return
            if slot == 0 and not zero_first and not any(fields):
                return
            yield slot, slot * layout.size, fields

    def check_cut_short(self, segment: _Segment, index_path: Path, offset: int) -> None:
        """Name the ``.log`` whose index holds an entry past its end, once.

        An index entry is written after the batch it names, so one past the log's end
        means the log lost bytes it had (truncated, or a power loss kept the index's
        pages and not the log's). Cut at a batch boundary the log itself still frames
        cleanly: without this only the indexes and the next segment (the hole) would
        be named, not the file the records went from.
        """
        if segment.cut_reported or not segment.framed:
            return
        segment.cut_reported = True
        end = segment.next_offset
        ends = f"ends after offset {end - 1}" if end > segment.base_offset else "holds no batch"
        self.problem(
            segment.log_path,
            segment.size,
            f"the log {ends} but {index_path.name} names offset {offset}: the segment "
            f"was cut short, offsets {end}..{offset} at least are gone",
        )

    def _index_size(self, path: Path, data: bytes, entry_size: int) -> None:
        if len(data) % entry_size:
            self.problem(
                path,
                len(data) - len(data) % entry_size,
                f"size {len(data)} is not a multiple of {entry_size}-byte entries",
            )

    def check_offset_index(self, segment: _Segment, data: bytes) -> None:
        path = segment.log_path.with_suffix(".index")
        self._index_size(path, data, _OFFSET_ENTRY.size)
        by_position = {b.position: b for b in segment.batches}
        previous = (-1, -1)
        for _slot, at, (relative, position) in self._entries(data, _OFFSET_ENTRY, 0):
            offset = segment.base_offset + relative
            if relative < 0 or (offset, position) <= previous or position <= previous[1]:
                self.problem(
                    path,
                    at,
                    f"entry (offset {offset}, position {position}) does not follow "
                    f"(offset {previous[0]}, position {previous[1]})",
                )
            batch = by_position.get(position)
            if batch is None and position >= segment.size:
                self.check_cut_short(segment, path, offset)
            if batch is None:
                self.problem(
                    path,
                    at,
                    f"entry for offset {offset} points at byte {position} of "
                    f"{segment.log_path.name}, which is not a batch start",
                )
            elif batch.last_offset != offset:
                self.problem(
                    path,
                    at,
                    f"entry for offset {offset} points at the batch ending at offset "
                    f"{batch.last_offset}",
                )
            previous = (offset, position)

    def check_time_index(self, segment: _Segment, data: bytes) -> None:
        path = segment.log_path.with_suffix(".timeindex")
        self._index_size(path, data, _TIME_ENTRY.size)
        by_last_offset = {b.last_offset: b for b in segment.batches}
        previous = (-1, segment.base_offset)
        for _slot, at, (timestamp, relative) in self._entries(data, _TIME_ENTRY, 1):
            offset = segment.base_offset + relative
            if timestamp < previous[0] or offset < previous[1]:
                self.problem(
                    path,
                    at,
                    f"entry (timestamp {timestamp}, offset {offset}) goes back from "
                    f"(timestamp {previous[0]}, offset {previous[1]})",
                )
            batch = by_last_offset.get(offset)
            if batch is None and offset >= segment.next_offset:
                self.check_cut_short(segment, path, offset)
            if batch is None:
                self.problem(path, at, f"entry names offset {offset}, which ends no batch")
            elif batch.max_timestamp != timestamp:
                self.problem(
                    path,
                    at,
                    f"entry says timestamp {timestamp} for the batch ending at offset "
                    f"{offset}, whose max timestamp is {batch.max_timestamp}",
                )
            previous = (timestamp, offset)

    def check_position_index(
        self, segment: _Segment, data: bytes, expected_start: int | None
    ) -> int | None:
        """Check a position index; return the units at this segment's end (None when
        they cannot be known: a batch did not decode or the index is unusable)."""
        path = segment.log_path.with_suffix(POSITION_INDEX_SUFFIX)
        self._index_size(path, data, _POSITION_ENTRY.size)
        entries = list(self._entries(data, _POSITION_ENTRY, 1, zero_first=True))
        if not entries:
            return None  # an empty file: nothing to check against (rebuilt on open)
        # Entry 0 is (units at the segment start, relative offset 0); for a segment
        # starting at units 0 it is all zeros.
        start, first_relative = entries[0][2]
        if first_relative != 0:
            self.problem(path, 0, "entry 0 does not name the segment's base offset")
            return None
        checkpointed = self._checkpointed_start(segment.base_offset)
        for expected, source in (
            (expected_start, "the previous segment ends at"),
            # Offset 0 starts at position 0, unless a cleaning pass moved the start
            # position up (it checkpoints where: the rule below).
            (
                0 if segment.base_offset == 0 and checkpointed is None else None,
                "no record comes before offset",
            ),
            (checkpointed, f"{self.start_checkpoint.name} says"),
        ):
            if expected is not None and start != expected:
                self.problem(
                    path, 0, f"segment starts at position {start}, but {source} {expected}"
                )
        # Cumulative rendered bytes before each batch start of the segment.
        before: dict[int, int] = {}
        units = start
        decodable = True
        for batch in segment.batches:
            before[batch.base_offset] = units
            if batch.units < 0:
                decodable = False
                break
            units += batch.units
        # Entry 0 names the segment's start, checked above: a segment has one before its
        # first batch is appended, and it stays when recovery or truncation empties it.
        for _slot, at, (indexed_units, relative) in entries[1:]:
            offset = segment.base_offset + relative
            if offset not in before:
                if decodable:
                    self.problem(path, at, f"entry names offset {offset}, which starts no batch")
                continue
            if indexed_units != before[offset]:
                self.problem(
                    path,
                    at,
                    f"entry says position {indexed_units} for the batch at offset {offset}, "
                    f"which starts at rendered byte {before[offset]}",
                )
        for (_a, _at_a, (units_a, rel_a)), (_b, at_b, (units_b, rel_b)) in itertools.pairwise(
            entries
        ):
            if units_b < units_a or rel_b <= rel_a:
                self.problem(path, at_b, "entries go back in position or offset")
        return units if decodable else None

    def _checkpointed_start(self, base_offset: int) -> int | None:
        checkpoint = self.checkpointed_start
        return checkpoint[1] if checkpoint is not None and checkpoint[0] == base_offset else None


__all__ = ["POSITION_INDEX_SUFFIX", "Problem", "verify_log_dir"]


def _cmd_verify(args: argparse.Namespace) -> int:
    value = args.log_dir_positional or getattr(args, "log_dir", None) or os.environ.get(LOG_DIR_ENV)
    if not value:
        raise UsageError(f"no log directory: give LOGDIR, -d/--log-dir or set {LOG_DIR_ENV}")
    log_dir = Path(value)
    check_log_dir(log_dir, must_exist=True)
    try:
        problems = verify_log_dir(log_dir, progress=not args.quiet and sys.stderr.isatty())
    except PermissionError as exc:
        raise log_dir_error(log_dir, exc, writing=False) from None
    try:
        for problem in problems:
            print(problem)
        sys.stdout.flush()
    except BrokenPipeError:
        if not stdout_reader_gone():
            raise
        # ``verify | head``: end quietly, but the problems exist: still exit 1, so a
        # script's ``set -o pipefail`` never takes a damaged directory for a clean one.
        silence_stdout()
        return EXIT_ERROR
    if problems:
        if not args.quiet:  # -q: the problem lines and the exit code say it all
            print(f"{len(problems)} problem(s) found in {log_dir}", file=sys.stderr)
        return EXIT_ERROR
    if not args.quiet:
        print(f"{log_dir}: no problems found", file=sys.stderr)
    return EXIT_OK


def add_parser(commands: argparse._SubParsersAction[Parser], shared: Parents) -> None:
    """Add ``verify`` to ``commands``."""
    verify = commands.add_parser(
        "verify",
        parents=[shared.log_dir],
        help="check every invariant of a log directory; exit 1 on any problem",
        description="Check CRCs, offsets, indexes, checkpoints and position indexes of "
        "a log directory; print each problem with its file and byte position.",
    )
    verify.add_argument("log_dir_positional", nargs="?", metavar="LOGDIR")
    verify.add_argument("-q", "--quiet", action="store_true", help="no progress, no summary")
    verify.set_defaults(handler=_cmd_verify, command_parser=verify)

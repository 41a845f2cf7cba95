"""One segment: a ``.log`` file and its ``.index`` / ``.timeindex`` (Kafka's ``LogSegment``).

The segment appends batches, keeps the sparse indexes in step (an offset-index entry
whenever more than ``index.interval.bytes`` were appended since the last one, keyed by
the batch's last offset and pointing at the batch's start; a time-index entry for each
new maximum timestamp at those points), translates an offset to a file position, and
recovers itself by re-validating every batch.

Crash safety: log bytes are written before the index entries that point at them, and
indexes are never trusted over the log: a missing or corrupt index is rebuilt by
``recover()``.

An optional extension index (``ExtensionIndexSpec``) is kept in step with the other two:
created with the segment, fed on append, truncated, trimmed, renamed and deleted with
it, rebuilt by ``recover``.

Descriptors and mappings: a segment's files are opened when it is made and may then
be released (descriptors closed, mappings dropped) and opened again on the next use,
as Kafka's ``LazyIndex`` maps an index on first use. ``OpenSegments`` decides: it keeps
the segments of the process that hold files open in least-recently-used order and
releases the oldest once more than its bound are open, so a process holds descriptors
and mappings for a bounded number of segments, whatever the number of segments on disk.
A segment being changed is *pinned* (the log pins its active segment; every method
below that writes pins the segment while it runs): a pinned segment is never released,
so writes never race a release.

Thread-safety: not thread-safe for mutation; the owning ``Log`` serialises appends,
truncation, roll and close. Reads (``batches_from``, ``translate_offset``, the
timestamp and extension lookups) may run in any number of threads concurrently with
an append, a roll, a deletion or a release: lazily loaded facts are computed under
the segment's own lock, so a reader never overwrites what the writer knows with an
older view; a read that finds the segment released opens its files again; and a
segment closed under a reader makes its reads raise ``SegmentDeletedError``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import resource
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from itertools import dropwhile
from pathlib import Path
from typing import Concatenate, Final, Generic, NamedTuple, ParamSpec, Protocol, TypeVar, overload

from ..errors import CorruptIndexError, CorruptRecordError, SegmentDeletedError, StorageError
from ..record.file_records import (
    FileRecords,
    OffsetPosition,
    Tail,
    TimestampAndOffset,
    retry_out_of_descriptors,
)
from ..record.record_batch import RecordBatch
from .extension_index import ExtensionIndex, ExtensionIndexSpec
from .file_names import (
    extension_index_file,
    log_file,
    offset_index_file,
    time_index_file,
)
from .index import AbstractIndex
from .log_config import LOG_SEGMENT_OPEN_MAX, LogConfig
from .offset_index import OffsetIndex
from .time_index import TimeIndex

logger = logging.getLogger(__name__)

DEFAULT_MAX_OPEN_SEGMENTS: Final = LOG_SEGMENT_OPEN_MAX
"""``log.segment.open.max``'s default: segments a process keeps open besides the pinned
ones (each log's active segment). Kafka has no such setting (a broker keeps every
segment's ``.log`` open and maps each index on first use for good, and its operators
raise ``ulimit -n`` and ``vm.max_map_count``); 1,000 segments are at most 7,000
descriptors and 3,000 mappings, next to ``max.broker.partitions`` (4,000) active
segments of 4 descriptors each: 23,000 of the unit's ``LimitNOFILE=65536``, and 15,000
mappings of Linux's default 65,530."""

DESCRIPTORS_PER_SEGMENT: Final = 7
"""The most descriptors an open segment holds: its ``.log``, and two per index
(``.index``, ``.timeindex``, an extension index) in a reader, its own and its mapping's;
a writer holds one per index (4 in all)."""

MAPPINGS_PER_SEGMENT: Final = 3
"""The most mappings an open segment holds: one per index."""

NOFILE_SHARE: Final = 4
"""Open segments take at most 1/4 of the process's soft ``RLIMIT_NOFILE``: the rest is
for the active segments, the descriptors each read in progress duplicates, sockets and
whatever else the process opens. A shell's soft limit of 1,024 allows 36 segments."""


class OpenSegments:
    """The segments of this process whose files may be open, least recently used first.

    When more than ``limit()`` unpinned segments are open, the least recently used are
    released (``LogSegment.release_handles``: descriptors closed, mappings dropped; the
    next use opens them again). Pinned segments (each writer's active segment, and a
    segment while a method changes it) are never released and do not count. The bound
    is ``max_open`` (``log.segment.open.max``, ``DEFAULT_MAX_OPEN_SEGMENTS``), lowered
    to ``NOFILE_SHARE``'s share of the soft ``RLIMIT_NOFILE`` at
    ``DESCRIPTORS_PER_SEGMENT`` each: a process therefore holds at most
    ``limit() * DESCRIPTORS_PER_SEGMENT`` descriptors and ``limit() *
    MAPPINGS_PER_SEGMENT`` mappings for sealed segments, plus 4 (a reader: 7) and 3 per
    pinned segment and one per read in progress. When an open fails for want of
    descriptors anyway (``EMFILE``: other code took them), ``shed`` releases every
    unpinned segment and the open is tried once more.

    One instance serves the process (``OPEN_SEGMENTS``): descriptors and mappings are
    the process's, whichever log or ``LogManager`` holds them.

    Thread-safety: thread-safe; one lock, held for O(1) bookkeeping and for the
    releases it decides (a ``close`` and an unmap per file). Lock order: this lock,
    then a file's handle lock; files tell it of a reopening after dropping theirs.

    Costs: ``touch``, ``pin``, ``unpin``, ``admit`` and ``discard`` O(1) (an
    ``OrderedDict`` move), plus the releases; ``limit()`` one ``getrlimit``, taken only
    when a segment is admitted or unpinned. Kafka's closest cache, the
    ``RemoteIndexCache`` of tiered storage, is bounded in bytes; what runs out here is
    descriptors, so this counts segments.
    """

    def __init__(self, max_open: int = DEFAULT_MAX_OPEN_SEGMENTS) -> None:
        self.max_open = max_open
        self._lock = threading.Lock()
        # Unpinned segments that may hold files, least recently used first.
        self._lru: OrderedDict[LogSegment, None] = OrderedDict()
        self.releases = 0
        """Segments released so far (for tests and metrics)."""

    def limit(self) -> int:
        """The bound now: ``max_open``, within the share of ``RLIMIT_NOFILE``; at least 1."""
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        share = self.max_open
        if soft != resource.RLIM_INFINITY:
            share = soft // NOFILE_SHARE // DESCRIPTORS_PER_SEGMENT
        return max(1, min(self.max_open, share))

    def __len__(self) -> int:
        """Unpinned segments that may hold files."""
        return len(self._lru)

    def __contains__(self, segment: object) -> bool:
        return segment in self._lru

    def touch(self, segment: LogSegment) -> None:
        """``segment`` was used: it becomes the most recently used."""
        with self._lock, contextlib.suppress(KeyError):
            self._lru.move_to_end(segment)

    def admit(self, segment: LogSegment) -> None:
        """``segment`` opened a file: track it (unless pinned or closed), most recently
        used, and release the least recently used beyond the bound."""
        with self._lock:
            lru = self._lru
            if segment.pins or segment.closed:
                return
            if lru and next(reversed(lru)) is segment:
                return  # another of its files opened: already the most recent
            lru[segment] = None
            lru.move_to_end(segment)
            self._release_beyond(self.limit())

    def pin(self, segment: LogSegment) -> None:
        """Keep ``segment`` from being released until as many ``unpin`` calls."""
        with self._lock:
            segment.pins += 1
            self._lru.pop(segment, None)

    def unpin(self, segment: LogSegment) -> None:
        """Undo one ``pin``; the last makes the segment the most recently used."""
        with self._lock:
            segment.pins -= 1
            assert segment.pins >= 0, segment
            if segment.pins == 0 and not segment.closed:
                self._lru[segment] = None
                self._release_beyond(self.limit())

    def discard(self, segment: LogSegment) -> None:
        """Forget ``segment`` (closed for good)."""
        with self._lock:
            self._lru.pop(segment, None)

    def shed(self) -> bool:
        """Release every unpinned segment (the process is out of descriptors); return
        whether there was any."""
        with self._lock:
            released = bool(self._lru)
            self._release_beyond(0)
            return released

    def _release_beyond(self, limit: int) -> None:
        lru = self._lru
        while len(lru) > limit:
            segment, _ = lru.popitem(last=False)
            try:
                segment.release_handles()
            except OSError as exc:  # a close that failed: the descriptor is gone anyway
                logger.warning("%s: releasing its files: %s", segment.path, exc)
            self.releases += 1


OPEN_SEGMENTS = OpenSegments()
"""The process's ``OpenSegments``: ``OPEN_SEGMENTS.max_open`` is ``log.segment.open.max``."""


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _pinning(
    method: Callable[Concatenate[LogSegment, _P], _R],
) -> Callable[Concatenate[LogSegment, _P], _R]:
    """Run a method that writes the segment's files with the segment pinned."""

    def pinned(segment: LogSegment, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        with segment.pinned():
            return method(segment, *args, **kwargs)

    functools.update_wrapper(pinned, method)
    return pinned


def _from_offset(offset: int, batches: Iterator[RecordBatch]) -> Iterator[RecordBatch]:
    return dropwhile(lambda batch: batch.last_offset < offset, batches)


def gap_disproved(
    batch: RecordBatch, previous_last_offset: int, after: RecordBatch | None, end_offset: int | None
) -> str | None:
    """Why ``batch``, which starts past ``previous_last_offset + 1`` (a gap of offsets),
    cannot be where it is (None: nothing says so).

    Only compaction leaves gaps (and a log copied from a compacted one): the offsets a
    gap skips were removed, so the batches after it still follow it. A base offset
    damaged upwards (it is outside the CRC) makes a gap too, but then the next batch
    (``after``) starts inside or before its offsets, or, for the last batch of a
    segment, its offsets reach ``end_offset`` (the next segment's base offset; for the
    active segment, the log end a clean shutdown checkpointed). Without either nothing
    tells its damage from a gap (``recover_tail``'s ``confirm_last_gap``).

    Cost: a few comparisons of header fields.
    """
    last_offset = batch.last_offset
    if after is not None:
        next_base = after.base_offset if after.magic >= 2 else after.last_offset
        if next_base <= last_offset:
            return (
                f"offsets {batch.base_offset}..{last_offset} leave out offsets "
                f"{previous_last_offset + 1}..{batch.base_offset - 1}, but the next batch "
                f"holds offset {next_base}: a damaged base offset"
            )
    elif end_offset is not None and last_offset >= end_offset:
        return (
            f"offsets {batch.base_offset}..{last_offset} leave out offsets "
            f"{previous_last_offset + 1}..{batch.base_offset - 1} and reach offset "
            f"{end_offset}, where the segment's offsets end: a damaged base offset"
        )
    return None


class AppendedBatch(NamedTuple):
    """What the segment needs to know of each batch it appends.

    ``units`` is the batch's size in the extension index's units (0 without one).
    """

    base_offset: int
    last_offset: int
    max_timestamp: int
    size: int
    units: int = 0


class Damage(NamedTuple):
    """The first damage a re-validating scan met: the byte where the damaged batch (or
    the bytes that no longer frame as batches) starts, the first offset not served
    there, and why."""

    position: int
    offset: int
    reason: str


class Revalidation(NamedTuple):
    """What a re-validating scan of a whole segment found (``LogSegment.recover``,
    ``LogSegment.rebuild_indexes``).

    ``valid_bytes`` and ``next_offset`` end the valid prefix (the last valid batch
    before the first damage); ``size`` is the file's size when scanned; ``damage`` is
    None when every byte is a valid batch. Past the damage, batch headers that still
    frame reach byte ``framed_to`` and offset ``last_framed_offset``: what a cut there
    loses, or what stays behind the damage when nothing is cut.
    """

    valid_bytes: int
    next_offset: int
    size: int
    damage: Damage | None
    last_framed_offset: int
    framed_to: int


_I = TypeVar("_I", bound="AbstractIndex | None")


class _OwnedIndex(Generic[_I]):
    """An index attribute of a ``LogSegment``: the segment becomes the owner of what
    is stored in it (told when the index opens its file again)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._attribute = "_" + name

    @overload
    def __get__(self, segment: None, objtype: type | None = None) -> _OwnedIndex[_I]: ...

    @overload
    def __get__(self, segment: LogSegment, objtype: type | None = None) -> _I: ...

    def __get__(
        self, segment: LogSegment | None, objtype: type | None = None
    ) -> _I | _OwnedIndex[_I]:
        if segment is None:
            return self
        index: _I = getattr(segment, self._attribute)
        return index

    def __set__(self, segment: LogSegment, index: _I) -> None:
        if index is not None:
            index.owner = segment
        setattr(segment, self._attribute, index)


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
        extension: ExtensionIndex | None = None,
        extension_spec: ExtensionIndexSpec | None = None,
        *,
        open_segments: OpenSegments = OPEN_SEGMENTS,
    ) -> None:
        self.open_segments = open_segments
        self.pins = 0
        """Pins held (``pin``); changed under ``open_segments``' lock."""
        log.owner = self
        self.log = log
        self.offset_index = offset_index
        self.time_index = time_index
        self.extension = extension
        self.extension_spec = extension_spec
        self.base_offset = base_offset
        self.index_interval_bytes = index_interval_bytes
        self.rolling_jitter_ms = rolling_jitter_ms
        self.created_ms = created_ms
        self._bytes_since_last_index_entry = 0
        self._index_entry_skipped_logged = False
        # Serialises the lazy loads below between reader threads and the writer.
        self._lazy_lock = threading.Lock()
        # (max timestamp, shallow offset of it) over the segment; loaded lazily since
        # it costs a scan past the last time-index entry.
        self._max_timestamp_and_offset: TimestampAndOffset | None = None
        self._rolling_based_timestamp: int | None = None
        self._rolling_based_loaded = False
        # Extension units: at the segment start (entry 0, or what the log says when
        # the index has no entry 0), at its end, and appended since the last entry.
        self.extension_start = 0
        self.extension_end = 0
        self._units_since_last_extension_entry = 0
        self.extension_exact = True
        """False when a damaged batch the units were measured over could not be
        measured (reads stop at it): ``extension_end`` is then a lower bound, and the
        next segment's own entry 0 says where it starts (see ``log_loader``)."""
        self.missing_after: int | None = None
        """Set when offsets from this segment's end up to this one (the next segment's
        base offset) are in no segment file: a read of this sealed segment that runs
        out of it raises ``CorruptRecordError`` naming them (see ``log_loader``)."""

    # The indexes tell their segment when they open their file again (``HandleOwner``):
    # setting one (the loader swaps in scratch indexes for a reader) makes it so.
    offset_index: _OwnedIndex[OffsetIndex] = _OwnedIndex()
    time_index: _OwnedIndex[TimeIndex] = _OwnedIndex()
    extension: _OwnedIndex[ExtensionIndex | None] = _OwnedIndex()

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
        extension_spec: ExtensionIndexSpec | None = None,
        open_segments: OpenSegments = OPEN_SEGMENTS,
    ) -> LogSegment:
        """Open (creating if missing, when writable) the segment at ``base_offset``.

        The extension index, when ``extension_spec`` is given, is opened too; its
        start and end units are the caller's to settle (``start_extension``,
        ``load_extension_end``, or ``recover``). The segment joins ``open_segments``
        (released when it has not been used lately). Out of descriptors,
        ``open_segments`` sheds its segments and the open is tried once more.

        Raises:
            OSError: a file cannot be opened (``EMFILE`` even after the shedding).
        """
        segment = retry_out_of_descriptors(
            lambda: cls._open_files(
                directory,
                base_offset,
                config,
                created_ms,
                writable=writable,
                file_suffix=file_suffix,
                rolling_jitter_ms=rolling_jitter_ms,
                extension_spec=extension_spec,
                open_segments=open_segments,
            ),
            open_segments.shed,
        )
        open_segments.admit(segment)
        return segment

    @classmethod
    def _open_files(
        cls,
        directory: Path,
        base_offset: int,
        config: LogConfig,
        created_ms: int,
        *,
        writable: bool,
        file_suffix: str,
        rolling_jitter_ms: int,
        extension_spec: ExtensionIndexSpec | None,
        open_segments: OpenSegments,
        extension_start: int | None = None,
    ) -> LogSegment:
        # The order is important: the indexes first, the .log last. Creating, the .log
        # is what makes a segment (the loader removes index files without one), so a
        # crash part way leaves no segment. Reading, the log's size is taken after the
        # indexes counted their entries: the writer (maybe another process, appending
        # meanwhile) writes a batch's log bytes before its index entries, and a
        # read-only index counts its valid prefix with ``pread`` of the shared page
        # cache, where the writer's mmap stores land, so every entry counted names
        # bytes the log file already held when it is opened. A size taken before could
        # end before a batch an entry names, and the indexes would look corrupt
        # (``indexes_plausible``) for no reason.
        opened: list[OffsetIndex | TimeIndex | ExtensionIndex] = []
        try:
            offset_index = OffsetIndex(
                offset_index_file(directory, base_offset, file_suffix),
                base_offset,
                config.segment_index_bytes,
                writable=writable,
            )
            opened.append(offset_index)
            time_index = TimeIndex(
                time_index_file(directory, base_offset, file_suffix),
                base_offset,
                config.segment_index_bytes,
                writable=writable,
            )
            opened.append(time_index)
            extension = None
            if extension_spec is not None:
                extension = ExtensionIndex(
                    extension_index_file(
                        directory, base_offset, extension_spec.suffix, file_suffix
                    ),
                    base_offset,
                    config.segment_index_bytes,
                    writable=writable,
                )
                opened.append(extension)
                if extension_start is not None:
                    extension.append(base_offset, extension_start)
            log = FileRecords(log_file(directory, base_offset, file_suffix), writable=writable)
        except BaseException:
            for index in opened:
                index.close_handler()
            raise
        segment = cls(
            log,
            offset_index,
            time_index,
            base_offset,
            config.index_interval_bytes,
            rolling_jitter_ms,
            created_ms,
            extension,
            extension_spec,
            open_segments=open_segments,
        )
        if extension_start is not None:
            segment.extension_start = segment.extension_end = extension_start
        return segment

    @classmethod
    def create(
        cls,
        directory: Path,
        base_offset: int,
        config: LogConfig,
        created_ms: int,
        *,
        rolling_jitter_ms: int = 0,
        extension_spec: ExtensionIndexSpec | None = None,
        extension_start: int = 0,
        open_segments: OpenSegments = OPEN_SEGMENTS,
    ) -> LogSegment:
        """Make the files of a new segment at ``base_offset`` (a roll's); return it pinned.

        The indexes come first, preallocated to ``segment.index.bytes``, the extension
        index with its entry 0 (the units at the segment start, ``extension_start``);
        the ``.log`` comes last (see ``_open_files``). Any failure (``EMFILE``,
        ``ENOSPC``, ...) deletes every file this call made: nothing of the segment is
        left. Files already at those names (a roll that failed and could not clean up)
        are deleted first, as Kafka's roll does. Out of descriptors, ``open_segments``
        sheds its segments and the creation is tried once more.

        Raises:
            OSError: the files cannot be made; none of them exists.
        """
        paths = [
            offset_index_file(directory, base_offset),
            time_index_file(directory, base_offset),
            log_file(directory, base_offset),
        ]
        if extension_spec is not None:
            paths.append(extension_index_file(directory, base_offset, extension_spec.suffix))
        for path in paths:
            if path.exists():
                logger.warning("newly rolled segment file %s already exists; deleting it", path)
                path.unlink()

        def made() -> LogSegment:
            try:
                return cls._open_files(
                    directory,
                    base_offset,
                    config,
                    created_ms,
                    writable=True,
                    file_suffix="",
                    rolling_jitter_ms=rolling_jitter_ms,
                    extension_spec=extension_spec,
                    open_segments=open_segments,
                    extension_start=extension_start,
                )
            except BaseException:
                for path in paths:
                    with contextlib.suppress(OSError):
                        os.unlink(path)
                raise

        segment = retry_out_of_descriptors(made, open_segments.shed)
        segment.pins = 1
        return segment

    # -- descriptors and mappings ------------------------------------------------------

    @property
    def closed(self) -> bool:
        """Whether the segment was closed (or deleted): it never opens a file again."""
        return self.log.closed

    @property
    def is_open(self) -> bool:
        """Whether any of its files holds a descriptor or mapping now."""
        return self.log.is_open or any(index.is_open for index in self.indexes())

    def pin(self) -> None:
        """Keep the segment's files open (not released) until ``unpin``; pins nest."""
        self.open_segments.pin(self)

    def unpin(self) -> None:
        """Undo a ``pin``; after the last the segment may be released again."""
        self.open_segments.unpin(self)

    @contextlib.contextmanager
    def pinned(self) -> Iterator[None]:
        """Pinned for the block (every method that writes a file runs so)."""
        self.pin()
        try:
            yield
        finally:
            self.unpin()

    def release_handles(self) -> None:
        """Close the descriptors and drop the mappings of every file (``OpenSegments``
        calls it, never on a pinned segment); the next use opens them again."""
        self.log.release()
        for index in self.indexes():
            index.release()

    def handles_opened(self) -> None:
        """``HandleOwner``: a file opened again, so the segment is open (and used)."""
        self.open_segments.admit(self)

    def shed_handles(self) -> bool:
        """``HandleOwner``: out of descriptors; release the unpinned segments."""
        return self.open_segments.shed()

    def _touch(self) -> None:
        # The log's active segment is pinned (outside the bookkeeping): no lock for it.
        if not self.pins:
            self.open_segments.touch(self)

    # -- facts -----------------------------------------------------------------------

    @property
    def size(self) -> int:
        """Bytes of the ``.log`` file."""
        return self.log.size

    @property
    def path(self) -> Path:
        return self.log.path

    def max_timestamp_and_offset(self) -> TimestampAndOffset:
        """The largest batch timestamp in the segment and the last offset of its batch
        (from the time index alone when the batches after its last entry do not frame).

        Cost: the first call scans the batches after the last time-index entry.
        """
        known = self._max_timestamp_and_offset
        if known is not None:
            return known
        self._touch()
        with self._lazy_lock:
            if self._max_timestamp_and_offset is None:
                last_ts, last_offset = self.time_index.last_entry
                best = TimestampAndOffset(last_ts, last_offset)
                start = self._offset_lookup(last_offset)[1] if last_ts >= 0 else 0
                try:
                    tail = self.log.largest_timestamp_after(start)
                except CorruptRecordError as exc:
                    # Damage the loader kept (reads report it): the time index's answer,
                    # rather than every append (and retention) of the segment failing.
                    logger.warning("%s: largest timestamp from its time index: %s", self.path, exc)
                    tail = TimestampAndOffset(-1, -1)
                if tail.timestamp > best.timestamp:
                    best = tail
                self._max_timestamp_and_offset = best
            return self._max_timestamp_and_offset

    def forget_max_timestamp(self) -> None:
        """Drop the cached max timestamp (a reader whose writer appended more)."""
        with self._lazy_lock:
            self._max_timestamp_and_offset = None

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
        """Max timestamp of the first batch: what ``segment.ms`` is measured from.

        None when the segment is empty, or when its first batch does not frame (damage
        that reads report; the loader keeps it in a segment whose data is final): then
        ``segment.ms`` counts from ``created_ms``, as for a batch without a timestamp,
        instead of every append to the segment failing on it.

        Cost: the first call reads the first batch's header.
        """
        if not self._rolling_based_loaded:
            self._touch()
            with self._lazy_lock:
                if not self._rolling_based_loaded:
                    try:
                        for batch in self.log.batches(0):
                            self._rolling_based_timestamp = batch.max_timestamp
                            self._rolling_based_loaded = True
                            break
                    except CorruptRecordError as exc:
                        logger.warning(
                            "%s: segment.ms counted from the segment's creation: %s",
                            self.path,
                            exc,
                        )
                        self._rolling_based_timestamp = None
                        self._rolling_based_loaded = True
        return self._rolling_based_timestamp

    # -- appending -------------------------------------------------------------------

    def can_convert_to_relative_offset(self, offset: int) -> bool:
        return self.offset_index.can_append_offset(offset)

    def append(self, data: bytes, batches: Sequence[AppendedBatch]) -> int:
        """Append ``data``: the batches described by ``batches``, back to back.

        Returns the position of the first batch. One ``write`` for all of them, so a
        failed append leaves nothing behind. Log bytes are written before index entries:
        an index entry must never point past the end of the log (a crash between the
        two leaves an index that merely lacks its newest entry, which lookups tolerate).

        An index entry that cannot be written (``ENOSPC`` for a new page of the index
        file) is skipped with a warning: the index is sparse, lookups scan further.

        Raises:
            OSError: the write failed; the segment is unchanged.
        """
        # The log pins its active segment: no bookkeeping per append then.
        pinned_here = not self.pins
        if pinned_here:
            self.pin()
        try:
            return self._append(data, batches)
        finally:
            if pinned_here:
                self.unpin()

    def _append(self, data: bytes, batches: Sequence[AppendedBatch]) -> int:
        # Loaded before the write: a lazy load afterwards would scan the new batches
        # too and index early batches with a later batch's max timestamp.
        current = self.max_timestamp_and_offset()
        self.first_batch_timestamp()
        position = self.log.append(data)
        batch_position = position
        for base_offset, last_offset, max_timestamp, size, units in batches:
            if max_timestamp > current.timestamp:
                current = TimestampAndOffset(max_timestamp, last_offset)
            if batch_position == 0:
                self._rolling_based_timestamp = max_timestamp
                self._rolling_based_loaded = True
            self._max_timestamp_and_offset = current
            self._maybe_index(last_offset, batch_position, size)
            self._maybe_index_extension(base_offset, units)
            batch_position += size
        return position

    def _maybe_index(self, last_offset: int, position: int, size: int) -> None:
        # Checked before counting this batch: the first batch of a segment is never
        # indexed, exactly as Kafka does, so index files are byte-identical to Kafka's.
        if self._bytes_since_last_index_entry > self.index_interval_bytes:
            try:
                self.offset_index.append(last_offset, position)
            except OSError as exc:
                self._index_entry_skipped(self.offset_index, exc)
            else:
                self._bytes_since_last_index_entry = 0
                max_ts = self.max_timestamp_and_offset()
                try:
                    self.time_index.maybe_append(max_ts.timestamp, max_ts.offset)
                except OSError as exc:
                    self._index_entry_skipped(self.time_index, exc)
        self._bytes_since_last_index_entry += size

    def _index_entry_skipped(
        self, index: OffsetIndex | TimeIndex | ExtensionIndex, exc: OSError
    ) -> None:
        # The log bytes are written: failing the append now would leave them there
        # unaccounted for. An index is sparse; a missing entry costs a longer scan.
        if not self._index_entry_skipped_logged:
            self._index_entry_skipped_logged = True
            logger.warning(
                "%s: index entry not written (%s); lookups scan further", index.path, exc
            )

    def _maybe_index_extension(self, base_offset: int, units: int) -> None:
        # An entry marks a batch start once more than ``interval`` units passed since
        # the previous one; entry 0 (the segment start) is written when the segment is
        # created. The end moves after the entry: the entry names the batch's start.
        extension, spec = self.extension, self.extension_spec
        if extension is None or spec is None:
            return
        if self._units_since_last_extension_entry > spec.interval and not extension.is_full:
            try:
                extension.append(base_offset, self.extension_end)
            except OSError as exc:
                self._index_entry_skipped(extension, exc)
            else:
                self._units_since_last_extension_entry = 0
        self._units_since_last_extension_entry += units
        self.extension_end += units

    # -- extension index -----------------------------------------------------------

    def start_extension(self, start_units: int) -> None:
        """Settle a new segment's start units and write its entry 0 (writable only)."""
        if self.extension is None:
            return
        self.extension_start = self.extension_end = start_units
        self._units_since_last_extension_entry = 0
        self.write_extension_entry0()

    @_pinning
    def rebase_extension(self, start_units: int) -> None:
        """Move the segment's extension units so that it starts at ``start_units``:
        every entry and the start and end units shift by the same amount. For a segment
        no reader uses yet (a cleaning pass's ``.cleaned`` one, laid where its records
        now start). Cost: O(index entries)."""
        extension = self.extension
        if extension is None:
            return
        delta = start_units - self.extension_start
        extension.rebase(delta)
        self.extension_start += delta
        self.extension_end += delta

    def write_extension_entry0(self) -> None:
        """Write entry 0 (base offset, start units) if the index lacks it (writable)."""
        extension = self.extension
        if extension is not None and extension.entries == 0 and extension.writable:
            with self.pinned():
                if extension.is_full:
                    # A sealed segment's file cut below one entry (damage): make room
                    # (the engine's trim keeps entry 0, so this is never the normal case).
                    extension.resize(extension.ENTRY_SIZE)
                extension.append(self.base_offset, self.extension_start)

    def load_extension(self, expected_start: int | None) -> bool:
        """Derive the start and end units from the index and the log tail.

        ``expected_start`` is the previous segment's end units (None for the oldest
        segment). Returns False when the index fails its sanity check or disagrees with
        it or with the log (the caller rebuilds it with ``rebuild_extension``). Damage
        in the batches after the last entry is the log's, not the index's: they are
        measured as by ``rebuild_extension`` (``extension_exact`` False).

        Cost: O(log n), then ``measure`` of the batches after the last entry.
        """
        extension, spec = self.extension, self.extension_spec
        if extension is None or spec is None:
            return True
        self._touch()
        try:
            extension.sanity_check()
        except CorruptIndexError:
            return False  # e.g. a file cut inside an entry: rebuilt
        first = extension.first_units
        if first < 0:
            # No entry 0: a new segment, or one starting at 0 (its entry reads as none).
            start = 0 if expected_start is None else expected_start
            if self.size > 0 and start != 0:
                return False
        else:
            start = first
            if expected_start is not None and first != expected_start:
                return False
        last_offset, last_units = extension.last_entry
        if last_units < 0:
            last_offset, last_units = self.base_offset, start
        units = 0
        exact = True
        previous_last_offset = last_offset - 1
        framed_to = -1
        try:
            batches = self.batches_from(last_offset)
            for i, batch in enumerate(batches):
                if i == 0 and last_offset != self.base_offset and batch.base_offset != last_offset:
                    return False  # the last entry does not name a batch start
                framed_to = batch.position + batch.size
                measured = self._units_of(spec, batch, previous_last_offset)
                if measured is None:
                    exact = False
                    continue
                previous_last_offset = batch.last_offset
                units += measured
        except CorruptRecordError:
            # Damaged framing after the last entry: the log's fault, not the index's
            # (a rebuild would measure no further). Reads stop there anyway.
            exact = False
        if self.size > 0 and framed_to != self.size:
            # The scan (``Tail.UNCHECKED``) ended quietly at a batch the file cuts off:
            # a sealed segment cut short (reads raise there), or a writer's append in
            # flight (a reader's active segment, measured again at its next refresh).
            exact = False
        self.extension_start = start
        self.extension_end = last_units + units
        self._units_since_last_extension_entry = units
        self.extension_exact = exact
        return True

    def _units_of(
        self, spec: ExtensionIndexSpec, batch: RecordBatch, previous_last_offset: int
    ) -> int | None:
        """What ``batch`` measures in ``spec``'s units; None for a damaged batch: its
        offsets cannot follow ``previous_last_offset`` here, or its records do not
        decode. Reads raise ``CorruptRecordError`` at such a batch, so what it would
        measure is never needed for a position before it; an index entry naming it
        (maybe by a damaged offset) would break the index's order."""
        if self._misplaced(batch, previous_last_offset) is not None:
            return None
        try:
            return spec.measure(batch)
        except CorruptRecordError:
            return None

    @_pinning
    def rebuild_extension(self, start_units: int) -> None:
        """Rebuild the extension index from the log, starting at ``start_units``.

        A damaged batch (``_units_of``) measures nothing and gets no entry, and damaged
        framing ends the measure: ``extension_exact`` is then False (reads raise at the
        damage whatever the units say; the open of the log must not fail on it).

        No entry names a batch after a damaged one (one that measures nothing or fails
        its CRC) either: the units there are measured on across the damage, so they are
        not known for certain (a batch that measures nothing is counted as 0, one that
        fails its CRC as what its damaged records render to), and an entry would serve
        the bytes after it at guessed positions: a read at the damaged batch's own
        position got the next batch's bytes, and every later position in the segment
        moved (issue 17). Without entries, a read there scans from the last entry
        before the damage and fails there. (The index written at append has those
        entries, with the positions the writer counted: only a rebuild lacks them.)

        Cost: ``measure`` and the CRC of every batch of the segment.
        """
        extension, spec = self.extension, self.extension_spec
        if extension is None or spec is None:
            return
        extension.reset()
        self.start_extension(start_units)
        self.extension_exact = True
        previous_last_offset = self.base_offset - 1
        framed_to = 0
        certain = True  # no damaged batch met yet: the units are the writer's
        try:
            for batch in self.log.batches(0):
                framed_to = batch.position + batch.size
                units = self._units_of(spec, batch, previous_last_offset)
                if units is None:
                    # Damage (reads stop there): no entry names it, and the units after
                    # it are a lower bound. Failing here would fail the open of the log.
                    self.extension_exact = False
                    certain = False
                    continue
                # Where the batch starts for an entry: after the one before at least.
                # A legacy wrapper kafka-python wrote numbers its inner messages from 0
                # (its base offset reads 0 after offset 385: an entry out of order).
                first_offset = max(batch.base_offset, previous_last_offset + 1)
                previous_last_offset = batch.last_offset
                if certain:
                    # An entry may name this batch: the units before it are certain.
                    self._maybe_index_extension(first_offset, units)
                    certain = batch.is_valid()
                else:
                    self._units_since_last_extension_entry += units
                    self.extension_end += units
        except CorruptRecordError:
            self.extension_exact = False  # the bytes stop framing: nothing more to measure
        if framed_to != self.size:
            self.extension_exact = False  # cut off (see ``load_extension``)
        extension.trim_to_valid_size()

    def extension_floor_by_units(self, units: int) -> tuple[int, int]:
        """(batch start offset, units before it) of the last entry at or below ``units``;
        the segment start when there is none. Cost: O(log n)."""
        return self._extension_floor(ExtensionIndex.floor_by_units, units)

    def extension_floor_by_offset(self, offset: int) -> tuple[int, int]:
        """(batch start offset, units before it) of the last entry at or below ``offset``;
        the segment start when there is none. Cost: O(log n)."""
        return self._extension_floor(ExtensionIndex.floor_by_offset, offset)

    def _extension_floor(
        self, lookup: Callable[[ExtensionIndex, int], tuple[int, int] | None], key: int
    ) -> tuple[int, int]:
        self._touch()
        try:
            found = None if self.extension is None else lookup(self.extension, key)
        except ValueError:
            # The index was closed: the segment was deleted (or the log closed).
            raise SegmentDeletedError(self.path) from None
        return found if found is not None else (self.base_offset, self.extension_start)

    def indexes(self) -> tuple[OffsetIndex | TimeIndex | ExtensionIndex, ...]:
        """The segment's index files: offset, time, and the extension index if any."""
        if self.extension is None:
            return (self.offset_index, self.time_index)
        return (self.offset_index, self.time_index, self.extension)

    # -- reading ---------------------------------------------------------------------

    def batches_from(
        self, offset: int, starting_position: int = 0, *, tail: Tail = Tail.UNCHECKED
    ) -> Iterator[RecordBatch]:
        """The batches from the one holding ``offset`` (or the first after it) on.

        ``tail``: what a batch cut off by the end of the file is (``Tail``; the log
        passes ``SEALED`` or ``ACTIVE`` for reads).

        Cost: O(log n) index lookup, then a scan of about ``index.interval.bytes``
        before the first batch (of the whole segment when the index entry proves wrong).

        Raises:
            CorruptRecordError: an impossible batch header, or damage (see ``Tail``).
            SegmentDeletedError: the segment was closed (deleted, or the log closed).
        """
        self._touch()
        indexed_offset, position = self._offset_lookup(offset)
        indexed = self._indexed_position(tail)
        if starting_position < position < self.size:
            scan = self.log.batches_from_entry(
                offset,
                position,
                indexed_offset,
                starting_position,
                tail=tail,
                indexed_position=indexed,
            )
            scan_start = position
        else:
            scan = _from_offset(
                offset, self.log.batches(starting_position, tail=tail, indexed_position=indexed)
            )
            scan_start = starting_position
        return self._then_hole(self._blaming_skipped(scan, scan_start, tail), offset, tail)

    def _blaming_skipped(
        self, scan: Iterator[RecordBatch], scan_start: int, tail: Tail
    ) -> Iterator[RecordBatch]:
        """``scan``, but when its framing fails before it yields a batch, and the batch
        it passed over last (below the offset wanted: not read, its CRC not checked)
        ends right there and fails its CRC, the error names that batch: a damaged
        length that still fits the segment frames garbage after it, and a read that
        starts past the damaged batch would otherwise report (and the daemon log) a
        second place, inside the batch's true bytes, for the same damage (issue 17).

        Cost: nothing until the error; then one scan from ``scan_start`` to it.
        """
        try:
            first = next(scan, None)
        except CorruptRecordError as exc:
            if exc.position <= scan_start:
                raise
            culprit = self._damaged_batch_ending_at(scan_start, exc.position, tail)
            if culprit is None:
                raise
            raise CorruptRecordError("CRC mismatch", self.path, culprit.position) from exc
        if first is None:
            return
        yield first
        # The batches yielded are checked by their reader (``Log.batches``): nothing to
        # blame after the first.
        yield from scan

    def _damaged_batch_ending_at(self, start: int, end: int, tail: Tail) -> RecordBatch | None:
        # The batch framed from ``start`` that ends at ``end``, if it fails its CRC.
        indexed = self._indexed_position(tail)
        try:
            for batch in self.log.batches(start, tail=tail, indexed_position=indexed):
                batch_end = batch.position + batch.size
                if batch_end >= end:
                    return batch if batch_end == end and not batch.is_valid() else None
        except CorruptRecordError:
            return None
        return None

    def _indexed_position(self, tail: Tail) -> int:
        # A reader's evidence that the writer is past a position (``Tail.ACTIVE``): the
        # offset index names a batch only once it is written whole.
        if tail is not Tail.ACTIVE or self.log.writable:
            return 0
        index = self.offset_index
        try:
            return index.entry(index.entries - 1)[1] if index.entries else 0
        except (IndexError, ValueError):
            return 0  # closed or refreshed meanwhile: no evidence

    def resume_after(self, position: int, tail: Tail) -> tuple[int, int] | None:
        """``(position, base offset)`` of the first batch after the damaged bytes at
        ``position`` that a scan can frame again: one an offset-index entry names, that
        is there and ends at the entry's offset. None when no entry after ``position``
        proves right (the rest of the segment cannot be framed).

        Cost: O(log n) to find the entry, one short read per entry tried.
        """
        self._touch()
        index = self.offset_index
        try:
            first = index.first_entry_after(position)
            entries = index.entries
        except ValueError:
            raise SegmentDeletedError(self.path) from None
        for n in range(first, entries):
            try:
                offset, entry_position = index.entry(n)
            except (IndexError, ValueError):
                return None
            try:
                batch = next(self.log.batches(entry_position, tail=tail), None)
            except CorruptRecordError:
                continue
            if batch is not None and batch.last_offset == offset:
                return entry_position, batch.base_offset
        return None

    def _offset_lookup(self, offset: int) -> tuple[int, int]:
        try:
            return self.offset_index.lookup(offset)
        except ValueError:
            # The index was closed: the segment was deleted (or the log closed).
            raise SegmentDeletedError(self.path) from None

    def translate_offset(
        self, offset: int, starting_position: int = 0, *, tail: Tail = Tail.UNCHECKED
    ) -> OffsetPosition | None:
        """Where the batch holding ``offset`` (or the first after it) starts.

        Cost and errors: as ``batches_from``.
        """
        batch = next(self.batches_from(offset, starting_position, tail=tail), None)
        if batch is None:
            return None
        return OffsetPosition(batch.last_offset, batch.position, batch.size)

    def batches(
        self, start_position: int = 0, *, tail: Tail = Tail.UNCHECKED
    ) -> Iterator[RecordBatch]:
        """The batches from file position ``start_position`` on (``tail``: see ``Tail``)."""
        self._touch()
        scan = self.log.batches(
            start_position, tail=tail, indexed_position=self._indexed_position(tail)
        )
        return self._then_hole(scan, -1, tail)

    def _then_hole(
        self, scan: Iterator[RecordBatch], offset: int, tail: Tail
    ) -> Iterator[RecordBatch]:
        # The scan, then, when a hole of missing offsets follows this sealed segment
        # (``missing_after``), the error a read meets there: the read that runs out of
        # this segment below the next one's base offset would otherwise skip the hole.
        missing_after = self.missing_after
        if missing_after is None or tail is not Tail.SEALED:
            return scan
        return self._scan_then_hole(scan, offset, missing_after)

    def _scan_then_hole(
        self, scan: Iterator[RecordBatch], offset: int, missing_after: int
    ) -> Iterator[RecordBatch]:
        end = offset
        for batch in scan:
            end = max(end, batch.next_offset)
            yield batch
        if 0 <= end < missing_after:
            raise CorruptRecordError(
                f"offsets {end}..{missing_after - 1} are in no segment file (the segment "
                "after this one is missing)",
                self.path,
                self.size,
                offset=end,
            )

    def read_next_offset(self) -> int:
        """The offset after the last complete batch (``base_offset`` when empty).

        Cost: O(log n) for the last index entry, then a scan of the tail after it.
        """
        self._touch()
        _last_offset, position = self._offset_lookup(2**63 - 1)
        if not 0 <= position < self.size:
            # The entry names a batch past the valid data (a reader's view of a crashed
            # log hides an invalid tail the on-disk index still covers), or is garbage
            # (a negative position made ``pread`` fail with EINVAL): scan it all.
            position = 0
        next_offset = self.base_offset
        for batch in self.log.batches(position):
            next_offset = batch.next_offset
        return next_offset

    def find_offset_by_timestamp(
        self, timestamp: int, starting_offset: int, *, tail: Tail = Tail.UNCHECKED
    ) -> TimestampAndOffset | None:
        """The first record with timestamp >= ``timestamp`` and offset >= ``starting_offset``.

        Checks the CRC of each batch it scans, not that their offsets follow one another
        or the holes after the segment: ``Log.offset_for_timestamp`` reads through
        ``Log.batches``, which does.

        Cost: O(log n) in both indexes, then a scan from the indexed position (from
        the segment start when the time-index entry proves wrong).

        Raises:
            CorruptRecordError: a batch scanned fails its CRC, or damage (``Tail``).
            SegmentDeletedError: the segment was closed (deleted, or the log closed).
        """
        offset = self.timestamp_scan_start(timestamp)
        found = self.translate_offset(max(offset, starting_offset), tail=tail)
        if found is None:
            return None
        return self.log.search_for_timestamp(
            timestamp,
            found.position,
            starting_offset,
            tail=tail,
            indexed_position=self._indexed_position(tail),
        )

    def timestamp_scan_start(self, timestamp: int) -> int:
        """Where a search of the segment for the first record at or after ``timestamp``
        starts: the offset of the time-index entry at or below it (every record of the
        batches before the one holding it is older), checked against the batch it names;
        the base offset when there is none or it proves wrong. The search scans from the
        batch holding it, that batch's records before it included.

        Cost: O(log n) in the time index, one short scan to check the entry.

        Raises:
            CorruptRecordError: the scan to the entry's batch meets damage.
            SegmentDeletedError: the segment was closed (deleted, or the log closed).
        """
        self._touch()
        try:
            indexed_timestamp, offset = self.time_index.lookup(timestamp)
        except ValueError:
            raise SegmentDeletedError(self.path) from None
        if offset != self.base_offset and not self._time_entry_matches(indexed_timestamp, offset):
            logger.warning(
                "%s: ignoring wrong time index entry (%d, %d)", self.path, indexed_timestamp, offset
            )
            return self.base_offset
        return offset

    def hole_after_error(self) -> CorruptRecordError | None:
        """The error a read meets at the end of this sealed segment when offsets after
        it are in no segment file (``missing_after``: a segment missing from the middle);
        None when there is no such hole. A search by time that passes over this segment
        (its records are all older) must not pass over the missing ones in silence."""
        missing_after = self.missing_after
        if missing_after is None:
            return None
        end = self.read_next_offset()
        if end >= missing_after:
            return None
        return CorruptRecordError(
            f"offsets {end}..{missing_after - 1} are in no segment file (the segment "
            "after this one is missing)",
            self.path,
            self.size,
            offset=end,
        )

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
        self._touch()
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
        self._touch()
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

    def recover(
        self,
        *,
        rebuild_indexes: bool = True,
        extension_start: int | None = None,
        end_offset: int | None = None,
    ) -> int:
        """Re-validate every batch and cut the log after the last valid one; return
        the number of bytes cut (Kafka's ``LogSegment.recover``). See ``recover_tail``."""
        found = self.recover_tail(
            rebuild_indexes=rebuild_indexes, extension_start=extension_start, end_offset=end_offset
        )
        return found.size - found.valid_bytes

    @_pinning
    def recover_tail(
        self,
        *,
        rebuild_indexes: bool = True,
        extension_start: int | None = None,
        end_offset: int | None = None,
        confirm_last_gap: bool = False,
    ) -> Revalidation:
        """Re-validate every batch and cut the log after the last valid one; return
        what the scan found (the cut: from ``valid_bytes`` to ``size``).

        A batch is invalid when its header is impossible (size, magic), its CRC does
        not match, its offsets go backwards, start below the segment's base offset,
        reach ``end_offset`` (the next segment's base offset, None for the active
        segment) or leave its 32-bit relative range, when (legacy formats) it does not
        decode, or when a v2 batch starts past the offset after the batch before it (a
        gap, which only compaction makes) and the next batch starts inside its offsets
        (``gap_disproved``): the base offset is not covered by the CRC, so a bit
        flipped there passes every other check (Kafka's ``recover`` checks the CRC and
        the relative range only, and splits a segment whose base offset was damaged
        out of that range as an overflow). With ``confirm_last_gap`` (the active
        segment after an unclean shutdown: recovery keeps only what it can verify) a
        last batch after a gap is invalid too: no batch after it can confirm its base
        offset (a log copied with gaps, ``Log.append_batches``, copies it again, as a
        Kafka follower fetches what its recovery truncated). A partial batch at the end
        is cut as well.
        With ``rebuild_indexes`` the indexes are rebuilt from the log on the
        way and, as Kafka does, the time index ends with the segment's (max timestamp,
        offset) entry; without it (a reader that found plausible indexes) they are
        kept, since an entry never points past a valid batch. A read-only segment's
        "cut" only hides the tail from its readers. The extension index is rebuilt from
        ``extension_start`` (default: its own entry 0, else 0).

        Only recovery of the unflushed tail cuts (the loader, for segments at or after
        the recovery point and a damaged active segment): anywhere else a cut would
        lose the valid batches after the damage for good (see ``rebuild_indexes``).

        Cost: one read of the segment, a CRC per batch up to the damage.
        """
        start_units = extension_start
        if start_units is None:
            first = self.extension.first_units if self.extension is not None else -1
            start_units = max(first, 0)
        found = self._revalidate(
            rebuild_indexes=rebuild_indexes,
            past_damage=False,
            end_offset=end_offset,
            confirm_last_gap=confirm_last_gap,
        )
        self.log.truncate_to(found.valid_bytes)
        if rebuild_indexes:
            self._seal_rebuilt_indexes()
        if self.extension is not None and self.extension.writable:
            self.rebuild_extension(start_units)
        elif self.extension is not None:
            self.load_extension(extension_start)
        return found

    @_pinning
    def rebuild_indexes(self, *, end_offset: int | None = None) -> Revalidation:
        """Rebuild the offset and time indexes from the log without cutting it.

        What the loader does for a segment whose data is final (sealed, or below the
        recovery point) but whose indexes are missing: every valid batch is indexed;
        a damaged one stays where it is, unindexed, and reads that reach it raise
        ``CorruptRecordError`` as before (a cut would lose the valid batches after it
        for good, and offsets a reader may already have seen). The scan goes on after
        a batch that fails its CRC (or whose offsets go back) and stops where the bytes
        no longer frame as batches. Batches are judged as by ``recover_tail``, except
        that the first valid batch after a damaged one may start past the offsets
        before it (the damaged batch held them). The extension index is left to the
        caller.

        Cost: one read of the segment, a CRC per batch.
        """
        found = self._revalidate(rebuild_indexes=True, past_damage=True, end_offset=end_offset)
        self._seal_rebuilt_indexes()
        return found

    def _seal_rebuilt_indexes(self) -> None:
        self.offset_index.trim_to_valid_size()
        self._append_final_time_entry()
        self.time_index.trim_to_valid_size()

    def _revalidate(
        self,
        *,
        rebuild_indexes: bool,
        past_damage: bool,
        end_offset: int | None,
        confirm_last_gap: bool = False,
    ) -> Revalidation:
        # Re-validate from byte 0 (``recover``, ``rebuild_indexes``). Valid batches
        # settle the facts loaded lazily otherwise (max timestamp, first timestamp) and,
        # with ``rebuild_indexes``, get their index entries. The first damage ends the
        # valid prefix; after it the scan only frames headers, to say which offsets lie
        # beyond (``past_damage``: and validates and indexes the valid batches there).
        if rebuild_indexes:
            self.offset_index.reset()
            self.time_index.reset()
        self._bytes_since_last_index_entry = 0
        self._max_timestamp_and_offset = TimestampAndOffset(-1, -1)
        self._rolling_based_timestamp = None
        self._rolling_based_loaded = True
        valid_bytes = 0
        next_offset = self.base_offset
        damage: Damage | None = None
        last_framed = self.base_offset - 1
        framed_to = 0
        previous_last_offset = self.base_offset - 1
        # A batch after a gap of offsets waits for the next batch to confirm it (its
        # base offset is outside the CRC); right after a damaged batch a gap is no
        # evidence of anything: that batch held the offsets (``past_damage``).
        pending: RecordBatch | None = None
        gap_allowed = False

        def accept(batch: RecordBatch) -> None:
            nonlocal previous_last_offset, valid_bytes, next_offset, gap_allowed
            gap_allowed = False
            previous_last_offset = batch.last_offset
            if self._rolling_based_timestamp is None:
                self._rolling_based_timestamp = batch.max_timestamp
            known = self._max_timestamp_and_offset
            if known is None or batch.max_timestamp > known.timestamp:
                self._max_timestamp_and_offset = TimestampAndOffset(
                    batch.max_timestamp, batch.last_offset
                )
            if rebuild_indexes:
                self._maybe_index(batch.last_offset, batch.position, batch.size)
            if damage is None:
                valid_bytes = batch.position + batch.size
                next_offset = batch.next_offset

        def reject(batch: RecordBatch, problem: str, offsets_trusted: bool) -> None:
            # The first offset not served: the batch's own base offset only when its
            # offsets passed (it is outside the CRC).
            nonlocal damage, gap_allowed
            gap_allowed = True
            if damage is None:
                offset = max(batch.base_offset, next_offset) if offsets_trusted else next_offset
                damage = Damage(batch.position, offset, problem)

        def settle_pending(after: RecordBatch | None) -> None:
            # ``after``: the next framed batch (None: there is none).
            nonlocal pending
            batch, pending = pending, None
            if batch is None:
                return
            problem = gap_disproved(batch, previous_last_offset, after, end_offset)
            if problem is None and after is None and confirm_last_gap:
                problem = (
                    f"offsets {batch.base_offset}..{batch.last_offset} leave out offsets "
                    f"{previous_last_offset + 1}..{batch.base_offset - 1} and no batch "
                    "after them confirms it (a damaged base offset?)"
                )
            if problem is None:
                accept(batch)
            else:
                reject(batch, problem, offsets_trusted=False)

        try:
            for batch in self.log.batches(0):
                settle_pending(batch)
                framed_to = batch.position + batch.size
                last_offset = batch.last_offset
                last_framed = max(last_framed, last_offset)
                if damage is not None and not past_damage:
                    continue
                problem = self._invalid(batch, previous_last_offset)
                if problem is not None:
                    trusted = self._misplaced(batch, previous_last_offset) is None
                    reject(batch, problem, offsets_trusted=trusted)
                elif (
                    not gap_allowed
                    and batch.magic >= 2
                    and batch.base_offset > previous_last_offset + 1
                ):
                    pending = batch
                else:
                    accept(batch)
        except CorruptRecordError as exc:
            settle_pending(None)
            if damage is None:
                damage = Damage(framed_to, next_offset, exc.reason)
        settle_pending(None)
        size = self.size
        if damage is None and framed_to < size:
            reason = f"{size - framed_to} bytes do not frame a batch"
            damage = Damage(framed_to, next_offset, reason)
        return Revalidation(valid_bytes, next_offset, size, damage, last_framed, framed_to)

    def _invalid(self, batch: RecordBatch, previous_last_offset: int) -> str | None:
        # Why a framed batch cannot be served (None: it can, unless a gap before it is
        # disproved: ``gap_disproved``).
        if not batch.is_valid():
            return "CRC mismatch"
        misplaced = self._misplaced(batch, previous_last_offset)
        if misplaced is not None:
            return misplaced
        if batch.magic < 2:
            # Legacy entries are whole messages; decode to prove they parse.
            try:
                batch.records()
            except CorruptRecordError as exc:
                return exc.reason
        return None

    def _misplaced(self, batch: RecordBatch, previous_last_offset: int) -> str | None:
        # Why a batch's offsets cannot follow ``previous_last_offset`` in this segment
        # (None: they can); see ``recover_tail``. Legacy entries: the last offset only
        # (a compressed wrapper's first costs a decompression).
        last_offset = batch.last_offset
        if last_offset <= previous_last_offset:
            return f"offsets up to {last_offset} go back (after offset {previous_last_offset})"
        if not self.can_convert_to_relative_offset(last_offset):
            return f"offset {last_offset} does not fit 32 bits relative to the segment"
        if batch.magic < 2:
            return None
        base_offset = batch.base_offset
        if base_offset <= previous_last_offset or base_offset > last_offset:
            return f"offsets {base_offset}..{last_offset} go back (after {previous_last_offset})"
        return None

    def _append_final_time_entry(self) -> None:
        # Kafka appends the segment's (max timestamp, offset) on close, roll and
        # recovery, even into the slot ``is_full`` keeps in reserve for it.
        max_ts = self.max_timestamp_and_offset()
        if max_ts.timestamp >= 0:
            self.time_index.maybe_append(max_ts.timestamp, max_ts.offset, skip_full_check=True)

    @_pinning
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
            self._rolling_based_loaded = False
        if self.extension is not None:
            # Entries name batch starts: those at or past the new end went with the cut.
            self.extension.truncate_to(self.read_next_offset())
            self.write_extension_entry0()
            self.load_extension(None)
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
            or (self.extension is not None and self.extension.is_full)
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

    @_pinning
    def on_becoming_inactive(self) -> None:
        """Seal the segment on roll: final time-index entry, indexes trimmed to size.

        Neither step opens a descriptor (the entry goes into the mapping, the trim is
        ``resize``'s). Each is tried even when another fails; an index that could not
        get its entry or be trimmed is still whole (a hint, as Kafka's ``close`` treats
        it).

        Raises:
            StorageError, OSError: the first step that failed.
        """
        failures: list[StorageError | OSError] = []
        try:
            self._append_final_time_entry()
        except (StorageError, OSError) as exc:
            failures.append(exc)
        for index in self.indexes():
            try:
                index.trim_to_valid_size()
            except OSError as exc:
                failures.append(exc)
        if failures:
            raise failures[0]

    @_pinning
    def flush_log(self) -> None:
        """fsync the ``.log`` alone (a roll's, before it seals the segment)."""
        self.log.flush()

    @_pinning
    def flush(self) -> None:
        """fsync the log, then the indexes (log first: indexes are rebuildable)."""
        self.log.flush()
        for index in self.indexes():
            index.flush()

    def change_file_suffixes(self, old_suffix: str, new_suffix: str) -> None:
        """Rename all three files, e.g. to ``.deleted`` before asynchronous removal.

        Open descriptors stay valid, so readers in the middle of a read finish it.
        """
        parts: tuple[_SegmentFile, ...] = (self.log, *self.indexes())
        for part in parts:
            renamed = part.path.with_name(part.path.name.removesuffix(old_suffix) + new_suffix)
            with contextlib.suppress(FileNotFoundError):
                part.rename_to(renamed)

    def close(self) -> None:
        """Close files for good. A writable segment first gets Kafka's final time-index
        entry (its max timestamp) and its indexes are trimmed, so closed files equal
        Kafka's. As Kafka's ``LogSegment.close``, the entry is appended only when the
        max timestamp is known (the segment was appended to, recovered or read since it
        was opened; otherwise the files already hold it): closing a log of many
        segments opens none of the released ones again (their indexes are trimmed)."""
        try:
            # Only the owner seals its segment; a reader's writable indexes are scratch
            # copies (deleted with the log), maybe trimmed to their entries already.
            if (
                self.log.writable
                and self.time_index.writable
                and not self.time_index.closed
                and self._max_timestamp_and_offset is not None
            ):
                try:
                    self._append_final_time_entry()
                except (StorageError, OSError) as exc:
                    # Kafka swallows this too: the index is a hint, rebuilt if wrong.
                    logger.warning("%s: no final time-index entry: %s", self.path, exc)
            with contextlib.suppress(CorruptIndexError):
                for index in self.indexes():
                    index.close()
        finally:
            self.close_handlers()

    def close_handlers(self) -> None:
        """Release file handles without touching the files (after rename to .deleted),
        for good: the segment never opens its files again."""
        try:
            for index in self.indexes():
                index.close_handler()
            self.log.close()
        finally:
            self.open_segments.discard(self)

    def delete_if_exists(self) -> None:
        self.close_handlers()
        for path in (self.log.path, *(index.path for index in self.indexes())):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def __repr__(self) -> str:
        return f"LogSegment(base_offset={self.base_offset}, size={self.size})"

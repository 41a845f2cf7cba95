"""One more sparse index per segment, of a cumulative size the caller defines.

The engine keeps it in step with the segment's life exactly as it keeps ``.index`` and
``.timeindex``: created with the segment, fed on append, trimmed on roll and close,
truncated with the log, renamed to ``.deleted`` and removed with the segment, rebuilt
from the ``.log`` when missing or wrong. What the size *means* is the caller's business
(the file system counts rendered bytes, so that a byte position in a partition file
finds its record); the engine only adds up what ``ExtensionIndexSpec.measure`` says of
each batch, or what the appender passes.

The "units" of a record are fixed when it is appended: the cumulative count at a batch
start never changes afterwards. Retention removes whole segments from the front, so the
units of every retained record stay what they were (they do not restart at 0).
"""

from __future__ import annotations

import itertools
import mmap
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from ..errors import CorruptIndexError, InvalidOffsetError
from ..record.record_batch import RecordBatch
from .index import AbstractIndex

__all__ = ["ExtensionIndex", "ExtensionIndexSpec"]

_ENTRY = struct.Struct(">qi")
_INT64 = struct.Struct(">q")
_INT32 = struct.Struct(">i")


@dataclass(frozen=True)
class ExtensionIndexSpec:
    """What a caller plugs into a log to get an extension index.

    Attributes:
        suffix: the index file's suffix, after the 20-digit base offset. It must be a
            name Kafka never uses (Kafka ignores such files), start with ``.`` and not
            be one of the engine's own suffixes.
        interval: a new entry once more than this many units were appended since the
            last one (the first batch of a segment is always entry 0).
        measure: the units of one batch. The engine calls it to rebuild an index and
            for appends whose caller does not pass the units; it must be a pure
            function of the batch bytes, or rebuilt indexes would disagree.
        partition_measure: when the units also depend on the partition number (a
            rendering that names it in every record), ``partition_measure(p)`` is
            partition ``p``'s ``measure``; ``LogManager`` opens each log with
            ``for_partition(p)``. ``measure`` is then the rest's (partition 0's).
    """

    suffix: str
    interval: int
    measure: Callable[[RecordBatch], int]
    partition_measure: Callable[[int], Callable[[RecordBatch], int]] | None = None

    def __post_init__(self) -> None:
        from .file_names import ENGINE_FILE_SUFFIXES

        if not self.suffix.startswith(".") or len(self.suffix) < 2 or "/" in self.suffix:
            raise ValueError(f"extension index suffix {self.suffix!r} must look like '.name'")
        if self.suffix in ENGINE_FILE_SUFFIXES:
            raise ValueError(f"extension index suffix {self.suffix!r} is the engine's own")
        if self.interval < 0:
            raise ValueError(f"extension index interval must be >= 0, not {self.interval}")

    def for_partition(self, partition: int) -> ExtensionIndexSpec:
        """The spec of ``partition``'s log: this one unless ``partition_measure`` is set.
        Cost: O(1)."""
        if self.partition_measure is None:
            return self
        return ExtensionIndexSpec(self.suffix, self.interval, self.partition_measure(partition))

    @property
    def start_checkpoint_name(self) -> str:
        """The file, in the partition directory, that checkpoints the units at the start
        of the oldest retained segment (``checkpoint.read_extension_start_checkpoint``).

        ``<suffix without its dot>-start-checkpoint``: a name Kafka never uses (its
        partition files are ``leader-epoch-checkpoint`` and ``partition.metadata``) and
        that does not end with the index suffix, so it is never taken for an index.
        """
        return f"{self.suffix[1:]}-start-checkpoint"


class ExtensionIndex(AbstractIndex):
    """Cumulative units -> offset at some batch starts of one segment.

    Byte layout: 12-byte entries, big-endian::

        int64 units            cumulative units before the batch, non-decreasing
        int32 relativeOffset   the batch's base offset - segment base offset, increasing

    Entry 0 is written when the segment is created: (units at the segment start, 0).
    Later entries come at batch starts once more than ``interval`` units were appended
    since the previous entry. Two lookups: by units (``floor_by_units``, what a byte
    position needs) and by offset (``floor_by_offset``); both return an entry to scan
    forward from with the segment's batches.

    Valid prefix and crash safety as ``AbstractIndex``: units are written before the
    relative offset, so an entry whose offset is not written yet reads as absent (a
    zero relative offset past slot 0 ends the prefix). A segment starting at units 0
    has an all-zero entry 0, which reads as "no entries"; the segment then answers
    its start units from ``start_units`` (see ``LogSegment``), which is 0 there too.

    Costs: lookups O(log n), ``append`` O(1). Not thread-safe for mutation: one writer;
    readers of the same instance only ever see whole entries (see ``AbstractIndex``).
    """

    ENTRY_SIZE: ClassVar[int] = 12
    REL_OFFSET_POS: ClassVar[int] = 8

    _last_entry: tuple[int, int]

    def _entries_changed(self, buf: mmap.mmap | bytes) -> None:
        n = self._entries
        if n:
            units, relative = _ENTRY.unpack_from(buf, (n - 1) * 12)
            self._last_entry = (self._base_offset + relative, units)
        else:
            self._last_entry = (self._base_offset, -1)

    @property
    def last_entry(self) -> tuple[int, int]:
        """The (offset, units) of the last entry; ``(base_offset, -1)`` when empty."""
        return self._last_entry

    @property
    def first_units(self) -> int:
        """The units of entry 0 (the segment start); -1 when the index is empty."""
        self._require_open()
        if not self._entries:
            return -1
        units: int = _INT64.unpack_from(self._mapped(), 0)[0]
        return units

    def floor_by_units(self, units: int) -> tuple[int, int] | None:
        """The (offset, units) of the last entry whose units are <= ``units``.

        None when there is none (empty index, or ``units`` before entry 0).

        Raises:
            ValueError: the index is closed.

        Runtime complexity: O(log n).
        """
        self._require_open()
        found = self._floor_entry(units, _INT64, 0, _ENTRY)
        if found is None:
            return None
        found_units, relative = found
        return self._base_offset + relative, found_units

    def floor_by_offset(self, offset: int) -> tuple[int, int] | None:
        """The (offset, units) of the last entry whose offset is <= ``offset``.

        None when there is none.

        Raises:
            ValueError: the index is closed.

        Runtime complexity: O(log n).
        """
        self._require_open()
        found = self._floor_entry(offset - self._base_offset, _INT32, 8, _ENTRY)
        if found is None:
            return None
        units, relative = found
        return self._base_offset + relative, units

    def entry(self, n: int) -> tuple[int, int]:
        """The (offset, units) of the ``n``-th entry.

        Raises:
            IndexError: ``n`` is not in ``[0, entries)``.
            ValueError: the index is closed.
        """
        self._require_open()
        if not 0 <= n < self._entries:
            raise IndexError(f"entry {n} requested from {self._path} of {self._entries} entries")
        units, relative = _ENTRY.unpack_from(self._mapped(), n * 12)
        return self._base_offset + relative, units

    def append(self, offset: int, units: int) -> None:
        """Append (``offset``, ``units``): a batch starting at ``offset`` after ``units``.

        Entry 0 must name the base offset; later offsets increase and units do not
        decrease.

        Raises:
            IndexFullError: no free slot (the log rolls on ``is_full`` first).
            InvalidOffsetError: the entry breaks the ordering, or the offset does not
                fit an int32 relative offset.
            ReadOnlyLogError: the index is read-only.
            ValueError: the index is closed.
            OSError: ``ENOSPC``: no block for a new page of the file (nothing written).

        Runtime complexity: O(1).
        """
        n = self._free_slot()
        last_offset, last_units = self._last_entry
        if n == 0 and offset != self._base_offset:
            raise InvalidOffsetError(
                f"entry 0 of {self._path} must name the base offset {self._base_offset}, "
                f"not {offset}"
            )
        if n and (offset <= last_offset or units < last_units):
            raise InvalidOffsetError(
                f"entry ({offset}, {units}) does not follow ({last_offset}, {last_units}) "
                f"in {self._path}"
            )
        relative = self._require_relative_offset(offset)
        self._ensure_allocated(n * 12 + 12)
        buf = self._writable_map()
        # Units first, relative offset last: see the class doc.
        _INT64.pack_into(buf, n * 12, units)
        _INT32.pack_into(buf, n * 12 + 8, relative)
        self._entries = n + 1
        self._last_entry = (offset, units)

    def rebase(self, delta: int) -> None:
        """Add ``delta`` to the units of every entry: the segment's records move by
        ``delta`` in the caller's units (a cleaning pass lays a cleaned segment where
        its records now start, before the segment is published).

        Only for an index no reader uses yet: the entries are rewritten one by one.
        Entry 0 last, so a crash part way leaves units that go down after entry 0
        (``sanity_check`` fails: rebuilt) or an entry 0 out of step with the segment
        before it (rebuilt too), never a plausible index with wrong units.

        Raises:
            ReadOnlyLogError: the index is read-only.
            ValueError: the index is closed, or ``delta`` would make units negative.

        Runtime complexity: O(entries).
        """
        self._require_open()
        n = self._entries
        if not delta or not n:
            return
        buf = self._writable_map()
        first: int = _INT64.unpack_from(buf, 0)[0]
        if first + delta < 0:
            raise ValueError(f"rebase of {self._path} by {delta} makes units negative")
        for slot in (*range(1, n), 0):
            units: int = _INT64.unpack_from(buf, slot * 12)[0]
            _INT64.pack_into(buf, slot * 12, units + delta)
        offset, units = self._last_entry
        self._last_entry = (offset, units + delta)

    def sanity_check(self) -> None:
        """Raise if the file is obviously corrupt (the checks Kafka makes of its indexes).

        Corrupt when entry 0 does not name the base offset, units go down from the
        first to the last entry, the last offset is below the base offset, or the file
        size is not a multiple of 12.

        Raises:
            CorruptIndexError: rebuild the index from the log.
        """
        last_offset, last_units = self._last_entry
        self._check_sanity(last_offset)
        if not self._entries:
            return
        first_units, first_relative = _ENTRY.unpack_from(self._mapped(), 0)
        if first_relative != 0:
            raise CorruptIndexError(self._path, "entry 0 does not name the base offset")
        if first_units < 0 or last_units < first_units:
            raise CorruptIndexError(self._path, f"units go from {first_units} down to {last_units}")

    def _check(self) -> None:
        self._check_common()
        buf = self._buf
        if self._closed or buf is None:
            return
        entries = [_ENTRY.unpack_from(buf, slot * 12) for slot in range(self._entries)]
        units = [u for u, _ in entries]
        relatives = [r for _, r in entries]
        assert all(u >= 0 for u in units), units
        assert all(a <= b for a, b in itertools.pairwise(units)), units
        assert not relatives or relatives[0] == 0, relatives
        assert all(a < b for a, b in itertools.pairwise(relatives)), relatives
        expected = (
            (self._base_offset + entries[-1][1], entries[-1][0])
            if entries
            else (self._base_offset, -1)
        )
        assert self._last_entry == expected, (self._last_entry, expected)

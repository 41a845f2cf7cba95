"""The ``.index`` file: a sparse map from offsets to byte positions in the segment's log."""

from __future__ import annotations

import itertools
import mmap
import struct
from typing import ClassVar

from ..errors import InvalidOffsetError
from .index import AbstractIndex

__all__ = ["OffsetIndex"]

_ENTRY = struct.Struct(">ii")
_INT32 = struct.Struct(">i")


class OffsetIndex(AbstractIndex):
    """Offset -> position in the ``.log`` for some batches of one segment (Kafka's ``OffsetIndex``).

    Byte layout: 8-byte entries, big-endian::

        int32 relativeOffset   offset - base_offset, strictly increasing
        int32 position         byte of the batch start in the .log file

    The log appends an entry when more than ``index.interval.bytes`` were appended since
    the last one, keyed by the batch's last offset; the first batch is never indexed.
    ``lookup`` finds the largest entry <= a target and the log scans forward from it.

    The relative offset is written before the position: a reader that catches an entry
    half-written sees position 0, the segment start, which is still a valid place to
    scan from (and a zero relative offset ends the valid prefix; see ``AbstractIndex``).

    Costs: ``lookup`` and ``truncate_to`` O(log n); ``append``, ``entry`` and
    ``last_offset`` O(1). Not thread-safe: one writer, or one read-only instance per
    reader (see ``AbstractIndex``).
    """

    ENTRY_SIZE: ClassVar[int] = 8
    REL_OFFSET_POS: ClassVar[int] = 0

    _last_offset: int

    def _entries_changed(self, buf: mmap.mmap | bytes) -> None:
        n = self._entries
        self._last_offset = (
            self._base_offset + _INT32.unpack_from(buf, (n - 1) * 8)[0] if n else self._base_offset
        )

    @property
    def last_offset(self) -> int:
        """The offset of the last entry; ``base_offset`` when the index is empty."""
        return self._last_offset

    def lookup(self, target_offset: int) -> tuple[int, int]:
        """The (offset, position) of the largest entry whose offset is <= ``target_offset``.

        Returns ``(base_offset, 0)`` when there is none (empty index, or a target
        before the first entry): scanning from the segment start is always correct.

        Raises:
            ValueError: the index is closed.

        Runtime complexity: O(log n).
        """
        self._require_open()
        base = self._base_offset
        found = self._floor_entry(target_offset - base, _INT32, 0, _ENTRY)
        if found is None:
            return base, 0
        relative, position = found
        return base + relative, position

    def first_entry_after(self, position: int) -> int:
        """The number of the first entry whose position is past ``position``
        (``entries`` when there is none): where a scan can frame batches again after
        damaged bytes at ``position``. Positions increase with offsets.

        Raises:
            ValueError: the index is closed.

        Runtime complexity: O(log n).
        """
        self._require_open()
        return self._largest_lower_bound_slot(position, _INT32, 4) + 1

    def entry(self, n: int) -> tuple[int, int]:
        """The (offset, position) of the ``n``-th entry.

        Raises:
            IndexError: ``n`` is not in ``[0, entries)``.
            ValueError: the index is closed.

        Runtime complexity: O(1).
        """
        self._require_open()
        if not 0 <= n < self._entries:
            raise IndexError(f"entry {n} requested from {self._path} of {self._entries} entries")
        relative, position = _ENTRY.unpack_from(self._mapped(), n * 8)
        return self._base_offset + relative, position

    def append(self, offset: int, position: int) -> None:
        """Append the entry (``offset``, ``position``); the offset must exceed the last one.

        Raises:
            IndexFullError: every slot is used (an ``IndexError`` and a
                ``StorageError``); the log rolls the segment on ``is_full`` first.
            OSError: ``ENOSPC``: no block for a new page of the file (nothing written).
            InvalidOffsetError: ``offset`` is not larger than ``last_offset`` while
                entries exist, or ``offset - base_offset`` does not fit an int32.
            ReadOnlyLogError: the index is read-only.
            ValueError: the index is closed.

        Runtime complexity: O(1).
        """
        n = self._free_slot()
        if n and offset <= self._last_offset:
            raise InvalidOffsetError(
                f"attempt to append offset {offset} to slot {n} of {self._path}, "
                f"no larger than the last offset appended ({self._last_offset})"
            )
        relative = self._require_relative_offset(offset)
        self._ensure_allocated(n * 8 + 8)
        buf = self._writable_map()
        # Relative offset first: a torn entry then reads as (offset, 0), still a safe
        # lower bound; the reverse would read as (base_offset, position) and skip data.
        _INT32.pack_into(buf, n * 8, relative)
        _INT32.pack_into(buf, n * 8 + 4, position)
        self._entries = n + 1
        self._last_offset = offset

    def sanity_check(self) -> None:
        """Raise if the file is obviously corrupt, as Kafka's ``OffsetIndex.sanityCheck``.

        Corrupt when it has entries and the last offset is below the base offset, or
        when the file size is not a multiple of 8.

        Raises:
            CorruptIndexError: the index fails the check; rebuild it from the log.
        """
        self._check_sanity(self._last_offset)

    def _check(self) -> None:
        self._check_common()
        buf = self._buf
        if self._closed or buf is None:
            return
        relatives = [_INT32.unpack_from(buf, slot * 8)[0] for slot in range(self._entries)]
        assert all(r >= 0 for r in relatives), relatives
        assert all(a < b for a, b in itertools.pairwise(relatives)), relatives
        expected_last = self._base_offset + relatives[-1] if relatives else self._base_offset
        assert self._last_offset == expected_last, (self._last_offset, expected_last)

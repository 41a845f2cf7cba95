"""The ``.timeindex`` file: a sparse map from timestamps to offsets in one segment."""

from __future__ import annotations

import itertools
import mmap
import struct
from typing import ClassVar

from ..errors import CorruptIndexError, IndexFullError, InvalidOffsetError
from ..record.record import NO_TIMESTAMP
from .index import AbstractIndex

__all__ = ["TimeIndex"]

_ENTRY = struct.Struct(">qi")
_INT64 = struct.Struct(">q")
_INT32 = struct.Struct(">i")


class TimeIndex(AbstractIndex):
    """Timestamp -> offset for some batches of one segment (Kafka's ``TimeIndex``).

    Byte layout: 12-byte entries, big-endian::

        int64 timestamp        strictly increasing
        int32 relativeOffset   offset - base_offset, non-decreasing

    An entry (T, O) means: the largest timestamp seen before offset O is T, so every
    record with a timestamp above T comes after O. ``lookup`` finds the largest entry
    whose timestamp is <= a target; the log scans forward from its offset.

    The last slot is reserved: ``is_full`` is true one entry early (as in Kafka), so
    the final (max timestamp, offset) entry the log appends on roll or close with
    ``skip_full_check=True`` always finds room.

    The timestamp is written before the relative offset: a zero relative offset ends
    the valid prefix (see ``AbstractIndex``), so a concurrent reader or a reopen after
    a crash ignores an entry whose offset is not yet written, and a torn first entry
    reads as (timestamp, base_offset), a safe place to scan from. One consequence:
    Kafka lets an entry repeat the previous offset with a larger timestamp; if the
    repeated offset is ``base_offset`` itself, a reopen or a reader stops before it.
    The log never writes that (a new max timestamp comes with a later offset), and
    losing it is harmless: the earlier entry is a lower bound with the same offset.

    Costs: ``lookup`` and ``truncate_to`` O(log n); ``maybe_append``, ``entry`` and
    ``last_entry`` O(1). Not thread-safe: one writer, or one read-only instance per
    reader (see ``AbstractIndex``).
    """

    ENTRY_SIZE: ClassVar[int] = 12
    REL_OFFSET_POS: ClassVar[int] = 8

    _last_entry: tuple[int, int]

    def _entries_changed(self, buf: mmap.mmap | bytes) -> None:
        n = self._entries
        if n:
            timestamp, relative = _ENTRY.unpack_from(buf, (n - 1) * 12)
            self._last_entry = (timestamp, self._base_offset + relative)
        else:
            self._last_entry = (NO_TIMESTAMP, self._base_offset)

    @property
    def is_full(self) -> bool:
        """True iff at most the reserved last slot is free (Kafka: ``entries >= max - 1``)."""
        return self._entries >= self._max_entries - 1

    @property
    def last_entry(self) -> tuple[int, int]:
        """The (timestamp, offset) of the last entry; ``(-1, base_offset)`` when empty."""
        return self._last_entry

    def lookup(self, target_timestamp: int) -> tuple[int, int]:
        """The (timestamp, offset) of the largest entry whose timestamp is <= the target.

        Returns ``(-1, base_offset)`` (Kafka's ``TimestampOffset(NO_TIMESTAMP,
        baseOffset)``) when there is none: scanning from the segment start is correct.

        Raises:
            ValueError: the index is closed.

        Runtime complexity: O(log n).
        """
        self._require_open()
        found = self._floor_entry(target_timestamp, _INT64, 0, _ENTRY)
        if found is None:
            return NO_TIMESTAMP, self._base_offset
        timestamp, relative = found
        return timestamp, self._base_offset + relative

    def entry(self, n: int) -> tuple[int, int]:
        """The (timestamp, offset) of the ``n``-th entry.

        Raises:
            IndexError: ``n`` is not in ``[0, entries)``.
            ValueError: the index is closed.

        Runtime complexity: O(1).
        """
        self._require_open()
        if not 0 <= n < self._entries:
            raise IndexError(f"entry {n} requested from {self._path} of {self._entries} entries")
        timestamp, relative = _ENTRY.unpack_from(self._mapped(), n * 12)
        return timestamp, self._base_offset + relative

    def maybe_append(self, timestamp: int, offset: int, skip_full_check: bool = False) -> None:
        """Append (``timestamp``, ``offset``) if the timestamp exceeds the last one.

        As Kafka's ``TimeIndex.maybeAppend``: an entry equal to the last one, or with
        an equal timestamp, is ignored (the log re-appends its last entry on roll and
        close); with no entries, any timestamp above ``NO_TIMESTAMP`` (-1) is appended.

        Args:
            timestamp: the largest timestamp seen up to ``offset``.
            offset: the offset of the record carrying that timestamp.
            skip_full_check: take the reserved last slot; only for the final entry on
                roll or close.

        Raises:
            IndexFullError: ``is_full`` and not ``skip_full_check``, or no slot at all.
            InvalidOffsetError: entries exist and ``offset`` is below the last entry's
                offset or ``timestamp`` below its timestamp, or the offset to append
                does not fit an int32 relative offset.
            ReadOnlyLogError: the index is read-only.
            ValueError: the index is closed.
            OSError: ``ENOSPC``: no block for a new page of the file (nothing written).

        Runtime complexity: O(1).
        """
        self._require_writable()
        n = self._entries
        if not skip_full_check and self.is_full:
            raise IndexFullError(self._path, n)
        last_timestamp, last_offset = self._last_entry
        # An equal offset is allowed: it is the log re-appending its last entry.
        if n and offset < last_offset:
            raise InvalidOffsetError(
                f"attempt to append offset {offset} to slot {n} of {self._path}, "
                f"smaller than the last offset appended ({last_offset})"
            )
        if n and timestamp < last_timestamp:
            raise InvalidOffsetError(
                f"attempt to append timestamp {timestamp} to slot {n} of {self._path}, "
                f"smaller than the last timestamp appended ({last_timestamp})"
            )
        # Only a larger timestamp adds information; with message format v0 every
        # timestamp is NO_TIMESTAMP and the index stays empty.
        if timestamp <= last_timestamp:
            return
        relative = self._require_relative_offset(offset)
        if n >= self._max_entries:
            raise IndexFullError(self._path, n)
        self._ensure_allocated(n * 12 + 12)
        buf = self._writable_map()
        # Timestamp first, relative offset last: see the class doc.
        _INT64.pack_into(buf, n * 12, timestamp)
        _INT32.pack_into(buf, n * 12 + 8, relative)
        self._entries = n + 1
        self._last_entry = (timestamp, offset)

    def sanity_check(self) -> None:
        """Raise if the file is obviously corrupt, as Kafka's ``TimeIndex.sanityCheck``.

        Corrupt when it has entries and the last timestamp is below the first, or the
        last offset is below the base offset; or when the file size is not a multiple
        of 12.

        Raises:
            CorruptIndexError: the index fails the check; rebuild it from the log.
        """
        last_timestamp, last_offset = self._last_entry
        self._check_sanity(last_offset)
        if self._entries:
            first_timestamp = _INT64.unpack_from(self._mapped(), 0)[0]
            if last_timestamp < first_timestamp:
                raise CorruptIndexError(
                    self._path,
                    f"non-zero size but the last timestamp is {last_timestamp}, "
                    f"less than the first timestamp {first_timestamp}",
                )

    def _check(self) -> None:
        self._check_common()
        buf = self._buf
        if self._closed or buf is None:
            return
        entries = [_ENTRY.unpack_from(buf, slot * 12) for slot in range(self._entries)]
        timestamps = [ts for ts, _ in entries]
        relatives = [rel for _, rel in entries]
        assert all(ts >= 0 for ts in timestamps), timestamps
        assert all(a < b for a, b in itertools.pairwise(timestamps)), timestamps
        assert all(r >= 0 for r in relatives), relatives
        assert all(a <= b for a, b in itertools.pairwise(relatives)), relatives
        expected = (
            (entries[-1][0], self._base_offset + entries[-1][1])
            if entries
            else (NO_TIMESTAMP, self._base_offset)
        )
        assert self._last_entry == expected, (self._last_entry, expected)

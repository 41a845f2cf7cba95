"""The sorted map of a log's segments by base offset (Kafka's ``LogSegments``).

Backed by ``sortedcontainers.SortedDict``: finding the segment that holds an offset is
a bisection over base offsets.

Thread-safety: thread-safe. Every method holds a private lock for its few
microseconds: the owning ``Log`` mutates the map (roll, retention) while reader threads
look segments up without taking the log's lock, and a ``SortedDict`` bisection must
not see a half-done insertion. ``values()`` returns a snapshot list to iterate freely.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

from sortedcontainers import SortedDict

from .segment import LogSegment


class LogSegments:
    """Segments keyed by base offset."""

    def __init__(self) -> None:
        self._segments: SortedDict = SortedDict()
        self._lock = threading.Lock()

    def add(self, segment: LogSegment) -> None:
        """Insert or replace the segment at its base offset. Cost: O(log n)."""
        with self._lock:
            self._segments[segment.base_offset] = segment

    def remove(self, base_offset: int) -> LogSegment:
        """Remove and return the segment at ``base_offset``. Cost: O(log n).

        Raises:
            KeyError: no segment has that base offset.
        """
        with self._lock:
            segment: LogSegment = self._segments.pop(base_offset)
            return segment

    def get(self, base_offset: int) -> LogSegment | None:
        with self._lock:
            segment: LogSegment | None = self._segments.get(base_offset)
            return segment

    def floor_segment(self, offset: int) -> LogSegment | None:
        """The segment with the largest base offset <= ``offset``: the one that would
        hold it. Cost: O(log n)."""
        with self._lock:
            index = self._segments.bisect_right(offset)
            if index == 0:
                return None
            segment: LogSegment = self._segments.peekitem(index - 1)[1]
            return segment

    def lower_segment(self, offset: int) -> LogSegment | None:
        """The last segment with base offset < ``offset``. Cost: O(log n)."""
        with self._lock:
            index = self._segments.bisect_left(offset)
            if index == 0:
                return None
            segment: LogSegment = self._segments.peekitem(index - 1)[1]
            return segment

    def higher_segment(self, offset: int) -> LogSegment | None:
        """The first segment with base offset > ``offset``. Cost: O(log n)."""
        with self._lock:
            index = self._segments.bisect_right(offset)
            if index == len(self._segments):
                return None
            segment: LogSegment = self._segments.peekitem(index)[1]
            return segment

    @property
    def first_segment(self) -> LogSegment | None:
        with self._lock:
            return self._segments.peekitem(0)[1] if self._segments else None

    @property
    def last_segment(self) -> LogSegment | None:
        with self._lock:
            return self._segments.peekitem(-1)[1] if self._segments else None

    def values(self, from_offset: int | None = None) -> list[LogSegment]:
        """A snapshot of the segments, oldest first, from the one holding ``from_offset``.

        Cost: O(log n + k) for k segments returned.
        """
        with self._lock:
            if from_offset is None:
                return list(self._segments.values())
            start = max(self._segments.bisect_right(from_offset) - 1, 0)
            return list(self._segments.values()[start:])

    def base_offsets(self) -> list[int]:
        with self._lock:
            return list(self._segments.keys())

    def size_in_bytes(self) -> int:
        """Sum of the ``.log`` sizes. Cost: O(n)."""
        with self._lock:
            return sum(segment.size for segment in self._segments.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._segments)

    def __iter__(self) -> Iterator[LogSegment]:
        with self._lock:
            return iter(list(self._segments.values()))

    def __contains__(self, base_offset: object) -> bool:
        with self._lock:
            return base_offset in self._segments

    def _check(self) -> None:
        """Assert the invariants: keys equal base offsets, segments do not overlap."""
        previous: LogSegment | None = None
        for base_offset, segment in self._segments.items():
            assert segment.base_offset == base_offset
            if previous is not None:
                assert previous.read_next_offset() <= base_offset, (previous, segment)
            previous = segment

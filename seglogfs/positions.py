"""Byte positions of a partition file: which record, which byte of it, and the bytes.

A partition file shows the rendered records of a partition back to back (SPEC §3,
``storage.render``). Positions are global and persistent: the position of a record is
the rendered size of every record appended before it, counted at append, so it never
changes, and retention only removes a prefix of positions. The engine keeps that count
in a per-segment *extension index* (``ExtensionIndexSpec``, files ``*.seglogpos``),
which this module defines: its unit is a rendered byte and its ``measure`` is
``rendered_size``; ``Log.extension_end`` is then the ``st_size`` of the file and
``Log.extension_floor(position)`` finds a batch start at or below any position without
scanning from the start.

Each open file reads through its own ``PositionReader``: the global position of a read
is the kernel's file offset plus a *shift* kept per open file (0 at open). A read that
falls in a gap (bytes retention removed) continues at the oldest retained record and
adds the skipped length to the shift, so the kernel's offset and the reader's view stay
consistent, nothing is returned twice and the file never looks truncated to ``tail -f``.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from functools import partial

from storage import (
    CorruptRecordError,
    ExtensionIndexSpec,
    Log,
    OffsetOutOfRangeError,
    RecordBatch,
    TopicMetadata,
)
from storage.render import RenderedBatch, render_batch, rendered_size

__all__ = [
    "POSITION_INDEX_INTERVAL",
    "POSITION_INDEX_SUFFIX",
    "PositionReader",
    "Rendering",
    "log_start_anchor",
    "position_index_spec",
    "position_of_offset",
]

POSITION_INDEX_SUFFIX = ".seglogpos"
"""The position index's file suffix: a name Kafka never uses, so Kafka ignores it."""

POSITION_INDEX_INTERVAL = 4096
"""Rendered bytes between two position-index entries (Kafka's ``index.interval.bytes``
for the offset index): a lookup decodes about this many bytes past the entry it finds.
Entries are 12 bytes, so the index is 0.3% of the rendered size."""

# A read that meets retention under it starts again from the new log start; more than
# this many consecutive retries means the log is being emptied faster than it is read.
_MAX_RETRIES = 8


@dataclass(frozen=True)
class Rendering:
    """How a topic's records render (its ``format`` and ``key.separator``)."""

    raw: bool
    key_separator: bytes | None

    @classmethod
    def of(cls, metadata: TopicMetadata) -> Rendering:
        separator = metadata.key_separator
        return cls(
            metadata.format == "raw",
            None if separator is None else separator.encode("utf-8"),
        )

    def render(self, batch: RecordBatch) -> RenderedBatch:
        return render_batch(batch, raw=self.raw, key_separator=self.key_separator)

    def measure(self, batch: RecordBatch) -> int:
        return rendered_size(batch, raw=self.raw, key_separator=self.key_separator)


def position_index_spec(metadata: TopicMetadata) -> ExtensionIndexSpec:
    """The position index of a topic's partitions, for ``LogManager.open(extension=)``."""
    rendering = Rendering.of(metadata)
    return ExtensionIndexSpec(
        POSITION_INDEX_SUFFIX,
        POSITION_INDEX_INTERVAL,
        partial(rendered_size, raw=rendering.raw, key_separator=rendering.key_separator),
    )


def position_of_offset(log: Log, rendering: Rendering, offset: int) -> int:
    """The global byte position where the record at ``offset`` starts (the log end
    position for the log end offset; the next record's position for an offset in a
    gap).

    Cost: O(log n) through the position index, then one batch rendered.

    Raises:
        OffsetOutOfRangeError: ``offset`` outside [log start, log end].
        CorruptRecordError: the batch holding it fails its CRC.
    """
    if offset == log.log_end_offset:
        return log.extension_end
    batch_offset, position = log.extension_position(offset)
    if batch_offset < log.log_start_offset:
        batch_offset = log.log_start_offset
        position, _start = log_start_anchor(log, rendering)
    for batch in log.batches(batch_offset):
        rendered = rendering.render(batch)
        if batch.next_offset > offset:
            i = bisect_left(rendered.offsets, offset)
            return position + (rendered.ends[i - 1] if i else 0)
        position += len(rendered.data)
    return log.extension_end


def log_start_anchor(log: Log, rendering: Rendering) -> tuple[int, int]:
    """``(units before the batch holding the log start offset, position of the log
    start record)``: where a partition file's retained records begin.

    Retention deletes whole segments, so the log start is usually a segment's first
    batch, whose index entry gives both at once. A log start inside a segment (Kafka's
    ``DeleteRecords``, found in a copied broker directory's checkpoint) has no entry,
    and ``Log.batches`` cannot scan from the entry below it: the answer is measured
    back from the first index entry after it (at most one index interval of batches
    rendered) and the records below the log start become part of the gap.

    Cost: O(log n), or O(log n * log units) plus one index interval when the log start
    is inside a segment.
    """
    start = log.log_start_offset
    if start >= log.log_end_offset:
        return log.extension_end, log.extension_end
    batch_offset, units = log.extension_position(start)
    if batch_offset == start:
        return units, units
    anchor_offset, anchor_units = _first_entry_after(log, start)
    rendered = []
    for batch in log.batches(start):
        if batch.base_offset >= anchor_offset:
            break
        rendered.append(rendering.render(batch))
    if not rendered:
        return anchor_units, anchor_units
    before = anchor_units - sum(len(r.data) for r in rendered)
    i = bisect_left(rendered[0].offsets, start)
    return before, before + (rendered[0].ends[i - 1] if i else 0)


def _first_entry_after(log: Log, offset: int) -> tuple[int, int]:
    # extension_floor is monotonic in its units: bisect them for the first entry whose
    # batch starts after `offset` (the log end when there is none).
    lo, hi = log.extension_start, log.extension_end
    while lo < hi:
        middle = (lo + hi) // 2
        if log.extension_floor(middle)[0] > offset:
            hi = middle
        else:
            lo = middle + 1
    found = log.extension_floor(lo)
    if found[0] > offset:
        return found
    return log.log_end_offset, log.extension_end


@dataclass(frozen=True, slots=True)
class _Rendered:
    """The last batch a reader rendered: where it starts, its bytes, what follows."""

    position: int
    batch: RenderedBatch
    next_offset: int

    @property
    def end(self) -> int:
        return self.position + len(self.batch.data)


class PositionReader:
    """The reads of one open file: kernel offsets to global positions, and bytes.

    ``base`` is the global position of the file's byte 0 (0 for a partition file; the
    start position of a ``P@<where>`` view). The bytes returned for a read are slices of
    ``render_batch`` output (no object per record); a read inside one batch returns a
    ``memoryview`` of it without a copy. The last rendered batch is kept, so a
    sequential reader renders each batch once and positions without an index lookup.

    Not thread-safe: the daemon runs one request of an open file at a time.
    """

    __slots__ = ("_last", "_start", "base", "shift")

    def __init__(self, base: int = 0) -> None:
        self.base = base
        self.shift = 0
        self._last: _Rendered | None = None
        # ((log identity, log start offset), log_start_anchor(...)) of the last read.
        self._start: tuple[tuple[int, int], tuple[int, int]] | None = None

    def position(self, kernel_offset: int) -> int:
        """The global position the kernel's ``kernel_offset`` denotes now."""
        return self.base + kernel_offset + self.shift

    def read(
        self, log: Log, rendering: Rendering, kernel_offset: int, size: int
    ) -> bytes | memoryview:
        """Up to ``size`` bytes at ``kernel_offset``; empty at the end. Never blocks for
        data: a read at the end returns what there is.

        A position below the oldest retained record (a gap) reads from that record on and
        moves the shift by the skipped length.

        Cost: O(log n) to position (none when it continues the previous read), then
        O(bytes) rendering.

        Raises:
            CorruptRecordError: the read starts in a batch that fails its CRC (never
                served; a read that meets one later returns the bytes before it).
        """
        for _ in range(_MAX_RETRIES):
            position = self.base + kernel_offset + self.shift
            anchor = self._anchor(log, rendering)
            start = anchor[1]
            if position < start:
                # Retention removed these bytes: continue at the oldest retained record,
                # as Kafka's auto.offset.reset=earliest, and remember the jump.
                self.shift += start - position
                position = start
            end = log.extension_end
            if position >= end or size <= 0:
                return b""
            try:
                return self._read_at(log, rendering, position, min(size, end - position))
            except OffsetOutOfRangeError:
                # The segment under the read was deleted (or the start moved past the
                # cached batch): forget it and start again from the new log start.
                self._last = None
        return b""

    def _anchor(self, log: Log, rendering: Rendering) -> tuple[int, int]:
        key = (id(log), log.log_start_offset)
        if self._start is None or self._start[0] != key:
            self._start = (key, log_start_anchor(log, rendering))
        return self._start[1]

    def _read_at(
        self, log: Log, rendering: Rendering, position: int, size: int
    ) -> bytes | memoryview:
        want = position + size
        parts: list[memoryview] = []
        last = self._last
        if last is not None and last.position <= position < last.end:
            view = memoryview(last.batch.data)[position - last.position : want - last.position]
            if last.end >= want:
                return view
            parts.append(view)
            cursor, offset = last.end, last.next_offset
        elif last is not None and position == last.end:
            cursor, offset = last.end, last.next_offset
        else:
            offset, cursor = log.extension_floor(position)
            if offset < log.log_start_offset:
                # The entry is below a log start inside its segment: scan from the
                # batch holding the log start (the caller keeps positions above it).
                offset = log.log_start_offset
                cursor = self._anchor(log, rendering)[0]
        try:
            for batch in log.batches(offset):
                rendered = rendering.render(batch)
                length = len(rendered.data)
                if cursor + length > position:
                    lo = position - cursor if position > cursor else 0
                    parts.append(memoryview(rendered.data)[lo : want - cursor])
                self._last = _Rendered(cursor, rendered, batch.next_offset)
                cursor += length
                if cursor >= want:
                    break
        except CorruptRecordError:
            if not parts:
                raise
            # Serve the valid bytes before the corrupt batch (a short read, as a disk
            # read before a bad sector); the next read starts there and fails.
        if len(parts) == 1:
            return parts[0]
        return b"".join(parts)

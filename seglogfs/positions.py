"""Byte positions of a partition file: which record, which byte of it, and the bytes.

A partition file shows the rendered records of a partition back to back (SPEC §3,
``storage.record.render``). Positions are global and persistent: the position of a record is
the rendered size of every record appended before it, counted at append, so it never
changes, and retention only removes a prefix of positions. The engine keeps that count
in a per-segment *extension index* (``ExtensionIndexSpec``, files ``*.seglogpos``),
which this module defines: its unit is a rendered byte and its ``measure`` is
``rendered_size``; ``Log.extension_end`` is then the ``st_size`` of the file and
``Log.extension_floor(position)`` finds a batch start at or below any position without
scanning from the start.

Every writer of a log directory keeps this index (the daemon, ``seglogfs produce``,
the Spark sink: they open the log with ``position_index_spec``), and the daemon's
readers find positions through it (``seglogfs.daemon.position_reader``).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from storage import (
    ExtensionIndexSpec,
    Log,
    RecordBatch,
    TopicMetadata,
)
from storage.record.json_format import json_rendered_size, render_json_batch
from storage.record.render import RenderedBatch, render_batch, rendered_size

__all__ = [
    "POSITION_INDEX_INTERVAL",
    "POSITION_INDEX_SUFFIX",
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


@dataclass(frozen=True)
class Rendering:
    """How a partition's records render: its topic's ``format`` and ``key.separator``,
    and for ``json``, which names them in every record, the topic and partition."""

    raw: bool
    key_separator: bytes | None
    json_of: tuple[str, int] | None = None
    """``(topic, partition)`` for the ``json`` format, else None."""

    @classmethod
    def of(cls, metadata: TopicMetadata, partition: int) -> Rendering:
        separator = metadata.key_separator
        return cls(
            metadata.format == "raw",
            None if separator is None else separator.encode("utf-8"),
            (metadata.name, partition) if metadata.format == "json" else None,
        )

    def render(self, batch: RecordBatch) -> RenderedBatch:
        """The batch's records as the partition file shows them.

        Raises:
            CorruptRecordError: the records do not parse.
        """
        if self.json_of is not None:
            return render_json_batch(batch, *self.json_of)
        return render_batch(batch, raw=self.raw, key_separator=self.key_separator)

    def measure(self, batch: RecordBatch) -> int:
        """``len(self.render(batch).data)``, without the bytes where the format allows.

        Raises:
            CorruptRecordError: the records do not parse.
        """
        if self.json_of is not None:
            return json_rendered_size(batch, *self.json_of)
        return rendered_size(batch, raw=self.raw, key_separator=self.key_separator)


def position_index_spec(metadata: TopicMetadata) -> ExtensionIndexSpec:
    """The position index of a topic's partitions, for ``LogManager.open(extension=)``
    (a ``json`` topic's measure is per partition: its records name the partition)."""
    if metadata.format != "json":
        rendering = Rendering.of(metadata, 0)
        return ExtensionIndexSpec(
            POSITION_INDEX_SUFFIX,
            POSITION_INDEX_INTERVAL,
            partial(rendered_size, raw=rendering.raw, key_separator=rendering.key_separator),
        )

    def measure_of(partition: int) -> Callable[[RecordBatch], int]:
        return Rendering.of(metadata, partition).measure

    return ExtensionIndexSpec(
        POSITION_INDEX_SUFFIX, POSITION_INDEX_INTERVAL, measure_of(0), measure_of
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

"""Rendering records as the bytes a partition file shows, a batch at a time.

The file system and the command line show a partition as one byte stream. A topic's
format decides how each record renders:

- ``lines``: ``value\\n``, or ``key<sep>value\\n`` for a record with a key in a topic
  with a key separator; a null value renders as an empty line (``\\n``, or
  ``key<sep>\\n``).
- ``raw``: the values back to back; a null value renders nothing.

Control batches (transaction markers) render nothing: consumers never see them.

``render_batch`` renders a whole batch into one ``bytes`` object plus an ``array`` of
record end positions, without a Python object per record, so a reader can map byte
positions to records (bisect ``ends``) and slice ``data`` for any range.

Pure functions over immutable results: thread-safe.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence
from typing import Final

from librt.strings import BytesWriter, write_i64_le
from mypy_extensions import i64

from .record_batch import DefaultRecordBatch, RecordBatch
from .record_columns import RecordColumns

_NEWLINE: Final = b"\n"


class RenderedBatch:
    """The consumer-visible records of one batch, rendered back to back.

    ``ends[i]`` is the byte just past record ``i`` in ``data`` (so record ``i`` is
    ``data[ends[i - 1]:ends[i]]``, and ``len(data) == ends[-1]``); ``offsets[i]`` is its
    offset (a ``range`` when the offsets are contiguous). A record that renders to
    nothing (a null value in ``raw``) still has its entry, with an empty range. The
    attributes are ``Final``; the ``ends`` array must not be modified.
    """

    # A plain class, not a dataclass: mypyc compiles this ``__init__`` (a dataclass's
    # generated one runs interpreted, a few µs a batch).
    __slots__ = ("data", "ends", "offsets")

    def __init__(self, data: bytes, ends: array[int], offsets: Sequence[int]) -> None:
        self.data: Final = data
        self.ends: Final = ends
        self.offsets: Final = offsets

    def __len__(self) -> int:
        """The number of records (not bytes)."""
        return len(self.offsets)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RenderedBatch):
            return NotImplemented
        return self.data == other.data and self.ends == other.ends and self.offsets == other.offsets

    __hash__ = None  # type: ignore[assignment]  # as the frozen dataclass with an array

    def __repr__(self) -> str:
        return f"RenderedBatch(data={self.data!r}, ends={self.ends!r}, offsets={self.offsets!r})"


def render_batch(batch: RecordBatch, *, raw: bool, key_separator: bytes | None) -> RenderedBatch:
    """Render every consumer-visible record of ``batch``.

    ``raw`` selects the ``raw`` format, else ``lines``; ``key_separator`` is the topic's
    separator (``None``: keys are not shown). The CRC is not checked here: callers
    reading untrusted bytes check ``batch.is_valid()`` first (``Log.batches`` does).

    Cost: O(records + bytes): one decode of the batch and one copy of its values.

    Raises:
        CorruptRecordError: the records do not parse (as ``RecordBatch.columns()``).
    """
    if batch.is_control:
        next_offset = batch.next_offset
        return RenderedBatch(b"", array("q"), range(next_offset, next_offset))
    if isinstance(batch, DefaultRecordBatch):
        values = batch.plain_values()
        if values is not None:
            base_offset = batch.base_offset
            offsets = range(base_offset, base_offset + len(values))
            return _render_values(values, offsets, raw=raw)
    return render_columns(batch.columns(), raw=raw, key_separator=key_separator)


def _render_values(values: list[bytes], offsets: range, *, raw: bool) -> RenderedBatch:
    # Keyless, non-null values (a plain batch): the values list is the rendering's
    # own, so it takes the final empty element for the last newline.
    ends = BytesWriter()
    total: i64 = 0
    line_end: i64 = 0 if raw else 1
    for value in values:
        total += len(value) + line_end
        write_i64_le(ends, total)
    if raw:
        data = b"".join(values)
    else:
        if values:
            values.append(b"")
        data = _NEWLINE.join(values)
    return RenderedBatch(data, _int64_array(ends.getvalue()), offsets)


def rendered_size(batch: RecordBatch, *, raw: bool, key_separator: bytes | None) -> int:
    """``len(render_batch(batch, ...).data)``: the units of a batch in a partition file.

    Cost: as ``render_batch`` without building the bytes (one decode of the batch).

    Raises:
        CorruptRecordError: the records do not parse.
    """
    if batch.is_control:
        return 0
    if isinstance(batch, DefaultRecordBatch):
        plain = batch.plain_values()
        if plain is not None:
            size: i64 = 0 if raw else len(plain)
            for line in plain:
                size += len(line)
            return size
    columns = batch.columns()
    values = _as_list(columns.values)
    total: i64 = 0
    for value in values:
        if value is not None:
            total += len(value)
    if raw:
        return total
    total += len(values)  # the newlines
    if key_separator is not None:
        sep_len = len(key_separator)
        for key in _as_list(columns.keys):
            if key is not None:
                total += len(key) + sep_len
    return total


def render_columns(
    columns: RecordColumns, *, raw: bool, key_separator: bytes | None
) -> RenderedBatch:
    """Render decoded columns (``render_batch`` without the batch). Cost: O(bytes)."""
    # Written for mypyc: lists (not Sequences) index natively, the running total is a
    # native int, and each end goes into a BytesWriter as 8 raw bytes: collecting them
    # as Python ints instead cost more than the rest of the rendering together.
    values = _as_list(columns.values)
    ends = BytesWriter()
    total: i64 = 0
    data: bytes
    if raw:
        parts: list[bytes] = []
        for value in values:
            if value is not None:
                parts.append(value)
                total += len(value)
            write_i64_le(ends, total)
        data = b"".join(parts)
    elif key_separator is None or not _any_key(columns.keys):
        # The common case: one join is the whole rendering; the empty last element
        # gives the final newline without a second copy.
        lines: list[bytes] = []
        for value in values:
            if value is None:
                lines.append(b"")
            else:
                lines.append(value)
                total += len(value)
            total += 1
            write_i64_le(ends, total)
        if lines:
            lines.append(b"")
        data = _NEWLINE.join(lines)
    else:
        keys = _as_list(columns.keys)
        pieces: list[bytes] = []
        sep_len = len(key_separator)
        for i in range(len(values)):
            key = keys[i]
            value = values[i]
            if key is not None:
                pieces.append(key)
                pieces.append(key_separator)
                total += len(key) + sep_len
            if value is not None:
                pieces.append(value)
                total += len(value)
            pieces.append(_NEWLINE)
            total += 1
            write_i64_le(ends, total)
        data = b"".join(pieces)
    return RenderedBatch(data, _int64_array(ends.getvalue()), columns.offsets)


def _int64_array(little_endian: bytes) -> array[int]:
    result = array("q")
    result.frombytes(little_endian)
    if sys.byteorder == "big":
        result.byteswap()
    return result


def _as_list(column: Sequence[bytes | None]) -> list[bytes | None]:
    # Decoded columns are lists already; this only copies other sequences.
    return column if isinstance(column, list) else list(column)


def _any_key(keys: Sequence[bytes | None]) -> bool:
    return any(key is not None for key in _as_list(keys))

"""Records as columns, and the v2 record decoder that produces them.

Bulk consumers want columns, not objects: rendering a partition file joins values,
the Spark source builds Arrow arrays. Decoding straight into columns also skips the
per-record object, the largest single cost of a pure-Python read path: columns that
are constant across a batch (no keys, no headers, one timestamp, contiguous offsets:
the common case) cost nothing per record. ``RecordColumns.records()`` turns columns
into ``Record`` tuples for callers that want them. ``PackedColumns`` goes one step
further for consumers that copy values in bulk (the Spark source's Arrow arrays): the
values, and the keys, each in one buffer with int32 bounds, no ``bytes`` per record.

v2 record layout (varints are ZigZag LEB128)::

    length varint | attributes int8 | timestampDelta varlong | offsetDelta varint
    | keyLength varint | key | valueLength varint | value | headerCount varint
    | (headerKeyLength varint | headerKey | headerValueLength varint | headerValue)*

Immutable once built; thread-safe.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence
from functools import partial
from itertools import repeat
from typing import Final

from librt.strings import BytesWriter, read_i32_le, write_i32_le
from mypy_extensions import i32, i64

from ..errors import CorruptRecordError
from .record import Header, Record, TimestampType
from .varint import decode_varint

_new_record = partial(tuple.__new__, Record)  # Record(...) without the Python-level __new__
_MAX_PACKED: Final = 0x7FFFFFFF  # int32 bounds, as an Arrow ``binary`` column has


class RecordColumns:
    """The records of one batch (or a slice of it), column by column.

    ``offsets`` is a ``range`` when the offsets are contiguous. All columns have the
    same length, which is ``len()`` of the object. The attributes are ``Final``.
    """

    # A plain class, not a dataclass: mypyc compiles this ``__init__``, while a
    # dataclass's generated one runs as interpreted code (about 2 µs a batch, a
    # twentieth of a lookup).
    __slots__ = ("headers", "keys", "offsets", "timestamp_type", "timestamps", "values")

    def __init__(
        self,
        offsets: Sequence[int],
        timestamps: Sequence[int],
        keys: Sequence[bytes | None],
        values: Sequence[bytes | None],
        headers: Sequence[tuple[Header, ...]],
        timestamp_type: TimestampType,
    ) -> None:
        self.offsets: Final = offsets
        self.timestamps: Final = timestamps
        self.keys: Final = keys
        self.values: Final = values
        self.headers: Final = headers
        self.timestamp_type: Final = timestamp_type

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RecordColumns):
            return NotImplemented
        return (
            self.offsets == other.offsets
            and self.timestamps == other.timestamps
            and self.keys == other.keys
            and self.values == other.values
            and self.headers == other.headers
            and self.timestamp_type == other.timestamp_type
        )

    __hash__ = None  # type: ignore[assignment]  # mutable columns: unhashable, as before

    def __repr__(self) -> str:
        return (
            f"RecordColumns(offsets={self.offsets!r}, timestamps={self.timestamps!r}, "
            f"keys={self.keys!r}, values={self.values!r}, headers={self.headers!r}, "
            f"timestamp_type={self.timestamp_type!r})"
        )

    def __len__(self) -> int:
        return len(self.offsets)

    def records(self) -> list[Record]:
        """The records as ``Record`` tuples. Cost: one tuple per record."""
        return list(self)

    def __iter__(self) -> Iterator[Record]:
        """Iterate ``Record`` tuples, made one at a time (no list of them all)."""
        return map(
            _new_record,
            zip(
                self.offsets,
                self.timestamps,
                self.keys,
                self.values,
                self.headers,
                repeat(self.timestamp_type),
                strict=False,
            ),
        )

    def slice(self, start_offset: int, end_offset: int | None = None) -> RecordColumns:
        """The records with ``start_offset <= offset < end_offset``. Cost: O(log n)."""
        offsets = self.offsets
        lo = bisect_left(offsets, start_offset)
        hi = len(offsets) if end_offset is None else bisect_left(offsets, end_offset)
        if lo == 0 and hi == len(offsets):
            return self
        return RecordColumns(
            offsets[lo:hi],
            self.timestamps[lo:hi],
            self.keys[lo:hi],
            self.values[lo:hi],
            self.headers[lo:hi],
            self.timestamp_type,
        )


class PackedBinary:
    """A column of byte strings (values or keys) packed into one buffer, the layout of
    an Arrow ``binary`` array, so a bulk consumer wraps it without copying.

    ``bounds`` holds ``len() + 1`` int32 little-endian positions, the first 0: entry
    ``i`` of the column is ``data[bound(i):bound(i + 1)]``. ``nulls`` lists the indexes
    of the null entries (an empty range in ``data``), or is None when there is none,
    which tells a null from an empty value. The attributes are ``Final``.
    """

    __slots__ = ("bounds", "data", "nulls")

    def __init__(self, data: bytes, bounds: bytes, nulls: list[int] | None) -> None:
        self.data: Final = data
        self.bounds: Final = bounds
        self.nulls: Final = nulls

    def __len__(self) -> int:
        return len(self.bounds) // 4 - 1

    def to_list(self) -> list[bytes | None]:
        """The entries as ``bytes`` (None for a null). Cost: one object per entry."""
        data = self.data
        bounds = self.bounds
        result: list[bytes | None] = []
        start: i64 = 0
        for i in range(len(self)):
            stop: i64 = i64(read_i32_le(bounds, (i + 1) * 4))
            result.append(data[start:stop])
            start = stop
        if self.nulls is not None:
            for i in self.nulls:
                result[i] = None
        return result

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PackedBinary):
            return NotImplemented
        return self.data == other.data and self.bounds == other.bounds and self.nulls == other.nulls

    __hash__ = None  # type: ignore[assignment]  # as RecordColumns

    def __repr__(self) -> str:
        return f"PackedBinary(data={self.data!r}, bounds={self.bounds!r}, nulls={self.nulls!r})"


class PackedColumns:
    """The records of one batch (or of an offset range of it) as ``RecordColumns``,
    but with the values, and the keys, each packed into one ``PackedBinary``:
    ``keys`` is None when every key is null. The attributes are ``Final``.
    """

    __slots__ = ("headers", "keys", "offsets", "timestamp_type", "timestamps", "values")

    def __init__(
        self,
        offsets: Sequence[int],
        timestamps: Sequence[int],
        keys: PackedBinary | None,
        values: PackedBinary,
        headers: Sequence[tuple[Header, ...]],
        timestamp_type: TimestampType,
    ) -> None:
        self.offsets: Final = offsets
        self.timestamps: Final = timestamps
        self.keys: Final = keys
        self.values: Final = values
        self.headers: Final = headers
        self.timestamp_type: Final = timestamp_type

    def __len__(self) -> int:
        return len(self.offsets)

    def unpacked(self) -> RecordColumns:
        """The same records as ``RecordColumns``. Cost: one object per value and key."""
        n = len(self.offsets)
        return RecordColumns(
            self.offsets,
            self.timestamps,
            [None] * n if self.keys is None else self.keys.to_list(),
            self.values.to_list(),
            self.headers,
            self.timestamp_type,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PackedColumns):
            return NotImplemented
        return (
            self.offsets == other.offsets
            and self.timestamps == other.timestamps
            and self.keys == other.keys
            and self.values == other.values
            and self.headers == other.headers
            and self.timestamp_type == other.timestamp_type
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"PackedColumns(offsets={self.offsets!r}, timestamps={self.timestamps!r}, "
            f"keys={self.keys!r}, values={self.values!r}, headers={self.headers!r}, "
            f"timestamp_type={self.timestamp_type!r})"
        )


def pack_binary(column: Sequence[bytes | None]) -> PackedBinary:
    """``column`` packed into one buffer. Cost: O(entries + bytes).

    Raises:
        OverflowError: the entries total 2 GiB or more (beyond int32 bounds).
    """
    entries = column if isinstance(column, list) else list(column)
    parts: list[bytes] = []
    bounds = BytesWriter()
    write_i32_le(bounds, 0)
    nulls: list[int] | None = None
    total: i64 = 0
    for i in range(len(entries)):
        entry = entries[i]
        if entry is None:
            if nulls is None:
                nulls = []
            nulls.append(i)
        else:
            parts.append(entry)
            total += len(entry)
            if total > _MAX_PACKED:
                raise OverflowError("a packed column holds under 2 GiB")
        write_i32_le(bounds, i32(total))
    return PackedBinary(b"".join(parts), bounds.getvalue(), nulls)


def pack_columns(columns: RecordColumns) -> PackedColumns:
    """``columns`` with their values and keys packed. Cost: O(records + bytes).

    Raises:
        OverflowError: as ``pack_binary``.
    """
    keys = columns.keys
    any_key = False
    for key in keys if isinstance(keys, list) else list(keys):
        if key is not None:
            any_key = True
            break
    return PackedColumns(
        columns.offsets,
        columns.timestamps,
        pack_binary(keys) if any_key else None,
        pack_binary(columns.values),
        columns.headers,
        columns.timestamp_type,
    )


def _uvarint(data: bytes, pos: int) -> tuple[int, int]:
    # The slow path: varints of three bytes or more (values of 8 KiB and up), unsigned.
    shift = 0
    u = 0
    while shift < 70:
        b = data[pos]
        pos += 1
        u |= (b & 0x7F) << shift
        if b < 0x80:
            return u, pos
        shift += 7
    raise CorruptRecordError("varint longer than 10 bytes")


def decode_record_columns(
    data: bytes,
    pos: int,
    end: int,
    count: int,
    base_offset: int,
    base_timestamp: int,
    timestamp_type: TimestampType,
    append_time: int | None,
    start_offset: int | None = None,
    end_offset: int | None = None,
) -> RecordColumns:
    """Decode the v2 records in ``data[pos:end]`` (``count`` of them) whose offsets lie in
    ``[start_offset, end_offset)`` (None: unbounded).

    ``append_time`` is the batch's max timestamp under LogAppendTime (every record
    reports it), else None.

    Records before ``start_offset`` are skipped, not decoded: only their length,
    timestamp delta and offset delta are read. Decoding stops at the first record at
    or past ``end_offset``. So a random read of one record costs a few nanoseconds per
    record before it, not a decode of the whole batch; the price is that a malformed
    field inside a skipped record (or one after the stop) goes unnoticed here (the
    batch CRC still covers it). A decode that reaches the batch's end checks the
    count and that no bytes are left over.

    Cost: O(records skipped) + O(records decoded + their bytes); about 0.04 µs a
    decoded record for typical records here.

    Raises:
        CorruptRecordError: a record does not parse, lengths disagree, the count is
            wrong, or bytes are left over.
        IndexError: the records run past ``data`` (callers convert it).
    """
    columns = _decode_columns(
        data, pos, end, count, base_offset, base_timestamp,
        timestamp_type, append_time, start_offset, end_offset, False,
    )  # fmt: skip
    assert isinstance(columns, RecordColumns)
    return columns


def _decode_columns(
    data: bytes,
    pos: int,
    end: int,
    count: int,
    base_offset: int,
    base_timestamp: int,
    timestamp_type: TimestampType,
    append_time: int | None,
    start_offset: int | None,
    end_offset: int | None,
    pack: bool,
    scratch: BytesWriter | None = None,
) -> RecordColumns | PackedColumns:
    """``decode_record_columns``, or with ``pack`` ``decode_packed_columns``: one loop,
    whose only difference is where a value or key goes (a list, or a packed buffer)."""
    # The hot loop of every read. Varints of one and two bytes are decoded inline:
    # every field of a typical record is one, and a call per field would double the
    # cost. Columns that stay constant are only materialised once a record differs.
    if count < 0:
        raise CorruptRecordError(f"negative record count {count}")
    first = 0
    if start_offset is not None and start_offset > base_offset:
        # Deltas are int32: clamping keeps the target a native int.
        first, pos = _skip_records(data, pos, end, count, min(start_offset - base_offset, 1 << 32))
    stop_delta = 1 << 32  # offset deltas are int32: none reaches it
    if end_offset is not None:
        stop_delta = max(min(end_offset - base_offset, stop_delta), 0)
    values: list[bytes | None] | None = None
    keys: list[bytes | None] | None = None
    # Packed: values (and keys) written to one buffer each, with their int32 bounds
    # and the indexes of their nulls (None until the first).
    packed_values = BytesWriter() if scratch is None else scratch
    packed_values.truncate(0)
    value_bounds = BytesWriter()
    value_nulls: list[int] | None = None
    packed_keys: BytesWriter | None = None
    key_bounds = BytesWriter()
    key_nulls: list[int] = []
    if pack:
        write_i32_le(value_bounds, 0)
    else:
        values = []
    offset_deltas: list[int] | None = None
    ts_deltas: list[int] | None = None
    headers: list[tuple[Header, ...]] | None = None
    start, pos = _decode_plain_values(
        data, pos, end, first, min(count, stop_delta), values, packed_values, value_bounds
    )
    stopped = False
    for i in range(start, count):
        record_start = pos
        # length (a record count larger than the records present shows as a record
        # running past ``end`` or an IndexError: no bounds check needed here)
        b = data[pos]
        if b < 0x80:
            u = b
            pos += 1
        else:
            c = data[pos + 1]
            if c < 0x80:
                u = (b & 0x7F) | (c << 7)
                pos += 2
            else:
                u, pos = _uvarint(data, pos)
        if u & 1 or u < 12:  # negative, or shorter than the 6 one-byte fields
            raise CorruptRecordError(f"invalid record length {(u >> 1) ^ -(u & 1)}")
        record_end = pos + (u >> 1)
        if record_end > end:
            raise CorruptRecordError("record runs past its batch")
        # attributes (unused), then timestampDelta
        ts_delta = 0
        if data[pos + 1] == 0:
            pos += 2
        else:
            u, pos = _uvarint(data, pos + 1)
            ts_delta = (u >> 1) ^ -(u & 1)
        # offsetDelta
        b = data[pos]
        if b < 0x80:
            u = b
            pos += 1
        else:
            c = data[pos + 1]
            if c < 0x80:
                u = (b & 0x7F) | (c << 7)
                pos += 2
            else:
                u, pos = _uvarint(data, pos)
        offset_delta = (u >> 1) ^ -(u & 1)
        if offset_delta >= stop_delta:
            pos = record_start
            stopped = True
            break
        decoded = i - first  # records of this decode before this one
        if ts_deltas is not None:
            ts_deltas.append(ts_delta)
        elif ts_delta != 0:
            ts_deltas = [0] * decoded
            ts_deltas.append(ts_delta)
        if offset_deltas is not None:
            offset_deltas.append(offset_delta)
        elif u != i << 1:  # the first gap (a compacted batch): materialise the column
            offset_deltas = list(range(first, i))
            offset_deltas.append(offset_delta)
        # key
        b = data[pos]
        if b == 1:
            pos += 1
            if keys is not None:
                keys.append(None)
            elif packed_keys is not None:
                key_nulls.append(decoded)
                write_i32_le(key_bounds, i32(len(packed_keys)))
        else:
            u, pos = _uvarint(data, pos)
            if u & 1:
                raise CorruptRecordError(f"invalid key length {(u >> 1) ^ -(u & 1)}")
            n = u >> 1
            if pack:
                if packed_keys is None:  # the first key: the records before had none
                    packed_keys = BytesWriter()
                    for _ in range(decoded + 1):
                        write_i32_le(key_bounds, 0)
                    key_nulls = list(range(decoded))
                packed_keys.write(data[pos : pos + n])
                if len(packed_keys) > _MAX_PACKED:
                    raise OverflowError("a packed column holds under 2 GiB")
                write_i32_le(key_bounds, i32(len(packed_keys)))
            else:
                if keys is None:
                    keys = [None] * decoded
                keys.append(data[pos : pos + n])
            pos += n
        # value
        b = data[pos]
        if b < 0x80:
            u = b
            pos += 1
        else:
            c = data[pos + 1]
            if c < 0x80:
                u = (b & 0x7F) | (c << 7)
                pos += 2
            else:
                u, pos = _uvarint(data, pos)
        if u & 1:
            if u != 1:
                raise CorruptRecordError(f"invalid value length {(u >> 1) ^ -(u & 1)}")
            if values is not None:
                values.append(None)
            else:
                if value_nulls is None:
                    value_nulls = []
                value_nulls.append(decoded)
                write_i32_le(value_bounds, i32(len(packed_values)))
        else:
            n = u >> 1
            if values is not None:
                values.append(data[pos : pos + n])
            else:
                packed_values.write(data[pos : pos + n])
                if len(packed_values) > _MAX_PACKED:
                    raise OverflowError("a packed column holds under 2 GiB")
                write_i32_le(value_bounds, i32(len(packed_values)))
            pos += n
        # headers
        if data[pos] == 0:
            pos += 1
            if headers is not None:
                headers.append(())
        else:
            if headers is None:
                headers = [()] * decoded
            record_headers, pos = _decode_headers(data, pos)
            headers.append(record_headers)
        if pos != record_end:
            raise CorruptRecordError("record length disagrees with its fields")
    if not stopped and pos != end:
        raise CorruptRecordError(f"{end - pos} bytes after the last of {count} records")

    n = len(values) if values is not None else len(value_bounds) // 4 - 1
    offsets: Sequence[int]
    if offset_deltas is None:
        offsets = range(base_offset + first, base_offset + first + n)
    else:
        offsets = [base_offset + delta for delta in offset_deltas]
    timestamps: Sequence[int]
    if append_time is not None:
        timestamps = [append_time] * n
    elif ts_deltas is None:
        timestamps = [base_timestamp] * n
    else:
        timestamps = [base_timestamp + delta for delta in ts_deltas]
    if values is None:
        return PackedColumns(
            offsets,
            timestamps,
            None
            if packed_keys is None
            else PackedBinary(packed_keys.getvalue(), key_bounds.getvalue(), key_nulls or None),
            PackedBinary(packed_values.getvalue(), value_bounds.getvalue(), value_nulls),
            headers if headers is not None else [()] * n,
            timestamp_type,
        )
    return RecordColumns(
        offsets,
        timestamps,
        keys if keys is not None else [None] * n,
        values,
        headers if headers is not None else [()] * n,
        timestamp_type,
    )


def decode_plain_values(data: bytes, pos: int, end: int, count: int) -> list[bytes] | None:
    """The values of the ``count`` records in ``data[pos:end]`` when every one is plain
    (see ``_decode_plain_values``: what a producer of lines writes), else None.

    The renderer's fast path: a plain batch renders from its values alone, with no
    other column built. Plain records are checked byte for byte, the count and the
    batch end too, so None also covers any malformed batch (the general decoder then
    reports it).

    Cost: about 0.03 µs a record plus the copy of its value.
    """
    if count < 0 or count > 8192:
        return None
    values: list[bytes | None] = []
    try:
        decoded, pos = _decode_plain_values(data, pos, end, 0, count, values)
    except IndexError:  # a count beyond the records, at the end of ``data``
        return None
    if decoded != count or pos != end:
        return None
    return values  # type: ignore[return-value]  # a plain record's value is never null


def decode_packed_columns(
    data: bytes,
    pos: int,
    end: int,
    count: int,
    base_offset: int,
    base_timestamp: int,
    timestamp_type: TimestampType,
    append_time: int | None,
    start_offset: int | None = None,
    end_offset: int | None = None,
    scratch: BytesWriter | None = None,
) -> PackedColumns:
    """``pack_columns(decode_record_columns(...))`` with the same arguments, without a
    Python object per value or key: each is copied straight from ``data`` into its
    packed buffer. Records before and after the range, and malformed ones, are treated
    exactly as ``decode_record_columns`` treats them.

    ``scratch``, when given, is where the values are gathered before their final copy
    (its content is discarded, its capacity kept): a caller decoding batch after batch
    passes the same one, so the buffer is not grown afresh for every batch. A fresh
    buffer growing to a batch's 100 KiB or more was measured at 170 ns a 100-byte
    value against 55 ns reused (mypyc, one process): its reallocations, and the pages
    that glibc maps afresh above its mmap threshold, cost more than the copy. Not
    shared between threads.

    Cost: as ``decode_record_columns``; each value and key is copied into its buffer
    (by way of a short-lived slice) and out of it once, with its bound.

    Raises:
        as ``decode_record_columns``; OverflowError as ``pack_binary``.
    """
    columns = _decode_columns(
        data, pos, end, count, base_offset, base_timestamp,
        timestamp_type, append_time, start_offset, end_offset, True, scratch,
    )  # fmt: skip
    assert isinstance(columns, PackedColumns)
    return columns


def _skip_records(
    data: bytes, pos: i64, end: i64, count: i64, target_delta: i64
) -> tuple[int, int]:
    """Skip the leading records whose offset delta is below ``target_delta``; return
    how many were skipped and where the first record kept starts.

    Reads only each record's length, timestamp delta (stepped over) and offset delta:
    nothing is copied. Lengths must chain within ``end``.
    """
    i: i64 = 0
    u: i64
    b: i64
    c: i64
    p: i64
    limit: i64
    record_end: i64
    while i < count:
        b = data[pos]
        if b < 0x80:
            u = b
            p = pos + 1
        else:
            c = data[pos + 1]
            if c < 0x80:
                u = (b & 0x7F) | (c << 7)
                p = pos + 2
            else:
                length, p = _uvarint(data, pos)
                if length >> 1 > end:
                    raise CorruptRecordError("record runs past its batch")
                u = length
        if u & 1 or u < 12:  # negative, or shorter than the 6 one-byte fields
            raise CorruptRecordError(f"invalid record length {(u >> 1) ^ -(u & 1)}")
        record_end = p + (u >> 1)
        if record_end > end:
            raise CorruptRecordError("record runs past its batch")
        # attributes, then the timestampDelta varlong, stepped over
        p += 1
        limit = p + 10
        while data[p] >= 0x80:
            p += 1
            if p == limit:
                raise CorruptRecordError("varint longer than 10 bytes")
        p += 1
        if p >= record_end:
            raise CorruptRecordError("record length disagrees with its fields")
        # offsetDelta
        b = data[p]
        if b < 0x80:
            u = b
        else:
            c = data[p + 1]
            if c >= 0x80:  # three bytes or more: rare, and no native int needed
                delta, _ = _uvarint(data, p)
                if (delta >> 1) ^ -(delta & 1) >= target_delta:
                    return i, pos
                pos = record_end
                i += 1
                continue
            u = (b & 0x7F) | (c << 7)
        if (u >> 1) ^ -(u & 1) >= target_delta:
            return i, pos
        pos = record_end
        i += 1
    return i, pos


def _decode_plain_values(
    data: bytes,
    pos: i64,
    end: i64,
    first: i64,
    count: i64,
    values: list[bytes | None] | None,
    packed: BytesWriter | None = None,
    bounds: BytesWriter | None = None,
) -> tuple[int, int]:
    """Append the values of the run of plain records from record ``first`` (at ``pos``)
    up to record ``count`` (excluded) to ``values``; return the index of the record
    after the run and where it starts.

    With ``values`` None, each value is written to ``packed`` instead and the running
    length of ``packed`` after it to ``bounds`` (int32 little-endian): the packed
    decoder's loop, the same checks. A run is under 8192 values of under 8 KiB each,
    so its lengths fit an int32.

    A plain record is what a producer of lines writes: no key, no headers, the
    batch's timestamp, the next offset, a value under 8 KiB. Its bytes are fixed but
    for the lengths (``length | 00 00 offsetDelta 01 | valueLength | value | 00``), so
    checking them is cheaper than decoding each field. The first record that differs
    (or does not parse) stops the run; the general loop then takes over from it and
    reports any corruption.
    """
    # Native 64-bit locals (mypyc): every value here is bounded (one- and two-byte
    # varints, positions within a batch), and untagged arithmetic makes this loop
    # about 1.4x faster than with Python ints.
    i: i64 = first
    u: i64
    b: i64
    c: i64
    p: i64
    record_end: i64
    value_end: i64
    limit: i64 = min(count, 8192)  # offset deltas of 8192 and up take three bytes
    while i < limit:
        b = data[pos]
        if b < 0x80:
            u = b
            p = pos + 1
        else:
            c = data[pos + 1]
            if c >= 0x80:
                break
            u = (b & 0x7F) | (c << 7)
            p = pos + 2
        record_end = p + (u >> 1)
        if u & 1 or record_end > end or data[p + 1]:  # negative length, overrun, ts delta
            break
        if i < 64:
            if data[p + 2] != i << 1:
                break
            p += 3
        else:
            if data[p + 2] != ((i << 1) & 0x7F) | 0x80 or data[p + 3] != i >> 6:
                break
            p += 4
        if data[p] != 1:  # a key
            break
        b = data[p + 1]
        if b < 0x80:
            p += 2
        else:
            c = data[p + 2]
            if c >= 0x80:
                break
            b = (b & 0x7F) | (c << 7)
            p += 3
        value_end = p + (b >> 1)
        if b & 1 or value_end + 1 != record_end or data[value_end]:  # null value, headers
            break
        if values is not None:
            values.append(data[p:value_end])
        elif packed is not None and bounds is not None:
            # The slice is freed at once: no object outlives its record.
            packed.write(data[p:value_end])
            write_i32_le(bounds, i32(len(packed)))
        pos = record_end
        i += 1
    return i, pos


def _decode_headers(data: bytes, pos: int) -> tuple[tuple[Header, ...], int]:
    count, pos = decode_varint(data, pos, 5)
    if count < 0:
        raise CorruptRecordError(f"invalid header count {count}")
    headers = []
    for _ in range(count):
        key_len, pos = decode_varint(data, pos, 5)
        if key_len < 0:
            raise CorruptRecordError("null header key")
        key = data[pos : pos + key_len].decode("utf-8")
        pos += key_len
        value_len, pos = decode_varint(data, pos, 5)
        value: bytes | None = None
        if value_len >= 0:
            value = data[pos : pos + value_len]
            pos += value_len
        elif value_len != -1:
            raise CorruptRecordError(f"invalid header value length {value_len}")
        headers.append((key, value))
    return tuple(headers), pos


def columns_from_records(records: Sequence[Record]) -> RecordColumns:
    """Columns of already-decoded records (legacy formats decode record by record)."""
    offsets = [r.offset for r in records]
    first = offsets[0] if offsets else 0
    contiguous = offsets == list(range(first, first + len(offsets)))
    return RecordColumns(
        range(first, first + len(offsets)) if contiguous else offsets,
        [r.timestamp for r in records],
        [r.key for r in records],
        [r.value for r in records],
        [r.headers for r in records],
        records[0].timestamp_type if records else TimestampType.CREATE_TIME,
    )

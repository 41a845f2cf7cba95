"""The cleaner's scan of a batch: its records' keys and offsets, and which are
tombstones, without their values (compiled with mypyc: see ``setup.py``).

Both scans of a cleaning pass need only this of every record: the offset map's build
takes each key and offset, the recopy looks each up to decide what stays (see
``cleaner``). Decoding whole records (``RecordBatch.columns()``) would also copy every
value into a ``bytes`` object only to drop it; the key scan reads a v2 record's fields
in place and copies only its key (a dictionary needs a ``bytes`` object to hash).

One decoder stays the reference: the scan takes only records it can read fully and
exactly as ``record_columns.decode_record_columns`` reads them, every varint of at most
5 bytes (10 for the timestamp delta) and no headers, and checks every length, the
record count and the batch end as that decoder does. On anything else (headers, a
malformed or unusual field, a legacy batch) it gives up before returning anything and
the batch is decoded by ``columns()``, which then reports damage as it always has. So
both give the same keys, offsets and tombstones, or the same error.

Cost: a few nanoseconds a record to step over its fields, plus one ``bytes`` object
per key and one ``int`` per offset (the columns the offset map takes).

Thread-safety: functions of their arguments only; a ``BatchKeys`` is immutable.
"""

from __future__ import annotations

from typing import Final

from mypy_extensions import i64

from ..record.record_batch import DefaultRecordBatch, RecordBatch

__all__ = ["BatchKeys", "batch_keys", "scan_keys"]

_MAX_VARINT_BYTES: Final = 5
"""Longest varint the scan reads for a length or an offset delta: 35 bits, enough for
any int32; a longer (non-canonical) encoding goes to the general decoder."""
_MAX_VARLONG_BYTES: Final = 10
"""Longest timestamp delta (a varlong), as the general decoder allows."""
_STOP_DELTA: Final = 1 << 32
"""An offset delta the general decoder stops at (deltas are int32: none valid reaches it)."""


class BatchKeys:
    """The keys and offsets of a batch's records, in order, and which are tombstones.

    ``keys[i]`` is None for a record without a key; ``nulls`` is None when no record
    has a null value, else ``nulls[i]`` tells whether record ``i``'s value is null.
    The attributes are ``Final``.
    """

    __slots__ = ("keys", "nulls", "offsets")

    def __init__(
        self, keys: list[bytes | None], offsets: list[int], nulls: list[bool] | None
    ) -> None:
        self.keys: Final = keys
        self.offsets: Final = offsets
        self.nulls: Final = nulls

    def __len__(self) -> int:
        return len(self.offsets)


def batch_keys(batch: RecordBatch) -> BatchKeys:
    """The keys, offsets and tombstones of every record of ``batch``: the key scan for
    a v2 batch it can read (see the module doc), else a decode by ``columns()``.

    Cost: as the module doc says; a decompression first for a compressed batch.

    Raises:
        CorruptRecordError: the records do not decode (as ``columns()``).
    """
    if isinstance(batch, DefaultRecordBatch):
        data, pos, end = batch._records_bytes()
        scanned = scan_keys(data, pos, end, batch.records_count, batch.base_offset)
        if scanned is not None:
            return scanned
    columns = batch.columns()
    keys = columns.keys if isinstance(columns.keys, list) else list(columns.keys)
    values = columns.values if isinstance(columns.values, list) else list(columns.values)
    nulls: list[bool] | None = None
    for i in range(len(values)):
        if values[i] is None:
            nulls = [value is None for value in values]
            break
    return BatchKeys(keys, list(columns.offsets), nulls)


def _uvarint(data: bytes, pos: i64, limit: i64) -> tuple[i64, i64]:
    # (value, position after) of the unsigned varint at ``pos`` of at most ``limit``
    # bytes (limit <= 5: the value fits 35 bits), or (0, -1) when it is longer.
    b: i64 = data[pos]
    if b < 0x80:
        return b, pos + 1
    u: i64 = b & 0x7F
    shift: i64 = 7
    p: i64 = pos + 1
    stop: i64 = pos + limit
    while p < stop:
        b = data[p]
        p += 1
        u |= (b & 0x7F) << shift
        if b < 0x80:
            return u, p
        shift += 7
    return 0, -1


def scan_keys(data: bytes, pos: i64, end: i64, count: i64, base_offset: int) -> BatchKeys | None:
    """The keys, offsets and tombstones of the ``count`` v2 records in ``data[pos:end]``
    (a batch whose first offset is ``base_offset``), or None when a record is not one
    the scan takes (see the module doc): then nothing was decided, and
    ``decode_record_columns`` must decode the batch (and report any damage).

    Cost: O(records), one key copy and one offset ``int`` a record.
    """
    if count < 0:
        return None
    keys: list[bytes | None] = []
    offsets: list[int] = []
    nulls: list[bool] | None = None
    i: i64 = 0
    u: i64
    p: i64
    n: i64
    record_end: i64
    stop: i64
    try:
        while i < count:
            # length: even (not negative), at least the 6 one-byte fields, inside the batch
            u, p = _uvarint(data, pos, _MAX_VARINT_BYTES)
            if p < 0 or u & 1 or u < 12:
                return None
            record_end = p + (u >> 1)
            if record_end > end:
                return None
            # attributes (unused), then the timestampDelta varlong, stepped over
            p += 1
            stop = p + _MAX_VARLONG_BYTES
            while data[p] >= 0x80:
                p += 1
                if p >= stop:
                    return None
            p += 1
            # offsetDelta
            u, p = _uvarint(data, p, _MAX_VARINT_BYTES)
            if p < 0:
                return None
            delta: i64 = (u >> 1) ^ -(u & 1)
            if delta >= _STOP_DELTA:  # where the general decoder stops: let it
                return None
            offsets.append(base_offset + int(delta))
            # key: null (-1), or its length and bytes
            if data[p] == 1:
                p += 1
                keys.append(None)
            else:
                u, p = _uvarint(data, p, _MAX_VARINT_BYTES)
                if p < 0 or u & 1:
                    return None
                n = u >> 1
                if p + n > record_end:
                    return None
                keys.append(data[p : p + n])
                p += n
            # value: null (a tombstone), or stepped over
            u, p = _uvarint(data, p, _MAX_VARINT_BYTES)
            if p < 0:
                return None
            if u & 1:
                if u != 1:
                    return None
                if nulls is None:
                    nulls = [False] * int(i)
                nulls.append(True)
            else:
                p += u >> 1
                if nulls is not None:
                    nulls.append(False)
            # headers: none (a record with headers goes to the general decoder, which
            # also checks that their keys are UTF-8)
            if p >= record_end or data[p] != 0:
                return None
            if p + 1 != record_end:
                return None
            pos = record_end
            i += 1
    except IndexError:  # the records run past ``data``: the general decoder reports it
        return None
    if pos != end:
        return None
    return BatchKeys(keys, offsets, nulls)

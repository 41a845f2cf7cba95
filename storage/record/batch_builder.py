"""Building v2 record batches (Kafka's ``MemoryRecordsBuilder`` for magic 2).

The builder takes columns (values, keys, timestamps, headers) rather than record
objects: producers hand over lists of lines or Arrow columns, and not creating an
object per record is most of what makes the append path fast.

Pure functions: thread-safe.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Final

import crc32c
from librt.strings import BytesWriter
from mypy_extensions import i64

from .compression import compress
from .record import CompressionType, Header, TimestampType
from .record_batch import (
    ATTRIBUTES_OFFSET,
    BATCH_HEADER,
    CONTROL_FLAG_MASK,
    CRC_OFFSET,
    LOG_OVERHEAD,
    MAGIC_V2,
    NO_PARTITION_LEADER_EPOCH,
    NO_PRODUCER_ID,
    RECORD_BATCH_OVERHEAD,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_FLAG_MASK,
)
from .varint import SMALL_VARINT_LIMIT, SMALL_VARINTS, encode_varint

_SMALL: Final = SMALL_VARINT_LIMIT
# attributes(0) + timestampDelta(0) + offsetDelta(i) + keyLength(-1): the bytes between a
# record's length and its value length when it has no key and the batch's timestamp.
_NULL_KEY_PREFIX = tuple(b"\x00\x00" + v + b"\x01" for v in SMALL_VARINTS)
# attributes(0) + timestampDelta(0) + offsetDelta(i): the start of any record with the
# batch's timestamp.
_RECORD_PREFIX = tuple(b"\x00\x00" + v for v in SMALL_VARINTS)
_CRC = struct.Struct(">I")


def build_record_batch(
    values: Sequence[bytes | None],
    *,
    timestamps: Sequence[int] | int,
    keys: Sequence[bytes | None] | None = None,
    headers: Sequence[Sequence[Header]] | None = None,
    base_offset: int = 0,
    codec: CompressionType = CompressionType.NONE,
    timestamp_type: TimestampType = TimestampType.CREATE_TIME,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    is_transactional: bool = False,
    is_control: bool = False,
    offset_deltas: Sequence[int] | None = None,
    last_offset_delta: int | None = None,
) -> bytes:
    """Encode one v2 batch.

    ``timestamps`` is one timestamp for every record or one per record. Under
    ``LOG_APPEND_TIME`` pass the append time: Kafka then reports the batch's
    maxTimestamp for every record. ``offset_deltas`` (default ``0..n-1``) and
    ``last_offset_delta`` let a rewrite (compaction) keep the original offsets, gaps
    included; an empty batch needs ``last_offset_delta``.

    Cost: O(total bytes); records without key, headers or own timestamp take a
    precomputed fast path.

    Raises:
        ValueError: columns of different lengths, or an empty batch without
            ``last_offset_delta``.
    """
    n = len(values)
    if keys is not None and len(keys) != n:
        raise ValueError("keys and values differ in length")
    if headers is not None and len(headers) != n:
        raise ValueError("headers and values differ in length")
    if offset_deltas is not None and len(offset_deltas) != n:
        raise ValueError("offset_deltas and values differ in length")
    if isinstance(timestamps, int):
        base_timestamp = max_timestamp = timestamps
        ts_deltas: Sequence[int] | None = None
    else:
        if len(timestamps) != n:
            raise ValueError("timestamps and values differ in length")
        base_timestamp = timestamps[0] if n else -1
        max_timestamp = max(timestamps) if n else -1
        ts_deltas = [t - base_timestamp for t in timestamps]
        if not any(ts_deltas):
            ts_deltas = None
    if last_offset_delta is None:
        if n == 0:
            raise ValueError("an empty batch needs last_offset_delta")
        last_offset_delta = offset_deltas[-1] if offset_deltas is not None else n - 1

    if keys is None and headers is None and ts_deltas is None and offset_deltas is None:
        body = _encode_plain_records(values)
    else:
        body = _encode_records(values, keys, headers, ts_deltas, offset_deltas)
    if codec is not CompressionType.NONE:
        body = compress(codec, body)

    attributes = int(codec)
    if timestamp_type is TimestampType.LOG_APPEND_TIME:
        attributes |= TIMESTAMP_TYPE_MASK
    if is_transactional:
        attributes |= TRANSACTIONAL_FLAG_MASK
    if is_control:
        attributes |= CONTROL_FLAG_MASK
    header = bytearray(
        BATCH_HEADER.pack(
            base_offset,
            RECORD_BATCH_OVERHEAD - LOG_OVERHEAD + len(body),
            partition_leader_epoch,
            MAGIC_V2,
            0,  # crc, patched below once the bytes it covers are final
            attributes,
            last_offset_delta,
            base_timestamp,
            max_timestamp,
            producer_id,
            producer_epoch,
            base_sequence,
            n,
        )
    )
    crc = crc32c.crc32c(body, crc32c.crc32c(header[ATTRIBUTES_OFFSET:]))
    _CRC.pack_into(header, CRC_OFFSET, crc)
    # One copy of the body, into the result (``header += body`` then ``bytes()`` would
    # copy it twice).
    return b"".join((header, body))


def _encode_plain_records(values: Sequence[bytes | None]) -> bytes:
    # Records with no key, no headers and the batch's timestamp: each is
    # length | 00 00 offsetDelta 01 | valueLength | value | 00.
    # Written into one BytesWriter (mypyc's growable buffer, its writes native calls):
    # five parts a record joined at the end cost a third more.
    small = SMALL_VARINTS
    prefixes = _NULL_KEY_PREFIX
    out = BytesWriter()
    # Native 64-bit locals for mypyc: counts and lengths of one batch.
    i: i64 = 0
    n: i64
    length: i64
    for value in _as_list(values):
        mid = prefixes[i] if i < _SMALL else b"\x00\x00" + encode_varint(i) + b"\x01"
        i += 1
        if value is None:
            out.write(small[len(mid) + 2])
            out.write(mid)
            out.write(b"\x01\x00")
            continue
        n = len(value)
        value_len = small[n] if n < _SMALL else encode_varint(n)
        length = len(mid) + len(value_len) + n + 1
        out.write(small[length] if length < _SMALL else encode_varint(length))
        out.write(mid)
        out.write(value_len)
        out.write(value)
        out.append(0)
    return out.getvalue()


def _encode_records(
    values: Sequence[bytes | None],
    keys: Sequence[bytes | None] | None,
    headers: Sequence[Sequence[Header]] | None,
    ts_deltas: Sequence[int] | None,
    offset_deltas: Sequence[int] | None,
) -> bytes:
    # Every field goes straight into one BytesWriter; the record length is summed
    # from the fields' sizes rather than by encoding each record apart first.
    small = SMALL_VARINTS
    prefixes = _RECORD_PREFIX
    out = BytesWriter()
    n: i64
    length: i64
    value_list = _as_list(values)
    key_list = None if keys is None else _as_list(keys)
    for i in range(len(value_list)):
        offset_delta = offset_deltas[i] if offset_deltas is not None else i
        ts_delta = ts_deltas[i] if ts_deltas is not None else 0
        if ts_delta == 0 and 0 <= offset_delta < _SMALL:
            prefix = prefixes[offset_delta]
        else:
            prefix = b"\x00" + encode_varint(ts_delta) + encode_varint(offset_delta)
        key = key_list[i] if key_list is not None else None
        value = value_list[i]
        header_bytes = b"\x00"
        if headers is not None:
            record_headers = headers[i]
            if record_headers:
                header_bytes = _encode_headers(record_headers)
        length = len(prefix) + len(header_bytes)
        if key is None:
            key_len = b"\x01"
        else:
            n = len(key)
            key_len = small[n] if n < _SMALL else encode_varint(n)
            length += n
        if value is None:
            value_len = b"\x01"
        else:
            n = len(value)
            value_len = small[n] if n < _SMALL else encode_varint(n)
            length += n
        length += len(key_len) + len(value_len)
        out.write(small[length] if length < _SMALL else encode_varint(length))
        out.write(prefix)
        out.write(key_len)
        if key is not None:
            out.write(key)
        out.write(value_len)
        if value is not None:
            out.write(value)
        out.write(header_bytes)
    return out.getvalue()


def _as_list(column: Sequence[bytes | None]) -> list[bytes | None]:
    # Producers pass lists; compiled code indexes a list natively, any other
    # sequence through the generic protocol.
    return column if isinstance(column, list) else list(column)


def _encode_headers(headers: Sequence[Header]) -> bytes:
    fields = [encode_varint(len(headers))]
    for header_key, header_value in headers:
        _append_bytes_field(fields, header_key.encode("utf-8"))
        _append_bytes_field(fields, header_value)
    return b"".join(fields)


def _append_bytes_field(fields: list[bytes], data: bytes | None) -> None:
    if data is None:
        fields.append(b"\x01")
    else:
        fields.append(encode_varint(len(data)))
        fields.append(data)

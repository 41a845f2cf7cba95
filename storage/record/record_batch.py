"""Reading record batches: v2 (``DefaultRecordBatch``) and legacy v0/v1 entries.

Every format starts with ``baseOffset int64 | length int32`` (the 12-byte log overhead)
and keeps its magic at byte 16, so a batch's size (``length + 12``) and format are known
from its first 17 bytes. That is all ``FileRecords`` needs to walk a segment.

v2 header (61 bytes, big-endian)::

    0 baseOffset int64 | 8 batchLength int32 | 12 partitionLeaderEpoch int32 | 16 magic int8
    17 crc uint32 (CRC-32C of bytes [21, end)) | 21 attributes int16 | 23 lastOffsetDelta int32
    27 baseTimestamp int64 | 35 maxTimestamp int64 | 43 producerId int64
    51 producerEpoch int16 | 53 baseSequence int32 | 57 recordsCount int32 | 61 records...

A batch object is a view over a caller's buffer (no copy); it is immutable and thread-safe.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Protocol

import crc32c
from librt.strings import BytesWriter

from ..errors import CorruptRecordError, InvalidRecordError, RecordTooLargeError
from . import legacy_record
from .compression import decompress
from .record import CompressionType, Record, TimestampType
from .record_columns import (
    PackedColumns,
    RecordColumns,
    columns_from_records,
    decode_packed_columns,
    decode_plain_values,
    decode_record_columns,
    pack_columns,
)

LOG_OVERHEAD = 12
"""Bytes before the size-counted part of any batch: baseOffset + length."""
HEADER_SIZE_UP_TO_MAGIC = 17
"""Bytes needed to know a batch's size and format."""
RECORD_BATCH_OVERHEAD = 61
"""Size of the v2 batch header."""
MAGIC_V0, MAGIC_V1, MAGIC_V2 = 0, 1, 2
NO_PRODUCER_ID = -1
NO_PARTITION_LEADER_EPOCH = -1

# Smallest legal size of each format, counted from byte 0 (Kafka's LegacyRecord
# RECORD_OVERHEAD_V0/V1 + log overhead, and the v2 header).
MIN_BATCH_SIZE = {MAGIC_V0: LOG_OVERHEAD + 14, MAGIC_V1: LOG_OVERHEAD + 22, MAGIC_V2: 61}

CRC_OFFSET = 17
ATTRIBUTES_OFFSET = 21
MAX_TIMESTAMP_OFFSET = 35
BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")
PEEK_HEADER = struct.Struct(">qiib")

COMPRESSION_CODEC_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_FLAG_MASK = 0x10
CONTROL_FLAG_MASK = 0x20
DELETE_HORIZON_FLAG_MASK = 0x40


class RecordBatch(Protocol):
    """What every batch format offers (Kafka's ``RecordBatch`` interface)."""

    @property
    def position(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def magic(self) -> int: ...
    @property
    def base_offset(self) -> int: ...
    @property
    def last_offset(self) -> int: ...
    @property
    def next_offset(self) -> int: ...
    @property
    def max_timestamp(self) -> int: ...
    @property
    def timestamp_type(self) -> TimestampType: ...
    @property
    def codec(self) -> CompressionType: ...
    @property
    def is_control(self) -> bool: ...
    @property
    def is_transactional(self) -> bool: ...

    def is_valid(self) -> bool: ...
    def checksum(self) -> int: ...
    def records(self) -> list[Record]: ...
    def columns(
        self, start_offset: int | None = None, end_offset: int | None = None
    ) -> RecordColumns: ...
    def packed_columns(
        self,
        start_offset: int | None = None,
        end_offset: int | None = None,
        scratch: BytesWriter | None = None,
    ) -> PackedColumns: ...
    def to_bytes(self) -> bytes: ...


class DefaultRecordBatch:
    """A v2 record batch at ``buffer[start:start + size]``.

    ``position`` is the batch's byte position in its segment (``-1`` when not from a file).
    Header fields are parsed on construction; records only when ``records()`` is called.
    """

    __slots__ = (
        "_buffer",
        "_start",
        "attributes",
        "base_offset",
        "base_sequence",
        "base_timestamp",
        "crc",
        "last_offset_delta",
        "magic",
        "max_timestamp",
        "partition_leader_epoch",
        "position",
        "producer_epoch",
        "producer_id",
        "records_count",
        "size",
    )
    attributes: int
    base_offset: int
    base_sequence: int
    base_timestamp: int
    crc: int
    last_offset_delta: int
    magic: int
    max_timestamp: int
    partition_leader_epoch: int
    producer_epoch: int
    producer_id: int
    records_count: int

    def __init__(self, buffer: bytes, start: int = 0, position: int = -1) -> None:
        if len(buffer) - start < RECORD_BATCH_OVERHEAD:
            raise CorruptRecordError("v2 batch shorter than its 61-byte header", position=position)
        (
            self.base_offset,
            length,
            self.partition_leader_epoch,
            self.magic,
            self.crc,
            self.attributes,
            self.last_offset_delta,
            self.base_timestamp,
            self.max_timestamp,
            self.producer_id,
            self.producer_epoch,
            self.base_sequence,
            self.records_count,
        ) = BATCH_HEADER.unpack_from(buffer, start)
        self.size = length + LOG_OVERHEAD
        if self.size < RECORD_BATCH_OVERHEAD or start + self.size > len(buffer):
            raise CorruptRecordError(f"v2 batch claims {self.size} bytes", position=position)
        self._buffer = buffer
        self._start = start
        self.position = position

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        """Offset after this batch; compaction gaps make this differ from a record count."""
        return self.base_offset + self.last_offset_delta + 1

    @property
    def codec(self) -> CompressionType:
        code = self.attributes & COMPRESSION_CODEC_MASK
        if code == 0:  # the common case, without the enum's (interpreted) lookup
            return CompressionType.NONE
        try:
            return CompressionType(code)
        except ValueError:
            raise CorruptRecordError(
                f"unknown compression codec {code}", position=self.position
            ) from None

    @property
    def timestamp_type(self) -> TimestampType:
        if self.attributes & TIMESTAMP_TYPE_MASK:
            return TimestampType.LOG_APPEND_TIME
        return TimestampType.CREATE_TIME

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_FLAG_MASK)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_FLAG_MASK)

    @property
    def delete_horizon_ms(self) -> int | None:
        """The cleaner's delete horizon (= baseTimestamp when the flag is set), else None."""
        return self.base_timestamp if self.attributes & DELETE_HORIZON_FLAG_MASK else None

    @property
    def last_sequence(self) -> int:
        """Kafka's ``lastSequence``: baseSequence + lastOffsetDelta, wrapping at int32."""
        if self.base_sequence == -1:
            return -1
        return (self.base_sequence + self.last_offset_delta) & 0x7FFFFFFF

    def checksum(self) -> int:
        """CRC-32C of bytes [21, end), as it should be stored at byte 17."""
        start = self._start
        return int(
            crc32c.crc32c(memoryview(self._buffer)[start + ATTRIBUTES_OFFSET : start + self.size])
        )

    def is_valid(self) -> bool:
        """Magic 2, sane size, and a matching CRC-32C."""
        return self.magic == MAGIC_V2 and self.checksum() == self.crc

    def to_bytes(self) -> bytes:
        if self._start == 0 and len(self._buffer) == self.size:
            return self._buffer
        return self._buffer[self._start : self._start + self.size]

    def columns(
        self,
        start_offset: int | None = None,
        end_offset: int | None = None,
        *,
        max_size: int | None = None,
    ) -> RecordColumns:
        """Decode the records with ``start_offset <= offset < end_offset`` (every
        record by default) into columns, decompressing the batch if needed.

        ``max_size``: for a batch being appended, its ``max.message.bytes``: inflating
        stops as soon as the records' bytes pass it (``RecordTooLargeError``). A stored
        batch being read leaves it None (see ``compression.decompress``).

        Records outside the range are not decoded: those before it are skipped by
        their lengths and offset deltas, decoding stops at the first after it (see
        ``decode_record_columns``). Cost: a few ns a skipped record, about 0.04 µs a
        decoded one.

        Raises:
            CorruptRecordError: the records do not parse, their count disagrees with
                ``recordsCount``, or bytes are left over. The CRC is not checked here:
                callers that read untrusted bytes check ``is_valid()`` first.
            RecordTooLargeError: with ``max_size``, the records inflate past it.
        """
        data, pos, end = self._records_bytes(max_size)
        ts_type = self.timestamp_type
        append_time = self.max_timestamp if ts_type is TimestampType.LOG_APPEND_TIME else None
        try:
            return decode_record_columns(
                data, pos, end, self.records_count, self.base_offset, self.base_timestamp,
                ts_type, append_time, start_offset, end_offset,
            )  # fmt: skip
        except (IndexError, UnicodeDecodeError) as exc:
            raise CorruptRecordError(
                f"record does not parse: {exc}", position=self.position
            ) from exc
        except CorruptRecordError as exc:
            raise CorruptRecordError(exc.reason, position=self.position) from None

    def packed_columns(
        self,
        start_offset: int | None = None,
        end_offset: int | None = None,
        scratch: BytesWriter | None = None,
    ) -> PackedColumns:
        """``columns(start_offset, end_offset)`` with the values and keys each packed
        into one buffer (``PackedColumns``): for bulk consumers that copy them whole
        (the Spark source's Arrow arrays), with no Python object per record.
        ``scratch``: a writer to reuse from batch to batch (see
        ``decode_packed_columns``).

        Raises:
            CorruptRecordError: as ``columns()``.
            OverflowError: the values or keys of the range total 2 GiB or more.
        """
        data, pos, end = self._records_bytes()
        ts_type = self.timestamp_type
        append_time = self.max_timestamp if ts_type is TimestampType.LOG_APPEND_TIME else None
        try:
            return decode_packed_columns(
                data, pos, end, self.records_count, self.base_offset, self.base_timestamp,
                ts_type, append_time, start_offset, end_offset, scratch,
            )  # fmt: skip
        except (IndexError, UnicodeDecodeError) as exc:
            raise CorruptRecordError(
                f"record does not parse: {exc}", position=self.position
            ) from exc
        except CorruptRecordError as exc:
            raise CorruptRecordError(exc.reason, position=self.position) from None

    def plain_values(self) -> list[bytes] | None:
        """The values, when every record is plain: no key, no headers, the batch's
        timestamp, offsets ``base_offset`` on without gaps, a value under 8 KiB (the
        records of a producer of lines); else None. Cost: as ``columns()``, less the
        columns that are not values.
        """
        data, pos, end = self._records_bytes()
        return decode_plain_values(data, pos, end, self.records_count)

    def _records_bytes(self, max_size: int | None = None) -> tuple[bytes, int, int]:
        """The records' bytes (decompressed if needed, at most ``max_size`` of them:
        see ``compression.decompress``) and where they start and end."""
        codec = self.codec
        start = self._start
        if codec is CompressionType.NONE:
            return self._buffer, start + RECORD_BATCH_OVERHEAD, start + self.size
        body = memoryview(self._buffer)[start + RECORD_BATCH_OVERHEAD : start + self.size]
        data = decompress(codec, body, max_size=max_size)
        return data, 0, len(data)

    def records(self) -> list[Record]:
        """Decode every record of the batch. Raises as ``columns()``."""
        return self.columns().records()

    def __iter__(self) -> Iterator[Record]:
        return iter(self.records())

    def __repr__(self) -> str:
        return (
            f"DefaultRecordBatch(base_offset={self.base_offset}, last_offset={self.last_offset},"
            f" count={self.records_count}, position={self.position}, size={self.size})"
        )


class LegacyRecordBatch:
    """One legacy (magic 0 or 1) log entry at ``buffer[start:start + size]``.

    A shallow entry is either one message or a compressed wrapper around several;
    Kafka treats either as one batch whose last offset is the entry's offset.
    """

    __slots__ = ("_buffer", "_records", "_start", "last_offset", "magic", "position", "size")
    last_offset: int
    magic: int

    def __init__(self, buffer: bytes, start: int = 0, position: int = -1) -> None:
        self.last_offset, length, _crc, self.magic = PEEK_HEADER.unpack_from(buffer, start)
        self.size = length + LOG_OVERHEAD
        if self.size < MIN_BATCH_SIZE.get(self.magic, 1 << 31) or start + self.size > len(buffer):
            raise CorruptRecordError(f"legacy entry claims {self.size} bytes", position=position)
        self._buffer = buffer
        self._start = start
        self.position = position
        self._records: list[Record] | None = None

    def _entry(self) -> memoryview:
        return memoryview(self._buffer)[self._start : self._start + self.size]

    @property
    def base_offset(self) -> int:
        """First offset; for a compressed wrapper this needs decompression."""
        if self.codec is CompressionType.NONE:
            return self.last_offset
        records = self.records()
        return records[0].offset if records else self.last_offset

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1

    @property
    def max_timestamp(self) -> int:
        return legacy_record.legacy_entry_max_timestamp(self._entry())

    @property
    def timestamp_type(self) -> TimestampType:
        # A legacy entry keeps its attributes at byte 17, right after the magic (byte
        # 21 is where v2 keeps them): the header parser knows the layout.
        return legacy_record.legacy_entry_header(self._entry()).timestamp_type

    @property
    def codec(self) -> CompressionType:
        return legacy_record.legacy_entry_codec(self._entry())

    @property
    def is_control(self) -> bool:
        return False

    @property
    def is_transactional(self) -> bool:
        return False

    @property
    def crc(self) -> int:
        return int(struct.unpack_from(">I", self._buffer, self._start + LOG_OVERHEAD)[0])

    def checksum(self) -> int:
        import zlib

        start = self._start + HEADER_SIZE_UP_TO_MAGIC - 1
        return zlib.crc32(memoryview(self._buffer)[start : self._start + self.size])

    def is_valid(self) -> bool:
        return legacy_record.legacy_entry_is_valid(self._entry())

    def to_bytes(self) -> bytes:
        return self._buffer[self._start : self._start + self.size]

    def records(self) -> list[Record]:
        """Decode the entry (and its inner messages when compressed).

        Raises:
            CorruptRecordError: the entry or an inner message does not parse or check.
        """
        if self._records is None:
            try:
                self._records = legacy_record.legacy_entry_records(self._entry())
            except CorruptRecordError as exc:
                raise CorruptRecordError(exc.reason, position=self.position) from None
        return self._records

    def columns(
        self, start_offset: int | None = None, end_offset: int | None = None
    ) -> RecordColumns:
        """The records with ``start_offset <= offset < end_offset`` (all by default) as
        columns. Raises as ``records()``."""
        columns = columns_from_records(self.records())
        if start_offset is None and end_offset is None:
            return columns
        return columns.slice(-1 if start_offset is None else start_offset, end_offset)

    def packed_columns(
        self,
        start_offset: int | None = None,
        end_offset: int | None = None,
        scratch: BytesWriter | None = None,
    ) -> PackedColumns:
        """``columns(start_offset, end_offset)`` with values and keys packed (as
        ``DefaultRecordBatch.packed_columns``); legacy messages decode one by one, so
        this is that decode and a pack (``scratch`` unused). Raises as ``columns()``,
        and OverflowError."""
        return pack_columns(self.columns(start_offset, end_offset))

    def __iter__(self) -> Iterator[Record]:
        return iter(self.records())

    def __repr__(self) -> str:
        return (
            f"LegacyRecordBatch(magic={self.magic}, last_offset={self.last_offset},"
            f" position={self.position}, size={self.size})"
        )


def batch_size_at(buffer: bytes, start: int) -> tuple[int, int]:
    """``(size, magic)`` of the batch starting at ``buffer[start]`` from its first 17 bytes.

    Raises:
        CorruptRecordError: the size is below the format's minimum or the magic is unknown.
    """
    _offset, length, _epoch, magic = PEEK_HEADER.unpack_from(buffer, start)
    minimum = MIN_BATCH_SIZE.get(magic)
    if minimum is None:
        raise CorruptRecordError(f"unknown magic {magic}")
    size = length + LOG_OVERHEAD
    if size < minimum:
        raise CorruptRecordError(f"batch size {size} below the minimum {minimum}")
    return size, magic


def read_batch(buffer: bytes, start: int = 0, position: int = -1) -> RecordBatch:
    """The batch of whatever format starts at ``buffer[start]``.

    Raises:
        CorruptRecordError: unknown magic, or the batch does not fit the buffer.
    """
    magic = buffer[start + 16]
    if magic == MAGIC_V2:
        return DefaultRecordBatch(buffer, start, position)
    if magic in (MAGIC_V0, MAGIC_V1):
        return LegacyRecordBatch(buffer, start, position)
    raise CorruptRecordError(f"unknown magic {magic}", position=position)


def iter_batches(buffer: bytes, position: int = 0) -> Iterator[RecordBatch]:
    """Walk the complete batches in ``buffer``; stop silently at a partial tail.

    ``position`` is the file position of ``buffer[0]`` (for error messages and
    ``RecordBatch.position``). CRCs are not checked.

    Raises:
        CorruptRecordError: a header with an impossible size or magic.
    """
    start = 0
    n = len(buffer)
    while n - start >= HEADER_SIZE_UP_TO_MAGIC:
        try:
            size, _magic = batch_size_at(buffer, start)
        except CorruptRecordError as exc:
            raise CorruptRecordError(exc.reason, position=position + start) from None
        if start + size > n:
            return
        yield read_batch(buffer, start, position + start)
        start += size


# -- client batches: what a broker checks and patches on append --------------------


def validate_client_batch(batch: RecordBatch, max_message_bytes: int) -> DefaultRecordBatch:
    """Check a client-built batch as Kafka's ``LogValidator`` does before an append.

    A v2 batch with a matching CRC, at most ``max_message_bytes``, whose header count
    equals ``lastOffsetDelta + 1`` and whose records decode to exactly that many, with
    offset deltas 0, 1, 2, ...; not a control batch, not transactional (the log keeps
    no transaction state), and with a base sequence when it carries a producer id. A
    compressed batch's records are held to ``max_message_bytes`` too: inflating stops
    there (Kafka bounds only the compressed size; a few hundred KB of gzip can hold
    gigabytes).

    Cost: one CRC and one decode of the batch.

    Raises:
        CorruptRecordError: the CRC does not match (or the records do not parse).
        RecordTooLargeError: the batch, or its records once inflated, exceed
            ``max_message_bytes``.
        InvalidRecordError: any other rule above.
    """
    position = batch.position
    if not isinstance(batch, DefaultRecordBatch):
        raise InvalidRecordError(
            f"only v2 batches can be appended, not magic {batch.magic}", position
        )
    if not batch.is_valid():
        raise CorruptRecordError("CRC mismatch", position=position)
    if batch.size > max_message_bytes:
        raise RecordTooLargeError(batch.size, max_message_bytes)
    count_from_offsets = batch.last_offset_delta + 1
    if count_from_offsets <= 0:
        raise InvalidRecordError(f"lastOffsetDelta {batch.last_offset_delta} is negative", position)
    if batch.records_count <= 0:
        raise InvalidRecordError(f"record count {batch.records_count} is not positive", position)
    if count_from_offsets != batch.records_count:
        raise InvalidRecordError(
            f"lastOffsetDelta {batch.last_offset_delta} does not match the count of "
            f"{batch.records_count} records",
            position,
        )
    if batch.is_control:
        raise InvalidRecordError("clients may not write control batches", position)
    if batch.is_transactional:
        raise InvalidRecordError("transactional batches are not supported by this log", position)
    if batch.producer_id > NO_PRODUCER_ID and batch.base_sequence < 0:
        raise InvalidRecordError(
            f"producer id {batch.producer_id} without a base sequence", position
        )
    offsets = batch.columns(max_size=max_message_bytes).offsets
    expected = range(batch.base_offset, batch.base_offset + batch.records_count)
    if len(offsets) != batch.records_count or list(offsets) != list(expected):
        raise InvalidRecordError(
            "the records' offset deltas are not 0, 1, 2, ... up to the count", position
        )
    return batch


_INT64 = struct.Struct(">q")
_INT16 = struct.Struct(">h")
_UINT32 = struct.Struct(">I")


def patch_base_offset(raw: bytearray, base_offset: int) -> None:
    """Set the base offset of the batch in ``raw`` (bytes 0-7, outside the CRC), as a
    broker assigns offsets to a client batch without re-encoding it."""
    _INT64.pack_into(raw, 0, base_offset)


def patch_log_append_time(raw: bytearray, now: int) -> None:
    """Mark the v2 batch in ``raw`` LogAppendTime with max timestamp ``now``.

    Both fields are inside the CRC, so the CRC-32C is recomputed.
    """
    attributes = _INT16.unpack_from(raw, ATTRIBUTES_OFFSET)[0] | TIMESTAMP_TYPE_MASK
    _INT16.pack_into(raw, ATTRIBUTES_OFFSET, attributes)
    _INT64.pack_into(raw, MAX_TIMESTAMP_OFFSET, now)
    _UINT32.pack_into(raw, CRC_OFFSET, crc32c.crc32c(memoryview(raw)[ATTRIBUTES_OFFSET:]))

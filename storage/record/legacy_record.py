"""Read-only decoding of Kafka's legacy message formats, v0 and v1 (Kafka's ``LegacyRecord``).

A legacy log entry is one message preceded by its offset and size (all big-endian)::

    byte  field       type    note
    0     offset      int64   for a compressed wrapper: the absolute offset of its LAST
                              inner message; not covered by the CRC
    8     size        int32   bytes after this field; the entry is size + 12 bytes
    12    crc         uint32  CRC-32 (zlib.crc32, not CRC-32C) of bytes [16, end of entry)
    16    magic       int8    0 or 1
    17    attributes  int8    bits 0-2 codec (0 none, 1 gzip, 2 snappy, 3 lz4);
                              bit 3 timestamp type, v1 only (1 = LogAppendTime)
    18    timestamp   int64   v1 only; -1 = none
    18|26 keyLength   int32   -1 = null key
          key
          valueLength int32   -1 = null value
          value

A compressed entry is one wrapper message whose value decompresses to complete inner
entries of the same magic, none of them compressed. In v0 the inner offsets are
absolute. In v1 they are relative (0..n-1 as the producer wrote them) and the wrapper's
offset is the absolute offset of the last inner message, so
``absolute = wrapper offset - last inner offset + inner offset``. Under a v1 wrapper
with LogAppendTime every inner message reports the wrapper's timestamp; under
CreateTime each reports its own, and the wrapper holds their maximum.

Every function takes ``entry``, a buffer that starts at the entry's first byte. Bytes
past the entry's end (``size + 12``) are ignored, so a reader may pass a view of the
rest of a segment. Functions that raise take an optional ``position``, the entry's byte
position in its file: errors report it plus the byte of the problem within the entry.

Pure functions over immutable inputs: thread-safe.
"""

from __future__ import annotations

import struct
import zlib
from typing import NamedTuple

from ..errors import CorruptRecordError
from .compression import decompress
from .record import NO_TIMESTAMP, CompressionType, Record, TimestampType

__all__ = [
    "LOG_OVERHEAD",
    "LegacyEntryHeader",
    "legacy_entry_codec",
    "legacy_entry_header",
    "legacy_entry_is_valid",
    "legacy_entry_max_timestamp",
    "legacy_entry_records",
]

LOG_OVERHEAD = 12
"""Bytes of the offset and size fields that precede every message."""

_CRC_START = 16  # the CRC covers magic..end
_PREFIX = struct.Struct(">qiIbb")  # offset, size, crc, magic, attributes: 18 bytes
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")

# Bytes of a message with null key and value, counted from the crc field: what the
# size field must at least say (Kafka's RECORD_OVERHEAD_V0 / _V1).
_MIN_SIZE = {0: 14, 1: 22}
_CODEC_MASK = 0x07
_TIMESTAMP_TYPE_MASK = 0x08
# zstd (4) exists only from magic 2 on; Kafka rejects it in a legacy wrapper.
_MAX_LEGACY_CODEC = CompressionType.LZ4


class LegacyEntryHeader(NamedTuple):
    """The fixed fields of one legacy entry, as a segment dumper prints them.

    Parsing it checks the structure (lengths, magic, codec) but not the CRC: a dumper
    prints a corrupt entry's fields and ``isvalid: false`` from ``legacy_entry_is_valid``.
    """

    offset: int
    size: int
    """The size field: bytes after it. The whole entry is ``size + 12`` bytes."""
    crc: int
    magic: int
    attributes: int
    timestamp: int
    """The message's timestamp; -1 for magic 0."""
    key_size: int
    """-1 for a null key."""
    value_size: int
    """-1 for a null value."""

    @property
    def entry_size(self) -> int:
        """Bytes of the whole entry, offset and size fields included."""
        return self.size + LOG_OVERHEAD

    @property
    def codec(self) -> CompressionType:
        """The codec of attribute bits 0-2 (validated to be 0-3 when parsed)."""
        return CompressionType(self.attributes & _CODEC_MASK)

    @property
    def timestamp_type(self) -> TimestampType:
        """``NO_TIMESTAMP_TYPE`` for magic 0, else attribute bit 3."""
        if self.magic == 0:
            return TimestampType.NO_TIMESTAMP_TYPE
        if self.attributes & _TIMESTAMP_TYPE_MASK:
            return TimestampType.LOG_APPEND_TIME
        return TimestampType.CREATE_TIME


class _Message(NamedTuple):
    header: LegacyEntryHeader
    key_start: int
    value_start: int


def legacy_entry_header(entry: bytes | memoryview, *, position: int = 0) -> LegacyEntryHeader:
    """Return the fixed fields of the entry at the start of ``entry``.

    Does not check the CRC nor decompress. Runtime: O(1).

    Raises:
        CorruptRecordError: the entry is truncated, its size or a length is impossible,
            its magic is not 0 or 1, or its codec id is not 0-3.
    """
    return _parse_message(memoryview(entry), 0, position, inner=False).header


def legacy_entry_is_valid(entry: bytes | memoryview) -> bool:
    """Whether the entry's size is sane for its magic and its CRC-32 matches.

    This is Kafka's ``LegacyRecord.isValid``: it neither parses the key and value
    lengths nor decompresses, so a valid entry may still fail ``legacy_entry_records``.
    Runtime: O(size) for the CRC.
    """
    view = memoryview(entry)
    if len(view) < _PREFIX.size:
        return False
    _offset, size, crc, magic, _attributes = _PREFIX.unpack_from(view, 0)
    minimum = _MIN_SIZE.get(magic)
    if minimum is None or size < minimum or len(view) < LOG_OVERHEAD + size:
        return False
    return zlib.crc32(view[_CRC_START : LOG_OVERHEAD + size]) == int(crc)


def legacy_entry_codec(entry: bytes | memoryview, *, position: int = 0) -> CompressionType:
    """Return the codec of the entry (``NONE`` for a plain message).

    Raises:
        CorruptRecordError: as ``legacy_entry_header``.
    """
    return legacy_entry_header(entry, position=position).codec


def legacy_entry_max_timestamp(entry: bytes | memoryview, *, position: int = 0) -> int:
    """Return the largest timestamp of the entry's records, as Kafka tracks it.

    v1: the entry's own timestamp; for a compressed wrapper under CreateTime Kafka wrote
    the largest inner timestamp there, under LogAppendTime the append time. v0: -1.
    Does not decompress. Runtime: O(1).

    Raises:
        CorruptRecordError: as ``legacy_entry_header``.
    """
    return legacy_entry_header(entry, position=position).timestamp


def legacy_entry_records(entry: bytes | memoryview, *, position: int = 0) -> list[Record]:
    """Decode the entry into its records: one, or a compressed wrapper's inner messages.

    Offsets are absolute. Records of magic 0 have timestamp -1 and
    ``NO_TIMESTAMP_TYPE``; under a v1 LogAppendTime wrapper every record has the
    wrapper's timestamp and ``LOG_APPEND_TIME``. Headers are always ``()``.
    The CRC of the entry and of every inner message is checked.
    Runtime: O(size of the entry + size of the decompressed value).

    Raises:
        CorruptRecordError: a CRC does not match; the entry or an inner message is
            truncated or has an impossible length, magic or codec; the wrapper has a
            null value, does not decompress, holds no messages or a message whose
            magic differs from its own or that is compressed again; an offset would be
            negative. Errors inside the decompressed value report the entry's position.
    """
    view = memoryview(entry)
    wrapper = _parse_message(view, 0, position, inner=False)
    _check_crc(view, wrapper.header, 0, position, inner=False)
    header = wrapper.header
    codec = header.codec
    if codec is CompressionType.NONE:
        return [_record(view, wrapper, header.offset, header.timestamp, header.timestamp_type)]

    if header.value_size < 0:
        raise CorruptRecordError("compressed wrapper message has a null value", position=position)
    compressed = view[wrapper.value_start : wrapper.value_start + header.value_size]
    try:
        data = memoryview(decompress(codec, compressed, magic=header.magic))
    except CorruptRecordError as e:
        raise CorruptRecordError(
            f"{codec.config_name} wrapper value does not decompress ({e})", position=position
        ) from e

    inner: list[_Message] = []
    pos = 0
    while pos < len(data):
        message = _parse_message(data, pos, position, inner=True)
        if message.header.magic != header.magic:
            detail = f"magic {message.header.magic} differs from the wrapper's {header.magic}"
            raise _corrupt(detail, pos, position, inner=True)
        if message.header.codec is not CompressionType.NONE:
            raise _corrupt("is compressed again", pos, position, inner=True)
        _check_crc(data, message.header, pos, position, inner=True)
        inner.append(message)
        pos += message.header.entry_size
    if not inner:
        raise CorruptRecordError("compressed wrapper holds no messages", position=position)

    # v0 inner offsets are already absolute; v1 ones are relative to the first.
    base = header.offset - inner[-1].header.offset if header.magic == 1 else 0
    if base + inner[0].header.offset < 0:
        raise CorruptRecordError(
            f"wrapper offset {header.offset} makes inner offsets negative", position=position
        )
    timestamp_type = header.timestamp_type
    log_append_time = timestamp_type is TimestampType.LOG_APPEND_TIME
    return [
        _record(
            data,
            message,
            base + message.header.offset,
            header.timestamp if log_append_time else message.header.timestamp,
            timestamp_type,
        )
        for message in inner
    ]


def _corrupt(detail: str, start: int, position: int, *, inner: bool) -> CorruptRecordError:
    """The error for a problem in the message at ``start``.

    A top-level entry reports ``position + start``; an inner message reports the
    wrapper's ``position``, since decompressed bytes have no place in the file, and
    names its byte in the decompressed value instead.
    """
    if inner:
        return CorruptRecordError(
            f"inner message at byte {start} of the decompressed value: {detail}",
            position=position,
        )
    return CorruptRecordError(detail, position=position + start)


def _parse_message(buf: memoryview, start: int, position: int, *, inner: bool) -> _Message:
    """Parse and check the structure of the message at ``buf[start:]`` (not its CRC)."""
    remaining = len(buf) - start
    if remaining < _PREFIX.size:
        raise _corrupt(f"entry is truncated: {remaining} bytes", start, position, inner=inner)
    offset, size, crc, magic, attributes = _PREFIX.unpack_from(buf, start)
    minimum = _MIN_SIZE.get(magic)
    if minimum is None:
        raise _corrupt(f"unknown legacy magic {magic}", start, position, inner=inner)
    if size < minimum:
        detail = f"size {size} is below the minimum {minimum} for magic {magic}"
        raise _corrupt(detail, start, position, inner=inner)
    if LOG_OVERHEAD + size > remaining:
        detail = f"entry is truncated: it claims {LOG_OVERHEAD + size} bytes, {remaining} remain"
        raise _corrupt(detail, start, position, inner=inner)
    if (attributes & _CODEC_MASK) > _MAX_LEGACY_CODEC:
        detail = f"codec id {attributes & _CODEC_MASK} is not valid for magic {magic}"
        raise _corrupt(detail, start, position, inner=inner)
    end = start + LOG_OVERHEAD + size
    pos = start + _PREFIX.size
    if magic == 1:
        (timestamp,) = _INT64.unpack_from(buf, pos)
        pos += 8
    else:
        timestamp = NO_TIMESTAMP
    lengths = []
    starts = []
    for name in ("key", "value"):
        if end - pos < 4:
            raise _corrupt(f"{name} length is truncated", start, position, inner=inner)
        (length,) = _INT32.unpack_from(buf, pos)
        pos += 4
        if length < -1 or length > end - pos:
            detail = f"{name} length {length} does not fit the {end - pos} bytes left"
            raise _corrupt(detail, start, position, inner=inner)
        lengths.append(length)
        starts.append(pos)
        pos += max(length, 0)
    if pos != end:
        detail = f"{end - pos} bytes follow the value inside the entry"
        raise _corrupt(detail, start, position, inner=inner)
    # The attribute byte is signed in Kafka; mask it so bit tests and printing agree.
    header = LegacyEntryHeader(
        offset, size, crc, magic, attributes & 0xFF, timestamp, lengths[0], lengths[1]
    )
    return _Message(header, starts[0], starts[1])


def _check_crc(
    buf: memoryview, header: LegacyEntryHeader, start: int, position: int, *, inner: bool
) -> None:
    computed = zlib.crc32(buf[start + _CRC_START : start + header.entry_size])
    if computed != header.crc:
        detail = f"CRC-32 {computed:#010x} does not match the stored {header.crc:#010x}"
        raise _corrupt(detail, start, position, inner=inner)


def _record(
    buf: memoryview, message: _Message, offset: int, timestamp: int, ts_type: TimestampType
) -> Record:
    header = message.header
    key = None
    if header.key_size >= 0:
        key = bytes(buf[message.key_start : message.key_start + header.key_size])
    value = None
    if header.value_size >= 0:
        value = bytes(buf[message.value_start : message.value_start + header.value_size])
    return Record(offset, timestamp, key, value, (), ts_type)

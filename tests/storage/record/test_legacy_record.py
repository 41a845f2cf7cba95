"""Legacy v0/v1 log entries: decoding checked against kafka-python's reader and writer."""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.legacy_records import LegacyRecordBatch, LegacyRecordBatchBuilder

from storage.errors import CorruptRecordError
from storage.record.compression import _xxh32, compress, decompress
from storage.record.legacy_record import (
    LOG_OVERHEAD,
    legacy_entry_codec,
    legacy_entry_header,
    legacy_entry_is_valid,
    legacy_entry_max_timestamp,
    legacy_entry_records,
)
from storage.record.record import CompressionType, Record, TimestampType
from storage.record.record_batch import read_batch

# KAFKA-FORMAT.md: v1, offset 7, key "k", value "hello", timestamp 1700000000000.
EXAMPLE_V1 = bytes.fromhex(
    "0000000000000007 0000001c aa1f6779 01 00 0000018bcfe56800 00000001 6b 00000005 68656c6c6f"
)
EXAMPLE_CRC = 0xAA1F6779
TS = 1_700_000_000_000
LEGACY_CODECS = [
    CompressionType.NONE,
    CompressionType.GZIP,
    CompressionType.SNAPPY,
    CompressionType.LZ4,
]
KEY_VALUES: list[tuple[bytes | None, bytes | None]] = [
    (b"k0", b"hello"),
    (None, b"world"),
    (b"k2", None),
    (None, None),
    (b"", b""),
]
LOG_APPEND_TIME_BIT = 0x08
# Where the value of a null-key entry starts: offset, size, crc, magic, attributes,
# [timestamp,] keyLength, valueLength.
NULL_KEY_VALUE_START = {0: 26, 1: 34}


# -- helpers ----------------------------------------------------------------------------


def _sized(data: bytes | None) -> bytes:
    if data is None:
        return struct.pack(">i", -1)
    return struct.pack(">i", len(data)) + data


def _message(
    offset: int,
    magic: int,
    key: bytes | None,
    value: bytes | None,
    *,
    attributes: int = 0,
    timestamp: int = TS,
) -> bytes:
    """Encode one legacy entry by hand, with a correct CRC."""
    body = struct.pack(">bb", magic, attributes)
    if magic == 1:
        body += struct.pack(">q", timestamp)
    body += _sized(key) + _sized(value)
    return struct.pack(">qiI", offset, len(body) + 4, zlib.crc32(body)) + body


def _with_crc(entry: bytes | bytearray) -> bytes:
    fixed = bytearray(entry)
    struct.pack_into(">I", fixed, 12, zlib.crc32(fixed[16:]))
    return bytes(fixed)


def _entries(buffer: bytes | bytearray) -> list[bytes]:
    """Split a buffer of consecutive entries by their size fields."""
    entries = []
    pos = 0
    while pos < len(buffer):
        (size,) = struct.unpack_from(">i", buffer, pos + 8)
        entries.append(bytes(buffer[pos : pos + LOG_OVERHEAD + size]))
        pos += LOG_OVERHEAD + size
    assert pos == len(buffer)
    return entries


def _as_broker_wrote_it(
    wrapper: bytes | bytearray,
    *,
    offset: int,
    timestamp: int | None = None,
    log_append_time: bool = False,
) -> bytes:
    """Give a producer-built wrapper the offset (and v1 timestamp) a broker assigns.

    The offset is outside the CRC; the timestamp and attributes are inside it.
    """
    fixed = bytearray(wrapper)
    struct.pack_into(">q", fixed, 0, offset)
    if timestamp is not None:
        struct.pack_into(">q", fixed, 18, timestamp)
    if log_append_time:
        fixed[17] |= LOG_APPEND_TIME_BIT
    return _with_crc(fixed)


def _build(
    magic: int,
    codec: CompressionType,
    key_values: Sequence[tuple[bytes | None, bytes | None]],
    *,
    first_offset: int,
    first_timestamp: int = TS,
    relative_inner_offsets: bool = True,
) -> list[bytes]:
    """Entries as a broker stores them, built with kafka-python's producer-side builder.

    Plain messages get consecutive offsets from ``first_offset``. A compressed v1 wrapper
    holds inner offsets 0..n-1 (or absolute ones if not ``relative_inner_offsets``) and
    gets the last absolute offset and the largest inner timestamp; a v0 wrapper's inner
    offsets are absolute, as v0 brokers rewrote them.
    """
    builder = LegacyRecordBatchBuilder(magic, int(codec), batch_size=1 << 30)
    relative = magic == 1 and codec is not CompressionType.NONE and relative_inner_offsets
    for i, (key, value) in enumerate(key_values):
        offset = i if relative else first_offset + i
        assert builder.append(offset, first_timestamp + i, key, value) is not None
    built = builder.build()
    if codec is CompressionType.NONE:
        return _entries(built)
    last_offset = first_offset + len(key_values) - 1
    max_timestamp = first_timestamp + len(key_values) - 1 if magic == 1 else None
    return [_as_broker_wrote_it(built, offset=last_offset, timestamp=max_timestamp)]


def _kafka_python_records(entry: bytes, magic: int) -> list[Record]:
    records = []
    for r in LegacyRecordBatch(entry, magic):
        if magic == 0:
            timestamp, timestamp_type = -1, TimestampType.NO_TIMESTAMP_TYPE
        else:
            timestamp, timestamp_type = r.timestamp, TimestampType(r.timestamp_type)
        records.append(Record(r.offset, timestamp, r.key, r.value, (), timestamp_type))
    return records


def _decode_all(entries: list[bytes]) -> list[Record]:
    return [record for entry in entries for record in legacy_entry_records(entry)]


# -- the documented example -------------------------------------------------------------


def test_example_crc_checks() -> None:
    assert zlib.crc32(EXAMPLE_V1[16:]) == EXAMPLE_CRC
    assert legacy_entry_is_valid(EXAMPLE_V1)
    assert legacy_entry_is_valid(memoryview(EXAMPLE_V1))


def test_example_decodes() -> None:
    assert legacy_entry_records(EXAMPLE_V1) == [
        Record(7, TS, b"k", b"hello", (), TimestampType.CREATE_TIME)
    ]


def test_example_header_fields() -> None:
    header = legacy_entry_header(EXAMPLE_V1)
    assert header == (7, 28, EXAMPLE_CRC, 1, 0, TS, 1, 5)
    assert header.entry_size == len(EXAMPLE_V1)
    assert header.codec is CompressionType.NONE
    assert header.timestamp_type is TimestampType.CREATE_TIME
    assert legacy_entry_codec(EXAMPLE_V1) is CompressionType.NONE
    assert legacy_entry_max_timestamp(EXAMPLE_V1) == TS


def test_hand_encoder_matches_example() -> None:
    assert _message(7, 1, b"k", b"hello") == EXAMPLE_V1


def test_bytes_past_the_entry_are_ignored() -> None:
    buffer = memoryview(EXAMPLE_V1 + b"\x00" * 7 + EXAMPLE_V1)
    assert legacy_entry_is_valid(buffer)
    assert legacy_entry_records(buffer)[0].offset == 7


# -- against kafka-python ---------------------------------------------------------------


@pytest.mark.parametrize("codec", LEGACY_CODECS, ids=[c.name for c in LEGACY_CODECS])
@pytest.mark.parametrize("magic", [0, 1])
def test_decodes_like_kafka_python(magic: int, codec: CompressionType) -> None:
    entries = _build(magic, codec, KEY_VALUES, first_offset=100)
    ours = _decode_all(entries)
    theirs = [r for entry in entries for r in _kafka_python_records(entry, magic)]
    assert ours == theirs
    assert [r.offset for r in ours] == [100, 101, 102, 103, 104]
    assert [(r.key, r.value) for r in ours] == KEY_VALUES
    if magic == 0:
        assert {(r.timestamp, r.timestamp_type) for r in ours} == {
            (-1, TimestampType.NO_TIMESTAMP_TYPE)
        }
    else:
        assert [r.timestamp for r in ours] == [TS + i for i in range(5)]
        assert {r.timestamp_type for r in ours} == {TimestampType.CREATE_TIME}
    assert all(r.headers == () for r in ours)
    for entry in entries:
        assert legacy_entry_is_valid(entry)
        assert legacy_entry_codec(entry) is codec


@pytest.mark.parametrize("codec", LEGACY_CODECS[1:], ids=[c.name for c in LEGACY_CODECS[1:]])
def test_v1_inner_offsets_already_absolute_stay_absolute(codec: CompressionType) -> None:
    # Inner offsets 100..104 under wrapper offset 104: base = 104 - 104 = 0.
    entries = _build(1, codec, KEY_VALUES, first_offset=100, relative_inner_offsets=False)
    assert [r.offset for r in _decode_all(entries)] == [100, 101, 102, 103, 104]


@pytest.mark.parametrize("codec", LEGACY_CODECS[1:], ids=[c.name for c in LEGACY_CODECS[1:]])
@pytest.mark.parametrize("magic", [0, 1])
def test_compressed_entry_header(magic: int, codec: CompressionType) -> None:
    (entry,) = _build(magic, codec, KEY_VALUES, first_offset=100)
    header = legacy_entry_header(entry)
    assert header.offset == 104
    assert header.entry_size == len(entry)
    assert header.key_size == -1
    assert header.value_size == len(entry) - NULL_KEY_VALUE_START[magic]
    assert header.codec is codec
    assert header.magic == magic


@pytest.mark.parametrize("codec", LEGACY_CODECS, ids=[c.name for c in LEGACY_CODECS])
def test_max_timestamp(codec: CompressionType) -> None:
    v1 = _build(1, codec, KEY_VALUES, first_offset=0)
    assert legacy_entry_max_timestamp(v1[-1]) == TS + 4
    for entry in _build(0, codec, KEY_VALUES, first_offset=0):
        assert legacy_entry_max_timestamp(entry) == -1


@pytest.mark.parametrize("codec", LEGACY_CODECS[1:], ids=[c.name for c in LEGACY_CODECS[1:]])
def test_log_append_time_wrapper_gives_every_record_its_timestamp(
    codec: CompressionType,
) -> None:
    (entry,) = _build(1, codec, KEY_VALUES, first_offset=100)
    appended = _as_broker_wrote_it(entry, offset=104, timestamp=TS + 999, log_append_time=True)
    ours = legacy_entry_records(appended)
    assert {(r.timestamp, r.timestamp_type) for r in ours} == {
        (TS + 999, TimestampType.LOG_APPEND_TIME)
    }
    assert ours == _kafka_python_records(appended, 1)
    assert legacy_entry_header(appended).timestamp_type is TimestampType.LOG_APPEND_TIME
    assert legacy_entry_max_timestamp(appended) == TS + 999


def test_plain_log_append_time_message_keeps_its_timestamp() -> None:
    entry = _message(3, 1, None, b"v", attributes=LOG_APPEND_TIME_BIT, timestamp=TS + 5)
    assert legacy_entry_records(entry) == [
        Record(3, TS + 5, None, b"v", (), TimestampType.LOG_APPEND_TIME)
    ]


def test_v0_ignores_timestamp_type_bit() -> None:
    entry = _message(3, 0, b"k", b"v", attributes=LOG_APPEND_TIME_BIT)
    (record,) = legacy_entry_records(entry)
    assert (record.timestamp, record.timestamp_type) == (-1, TimestampType.NO_TIMESTAMP_TYPE)


def test_lz4_magic0_wrapper_uses_kafka_quirk() -> None:
    (entry,) = _build(0, CompressionType.LZ4, KEY_VALUES, first_offset=0)
    header = legacy_entry_header(entry)
    value = entry[NULL_KEY_VALUE_START[0] :]
    assert len(value) == header.value_size
    assert value[6] == (_xxh32(value[:6]) >> 8) & 0xFF  # HC over the magic bytes too
    assert len(legacy_entry_records(entry)) == 5


@settings(max_examples=60, deadline=None)
@given(
    magic=st.sampled_from([0, 1]),
    codec=st.sampled_from(LEGACY_CODECS),
    key_values=st.lists(
        st.tuples(st.none() | st.binary(max_size=50), st.none() | st.binary(max_size=300)),
        min_size=1,
        max_size=12,
    ),
    first_offset=st.integers(min_value=0, max_value=1 << 40),
    first_timestamp=st.integers(min_value=0, max_value=1 << 42),
)
def test_random_key_values_round_trip_through_kafka_python(
    magic: int,
    codec: CompressionType,
    key_values: list[tuple[bytes | None, bytes | None]],
    first_offset: int,
    first_timestamp: int,
) -> None:
    entries = _build(
        magic, codec, key_values, first_offset=first_offset, first_timestamp=first_timestamp
    )
    ours = _decode_all(entries)
    assert [(r.key, r.value) for r in ours] == key_values
    assert [r.offset for r in ours] == list(range(first_offset, first_offset + len(key_values)))
    if magic == 1:
        assert [r.timestamp for r in ours] == [first_timestamp + i for i in range(len(ours))]
    assert ours == [r for entry in entries for r in _kafka_python_records(entry, magic)]


# -- corruption -------------------------------------------------------------------------


CORRUPTION_CASES = ["example", "v0-plain"] + [
    f"v{magic}-{codec.name}" for magic in (0, 1) for codec in LEGACY_CODECS[1:]
]


def _corruption_case(name: str) -> bytes:
    if name == "example":
        return EXAMPLE_V1
    if name == "v0-plain":
        return _message(5, 0, b"key", b"value")
    magic, codec = name.split("-")
    (entry,) = _build(int(magic[1]), CompressionType[codec], KEY_VALUES[:2], first_offset=100)
    return entry


@pytest.mark.parametrize("name", CORRUPTION_CASES)
def test_flipped_byte_after_offset_is_detected(name: str) -> None:
    # Every byte from the size field on is covered by the size check or the CRC.
    entry = _corruption_case(name)
    for index in range(8, len(entry)):
        for mask in (0x01, 0x80):
            flipped = bytearray(entry)
            flipped[index] ^= mask
            assert not legacy_entry_is_valid(bytes(flipped)), (index, mask)
            with pytest.raises(CorruptRecordError):
                legacy_entry_records(bytes(flipped))


def test_bad_crc_reports_both_values() -> None:
    entry = bytearray(EXAMPLE_V1)
    entry[-1] ^= 0xFF
    with pytest.raises(CorruptRecordError, match="does not match the stored 0xaa1f6779"):
        legacy_entry_records(bytes(entry))


def test_error_position_is_relative_to_the_given_entry_position() -> None:
    entry = bytearray(EXAMPLE_V1)
    entry[-1] ^= 0xFF
    with pytest.raises(CorruptRecordError) as info:
        legacy_entry_records(bytes(entry), position=4096)
    assert info.value.position == 4096
    assert "at byte 4096" in str(info.value)


def _wrapper(
    magic: int,
    codec: CompressionType,
    inner: bytes,
    *,
    offset: int = 10,
    attributes: int = 0,
) -> bytes:
    value = compress(codec, inner, magic=magic)
    return _message(offset, magic, None, value, attributes=int(codec) | attributes)


@pytest.mark.parametrize("magic", [0, 1])
def test_inner_crc_is_checked(magic: int) -> None:
    inner = bytearray(_message(0, magic, b"k", b"v") + _message(1, magic, b"k", b"v"))
    inner[-1] ^= 0x01
    entry = _wrapper(magic, CompressionType.GZIP, bytes(inner))
    assert legacy_entry_is_valid(entry)  # the wrapper itself is fine
    with pytest.raises(CorruptRecordError, match=r"inner message at byte \d+ .*CRC-32"):
        legacy_entry_records(entry, position=500)


@pytest.mark.parametrize(
    ("inner", "match"),
    [
        (_message(0, 1, None, b"x", attributes=1), "compressed again"),
        (_message(0, 0, None, b"x"), "magic 0 differs from the wrapper's 1"),
        (b"", "holds no messages"),
        (_message(0, 1, None, b"x")[:-1], "truncated"),
        (_message(0, 1, None, b"x") + b"\x00" * 5, "truncated"),
    ],
    ids=["nested", "magic-mismatch", "empty", "truncated", "trailing-partial"],
)
def test_bad_inner_messages_are_corrupt(inner: bytes, match: str) -> None:
    entry = _wrapper(1, CompressionType.SNAPPY, inner)
    with pytest.raises(CorruptRecordError, match=match) as info:
        legacy_entry_records(entry, position=77)
    assert info.value.position == 77


def test_wrapper_with_null_value_is_corrupt() -> None:
    entry = _message(0, 1, None, None, attributes=int(CompressionType.GZIP))
    with pytest.raises(CorruptRecordError, match="null value"):
        legacy_entry_records(entry)


def test_wrapper_value_that_does_not_decompress_is_corrupt() -> None:
    entry = _message(0, 1, None, b"not gzip", attributes=int(CompressionType.GZIP))
    with pytest.raises(CorruptRecordError, match="gzip wrapper value does not decompress"):
        legacy_entry_records(entry)


def test_negative_absolute_offset_is_corrupt() -> None:
    inner = _message(0, 1, None, b"a") + _message(1, 1, None, b"b")
    entry = _wrapper(1, CompressionType.GZIP, inner, offset=0)
    with pytest.raises(CorruptRecordError, match="negative"):
        legacy_entry_records(entry)


def test_decompression_uses_wrapper_magic_for_lz4() -> None:
    inner = _message(8, 0, None, b"a") + _message(9, 0, None, b"b")
    entry = _wrapper(0, CompressionType.LZ4, inner, offset=9)
    assert [r.offset for r in legacy_entry_records(entry)] == [8, 9]
    assert decompress(CompressionType.LZ4, entry[NULL_KEY_VALUE_START[0] :], magic=0) == inner


def _patched(entry: bytes, fmt: str, where: int, value: int) -> bytes:
    patched = bytearray(entry)
    struct.pack_into(fmt, patched, where, value)
    return _with_crc(patched)


@pytest.mark.parametrize(
    ("entry", "match"),
    [
        (EXAMPLE_V1[:11], "truncated"),
        (EXAMPLE_V1[:20], "truncated"),
        (EXAMPLE_V1[:-1], "truncated"),
        (_patched(EXAMPLE_V1, ">b", 16, 2), "unknown legacy magic 2"),
        (_patched(EXAMPLE_V1, ">b", 16, -1), "unknown legacy magic -1"),
        (_patched(EXAMPLE_V1, ">b", 17, 4), "codec id 4 is not valid for magic 1"),
        (_patched(EXAMPLE_V1, ">b", 17, 7), "codec id 7"),
        (_patched(EXAMPLE_V1, ">i", 26, -2), "key length -2"),
        (_patched(EXAMPLE_V1, ">i", 26, 50), "key length 50"),
        (_patched(EXAMPLE_V1, ">i", 31, -2), "value length -2"),
        (_patched(EXAMPLE_V1, ">i", 31, 4), "1 bytes follow the value"),
        (_patched(EXAMPLE_V1, ">i", 8, 21), "below the minimum 22"),
        (_patched(EXAMPLE_V1, ">i", 8, -1), "below the minimum"),
        (_message(0, 0, None, None)[:-1], "truncated"),
    ],
)
def test_malformed_entries_are_corrupt(entry: bytes, match: str) -> None:
    with pytest.raises(CorruptRecordError, match=match):
        legacy_entry_records(entry)


@pytest.mark.parametrize(
    "entry",
    [b"", EXAMPLE_V1[:17], EXAMPLE_V1[:-1], _patched(EXAMPLE_V1, ">b", 16, 2)],
    ids=["empty", "short", "truncated", "magic-2"],
)
def test_is_valid_rejects_without_raising(entry: bytes) -> None:
    assert not legacy_entry_is_valid(entry)


def test_header_does_not_check_crc() -> None:
    entry = bytearray(EXAMPLE_V1)
    entry[-1] ^= 0xFF
    assert legacy_entry_header(bytes(entry)).offset == 7
    assert not legacy_entry_is_valid(bytes(entry))


def test_minimal_v0_entry() -> None:
    entry = _message(0, 0, None, None)
    assert len(entry) == LOG_OVERHEAD + 14
    assert legacy_entry_records(entry) == [
        Record(0, -1, None, None, (), TimestampType.NO_TIMESTAMP_TYPE)
    ]


@pytest.mark.parametrize(
    ("attributes", "expected"),
    [(0, TimestampType.CREATE_TIME), (LOG_APPEND_TIME_BIT, TimestampType.LOG_APPEND_TIME)],
)
def test_batch_view_reads_the_timestamp_type_at_the_legacy_attributes(
    attributes: int, expected: TimestampType
) -> None:
    # The batch view of a v1 entry must read byte 17 (v2's attributes sit at byte 21,
    # inside a v1 entry's timestamp).
    entry = _message(3, 1, b"k", b"v", attributes=attributes, timestamp=TS)
    batch = read_batch(entry)
    assert batch.timestamp_type is expected
    assert {r.timestamp_type for r in batch.records()} == {expected}

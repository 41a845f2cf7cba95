"""v2 record batches: the exact bytes of KAFKA-FORMAT.md, round trips, and cross-checks
against kafka-python's independent implementation (``kafka.record``)."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch as KafkaPythonBatch
from kafka.record.default_records import DefaultRecordBatchBuilder

from storage.errors import CorruptRecordError
from storage.record.batch_builder import build_record_batch
from storage.record.record import CompressionType, TimestampType
from storage.record.record_batch import (
    DefaultRecordBatch,
    iter_batches,
    patch_base_offset,
    read_batch,
)

# KAFKA-FORMAT.md: 3 records at base offset 100, leader epoch 0.
EXAMPLE = bytes.fromhex(
    "0000000000000064 00000058 00000000 02 b8c7db42 0000 00000002 0000018bcfe56800"
    " 0000018bcfe56802 ffffffffffffffff ffff ffffffff 00000003"
    " 22 00 00 00 04 6b30 0a 68656c6c6f 02 02 68 02 78"
    " 16 00 02 02 01 0a 776f726c64 00"
    " 10 00 04 04 04 6b32 01 00".replace(" ", "")
)
TS = 1700000000000


def with_base_offset(batch: bytes | bytearray, base_offset: int) -> bytes:
    """A copy of ``batch`` with the broker's base-offset patch applied."""
    raw = bytearray(batch)
    patch_base_offset(raw, base_offset)
    return bytes(raw)


def test_example_batch_decodes() -> None:
    batch = DefaultRecordBatch(EXAMPLE)
    assert batch.is_valid()
    assert batch.crc == 0xB8C7DB42
    assert (batch.base_offset, batch.last_offset, batch.next_offset) == (100, 102, 103)
    assert batch.size == len(EXAMPLE) == 0x58 + 12
    assert batch.partition_leader_epoch == 0
    assert batch.max_timestamp == TS + 2
    records = batch.records()
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in records] == [
        (100, TS, b"k0", b"hello", (("h", b"x"),)),
        (101, TS + 1, None, b"world", ()),
        (102, TS + 2, b"k2", None, ()),
    ]
    assert all(r.timestamp_type is TimestampType.CREATE_TIME for r in records)


def test_builder_reproduces_example_bytes() -> None:
    built = build_record_batch(
        [b"hello", b"world", None],
        keys=[b"k0", None, b"k2"],
        headers=[(("h", b"x"),), (), ()],
        timestamps=[TS, TS + 1, TS + 2],
        base_offset=100,
        partition_leader_epoch=0,
    )
    assert built == EXAMPLE


def test_base_offset_patch_keeps_crc_valid() -> None:
    patched = with_base_offset(EXAMPLE, 5000)
    batch = DefaultRecordBatch(patched)
    assert batch.is_valid()
    assert [r.offset for r in batch.records()] == [5000, 5001, 5002]


@pytest.mark.parametrize("position", [17, 21, 30, 61, 70, len(EXAMPLE) - 1])
def test_flipped_byte_fails_crc(position: int) -> None:
    corrupt = bytearray(EXAMPLE)
    corrupt[position] ^= 0x01
    assert not DefaultRecordBatch(bytes(corrupt)).is_valid()


def test_flipped_offset_byte_is_outside_crc() -> None:
    corrupt = bytearray(EXAMPLE)
    corrupt[3] ^= 0x01
    assert DefaultRecordBatch(bytes(corrupt)).is_valid()


def test_truncated_records_raise_corrupt() -> None:
    # Claim one record more than present: the decoder must notice, not invent one.
    bad = bytearray(EXAMPLE)
    struct.pack_into(">i", bad, 57, 4)
    with pytest.raises(CorruptRecordError):
        DefaultRecordBatch(bytes(bad)).records()


def test_log_append_time_reports_max_timestamp() -> None:
    built = build_record_batch(
        [b"a", b"b"], timestamps=TS + 99, timestamp_type=TimestampType.LOG_APPEND_TIME
    )
    records = DefaultRecordBatch(built).records()
    assert {r.timestamp for r in records} == {TS + 99}
    assert {r.timestamp_type for r in records} == {TimestampType.LOG_APPEND_TIME}


def test_compaction_gaps_advance_by_last_offset_delta() -> None:
    built = build_record_batch(
        [b"a", b"c"], timestamps=TS, offset_deltas=[0, 2], last_offset_delta=4, base_offset=10
    )
    empty = build_record_batch([], timestamps=TS, last_offset_delta=3, base_offset=15)
    batches = list(iter_batches(built + empty))
    assert [r.offset for r in batches[0].records()] == [10, 12]
    assert batches[0].next_offset == 15
    assert batches[1].records() == []
    assert batches[1].next_offset == 19


def test_iter_batches_stops_at_partial_tail() -> None:
    data = EXAMPLE + with_base_offset(EXAMPLE, 103)
    for cut in range(len(EXAMPLE), len(data)):
        assert len(list(iter_batches(data[:cut]))) == 1


def test_control_batch_flag() -> None:
    built = build_record_batch(
        [b"\x00\x00\x00\x00\x00\x00"],
        keys=[b"\x00\x00\x00\x01"],
        timestamps=TS,
        is_control=True,
        is_transactional=True,
        producer_id=7,
        producer_epoch=0,
    )
    batch = read_batch(built)
    assert batch.is_control
    assert batch.is_transactional
    assert batch.records()[0].key == b"\x00\x00\x00\x01"


CODECS = list(CompressionType)
KP_CODEC = {CompressionType.NONE: 0, CompressionType.GZIP: 1, CompressionType.SNAPPY: 2,
            CompressionType.LZ4: 3, CompressionType.ZSTD: 4}  # fmt: skip


def _kafka_python_build(
    rows: list[tuple[bytes | None, bytes | None, int, list[tuple[str, bytes]]]],
    codec: CompressionType,
    base_offset: int,
) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=KP_CODEC[codec], is_transactional=False,
        producer_id=-1, producer_epoch=-1, base_sequence=-1, batch_size=1 << 30,
    )  # fmt: skip
    for i, (key, value, ts, headers) in enumerate(rows):
        builder.append(i, timestamp=ts, key=key, value=value, headers=headers)
    raw = bytearray(builder.build())
    return with_base_offset(raw, base_offset)


row_strategy = st.tuples(
    st.none() | st.binary(max_size=300),
    st.none() | st.binary(max_size=300),
    st.integers(min_value=0, max_value=2**41),
    st.lists(st.tuples(st.text(max_size=8), st.binary(max_size=8)), max_size=3),
)


@pytest.mark.parametrize("codec", CODECS, ids=[c.name for c in CODECS])
@settings(max_examples=25, deadline=None)
@given(rows=st.lists(row_strategy, min_size=1, max_size=40))
def test_kafka_python_batches_decode_here(
    codec: CompressionType,
    rows: list[tuple[bytes | None, bytes | None, int, list[tuple[str, bytes]]]],
) -> None:
    data = _kafka_python_build(rows, codec, base_offset=1000)
    batch = DefaultRecordBatch(data)
    assert batch.is_valid()
    # kafka-python keeps a batch uncompressed when compression would not shrink it.
    assert batch.codec in (codec, CompressionType.NONE)
    assert batch.codec == KafkaPythonBatch(data).compression_type
    decoded = batch.records()
    assert [(r.offset, r.key, r.value, r.timestamp, list(r.headers)) for r in decoded] == [
        (1000 + i, k, v, ts, list(h)) for i, (k, v, ts, h) in enumerate(rows)
    ]


@pytest.mark.parametrize("codec", CODECS, ids=[c.name for c in CODECS])
def test_compressible_kafka_python_batch_decodes_here(codec: CompressionType) -> None:
    rows = [(b"key%d" % i, b"value %d " % i * 50, TS + i, [("h", b"v")]) for i in range(200)]
    data = _kafka_python_build(rows, codec, base_offset=5)  # type: ignore[arg-type]
    batch = DefaultRecordBatch(data)
    assert batch.codec is codec
    assert [(r.offset, r.key, r.value) for r in batch.records()] == [
        (5 + i, k, v) for i, (k, v, _ts, _h) in enumerate(rows)
    ]


@pytest.mark.parametrize("codec", CODECS, ids=[c.name for c in CODECS])
@settings(max_examples=25, deadline=None)
@given(rows=st.lists(row_strategy, min_size=1, max_size=40))
def test_batches_built_here_validate_in_kafka_python(
    codec: CompressionType,
    rows: list[tuple[bytes | None, bytes | None, int, list[tuple[str, bytes]]]],
) -> None:
    data = build_record_batch(
        [v for _k, v, _ts, _h in rows],
        keys=[k for k, _v, _ts, _h in rows],
        timestamps=[ts for _k, _v, ts, _h in rows],
        headers=[tuple(h) for _k, _v, _ts, h in rows],
        base_offset=77,
        codec=codec,
    )
    theirs = KafkaPythonBatch(data)
    assert theirs.validate_crc()
    assert theirs.compression_type == KP_CODEC[codec]
    got = [(r.offset, r.key, r.value, r.timestamp, list(r.headers)) for r in theirs]
    assert got == [(77 + i, k, v, ts, list(h)) for i, (k, v, ts, h) in enumerate(rows)]


def test_plain_fast_path_matches_general_encoding() -> None:
    values = [b"x" * n for n in (0, 1, 63, 64, 127, 128, 8191, 8192, 20000)] + [None]
    fast = build_record_batch(values, timestamps=TS)
    general = build_record_batch(values, timestamps=[TS] * len(values), keys=[None] * len(values))
    assert fast == general
    assert [r.value for r in DefaultRecordBatch(fast).records()] == values

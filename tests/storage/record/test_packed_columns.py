"""Packed columns: a batch's values and keys in one buffer each, with int32 bounds and
the indexes of null entries (``packed_columns``), equal to the packed ``columns()``."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.legacy_records import LegacyRecordBatchBuilder
from librt.strings import BytesWriter

from storage.errors import CorruptRecordError
from storage.record.batch_builder import build_record_batch
from storage.record.record import CompressionType, TimestampType
from storage.record.record_batch import DefaultRecordBatch, LegacyRecordBatch
from storage.record.record_columns import (
    PackedBinary,
    PackedColumns,
    RecordColumns,
    pack_binary,
    pack_columns,
)

TS = 1_700_000_000_000


def bounds_of(column: PackedBinary) -> list[int]:
    return list(struct.unpack(f"<{len(column) + 1}i", column.bounds))


def check_packed(packed: PackedColumns, expected: RecordColumns) -> None:
    """``packed`` holds exactly ``expected``'s records, in the documented layout."""
    assert packed.unpacked() == expected
    assert packed == pack_columns(expected)
    values = list(expected.values)
    assert len(packed.values) == len(packed) == len(values)
    assert packed.values.data == b"".join(v for v in values if v is not None)
    ends = bounds_of(packed.values)
    assert ends[0] == 0
    assert [ends[i + 1] - ends[i] for i in range(len(values))] == [len(v or b"") for v in values]
    nulls = [i for i, v in enumerate(values) if v is None]
    assert packed.values.nulls == (nulls or None)
    if all(k is None for k in expected.keys):
        assert packed.keys is None
    else:
        assert packed.keys is not None
        assert packed.keys.to_list() == list(expected.keys)


@settings(max_examples=150, deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            st.one_of(st.none(), st.binary(max_size=70)),
            st.one_of(st.none(), st.binary(max_size=4)),
            st.integers(0, 3),
            st.sampled_from([1, 1, 1, 2, 70]),
            st.booleans(),
        ),
        min_size=1,
        max_size=90,
    ),
    bounds=st.tuples(
        st.one_of(st.none(), st.integers(-5, 400)), st.one_of(st.none(), st.integers(-5, 400))
    ),
    codec=st.sampled_from([CompressionType.NONE, CompressionType.GZIP]),
)
def test_packed_columns_equal_the_packed_decode_of_any_batch_and_range(
    rows: list[tuple[bytes | None, bytes | None, int, int, bool]],
    bounds: tuple[int | None, int | None],
    codec: CompressionType,
) -> None:
    deltas, delta = [], 0
    for _value, _key, _ts, step, _header in rows:
        deltas.append(delta)
        delta += step
    data = build_record_batch(
        [r[0] for r in rows],
        keys=[r[1] for r in rows],
        timestamps=[TS + r[2] for r in rows],
        headers=[[("h", b"x")] if r[4] else [] for r in rows],
        offset_deltas=deltas,
        base_offset=100,
        codec=codec,
    )
    batch = DefaultRecordBatch(data)
    start, end = bounds
    check_packed(batch.packed_columns(start, end), batch.columns(start, end))


@settings(max_examples=100, deadline=None)
@given(
    values=st.lists(st.binary(max_size=20), min_size=1, max_size=300),
    bounds=st.tuples(
        st.one_of(st.none(), st.integers(95, 420)), st.one_of(st.none(), st.integers(95, 420))
    ),
    codec=st.sampled_from([CompressionType.NONE, CompressionType.GZIP]),
)
def test_plain_batches_and_their_ranges_pack_exactly(
    values: list[bytes], bounds: tuple[int | None, int | None], codec: CompressionType
) -> None:
    """The path that copies values straight from the records (no key, no header, no
    null, one timestamp): empty values included, skipped records and the range end."""
    batch = DefaultRecordBatch(
        build_record_batch(values, timestamps=TS, base_offset=100, codec=codec)
    )
    start, end = bounds
    packed = batch.packed_columns(start, end)
    check_packed(packed, batch.columns(start, end))
    assert isinstance(packed.offsets, range)


@pytest.mark.parametrize("n", [1, 63, 64, 300, 8191, 8192, 9000])
def test_a_plain_batch_of_every_offset_delta_width_packs(n: int) -> None:
    values = [b"line %d" % i for i in range(n)]
    batch = DefaultRecordBatch(build_record_batch(values, timestamps=TS, base_offset=7))
    packed = batch.packed_columns()
    assert packed.offsets == range(7, 7 + n)
    assert list(packed.timestamps) == [TS] * n
    assert packed.keys is None
    assert packed.values.nulls is None
    assert packed.values.to_list() == values
    assert list(packed.headers) == [()] * n
    check_packed(batch.packed_columns(20, 7 + n - 1), batch.columns(20, 7 + n - 1))


def test_a_null_value_is_told_from_an_empty_one() -> None:
    values: list[bytes | None] = [b"", None, b"x", None, b""]
    batch = DefaultRecordBatch(build_record_batch(values, timestamps=TS))
    packed = batch.packed_columns()
    assert packed.values.nulls == [1, 3]
    assert packed.values.data == b"x"
    assert bounds_of(packed.values) == [0, 0, 0, 1, 1, 1]
    assert packed.values.to_list() == values
    # A range that leaves the nulls out has none.
    assert batch.packed_columns(4).values.nulls is None


def test_keys_pack_with_their_nulls_and_all_null_keys_are_none() -> None:
    keys: list[bytes | None] = [None, b"k1", b"", None]
    batch = DefaultRecordBatch(
        build_record_batch([b"a", b"b", b"c", b"d"], keys=keys, timestamps=TS)
    )
    packed = batch.packed_columns()
    assert packed.keys is not None
    assert packed.keys.to_list() == keys
    assert packed.keys.nulls == [0, 3]
    # Only the first record in range: its key is null, so no key column at all.
    assert batch.packed_columns(0, 1).keys is None


def test_log_append_time_gives_the_batch_max_timestamp() -> None:
    data = build_record_batch(
        [b"a", b"b"], timestamps=[TS, TS + 5], timestamp_type=TimestampType.LOG_APPEND_TIME
    )
    plain = build_record_batch(
        [b"a", b"b"], timestamps=TS, timestamp_type=TimestampType.LOG_APPEND_TIME
    )
    for batch in (DefaultRecordBatch(data), DefaultRecordBatch(plain)):
        packed = batch.packed_columns()
        assert list(packed.timestamps) == [batch.max_timestamp] * 2
        assert packed.timestamp_type is TimestampType.LOG_APPEND_TIME
        check_packed(packed, batch.columns())


def test_a_control_batch_packs_its_marker_as_columns_does() -> None:
    """The primitive mirrors ``columns()``; skipping control batches is the reader's."""
    marker = build_record_batch(
        [b"\x00\x00\x00\x00\x00\x00"],
        keys=[b"\x00\x00\x00\x00"],
        timestamps=TS,
        is_control=True,
        is_transactional=True,
        producer_id=3,
    )
    batch = DefaultRecordBatch(marker)
    assert batch.is_control
    check_packed(batch.packed_columns(), batch.columns())


def _legacy(magic: int, codec: int, first_offset: int, values: list[bytes | None]) -> bytes:
    builder = LegacyRecordBatchBuilder(magic=magic, compression_type=codec, batch_size=1 << 20)
    for i, value in enumerate(values):
        # Uncompressed: absolute offsets. Compressed: relative inner offsets.
        offset = i if codec else first_offset + i
        builder.append(offset, timestamp=TS + i, key=b"k" if i % 2 else None, value=value)
    raw = bytearray(builder.build())
    if codec:
        # A broker gives the wrapper the absolute offset of its last inner message.
        struct.pack_into(">q", raw, 0, first_offset + len(values) - 1)
    return bytes(raw)


@pytest.mark.parametrize(
    ("magic", "codec", "values"),
    [
        (0, 0, [b"v0"]),
        (1, 0, [None]),
        (0, 1, [b"a", None, b"", b"d"]),
        (1, 1, [b"a", None, b"", b"d"]),
    ],
)
@pytest.mark.parametrize(("start", "end"), [(None, None), (11, None), (None, 12), (11, 13)])
def test_legacy_batches_pack_as_their_columns(
    magic: int, codec: int, values: list[bytes | None], start: int | None, end: int | None
) -> None:
    batch = LegacyRecordBatch(_legacy(magic, codec, 10, values))
    check_packed(batch.packed_columns(start, end), batch.columns(start, end))


def test_a_malformed_plain_batch_is_reported_as_columns_reports_it() -> None:
    data = build_record_batch([b"a", b"b", b"c"], timestamps=TS)
    for count in (2, 4, -1):
        bad = data[:57] + count.to_bytes(4, "big", signed=True) + data[61:]
        with pytest.raises(CorruptRecordError):
            DefaultRecordBatch(bad).columns()
        with pytest.raises(CorruptRecordError):
            DefaultRecordBatch(bad).packed_columns()


def test_pack_binary_and_back() -> None:
    assert pack_binary([]) == PackedBinary(b"", struct.pack("<i", 0), None)
    column = pack_binary((b"ab", None, b"", b"c"))
    assert column == PackedBinary(b"abc", struct.pack("<5i", 0, 2, 2, 2, 3), [1])
    assert column.to_list() == [b"ab", None, b"", b"c"]
    assert len(column) == 4
    assert "nulls=[1]" in repr(column)


@pytest.mark.parametrize("codec", [CompressionType.NONE, CompressionType.ZSTD])
def test_a_plain_run_then_keys_nulls_and_headers_pack_in_one_pass(codec: CompressionType) -> None:
    """The plain records' fast loop hands over to the general one mid-batch: the
    buffers, bounds and null indexes continue across the switch."""
    n = 400
    values: list[bytes | None] = [b"p%d" % i for i in range(n)]
    keys: list[bytes | None] = [None] * n
    headers: list[list[tuple[str, bytes | None]]] = [[] for _ in range(n)]
    values[300] = None
    keys[301] = b"first key"
    headers[302] = [("h", None)]
    values[399] = b""
    batch = DefaultRecordBatch(
        build_record_batch(values, keys=keys, headers=headers, timestamps=TS, codec=codec)
    )
    packed = batch.packed_columns()
    check_packed(packed, batch.columns())
    assert packed.values.nulls == [300]
    assert packed.keys is not None
    assert packed.keys.nulls == [i for i in range(n) if i != 301]
    assert packed.keys.data == b"first key"
    for start, end in ((250, 301), (301, 302), (299, None), (350, 400)):
        check_packed(batch.packed_columns(start, end), batch.columns(start, end))


def test_a_scratch_writer_reused_across_batches_leaves_earlier_results_intact() -> None:
    scratch = BytesWriter()
    scratch.write(b"left over from before")
    first = DefaultRecordBatch(build_record_batch([b"a" * 300] * 400, timestamps=TS))
    second = DefaultRecordBatch(
        build_record_batch([b"b", None, b"c"], keys=[None, b"k", None], timestamps=TS)
    )
    packed_first = first.packed_columns(scratch=scratch)
    packed_second = second.packed_columns(1, None, scratch)
    assert packed_first.values.to_list() == [b"a" * 300] * 400
    check_packed(packed_first, first.columns())
    check_packed(packed_second, second.columns(1))
    assert packed_second.values.to_list() == [None, b"c"]

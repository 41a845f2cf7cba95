"""The v2 record decoder that produces columns: compact columns, materialised ones, corruption."""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch as KafkaPythonBatch

from storage.errors import CorruptRecordError
from storage.record.batch_builder import build_record_batch
from storage.record.record import CompressionType, Header, Record, TimestampType
from storage.record.record_batch import RECORD_BATCH_OVERHEAD, DefaultRecordBatch, LegacyRecordBatch
from storage.record.record_columns import (
    RecordColumns,
    columns_from_records,
    decode_plain_values,
    decode_record_columns,
)
from storage.record.varint import encode_varint

TS = 1_700_000_000_000


def columns_of(data: bytes) -> RecordColumns:
    return DefaultRecordBatch(data).columns()


def decode(
    body: bytes, count: int, base_offset: int = 0, base_timestamp: int = TS
) -> RecordColumns:
    return decode_record_columns(
        body, 0, len(body), count, base_offset, base_timestamp, TimestampType.CREATE_TIME, None
    )


def bytes_field(data: bytes | None) -> bytes:
    return b"\x01" if data is None else encode_varint(len(data)) + data


def raw_record(
    offset_delta: int,
    value: bytes | None = b"v",
    *,
    ts_delta: int = 0,
    key_field: bytes = b"\x01",
    value_field: bytes | None = None,
    headers_field: bytes = b"\x00",
    length_adjust: int = 0,
) -> bytes:
    """One v2 record, with any field replaceable by raw bytes to corrupt it."""
    body = (
        b"\x00"
        + encode_varint(ts_delta)
        + encode_varint(offset_delta)
        + key_field
        + (value_field if value_field is not None else bytes_field(value))
        + headers_field
    )
    return encode_varint(len(body) + length_adjust) + body


# -- compact columns ---------------------------------------------------------------


def test_plain_batch_columns_stay_compact() -> None:
    columns = columns_of(build_record_batch([b"a", b"b", None], timestamps=TS, base_offset=100))
    assert columns.offsets == range(100, 103)
    assert list(columns.timestamps) == [TS] * 3
    assert list(columns.keys) == [None] * 3
    assert list(columns.values) == [b"a", b"b", None]
    assert list(columns.headers) == [(), (), ()]
    assert columns.timestamp_type is TimestampType.CREATE_TIME
    assert len(columns) == 3


def test_contiguous_offsets_stay_a_range_past_the_two_byte_varints() -> None:
    # Offset deltas of 64 and up take two varint bytes, of 8192 and up three.
    n = 9000
    columns = columns_of(build_record_batch([b"x"] * n, timestamps=TS, base_offset=7))
    assert columns.offsets == range(7, 7 + n)
    assert len(columns.values) == n


def test_explicit_identity_offset_deltas_stay_a_range() -> None:
    data = build_record_batch([b"a", b"b"], timestamps=TS, keys=[b"k", None], offset_deltas=[0, 1])
    assert columns_of(data).offsets == range(2)


@pytest.mark.parametrize(
    "deltas",
    [[0, 2, 5], [1, 2, 3], [3], [0, 1, 2, 70], [0, 9000], [0, 1, 2, 3, 100000]],
)
def test_offset_gaps_give_explicit_offsets(deltas: list[int]) -> None:
    data = build_record_batch(
        [b"v"] * len(deltas), timestamps=TS, base_offset=1000, offset_deltas=deltas
    )
    columns = columns_of(data)
    assert list(columns.offsets) == [1000 + d for d in deltas]
    assert not isinstance(columns.offsets, range)
    assert columns.keys == [None] * len(deltas)


def test_empty_batch_has_empty_columns() -> None:
    columns = columns_of(build_record_batch([], timestamps=TS, base_offset=5, last_offset_delta=3))
    assert len(columns) == 0
    assert columns.records() == []
    assert list(columns.offsets) == []


# -- materialised columns ----------------------------------------------------------


def test_per_record_timestamps_materialise() -> None:
    stamps = [TS + 5, TS, TS + 100_000, TS - 3]
    columns = columns_of(build_record_batch([b"v"] * 4, timestamps=stamps))
    assert list(columns.timestamps) == stamps


def test_a_timestamp_differing_only_in_the_last_record_materialises() -> None:
    columns = columns_of(build_record_batch([b"v"] * 3, timestamps=[TS, TS, TS + 1]))
    assert list(columns.timestamps) == [TS, TS, TS + 1]


@pytest.mark.parametrize(
    "keys",
    [
        [None, None, b"k"],
        [b"k", None, None],
        [None, b"", None],
        [b"a" * 64, None, b"b" * 9000],
        [b"x", b"y", b"z"],
    ],
)
def test_keys_materialise_even_when_only_a_later_record_has_one(
    keys: list[bytes | None],
) -> None:
    columns = columns_of(build_record_batch([b"v"] * 3, timestamps=TS, keys=keys))
    assert list(columns.keys) == keys
    assert columns.offsets == range(3)


@pytest.mark.parametrize(
    "headers",
    [
        [[], [], [("h", b"x")]],
        [[("h", b"x"), ("n", None)], [], []],
        [[], [("", b"")], []],
        [[("k\u00e9y", b"v" * 200)], [("a", None), ("b", b"1"), ("c", b"2")], [("h", b"")]],
    ],
)
def test_headers_materialise_even_when_only_a_later_record_has_them(
    headers: list[list[Header]],
) -> None:
    columns = columns_of(build_record_batch([b"v"] * 3, timestamps=TS, headers=headers))
    assert list(columns.headers) == [tuple(h) for h in headers]


@pytest.mark.parametrize("size", [0, 1, 63, 64, 8191, 8192, 20000])
def test_values_of_every_varint_width_decode(size: int) -> None:
    # The record length and value length cross the one/two/three-byte varint paths.
    vals = [b"a" * size, None, b"b" * size]
    columns = columns_of(build_record_batch(vals, timestamps=TS, keys=[None, b"k", None]))
    assert list(columns.values) == vals


def test_log_append_time_reports_the_batch_max_timestamp() -> None:
    data = build_record_batch(
        [b"a", b"b", b"c"],
        timestamps=[TS + 1, TS + 9, TS + 4],
        timestamp_type=TimestampType.LOG_APPEND_TIME,
    )
    columns = columns_of(data)
    assert columns.timestamp_type is TimestampType.LOG_APPEND_TIME
    assert list(columns.timestamps) == [TS + 9] * 3
    assert all(r.timestamp_type is TimestampType.LOG_APPEND_TIME for r in columns)


def test_append_time_argument_overrides_record_timestamps() -> None:
    body = raw_record(0, ts_delta=5) + raw_record(1, ts_delta=-5)
    columns = decode_record_columns(body, 0, len(body), 2, 0, TS, TimestampType.LOG_APPEND_TIME, 42)
    assert list(columns.timestamps) == [42, 42]


def test_decode_honours_pos_and_end_inside_a_larger_buffer() -> None:
    body = raw_record(0, b"one") + raw_record(1, b"two")
    data = b"garbage" + body + b"more garbage"
    columns = decode_record_columns(
        data, 7, 7 + len(body), 2, 50, TS, TimestampType.CREATE_TIME, None
    )
    assert list(columns.values) == [b"one", b"two"]
    assert columns.offsets == range(50, 52)


def test_compressed_batch_decodes_to_the_same_columns() -> None:
    def build(codec: CompressionType) -> bytes:
        return build_record_batch(
            [b"a", b"b"],
            timestamps=[TS, TS + 1],
            keys=[None, b"k"],
            headers=[[], [("h", b"x")]],
            codec=codec,
        )

    gzip = columns_of(build(CompressionType.GZIP))
    assert gzip.records() == columns_of(build(CompressionType.NONE)).records()
    assert list(gzip.values) == [b"a", b"b"]


# -- records() and iteration -------------------------------------------------------


def test_records_and_iteration_give_record_tuples() -> None:
    data = build_record_batch(
        [b"a", None, b"c"],
        timestamps=[TS, TS + 1, TS + 2],
        keys=[None, b"k", None],
        headers=[[], [("h", b"x")], []],
        base_offset=10,
        offset_deltas=[0, 2, 3],
    )
    expected = [
        Record(10, TS, None, b"a", (), TimestampType.CREATE_TIME),
        Record(12, TS + 1, b"k", None, (("h", b"x"),), TimestampType.CREATE_TIME),
        Record(13, TS + 2, None, b"c", (), TimestampType.CREATE_TIME),
    ]
    columns = columns_of(data)
    assert columns.records() == expected
    assert list(columns) == expected
    assert all(type(r) is Record for r in columns)
    assert [r.offset for r in columns] == [10, 12, 13]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.one_of(st.none(), st.binary(max_size=100)),
            st.one_of(st.none(), st.binary(max_size=20)),
            st.integers(min_value=-(10**6), max_value=10**6),
            st.integers(min_value=1, max_value=300),
            st.lists(
                st.tuples(st.text(max_size=5), st.one_of(st.none(), st.binary(max_size=5))),
                max_size=2,
            ),
        ),
        min_size=1,
        max_size=20,
    )
)
def test_columns_agree_with_kafka_python(
    rows: list[tuple[bytes | None, bytes | None, int, int, list[Header]]],
) -> None:
    deltas, delta = [], 0
    for _value, _key, _ts, step, _headers in rows:
        deltas.append(delta)
        delta += step
    data = build_record_batch(
        [r[0] for r in rows],
        keys=[r[1] for r in rows],
        timestamps=[TS + r[2] for r in rows],
        headers=[r[4] for r in rows],
        offset_deltas=deltas,
        base_offset=3,
    )
    got = [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in columns_of(data)]
    expected = [
        (r.offset, r.timestamp, r.key, r.value, [tuple(h) for h in r.headers])
        for r in KafkaPythonBatch(data)
    ]
    assert got == expected


# -- slice ---------------------------------------------------------------------------


def contiguous() -> RecordColumns:
    return columns_of(
        build_record_batch(
            [b"%d" % i for i in range(5)], timestamps=[TS + i for i in range(5)], base_offset=100
        )
    )


def gapped() -> RecordColumns:
    return columns_of(
        build_record_batch(
            [b"a", b"b", b"c", b"d"],
            timestamps=TS,
            keys=[b"ka", None, b"kc", None],
            offset_deltas=[0, 2, 5, 9],
        )
    )


@pytest.mark.parametrize(
    ("start", "end", "expected"),
    [
        (100, None, [100, 101, 102, 103, 104]),
        (0, None, [100, 101, 102, 103, 104]),
        (102, None, [102, 103, 104]),
        (101, 103, [101, 102]),
        (104, 105, [104]),
        (105, None, []),
        (103, 101, []),
        (102, 102, []),
        (0, 100, []),
    ],
)
def test_slice_contiguous_by_offsets(start: int, end: int | None, expected: list[int]) -> None:
    sliced = contiguous().slice(start, end)
    assert list(sliced.offsets) == expected
    assert isinstance(sliced.offsets, range)
    assert list(sliced.values) == [b"%d" % (o - 100) for o in expected]
    assert list(sliced.timestamps) == [TS + o - 100 for o in expected]
    assert len(sliced) == len(expected)


@pytest.mark.parametrize(
    ("start", "end", "expected"),
    [
        (0, None, [0, 2, 5, 9]),
        (1, None, [2, 5, 9]),
        (3, None, [5, 9]),
        (2, 5, [2]),
        (2, 6, [2, 5]),
        (6, 9, []),
        (6, 10, [9]),
        (10, None, []),
    ],
)
def test_slice_with_gaps_keeps_columns_aligned(
    start: int, end: int | None, expected: list[int]
) -> None:
    full = gapped()
    by_offset = {r.offset: r for r in full}
    sliced = full.slice(start, end)
    assert sliced.records() == [by_offset[o] for o in expected]


def test_slice_of_everything_is_the_same_object() -> None:
    full = gapped()
    assert full.slice(0) is full
    assert full.slice(-5, 100) is full


# -- decoding a range of offsets ------------------------------------------------------


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
    bounds=st.tuples(st.integers(-5, 400), st.one_of(st.none(), st.integers(-5, 400))),
    codec=st.sampled_from([CompressionType.NONE, CompressionType.GZIP]),
)
def test_decoding_a_range_equals_slicing_the_whole_decode(
    rows: list[tuple[bytes | None, bytes | None, int, int, bool]],
    bounds: tuple[int, int | None],
    codec: CompressionType,
) -> None:
    """Skipped records (read by length and offset delta only) and the early stop give
    exactly the records a full decode keeps, whatever the fields, gaps and widths."""
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
    start, end = bounds
    batch = DefaultRecordBatch(data)
    expected = batch.columns().slice(start, end).records()
    assert batch.columns(start, end).records() == expected
    assert batch.columns(start).records() == batch.columns().slice(start).records()


@pytest.mark.parametrize(("start", "end"), [(0, 10), (5, 9), (64, 300), (299, None), (8200, None)])
def test_a_range_of_plain_records_keeps_compact_columns(start: int, end: int | None) -> None:
    n = 9000  # offset deltas of one, two and three varint bytes
    batch = DefaultRecordBatch(build_record_batch([b"v%d" % i for i in range(n)], timestamps=TS))
    columns = batch.columns(start, end)
    stop = n if end is None else end
    assert columns.offsets == range(start, stop)
    assert list(columns.values) == [b"v%d" % i for i in range(start, stop)]
    assert list(columns.timestamps) == [TS] * (stop - start)


def test_records_skipped_or_after_the_range_are_not_decoded() -> None:
    # Record 1's key length is malformed (-3): a full decode fails on it, a decode of
    # the records after it skips it by its length, one of those before stops first.
    body = raw_record(0) + raw_record(1, key_field=encode_varint(-3)) + raw_record(2)
    with pytest.raises(CorruptRecordError, match="invalid key length"):
        decode(body, count=3)
    after = decode_record_columns(
        body, 0, len(body), 3, 0, TS, TimestampType.CREATE_TIME, None, start_offset=2
    )
    assert after.offsets == range(2, 3)
    before = decode_record_columns(
        body, 0, len(body), 3, 0, TS, TimestampType.CREATE_TIME, None, end_offset=1
    )
    assert before.offsets == range(1)


@pytest.mark.parametrize(
    ("record", "message"),
    [
        (raw_record(0, length_adjust=-20), "invalid record length"),
        (raw_record(0, length_adjust=50), "runs past"),
        (encode_varint(8) + b"\x00" + b"\xff" * 7, "record length disagrees"),
        (encode_varint(14) + b"\x00" + b"\xff" * 13, "over 10 bytes|longer than 10"),
    ],
)
def test_a_skipped_record_must_still_frame_correctly(record: bytes, message: str) -> None:
    body = record + raw_record(1)
    with pytest.raises(CorruptRecordError, match=message):
        decode_record_columns(
            body, 0, len(body), 2, 0, TS, TimestampType.CREATE_TIME, None, start_offset=1
        )


def test_a_decode_reaching_the_end_still_checks_leftover_bytes() -> None:
    body = raw_record(0) + raw_record(1) + b"\x00"
    with pytest.raises(CorruptRecordError, match="1 bytes after"):
        decode_record_columns(
            body, 0, len(body), 2, 0, TS, TimestampType.CREATE_TIME, None, start_offset=1
        )
    stopped = decode_record_columns(
        body, 0, len(body), 2, 0, TS, TimestampType.CREATE_TIME, None, end_offset=1
    )
    assert stopped.offsets == range(1)


def test_legacy_batch_columns_of_a_range_are_a_slice() -> None:
    # One v1 message (magic, attributes, timestamp, null key, value), CRC over it.
    body = struct.pack(">bbqi", 1, 0, TS, -1) + struct.pack(">i", 2) + b"v5"
    batch = LegacyRecordBatch(struct.pack(">qiI", 5, len(body) + 4, zlib.crc32(body)) + body)
    assert [r.offset for r in batch.columns(5)] == [5]
    assert [r.offset for r in batch.columns(None, 6)] == [5]
    assert len(batch.columns(6)) == 0
    assert len(batch.columns(0, 5)) == 0


# -- plain values (the renderer's fast path) -------------------------------------------


def test_plain_values_of_a_batch_of_lines() -> None:
    values = [b"line %d" % i for i in range(300)] + [b"x" * 8000, b""]
    batch = DefaultRecordBatch(build_record_batch(values, timestamps=TS, base_offset=9))
    assert batch.plain_values() == values
    gzip = build_record_batch(values, timestamps=TS, codec=CompressionType.GZIP)
    assert DefaultRecordBatch(gzip).plain_values() == values


@pytest.mark.parametrize(
    "kwargs",
    [
        {"keys": [None, b"k"]},
        {"headers": [[], [("h", None)]]},
        {"timestamps": [TS, TS + 1]},
        {"offset_deltas": [0, 2]},
        {"values": [b"a", None]},
        {"values": [b"a", b"b" * 9000]},
        {"values": [b"v"] * 8193},
    ],
)
def test_plain_values_are_none_for_any_other_batch(kwargs: dict[str, object]) -> None:
    arguments: dict[str, object] = {"values": [b"a", b"b"], "timestamps": TS, **kwargs}
    batch = DefaultRecordBatch(build_record_batch(**arguments))  # type: ignore[arg-type]
    assert batch.plain_values() is None


def test_plain_values_are_none_for_a_wrong_count_or_leftover_bytes() -> None:
    body = raw_record(0) + raw_record(1)
    assert decode_plain_values(body, 0, len(body), 2) == [b"v", b"v"]
    assert decode_plain_values(body, 0, len(body), 1) is None
    assert decode_plain_values(body, 0, len(body), 3) is None
    assert decode_plain_values(body + b"\x00", 0, len(body) + 1, 2) is None
    assert decode_plain_values(body, 0, len(body), -1) is None


# -- the columns object ----------------------------------------------------------------


def test_columns_compare_by_value_and_show_their_fields() -> None:
    a = columns_of(build_record_batch([b"a", b"b"], timestamps=TS))
    b = columns_of(build_record_batch([b"a", b"b"], timestamps=TS))
    assert a == b
    assert a != columns_of(build_record_batch([b"a", b"c"], timestamps=TS))
    assert a != "columns"
    assert "values=[b'a', b'b']" in repr(a)
    with pytest.raises(TypeError):
        hash(a)


# -- columns_from_records ------------------------------------------------------------


def test_columns_from_contiguous_records_use_a_range() -> None:
    records = [Record(5, TS, None, b"a"), Record(6, TS + 1, b"k", None, (("h", None),))]
    columns = columns_from_records(records)
    assert columns.offsets == range(5, 7)
    assert columns.records() == records


def test_columns_from_records_with_gaps_keep_them() -> None:
    records = [
        Record(5, 1, None, b"a", (), TimestampType.LOG_APPEND_TIME),
        Record(8, 1, None, b"b", (), TimestampType.LOG_APPEND_TIME),
    ]
    columns = columns_from_records(records)
    assert list(columns.offsets) == [5, 8]
    assert columns.timestamp_type is TimestampType.LOG_APPEND_TIME
    assert columns.records() == records


def test_columns_from_no_records_are_empty() -> None:
    columns = columns_from_records([])
    assert len(columns) == 0
    assert columns.timestamp_type is TimestampType.CREATE_TIME


# -- corruption ----------------------------------------------------------------------


def with_count(data: bytes, count: int) -> bytes:
    # recordsCount is bytes 57-60, outside nothing the decoder checks (the CRC is not).
    return data[:57] + count.to_bytes(4, "big", signed=True) + data[61:]


@pytest.mark.parametrize("delta", [1, -1, 100])
def test_a_wrong_record_count_is_corrupt(delta: int) -> None:
    data = build_record_batch([b"a", b"b", b"c"], timestamps=TS, keys=[b"k", None, None])
    with pytest.raises(CorruptRecordError):
        columns_of(with_count(data, 3 + delta))


def test_a_negative_record_count_is_corrupt() -> None:
    data = build_record_batch([b"a"], timestamps=TS)
    with pytest.raises(CorruptRecordError, match="negative record count"):
        columns_of(with_count(data, -1))


def test_records_missing_at_the_end_of_the_buffer_are_corrupt() -> None:
    body = raw_record(0) + raw_record(1)
    # Called directly, the decoder reports running off ``data`` as IndexError.
    with pytest.raises((CorruptRecordError, IndexError)):
        decode(body, 3)


def test_a_record_running_past_the_batch_is_corrupt() -> None:
    body = raw_record(0) + raw_record(1, length_adjust=5)
    with pytest.raises(CorruptRecordError, match="runs past its batch"):
        decode(body, 2)


def test_a_record_running_past_end_is_corrupt_even_with_bytes_after_end() -> None:
    body = raw_record(0, length_adjust=1)
    data = body + b"\x00" * 10
    with pytest.raises(CorruptRecordError, match="runs past its batch"):
        decode_record_columns(data, 0, len(body), 1, 0, TS, TimestampType.CREATE_TIME, None)


def test_trailing_bytes_after_the_last_record_are_corrupt() -> None:
    body = raw_record(0) + raw_record(1)
    with pytest.raises(CorruptRecordError, match="3 bytes after the last of 2 records"):
        decode(body + b"\x00\x00\x00", 2)


def test_trailing_bytes_inside_a_batch_are_corrupt() -> None:
    data = build_record_batch([b"a", b"b"], timestamps=TS)
    length = int.from_bytes(data[8:12], "big") + 2
    padded = data[:8] + length.to_bytes(4, "big") + data[12:] + b"\x00\x00"
    with pytest.raises(CorruptRecordError):
        columns_of(padded)


@pytest.mark.parametrize(
    ("record", "message"),
    [
        (encode_varint(-1) + b"\x00" * 6, "invalid record length -1"),
        (encode_varint(5) + b"\x00" * 5, "invalid record length 5"),
        (raw_record(0, length_adjust=1) + b"\x00", "record length disagrees"),
        (raw_record(0, length_adjust=-1), "record length disagrees"),
        (raw_record(0, key_field=encode_varint(-2)), "invalid key length -2"),
        (raw_record(0, value_field=encode_varint(-3)), "invalid value length -3"),
        (raw_record(0, headers_field=encode_varint(-1)), "invalid header count -1"),
        (raw_record(0, headers_field=b"\x02" + encode_varint(-1) + b"\x01"), "null header key"),
        (
            raw_record(0, headers_field=b"\x02\x02h" + encode_varint(-2)),
            "invalid header value length -2",
        ),
    ],
)
def test_malformed_record_fields_are_corrupt(record: bytes, message: str) -> None:
    with pytest.raises(CorruptRecordError, match=message):
        decode(record, 1)


def test_a_varint_over_ten_bytes_is_corrupt() -> None:
    record = raw_record(0, key_field=b"\xff" * 11 + b"\x00")
    with pytest.raises(CorruptRecordError, match="longer than 10 bytes"):
        decode(record, 1)


def test_a_header_key_that_is_not_utf8_is_corrupt_through_the_batch() -> None:
    data = build_record_batch([b"v"], timestamps=TS, headers=[[("h", b"x")]])
    body_start = data.index(b"\x02h\x02x", RECORD_BATCH_OVERHEAD)
    broken = data[:body_start] + b"\x02\xff\x02x" + data[body_start + 4 :]
    with pytest.raises(CorruptRecordError, match="does not parse"):
        columns_of(broken)


def test_batch_corruption_reports_the_batch_position() -> None:
    data = build_record_batch([b"a"], timestamps=TS)
    with pytest.raises(CorruptRecordError) as info:
        DefaultRecordBatch(with_count(data, 2), 0, position=4096).columns()
    assert info.value.position == 4096


def test_columns_match_records_for_every_field_combination() -> None:
    # All eight combinations of key / header / own timestamp in one batch.
    combos: Sequence[tuple[bool, bool, bool]] = [
        (k, h, t) for k in (False, True) for h in (False, True) for t in (False, True)
    ]
    data = build_record_batch(
        [b"v%d" % i for i in range(8)],
        keys=[b"k" if k else None for k, _, _ in combos],
        headers=[[("h", b"x")] if h else [] for _, h, _ in combos],
        timestamps=[TS + (i if t else 0) for i, (_, _, t) in enumerate(combos)],
    )
    records = columns_of(data).records()
    assert [r.key for r in records] == [b"k" if k else None for k, _, _ in combos]
    assert [r.headers for r in records] == [(("h", b"x"),) if h else () for _, h, _ in combos]
    assert [r.timestamp for r in records] == [
        TS + (i if t else 0) for i, (_, _, t) in enumerate(combos)
    ]


@pytest.mark.parametrize("at", [0, 1, 63, 64, 65, 300])
@pytest.mark.parametrize("kind", ["key", "null-value", "header", "timestamp", "big-value"])
def test_plain_run_hands_over_to_the_general_decoder(at: int, kind: str) -> None:
    """The plain-record fast path stops at the first record that differs; every record
    after it still decodes, whatever field differs and wherever it happens."""
    n = 320
    values: list[bytes | None] = [b"value %d" % i for i in range(n)]
    keys: list[bytes | None] = [None] * n
    headers: list[tuple[Header, ...]] = [()] * n
    timestamps = [TS] * n
    if kind == "key":
        keys[at] = b"k"
    elif kind == "null-value":
        values[at] = None
    elif kind == "header":
        headers[at] = (("h", b"v"),)
    elif kind == "timestamp":
        timestamps[at] = TS + 5
    else:
        values[at] = b"x" * 9000  # a three-byte value length
    data = build_record_batch(
        values, keys=keys, headers=headers, timestamps=timestamps, base_offset=40
    )
    columns = columns_of(data)
    assert list(columns.offsets) == list(range(40, 40 + n))
    assert list(columns.values) == values
    assert list(columns.keys) == keys
    assert list(columns.headers) == headers
    assert list(columns.timestamps) == timestamps


def test_corrupt_record_inside_a_plain_run_is_reported() -> None:
    body = bytearray(build_record_batch([b"v" * 10] * 50, timestamps=TS)[RECORD_BATCH_OVERHEAD:])
    # Each record: length 16 (one byte, zigzag 32) + 00 00 offsetDelta 01 0a value 00.
    record = 30 * 17
    assert body[record] == 32
    body[record] = 34  # one byte longer than its fields
    with pytest.raises(CorruptRecordError):
        decode(bytes(body), count=50)

"""Engine column batches to Arrow record batches (``ArrowBatcher``), without Spark."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from seglogfs.spark.arrow import SMALL_BATCH_ROWS, _repeat, arrow_batches, arrow_schema
from storage import Header, RecordColumns, TimestampType
from storage.record.record_columns import PackedColumns, pack_columns

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _expected_rows(
    columns: list[RecordColumns | PackedColumns], include_headers: bool
) -> list[dict[str, Any]]:
    """What each record must become, built record by record from the columns."""
    rows = []
    for packed_or_not in columns:
        c = packed_or_not.unpacked() if isinstance(packed_or_not, PackedColumns) else packed_or_not
        for i in range(len(c)):
            row: dict[str, Any] = {
                "key": c.keys[i],
                "value": c.values[i],
                "topic": "t",
                "partition": 3,
                "offset": c.offsets[i],
                "timestamp": EPOCH + dt.timedelta(milliseconds=c.timestamps[i]),
                "timestampType": int(c.timestamp_type),
            }
            if include_headers:
                headers = c.headers[i]
                row["headers"] = [{"key": k, "value": v} for k, v in headers] or None
            rows.append(row)
    return rows


@st.composite
def engine_batches(draw: st.DrawFn) -> list[RecordColumns | PackedColumns]:
    """Engine batches of every shape the batcher tells apart: below and above
    ``SMALL_BATCH_ROWS``, contiguous offsets (a range) or offsets with compaction gaps
    (a list), keyless or keyed, with and without headers, null values, one or varied
    timestamps, the three timestamp types, and as lists or packed (``PackedColumns``,
    whose nulls are a validity bitmap in Arrow)."""
    batches: list[RecordColumns | PackedColumns] = []
    offset = draw(st.integers(0, 1000))
    for _ in range(draw(st.integers(0, 6))):
        n = draw(st.sampled_from([1, 2, 7, SMALL_BATCH_ROWS - 1, SMALL_BATCH_ROWS, 600]))
        offsets: range | list[int]
        if draw(st.booleans()):
            offsets = range(offset, offset + n)
        else:
            offsets = [offset + 2 * i for i in range(n)]
        offset = offsets[-1] + 1 + draw(st.sampled_from([0, 0, 5]))
        with_keys, with_headers, null_values, one_time = (draw(st.booleans()) for _ in range(4))
        base_time = draw(st.integers(0, 2**41))
        headers: list[tuple[Header, ...]] = [
            (("h", b"%d" % i), ("none", None)) if with_headers and i % 3 == 0 else ()
            for i in range(n)
        ]
        columns = RecordColumns(
            offsets,
            [base_time if one_time else base_time + 7 * i for i in range(n)],
            [b"k%d" % i if with_keys and i % 2 else None for i in range(n)],
            [None if null_values and i % 5 == 0 else b"v%d" % i for i in range(n)],
            headers,
            draw(st.sampled_from(list(TimestampType))),
        )
        batches.append(pack_columns(columns) if draw(st.booleans()) else columns)
    return batches


@settings(max_examples=60, deadline=None)
@given(
    batches=engine_batches(),
    rows=st.sampled_from([1, 100, SMALL_BATCH_ROWS, 1000]),
    include_headers=st.booleans(),
)
def test_arrow_batches_hold_every_record_in_order(
    batches: list[RecordColumns | PackedColumns], rows: int, include_headers: bool
) -> None:
    out = list(arrow_batches("t", 3, iter(batches), include_headers=include_headers, rows=rows))
    schema = arrow_schema(include_headers)
    assert all(b.schema == schema for b in out)
    for batch in out:
        batch.validate(full=True)
    # Every batch but the last holds at least ``rows`` rows, and none is empty.
    assert all(b.num_rows >= rows for b in out[:-1])
    assert all(b.num_rows > 0 for b in out)
    got = pa.Table.from_batches(out, schema=schema).to_pylist()
    assert got == _expected_rows(batches, include_headers)


def test_constant_columns_follow_the_batch_length() -> None:
    """Topic, partition and timestamp type are slices of a kept array: a shorter last
    batch, and a longer one after it, still get exactly their own length."""
    ts = TimestampType.CREATE_TIME
    sizes = [SMALL_BATCH_ROWS * 2, 3, SMALL_BATCH_ROWS * 3]
    start = 0
    batches = []
    for n in sizes:
        batches.append(
            RecordColumns(range(start, start + n), [5] * n, [None] * n, [b"x"] * n, [()] * n, ts)
        )
        start += n
    # rows=1: one batcher emits one Arrow batch per engine batch.
    out = list(arrow_batches("t", 3, iter(batches), include_headers=False, rows=1))
    assert [b.num_rows for b in out] == sizes
    for batch in out:
        for name in ("topic", "partition", "timestampType"):
            column = batch.column(name)
            assert len(column) == batch.num_rows
            assert column.null_count == 0
        assert set(batch.column("topic").to_pylist()) == {"t"}


def test_constant_columns_are_those_pa_repeat_builds() -> None:
    """``_repeat`` builds them from buffers (no pandas import); same arrays as Arrow's."""
    for value, type_ in (("orders", pa.string()), ("", pa.string()), (7, pa.int32())):
        for n in (0, 1, 8192):
            got = _repeat(value, type_, n)
            got.validate(full=True)
            assert got.equals(pa.repeat(pa.scalar(value, type_), n))

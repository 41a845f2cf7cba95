"""Engine column batches to Arrow record batches (``ArrowBatcher``), and the projections
of the Kafka schema a query may ask for (``Projection``), without Spark."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
)

from seglogfs.spark.arrow import (
    SMALL_BATCH_ROWS,
    ArrowBatcher,
    Projection,
    _repeat,
    arrow_batches,
    arrow_schema,
    spark_schema,
)
from seglogfs.spark.errors import SchemaError
from storage import Header, RecordColumns, TimestampType
from storage.record.record_columns import PackedColumns, pack_binary, pack_columns

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


@st.composite
def projections(draw: st.DrawFn) -> Projection:
    """A projection a query may ask for: any columns of the Kafka schema (headers only
    with ``includeHeaders``), none to all, in any order, ``key`` and ``value`` as
    ``binary`` or ``string``."""
    kafka = spark_schema(draw(st.booleans())).fields
    chosen = draw(st.permutations(kafka))[: draw(st.integers(0, len(kafka)))]
    fields = [
        StructField(f.name, StringType())
        if f.name in ("key", "value") and draw(st.booleans())
        else f
        for f in chosen
    ]
    return Projection.of(StructType(fields), include_headers="headers" in (f.name for f in kafka))


@settings(max_examples=100, deadline=None)
@given(
    batches=engine_batches(),
    rows=st.sampled_from([1, 100, SMALL_BATCH_ROWS, 1000]),
    projection=projections(),
)
def test_arrow_batches_hold_every_record_in_order(
    batches: list[RecordColumns | PackedColumns], rows: int, projection: Projection
) -> None:
    include_headers = "headers" in projection.columns
    out = list(arrow_batches("t", 3, iter(batches), projection=projection, rows=rows))
    assert all(b.schema == projection.schema for b in out)
    for batch in out:
        batch.validate(full=True)
    # Every batch but the last holds at least ``rows`` rows, and none is empty.
    assert all(b.num_rows >= rows for b in out[:-1])
    assert all(b.num_rows > 0 for b in out)
    got = pa.Table.from_batches(out, schema=projection.schema).to_pylist()
    strings = {f.name for f in projection.schema if f.type == pa.string()} - {"topic"}
    expected = [
        {
            name: row[name].decode() if name in strings and row[name] is not None else row[name]
            for name in projection.columns
        }
        for row in _expected_rows(batches, include_headers)
    ]
    assert got == expected


def test_the_whole_schema_is_the_full_projection() -> None:
    for include_headers in (False, True):
        full = Projection.full(include_headers)
        assert Projection.of(spark_schema(include_headers), include_headers=include_headers) == full
        assert full.schema == arrow_schema(include_headers)
        assert full.columns == tuple(spark_schema(include_headers).fieldNames())


@pytest.mark.parametrize(
    ("fields", "include_headers", "column", "reason"),
    [
        ([StructField("payload", BinaryType())], False, "payload", "not a column of the Kafka"),
        ([StructField("Value", BinaryType())], False, "Value", "did you mean value"),
        ([StructField("headers", BinaryType())], False, "headers", "includeHeaders=true"),
        ([StructField("partition", LongType())], False, "partition", "int in the Kafka schema"),
        ([StructField("offset", IntegerType())], False, "offset", "bigint in the Kafka schema"),
        ([StructField("value", IntegerType())], False, "value", "binary or string"),
        ([StructField("topic", BinaryType())], False, "topic", "string in the Kafka schema"),
        ([StructField("timestamp", TimestampNTZType())], False, "timestamp", "not timestamp_ntz"),
        ([StructField("headers", StringType())], True, "headers", "array<struct<key:string"),
        ([StructField("value", BinaryType(), nullable=False)], False, "value", "can be null"),
        ([StructField("key", StringType(), nullable=False)], False, "key", "can be null"),
        (
            [StructField("value", BinaryType()), StructField("value", StringType())],
            False, "value", "named twice",
        ),
    ],
)  # fmt: skip
def test_a_schema_that_is_no_projection_names_the_column(
    fields: list[StructField], include_headers: bool, column: str, reason: str
) -> None:
    with pytest.raises(SchemaError) as info:
        Projection.of(StructType(fields), include_headers=include_headers)
    assert info.value.column == column
    assert f"column {column!r}" in str(info.value)
    assert reason in str(info.value)


def test_never_null_columns_may_be_declared_not_null() -> None:
    schema = StructType([StructField("offset", LongType(), nullable=False)])
    projection = Projection.of(schema, include_headers=False)
    batch = next(arrow_batches("t", 0, iter([_plain_packed(3)]), projection=projection, rows=8192))
    assert batch.schema == projection.schema
    assert not batch.schema.field("offset").nullable
    assert batch.column("offset").to_pylist() == [0, 1, 2]


def _plain_packed(n: int) -> PackedColumns:
    return PackedColumns(
        range(n), [7] * n, None, pack_binary([b"v%d" % i for i in range(n)]), [()] * n,
        TimestampType.CREATE_TIME,
    )  # fmt: skip


def test_value_as_string_is_the_engine_buffer_itself() -> None:
    """A ``string`` value is the packed binary column under another type: no copy."""
    packed = _plain_packed(300)
    schema = StructType([StructField("value", StringType())])
    batcher = ArrowBatcher("t", 0, Projection.of(schema, include_headers=False), rows=8192)
    assert batcher.add(packed) is None
    batch = batcher.flush()
    assert batch is not None
    value = batch.column("value")
    assert value.type == pa.string()
    assert value.buffers()[2].address == pa.py_buffer(packed.values.data).address
    assert value.to_pylist() == [f"v{i}" for i in range(300)]


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
    out = list(arrow_batches("t", 3, iter(batches), projection=Projection.full(False), rows=1))
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

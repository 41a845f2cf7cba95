"""Records of a partition as Arrow record batches with the Kafka source's schema, or
the projection of it a query asked for.

The columns and types are Spark's Kafka source's: ``key`` and ``value`` binary,
``topic`` string, ``partition`` int, ``offset`` long, ``timestamp`` timestamp,
``timestampType`` int, and with ``includeHeaders`` ``headers`` as
``array<struct<key: string, value: binary>>`` (null for a record without headers, as
Kafka's source gives).

A query that gives a schema (``spark.read.format("seglog").schema("value binary")``)
reads only those columns, in that order (``Projection``): Spark converts every row of
every column a Python source yields into its own row format, whether the query uses
the column or not, and Spark 4.3 tells a Python source nothing of the columns a query
needs (its ``PythonScanBuilder`` pushes filters only), so the schema is the way to
say it. ``key`` and ``value`` may be asked for as ``string``: the same Arrow buffers
under the ``string`` type, no copy, and no UTF-8 check, as Spark's own
``cast(value as string)`` does none.

Spark (4.3) checks the Arrow schema a Python source yields against the one it derives
from the Spark schema with the time zone ``UTC``: a timestamp column must be
``timestamp('us', tz='UTC')`` (the instant; Spark shows it in the session time zone),
and a naive timestamp or ``large_binary`` is refused as a schema mismatch. The schema
is therefore derived by Spark's own ``to_arrow_schema`` from the Spark schema, never
written out by hand.

Rows are built from the engine's columns (``RecordColumns``), one engine batch after
another, and handed over in Arrow batches of about ``ROWS_PER_ARROW_BATCH`` rows: the
per-batch cost of Arrow and of Spark's transfer is then spread over thousands of rows
even when the log holds one-record batches (legacy messages, a producer of single
lines); 1024-row batches cost Spark's Python worker 0.4 s more per 10^7 rows than
8192-row ones, and 65536 rows gain nothing (measured with a source yielding ready-made
batches). Each engine batch becomes Arrow arrays by one C call per column, so no
Python object is made per row: the engine packs the values (and keys) of a large batch
into one buffer with int32 bounds (``PackedColumns``), the layout of an Arrow ``binary``
array, which is wrapped without a copy; a run of contiguous offsets is one ``arange``,
a batch with one timestamp one ``full``, columns with no keys or headers nulls, and the
columns constant across a partition (topic, partition, one timestamp type) slices of
one array.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Final

import numpy as np
import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    NullType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from storage import Header, RecordColumns
from storage import TimestampType as RecordTimestampType  # pyspark's is a Spark type
from storage.record.record_columns import PackedBinary, PackedColumns

from .errors import SchemaError

SCHEMA_DDL: Final = (
    "key binary, value binary, topic string, partition int, offset bigint, "
    "timestamp timestamp, timestampType int"
)
HEADERS_DDL: Final = "headers array<struct<key: string, value: binary>>"
ROWS_PER_ARROW_BATCH: Final = 8192
SMALL_BATCH_ROWS: Final = 256
_ARROW_TIME_ZONE: Final = "UTC"


@cache
def spark_schema(include_headers: bool) -> StructType:
    """The Kafka source's Spark schema (``SCHEMA_DDL``), with ``headers`` when asked.

    Built from types, not parsed from the DDL: parsing needs a live SparkContext, which
    Spark's planner and task processes do not have.
    """
    fields = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if include_headers:
        header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
        fields.append(StructField("headers", ArrayType(header)))
    return StructType(fields)


@cache
def arrow_schema(include_headers: bool) -> pa.Schema:
    """The Arrow schema Spark expects for ``spark_schema(include_headers)``."""
    return to_arrow_schema(spark_schema(include_headers), timezone=_ARROW_TIME_ZONE)


_NULLABLE: Final = frozenset({"key", "value", "headers"})
"""The columns that can hold nulls: a schema may not declare them ``NOT NULL``."""
_AS_STRING: Final = frozenset({"key", "value"})
"""The binary columns a schema may ask for as ``string`` (the same Arrow buffers)."""
_FROM_HEADERS: Final = frozenset({"topic", "partition", "offset", "timestampType"})
"""The columns a v2 batch's header gives for all its records (``RecordSpan``)."""


class RecordSpan:
    """The records ``offsets`` of one v2 batch, all of timestamp type ``timestamp_type``,
    known from the batch's header alone: what the reader hands the batcher in place
    of the records' columns when the projection needs nothing else
    (``Projection.needs_records`` false). The attributes are ``Final``."""

    __slots__ = ("offsets", "timestamp_type")

    def __init__(self, offsets: range, timestamp_type: RecordTimestampType) -> None:
        self.offsets: Final = offsets
        self.timestamp_type: Final = timestamp_type

    def __len__(self) -> int:
        return len(self.offsets)


@dataclass(frozen=True)
class Projection:
    """The columns a read yields, in order: Kafka column names (``columns``) and the
    Arrow schema Spark expects of the batches (``schema``, derived from the Spark
    schema by Spark's own ``to_arrow_schema``; a ``string`` key or value is there as
    ``string``). Picklable and hashable: readers carry it to their tasks.
    """

    columns: tuple[str, ...]
    schema: pa.Schema

    @classmethod
    def of(cls, schema: StructType, *, include_headers: bool) -> Projection:
        """The projection a query's Spark schema asks for: any of the Kafka source's
        columns (``spark_schema(include_headers)``), in any order, each at most once,
        with its Kafka type, or ``string`` for ``key`` and ``value``. Without a
        user-specified schema Spark passes the source's own, the whole Kafka schema.

        Raises:
            SchemaError: a column the Kafka schema does not have (``headers`` without
                ``includeHeaders``), named twice, of another type, or declared
                ``NOT NULL`` although it can be null; the message names it.
        """
        kafka = {f.name: f.dataType for f in spark_schema(include_headers).fields}
        seen: set[str] = set()
        for f in schema.fields:
            name = f.name
            expected = kafka.get(name)
            if expected is None:
                raise SchemaError(name, _unknown_reason(name, kafka))
            if name in seen:
                raise SchemaError(name, "named twice")
            seen.add(name)
            allowed = [expected, StringType()] if name in _AS_STRING else [expected]
            if f.dataType not in allowed:
                wanted = " or ".join(t.simpleString() for t in allowed)
                raise SchemaError(
                    name, f"is {wanted} in the Kafka schema, not {f.dataType.simpleString()}"
                )
            if not f.nullable and name in _NULLABLE:
                raise SchemaError(name, "can be null: drop NOT NULL")
        arrow = to_arrow_schema(schema, timezone=_ARROW_TIME_ZONE)
        return cls(tuple(f.name for f in schema.fields), arrow)

    @property
    def needs_records(self) -> bool:
        """Whether a column needs the records themselves: ``key``, ``value``,
        ``timestamp`` or ``headers``. The others (``topic``, ``partition``, ``offset``,
        ``timestampType``, or no column at all, a count) come from batch headers."""
        return not _FROM_HEADERS.issuperset(self.columns)

    @classmethod
    def full(cls, include_headers: bool) -> Projection:
        """Every column of the Kafka schema: what a query without a schema reads."""
        return _full_projection(include_headers)


def kafka_columns(names: Iterable[str], *, include_headers: bool) -> StructType:
    """The Spark schema of the Kafka columns ``names``, in that order, each with its
    Kafka type: what ``.schema(...)`` takes to read just those columns.

    Raises:
        SchemaError: a name the Kafka schema lacks, or one given twice.
    """
    kafka = {f.name: f for f in spark_schema(include_headers).fields}
    # A name the Kafka schema lacks gets a type of none, for Projection.of to refuse.
    schema = StructType([kafka.get(name, StructField(name, NullType())) for name in names])
    Projection.of(schema, include_headers=include_headers)
    return schema


@cache
def _full_projection(include_headers: bool) -> Projection:
    return Projection(
        tuple(spark_schema(include_headers).fieldNames()), arrow_schema(include_headers)
    )


def _unknown_reason(name: str, kafka: Iterable[str]) -> str:
    if name == "headers":
        return "is in the Kafka schema only with the option includeHeaders=true"
    near = [k for k in kafka if k.lower() == name.lower()]
    if near:
        return f"is not a column of the Kafka schema (did you mean {near[0]}?)"
    return "is not a column of the Kafka schema (" + ", ".join(kafka) + ")"


class ArrowBatcher:
    """Accumulates the engine's column batches of one topic-partition and emits Arrow
    record batches of about ``rows`` rows, holding the columns of ``projection`` alone.

    Packed columns (``PackedColumns``, what the reader asks the engine for when a
    batch has ``SMALL_BATCH_ROWS`` records or more) become Arrow arrays at once, their
    value and key buffers wrapped as they are. An engine batch of ``SMALL_BATCH_ROWS``
    rows or more in ``RecordColumns`` also becomes Arrow arrays at once (one C call per
    column: the decoded ``bytes`` of its values are released right away, and no Python
    list of all the pending rows is built); smaller ones (legacy
    messages, line-by-line producers) are gathered in lists first, as one Arrow call per
    column per batch would cost more than their rows. ``flush`` concatenates the pieces
    (a copy of the bytes, no Python object per row). Offsets are kept as ranges while
    they are contiguous, so the offset column of a plain log is one ``arange``. A
    column the projection leaves out is never gathered: a ``value``-only batch costs
    the wrapping of the value buffers and their concatenation, nothing per other column.

    Not thread-safe: one per reading task.
    """

    def __init__(self, topic: str, partition: int, projection: Projection, rows: int) -> None:
        self.topic = topic
        self.partition = partition
        self.projection = projection
        self.rows = rows
        self._schema = projection.schema
        wanted = frozenset(projection.columns)
        self._keys_wanted = "key" in wanted
        self._values_wanted = "value" in wanted
        self._offsets_wanted = "offset" in wanted
        self._timestamps_wanted = "timestamp" in wanted
        self._types_wanted = "timestampType" in wanted
        self._headers_wanted = "headers" in wanted
        self._headers_type = arrow_schema(True).field("headers").type
        self._needs_records = projection.needs_records
        # Columns constant across the partition, built once and sliced (no copy) for
        # each batch: most batches have the same length.
        self._constants: dict[tuple[str, object], pa.Array] = {}
        self._reset()

    def _reset(self) -> None:
        self._rows = 0
        # Pieces of the pending rows, in order. An int in ``_keys`` or ``_headers``
        # stands for that many nulls.
        self._values: list[pa.Array] = []
        self._keys: list[pa.Array | int] = []
        self._timestamps: list[np.ndarray] = []
        self._headers: list[pa.Array | int] = []
        self._offsets: list[range | np.ndarray] = []
        self._types: list[list[int]] = []  # runs of [timestamp type, rows]
        # Small engine batches not yet turned into pieces.
        self._small_rows = 0
        self._small_values: list[bytes | None] = []
        self._small_keys: list[bytes | None] = []
        self._small_timestamps: list[int] = []
        self._small_headers: list[tuple[Header, ...]] = []

    def __len__(self) -> int:
        return self._rows

    def add(self, columns: RecordColumns | PackedColumns | RecordSpan) -> pa.RecordBatch | None:
        """Add one engine batch; return an Arrow batch once ``rows`` rows are pending.
        A ``RecordSpan`` only where the projection needs no record (else ValueError).

        Cost: O(records) in C calls (Arrow, numpy, list extends) for each column the
        projection holds, plus O(1) Python work per engine batch.
        """
        n = len(columns)
        if n == 0:
            return None
        if self._offsets_wanted:
            self._add_offsets(columns.offsets)
        if self._types_wanted:
            timestamp_type = int(columns.timestamp_type)
            if self._types and self._types[-1][0] == timestamp_type:
                self._types[-1][1] += n
            else:
                self._types.append([timestamp_type, n])
        if isinstance(columns, RecordSpan):
            if self._needs_records:
                raise ValueError("a RecordSpan has no records for this projection's columns")
        elif isinstance(columns, PackedColumns):
            self._seal_small()
            keys = columns.keys
            self._add_piece(
                n,
                _binary_array(columns.values) if self._values_wanted else None,
                n if keys is None or not self._keys_wanted else _binary_array(keys),
                columns.timestamps,
                columns.headers,
            )
        elif n >= SMALL_BATCH_ROWS:
            self._seal_small()
            self._add_lists(n, columns.values, columns.keys, columns.timestamps, columns.headers)
        else:
            self._small_rows += n
            if self._values_wanted:
                self._small_values += columns.values
            if self._keys_wanted:
                self._small_keys += columns.keys
            if self._timestamps_wanted:
                self._small_timestamps += columns.timestamps
            if self._headers_wanted:
                self._small_headers += columns.headers
        self._rows += n
        if self._rows >= self.rows:
            return self.flush()
        return None

    def _add_offsets(self, offsets: Sequence[int]) -> None:
        if isinstance(offsets, range) and offsets.step == 1:
            last = self._offsets[-1] if self._offsets else None
            if isinstance(last, range) and last.stop == offsets.start:
                self._offsets[-1] = range(last.start, offsets.stop)
            else:
                self._offsets.append(offsets)
        else:
            self._offsets.append(np.array(offsets, dtype=np.int64))

    def _add_lists(
        self,
        n: int,
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None],
        timestamps: Sequence[int],
        headers: Sequence[tuple[Header, ...]],
    ) -> None:
        binary = pa.binary()
        self._add_piece(
            n,
            pa.array(values, binary) if self._values_wanted else None,
            pa.array(keys, binary) if self._keys_wanted and keys.count(None) != n else n,
            timestamps,
            headers,
        )

    def _add_piece(
        self,
        n: int,
        values: pa.Array | None,
        keys: pa.Array | int,
        timestamps: Sequence[int],
        headers: Sequence[tuple[Header, ...]],
    ) -> None:
        """Add the ``n`` rows of one piece, of the columns the projection holds:
        ``values`` None when it holds none, ``keys`` an int for that many nulls."""
        if values is not None:
            self._values.append(values)
        if self._keys_wanted:
            self._keys.append(keys)
        if self._timestamps_wanted:
            # A producer's batch often has one timestamp for all its records: checking
            # that (a C loop) is cheaper than converting every int.
            first = timestamps[0]
            if timestamps.count(first) == n:
                self._timestamps.append(np.full(n, first, dtype=np.int64))
            else:
                self._timestamps.append(np.array(timestamps, dtype=np.int64))
        if self._headers_wanted:
            self._headers.append(
                n
                if headers.count(()) == n
                else pa.array([h if h else None for h in headers], self._headers_type)
            )

    def _seal_small(self) -> None:
        n = self._small_rows
        if n:
            self._add_lists(
                n, self._small_values, self._small_keys, self._small_timestamps,
                self._small_headers,
            )  # fmt: skip
            self._small_rows = 0
            self._small_values = []
            self._small_keys = []
            self._small_timestamps = []
            self._small_headers = []

    def flush(self) -> pa.RecordBatch | None:
        """The pending rows as one Arrow batch (None when there are none)."""
        n = self._rows
        if n == 0:
            return None
        self._seal_small()
        arrays = [self._column(name, field.type, n) for name, field in
                  zip(self.projection.columns, self._schema, strict=True)]  # fmt: skip
        self._reset()
        if not arrays:  # no column (a count): the rows are the batch's length alone
            return pa.RecordBatch.from_struct_array(
                pa.StructArray.from_buffers(pa.struct([]), n, [None])
            )
        return pa.RecordBatch.from_arrays(arrays, schema=self._schema)

    def _column(self, name: str, type_: pa.DataType, n: int) -> pa.Array:
        """Column ``name`` of the ``n`` pending rows, as Arrow type ``type_`` (a
        ``string`` key or value is a view of the binary array)."""
        if name == "value":
            return _concat_arrow(self._values).view(type_)
        if name == "key":
            return _concat_nullable(self._keys, pa.binary(), n).view(type_)
        if name == "topic":
            return self._constant("topic", self.topic, type_, n)
        if name == "partition":
            return self._constant("partition", self.partition, type_, n)
        if name == "offset":
            offsets = [np.arange(o.start, o.stop, dtype=np.int64) if isinstance(o, range) else o
                       for o in self._offsets]  # fmt: skip
            return _fixed_width_array(_concat_numpy(offsets), type_)
        if name == "timestamp":
            timestamps = _concat_numpy(self._timestamps)
            timestamps *= 1000  # Kafka's milliseconds to Arrow's microseconds
            return _fixed_width_array(timestamps, type_)
        if name == "timestampType":
            if len(self._types) == 1:
                return self._constant("timestampType", self._types[0][0], type_, n)
            runs = np.array(self._types, dtype=np.int32)
            return _fixed_width_array(np.repeat(runs[:, 0], runs[:, 1]), type_)
        assert name == "headers"
        return _concat_nullable(self._headers, type_, n)

    def _constant(self, column: str, value: object, type_: pa.DataType, n: int) -> pa.Array:
        """``n`` copies of ``value``: a slice of an array kept for the column."""
        key = (column, value)
        array = self._constants.get(key)
        if array is None or len(array) < n:
            array = self._constants[key] = _repeat(value, type_, n)
        return array if len(array) == n else array.slice(0, n)


def _fixed_width_array(values: np.ndarray, type_: pa.DataType) -> pa.Array:
    """``values`` (a contiguous numpy array of ``type_``'s width) as an Arrow array over
    the same buffer, without nulls. Cost: O(1).

    ``pa.array`` would do the same, but pyarrow's conversion of numpy (and Python)
    objects imports pandas on first use: some 33,000 objects more in the Python worker,
    which Spark's daemon scans with ``gc.collect()`` after every task (a full collection
    took 10.5 ms with pandas imported, 3.9 ms without, in one process here), and 110 ms
    more for a worker's first read.
    """
    return pa.Array.from_buffers(type_, len(values), [None, pa.py_buffer(values)])


def _repeat(value: object, type_: pa.DataType, n: int) -> pa.Array:
    """``n`` copies of ``value``: an ``int32`` or a ``string`` (see ``_fixed_width_array``
    for why not ``pa.repeat``). Cost: O(n)."""
    if isinstance(value, int) and type_ == pa.int32():
        return _fixed_width_array(np.full(n, value, dtype=np.int32), type_)
    if isinstance(value, str) and type_ == pa.string():
        data = value.encode()
        if n * len(data) < 1 << 31:  # else beyond int32 offsets: pa.repeat refuses it too
            ends = np.arange(n + 1, dtype=np.int32) * np.int32(len(data))
            return pa.Array.from_buffers(
                type_, n, [None, pa.py_buffer(ends), pa.py_buffer(data * n)]
            )
    return pa.repeat(pa.scalar(value, type_), n)


def _binary_array(column: PackedBinary) -> pa.Array:
    """The packed column as an Arrow ``binary`` array over the same buffers (no copy:
    Arrow keeps the ``bytes`` objects alive). Cost: O(1), or O(entries) in numpy for
    the validity bitmap when there are nulls."""
    n = len(column)
    bounds = column.bounds
    if sys.byteorder == "big":  # the engine writes little-endian bounds
        bounds = np.frombuffer(bounds, dtype="<i4").astype(np.int32).tobytes()
    validity = None
    nulls = column.nulls
    if nulls is not None:
        valid = np.ones(n, dtype=np.bool_)
        valid[nulls] = False
        validity = pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.Array.from_buffers(
        pa.binary(),
        n,
        [validity, pa.py_buffer(bounds), pa.py_buffer(column.data)],
        null_count=0 if nulls is None else len(nulls),
    )


def _concat_numpy(pieces: list[np.ndarray]) -> np.ndarray:
    # A fresh array either way: the caller scales it in place.
    return pieces[0].copy() if len(pieces) == 1 else np.concatenate(pieces)


def _concat_arrow(pieces: list[pa.Array]) -> pa.Array:
    return pieces[0] if len(pieces) == 1 else pa.concat_arrays(pieces)


def _concat_nullable(pieces: list[pa.Array | int], type_: pa.DataType, n: int) -> pa.Array:
    """The pieces as one array; an int piece is that many nulls."""
    if all(isinstance(p, int) for p in pieces):
        return pa.nulls(n, type_)
    return _concat_arrow([pa.nulls(p, type_) if isinstance(p, int) else p for p in pieces])


def arrow_batches(
    topic: str,
    partition: int,
    columns: Iterator[RecordColumns | PackedColumns | RecordSpan],
    *,
    projection: Projection,
    rows: int = ROWS_PER_ARROW_BATCH,
) -> Iterator[pa.RecordBatch]:
    """Arrow record batches of the records in ``columns`` (already sliced to range),
    holding the columns of ``projection``."""
    batcher = ArrowBatcher(topic, partition, projection, rows)
    for cols in columns:
        out = batcher.add(cols)
        if out is not None:
            yield out
    last = batcher.flush()
    if last is not None:
        yield last

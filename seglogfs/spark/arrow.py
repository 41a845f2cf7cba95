"""Records of a partition as Arrow record batches with the Kafka source's schema.

The columns and types are Spark's Kafka source's: ``key`` and ``value`` binary,
``topic`` string, ``partition`` int, ``offset`` long, ``timestamp`` timestamp,
``timestampType`` int, and with ``includeHeaders`` ``headers`` as
``array<struct<key: string, value: binary>>`` (null for a record without headers, as
Kafka's source gives).

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
lines). Columns constant across a batch (topic, partition, no keys, one timestamp
type) are built without a Python object per row.
"""

from __future__ import annotations

from collections.abc import Iterator
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
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from storage import RecordColumns

SCHEMA_DDL: Final = (
    "key binary, value binary, topic string, partition int, offset bigint, "
    "timestamp timestamp, timestampType int"
)
HEADERS_DDL: Final = "headers array<struct<key: string, value: binary>>"
ROWS_PER_ARROW_BATCH: Final = 8192
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


class ArrowBatcher:
    """Accumulates the engine's column batches of one topic-partition and emits Arrow
    record batches of about ``rows`` rows.

    Not thread-safe: one per reading task.
    """

    def __init__(self, topic: str, partition: int, include_headers: bool, rows: int) -> None:
        self.topic = topic
        self.partition = partition
        self.include_headers = include_headers
        self.rows = rows
        self._schema = arrow_schema(include_headers)
        self._headers_type = self._schema.field("headers").type if include_headers else None
        self._reset()

    def _reset(self) -> None:
        self._offsets: list[int] = []
        self._timestamps: list[int] = []
        self._keys: list[bytes | None] = []
        self._keyless = True
        self._values: list[bytes | None] = []
        self._types: list[int] = []
        self._single_type: int | None = None
        self._mixed_types = False
        self._headers: list[object] = []
        self._no_headers = True

    def __len__(self) -> int:
        return len(self._offsets)

    def add(self, columns: RecordColumns) -> pa.RecordBatch | None:
        """Add one engine batch; return an Arrow batch once ``rows`` rows are pending.

        Cost: O(records) list extends at C speed; a column of keys or headers is only
        copied when some record of the batch has one.
        """
        n = len(columns)
        start = len(self._offsets)
        self._offsets += columns.offsets
        self._timestamps += columns.timestamps
        self._values += columns.values
        if self._keyless and columns.keys.count(None) != n:
            self._keyless = False
            self._keys = [None] * start
        if not self._keyless:
            self._keys += columns.keys
        timestamp_type = int(columns.timestamp_type)
        if self._single_type is None and not self._mixed_types:
            self._single_type = timestamp_type
        elif timestamp_type != self._single_type and not self._mixed_types:
            self._mixed_types = True
            self._types = [self._single_type if self._single_type is not None else 0] * start
        if self._mixed_types:
            self._types += [timestamp_type] * n
        if self.include_headers:
            headers = columns.headers
            if self._no_headers and headers.count(()) != n:
                self._no_headers = False
                self._headers = [None] * start
            if not self._no_headers:
                self._headers += [h if h else None for h in headers]
        if len(self._offsets) >= self.rows:
            return self.flush()
        return None

    def flush(self) -> pa.RecordBatch | None:
        """The pending rows as one Arrow batch (None when there are none)."""
        n = len(self._offsets)
        if n == 0:
            return None
        schema = self._schema
        binary = pa.binary()
        timestamps = np.array(self._timestamps, dtype=np.int64)
        timestamps *= 1000  # Kafka's milliseconds to Arrow's microseconds
        arrays = [
            pa.nulls(n, binary) if self._keyless else pa.array(self._keys, binary),
            pa.array(self._values, binary),
            pa.repeat(pa.scalar(self.topic, pa.string()), n),
            pa.repeat(pa.scalar(self.partition, pa.int32()), n),
            pa.array(np.array(self._offsets, dtype=np.int64)),
            pa.array(timestamps, type=schema.field("timestamp").type),
            pa.array(self._types, pa.int32())
            if self._mixed_types
            else pa.repeat(pa.scalar(self._single_type, pa.int32()), n),
        ]
        if self.include_headers:
            arrays.append(
                pa.nulls(n, self._headers_type)
                if self._no_headers
                else pa.array(self._headers, self._headers_type)
            )
        self._reset()
        return pa.RecordBatch.from_arrays(arrays, schema=schema)


def arrow_batches(
    topic: str,
    partition: int,
    columns: Iterator[RecordColumns],
    *,
    include_headers: bool,
    rows: int = ROWS_PER_ARROW_BATCH,
) -> Iterator[pa.RecordBatch]:
    """Arrow record batches of the records in ``columns`` (already sliced to range)."""
    batcher = ArrowBatcher(topic, partition, include_headers, rows)
    for cols in columns:
        out = batcher.add(cols)
        if out is not None:
            yield out
    last = batcher.flush()
    if last is not None:
        yield last

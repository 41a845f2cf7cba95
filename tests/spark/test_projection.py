"""A user-specified schema is a projection of the Kafka schema, through real Spark."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from seglogfs.spark.arrow import SCHEMA_DDL
from storage import LogManager

TS = 1_700_000_000_000


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Topic ``p``, 2 partitions of 40 records: odd ones keyed, every fifth with a header,
    values in UTF-8 beyond ASCII, one null value."""
    path = tmp_path_factory.mktemp("spark-projection") / "logs"
    with LogManager.open(path) as manager:
        manager.create_topic("p", 2)
        for partition in range(2):
            manager.log("p", partition).append(
                [None if i == 7 else f"wört {partition}/{i}".encode() for i in range(40)],
                keys=[b"k%d" % i if i % 2 else None for i in range(40)],
                headers=[(("h", b"%d" % i),) if i % 5 == 0 else () for i in range(40)],
                timestamps=[TS + i for i in range(40)],
            )
    return path


def _read(spark: Any, logs: Path, schema: str | StructType | None, **options: str) -> Any:
    reader = spark.read.format("seglog").option("subscribe", "p")
    for name, value in options.items():
        reader = reader.option(name, value)
    if schema is not None:
        reader = reader.schema(schema)
    return reader.load(str(logs))


def _engine(logs: Path) -> list[tuple[int, int, bytes | None, bytes | None, list[Any]]]:
    """(partition, offset, key, value, headers) of every record, as the engine reads it."""
    with LogManager.open(logs, read_only=True) as manager:
        return [
            (p, r.offset, r.key, r.value, list(r.headers))
            for p in range(2)
            for r in manager.log("p", p).records(0)
        ]


def test_value_alone(spark: Any, logs: Path) -> None:
    df = _read(spark, logs, "value binary")
    assert df.schema.simpleString() == "struct<value:binary>"
    got = Counter(None if r.value is None else bytes(r.value) for r in df.collect())
    assert got == Counter(value for _, _, _, value, _ in _engine(logs))
    # The plan reads that one column: the scan's output is the schema given.
    assert "BatchScan seglog[value#" in df._jdf.queryExecution().executedPlan().toString()


def test_several_columns_in_the_order_given(spark: Any, logs: Path) -> None:
    df = _read(spark, logs, "offset bigint, value binary, partition int, topic string")
    assert df.columns == ["offset", "value", "partition", "topic"]
    rows = sorted((r.partition, r.offset, r.value, r.topic) for r in df.collect())
    assert rows == [(p, o, v, "p") for p, o, _, v, _ in _engine(logs)]
    times = _read(spark, logs, "timestampType int, timestamp timestamp, partition int")
    row = times.where("partition = 1").orderBy("timestamp").first()
    assert row.timestampType == 0
    first = times.select(F.min(F.unix_millis("timestamp"))).first()
    assert first is not None
    assert first[0] == TS


def test_key_and_value_as_strings(spark: Any, logs: Path) -> None:
    df = _read(spark, logs, "value string, key string, partition int, offset bigint")
    assert df.schema.simpleString() == (
        "struct<value:string,key:string,partition:int,offset:bigint>"
    )
    rows = sorted((r.partition, r.offset, r.key, r.value) for r in df.collect())
    assert rows == [
        (p, o, None if k is None else k.decode(), None if v is None else v.decode())
        for p, o, k, v, _ in _engine(logs)
    ]
    # The same strings Spark's own cast of the Kafka columns gives.
    cast = _read(spark, logs, None).select(
        F.col("value").cast("string").alias("value"), F.col("key").cast("string").alias("key"),
        "partition", "offset",
    )  # fmt: skip
    assert sorted(map(tuple, cast.collect()), key=repr) == sorted(
        map(tuple, df.collect()), key=repr
    )


def test_headers_in_a_projection(spark: Any, logs: Path) -> None:
    df = _read(
        spark, logs, "headers array<struct<key: string, value: binary>>, offset bigint",
        includeHeaders="true",
    )  # fmt: skip
    rows = df.where("offset < 6").orderBy("offset").collect()
    assert [None if r.headers is None else [(h.key, h.value) for h in r.headers] for r in rows] == [
        [("h", b"0")], [("h", b"0")], None, None, None, None,
        None, None, None, None, [("h", b"5")], [("h", b"5")],
    ]  # fmt: skip


def test_no_schema_and_the_whole_schema_read_the_same(spark: Any, logs: Path) -> None:
    default = _read(spark, logs, None)
    assert default.schema.simpleString() == (
        "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,"
        "timestamp:timestamp,timestampType:int>"
    )
    whole = _read(spark, logs, SCHEMA_DDL)
    assert whole.schema == default.schema
    assert sorted(map(tuple, whole.collect()), key=repr) == sorted(
        map(tuple, default.collect()), key=repr
    )


def test_filters_are_pushed_down_within_a_projection(spark: Any, logs: Path) -> None:
    df = _read(spark, logs, "partition int, offset bigint, value string")
    narrowed = df.where((F.col("partition") == 1) & (F.col("offset") >= 37))
    assert narrowed.rdd.getNumPartitions() == 1
    assert [r.value for r in narrowed.orderBy("offset").collect()] == [
        "wört 1/37", "wört 1/38", "wört 1/39",
    ]  # fmt: skip


def test_count_without_columns(spark: Any, logs: Path) -> None:
    assert _read(spark, logs, StructType()).count() == 80
    assert _read(spark, logs, StructType(), endingOffsets='{"p": {"0": 5, "1": 9}}').count() == 14


def _fails_while_planned(spark: Any, action: Callable[[], object], *needles: str) -> None:
    """``action`` fails with a message holding ``needles``, before any Spark job ran."""
    group = f"planning-{uuid.uuid4()}"
    spark.sparkContext.setJobGroup(group, "a query that must fail while planned")
    try:
        with pytest.raises(PySparkException) as info:
            action()
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    for needle in needles:
        assert needle in str(info.value)
    assert spark.sparkContext.statusTracker().getJobIdsForGroup(group) == []


@pytest.mark.parametrize(
    ("schema", "needles"),
    [
        ("value binary, payload binary", ["seglog schema: column 'payload'", "not a column"]),
        ("value int", ["column 'value'", "binary or string in the Kafka schema, not int"]),
        ("partition bigint", ["column 'partition'", "int in the Kafka schema, not bigint"]),
        ("timestamp timestamp_ntz", ["column 'timestamp'", "not timestamp_ntz"]),
        ("headers array<struct<key: string, value: binary>>", ["'headers'", "includeHeaders"]),
    ],
)
def test_a_bad_schema_fails_while_planned(
    spark: Any, logs: Path, schema: str, needles: list[str]
) -> None:
    _fails_while_planned(spark, lambda: _read(spark, logs, schema).collect(), *needles)


def test_a_bad_schema_fails_a_stream_while_planned(spark: Any, logs: Path, tmp_path: Path) -> None:
    def start() -> None:
        query = (
            spark.readStream.format("seglog").option("subscribe", "p")
            .schema("value binary, offset int").load(str(logs))
            .writeStream.format("noop").option("checkpointLocation", str(tmp_path / "cp"))
            .trigger(availableNow=True).start()
        )  # fmt: skip
        try:
            query.awaitTermination(60)
        finally:
            query.stop()

    with pytest.raises(PySparkException) as info:
        start()
    assert "seglog schema: column 'offset'" in str(info.value)
    assert "bigint in the Kafka schema, not int" in str(info.value)


def test_a_stream_with_a_projection_resumes_from_its_checkpoint(spark: Any, tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    checkpoint = tmp_path / "checkpoint"
    with LogManager.open(log_dir) as manager:
        manager.create_topic("s", 2)
        for p in range(2):
            manager.log("s", p).append([b"first %d-%d" % (p, i) for i in range(6)])
    seen: list[tuple[int, list[tuple[str, int]]]] = []

    def collect(df: Any, batch_id: int) -> None:
        assert df.columns == ["value", "offset"]
        seen.append((batch_id, [(r.value, r.offset) for r in df.collect()]))

    def run() -> None:
        query = (
            spark.readStream.format("seglog").option("subscribe", "s")
            .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "5")
            .schema("value string, offset bigint").load(str(log_dir))
            .writeStream.foreachBatch(collect).option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True).start()
        )  # fmt: skip
        query.awaitTermination(120)
        assert query.exception() is None

    run()
    first_run = len(seen)
    assert first_run >= 3  # 12 records, at most 5 per micro-batch
    with LogManager.open(log_dir) as manager:
        for p in range(2):
            manager.log("s", p).append([b"second %d-%d" % (p, i) for i in range(3)])
    run()
    delivered = [row for _, rows in seen for row in rows]
    expected = [(f"first {p}-{i}", i) for p in range(2) for i in range(6)]
    expected += [(f"second {p}-{i}", 6 + i) for p in range(2) for i in range(3)]
    assert sorted(delivered) == sorted(expected)  # each record once, across both runs
    second_run = [row for _, rows in seen[first_run:] for row in rows]
    assert sorted(second_run) == sorted(expected[12:])

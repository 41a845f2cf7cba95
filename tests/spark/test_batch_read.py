"""Batch reads through Spark against what the engine itself returns."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.errors import PySparkException
from pyspark.sql import functions as F

from seglogfs.spark.arrow import Projection, arrow_schema
from seglogfs.spark.reader import (
    OffsetRange,
    estimated_bytes,
    plan_tasks,
    planner_cores,
    read_offset_range,
)
from storage import CompressionType, LogManager, TimestampType, build_record_batch
from tests.conftest import ManualClock
from tests.storage.test_kafka_compat import _legacy, _v2

TS = 1_700_000_000_000
CODECS = ["uncompressed", "gzip", "snappy", "lz4", "zstd"]

Row = tuple[Any, ...]


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``mixed`` (2 partitions: every codec, keys, headers, null values, explicit and
    log-append timestamps, a transaction marker), ``legacy`` (a segment assembled from
    kafka-python's v0/v1/v2 builders) and ``plain`` (3 partitions of numbered lines)."""
    path = tmp_path_factory.mktemp("spark-batch") / "logs"
    clock = ManualClock(TS)
    with LogManager.open(path, clock=clock) as manager:
        manager.create_topic("mixed", 2)
        for partition in range(2):
            log = manager.log("mixed", partition)
            for i, codec in enumerate(CODECS):
                manager.alter_topic_config("mixed", {"compression.type": codec})
                n = 20 + i
                log.append(
                    [
                        None if j == 3 else b"%s-%d-%d" % (codec.encode(), partition, j)
                        for j in range(n)
                    ],
                    keys=[b"k%d" % j if j % 2 else None for j in range(n)],
                    headers=[
                        (("h", b"v%d" % j), ("empty", None)) if j % 3 == 0 else () for j in range(n)
                    ],
                    timestamps=[TS + 1000 * i + j for j in range(n)],
                )
                clock.advance(10)
            manager.alter_topic_config("mixed", {"message.timestamp.type": "LogAppendTime"})
            log.append([b"appended-at-log-time"], timestamps=[1])
            manager.alter_topic_config(
                "mixed", set_configs={}, delete_configs=["message.timestamp.type"]
            )
        manager.create_topic("plain", 3)
        for partition in range(3):
            values = [b"line %d of %d" % (i, partition) for i in range(30)]
            manager.log("plain", partition).append(
                values, timestamps=[TS + 10 * i for i in range(30)]
            )
    segment = b"".join(
        [
            _legacy(0, 0, 0, [b"v0-a", b"v0-b"]),
            _legacy(1, 0, 2, [b"v1-a", b"v1-b"]),
            _legacy(1, 1, 4, [b"v1-gzip-%d" % i * 20 for i in range(3)]),
            _v2(7, int(CompressionType.ZSTD), [b"v2-zstd-%d" % i for i in range(3)]),
            _v2(10, int(CompressionType.SNAPPY), [b"v2-snappy-%d" % i for i in range(2)]),
        ]
    )
    (path / "legacy-0").mkdir()
    (path / "legacy-0" / "00000000000000000000.log").write_bytes(segment)

    # A transaction: two data batches around a commit marker (a control batch, which
    # clients may not append, so the segment is written as a broker would have).
    def txn(values: list[bytes], base_offset: int, control: bool = False) -> bytes:
        return build_record_batch(
            values,
            keys=[b"\x00\x00\x00\x01"] if control else None,
            timestamps=TS,
            base_offset=base_offset,
            producer_id=7,
            producer_epoch=0,
            is_transactional=True,
            is_control=control,
        )

    commit_marker = b"\x00\x00\x00\x00\x00\x00"
    transaction = (
        txn([b"t0", b"t1", b"t2"], 0) + txn([commit_marker], 3, True) + txn([b"t4", b"t5"], 4)
    )
    (path / "txn-0").mkdir()
    (path / "txn-0" / "00000000000000000000.log").write_bytes(transaction)
    return path


def _engine_rows(log_dir: Path, topics: list[str]) -> list[Row]:
    """Every consumer-visible record as the engine decodes it, in the source's columns."""
    rows: list[Row] = []
    with LogManager.open(log_dir, read_only=True) as manager:
        for topic in topics:
            for partition in range(manager.topic(topic).partitions):
                log = manager.log(topic, partition)
                for batch in log.batches(log.log_start_offset):
                    if batch.is_control:
                        continue
                    for r in batch.records():
                        headers = [(k, v) for k, v in r.headers] or None
                        rows.append(
                            (r.key, r.value, topic, partition, r.offset, r.timestamp * 1000,
                             int(r.timestamp_type), headers)
                        )  # fmt: skip
    return sorted(rows, key=lambda row: (row[2], row[3], row[4]))


def _spark_rows(df: Any) -> list[Row]:
    # unix_micros: the instant, independent of the session and the Python time zones.
    selected = df.select(
        "key", "value", "topic", "partition", "offset",
        F.unix_micros("timestamp").alias("micros"), "timestampType", "headers",
    ).orderBy("topic", "partition", "offset")  # fmt: skip
    return [
        (r.key, r.value, r.topic, r.partition, r.offset, r.micros, r.timestampType,
         None if r.headers is None else [(h.key, h.value) for h in r.headers])
        for r in selected.collect()
    ]  # fmt: skip


def test_batch_read_equals_engine_record_by_record(spark: Any, logs: Path) -> None:
    df = (
        spark.read.format("seglog")
        .option("subscribe", "mixed,legacy,txn")
        .option("includeHeaders", "true")
        .load(str(logs))
    )
    expected = _engine_rows(logs, ["legacy", "mixed", "txn"])
    got = _spark_rows(df)
    assert got == expected
    # The cases the fixture promises are really in there.
    assert any(row[0] is not None for row in got)
    assert any(row[1] is None for row in got)
    assert {row[6] for row in got} == {-1, 0, 1}  # v0, CreateTime, LogAppendTime
    assert any(row[7] == [("h", b"v0"), ("empty", None)] for row in got)
    assert len([row for row in got if row[2] == "legacy"]) == 12
    assert len([row for row in got if row[2] == "mixed"]) == 2 * (sum(20 + i for i in range(5)) + 1)
    # The transaction marker took an offset but is not a row.
    assert [(row[1], row[4]) for row in got if row[2] == "txn"] == [
        (b"t0", 0), (b"t1", 1), (b"t2", 2), (b"t4", 4), (b"t5", 5),
    ]  # fmt: skip


def test_schema_and_arrow_types(spark: Any, logs: Path) -> None:
    df = spark.read.format("seglog").option("subscribe", "plain").load(str(logs))
    assert df.schema.simpleString() == (
        "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,"
        "timestamp:timestamp,timestampType:int>"
    )
    # Tasks hand Spark Arrow batches of exactly the types Spark checks against.
    batches = list(
        read_offset_range(str(logs), OffsetRange("plain", 1, 0, 30),
                          projection=Projection.full(True), fail_on_data_loss=True)
    )  # fmt: skip
    assert [b.schema for b in batches] == [arrow_schema(True)]
    assert arrow_schema(True).field("timestamp").type == pa.timestamp("us", tz="UTC")
    first = spark.conf.get("spark.sql.session.timeZone")
    assert first != "UTC"  # the instants below are checked under another zone
    row = (
        df.where("partition = 2 and offset = 7")
        .select(F.unix_millis("timestamp").alias("ms"), F.col("value").cast("string").alias("v"))
        .first()
    )
    assert (row.ms, row.v) == (TS + 70, "line 7 of 2")


def test_offset_ranges_and_timestamps(spark: Any, logs: Path) -> None:
    def offsets(df: Any) -> dict[int, list[int]]:
        result: dict[int, list[int]] = {}
        for r in df.select("partition", "offset").orderBy("partition", "offset").collect():
            result.setdefault(r.partition, []).append(r.offset)
        return result

    ranged = (
        spark.read.format("seglog")
        .option("subscribe", "plain")
        .option("startingOffsets", json.dumps({"plain": {"0": 5, "1": -2, "2": 29}}))
        .option("endingOffsets", json.dumps({"plain": {"0": 8, "1": 2, "2": -1}}))
        .load(str(logs))
    )
    assert offsets(ranged) == {0: [5, 6, 7], 1: [0, 1], 2: [29]}

    timed = (
        spark.read.format("seglog")
        .option("subscribe", "plain")
        .option("startingTimestamp", str(TS + 275))
        .option(
            "endingOffsetsByTimestamp",
            json.dumps({"plain": {"0": TS + 285, "1": TS + 10**6, "2": TS + 10**6}}),
        )
        .load(str(logs))
    )
    assert offsets(timed) == {0: [28], 1: [28, 29], 2: [28, 29]}


def test_pushdown_prunes_partitions_and_offsets(spark: Any, logs: Path) -> None:
    df = spark.read.format("seglog").option("subscribe", "plain").load(str(logs))
    kafkas = spark.read.format("seglog").option("subscribe", "plain").option("minPartitions", "1")
    assert kafkas.load(str(logs)).rdd.getNumPartitions() == 3  # one task per partition
    narrowed = df.where((F.col("partition") == 1) & (F.col("offset") >= 25))
    assert narrowed.rdd.getNumPartitions() == 1
    assert [r.offset for r in narrowed.orderBy("offset").collect()] == [25, 26, 27, 28, 29]
    after = df.where(F.col("timestamp") >= F.timestamp_millis(F.lit(TS + 285)))
    assert sorted((r.partition, r.offset) for r in after.collect()) == [
        (p, o) for p in range(3) for o in (29,)
    ]
    split = spark.read.format("seglog").option("subscribe", "plain").option("minPartitions", "7")
    split_df = split.load(str(logs))
    assert split_df.rdd.getNumPartitions() >= 7
    assert split_df.groupBy("partition").count().orderBy("partition").collect() == [
        (0, 30), (1, 30), (2, 30),
    ]  # fmt: skip


def test_default_plan_splits_and_packs_as_text_does(spark: Any, tmp_path: Path) -> None:
    """Without ``minPartitions`` a large partition is read by several tasks and small
    ones share a task (``plan_tasks``): every record is read exactly once either way."""
    path = tmp_path / "logs"
    with LogManager.open(path) as manager:
        manager.create_topic("big", 1)
        manager.create_topic("small", 3)
        log = manager.log("big", 0)
        for start in range(0, 120_000, 1000):  # 12 MB: split on 2 cores or more
            log.append([b"%09d-" % i + b"x" * 90 for i in range(start, start + 1000)])
        for p in range(3):
            manager.log("small", p).append([b"s%d-%d" % (p, i) for i in range(10)])
        big = OffsetRange("big", 0, 0, 120_000)
        expected_tasks = len(plan_tasks([big], [estimated_bytes(manager, big)], planner_cores()))
        smalls = [OffsetRange("small", p, 0, 10) for p in range(3)]
        sizes = [estimated_bytes(manager, r) for r in smalls]
        expected_small_tasks = len(plan_tasks(smalls, sizes, planner_cores()))
    df = spark.read.format("seglog").option("subscribe", "big").schema("offset bigint")
    big_df = df.load(str(path))
    assert big_df.rdd.getNumPartitions() == expected_tasks
    if planner_cores() >= 2:
        assert expected_tasks >= 2
    offsets = big_df.agg(F.count("*"), F.countDistinct("offset"), F.min("offset"), F.max("offset"))
    assert tuple(offsets.first()) == (120_000, 120_000, 0, 119_999)
    small = spark.read.format("seglog").option("subscribe", "small").load(str(path))
    assert small.rdd.getNumPartitions() == expected_small_tasks
    if planner_cores() <= 2:
        assert expected_small_tasks < 3  # packed
    assert sorted((r.partition, r.offset, r.value) for r in small.collect()) == [
        (p, i, b"s%d-%d" % (p, i)) for p in range(3) for i in range(10)
    ]


def test_option_errors_reach_the_user(spark: Any, logs: Path) -> None:
    bad = (
        spark.read.format("seglog").option("subscribe", "plain").option("startingOffsets", "latest")
    )
    with pytest.raises(PySparkException, match="startingOffsets"):
        bad.load(str(logs)).count()
    missing = spark.read.format("seglog").option("subscribe", "plain")
    with pytest.raises(PySparkException, match="does not exist"):
        missing.load(str(logs / "nowhere")).count()


def test_timestamp_types_in_engine_fixture(logs: Path) -> None:
    # Guards the fixture itself: LogAppendTime really was written.
    with LogManager.open(logs, read_only=True) as manager:
        last = list(manager.log("mixed", 1).records(0))[-1]
    assert last.timestamp_type is TimestampType.LOG_APPEND_TIME
    assert last.timestamp != 1

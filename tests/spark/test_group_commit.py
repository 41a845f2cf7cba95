"""A streaming query's progress committed to a consumer group (``commitOffsets``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from seglogfs.spark.errors import OptionError
from seglogfs.spark.options import ReadOptions
from storage import OFFSETS_TOPIC, LogManager, OffsetStore


def _append(log_dir: Path, n: int) -> None:
    with LogManager.open(log_dir) as manager:
        if "g-a" not in manager.topics():
            manager.create_topic("g-a", 2)
        for p in range(2):
            manager.log("g-a", p).append([f"r{i}".encode() for i in range(n)])


def _run(spark: Any, log_dir: Path, checkpoint: Path, **options: str) -> int:
    batches: list[int] = []

    def collect(df: Any, batch_id: int) -> None:
        if df.count():
            batches.append(batch_id)

    reader = spark.readStream.format("seglog").option("subscribe", "g-a")
    reader = reader.option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "7")
    for name, value in options.items():
        reader = reader.option(name, value)
    query = (
        reader.load(str(log_dir))
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    return len(batches)


def _committed(log_dir: Path, group: str) -> tuple[dict[tuple[str, int], int], int]:
    """The group's committed offsets, and how many commit records its partition holds."""
    with LogManager.open(log_dir, read_only=True) as manager:
        if OFFSETS_TOPIC not in manager.topics():
            return {}, 0
        store = OffsetStore(manager)
        offsets = {tp: v.offset for tp, v in store.committed(group).items()}
        log = manager.log(OFFSETS_TOPIC, store.partition_of(group))
        return offsets, sum(1 for _ in log.records(0))


def test_each_micro_batch_commits_its_end_to_the_group(spark: Any, tmp_path: Path) -> None:
    log_dir, checkpoint = tmp_path / "logs", tmp_path / "checkpoint"
    _append(log_dir, 10)
    options = {"commitOffsets": "true", "kafka.group.id": "pipeline"}
    batches = _run(spark, log_dir, checkpoint, **options)
    # 20 records at most 7 a micro-batch: at least 3 batches. Spark tells a source that
    # a batch is done when it plans the next one (the offset log's walCommit), so the
    # last batch of a run is committed by the next run: every earlier one is now.
    assert batches >= 3
    offsets, records = _committed(log_dir, "pipeline")
    assert set(offsets) == {("g-a", 0), ("g-a", 1)}
    assert 0 < sum(offsets.values()) < 20
    assert records >= 2 * (batches - 1) - 1  # a record per partition whose offset moved
    # The next run (one micro-batch of 4 records) first commits the previous run's last
    # batch: all 20 records; its own batch is the next run's to commit.
    _append(log_dir, 2)
    _run(spark, log_dir, checkpoint, **options)
    assert _committed(log_dir, "pipeline")[0] == {("g-a", 0): 10, ("g-a", 1): 10}


def test_without_commit_offsets_no_group_is_written(spark: Any, tmp_path: Path) -> None:
    log_dir, checkpoint = tmp_path / "logs", tmp_path / "checkpoint"
    _append(log_dir, 3)
    # kafka.group.id alone changes nothing, as with Spark's Kafka source.
    _run(spark, log_dir, checkpoint, **{"kafka.group.id": "pipeline"})
    assert _committed(log_dir, "pipeline") == ({}, 0)


def test_commit_offsets_needs_a_group_and_a_stream() -> None:
    base = {"path": "/x", "subscribe": "t", "commitOffsets": "true"}
    with pytest.raises(OptionError, match=r"kafka\.group\.id"):
        ReadOptions.parse(base, streaming=True)
    with pytest.raises(OptionError, match="only streaming queries commit"):
        ReadOptions.parse({**base, "kafka.group.id": "g"}, streaming=False)
    assert ReadOptions.parse({**base, "kafka.group.id": "g"}, streaming=True).commit_group == "g"

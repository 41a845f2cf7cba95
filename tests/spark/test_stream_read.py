"""Streaming reads: offsets in Spark's checkpoint, exact resume across separate runs."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from storage import LogManager

Seen = list[tuple[int, list[tuple[str, int, int, bytes]]]]


def _append(log_dir: Path, topic: str, partition: int, n: int, tag: str) -> None:
    with LogManager.open(log_dir) as manager:
        if topic not in manager.topics():
            manager.create_topic(topic, 2 if topic == "s-a" else 1)
        values = [f"{tag} {topic}-{partition} #{i}".encode() for i in range(n)]
        manager.log(topic, partition).append(values)


def _engine_records(log_dir: Path) -> list[tuple[str, int, int, bytes]]:
    with LogManager.open(log_dir, read_only=True) as manager:
        return sorted(
            (topic, p, r.offset, r.value or b"")
            for topic in manager.topics()
            for p in range(manager.topic(topic).partitions)
            for r in manager.log(topic, p).records(0)
        )


def _query(spark: Any, log_dir: Path, checkpoint: Path, seen: Seen, **options: str) -> Any:
    def collect(df: Any, batch_id: int) -> None:
        rows = df.select("topic", "partition", "offset", "value").collect()
        seen.append((batch_id, [(r.topic, r.partition, r.offset, bytes(r.value)) for r in rows]))

    reader = spark.readStream.format("seglog").option("subscribePattern", "s-.*")
    reader = reader.option("startingOffsets", "earliest")
    for name, value in options.items():
        reader = reader.option(name, value)
    return (
        reader.load(str(log_dir))
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(checkpoint))
    )


def test_three_runs_with_appends_between_deliver_each_record_once(
    spark: Any, tmp_path: Path
) -> None:
    log_dir = tmp_path / "logs"
    checkpoint = tmp_path / "checkpoint"
    for p in range(2):
        _append(log_dir, "s-a", p, 10, "first")
    seen: Seen = []

    # Run 1: admission control, at most 7 records per micro-batch.
    _query(spark, log_dir, checkpoint, seen, maxOffsetsPerTrigger="7").trigger(
        availableNow=True
    ).start().awaitTermination(120)
    run1 = [rows for _, rows in seen if rows]
    assert sum(len(rows) for rows in run1) == 20
    assert len(run1) >= 3
    assert max(len(rows) for rows in run1) <= 7

    # Between runs: more records, and a new topic the pattern matches.
    for p in range(2):
        _append(log_dir, "s-a", p, 5, "second")
    _append(log_dir, "s-b", 0, 4, "second")
    first_batch_of_run2 = len(seen)
    _query(spark, log_dir, checkpoint, seen).trigger(availableNow=True).start().awaitTermination(
        120
    )
    run2 = [row for _, rows in seen[first_batch_of_run2:] for row in rows]
    assert sorted((t, p) for t, p, _, _ in run2) == sorted(
        [("s-a", 0)] * 5 + [("s-a", 1)] * 5 + [("s-b", 0)] * 4
    )

    # Run 3: a continuously triggered query follows appends made while it runs.
    _append(log_dir, "s-a", 0, 3, "third")
    query = (
        _query(spark, log_dir, checkpoint, seen).trigger(processingTime="200 milliseconds").start()
    )
    try:
        query.processAllAvailable()
        _append(log_dir, "s-b", 0, 2, "live")
        query.processAllAvailable()
    finally:
        query.stop()

    delivered = [row for _, rows in seen for row in rows]
    duplicates = [row for row, count in Counter(delivered).items() if count > 1]
    assert duplicates == []
    assert sorted(delivered) == _engine_records(log_dir)
    assert any(b"live" in row[3] for _, rows in seen[-2:] for row in rows)
    # Spark's checkpoint holds Kafka-style offsets: the next offset of each partition.
    offsets_dir = checkpoint / "offsets"
    last = max(offsets_dir.iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1)
    assert '{"s-a": {"0": 18, "1": 15}, "s-b": {"0": 6}}' in last.read_text()

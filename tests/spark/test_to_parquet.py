"""The shipped batch example: a topic into Parquet files, every record, headers kept, or
the columns asked for."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from seglogfs.spark.to_parquet import main, topic_to_parquet
from storage import LogManager


def test_topic_to_parquet_copies_every_record(spark: Any, tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    with LogManager.open(log_dir) as manager:
        manager.create_topic("events", 2)
        for p in range(2):
            manager.log("events", p).append(
                [b"event %d/%d" % (p, i) for i in range(25)],
                keys=[b"k%d" % i for i in range(25)],
                headers=[(("source", b"test"),)] * 25,
            )
    output = tmp_path / "parquet"
    assert topic_to_parquet(spark, str(log_dir), "events", str(output)) == 50
    # Read back without Spark: one directory per partition, the source's columns.
    assert sorted(p.name for p in output.iterdir() if p.is_dir()) == [
        "partition=0",
        "partition=1",
    ]
    table = pq.read_table(output / "partition=1")
    offsets, values = table.column("offset").to_pylist(), table.column("value").to_pylist()
    rows = sorted(zip(offsets, values, strict=True))
    assert rows == [(i, b"event 1/%d" % i) for i in range(25)]
    assert table.column("headers").to_pylist()[0] == [{"key": "source", "value": b"test"}]


def test_topic_to_parquet_copies_the_columns_asked_for(spark: Any, tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    with LogManager.open(log_dir) as manager:
        manager.create_topic("events", 2)
        for p in range(2):
            manager.log("events", p).append([b"event %d/%d" % (p, i) for i in range(5)])
    output = tmp_path / "parquet"
    assert topic_to_parquet(spark, str(log_dir), "events", str(output), ["offset", "value"]) == 10
    table = pq.read_table(output / "partition=0")
    assert table.column_names == ["offset", "value"]  # partition is the directory
    assert sorted(zip(table.column("offset").to_pylist(), table.column("value").to_pylist(),
                      strict=True)) == [(i, b"event 0/%d" % i) for i in range(5)]  # fmt: skip


def test_unknown_columns_are_refused_before_spark_starts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["/nowhere", "events", "/out", "--columns", "value,payload"])
    assert info.value.code == 2
    assert "seglog schema: column 'payload' is not a column of the Kafka schema" in (
        capsys.readouterr().err
    )

"""The sink creates a topic its rows name that does not exist, as a Kafka broker creates
the topics its producers name (``auto.create.topics.enable``, Kafka's default true):
``num.partitions`` and the default format, directly or through the daemon that owns
the directory; the option ``auto.create.topics.enable=false`` keeps the refusal."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.errors import PySparkException

from seglogfs.spark.errors import SinkError
from seglogfs.spark.writer import append_exactly_once
from storage import LogManager
from tests.spark.test_sink import _create, _daemon, _staged_files, _stored


def _rows(*pairs: tuple[str, str]) -> pa.Table:
    return pa.table(
        {"topic": [t for t, _ in pairs], "value": [v.encode() for _, v in pairs]},
    )


def test_missing_topics_are_created_directly(tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    _create(log_dir, ("old", 1))
    table = _rows(("old", "a"), ("new", "b"), ("newer", "c"), ("new", "d"))
    assert append_exactly_once(log_dir, table, topic=None, app_id="x", version=1) == 4
    with LogManager.open(log_dir, read_only=True) as manager:
        assert manager.topics() == ["new", "newer", "old"]
        assert manager.topic("new").partitions == 1  # num.partitions
        assert manager.topic("new").format == manager.topic("old").format
    assert [v for *_, v, _ in _stored(log_dir, "new")] == [b"b", b"d"]
    assert [v for *_, v, _ in _stored(log_dir, "newer")] == [b"c"]


def test_missing_topics_are_refused_when_the_setting_is_false(tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    _create(log_dir, ("old", 1))
    table = _rows(("old", "a"), ("missing", "b"))
    with pytest.raises(SinkError, match="topic 'missing' does not exist"):
        append_exactly_once(log_dir, table, topic=None, app_id="x", version=1, auto_create=False)
    with LogManager.open(log_dir, read_only=True) as manager:
        assert manager.topics() == ["old"]
    assert _stored(log_dir, "old") == []  # nothing of the refused batch
    # A bad name is the engine's refusal, nothing created.
    with pytest.raises(SinkError, match="cannot create topic 'bad/name'"):
        append_exactly_once(log_dir, _rows(("bad/name", "x")), topic=None, app_id="y", version=1)


def test_missing_topics_are_created_through_the_daemon(tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    _create(log_dir, ("old", 1))
    with _daemon(log_dir) as manager:
        table = _rows(("via", "a"), ("via", "b"))
        assert append_exactly_once(log_dir, table, topic=None, app_id="d", version=1) == 2
        assert "via" in manager.topics()
        assert manager.log("via", 0).log_end_offset == 2
    assert [v for *_, v, _ in _stored(log_dir, "via")] == [b"a", b"b"]


def test_spark_write_creates_the_topic(spark: Any, tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    _create(log_dir, ("old", 1))
    df = spark.createDataFrame([("k", "v1"), (None, "v2")], "key string, value string")
    df.write.format("seglog").mode("append").option("topic", "fresh").save(str(log_dir))
    assert sorted(v or b"" for *_, v, _ in _stored(log_dir, "fresh")) == [b"v1", b"v2"]
    refused = df.write.format("seglog").mode("append").option("topic", "absent")
    with pytest.raises(PySparkException, match="topic 'absent' does not exist"):
        refused.option("auto.create.topics.enable", "false").save(str(log_dir))
    with pytest.raises(PySparkException, match="must be true or false"):
        refused.option("auto.create.topics.enable", "maybe").save(str(log_dir))
    with LogManager.open(log_dir, read_only=True) as manager:
        assert manager.topics() == ["fresh", "old"]
    assert _staged_files(log_dir) == []

"""Security (issue #17): no topic name leaves the log directory through the Spark source
or sink. Each name is refused (the source: no such topic; the sink: the topic does not
exist) and the directory holding the log directory is listed before and after; the
mount, the control socket and the command line are in ``tests/daemon/test_security.py``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import PySparkException

from seglogfs.positions import position_index_spec
from storage import LogManager


def _everything(root: Path) -> set[str]:
    return {
        str(Path(where, name).relative_to(root))
        for where, dirs, files in os.walk(root)
        for name in dirs + files
    }


def test_no_topic_name_escapes_through_the_source_or_the_sink(spark: Any, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    with LogManager.open(logs, extension=position_index_spec) as manager:  # as a writer does
        manager.create_topic("orders", 1)
        manager.log("orders", 0).append([b"kept"])
    before = _everything(tmp_path)
    names = {
        "parent": "../escaped",
        "dot-dot": "..",
        "absolute": str(tmp_path / "absolute"),
        "slash": "a/b",
        "cyrillic o": "\u043erders",  # looks like "orders"
    }
    for label, name in names.items():
        reads = {
            "subscribe": name,
            "assign": json.dumps({name: [0]}),
        }
        for option, value in reads.items():
            with pytest.raises(PySparkException):
                spark.read.format("seglog").option(option, value).load(str(logs)).collect()
        frame = spark.createDataFrame([(name, "v")], "topic string, value string")
        # The sink creates a missing topic (auto.create.topics.enable): a bad name is
        # refused by the creation, nothing written.
        refused = "invalid topic name|does not exist"
        with pytest.raises(PySparkException, match=refused):
            frame.write.format("seglog").mode("append").save(str(logs))
        with pytest.raises(PySparkException, match=refused):
            frame.select("value").write.format("seglog").mode("append").option("topic", name).save(
                str(logs)
            )
        after = _everything(tmp_path)
        # Only the sink's staging area (a name Kafka never uses) may have appeared.
        assert {p for p in after - before if not p.startswith("logs/.seglog-spark")} == set(), label
    with LogManager.open(logs, read_only=True) as manager:
        assert manager.topics() == ["orders"]
        assert [r.value for r in manager.log("orders", 0).records(0)] == [b"kept"]

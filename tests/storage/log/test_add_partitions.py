"""``LogManager.add_partitions``: Kafka's ``kafka-topics.sh --alter --partitions N``,
increase only, validated first, all or nothing."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from storage import (
    BrokerConfig,
    ConfigError,
    Log,
    LogManager,
    ReadOnlyLogError,
    UnknownTopicError,
)
from tests.conftest import ManualClock


def _partition_dirs(log_dir: Path, topic: str) -> list[str]:
    return sorted(p.name for p in log_dir.iterdir() if p.is_dir() and p.name.startswith(topic))


def test_partitions_are_added_empty_and_kept(log_dir: Path, clock: ManualClock) -> None:
    with LogManager.open(log_dir, clock=clock) as manager:
        manager.create_topic("orders", 2, {"retention.ms": "86400000"})
        manager.log("orders", 0).append([b"a", b"b"])
        grown = manager.add_partitions("orders", 4)
        assert grown.partitions == 4
        assert grown.overrides == {"retention.ms": "86400000"}  # the rest unchanged
        assert manager.topic("orders").partitions == 4
        assert [manager.log("orders", p).log_end_offset for p in range(4)] == [2, 0, 0, 0]
        assert manager.log("orders", 3).config.retention_ms == 86400000
        manager.log("orders", 3).append([b"new"])
        assert _partition_dirs(log_dir, "orders") == [f"orders-{p}" for p in range(4)]
    with LogManager.open(log_dir, clock=clock) as manager:  # durable
        assert manager.topic("orders").partitions == 4
        assert [r.value for r in manager.log("orders", 3).records(0)] == [b"new"]
        assert [r.value for r in manager.log("orders", 0).records(0)] == [b"a", b"b"]


@pytest.mark.parametrize("count", [2, 1])
def test_the_count_only_increases(log_dir: Path, count: int) -> None:
    with LogManager.open(log_dir) as manager:
        manager.create_topic("t", 2)
        with pytest.raises(ConfigError) as caught:
            manager.add_partitions("t", count)
        assert str(caught.value) == (
            f"invalid value {count} for configuration partitions: topic 't' has 2 "
            "partition(s); the count can only be increased"
        )
        assert manager.topic("t").partitions == 2
    assert _partition_dirs(log_dir, "t") == ["t-0", "t-1"]


def test_the_maximums_hold(log_dir: Path) -> None:
    broker = BrokerConfig(log_dirs=(str(log_dir),), max_topic_partitions=4, max_broker_partitions=6)
    with LogManager.open(log_dir, broker) as manager:
        manager.create_topic("t", 2)
        manager.create_topic("u", 2)
        with pytest.raises(ConfigError, match=r"max\.topic\.partitions"):
            manager.add_partitions("t", 5)
        manager.add_partitions("t", 4)  # 4 + 2 = 6: at the broker maximum
        with pytest.raises(ConfigError, match=r"max\.broker\.partitions"):
            manager.add_partitions("u", 3)
        assert (manager.topic("t").partitions, manager.topic("u").partitions) == (4, 2)
        with pytest.raises(ConfigError, match="whole number"):
            manager.add_partitions("u", True)


def test_unknown_topic_and_read_only(log_dir: Path) -> None:
    with LogManager.open(log_dir) as manager:
        with pytest.raises(UnknownTopicError):
            manager.add_partitions("nope", 3)
        manager.create_topic("t", 1)
        with LogManager.open(log_dir, read_only=True) as reader:
            with pytest.raises(ReadOnlyLogError):
                reader.add_partitions("t", 3)
            manager.add_partitions("t", 3)
            manager.log("t", 2).append([b"x"])
            reader.refresh()  # a reader follows the writer's new partitions
            assert reader.topic("t").partitions == 3
            assert [r.value for r in reader.log("t", 2).records(0)] == [b"x"]


def test_a_partition_that_fails_to_open_undoes_the_increase(
    log_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[Path] = []
    real_open = Log.open

    def open_twice_then_fail(directory: Path, *args: object, **kwargs: object) -> Log:
        if len(opened) == 2:
            raise OSError(errno.EMFILE, "Too many open files")
        opened.append(directory)
        return real_open(directory, *args, **kwargs)  # type: ignore[arg-type]

    with LogManager.open(log_dir) as manager:
        manager.create_topic("t", 1)
        monkeypatch.setattr(Log, "open", staticmethod(open_twice_then_fail))
        with pytest.raises(OSError, match="Too many open files"):
            manager.add_partitions("t", 4)
        monkeypatch.undo()
        assert [path.name for path in opened] == ["t-1", "t-2"]
        assert manager.topic("t").partitions == 1
        assert _partition_dirs(log_dir, "t") == ["t-0"]
        manager.log("t", 0).append([b"still fine"])
    with LogManager.open(log_dir) as manager:
        assert manager.topic("t").partitions == 1
        assert _partition_dirs(log_dir, "t") == ["t-0"]

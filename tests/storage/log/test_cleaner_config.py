"""Compaction settings, as Kafka parses them, and the rules they switch on: keyless
records refused at append, retention by time and size only with ``delete``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from storage import (
    BrokerConfig,
    CleanerConfig,
    ConfigError,
    InvalidRecordError,
    LogConfig,
    LogManager,
    build_record_batch,
)
from tests.conftest import ManualClock


@pytest.mark.parametrize("policy", ["compact", "delete", "compact,delete", "delete, compact"])
def test_every_cleanup_policy_is_accepted_per_topic_and_as_broker_default(
    policy: str, log_dir: Path, clock: ManualClock
) -> None:
    expected = tuple(p.strip() for p in policy.split(","))
    broker = BrokerConfig.from_properties({"log.dirs": str(log_dir), "log.cleanup.policy": policy})
    assert broker.default_topic_config.cleanup_policy == expected
    topic = BrokerConfig(log_dirs=(str(log_dir),)).topic_log_config({"cleanup.policy": policy})
    assert topic.cleanup_policy == expected
    with LogManager.open(log_dir, clock=clock) as manager:
        manager.create_topic("t", 1, {"cleanup.policy": policy})
        assert manager.topic_config("t").compact == ("compact" in expected)


def test_compaction_settings_are_accepted_and_validated_as_kafka() -> None:
    config = LogConfig.from_properties(
        {
            "cleanup.policy": "compact",
            "min.cleanable.dirty.ratio": "0.1",
            "min.compaction.lag.ms": "5",
            "max.compaction.lag.ms": "10",
            "delete.retention.ms": "0",
        }
    )
    assert BrokerConfig(log_dirs=("/x",)).topic_log_config(config.overrides(LogConfig())) == config
    for key, value, reason in [
        ("min.cleanable.dirty.ratio", "1.5", "Value must be no more than 1"),
        ("min.compaction.lag.ms", "-1", "Value must be at least 0"),
        ("max.compaction.lag.ms", "0", "Value must be at least 1"),
        ("delete.retention.ms", "-1", "Value must be at least 0"),
    ]:
        with pytest.raises(ConfigError, match=reason):
            LogConfig.from_properties({key: value})


def test_cleaner_broker_settings_have_kafkas_defaults() -> None:
    cleaner = BrokerConfig.from_properties({}).cleaner
    assert cleaner == CleanerConfig()
    assert (cleaner.enable, cleaner.threads, cleaner.backoff_ms) == (True, 1, 15_000)
    assert cleaner.dedupe_buffer_size == 128 * 1024 * 1024
    assert cleaner.io_buffer_size == 512 * 1024
    assert cleaner.io_buffer_load_factor == 0.9
    assert cleaner.io_max_bytes_per_second == sys.float_info.max
    # SkimpyOffsetMap: memory / 24 bytes an entry (MD5 + offset).
    assert cleaner.offset_map_slots == 128 * 1024 * 1024 // 24


def test_cleaner_broker_settings_are_parsed() -> None:
    cleaner = BrokerConfig.from_properties(
        {
            "log.cleaner.enable": "false",
            "log.cleaner.threads": "2",
            "log.cleaner.dedupe.buffer.size": "10000000",
            "log.cleaner.io.buffer.size": "1024",
            "log.cleaner.io.buffer.load.factor": "0.5",
            "log.cleaner.io.max.bytes.per.second": "1e6",
            "log.cleaner.backoff.ms": "10",
        }
    ).cleaner
    assert cleaner == CleanerConfig(False, 2, 10_000_000, 1024, 0.5, 1e6, 10)
    assert cleaner.offset_map_memory == 5_000_000  # per thread


@pytest.mark.parametrize(
    ("key", "value", "reason"),
    [
        ("log.cleaner.threads", "-1", "Value must be at least 0"),
        ("log.cleaner.io.buffer.size", "-1", "Value must be at least 0"),
        ("log.cleaner.backoff.ms", "-1", "Value must be at least 0"),
        ("log.cleaner.enable", "yes", "either true or false"),
        ("log.cleaner.io.buffer.load.factor", "x", "Not a number of type DOUBLE"),
        # KafkaConfig: dedupe / threads > 1 MiB.
        ("log.cleaner.dedupe.buffer.size", "1048576", "at least 1MB per cleaner thread"),
        # Cleaner's assertion: the map must hold an entry.
        ("log.cleaner.io.buffer.load.factor", "0", "too small to fit"),
    ],
)
def test_cleaner_broker_settings_are_validated(key: str, value: str, reason: str) -> None:
    with pytest.raises(ConfigError, match=reason) as info:
        BrokerConfig.from_properties({key: value})
    assert info.value.key == key


def test_dedupe_buffer_is_per_thread() -> None:
    with pytest.raises(ConfigError, match="per cleaner thread"):
        CleanerConfig(threads=4, dedupe_buffer_size=4 * 1024 * 1024)
    assert CleanerConfig(threads=3, dedupe_buffer_size=4 * 1024 * 1024).threads == 3


def test_keyless_records_are_refused_by_a_compacted_topic(
    log_dir: Path, clock: ManualClock
) -> None:
    with LogManager.open(log_dir, clock=clock) as manager:
        manager.create_topic("c", 1, {"cleanup.policy": "compact,delete"})
        manager.create_topic("d", 1)
        compacted, plain = manager.log("c", 0), manager.log("d", 0)
        with pytest.raises(InvalidRecordError, match="without key in topic partition c-0"):
            compacted.append([b"v"])
        with pytest.raises(InvalidRecordError, match="without key"):
            compacted.append([b"v", b"w"], keys=[b"k", None])
        batch = build_record_batch([b"a", b"b"], keys=[b"k", None], timestamps=clock.now_ms)
        with pytest.raises(InvalidRecordError, match="without key") as info:
            compacted.append_batches(build_record_batch([b"x"], keys=[b"k"], timestamps=0) + batch)
        assert info.value.position > 0  # the second batch of the request
        assert compacted.log_end_offset == 0  # nothing appended
        compacted.append([b"v", None], keys=[b"k", b"k"])  # keyed values and tombstones
        assert compacted.log_end_offset == 2
        plain.append([b"v"])  # delete: keys optional
        plain.append_batches(batch)
        assert plain.log_end_offset == 3


def test_retention_by_time_and_size_only_with_delete(log_dir: Path, clock: ManualClock) -> None:
    limits = {"retention.ms": "1000", "retention.bytes": "1", "segment.bytes": "200"}
    with LogManager.open(log_dir, clock=clock) as manager:
        manager.create_topic("c", 1, {**limits, "cleanup.policy": "compact"})
        manager.create_topic("cd", 1, {**limits, "cleanup.policy": "compact,delete"})
        for topic in ("c", "cd"):
            log = manager.log(topic, 0)
            for i in range(20):
                log.append([b"value %d" % i], keys=[b"k%d" % i], timestamps=clock.now_ms)
        clock.advance(10_000)
        manager.run_retention()
        assert manager.log("c", 0).log_start_offset == 0  # compact only: kept
        assert manager.log("c", 0).next_retention_due_ms() is None
        assert manager.log("cd", 0).log_start_offset > 0  # compact,delete: retention ran

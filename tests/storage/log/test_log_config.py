"""Tests for storage.log.log_config: Kafka's names, defaults, precedence and validation."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from storage.errors import ConfigError
from storage.log.log_config import (
    LONG_MAX,
    TOPIC_CONFIG_NAMES,
    BrokerConfig,
    LogConfig,
)
from storage.log.properties import load_properties, parse_properties

HOUR_MS = 3_600_000

# config/kraft/server.properties as Kafka 3.x ships it, comments shortened.
KRAFT_SERVER_PROPERTIES = """\
# Licensed to the Apache Software Foundation (ASF) under one or more
# contributor license agreements.

############################# Server Basics #############################

# The role of this server. Setting this puts us in KRaft mode
process.roles=broker,controller

# The node id associated with this instance's roles
node.id=1

# The connect string for the controller quorum
controller.quorum.voters=1@localhost:9093

############################# Socket Server Settings #############################

#   FORMAT:
#     listeners = listener_name://host_name:port
listeners=PLAINTEXT://:9092,CONTROLLER://:9093
inter.broker.listener.name=PLAINTEXT
advertised.listeners=PLAINTEXT://localhost:9092
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SSL:SSL,\
SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL
num.network.threads=3
num.io.threads=8
socket.send.buffer.bytes=102400
socket.receive.buffer.bytes=102400
socket.request.max.bytes=104857600

############################# Log Basics #############################

# A comma separated list of directories under which to store log files
log.dirs=/tmp/kraft-combined-logs
num.partitions=1
num.recovery.threads.per.data.dir=1

############################# Internal Topic Settings  #############################
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1

############################# Log Flush Policy #############################

# The number of messages to accept before forcing a flush of data to disk
#log.flush.interval.messages=10000

# The maximum amount of time a message can sit in a log before we force a flush
#log.flush.interval.ms=1000

############################# Log Retention Policy #############################

# The minimum age of a log file to be eligible for deletion due to age
log.retention.hours=168

# A size-based retention policy for logs.
#log.retention.bytes=1073741824

# The maximum size of a log segment file.
log.segment.bytes=1073741824

# The interval at which log segments are checked to see if they can be deleted
log.retention.check.interval.ms=300000
"""

# An older ZooKeeper-mode server.properties with a few more log settings.
ZK_SERVER_PROPERTIES = """\
broker.id=0
listeners = PLAINTEXT://your.host.name:9092
log.dirs=/var/lib/kafka/data-1, /var/lib/kafka/data-2
num.partitions=3
log.retention.hours=72
log.segment.bytes=536870912
log.cleaner.enable=true
log.cleaner.threads=2
log.message.format.version=2.8
zookeeper.connect=localhost:2181
zookeeper.connection.timeout.ms=18000
group.initial.rebalance.delay.ms=0
"""


# --- LogConfig: defaults and names ------------------------------------------------


def test_defaults_equal_kafkas() -> None:
    c = LogConfig()
    assert c.segment_bytes == 1073741824
    assert c.segment_ms == 604800000
    assert c.segment_jitter_ms == 0
    assert c.segment_index_bytes == 10485760
    assert c.index_interval_bytes == 4096
    assert c.retention_ms == 604800000
    assert c.retention_bytes == -1
    assert c.file_delete_delay_ms == 60000
    assert c.max_message_bytes == 1048588
    assert c.cleanup_policy == ("delete",)
    assert c.delete_retention_ms == 86400000
    assert c.min_compaction_lag_ms == 0
    assert c.max_compaction_lag_ms == 9223372036854775807
    assert c.min_cleanable_dirty_ratio == 0.5
    assert c.compression_type == "producer"
    assert c.message_timestamp_type == "CreateTime"
    assert c.flush_messages == 9223372036854775807
    assert c.flush_ms == 9223372036854775807
    assert c.preallocate is False
    assert LONG_MAX == 2**63 - 1


def test_topic_config_names_are_kafkas_topic_keys() -> None:
    assert {
        "segment.bytes",
        "segment.ms",
        "segment.jitter.ms",
        "segment.index.bytes",
        "index.interval.bytes",
        "retention.ms",
        "retention.bytes",
        "file.delete.delay.ms",
        "max.message.bytes",
        "cleanup.policy",
        "delete.retention.ms",
        "min.compaction.lag.ms",
        "max.compaction.lag.ms",
        "min.cleanable.dirty.ratio",
        "compression.type",
        "message.timestamp.type",
        "flush.messages",
        "flush.ms",
        "preallocate",
    } == TOPIC_CONFIG_NAMES


def test_to_properties_has_every_key_and_kafka_spellings() -> None:
    props = LogConfig().to_properties()
    assert set(props) == TOPIC_CONFIG_NAMES
    assert props["cleanup.policy"] == "delete"
    assert props["preallocate"] == "false"
    assert props["min.cleanable.dirty.ratio"] == "0.5"
    assert props["flush.ms"] == "9223372036854775807"


def test_from_properties_parses_like_kafka() -> None:
    c = LogConfig.from_properties(
        {
            "segment.bytes": " 1048576 ",
            "segment.ms": "+60000",
            "retention.ms": "-1",
            "retention.bytes": "-5",
            "cleanup.policy": "compact , delete",
            "min.cleanable.dirty.ratio": "1e-1",
            "preallocate": "TRUE",
            "compression.type": "zstd",
            "message.timestamp.type": "LogAppendTime",
        }
    )
    assert c.segment_bytes == 1048576
    assert c.segment_ms == 60000
    assert c.retention_ms == -1
    assert c.retention_bytes == -5
    assert c.cleanup_policy == ("compact", "delete")
    assert c.compact
    assert c.delete
    assert c.min_cleanable_dirty_ratio == pytest.approx(0.1)
    assert c.preallocate is True
    assert c.compression_type == "zstd"
    assert c.message_timestamp_type == "LogAppendTime"


@pytest.mark.parametrize(
    ("raw", "expected"), [("0.25", 0.25), ("1", 1.0), (".5", 0.5), ("0d", 0.0)]
)
def test_ratio_accepts_java_double_spellings(raw: str, expected: float) -> None:
    c = LogConfig.from_properties({"min.cleanable.dirty.ratio": raw})
    assert c.min_cleanable_dirty_ratio == expected


def test_empty_cleanup_policy_means_neither_delete_nor_compact() -> None:
    c = LogConfig.from_properties({"cleanup.policy": ""})
    assert c.cleanup_policy == ()
    assert not c.compact
    assert not c.delete


def test_from_properties_applies_over_given_defaults() -> None:
    base = LogConfig(segment_bytes=4096, retention_ms=1000)
    c = LogConfig.from_properties({"retention.ms": "2000"}, base)
    assert c.segment_bytes == 4096
    assert c.retention_ms == 2000


def test_round_trip_through_properties() -> None:
    c = LogConfig(cleanup_policy=("compact",), min_cleanable_dirty_ratio=0.75, preallocate=True)
    assert LogConfig.from_properties(c.to_properties()) == c


def test_overrides_lists_only_differing_keys() -> None:
    base = LogConfig()
    c = dataclasses.replace(base, segment_bytes=2048, cleanup_policy=("compact",))
    assert c.overrides(base) == {"segment.bytes": "2048", "cleanup.policy": "compact"}
    assert base.overrides(base) == {}
    assert LogConfig.from_properties(c.overrides(base), base) == c


def test_construction_normalises_list_and_int_ratio() -> None:
    c = LogConfig(cleanup_policy=["compact"], min_cleanable_dirty_ratio=1)  # type: ignore[arg-type]
    assert c.cleanup_policy == ("compact",)
    assert isinstance(c.min_cleanable_dirty_ratio, float)
    assert c == LogConfig(cleanup_policy=("compact",), min_cleanable_dirty_ratio=1.0)
    assert hash(c) == hash(LogConfig(cleanup_policy=("compact",), min_cleanable_dirty_ratio=1.0))


def test_max_segment_ms_is_capped_by_max_compaction_lag_when_compacting() -> None:
    assert LogConfig(segment_ms=1000).max_segment_ms == 1000
    compacted = LogConfig(segment_ms=1000, cleanup_policy=("compact",), max_compaction_lag_ms=10)
    assert compacted.max_segment_ms == 10
    deleting = LogConfig(segment_ms=1000, max_compaction_lag_ms=10)
    assert deleting.max_segment_ms == 1000


_valid_configs = st.builds(
    LogConfig,
    segment_bytes=st.integers(14, 2**31 - 1),
    segment_ms=st.integers(1, LONG_MAX),
    segment_jitter_ms=st.integers(0, LONG_MAX),
    segment_index_bytes=st.integers(4, 2**31 - 1),
    index_interval_bytes=st.integers(0, 2**31 - 1),
    retention_ms=st.integers(-1, LONG_MAX),
    retention_bytes=st.integers(-(2**63), LONG_MAX),
    cleanup_policy=st.sampled_from([(), ("delete",), ("compact",), ("compact", "delete")]),
    min_cleanable_dirty_ratio=st.floats(0, 1),
    compression_type=st.sampled_from(["uncompressed", "zstd", "lz4", "snappy", "gzip"]),
    message_timestamp_type=st.sampled_from(["CreateTime", "LogAppendTime"]),
    flush_messages=st.integers(1, LONG_MAX),
    preallocate=st.booleans(),
)


@given(_valid_configs)
def test_any_valid_config_round_trips(c: LogConfig) -> None:
    assert LogConfig.from_properties(c.to_properties()) == c
    assert LogConfig.from_properties(c.overrides(LogConfig()), LogConfig()) == c


# --- LogConfig: every validation error names its key ------------------------------

TOPIC_ERRORS = [
    ("segment.bytes", "13", "Value must be at least 14"),
    ("segment.bytes", "2147483648", "Not a number of type INT"),
    ("segment.bytes", "1GB", "Not a number of type INT"),
    ("segment.bytes", "", "Not a number of type INT"),
    ("segment.ms", "0", "Value must be at least 1"),
    ("segment.ms", "9223372036854775808", "Not a number of type LONG"),
    ("segment.ms", "1.5", "Not a number of type LONG"),
    ("segment.jitter.ms", "-1", "Value must be at least 0"),
    ("segment.index.bytes", "3", "Value must be at least 4"),
    ("index.interval.bytes", "-1", "Value must be at least 0"),
    ("retention.ms", "-2", "Value must be at least -1"),
    ("retention.bytes", "lots", "Not a number of type LONG"),
    ("file.delete.delay.ms", "-1", "Value must be at least 0"),
    ("max.message.bytes", "-1", "Value must be at least 0"),
    ("cleanup.policy", "compact,remove", "String must be one of: compact, delete"),
    ("cleanup.policy", "Delete", "String must be one of: compact, delete"),
    ("delete.retention.ms", "-1", "Value must be at least 0"),
    ("min.compaction.lag.ms", "-1", "Value must be at least 0"),
    ("max.compaction.lag.ms", "0", "Value must be at least 1"),
    ("min.cleanable.dirty.ratio", "-0.1", "Value must be at least 0"),
    ("min.cleanable.dirty.ratio", "1.01", "Value must be no more than 1"),
    ("min.cleanable.dirty.ratio", "NaN", "Value must be at least 0"),
    ("min.cleanable.dirty.ratio", "half", "Not a number of type DOUBLE"),
    ("min.cleanable.dirty.ratio", "0x1p-1", "Not a number of type DOUBLE"),
    ("compression.type", "brotli", "String must be one of: uncompressed, zstd, lz4"),
    ("compression.type", "GZIP", "String must be one of"),
    ("message.timestamp.type", "createtime", "String must be one of: CreateTime, LogAppendTime"),
    ("flush.messages", "0", "Value must be at least 1"),
    ("flush.ms", "-1", "Value must be at least 0"),
    ("preallocate", "yes", "Expected value to be either true or false"),
    ("segmnet.bytes", "1024", "unknown topic configuration"),
    ("log.segment.bytes", "1024", "unknown topic configuration"),
]


@pytest.mark.parametrize(("key", "raw", "reason"), TOPIC_ERRORS)
def test_topic_validation_error_names_the_key(key: str, raw: str, reason: str) -> None:
    with pytest.raises(ConfigError) as info:
        LogConfig.from_properties({key: raw})
    assert info.value.key == key
    assert reason in info.value.reason
    assert key in str(info.value)


def test_every_topic_key_has_a_validation_error_test() -> None:
    assert {key for key, _, _ in TOPIC_ERRORS} >= TOPIC_CONFIG_NAMES


def test_non_string_property_value_is_rejected() -> None:
    with pytest.raises(ConfigError) as info:
        LogConfig.from_properties({"segment.bytes": 1024})  # type: ignore[dict-item]
    assert info.value.key == "segment.bytes"


def test_min_compaction_lag_above_max_is_rejected() -> None:
    with pytest.raises(ConfigError) as info:
        LogConfig.from_properties({"min.compaction.lag.ms": "10", "max.compaction.lag.ms": "5"})
    assert info.value.key == "min.compaction.lag.ms"
    assert "max.compaction.lag.ms (5)" in info.value.reason


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"segment_bytes": 13}, "segment.bytes"),
        ({"segment_bytes": 2**31}, "segment.bytes"),
        ({"segment_bytes": "1024"}, "segment.bytes"),
        ({"segment_bytes": True}, "segment.bytes"),
        ({"retention_ms": -2}, "retention.ms"),
        ({"min_cleanable_dirty_ratio": "0.5"}, "min.cleanable.dirty.ratio"),
        ({"min_cleanable_dirty_ratio": 2.0}, "min.cleanable.dirty.ratio"),
        ({"cleanup_policy": ("delete", "archive")}, "cleanup.policy"),
        ({"cleanup_policy": "delete"}, "cleanup.policy"),
        ({"compression_type": "brotli"}, "compression.type"),
        ({"compression_type": 1}, "compression.type"),
        ({"preallocate": 1}, "preallocate"),
        ({"flush_messages": 0}, "flush.messages"),
        ({"min_compaction_lag_ms": 2, "max_compaction_lag_ms": 1}, "min.compaction.lag.ms"),
    ],
)
def test_direct_construction_is_validated(changes: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        LogConfig(**changes)  # type: ignore[arg-type]
    assert info.value.key == key


@pytest.mark.parametrize(
    ("key", "raw", "reason"),
    [
        ("retention.ms", "1" * 65000, "Not a number of type LONG"),
        ("retention.ms", "9" * 5000, "Not a number of type LONG"),
        ("retention.bytes", "-" + "9" * 5000, "Not a number of type LONG"),
        ("segment.bytes", "9" * 5000, "Not a number of type INT"),
        ("min.cleanable.dirty.ratio", "1" * 30000 + "x", "Not a number of type DOUBLE"),
        ("cleanup.policy", "delete" + " " * 30000 + "x", "String must be one of"),
        ("compression.type", "z" * 65000, "String must be one of"),
    ],
    ids=["65000-ones", "5000-nines", "minus-5000-nines", "int", "double", "list", "string"],
)
def test_a_value_of_thousands_of_characters_is_a_config_error(
    key: str, raw: str, reason: str
) -> None:
    """Issue #18 (6): ``int()`` raised ValueError past 4,300 digits (a traceback and
    EIO for ``setfattr``, exit 1 for ``topics alter``), and the DOUBLE and LIST
    patterns backtracked in quadratic time (minutes for 65,000 characters). Now each is
    refused at once, and the message shows the value shortened."""
    started = time.monotonic()
    with pytest.raises(ConfigError) as info:
        LogConfig.from_properties({key: raw})
    assert time.monotonic() - started < 2
    assert info.value.key == key
    assert reason in info.value.reason
    assert len(str(info.value)) < 300
    assert f"({len(raw)} characters)" in str(info.value)


def test_broker_keys_of_thousands_of_digits_are_config_errors() -> None:
    for key in ("log.retention.ms", "log.roll.hours", "num.partitions", "log.segment.bytes"):
        with pytest.raises(ConfigError, match=r"Not a number of type (INT|LONG)") as info:
            BrokerConfig.from_properties({key: "9" * 5000})
        assert info.value.key == key


def test_leading_zeros_are_accepted_as_java_does() -> None:
    config = LogConfig.from_properties({"segment.bytes": "0" * 5000 + "1048576"})
    assert config.segment_bytes == 1048576


def test_config_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match=r"segment\.bytes"):
        LogConfig.from_properties({"segment.bytes": "1"})


# --- BrokerConfig --------------------------------------------------------------


def test_broker_defaults_equal_kafkas() -> None:
    b = BrokerConfig.from_properties({})
    assert b.log_dirs == ("/tmp/kafka-logs",)
    assert b.num_partitions == 1
    assert b.log_retention_check_interval_ms == 300000
    assert b.log_flush_scheduler_interval_ms == LONG_MAX
    assert b.log_flush_offset_checkpoint_interval_ms == 60000
    assert b.log_flush_start_offset_checkpoint_interval_ms == 60000
    assert b.default_topic_config == LogConfig()


def test_broker_constructor_defaults() -> None:
    b = BrokerConfig(log_dirs=("/data",))
    assert b.default_topic_config == LogConfig()
    assert b == BrokerConfig.from_properties({"log.dirs": "/data"})


def test_broker_synonyms_map_to_topic_fields() -> None:
    b = BrokerConfig.from_properties(
        {
            "log.segment.bytes": "2048",
            "log.retention.bytes": "100",
            "log.index.interval.bytes": "10",
            "log.index.size.max.bytes": "800",
            "log.segment.delete.delay.ms": "5",
            "message.max.bytes": "1000",
            "log.cleanup.policy": "delete",
            "log.cleaner.delete.retention.ms": "86400000",
            "compression.type": "lz4",
            "log.message.timestamp.type": "LogAppendTime",
            "log.flush.interval.messages": "11",
            "log.flush.interval.ms": "12",
            "log.preallocate": "false",
        }
    )
    assert b.default_topic_config == LogConfig(
        segment_bytes=2048,
        retention_bytes=100,
        index_interval_bytes=10,
        segment_index_bytes=800,
        file_delete_delay_ms=5,
        max_message_bytes=1000,
        cleanup_policy=("delete",),
        compression_type="lz4",
        message_timestamp_type="LogAppendTime",
        flush_messages=11,
        flush_ms=12,
    )


@pytest.mark.parametrize(
    ("broker_key", "topic_key", "value"),
    # Compaction and its settings are honoured since the cleaner exists
    # (tests/storage/log/test_cleaner_config.py); preallocation is not.
    [("log.preallocate", "preallocate", "true")],
)
def test_settings_the_engine_does_not_honour_are_refused(
    broker_key: str, topic_key: str, value: str
) -> None:
    # Parsed and validated as Kafka does (so a typo still gets Kafka's message) ...
    assert LogConfig.from_properties({topic_key: value}) != LogConfig()
    # ... but refused wherever it would take effect, naming the key and why.
    with pytest.raises(ConfigError, match="not implemented") as broker:
        BrokerConfig.from_properties({broker_key: value})
    assert broker.value.key == topic_key
    with pytest.raises(ConfigError, match="not implemented") as topic:
        BrokerConfig(log_dirs=("/tmp/x",)).topic_log_config({topic_key: value})
    assert topic.value.key == topic_key


def test_compaction_settings_at_their_defaults_are_accepted() -> None:
    defaults = {
        "cleanup.policy": "delete",
        "delete.retention.ms": "86400000",
        "min.compaction.lag.ms": "0",
        "min.cleanable.dirty.ratio": "0.5",
        "preallocate": "false",
    }
    assert BrokerConfig(log_dirs=("/tmp/x",)).topic_log_config(defaults) == LogConfig()


def test_broker_only_settings() -> None:
    b = BrokerConfig.from_properties(
        {
            "num.partitions": "6",
            "log.retention.check.interval.ms": "1000",
            "log.flush.scheduler.interval.ms": "2000",
            "log.flush.offset.checkpoint.interval.ms": "3000",
            "log.flush.start.offset.checkpoint.interval.ms": "4000",
        }
    )
    assert b.num_partitions == 6
    assert b.log_retention_check_interval_ms == 1000
    assert b.log_flush_scheduler_interval_ms == 2000
    assert b.log_flush_offset_checkpoint_interval_ms == 3000
    assert b.log_flush_start_offset_checkpoint_interval_ms == 4000


@pytest.mark.parametrize(
    ("props", "expected"),
    [
        ({}, 168 * HOUR_MS),
        ({"log.roll.hours": "1"}, HOUR_MS),
        ({"log.roll.ms": "1234"}, 1234),
        ({"log.roll.ms": "1234", "log.roll.hours": "1"}, 1234),
    ],
)
def test_roll_ms_wins_over_hours(props: dict[str, str], expected: int) -> None:
    assert BrokerConfig.from_properties(props).default_topic_config.segment_ms == expected


@pytest.mark.parametrize(
    ("props", "expected"),
    [
        ({}, 0),
        ({"log.roll.jitter.hours": "2"}, 2 * HOUR_MS),
        ({"log.roll.jitter.ms": "99", "log.roll.jitter.hours": "2"}, 99),
    ],
)
def test_roll_jitter_ms_wins_over_hours(props: dict[str, str], expected: int) -> None:
    assert BrokerConfig.from_properties(props).default_topic_config.segment_jitter_ms == expected


@pytest.mark.parametrize(
    ("props", "expected"),
    [
        ({}, 168 * HOUR_MS),
        ({"log.retention.hours": "1"}, HOUR_MS),
        ({"log.retention.minutes": "3", "log.retention.hours": "1"}, 180_000),
        (
            {"log.retention.ms": "5", "log.retention.minutes": "3", "log.retention.hours": "1"},
            5,
        ),
        ({"log.retention.ms": "5", "log.retention.hours": "1"}, 5),
        ({"log.retention.hours": "-1"}, -1),
        ({"log.retention.minutes": "-7"}, -1),
        ({"log.retention.ms": "-100"}, -1),
        ({"log.retention.ms": "-1", "log.retention.hours": "5"}, -1),
        ({"log.retention.ms": "0"}, 0),
    ],
)
def test_retention_ms_over_minutes_over_hours(props: dict[str, str], expected: int) -> None:
    assert BrokerConfig.from_properties(props).default_topic_config.retention_ms == expected


def test_flush_ms_falls_back_to_the_scheduler_interval() -> None:
    b = BrokerConfig.from_properties({"log.flush.scheduler.interval.ms": "3000"})
    assert b.default_topic_config.flush_ms == 3000
    b = BrokerConfig.from_properties(
        {"log.flush.scheduler.interval.ms": "3000", "log.flush.interval.ms": "10"}
    )
    assert b.default_topic_config.flush_ms == 10


def test_log_dirs_wins_over_log_dir_and_is_a_list() -> None:
    b = BrokerConfig.from_properties({"log.dir": "/one", "log.dirs": " /a , /b,/c "})
    assert b.log_dirs == ("/a", "/b", "/c")
    assert BrokerConfig.from_properties({"log.dir": "/one"}).log_dirs == ("/one",)


def test_topic_log_config_applies_topic_overrides_over_broker_defaults() -> None:
    b = BrokerConfig.from_properties({"log.segment.bytes": "2048", "log.retention.hours": "1"})
    c = b.topic_log_config({"retention.ms": "10"})
    assert c.segment_bytes == 2048
    assert c.retention_ms == 10


BROKER_ERRORS = [
    ("log.segment.bytes", "1", "Value must be at least 14"),
    ("log.roll.ms", "0", "Value must be at least 1"),
    ("log.roll.hours", "0", "Value must be at least 1"),
    ("log.roll.hours", "2147483648", "Not a number of type INT"),
    ("log.roll.jitter.ms", "-1", "Value must be at least 0"),
    ("log.roll.jitter.hours", "-1", "Value must be at least 0"),
    ("log.retention.ms", "forever", "Not a number of type LONG"),
    ("log.retention.minutes", "1.5", "Not a number of type INT"),
    ("log.retention.hours", "", "Not a number of type INT"),
    ("log.retention.bytes", "1G", "Not a number of type LONG"),
    ("log.retention.check.interval.ms", "0", "Value must be at least 1"),
    ("log.index.interval.bytes", "-1", "Value must be at least 0"),
    ("log.index.size.max.bytes", "3", "Value must be at least 4"),
    ("log.segment.delete.delay.ms", "-1", "Value must be at least 0"),
    ("message.max.bytes", "-1", "Value must be at least 0"),
    ("log.cleanup.policy", "shred", "String must be one of: compact, delete"),
    ("log.cleaner.delete.retention.ms", "-1", "Value must be at least 0"),
    ("log.cleaner.min.compaction.lag.ms", "-1", "Value must be at least 0"),
    ("log.cleaner.max.compaction.lag.ms", "0", "Value must be at least 1"),
    ("log.cleaner.min.cleanable.ratio", "2", "Value must be no more than 1"),
    ("compression.type", "brotli", "String must be one of"),
    ("log.message.timestamp.type", "AppendTime", "String must be one of"),
    ("log.flush.interval.messages", "0", "Value must be at least 1"),
    ("log.flush.interval.ms", "-1", "Value must be at least 0"),
    ("log.flush.scheduler.interval.ms", "-1", "Value must be at least 0"),
    ("log.flush.scheduler.interval.ms", "soon", "Not a number of type LONG"),
    ("log.flush.offset.checkpoint.interval.ms", "-1", "Value must be at least 0"),
    ("log.flush.start.offset.checkpoint.interval.ms", "-1", "Value must be at least 0"),
    ("log.preallocate", "on", "Expected value to be either true or false"),
    ("num.partitions", "0", "Value must be at least 1"),
    ("num.partitions", "1001", "more than max.topic.partitions (1000)"),
    ("max.topic.partitions", "0", "Value must be at least 1"),
    ("max.topic.partitions", "2147483648", "Not a number of type INT"),
    ("max.broker.partitions", "-1", "Value must be at least 1"),
    ("log.dirs", "", "values must not be empty"),
    ("log.dirs", "/a,,/b", "values must not be empty"),
    ("log.dirs", "/a,/a", "values must not be duplicated"),
    ("log.dir", " ", "values must not be empty"),
    ("log.segments.bytes", "1024", "unknown log configuration"),
    ("log.retention.day", "1", "unknown log configuration"),
]


@pytest.mark.parametrize(("key", "raw", "reason"), BROKER_ERRORS)
def test_broker_validation_error_names_the_key(key: str, raw: str, reason: str) -> None:
    with pytest.raises(ConfigError) as info:
        BrokerConfig.from_properties({key: raw})
    assert info.value.key == key
    assert reason in info.value.reason
    assert key in str(info.value)


def test_overridden_time_keys_are_still_validated() -> None:
    # As Kafka's ConfigDef parses every key given, a bad hours value is an
    # error even though log.retention.ms takes precedence.
    with pytest.raises(ConfigError) as info:
        BrokerConfig.from_properties({"log.retention.ms": "5", "log.retention.hours": "x"})
    assert info.value.key == "log.retention.hours"


def test_broker_compaction_lag_conflict_names_the_broker_key() -> None:
    with pytest.raises(ConfigError) as info:
        BrokerConfig.from_properties(
            {"log.cleaner.min.compaction.lag.ms": "10", "log.cleaner.max.compaction.lag.ms": "5"}
        )
    assert info.value.key == "log.cleaner.min.compaction.lag.ms"


def test_non_log_broker_keys_and_unused_kafka_log_keys_are_ignored() -> None:
    b = BrokerConfig.from_properties(
        {
            "broker.id": "1",
            "listeners": "PLAINTEXT://:9092",
            "zookeeper.connect": "zk:2181",
            "process.roles": "broker,controller",
            "segment.bytes": "not a broker key, ignored",
            "log.cleaner.threads": "4",
            "log.message.timestamp.after.max.ms": "1000",
            "log.local.retention.ms": "-2",
        }
    )
    assert b.default_topic_config == LogConfig()


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"log_dirs": ()}, "log.dirs"),
        ({"log_dirs": ("/a", "")}, "log.dirs"),
        ({"log_dirs": ("/a", "/a")}, "log.dirs"),
        ({"log_dirs": "/a"}, "log.dirs"),
        ({"num_partitions": 0}, "num.partitions"),
        ({"log_retention_check_interval_ms": 0}, "log.retention.check.interval.ms"),
        (
            {"log_flush_offset_checkpoint_interval_ms": -1},
            "log.flush.offset.checkpoint.interval.ms",
        ),
        (
            {"log_flush_start_offset_checkpoint_interval_ms": -1},
            "log.flush.start.offset.checkpoint.interval.ms",
        ),
        ({"default_topic_config": {}}, "default_topic_config"),
    ],
)
def test_broker_direct_construction_is_validated(changes: dict[str, object], key: str) -> None:
    args: dict[str, object] = {"log_dirs": ("/data",), **changes}
    with pytest.raises(ConfigError) as info:
        BrokerConfig(**args)  # type: ignore[arg-type]
    assert info.value.key == key


def test_partition_maximums_default_and_parse() -> None:
    defaults = BrokerConfig(log_dirs=("/data",))
    assert (defaults.max_topic_partitions, defaults.max_broker_partitions) == (1000, 4000)
    assert BrokerConfig.from_properties({}) == BrokerConfig.from_properties(
        {"max.topic.partitions": "1000", "max.broker.partitions": "4000"}
    )
    b = BrokerConfig.from_properties(
        {"num.partitions": "3", "max.topic.partitions": "3", "max.broker.partitions": "5"}
    )
    assert (b.num_partitions, b.max_topic_partitions, b.max_broker_partitions) == (3, 3, 5)
    with pytest.raises(ConfigError, match=r"more than max\.broker\.partitions \(2\)") as info:
        BrokerConfig(log_dirs=("/data",), num_partitions=3, max_broker_partitions=2)
    assert info.value.key == "num.partitions"


@pytest.mark.parametrize(
    ("partitions", "existing", "reason"),
    [
        (0, 0, "must be at least 1"),
        (-1, 0, "must be at least 1"),
        (True, 0, "must be a whole number"),
        ("3", 0, "must be a whole number"),
        (2.0, 0, "must be a whole number"),
        (None, 0, "must be a whole number"),
        (11, 0, "more than max.topic.partitions (10) for one topic"),
        (100_000, 0, "more than max.topic.partitions (10) for one topic"),
        (10**30, 0, "more than max.topic.partitions (10) for one topic"),
        pytest.param(10**5000, 0, "more than max.topic.partitions (10)", id="10**5000"),
        pytest.param(-(10**5000), 0, "must be at least 1", id="-10**5000"),
        (5, 11, "holds 11 partitions and may hold at most max.broker.partitions (15)"),
        (1, 15, "may hold at most max.broker.partitions (15)"),
    ],
)
def test_a_new_topic_partition_count_is_bounded(
    partitions: object, existing: int, reason: str
) -> None:
    broker = BrokerConfig(log_dirs=("/data",), max_topic_partitions=10, max_broker_partitions=15)
    with pytest.raises(ConfigError) as info:
        broker.validated_partition_count(partitions, existing)
    assert info.value.key == "partitions"
    assert reason in info.value.reason
    assert len(str(info.value)) < 300


def test_a_new_topic_within_both_maximums_is_accepted() -> None:
    broker = BrokerConfig(log_dirs=("/data",), max_topic_partitions=10, max_broker_partitions=15)
    assert broker.validated_partition_count(10, 5) == 10
    assert broker.validated_partition_count(1) == 1


def test_broker_accepts_a_list_of_log_dirs() -> None:
    assert BrokerConfig(log_dirs=["/a", "/b"]).log_dirs == ("/a", "/b")  # type: ignore[arg-type]


# --- Real server.properties files --------------------------------------------------


def test_kafka_kraft_server_properties_loads(tmp_path: Path) -> None:
    path = tmp_path / "server.properties"
    path.write_text(KRAFT_SERVER_PROPERTIES, encoding="utf-8")
    props = load_properties(path)
    assert props["listener.security.protocol.map"].endswith("SASL_SSL:SASL_SSL")
    assert "log.flush.interval.messages" not in props
    b = BrokerConfig.from_properties(props)
    assert b.log_dirs == ("/tmp/kraft-combined-logs",)
    assert b.num_partitions == 1
    assert b.log_retention_check_interval_ms == 300000
    assert b.default_topic_config == LogConfig()


def test_zookeeper_era_server_properties_loads(tmp_path: Path) -> None:
    path = tmp_path / "server.properties"
    path.write_text(ZK_SERVER_PROPERTIES, encoding="utf-8")
    b = BrokerConfig.from_properties(load_properties(str(path)))
    assert b.log_dirs == ("/var/lib/kafka/data-1", "/var/lib/kafka/data-2")
    assert b.num_partitions == 3
    assert b.default_topic_config.retention_ms == 72 * HOUR_MS
    assert b.default_topic_config.segment_bytes == 536870912


# --- Java .properties syntax ------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a=b", {"a": "b"}),
        ("a:b", {"a": "b"}),
        ("a b", {"a": "b"}),
        ("a\tb", {"a": "b"}),
        ("  a   =   b", {"a": "b"}),
        ("a = b   ", {"a": "b   "}),
        ("a : = b", {"a": "= b"}),
        ("a=b=c", {"a": "b=c"}),
        ("a==b", {"a": "=b"}),
        ("a", {"a": ""}),
        ("a=", {"a": ""}),
        ("=b", {"": "b"}),
        ("# a=b\n! c=d\n   # e=f", {}),
        ("a=b # not a comment", {"a": "b # not a comment"}),
        ("\n\n   \n\t\na=b\n\n", {"a": "b"}),
        ("a=1\na=2", {"a": "2"}),
        ("a=b\r\nc=d\re=f", {"a": "b", "c": "d", "e": "f"}),
        ("\f a=b", {"a": "b"}),
    ],
)
def test_parse_properties_separators_and_comments(text: str, expected: dict[str, str]) -> None:
    assert parse_properties(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a=one,\\\n    two,\\\n\tthree", {"a": "one,two,three"}),
        ("a\\\n  b=c", {"ab": "c"}),
        ("a=x\\\\\nb=y", {"a": "x\\", "b": "y"}),
        ("a=x\\\\\\\nmore", {"a": "x\\more"}),
        ("# comment \\\nb=c", {"b": "c"}),
        ("a=x\\\n   \nb=c", {"a": "x", "b": "c"}),
        ("a=x\\\n# not a comment", {"a": "x# not a comment"}),
        ("a=x\\", {"a": "x"}),
        ("a=x\\\r\n  y", {"a": "xy"}),
    ],
)
def test_parse_properties_line_continuations(text: str, expected: dict[str, str]) -> None:
    assert parse_properties(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a=x\\ty", {"a": "x\ty"}),
        ("a=x\\ny", {"a": "x\ny"}),
        ("a=x\\ry\\fz", {"a": "x\ry\fz"}),
        ("a=c:\\\\temp", {"a": "c:\\temp"}),
        ("a=\\u0041\\u00e9\\u20AC", {"a": "Aé€"}),
        ("a\\=b=c", {"a=b": "c"}),
        ("a\\:b:c", {"a:b": "c"}),
        ("a\\ b c", {"a b": "c"}),
        ("a=\\=\\:\\#\\!", {"a": "=:#!"}),
        ("a=\\q", {"a": "q"}),
        ("\\#a=b", {"#a": "b"}),
        ("a=\\ \\ lead", {"a": "  lead"}),
    ],
)
def test_parse_properties_escapes(text: str, expected: dict[str, str]) -> None:
    assert parse_properties(text) == expected


@pytest.mark.parametrize("text", ["a=\\u00", "a=\\u00zz", "a\\uXYZW=b", "a=\\u"])
def test_parse_properties_rejects_malformed_unicode_escapes(text: str) -> None:
    with pytest.raises(ConfigError, match="Malformed"):
        parse_properties(text)


def test_load_properties_decodes_utf8_and_falls_back_to_latin1(tmp_path: Path) -> None:
    utf8 = tmp_path / "utf8.properties"
    utf8.write_bytes("\ufefflog.dirs=/données\n".encode())
    assert load_properties(utf8) == {"log.dirs": "/données"}
    latin1 = tmp_path / "latin1.properties"
    latin1.write_bytes("log.dirs=/données\n".encode("iso-8859-1"))
    assert load_properties(latin1) == {"log.dirs": "/données"}


def test_load_properties_missing_file_raises_os_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_properties(tmp_path / "absent.properties")

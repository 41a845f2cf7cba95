"""The offsets topic ``__consumer_offsets``: its name, settings and partition choice.

A group's commits live in one partition of the topic, the one Kafka's group
coordinator picks (``GroupMetadataManager.partitionFor`` /
``GroupCoordinatorService.topicPartitionFor``): ``Utils.abs(groupId.hashCode()) %
offsets.topic.num.partitions``, with Java's ``String.hashCode`` (``s[0]*31^(n-1) + ... +
s[n-1]`` over the UTF-16 code units, in 32-bit wrapping arithmetic) and Kafka's
``Utils.abs`` (``Integer.MIN_VALUE`` gives 0). So a group committed here is found by a
broker in the partition it reads, and a broker's commits are found here.

Broker settings, with Kafka's names and defaults (``GroupConfig``):
``offsets.topic.num.partitions`` (50) and ``offsets.topic.segment.bytes`` (100 MiB) when
the topic is created, ``offsets.retention.minutes`` (7 days) and
``offsets.retention.check.interval.ms`` (10 minutes) for expiry.

Thread-safety: pure functions and frozen dataclasses.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import ConfigError
from ..log.log_config import BrokerConfig
from ..number import INT_MAX, LONG_MAX, parse_java_integer

__all__ = [
    "OFFSETS_TOPIC",
    "GroupConfig",
    "java_string_hash",
    "offsets_topic_overrides",
    "partition_for_group",
]

OFFSETS_TOPIC = "__consumer_offsets"
"""Kafka's internal topic of committed offsets (``Topic.GROUP_METADATA_TOPIC_NAME``)."""

_MS_PER_MINUTE = 60_000


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode`` of ``text``: a signed 32-bit ``int``.

    Java strings are UTF-16: a character outside the Basic Multilingual Plane counts as
    its two surrogates, as Java hashes it.

    Cost: O(len(text)).
    """
    h = 0
    units = text.encode("utf-16-be", "surrogatepass")
    for i in range(0, len(units), 2):
        h = (31 * h + (units[i] << 8 | units[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for_group(group: str, partitions: int) -> int:
    """The partition of the offsets topic holding ``group``'s commits:
    ``Utils.abs(group.hashCode()) % partitions``, as Kafka's coordinator places it.

    Raises:
        ValueError: ``partitions`` below 1.
    """
    if partitions < 1:
        raise ValueError(f"the offsets topic needs at least one partition, not {partitions}")
    h = java_string_hash(group)
    return (0 if h == -(1 << 31) else abs(h)) % partitions


@dataclass(frozen=True)
class GroupConfig:
    """The broker's group coordinator settings (Kafka's names and defaults).

    Raises:
        ConfigError: (on construction) a value out of Kafka's bounds, naming the key.
    """

    offsets_topic_num_partitions: int = 50
    offsets_topic_segment_bytes: int = 100 * 1024 * 1024
    offsets_retention_minutes: int = 7 * 24 * 60
    offsets_retention_check_interval_ms: int = 600_000

    def __post_init__(self) -> None:
        for key, value, low, high in (
            ("offsets.topic.num.partitions", self.offsets_topic_num_partitions, 1, INT_MAX),
            ("offsets.topic.segment.bytes", self.offsets_topic_segment_bytes, 1, INT_MAX),
            ("offsets.retention.minutes", self.offsets_retention_minutes, 1, INT_MAX),
            (
                "offsets.retention.check.interval.ms",
                self.offsets_retention_check_interval_ms,
                1,
                LONG_MAX,
            ),
        ):
            if not isinstance(value, int) or isinstance(value, bool):
                raise ConfigError(key, value, "Expected value to be an integer")
            if not low <= value <= high:
                raise ConfigError(key, value, f"Value must be at least {low}")

    @property
    def retention_ms(self) -> int:
        """``offsets.retention.minutes`` in milliseconds."""
        return self.offsets_retention_minutes * _MS_PER_MINUTE

    @classmethod
    def from_properties(cls, props: Mapping[str, str]) -> GroupConfig:
        """The settings of a ``server.properties``; other keys are ignored.

        Raises:
            ConfigError: a value that is no number or is out of bounds.
        """
        values: dict[str, int] = {}
        for key, attribute, high in (
            ("offsets.topic.num.partitions", "offsets_topic_num_partitions", INT_MAX),
            ("offsets.topic.segment.bytes", "offsets_topic_segment_bytes", INT_MAX),
            ("offsets.retention.minutes", "offsets_retention_minutes", INT_MAX),
            (
                "offsets.retention.check.interval.ms",
                "offsets_retention_check_interval_ms",
                LONG_MAX,
            ),
        ):
            raw = props.get(key)
            if raw is None:
                continue
            value = parse_java_integer(raw.strip(), -high - 1, high)
            if value is None:
                raise ConfigError(key, raw, "Not a number of type INT")
            values[attribute] = value
        return cls(**values)


COMPACTED_OFFSETS_TOPIC: Mapping[str, str] = {"cleanup.policy": "compact"}
"""What Kafka gives the offsets topic, besides its segment size."""

_UNTIL_COMPACTION: Mapping[str, str] = {"cleanup.policy": "delete", "retention.ms": "-1"}


def offsets_topic_overrides(broker: BrokerConfig, config: GroupConfig) -> dict[str, str]:
    """The topic-level overrides the offsets topic is created with: Kafka's
    ``cleanup.policy=compact`` and ``segment.bytes`` of ``offsets.topic.segment.bytes``.

    While the engine refuses ``compact`` (log compaction is not implemented: see
    ``LogConfig.require_supported``), the topic is created ``delete`` with infinite
    ``retention.ms`` instead, so no commit is ever deleted by retention (the topic
    grows until compaction exists); ``OffsetStore`` switches an existing topic to
    ``compact`` the first time it opens it writable with an engine that accepts it.
    """
    compacted = {
        **COMPACTED_OFFSETS_TOPIC,
        "segment.bytes": str(config.offsets_topic_segment_bytes),
    }
    if compaction_supported(broker):
        return compacted
    return {**compacted, **_UNTIL_COMPACTION}


def compaction_supported(broker: BrokerConfig) -> bool:
    """Whether this engine honours ``cleanup.policy=compact``."""
    try:
        broker.topic_log_config(COMPACTED_OFFSETS_TOPIC)
    except ConfigError:
        return False
    return True

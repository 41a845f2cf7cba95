"""Log configuration with Kafka's names, defaults and validation rules.

Two levels, as in Kafka:

- ``LogConfig``: what one log (topic-partition) obeys, under the *topic-level*
  names (``segment.bytes``, ``retention.ms``, ``cleanup.policy``, ...). Defaults
  and lower bounds are those of Kafka's
  ``storage/.../internals/log/LogConfig.java``.
- ``BrokerConfig``: a ``server.properties`` file. Its ``log.*`` keys are the
  broker-wide defaults of the topic-level keys (``log.segment.bytes`` ->
  ``segment.bytes``, ``log.roll.hours`` -> ``segment.ms``, ...), resolved with
  Kafka's precedence (``log.retention.ms`` over ``.minutes`` over ``.hours``).

Values are parsed as Kafka's ``ConfigDef`` parses strings (surrounding
whitespace ignored; ``INT`` is 32-bit and ``LONG`` 64-bit; lists are
comma-separated; booleans are ``true``/``false`` in any case) and every
rejection is a ``ConfigError`` naming the key and giving Kafka's reason, e.g.
``Value must be at least 14``.

One deliberate difference: Kafka 4.0 raised the minimum of ``segment.bytes`` to
1 MiB (KIP-1030, with an internal override for tests); this module keeps the
Kafka 3.x minimum of 14 bytes (the v0 record overhead) so tests and small
deployments can roll tiny segments. Everything Kafka 4 accepts is accepted.

The ``properties`` module reads the Java ``.properties`` syntax of such files.

Thread-safety: both configs are frozen dataclasses and every function is pure,
so all of it is safe to share between threads.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ..errors import ConfigError
from ..number import (
    INT_MAX,
    INT_MIN,
    LONG_MAX,
    LONG_MIN,
    abbreviated,
    parse_java_integer,
    shown_integer,
)
from .offset_map import OFFSET_MAP_BYTES_PER_ENTRY

__all__ = [
    "LONG_MAX",
    "TOPIC_CONFIG_NAMES",
    "UNKNOWN_LOG_CONFIG",
    "UNKNOWN_TOPIC_CONFIG",
    "BrokerConfig",
    "CleanerConfig",
    "LogConfig",
    "closest_topic_config",
    "unknown_topic_config",
]

# LONG_MAX, Java's ``Long.MAX_VALUE``, is Kafka's "never" for flush and compaction lags.
_INT_RANGE = (INT_MIN, INT_MAX)
_LONG_RANGE = (LONG_MIN, LONG_MAX)
_MS_PER_MINUTE = 60 * 1000
_MS_PER_HOUR = 60 * _MS_PER_MINUTE

_Kind = Literal["int", "long", "double", "boolean", "string", "list"]


@dataclass(frozen=True)
class _Spec:
    """How one topic-level key is typed and bounded (Kafka's ``ConfigDef`` entry)."""

    name: str
    attr: str
    kind: _Kind
    at_least: int | None = None
    at_most: int | None = None
    choices: tuple[str, ...] = ()


CLEANUP_POLICIES = ("compact", "delete")
COMPRESSION_TYPES = ("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer")
TIMESTAMP_TYPES = ("CreateTime", "LogAppendTime")

# Order: the order of the LogConfig fields, which is also the order of
# to_properties(). Bounds checked against Kafka's LogConfig.CONFIG definitions.
_SPECS: tuple[_Spec, ...] = (
    _Spec("segment.bytes", "segment_bytes", "int", at_least=14),
    _Spec("segment.ms", "segment_ms", "long", at_least=1),
    _Spec("segment.jitter.ms", "segment_jitter_ms", "long", at_least=0),
    _Spec("segment.index.bytes", "segment_index_bytes", "int", at_least=4),
    _Spec("index.interval.bytes", "index_interval_bytes", "int", at_least=0),
    # Negative means "no limit"; Kafka bounds it at -1 for the topic level.
    _Spec("retention.ms", "retention_ms", "long", at_least=-1),
    # Kafka has no bound: any negative size means "no limit".
    _Spec("retention.bytes", "retention_bytes", "long"),
    _Spec("file.delete.delay.ms", "file_delete_delay_ms", "long", at_least=0),
    _Spec("max.message.bytes", "max_message_bytes", "int", at_least=0),
    _Spec("cleanup.policy", "cleanup_policy", "list", choices=CLEANUP_POLICIES),
    _Spec("delete.retention.ms", "delete_retention_ms", "long", at_least=0),
    _Spec("min.compaction.lag.ms", "min_compaction_lag_ms", "long", at_least=0),
    _Spec("max.compaction.lag.ms", "max_compaction_lag_ms", "long", at_least=1),
    _Spec(
        "min.cleanable.dirty.ratio", "min_cleanable_dirty_ratio", "double", at_least=0, at_most=1
    ),
    _Spec("compression.type", "compression_type", "string", choices=COMPRESSION_TYPES),
    _Spec("message.timestamp.type", "message_timestamp_type", "string", choices=TIMESTAMP_TYPES),
    _Spec("flush.messages", "flush_messages", "long", at_least=1),
    _Spec("flush.ms", "flush_ms", "long", at_least=0),
    _Spec("preallocate", "preallocate", "boolean"),
)
_SPEC_BY_NAME: dict[str, _Spec] = {spec.name: spec for spec in _SPECS}

TOPIC_CONFIG_NAMES: frozenset[str] = frozenset(_SPEC_BY_NAME)
"""Every topic-level key ``LogConfig.from_properties`` accepts."""

_LONGEST_SUGGESTED = 100  # difflib is quadratic in the key's length: no hint past it


def _closest_key(key: str, known: frozenset[str]) -> str | None:
    """The known key most like ``key`` (difflib's ratio at least 0.6, case ignored),
    or ``None``: ``retention.mss`` -> ``retention.ms``, ``nosuch.key`` -> ``None``.

    Cost: O(len(known) x len(key)^2) at worst, for keys of at most 100 characters."""
    if len(key) > _LONGEST_SUGGESTED:
        return None
    by_lower = {name.lower(): name for name in known}
    matches = difflib.get_close_matches(key.lower(), sorted(by_lower), n=1)
    return by_lower[matches[0]] if matches else None


UNKNOWN_TOPIC_CONFIG = "unknown topic configuration"
"""The ``reason`` of the ``ConfigError`` for a topic-level key that does not exist."""
UNKNOWN_LOG_CONFIG = "unknown log configuration"
"""The ``reason`` of the ``ConfigError`` for a broker ``log.*`` key that does not exist."""


def closest_topic_config(key: str) -> str | None:
    """The topic-level key most like ``key`` (``retention.mss`` -> ``retention.ms``),
    or ``None`` when none is close."""
    return _closest_key(key, TOPIC_CONFIG_NAMES)


def unknown_topic_config(key: str, value: object = None) -> ConfigError:
    """The error for a topic-level ``key`` that does not exist (given ``value``):
    ``unknown topic configuration 'retention.mss' (did you mean retention.ms?)``."""
    return _unknown_key(key, value, UNKNOWN_TOPIC_CONFIG, closest_topic_config(key))


def _unknown_key(key: str, value: object, reason: str, suggestion: str | None) -> ConfigError:
    # A ConfigError like any other (the same class for every ``except``, and the same
    # error kind on the control socket), whose message names the key and the closest
    # known one rather than the value ("invalid value '1' for ...": the value is not
    # what is wrong).
    error = ConfigError(abbreviated(key), value, reason)
    hint = f" (did you mean {suggestion}?)" if suggestion is not None else ""
    error.args = (f"{reason} {abbreviated(key)!r}{hint}",)
    return error


# Java's Double.parseDouble grammar for decimal strings (hex floats left out). Written
# so that no two repetitions can share a digit: "[0-9]+\.?[0-9]*" backtracked in
# quadratic time (11 s for 16,000 digits and a letter).
_DOUBLE_PATTERN = re.compile(
    r"[+-]?(?:NaN|Infinity|(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[fFdD]?)"
)


def _parse_long(key: str, raw: str, kind: Literal["int", "long"]) -> int:
    # Never int() of the raw text: past 4,300 digits it raises ValueError, not ours.
    value = parse_java_integer(raw.strip(), *(_INT_RANGE if kind == "int" else _LONG_RANGE))
    if value is None:
        raise ConfigError(key, raw, f"Not a number of type {kind.upper()}")
    return value


def _parse_double(key: str, raw: str) -> float:
    text = raw.strip()
    if _DOUBLE_PATTERN.fullmatch(text) is None:
        raise ConfigError(key, raw, "Not a number of type DOUBLE")
    return float(text.rstrip("fFdD").replace("Infinity", "inf"))


def _parse_boolean(key: str, raw: str) -> bool:
    text = raw.strip().lower()
    if text not in ("true", "false"):
        raise ConfigError(key, raw, "Expected value to be either true or false")
    return text == "true"


def _split_list(text: str) -> tuple[str, ...]:
    """Kafka's split at ``\\s*,\\s*`` of trimmed text, in linear time (that regular
    expression backtracks quadratically over a long run of spaces without a comma)."""
    return tuple(item.strip() for item in text.split(","))


def _parse_list(raw: str) -> tuple[str, ...]:
    text = raw.strip()
    return _split_list(text) if text else ()


def _parse(key: str, raw: object, spec: _Spec) -> object:
    """Parse the string ``raw`` of ``key`` as ``spec`` says, then check its bounds.

    Raises:
        ConfigError: not a string, not of the type, or out of bounds.
    """
    if not isinstance(raw, str):
        raise ConfigError(key, raw, f"expected a string, got {type(raw).__name__}")
    value: object
    try:
        if spec.kind in ("int", "long"):
            value = _parse_long(key, raw, "int" if spec.kind == "int" else "long")
        elif spec.kind == "double":
            value = _parse_double(key, raw)
        elif spec.kind == "boolean":
            value = _parse_boolean(key, raw)
        elif spec.kind == "list":
            value = _parse_list(raw)
        else:
            value = raw.strip()
        _check(key, value, spec)
    except ConfigError as exc:
        if abbreviated(raw) == raw:
            raise
        # The error goes into a log line or onto a terminal: not 65,000 characters.
        raise ConfigError(key, abbreviated(raw), exc.reason) from None
    return value


def _check(key: str, value: object, spec: _Spec) -> None:
    """Check an already typed ``value`` against ``spec``; errors name ``key``.

    Raises:
        ConfigError: wrong Python type, out of range, or not one of the choices.
    """
    if spec.kind in ("int", "long"):
        low, high = _INT_RANGE if spec.kind == "int" else _LONG_RANGE
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(key, value, f"Expected value to be an integer ({spec.kind})")
        if not low <= value <= high:
            raise ConfigError(
                key, shown_integer(value), f"Not a number of type {spec.kind.upper()}"
            )
    elif spec.kind == "double":
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise ConfigError(key, value, "Expected value to be a double")
    elif spec.kind == "boolean":
        if not isinstance(value, bool):
            raise ConfigError(key, value, "Expected value to be either true or false")
    elif spec.kind == "list":
        if not isinstance(value, tuple) or not all(isinstance(v, str) for v in value):
            raise ConfigError(key, value, "Expected a tuple of strings")
        for item in value:
            if item not in spec.choices:
                raise ConfigError(key, item, f"String must be one of: {', '.join(spec.choices)}")
        return
    elif not isinstance(value, str):
        raise ConfigError(key, value, "Expected value to be a string")

    if spec.choices and value not in spec.choices:
        raise ConfigError(key, value, f"String must be one of: {', '.join(spec.choices)}")
    if isinstance(value, int | float) and not isinstance(value, bool):
        # Written as negations so that NaN fails both bounds.
        if spec.at_least is not None and not value >= spec.at_least:
            raise ConfigError(key, value, f"Value must be at least {spec.at_least}")
        if spec.at_most is not None and not value <= spec.at_most:
            raise ConfigError(key, value, f"Value must be no more than {spec.at_most}")


def _check_compaction_lags(min_key: str, min_lag: int, max_key: str, max_lag: int) -> None:
    # Kafka's LogConfig.validateValues: the only cross-key rule for a local log.
    if min_lag > max_lag:
        raise ConfigError(
            min_key,
            min_lag,
            f"conflict topic config setting {min_key} ({min_lag}) > {max_key} ({max_lag})",
        )


def _format(value: object) -> str:
    """Render a typed value the way Kafka would read it back."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(value)
    if isinstance(value, float):
        return repr(value)
    return str(value)


@dataclass(frozen=True)
class LogConfig:
    """The configuration one log obeys, with Kafka's topic-level defaults.

    Field ``x_y`` is Kafka's topic key ``x.y`` (see ``TOPIC_CONFIG_NAMES``).
    Sizes are bytes, times milliseconds. ``retention_ms``/``retention_bytes``
    of -1 (any negative size) mean "no limit"; ``LONG_MAX`` for
    ``flush_messages``/``flush_ms`` means "leave flushing to the OS".

    Validated on construction, whether built directly or parsed.

    Raises:
        ConfigError: (on construction) a value of the wrong type or outside
            Kafka's bounds, naming the topic-level key; or
            ``min.compaction.lag.ms`` greater than ``max.compaction.lag.ms``.
    """

    segment_bytes: int = 1024 * 1024 * 1024
    segment_ms: int = 7 * 24 * _MS_PER_HOUR
    segment_jitter_ms: int = 0
    segment_index_bytes: int = 10 * 1024 * 1024
    index_interval_bytes: int = 4096
    retention_ms: int = 7 * 24 * _MS_PER_HOUR
    retention_bytes: int = -1
    file_delete_delay_ms: int = 60000
    max_message_bytes: int = 1024 * 1024 + 12
    cleanup_policy: tuple[str, ...] = ("delete",)
    delete_retention_ms: int = 24 * _MS_PER_HOUR
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = LONG_MAX
    min_cleanable_dirty_ratio: float = 0.5
    compression_type: str = "producer"
    message_timestamp_type: str = "CreateTime"
    flush_messages: int = LONG_MAX
    flush_ms: int = LONG_MAX
    preallocate: bool = False

    def __post_init__(self) -> None:
        # Normalise the two fields whose natural Python spellings differ from
        # the stored ones, so equality and hashing behave (a frozen dataclass
        # needs object.__setattr__ for that).
        if isinstance(self.cleanup_policy, list):
            object.__setattr__(self, "cleanup_policy", tuple(self.cleanup_policy))
        ratio = self.min_cleanable_dirty_ratio
        if isinstance(ratio, int) and not isinstance(ratio, bool):
            object.__setattr__(self, "min_cleanable_dirty_ratio", float(ratio))
        for spec in _SPECS:
            _check(spec.name, getattr(self, spec.attr), spec)
        _check_compaction_lags(
            "min.compaction.lag.ms",
            self.min_compaction_lag_ms,
            "max.compaction.lag.ms",
            self.max_compaction_lag_ms,
        )

    def require_supported(self) -> LogConfig:
        """Return self, or raise for a setting this engine would accept but not honour.

        ``preallocate=true`` is parsed and validated like Kafka does, but nothing acts
        on it: a user must never believe it works. Every path that makes a config
        effective (a broker config, a topic's overrides, a writable log) calls this.
        (Compaction and its settings are honoured: see ``storage/log/cleaner.py``.)

        Raises:
            ConfigError: naming the first such key and why.
        """
        if self.preallocate:
            raise ConfigError(
                "preallocate", "true", "segment preallocation is not implemented; use false"
            )
        return self

    @property
    def compact(self) -> bool:
        """Whether ``cleanup.policy`` includes ``compact``."""
        return "compact" in self.cleanup_policy

    @property
    def delete(self) -> bool:
        """Whether ``cleanup.policy`` includes ``delete`` (retention applies)."""
        return "delete" in self.cleanup_policy

    @property
    def max_segment_ms(self) -> int:
        """The age at which the active segment rolls, as Kafka's ``maxSegmentMs``.

        For a compacted log with a positive ``max.compaction.lag.ms`` the segment
        rolls no later than that lag, so records become cleanable in time.
        """
        if self.compact and self.max_compaction_lag_ms > 0:
            return min(self.max_compaction_lag_ms, self.segment_ms)
        return self.segment_ms

    @classmethod
    def from_properties(
        cls, props: Mapping[str, str], defaults: LogConfig | None = None
    ) -> LogConfig:
        """Build a config from topic-level ``props`` over ``defaults``.

        ``defaults`` is usually ``BrokerConfig.default_topic_config``; when
        ``None``, Kafka's own defaults. Values are strings parsed as Kafka
        parses them (``"compact,delete"``, ``"true"``, ``" 42 "``).

        Raises:
            ConfigError: an unknown key (reason ``UNKNOWN_TOPIC_CONFIG``, the
                message naming the closest known key), an unparsable value, or a
                value out of bounds; the error names the key.
        """
        # Any: each value matches its field's type by construction of _SPECS.
        changes: dict[str, Any] = {}
        for key, raw in props.items():
            spec = _SPEC_BY_NAME.get(key)
            if spec is None:
                raise unknown_topic_config(key, raw)
            changes[spec.attr] = _parse(key, raw, spec)
        return dataclasses.replace(defaults if defaults is not None else cls(), **changes)

    def to_properties(self) -> dict[str, str]:
        """Return every setting under its topic-level name, as strings.

        ``LogConfig.from_properties(c.to_properties()) == c`` for every config.
        """
        return {spec.name: _format(getattr(self, spec.attr)) for spec in _SPECS}

    def overrides(self, base: LogConfig) -> dict[str, str]:
        """Return only the settings that differ from ``base`` (topic-level names).

        This is what a topic stores: applying the result to ``base`` with
        ``from_properties`` gives back this config.
        """
        return {
            spec.name: _format(getattr(self, spec.attr))
            for spec in _SPECS
            if getattr(self, spec.attr) != getattr(base, spec.attr)
        }


# Broker keys that are plain synonyms of a topic-level key. The time keys with
# hours/minutes fallbacks (segment.ms, segment.jitter.ms, retention.ms,
# flush.ms) are resolved separately in BrokerConfig.from_properties.
_BROKER_SYNONYMS: dict[str, str] = {
    "log.segment.bytes": "segment.bytes",
    "log.index.size.max.bytes": "segment.index.bytes",
    "log.index.interval.bytes": "index.interval.bytes",
    "log.retention.bytes": "retention.bytes",
    "log.segment.delete.delay.ms": "file.delete.delay.ms",
    "message.max.bytes": "max.message.bytes",
    "log.cleanup.policy": "cleanup.policy",
    "log.cleaner.delete.retention.ms": "delete.retention.ms",
    "log.cleaner.min.compaction.lag.ms": "min.compaction.lag.ms",
    "log.cleaner.max.compaction.lag.ms": "max.compaction.lag.ms",
    "log.cleaner.min.cleanable.ratio": "min.cleanable.dirty.ratio",
    "compression.type": "compression.type",
    "log.message.timestamp.type": "message.timestamp.type",
    "log.flush.interval.messages": "flush.messages",
    "log.preallocate": "preallocate",
}

LOG_SEGMENT_OPEN_MAX = 1000
"""``log.segment.open.max``'s default (``segment.OpenSegments``)."""

# Broker keys with their own ConfigDef entries (KafkaConfig / ServerLogConfigs).
_BROKER_SPECS: dict[str, _Spec] = {
    spec.name: spec
    for spec in (
        _Spec("log.roll.ms", "segment_ms", "long", at_least=1),
        _Spec("log.roll.hours", "segment_ms", "int", at_least=1),
        _Spec("log.roll.jitter.ms", "segment_jitter_ms", "long", at_least=0),
        _Spec("log.roll.jitter.hours", "segment_jitter_ms", "int", at_least=0),
        # No bounds: any negative retention time means "unlimited" (-1).
        _Spec("log.retention.ms", "retention_ms", "long"),
        _Spec("log.retention.minutes", "retention_ms", "int"),
        _Spec("log.retention.hours", "retention_ms", "int"),
        _Spec("log.flush.interval.ms", "flush_ms", "long", at_least=0),
        _Spec("log.flush.scheduler.interval.ms", "log_flush_scheduler_interval_ms", "long"),
        _Spec("num.partitions", "num_partitions", "int", at_least=1),
        # Not Kafka's: see BrokerConfig. The names are KIP-578's pattern.
        _Spec("max.topic.partitions", "max_topic_partitions", "int", at_least=1),
        _Spec("max.broker.partitions", "max_broker_partitions", "int", at_least=1),
        # Not Kafka's either (a broker keeps every .log open): see BrokerConfig.
        _Spec("log.segment.open.max", "log_segment_open_max", "int", at_least=1),
        _Spec(
            "log.retention.check.interval.ms",
            "log_retention_check_interval_ms",
            "long",
            at_least=1,
        ),
        _Spec(
            "log.flush.offset.checkpoint.interval.ms",
            "log_flush_offset_checkpoint_interval_ms",
            "int",
            at_least=0,
        ),
        _Spec(
            "log.flush.start.offset.checkpoint.interval.ms",
            "log_flush_start_offset_checkpoint_interval_ms",
            "int",
            at_least=0,
        ),
        # The cleaner's (Kafka's CleanerConfig.CONFIG_DEF): see CleanerConfig.
        _Spec("log.cleaner.enable", "enable", "boolean"),
        _Spec("log.cleaner.threads", "threads", "int", at_least=0),
        _Spec("log.cleaner.dedupe.buffer.size", "dedupe_buffer_size", "long"),
        _Spec("log.cleaner.io.buffer.size", "io_buffer_size", "int", at_least=0),
        _Spec("log.cleaner.io.buffer.load.factor", "io_buffer_load_factor", "double"),
        _Spec("log.cleaner.io.max.bytes.per.second", "io_max_bytes_per_second", "double"),
        _Spec("log.cleaner.backoff.ms", "backoff_ms", "long", at_least=0),
    )
} | {
    broker_key: dataclasses.replace(_SPEC_BY_NAME[topic_key], name=broker_key)
    for broker_key, topic_key in _BROKER_SYNONYMS.items()
}

_LOG_DIRS_KEYS = ("log.dirs", "log.dir")
_DEFAULT_LOG_DIR = "/tmp/kafka-logs"  # Kafka's log.dir default; not a temp file we create.

# Kafka's other log.* broker keys: accepted so a real server.properties loads,
# but they configure machinery this engine does not have (tiered storage,
# message-format conversion, timestamp skew).
_IGNORED_KAFKA_LOG_KEYS = frozenset(
    {
        "log.message.format.version",
        "log.message.downconversion.enable",
        "log.message.timestamp.difference.max.ms",
        "log.message.timestamp.before.max.ms",
        "log.message.timestamp.after.max.ms",
        "log.local.retention.ms",
        "log.local.retention.bytes",
        "log.dir.failure.timeout.ms",
        "log.initial.task.delay.ms",
    }
)


_KNOWN_BROKER_KEYS = frozenset(_BROKER_SPECS) | frozenset(_LOG_DIRS_KEYS) | _IGNORED_KAFKA_LOG_KEYS


def _broker_check(key: str, value: object) -> None:
    _check(key, value, _BROKER_SPECS[key])


_CLEANER_KEYS = {
    "enable": "log.cleaner.enable",
    "threads": "log.cleaner.threads",
    "dedupe_buffer_size": "log.cleaner.dedupe.buffer.size",
    "io_buffer_size": "log.cleaner.io.buffer.size",
    "io_buffer_load_factor": "log.cleaner.io.buffer.load.factor",
    "io_max_bytes_per_second": "log.cleaner.io.max.bytes.per.second",
    "backoff_ms": "log.cleaner.backoff.ms",
}
_MIN_DEDUPE_BYTES_PER_THREAD = 1024 * 1024


@dataclass(frozen=True)
class CleanerConfig:
    """The log cleaner's broker settings, Kafka's ``log.cleaner.*`` with its defaults.

    ``dedupe_buffer_size`` bounds the offset map of all cleaner threads together:
    a thread's map holds ``offset_map_slots`` entries (24 bytes each, Kafka's cost),
    filled to ``io_buffer_load_factor`` of them per pass; a log with more keys in its
    dirty section is cleaned in several passes. ``io_buffer_size`` and
    ``io_max_bytes_per_second`` are parsed and validated as Kafka does; this engine
    reads segments through its own buffers and does not throttle.
    ``enable``/``threads``/``backoff_ms`` are for the owner that schedules cleaning
    (the daemon).

    Raises:
        ConfigError: (on construction) a value outside Kafka's bounds, naming the
            broker key; ``log.cleaner.dedupe.buffer.size`` of 1 MiB or less per
            cleaner thread (Kafka's ``KafkaConfig`` rule), or a load factor with which
            the map holds no entry (Kafka's ``Cleaner`` assertion).
    """

    enable: bool = True
    threads: int = 1
    dedupe_buffer_size: int = 128 * 1024 * 1024
    io_buffer_size: int = 512 * 1024
    io_buffer_load_factor: float = 0.9
    io_max_bytes_per_second: float = sys.float_info.max
    backoff_ms: int = 15 * 1000

    def __post_init__(self) -> None:
        for attr in ("io_buffer_load_factor", "io_max_bytes_per_second"):
            value = getattr(self, attr)
            if isinstance(value, int) and not isinstance(value, bool):
                object.__setattr__(self, attr, float(value))
        for attr, key in _CLEANER_KEYS.items():
            _broker_check(key, getattr(self, attr))
        if self.dedupe_buffer_size // max(self.threads, 1) <= _MIN_DEDUPE_BYTES_PER_THREAD:
            raise ConfigError(
                "log.cleaner.dedupe.buffer.size",
                self.dedupe_buffer_size,
                "log.cleaner.dedupe.buffer.size must be at least 1MB per cleaner thread.",
            )
        if not self.offset_map_slots * self.io_buffer_load_factor > 1:
            raise ConfigError(
                "log.cleaner.io.buffer.load.factor",
                self.io_buffer_load_factor,
                "the offset map is too small to fit in even a single message",
            )

    @property
    def offset_map_memory(self) -> int:
        """Bytes of one cleaner thread's offset map (Kafka's
        ``min(dedupeBufferSize / numThreads, Integer.MAX_VALUE)``)."""
        return min(self.dedupe_buffer_size // max(self.threads, 1), INT_MAX)

    @property
    def offset_map_slots(self) -> int:
        """Entries one thread's map has room for: memory / 24 (``SkimpyOffsetMap``)."""
        return self.offset_map_memory // OFFSET_MAP_BYTES_PER_ENTRY

    @classmethod
    def from_parsed(cls, parsed: Mapping[str, object]) -> CleanerConfig:
        """The cleaner settings among already parsed broker ``parsed`` values (the rest
        at Kafka's defaults).

        Raises:
            ConfigError: as on construction.
        """
        values: dict[str, Any] = {
            attr: parsed[key] for attr, key in _CLEANER_KEYS.items() if key in parsed
        }
        return cls(**values)


@dataclass(frozen=True)
class BrokerConfig:
    """The log-related part of a Kafka broker configuration (``server.properties``).

    ``default_topic_config`` holds the broker-wide defaults of the topic-level
    settings; a topic's own overrides apply on top of it
    (``topic_log_config``). The other fields are broker-only.

    Two bounds are not Kafka's, which has none (KIP-578 proposed
    ``max.broker.partitions``; Kafka's controller only caps one request at 10,000
    partitions): ``max.topic.partitions`` (1,000) and ``max.broker.partitions`` (4,000,
    for the whole log directory, which is one broker's). Every open partition holds
    descriptors (measured with the file system's position index: 4 for its first
    segment, in a writer and in a reader that opens it; 3 more per further segment in a
    writer, 6 in a reader), so a topic of 100,000 partitions used to make a directory
    that no process could open again (``Too many open files``). 4,000 partitions hold
    16,000 descriptors in the daemon: a quarter of the unit's ``LimitNOFILE=65536``,
    within a shell's hard limit (524,288 on Debian; the soft 1,024 is raised to it at
    start); 4,000 is also Kafka's own advice per broker. ``validated_partition_count``
    applies them to each new topic. ``log.segment.open.max`` (1,000) bounds the sealed
    segments a process keeps open (``segment.OpenSegments``; Kafka keeps every ``.log``
    open and every used index mapped, and its operators raise ``ulimit -n``).

    Raises:
        ConfigError: (on construction) a broker-only value outside Kafka's
            bounds, ``num.partitions`` over either maximum, or an empty or
            duplicated ``log.dirs`` entry, naming the broker key.
    """

    log_dirs: tuple[str, ...]
    num_partitions: int = 1
    max_topic_partitions: int = 1000
    max_broker_partitions: int = 4000
    log_segment_open_max: int = LOG_SEGMENT_OPEN_MAX
    log_retention_check_interval_ms: int = 5 * _MS_PER_MINUTE
    log_flush_scheduler_interval_ms: int = LONG_MAX
    log_flush_offset_checkpoint_interval_ms: int = 60000
    log_flush_start_offset_checkpoint_interval_ms: int = 60000
    default_topic_config: LogConfig = field(default_factory=LogConfig)
    cleaner: CleanerConfig = field(default_factory=CleanerConfig)

    def __post_init__(self) -> None:
        if isinstance(self.log_dirs, list):
            object.__setattr__(self, "log_dirs", tuple(self.log_dirs))
        _check_log_dirs("log.dirs", self.log_dirs)
        _broker_check("num.partitions", self.num_partitions)
        _broker_check("max.topic.partitions", self.max_topic_partitions)
        _broker_check("max.broker.partitions", self.max_broker_partitions)
        _broker_check("log.segment.open.max", self.log_segment_open_max)
        for key, maximum in (
            ("max.topic.partitions", self.max_topic_partitions),
            ("max.broker.partitions", self.max_broker_partitions),
        ):
            if self.num_partitions > maximum:
                # Every topic made with the default count would be refused.
                raise ConfigError(
                    "num.partitions", self.num_partitions, f"more than {key} ({maximum})"
                )
        _broker_check("log.retention.check.interval.ms", self.log_retention_check_interval_ms)
        _broker_check("log.flush.scheduler.interval.ms", self.log_flush_scheduler_interval_ms)
        _broker_check(
            "log.flush.offset.checkpoint.interval.ms",
            self.log_flush_offset_checkpoint_interval_ms,
        )
        _broker_check(
            "log.flush.start.offset.checkpoint.interval.ms",
            self.log_flush_start_offset_checkpoint_interval_ms,
        )
        if not isinstance(self.default_topic_config, LogConfig):
            raise ConfigError(
                "default_topic_config", self.default_topic_config, "expected a LogConfig"
            )
        self.default_topic_config.require_supported()
        if not isinstance(self.cleaner, CleanerConfig):
            raise ConfigError("cleaner", self.cleaner, "expected a CleanerConfig")

    def topic_log_config(self, overrides: Mapping[str, str]) -> LogConfig:
        """Return the config of a topic with topic-level ``overrides``.

        Raises:
            ConfigError: as ``LogConfig.from_properties``, or a setting this engine does
                not honour yet (``LogConfig.require_supported``).
        """
        return LogConfig.from_properties(overrides, self.default_topic_config).require_supported()

    def validated_partition_count(self, partitions: object, existing: int = 0) -> int:
        """``partitions`` as the partition count of a new topic in a log directory that
        holds ``existing`` partitions: a whole number (not a bool) from 1 to
        ``max.topic.partitions``, with ``existing + partitions`` at most
        ``max.broker.partitions``.

        Raises:
            ConfigError: naming ``partitions`` and the bound it breaks.
        """
        if not isinstance(partitions, int) or isinstance(partitions, bool):
            raise ConfigError("partitions", partitions, "must be a whole number")
        if partitions < 1:
            raise ConfigError("partitions", shown_integer(partitions), "must be at least 1")
        if partitions > self.max_topic_partitions:
            raise ConfigError(
                "partitions",
                shown_integer(partitions),
                f"more than max.topic.partitions ({self.max_topic_partitions}) for one topic",
            )
        if existing + partitions > self.max_broker_partitions:
            raise ConfigError(
                "partitions",
                partitions,
                f"the log directory holds {existing} partitions and may hold at most "
                f"max.broker.partitions ({self.max_broker_partitions})",
            )
        return partitions

    @classmethod
    def from_properties(cls, props: Mapping[str, str]) -> BrokerConfig:
        """Build the broker config from ``server.properties`` key/values.

        Precedence as in Kafka: ``log.roll.ms`` over ``log.roll.hours`` (168);
        ``log.roll.jitter.ms`` over ``log.roll.jitter.hours`` (0);
        ``log.retention.ms`` over ``log.retention.minutes`` over
        ``log.retention.hours`` (168), any negative result meaning unlimited
        (-1); ``log.flush.interval.ms`` over ``log.flush.scheduler.interval.ms``;
        ``log.dirs`` over ``log.dir`` (``/tmp/kafka-logs``). Every key present
        is parsed and checked, even one a higher-precedence key overrides.

        Keys without the ``log.`` prefix that are not log settings
        (``broker.id``, ``listeners``, ``process.roles``, ...) are ignored so a
        real ``server.properties`` loads; so are Kafka's ``log.*`` keys for
        machinery this engine lacks (tiered storage, format conversion).

        Raises:
            ConfigError: an unknown ``log.*`` key (most likely a typo: reason
                ``UNKNOWN_LOG_CONFIG``, the message naming the closest known key), an
                unparsable value or one outside Kafka's bounds; the error names
                the broker key.
        """
        for key, raw in props.items():
            known = key in _BROKER_SPECS or key in _LOG_DIRS_KEYS
            if key.startswith("log.") and not known and key not in _IGNORED_KAFKA_LOG_KEYS:
                suggestion = _closest_key(key, _KNOWN_BROKER_KEYS)
                raise _unknown_key(key, raw, UNKNOWN_LOG_CONFIG, suggestion)

        parsed: dict[str, object] = {
            key: _parse(key, raw, _BROKER_SPECS[key])
            for key, raw in props.items()
            if key in _BROKER_SPECS
        }

        def number(key: str, default: int) -> int:
            value = parsed.get(key, default)
            assert isinstance(value, int)
            return value

        topic: dict[str, Any] = {
            _SPEC_BY_NAME[topic_key].attr: parsed[broker_key]
            for broker_key, topic_key in _BROKER_SYNONYMS.items()
            if broker_key in parsed
        }
        topic["segment_ms"] = _first_of(
            parsed, [("log.roll.ms", 1)], ("log.roll.hours", 168, _MS_PER_HOUR)
        )
        topic["segment_jitter_ms"] = _first_of(
            parsed, [("log.roll.jitter.ms", 1)], ("log.roll.jitter.hours", 0, _MS_PER_HOUR)
        )
        retention_ms = _first_of(
            parsed,
            [("log.retention.ms", 1), ("log.retention.minutes", _MS_PER_MINUTE)],
            ("log.retention.hours", 168, _MS_PER_HOUR),
        )
        topic["retention_ms"] = -1 if retention_ms < 0 else retention_ms

        scheduler_ms = number("log.flush.scheduler.interval.ms", LONG_MAX)
        if "log.flush.interval.ms" in parsed:
            topic["flush_ms"] = parsed["log.flush.interval.ms"]
        else:
            # Kafka falls back to the scheduler interval, which has no bounds
            # of its own; flush.ms's bound then applies to it.
            _check("log.flush.scheduler.interval.ms", scheduler_ms, _SPEC_BY_NAME["flush.ms"])
            topic["flush_ms"] = scheduler_ms

        _check_compaction_lags(
            "log.cleaner.min.compaction.lag.ms",
            number("log.cleaner.min.compaction.lag.ms", 0),
            "log.cleaner.max.compaction.lag.ms",
            number("log.cleaner.max.compaction.lag.ms", LONG_MAX),
        )

        return cls(
            log_dirs=_log_dirs(props),
            num_partitions=number("num.partitions", 1),
            max_topic_partitions=number("max.topic.partitions", 1000),
            max_broker_partitions=number("max.broker.partitions", 4000),
            log_segment_open_max=number("log.segment.open.max", LOG_SEGMENT_OPEN_MAX),
            log_retention_check_interval_ms=number(
                "log.retention.check.interval.ms", 5 * _MS_PER_MINUTE
            ),
            log_flush_scheduler_interval_ms=scheduler_ms,
            log_flush_offset_checkpoint_interval_ms=number(
                "log.flush.offset.checkpoint.interval.ms", 60000
            ),
            log_flush_start_offset_checkpoint_interval_ms=number(
                "log.flush.start.offset.checkpoint.interval.ms", 60000
            ),
            default_topic_config=dataclasses.replace(LogConfig(), **topic),
            cleaner=CleanerConfig.from_parsed(parsed),
        )


def _first_of(
    parsed: Mapping[str, object],
    preferred: list[tuple[str, int]],
    fallback: tuple[str, int, int],
) -> int:
    """The first key of ``preferred`` present (times its unit), else the fallback."""
    for key, unit in preferred:
        if key in parsed:
            value = parsed[key]
            assert isinstance(value, int)
            return value * unit
    key, default, unit = fallback
    value = parsed.get(key, default)
    assert isinstance(value, int)
    return value * unit


def _check_log_dirs(key: str, dirs: object) -> None:
    if not isinstance(dirs, tuple) or not all(isinstance(d, str) for d in dirs):
        raise ConfigError(key, dirs, "Expected a tuple of directory names")
    if not dirs or any(not d for d in dirs):
        raise ConfigError(key, ",".join(dirs), "values must not be empty")
    if len(set(dirs)) != len(dirs):
        raise ConfigError(key, ",".join(dirs), "values must not be duplicated")


def _log_dirs(props: Mapping[str, str]) -> tuple[str, ...]:
    for key in _LOG_DIRS_KEYS:
        if key in props:
            raw = props[key]
            if not isinstance(raw, str):
                raise ConfigError(key, raw, f"expected a string, got {type(raw).__name__}")
            # An empty string parses to [""], which is then rejected as empty.
            dirs = _split_list(raw.strip())
            _check_log_dirs(key, dirs)
            return dirs
    return (_DEFAULT_LOG_DIR,)

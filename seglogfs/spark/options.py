"""The options of the ``seglog`` source, named and checked as Spark's Kafka source does.

Parsing is pure (no Spark, no log directory): ``ReadOptions.parse`` turns Spark's
option map into a typed value or raises ``OptionError``. Resolving offsets against a
log directory (``earliest``/``latest``/JSON/timestamps to concrete offsets) is done by
``resolve_starting_offsets`` and ``resolve_ending_offsets`` over a read-only
``LogManager``.

Offsets are Kafka's: JSON ``{"topic": {"0": 23, "1": -2}}`` where -2 means earliest and
-1 latest; the same shape (with concrete offsets) is what a streaming query keeps in
Spark's checkpoint.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from storage import LogManager

from .errors import OptionError

TopicPartition = tuple[str, int]
PartitionOffsets = dict[TopicPartition, int]

EARLIEST = -2
"""Kafka's JSON marker for the earliest offset of a partition."""
LATEST = -1
"""Kafka's JSON marker for the latest offset (the log end) of a partition."""

# A spec is "earliest", "latest" or concrete per-partition offsets (-2/-1 allowed).
OffsetSpec = str | PartitionOffsets


@dataclass(frozen=True)
class Subscription:
    """Which topic-partitions a query reads: exactly one of ``subscribe`` (topics),
    ``subscribePattern`` (a regular expression matched against whole topic names) and
    ``assign`` (explicit topic-partitions)."""

    topics: tuple[str, ...] = ()
    pattern: str | None = None
    assigned: tuple[TopicPartition, ...] = ()

    def matches(self, topic: str) -> bool:
        if self.pattern is not None:
            return re.fullmatch(self.pattern, topic) is not None
        if self.assigned:
            return any(t == topic for t, _ in self.assigned)
        return topic in self.topics

    def topic_partitions(self, partition_counts: Mapping[str, int]) -> list[TopicPartition]:
        """The subscribed partitions that exist, sorted. A subscribed topic that does
        not exist yet contributes none (a streaming query picks it up once created).

        Cost: O(topics + partitions).
        """
        if self.assigned:
            return sorted(tp for tp in set(self.assigned) if tp[1] < partition_counts.get(tp[0], 0))
        return [
            (topic, p)
            for topic in sorted(partition_counts)
            if self.matches(topic)
            for p in range(partition_counts[topic])
        ]


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    value = options.get(name.lower())
    if value is None:
        return default
    lowered = value.strip().lower()
    if lowered not in ("true", "false"):
        raise OptionError(name, value, "must be true or false")
    return lowered == "true"


def _positive_int(options: Mapping[str, str], name: str) -> int | None:
    value = options.get(name.lower())
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        raise OptionError(name, value, "must be a positive integer") from None
    if number <= 0:
        raise OptionError(name, value, "must be a positive integer")
    return number


def _timestamp(options: Mapping[str, str], name: str) -> int | None:
    value = options.get(name.lower())
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        raise OptionError(name, value, "must be a timestamp in epoch milliseconds") from None
    if number < 0:
        raise OptionError(name, value, "must be a timestamp in epoch milliseconds (>= 0)")
    return number


def _partition_json(name: str, value: str, *, allow_markers: bool) -> PartitionOffsets:
    """``{"topic": {"0": n, ...}, ...}`` to ``{(topic, 0): n}``."""
    try:
        document = json.loads(value)
    except json.JSONDecodeError as exc:
        raise OptionError(name, value, f"not JSON: {exc.msg}") from None
    if not isinstance(document, dict):
        raise OptionError(name, value, 'expected {"topic": {"partition": number}}')
    result: PartitionOffsets = {}
    for topic, partitions in document.items():
        if not isinstance(partitions, dict):
            raise OptionError(name, value, f"topic {topic!r}: expected {{partition: number}}")
        for partition, number in partitions.items():
            try:
                p = int(partition)
            except ValueError:
                raise OptionError(name, value, f"partition {partition!r} is not a number") from None
            if isinstance(number, bool) or not isinstance(number, int):
                raise OptionError(name, value, f"{topic}-{p}: {number!r} is not an integer")
            lowest = EARLIEST if allow_markers else 0
            if number < lowest or p < 0:
                raise OptionError(name, value, f"{topic}-{p}: {number} is out of range")
            result[(topic, p)] = number
    return result


def _offset_spec(options: Mapping[str, str], name: str, default: str) -> OffsetSpec:
    value = options.get(name.lower())
    if value is None:
        return default
    lowered = value.strip().lower()
    if lowered in ("earliest", "latest"):
        return lowered
    return _partition_json(name, value, allow_markers=True)


def _subscription(options: Mapping[str, str]) -> Subscription:
    given = [
        name for name in ("assign", "subscribe", "subscribePattern") if name.lower() in options
    ]
    if len(given) != 1:
        reason = (
            "exactly one of assign, subscribe and subscribePattern must be given"
            if given
            else "one of assign, subscribe or subscribePattern is required"
        )
        raise OptionError(", ".join(given) or "subscribe", given or None, reason)
    name = given[0]
    value = options[name.lower()]
    if name == "subscribe":
        topics = tuple(t.strip() for t in value.split(",") if t.strip())
        if not topics:
            raise OptionError(name, value, "name at least one topic (comma-separated)")
        return Subscription(topics=topics)
    if name == "subscribePattern":
        try:
            re.compile(value)
        except re.error as exc:
            raise OptionError(name, value, f"not a regular expression: {exc}") from None
        return Subscription(pattern=value)
    assigned = _partition_json_lists(name, value)
    return Subscription(assigned=assigned)


def _partition_json_lists(name: str, value: str) -> tuple[TopicPartition, ...]:
    """``assign``: ``{"topicA": [0, 1], "topicB": [2]}``."""
    try:
        document = json.loads(value)
    except json.JSONDecodeError as exc:
        raise OptionError(name, value, f"not JSON: {exc.msg}") from None
    if not isinstance(document, dict) or not document:
        raise OptionError(name, value, 'expected {"topic": [partition, ...]}')
    result = []
    for topic, partitions in document.items():
        if not isinstance(partitions, list) or not all(
            isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in partitions
        ):
            raise OptionError(name, value, f"topic {topic!r}: expected a list of partitions")
        result += [(topic, p) for p in partitions]
    return tuple(sorted(set(result)))


@dataclass(frozen=True)
class ReadOptions:
    """The reader options of one query (batch or streaming), checked."""

    log_dir: str
    subscription: Subscription
    starting: OffsetSpec
    ending: OffsetSpec
    starting_timestamp: int | None = None
    starting_by_timestamp: PartitionOffsets | None = None
    ending_timestamp: int | None = None
    ending_by_timestamp: PartitionOffsets | None = None
    timestamp_strategy: str = "error"
    min_partitions: int | None = None
    max_offsets_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    include_headers: bool = False
    commit_group: str | None = None  # streaming: commit progress to this consumer group

    @classmethod
    def parse(cls, options: Mapping[str, str], *, streaming: bool) -> ReadOptions:
        """Check Spark's option map (keys in any case) as the Kafka source does.

        Defaults: ``startingOffsets`` earliest for batch, latest for streaming;
        ``endingOffsets`` latest (batch only); ``failOnDataLoss`` true;
        ``includeHeaders`` false; ``commitOffsets`` false (``true``: a streaming
        query commits its progress to the group ``kafka.group.id``). Other options
        Kafka takes but seglog has no use for (``kafka.*``, ``groupIdPrefix``, ...) are
        ignored, so a Kafka pipeline changes only its format and path.

        Raises:
            OptionError: a missing path or subscription, or a value Kafka refuses.
        """
        options = {k.lower(): v for k, v in options.items()}
        log_dir = options.get("path")
        if not log_dir:
            raise OptionError("path", None, "give the log directory: .load(LOGDIR)")
        starting = _offset_spec(options, "startingOffsets", "latest" if streaming else "earliest")
        if "endingoffsets" in options and streaming:
            raise OptionError(
                "endingOffsets", options["endingoffsets"], "not valid in streaming queries"
            )
        ending = _offset_spec(options, "endingOffsets", "latest")
        if not streaming:
            if starting == "latest" or (isinstance(starting, dict) and LATEST in starting.values()):
                raise OptionError(
                    "startingOffsets", options.get("startingoffsets"),
                    "latest (-1) cannot be a starting offset of a batch query",
                )  # fmt: skip
            if ending == "earliest" or (isinstance(ending, dict) and EARLIEST in ending.values()):
                raise OptionError(
                    "endingOffsets", options.get("endingoffsets"),
                    "earliest (-2) cannot be an ending offset of a batch query",
                )  # fmt: skip
        strategy = options.get("startingoffsetsbytimestampstrategy", "error").strip().lower()
        if strategy not in ("error", "latest"):
            raise OptionError(
                "startingOffsetsByTimestampStrategy", strategy, "must be error or latest"
            )
        by_ts = options.get("startingoffsetsbytimestamp")
        end_by_ts = options.get("endingoffsetsbytimestamp")
        result = cls(
            log_dir=log_dir,
            subscription=_subscription(options),
            starting=starting,
            ending=ending,
            starting_timestamp=_timestamp(options, "startingTimestamp"),
            starting_by_timestamp=None
            if by_ts is None
            else _partition_json("startingOffsetsByTimestamp", by_ts, allow_markers=False),
            ending_timestamp=None if streaming else _timestamp(options, "endingTimestamp"),
            ending_by_timestamp=None
            if end_by_ts is None or streaming
            else _partition_json("endingOffsetsByTimestamp", end_by_ts, allow_markers=False),
            timestamp_strategy=strategy,
            min_partitions=_positive_int(options, "minPartitions"),
            max_offsets_per_trigger=_positive_int(options, "maxOffsetsPerTrigger"),
            fail_on_data_loss=_bool(options, "failOnDataLoss", True),
            include_headers=_bool(options, "includeHeaders", False),
            commit_group=_commit_group(options, streaming),
        )
        return result


def _commit_group(options: Mapping[str, str], streaming: bool) -> str | None:
    # commitOffsets=true: a streaming query also commits its progress to the consumer
    # group kafka.group.id (its offsets stay in Spark's checkpoint either way). Kafka's
    # own source never commits; the group is named as Kafka's options name it.
    if not _bool(options, "commitOffsets", False):
        return None
    if not streaming:
        raise OptionError(
            "commitOffsets", options.get("commitoffsets"), "only streaming queries commit"
        )
    group = options.get("kafka.group.id", "")
    if not group:
        raise OptionError("kafka.group.id", None, "commitOffsets=true needs the group to commit to")
    return group


def partition_counts(manager: LogManager) -> dict[str, int]:
    """Partitions per topic as the directory holds them now. Cost: O(topics)."""
    return {name: manager.topic(name).partitions for name in manager.topics()}


def _check_all_given(
    name: str, spec: PartitionOffsets, partitions: Iterable[TopicPartition]
) -> None:
    # Kafka asserts the same: a JSON spec names exactly the subscribed partitions.
    wanted = set(partitions)
    if set(spec) != wanted:
        missing = sorted(wanted - set(spec))
        extra = sorted(set(spec) - wanted)
        parts = []
        if missing:
            parts.append("missing " + ", ".join(f"{t}-{p}" for t, p in missing))
        if extra:
            parts.append("not subscribed " + ", ".join(f"{t}-{p}" for t, p in extra))
        raise OptionError(
            name,
            to_json_offsets(spec),
            "give every subscribed partition, and only those (use -2 for earliest, -1 for "
            "latest): " + "; ".join(parts),
        )


def resolve_starting_offsets(
    opts: ReadOptions, manager: LogManager, partitions: Iterable[TopicPartition]
) -> PartitionOffsets:
    """Concrete starting offsets of ``partitions``, in Kafka's precedence:
    ``startingTimestamp``, then ``startingOffsetsByTimestamp``, then ``startingOffsets``.

    A timestamp resolves to the first offset whose record is at or after it; when every
    record is older, ``startingOffsetsByTimestampStrategy`` decides: ``error`` (Kafka's
    default) raises, ``latest`` takes the log end.

    Cost: O(log n) per partition for offsets, O(segments) per partition for timestamps.

    Raises:
        OptionError: a JSON spec that does not name exactly the subscribed partitions,
            or a timestamp no record matches under the ``error`` strategy.
    """
    tps = list(partitions)
    result: PartitionOffsets = {}
    by_ts: PartitionOffsets | None = None
    if opts.starting_timestamp is not None:
        by_ts = dict.fromkeys(tps, opts.starting_timestamp)
    elif opts.starting_by_timestamp is not None:
        _check_all_given("startingOffsetsByTimestamp", opts.starting_by_timestamp, tps)
        by_ts = opts.starting_by_timestamp
    if by_ts is not None:
        for tp in tps:
            log = manager.log(*tp)
            found = log.offset_for_timestamp(by_ts[tp])
            if found is None:
                if opts.timestamp_strategy == "error":
                    raise OptionError(
                        "startingOffsetsByTimestamp",
                        by_ts[tp],
                        f"no record of {tp[0]}-{tp[1]} has a timestamp at or after it (set "
                        "startingOffsetsByTimestampStrategy to latest to start at the end)",
                    )
                found = log.log_end_offset
            result[tp] = found
        return result
    spec = opts.starting
    if isinstance(spec, dict):
        _check_all_given("startingOffsets", spec, tps)
    for tp in tps:
        log = manager.log(*tp)
        wanted = (EARLIEST if spec == "earliest" else LATEST) if isinstance(spec, str) else spec[tp]
        if wanted == EARLIEST:
            result[tp] = log.log_start_offset
        elif wanted == LATEST:
            result[tp] = log.log_end_offset
        else:
            result[tp] = wanted
    return result


def resolve_ending_offsets(
    opts: ReadOptions, manager: LogManager, partitions: Iterable[TopicPartition]
) -> PartitionOffsets:
    """Concrete ending offsets (exclusive) of a batch query's ``partitions``:
    ``endingTimestamp``, then ``endingOffsetsByTimestamp``, then ``endingOffsets``.
    A timestamp after every record resolves to the log end, as in Kafka.

    Raises:
        OptionError: a JSON spec that does not name exactly the subscribed partitions.
    """
    tps = list(partitions)
    by_ts: PartitionOffsets | None = None
    if opts.ending_timestamp is not None:
        by_ts = dict.fromkeys(tps, opts.ending_timestamp)
    elif opts.ending_by_timestamp is not None:
        _check_all_given("endingOffsetsByTimestamp", opts.ending_by_timestamp, tps)
        by_ts = opts.ending_by_timestamp
    result: PartitionOffsets = {}
    spec = opts.ending
    if isinstance(spec, dict) and by_ts is None:
        _check_all_given("endingOffsets", spec, tps)
    for tp in tps:
        log = manager.log(*tp)
        if by_ts is not None:
            found = log.offset_for_timestamp(by_ts[tp])
            result[tp] = log.log_end_offset if found is None else found
            continue
        wanted = LATEST if isinstance(spec, str) else spec[tp]
        result[tp] = log.log_end_offset if wanted == LATEST else wanted
    return result


def to_json_offsets(offsets: Mapping[TopicPartition, int]) -> dict[str, dict[str, int]]:
    """``{(topic, p): n}`` to Kafka's JSON shape ``{"topic": {"p": n}}``, sorted."""
    result: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        result.setdefault(topic, {})[str(partition)] = offset
    return result


def from_json_offsets(document: Mapping[str, Mapping[str, int]]) -> PartitionOffsets:
    """The inverse of ``to_json_offsets`` (a checkpointed offset back to a map)."""
    return {
        (topic, int(partition)): int(offset)
        for topic, partitions in document.items()
        for partition, offset in partitions.items()
    }

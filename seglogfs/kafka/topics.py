"""CreateTopics (19), DeleteTopics (20), CreatePartitions (37) and DeleteRecords (21):
the admin APIs that change the topics and their logs, over ``LogManager``.

A topic created here is the same as one made by ``mkdir`` on the mount or
``seglogfs topics create``: ``num.partitions`` when the request says -1, the configs
as its overrides, rendered in the mount's default format. One broker holds one
replica: a replication factor other than -1 or 1 is ``INVALID_REPLICATION_FACTOR``,
and manual assignments must name this broker only. ``validate_only`` runs the
engine's checks (name, existence, partition count against ``max.topic.partitions``
and ``max.broker.partitions``, configs) without writing. Topic ids are not kept: a
DeleteTopics entry naming a topic by id only is ``UNKNOWN_TOPIC_ID``. DeleteRecords
moves each partition's log start offset forward (-1: to the log end) and checkpoints
it, as ``seglogfs delete-records`` does.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from storage import (
    OFFSETS_TOPIC,
    ConfigError,
    InvalidTopicError,
    LogManager,
    OffsetOutOfRangeError,
    StorageError,
    TopicExistsError,
    validate_topic_name,
)

from .broker import Broker, error_code_of
from .codec import ErrorCode, Request, build, response_class
from .configs import topic_config_entries

__all__ = [
    "handle_create_partitions",
    "handle_create_topics",
    "handle_delete_records",
    "handle_delete_topics",
]

logger = logging.getLogger(__name__)

NIL_ID = uuid.UUID(int=0)
HIGH_WATERMARK = -1
"""A DeleteRecords offset meaning the log end offset."""


def _response(request: Request, **values: Any) -> Any:
    cls = response_class(request.api_key, request.api_version)
    assert cls is not None
    return build(cls, throttle_time=0, **values)


def _config_error_code(exc: BaseException) -> ErrorCode:
    """A ``ConfigError`` as Kafka's code: a partition count is ``INVALID_PARTITIONS``,
    any other setting ``INVALID_CONFIG``."""
    if isinstance(exc, ConfigError):
        if exc.key == "partitions":
            return ErrorCode.invalid_partitions
        return ErrorCode.invalid_config
    return error_code_of(exc)


# -- CreateTopics ------------------------------------------------------------------------


async def handle_create_topics(broker: Broker, request: Request) -> Any:
    """Answer CreateTopics."""
    body = request.body
    wanted = []
    for t in body.topics:
        configs = {c.name: c.value for c in t.configs if c.value is not None}
        assignments = [list(a.broker_ids) for a in t.assignments]
        wanted.append((t.name, t.num_partitions, t.replication_factor, assignments, configs))
    seen: dict[str, int] = {}
    for name, *_ in wanted:
        seen[name] = seen.get(name, 0) + 1
    results = await broker.run_sync(
        _create_topics, broker.manager, wanted, body.validate_only, broker.node_id, seen
    )
    return _response(request, topics=results)


def _create_topics(
    manager: LogManager,
    wanted: list[tuple[str, int, int, list[list[int]], dict[str, str]]],
    validate_only: bool,
    node_id: int,
    seen: dict[str, int],
) -> list[dict[str, Any]]:
    """Each topic's result (blocking: a worker thread)."""
    results = []
    for name, count, replication, assignments, configs in wanted:
        result: dict[str, Any] = {
            "name": name,
            "topic_id": NIL_ID,
            "error_code": ErrorCode.none,
            "error_message": None,
            "num_partitions": -1,
            "replication_factor": -1,
            "configs": None,
        }
        results.append(result)
        code, message = _check_create(manager, name, count, replication, assignments, node_id)
        if code is ErrorCode.none and seen[name] > 1:
            code, message = ErrorCode.invalid_request, f"Topic {name} is named more than once."
        partitions = len(assignments) if assignments else None if count == -1 else count
        if code is ErrorCode.none:
            try:
                if validate_only:
                    _validate_create(manager, name, partitions, configs)
                else:
                    manager.create_topic(name, partitions, configs)
                    logger.info("kafka: created topic %s (CreateTopics)", name)
            except (StorageError, OSError) as exc:
                code, message = _config_error_code(exc), str(exc)
        if code is not ErrorCode.none:
            result.update(error_code=code, error_message=message)
            continue
        count_now = partitions if partitions is not None else manager.broker_config.num_partitions
        overrides = configs if validate_only else manager.topic(name).overrides
        config = manager.broker_config.topic_log_config(overrides)
        result.update(
            num_partitions=count_now,
            replication_factor=1,
            configs=[
                {
                    "name": e["name"],
                    "value": e["value"],
                    "read_only": False,
                    "config_source": e["config_source"],
                    "is_sensitive": False,
                }
                for e in topic_config_entries(manager, config, overrides, None)
            ],
        )
    return results


def _check_create(
    manager: LogManager,
    name: str,
    count: int,
    replication: int,
    assignments: list[list[int]],
    node_id: int,
) -> tuple[ErrorCode, str | None]:
    """What Kafka checks of a request before the engine's checks."""
    if name == OFFSETS_TOPIC or name in manager.topics():
        return ErrorCode.topic_already_exists, f"Topic '{name}' already exists."
    if assignments:
        if count != -1 or replication != -1:
            return (
                ErrorCode.invalid_request,
                "Both numPartitions or replicationFactor and replicasAssignments were set.",
            )
        if any(ids != [node_id] for ids in assignments):
            return (
                ErrorCode.invalid_replica_assignment,
                f"The one broker is {node_id}: each partition's replicas must be [{node_id}].",
            )
        return ErrorCode.none, None
    if count == 0 or count < -1:
        return ErrorCode.invalid_partitions, "Number of partitions must be larger than 0."
    if replication not in (-1, 1):
        return (
            ErrorCode.invalid_replication_factor,
            f"Replication factor: {replication} larger than available brokers: 1.",
        )
    return ErrorCode.none, None


def _validate_create(
    manager: LogManager, name: str, partitions: int | None, configs: dict[str, str]
) -> None:
    """``create_topic``'s checks without the create."""
    validate_topic_name(name)
    existing = manager.topics()
    if name in existing:
        raise TopicExistsError(name)
    fold = name.replace(".", "_")
    for other in existing:
        if other.replace(".", "_") == fold:
            raise InvalidTopicError(name, f"collides with existing topic {other!r}")
    broker_config = manager.broker_config
    total = sum(manager.topic(t).partitions for t in existing)
    broker_config.validated_partition_count(
        broker_config.num_partitions if partitions is None else partitions, total
    )
    broker_config.topic_log_config(configs)


# -- DeleteTopics ------------------------------------------------------------------------


async def handle_delete_topics(broker: Broker, request: Request) -> Any:
    """Answer DeleteTopics (names before v6, names or ids from v6)."""
    body = request.body
    if request.api_version >= 6:
        wanted = [(t.name, t.topic_id) for t in body.topics]
    else:
        wanted = [(name, NIL_ID) for name in body.topic_names]
    results = await broker.run_sync(_delete_topics, broker.manager, wanted)
    for result in results:
        if result["error_code"] is ErrorCode.none:
            broker.sequences.forget(result["name"])  # a topic created again starts empty
    return _response(request, responses=results)


def _delete_topics(
    manager: LogManager, wanted: list[tuple[str | None, uuid.UUID | None]]
) -> list[dict[str, Any]]:
    results = []
    for name, topic_id in wanted:
        result: dict[str, Any] = {
            "name": name,
            "topic_id": topic_id or NIL_ID,
            "error_code": ErrorCode.none,
            "error_message": None,
        }
        results.append(result)
        if name is None:
            result.update(
                error_code=ErrorCode.unknown_topic_id,
                error_message="This broker keeps no topic ids: name the topic.",
            )
            continue
        if name == OFFSETS_TOPIC:
            result.update(
                error_code=ErrorCode.invalid_request,
                error_message=f"{OFFSETS_TOPIC} holds the groups' offsets: not deleted.",
            )
            continue
        try:
            manager.delete_topic(name)
            logger.info("kafka: deleted topic %s (DeleteTopics)", name)
        except (StorageError, OSError) as exc:
            result.update(error_code=error_code_of(exc), error_message=str(exc))
    return results


# -- CreatePartitions --------------------------------------------------------------------


async def handle_create_partitions(broker: Broker, request: Request) -> Any:
    """Answer CreatePartitions."""
    body = request.body
    wanted = [
        (
            t.name,
            t.count,
            None if t.assignments is None else [list(a.broker_ids) for a in t.assignments],
        )
        for t in body.topics
    ]
    results = await broker.run_sync(
        _create_partitions, broker.manager, wanted, body.validate_only, broker.node_id
    )
    return _response(request, results=results)


def _create_partitions(
    manager: LogManager,
    wanted: list[tuple[str, int, list[list[int]] | None]],
    validate_only: bool,
    node_id: int,
) -> list[dict[str, Any]]:
    results = []
    for name, count, assignments in wanted:
        result: dict[str, Any] = {"name": name, "error_code": ErrorCode.none, "error_message": None}
        results.append(result)
        try:
            current = manager.topic(name).partitions
        except (StorageError, OSError) as exc:
            result.update(error_code=error_code_of(exc), error_message=str(exc))
            continue
        code, message = ErrorCode.none, None
        if name == OFFSETS_TOPIC:
            code, message = ErrorCode.invalid_request, f"{OFFSETS_TOPIC}: partitions are fixed."
        elif count < current:
            code = ErrorCode.invalid_partitions
            message = (
                f"Topic currently has {current} partitions, "
                f"which is higher than the requested {count}."
            )
        elif count == current:
            code = ErrorCode.invalid_partitions
            message = f"Topic already has {current} partitions."
        elif assignments is not None and (
            len(assignments) != count - current or any(ids != [node_id] for ids in assignments)
        ):
            code = ErrorCode.invalid_replica_assignment
            message = f"The one broker is {node_id}: one [{node_id}] per new partition."
        if code is ErrorCode.none:
            try:
                if validate_only:
                    manager.broker_config.validated_partition_count(
                        count - current,
                        sum(manager.topic(t).partitions for t in manager.topics()),
                    )
                    manager.broker_config.validated_partition_count(count)
                else:
                    manager.add_partitions(name, count)
                    logger.info("kafka: topic %s now has %d partitions", name, count)
            except (StorageError, OSError) as exc:
                code, message = _config_error_code(exc), str(exc)
        result.update(error_code=code, error_message=message)
    return results


# -- DeleteRecords -----------------------------------------------------------------------


async def handle_delete_records(broker: Broker, request: Request) -> Any:
    """Answer DeleteRecords."""
    wanted = [
        (t.name, p.partition_index, p.offset) for t in request.body.topics for p in t.partitions
    ]
    found = await broker.run_sync(_delete_records, broker.manager, wanted)
    topics: dict[str, list[dict[str, Any]]] = {}
    for (topic, partition, _), (code, low) in zip(wanted, found, strict=True):
        topics.setdefault(topic, []).append(
            {"partition_index": partition, "low_watermark": low, "error_code": code}
        )
    return _response(
        request, topics=[{"name": name, "partitions": parts} for name, parts in topics.items()]
    )


def _delete_records(
    manager: LogManager, wanted: list[tuple[str, int, int]]
) -> list[tuple[ErrorCode, int]]:
    """(error, low watermark) per partition; the log start offsets checkpointed once
    (blocking: a worker thread)."""
    found: list[tuple[ErrorCode, int]] = []
    for topic, partition, offset in wanted:
        try:
            log = manager.log(topic, partition)
            target = log.log_end_offset if offset == HIGH_WATERMARK else offset
            if target < 0:
                raise OffsetOutOfRangeError(offset, log.log_start_offset, log.log_end_offset)
            log.advance_log_start_offset(target)
            found.append((ErrorCode.none, log.log_start_offset))
        except (StorageError, OSError) as exc:
            found.append((error_code_of(exc), -1))
    if any(code is ErrorCode.none for code, _ in found):
        manager.checkpoint_log_start_offsets()
    return found

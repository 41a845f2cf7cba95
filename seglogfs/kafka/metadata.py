"""Metadata (key 3): the one broker, and every topic with its partitions, all led by
it (one replica, always in sync).

A request naming a missing topic creates it when the request allows it and
``auto.create.topics.enable`` is true (Kafka's default), with ``num.partitions`` and
the mount's default format, as a broker does (``auto_create``, also used by
Produce); else the topic is answered with ``UNKNOWN_TOPIC_OR_PARTITION``. Topics
carry the nil topic id: the engine keeps no topic ids (Kafka before 2.8 had none),
so the Fetch and Produce versions that need one are not advertised.
"""

from __future__ import annotations

import logging
from typing import Any

from storage import OFFSETS_TOPIC, LogManager, StorageError, TopicExistsError

from .broker import Broker, error_code_of
from .codec import ErrorCode, Request, build, response_class

__all__ = ["auto_create", "handle_metadata"]

logger = logging.getLogger(__name__)


async def handle_metadata(broker: Broker, request: Request) -> Any:
    """Answer Metadata."""
    body = request.body
    names: list[str] | None = None
    if body.topics is not None:
        names = [t.name for t in body.topics if t.name is not None]
    if request.api_version < 1 and names == []:
        names = None  # v0: an empty list means every topic
    allow_create = bool(getattr(body, "allow_auto_topic_creation", True))
    create = (
        allow_create and broker.config.auto_create_topics and not broker.read_only and bool(names)
    )
    topics = await broker.run_sync(_describe, broker.manager, names, create, broker.node_id)
    cls = response_class(3, request.api_version)
    assert cls is not None
    return build(
        cls,
        throttle_time=0,
        brokers=[
            {
                "node_id": broker.node_id,
                "host": broker.advertised_host,
                "port": broker.advertised_port,
                "rack": None,
            }
        ],
        cluster_id=broker.cluster_id,
        controller_id=broker.node_id,
        topics=topics,
        cluster_authorized_operations=-2147483648,
    )


def _describe(
    manager: LogManager, names: list[str] | None, create: bool, node_id: int
) -> list[dict[str, Any]]:
    """The topics' entries (blocking: a worker thread)."""
    existing = manager.topics()
    if names is None:
        names = existing
    known = set(existing)
    topics: list[dict[str, Any]] = []
    for name in names:
        if name not in known and create and name != OFFSETS_TOPIC:
            code = auto_create(manager, name, "Metadata")
            if code is not ErrorCode.none:
                topics.append(_topic_error(name, code))
                continue
            known.add(name)
        if name not in known:
            topics.append(_topic_error(name, ErrorCode.unknown_topic_or_partition))
            continue
        try:
            count = manager.topic(name).partitions
        except StorageError as exc:  # deleted meanwhile
            topics.append(_topic_error(name, error_code_of(exc)))
            continue
        topics.append(
            {
                "error_code": ErrorCode.none,
                "name": name,
                "is_internal": name == OFFSETS_TOPIC,
                "partitions": [_partition(p, node_id) for p in range(count)],
                "topic_authorized_operations": -2147483648,
            }
        )
    return topics


def auto_create(manager: LogManager, name: str, api: str) -> ErrorCode:
    """Create the missing topic ``name`` as ``auto.create.topics.enable`` does: with
    ``num.partitions``, no overrides, the mount's default format (blocking: a worker
    thread). ``ErrorCode.none`` also when another request created it meanwhile;
    else Kafka's code for the engine's refusal (``INVALID_TOPIC_EXCEPTION`` for a bad
    name). Callers check the setting, the mount being writable and that the topic is
    not internal."""
    try:
        metadata = manager.create_topic(name)
    except TopicExistsError:
        return ErrorCode.none
    except (StorageError, OSError) as exc:
        code = error_code_of(exc)
        logger.warning("kafka: %s could not create topic %r: %s", api, name, exc)
        return code
    logger.info(
        "kafka: created topic %s with %d partitions (auto.create.topics.enable, %s)",
        name,
        metadata.partitions,
        api,
    )
    return ErrorCode.none


def _topic_error(name: str, code: ErrorCode) -> dict[str, Any]:
    return {"error_code": code, "name": name, "partitions": []}


def _partition(partition: int, node_id: int) -> dict[str, Any]:
    return {
        "error_code": ErrorCode.none,
        "partition_index": partition,
        "leader_id": node_id,
        "leader_epoch": 0,
        "replica_nodes": [node_id],
        "isr_nodes": [node_id],
        "offline_replicas": [],
    }

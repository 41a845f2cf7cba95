"""Produce (key 0): a producer's record batches appended as a broker appends them.

Each partition's ``records`` go through ``Log.append_batches`` (the engine's path for
client-built batches: Kafka's ``LogValidator`` rules, CRC, ``max.message.bytes``, the
base offsets rewritten to the log end, the position index the mount reads kept up to
date), so a record produced here is on the mount at once, rendered in the topic's
format. ``acks`` 0 gets no response; 1 and -1 (all) are the same on a single broker
with one replica: the response goes once the batch is in the segment file (flushed
by the topic's ``flush.*`` settings, as Kafka's acks=all waits for the replicas, not
for the disk). Idempotent producers' batches pass ``producers.SequenceTable``:
a batch retried after a lost response is answered with its first offsets instead of
being appended twice, also across a daemon restart (the first Produce to a partition
reads its producers back from the log's tail: ``producers.producer_entries``). Each
partition's check, append and record run under that partition's lock, so two
connections sending the same batch cannot both append it. Transactional batches are
refused by the engine (``INVALID_RECORD``: the log keeps no transaction state).

A topic the request names that does not exist is created first when
``auto.create.topics.enable`` is true and the mount is writable (``num.partitions``
partitions, as the Metadata request a producer sends first would create it; Kafka
creates topics from Metadata only and answers such a Produce with
``UNKNOWN_TOPIC_OR_PARTITION``, which its clients retry after a Metadata request).
"""

from __future__ import annotations

import logging
import time
from typing import Any, NamedTuple

from storage import OFFSETS_TOPIC, AppendInfo, Log, LogManager, StorageError

from .broker import KAFKA_PATH, Broker, error_code_of
from .codec import ErrorCode, Request, build, response_class
from .metadata import auto_create
from .producers import AppendedBatch, identify_batches, producer_entries

__all__ = ["handle_produce"]

logger = logging.getLogger(__name__)


async def handle_produce(broker: Broker, request: Request) -> Any | None:
    """Answer Produce (None for ``acks=0``: no response is sent)."""
    body = request.body
    parts: list[tuple[str, int, bytes | None, ErrorCode, str | None]]
    if body.transactional_id is not None:
        code = ErrorCode.transactional_id_authorization_failed
        parts = [
            (t.name, p.index, None, code, "transactions are not supported")
            for t in body.topic_data
            for p in t.partition_data
        ]
    else:
        parts = [
            (t.name, p.index, p.records, ErrorCode.none, None)
            for t in body.topic_data
            for p in t.partition_data
        ]
    results: dict[tuple[str, int], dict[str, Any]] = {}
    named = {t for t, _, _, code, _ in parts if code is ErrorCode.none}
    refused = await _create_missing(broker, named)
    appended = False
    for topic, partition, records, code, message in parts:
        if topic in refused:
            code, message = refused[topic], "the topic could not be created"
        if code is not ErrorCode.none or not records:
            error = code if code is not ErrorCode.none else ErrorCode.corrupt_message
            results[(topic, partition)] = _result(partition, error, message=message)
            continue
        async with broker.partition_lock(topic, partition):
            result, added = await _produce_partition(broker, topic, partition, records)
        results[(topic, partition)] = result
        appended = appended or added
    if appended:
        broker.appends.appended()
    if body.acks == 0:
        return None
    cls = response_class(0, request.api_version)
    assert cls is not None
    responses: dict[str, list[dict[str, Any]]] = {}
    for (topic, _), result in results.items():
        responses.setdefault(topic, []).append(result)
    return build(
        cls,
        responses=[
            {"name": topic, "partition_responses": partitions}
            for topic, partitions in responses.items()
        ],
        throttle_time=0,
    )


async def _create_missing(broker: Broker, topics: set[str]) -> dict[str, ErrorCode]:
    """Create the missing ``topics`` when ``auto.create.topics.enable`` allows it; the
    codes of those that could not be created (their partitions get them)."""
    manager = broker.manager
    if not broker.config.auto_create_topics or broker.read_only:
        return {}
    refused: dict[str, ErrorCode] = {}
    for topic in sorted(topics):
        try:
            manager.topic(topic)  # a lookup in memory: no worker thread needed
            continue
        except StorageError:
            pass
        if topic == OFFSETS_TOPIC:
            continue  # internal: never created on demand (the append reports it)
        code = await broker.run_sync(auto_create, manager, topic, "Produce")
        if code is not ErrorCode.none:
            refused[topic] = code
    return refused


async def _produce_partition(
    broker: Broker, topic: str, partition: int, records: Any
) -> tuple[dict[str, Any], bool]:
    """One partition's batches through the sequence check and the append (the caller
    holds the partition's lock); its response entry and whether anything was appended."""
    identity = identify_batches(records)
    sequences = broker.sequences
    if identity.producer_id >= 0 and not sequences.loaded(topic, partition):
        await _load_producers(broker, topic, partition)
    duplicate = sequences.check(topic, partition, identity)
    if duplicate is not None and not await _loaded_log_is_current(broker, topic, partition):
        # Answered from a table of a log deleted since (rmdir/mkdir on the mount, the
        # command line): a "duplicate" would not be in this one. Read this one's.
        sequences.forget_partition(topic, partition)
        await _load_producers(broker, topic, partition)
        duplicate = sequences.check(topic, partition, identity)
    if isinstance(duplicate, ErrorCode):
        return _result(partition, duplicate), False
    if duplicate is not None:
        return _result(partition, ErrorCode.none, duplicate), False
    outcome = await broker.run_sync(_append, broker.manager, topic, partition, bytes(records))
    if not isinstance(outcome, _Appended):
        return _result(partition, outcome[0], message=outcome[1]), False
    info, log = outcome
    if broker.counters is not None:
        broker.counters.appended(topic, info.record_count, info.size, KAFKA_PATH)
    if sequences.loaded(topic, partition):
        if sequences.loaded_from(topic, partition) is log:
            sequences.record(topic, partition, identity, info.first_offset)
        else:
            # The topic was deleted and made again (rmdir/mkdir on the mount, the
            # command line) since its producers were read back: the table describes
            # another log. Read this one's (the batch just appended included).
            sequences.forget_partition(topic, partition)
            await _load_producers(broker, topic, partition)
    return _result(partition, ErrorCode.none, info.first_offset), True


async def _loaded_log_is_current(broker: Broker, topic: str, partition: int) -> bool:
    loaded = broker.sequences.loaded_from(topic, partition)
    current = await broker.run_sync(_current_log, broker.manager, topic, partition)
    return loaded is not None and loaded is current


def _current_log(manager: LogManager, topic: str, partition: int) -> Log | None:
    try:
        return manager.log(topic, partition)
    except StorageError:
        return None


async def _load_producers(broker: Broker, topic: str, partition: int) -> None:
    found = await broker.run_sync(_producer_entries, broker.manager, topic, partition)
    if found is not None:
        broker.sequences.load(topic, partition, *found)


def _producer_entries(
    manager: LogManager, topic: str, partition: int
) -> tuple[Log, list[AppendedBatch]] | None:
    """The partition's producers from its log's tail (blocking: a worker thread); None
    when there is no such partition (the append then says so). A log that cannot be
    read is logged and counts as empty: its producers' next batches are taken as they
    come, as before the table knew them."""
    try:
        log = manager.log(topic, partition)
    except StorageError:
        return None
    try:
        return log, producer_entries(log, time.time_ns() // 1_000_000)
    except (StorageError, OSError) as exc:
        logger.warning(
            "kafka: the producers of %s-%d could not be read back from the log: %s",
            topic,
            partition,
            exc,
        )
        return log, []


def _result(
    partition: int, code: ErrorCode, base_offset: int = -1, message: str | None = None
) -> dict[str, Any]:
    return {
        "index": partition,
        "error_code": code,
        "base_offset": base_offset,
        "log_append_time": -1,
        "log_start_offset": -1,
        "record_errors": [],
        "error_message": message,
    }


class _Appended(NamedTuple):
    info: AppendInfo
    log: Log


def _append(
    manager: LogManager, topic: str, partition: int, records: bytes
) -> _Appended | tuple[ErrorCode, str]:
    """Append one partition's batches (blocking: a worker thread): what was appended
    and to which log, or Kafka's error code and the reason when the engine refused
    them (nothing was appended then)."""
    try:
        log = manager.log(topic, partition)
        return _Appended(log.append_batches(records), log)
    except (StorageError, OSError) as exc:
        code = error_code_of(exc)
        if code is ErrorCode.unknown_server_error:
            logger.warning("kafka: produce to %s-%d failed: %s", topic, partition, exc)
        return code, str(exc)

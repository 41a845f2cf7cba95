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
being appended twice. Transactional batches are refused by the engine
(``INVALID_RECORD``: the log keeps no transaction state).
"""

from __future__ import annotations

import logging
from typing import Any

from storage import AppendInfo, LogManager, StorageError

from .broker import KAFKA_PATH, Broker, error_code_of
from .codec import ErrorCode, Request, build, response_class
from .producers import identify_batches

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
    appended = False
    for topic, partition, records, code, message in parts:
        if code is not ErrorCode.none or not records:
            error = code if code is not ErrorCode.none else ErrorCode.corrupt_message
            results[(topic, partition)] = _result(partition, error, message=message)
            continue
        identity = identify_batches(records)
        duplicate = broker.sequences.check(topic, partition, identity)
        if isinstance(duplicate, ErrorCode):
            results[(topic, partition)] = _result(partition, duplicate)
            continue
        if duplicate is not None:
            results[(topic, partition)] = _result(partition, ErrorCode.none, duplicate)
            continue
        outcome = await broker.run_sync(_append, broker.manager, topic, partition, bytes(records))
        if isinstance(outcome, AppendInfo):
            appended = True
            if broker.counters is not None:
                broker.counters.appended(topic, outcome.record_count, outcome.size, KAFKA_PATH)
            broker.sequences.record(topic, partition, identity, outcome.first_offset)
            results[(topic, partition)] = _result(partition, ErrorCode.none, outcome.first_offset)
        else:
            results[(topic, partition)] = _result(partition, outcome[0], message=outcome[1])
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


def _append(
    manager: LogManager, topic: str, partition: int, records: bytes
) -> AppendInfo | tuple[ErrorCode, str]:
    """Append one partition's batches (blocking: a worker thread); Kafka's error code
    and the reason when the engine refused them (nothing was appended then)."""
    try:
        return manager.log(topic, partition).append_batches(records)
    except (StorageError, OSError) as exc:
        code = error_code_of(exc)
        if code is ErrorCode.unknown_server_error:
            logger.warning("kafka: produce to %s-%d failed: %s", topic, partition, exc)
        return code, str(exc)

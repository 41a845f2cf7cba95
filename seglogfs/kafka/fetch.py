"""Fetch (key 1): the stored batches, byte for byte, from the one holding the fetch
offset.

A segment's batches are what Kafka's consumers read (the engine writes Kafka's
format), so a partition's answer is the stored bytes of whole batches, as Kafka sends
them: starting with the batch that holds ``fetch_offset`` (consumers skip the records
before it), up to ``partition_max_bytes`` per partition and ``max_bytes`` per response,
and always the first batch of the response even when it alone is larger (KIP-74), so
a consumer never stalls on a large batch. Legacy v0/v1 message sets (a broker's copied
directory) are served as stored. Each batch's CRC is checked as the engine reads it:
a damaged batch is never served (the batches before it are; then
``CORRUPT_MESSAGE``). The bytes are sent as they lie in the segment files, with
``os.sendfile`` (``Log.fetch``, ``send``): the daemon checks them but never copies
runs of 64 KiB or more, and holds no response in memory.

``min_bytes`` and ``max_wait_ms``: a response with fewer bytes than ``min_bytes``
waits for appends until ``max_wait_ms`` (woken by Produce requests at once, and by
polling for appends made through the mount; see ``AppendSignal``). Fetch sessions
(KIP-227) are not kept: every request is a full one (session id 0), which clients
accept.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import trio

from storage import (
    CorruptRecordError,
    FetchData,
    LogManager,
    OffsetOutOfRangeError,
    StorageError,
)

from .broker import Broker, error_code_of
from .codec import ErrorCode, Request, build, response_class

__all__ = ["handle_fetch"]


@dataclass
class _Wanted:
    topic: str
    partition: int
    offset: int
    max_bytes: int


@dataclass
class _Answer:
    topic: str
    partition: int
    code: ErrorCode
    high_watermark: int = -1
    log_start_offset: int = -1
    records: FetchData = field(default_factory=FetchData)


async def handle_fetch(broker: Broker, request: Request) -> Any:
    """Answer Fetch, waiting for ``min_bytes`` up to ``max_wait_ms``."""
    body = request.body
    wanted = [
        _Wanted(t.topic, p.partition, p.fetch_offset, p.partition_max_bytes)
        for t in body.topics
        for p in t.partitions
    ]
    max_wait_s = body.max_wait.total_seconds()
    # The broker's fetch.max.bytes bounds what one response holds, as Kafka's does.
    max_bytes = min(body.max_bytes, broker.config.fetch_max_bytes)
    deadline = trio.current_time() + max(0.0, max_wait_s)
    while True:
        answers = await broker.run_sync(_read, broker.manager, wanted, max_bytes)
        size = sum(len(a.records) for a in answers)
        errors = any(a.code is not ErrorCode.none for a in answers)
        if size >= max(1, body.min_bytes) or errors or trio.current_time() >= deadline:
            break
        _close(answers)
        await broker.appends.wait(deadline)
    try:
        counters = broker.counters  # None unless the daemon serves metrics
        if counters is not None:
            for a in answers:
                if a.records:
                    counters.fetched(a.topic, len(a.records))
        cls = response_class(1, request.api_version)
        assert cls is not None
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for a in answers:
            by_topic.setdefault(a.topic, []).append(
                {
                    "partition_index": a.partition,
                    "error_code": a.code,
                    "high_watermark": a.high_watermark,
                    "last_stable_offset": a.high_watermark,
                    "log_start_offset": a.log_start_offset,
                    "aborted_transactions": [],
                    "preferred_read_replica": -1,
                    # Encoded without a copy: the frame sends its regions from the
                    # segment files (``send``), and closes them.
                    "records": a.records,
                }
            )
        return build(
            cls,
            throttle_time=0,
            error_code=ErrorCode.none,
            session_id=0,
            responses=[{"topic": t, "partitions": parts} for t, parts in by_topic.items()],
        )
    except BaseException:
        _close(answers)
        raise


def _close(answers: list[_Answer]) -> None:
    for a in answers:
        a.records.close()


def _read(manager: LogManager, wanted: list[_Wanted], max_bytes: int) -> list[_Answer]:
    """Every partition's batches (blocking: a worker thread)."""
    answers: list[_Answer] = []
    budget = max_bytes
    try:
        for w in wanted:
            first = not any(a.records for a in answers)
            answer = _read_partition(manager, w, budget, first=first)
            budget -= len(answer.records)
            answers.append(answer)
    except BaseException:
        _close(answers)
        raise
    return answers


def _read_partition(manager: LogManager, w: _Wanted, budget: int, *, first: bool) -> _Answer:
    try:
        log = manager.log(w.topic, w.partition)
    except StorageError as exc:
        return _Answer(w.topic, w.partition, error_code_of(exc))
    start, end = log.log_start_offset, log.log_end_offset
    answer = _Answer(w.topic, w.partition, ErrorCode.none, end, start)
    if not start <= w.offset <= end:
        answer.code = ErrorCode.offset_out_of_range
        return answer
    if w.offset == end:
        return answer
    try:
        # The response's first batch goes whole even when over the limit (KIP-74).
        answer.records = log.fetch(w.offset, min(w.max_bytes, budget), min_one_batch=first)
    except OffsetOutOfRangeError:  # retention moved the start past the offset meanwhile
        answer.code = ErrorCode.offset_out_of_range
        answer.log_start_offset = log.log_start_offset
    except CorruptRecordError:
        answer.code = ErrorCode.corrupt_message
    return answer

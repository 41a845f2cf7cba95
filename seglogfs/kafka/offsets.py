"""ListOffsets (2), OffsetCommit (8) and OffsetFetch (9): offsets of the log and the
offsets groups committed.

ListOffsets answers ``-2`` (earliest: the log start offset), ``-1`` (latest: the log
end offset) and a timestamp (the first offset whose record's timestamp is at or after
it, through the time index, with that record's timestamp; ``-1`` when every record is
older); ``-3`` (the record with the largest timestamp, v7) is answered with the last
offset. Commits and fetched commits are the directory's ``OffsetStore``'s
(``__consumer_offsets``), as ``seglogfs groups`` shows them.
"""

from __future__ import annotations

from typing import Any

from storage import LogManager, OffsetStore, StorageError

from .broker import Broker, error_code_of
from .codec import ErrorCode, Request, build, response_class

__all__ = ["handle_list_offsets", "handle_offset_commit", "handle_offset_fetch"]

EARLIEST = -2
LATEST = -1
MAX_TIMESTAMP = -3


def _response(request: Request, **values: Any) -> Any:
    cls = response_class(request.api_key, request.api_version)
    assert cls is not None
    return build(cls, throttle_time=0, **values)


async def handle_list_offsets(broker: Broker, request: Request) -> Any:
    """Answer ListOffsets."""
    wanted = [
        (t.name, p.partition_index, p.timestamp) for t in request.body.topics for p in t.partitions
    ]
    found = await broker.run_sync(_list_offsets, broker.manager, wanted)
    topics: dict[str, list[dict[str, Any]]] = {}
    for (topic, partition, _), (code, timestamp, offset) in zip(wanted, found, strict=True):
        topics.setdefault(topic, []).append(
            {
                "partition_index": partition,
                "error_code": code,
                "timestamp": timestamp,
                "offset": offset,
                "leader_epoch": 0 if code is ErrorCode.none else -1,
            }
        )
    return _response(
        request, topics=[{"name": name, "partitions": parts} for name, parts in topics.items()]
    )


def _list_offsets(
    manager: LogManager, wanted: list[tuple[str, int, int]]
) -> list[tuple[ErrorCode, int, int]]:
    """(error, timestamp, offset) per partition (blocking: a worker thread)."""
    found: list[tuple[ErrorCode, int, int]] = []
    for topic, partition, timestamp in wanted:
        try:
            log = manager.log(topic, partition)
            if timestamp == EARLIEST:
                found.append((ErrorCode.none, -1, log.log_start_offset))
            elif timestamp == LATEST:
                found.append((ErrorCode.none, -1, log.log_end_offset))
            elif timestamp == MAX_TIMESTAMP:
                end = log.log_end_offset
                last = end - 1 if end > log.log_start_offset else -1
                found.append((ErrorCode.none, log.last_timestamp() if last >= 0 else -1, last))
            else:
                offset = log.offset_for_timestamp(timestamp)
                if offset is None:
                    found.append((ErrorCode.none, -1, -1))
                else:
                    records = log.read(offset, 1)
                    stamp = records[0].timestamp if records else timestamp
                    found.append((ErrorCode.none, stamp, offset))
        except (StorageError, OSError) as exc:
            found.append((error_code_of(exc), -1, -1))
    return found


async def handle_offset_commit(broker: Broker, request: Request) -> Any:
    """Answer OffsetCommit."""
    body = request.body
    offsets: dict[tuple[str, int], int] = {}
    metadata: dict[tuple[str, int], str] = {}
    for t in body.topics:
        for p in t.partitions:
            offsets[(t.name, p.partition_index)] = p.committed_offset
            metadata[(t.name, p.partition_index)] = p.committed_metadata or ""
    generation = getattr(body, "generation_id_or_member_epoch", None)
    if generation is None:
        generation = body.generation_id
    results = await broker.groups.commit(
        body.group_id, generation, body.member_id, offsets, metadata
    )
    topics: dict[str, list[dict[str, Any]]] = {}
    for (topic, partition), code in results.items():
        topics.setdefault(topic, []).append({"partition_index": partition, "error_code": code})
    return _response(
        request, topics=[{"name": name, "partitions": parts} for name, parts in topics.items()]
    )


async def handle_offset_fetch(broker: Broker, request: Request) -> Any:
    """Answer OffsetFetch (one group before v8, a list of groups from v8)."""
    body = request.body
    store = broker.groups.store
    if request.api_version >= 8:
        groups = []
        for g in body.groups:
            topics = (
                None
                if g.topics is None
                else [(t.name, list(t.partition_indexes)) for t in g.topics]
            )
            answer = await broker.run_sync(_fetch_group, store, g.group_id, topics)
            groups.append({"group_id": g.group_id, "topics": answer, "error_code": ErrorCode.none})
        return _response(request, groups=groups)
    topics = (
        None if body.topics is None else [(t.name, list(t.partition_indexes)) for t in body.topics]
    )
    answer = await broker.run_sync(_fetch_group, store, body.group_id, topics)
    return _response(request, topics=answer, error_code=ErrorCode.none)


def _fetch_group(
    store: OffsetStore, group: str, topics: list[tuple[str, list[int]]] | None
) -> list[dict[str, Any]]:
    """The committed offsets asked for (all of the group's when ``topics`` is None);
    -1 for a partition without one (blocking: a worker thread)."""
    committed = store.committed(group) if group else {}
    if topics is None:
        by_topic: dict[str, list[int]] = {}
        for topic, partition in sorted(committed):
            by_topic.setdefault(topic, []).append(partition)
        topics = list(by_topic.items())
    answer = []
    for topic, partitions in topics:
        parts = []
        for partition in partitions:
            value = committed.get((topic, partition))
            parts.append(
                {
                    "partition_index": partition,
                    "committed_offset": -1 if value is None else value.offset,
                    "committed_leader_epoch": -1 if value is None else value.leader_epoch,
                    "metadata": "" if value is None else value.metadata,
                    "error_code": ErrorCode.none,
                }
            )
        answer.append({"name": topic, "partitions": parts})
    return answer

"""The write path of ``json`` topics: each complete line written is one record object.

A line is what the topic's files show of a record (``storage.record.json_format``):
``{"key": ..., "value": ..., "headers": [...], "timestamp": ...}``, base64 objects for
bytes that are not UTF-8; ``topic``, ``partition``, ``offset`` and ``timestampType``
are ignored, so the lines ``cat`` prints of one partition append as they are to
another. Everything complete in one ``write()`` is parsed before anything is appended:
a line that is no such object refuses the whole write (``JsonRecordError``, ``EINVAL``
at the writer) with nothing appended. Partial lines wait in the open file's
``LineBuffer`` as for ``lines`` topics.

On a partition file the records are one ``Log.append`` (one ``write`` of the segment
file; batches cut at ``max.message.bytes`` by the engine). On ``produce``, keyed
records go to ``murmur2(key) % partitions``, keyless ones to this write's sticky
partition, each partition's records one append after every partition has reserved its
room (all or nothing, as ``produce_lines``). The position index's units are measured by
the engine (a record's line holds its offset, known only at append).

Thread-safe as far as the engine is; callers serialise the requests of one open file.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from storage import (
    AppendInfo,
    CompressionType,
    Log,
    RecordTooLargeError,
    StickyPartitioner,
    build_record_batch,
    partition_for_key,
)
from storage.record.json_format import JsonRecords, parse_json_lines

from .lines import RecordLimit, _codec_growth, room_estimate

__all__ = ["append_json"]

_NEWLINE = b"\n"
_HEADER_OVERHEAD = 10
"""Bytes a v2 header adds to its key and value at most (two length varints)."""


def append_json(
    logs: Callable[[int], Log],
    partitions: int,
    data: bytes,
    limit: RecordLimit,
    *,
    partition: int | None,
    sticky: StickyPartitioner | None,
) -> list[tuple[int, AppendInfo]]:
    """Append the records of the complete ``json`` lines of ``data`` (which ends with
    ``\\n``) to ``partition``, or, when it is None, partitioned as ``produce_lines``
    does with ``sticky``; return ``(partition, AppendInfo)`` for each append. Writes
    are all or nothing: ``len(data)`` bytes were appended when this returns.

    Cost: O(bytes): one ``json.loads`` per line, murmur2 per key, one build of the
    batches, then one measure (rendering) of them for the position index.

    Raises:
        JsonRecordError: a line is not a record object; nothing appended.
        RecordTooLargeError: a record exceeds ``max.message.bytes``; nothing appended
            (checked before any partition's append when the write spans several).
        OSError: ``ENOSPC``: a partition has no room; nothing appended.
        ReadOnlyLogError: the log is read-only or closed.
    """
    lines = data.split(_NEWLINE)
    lines.pop()  # after the final newline
    first = logs(0 if partition is None else partition)
    records = parse_json_lines(lines, first.clock.milliseconds())
    groups: dict[int, list[int]] = {}
    if partition is not None:
        groups[partition] = list(range(len(records.values)))
    else:
        assert sticky is not None
        keyless = sticky.partition()
        sticky.next_batch()
        for i, key in enumerate(records.keys):
            p = keyless if key is None else partition_for_key(key, partitions)
            groups.setdefault(p, []).append(i)
    if len(groups) > 1:
        # A record the engine refuses after other partitions' appends would leave the
        # write half done: refuse it first (one partition's append is all or nothing).
        # Exact: a record whose bound (with a codec's worst growth) does not fit is
        # built as the engine will build it.
        for i, value in enumerate(records.values):
            bound = _record_batch_size(records, i, value)
            if limit.codec is not CompressionType.NONE:
                bound += _codec_growth(bound)
            if bound <= limit.max_message_bytes:
                continue
            size = len(
                build_record_batch(
                    [value],
                    keys=[records.keys[i]],
                    headers=[records.headers[i]],
                    timestamps=records.timestamps[i],
                    codec=limit.codec,
                )
            )
            if size > limit.max_message_bytes:
                raise RecordTooLargeError(size, limit.max_message_bytes)
    infos: list[tuple[int, AppendInfo]] = []
    with contextlib.ExitStack() as reserved:
        if len(groups) > 1:
            # Room in every partition first: a full disk refuses the whole write, or the
            # writer's retry would append again the records of the partitions before.
            for p in sorted(groups):
                count = len(groups[p])
                room = room_estimate(len(data), count, limit.codec)
                reserved.enter_context(logs(p).reserved(room, count))
        for p in sorted(groups):
            chosen = groups[p]
            info = logs(p).append(
                [records.values[i] for i in chosen],
                keys=[records.keys[i] for i in chosen],
                headers=[records.headers[i] for i in chosen],
                timestamps=[records.timestamps[i] for i in chosen],
            )
            infos.append((p, info))
    return infos


def _record_batch_size(records: JsonRecords, i: int, value: bytes | None) -> int:
    # An upper bound of the one-record batch: RecordLimit's exact size of key and value
    # plus each header's bytes and lengths (a timestamp delta needs at most 10 bytes).
    size = RecordLimit.batch_size(records.keys[i], value or b"") + 10
    for key, header_value in records.headers[i]:
        size += len(key.encode("utf-8")) + len(header_value or b"") + _HEADER_OVERHEAD
    return size

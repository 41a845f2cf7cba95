"""The one produce path of a seglogfs log directory, whoever writes it.

``seglogfs produce`` on a directory it opened itself, the control socket's server for
a client of a running daemon, and the Spark sink all append through
``append_records``, so the partitions, offsets and errors are the same on every path,
and every path hands the engine the records' rendered size (``rendered_units``), which
keeps the file system's position index (``seglogfs.positions``) in step.

Thread-safe as far as the engine is (each ``Log`` serialises its own appends); a
``StickyPartitioner`` passed in is the caller's to guard.
"""

from __future__ import annotations

from collections.abc import Sequence

from storage import (
    Header,
    LogManager,
    StickyPartitioner,
    TopicMetadata,
    UnknownTopicError,
    partition_for_key,
)

__all__ = ["append_records", "rendered_units", "split_keys"]


def append_records(
    manager: LogManager,
    topic: str,
    values: Sequence[bytes | None],
    *,
    keys: Sequence[bytes | None] | None = None,
    headers: Sequence[Sequence[Header]] | None = None,
    timestamps: Sequence[int] | None = None,
    partition: int | None = None,
    partitioner: StickyPartitioner | None = None,
) -> list[tuple[int, int, int]]:
    """Append one producer call's records; return (partition, first, last offset) for
    each partition written, in partition order.

    This is the single produce path: ``seglogfs produce`` calls it on a log directory
    it opened itself, and the control server calls it for a client, so both give the
    same partitions, offsets and errors. Without ``partition``, a record with a key
    goes to ``toPositive(murmur2(key)) % partitions`` (Kafka's producer) and keyless
    records go to the ``partitioner``'s sticky partition, which moves on after the
    call (one call is one producer batch).

    Cost: O(records) to partition (murmur2 per key), then one ``Log.append`` per
    partition written.

    Raises:
        UnknownTopicError: no such topic or partition.
        RecordTooLargeError: a record over ``max.message.bytes`` (that partition's
            records are not appended; partitions written before it stay written).
        ReadOnlyLogError: the manager is read-only or closed.
        OSError: the write failed (e.g. ENOSPC); nothing of that partition appended.
    """
    metadata = manager.topic(topic)
    n = len(values)
    if n == 0:
        return []
    if partition is not None:
        if not 0 <= partition < metadata.partitions:
            raise UnknownTopicError(topic, partition)
        groups: dict[int, list[int] | None] = {partition: None}
    else:
        sticky = partitioner if partitioner is not None else StickyPartitioner(metadata.partitions)
        if sticky.num_partitions != metadata.partitions:
            sticky = StickyPartitioner(metadata.partitions)
        if keys is None or all(key is None for key in keys):
            groups = {sticky.partition(): None}
        else:
            count = metadata.partitions
            sticky_partition = sticky.partition()
            groups = {}
            for i, key in enumerate(keys):
                p = sticky_partition if key is None else partition_for_key(key, count)
                indices = groups.setdefault(p, [])
                assert indices is not None
                indices.append(i)
        sticky.next_batch()
    written = []
    for p in sorted(groups):
        indices = groups[p]
        log = manager.log(topic, p)
        if indices is None or len(indices) == n:
            info = log.append(
                values,
                keys=keys,
                timestamps=timestamps,
                headers=headers,
                units=rendered_units(metadata, values, keys),
            )
        else:
            part_values = [values[i] for i in indices]
            part_keys = None if keys is None else [keys[i] for i in indices]
            info = log.append(
                part_values,
                keys=part_keys,
                timestamps=None if timestamps is None else [timestamps[i] for i in indices],
                headers=None if headers is None else [headers[i] for i in indices],
                units=rendered_units(metadata, part_values, part_keys),
            )
        written.append((p, info.first_offset, info.last_offset))
    return written


def rendered_units(
    metadata: TopicMetadata,
    values: Sequence[bytes | None],
    keys: Sequence[bytes | None] | None,
) -> int | None:
    """The bytes these records add to the partition file (SPEC §3, as
    ``storage.record.render`` renders them), handed to ``Log.append(units=)`` so the engine
    need not decode the batch it just encoded to measure it. ``seglogfs verify``
    recomputes every position from ``storage.record.render`` and reports any difference.
    None for a ``json`` topic: its lines hold the offsets the append assigns, so the
    engine measures the batches it built (``position_index_spec``).

    Cost: O(records), with no object per record.
    """
    if metadata.format == "json":
        return None
    if None in values:
        total = sum(len(value) for value in values if value is not None)
    else:
        total = sum(map(len, values))  # type: ignore[arg-type]
    if metadata.format == "raw":
        return total
    total += len(values)  # one newline per record
    separator = metadata.key_separator
    if separator is not None and keys is not None:
        width = len(separator.encode())
        total += sum(len(key) + width for key in keys if key is not None)
    return total


def split_keys(
    lines: Sequence[bytes | None], separator: bytes
) -> tuple[list[bytes | None], list[bytes | None]]:
    """``(keys, values)`` of lines whose key ends at the first ``separator`` (a topic's
    ``key.separator``, ``seglogfs produce -K``): a line without it has a null key and
    is all value, so it renders back exactly as written.

    Cost: O(bytes), one ``bytes`` object per key and value.
    """
    keys: list[bytes | None] = []
    values: list[bytes | None] = []
    for line in lines:
        assert line is not None
        key, found, value = line.partition(separator)
        if found:
            keys.append(key)
            values.append(value)
        else:
            keys.append(None)
            values.append(line)
    return keys, values

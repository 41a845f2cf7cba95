"""The write path: bytes written to a partition or ``produce`` file become records.

``lines`` topics: each complete line is one record (value = the line without its
``\\n``; with a ``key.separator``, the text before the first separator is the key). A
write's trailing partial line waits in the open file's ``LineBuffer`` until its newline
or until close. Everything complete in one ``write()`` is one ``Log.append`` call: one
batch (several only when one would exceed ``max.message.bytes``), written with one
``write`` by the engine, so concurrent writers never interleave inside a line and a
failure appends nothing. ``raw`` topics: each ``write()`` is one record.

The units passed to the engine's position index are the rendered size of the records,
which for complete lines is exactly the bytes written (``key<sep>value\\n`` renders as
it was written); a final line without its newline renders one byte longer.

Thread-safe as far as the engine is (each ``Log`` serialises its appends); a
``LineBuffer`` belongs to one open file, whose requests the daemon runs one at a time.
"""

from __future__ import annotations

from collections.abc import Callable

from storage import (
    AppendInfo,
    Log,
    RecordTooLargeError,
    StickyPartitioner,
    StorageError,
    partition_for_key,
)

from ..producer import split_keys

__all__ = ["LineBuffer", "append_lines", "append_raw", "produce_lines", "split_lines"]

_NEWLINE = b"\n"
RECORD_OVERHEAD = 16
"""Bytes a v2 record adds to its key and value at most, for lines under 2 MiB: length,
attributes, timestamp and offset deltas, key and value lengths, header count."""
BATCH_OVERHEAD = 61


def split_lines(
    data: bytes, separator: bytes | None
) -> tuple[list[bytes | None], list[bytes | None] | None]:
    """``(values, keys)`` of the complete lines in ``data`` (which ends with ``\\n``);
    ``keys`` is ``None`` when the topic has no separator.

    Cost: O(bytes), one ``bytes`` object per line (the engine's append takes a list).
    """
    lines: list[bytes | None] = list(data.split(_NEWLINE))
    lines.pop()  # after the final newline
    if separator is None:
        return lines, None
    keys, values = split_keys(lines, separator)
    return values, keys


def batch_estimate(data_bytes: int, records: int) -> int:
    """An upper estimate of the v2 batch holding ``records`` lines of ``data_bytes``."""
    return data_bytes + RECORD_OVERHEAD * records + BATCH_OVERHEAD


def line_chunks(data: bytes, limit: int) -> list[bytes]:
    """``data`` (complete lines) cut at line ends into pieces whose batches fit
    ``limit`` (``max.message.bytes``) by ``batch_estimate``, of about equal size.

    Cost: O(pieces) searches for a newline, no object per line.
    """
    estimate = batch_estimate(len(data), data.count(_NEWLINE))
    pieces = -(-estimate // max(limit - BATCH_OVERHEAD, 1))
    if pieces <= 1:
        return [data]
    chunks = []
    start = 0
    for j in range(1, pieces):
        cut = data.find(_NEWLINE, max(start, j * len(data) // pieces)) + 1
        if cut <= start:
            continue
        chunks.append(data[start:cut])
        start = cut
    if start < len(data):
        chunks.append(data[start:])
    return chunks


def append_lines(log: Log, data: bytes, separator: bytes | None) -> tuple[int, list[AppendInfo]]:
    """Append the complete lines of ``data`` (ending with ``\\n``); return how many bytes
    of ``data`` were appended, and what each append did.

    Lines whose batch fits ``max.message.bytes`` are one append: one batch, one
    ``write``, all or nothing. More lines are cut into pieces that each fit (the engine
    would build the whole batch before splitting it), appended in order; if a later
    piece fails, the count says how far it got: the caller answers a short write (the
    writer retries the rest and gets the error), so no line is ever appended twice or
    reported lost.

    Raises:
        RecordTooLargeError: a line's record exceeds ``max.message.bytes``; nothing
            appended.
        OSError: the write failed (``ENOSPC``); nothing appended.
        ReadOnlyLogError: the log is read-only or closed.
    """
    appended = 0
    infos: list[AppendInfo] = []
    for chunk in line_chunks(data, log.config.max_message_bytes):
        values, keys = split_lines(chunk, separator)
        try:
            infos.append(log.append(values, keys=keys, units=len(chunk)))
        except (StorageError, OSError):
            if not appended:
                raise
            break
        appended += len(chunk)
    return appended, infos


def append_raw(log: Log, data: bytes) -> AppendInfo:
    """Append ``data`` as one record (the ``raw`` format). Raises: as ``append_lines``."""
    return log.append([data], units=len(data))


def produce_lines(
    logs: Callable[[int], Log],
    partitions: int,
    data: bytes,
    separator: bytes | None,
    sticky: StickyPartitioner,
) -> tuple[int, list[tuple[int, AppendInfo]]]:
    """Append the complete lines of ``data`` to a topic, partitioned as Kafka's Java
    producer does: a keyed line to ``murmur2(key) % partitions``, keyless lines to the
    sticky partition of this write (the next write moves to another one).

    Keyless lines are appended as ``append_lines`` does (a count short of ``len(data)``
    means a short write); keyed lines with one append per partition written, in
    partition order. Returns the bytes of ``data`` appended and ``(partition,
    AppendInfo)`` for each append. ``logs(p)`` gives partition ``p``'s log.

    Raises:
        RecordTooLargeError, OSError, ReadOnlyLogError: as ``append_lines``; appends to
            partitions earlier in the order may have happened.
    """
    keyless = sticky.partition()
    if separator is None:
        # No keys: the whole write goes to this write's sticky partition.
        sticky.next_batch()
        appended, keyless_infos = append_lines(logs(keyless), data, None)
        return appended, [(keyless, info) for info in keyless_infos]
    values, keys = split_lines(data, separator)
    groups: dict[int, tuple[list[bytes | None], list[bytes | None], list[int]]] = {}
    for i, value in enumerate(values):
        key = None if keys is None else keys[i]
        partition = keyless if key is None else partition_for_key(key, partitions)
        group = groups.get(partition)
        if group is None:
            group = groups[partition] = ([], [], [0])
        group[0].append(value)
        group[1].append(key)
        # The rendered size of this line is what was written: key, separator, value, \n.
        size = len(value) if value is not None else 0
        if key is not None and separator is not None:
            size += len(key) + len(separator)
        group[2][0] += size + 1
    sticky.next_batch()
    infos: list[tuple[int, AppendInfo]] = []
    for partition in sorted(groups):
        group_values, group_keys, units = groups[partition]
        info = logs(partition).append(
            group_values, keys=None if keys is None else group_keys, units=units[0]
        )
        infos.append((partition, info))
    return len(data), infos


class LineBuffer:
    """The partial line of one open file, kept until its newline or close.

    ``split(data)`` returns the complete lines to append now (``pending + data`` up to
    the last newline) without changing the buffer; ``commit`` keeps the new tail once
    the append succeeded, so a refused write leaves the buffer as it was.
    """

    __slots__ = ("pending",)

    def __init__(self) -> None:
        self.pending = b""

    def split(self, data: bytes, limit: int) -> tuple[bytes, bytes]:
        """``(complete, tail)``: the lines ending in ``data`` and the new partial line.

        Raises:
            RecordTooLargeError: the partial line already exceeds ``limit``
                (``max.message.bytes``): it could never be appended.
        """
        cut = data.rfind(_NEWLINE)
        if cut < 0:
            complete, tail = b"", self.pending + data
        elif cut == len(data) - 1:
            complete, tail = (self.pending + data if self.pending else data), b""
        else:
            complete, tail = self.pending + data[: cut + 1], data[cut + 1 :]
        if len(tail) > limit:
            raise RecordTooLargeError(len(tail), limit)
        return complete, tail

    def commit(self, tail: bytes) -> None:
        self.pending = tail

    def completed(self) -> bytes:
        """The pending partial line completed with a newline (empty when none): what
        close and fsync append, then ``commit(b"")``."""
        return self.pending + _NEWLINE if self.pending else b""

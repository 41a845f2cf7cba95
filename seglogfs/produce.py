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

from storage import AppendInfo, Log, RecordTooLargeError, StickyPartitioner, partition_for_key

__all__ = ["LineBuffer", "append_lines", "append_raw", "produce_lines", "split_lines"]

_NEWLINE = b"\n"


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
    return values, keys


def append_lines(log: Log, data: bytes, separator: bytes | None) -> AppendInfo:
    """Append the complete lines of ``data`` (ending with ``\\n``) as one call.

    Raises:
        RecordTooLargeError: a line's record exceeds ``max.message.bytes``; nothing
            appended.
        OSError: the write failed (``ENOSPC``); nothing appended.
        ReadOnlyLogError: the log is read-only or closed.
    """
    values, keys = split_lines(data, separator)
    return log.append(values, keys=keys, units=len(data))


def append_raw(log: Log, data: bytes) -> AppendInfo:
    """Append ``data`` as one record (the ``raw`` format). Raises: as ``append_lines``."""
    return log.append([data], units=len(data))


def produce_lines(
    logs: Callable[[int], Log],
    partitions: int,
    data: bytes,
    separator: bytes | None,
    sticky: StickyPartitioner,
) -> list[tuple[int, AppendInfo]]:
    """Append the complete lines of ``data`` to a topic, partitioned as Kafka's Java
    producer does: a keyed line to ``murmur2(key) % partitions``, keyless lines to the
    sticky partition of this write (the next write moves to another one).

    One append per partition written, in partition order; returns ``(partition,
    AppendInfo)`` for each. ``logs(p)`` gives partition ``p``'s log.

    Raises:
        RecordTooLargeError, OSError, ReadOnlyLogError: as ``append_lines``; appends to
            partitions earlier in the order may have happened.
    """
    values, keys = split_lines(data, separator)
    keyless = sticky.partition()
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
    infos = []
    for partition in sorted(groups):
        group_values, group_keys, units = groups[partition]
        info = logs(partition).append(
            group_values, keys=None if keys is None else group_keys, units=units[0]
        )
        infos.append((partition, info))
    return infos


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

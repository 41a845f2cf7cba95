"""The write path: bytes written to a partition or ``produce`` file become records.

``lines`` topics: each complete line is one record (value = the line without its
``\\n``; with a ``key.separator``, the text before the first separator is the key). A
write's trailing partial line waits in the open file's ``LineBuffer`` until its newline,
or until the last close of the open file (``release``) or ``fsync`` makes it a record of
its own; a write is refused (``RecordTooLargeError``) when the partial line it leaves
could not be that one record (``RecordLimit``), so bytes a write accepted are never
dropped at close. Everything complete in one ``write()`` is one ``Log.append`` call:
one batch (several only when one would exceed ``max.message.bytes``), written with one
``write`` by the engine, so concurrent writers never interleave inside a line and a
failure appends nothing. ``raw`` topics: each ``write()`` is one record, or, when that
record would exceed ``max.message.bytes``, the fewest records of about equal size that
fit (``raw_pieces``), appended by one ``Log.append``: one ``write`` of the segment file,
all or nothing.

The units passed to the engine's position index are the rendered size of the records,
which for complete lines is exactly the bytes written (``key<sep>value\\n`` renders as
it was written); a final line without its newline renders one byte longer.

Thread-safe as far as the engine is (each ``Log`` serialises its appends); a
``LineBuffer`` belongs to one open file, whose requests the daemon runs one at a time.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from storage import (
    AppendInfo,
    CompressionType,
    Log,
    LogConfig,
    RecordTooLargeError,
    StickyPartitioner,
    StorageError,
    TopicMetadata,
    build_record_batch,
    partition_for_key,
)

from ..producer import split_keys

__all__ = [
    "LineBuffer",
    "RecordLimit",
    "append_lines",
    "append_raw",
    "produce_lines",
    "raw_pieces",
    "room_estimate",
    "split_lines",
]

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


def room_estimate(data_bytes: int, records: int, codec: CompressionType) -> int:
    """An upper bound of the bytes the batches of ``records`` lines of ``data_bytes``
    take in a segment, however the engine splits them (a batch per record at worst)
    and whatever a codec does to them (its worst growth)."""
    size = data_bytes + (RECORD_OVERHEAD + BATCH_OVERHEAD) * records
    return size if codec is CompressionType.NONE else size + _codec_growth(size)


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


def _varint_size(n: int) -> int:
    """Bytes of the zigzag varint of ``n`` (Kafka's record fields)."""
    z = (n << 1) ^ (n >> 63)
    size = 1
    while z >= 0x80:
        z >>= 7
        size += 1
    return size


class RecordLimit:
    """Whether a line (or a raw value) can be one record of a topic: its one-record
    batch within ``max.message.bytes``, as the engine checks it when it appends. Also
    how the topic takes what is written (``raw``; a line's key ``separator``).

    Exact: for uncompressed topics by arithmetic (the v2 record layout: attributes,
    timestamp and offset deltas, key and value lengths and bytes, header count, after
    the record's own length and the 61-byte batch header); for a codec, a record whose
    uncompressed batch plus the codec's worst growth fits needs no more, others are
    built and compressed, as the engine will. Thread-safe (immutable).

    Cost: O(1) plus the search for the separator, without a codec or far below the
    limit; else one ``build_record_batch``.
    """

    __slots__ = ("codec", "max_message_bytes", "raw", "separator")

    def __init__(
        self,
        max_message_bytes: int,
        codec: CompressionType,
        separator: bytes | None,
        *,
        raw: bool = False,
    ) -> None:
        self.max_message_bytes = max_message_bytes
        self.codec = codec
        self.separator = separator
        self.raw = raw

    @classmethod
    def of(cls, config: LogConfig, metadata: TopicMetadata) -> RecordLimit:
        """The limit of a topic's records: its config, format and key separator."""
        name = config.compression_type
        codec = (
            CompressionType.NONE
            if name in ("producer", "uncompressed")
            else CompressionType[name.upper()]
        )
        raw = metadata.format == "raw"
        separator = None
        if not raw and metadata.key_separator is not None:
            separator = metadata.key_separator.encode()
        return cls(config.max_message_bytes, codec, separator, raw=raw)

    def fits(self, line: bytes) -> bool:
        """Whether ``line`` (without its newline; with the separator, key and value)
        is one record the engine appends."""
        key: bytes | None = None
        value = line
        if self.separator is not None:
            head, found, tail = line.partition(self.separator)
            if found:
                key, value = head, tail
        size = self.batch_size(key, value)
        if self.codec is CompressionType.NONE:
            return size <= self.max_message_bytes
        if size + _codec_growth(size) <= self.max_message_bytes:
            return True  # even if it does not compress at all
        batch = build_record_batch([value], keys=[key], timestamps=0, codec=self.codec)
        return len(batch) <= self.max_message_bytes

    def piece_size(self) -> int:
        """The size of raw values to cut a large write into (at least 1): the largest
        value ``fits`` accepts without building a batch, or, when a codec's worst
        growth would leave less than half of the uncompressed room (a small
        ``max.message.bytes``), the uncompressed room (then ``fits`` compresses)."""
        room = self.max_message_bytes - BATCH_OVERHEAD - RECORD_OVERHEAD
        if self.codec is not CompressionType.NONE:
            parts = _CODEC_GROWTH_PARTS
            limit = (self.max_message_bytes - _CODEC_GROWTH_BYTES) * parts // (parts + 1)
            if limit - BATCH_OVERHEAD - RECORD_OVERHEAD >= room // 2:
                room = limit - BATCH_OVERHEAD - RECORD_OVERHEAD
        return max(room, 1)

    @staticmethod
    def batch_size(key: bytes | None, value: bytes) -> int:
        """The bytes of an uncompressed one-record batch of ``key`` and ``value``."""
        # attributes, timestamp delta 0, offset delta 0: one byte each; header count 0.
        body = 4 + _varint_size(len(value)) + len(value)
        body += 1 if key is None else _varint_size(len(key)) + len(key)
        return BATCH_OVERHEAD + _varint_size(body) + body


# A codec grows incompressible data by less than 1/_CODEC_GROWTH_PARTS of it plus
# _CODEC_GROWTH_BYTES: snappy's worst (n/6 + 32 per 32-KiB block, 4 more per block and
# 16 of xerial's framing) is the largest; gzip, lz4 and zstd add under 1 %.
_CODEC_GROWTH_PARTS = 5
_CODEC_GROWTH_BYTES = 1024


def _codec_growth(size: int) -> int:
    return size // _CODEC_GROWTH_PARTS + _CODEC_GROWTH_BYTES


def raw_pieces(data: bytes, limit: RecordLimit) -> list[bytes]:
    """``data`` (one ``write()`` to a ``raw`` topic) as the values of its records:
    itself when it fits one record, else the fewest pieces of about equal size that
    each fit (a codec that grows a piece past the estimate doubles the count).

    Cost: O(pieces) slices (copies of ``data``).

    Raises:
        RecordTooLargeError: not even one byte fits a record (``max.message.bytes``
            below a batch's overhead).
    """
    if limit.fits(data):
        return [data]
    count = -(-len(data) // limit.piece_size())
    while True:
        step = -(-len(data) // count)
        pieces = [data[i : i + step] for i in range(0, len(data), step)]
        if all(limit.fits(piece) for piece in pieces):
            return pieces
        if step == 1:
            raise RecordTooLargeError(limit.batch_size(None, data[:1]), limit.max_message_bytes)
        count *= 2


def append_raw(log: Log, data: bytes, limit: RecordLimit) -> AppendInfo:
    """Append ``data`` as the ``raw`` records ``raw_pieces`` cuts it into: one
    ``Log.append`` (one ``write``, all or nothing).

    Raises:
        RecordTooLargeError: ``max.message.bytes`` is below a batch's overhead.
        OSError, ReadOnlyLogError: as ``append_lines``; nothing appended.
    """
    return log.append(raw_pieces(data, limit), units=len(data))


def produce_lines(
    logs: Callable[[int], Log],
    partitions: int,
    data: bytes,
    limit: RecordLimit,
    sticky: StickyPartitioner,
) -> tuple[int, list[tuple[int, AppendInfo]]]:
    """Append the complete lines of ``data`` to a topic, partitioned as Kafka's Java
    producer does: a keyed line to ``murmur2(key) % partitions``, keyless lines to the
    sticky partition of this write (the next write moves to another one).

    Keyless lines are appended as ``append_lines`` does (a count short of ``len(data)``
    means a short write); keyed lines with one append per partition written, in
    partition order, once every line is known to fit one record (``limit``, whose
    separator is the topic's) and every partition has room for its lines
    (``Log.reserved``): a write cannot be cut short at a line end then (the lines of
    the partitions go to their logs in no order the write's bytes have), so it is all
    or nothing. Returns the bytes of ``data`` appended and ``(partition, AppendInfo)``
    for each append. ``logs(p)`` gives partition ``p``'s log.

    Raises:
        RecordTooLargeError: a line cannot be one record; nothing appended.
        OSError: ``ENOSPC``: a partition has no room for its lines; nothing appended.
        ReadOnlyLogError: as ``append_lines``.
    """
    keyless = sticky.partition()
    separator = limit.separator
    if separator is None:
        # No keys: the whole write goes to this write's sticky partition.
        sticky.next_batch()
        appended, keyless_infos = append_lines(logs(keyless), data, None)
        return appended, [(keyless, info) for info in keyless_infos]
    # A line refused after other partitions' appends would fail a write that is partly
    # done, and the writer's retry would append those lines twice: check first (lines
    # shorter than a record's room need no check).
    lines = data.split(_NEWLINE)
    if max(map(len, lines)) > limit.piece_size():
        for line in lines:
            if not limit.fits(line):
                raise RecordTooLargeError(len(line), limit.max_message_bytes)
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
    with contextlib.ExitStack() as reserved:
        # Room in every partition first: a full disk must refuse the whole write, or
        # the writer's retry would append again the lines of the partitions before.
        for partition in sorted(groups):
            group_values, _keys, units = groups[partition]
            room = room_estimate(units[0], len(group_values), limit.codec)
            reserved.enter_context(logs(partition).reserved(room, len(group_values)))
        for partition in sorted(groups):
            group_values, group_keys, units = groups[partition]
            info = logs(partition).append(
                group_values, keys=None if keys is None else group_keys, units=units[0]
            )
            infos.append((partition, info))
    return len(data), infos


class LineBuffer:
    """The partial line of one open file, kept until its newline, or until the open
    file's last close (``release``) or an ``fsync`` appends it as a record.

    ``split(data)`` returns the complete lines to append now (``pending + data`` up to
    the last newline) without changing the buffer; ``commit`` keeps the new tail once
    the append succeeded, so a refused write leaves the buffer as it was.
    """

    __slots__ = ("pending",)

    def __init__(self) -> None:
        self.pending = b""

    def split(self, data: bytes, limit: RecordLimit) -> tuple[bytes, bytes]:
        """``(complete, tail)``: the lines ending in ``data`` and the new partial line.

        Raises:
            RecordTooLargeError: the new partial line could not be one record under
                ``limit``: it could never be appended, so the write that makes it is
                refused (the buffer is unchanged).
        """
        cut = data.rfind(_NEWLINE)
        if cut < 0:
            complete, tail = b"", self.pending + data
        elif cut == len(data) - 1:
            complete, tail = (self.pending + data if self.pending else data), b""
        else:
            complete, tail = self.pending + data[: cut + 1], data[cut + 1 :]
        if tail and not limit.fits(tail):
            raise RecordTooLargeError(len(tail), limit.max_message_bytes)
        return complete, tail

    def commit(self, tail: bytes) -> None:
        self.pending = tail

    def completed(self) -> bytes:
        """The pending partial line completed with a newline (empty when none): what
        close and fsync append, then ``commit(b"")``."""
        return self.pending + _NEWLINE if self.pending else b""

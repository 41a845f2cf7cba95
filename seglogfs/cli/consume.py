"""``seglogfs consume TOPIC``: records to stdout, like ``kcat -C``.

Opens the log directory read-only (works beside a daemon that writes it); by default
writes the same bytes ``cat`` of the partition files gives, or one JSON object per
record with ``--format json``. Below the log start (retention), a reader continues at
the oldest retained record, as Kafka's ``auto.offset.reset=earliest``. A damaged batch
stops it as Kafka's consumer stops (``CorruptRecordException``): the records before it
are written, then one line names the topic, partition, offset and file, and the exit
code is 1 (``seglogfs delete-records`` moves the log start past the damage).
"""

from __future__ import annotations

import argparse
import base64
import bisect
import json
import os
import sys
import time
from datetime import UTC, datetime
from typing import IO

from storage import (
    CorruptRecordError,
    Log,
    LogManager,
    OffsetOutOfRangeError,
    RecordBatch,
    SegmentDeletedError,
    render_batch,
)
from storage.number import abbreviated, decimal_long

from .common import (
    EXIT_OK,
    CommandError,
    Parents,
    Parser,
    UsageError,
    log_dir_of,
    open_read_only,
)

__all__ = ["add_parser", "parse_offset_spec"]

FOLLOW_POLL_S = 0.2
_MAX_REPOSITIONS = 8


def parse_offset_spec(spec: str) -> tuple[str, int]:
    """``beginning``, ``end``, ``N``, ``-N`` or ``@TIME`` (epoch ms or ISO 8601) as
    ``(kind, value)`` with kind in beginning/end/offset/last/time.

    Raises:
        UsageError: anything else.
    """
    text = spec.strip()
    shown = abbreviated(spec)
    if text in ("beginning", "earliest"):
        return ("beginning", 0)
    if text in ("end", "latest"):
        return ("end", 0)
    if text.startswith("@"):
        when = text[1:]
        millis = decimal_long(when)
        if millis is not None:
            return ("time", millis)
        try:
            moment = datetime.fromisoformat(when)
        except ValueError:
            raise UsageError(
                f"bad offset spec {shown!r}: after '@' give epoch milliseconds or an ISO 8601 time"
            ) from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)  # as the file system's 0@TIME views
        return ("time", round(moment.timestamp() * 1000))
    last = decimal_long(text[1:]) if text.startswith("-") else None
    if last is not None:
        return ("last", last)
    offset = decimal_long(text)
    if offset is not None:
        return ("offset", offset)
    raise UsageError(
        f"bad offset spec {shown!r}: use beginning, end, N, -N or @TIME (epoch ms or ISO 8601)"
    )


def _start_offset(log: Log, spec: tuple[str, int]) -> int:
    kind, value = spec
    start, end = log.log_start_offset, log.log_end_offset
    if kind == "beginning":
        return start
    if kind == "end":
        return end
    if kind == "last":
        return max(start, end - value)
    if kind == "time":
        found = log.offset_for_timestamp(value)
        return end if found is None else found
    if not start <= value <= end:
        raise OffsetOutOfRangeError(value, start, end)
    return value


def _damaged(topic: str, partition: int, exc: CorruptRecordError, offset: int = -1) -> CommandError:
    """The one line for a damaged batch: topic, partition, offset, file and byte."""
    where = f"topic {topic} partition {partition}"
    if exc.offset < 0 and offset >= 0:
        where += f" offset {offset}"  # the error names it when it knows it
    return CommandError(f"{where}: {exc}")


def _text_or_base64(data: bytes | None) -> object:
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode("ascii")}


class _Consumer:
    """Writes the records of some partitions from their start offsets to ``out``."""

    def __init__(
        self,
        manager: LogManager,
        topic: str,
        partitions: list[int],
        spec: tuple[str, int],
        *,
        json_format: bool,
        count: int | None,
        out: IO[bytes],
    ) -> None:
        self.manager = manager
        self.metadata = manager.topic(topic)
        self.topic = topic
        self.raw = self.metadata.format == "raw"
        separator = self.metadata.key_separator
        self.separator = separator.encode() if separator is not None else None
        self.json_format = json_format
        self.remaining = count
        self.out = out
        self.positions: dict[int, int] = {}
        for p in partitions:
            try:
                self.positions[p] = _start_offset(manager.log(topic, p), spec)
            except CorruptRecordError as exc:  # a lookup by time met it
                raise _damaged(topic, p, exc) from None

    @property
    def done(self) -> bool:
        return self.remaining is not None and self.remaining <= 0

    def drain(self, partition: int) -> int:
        """Write every record of ``partition`` from its position to the log end (or
        until the count is reached); return how many were written."""
        log = self.manager.log(self.topic, partition)
        written = 0
        for _attempt in range(_MAX_REPOSITIONS):
            # Below the log start, retention took the records: continue at the oldest
            # retained one (Kafka's auto.offset.reset=earliest), as the file system does.
            position = max(self.positions[partition], log.log_start_offset)
            try:
                for batch in log.batches(position):
                    if self.done:
                        break
                    if batch.is_control:
                        position = batch.next_offset
                        continue
                    if self.json_format:
                        n, position = self._write_json(batch, partition, position)
                    else:
                        n, position = self._write_rendered(batch, position)
                    written += n
                    self.positions[partition] = position
            except SegmentDeletedError:
                # Retention removed the segment under the read: what was written stays
                # written; pick up the new log start and go on from there.
                log.refresh()
                continue
            except CorruptRecordError as exc:
                # What came before it is written; the damaged batch never is.
                self.positions[partition] = position
                self.out.flush()
                raise _damaged(self.topic, partition, exc, position) from None
            self.positions[partition] = position
            return written
        raise CommandError(
            f"partition {self.topic}-{partition} is deleted by retention faster than it is read"
        )

    def _take(self, available: int) -> int:
        if self.remaining is None:
            return available
        taken = min(available, self.remaining)
        self.remaining -= taken
        return taken

    def _write_rendered(self, batch: RecordBatch, start: int) -> tuple[int, int]:
        rendered = render_batch(batch, raw=self.raw, key_separator=self.separator)
        offsets = rendered.offsets
        first = bisect.bisect_left(offsets, start)
        n = self._take(len(offsets) - first)
        if n < len(offsets) - first:
            if n == 0:
                return 0, start
            next_position = offsets[first + n - 1] + 1
        else:
            next_position = batch.next_offset
        if n:
            ends = rendered.ends
            lo = ends[first - 1] if first > 0 else 0
            self.out.write(rendered.data[lo : ends[first + n - 1]])
        return n, next_position

    def _write_json(self, batch: RecordBatch, partition: int, start: int) -> tuple[int, int]:
        chosen = [r for r in batch.records() if r.offset >= start]
        n = self._take(len(chosen))
        if n < len(chosen):
            if n == 0:
                return 0, start
            next_position = chosen[n - 1].offset + 1
        else:
            next_position = batch.next_offset
        lines = []
        for record in chosen[:n]:
            document = {
                "topic": self.topic,
                "partition": partition,
                "offset": record.offset,
                "timestamp": record.timestamp,
                "timestampType": record.timestamp_type.display_name,
                "key": _text_or_base64(record.key),
                "value": _text_or_base64(record.value),
                "headers": [[k, _text_or_base64(v)] for k, v in record.headers],
            }
            lines.append(json.dumps(document, ensure_ascii=False) + "\n")
        if lines:
            self.out.write("".join(lines).encode("utf-8"))
        return n, next_position


def _cmd_consume(args: argparse.Namespace) -> int:
    spec = parse_offset_spec(args.offset)
    if args.count is not None and args.count < 0:
        raise UsageError("-c/--count must not be negative")
    with open_read_only(log_dir_of(args)) as manager:
        metadata = manager.topic(args.topic)
        if args.partition is not None:
            manager.log(args.topic, args.partition)  # UnknownTopicError for a bad one
            partitions = [args.partition]
        else:
            partitions = list(range(metadata.partitions))
        out = sys.stdout.buffer
        consumer = _Consumer(
            manager,
            args.topic,
            partitions,
            spec,
            json_format=args.format == "json",
            count=args.count,
            out=out,
        )
        try:
            for partition in partitions:
                if consumer.done:
                    break
                consumer.drain(partition)
            out.flush()
            while args.follow and not consumer.done:
                time.sleep(FOLLOW_POLL_S)
                for partition in partitions:
                    log = manager.log(args.topic, partition)
                    if not log.dir.is_dir():
                        raise CommandError(f"topic {args.topic!r} was deleted")
                    log.refresh()
                    if consumer.drain(partition):
                        out.flush()
                    if consumer.done:
                        break
            out.flush()
        except BrokenPipeError:
            # The reader went away (``| head``): stop quietly, as cat does.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
    return EXIT_OK


def add_parser(commands: argparse._SubParsersAction[Parser], shared: Parents) -> None:
    """Add ``consume`` to ``commands``."""
    consume = commands.add_parser(
        "consume",
        parents=[shared.log_dir],
        help="records to stdout (like kcat -C)",
        description="Write a topic's records to stdout: by default the same bytes as "
        "cat of the partition files, or one JSON object per record.",
    )
    consume.add_argument("topic", metavar="TOPIC")
    consume.add_argument("-p", "--partition", type=int, metavar="N", help="partition N only")
    consume.add_argument(
        "-o",
        "--offset",
        default="beginning",
        metavar="SPEC",
        help="start at beginning (default), end, N, -N (the last N) or @TIME "
        "(epoch ms or ISO 8601, e.g. @2026-11-22T10:00:00Z; no zone means UTC)",
    )
    consume.add_argument("-c", "--count", type=int, metavar="COUNT", help="stop after COUNT")
    stop = consume.add_mutually_exclusive_group()
    stop.add_argument("-f", "--follow", action="store_true", help="wait for new records")
    stop.add_argument(
        "-e", "--exit", action="store_true", help="exit at the end of the log (the default)"
    )
    consume.add_argument(
        "--format",
        choices=("plain", "json"),
        default="plain",
        help="plain (the partition file's bytes) or json (one object per record; "
        'bytes that are not UTF-8 as {"base64": ...})',
    )
    consume.set_defaults(handler=_cmd_consume, command_parser=consume)

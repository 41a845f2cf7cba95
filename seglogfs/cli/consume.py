"""``seglogfs consume TOPIC``: records to stdout, like ``kcat -C``.

Opens the log directory read-only (works beside a daemon that writes it); by default
writes the same bytes ``cat`` of the partition files gives, or one JSON object per
record with ``--format json``. Below the log start (retention), a reader continues at
the oldest retained record, as Kafka's ``auto.offset.reset=earliest``. A damaged batch
stops it as Kafka's consumer stops (``CorruptRecordException``): the records before it
are written, then one line names the topic, partition, offset and file, and the exit
code is 1 (``seglogfs delete-records`` moves the log start past the damage).

``-K SEP`` prints each record as ``key<SEP>value`` and a newline, as ``kcat -C -K SEP``
(a null key or value prints as nothing).

``-g GROUP`` consumes as a member of a consumer group (``seglogfs.cli.groups``): it
joins the group for the partitions asked for and gets those no other live member reads
(one reader per partition and group; with ``-f`` it picks up partitions freed later),
starts each at the group's committed offset, or where ``--reset`` says when there is
none or it is out of the log's range (``latest``, the default, as Kafka's
``auto.offset.reset``; ``earliest``; ``none``: an error), and commits the position
after the last record written: every second and at the end (``-e``, ``-c``, ``SIGINT``,
``SIGTERM``, a closed pipe). Output is flushed before each commit, so what is committed
was written: a crash between the two writes those records again on the next run, it
never skips one (at least once, as Kafka's auto-commit). Through the daemon's control
socket when one owns the directory (the daemon knows the member while this process
runs); without one, this command takes the writer lock for its whole run, as
``produce`` does (nothing else writes the directory meanwhile: mount it to consume in
groups beside producers).
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import IO

from storage import (
    CorruptRecordError,
    GroupIdNotFoundError,
    Log,
    LogManager,
    NoOffsetForPartitionError,
    OffsetOutOfRangeError,
    Record,
    RecordBatch,
    SegmentDeletedError,
    render_json_batch,
)
from storage.number import abbreviated, decimal_long

from .. import control
from ..positions import Rendering
from .common import (
    EXIT_OK,
    CommandError,
    Parents,
    Parser,
    UsageError,
    log_dir_of,
    open_read_only,
    open_writable,
)
from .groups import Coordinator, DaemonCoordinator, LocalCoordinator, is_error

__all__ = ["add_parser", "parse_offset_spec"]

FOLLOW_POLL_S = 0.2
COMMIT_INTERVAL_S = 1.0
"""How often ``consume -g`` commits (Kafka's ``auto.commit.interval.ms`` is 5 s)."""
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
        key_delimiter: bytes | None = None,
        starts: dict[int, int] | None = None,
    ) -> None:
        self.manager = manager
        self.metadata = manager.topic(topic)
        self.topic = topic
        self.json_format = json_format
        self.key_delimiter = key_delimiter
        self.remaining = count
        self.out = out
        # Called after each batch written (``consume -g`` commits from there).
        self.on_progress: Callable[[], None] | None = None
        self.positions: dict[int, int] = {}
        for p in partitions:
            if starts is not None:
                self.positions[p] = starts[p]
                continue
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
                    # A signal here would end the command with the batch's records
                    # written (stdout may be unbuffered) and its position not moved:
                    # its last commit would make the group read them again.
                    with _INTERRUPTS.whole_batch():
                        if self.key_delimiter is not None:
                            n, position = self._write_keyed(batch, position, self.key_delimiter)
                        else:
                            n, position = self._write_rendered(batch, partition, position)
                        written += n
                        self.positions[partition] = position
                    if self.on_progress is not None:
                        self.on_progress()
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

    def _write_rendered(self, batch: RecordBatch, partition: int, start: int) -> tuple[int, int]:
        # --format json and a json topic's file bytes are one renderer's output
        # (storage.record.json_format): the same line for the same record.
        if self.json_format:
            rendered = render_json_batch(batch, self.topic, partition)
        else:
            rendered = Rendering.of(self.metadata, partition).render(batch)
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

    def _chosen(self, batch: RecordBatch, start: int) -> tuple[list[Record], int]:
        """The records of ``batch`` to write from ``start`` within the count, and the
        position after them."""
        chosen = [r for r in batch.records() if r.offset >= start]
        n = self._take(len(chosen))
        if n < len(chosen):
            if n == 0:
                return [], start
            return chosen[:n], chosen[n - 1].offset + 1
        return chosen, batch.next_offset

    def _write_keyed(self, batch: RecordBatch, start: int, delimiter: bytes) -> tuple[int, int]:
        # kcat -C -K: key, delimiter, value, newline; a null key or value prints nothing.
        chosen, next_position = self._chosen(batch, start)
        if chosen:
            self.out.write(
                b"".join(b"%s%s%s\n" % (r.key or b"", delimiter, r.value or b"") for r in chosen)
            )
        return len(chosen), next_position


def _cmd_consume(args: argparse.Namespace) -> int:
    if args.count is not None and args.count < 0:
        raise UsageError("-c/--count must not be negative")
    if args.key_delimiter is not None and args.format == "json":
        raise UsageError("-K prints key and value as text: not with --format json")
    if args.group is None:
        spec = parse_offset_spec("beginning" if args.offset is None else args.offset)
        with open_read_only(log_dir_of(args)) as manager:
            partitions = _partitions(manager, args)
            consumer = _consumer(manager, args, partitions, spec)
            _run(manager, args, consumer, partitions, _NoGroup())
        return EXIT_OK
    if args.offset is not None:
        raise UsageError(
            "-o and -g: a group starts at its committed offsets (--reset says where "
            "when it has none)"
        )
    log_dir = log_dir_of(args)
    daemon = control.daemon_socket(log_dir) is not None
    with open_read_only(log_dir) if daemon else open_writable(log_dir, args) as manager:
        groups: Coordinator = DaemonCoordinator(log_dir) if daemon else LocalCoordinator(manager)
        wanted = _partitions(manager, args)
        with _GroupMember(groups, manager, args, wanted) as member:
            consumer = _consumer(manager, args, member.assigned, ("end", 0), member.starts)
            member.consumer = consumer
            consumer.on_progress = member.maybe_commit
            _run(manager, args, consumer, wanted, member)
    return EXIT_OK


def _partitions(manager: LogManager, args: argparse.Namespace) -> list[int]:
    metadata = manager.topic(args.topic)
    if args.partition is not None:
        manager.log(args.topic, args.partition)  # UnknownTopicError for a bad one
        return [args.partition]
    return list(range(metadata.partitions))


def _consumer(
    manager: LogManager,
    args: argparse.Namespace,
    partitions: list[int],
    spec: tuple[str, int],
    starts: dict[int, int] | None = None,
) -> _Consumer:
    return _Consumer(
        manager,
        args.topic,
        partitions,
        spec,
        json_format=args.format == "json",
        count=args.count,
        out=sys.stdout.buffer,
        key_delimiter=None if args.key_delimiter is None else args.key_delimiter.encode(),
        starts=starts,
    )


class _NoGroup:
    """A consumer outside any group: nothing to commit, no partition to pick up."""

    def maybe_commit(self) -> None:
        return None

    def poll(self) -> list[int]:
        return []


def _run(
    manager: LogManager,
    args: argparse.Namespace,
    consumer: _Consumer,
    wanted: list[int],
    member: _NoGroup | _GroupMember,
) -> None:
    out = sys.stdout.buffer
    try:
        for partition in list(consumer.positions):
            if consumer.done:
                break
            consumer.drain(partition)
        out.flush()
        while args.follow and not consumer.done:
            time.sleep(FOLLOW_POLL_S)
            member.poll()
            for partition in list(consumer.positions):
                log = manager.log(args.topic, partition)
                if not log.dir.is_dir():
                    raise CommandError(f"topic {args.topic!r} was deleted")
                log.refresh()
                if consumer.drain(partition):
                    out.flush()
                if consumer.done:
                    break
            member.maybe_commit()
        out.flush()
    except BrokenPipeError:
        # The reader went away (``| head``): stop quietly, as cat does. What the buffer
        # held was lost: a group commits only what earlier flushes wrote.
        if isinstance(member, _GroupMember):
            member.consumer = None
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


class _GroupMember:
    """``consume -g``: membership of the group, start offsets, commits (see the module).

    What is committed is the position of each partition after the records written to
    stdout and flushed (``flushed``): never a record still in a buffer.
    """

    def __init__(
        self, groups: Coordinator, manager: LogManager, args: argparse.Namespace, wanted: list[int]
    ) -> None:
        self.groups = groups
        self.manager = manager
        self.group: str = args.group
        self.topic: str = args.topic
        self.reset: str = args.reset
        self.consumer: _Consumer | None = None
        self.member_id, self.assigned = groups.join(self.group, self.topic, wanted)
        self.starts: dict[int, int] = {}
        self.flushed: dict[int, int] = {}
        self.committed: dict[int, int] = {}
        self.next_commit = time.monotonic() + COMMIT_INTERVAL_S
        try:
            self._take(self.assigned)
        except BaseException:
            self.groups.leave(self.group, self.member_id)
            raise

    def _take(self, partitions: list[int]) -> None:
        """Start positions of newly assigned ``partitions``: the committed offset within
        the log, else the reset rule."""
        try:
            offsets = self.groups.describe(self.group)["offsets"]
        except (GroupIdNotFoundError, control.ControlError) as exc:
            if not is_error(exc, GroupIdNotFoundError):
                raise
            offsets = []
        committed = {o["partition"]: o["offset"] for o in offsets if o["topic"] == self.topic}
        for p in partitions:
            log = self.manager.log(self.topic, p)
            offset = committed.get(p)
            if offset is not None and log.log_start_offset <= offset <= log.log_end_offset:
                start = offset
            elif self.reset == "none":
                raise NoOffsetForPartitionError(self.group, self.topic, p)
            else:
                start = log.log_start_offset if self.reset == "earliest" else log.log_end_offset
            self.starts[p] = self.flushed[p] = start
            if offset is not None:
                self.committed[p] = offset

    def poll(self) -> list[int]:
        """Heartbeat: take the partitions freed since (``-f``)."""
        now = self.groups.heartbeat(self.group, self.member_id)
        new = [p for p in now if p not in self.starts]
        if new:
            self._take(new)
            if self.consumer is not None:
                self.consumer.positions.update({p: self.starts[p] for p in new})
        return new

    def maybe_commit(self) -> None:
        if time.monotonic() >= self.next_commit:
            self.commit()

    def commit(self) -> None:
        """Flush stdout, then commit the positions it holds (a failed flush commits what
        the last good one held)."""
        self.next_commit = time.monotonic() + COMMIT_INTERVAL_S
        if self.consumer is not None:
            try:
                sys.stdout.buffer.flush()
                self.flushed.update(self.consumer.positions)
            except OSError:
                pass
        changed = {
            (self.topic, p): o for p, o in self.flushed.items() if self.committed.get(p) != o
        }
        if changed:
            self.groups.commit(self.group, changed, self.member_id)
            self.committed.update({p: o for (_t, p), o in changed.items()})

    def __enter__(self) -> _GroupMember:
        return self

    def __exit__(self, *exc_info: object) -> None:
        # The last commit and the leave run with SIGINT and SIGTERM held off: a second
        # Ctrl-C must not lose what was written.
        with _signals_held():
            try:
                self.commit()
            finally:
                self.groups.leave(self.group, self.member_id)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


class _Interrupts:
    """``SIGINT`` ends the command as ``KeyboardInterrupt`` (exit 130), ``SIGTERM`` as
    ``SystemExit(143)``, so that its ``finally`` blocks run (a group's last commit); a
    signal that arrives while a batch's records are written and its position recorded
    (``whole_batch``) takes effect right after, so that a record written is a record
    committed. Not thread-safe (signals run in the main thread, as consume does)."""

    def __init__(self) -> None:
        self.holding = False
        self.pending: int | None = None

    def handle(self, signum: int, _frame: object) -> None:
        if self.holding:
            self.pending = signum
            return
        _interrupt(signum)

    @contextlib.contextmanager
    def whole_batch(self) -> Iterator[None]:
        self.holding = True
        try:
            yield
        finally:
            self.holding = False
        if self.pending is not None:
            signum, self.pending = self.pending, None
            _interrupt(signum)

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        previous = {s: signal.signal(s, self.handle) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)


def _interrupt(signum: int) -> None:
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise SystemExit(128 + signum)


_INTERRUPTS = _Interrupts()


def add_parser(commands: argparse._SubParsersAction[Parser], shared: Parents) -> None:
    """Add ``consume`` to ``commands``."""
    consume = commands.add_parser(
        "consume",
        parents=[shared.log_dir, shared.writer],
        help="records to stdout (like kcat -C)",
        description="Write a topic's records to stdout: by default the same bytes as "
        "cat of the partition files, or one JSON object per record.",
    )
    consume.add_argument("topic", metavar="TOPIC")
    consume.add_argument("-p", "--partition", type=int, metavar="N", help="partition N only")
    consume.add_argument(
        "-o",
        "--offset",
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
    consume.add_argument(
        "-K",
        "--key-delimiter",
        metavar="SEP",
        help="print each record as key, SEP, value and a newline (as kcat -C -K)",
    )
    consume.add_argument(
        "-g",
        "--group",
        metavar="GROUP",
        help="consume as a member of GROUP: start at its committed offsets and commit "
        "every second and at the end (no -o)",
    )
    consume.add_argument(
        "--reset",
        choices=("earliest", "latest", "none"),
        default="latest",
        help="with -g, where a partition without a committed offset starts (Kafka's "
        "auto.offset.reset; default latest)",
    )
    consume.set_defaults(handler=_handler, command_parser=consume)


def _handler(args: argparse.Namespace) -> int:
    with _INTERRUPTS.installed():
        return _cmd_consume(args)

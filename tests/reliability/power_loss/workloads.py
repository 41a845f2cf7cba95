"""Workloads run under the recorder, and the oracle of what the engine promised.

A ``Driver`` makes the engine calls through ``LogManager`` and ``Log`` and marks each
call in the recording twice: when it begins and when it returns, with the facts it
establishes. The facts come from the engine's documented promises, not from its
file operations (that would only check the recorder against itself):

- ``Appended``: the records of an append may exist from the moment it began (their
  offsets are the log end offset before the call: one writer, one thread);
- ``Durable``: offsets below ``end`` survive a power cut once the call returned:
  ``Log.flush()``, ``flush_dirty_logs``, ``flush_due_logs`` (``flush.ms``) for the logs
  it was due for, an append under ``flush.messages=1``, ``LogManager.close()``, and a
  roll ("the sealed segment is fsynced before the new one starts, so after a crash
  only the active segment can have lost data": everything below the active segment's
  base offset);
- ``StartMoved``: DeleteRecords or retention moved the log start offset (records below
  it may be gone from the moment the call began);
- ``StartDurable``: a checkpoint of the log start offsets returned (``checkpoint()``,
  ``close()``, ``run_retention`` when it deleted a segment);
- ``TopicCreated`` / ``TopicDeleted``: possible from the call's start, promised once
  it returned (the metadata file is written atomically and its directory fsynced);
- ``Cleaning``: a cleaning pass (log compaction) began: from then on a record below
  the log's active segment at that moment (the first uncleanable offset) may be gone
  when a later record of its key is there too (below the same bound, so durable: a
  roll made it so), and a tombstone appended at least ``delete.retention.ms`` before
  the pass began may be gone (its delete horizon, set by an earlier pass, passed).

Records of a compacted topic carry their key (``Appended.keys``) and the time they
were appended; records of a topic with the position index carry the units at the end
of each append (``Appended.units_end``): positions never move (retention and cleaning
remove units from the front only), so a recovered durable end has the units it had.

``Oracle.at(cut)`` folds the facts visible at a cut into what a recovered directory
must (and may) hold. Record values name their topic, incarnation, partition and
offset, so a record of a deleted incarnation, or at the wrong offset, is recognised.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from seglogfs.positions import POSITION_INDEX_SUFFIX, Rendering
from storage import ExtensionIndexSpec, Log, LogManager, TopicMetadata, rendered_size
from tests.conftest import ManualClock

from .crash_states import CrashState
from .recorder import Kind, Op, Recorder

__all__ = ["WORKLOADS", "Driver", "Oracle", "Recording", "record_workload"]

POSITION_INTERVAL = 96
"""Rendered bytes between position-index entries here (the daemon uses 4096): small,
so that the short workloads write many mapped entries."""

# Small segments and indexes: rolls, full indexes and many index entries in a few
# hundred appends, and mapped files of a few hundred bytes to compare at each call.
SMALL = {
    "segment.bytes": "1400",
    "segment.index.bytes": "192",
    "index.interval.bytes": "120",
    "file.delete.delay.ms": "0",
}


UNPOSITIONED_PREFIX = "plain"
"""Topics whose name starts so have no position index (``extension_for``): the engine's
paths without an extension index (a cleaning pass swaps group by group)."""


def extension_for(metadata: TopicMetadata) -> ExtensionIndexSpec | None:
    """The file system's position index (``*.seglogpos``), with a small interval; none
    for a topic named ``UNPOSITIONED_PREFIX...``."""
    if metadata.name.startswith(UNPOSITIONED_PREFIX):
        return None
    rendering = Rendering.of(metadata, 0)  # lines and raw: the same for every partition
    measure = partial(rendered_size, raw=rendering.raw, key_separator=rendering.key_separator)
    return ExtensionIndexSpec(POSITION_INDEX_SUFFIX, POSITION_INTERVAL, measure)


# -- facts ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Appended:
    topic: str
    incarnation: int
    partition: int
    first_offset: int
    values: tuple[bytes | None, ...]
    keys: tuple[bytes | None, ...] | None = None  # a compacted topic's (None: no keys)
    time_ms: int = 0  # the clock when the append began (the records' timestamp)
    units_end: int | None = None  # the position index's units at the append's end


@dataclass(frozen=True)
class Cleaning:
    """A cleaning pass began: records below ``limit`` may be compacted away (see the
    module doc); tombstones appended at or before ``tombstones_before_ms`` may go."""

    topic: str
    incarnation: int
    partition: int
    limit: int
    tombstones_before_ms: int


@dataclass(frozen=True)
class Durable:
    topic: str
    incarnation: int
    partition: int
    end: int


@dataclass(frozen=True)
class StartMoved:
    topic: str
    incarnation: int
    partition: int
    offset: int


@dataclass(frozen=True)
class StartDurable:
    topic: str
    incarnation: int
    partition: int
    offset: int


@dataclass(frozen=True)
class TopicCreated:
    topic: str
    incarnation: int
    partitions: int


@dataclass(frozen=True)
class TopicDeleted:
    topic: str
    incarnation: int


Fact = Appended | Cleaning | Durable | StartMoved | StartDurable | TopicCreated | TopicDeleted


@dataclass(frozen=True)
class Begin:
    call: int
    name: str

    def __str__(self) -> str:
        return f"begin {self.name} (call {self.call})"


@dataclass(frozen=True)
class End:
    call: int
    name: str
    facts: tuple[Fact, ...]
    promised: bool = True  # False: the facts were only possible (an inherited state)

    def __str__(self) -> str:
        return f"end {self.name} (call {self.call})"


# -- the oracle -----------------------------------------------------------------------


@dataclass
class PartitionExpectation:
    """What a recovered partition of one topic incarnation must and may hold."""

    values: dict[int, bytes | None]  # every value that may be at an offset
    appended_end: int  # offsets at or past this were never appended (before the cut)
    durable_end: int  # offsets below this survive (above the moved log start)
    start_moved: int  # the highest log start a call (begun) asked for
    start_durable: int  # the recovered log start is at least this
    keys: dict[int, bytes | None] = field(default_factory=dict)  # a compacted topic's
    times: dict[int, int] = field(default_factory=dict)  # append time of each offset
    units: dict[int, int] = field(default_factory=dict)  # an append's end -> its units
    clean_limit: int = 0  # records below this may be compacted away (0: no pass began)
    tombstones_before_ms: int = -(1 << 62)  # tombstones appended by then may be gone

    def removable(self, offset: int) -> bool:
        """Whether a cleaning pass begun before the cut may have removed the record at
        ``offset``: a later record of its key below the pass's bound (durable, and
        never itself removable but by a later one: the latest durable record of every
        key stays), or a tombstone whose delete horizon may have passed."""
        if offset >= self.clean_limit or offset not in self.keys:
            return False
        key = self.keys[offset]
        if self.values.get(offset, b"") is None and (
            self.times.get(offset, 1 << 62) <= self.tombstones_before_ms
        ):
            return True
        return any(self.keys.get(later) == key for later in range(offset + 1, self.clean_limit))


@dataclass
class TopicExpectation:
    candidates: dict[int, int]  # incarnations that may be on disk -> partitions
    must_exist: int | None  # this incarnation must be there
    partitions: dict[tuple[int, int], PartitionExpectation] = field(default_factory=dict)


@dataclass
class Expectation:
    topics: dict[str, TopicExpectation]

    def key(self) -> tuple[object, ...]:
        """What the checks depend on (to skip a state already checked with it)."""
        out: list[object] = []
        for name in sorted(self.topics):
            topic = self.topics[name]
            out.append((name, tuple(sorted(topic.candidates.items())), topic.must_exist))
            for tp in sorted(topic.partitions):
                p = topic.partitions[tp]
                out.append(
                    (tp, p.appended_end, p.durable_end, p.start_moved, p.start_durable,
                     p.clean_limit, p.tombstones_before_ms)
                )  # fmt: skip
        return tuple(out)


class Oracle:
    """The facts of a recording, by the seq of the marks that made them."""

    def __init__(self, ops: list[Op]) -> None:
        begins: dict[int, int] = {}
        # (seq from which the fact holds, fact)
        self.possible: list[tuple[int, Fact]] = []
        self.promised: list[tuple[int, Fact]] = []
        for op in ops:
            if op.kind is not Kind.MARK:
                continue
            event = op.event
            if isinstance(event, Begin):
                begins[event.call] = op.seq
            elif isinstance(event, End):
                begin = begins[event.call]
                for fact in event.facts:
                    if isinstance(
                        fact, Appended | Cleaning | StartMoved | TopicCreated | TopicDeleted
                    ):
                        self.possible.append((begin, fact))
                    if event.promised and isinstance(
                        fact, Durable | StartDurable | TopicCreated | TopicDeleted
                    ):
                        self.promised.append((op.seq, fact))

    def at(self, cut: int) -> Expectation:
        """What holds for a power cut after ``ops[:cut]``: a fact holds at the cut when
        the mark it hangs on (seq ``s``) was issued, ``s < cut``."""
        created: dict[str, dict[int, int]] = {}
        deleted_begun: dict[str, set[int]] = {}
        deleted: dict[str, set[int]] = {}
        created_promised: dict[str, set[int]] = {}
        parts: dict[tuple[str, int, int], PartitionExpectation] = {}

        def part(topic: str, incarnation: int, partition: int) -> PartitionExpectation:
            key = (topic, incarnation, partition)
            if key not in parts:
                parts[key] = PartitionExpectation({}, 0, 0, 0, 0)
            return parts[key]

        for seq, fact in self.possible:
            if seq >= cut:
                continue
            match fact:
                case Appended(topic, inc, p, first, values, keys, time_ms, units_end):
                    expect = part(topic, inc, p)
                    for i, value in enumerate(values):
                        expect.values[first + i] = value
                        expect.times[first + i] = time_ms
                        if keys is not None:
                            expect.keys[first + i] = keys[i]
                    expect.appended_end = max(expect.appended_end, first + len(values))
                    if units_end is not None:
                        expect.units[first + len(values)] = units_end
                case Cleaning(topic, inc, p, limit, tombstones_before_ms):
                    expect = part(topic, inc, p)
                    expect.clean_limit = max(expect.clean_limit, limit)
                    expect.tombstones_before_ms = max(
                        expect.tombstones_before_ms, tombstones_before_ms
                    )
                case StartMoved(topic, inc, p, offset):
                    expect = part(topic, inc, p)
                    expect.start_moved = max(expect.start_moved, offset)
                case TopicCreated(topic, inc, partitions):
                    created.setdefault(topic, {})[inc] = partitions
                case TopicDeleted(topic, inc):
                    deleted_begun.setdefault(topic, set()).add(inc)
        for seq, fact in self.promised:
            if seq >= cut:
                continue
            match fact:
                case Durable(topic, inc, p, end):
                    expect = part(topic, inc, p)
                    expect.durable_end = max(expect.durable_end, end)
                case StartDurable(topic, inc, p, offset):
                    expect = part(topic, inc, p)
                    expect.start_durable = max(expect.start_durable, offset)
                case TopicCreated(topic, inc, _partitions):
                    created_promised.setdefault(topic, set()).add(inc)
                case TopicDeleted(topic, inc):
                    deleted.setdefault(topic, set()).add(inc)
        topics: dict[str, TopicExpectation] = {}
        for topic, incarnations in created.items():
            gone = deleted.get(topic, set())
            candidates = {i: n for i, n in incarnations.items() if i not in gone}
            must = [
                i
                for i in created_promised.get(topic, set())
                if i not in deleted_begun.get(topic, set())
            ]
            expectation = TopicExpectation(candidates, max(must) if must else None)
            for (name, inc, p), expect in parts.items():
                if name == topic and inc in candidates:
                    expectation.partitions[(inc, p)] = expect
            topics[topic] = expectation
        return Expectation(topics)


# -- running a workload -------------------------------------------------------------------


@dataclass
class Recording:
    """A workload's recording: the operations, the starting tree and the oracle."""

    name: str
    recorder: Recorder
    oracle: Oracle
    now_ms: int  # the clock when the workload ended (the checker opens at this time)

    @property
    def ops(self) -> list[Op]:
        return self.recorder.ops


class Driver:
    """Makes engine calls, marking each one's start and end with its facts."""

    def __init__(self, root: Path, recorder: Recorder, clock: ManualClock, seed: int) -> None:
        self.root = root
        self.recorder = recorder
        self.clock = clock
        self.rng = random.Random(seed)
        self.manager: LogManager | None = None
        self.incarnation: dict[str, int] = {}
        self._inherited = False
        self._calls = 0

    # -- marking ---------------------------------------------------------------------

    def _begin(self, name: str) -> int:
        self._calls += 1
        self.recorder.mark(Begin(self._calls, name))
        return self._calls

    def _end(self, call: int, name: str, facts: list[Fact]) -> None:
        self.recorder.mark(End(call, name, tuple(facts)))

    def _manager(self) -> LogManager:
        assert self.manager is not None, "the workload opened no manager"
        return self.manager

    def _log(self, topic: str, partition: int) -> Log:
        return self._manager().log(topic, partition)

    def _rolled(self, log: Log) -> Durable:
        # Everything below the active segment was fsynced when it was sealed.
        return Durable(
            log.topic, self.incarnation[log.topic], log.partition, log.active_segment.base_offset
        )

    def _all_logs(self) -> Iterator[Log]:
        manager = self._manager()
        for topic in manager.topics():
            if topic not in self.incarnation:
                continue  # an inherited topic whose incarnation is not known
            for p in range(manager.topic(topic).partitions):
                yield manager.log(topic, p)

    def _durable_all(self) -> list[Fact]:
        return [
            Durable(log.topic, self.incarnation[log.topic], log.partition, log.log_end_offset)
            for log in self._all_logs()
        ]

    def _starts_durable(self) -> list[Fact]:
        return [
            StartDurable(
                log.topic, self.incarnation[log.topic], log.partition, log.log_start_offset
            )
            for log in self._all_logs()
        ]

    # -- calls ---------------------------------------------------------------------------

    def open(self) -> None:
        call = self._begin("LogManager.open")
        self.manager = LogManager.open(self.root, clock=self.clock, extension=extension_for)
        if not self._inherited:
            for topic in self.manager.topics():
                self.incarnation.setdefault(topic, 1)
        self._end(call, "LogManager.open", [])

    def close(self) -> None:
        call = self._begin("LogManager.close")
        facts = self._durable_all() + self._starts_durable()
        self._manager().close()
        self.manager = None
        self._end(call, "LogManager.close", facts)

    def create_topic(self, name: str, partitions: int, config: dict[str, str]) -> None:
        incarnation = self.incarnation.get(name, 0) + 1
        self.incarnation[name] = incarnation
        call = self._begin(f"create_topic {name}")
        self._manager().create_topic(name, partitions, config)
        self._end(call, f"create_topic {name}", [TopicCreated(name, incarnation, partitions)])

    def set_topic_rendering(self, name: str, format: str) -> None:
        call = self._begin(f"set_topic_rendering {name}")
        self._manager().set_topic_rendering(name, format, None)
        self._end(call, f"set_topic_rendering {name}", [])

    def delete_topic(self, name: str) -> None:
        call = self._begin(f"delete_topic {name}")
        self._manager().delete_topic(name)
        self._end(call, f"delete_topic {name}", [TopicDeleted(name, self.incarnation[name])])

    def append(self, topic: str, partition: int, count: int) -> None:
        log = self._log(topic, partition)
        incarnation = self.incarnation[topic]
        first = log.log_end_offset
        values: list[bytes | None] = []
        for i in range(count):
            pad = "x" * self.rng.randrange(8, 60)
            values.append(f"{topic}.{incarnation}.{partition}.{first + i}:{pad}".encode())
        self._append(log, values, None)

    def _append(
        self, log: Log, values: list[bytes | None], keys: list[bytes | None] | None
    ) -> None:
        topic, partition = log.topic, log.partition
        incarnation = self.incarnation[topic]
        first = log.log_end_offset
        now = self.clock.milliseconds()
        call = self._begin(f"append {topic}-{partition}")
        info = log.append(values, keys=keys)
        assert info.first_offset == first, (info, first)
        units = log.extension_end if log.extension is not None else None
        fact = Appended(
            topic, incarnation, partition, first, tuple(values),
            None if keys is None else tuple(keys), now, units,
        )  # fmt: skip
        facts: list[Fact] = [fact, self._rolled(log)]
        if log.config.flush_messages == 1:
            facts.append(Durable(topic, incarnation, partition, info.last_offset + 1))
        self._end(call, f"append {topic}-{partition}", facts)

    def append_keyed(
        self, topic: str, partition: int, keys: list[bytes], tombstone_p: float
    ) -> None:
        """One append of records with ``keys`` (a compacted topic's), each a tombstone
        with probability ``tombstone_p``; a value names its offset and key."""
        log = self._log(topic, partition)
        incarnation = self.incarnation[topic]
        first = log.log_end_offset
        values: list[bytes | None] = []
        for i, key in enumerate(keys):
            if self.rng.random() < tombstone_p:
                values.append(None)
                continue
            pad = "x" * self.rng.randrange(8, 40)
            name = f"{topic}.{incarnation}.{partition}.{first + i}:{key.decode()}:{pad}"
            values.append(name.encode())
        self._append(log, values, list(keys))

    def keyed_appends(
        self, topic: str, partitions: int, rounds: int, keys: int, flush_p: float
    ) -> None:
        """``rounds`` appends of 1-4 records with keys drawn from ``keys`` (so they
        repeat), a few tombstones, to random partitions, each maybe flushed."""
        for _ in range(rounds):
            p = self.rng.randrange(partitions)
            drawn = [f"k{self.rng.randrange(keys)}".encode() for _ in range(self.rng.randint(1, 4))]
            self.append_keyed(topic, p, drawn, 0.12)
            self.tick(self.rng.randint(1, 50))
            if self.rng.random() < flush_p:
                self.flush(topic, p)

    def clean(self, topics: list[str]) -> None:
        """``LogManager.clean(topics, force=True)``: a cleaning pass over each of their
        logs with anything cleanable (and the cleaner checkpoint)."""
        now = self.clock.milliseconds()
        facts: list[Fact] = [
            Cleaning(
                log.topic,
                self.incarnation[log.topic],
                log.partition,
                log.active_segment.base_offset,
                now - log.config.delete_retention_ms,
            )
            for log in self._all_logs()
            if log.topic in topics
        ]
        call = self._begin("clean")
        summary = self._manager().clean(topics, force=True)
        assert not summary.skipped, summary.skipped
        self._end(call, "clean", facts)

    def flush(self, topic: str, partition: int) -> None:
        log = self._log(topic, partition)
        call = self._begin(f"Log.flush {topic}-{partition}")
        end = log.log_end_offset
        log.flush()
        self._end(
            call,
            f"Log.flush {topic}-{partition}",
            [Durable(topic, self.incarnation[topic], partition, end)],
        )

    def flush_dirty_logs(self) -> None:
        call = self._begin("flush_dirty_logs")
        facts = self._durable_all()
        self._manager().flush_dirty_logs()
        self._end(call, "flush_dirty_logs", facts)

    def flush_due_logs(self) -> None:
        now = self.clock.milliseconds()
        due = [
            log
            for log in self._all_logs()
            if (when := log.next_flush_due_ms()) is not None and when <= now
        ]
        facts: list[Fact] = [
            Durable(log.topic, self.incarnation[log.topic], log.partition, log.log_end_offset)
            for log in due
        ]
        call = self._begin("flush_due_logs")
        self._manager().flush_due_logs()
        self._end(call, "flush_due_logs", facts)

    def roll(self, topic: str, partition: int) -> None:
        log = self._log(topic, partition)
        call = self._begin(f"Log.roll {topic}-{partition}")
        log.roll()
        self._end(call, f"Log.roll {topic}-{partition}", [self._rolled(log)])

    def delete_records(self, topic: str, partition: int, offset: int) -> None:
        log = self._log(topic, partition)
        call = self._begin(f"DeleteRecords {topic}-{partition}")
        log.advance_log_start_offset(offset)
        fact = StartMoved(topic, self.incarnation[topic], partition, log.log_start_offset)
        self._end(call, f"DeleteRecords {topic}-{partition}", [fact])

    def run_retention(self) -> int:
        call = self._begin("run_retention")
        deleted = self._manager().run_retention()
        facts: list[Fact] = [
            StartMoved(log.topic, self.incarnation[log.topic], log.partition, log.log_start_offset)
            for log in self._all_logs()
        ]
        facts += [self._rolled(log) for log in self._all_logs()]
        if deleted:
            facts += self._starts_durable()
        self._end(call, "run_retention", facts)
        return deleted

    def roll_due_segments(self) -> None:
        call = self._begin("roll_due_segments")
        self._manager().roll_due_segments()
        self._end(call, "roll_due_segments", [self._rolled(log) for log in self._all_logs()])

    def maintenance(self) -> None:
        """What the daemon runs when ``next_maintenance_due_ms`` comes: rolls by
        ``segment.ms``, retention, delayed deletions, flushes by ``flush.ms``, and the
        checkpoints."""
        self.roll_due_segments()
        self.run_retention()
        self.delete_expired_files()
        self.flush_due_logs()
        self.checkpoint()

    def delete_expired_files(self) -> None:
        call = self._begin("delete_expired_files")
        self._manager().delete_expired_files()
        self._end(call, "delete_expired_files", [])

    def checkpoint(self) -> None:
        call = self._begin("checkpoint")
        self._manager().checkpoint()
        self._end(call, "checkpoint", self._starts_durable())

    def inherit(self, expect: Expectation) -> None:
        """State, as facts of one call already returned, what held before this run: a
        run that starts from a crash state (recovery, then more work) owes what the
        run that left it promised."""
        self._inherited = True
        call = self._begin("before the power cut")
        promised: list[Fact] = []
        possible: list[Fact] = []
        for topic, t in sorted(expect.topics.items()):
            if not t.candidates:
                possible.append(TopicCreated(topic, 0, 1))
                promised.append(TopicDeleted(topic, 0))
            for inc, partitions in sorted(t.candidates.items()):
                created = TopicCreated(topic, inc, partitions)
                (promised if inc == t.must_exist else possible).append(created)
            if t.must_exist is not None:
                self.incarnation[topic] = t.must_exist
            for (inc, p), e in sorted(t.partitions.items()):
                for offset, value in sorted(e.values.items()):
                    key = e.keys.get(offset)
                    possible.append(
                        Appended(
                            topic, inc, p, offset, (value,),
                            None if offset not in e.keys else (key,),
                            e.times.get(offset, 0), e.units.get(offset + 1),
                        )
                    )  # fmt: skip
                if e.clean_limit:
                    possible.append(Cleaning(topic, inc, p, e.clean_limit, e.tombstones_before_ms))
                possible.append(StartMoved(topic, inc, p, e.start_moved))
                promised.append(Durable(topic, inc, p, e.durable_end))
                promised.append(StartDurable(topic, inc, p, e.start_durable))
        self.recorder.mark(End(call, "before the power cut", tuple(possible), promised=False))
        self._end(call, "before the power cut", promised)

    def tick(self, ms: int) -> None:
        self.clock.advance(ms)

    def appends(self, topic: str, partitions: int, rounds: int, flush_p: float) -> None:
        """``rounds`` appends of 1-4 records to random partitions, each maybe flushed."""
        for _ in range(rounds):
            p = self.rng.randrange(partitions)
            self.append(topic, p, self.rng.randint(1, 4))
            self.tick(self.rng.randint(1, 50))
            if self.rng.random() < flush_p:
                self.flush(topic, p)


# -- the workloads ------------------------------------------------------------------------


def appends_and_flushes(d: Driver, scale: int) -> None:
    """Appends with flushes at random points; rolls on small segments; a clean close."""
    d.open()
    d.create_topic("t", 1, dict(SMALL))
    d.appends("t", 1, 30 * scale, 0.2)
    d.roll("t", 0)
    d.appends("t", 1, 6 * scale, 0.0)
    d.close()


def flush_messages(d: Driver, scale: int) -> None:
    """``flush.messages=1``: every append is durable when it returns."""
    d.open()
    d.create_topic("f", 2, {**SMALL, "flush.messages": "1"})
    d.appends("f", 2, 24 * scale, 0.0)


def flush_ms(d: Driver, scale: int) -> None:
    """``flush.ms``: the manager's schedule flushes (``flush_due_logs``)."""
    d.open()
    d.create_topic("m", 2, {**SMALL, "flush.ms": "100"})
    for _ in range(12 * scale):
        d.appends("m", 2, 2, 0.0)
        d.tick(60)
        d.flush_due_logs()


def retention(d: Driver, scale: int) -> None:
    """Retention by size deleting segments, DeleteRecords, checkpoints, delayed deletes."""
    d.open()
    config = {**SMALL, "retention.bytes": "2800", "file.delete.delay.ms": "500"}
    d.create_topic("r", 1, config)
    for round_ in range(6 * scale):
        d.appends("r", 1, 5, 0.3)
        if round_ % 2 == 1:
            log = d._log("r", 0)
            d.delete_records("r", 0, (log.log_start_offset + log.log_end_offset) // 2)
        d.run_retention()
        d.tick(300)
        d.delete_expired_files()
        if round_ % 3 == 2:
            d.checkpoint()
    d.tick(1000)
    d.delete_expired_files()
    d.flush_dirty_logs()
    d.appends("r", 1, 4, 0.0)


def topics(d: Driver, scale: int) -> None:
    """Topics created, written, deleted and created again under the same name (after
    DeleteRecords and a checkpoint, so the checkpoints name the old partition), and a
    rendering change of an empty topic."""
    d.open()
    for round_ in range(scale):
        d.create_topic("a", 1, dict(SMALL))
        d.appends("a", 1, 8, 0.5)
        d.create_topic(f"b{round_}", 2, dict(SMALL))
        d.set_topic_rendering(f"b{round_}", "raw")
        d.appends(f"b{round_}", 2, 8, 0.3)
        d.delete_records("a", 0, d._log("a", 0).log_end_offset - 2)
        d.flush_dirty_logs()
        d.checkpoint()
        d.delete_topic("a")
        d.create_topic("a", 1, dict(SMALL))
        d.appends("a", 1, 6, 0.5)
        d.delete_topic("a")
    d.create_topic("a", 1, dict(SMALL))
    d.appends("a", 1, 4, 0.5)


def maintenance(d: Driver, scale: int) -> None:
    """The daemon's schedule: time-based rolls and retention, delayed deletions,
    ``flush.ms`` flushes and checkpoints, run whenever the manager says one is due."""
    d.open()
    config = {
        **SMALL,
        "segment.bytes": "100000",
        "segment.ms": "400",
        "retention.ms": "1500",
        "flush.ms": "250",
        "file.delete.delay.ms": "300",
    }
    d.create_topic("d", 2, config)
    for _ in range(12 * scale):
        d.appends("d", 2, 3, 0.0)
        d.tick(d.rng.randint(50, 200))
        if d._manager().next_maintenance_due_ms() <= d.clock.milliseconds():
            d.maintenance()


def reopen(d: Driver, scale: int) -> None:
    """A clean close and a reopen (the marker goes), then more appends and a crash."""
    d.open()
    d.create_topic("o", 1, dict(SMALL))
    d.appends("o", 1, 10 * scale, 0.3)
    d.close()
    d.tick(1000)
    d.open()
    d.appends("o", 1, 10 * scale, 0.3)
    d.close()
    d.open()
    d.appends("o", 1, 5 * scale, 0.0)


COMPACTED = {
    **SMALL,
    "cleanup.policy": "compact",
    "segment.bytes": "700",
    "delete.retention.ms": "1500",
}
"""A compacted topic's config: segments of a few records (several to clean each pass,
grouped back by ``segment.bytes``), tombstones kept 1.5 s after their first pass."""


def compaction(d: Driver, scale: int) -> None:
    """Log compaction: keyed records whose keys repeat (a few tombstones), flushed at
    points, and forced cleaning passes between the appends, on a topic with the
    position index (its groups swapped in together, units laid end to end) and one
    without (``plain...``: group by group); time passes, so that tombstones get a
    delete horizon and a later pass removes them. Passes after a reopen too."""
    d.open()
    d.create_topic("c", 1, dict(COMPACTED))
    d.create_topic("plainc", 1, dict(COMPACTED))
    for round_ in range(4 * scale):
        for topic in ("c", "plainc"):
            d.keyed_appends(topic, 1, 9, 6, 0.15)
        d.clean(["c", "plainc"])
        d.tick(600)
        if round_ == 1:
            d.close()
            d.open()
    d.keyed_appends("c", 1, 3, 6, 0.0)


def after_recovery(d: Driver, scale: int) -> None:
    """From a crash state: recovery, appends to every topic that must exist (flushed at
    random points, rolling), maybe retention, and a clean close half of the time. A
    compacted topic gets keyed records and a cleaning pass."""
    d.open()
    manager = d._manager()
    owned = [t for t in manager.topics() if t in d.incarnation]
    for _ in range(scale):
        for topic in owned:
            partitions = manager.topic(topic).partitions
            if manager.log(topic, 0).config.compact:
                d.keyed_appends(topic, partitions, 6, 6, 0.3)
            else:
                d.appends(topic, partitions, 6, 0.3)
        compacted = [t for t in owned if manager.log(t, 0).config.compact]
        if compacted:
            d.clean(compacted)
        if d.rng.random() < 0.5:
            d.run_retention()
    if d.rng.random() < 0.5:
        d.close()


WORKLOADS: dict[str, Callable[[Driver, int], None]] = {
    "appends_and_flushes": appends_and_flushes,
    "compaction": compaction,
    "flush_messages": flush_messages,
    "flush_ms": flush_ms,
    "maintenance": maintenance,
    "retention": retention,
    "topics": topics,
    "reopen": reopen,
}


def record_workload(
    name: str,
    root: Path,
    *,
    scale: int = 1,
    seed: int = 17,
    workload: Callable[[Driver, int], None] | None = None,
) -> Recording:
    """Run a workload on the empty directory ``root`` under a recorder.

    The driver's manager is left open at the end when the workload does not close it
    (its descriptors are released after the recording): the power cut comes anyway.
    """
    root.mkdir(parents=True, exist_ok=True)
    recorder = Recorder(root)
    clock = ManualClock()
    driver = Driver(root, recorder, clock, seed)
    run = workload if workload is not None else WORKLOADS[name]
    with recorder.recording():
        run(driver, scale)
    recorder.check_fidelity()
    if driver.manager is not None:
        _release(driver.manager)
    return Recording(name, recorder, Oracle(recorder.ops), clock.milliseconds())


def record_recovery(
    state: CrashState,
    expect: Expectation,
    root: Path,
    *,
    now_ms: int,
    name: str,
    scale: int = 1,
    seed: int = 17,
) -> Recording:
    """Materialise a crash state at ``root`` and record the recovery of it and what
    follows (``after_recovery``): a power cut during or after recovery must keep what
    the first run promised as well as what the second one does."""
    state.materialize(root)
    recorder = Recorder(root)
    clock = ManualClock(now_ms + 1000)
    driver = Driver(root, recorder, clock, seed)
    with recorder.recording():
        driver.inherit(expect)
        after_recovery(driver, scale)
    recorder.check_fidelity()
    if driver.manager is not None:
        _release(driver.manager)
    return Recording(name, recorder, Oracle(recorder.ops), clock.milliseconds())


def _release(manager: LogManager) -> None:
    # Let go of descriptors and the lock without writing anything (a crash would not).
    for log in manager.logs():
        for segment in log.segments.values():
            segment.close_handlers()
    manager._dir_lock.release()

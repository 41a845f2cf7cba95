"""The engine on a full disk: a ``LogManager`` driven through every operation that writes.

Run in a process of its own by ``test_disk_full.py`` (``python -m
tests.reliability.disk_full_engine FS KIND BLOCK``), once on the compiled engine and
once on the pure-Python one (``SEGLOG_PURE_PYTHON=1``): a store into an index page
without a block would kill the process with ``SIGBUS``, and that must fail the test,
not end the test run. It prints one JSON object: ``hits`` (the ``ENOSPC`` errors each
operation raised, by where they came from), ``cases`` (what each case saw) and
``problems`` (every broken invariant, with the case and step).

Each case opens a ``LogManager`` on the small file system as the daemon does (with the
position index), fills the disk with a ballast file (or leaves a few blocks of it free,
sweeping where inside an operation the space runs out), runs the operation, and checks:
an operation either succeeded or raised ``ENOSPC`` and changed nothing (every partition
holds exactly the records whose appends returned, no ``.log`` file is longer than the
engine's view of it, no file of a failed roll or create, no ``.tmp`` left, checkpoints
and metadata as before, ``Log._check()``); reads work meanwhile. Then the ballast goes,
every partition takes one more append, the manager closes and opens again, everything
is checked again and ``seglogfs verify`` finds nothing.
"""

from __future__ import annotations

import collections
import errno
import json
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import TypedDict

from seglogfs.cli.verify import verify_log_dir
from seglogfs.daemon.lines import RecordLimit, produce_lines
from seglogfs.positions import position_index_spec
from storage import (
    BrokerConfig,
    LogManager,
    StickyPartitioner,
    build_record_batch,
    partition_for_key,
)
from storage._build import SELECTION
from storage.log.checkpoint import read_offset_checkpoint
from storage.log.file_names import (
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    SEGLOG_TOPICS_FILE,
    parse_topic_partition_name,
)
from storage.log.topic import read_topics_document
from tests.conftest import ManualClock
from tests.reliability.small_fs import SmallFileSystem

__all__ = ["CASES", "Summary", "origin", "run"]

TopicPartition = tuple[str, int]

SWEEP_BLOCKS = 12
"""Sweeps leave 0, 1, ... up to this many blocks of the ballast free."""


def origin(exc: BaseException) -> str:
    """The operation an ``ENOSPC`` came from, read off its traceback (the innermost
    writer of a file that the error passed through)."""
    frames = traceback.extract_tb(exc.__traceback__)
    names = {frame.name for frame in frames}
    files = {Path(frame.filename).name for frame in frames}
    if "produce_lines" in names:
        return "produce file"
    if "create_topic" in names:
        return "topic create"
    if "set_topic_rendering" in names:
        return "format change"
    if "roll" in names:
        return "roll"
    if "write_offset_checkpoint" in names:
        return "checkpoint"
    # An index page without a block names the index file.
    filename = str(getattr(exc, "filename", None) or "")
    if filename.endswith(".seglogpos") or "extension_index.py" in files:
        return "position index"
    if filename.endswith((".index", ".timeindex")) or files & {"offset_index.py", "time_index.py"}:
        return "index"
    if "file_records.py" in files:
        return "append"
    return f"other ({frames[-1].name if frames else '?'})"


class Harness:
    """One case's manager, its model of what was acknowledged, and the checks."""

    def __init__(self, fs: SmallFileSystem, case: str) -> None:
        self.fs = fs
        self.case = case
        self.log_dir = fs.path / "logs"
        self.clock = ManualClock()
        self.acked: dict[TopicPartition, list[bytes]] = collections.defaultdict(list)
        self.hits: collections.Counter[str] = collections.Counter()
        self.problems: list[str] = []
        self.step = "open"
        self.manager = self.open()

    def open(self) -> LogManager:
        broker = BrokerConfig(log_dirs=(str(self.log_dir),), num_partitions=2)
        return LogManager.open(
            self.log_dir, broker, clock=self.clock, extension=position_index_spec
        )

    # -- what the operations do ------------------------------------------------------

    @contextmanager
    def full(self, step: str, leave_blocks: int = 0) -> Iterator[None]:
        """The disk full (but ``leave_blocks`` blocks) for the block; checked after."""
        self.step = step
        self.fs.fill()
        if leave_blocks:
            self.fs.leave(leave_blocks * self.fs.block_size)
        try:
            yield
            self.check()
        finally:
            self.fs.free()

    def enospc(self, action: Callable[[], object]) -> bool:
        """Run ``action``; True if it worked, False (counted) if it raised ``ENOSPC``."""
        try:
            action()
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            self.hits[origin(exc)] += 1
            return False
        return True

    def append(self, tp: TopicPartition, values: list[bytes], **kwargs: int) -> bool:
        """Append ``values`` as one call; the model takes them if it returned."""
        log = self.manager.log(*tp)
        if self.enospc(lambda: log.append(values, **kwargs)):  # type: ignore[arg-type]
            self.acked[tp].extend(values)
            return True
        return False

    def problem(self, what: str) -> None:
        self.problems.append(f"{self.case}: {self.step}: {what}")

    # -- the checks --------------------------------------------------------------------

    def check(self) -> None:
        """Every invariant of the manager and the files (see the module)."""
        manager = self.manager
        try:
            recorded = read_topics_document(self.log_dir / SEGLOG_TOPICS_FILE).topics
        except Exception as exc:
            self.problem(f"metadata unreadable: {exc}")
            recorded = {}
        if set(recorded) != set(manager.topics()):
            self.problem(f"metadata names {sorted(recorded)}, the manager {manager.topics()}")
        for name in (RECOVERY_POINT_CHECKPOINT, LOG_START_OFFSET_CHECKPOINT):
            try:
                read_offset_checkpoint(self.log_dir / name)
            except Exception as exc:
                self.problem(f"{name} unreadable: {exc}")
        for dirpath, _dirs, files in os.walk(self.log_dir):
            for name in files:
                if name.endswith(".tmp"):
                    self.problem(f"{dirpath}/{name} left behind")
        for entry in os.listdir(self.log_dir):
            parsed = parse_topic_partition_name(entry)
            if parsed is not None and parsed[0] not in manager.topics():
                self.problem(f"{entry} belongs to no topic")
        for topic in manager.topics():
            for partition in range(manager.topic(topic).partitions):
                try:
                    self.check_log((topic, partition))
                except Exception as exc:
                    self.problem(f"{topic}-{partition}: {type(exc).__name__}: {exc}")

    def check_log(self, tp: TopicPartition) -> None:
        log = self.manager.log(*tp)
        log._check()
        expected = self.acked[tp]
        values = [record.value for record in log.records(log.log_start_offset)]
        if values != expected[log.log_start_offset :]:
            self.problem(
                f"{tp}: {len(values)} records from offset {log.log_start_offset}, "
                f"{len(expected)} acknowledged"
            )
        if log.log_end_offset != len(expected):
            self.problem(f"{tp}: log end {log.log_end_offset}, {len(expected)} acknowledged")
        expected_files = {log.extension.start_checkpoint_name} if log.extension else set()
        for segment in log.segments.values():
            on_disk = os.path.getsize(segment.path)
            if on_disk != segment.size:
                self.problem(f"{segment.path.name}: {on_disk} bytes on disk, {segment.size} valid")
            expected_files.add(segment.path.name)
            expected_files.update(index.path.name for index in segment.indexes())
        for name in os.listdir(log.dir):
            if name not in expected_files and not name.endswith(".deleted"):
                self.problem(f"{log.dir.name}/{name}: a file of no segment")

    def restart(self) -> None:
        """Room again: write, close, open, check, verify."""
        self.step = "after the disk was freed"
        self.fs.free()
        for topic in self.manager.topics():
            for partition in range(self.manager.topic(topic).partitions):
                if not self.append((topic, partition), [b"after %d" % partition]):
                    self.problem(f"{topic}-{partition}: no append with room again")
        self.check()
        self.step = "close"
        self.manager.close()
        self.step = "reopen"
        self.manager = self.open()
        self.check()
        self.manager.close()
        for problem in verify_log_dir(self.log_dir):
            self.problem(f"verify: {problem}")


# -- the cases ------------------------------------------------------------------------


def case_append(h: Harness) -> None:
    """Appends on a full disk: until the last block's slack is used, then ``ENOSPC``."""
    h.manager.create_topic("a")
    for i in range(50):
        h.append(("a", 0), [b"record %d " % i + b"x" * 100])
    with h.full("small appends fill the slack"):
        while h.append(("a", 0), [b"y" * 100]):
            pass
        h.append(("a", 0), [b"z" * 10000])
        h.append(("a", 1), [b"z" * 5000, b"w" * 5000])


def case_append_mid_write(h: Harness) -> None:
    """A batch larger than the room left: the ``write`` stops part way; the engine cuts
    the file back to the batch start. Also several batches in one ``write``."""
    h.manager.create_topic("m", config={"max.message.bytes": "4096"})
    h.append(("m", 0), [b"first"])
    for blocks in range(1, SWEEP_BLOCKS):
        with h.full(f"one 16-KB batch, {blocks} block(s) free", blocks):
            h.append(("m", 0), [b"%d" % blocks + b"b" * 1000 for _ in range(16)])
        with h.full(f"eight batches in one write, {blocks} block(s) free", blocks):
            h.append(("m", 1), [b"%d" % blocks + b"c" * 3000 for _ in range(8)])


def case_produce_file(h: Harness) -> None:
    """Keyed lines written to a topic's ``produce`` file go to three partitions, with
    0, 1, 2... blocks free: the write is all or nothing (a write refused after some
    partitions took their lines would have them appended again by the writer's retry;
    it cannot be cut short at a line end, the partitions' lines interleave)."""
    h.manager.create_topic("k", partitions=3, key_separator=":")
    logs = [h.manager.log("k", p) for p in range(3)]
    limit = RecordLimit.of(logs[0].config, h.manager.topic("k"))
    sticky = StickyPartitioner(3)
    for blocks in range(SWEEP_BLOCKS + 4):
        lines = [b"key%d:%d %s" % (i, blocks, b"v" * 600) for i in range(12)]
        data = b"".join(line + b"\n" for line in lines)
        with h.full(f"keyed lines to the produce file, {blocks} block(s) free", blocks):
            ends = [log.log_end_offset for log in logs]
            produced = h.enospc(partial(produce_lines, logs.__getitem__, 3, data, limit, sticky))
            added = [log.log_end_offset - end for log, end in zip(logs, ends, strict=True)]
            if produced:
                for line in lines:
                    key, value = line.split(b":", 1)
                    h.acked[("k", partition_for_key(key, 3))].append(value)
            elif any(added):
                h.problem(f"a refused write appended {added} records to the partitions")
                for p, log in enumerate(logs):
                    h.acked[("k", p)].extend(r.value for r in log.records(ends[p]))  # type: ignore[misc]


def _fill_segment(h: Harness, tp: TopicPartition, size: int, segment_bytes: int) -> None:
    """Append records of ``size`` bytes until the next one must roll the segment."""
    log = h.manager.log(*tp)
    while log.active_segment.size + size + 100 <= segment_bytes:
        if not h.append(tp, [b"r" * size]):
            raise AssertionError("no room to fill the segment")


def case_roll(h: Harness) -> None:
    """The append that rolls the segment, with 0, 1, 2... blocks free: the roll fails
    whole (no file of the new segment), or the append after it does."""
    h.manager.create_topic("r", config={"segment.bytes": "8192", "segment.ms": "60000"})
    log = h.manager.log("r", 0)
    for blocks in range(SWEEP_BLOCKS):
        _fill_segment(h, ("r", 0), 1000, 8192)
        segments = log.number_of_segments
        with h.full(f"a roll, {blocks} block(s) free", blocks):
            rolled = h.append(("r", 0), [b"roll %d " % blocks + b"r" * 1000])
            if not rolled and log.number_of_segments not in (segments, segments + 1):
                h.problem(f"{log.number_of_segments} segments after a failed roll")
    # Roll by time (the daemon's maintenance), on a full disk.
    h.append(("r", 1), [b"quiet"])
    h.clock.advance(120_000)
    with h.full("a roll by segment.ms"):
        h.enospc(h.manager.roll_due_segments)


def case_position_index(h: Harness) -> None:
    """The append whose position-index entry needs a new page of ``.seglogpos``: with the
    disk full it fails whole, although its bytes would fit in the ``.log``'s last block."""
    h.manager.create_topic("p", partitions=1, config={"index.interval.bytes": "1048576"})
    log = h.manager.log("p", 0)
    extension = log.active_segment.extension
    assert extension is not None
    per_page = os.sysconf("SC_PAGE_SIZE") // extension.ENTRY_SIZE
    # A line renders as itself and its newline: each append of more than 4096 bytes
    # gives the next append an entry, so page 0 is full after ``per_page`` appends.
    while extension.entries < per_page - 1:
        h.append(("p", 0), [b"v" * 4100])
    # The last one is sized to leave room in the .log's last block.
    block = h.fs.block_size
    size = log.active_segment.size
    length = 4100
    while not 0 < (size + len(build_record_batch([b"v" * length], timestamps=0))) % block < 512:
        length += 1
    h.append(("p", 0), [b"v" * length])
    assert extension.entries == per_page, extension
    with h.full("an entry on a new page of the position index"):
        log_size = log.active_segment.size
        if h.append(("p", 0), [b"u"]):
            h.problem(
                "an append was acknowledged whose position-index entry had no block "
                f"(entries {extension.entries})"
            )
        elif log.active_segment.size != log_size:
            h.problem("a failed append changed the .log")


def case_checkpoint(h: Harness) -> None:
    """Checkpoints on a full disk fail and leave the old file (and no ``.tmp``); a close
    that cannot checkpoint raises and leaves the shutdown unclean: the next open
    recovers."""
    h.manager.create_topic("c")
    h.append(("c", 0), [b"checkpointed"])
    h.manager.checkpoint()
    before = {
        name: (h.log_dir / name).read_bytes()
        for name in (RECOVERY_POINT_CHECKPOINT, LOG_START_OFFSET_CHECKPOINT)
    }
    h.manager.log("c", 0).flush()
    for blocks in range(3):
        with h.full(f"checkpoints, {blocks} block(s) free", blocks):
            h.enospc(h.manager.checkpoint_recovery_points)
            h.enospc(h.manager.checkpoint_log_start_offsets)
            for name, data in before.items():
                now = (h.log_dir / name).read_bytes()
                if now != data and read_offset_checkpoint(h.log_dir / name) == {}:
                    h.problem(f"{name} lost its entries")
    # A close on a full disk: it trims the indexes first, which may give the
    # checkpoints their room; if not, the shutdown stays unclean.
    h.step = "close"
    h.fs.fill()
    try:
        h.enospc(h.manager.close)
    finally:
        h.fs.free()
    h.step = "reopen after a close on a full disk"
    h.manager = h.open()
    h.check()


def case_retention(h: Harness) -> None:
    """Retention on a full disk deletes segments all the same (how a disk gets room
    again), and the positions after them survive a restart although the start
    checkpoint could not be written."""
    h.manager.create_topic("d", partitions=1, config={"segment.bytes": "4096"})
    for i in range(40):
        h.append(("d", 0), [b"%d " % i + b"d" * 500])
    log = h.manager.log("d", 0)
    with h.full("retention"):
        # Kafka's DeleteRecords: the segments wholly below offset 20 are deletable.
        log.advance_log_start_offset(20)
        h.enospc(h.manager.run_retention)
        start, start_units = log.log_start_offset, log.extension_start
        if start < 20:
            h.problem(f"retention deleted nothing: log start {start}")
    h.manager.close()
    h.step = "reopen after retention on a full disk"
    h.manager = h.open()
    log = h.manager.log("d", 0)
    if (log.log_start_offset, log.extension_start) != (start, start_units):
        h.problem(
            f"log start and positions {(log.log_start_offset, log.extension_start)} after "
            f"the restart, {(start, start_units)} before"
        )
    h.check()


def case_topic_create(h: Harness) -> None:
    """A topic create on a full disk fails at its commit point: no topic, no file."""
    h.manager.create_topic("e")
    with h.full("a topic create"):
        if h.enospc(lambda: h.manager.create_topic("n")):
            h.problem("a topic was created on a full disk")


def case_format_change(h: Harness) -> None:
    """A format change of an empty topic with 0, 1, 2... blocks free: the topic keeps
    its rendering, or gets the new one whole, and its logs stay open either way."""
    h.manager.create_topic("f")
    for blocks in range(SWEEP_BLOCKS):
        before = h.manager.topic("f").format
        target = "raw" if before == "lines" else "lines"
        with h.full(f"a format change, {blocks} block(s) free", blocks):
            changed = h.enospc(partial(h.manager.set_topic_rendering, "f", target, None))
            after = h.manager.topic("f").format
            if after != (target if changed else before):
                h.problem(f"format {after} after a change from {before} that returned {changed}")
            if any(log.closed for log in h.manager.logs()):
                h.problem("a log of the topic is closed")


CASES: dict[str, Callable[[Harness], None]] = {
    "append": case_append,
    "append mid-write": case_append_mid_write,
    "produce file": case_produce_file,
    "roll": case_roll,
    "position index": case_position_index,
    "checkpoint": case_checkpoint,
    "retention": case_retention,
    "topic create": case_topic_create,
    "format change": case_format_change,
}


class Summary(TypedDict):
    """What ``run`` prints (as JSON)."""

    build: str
    hits: dict[str, int]
    cases: dict[str, dict[str, int]]
    problems: list[str]


def run(fs: SmallFileSystem, names: list[str]) -> Summary:
    """Run the named cases on ``fs`` (cleared before each); the JSON summary."""
    hits: collections.Counter[str] = collections.Counter()
    problems: list[str] = []
    cases: dict[str, dict[str, int]] = {}
    for name in names:
        fs.clear()
        h = Harness(fs, name)
        try:
            CASES[name](h)
            h.restart()
        except Exception:
            h.problem(traceback.format_exc())
        hits.update(h.hits)
        cases[name] = dict(h.hits)
        problems.extend(h.problems)
    return {
        "build": "compiled" if SELECTION.compiled else "pure",
        "hits": dict(hits),
        "cases": cases,
        "problems": problems,
    }


def main(argv: list[str]) -> int:
    path, kind, block, *names = argv
    fs = SmallFileSystem(Path(path), kind, int(block))
    print(json.dumps(run(fs, names or list(CASES))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

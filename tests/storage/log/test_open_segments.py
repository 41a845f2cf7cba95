"""Descriptors and mappings bounded whatever the number of segments (issue #18, item 2).

A partition of many small segments (``segment.bytes=14``, Kafka's minimum, rolls one
per append) used to hold every segment's files open and mapped: at 6,657 segments a
daemon ran out of descriptors, and a roll that met ``EMFILE`` half way left a segment
no tool could verify. Sealed segments are now opened on use and the least recently
used closed (``OpenSegments``), and a roll creates its new segment before it seals the
old one (``Log.roll``).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import resource
import shutil
import struct
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from seglogfs.cli.verify import verify_log_dir
from seglogfs.positions import position_index_spec
from storage import Log, LogConfig
from storage.errors import SegmentDeletedError
from storage.log.segment import OPEN_SEGMENTS, OpenSegments
from storage.log.topic import TopicMetadata
from storage.record.batch_builder import build_record_batch
from tests.conftest import ManualClock
from tests.storage.test_concurrency import DURATIONS
from tests.storage.test_concurrency import (
    test_reader_threads_during_appends_rolls_and_deletions as readers_beside_a_writer,
)

ROOT = Path(__file__).resolve().parents[3]

SPEC = position_index_spec(TopicMetadata("t", 1))
"""The daemon's position index (``.seglogpos``), so that ``verify`` checks it too."""


def value_of(offset: int) -> bytes:
    return b"record %d" % offset


def descriptors_under(directory: Path) -> int:
    """Descriptors this process holds on files below ``directory``."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor, closed by now
            count += os.readlink(f"/proc/self/fd/{fd}").startswith(f"{directory}/")
    return count


def mappings_under(directory: Path) -> int:
    """Memory mappings of this process of files below ``directory``."""
    with open("/proc/self/maps") as maps:
        return sum(f" {directory}/" in line for line in maps)


def run_script(script: str, *args: object) -> dict[str, Any]:
    """Run ``script`` in a fresh interpreter (its own descriptor limit) from the
    repository root; return the JSON object its last output line holds."""
    result = subprocess.run(
        [sys.executable, "-c", script, *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert result.returncode == 0, (result.returncode, result.stderr[-3000:])
    summary: dict[str, Any] = json.loads(result.stdout.splitlines()[-1])
    return summary


@pytest.fixture
def memory_dir(tmp_path: Path) -> Iterator[Path]:
    """A log directory in memory (``/dev/shm``) where there is one: rolls fsync, and
    fsyncs on a disk make tests of thousands of rolls slow for nothing."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield tmp_path
        return
    directory = Path(tempfile.mkdtemp(prefix="seglog-test-", dir=shm))
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@contextlib.contextmanager
def no_descriptor_left(spare: int = 0) -> Iterator[None]:
    """Until the block ends, this process can open only ``spare`` more descriptors,
    plus those it closes: the soft ``RLIMIT_NOFILE`` is lowered to just above the
    highest descriptor open, and every free one below it is taken (what a daemon's
    other clients do meanwhile)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    highest = max(int(fd) for fd in os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (highest + 1 + spare, hard))
    held: list[int] = []
    try:
        while True:
            try:
                held.append(os.open("/dev/null", os.O_RDONLY))
            except OSError as exc:
                if exc.errno != errno.EMFILE:
                    raise
                break
        for _ in range(spare):
            os.close(held.pop())
        yield
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


# -- regression tests of issue #18 (2) ----------------------------------------------------

_MANY_SEGMENTS = r"""
import json, os, random, resource, sys
from pathlib import Path
from seglogfs.positions import position_index_spec
from storage import Log, LogConfig, OffsetOutOfRangeError
from storage.errors import SegmentDeletedError
from storage.log.segment import OPEN_SEGMENTS, OpenSegments
from storage.log.topic import TopicMetadata

from tests.storage.log.test_open_segments import descriptors_under, mappings_under

directory, limit, appends = Path(sys.argv[1]) / "t-0", int(sys.argv[2]), int(sys.argv[3])
resource.setrlimit(resource.RLIMIT_NOFILE, (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
spec = position_index_spec(TopicMetadata("t", 1))
peak = {"fds": 0, "maps": 0}

def measure():
    peak["fds"] = max(peak["fds"], descriptors_under(directory))
    peak["maps"] = max(peak["maps"], mappings_under(directory))

def value(offset):
    return b"record %d" % offset

rng = random.Random(18)
log = Log.open(directory, LogConfig(segment_bytes=14), extension=spec)
for i in range(appends):
    log.append([value(i)])
    if i % 5 == 0:
        offset = rng.randrange(0, i + 1)
        assert next(log.records(offset)).value == value(offset)
        measure()
segments = log.number_of_segments
assert [r.value for r in log.records(0)] == [value(i) for i in range(appends)]
measure()
log.close()
# A mount of the same directory under the same limit: every segment is loaded.
log = Log.open(directory, LogConfig(segment_bytes=14), extension=spec)
for offset in rng.sample(range(appends), 200):
    assert next(log.records(offset)).value == value(offset)
    measure()
log.append([value(appends)])
assert [r.offset for r in log.records(appends - 3)] == list(range(appends - 3, appends + 1))
measure()
# A reader (the command line, Spark) beside the writer, under the same limit.
reader = Log.open(directory, LogConfig(segment_bytes=14), extension=spec, writable=False)
assert [r.value for r in reader.records(0)] == [value(i) for i in range(appends + 1)]
for offset in rng.sample(range(appends), 200):
    assert next(reader.records(offset)).value == value(offset)
    measure()
reader.close()
log.close()
print(json.dumps({"segments": segments, **peak}))
"""


def test_many_more_segments_than_descriptors_under_a_lowered_limit(memory_dir: Path) -> None:
    """Issue #18 (2): 300 segments of one record each under ``RLIMIT_NOFILE=128`` (each
    open segment held 4 descriptors: the limit was reached at about 25). Appends, reads
    of every record, a reopen and reads after it, and a reader beside the writer all
    work, and the descriptors and mappings of the log's files stay within the bound
    derived from the limit: at most a quarter of it for sealed segments (128 // 4 // 7
    = 4 segments of at most 7 descriptors (a reader's) and 3 mappings each), plus the
    writer's active segment (4 and 3) and the reader's (7 and 3)."""
    appends = 300
    summary = run_script(_MANY_SEGMENTS, memory_dir, 128, appends)
    assert summary["segments"] == appends
    bound = 128 // 4 // 7
    assert summary["fds"] <= 7 * bound + 4 + 7, summary
    assert summary["maps"] <= 3 * bound + 3 + 3, summary
    assert verify_log_dir(memory_dir) == []


@pytest.mark.parametrize("spare", range(12))
def test_a_roll_out_of_descriptors_leaves_a_consistent_appendable_log(
    log_dir: Path, clock: ManualClock, spare: int
) -> None:
    """Issue #18 (2): a roll that met ``EMFILE`` part way left the new segment half
    made (its ``.index`` preallocated, its position index without entry 0, which
    ``verify`` rejects) and the old one sealed. With ``spare`` descriptors left
    (every step of the roll in turn runs out), the roll either completes or leaves
    the old segment active with its indexes intact; either way ``verify`` finds
    nothing, and once descriptors are back the log appends and rolls."""
    directory = log_dir / "t-0"
    log = Log.open(directory, LogConfig(segment_bytes=14), clock=clock, extension=SPEC)
    for i in range(3):
        log.append([value_of(i)])
    before = log.number_of_segments
    with no_descriptor_left(spare):
        try:
            log.append([value_of(3)])
        except OSError as exc:
            error: int | None = exc.errno
        else:
            error = None
    assert error in (None, errno.EMFILE)
    appended = int(error is None)
    assert log.log_end_offset == 3 + appended
    assert log.number_of_segments == before + appended
    log._check()
    assert verify_log_dir(log_dir) == []
    log.append([value_of(3 + appended)])
    log.append([value_of(4 + appended)])
    assert [r.value for r in log.records(0)] == [value_of(i) for i in range(5 + appended)]
    log._check()
    log.close()
    assert verify_log_dir(log_dir) == []


class _FailingCalls:
    """Makes the ``fail_at``-th call (counting from 1) among the file-system calls a
    roll makes fail with ``error``; the calls before and after it run as usual."""

    NAMES = ("open", "ftruncate", "truncate", "write", "pwrite", "fdatasync", "fsync", "dup")

    def __init__(self, monkeypatch: pytest.MonkeyPatch, fail_at: int, error: int) -> None:
        self.calls = 0
        self.failed = False
        for name in self.NAMES:
            monkeypatch.setattr(os, name, self._wrap(getattr(os, name), name, fail_at, error))

    def _wrap(self, real: object, name: str, fail_at: int, error: int) -> object:
        def call(*args: object, **kwargs: object) -> object:
            self.calls += 1
            if self.calls == fail_at:
                self.failed = True
                raise OSError(error, f"{os.strerror(error)} (injected into os.{name})")
            return real(*args, **kwargs)  # type: ignore[operator]

        return call


@pytest.mark.parametrize("error", [errno.ENOSPC, errno.EMFILE, errno.EIO])
def test_a_roll_failing_at_any_step_is_all_or_nothing(
    memory_dir: Path, clock: ManualClock, error: int
) -> None:
    """Each file-system call of a roll fails in turn (``ENOSPC``, ``EMFILE``, ``EIO``):
    the roll either completes or raises with the old segment still active and whole
    (never a half-made new segment, never an old one sealed under a failed roll), the
    log stays consistent, ``verify`` finds nothing, and the next append rolls."""
    fail_at = 1
    while True:
        root = memory_dir / str(fail_at)
        directory = root / "t-0"
        log = Log.open(directory, LogConfig(segment_bytes=14), clock=clock, extension=SPEC)
        log.append([value_of(0)])
        log.append([value_of(1)])
        before = sorted(os.listdir(directory))
        with pytest.MonkeyPatch.context() as monkeypatch:
            calls = _FailingCalls(monkeypatch, fail_at, error)
            try:
                log.roll()
            except OSError as exc:
                raised: int | None = exc.errno
            else:
                raised = None
        if raised is not None:
            assert raised == error
            assert calls.failed
            assert sorted(os.listdir(directory)) == before, fail_at
            # The old segment is still the active one, its indexes as they were.
            assert log.active_segment.base_offset == 1
            assert log.active_segment.offset_index.max_entries > 0
            assert log.active_segment.time_index.max_entries > 1
        log._check()
        assert verify_log_dir(root) == [], fail_at
        log.append([value_of(log.log_end_offset)])
        log.append([value_of(log.log_end_offset)])
        assert [r.value for r in log.records(0)] == [value_of(i) for i in range(log.log_end_offset)]
        log._check()
        log.close()
        assert verify_log_dir(root) == [], fail_at
        if not calls.failed:
            break  # the roll made fewer calls than fail_at: every step was tried
        fail_at += 1
    assert fail_at > 8  # so many calls: every step was reached


_FULL_DISK_ROLL = r"""
import errno, json, os, sys
from pathlib import Path
from seglogfs.positions import position_index_spec
from storage import Log, LogConfig, OffsetOutOfRangeError
from storage.errors import SegmentDeletedError
from storage.log.segment import OPEN_SEGMENTS, OpenSegments
from storage.log.topic import TopicMetadata

root = Path(sys.argv[1])
log = Log.open(root / "t-0", LogConfig(), extension=position_index_spec(TopicMetadata("t", 1)))
log.append([b"before the disk filled"])
with open(root / "filler", "wb", buffering=0) as filler:
    try:
        while True:
            filler.write(b"f" * 4096)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
try:
    log.roll()
    roll = "rolled"
except OSError as exc:
    roll = errno.errorcode[exc.errno]
os.unlink(root / "filler")
log.append([b"after"])
log.roll()
log.append([b"rolled"])
print(json.dumps({"roll": roll, "values": [r.value.decode() for r in log.records(0)]}))
log.close()
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs to fill needs root")
def test_a_roll_on_a_full_disk_fails_cleanly_instead_of_killing_the_process(
    tmp_path: Path,
) -> None:
    """A roll on a full file system wrote the new position index's entry 0 and the old
    segment's final time-index entry through their mappings, into pages without a
    block: the process died of ``SIGBUS``. Pages are now faulted in first
    (``MADV_POPULATE_WRITE``): the roll fails with ``ENOSPC``, changes nothing, and
    works once there is room again."""
    small = tmp_path / "small"
    small.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(small)])
    assert made.returncode == 0, "a tmpfs is needed to fill a disk"
    try:
        summary = run_script(_FULL_DISK_ROLL, small)
        assert summary == {
            "roll": "ENOSPC",
            "values": ["before the disk filled", "after", "rolled"],
        }
        assert verify_log_dir(small) == []
    finally:
        subprocess.run(["umount", "-l", str(small)], check=False)


# -- the least recently used segments are released, and open again on use ----------------


@pytest.fixture
def open_segments(monkeypatch: pytest.MonkeyPatch) -> OpenSegments:
    """The process's ``OpenSegments`` with a bound of 2 for the test, emptied first."""
    OPEN_SEGMENTS.shed()
    monkeypatch.setattr(OPEN_SEGMENTS, "max_open", 2)
    return OPEN_SEGMENTS


def many_segments(directory: Path, clock: ManualClock, count: int, **config: int) -> Log:
    """A log of ``count`` segments of one record each (``value_of(offset)``)."""
    log_config = LogConfig(segment_bytes=14, **config)  # type: ignore[arg-type]
    log = Log.open(directory, log_config, clock=clock, extension=SPEC)
    for offset in range(count):
        log.append([value_of(offset)])
        clock.advance(1)
    return log


def open_segment_count(log: Log) -> int:
    return sum(segment.is_open for segment in log.segments.values())


def test_the_bound_is_log_segment_open_max_within_a_share_of_the_descriptor_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert OpenSegments(5).limit() == min(5, soft // 28)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (280, hard))
        assert OpenSegments().limit() == 10  # 280 // 4 // 7
        assert OpenSegments(3).limit() == 3
        resource.setrlimit(resource.RLIMIT_NOFILE, (20, hard))
        assert OpenSegments().limit() == 1
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_only_the_most_recently_used_segments_stay_open(
    log_dir: Path, clock: ManualClock, open_segments: OpenSegments
) -> None:
    log = many_segments(log_dir / "t-0", clock, 20)
    directory = log.dir
    # The active segment (pinned) and the bound's 2 sealed ones.
    assert open_segment_count(log) <= 3
    assert log.active_segment.is_open
    assert descriptors_under(directory) <= 3 * 4
    assert mappings_under(directory) <= 3 * 3
    for offset in (3, 11, 7):
        assert next(log.records(offset)).value == value_of(offset)
    segments = log.segments.values()
    assert [s.base_offset for s in segments if s.is_open] == [7, 11, 19]
    assert len(open_segments) == 2
    log._check()
    log.close()
    assert descriptors_under(directory) == 0
    assert len(open_segments) == 0


def test_a_released_segment_reads_the_same_bytes_again(
    log_dir: Path, clock: ManualClock, open_segments: OpenSegments
) -> None:
    log = many_segments(log_dir / "t-0", clock, 12, index_interval_bytes=0)
    expected = [(r.offset, r.value, r.timestamp) for r in log.records(0)]
    units = [sum(len(value_of(i)) + 1 for i in range(offset)) for offset in range(12)]
    open_segments.shed()
    assert open_segment_count(log) == 1  # the active one
    assert [(r.offset, r.value, r.timestamp) for r in log.records(0)] == expected
    for offset, _value, timestamp in expected:
        open_segments.shed()
        assert log.offset_for_timestamp(timestamp) == offset
        assert next(log.records(offset)).value == value_of(offset)
        open_segments.shed()
        assert log.extension_position(offset) == (offset, units[offset])
    log._check()
    log.close()
    # A reader, whose indexes keep their view across a release.
    reader = Log.open(log_dir / "t-0", LogConfig(), extension=SPEC, writable=False)
    open_segments.shed()
    assert [(r.offset, r.value, r.timestamp) for r in reader.records(0)] == expected
    reader.close()


def test_a_segment_deleted_while_released_is_not_made_again(
    log_dir: Path, clock: ManualClock, open_segments: OpenSegments
) -> None:
    """Retention renames a released segment (by name, no descriptor needed); a read of
    it during ``file.delete.delay.ms`` opens the renamed file; after the delay a read
    raises ``SegmentDeletedError`` and creates no file."""
    log = many_segments(log_dir / "t-0", clock, 6, retention_bytes=200, file_delete_delay_ms=1000)
    first = log.segments.first_segment
    assert first is not None
    scan = log.records(0)  # reads its first batch now, then holds the segment
    assert next(scan).value == value_of(0)
    open_segments.shed()
    assert not first.is_open
    assert log.delete_old_segments() > 0
    assert first.path.name == "00000000000000000000.log.deleted"
    assert len(list(first.batches())) == 1  # opened again, as .deleted
    open_segments.shed()
    clock.advance(1000)
    log.delete_expired_files()
    with pytest.raises(SegmentDeletedError):
        list(first.batches())
    with pytest.raises(SegmentDeletedError):
        first.translate_offset(0)
    with pytest.raises(SegmentDeletedError):
        list(scan)  # the read that was under way: retention passed it
    assert not any(name.startswith("00000000000000000000") for name in os.listdir(log.dir))
    log._check()
    log.close()
    assert verify_log_dir(log_dir) == []


def test_a_file_replaced_while_released_is_not_read(
    log_dir: Path, clock: ManualClock, open_segments: OpenSegments
) -> None:
    """A reader's released segment whose ``.log`` is now another file (a writer's
    recovery made it anew): reading it raises ``SegmentDeletedError``, never serves
    the other file's bytes as this segment's (told by the inode; see ``FileRecords``
    for a number reused)."""
    writer = many_segments(log_dir / "t-0", clock, 4)
    writer.close()
    reader = Log.open(log_dir / "t-0", LogConfig(), extension=SPEC, writable=False)
    segment = reader.segments.floor_segment(1)
    assert segment is not None
    open_segments.shed()
    copy = segment.path.with_suffix(".copy")
    shutil.copyfile(segment.path, copy)
    os.replace(copy, segment.path)  # the same bytes in another file
    with pytest.raises(SegmentDeletedError):
        next(reader.records(1))
    assert next(reader.records(2)).value == value_of(2)
    reader.close()


def test_out_of_descriptors_the_released_segments_are_shed_first(
    log_dir: Path, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no descriptor left, opening a segment again releases the other unpinned
    segments and tries once more: a read succeeds where it would fail."""
    OPEN_SEGMENTS.shed()
    monkeypatch.setattr(OPEN_SEGMENTS, "max_open", 10)
    log = many_segments(log_dir / "t-0", clock, 12)
    for offset in range(1, 11):
        assert next(log.records(offset)).value == value_of(offset)
    assert len(OPEN_SEGMENTS) == 10
    first = log.segments.first_segment
    assert first is not None
    assert not first.is_open
    with no_descriptor_left():
        assert next(log.records(0)).value == value_of(0)
        assert first.is_open
        assert len(OPEN_SEGMENTS) == 1
        log.append([value_of(12)])  # a roll, too, once it has shed
    assert log.log_end_offset == 13
    log._check()
    log.close()
    assert verify_log_dir(log_dir) == []


def test_pinned_segments_are_never_released(
    log_dir: Path, clock: ManualClock, open_segments: OpenSegments
) -> None:
    log = many_segments(log_dir / "t-0", clock, 5)
    active = log.active_segment
    assert active.pins == 1
    open_segments.shed()
    assert active.is_open
    sealed = log.segments.first_segment
    assert sealed is not None
    with sealed.pinned():
        assert next(log.records(0)).value == value_of(0)
        open_segments.shed()
        assert sealed.is_open
    assert sealed.pins == 0
    assert sealed in open_segments
    log.close()
    assert sealed not in open_segments


@pytest.mark.parametrize("seconds", DURATIONS)
def test_reader_threads_while_segments_are_released_rolled_and_deleted(
    memory_dir: Path, open_segments: OpenSegments, seconds: float
) -> None:
    """``test_concurrency``'s reader threads (random reads, lookups by time and by
    units) beside a writer that appends, rolls and deletes, with the bound at 2: the
    segments they read are released under them all the time, and every record is still
    the right one, the only errors the documented ``OffsetOutOfRangeError``s."""
    releases = open_segments.releases
    readers_beside_a_writer(memory_dir, seconds)
    assert open_segments.releases - releases >= 20
    assert len(open_segments) == 0
    assert descriptors_under(memory_dir) == 0
    assert mappings_under(memory_dir) == 0


# -- a partition of 100,000 segments ------------------------------------------------------

TIMESTAMP_MS = 1_700_000_000_000


def write_one_record_segments(directory: Path, count: int) -> None:
    """Write ``count`` closed segments of one record each into ``directory`` as a writer
    leaves them (what ``segment.bytes=14`` makes, without the fsyncs of ``count``
    rolls): record ``k`` (value ``v%07d``, 8 bytes, rendered 9) is segment ``k``'s batch;
    its ``.index`` is empty (a segment's first batch is never indexed), its
    ``.timeindex`` holds the final entry, its ``.seglogpos`` its entry 0."""
    directory.mkdir(parents=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    parent = os.open(directory, os.O_RDONLY)
    try:
        for k in range(count):
            batch = build_record_batch([b"v%07d" % k], timestamps=TIMESTAMP_MS + k, base_offset=k)
            for suffix, data in (
                (".log", batch),
                (".index", b""),
                (".timeindex", struct.pack(">qi", TIMESTAMP_MS + k, 0)),
                (".seglogpos", struct.pack(">qi", 9 * k, 0)),
            ):
                fd = os.open(f"{k:020d}{suffix}", flags, 0o644, dir_fd=parent)
                try:
                    os.write(fd, data)
                finally:
                    os.close(fd)
    finally:
        os.close(parent)


_HUNDRED_THOUSAND = r"""
import json, os, random, resource, sys, time
from pathlib import Path
from seglogfs.positions import position_index_spec
from storage import Log, LogConfig
from storage.log.topic import TopicMetadata

from tests.storage.log.test_open_segments import descriptors_under, mappings_under

directory, limit = Path(sys.argv[1]) / "t-0", int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_NOFILE, (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

def held():
    return descriptors_under(directory), mappings_under(directory)

started = time.perf_counter()
log = Log.open(directory, LogConfig(), extension=position_index_spec(TopicMetadata("t", 1)))
opened = time.perf_counter() - started
fds, maps = held()
rng = random.Random(18)
latencies = []
for offset in rng.sample(range(log.log_end_offset), 500):
    started = time.perf_counter()
    record = next(log.records(offset))
    latencies.append(time.perf_counter() - started)
    assert record.value == b"v%07d" % offset, (offset, record)
latencies.sort()
assert log.offset_for_timestamp(1_700_000_000_000 + 99_990) == 99_990
log.append([b"after"])
fds_after, maps_after = held()
started = time.perf_counter()
log.close()
print(json.dumps({
    "segments": log.number_of_segments, "open_s": opened, "fds": max(fds, fds_after),
    "maps": max(maps, maps_after), "read_median_us": latencies[250] * 1e6,
    "read_p99_us": latencies[495] * 1e6, "close_s": time.perf_counter() - started,
}))
"""


@pytest.mark.slow
def test_a_partition_of_100000_segments_opens_and_serves_reads(memory_dir: Path) -> None:
    """Issue #18 (2): a partition of 100,000 segments (on disk at 3 descriptors and
    3 mappings each: no process could open it, whatever its limit short of 300,000)
    opens writable with the file system's position index under ``RLIMIT_NOFILE=1024``
    (a shell's; the bound is then 36 segments), serves random reads, a lookup by time
    and an append, and closes. Its figures are printed (``pytest -s``)."""
    write_one_record_segments(memory_dir / "t-0", 100_000)
    summary = run_script(_HUNDRED_THOUSAND, memory_dir, 1024)
    print(summary)
    assert summary["segments"] == 100_001
    bound = 1024 // 4 // 7
    assert summary["fds"] <= 4 * (bound + 1), summary
    assert summary["maps"] <= 3 * (bound + 1), summary


def test_log_segment_open_max_is_read_from_the_broker_config(tmp_path: Path) -> None:
    from storage import BrokerConfig, ConfigError, LogManager

    props = {"log.dirs": str(tmp_path), "log.segment.open.max": "7"}
    with LogManager.open(tmp_path, BrokerConfig.from_properties(props)):
        assert OPEN_SEGMENTS.max_open == 7
    with pytest.raises(ConfigError, match=r"log\.segment\.open\.max"):
        BrokerConfig.from_properties({**props, "log.segment.open.max": "0"})


def test_retention_releases_the_descriptors_of_the_segments_it_deletes(
    log_dir: Path, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue #17: a segment retention deleted kept its descriptors and mappings until
    ``file.delete.delay.ms`` (60 s by default) passed and its ``.deleted`` files were
    unlinked. At a roll and a deletion per append, the process's open descriptors grew
    by 3 a cycle (the ``.log`` and the index mappings: 600 after these 200 cycles) up
    to the bound of open segments (``log.segment.open.max``). They are released at the
    rename now; the files still wait for the delay, and a read that needs one again
    during it opens the ``.deleted`` file (see above)."""
    OPEN_SEGMENTS.shed()
    monkeypatch.setattr(OPEN_SEGMENTS, "max_open", 1000)  # the default, whatever ran before
    config = LogConfig(segment_bytes=14, retention_bytes=100)  # a roll per append
    assert config.file_delete_delay_ms == 60_000
    log = Log.open(log_dir / "t-0", config, clock=clock, extension=SPEC)

    def open_descriptors() -> int:
        return len(os.listdir("/proc/self/fd"))

    def cycle(offset: int) -> int:
        log.append([value_of(offset)])
        clock.advance(1)
        return log.delete_old_segments()

    for offset in range(10):  # the steady state: active segment, one sealed, pending
        cycle(offset)
    before = open_descriptors()
    cycles = 200
    deleted = sum(cycle(offset) for offset in range(10, 10 + cycles))
    grown = open_descriptors() - before
    assert deleted >= cycles - 2
    assert grown <= 8, (
        f"{grown} more descriptors after {deleted} segments were deleted "
        f"({descriptors_under(log.dir)} on the log's files, "
        f"{mappings_under(log.dir)} mappings)"
    )
    assert [r.value for r in log.records(log.log_start_offset)] == [
        value_of(offset) for offset in range(log.log_start_offset, 10 + cycles)
    ]
    pending = [name for name in os.listdir(log.dir) if name.endswith(".deleted")]
    assert len(pending) >= 4 * cycles  # the files wait for file.delete.delay.ms
    clock.advance(60_000)
    log.delete_expired_files()
    assert not [name for name in os.listdir(log.dir) if name.endswith(".deleted")]
    log._check()
    log.close()
    assert descriptors_under(log.dir) == 0

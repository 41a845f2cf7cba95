"""Disk full (#17): ``ENOSPC`` at every operation that writes, through the engine and a
real mount, on a small real file system.

The file system is an ext4 of 16 MiB in an image on a loop device (1-KiB blocks, as
``mkfs.ext4`` makes one this small), or a tmpfs where loop devices are missing
(``small_fs.py``); the test skips, saying why, only where neither can be mounted. A
ballast file fills it, so that the next operation that needs a block gets ``ENOSPC``.

What must hold, each time (SPEC §3: "Disk full: ENOSPC, no partial record ever
visible"): the writer gets ``ENOSPC`` (a file-system call its errno, a command exit
code 1 and one line); nothing partial is visible (every partition reads back exactly
the acknowledged records, no file of a failed roll or create is left, no ``.log`` is
longer than its valid bytes); reads keep working meanwhile; the daemon stays up and
does not flood its log; writes work again once the ballast is gone; a stop exits 0, a
restart recovers, and ``seglogfs verify`` finds nothing.

- ``test_every_engine_operation_on_a_full_disk``: the engine (``disk_full_engine.py``),
  faster and with sweeps (0, 1, 2... blocks left free, so the space runs out at each
  step of a roll, a batch write, a keyed write to several partitions, a format
  change), once on the compiled engine and once on the pure-Python one, each in a
  process of its own (a store into a page without a block is ``SIGBUS``: it must fail
  the test, not end the run).
- ``test_a_mount_on_a_full_disk``: a real daemon; ``echo >>`` a partition, the
  ``produce`` file (keyless, and keyed lines to three partitions with 0, 1, 2...
  blocks free), ``seglogfs produce`` through the control socket, ``fsync`` of a
  partial line, a roll, a new page of the position index, the daemon's checkpoints,
  ``mkdir`` and ``seglogfs topics create``, a format change with ``setfattr``, a
  2.5-MB ``write()`` that the room runs out in (a short count of whole lines); then a
  stop on the full disk and a mount refused on it, each in one line.

Both count the ``ENOSPC`` hits per operation, print them, and fail unless every
operation was hit: a test that cannot fail for the reason it names proves nothing. The
regression tests after them each failed before their fix (named in each docstring).
"""

from __future__ import annotations

import collections
import errno
import json
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import trio
import trio.testing

from seglogfs.daemon import maintenance
from storage import build_record_batch, partition_for_key
from storage._build import SELECTION
from tests.daemon.conftest import ROOT, Mount, is_mounted, needs_fuse

from . import disk_full_engine
from .small_fs import SmallFileSystem, small_file_system

SIZE_MIB = 16

# The operations every run must hit with ENOSPC at least once.
ENGINE_OPERATIONS = (
    "append",
    "produce file",
    "roll",
    "position index",
    "checkpoint",
    "topic create",
    "format change",
)
MOUNT_OPERATIONS = (
    "echo >> partition",
    "write cut short",
    "fsync of a partial line",
    "echo >> produce",
    "echo >> produce (keyed)",
    "seglogfs produce",
    "roll",
    "position index",
    "checkpoint",
    "mkdir",
    "seglogfs topics create",
    "setfattr format",
)


@pytest.fixture(scope="module")
def small_fs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SmallFileSystem]:
    with small_file_system(tmp_path_factory.mktemp("disk-full"), SIZE_MIB) as fs:
        yield fs


@pytest.fixture(scope="module")
def small_tmpfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SmallFileSystem]:
    with small_file_system(tmp_path_factory.mktemp("disk-full"), SIZE_MIB, tmpfs=True) as fs:
        yield fs


@pytest.fixture
def fs(small_fs: SmallFileSystem) -> Iterator[SmallFileSystem]:
    """The small file system, empty, for one test."""
    small_fs.clear()
    yield small_fs
    small_fs.clear()


def _python(build: str) -> dict[str, str]:
    """The environment of a subprocess running ``build`` (compiled or pure)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("SEGLOG_PURE_PYTHON", None)
    if build == "pure":
        env["SEGLOG_PURE_PYTHON"] = "1"
    elif not SELECTION.compiled:
        pytest.skip(f"no compiled engine here ({SELECTION.reason})")
    return env


# -- the engine ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "build"), [("ext4", "compiled"), ("ext4", "pure"), ("tmpfs", "compiled")]
)
def test_every_engine_operation_on_a_full_disk(
    request: pytest.FixtureRequest, kind: str, build: str
) -> None:
    """Where loop devices are missing the ext4 runs are tmpfs runs too. The tmpfs run
    found that ``AbstractIndex._check`` read an index's unallocated pages through its
    mapping: on a full tmpfs even a read fault allocates, so the checker itself died of
    ``SIGBUS`` (now it reads them from the file, which returns a hole's zeros)."""
    fs: SmallFileSystem = request.getfixturevalue("small_fs" if kind == "ext4" else "small_tmpfs")
    fs.clear()
    result = subprocess.run(
        [sys.executable, "-m", "tests.reliability.disk_full_engine", str(fs.path), fs.kind,
         str(fs.block_size)],
        cwd=ROOT,
        env=_python(build),
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, f"exit {result.returncode} (-7: SIGBUS): {result.stderr[-4000:]}"
    summary = json.loads(result.stdout)
    print(f"{fs.kind}, {summary['build']} engine: ENOSPC hits {summary['hits']}")
    for case, hits in summary["cases"].items():
        print(f"    {case}: {hits}")
    assert summary["build"] == build
    assert summary["problems"] == []
    missed = [op for op in ENGINE_OPERATIONS if not summary["hits"].get(op)]
    assert not missed, f"never hit: {missed} ({summary['hits']})"


# -- a real mount ---------------------------------------------------------------------------

BROKER_CONFIG = """\
log.flush.offset.checkpoint.interval.ms=200
log.flush.start.offset.checkpoint.interval.ms=200
log.retention.check.interval.ms=500
"""

ROLL_SEGMENT_BYTES = 8192
PAGE = os.sysconf("SC_PAGE_SIZE")
POSITION_ENTRY = 12


def _cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "seglogfs.cli", *args],
        cwd=ROOT,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _sh(command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60)


class MountHarness:
    """A daemon on the small file system, what each partition acknowledged, the checks."""

    def __init__(self, fs: SmallFileSystem, tmp_path: Path) -> None:
        self.fs = fs
        self.log_dir = fs.path / "logs"
        self.mountpoint = tmp_path / "mnt"
        self.mountpoint.mkdir()
        config = tmp_path / "server.properties"
        config.write_text(BROKER_CONFIG)
        # The daemon's log is not on the small file system: it must be able to write.
        self.mount = Mount(
            self.log_dir, self.mountpoint, ["--config", str(config)], tmp_path / "daemon.log"
        )
        self.acked: dict[tuple[str, int], list[str]] = collections.defaultdict(list)
        self.produced: list[str] = []  # through the produce file, any partition
        self.hits: collections.Counter[str] = collections.Counter()
        self.serial = 0

    def line(self, name: str, length: int = 40) -> str:
        self.serial += 1
        head = f"{name}-{self.serial}-"
        return head + "x" * max(length - len(head), 0)

    def topic_dir(self, topic: str) -> Path:
        return self.mountpoint / topic

    # -- writers: each returns whether it was acknowledged; ENOSPC is counted ----------

    def refused(self, operation: str, result: subprocess.CompletedProcess[str]) -> bool:
        """A command's outcome: True if it worked; False, counted, if it failed with
        ENOSPC as one line; anything else fails the test."""
        if result.returncode == 0:
            return True
        message = result.stderr.strip()
        assert result.returncode == 1, (operation, result)
        assert "No space left on device" in message, (operation, result)
        assert len(message.splitlines()) == 1, (operation, message)
        self.hits[operation] += 1
        return False

    def echo(self, operation: str, topic: str, name: str, line: str) -> bool:
        return self.refused(operation, _sh(f"echo '{line}' >> {self.topic_dir(topic)}/{name}"))

    def append(self, topic: str, line: str, operation: str = "echo >> partition") -> bool:
        if self.echo(operation, topic, "0", line):
            self.acked[(topic, 0)].append(line)
            return True
        return False

    def produce_file(self, line: str) -> bool:
        if self.echo("echo >> produce", "prod", "produce", line):
            self.produced.append(line)
            return True
        return False

    def control_produce(self, line: str) -> bool:
        result = _cli("produce", "ctl", "-d", str(self.log_dir), stdin=line + "\n")
        if self.refused("seglogfs produce", result):
            self.acked[("ctl", 0)].append(line)
            return True
        return False

    def write_until_full(self, topic: str, data: bytes) -> None:
        """``write()`` ``data`` (many lines, more than one batch each request) until the
        disk refuses: the bytes each call accepted (a short count when a later batch of
        a request failed) are whole lines, and exactly what the partition holds."""
        fd = os.open(self.topic_dir(topic) / "0", os.O_WRONLY | os.O_APPEND)
        written = 0
        failure: OSError | None = None
        try:
            while written < len(data):
                try:
                    written += os.write(fd, data[written:])
                except OSError as exc:
                    failure = exc
                    break
        finally:
            os.close(fd)
        assert failure is not None, "the disk did not fill"
        assert failure.errno == errno.ENOSPC, failure
        self.hits["write cut short"] += 1
        assert written > 0
        assert data[:written].endswith(b"\n"), written
        self.acked[(topic, 0)].extend(data[:written].decode().splitlines())

    def produce_keyed(self, topic: str, lines: list[str], partitions: int) -> bool:
        """One ``write()`` of keyed lines to ``topic``'s ``produce`` file: all of them go
        to their partitions (``key:value``) or, on ENOSPC, none."""
        data = "".join(line + "\n" for line in lines).encode()
        fd = os.open(self.topic_dir(topic) / "produce", os.O_WRONLY | os.O_APPEND)
        try:
            if self.refused_call("echo >> produce (keyed)", lambda: os.write(fd, data)):
                return False
        finally:
            os.close(fd)
        for line in lines:
            key = line.split(":", 1)[0].encode()
            self.acked[(topic, partition_for_key(key, partitions))].append(line)
        return True

    def fsync_partial(self, topic: str, line: str) -> int | None:
        """Write ``line`` without its newline and ``fsync``, which appends it as a
        record of its own. On ENOSPC the line stays pending in the open file: the
        descriptor is returned, for the caller to close once there is room (the last
        close appends it)."""
        fd = os.open(self.topic_dir(topic) / "0", os.O_WRONLY | os.O_APPEND)
        os.write(fd, line.encode())
        if self.refused_call("fsync of a partial line", lambda: os.fsync(fd)):
            return fd
        os.close(fd)
        self.acked[(topic, 0)].append(line)
        return None

    def refused_call(self, operation: str, call: Callable[[], object]) -> bool:
        """Whether ``call`` failed with ENOSPC (counted); any other error fails."""
        try:
            call()
        except OSError as exc:
            failure: OSError | None = exc
        else:
            failure = None
        if failure is None:
            return False
        assert failure.errno == errno.ENOSPC, (operation, failure)
        self.hits[operation] += 1
        return True

    def mkdir(self, topic: str) -> bool:
        return not self.refused_call("mkdir", lambda: os.mkdir(self.topic_dir(topic)))

    def create_topic(self, topic: str) -> bool:
        result = _cli("topics", "create", topic, "-d", str(self.log_dir))
        return self.refused("seglogfs topics create", result)

    def set_format(self, topic: str, fmt: str) -> bool:
        return not self.refused_call(
            "setfattr format",
            lambda: os.setxattr(self.topic_dir(topic), "user.seglog.format", fmt.encode()),
        )

    # -- the state on disk -----------------------------------------------------------

    def segment_files(self, topic: str) -> list[str]:
        return sorted(os.listdir(self.log_dir / f"{topic}-0"))

    def active_log(self, topic: str) -> Path:
        logs = sorted((self.log_dir / f"{topic}-0").glob("*.log"))
        return logs[-1]

    def position_entries(self, topic: str) -> int:
        """Entries of the active segment's ``.seglogpos`` (the valid prefix)."""
        data = self.active_log(topic).with_suffix(".seglogpos").read_bytes()
        slots = [data[i : i + POSITION_ENTRY] for i in range(0, len(data), POSITION_ENTRY)]
        count = 1
        while count < len(slots) and slots[count][8:12] != bytes(4):
            count += 1
        return count

    # -- checks ----------------------------------------------------------------------

    def check(self) -> None:
        """Every partition reads back what was acknowledged; ``tail -c`` too."""
        assert self.mount.proc is not None
        assert self.mount.proc.poll() is None, self.mount.log()
        for (topic, partition), lines in self.acked.items():
            path = self.topic_dir(topic) / str(partition)
            expected = "".join(line + "\n" for line in lines)
            assert _sh(f"cat {path}").stdout == expected, (topic, partition)
            assert _sh(f"tail -c 100 {path}").stdout == expected[-100:], (topic, partition)
        found: list[str] = []
        for partition in range(3):
            lines = (self.topic_dir("prod") / str(partition)).read_text().splitlines()
            serials = [int(line.split("-")[1]) for line in lines]
            assert serials == sorted(serials), "a produce-file partition is out of order"
            found.extend(lines)
        assert sorted(found) == sorted(self.produced)

    def error_lines(self) -> list[str]:
        return [line for line in self.mount.log().splitlines() if " ERROR " in line]

    def checkpoint_failures(self) -> int:
        return len(re.findall(r"checkpoint failed", self.mount.log()))


def _fill_roll_segment(h: MountHarness) -> None:
    """Lines into ``roll`` until the next one of 1,000 bytes must roll the segment."""
    while h.active_log("roll").stat().st_size + 1200 <= ROLL_SEGMENT_BYTES:
        assert h.append("roll", h.line("roll", 1000))


def _fill_position_page(h: MountHarness) -> None:
    """Lines into ``pos`` until page 0 of its ``.seglogpos`` is full and the next write
    starts a batch that needs an entry, with room left in the ``.log``'s last block (so
    only the position index needs a block)."""
    per_page = PAGE // POSITION_ENTRY
    path = h.topic_dir("pos") / "0"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        # Each write of more than 4,096 bytes is one batch, and gives the next an entry.
        for _ in range(per_page - 1):
            line = h.line("pos", 4100)
            os.write(fd, (line + "\n").encode())
            h.acked[("pos", 0)].append(line)
        size = h.active_log("pos").stat().st_size
        length = 4100
        block = h.fs.block_size
        while True:
            batch = build_record_batch([h.line("pos", length).encode()], timestamps=0)
            if 0 < (size + len(batch)) % block < 512:
                break
            length += 1
        line = h.line("pos", length)
        os.write(fd, (line + "\n").encode())
        h.acked[("pos", 0)].append(line)
    finally:
        os.close(fd)
    assert h.position_entries("pos") == per_page


@needs_fuse
def test_a_mount_on_a_full_disk(fs: SmallFileSystem, tmp_path: Path) -> None:
    h = MountHarness(fs, tmp_path)
    h.mount.start()
    try:
        _run_mount_scenario(h)
    finally:
        h.mount.cleanup()
    print(f"{fs.kind}: ENOSPC hits through the mount {dict(h.hits)}")
    missed = [op for op in MOUNT_OPERATIONS if not h.hits[op]]
    assert not missed, f"never hit: {missed} ({dict(h.hits)})"


def _run_mount_scenario(h: MountHarness) -> None:
    mnt = h.mountpoint
    # Room: the topics and what they hold before the disk fills.
    for topic in ("app", "big", "roll", "pos", "ctl", "fmt"):
        assert h.mkdir(topic)
    # Each 1-MiB request of a write is cut into batches of at most 64 KiB.
    os.setxattr(mnt / "big", "user.seglog.max.message.bytes", b"65536")
    os.setxattr(mnt / "roll", "user.seglog.segment.bytes", str(ROLL_SEGMENT_BYTES).encode())
    # Offset- and time-index entries once per MiB: only the position index grows.
    os.setxattr(mnt / "pos", "user.seglog.index.interval.bytes", b"1048576")
    for topic, options in (("prod", ()), ("keyed", ("--key-separator", ":"))):
        created = _cli("topics", "create", topic, "--partitions", "3", *options, "-d",
                       str(h.log_dir))  # fmt: skip
        assert created.returncode == 0, created
    for _ in range(20):
        assert h.append("app", h.line("app"))
        assert h.produce_file(h.line("prod"))
    assert h.control_produce(h.line("ctl"))
    _fill_roll_segment(h)
    _fill_position_page(h)
    h.check()
    roll_files = h.segment_files("roll")
    pos_log = h.active_log("pos").stat().st_size
    topics = sorted(os.listdir(mnt))

    # Full: each operation gets ENOSPC and changes nothing; reads go on.
    h.fs.fill()
    try:
        failures_before = h.checkpoint_failures()
        pending_line = h.line("app", 3000)
        pending = h.fsync_partial("app", pending_line)
        assert not h.append("app", h.line("app", 3000))
        assert not h.produce_file(h.line("prod", 3000))
        assert not h.control_produce(h.line("ctl", 3000))
        assert not h.append("roll", h.line("roll", 1000), "roll")
        assert h.segment_files("roll") == roll_files, "a failed roll left files"
        # The batch fits the .log's last block; its position-index entry has no page.
        assert not h.append("pos", "p", "position index")
        assert h.active_log("pos").stat().st_size == pos_log
        assert not h.mkdir("new")
        assert not h.create_topic("new2")
        assert not h.set_format("fmt", "raw")
        assert sorted(os.listdir(mnt)) == topics
        assert os.getxattr(mnt / "fmt", "user.seglog.format") == b"lines"
        h.check()
        # The daemon's checkpoints (every 200 ms) meet the full disk too.
        for _ in range(50):
            if h.checkpoint_failures() > failures_before:
                break
            subprocess.run(["sleep", "0.1"], check=True)
        h.hits["checkpoint"] = h.checkpoint_failures() - failures_before
        h.check()
    finally:
        h.fs.free()

    # Room again: the pending line goes in at close, every writer works, the roll and
    # the new page happen.
    if pending is not None:
        os.close(pending)
        h.acked[("app", 0)].append(pending_line)
    assert h.append("app", h.line("app", 3000))
    assert h.produce_file(h.line("prod", 3000))
    assert h.control_produce(h.line("ctl", 3000))
    assert h.append("roll", h.line("roll", 1000))
    assert len(h.segment_files("roll")) > len(roll_files)
    assert h.append("pos", "p")
    assert h.mkdir("new")
    assert h.create_topic("new2")
    assert h.set_format("fmt", "raw")
    h.check()
    # The checkpoints work again, and say so.
    for _ in range(50):
        if h.mount.log().count("checkpoint works again") == 2:
            break
        subprocess.run(["sleep", "0.1"], check=True)
    else:
        raise AssertionError(f"the checkpoints never worked again: {h.mount.log()}")

    # Nearly full: a write of 2.5 MB meets the end of the room part way through a
    # request, after some of its batches were appended.
    h.fs.fill()
    h.fs.leave(300 * 1024)
    data = "".join(h.line("big", 100) + "\n" for _ in range(25_000)).encode()
    h.write_until_full("big", data)
    h.check()
    h.fs.free()
    # Keyed lines to three partitions with 0, 1, 2... blocks free: all or nothing.
    for blocks in range(12):
        h.fs.fill()
        h.fs.leave(blocks * h.fs.block_size)
        try:
            h.produce_keyed("keyed", [f"k{i}:{blocks}-{'v' * 600}" for i in range(12)], 3)
            h.check()
        finally:
            h.fs.free()

    errors = h.error_lines()
    print(f"ERROR lines in the daemon's log: {len(errors)}")
    assert "Traceback" not in h.mount.log(), h.mount.log()
    # A line a minute at most per background task that met the full disk.
    assert len(errors) <= 4, "\n".join(errors)

    assert h.mount.stop() == 0, h.mount.log()
    h.mount.start()
    h.check()
    # A stop on a full disk: clean if closing the logs (their indexes trimmed) gave the
    # checkpoints room, else exit 1 and one line; a mount on it is refused in one line.
    h.fs.fill()
    try:
        stopped = h.mount.stop()
        assert stopped in (0, 1), h.mount.log()
        if stopped:
            assert "error: unclean shutdown: [Errno 28] No space left on device" in h.mount.log()
        # Whether the start needs a block (its directory entries, the marker's removal)
        # depends on where the file system put its last blocks: refused in one line,
        # or mounted, serving reads and refusing appends with ENOSPC.
        h.mount.start(wait=False)
        proc = h.mount.proc
        assert proc is not None
        deadline = time.monotonic() + 60
        while proc.poll() is None and not is_mounted(h.mount.mountpoint):
            assert time.monotonic() < deadline, h.mount.log()
            time.sleep(0.05)
        if proc.poll() is not None:
            assert proc.returncode == 1, h.mount.log()
            last = h.mount.log().rstrip().splitlines()[-1]
            assert re.fullmatch(r"seglogfs mount: error: \S+: No space left on device", last), last
        else:
            h.check()
            assert h.mount.stop() in (0, 1), h.mount.log()
    finally:
        h.fs.free()
    h.mount.start()  # recovers
    h.check()
    assert h.append("app", h.line("app"))
    assert h.mount.stop() == 0, h.mount.log()
    assert "Traceback" not in h.mount.log(), h.mount.log()
    verified = _cli("verify", "-q", str(h.log_dir))
    assert verified.returncode == 0, verified.stdout + verified.stderr


# -- regressions: each failed before its fix ------------------------------------------------

_REOPENED_INDEX = """\
import errno, json, sys
from pathlib import Path
from storage import Log, LogConfig, build_record_batch
from tests.reliability.small_fs import SmallFileSystem

fs = SmallFileSystem(Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]))
directory = fs.path / "t-0"
outcomes = []
values = []


def append(value):
    try:
        log.append([value])
    except OSError as exc:
        outcomes.append(errno.errorcode[exc.errno])
    else:
        outcomes.append("appended")
        values.append(value)


log = Log.open(directory, LogConfig())
for value in (b"a" * 5000, b"b" * 5000, b"c" * 10):
    append(value)
log.close()  # the indexes are trimmed to their entries: their page is cut short
log = Log.open(directory, LogConfig())  # and regrown sparse
# 1. Full at once: the next entries' page needs blocks before anything is written.
fs.fill()
append(b"e")
fs.free()
# 2. 5,000 bytes more, so that the next batch gets an offset-index entry, sized to leave
# room in the .log's last block (only an index page could need blocks); then full.
length = 5000
block = fs.block_size


def end_in_block(length):
    batch = build_record_batch([b"d" * length], timestamps=0)
    return (log.active_segment.size + len(batch)) % block


while not 0 < end_in_block(length) < 512:
    length += 1
append(b"d" * length)
fs.fill()
append(b"f")
fs.free()
log._check()
assert [record.value for record in log.records(0)] == values
log.close()
print(json.dumps(outcomes[3:]))
"""


@pytest.mark.parametrize("build", ["compiled", "pure"])
def test_an_index_page_cut_short_by_a_close_is_allocated_before_its_next_entry(
    fs: SmallFileSystem, build: str
) -> None:
    """A close trims an index to its entries; the next open regrows it sparse and took
    the page holding its last entry for allocated, since entries were written there.
    With blocks smaller than a page (this ext4's 1 KiB) that page's blocks past the
    trimmed end are holes: the first entry stored into it on a full disk killed the
    process with ``SIGBUS`` (exit -7, both builds: ``index.py`` is pure Python in
    both), and an append on a full disk at once was acknowledged. Fixed in
    ``AbstractIndex._open_writable`` (that page counts as not allocated) and
    ``AbstractIndex.reserve`` (allocated before the append's bytes are written)."""
    result = subprocess.run(
        [sys.executable, "-c", _REOPENED_INDEX, str(fs.path), fs.kind, str(fs.block_size)],
        cwd=ROOT,
        env=_python(build),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, f"exit {result.returncode} (-7: SIGBUS): {result.stderr}"
    # On ext4 the page needs blocks; a tmpfs page is whole or absent.
    full_at_once = "ENOSPC" if fs.kind == "ext4" else "appended"
    assert json.loads(result.stdout) == [full_at_once, "appended", "appended"]


def test_an_append_whose_position_index_entry_has_no_page_fails_whole(
    fs: SmallFileSystem,
) -> None:
    """The append whose ``.seglogpos`` entry starts a new page, on a full disk, its bytes
    fitting in the ``.log``'s last block: the append was acknowledged and its entry
    left out (a warning), so the index was no longer what a rebuild (or Kafka) makes of
    the log, and through the mount ``echo >>`` succeeded on a full disk. Now the pages
    an append may write are allocated before its bytes (``Log._append_built``,
    ``AbstractIndex.reserve``): ``ENOSPC``, nothing written."""
    summary = disk_full_engine.run(fs, ["position index"])
    assert summary["problems"] == []
    assert summary["hits"] == {"position index": 1}


def test_keyed_lines_to_the_produce_file_on_a_full_disk_are_all_or_nothing(
    fs: SmallFileSystem,
) -> None:
    """Keyed lines of one write to a ``produce`` file go to their partitions, one append
    each in partition order. With the room running out part way (with 3 to 9 blocks
    free, depending on the layout), the write failed with ``ENOSPC`` after the first
    partitions took their lines ("a refused write appended [4, 0, 0] records"): the
    writer, told nothing was written, appends them again when it retries.
    Now every partition's room is made first (``Log.reserved``: the ``.log``'s blocks
    allocated past its end, the index pages, a roll they need), under each log's lock,
    then the appends: the write is all or nothing (``lines.produce_lines``)."""
    summary = disk_full_engine.run(fs, ["produce file"])
    assert summary["problems"] == []
    assert summary["hits"].get("produce file", 0) >= 1


def test_retention_on_a_full_disk_deletes_whole_segments(fs: SmallFileSystem) -> None:
    """Retention is how a full disk gets room back, but its first step can need a block:
    renaming a segment's files to ``.deleted`` adds longer names to the partition
    directory, which may need a new directory block. A rename failing with ``ENOSPC``
    left the segments out of the log but their files on disk, some renamed and some
    not, never removed; after a restart the segments were back (and the log's first
    position with them). Now a segment whose files cannot be renamed is deleted at
    once (``Log._delete_segments``): unlinking needs no room."""
    summary = disk_full_engine.run(fs, ["retention"])
    assert summary["problems"] == []


def test_a_background_task_failing_on_a_full_disk_logs_a_line_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The daemon's checkpoints (every ``log.flush.offset.checkpoint.interval.ms``) on a
    full disk logged an ERROR line at every attempt, the first with a traceback: 40
    lines in 4 s at this test's 200 ms interval. An ``OSError`` is the environment, not
    a bug: one line without a traceback, then at most one a minute counting the
    failures, and one when the task works again."""
    attempts = 0

    def checkpoint() -> None:
        nonlocal attempts
        attempts += 1
        if attempts <= 600:  # two minutes of a full disk at 200 ms
            raise OSError(errno.ENOSPC, "No space left on device")

    async def run_sync(fn: object, *args: object) -> object:
        return fn(*args)  # type: ignore[operator]

    async def main() -> None:
        with trio.move_on_after(130):
            await maintenance._every(0.2, "recovery-point checkpoint", run_sync, checkpoint)

    with caplog.at_level(logging.INFO, logger=maintenance.__name__):
        trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    records = [r for r in caplog.records if r.name == maintenance.__name__]
    assert attempts > 600
    assert all(r.exc_info is None for r in records)
    errors = [r.getMessage() for r in records if r.levelno == logging.ERROR]
    assert 2 <= len(errors) <= 4, errors
    assert "No space left on device" in errors[0]
    assert any("more time" in message for message in errors[1:]), errors
    assert any("works again" in r.getMessage() for r in records if r.levelno == logging.INFO)


def test_a_topic_create_running_out_of_room_part_way_leaves_no_topic(
    fs: SmallFileSystem,
) -> None:
    """A create with 0, 1, 2... blocks free: the metadata write (the commit point)
    succeeds, then a partition's directory or its first index page takes the last
    block and the next fails; the undo must write the metadata file again. D2 (fixed):
    it found no room, so the create failed with ``ENOSPC`` but the topic stayed, its
    failed partition missing until a restart created it (``mkdir`` said "No space left
    on device", yet ``ls`` showed the topic). Two causes: a failed load kept the
    segments it had opened (their preallocated index blocks stayed allocated), and the
    undo wrote the metadata file before it removed the partition directories the
    create made. Now ``load_log`` closes what it opened when it fails, and the undo
    removes those directories first."""
    harness = disk_full_engine.Harness(fs, "topic create sweep")
    for blocks in range(disk_full_engine.SWEEP_BLOCKS):
        harness.manager.create_topic(f"t{blocks}")
        name = f"n{blocks}"
        with harness.full(f"create {name}, {blocks} block(s) free", blocks):
            harness.enospc(lambda name=name: harness.manager.create_topic(name))  # type: ignore[misc]
    try:
        harness.restart()
    except Exception as exc:
        harness.problem(f"{type(exc).__name__}: {exc}")
    assert harness.problems == []

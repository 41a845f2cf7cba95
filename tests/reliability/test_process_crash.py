"""Process crashes: the daemon is ``SIGKILL``ed while every write path is busy.

Each cycle mounts the log directory (recovery runs), checks what the last crash left,
starts one writer per path and kills the daemon, either inside a chosen operation (a
roll, retention, a checkpoint write, a topic create, a rendering change, a topic
delete, an append, a flush, a cleaning pass: ``crash_points/sitecustomize.py`` makes the daemon
``SIGKILL`` itself just before the K-th file-system call of that operation) or, when
the operation does not come or makes fewer calls, at a random moment. The paths:

- ``>>`` on a partition file (``echo >>``'s ``O_APPEND`` writes), topic ``part``;
- the ``produce`` file of a three-partition topic, ``prod``;
- the control socket's client (what ``seglogfs produce`` and the Spark sink call
  when a daemon owns the directory), topic ``ctl``;
- ``>>`` into a topic whose retention deletes segments while it is written, ``ret``;
- ``>>`` of ``key:value`` lines into a compacted topic, ``cmp``, which the daemon's
  cleaner compacts while it is written (small segments, a dirty ratio of 0.01, a
  cleaner backoff of 100 ms). Every key is new, so a pass keeps every record and
  rewrites the segments behind the active one: a crash inside it must leave all
  groups swapped or none, with nothing lost or doubled.

A writer acknowledges a line (appends it to its own ack file) once its ``write()`` or
its control request returned. After every remount: each acknowledged line is present
exactly once and in order, a line that was not acknowledged (the one in flight) at
most once and only as its writer's last of that cycle, offsets are contiguous from the
log start, no partial line is visible; in ``ret``, what retention removed is a prefix.
At the end the daemon stops cleanly and ``seglogfs verify`` finds nothing.

The CI run does ``CYCLES`` cycles; ``pytest -m long`` does ``LONG_CYCLES``. The test
counts the crashes that landed inside each operation and requires every operation to
have been hit at least once, so it cannot pass without exercising what it names.
"""

from __future__ import annotations

import collections
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from storage import LogManager
from tests.daemon.conftest import ROOT, Mount, is_mounted, needs_fuse

CRASH_POINTS = Path(__file__).resolve().parent / "crash_points"
CYCLES = 32
LONG_CYCLES = 200
SEED = 20261125

# Operation -> the largest K drawn: about the number of file-system calls one run of it
# makes (counted with the hook), so most draws land inside it.
OPERATIONS = {
    "roll": 8,
    "retention": 6,
    "checkpoint": 5,
    "create_topic": 12,
    "set_rendering": 4,
    "delete_topic": 8,
    "append": 2,
    "flush": 1,
    "clean": 16,
}

BROKER_CONFIG = """\
log.retention.check.interval.ms=200
log.flush.offset.checkpoint.interval.ms=150
log.flush.start.offset.checkpoint.interval.ms=150
log.segment.delete.delay.ms=100
log.flush.interval.ms=300
log.cleaner.backoff.ms=100
"""

# Writers: each prints nothing, acknowledges into its ack file, stops at the first error.
APPEND_WRITER = """\
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND)
ack = open(sys.argv[2], "a")
prefix = sys.argv[3]
keyed = len(sys.argv) > 4  # write "line:line": the line is the record's key too
i = 0
while True:
    line = "%s-%d" % (prefix, i)
    try:
        os.write(fd, ((line + ":" + line if keyed else line) + "\\n").encode())
    except OSError:
        break
    ack.write(line + "\\n"); ack.flush()
    i += 1
"""

CONTROL_WRITER = """\
import sys
from pathlib import Path
from seglogfs import control
log_dir, ack, prefix = Path(sys.argv[1]), open(sys.argv[2], "a"), sys.argv[3]
i = 0
while True:
    lines = ["%s-%d" % (prefix, i + j) for j in range(5)]
    try:
        control.produce(log_dir, "ctl", [(None, l.encode(), (), None) for l in lines])
    except (control.ControlError, OSError):
        break
    ack.write("".join(l + "\\n" for l in lines)); ack.flush()
    i += 5
"""

# Namespace churn: topic creates, rendering changes on empty topics, deletes.
NAMESPACE_CHURN = """\
import os, subprocess, sys
mnt, log_dir, prefix = sys.argv[1], sys.argv[2], sys.argv[3]
i = 0
while os.path.ismount(mnt):
    name = "%s-%d" % (prefix, i)
    try:
        os.mkdir(os.path.join(mnt, name))
        os.setxattr(os.path.join(mnt, name), "user.seglog.format", b"raw")
    except OSError:
        break
    subprocess.run([sys.executable, "-m", "seglogfs.cli", "topics", "delete", name,
                    "-d", log_dir], capture_output=True)
    i += 1
"""


@dataclass
class Writer:
    topic: str
    prefix: str
    ack: Path
    in_flight: int = 1  # lines one write (or request) carries: appended all or none
    # Lines acknowledged per cycle, in order.
    acked: dict[int, list[str]] = field(default_factory=dict)


def _start(code: str, *args: object) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", code, *map(str, args)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _unmount(mountpoint: Path) -> None:
    for flags in ("-u", "-uz"):
        subprocess.run(["fusermount3", flags, str(mountpoint)], capture_output=True, check=False)


def _partition_lines(mountpoint: Path, topic: str) -> dict[int, list[str]]:
    topic_dir = mountpoint / topic
    out: dict[int, list[str]] = {}
    for name in os.listdir(topic_dir):
        if name.isdigit():
            data = (topic_dir / name).read_bytes()
            assert data == b"" or data.endswith(b"\n"), f"{topic}/{name} ends in a partial line"
            lines = data.decode().splitlines()
            # A keyed line reads key:value, both the line written: the key stands for it.
            out[int(name)] = [line.partition(":")[0] for line in lines]
    return out


def _check_writer(writer: Writer, found: list[str], *, retention: bool) -> None:
    """``found``: the writer's lines in one partition, in file order (or, for a
    multi-partition topic, checked per partition by the caller)."""
    expected: list[str] = []
    allowed_extra: set[str] = set()
    for cycle in sorted(writer.acked):
        lines = writer.acked[cycle]
        expected.extend(lines)
        # The write in flight when the daemon died may or may not have been appended.
        last = int(lines[-1].rsplit("-", 1)[1]) if lines else -1
        allowed_extra.update(
            f"{writer.prefix}{cycle}-{last + 1 + i}" for i in range(writer.in_flight)
        )
    present = [line for line in found if line not in allowed_extra]
    assert len(present) == len(set(present)), f"{writer.topic}: a line appears twice"
    if retention:
        # Retention removes a prefix: what is left is a suffix of what was acknowledged.
        assert expected[len(expected) - len(present) :] == present, f"{writer.topic}: not a suffix"
    else:
        assert present == expected, f"{writer.topic}: acknowledged lines lost or reordered"


def _check_offsets(log_dir: Path) -> None:
    with LogManager.open(log_dir, read_only=True) as manager:
        for topic in ("part", "prod", "ctl", "ret", "cmp"):
            for partition in range(manager.topic(topic).partitions):
                log = manager.log(topic, partition)
                offsets = [record.offset for record in log.records(log.log_start_offset)]
                assert offsets == list(range(log.log_start_offset, log.log_end_offset))


class Harness:
    def __init__(self, tmp_path: Path, seed: int) -> None:
        self.rng = random.Random(seed)
        self.log_dir = tmp_path / "logs"
        self.mountpoint = tmp_path / "mnt"
        self.mountpoint.mkdir()
        self.config = tmp_path / "server.properties"
        self.config.write_text(BROKER_CONFIG)
        self.marker = tmp_path / "crash-marker"
        self.armed = tmp_path / "crash-armed"
        self.daemon_log = tmp_path / "daemon.log"
        self.writers = {
            "part": Writer("part", "p", tmp_path / "ack-part"),
            "prod": Writer("prod", "d", tmp_path / "ack-prod"),
            "ctl": Writer("ctl", "c", tmp_path / "ack-ctl", in_flight=5),
            "ret": Writer("ret", "r", tmp_path / "ack-ret"),
            "cmp": Writer("cmp", "k", tmp_path / "ack-cmp"),
        }
        self.hits: collections.Counter[str] = collections.Counter()
        self.random_kills = 0
        self.crashed: list[str] = []
        self.mount: Mount | None = None

    def start_daemon(self, crash_at: str | None) -> Mount:
        """The daemon, mounted, with the crash at ``crash_at`` (not armed yet)."""
        mount = Mount(
            self.log_dir, self.mountpoint, ["--config", str(self.config)], self.daemon_log
        )
        env = {"PYTHONPATH": f"{CRASH_POINTS}{os.pathsep}{ROOT}"}
        if crash_at is not None:
            env["SEGLOG_TEST_CRASH_AT"] = crash_at
            env["SEGLOG_TEST_CRASH_MARKER"] = str(self.marker)
            env["SEGLOG_TEST_CRASH_ARMED"] = str(self.armed)
        self.mount = mount
        mount.start(env, wait=False)
        assert mount.proc is not None
        while not is_mounted(self.mountpoint):
            assert mount.proc.poll() is None, f"the daemon exited: {mount.log()}"
            time.sleep(0.02)
        return mount

    def create_topics(self) -> None:
        mount = self.start_daemon(None)
        mnt = self.mountpoint
        for topic in ("part", "ctl"):
            os.mkdir(mnt / topic)
            os.setxattr(mnt / topic, "user.seglog.segment.bytes", b"16384")
        subprocess.run(
            [sys.executable, "-m", "seglogfs.cli", "topics", "create", "prod", "-d", self.log_dir,
             "--partitions", "3", "--config", "segment.bytes=16384"],
            check=True,
            capture_output=True,
        )  # fmt: skip
        os.mkdir(mnt / "ret")
        for key, value in (("segment.bytes", b"4096"), ("retention.ms", b"300")):
            os.setxattr(mnt / "ret", f"user.seglog.{key}", value)
        os.mkdir(mnt / "cmp")
        for key, value in (
            ("key.separator", b":"),
            ("segment.bytes", b"4096"),
            ("min.cleanable.dirty.ratio", b"0.01"),
            ("cleanup.policy", b"compact"),
        ):
            os.setxattr(mnt / "cmp", f"user.seglog.{key}", value)
        assert mount.stop() == 0, mount.log()
        _unmount(mnt)

    def check(self) -> None:
        mnt = self.mountpoint
        for name in ("part", "ctl", "ret", "cmp"):
            found = _partition_lines(mnt, name)[0]
            _check_writer(self.writers[name], found, retention=name == "ret")
        # prod: keyless lines spread over partitions; each partition keeps their order.
        writer = self.writers["prod"]
        by_partition = _partition_lines(mnt, "prod")
        everything = [line for lines in by_partition.values() for line in lines]
        acked = [line for cycle in sorted(writer.acked) for line in writer.acked[cycle]]
        order = {line: i for i, line in enumerate(acked)}
        for lines in by_partition.values():
            ranks = [order[line] for line in lines if line in order]
            assert ranks == sorted(ranks), "prod: a partition's lines are out of order"
        merged = sorted(everything, key=lambda line: order.get(line, 1 << 60))
        _check_writer(writer, merged, retention=False)

    def cycle(self, number: int) -> None:
        operation = list(OPERATIONS)[number % len(OPERATIONS)]
        crash_at = f"{operation}:{self.rng.randint(1, OPERATIONS[operation])}"
        self.marker.unlink(missing_ok=True)
        self.armed.unlink(missing_ok=True)
        mount = self.start_daemon(crash_at)
        self.check()
        self.armed.touch()
        mnt = self.mountpoint
        for writer in self.writers.values():
            writer.ack.write_text("")
        processes = [
            _start(APPEND_WRITER, mnt / "part" / "0", self.writers["part"].ack, f"p{number}"),
            _start(APPEND_WRITER, mnt / "prod" / "produce", self.writers["prod"].ack, f"d{number}"),
            _start(CONTROL_WRITER, self.log_dir, self.writers["ctl"].ack, f"c{number}"),
            _start(APPEND_WRITER, mnt / "ret" / "0", self.writers["ret"].ack, f"r{number}"),
            _start(
                APPEND_WRITER, mnt / "cmp" / "0", self.writers["cmp"].ack, f"k{number}", "keyed"
            ),
            _start(NAMESPACE_CHURN, mnt, self.log_dir, f"n{number}"),
        ]
        assert mount.proc is not None
        deadline = time.monotonic() + self.rng.uniform(0.5, 2.5)
        while time.monotonic() < deadline and mount.proc.poll() is None:
            time.sleep(0.02)
        if mount.proc.poll() is None:
            mount.kill()
            self.random_kills += 1
        else:
            assert mount.proc.returncode == -9, mount.log()
            self.hits[self.marker.read_text().split()[0]] += 1
            self.crashed.append(crash_at + " " + self.marker.read_text().split()[2])
        for process in processes:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                raise
        _unmount(mnt)
        for writer in self.writers.values():
            writer.acked[number] = writer.ack.read_text().splitlines()

    def finish(self) -> None:
        mount = self.start_daemon(None)
        try:
            self.check()
        finally:
            assert mount.stop() == 0, mount.log()
            _unmount(self.mountpoint)
        _check_offsets(self.log_dir)
        result = subprocess.run(
            [sys.executable, "-m", "seglogfs.cli", "verify", "-q", str(self.log_dir)],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        assert result.returncode == 0, result.stdout + result.stderr

    def cleanup(self) -> None:
        if self.mount is not None:
            self.mount.cleanup()
        _unmount(self.mountpoint)


def _run(tmp_path: Path, cycles: int) -> Harness:
    harness = Harness(tmp_path, SEED + cycles)
    try:
        harness.create_topics()
        for number in range(cycles):
            harness.cycle(number)
        harness.finish()
    finally:
        harness.cleanup()
        acked = sum(len(lines) for w in harness.writers.values() for lines in w.acked.values())
        print(
            f"{cycles} cycles: crashes inside operations {dict(harness.hits)}, "
            f"{harness.random_kills} at random moments, {acked} lines acknowledged; "
            f"crash points: {harness.crashed}"
        )
    return harness


@needs_fuse
@pytest.mark.slow
def test_sigkill_in_every_operation_loses_no_acknowledged_line(tmp_path: Path) -> None:
    harness = _run(tmp_path, CYCLES)
    assert set(harness.hits) == set(OPERATIONS), harness.hits


@needs_fuse
@pytest.mark.long
@pytest.mark.timeout(3600)
def test_sigkill_many_cycles(tmp_path: Path) -> None:
    harness = _run(tmp_path, LONG_CYCLES)
    assert set(harness.hits) == set(OPERATIONS), harness.hits

"""Load and soak: a daemon under steady load, watched for growth and errors.

Writers append to several partitions through every write path (``>>`` on partition
files, the ``produce`` file, the control socket's client), ``tail -f`` readers follow
them, ``cat`` readers stream whole partitions through the render process, and small
``segment.bytes`` and ``retention.ms`` make rolls and retention happen every few
seconds. Every ``SAMPLE_S`` the daemon's RSS, open descriptors and threads are sampled
from ``/proc``. At the end:

- the daemon's log holds no ERROR line and no traceback;
- every ``tail -f`` reader saw, in order, a run of its writer's acknowledged lines
  (what retention removed before it got there is skipped over, never reordered, never
  duplicated);
- the growth of RSS, descriptors and threads between the first and the last quarter of
  the run is reported, and bounded (``RSS_GROWTH_MIB``, ``FD_GROWTH``,
  ``THREAD_GROWTH``): a leak of one descriptor or one object per operation would show.

``pytest -m long tests/reliability/test_soak.py`` runs for ``SEGLOG_SOAK_SECONDS``
(default 3600); the CI run is a short smoke of ``CI_SECONDS``.
"""

from __future__ import annotations

import os
import random
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.daemon.conftest import ROOT, Mount, needs_fuse

CI_SECONDS = 20.0
LONG_SECONDS = float(os.environ.get("SEGLOG_SOAK_SECONDS", "3600"))
SAMPLE_S = 1.0
RSS_GROWTH_MIB = 64
FD_GROWTH = 16
THREAD_GROWTH = 4

BROKER_CONFIG = """\
log.retention.check.interval.ms=500
log.segment.delete.delay.ms=200
log.flush.offset.checkpoint.interval.ms=1000
log.flush.start.offset.checkpoint.interval.ms=1000
"""

WRITER = """\
import os, sys, time
path, ack, prefix, rate = sys.argv[1], open(sys.argv[2], "a"), sys.argv[3], float(sys.argv[4])
fd = os.open(path, os.O_WRONLY | os.O_APPEND)
i = 0
while True:
    lines = "".join("%s-%d %s\\n" % (prefix, i + j, "x" * 80) for j in range(50))
    try:
        os.write(fd, lines.encode())
    except OSError:
        break
    ack.write("".join("%s-%d\\n" % (prefix, i + j) for j in range(50))); ack.flush()
    i += 50
    time.sleep(50 / rate)
"""

CONTROL_WRITER = """\
import sys, time
from pathlib import Path
from seglogfs import control
log_dir, ack, prefix = Path(sys.argv[1]), open(sys.argv[2], "a"), sys.argv[3]
rate = float(sys.argv[4])
i = 0
while True:
    lines = ["%s-%d %s" % (prefix, i + j, "x" * 80) for j in range(50)]
    try:
        control.produce(log_dir, "ctl", [(None, l.encode(), (), None) for l in lines])
    except (control.ControlError, OSError):
        break
    ack.write("".join("%s-%d\\n" % (prefix, i + j) for j in range(50))); ack.flush()
    i += 50
    time.sleep(50 / rate)
"""


@dataclass
class Sample:
    at: float
    rss_kib: int
    fds: int
    threads: int


@dataclass
class Soak:
    mount: Mount
    samples: list[Sample] = field(default_factory=list)

    def sample(self) -> None:
        assert self.mount.proc is not None
        pid = self.mount.proc.pid
        status = Path(f"/proc/{pid}/status").read_text()
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        self.samples.append(
            Sample(
                time.monotonic(),
                int(fields["VmRSS"].split()[0]),
                len(os.listdir(f"/proc/{pid}/fd")),
                int(fields["Threads"]),
            )
        )

    def growth(self) -> tuple[float, float, float]:
        """(RSS MiB, descriptors, threads): the median of the last quarter of the
        samples minus that of the first quarter after the warm-up."""
        quarter = max(1, len(self.samples) // 4)
        first, last = self.samples[quarter : 2 * quarter], self.samples[-quarter:]

        def median(values: list[int]) -> float:
            return statistics.median(values)

        return (
            (median([s.rss_kib for s in last]) - median([s.rss_kib for s in first])) / 1024,
            median([s.fds for s in last]) - median([s.fds for s in first]),
            median([s.threads for s in last]) - median([s.threads for s in first]),
        )


def _start(
    code: str, *args: object, stdout: int | None = subprocess.DEVNULL
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", code, *map(str, args)],
        cwd=ROOT,
        stdout=stdout,
        stderr=subprocess.DEVNULL,
    )


def _check_follower(seen: list[str], acked: list[str], name: str) -> None:
    """``seen`` (ids in the order ``tail -f`` printed them) must be a run of ``acked``
    in order, possibly with gaps retention made, never reordered or repeated."""
    position = {line: i for i, line in enumerate(acked)}
    ranks = [position[line] for line in seen if line in position]
    assert len(ranks) >= len(seen) - 50, f"{name}: lines nobody acknowledged"  # one write
    assert ranks == sorted(set(ranks)), f"{name}: reordered or repeated lines"


def run_soak(tmp_path: Path, seconds: float) -> Soak:
    rng = random.Random(7)
    log_dir = tmp_path / "logs"
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    config = tmp_path / "server.properties"
    config.write_text(BROKER_CONFIG)
    mount = Mount(log_dir, mountpoint, ["--config", str(config)], tmp_path / "daemon.log")
    soak = Soak(mount)
    processes: list[subprocess.Popen[bytes]] = []
    followers: list[tuple[str, subprocess.Popen[bytes], Path]] = []
    try:
        mount.start()
        for topic in ("a", "b", "ctl"):
            os.mkdir(mountpoint / topic)
            for key, value in (("segment.bytes", b"262144"), ("retention.ms", b"4000")):
                os.setxattr(mountpoint / topic, f"user.seglog.{key}", value)
        acks = {name: tmp_path / f"ack-{name}" for name in ("a", "b", "ctl")}
        processes.append(_start(WRITER, mountpoint / "a" / "0", acks["a"], "a", 4000))
        processes.append(_start(WRITER, mountpoint / "b" / "produce", acks["b"], "b", 4000))
        processes.append(_start(CONTROL_WRITER, log_dir, acks["ctl"], "ctl", 4000))
        for topic in ("a", "ctl"):
            out = tmp_path / f"follow-{topic}"
            with open(out, "wb") as sink:
                follower = subprocess.Popen(
                    ["tail", "-f", "-s", "0.1", str(mountpoint / topic / "0")], stdout=sink
                )
            followers.append((topic, follower, out))
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            soak.sample()
            # A cat streams a whole partition now and then (the render process).
            if rng.random() < 0.3:
                subprocess.run(
                    ["cat", str(mountpoint / rng.choice(["a", "ctl"]) / "0")],
                    stdout=subprocess.DEVNULL,
                    check=True,
                )
            time.sleep(SAMPLE_S)
        for process in processes:
            process.terminate()
        for _topic, follower, _out in followers:
            follower.terminate()
            follower.wait(10)
        for process in processes:
            process.wait(30)
        log = mount.log()
        assert " ERROR " not in log, log[-3000:]
        assert "Traceback" not in log, log[-3000:]
        for topic, _follower, out in followers:
            acked = acks[topic].read_text().split()
            seen = [line.split(" ", 1)[0] for line in out.read_text().splitlines()]
            assert len(seen) > 100, f"{topic}: the follower saw almost nothing"
            _check_follower(seen, acked, topic)
        assert mount.stop() == 0, mount.log()
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
        for _topic, follower, _out in followers:
            if follower.poll() is None:
                follower.kill()
        mount.cleanup()
    rss, fds, threads = soak.growth()
    first, last = soak.samples[0], soak.samples[-1]
    segments = sum(1 for p in log_dir.glob("*/*.log"))
    deleted = "retention: " + str(mount.log().count("retention deleted"))
    print(
        f"soak {seconds:.0f} s, {len(soak.samples)} samples: RSS {first.rss_kib // 1024}"
        f" -> {last.rss_kib // 1024} MiB (growth {rss:+.1f} MiB), descriptors {first.fds}"
        f" -> {last.fds} ({fds:+.0f}), threads {first.threads} -> {last.threads}"
        f" ({threads:+.0f}); {segments} segments left, {deleted} passes"
    )
    assert mount.log().count("retention deleted") > 0, "retention never ran"
    assert rss < RSS_GROWTH_MIB
    assert fds < FD_GROWTH
    assert threads < THREAD_GROWTH
    return soak


@needs_fuse
@pytest.mark.slow
def test_soak_smoke(tmp_path: Path) -> None:
    run_soak(tmp_path, CI_SECONDS)


@needs_fuse
@pytest.mark.long
@pytest.mark.timeout(LONG_SECONDS + 900)
def test_soak(tmp_path: Path) -> None:
    run_soak(tmp_path, LONG_SECONDS)

"""A log of more segments than a login shell's soft descriptor limit allows: the daemon
and the command line raise the soft limit to the hard one
(``seglogfs.open_files_limit``). Each process starts with a soft limit of 128, which
the 60-segment log below exceeds (4 descriptors a segment in the daemon, 5 in a
read-only reader)."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from storage import LogManager

from .conftest import ROOT, MountDir, needs_fuse

SOFT = 128
SEGMENTS = 60
PER_SEGMENT = 20


def low_soft_limit() -> None:
    """In the child before exec: the soft limit of a tight shell, the hard one kept."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (SOFT, hard))


@pytest.fixture
def many_segments(tmp_path: Path) -> tuple[Path, list[bytes]]:
    log_dir = tmp_path / "logs"
    values = [b"record %04d" % i for i in range(SEGMENTS * PER_SEGMENT)]
    with LogManager.open(log_dir) as manager:
        # index.interval.bytes=1: every batch indexed, so every index is mapped.
        config = {"segment.bytes": "500", "index.interval.bytes": "1"}
        manager.create_topic("big", 1, config)
        log = manager.log("big", 0)
        for start in range(0, len(values), PER_SEGMENT // 4):
            log.append(values[start : start + PER_SEGMENT // 4])
        assert log.number_of_segments >= SEGMENTS
    return log_dir, values


def test_the_limit_is_raised_to_the_hard_limit_and_never_lowered() -> None:
    probe = (
        "import resource, json\n"
        "from seglogfs.open_files_limit import raise_open_files_limit\n"
        "got = raise_open_files_limit()\n"
        "print(json.dumps([got, *resource.getrlimit(resource.RLIMIT_NOFILE)]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=ROOT,
        preexec_fn=low_soft_limit,
        capture_output=True,
        check=True,
    ).stdout
    got, soft, hard = json.loads(out)
    assert got == soft == hard
    assert hard > SOFT  # else this machine cannot show the raise at all


def test_consume_reads_a_log_of_more_segments_than_the_soft_limit(
    many_segments: tuple[Path, list[bytes]],
) -> None:
    log_dir, values = many_segments
    script = Path(sys.executable).with_name("seglogfs")
    consume = [str(script), "consume", "-d", str(log_dir), "-e", "big"]
    done = subprocess.run(
        consume, preexec_fn=low_soft_limit, capture_output=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout == b"".join(v + b"\n" for v in values)


@needs_fuse
def test_the_daemon_mounts_a_log_of_more_segments_than_the_soft_limit(
    many_segments: tuple[Path, list[bytes]], mount_dir: MountDir
) -> None:
    log_dir, values = many_segments
    mount = mount_dir(log_dir, preexec_fn=low_soft_limit)
    cat = subprocess.run(
        ["cat", str(mount.mountpoint / "big" / "0")], capture_output=True, timeout=60, check=True
    )
    assert cat.stdout == b"".join(v + b"\n" for v in values)
    with open(mount.mountpoint / "big" / "0", "ab") as f:
        f.write(b"one more\n")
    assert mount.stop() == 0

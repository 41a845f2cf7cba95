"""The command line beside a real ``seglogfs mount`` daemon: writes go through its control
socket, reads work on the files, and ``consume`` prints what ``cat`` of the mounted
partition file prints."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.conftest import SCRIPT, run_script

pytestmark = pytest.mark.skipif(not Path("/dev/fuse").exists(), reason="no /dev/fuse")


@contextlib.contextmanager
def _daemon(log_dir: Path, mountpoint: Path) -> Iterator[None]:
    """``seglogfs mount LOGDIR MOUNTPOINT`` until the block ends; it must exit 0."""
    with subprocess.Popen(
        [str(SCRIPT), "mount", str(log_dir), str(mountpoint)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    ) as daemon:
        try:
            deadline = time.monotonic() + 60
            while not (log_dir / ".seglog.sock").exists() or not os.path.ismount(mountpoint):
                assert daemon.poll() is None, daemon.communicate()
                assert time.monotonic() < deadline, "the mount did not come up"
                time.sleep(0.05)
            yield
        finally:
            subprocess.run(["fusermount3", "-u", str(mountpoint)], check=False)
            try:
                daemon.wait(timeout=60)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
                subprocess.run(["fusermount3", "-u", "-z", str(mountpoint)], check=False)
    assert daemon.returncode == 0


@pytest.fixture
def mounted(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    log_dir, mountpoint = tmp_path / "logs", tmp_path / "mnt"
    log_dir.mkdir()
    mountpoint.mkdir()
    with _daemon(log_dir, mountpoint):
        yield log_dir, mountpoint


def test_cli_writes_through_the_daemon_and_reads_match_the_mount(
    mounted: tuple[Path, Path],
) -> None:
    log_dir, mountpoint = mounted
    env = {"SEGLOG_LOG_DIR": str(log_dir)}
    created = run_script(
        "topics", "create", "orders", "--partitions", "2", "--key-separator", ":", env=env
    )
    assert (created.code, created.out) == (0, b"Created topic orders.\n"), created.err
    # The daemon made it: the mount shows it at once.
    assert sorted(os.listdir(mountpoint / "orders")) == ["0", "1", "produce"]
    lines = b"".join(b"user-%d:event %d\n" % (i % 7, i) for i in range(500))
    produced = run_script("produce", "orders", stdin=lines, env=env)
    assert produced.code == 0, produced.err
    for partition in (0, 1):
        consumed = run_script("consume", "orders", "-p", str(partition), env=env)
        assert consumed.code == 0
        assert consumed.out == (mountpoint / "orders" / str(partition)).read_bytes()
        assert consumed.out
    both = run_script("consume", "orders", env=env).out
    assert sorted(both.splitlines()) == sorted(lines.splitlines())
    # A write through the mount is seen by consume; a keyed line goes where produce sends it.
    with open(mountpoint / "orders" / "produce", "ab") as produce_file:
        produce_file.write(b"user-3:from the mount\n")
    keyed = run_script("produce", "orders", stdin=b"user-3:from the cli\n", env=env)
    assert keyed.code == 0
    tails = [run_script("consume", "orders", "-p", str(p), "-o", "-2", env=env).out for p in (0, 1)]
    assert b"user-3:from the mount\nuser-3:from the cli\n" in tails
    # Errors come back from the daemon as they would from the engine.
    again = run_script("topics", "create", "orders", env=env)
    assert (again.code, again.err) == (
        1,
        "seglogfs topics create: error: topic 'orders' already exists\n",
    )
    altered = run_script("topics", "alter", "orders", "--add-config", "retention.ms=60000", env=env)
    assert altered.code == 0, altered.err
    described = run_script("topics", "describe", "orders", env=env).text
    assert "Configs: retention.ms=60000" in described
    verified = run_script("verify", str(log_dir), env=env)
    assert (verified.code, verified.out) == (0, b""), verified.out
    deleted = run_script("topics", "delete", "orders", env=env)
    assert deleted.code == 0, deleted.err
    assert run_script("topics", "list", env=env).out == b""


def test_delete_of_a_topic_with_the_longest_name_through_the_mount(tmp_path: Path) -> None:
    """Issue #16 (5), as it was seen: ``topics delete`` of a 249-character topic failed
    with "File name too long", the topic vanished from the mount, and ``mkdir`` of the
    name or a remount showed the old data again."""
    log_dir, mountpoint = tmp_path / "logs", tmp_path / "mnt"
    log_dir.mkdir()
    mountpoint.mkdir()
    env = {"SEGLOG_LOG_DIR": str(log_dir)}
    name = "t" * 249
    with _daemon(log_dir, mountpoint):
        (mountpoint / name).mkdir()
        subprocess.run(f"echo 'old data' >> {mountpoint / name / '0'}", shell=True, check=True)
        deleted = run_script("topics", "delete", name, env=env)
        assert (deleted.code, deleted.err) == (0, ""), deleted.err
        assert name not in os.listdir(mountpoint)
        (mountpoint / name).mkdir()
        assert subprocess.run(["cat", str(mountpoint / name / "0")], capture_output=True,
                              check=True).stdout == b""  # fmt: skip
        subprocess.run(f"echo 'new data' >> {mountpoint / name / '0'}", shell=True, check=True)
    with _daemon(log_dir, mountpoint):
        shown = subprocess.run(
            ["cat", str(mountpoint / name / "0")], capture_output=True, check=True
        )
        assert shown.stdout == b"new data\n"
    verified = run_script("verify", str(log_dir), env=env)
    assert (verified.code, verified.out) == (0, b""), verified.out


def test_verify_is_clean_beside_the_daemon(mounted: tuple[Path, Path]) -> None:
    """Issue #16 (8), as it was seen: ``seglogfs verify`` reported every empty partition
    (a topic just made with ``mkdir``) and every empty segment the daemon's roll by
    time starts, and exited 1."""
    log_dir, mountpoint = mounted
    env = {"SEGLOG_LOG_DIR": str(log_dir)}
    (mountpoint / "empty").mkdir()
    (mountpoint / "rolled").mkdir()
    subprocess.run(
        ["setfattr", "-n", "user.seglog.segment.ms", "-v", "200", str(mountpoint / "rolled")],
        check=True,
    )
    subprocess.run(f"echo 'a line' >> {mountpoint / 'rolled' / '0'}", shell=True, check=True)
    deadline = time.monotonic() + 30
    while len(list((log_dir / "rolled-0").glob("*.log"))) < 2:  # the daemon rolls it
        assert time.monotonic() < deadline, "the daemon did not roll by time"
        time.sleep(0.05)
    verified = run_script("verify", str(log_dir), env=env)
    assert (verified.code, verified.text) == (0, ""), verified.text

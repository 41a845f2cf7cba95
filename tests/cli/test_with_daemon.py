"""The command line beside a real ``seglogfs mount`` daemon: writes go through its control
socket, reads work on the files, and ``consume`` prints what ``cat`` of the mounted
partition file prints."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.conftest import SCRIPT, run_script

pytestmark = pytest.mark.skipif(not Path("/dev/fuse").exists(), reason="no /dev/fuse")


@pytest.fixture
def mounted(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    log_dir, mountpoint = tmp_path / "logs", tmp_path / "mnt"
    log_dir.mkdir()
    mountpoint.mkdir()
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
            yield log_dir, mountpoint
        finally:
            subprocess.run(["fusermount3", "-u", str(mountpoint)], check=False)
            try:
                daemon.wait(timeout=60)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
                subprocess.run(["fusermount3", "-u", "-z", str(mountpoint)], check=False)
    assert daemon.returncode == 0


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

"""The daemon exits as soon as its work is done (#23 item 6): once it has logged
"unmounted", nothing of the interpreter's teardown runs. Teardown here is made
deliberately slow (an ``atexit`` handler that sleeps 5 s, loaded through
``sitecustomize``), standing in for freeing a large daemon's objects one by one: a
daemon that ran it would take 5 s more to exit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.daemon.conftest import Mount, MountDir, is_mounted, needs_fuse

pytestmark = needs_fuse

SLOW_TEARDOWN_S = 5.0


@pytest.fixture
def slow_teardown(tmp_path: Path) -> dict[str, str]:
    """The environment of a Python whose teardown takes ``SLOW_TEARDOWN_S``."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        f"import atexit, time\natexit.register(time.sleep, {SLOW_TEARDOWN_S})\n"
    )
    return {"PYTHONPATH": str(site)}


def _exit_after_unmounted(mount: Mount) -> float:
    """SIGTERM the daemon; the seconds from its "unmounted" line to its exit."""
    assert mount.proc is not None
    mount.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 30
    while "INFO seglogfs.daemon.mount: unmounted" not in mount.log():
        assert time.monotonic() < deadline, mount.log()
        time.sleep(0.005)
    unmounted = time.monotonic()
    assert mount.proc.wait(30) == 0
    return time.monotonic() - unmounted


def test_python_m_daemon_exits_without_teardown(
    tmp_path: Path, mount_dir: MountDir, slow_teardown: dict[str, str]
) -> None:
    mount = mount_dir(tmp_path / "logs", env=slow_teardown)
    (mount.mountpoint / "t").mkdir()
    with open(mount.mountpoint / "t" / "0", "a") as partition:
        partition.write("one\n")
    assert _exit_after_unmounted(mount) < SLOW_TEARDOWN_S / 2
    assert not is_mounted(mount.mountpoint)
    assert (tmp_path / "logs" / ".kafka_cleanshutdown").exists()
    assert mount.log().rstrip().endswith(f"unmounted {mount.mountpoint}")  # flushed


def test_the_console_script_exits_without_teardown(
    tmp_path: Path, slow_teardown: dict[str, str]
) -> None:
    logs, mnt = tmp_path / "logs", tmp_path / "mnt"
    mnt.mkdir()
    script = Path(sys.executable).with_name("seglogfs")
    mount = Mount(logs, mnt, [], tmp_path / "daemon.log")
    with open(mount.log_path, "ab") as log:
        mount.proc = subprocess.Popen(
            [str(script), "mount", str(logs), str(mnt)],
            stdout=log,
            stderr=log,
            env={**os.environ, **slow_teardown},
        )
    try:
        mount.wait_mounted()
        assert _exit_after_unmounted(mount) < SLOW_TEARDOWN_S / 2
    finally:
        mount.cleanup()


def test_a_refused_mount_still_exits_normally(
    tmp_path: Path, slow_teardown: dict[str, str]
) -> None:
    """Only a process that mounted skips teardown: a refused set-up exits as every
    command does (here: with the deliberately slow teardown)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    (mnt / "x").write_text("")
    started = time.monotonic()
    completed = subprocess.run(
        [sys.executable, "-m", "seglogfs.daemon", str(tmp_path / "logs"), str(mnt)],
        capture_output=True,
        env={**os.environ, **slow_teardown},
        timeout=60,
        check=False,
    )
    assert completed.returncode == 1
    assert time.monotonic() - started >= SLOW_TEARDOWN_S


def _stop_signals_caught(pid: int) -> bool:
    """Whether process ``pid`` catches SIGTERM, SIGINT and SIGHUP (``SigCgt``)."""
    status = Path(f"/proc/{pid}/status").read_text()
    caught = int(next(line for line in status.splitlines() if line.startswith("SigCgt:"))[7:], 16)
    return all(caught & (1 << (signum - 1)) for signum in (15, 2, 1))


def test_sigterm_as_soon_as_the_mount_exists_unmounts_cleanly(tmp_path: Path) -> None:
    """A stop signal between the mount and the event loop's signal receiver was left to
    its default action: the daemon died and left a dead mount ("Transport endpoint is
    not connected"). The signal is sent the moment the daemon logs "mounted" (read from
    its stderr as it is written), when that receiver was not listening yet."""
    logs, mnt = tmp_path / "logs", tmp_path / "mnt"
    mnt.mkdir()
    with subprocess.Popen(
        [sys.executable, "-m", "seglogfs.daemon", str(logs), str(mnt)],
        stderr=subprocess.PIPE,
        text=True,
    ) as daemon:
        try:
            assert daemon.stderr is not None
            lines = []
            for line in daemon.stderr:
                lines.append(line)
                if "INFO seglogfs.daemon.mount: mounted " in line:
                    break
            caught = _stop_signals_caught(daemon.pid)
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(30)
            log = "".join(lines) + daemon.stderr.read()
        finally:
            if daemon.poll() is None:
                daemon.kill()
                daemon.wait(30)
            if is_mounted(mnt):
                subprocess.run(["fusermount3", "-u", "-z", str(mnt)], check=False)
    # From the mount on, a stop signal never has its default action.
    assert (daemon.returncode, caught) == (0, True), log
    assert "SIGTERM: unmounting" in log
    assert not is_mounted(mnt)
    assert (logs / ".kafka_cleanshutdown").exists()

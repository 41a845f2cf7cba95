"""Issue #18 item 3 against a real ``seglogfs mount``: a thousand control-socket
connections that send 3 bytes of a frame and stay silent, under a lowered
``RLIMIT_NOFILE`` in the daemon (600, so that the test is fast). Before, they took
every descriptor: ``cat`` and ``mkdir`` on the mount failed with ``EMFILE``,
``seglogfs produce`` hung, and trio logged ``EMFILE`` tracebacks ten times a second."""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from storage import LogManager
from tests.cli.conftest import SCRIPT
from tests.daemon.conftest import MountDir, needs_fuse

pytestmark = needs_fuse

DAEMON_NOFILE = 600
CLIENTS = 1000


def _daemon_nofile() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (DAEMON_NOFILE, DAEMON_NOFILE))


@contextmanager
def _silent_clients(path: Path, count: int) -> Iterator[list[socket.socket]]:
    """Up to ``count`` connections that each send 3 bytes of a frame, made as fast as
    the daemon accepts them; once its backlog stays full for a second (it accepts no
    more), no more are tried."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, count + 1024), hard))
    clients: list[socket.socket] = []
    full_since: float | None = None
    try:
        while len(clients) < count:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                sock.connect(str(path))
            except BlockingIOError:
                sock.close()
                full_since = full_since or time.monotonic()
                if time.monotonic() - full_since > 1.0:
                    break
                time.sleep(0.002)
                continue
            full_since = None
            sock.send(b"\x00\x00\x00")
            clients.append(sock)
        yield clients
    finally:
        for sock in clients:
            sock.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _run(*args: str, stdin: bytes = b"", timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(list(args), input=stdin, capture_output=True, timeout=timeout)


def _daemon_descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@pytest.mark.parametrize(
    ("settings", "line"),
    [
        # The reserve holds: connections are accepted until 256 descriptors are left.
        (
            "max.connections=100000\ncontrol.frame.timeout.ms=3000\n",
            "descriptors free, control.reserved.fds=256: not accepting connections",
        ),
        # max.connections holds (its default, 64): the rest wait in the backlog.
        ("control.frame.timeout.ms=3000\n", "max.connections=64 connections are busy"),
    ],
    ids=["reserved-fds", "max-connections"],
)
def test_silent_connections_leave_the_file_system_its_descriptors(
    tmp_path: Path, mount_dir: MountDir, settings: str, line: str
) -> None:
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    with LogManager.open(log_dir) as manager:
        manager.create_topic("t", 1, {})
        manager.log("t", 0).append([b"first"])
    properties = tmp_path / "server.properties"
    properties.write_text(settings)
    mount = mount_dir(log_dir, "--config", str(properties), preexec_fn=_daemon_nofile)
    assert mount.proc is not None
    partition = mount.mountpoint / "t" / "0"
    env = {**os.environ, "SEGLOG_LOG_DIR": str(log_dir)}

    with _silent_clients(log_dir / ".seglog.sock", CLIENTS) as clients:
        assert len(clients) >= 64
        time.sleep(1.0)  # the daemon accepts what it will
        held = _daemon_descriptors(mount.proc.pid)
        print(f"{len(clients)} silent connections made, the daemon holds {held} descriptors")
        assert held <= DAEMON_NOFILE - 200, f"the daemon holds {held} descriptors"
        # The file system works meanwhile.
        assert partition.read_bytes() == b"first\n"
        (mount.mountpoint / "u").mkdir()
        with open(partition, "ab") as f:
            f.write(b"second\n")
        assert partition.read_bytes() == b"first\nsecond\n"
        # A command through the control socket neither hangs nor wrongly finds no
        # daemon: it waits for the silent connections' frame timeout, then is served.
        started = time.monotonic()
        produced = subprocess.run(
            [str(SCRIPT), "produce", "t"], input=b"third\n", env=env, capture_output=True,
            timeout=120,
        )  # fmt: skip
        assert produced.returncode == 0, produced.stderr
        assert time.monotonic() - started < 60
        assert partition.read_bytes() == b"first\nsecond\nthird\n"

    assert mount.stop() == 0
    log = mount.log()
    assert "Traceback" not in log
    assert "Too many open files" not in log
    assert sum(line in entry for entry in log.splitlines()) == 1, log[-3000:]


def test_a_produce_that_cannot_connect_fails_instead_of_hanging(
    tmp_path: Path, mount_dir: MountDir
) -> None:
    # The daemon stopped (SIGSTOP): its backlog fills and nobody answers. The command
    # line gives up after its connect timeout with one line and exit 1.
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    with LogManager.open(log_dir) as manager:
        manager.create_topic("t", 1, {})
    mount = mount_dir(log_dir)
    assert mount.proc is not None
    env = {**os.environ, "SEGLOG_LOG_DIR": str(log_dir)}
    os.kill(mount.proc.pid, 19)  # SIGSTOP
    try:
        with _silent_clients(log_dir / ".seglog.sock", 200):
            started = time.monotonic()
            produced = subprocess.run(
                [str(SCRIPT), "produce", "t"], input=b"x\n", env=env, capture_output=True,
                timeout=60,
            )  # fmt: skip
            took = time.monotonic() - started
    finally:
        os.kill(mount.proc.pid, 18)  # SIGCONT
    assert produced.returncode == 1
    assert produced.stderr.decode().splitlines() == [
        "seglogfs produce: error: cannot connect to the daemon on "
        f"{log_dir / '.seglog.sock'}: the daemon's backlog stays full"
    ]
    assert 5 < took < 40  # CONNECT_TIMEOUT_S, 10 s


def test_a_bad_control_setting_stops_the_mount_with_one_line(
    tmp_path: Path, mount_dir: MountDir
) -> None:
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    properties = tmp_path / "server.properties"
    properties.write_text("num.partitions=2\nmax.connections=0\n")
    mount = mount_dir(log_dir, "--config", str(properties), wait=False)
    assert mount.proc is not None
    # A bad value in --config is a usage error, as for the other commands' files, and
    # the line names the file.
    assert mount.proc.wait(60) == 2
    assert mount.log().strip().splitlines()[-1] == (
        f"seglogfs mount: error: --config {properties}: invalid value 0 for configuration "
        "max.connections: must be a whole number from 1 to 2147483647"
    )

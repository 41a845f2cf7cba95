"""Fixtures of the file-system suites: handler-level ``Operations`` over a real engine,
and real mounts in a subprocess that are always unmounted, even when a test fails."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import trio

from seglogfs.daemon.operations import Operations
from seglogfs.positions import position_index_spec
from storage import BrokerConfig, LogManager
from tests.conftest import ManualClock

ROOT = Path(__file__).resolve().parents[2]
HAVE_FUSE = os.path.exists("/dev/fuse")
needs_fuse = pytest.mark.skipif(not HAVE_FUSE, reason="/dev/fuse is missing")

MOUNT_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0


# -- handlers without a kernel --------------------------------------------------------


async def run_sync(fn: object, *args: object) -> object:
    """The daemon's bridge to worker threads, as the mount passes it."""
    return await trio.to_thread.run_sync(fn, *args)  # type: ignore[arg-type]


def open_manager(log_dir: Path, clock: ManualClock | None = None, **kwargs: object) -> LogManager:
    """A writable ``LogManager`` keeping the position index, as the daemon opens it;
    ``partitions`` sets ``num.partitions``."""
    broker = BrokerConfig(log_dirs=(str(log_dir),), num_partitions=kwargs.pop("partitions", 1))  # type: ignore[arg-type]
    if clock is None:
        return LogManager.open(log_dir, broker, extension=position_index_spec, **kwargs)  # type: ignore[arg-type]
    return LogManager.open(log_dir, broker, clock=clock, extension=position_index_spec, **kwargs)  # type: ignore[arg-type]


@pytest.fixture
def manager(log_dir: Path, clock: ManualClock) -> Iterator[LogManager]:
    with open_manager(log_dir, clock) as manager:
        yield manager


@pytest.fixture
def ops(manager: LogManager) -> Operations:
    return Operations(manager, run_sync)


# -- real mounts ------------------------------------------------------------------------


def is_mounted(path: Path) -> bool:
    """Whether ``path`` is a mount point now (also a dead FUSE mount, which
    ``os.path.ismount`` cannot stat)."""
    target = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == target for line in f)


class Mount:
    """A ``seglogfs mount`` daemon running in a subprocess."""

    def __init__(self, log_dir: Path, mountpoint: Path, args: list[str], log_path: Path) -> None:
        self.log_dir = log_dir
        self.mountpoint = mountpoint
        self.args = args
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(
        self,
        env: dict[str, str] | None = None,
        *,
        wait: bool = True,
        preexec_fn: Callable[[], object] | None = None,
    ) -> None:
        command = [sys.executable, "-m", "seglogfs.daemon", str(self.log_dir), str(self.mountpoint)]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [*command, *self.args],
                stdout=log,
                stderr=log,
                cwd=ROOT,
                env={**os.environ, **(env or {})},
                preexec_fn=preexec_fn,
            )
        if wait:
            self.wait_mounted()

    def wait_mounted(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + MOUNT_TIMEOUT_S
        while not is_mounted(self.mountpoint):
            if self.proc.poll() is not None:
                raise AssertionError(f"the daemon exited with {self.proc.returncode}: {self.log()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no mount after {MOUNT_TIMEOUT_S} s: {self.log()}")
            time.sleep(0.02)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM, wait for the exit; the exit code."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(STOP_TIMEOUT_S)

    def cleanup(self) -> None:
        """Whatever happened: the daemon gone, the mount point unmounted."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(STOP_TIMEOUT_S)
        if is_mounted(self.mountpoint):
            subprocess.run(["fusermount3", "-u", str(self.mountpoint)], check=False)
        if is_mounted(self.mountpoint):
            subprocess.run(["fusermount3", "-uz", str(self.mountpoint)], check=False)


@pytest.fixture
def mounts(tmp_path: Path) -> Iterator[list[Mount]]:
    started: list[Mount] = []
    yield started
    for mount in reversed(started):
        mount.cleanup()


MountDir = Callable[..., Mount]
"""The ``mount_dir`` fixture's type."""


@pytest.fixture
def mount_dir(tmp_path: Path, mounts: list[Mount]) -> MountDir:
    """``mount_dir(log_dir, *args)``: mount ``log_dir`` on a fresh mount point."""

    def start(
        log_dir: Path,
        *args: str,
        env: dict[str, str] | None = None,
        wait: bool = True,
        preexec_fn: Callable[[], object] | None = None,
    ) -> Mount:
        mountpoint = tmp_path / f"mnt{len(mounts)}"
        mountpoint.mkdir()
        mount = Mount(log_dir, mountpoint, list(args), tmp_path / f"daemon{len(mounts)}.log")
        mounts.append(mount)
        mount.start(env, wait=wait, preexec_fn=preexec_fn)
        return mount

    return start

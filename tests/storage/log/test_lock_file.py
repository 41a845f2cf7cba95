"""The writer lock: only the directory's writers can take it (issue #18, item 8).

The hostile cases run a throwaway unprivileged user (``useradd``, then ``setpriv``);
they need root and skip with that reason without it.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from storage import LogDirLockedError, LogManager
from storage.log.lock_file import LogDirLock

ROOT = Path(__file__).resolve().parents[3]
SYSTEM_PYTHON = Path("/usr/bin/python3")  # readable by every user, unlike a venv's
SECOND_WRITER = (
    "import sys; from storage import LogManager, LogDirLockedError\n"
    "try:\n    LogManager.open(sys.argv[1]).close()\nexcept LogDirLockedError:\n    sys.exit(3)\n"
)


@pytest.fixture
def other_user() -> Iterator[pwd.struct_passwd]:
    """A throwaway unprivileged user, removed afterwards."""
    if os.geteuid() != 0:
        pytest.skip("creating a throwaway user needs root")
    if shutil.which("useradd") is None or shutil.which("setpriv") is None:
        pytest.skip("useradd and setpriv are needed to act as another user")
    name = f"seglogt{os.getpid() % 100000}"
    created = subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
        capture_output=True,
        text=True,
        check=False,
    )
    if created.returncode != 0:
        pytest.skip(f"useradd failed: {created.stderr.strip()}")
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], capture_output=True, check=False)


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory every user can reach (pytest's own temporary tree is root's only)."""
    path = Path(tempfile.mkdtemp(prefix="seglog-lock-", dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def holding(argv: list[str]) -> Iterator[bool]:
    """Run ``argv`` in the background until the block ends; yields whether it said
    ``held`` (it prints that once it holds its lock; it exits at once if it cannot)."""
    process = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True
    )
    try:
        assert process.stdout is not None
        yield process.stdout.readline().strip() == "held"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        if process.stdout is not None:
            process.stdout.close()


def as_user(user: pwd.struct_passwd, *argv: str) -> list[str]:
    return [
        "setpriv",
        f"--reuid={user.pw_uid}",
        f"--regid={user.pw_gid}",
        "--clear-groups",
        *argv,
    ]


def flock_command(lock: Path) -> list[str]:
    """util-linux's ``flock -x -n``: what issue #18 used to block every writer (``-o``:
    the lock stays with ``flock`` itself, which ``holding`` kills, not its child)."""
    return ["flock", "-x", "-n", "-o", str(lock), "sh", "-c", "echo held; exec sleep 60"]


def read_lock_command(lock: Path) -> list[str]:
    """A POSIX read lock (``F_RDLCK``) through a read-only descriptor."""
    code = (
        "import fcntl, os, sys, time\n"
        "fd = os.open(sys.argv[1], os.O_RDONLY)\n"
        "fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)\n"
        "print('held', flush=True)\n"
        "time.sleep(60)\n"
    )
    return [str(SYSTEM_PYTHON), "-c", code, str(lock)]


def older_version_layout(log_dir: Path) -> Path:
    """A log directory as seglogfs made it before: 0755, with a 0644 lock file."""
    log_dir.mkdir(mode=0o755)
    log_dir.chmod(0o755)
    lock = log_dir / ".seglog.lock"
    lock.write_text("4242\n")
    lock.chmod(0o644)
    return lock


def second_writer_exit_code(log_dir: Path) -> int:
    return subprocess.run(
        [sys.executable, "-c", SECOND_WRITER, str(log_dir)], cwd=ROOT, check=False, timeout=60
    ).returncode


def test_another_users_flock_does_not_block_the_writer(
    other_user: pwd.struct_passwd, shared_dir: Path
) -> None:
    """Issue #18 (8): ``flock -x -n LOGDIR/.seglog.lock sleep 20`` as any local user
    kept ``seglogfs mount`` and ``topics create`` out ("already mounted or written by
    another process"): the lock was an flock, which a read-only descriptor takes, on a
    0644 file. The writer's lock is now a write lock, which needs write access; the
    old file is replaced by a 0600 one that the other user cannot even open."""
    log_dir = shared_dir / "logs"
    lock = older_version_layout(log_dir)
    old_inode = lock.stat().st_ino
    with holding(as_user(other_user, *flock_command(lock))) as held:
        assert held  # the block of issue #18, reproduced
        with LogManager.open(log_dir) as manager:
            manager.create_topic("orders")
            assert lock.stat().st_ino != old_inode
            assert lock.stat().st_mode & 0o777 == 0o600
            assert second_writer_exit_code(log_dir) == 3  # still one writer
        with LogManager.open(log_dir) as again:
            assert again.topics() == ["orders"]
    with holding(as_user(other_user, *flock_command(lock))) as held_again:
        assert not held_again  # the 0600 file: permission denied


def test_another_users_read_lock_does_not_block_the_writer(
    other_user: pwd.struct_passwd, shared_dir: Path
) -> None:
    """A read lock (``F_RDLCK``) through a read-only descriptor of an older version's
    0644 lock file refuses every write lock on that file. Writers never take one, so
    the writer takes the file's flock instead and puts a fresh 0600 file in its place."""
    if not SYSTEM_PYTHON.exists():
        pytest.skip(f"{SYSTEM_PYTHON} is needed to take a read lock as another user")
    log_dir = shared_dir / "logs"
    lock = older_version_layout(log_dir)
    with holding(as_user(other_user, *read_lock_command(lock))) as held:
        assert held
        with LogManager.open(log_dir) as manager:
            manager.create_topic("orders")
            assert lock.stat().st_mode & 0o777 == 0o600
            assert second_writer_exit_code(log_dir) == 3
        LogManager.open(log_dir).close()


def test_another_users_read_lock_and_flock_refuse_the_writer_with_a_remedy(
    other_user: pwd.struct_passwd, shared_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """With both locks of an older version's lock file taken by someone who is not a
    writer, no lock is left that tells writers apart: the writer is refused and the
    warning says which file to remove. Without it, the next open makes a 0600 one."""
    if not SYSTEM_PYTHON.exists():
        pytest.skip(f"{SYSTEM_PYTHON} is needed to take a read lock as another user")
    log_dir = shared_dir / "logs"
    lock = older_version_layout(log_dir)
    with (
        holding(as_user(other_user, *read_lock_command(lock))) as read_held,
        holding(as_user(other_user, *flock_command(lock))) as flock_held,
    ):
        assert read_held
        assert flock_held
        with pytest.raises(LogDirLockedError):
            LogManager.open(log_dir)
        assert f"{lock} (mode 644) is locked by another user's process" in caplog.text
        assert "remove the file" in caplog.text
        lock.unlink()
        with LogManager.open(log_dir) as manager:
            assert manager.topics() == []
        assert lock.stat().st_mode & 0o777 == 0o600


def test_a_log_directory_seglogfs_makes_keeps_other_users_out(
    other_user: pwd.struct_passwd, shared_dir: Path
) -> None:
    """Under a umask of 022 the log directory is made 0750 (segment files follow the
    umask, 0644, and stay out of other users' reach) and the lock file 0600."""
    log_dir = shared_dir / "made" / "logs"
    previous = os.umask(0o022)
    try:
        LogManager.open(log_dir).close()
    finally:
        os.umask(previous)
    assert log_dir.stat().st_mode & 0o777 == 0o750
    assert log_dir.parent.stat().st_mode & 0o777 == 0o755  # parents: the umask's
    assert (log_dir / ".seglog.lock").stat().st_mode & 0o777 == 0o600
    with holding(as_user(other_user, *flock_command(log_dir / ".seglog.lock"))) as held:
        assert not held
    listing = subprocess.run(
        as_user(other_user, "ls", str(log_dir)), capture_output=True, check=False
    )
    assert listing.returncode != 0


def test_an_older_writers_flock_keeps_the_writer_out(shared_dir: Path) -> None:
    """A seglogfs of an older version locks with flock alone: held by the file's owner
    (or root), it still means a writer, whatever the file's mode. And while a writer
    of this version holds the lock, an older one's flock fails."""
    log_dir = shared_dir / "logs"
    lock = older_version_layout(log_dir)
    with holding(flock_command(lock)) as held:
        assert held
        with pytest.raises(LogDirLockedError):
            LogManager.open(log_dir)
    with LogManager.open(log_dir), holding(flock_command(lock)) as held:
        assert not held
    lock.chmod(0o600)
    with holding(flock_command(lock)) as held:
        assert held
        with pytest.raises(LogDirLockedError):
            LogManager.open(log_dir)


def test_the_lock_holds_when_another_descriptor_of_the_file_closes(tmp_path: Path) -> None:
    """A POSIX record lock (what ``lockf`` takes) is dropped when the process closes any
    descriptor of the file; the open-file-description lock is not."""
    lock = LogDirLock(tmp_path)
    lock.acquire()
    try:
        fd = os.open(tmp_path / ".seglog.lock", os.O_RDONLY)
        os.close(fd)
        with pytest.raises(LogDirLockedError):
            LogDirLock(tmp_path).acquire()  # also within one process
        assert second_writer_exit_code(tmp_path) == 3
    finally:
        lock.release()
    assert not lock.held
    LogManager.open(tmp_path).close()


def test_the_lock_dies_with_its_process(tmp_path: Path) -> None:
    code = (
        "import sys, time; from storage import LogManager\n"
        "manager = LogManager.open(sys.argv[1])\n"
        "print('held', flush=True)\n"
        "time.sleep(60)\n"
    )
    with holding([sys.executable, "-c", code, str(tmp_path)]) as held:
        assert held
        assert second_writer_exit_code(tmp_path) == 3
    LogManager.open(tmp_path).close()  # SIGKILL'ed: no stale lock

"""Bad set-up of ``seglogfs mount``, tried as a new user would, through the console
script: each mistake is one line naming it before anything is created or mounted
(issue #17 "Bad set-up", #23 item 2): a file as the log directory, a mount point that
does not exist, is mounted already or is dead, a log directory inside the mount point
or inside another seglogfs mount, the mount point given to the command line as the log
directory, a read-only file system, a bad ``--config``, an unknown config key through
``setfattr`` and through the daemon's control socket."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli.conftest import (
    Result,
    as_nobody,
    needs_root,
    public_dir,
    read_only_file_system,
    refused,
    run_script,
    tree,
    write,
)
from tests.daemon.conftest import MOUNT_TIMEOUT_S, MountDir, is_mounted, needs_fuse

pytestmark = needs_fuse

SCRIPT = Path(sys.executable).with_name("seglogfs")


def mount_refused(*args: str, mountpoint: Path) -> Result:
    """``seglogfs mount ARGS`` that must fail at once; a daemon that mounts instead is
    stopped (and its mount cleared) before the test fails."""
    try:
        return run_script("mount", *args, timeout=20)
    except subprocess.TimeoutExpired:
        subprocess.run(["fusermount3", "-u", "-z", str(mountpoint)], check=False)
        raise AssertionError(
            f"seglogfs mount {' '.join(args)} mounted instead of refusing"
        ) from None


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    logs, mnt = tmp_path / "logs", tmp_path / "mnt"
    mnt.mkdir()
    return logs, mnt


def test_a_file_as_the_log_dir_is_not_a_directory(tmp_path: Path, dirs: tuple[Path, Path]) -> None:
    _, mnt = dirs
    hostname = write(tmp_path / "hostname", "box\n")
    # Was "hostname: File exists" (mkdir's word for it).
    refused(
        mount_refused(str(hostname), str(mnt), mountpoint=mnt),
        1,
        f"log directory {hostname} is not a directory",
    )
    assert hostname.read_text() == "box\n"
    assert not is_mounted(mnt)


def test_a_mount_point_that_does_not_exist_says_so(tmp_path: Path, dirs: tuple[Path, Path]) -> None:
    logs, _ = dirs
    nowhere = tmp_path / "no" / "such" / "dir"
    # Was "mount point ... is not a directory".
    refused(
        mount_refused(str(logs), str(nowhere), mountpoint=nowhere),
        1,
        f"mount point {nowhere} does not exist",
    )
    hostname = write(tmp_path / "hostname", "box\n")
    refused(
        mount_refused(str(logs), str(hostname), mountpoint=hostname),
        1,
        f"mount point {hostname} is not a directory",
    )
    assert not logs.exists()  # nothing made for a mount that cannot happen


def test_a_log_dir_and_mount_point_that_overlap_are_refused(tmp_path: Path) -> None:
    # Each mounted before: over its own log directory, or into it.
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    inner = mnt / "logs"
    refused(
        mount_refused(str(inner), str(mnt), mountpoint=mnt),
        1,
        f"log directory {inner} is inside the mount point {mnt}: the mount would hide it; "
        "keep it outside",
    )
    assert os.listdir(mnt) == []
    refused(
        mount_refused(str(mnt), str(mnt), mountpoint=mnt),
        1,
        f"log directory {mnt} is the mount point itself: mount it on another, empty directory",
    )
    logs = tmp_path / "logs"
    (logs / "mnt").mkdir(parents=True)
    refused(
        mount_refused(str(logs), str(logs / "mnt"), mountpoint=logs / "mnt"),
        1,
        f"mount point {logs / 'mnt'} is inside the log directory {logs}: use a directory "
        "outside it",
    )
    assert os.listdir(logs) == ["mnt"]
    assert not any(is_mounted(path) for path in (mnt, logs / "mnt"))


def test_relative_paths_work(tmp_path: Path, dirs: tuple[Path, Path]) -> None:
    _, mnt = dirs
    daemon = subprocess.Popen(
        [str(SCRIPT), "mount", "logs", "mnt"], cwd=tmp_path, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + MOUNT_TIMEOUT_S
        while not is_mounted(mnt):
            assert daemon.poll() is None, "the daemon exited"
            assert time.monotonic() < deadline, "no mount"
            time.sleep(0.02)
        (mnt / "t").mkdir()
        created = subprocess.run(
            [str(SCRIPT), "produce", "t", "-d", "logs"],
            cwd=tmp_path,
            input=b"relative\n",
            capture_output=True,
            check=False,
        )
        assert created.returncode == 0, created.stderr
        assert (mnt / "t" / "0").read_bytes() == b"relative\n"
    finally:
        daemon.terminate()
        assert daemon.wait(30) == 0
        subprocess.run(["fusermount3", "-u", "-z", str(mnt)], check=False, capture_output=True)
    assert not is_mounted(mnt)


def test_a_mount_point_mounted_already_is_refused(tmp_path: Path, mount_dir: MountDir) -> None:
    first = mount_dir(tmp_path / "first")
    (first.mountpoint / "t").mkdir()
    second = tmp_path / "second"
    # Was a second mount stacked over the first, hiding it.
    refused(
        mount_refused(str(second), str(first.mountpoint), mountpoint=first.mountpoint),
        1,
        f"mount point {first.mountpoint} is mounted already (fuse.seglogfs from "
        f"{os.path.realpath(tmp_path / 'first')}): "
        f"unmount it first with fusermount3 -u {first.mountpoint}",
    )
    assert not second.exists()
    assert os.listdir(first.mountpoint) == ["t"]  # the first mount still answers


def test_a_dead_mount_point_says_how_to_clear_it(tmp_path: Path, mount_dir: MountDir) -> None:
    dead = mount_dir(tmp_path / "logs")
    dead.kill()
    with pytest.raises(OSError, match="not connected"):
        os.listdir(dead.mountpoint)
    # Was "mount point ... is not a directory".
    refused(
        mount_refused(str(tmp_path / "logs"), str(dead.mountpoint), mountpoint=dead.mountpoint),
        1,
        f"mount point {dead.mountpoint} is a dead FUSE mount (its daemon is gone: Transport "
        f"endpoint is not connected); clear it with fusermount3 -u -z {dead.mountpoint}",
    )
    refused(
        run_script("topics", "list", "-d", str(dead.mountpoint)),
        1,
        f"{dead.mountpoint} is a seglogfs mount point, not a log directory: give the log "
        f"directory that mount serves ({os.path.realpath(tmp_path / 'logs')})",
    )


def test_a_seglogfs_mount_is_not_a_log_directory(tmp_path: Path, mount_dir: MountDir) -> None:
    logs = tmp_path / "logs"
    mount = mount_dir(logs)
    mnt = mount.mountpoint
    (mnt / "t").mkdir()
    before = tree(logs)
    # The mount's source is its log directory (#23 item 5), so the message names it.
    served = f" ({os.path.realpath(logs)})"
    mount_point_message = (
        f"{mnt} is a seglogfs mount point, not a log directory: give the log directory "
        f"that mount serves{served}"
    )
    # Were: an empty list (exit 0), "mnt/.seglog.lock: Operation not permitted",
    # "topic 't' does not exist", "no problems found" (exit 0).
    for command in (
        ["topics", "list"],
        ["topics", "create", "x"],
        ["topics", "describe"],
        ["consume", "t"],
        ["produce", "t"],
    ):
        refused(run_script(*command, "-d", str(mnt), stdin=b"x\n"), 1, mount_point_message)
    refused(run_script("verify", str(mnt)), 1, mount_point_message)
    refused(
        run_script("produce", "x", "-d", str(mnt / "t"), stdin=b"x\n"),
        1,
        f"{mnt / 't'} is inside the seglogfs mount {mnt}: give the log directory that mount "
        f"serves{served}",
    )
    # Mounting a directory of a mount: mkdir made a topic "sub" there, then the lock
    # file failed with "Invalid argument".
    other = tmp_path / "other"
    other.mkdir()
    refused(
        mount_refused(str(mnt / "sub"), str(other), mountpoint=other),
        1,
        f"{mnt / 'sub'} is inside the seglogfs mount {mnt}: give the log directory that "
        f"mount serves{served}",
    )
    refused(
        mount_refused(str(mnt), str(other), mountpoint=other),
        1,
        mount_point_message,
    )
    assert os.listdir(mnt) == ["t"]
    assert tree(logs) == before


@needs_root
def test_a_log_dir_on_a_read_only_file_system_says_to_mount_it_read_only(
    tmp_path: Path, mount_dir: MountDir
) -> None:
    logs = tmp_path / "logs"
    assert run_script("topics", "create", "t", "-d", str(logs)).code == 0
    assert run_script("produce", "t", "-d", str(logs), stdin=b"kept\n").code == 0
    with read_only_file_system(tmp_path / "ro", holding=logs) as copy:
        mnt = tmp_path / "mnt"
        mnt.mkdir()
        # Was "ro/logs/.seglog.lock: Read-only file system".
        refused(
            mount_refused(str(copy), str(mnt), mountpoint=mnt),
            1,
            f"log directory {copy} is on a read-only file system; mount it read-only with -o ro",
        )
        mount = mount_dir(copy, "-o", "ro")
        assert (mount.mountpoint / "t" / "0").read_bytes() == b"kept\n"
        assert mount.stop() == 0


def test_config_file_mistakes_name_the_option_and_the_file(
    tmp_path: Path, dirs: tuple[Path, Path]
) -> None:
    logs, mnt = dirs

    def mount_with(config: Path) -> Result:
        return mount_refused(str(logs), str(mnt), "--config", str(config), mountpoint=mnt)

    missing = tmp_path / "server.properties"
    refused(mount_with(missing), 1, f"--config {missing} does not exist")
    refused(mount_with(tmp_path), 1, f"--config {tmp_path} is a directory, not a properties file")
    typo = write(tmp_path / "typo.properties", "log.retention.hour=1\n")
    # A bad key or value is a usage error (exit 2), as for the other commands; was 1.
    refused(
        mount_with(typo),
        2,
        f"--config {typo}: unknown log configuration 'log.retention.hour' (did you mean "
        "log.retention.hours?)",
    )
    bad = write(tmp_path / "bad.properties", "fetch.max.bytes=12\n")
    refused(
        mount_with(bad),
        2,
        f"--config {bad}: invalid value '12' for configuration fetch.max.bytes: must be a "
        "whole number from 1024 to 2147483647",
    )
    assert not logs.exists()
    assert not is_mounted(mnt)


@needs_root
def test_a_user_who_cannot_open_dev_fuse_is_told_so() -> None:
    if os.stat("/dev/fuse").st_mode & 0o006 == 0o006:
        pytest.skip("/dev/fuse is usable by everyone here")
    with public_dir() as public:
        (public / "mnt").mkdir()
        shutil.chown(public, "nobody")
        shutil.chown(public / "mnt", "nobody")
        result = as_nobody("mount", str(public / "logs"), str(public / "mnt"), timeout=20)
        # Was libfuse's "fuse: failed to open /dev/fuse: Permission denied", then
        # "cannot mount on mnt (fuse_session_mount failed): is it mounted already?".
        refused(
            result,
            1,
            "no permission to open /dev/fuse (owned by root, mode 0600; running as nobody): "
            "run the daemon as root, or make /dev/fuse mode 0666",
        )
        assert not (public / "logs").exists()


def test_an_unknown_key_through_setfattr_and_the_daemon_names_the_closest(
    tmp_path: Path, mount_dir: MountDir
) -> None:
    logs = tmp_path / "logs"
    mount = mount_dir(logs)
    (mount.mountpoint / "t").mkdir()
    with pytest.raises(OSError, match="Invalid argument"):
        os.setxattr(mount.mountpoint / "t", "user.seglog.retention.mss", b"1")
    with pytest.raises(OSError, match="Invalid argument"):
        os.setxattr(mount.mountpoint / "t", "user.seglog.bogus.key", b"1")
    log = mount.log()
    # Was "invalid value '1' for configuration retention.mss: unknown topic configuration".
    assert (
        "setfattr user.seglog.retention.mss on topic t refused: no such topic configuration "
        "(did you mean user.seglog.retention.ms?)"
    ) in log
    assert "setfattr user.seglog.bogus.key on topic t refused: no such topic configuration\n" in log
    # Through the control socket: the same line, a usage error.
    refused(
        run_script("topics", "alter", "t", "-d", str(logs), "--add-config", "retention.mss=1"),
        2,
        "unknown topic configuration 'retention.mss' (did you mean retention.ms?)",
    )
    assert mount.stop() == 0

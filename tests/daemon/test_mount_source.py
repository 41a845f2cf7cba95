"""What ``mount``, ``df`` and ``findmnt`` say a seglogfs mount is (#23 item 5): its
source is the log directory and its type ``fuse.seglogfs``, as sshfs shows
``user@host:path``; and a mount point that holds files is refused unless ``-o
nonempty`` asks for it (the mount would hide them)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from tests.cli.conftest import refused, run_script
from tests.daemon.conftest import Mount, MountDir, is_mounted, needs_fuse
from tests.daemon.test_setup_errors import mount_refused

pytestmark = needs_fuse

_OCTAL = re.compile(rb"\\([0-7]{3})")


def _mountinfo(mountpoint: Path) -> tuple[str, str]:
    """(file system type, source) of the mount at ``mountpoint``, with the kernel's
    octal escapes (``\\040`` for a space, ``\\134`` for a backslash) undone."""
    target = os.fsencode(os.path.realpath(mountpoint))
    with open("/proc/self/mountinfo", "rb") as f:
        for line in f:
            fields = [_OCTAL.sub(lambda m: bytes([int(m[1], 8)]), x) for x in line.split(b" ")]
            if fields[4] == target:
                after = fields.index(b"-")
                return os.fsdecode(fields[after + 1]), os.fsdecode(fields[after + 2])
    raise AssertionError(f"{mountpoint} is not mounted")


def test_df_and_findmnt_show_the_log_directory(tmp_path: Path, mount_dir: MountDir) -> None:
    logs = tmp_path / "logs"
    mount = mount_dir(logs)
    assert _mountinfo(mount.mountpoint) == ("fuse.seglogfs", os.path.realpath(logs))
    df = subprocess.run(
        ["df", "--output=source,fstype", str(mount.mountpoint)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert df.stdout.splitlines()[1].split() == [os.path.realpath(logs), "fuse.seglogfs"]
    # Run from another directory: a bare "seglogfs" source was shown as a path there.
    findmnt = subprocess.run(
        ["findmnt", "-n", "-o", "SOURCE,FSTYPE", str(mount.mountpoint)],
        capture_output=True,
        text=True,
        cwd="/",
        check=True,
    )
    assert findmnt.stdout.split() == [os.path.realpath(logs), "fuse.seglogfs"]


def test_any_log_directory_name_comes_through_byte_for_byte(
    tmp_path: Path, mount_dir: MountDir
) -> None:
    """Commas end a libfuse option and pyfuse3 passes options as ASCII: the name is
    escaped, so a comma, a backslash, a space and UTF-8 arrive unchanged."""
    logs = tmp_path / "log s,a=b\\c-é日"
    mount = mount_dir(logs, "-o", "internal")  # an option after the name: nothing leaks
    assert _mountinfo(mount.mountpoint) == ("fuse.seglogfs", os.path.realpath(logs))
    (mount.mountpoint / "t").mkdir()
    assert os.listdir(logs / "t-0") != []  # the daemon serves the directory so named


def test_a_mount_point_holding_files_is_refused(tmp_path: Path) -> None:
    logs, mnt = tmp_path / "logs", tmp_path / "mnt"
    mnt.mkdir()
    (mnt / "notes.txt").write_text("mine\n")
    refused(
        mount_refused(str(logs), str(mnt), mountpoint=mnt),
        1,
        f"mount point {mnt} is not empty (it holds 'notes.txt'): the mount would hide its "
        "files; use an empty directory, or pass -o nonempty",
    )
    assert not is_mounted(mnt)
    assert not logs.exists()  # refused before anything was made
    assert (mnt / "notes.txt").read_text() == "mine\n"


def test_nonempty_mounts_over_the_files_and_gives_them_back(
    tmp_path: Path, mounts: list[Mount]
) -> None:
    logs, mnt = tmp_path / "logs", tmp_path / "mnt"
    mnt.mkdir()
    (mnt / "notes.txt").write_text("mine\n")
    mount = Mount(logs, mnt, ["-o", "nonempty"], tmp_path / "daemon.log")
    mounts.append(mount)
    mount.start()
    assert os.listdir(mnt) == []  # hidden while mounted, as asked
    (mnt / "t").mkdir()
    assert mount.stop() == 0
    assert os.listdir(mnt) == ["notes.txt"]


def test_mount_help_names_nonempty() -> None:
    result = run_script("mount", "--help")
    assert result.code == 0
    assert "nonempty" in result.text

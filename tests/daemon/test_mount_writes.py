"""Issue #16 through a real mount, with the tools the defects were seen with: a write
does what was asked, no record split, dropped, misplaced or written into another topic.
Handler-level tests of the same rules are in ``test_write_semantics.py``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from storage import LogManager

from .conftest import Mount, MountDir, needs_fuse
from .test_mount import errno_of, ok, sh

pytestmark = needs_fuse

SEGLOGFS = str(Path(sys.executable).parent / "seglogfs")
DEAD = (errno.ESTALE, errno.ENOENT)


@pytest.fixture
def mounted(tmp_path: Path, mount_dir: MountDir) -> Mount:
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    return mount_dir(log_dir)


def records(log_dir: Path, topic: str, partition: int = 0) -> list[bytes | None]:
    with LogManager.open(log_dir, read_only=True) as reader:
        return [r.value for r in reader.log(topic, partition).records(0)]


def test_a_child_closing_its_copy_of_the_descriptor_does_not_cut_a_partial_line(
    mounted: Mount,
) -> None:
    mnt = mounted.mountpoint
    part = mnt / "t" / "0"
    ok(f"mkdir {mnt}/t")
    # /bin/true inherits the descriptor; its exit closes that copy (FUSE flush).
    ok(f"{{ printf 'part1-'; /bin/true; printf 'part2\\n'; }} >> {part}")
    assert ok(f"cat {part}") == "part1-part2\n"
    # The same with a subprocess between two writes, and a closed dup().
    fd = os.open(part, os.O_WRONLY | os.O_APPEND)
    os.write(fd, b"py-")
    subprocess.run(["/bin/true"], pass_fds=(fd,), check=True)
    os.close(os.dup(fd))
    os.write(fd, b"line\n")
    os.close(fd)
    # A final partial line is appended at the last close, and the next command sees it.
    ok(f"{{ printf 'last-'; /bin/true; printf 'one'; }} >> {part}")
    assert ok(f"cat {part}") == "part1-part2\npy-line\nlast-one\n"
    assert os.stat(part).st_size == len("part1-part2\npy-line\nlast-one\n")
    for i in range(20):  # every time, not by luck of timing
        ok(f"printf 'p{i}' >> {part}")
        assert ok(f"tail -n 1 {part}") == f"p{i}\n"
    mounted.stop()
    assert records(mounted.log_dir, "t")[:3] == [b"part1-part2", b"py-line", b"last-one"]


def test_a_partial_line_too_large_for_one_record_fails_its_write(mounted: Mount) -> None:
    mnt = mounted.mountpoint
    part = mnt / "t" / "0"
    ok(f"mkdir {mnt}/t && setfattr -n user.seglog.max.message.bytes -v 200 {mnt}/t")
    fd = os.open(part, os.O_WRONLY | os.O_APPEND)
    try:
        assert errno_of(lambda: os.write(fd, b"x" * 150)) == errno.EFBIG
        assert os.write(fd, b"y" * 120) == 120
        assert errno_of(lambda: os.write(fd, b"z" * 30)) == errno.EFBIG
    finally:
        os.close(fd)  # no error: the 120 accepted bytes fit one record
    assert part.read_bytes() == b"y" * 120 + b"\n"
    result = sh(f"printf '%0170d' 0 >> {part}")
    assert result.returncode != 0
    assert "File too large" in result.stderr
    assert part.read_bytes() == b"y" * 120 + b"\n"


def test_cat_and_dd_of_a_large_file_into_a_raw_topic(mounted: Mount, tmp_path: Path) -> None:
    mnt = mounted.mountpoint
    ok(f"mkdir {mnt}/bin && setfattr -n user.seglog.format -v raw {mnt}/bin")
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom((5 << 20) + 12345))
    ok(f"cat {big} >> {mnt}/bin/0")
    ok(f"dd if={big} of={mnt}/bin/0 bs=1M oflag=append conv=notrunc status=none")
    ok(f"dd if={big} of={mnt}/bin/0 bs=3M oflag=append conv=notrunc status=none")
    expected = big.read_bytes() * 3
    assert (mnt / "bin" / "0").read_bytes() == expected
    assert os.stat(mnt / "bin" / "0").st_size == len(expected)
    ok(f"cat {mnt}/bin/0 {mnt}/bin/0 | cmp - <(cat {big} {big} {big} {big} {big} {big})")
    mounted.stop()
    assert b"".join(v or b"" for v in records(mounted.log_dir, "bin")) == expected


def test_format_change_under_a_pending_line_is_ebusy_and_positions_stay_right(
    mounted: Mount, mount_dir: MountDir
) -> None:
    mnt = mounted.mountpoint
    part = mnt / "fmt" / "0"
    ok(f"mkdir {mnt}/fmt")
    fd = os.open(part, os.O_WRONLY | os.O_APPEND)
    os.write(fd, b"abc")
    # From this process (a child would inherit `fd`, and its exit flush it), then with
    # setfattr.
    assert errno_of(lambda: os.setxattr(mnt / "fmt", "user.seglog.format", b"raw")) == errno.EBUSY
    for name, value in (("format", "raw"), ("key.separator", ":")):
        result = sh(f"setfattr -n user.seglog.{name} -v {value} {mnt}/fmt")
        assert result.returncode != 0
        assert "Device or resource busy" in result.stderr
    os.write(fd, b"def\nghi\n")
    os.close(fd)
    assert ok(f"getfattr -n user.seglog.format --only-values {mnt}/fmt") == "lines"
    assert part.read_bytes() == b"abcdef\nghi\n"
    assert os.stat(part).st_size == len(b"abcdef\nghi\n")
    ok(f"printf 'more\\n' >> {part}")
    assert mounted.stop() == 0
    verified = subprocess.run(
        [SEGLOGFS, "verify", str(mounted.log_dir)], capture_output=True, text=True, timeout=60
    )
    assert verified.returncode == 0, verified.stdout + verified.stderr
    again = mount_dir(mounted.log_dir)
    part = again.mountpoint / "fmt" / "0"
    assert part.read_bytes() == b"abcdef\nghi\nmore\n"
    assert os.stat(part).st_size == len(b"abcdef\nghi\nmore\n")


def test_open_descriptors_of_a_deleted_topic_stay_dead(mounted: Mount) -> None:
    mnt, log_dir = mounted.mountpoint, mounted.log_dir
    part = mnt / "rt" / "0"
    ok(f"mkdir {mnt}/rt && printf 'old 1\\nold 2\\n' >> {part}")
    reader = os.open(part, os.O_RDONLY)
    writer = os.open(part, os.O_WRONLY | os.O_APPEND)
    try:
        assert os.read(reader, 6) == b"old 1\n"
        os.write(writer, b"pending")
        deleted = subprocess.run(
            [SEGLOGFS, "topics", "delete", "rt", "-d", str(log_dir)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert deleted.returncode == 0, deleted.stderr
        ok(f"mkdir {mnt}/rt && printf 'new 1\\nnew 2\\n' >> {part}")
        for _ in range(2):
            assert errno_of(lambda: os.read(reader, 100)) in DEAD
            assert errno_of(lambda: os.write(writer, b"stray\n")) in DEAD
    finally:
        os.close(reader)
        with contextlib.suppress(OSError):
            os.close(writer)  # reports that its pending line cannot be appended
    assert ok(f"cat {part}") == "new 1\nnew 2\n"
    mounted.stop()
    assert records(log_dir, "rt") == [b"new 1", b"new 2"]


def test_mkdir_of_an_internal_name_is_refused_unless_shown(
    mounted: Mount, tmp_path: Path, mount_dir: MountDir
) -> None:
    mnt = mounted.mountpoint
    result = sh(f"mkdir {mnt}/__name")
    assert result.returncode != 0
    assert "Invalid argument" in result.stderr
    assert os.listdir(mnt) == []
    assert errno_of(lambda: os.stat(mnt / "__name")) == errno.ENOENT
    assert "__name" in mounted.log()
    assert "-o internal" in mounted.log()
    assert sh(f"mkdir {mnt}/'bad name'").returncode != 0
    assert "'bad name'" in mounted.log()
    mounted.stop()
    shown = mount_dir(mounted.log_dir, "-o", "internal")
    ok(f"mkdir {shown.mountpoint}/__name && echo x >> {shown.mountpoint}/__name/0")
    assert ok(f"cat {shown.mountpoint}/__name/0") == "x\n"

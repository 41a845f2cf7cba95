"""``P@group=NAME`` views and group xattrs on a real mount, with real tools: ``cat``
twice prints what arrived in between, a ``tail -f`` commits when it is stopped, one
reader per partition and group (``EBUSY``), resets refused while a view is open, and
the command line through the daemon."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from seglogfs.daemon.group_view import offset_after
from seglogfs.daemon.views import parse_view_name
from seglogfs.positions import Rendering, position_of_offset
from storage import LogManager
from tests.cli.conftest import SCRIPT, run_script
from tests.daemon.conftest import MountDir

fuse = pytest.mark.skipif(not Path("/dev/fuse").exists(), reason="no /dev/fuse")


def test_group_view_names() -> None:
    view = parse_view_name("3@group=orders-app")
    assert view is not None
    assert (view.partition, view.group, view.reset) == (3, "orders-app", "latest")
    view = parse_view_name("0@group:earliest=a=b")
    assert view is not None
    assert (view.group, view.reset) == ("a=b", "earliest")
    for name in ("0@group=", "0@group:soon=g", "0@groupx=g", "0@groups:earliest=g"):
        assert parse_view_name(name) is None, name


def test_offset_after_a_position(log_dir: Path) -> None:
    from seglogfs.positions import position_index_spec

    with LogManager.open(log_dir, extension=position_index_spec) as manager:
        manager.create_topic("t", 1)
        log = manager.log("t", 0)
        log.append([b"aa", b"bbb"])  # "aa\n" at 0-3, "bbb\n" at 3-7
        log.append([b"c"])  # "c\n" at 7-9
        rendering = Rendering(False, None)
        assert [offset_after(log, rendering, p) for p in (0, 2, 3, 6, 7, 8, 9, 99)] == [
            0, 0, 1, 1, 2, 2, 3, 3,
        ]  # fmt: skip
        assert position_of_offset(log, rendering, 2) == 7


def _run(*args: str, log_dir: Path) -> tuple[int, str, str]:
    result = run_script(*args, "-d", str(log_dir))
    return result.code, result.text, result.err


@fuse
def test_views_commit_on_close(tmp_path: Path, log_dir: Path, mount_dir: MountDir) -> None:
    mount = mount_dir(log_dir)
    topic = mount.mountpoint / "t"
    topic.mkdir()
    with open(topic / "0", "a") as f:
        f.write("a\nb\nc\n")
    # No committed offset: latest by default, earliest when asked.
    assert (topic / "0@group=g").read_bytes() == b""
    assert (topic / "0@group=g").read_bytes() == b""
    assert (topic / "0@group:earliest=late").read_bytes() == b"a\nb\nc\n"
    with pytest.raises(FileNotFoundError):
        (topic / "0@group:none=never").read_bytes()
    with open(topic / "0", "a") as f:
        f.write("d\ne\n")
    # cat twice: only what arrived in between.
    assert subprocess.run(["cat", topic / "0@group=g"], capture_output=True).stdout == b"d\ne\n"
    assert subprocess.run(["cat", topic / "0@group=g"], capture_output=True).stdout == b""
    assert os.getxattr(topic / "0", "user.seglog.group.g.offset") == b"5"
    assert os.getxattr(topic / "0", "user.seglog.group.late.offset") == b"3"
    # A read that ends inside a record commits that record's offset: read again.
    with open(topic / "0", "a") as f:
        f.write("long line\nz\n")
    with open(topic / "0@group=g", "rb", buffering=0) as view:
        assert view.read(4) == b"long"
    assert os.getxattr(topic / "0", "user.seglog.group.g.offset") == b"5"
    assert (topic / "0@group=g").read_bytes() == b"long line\nz\n"
    code, text, err = _run("groups", "describe", "--group", "g", log_dir=log_dir)
    assert code == 0, err
    assert text.split("\n")[2].split()[:6] == ["g", "t", "0", "7", "7", "0"]


@fuse
def test_one_reader_per_group_and_no_reset_while_consuming(
    log_dir: Path, mount_dir: MountDir
) -> None:
    mount = mount_dir(log_dir)
    topic = mount.mountpoint / "t"
    topic.mkdir()
    with open(topic / "0", "a") as f:
        f.write("a\nb\n")
    tail = subprocess.Popen(
        ["tail", "-n", "+1", "-f", topic / "0@group:earliest=g"], stdout=subprocess.PIPE
    )
    try:
        assert tail.stdout is not None
        assert os.read(tail.stdout.fileno(), 4) == b"a\nb\n"
        # A second reader of the group's partition: refused, as Kafka gives a partition
        # to one member. Another group reads freely.
        with pytest.raises(OSError, match="Device or resource busy") as busy:
            (topic / "0@group=g").read_bytes()
        assert busy.value.errno == errno.EBUSY
        assert (topic / "0@group:earliest=other").read_bytes() == b"a\nb\n"
        code, text, err = _run("groups", "describe", "--group", "g", log_dir=log_dir)
        assert code == 0, err
        assert text.split("\n")[2].split()[7:] == ["localhost", "tail"]
        code, _text, err = _run(
            "groups", "reset-offsets", "--group", "g", "--all-topics", "--to-earliest",
            "--execute", log_dir=log_dir,
        )  # fmt: skip
        assert code == 1
        assert "Assignments can only be reset if the group 'g' is inactive" in err
        code, _text, err = _run("groups", "delete", "--group", "g", log_dir=log_dir)
        assert code == 1
        assert "is not empty" in err
        with open(topic / "0", "a") as f:
            f.write("c\n")
        assert os.read(tail.stdout.fileno(), 2) == b"c\n"
    finally:
        tail.send_signal(signal.SIGTERM)
        tail.communicate(timeout=30)
    # Stopping the tail -f committed its position.
    deadline = time.monotonic() + 10
    while os.getxattr(topic / "0", "user.seglog.group.g.offset") != b"3":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    code, _text, err = _run("groups", "delete", "--group", "g", log_dir=log_dir)
    assert code == 0, err


@fuse
def test_consume_g_through_the_daemon(log_dir: Path, mount_dir: MountDir) -> None:
    mount = mount_dir(log_dir)
    topic = mount.mountpoint / "t"
    topic.mkdir()
    with open(topic / "0", "a") as f:
        f.write("a\nb\n")
    env = {"SEGLOG_LOG_DIR": str(log_dir)}
    first = run_script("consume", "t", "-g", "g", "--reset", "earliest", env=env)
    assert (first.code, first.out) == (0, b"a\nb\n"), first.err
    # The view and the command line share the group's offsets.
    with open(topic / "0", "a") as f:
        f.write("c\n")
    assert (topic / "0@group=g").read_bytes() == b"c\n"
    assert run_script("consume", "t", "-g", "g", env=env).out == b""
    # Two consumers of one group: the second gets no partition while the first reads.
    follower = subprocess.Popen(
        [str(SCRIPT), "consume", "t", "-g", "g", "-f"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, **env},
    )
    try:
        deadline = time.monotonic() + 30
        while (
            "seglogfs-consume" not in run_script("groups", "describe", "--group", "g", env=env).text
        ):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        second = run_script("consume", "t", "-g", "g", env=env)
        assert second.code == 1
        assert "partition t-0 of consumer group 'g' is being consumed by member" in second.err
        with open(topic / "0", "a") as f:
            f.write("d\n")
        assert follower.stdout is not None
        assert os.read(follower.stdout.fileno(), 2) == b"d\n"
    finally:
        follower.send_signal(signal.SIGINT)
        _out, follower_err = follower.communicate(timeout=30)
    assert follower.returncode == 130, follower_err
    described = run_script("groups", "describe", "--group", "g", env=env).text
    assert os.getxattr(topic / "0", "user.seglog.group.g.offset") == b"4", (
        follower_err,
        described,
        mount.log(),
    )

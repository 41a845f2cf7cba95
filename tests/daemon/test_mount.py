"""Real mounts driven by real Unix tools (the daemon runs in a subprocess).

Every test mounts through the ``mount_dir`` fixture, which always unmounts in teardown
(SIGTERM, then ``fusermount3 -u``, then ``-uz``), even when the test fails.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from storage import LogManager, partition_for_key

from .conftest import Mount, MountDir, is_mounted, needs_fuse

pytestmark = needs_fuse


def sh(command: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # type: ignore[call-overload, no-any-return]
        ["bash", "-c", command], capture_output=True, text=True, timeout=60, **kwargs
    )


def ok(command: str) -> str:
    result = sh(command)
    assert result.returncode == 0, f"{command!r} failed: {result.stderr}"
    return result.stdout


def errno_of(fn: Callable[[], object]) -> int:
    with pytest.raises(OSError, match=r"\[Errno \d+\]") as info:
        fn()
    assert info.value.errno is not None
    return info.value.errno


def write_properties(path: Path, **settings: object) -> Path:
    path.write_text("".join(f"{k.replace('_', '.')}={v}\n" for k, v in settings.items()))
    return path


@pytest.fixture
def mounted(tmp_path: Path, mount_dir: MountDir) -> Mount:
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    return mount_dir(log_dir)


def test_produce_with_every_tool_and_consume_with_every_tool(mounted: Mount) -> None:
    mnt = mounted.mountpoint
    ok(f"mkdir {mnt}/t")
    ok(f"echo hello >> {mnt}/t/0")
    ok(f"printf 'two\\nthree\\n' >> {mnt}/t/0")
    ok(f"printf 'four\\n' | tee -a {mnt}/t/0 > /dev/null")
    source = mnt.parent / "lines.txt"
    source.write_bytes(b"".join(b"line %d\n" % i for i in range(1000)))
    ok(f"cat {source} >> {mnt}/t/0")
    ok(f"printf 'dd line\\n' | dd of={mnt}/t/0 oflag=append conv=notrunc status=none")
    expected = b"hello\ntwo\nthree\nfour\n" + source.read_bytes() + b"dd line\n"
    assert (mnt / "t" / "0").read_bytes() == expected
    assert ok(f"cat {mnt}/t/0").encode() == expected
    assert ok(f"wc -l < {mnt}/t/0").strip() == str(expected.count(b"\n"))
    assert ok(f"grep -c '^line ' {mnt}/t/0").strip() == "1000"
    assert ok(f"head -n 2 {mnt}/t/0") == "hello\ntwo\n"
    assert ok(f"tail -n 2 {mnt}/t/0") == "line 999\ndd line\n"
    assert ok(f"stat -c %s {mnt}/t/0").strip() == str(len(expected))
    listing = ok(f"ls -l {mnt}/t")
    assert re.search(rf"-rw-r--r-- .* {len(expected)} .* 0\n", listing), listing
    assert "produce" in listing
    assert ok(f"ls {mnt}") == "t\n"


def test_seeks_with_tail_c_and_dd_skip(mounted: Mount) -> None:
    mnt = mounted.mountpoint
    ok(f"mkdir {mnt}/t")
    data = b"".join(b"record %05d %s\n" % (i, b"z" * (i % 50)) for i in range(3000))
    (mnt.parent / "in.txt").write_bytes(data)
    ok(f"cat {mnt.parent}/in.txt >> {mnt}/t/0")
    for start in [1, 2, 4097, 65536, len(data) // 2, len(data) - 3, len(data)]:
        assert sh(f"tail -c +{start} {mnt}/t/0").stdout.encode() == data[start - 1 :]
    out = subprocess.run(
        ["dd", f"if={mnt}/t/0", "bs=1000", "skip=37", "count=3", "status=none"],
        capture_output=True,
        check=True,
    ).stdout
    assert out == data[37000:40000]
    out = subprocess.run(
        ["dd", f"if={mnt}/t/0", "bs=1M", "status=none"], capture_output=True, check=True
    ).stdout
    assert out == data


def test_refused_operations_report_their_errno_and_change_nothing(mounted: Mount) -> None:
    mnt = mounted.mountpoint
    ok(f"mkdir {mnt}/t")
    ok(f"echo keep >> {mnt}/t/0")
    part = mnt / "t" / "0"
    assert errno_of(lambda: os.open(part, os.O_WRONLY | os.O_TRUNC)) == errno.EPERM
    assert errno_of(lambda: os.truncate(part, 0)) == errno.EPERM
    assert errno_of(lambda: os.unlink(part)) == errno.EPERM
    assert errno_of(lambda: os.rename(part, mnt / "t" / "1")) == errno.EPERM
    assert errno_of(lambda: os.rmdir(mnt / "t")) == errno.EPERM
    assert errno_of(lambda: os.mkdir(mnt / "bad name")) == errno.EINVAL
    assert errno_of(lambda: os.mkdir(mnt / "t")) == errno.EEXIST
    assert errno_of(lambda: os.stat(mnt / "nope")) == errno.ENOENT
    assert errno_of(lambda: os.stat(mnt / "t" / "5")) == errno.ENOENT
    assert errno_of(lambda: open(mnt / "t" / "7", "ab")) == errno.ENOENT  # noqa: SIM115
    assert (mnt / "t" / "produce").read_bytes() == b""  # readable, empty
    fd = os.open(part, os.O_WRONLY)  # no O_APPEND: a write at 0 is into the middle
    try:
        assert errno_of(lambda: os.write(fd, b"middle\n")) == errno.EPERM
    finally:
        os.close(fd)
    assert errno_of(lambda: os.chmod(part, 0o600)) == errno.EPERM
    assert errno_of(lambda: os.link(part, mnt / "t" / "copy")) == errno.EPERM
    assert errno_of(lambda: os.symlink("0", mnt / "t" / "link")) == errno.EPERM
    ok(f"touch {part}")  # times: accepted and ignored
    result = sh(f"echo overwrite > {mnt}/t/0")
    assert result.returncode != 0
    assert "Operation not permitted" in result.stderr
    assert sh(f"rm -f {mnt}/t/0").returncode != 0
    assert part.read_bytes() == b"keep\n"
    assert sorted(os.listdir(mnt / "t")) == ["0", "produce"]
    assert os.listdir(mnt) == ["t"]


def test_oversized_line_is_efbig_and_nothing_appended(mounted: Mount) -> None:
    mnt = mounted.mountpoint
    ok(f"mkdir {mnt}/t")
    ok(f"setfattr -n user.seglog.max.message.bytes -v 300 {mnt}/t")
    ok(f"echo before >> {mnt}/t/0")
    with open(mnt / "t" / "0", "ab", buffering=0) as f:
        assert errno_of(lambda: f.write(b"a\n" + b"x" * 1000 + b"\n")) == errno.EFBIG
        f.write(b"after\n")
    assert (mnt / "t" / "0").read_bytes() == b"before\nafter\n"


def test_xattrs_through_getfattr_and_setfattr(mounted: Mount) -> None:
    mnt = mounted.mountpoint
    ok(f"mkdir {mnt}/t")
    ok(f"printf 'a\\nb\\nc\\n' >> {mnt}/t/0")
    dump = ok(f"getfattr -d {mnt}/t/0")
    for line in ['user.seglog.log_start_offset="0"', 'user.seglog.log_end_offset="3"',
                 'user.seglog.segments="1"']:  # fmt: skip
        assert line in dump, dump
    assert re.search(r'user.seglog.size="\d+"', dump)
    assert re.search(r'user.seglog.last_timestamp="1\d{12}"', dump)
    topic = ok(f"getfattr -d {mnt}/t")
    assert 'user.seglog.partitions="1"' in topic
    assert 'user.seglog.format="lines"' in topic
    assert 'user.seglog.retention.ms="604800000"' in topic
    ok(f"setfattr -n user.seglog.retention.ms -v 86400000 {mnt}/t")
    assert ok(f"getfattr --only-values -n user.seglog.retention.ms {mnt}/t") == "86400000"
    result = sh(f"setfattr -n user.seglog.retention.ms -v tomorrow {mnt}/t")
    assert result.returncode != 0
    assert "Invalid argument" in result.stderr
    assert ok(f"getfattr --only-values -n user.seglog.retention.ms {mnt}/t") == "86400000"
    assert re.search(r"WARNING .*retention\.ms.*tomorrow", mounted.log())


def test_format_and_separator_chosen_on_a_fresh_topic(mounted: Mount) -> None:
    mnt = mounted.mountpoint
    ok(f"mkdir {mnt}/keyed {mnt}/blobs")
    ok(f"setfattr -n user.seglog.key.separator -v = {mnt}/keyed")
    ok(f"setfattr -n user.seglog.format -v raw {mnt}/blobs")
    ok(f"printf 'k=v\\nnokey\\n' >> {mnt}/keyed/0")
    assert (mnt / "keyed" / "0").read_bytes() == b"k=v\nnokey\n"
    with open(mnt / "blobs" / "0", "ab", buffering=0) as f:
        f.write(b"\x00raw")
        f.write(b"bytes")
    assert (mnt / "blobs" / "0").read_bytes() == b"\x00rawbytes"
    result = sh(f"setfattr -n user.seglog.format -v raw {mnt}/keyed")
    assert result.returncode != 0
    assert "Operation not permitted" in result.stderr
    with LogManager.open(mounted.log_dir, read_only=True) as reader:
        assert [(r.key, r.value) for r in reader.log("keyed", 0).records(0)] == [
            (b"k", b"v"),
            (None, b"nokey"),
        ]


def test_views_resolve_offsets_and_times(mounted: Mount) -> None:
    mnt = mounted.mountpoint
    ok(f"mkdir {mnt}/t")
    for i in range(10):
        ok(f"echo r{i} >> {mnt}/t/0")
    assert ok(f"cat {mnt}/t/0@-3") == "r7\nr8\nr9\n"
    assert ok(f"cat {mnt}/t/0@5") == "r5\nr6\nr7\nr8\nr9\n"
    assert ok(f"cat {mnt}/t/0@earliest").startswith("r0\n")
    assert ok(f"cat {mnt}/t/0@latest") == ""
    assert ok(f"cat {mnt}/t/0@2000-01-01T00:00:00Z").startswith("r0\n")
    assert ok(f"cat {mnt}/t/0@2999-01-01T00:00:00Z") == ""
    assert "0@5" not in os.listdir(mnt / "t")


def test_df_shows_the_log_dirs_file_system(mounted: Mount) -> None:
    mine = os.statvfs(mounted.mountpoint)
    theirs = os.statvfs(mounted.log_dir)
    assert mine.f_blocks == theirs.f_blocks
    assert mine.f_frsize == theirs.f_frsize
    out = ok(f"df -P {mounted.mountpoint}").splitlines()[1].split()
    assert out[0] == os.path.realpath(mounted.log_dir)  # the source names what is mounted
    assert int(out[1]) == theirs.f_blocks * theirs.f_frsize // 1024


def test_many_threads_appending_lines_never_interleave(mounted: Mount) -> None:
    mnt = mounted.mountpoint
    ok(f"mkdir {mnt}/t")
    threads, lines = 8, 400
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            with open(mnt / "t" / "0", "ab", buffering=0) as f:
                for i in range(lines):
                    f.write(b"writer %d line %d %s\n" % (n, i, b"-" * (i % 97)))
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=writer, args=(n,)) for n in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert errors == []
    got = (mnt / "t" / "0").read_bytes().splitlines()
    assert len(got) == threads * lines
    expected = {
        b"writer %d line %d %s" % (n, i, b"-" * (i % 97))
        for n in range(threads)
        for i in range(lines)
    }
    assert set(got) == expected
    for n in range(threads):  # each writer's lines in its own order
        mine = [line for line in got if line.startswith(b"writer %d " % n)]
        assert [int(line.split()[3]) for line in mine] == list(range(lines))


def test_tail_follows_appends_and_never_sees_truncation_under_retention(
    tmp_path: Path, mount_dir: MountDir
) -> None:
    log_dir = tmp_path / "logs"
    config = write_properties(
        tmp_path / "server.properties",
        **{
            "log.retention.check.interval.ms": 200,
            "log.segment.bytes": 2000,
            "log.retention.bytes": 6000,
            "log.segment.delete.delay.ms": 100,
        },
    )
    mount = mount_dir(log_dir, "--config", str(config))
    mnt = mount.mountpoint
    ok(f"mkdir {mnt}/t")
    out = tmp_path / "tail.out"
    err = tmp_path / "tail.err"
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        tail = subprocess.Popen(
            ["tail", "-f", "-s", "0.1", "-n", "+1", str(mnt / "t" / "0")],
            stdout=stdout,
            stderr=stderr,
        )
    lagging = open(mnt / "t" / "0", "rb", buffering=0)  # noqa: SIM115
    try:
        with open(mnt / "t" / "0", "ab", buffering=0) as f:
            for i in range(600):
                f.write(b"line %05d %s\n" % (i, b"p" * 40))
                if i == 0:
                    head = lagging.read(20)  # a reader that then falls far behind
                if i % 50 == 49:
                    time.sleep(0.25)  # let retention run between bursts
        # The lagging reader asks for deleted bytes: it continues at the oldest
        # retained record, and its file never looked shorter than its position.
        size_seen = os.fstat(lagging.fileno()).st_size
        rest = lagging.read()
        assert size_seen >= lagging.tell()
        deadline = time.monotonic() + 10
        while b"line 00599" not in out.read_bytes() and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        lagging.close()
        tail.terminate()
        tail.wait(10)
    deleted = sum(int(n) for n in re.findall(r"retention deleted (\d+) segment", mount.log()))
    assert deleted >= 3, mount.log()
    assert head == b"line 00000 " + b"p" * 9
    kept = rest.splitlines()
    first_kept = int(kept[0].split()[1])
    assert first_kept > 50  # retention removed everything before it
    assert kept == [b"line %05d %s" % (i, b"p" * 40) for i in range(first_kept, 600)]
    with LogManager.open(log_dir, read_only=True) as reader:
        assert reader.log("t", 0).log_start_offset >= first_kept
    assert "truncated" not in err.read_text(), err.read_text()
    lines = out.read_bytes().splitlines()
    assert lines[-1].startswith(b"line 00599")
    numbers = [int(line.split()[1]) for line in lines]
    assert numbers == sorted(numbers)  # nothing twice, nothing out of order
    assert len(set(numbers)) == len(numbers)


def test_tail_f_shows_a_new_line_within_the_poll_interval(mounted: Mount) -> None:
    mnt = mounted.mountpoint
    ok(f"mkdir {mnt}/t")
    ok(f"echo first >> {mnt}/t/0")
    tail = subprocess.Popen(
        ["tail", "-f", "-s", "0.1", str(mnt / "t" / "0")], stdout=subprocess.PIPE
    )
    try:
        assert tail.stdout is not None
        assert tail.stdout.readline() == b"first\n"
        for i in range(3):
            ok(f"echo next{i} >> {mnt}/t/0")
            started = time.monotonic()
            assert tail.stdout.readline() == b"next%d\n" % i
            assert time.monotonic() - started < 2.0
    finally:
        tail.terminate()
        tail.wait(10)
        assert tail.stdout is not None
        tail.stdout.close()


def test_sigterm_flushes_checkpoints_marks_clean_and_unmounts(mounted: Mount) -> None:
    mnt = mounted.mountpoint
    ok(f"mkdir {mnt}/t")
    fd = os.open(mnt / "t" / "0", os.O_WRONLY | os.O_APPEND)
    os.write(fd, b"complete\npartial")  # the partial line waits in the daemon
    started = time.monotonic()
    assert mounted.stop() == 0
    assert time.monotonic() - started < 5
    with contextlib.suppress(OSError):
        os.close(fd)  # the file system is gone: its close cannot reach it
    assert not is_mounted(mnt)
    assert (mounted.log_dir / ".kafka_cleanshutdown").exists()
    assert "unmounted" in mounted.log()
    with LogManager.open(mounted.log_dir, read_only=True) as reader:
        assert [r.value for r in reader.log("t", 0).records(0)] == [b"complete", b"partial"]
    # INFO lines for mount, topic, unmount, and nothing per request.
    info = [line for line in mounted.log().splitlines() if " INFO " in line]
    assert len(info) < 10, info


def test_second_writable_mount_fails_with_one_line(mounted: Mount, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "seglogfs.mount", str(mounted.log_dir), str(other)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    # One line of ours (the engine may add its own build notice before it).
    lines = [line for line in result.stderr.splitlines() if not line.startswith("storage: ")]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("seglogfs mount: error: ")
    assert "already mounted" in lines[0]
    assert not is_mounted(other)


def test_unknown_option_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "seglogfs.mount",
            str(tmp_path / "l"),
            str(tmp_path / "m"),
            "-o",
            "bogus",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "unknown mount option 'bogus'" in result.stderr


def test_sigkill_mid_stream_loses_no_acknowledged_line(tmp_path: Path, mount_dir: MountDir) -> None:
    log_dir = tmp_path / "logs"
    mount = mount_dir(log_dir)
    mnt = mount.mountpoint
    ok(f"mkdir {mnt}/t")
    acknowledged = tmp_path / "acknowledged"
    writer = subprocess.Popen(
        [sys.executable, "-c", (
            "import os, sys\n"
            "fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND)\n"
            "ack = open(sys.argv[2], 'w')\n"
            "i = 0\n"
            "while True:\n"
            "    try:\n"
            "        os.write(fd, b'line %d\\n' % i)\n"
            "    except OSError:\n"
            "        break\n"
            "    ack.write('%d\\n' % i); ack.flush()\n"
            "    i += 1\n"
        ), str(mnt / "t" / "0"), str(acknowledged)],
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while (
            not acknowledged.exists() or acknowledged.stat().st_size < 20000
        ) and time.monotonic() < deadline:
            time.sleep(0.05)
        mount.kill()  # SIGKILL while the writer keeps writing
        writer.wait(30)
    finally:
        if writer.poll() is None:
            writer.kill()
    subprocess.run(["fusermount3", "-u", str(mnt)], check=False)
    acked = [int(n) for n in acknowledged.read_text().split()]
    assert len(acked) > 1000
    assert not (log_dir / ".kafka_cleanshutdown").exists()
    again = mount_dir(log_dir)
    lines = (again.mountpoint / "t" / "0").read_bytes().splitlines()
    assert lines[: len(acked)] == [b"line %d" % i for i in acked]
    assert len(lines) <= len(acked) + 1  # at most the write in flight


def test_read_only_mount_follows_a_live_writer_and_refuses_writes(
    tmp_path: Path, mount_dir: MountDir
) -> None:
    log_dir = tmp_path / "logs"
    writer = mount_dir(log_dir)
    ok(f"mkdir {writer.mountpoint}/t")
    ok(f"echo one >> {writer.mountpoint}/t/0")
    reader = mount_dir(log_dir, "-o", "ro")
    ro = reader.mountpoint
    assert (ro / "t" / "0").read_bytes() == b"one\n"
    assert sorted(os.listdir(ro / "t")) == ["0"]
    ok(f"echo two >> {writer.mountpoint}/t/0")
    ok(f"mkdir {writer.mountpoint}/later")
    deadline = time.monotonic() + 5
    while (ro / "t" / "0").read_bytes() != b"one\ntwo\n" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (ro / "t" / "0").read_bytes() == b"one\ntwo\n"
    assert os.stat(ro / "t" / "0").st_size == 8
    while "later" not in os.listdir(ro) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "later" in os.listdir(ro)
    assert errno_of(lambda: open(ro / "t" / "0", "ab")) == errno.EROFS  # noqa: SIM115
    assert errno_of(lambda: os.mkdir(ro / "new")) == errno.EROFS
    assert errno_of(lambda: os.setxattr(ro / "t", "user.seglog.retention.ms", b"1")) == errno.EROFS


def test_read_only_mount_changes_no_file(tmp_path: Path, mount_dir: MountDir) -> None:
    log_dir = tmp_path / "logs"
    with LogManager.open(log_dir) as manager:
        manager.create_topic("t", 2)
        manager.log("t", 0).append([b"a", b"b"])
    for path in log_dir.rglob("*.seglogpos"):
        path.unlink()  # a Kafka copy has no position index: it must be rebuilt privately

    def snapshot() -> dict[str, tuple[int, int]]:
        return {str(p.relative_to(log_dir)): (p.stat().st_size, p.stat().st_mtime_ns)
                for p in sorted(log_dir.rglob("*"))}  # fmt: skip

    before = snapshot()
    mount = mount_dir(log_dir, "-o", "ro")
    assert (mount.mountpoint / "t" / "0").read_bytes() == b"a\nb\n"
    ok(f"getfattr -d {mount.mountpoint}/t/0 {mount.mountpoint}/t")
    assert mount.stop() == 0
    assert snapshot() == before


def test_sd_notify_ready_and_stopping(tmp_path: Path, mount_dir: MountDir) -> None:
    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind(str(path))
        server.settimeout(30)
        env = {"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "200000"}
        mount = mount_dir(tmp_path / "logs", env=env)
        assert server.recv(100) == b"READY=1"
        assert is_mounted(mount.mountpoint)
        started = time.monotonic()
        assert [server.recv(100) for _ in range(5)] == [b"WATCHDOG=1"] * 5
        assert time.monotonic() - started < 2  # every 100 ms: half of WATCHDOG_USEC
        assert mount.stop() == 0
        rest = []
        while (message := server.recv(100)) != b"STOPPING=1":
            rest.append(message)
        assert set(rest) <= {b"WATCHDOG=1"}


def test_disk_full_is_enospc_and_leaves_no_partial_record(
    tmp_path: Path, mount_dir: MountDir
) -> None:
    small = tmp_path / "small"
    small.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(small)], check=False
    )
    assert made.returncode == 0, "a tmpfs of 1 MiB is needed to fill a disk"
    try:
        mount = mount_dir(small / "logs")
        mnt = mount.mountpoint
        ok(f"mkdir {mnt}/t")
        ok(f"setfattr -n user.seglog.segment.index.bytes -v 4096 {mnt}/t")
        written: list[bytes] = []
        with open(mnt / "t" / "0", "ab", buffering=0) as f:
            for i in range(100000):
                chunk = b"".join(b"line %d.%d %s\n" % (i, j, b"f" * 60) for j in range(50))
                try:
                    f.write(chunk)
                except OSError as exc:
                    failure = exc.errno
                    break
                written.append(chunk)
            else:
                raise AssertionError("the disk never filled")
        assert failure == errno.ENOSPC
        assert written
        assert (mnt / "t" / "0").read_bytes() == b"".join(written)
        # Stopping on a full disk cannot write the checkpoints: one clear line, exit 1,
        # still unmounted; the next open recovers from the segments.
        assert mount.stop() == 1
        assert "error: unclean shutdown: [Errno 28] No space left on device" in mount.log()
        assert "Traceback" not in mount.log()
        assert not is_mounted(mnt)
    finally:
        subprocess.run(["umount", "-l", str(small)], check=False)


def test_console_script_mounts(tmp_path: Path, mounts: list[Mount]) -> None:
    script = Path(sys.executable).parent / "seglogfs"
    if not script.exists():
        script = Path(shutil.which("seglogfs") or "seglogfs")
    (tmp_path / "mnt").mkdir()
    proc = subprocess.Popen([str(script), "mount", str(tmp_path / "logs"), str(tmp_path / "mnt")])
    mount = Mount(tmp_path / "logs", tmp_path / "mnt", [], tmp_path / "unused.log")
    mount.proc = proc
    mounts.append(mount)
    deadline = time.monotonic() + 30
    while not is_mounted(tmp_path / "mnt"):
        assert proc.poll() is None
        assert time.monotonic() < deadline
        time.sleep(0.05)
    ok(f"mkdir {tmp_path}/mnt/smoke && echo hello >> {tmp_path}/mnt/smoke/0")
    assert ok(f"cat {tmp_path}/mnt/smoke/0") == "hello\n"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(5) == 0


def test_mtime_moves_and_size_is_exact_at_every_stat(mounted: Mount) -> None:
    mnt = mounted.mountpoint
    ok(f"mkdir {mnt}/t")
    part = mnt / "t" / "0"
    ok(f"echo first >> {part}")
    before = os.stat(part)
    time.sleep(0.05)
    expected = before.st_size
    with open(part, "ab", buffering=0) as f:
        for i in range(20):
            expected += f.write(b"line %d\n" % i)
            assert os.stat(part).st_size == expected
            assert os.fstat(f.fileno()).st_size == expected
    after = os.stat(part)
    assert after.st_mtime_ns > before.st_mtime_ns
    assert after.st_size == len(b"first\n") + sum(len(b"line %d\n" % i) for i in range(20))


def test_command_line_writes_go_through_the_mounted_daemon(mounted: Mount) -> None:
    script = Path(sys.executable).parent / "seglogfs"
    mnt, log_dir = mounted.mountpoint, mounted.log_dir
    created = subprocess.run(
        [str(script), "topics", "create", "cli", "--partitions", "2", "-d", str(log_dir)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    assert sorted(os.listdir(mnt / "cli")) == ["0", "1", "produce"]
    produced = subprocess.run(
        [str(script), "produce", "cli", "-p", "1", "-d", str(log_dir)],
        input="from the command line\n", capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert produced.returncode == 0, produced.stderr
    assert (mnt / "cli" / "1").read_bytes() == b"from the command line\n"
    assert os.stat(mnt / "cli" / "1").st_size == len(b"from the command line\n")


def test_produce_file_partitions_keyed_lines_like_kafka(
    tmp_path: Path, mount_dir: MountDir
) -> None:
    config = write_properties(tmp_path / "server.properties", **{"num.partitions": 3})
    mount = mount_dir(tmp_path / "logs", "--config", str(config))
    mnt = mount.mountpoint
    ok(f"mkdir {mnt}/orders")
    assert sorted(os.listdir(mnt / "orders")) == ["0", "1", "2", "produce"]
    ok(f"setfattr -n user.seglog.key.separator -v : {mnt}/orders")
    lines = [b"customer-%d:order %d" % (i % 7, i) for i in range(300)]
    (tmp_path / "keyed.txt").write_bytes(b"".join(line + b"\n" for line in lines))
    ok(f"cat {tmp_path}/keyed.txt >> {mnt}/orders/produce")
    for partition in range(3):
        mine = [line for line in lines if partition_for_key(line.split(b":")[0], 3) == partition]
        assert (mnt / "orders" / str(partition)).read_bytes() == b"".join(
            line + b"\n" for line in mine
        )
    with open(mnt / "orders" / "produce", "ab", buffering=0) as f:
        f.write(b"no key 1\nno key 2\n")  # keyless: one write, one sticky partition
        f.write(b"no key 3\n")  # the next write moves to another partition
    tails = [(mnt / "orders" / str(p)).read_bytes() for p in range(3)]
    assert sum(t.endswith(b"no key 1\nno key 2\n") for t in tails) == 1
    assert sum(t.endswith(b"no key 3\n") for t in tails) == 1
    ok(f"echo 'k:with >' > {mnt}/orders/produce")  # `>` truncates nothing: it produces
    key_partition = partition_for_key(b"k", 3)
    assert (mnt / "orders" / str(key_partition)).read_bytes().endswith(b"k:with >\n")


def test_mount_survives_a_control_socket_it_cannot_bind(
    tmp_path: Path, mount_dir: MountDir
) -> None:
    log_dir = tmp_path / "logs"
    (log_dir / ".seglog.sock").mkdir(parents=True)  # the socket's name is taken
    mount = mount_dir(log_dir)
    ok(f"mkdir {mount.mountpoint}/t && echo still >> {mount.mountpoint}/t/0")
    assert (mount.mountpoint / "t" / "0").read_bytes() == b"still\n"
    assert "control socket unavailable" in mount.log()
    assert mount.stop() == 0


def test_mount_options_reach_the_kernel_and_debug_logs_requests(
    tmp_path: Path, mount_dir: MountDir
) -> None:
    log_dir = tmp_path / "logs"
    with LogManager.open(log_dir) as manager:
        manager.create_topic("t", 1)
        manager.log("t", 0).append([b"x"])
    mount = mount_dir(log_dir, "-o", "ro,allow_other", "--debug")
    target = os.path.realpath(mount.mountpoint)
    with open("/proc/self/mountinfo") as f:
        fields = next(line.split() for line in f if line.split()[4] == target)
    assert "ro" in fields[5].split(",")
    assert "allow_other" in fields[-1].split(",")
    assert fields[fields.index("-") + 1] == "fuse.seglogfs"
    assert (mount.mountpoint / "t" / "0").read_bytes() == b"x\n"
    assert re.search(
        r"DEBUG seglogfs.daemon.read_path: read fh=\d+ off=0 size=\d+: 2 bytes", mount.log()
    )


def test_corrupt_batch_is_eio_never_served_and_the_mount_stays_up(
    tmp_path: Path, mount_dir: MountDir
) -> None:
    log_dir = tmp_path / "logs"
    with LogManager.open(log_dir) as manager:
        manager.create_topic("t", 1)
        log = manager.log("t", 0)
        log.append([b"good %d" % i for i in range(100)])
        bad = log.append([b"doomed %d" % i for i in range(100)])
        log.append([b"after %d" % i for i in range(100)])
    segment = log_dir / "t-0" / "00000000000000000000.log"
    data = bytearray(segment.read_bytes())
    flip = bad.position + bad.size // 2
    data[flip] ^= 0xFF  # a value byte: the batch CRC no longer matches
    segment.write_bytes(bytes(data))
    mount = mount_dir(log_dir)
    part = mount.mountpoint / "t" / "0"
    result = subprocess.run(["cat", str(part)], capture_output=True, timeout=60)
    assert result.returncode != 0
    assert b"Input/output error" in result.stderr
    assert b"doomed" not in result.stdout  # nothing of the corrupt batch
    assert result.stdout == b"".join(b"good %d\n" % i for i in range(100))
    assert "corrupt record" in mount.log()
    assert sorted(os.listdir(mount.mountpoint / "t")) == ["0", "produce"]  # still up
    assert 'user.seglog.log_end_offset="300"' in ok(f"getfattr -d {part}")
    ok(f"echo new >> {part}")  # appends still work; the corrupt batch is never served
    assert b"doomed" not in subprocess.run(["cat", str(part)], capture_output=True).stdout


def test_sigterm_unmounts_while_files_are_open_and_a_process_is_inside(mounted: Mount) -> None:
    mnt = mounted.mountpoint
    ok(f"mkdir {mnt}/t && echo a >> {mnt}/t/0")
    tail = subprocess.Popen(
        ["tail", "-f", str(mnt / "t" / "0")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    inside = subprocess.Popen(["sleep", "30"], cwd=mnt / "t")
    try:
        time.sleep(0.3)
        started = time.monotonic()
        assert mounted.stop() == 0
        assert time.monotonic() - started < 5
        assert not is_mounted(mnt)
    finally:
        for proc in (tail, inside):
            proc.kill()
            proc.wait()


def test_tail_f_of_the_latest_view_shows_only_new_records(mounted: Mount) -> None:
    mnt = mounted.mountpoint
    ok(f"mkdir {mnt}/t && printf 'old 1\\nold 2\\n' >> {mnt}/t/0")
    tail = subprocess.Popen(
        ["tail", "-f", "-s", "0.1", "-n", "+1", str(mnt / "t" / "0@latest")],
        stdout=subprocess.PIPE,
    )
    try:
        assert tail.stdout is not None
        time.sleep(0.3)
        ok(f"echo new 1 >> {mnt}/t/0")
        assert tail.stdout.readline() == b"new 1\n"
        ok(f"echo new 2 >> {mnt}/t/0")
        assert tail.stdout.readline() == b"new 2\n"
    finally:
        tail.terminate()
        tail.wait(10)
        if tail.stdout is not None:
            tail.stdout.close()

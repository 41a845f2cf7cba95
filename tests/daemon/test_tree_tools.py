"""Whole-tree Unix tools over a real mount (SPEC §3: they "exit 0 over a mount and copy
each partition as cat reads it"): ``ls -lR``, ``grep -r``, ``wc -l``, ``cp -r``,
``tar``, ``rsync -a``, ``diff -r``, ``du``, ``find -exec cat``, on writable and
read-only mounts, on a copy of a broker's directory with internal topics, and after
retention; read mappings; ``tail -F`` across a daemon restart.

Every tool's exit status and error output are checked, and every copy is compared byte
for byte with what ``cat`` prints for the same file.
"""

from __future__ import annotations

import json
import mmap
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from storage import partition_for_key

from .conftest import MountDir, needs_fuse
from .test_kafka_copy import mount_copy_after_delete_records

pytestmark = needs_fuse

ERROR_LINES = [b"order %d ERROR disk" % i for i in range(0, 300, 7)]


def run(*argv: str | bytes | Path) -> subprocess.CompletedProcess[bytes]:
    """``argv`` run to its end: it exited 0 and wrote nothing on stderr."""
    done = subprocess.run([os.fspath(a) for a in argv], capture_output=True, timeout=120)
    assert done.returncode == 0, f"{argv}: exit {done.returncode}: {done.stderr!r}"
    assert done.stderr == b"", f"{argv}: {done.stderr!r}"
    return done


def write_properties(path: Path, **settings: object) -> Path:
    path.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
    return path


def fill(mnt: Path) -> dict[str, bytes]:
    """Topics of every format written through ``mnt`` (3 partitions each); returns the
    bytes each partition file must show, by path relative to ``mnt``."""
    expected: dict[str, bytes] = {}
    (mnt / "orders").mkdir()
    lines = [b"order %d %s" % (i, b"ok" * (i % 40)) for i in range(300)]
    for line in ERROR_LINES:
        lines[int(line.split()[1])] = line
    big = b"".join(b"bulk %06d %s\n" % (i, b"x" * (i % 90)) for i in range(25_000))
    with open(mnt / "orders" / "0", "ab") as f:
        f.write(b"".join(line + b"\n" for line in lines))
    with open(mnt / "orders" / "1", "ab") as f:
        f.write(big)  # over 1 MiB and several segments: cat and cp read it in pieces
    expected |= {"orders/0": b"".join(line + b"\n" for line in lines), "orders/1": big}
    expected["orders/2"] = b""

    (mnt / "raw").mkdir()
    os.setxattr(mnt / "raw", "user.seglog.format", b"raw")
    blob = bytes(random.Random(7).randrange(256) for _ in range(70_000)).replace(b"R", b"r")
    for partition, data in [(0, bytes(range(256)) * 3 + b"no newline at the end"), (2, blob)]:
        fd = os.open(mnt / "raw" / str(partition), os.O_WRONLY | os.O_APPEND)
        try:
            for start in range(0, len(data), 5000):
                os.write(fd, data[start : start + 5000])  # a record per write
        finally:
            os.close(fd)
        expected[f"raw/{partition}"] = data
    expected["raw/1"] = b""

    (mnt / "keyed").mkdir()
    os.setxattr(mnt / "keyed", "user.seglog.key.separator", b":")
    keyed = [(b"user%d" % (i % 13), b"login %d%s" % (i, b" ERROR" if i % 50 == 0 else b""))
             for i in range(200)]  # fmt: skip
    with open(mnt / "keyed" / "produce", "ab") as f:
        f.write(b"".join(k + b":" + v + b"\n" for k, v in keyed))
    for partition in range(3):
        expected[f"keyed/{partition}"] = b"".join(
            k + b":" + v + b"\n" for k, v in keyed if partition_for_key(k, 3) == partition
        )
    return expected


def cats(mnt: Path) -> dict[str, bytes]:
    """Every regular file under ``mnt`` (relative path) and what ``cat`` prints for it."""
    return {
        str(path.relative_to(mnt)): run("cat", path).stdout
        for path in sorted(mnt.rglob("*"))
        if path.is_file()
    }


def tree(root: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(root)): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def check_tree_tools(
    mnt: Path, work: Path, shown: dict[str, bytes], pattern: bytes = b"ERROR"
) -> None:
    """Run every whole-tree tool over ``mnt`` (scratch space in ``work``, which must
    not exist): each exits 0 without a word on stderr, says what ``shown`` (every
    file of the tree as ``cat`` prints it) implies, and copies each file as ``cat``
    prints it. ``grep -r`` looks for ``pattern``, which some line holds."""
    work.mkdir()
    files = sorted(shown)

    listing = run("ls", "-lR", mnt).stdout.decode()
    sizes: dict[str, int] = {}
    directory = ""
    for line in listing.splitlines():
        if line.endswith(":"):
            directory = str(Path(line[:-1]).relative_to(mnt))
        elif line.startswith("-"):
            fields = line.split()
            sizes[str(Path(directory) / fields[-1])] = int(fields[4])
    assert sizes == {name: len(data) for name, data in shown.items()}

    found = run("grep", "-r", pattern, mnt).stdout.splitlines()
    matches = [
        f"{mnt}/{name}:".encode() + line
        for name, data in shown.items()
        for line in data.split(b"\n")
        if pattern in line
    ]
    assert matches
    assert sorted(found) == sorted(matches)

    counts = run("bash", "-c", f"wc -l {mnt}/*/*").stdout.decode().splitlines()
    assert counts[-1].split() == [str(sum(d.count(b"\n") for d in shown.values())), "total"]
    assert {line.split()[1]: int(line.split()[0]) for line in counts[:-1]} == {
        f"{mnt}/{name}": data.count(b"\n") for name, data in shown.items()
    }

    usage = run("du", "-ab", mnt).stdout.decode().splitlines()
    apparent = {line.split("\t")[1]: int(line.split("\t")[0]) for line in usage}
    for name, data in shown.items():
        assert apparent[f"{mnt}/{name}"] == len(data), name

    order = run("find", mnt, "-type", "f").stdout.decode().split()
    assert sorted(str(Path(p).relative_to(mnt)) for p in order) == files
    catted = run("find", mnt, "-type", "f", "-exec", "cat", "{}", "+").stdout
    assert catted == b"".join(shown[str(Path(p).relative_to(mnt))] for p in order)

    run("cp", "-r", mnt, work / "cp")
    assert tree(work / "cp") == shown
    run("tar", "cf", work / "tree.tar", "-C", mnt, ".")
    (work / "tar").mkdir()
    run("tar", "xf", work / "tree.tar", "-C", work / "tar")
    assert tree(work / "tar") == shown
    run("rsync", "-a", f"{mnt}/", f"{work}/rsync/")
    assert tree(work / "rsync") == shown
    assert run("diff", "-r", mnt, work / "cp").stdout == b""
    assert run("diff", "-r", work / "rsync", mnt).stdout == b""


def test_tree_tools_on_a_writable_mount(tmp_path: Path, mount_dir: MountDir) -> None:
    config = write_properties(
        tmp_path / "server.properties", **{"num.partitions": 3, "log.segment.bytes": 200_000}
    )
    log_dir = tmp_path / "logs"
    mount = mount_dir(log_dir, "--config", str(config))
    mnt = mount.mountpoint
    expected = fill(mnt)
    shown = cats(mnt)
    # Each topic's produce file reads as an empty file; partitions as written.
    assert shown == expected | {f"{t}/produce": b"" for t in ("orders", "raw", "keyed")}
    check_tree_tools(mnt, tmp_path / "work", shown)
    # The produce file still produces.
    run("bash", "-c", f"echo 'user1:after the copies' >> {mnt}/keyed/produce")
    partition = partition_for_key(b"user1", 3)
    assert (
        run("tail", "-n", "1", mnt / "keyed" / str(partition)).stdout == b"user1:after the copies\n"
    )


def test_tree_tools_on_a_read_only_mount(tmp_path: Path, mount_dir: MountDir) -> None:
    config = write_properties(tmp_path / "server.properties", **{"num.partitions": 3})
    log_dir = tmp_path / "logs"
    writer = mount_dir(log_dir, "--config", str(config))
    expected = fill(writer.mountpoint)
    delete_records(log_dir, "orders", 0, 100)  # the file begins at offset 100
    expected["orders/0"] = expected["orders/0"].split(b"\n", 100)[-1]
    assert writer.stop() == 0
    mount = mount_dir(log_dir, "-o", "ro")
    shown = cats(mount.mountpoint)
    assert shown == expected  # no produce file on a read-only mount
    check_tree_tools(mount.mountpoint, tmp_path / "work", shown)


def test_tree_tools_on_a_broker_copy_with_internal_topics(
    tmp_path: Path, mount_dir: MountDir
) -> None:
    # DeleteRecords left the log start inside the segment: the file begins there.
    mount, legacy = mount_copy_after_delete_records(tmp_path, mount_dir, "ro,internal")
    shown = cats(mount.mountpoint)
    assert shown == {"__consumer_offsets/0": b"offset\n", "legacy/0": legacy}
    check_tree_tools(mount.mountpoint, tmp_path / "work", shown, b"v2 ")


def wait_for(condition: Callable[[], object], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def delete_records(log_dir: Path, topic: str, partition: int, offset: int) -> None:
    """Kafka's DeleteRecords through the mounted daemon's control socket."""
    offsets = log_dir.parent / "offsets.json"
    entry = {"topic": topic, "partition": partition, "offset": offset}
    offsets.write_text(json.dumps({"partitions": [entry], "version": 1}))
    script = Path(sys.executable).parent / "seglogfs"
    done = subprocess.run(
        [script, "delete-records", "-d", log_dir, "--offset-json-file", offsets],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


class Retained:
    """A mount whose partition t/0 (``path``) holds 400 lines in segments of about 2000
    bytes; retention runs every 100 ms, so once ``delete_below`` moved the log start
    the segments wholly below it go too."""

    def __init__(self, tmp_path: Path, mount_dir: MountDir) -> None:
        config = write_properties(
            tmp_path / "server.properties",
            **{"log.segment.bytes": 2000, "log.retention.check.interval.ms": 100},
        )
        self.mount = mount_dir(tmp_path / "logs", "--config", str(config))
        (self.mount.mountpoint / "t").mkdir()
        self.path = self.mount.mountpoint / "t" / "0"
        self.lines = [b"line %05d %s" % (i, b"r" * (i % 30)) for i in range(400)]
        with open(self.path, "ab", buffering=0) as f:
            for start in range(0, 400, 20):  # a batch per write: segments roll
                f.write(self.rendered(start, start + 20))

    def rendered(self, start: int, end: int = 400) -> bytes:
        """The bytes of lines ``start`` to ``end`` in the file."""
        return b"".join(line + b"\n" for line in self.lines[start:end])

    def delete_below(self, offset: int) -> bytes:
        """DeleteRecords below ``offset``, once retention deleted a segment; returns
        the bytes retained."""
        before = self.segments()
        delete_records(self.mount.log_dir, "t", 0, offset)
        wait_for(lambda: self.segments() < before, "retention to delete segments")
        return self.rendered(offset)

    def segments(self) -> int:
        return int(os.getxattr(self.path, "user.seglog.segments"))


@pytest.fixture
def retained(tmp_path: Path, mount_dir: MountDir) -> Retained:
    return Retained(tmp_path, mount_dir)


def test_tree_tools_and_sizes_after_retention(tmp_path: Path, retained: Retained) -> None:
    mnt, part = retained.mount.mountpoint, retained.path
    everything = retained.rendered(0)
    # A tail -f opened before retention: its file must never shrink under it.
    out, err = tmp_path / "tail.out", tmp_path / "tail.err"
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        tail = subprocess.Popen(
            ["tail", "-f", "-s", "0.1", "-n", "+1", str(part)], stdout=stdout, stderr=stderr
        )
    try:
        wait_for(lambda: out.read_bytes() == everything, "tail -f to print the partition")
        kept = retained.delete_below(150)
        # Sizes say what a fresh reader reads, whichever way they are asked.
        assert run("cat", part).stdout == kept
        assert run("stat", "-c", "%s", part).stdout == b"%d\n" % len(kept)
        assert run("bash", "-c", f"wc -c < {part}").stdout.strip() == b"%d" % len(kept)
        assert run("bash", "-c", f"cat {part} | wc -c").stdout.strip() == b"%d" % len(kept)
        assert b" %d " % len(kept) in run("ls", "-l", part).stdout
        assert run("tail", "-c", "+11", part).stdout == kept[10:]
        assert run("dd", f"if={part}", "bs=100", "skip=2", "status=none").stdout == kept[200:]
        # tar pads nothing ("File shrank") and exits 0; every other tool agrees.
        run("tar", "cf", tmp_path / "t.tar", "-C", mnt, "t/0")
        (tmp_path / "x").mkdir()
        run("tar", "xf", tmp_path / "t.tar", "-C", tmp_path / "x")
        assert (tmp_path / "x" / "t" / "0").read_bytes() == kept
        check_tree_tools(mnt, tmp_path / "work", {"t/0": kept, "t/produce": b""}, b"line")
        # The tail -f that held the file all along goes on: no truncation, nothing twice.
        run("bash", "-c", f"echo 'after retention' >> {part}")
        wait_for(lambda: out.read_bytes().endswith(b"after retention\n"), "tail -f to follow")
        assert out.read_bytes() == everything + b"after retention\n"
        assert err.read_bytes() == b""
    finally:
        tail.terminate()
        tail.wait(10)


def test_a_holder_keeps_its_size_and_positions_while_others_see_the_retained_bytes(
    retained: Retained,
) -> None:
    part = retained.path
    everything = retained.rendered(0)
    with open(part, "rb", buffering=0) as held:
        assert held.read(100) == everything[:100]
        kept = retained.delete_below(150)
        # This process holds the file: its stat and fstat keep the size, also from
        # another thread; another process sees the retained bytes.
        assert os.fstat(held.fileno()).st_size == len(everything)
        assert os.stat(part).st_size == len(everything)
        with ThreadPoolExecutor(1) as pool:
            assert pool.submit(os.stat, part).result().st_size == len(everything)
        assert run("stat", "-c", "%s", part).stdout == b"%d\n" % len(kept)
        # A read below the log start continues at the oldest retained record.
        assert held.read() == kept
        assert os.fstat(held.fileno()).st_size == len(everything)
    assert os.stat(part).st_size == len(kept)


def test_private_read_mappings_show_the_file_and_shared_ones_are_enodev(
    retained: Retained,
) -> None:
    def mapped(flags: int) -> subprocess.CompletedProcess[bytes]:
        # In a child: a mapping that outlives the file's end kills with SIGBUS.
        program = (
            "import mmap, sys\n"
            f"with open({str(retained.path)!r}, 'rb') as f:\n"
            f"    m = mmap.mmap(f.fileno(), 0, flags={flags}, prot=mmap.PROT_READ)\n"
            "    sys.stdout.buffer.write(m[:])\n"
        )
        return subprocess.run([sys.executable, "-c", program], capture_output=True, timeout=60)

    assert mapped(mmap.MAP_PRIVATE).stdout == run("cat", retained.path).stdout
    kept = retained.delete_below(150)
    private = mapped(mmap.MAP_PRIVATE)
    assert (private.returncode, private.stdout) == (0, kept)
    shared = mapped(mmap.MAP_SHARED)
    assert shared.returncode == 1
    assert shared.stderr.splitlines()[-1] == b"OSError: [Errno 19] No such device"


class Follower:
    """A ``tail -F`` of a file of a mount, its output and error output in files."""

    def __init__(self, path: Path, scratch: Path) -> None:
        self.path = path
        self.out, self.err = scratch.with_suffix(".out"), scratch.with_suffix(".err")
        with open(self.out, "wb") as stdout, open(self.err, "wb") as stderr:
            self.proc = subprocess.Popen(
                ["tail", "-F", "-s", "0.1", str(path)], stdout=stdout, stderr=stderr
            )

    def printed(self) -> bytes:
        return self.out.read_bytes()

    def printed_last(self, text: bytes) -> Callable[[], bool]:
        return lambda: self.printed().endswith(text)

    def said(self, text: bytes) -> Callable[[], bool]:
        return lambda: text in self.err.read_bytes()

    def holds_its_file(self) -> bool:
        fds = Path(f"/proc/{self.proc.pid}/fd")
        return any(os.readlink(fd) == str(self.path) for fd in fds.iterdir())

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def test_tail_capital_f_of_latest_follows_only_new_records_across_a_restart(
    tmp_path: Path, mount_dir: MountDir
) -> None:
    mount = mount_dir(tmp_path / "logs")
    mnt = mount.mountpoint
    (mnt / "t").mkdir()
    old = b"old 1\nold 2\n"
    run("bash", "-c", f"printf 'old 1\\nold 2\\n' >> {mnt}/t/0")
    latest = Follower(mnt / "t" / "0@latest", tmp_path / "latest")
    plain = Follower(mnt / "t" / "0", tmp_path / "plain")
    try:
        wait_for(lambda: plain.printed() == old, "tail -F of the partition")
        wait_for(latest.holds_its_file, "tail -F to open the latest view")
        run("bash", "-c", f"echo 'new 1' >> {mnt}/t/0")
        wait_for(lambda: latest.printed() == b"new 1\n", "tail -F of latest")
        # Both have read new 1 before the daemon stops (tail polls every 0.1 s).
        wait_for(lambda: plain.printed() == old + b"new 1\n", "tail -F of the partition")
        assert mount.stop() == 0
        for follower in (latest, plain):
            wait_for(follower.said(b"has become inaccessible"), "tail to lose the file")
        mount.start()
        for follower in (latest, plain):
            wait_for(follower.said(b"has appeared"), "tail to find the file again")
        run("bash", "-c", f"echo 'new 2' >> {mnt}/t/0")
        for follower in (latest, plain):
            wait_for(follower.printed_last(b"new 2\n"), "tail to follow")
        # The latest view resolves at the end again: only new records, across restarts.
        assert latest.printed() == b"new 1\nnew 2\n"
        # The partition file "appeared" again to tail, which printed all of it again.
        assert plain.printed() == old + b"new 1\n" + old + b"new 1\nnew 2\n"
    finally:
        latest.stop()
        plain.stop()

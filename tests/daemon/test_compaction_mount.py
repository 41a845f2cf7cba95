"""Compacted topics through a real mount (issue 19, "Where it runs"): keyless writes are
``EINVAL`` and lose nothing, the ``key.separator`` rule for ``mkdir``, ``setfattr`` and
``removexattr``, and the daemon's background cleaning (``log.cleaner.*`` from
``--config``); and the background pass itself, driven in trio without a kernel."""

from __future__ import annotations

import errno
import os
import re
import subprocess
import time
from functools import partial
from pathlib import Path

import pytest
import trio

from seglogfs.daemon import metrics
from seglogfs.daemon.maintenance import run_maintenance
from seglogfs.positions import position_index_spec
from storage import BrokerConfig, CleanerConfig, LogManager
from tests.cli.conftest import run_script
from tests.conftest import ManualClock
from tests.daemon.conftest import Mount, MountDir, needs_fuse, run_sync

KEYS = 7
PASS_LINE = re.compile(
    r"cleaner: compacted 1 log\(s\) \(t-0\) in (?P<passes>\d+) pass\(es\): "
    r"segments (?P<s0>\d+) -> (?P<s1>\d+), bytes (?P<b0>\d+) -> (?P<b1>\d+) "
    r"\((?P<reclaimed>\d+) reclaimed\), records (?P<read>\d+) read, (?P<kept>\d+) kept"
)


def sh(command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``command`` run by bash in ``cwd`` (the mount point), as a user types it."""
    return subprocess.run(
        ["bash", "-c", command], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


def cli(log_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The console script, through the daemon's control socket; it must succeed."""
    result = run_script(*args, env={"SEGLOG_LOG_DIR": str(log_dir)})
    assert result.code == 0, result.err
    return subprocess.CompletedProcess(list(args), result.code, result.text, result.err)


def config_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "server.properties"
    path.write_text(text)
    return str(path)


def mount_compacted(tmp_path: Path, mount_dir: MountDir, config: str = "") -> Mount:
    """A mount whose topic ``t`` is compacted, keyed by ``:``, in small segments."""
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    mount = mount_dir(log_dir, "--config", config_file(tmp_path, config))
    cli(
        log_dir,
        "topics", "create", "t", "--key-separator", ":",
        "--config", "cleanup.policy=compact", "--config", "segment.bytes=1000",
    )  # fmt: skip
    return mount


def write_rounds(partition: Path, first: int, rounds: int) -> bytes:
    """``rounds`` writes through the mount, each one line per key (one batch each)."""
    written = b""
    with open(partition, "ab", buffering=0) as f:
        for r in range(first, first + rounds):
            data = b"".join(b"k%d:%d-%d\n" % (k, r, k) for k in range(KEYS))
            assert f.write(data) == len(data)
            written += data
    return written


def describe(log_dir: Path) -> dict[str, int]:
    """Partition 0 of ``t`` as ``seglogfs topics describe`` shows it (read-only)."""
    text = cli(log_dir, "topics", "describe", "t").stdout
    fields = dict(re.findall(r"(\w+): (\S*)", text.splitlines()[1]))
    return {k: int(fields[k]) for k in ("StartOffset", "EndOffset", "Segments", "Size")}


# -- writes ------------------------------------------------------------------------------


@needs_fuse
def test_a_keyless_line_is_einval_and_loses_nothing(tmp_path: Path, mount_dir: MountDir) -> None:
    mount = mount_compacted(tmp_path, mount_dir, "log.cleaner.enable=false\n")
    mnt = mount.mountpoint
    (tmp_path / "mixed").write_bytes(b"b:2\nno key\n")  # cat writes it in one write
    assert sh("echo 'a:1' >> t/0", mnt).returncode == 0
    for command in (
        "echo 'no key' >> t/0",  # no separator in the line: a record without a key
        "cat ../mixed >> t/0",  # one write, one batch: all or nothing
        "echo 'no key' >> t/produce",
    ):
        refused = sh(command, mnt)
        assert refused.returncode == 1, command
        assert "Invalid argument" in refused.stderr, refused.stderr
    assert (mnt / "t" / "0").read_bytes() == b"a:1\n"
    assert sh("echo 'c:3' >> t/0", mnt).returncode == 0
    assert (mnt / "t" / "0").read_bytes() == b"a:1\nc:3\n"
    # A partial line: the writer may still send its separator, so close() decides.
    fd = os.open(mnt / "t" / "0", os.O_WRONLY | os.O_APPEND)
    assert os.write(fd, b"d") == 1
    assert os.write(fd, b":4") == 2
    os.close(fd)
    fd = os.open(mnt / "t" / "0", os.O_WRONLY | os.O_APPEND)
    assert os.write(fd, b"still no key") == 12
    with pytest.raises(OSError, match="Invalid argument") as closed:
        os.close(fd)
    assert closed.value.errno == errno.EINVAL
    assert (mnt / "t" / "0").read_bytes() == b"a:1\nc:3\nd:4\n"
    assert describe(mount.log_dir)["EndOffset"] == 3
    log = mount.log()
    assert "write of 7 bytes refused: invalid record batch: Compacted topic cannot accept " in log
    assert "Traceback" not in log


@needs_fuse
def test_a_compacted_raw_topic_refuses_writes_through_the_mount(
    tmp_path: Path, mount_dir: MountDir
) -> None:
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    mnt = mount_dir(log_dir).mountpoint
    cli(log_dir, "topics", "create", "r", "--format", "raw", "--config", "cleanup.policy=compact")
    refused = sh("echo value >> r/0", mnt)
    assert (refused.returncode, "Invalid argument" in refused.stderr) == (1, True)
    assert (mnt / "r" / "0").read_bytes() == b""
    # A producer that brings keys is served (here the console producer, split at ':').
    produced = run_script(
        "produce", "r", "--format", "lines", "-K", ":",
        stdin=b"key:value\n", env={"SEGLOG_LOG_DIR": str(log_dir)},
    )  # fmt: skip
    assert produced.code == 0, produced.err
    assert (mnt / "r" / "0").read_bytes() == b"value"


# -- the key.separator rule --------------------------------------------------------------


def xattr(path: Path, name: str, value: str | None = None) -> subprocess.CompletedProcess[str]:
    command = ["setfattr", "-n", f"user.seglog.{name}"]
    command += ["-v", value] if value is not None else []
    return subprocess.run(
        [*command, str(path)], capture_output=True, text=True, timeout=60, check=False
    )


def get_xattr(path: Path, name: str) -> str:
    return subprocess.run(
        ["getfattr", "--only-values", "-n", f"user.seglog.{name}", str(path)],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip


def einval(result: subprocess.CompletedProcess[str]) -> bool:
    return result.returncode != 0 and "Invalid argument" in result.stderr


@needs_fuse
def test_setfattr_makes_no_compacted_lines_topic_without_separator(
    tmp_path: Path, mount_dir: MountDir
) -> None:
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    mount = mount_dir(log_dir)
    topic = mount.mountpoint / "m"
    topic.mkdir()  # lines, no separator, the broker's policy (delete)
    assert einval(xattr(topic, "cleanup.policy", "compact"))
    assert einval(xattr(topic, "cleanup.policy", "delete,compact"))
    assert get_xattr(topic, "cleanup.policy") == "delete"
    assert xattr(topic, "key.separator", ":").returncode == 0
    assert xattr(topic, "cleanup.policy", "compact").returncode == 0
    assert get_xattr(topic, "cleanup.policy") == "compact"
    # Dropping the separator of the (empty) compacted topic: refused, it stays.
    assert einval(xattr(topic, "key.separator", ""))
    assert get_xattr(topic, "key.separator") == ":"
    # A json topic may be compacted (its lines carry keys), not turned into lines then.
    json_topic = mount.mountpoint / "j"
    json_topic.mkdir()
    assert xattr(json_topic, "format", "json").returncode == 0
    assert xattr(json_topic, "cleanup.policy", "compact").returncode == 0
    assert einval(xattr(json_topic, "format", "lines"))
    assert get_xattr(json_topic, "format") == "json"
    log = mount.log()
    assert "refused: invalid value 'compact' for configuration cleanup.policy: a lines topic" in log
    assert "Traceback" not in log


@needs_fuse
def test_under_a_broker_default_of_compact(tmp_path: Path, mount_dir: MountDir) -> None:
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    mount = mount_dir(log_dir, "--config", config_file(tmp_path, "log.cleanup.policy=compact\n"))
    mnt = mount.mountpoint
    made = subprocess.run(["mkdir", str(mnt / "x")], capture_output=True, text=True, check=False)
    assert einval(made), made.stderr
    assert not (mnt / "x").exists()
    assert "mkdir refused: invalid value 'compact' for configuration cleanup.policy" in mount.log()
    cli(log_dir, "topics", "create", "x", "--key-separator", ":")
    assert sh("echo 'k:v' >> x/0", mnt).returncode == 0
    cli(log_dir, "topics", "create", "d", "--config", "cleanup.policy=delete")
    removed = subprocess.run(
        ["setfattr", "-x", "user.seglog.cleanup.policy", str(mnt / "d")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert einval(removed), removed.stderr
    assert get_xattr(mnt / "d", "cleanup.policy") == "delete"


# -- the background cleaner ---------------------------------------------------------------


def pass_lines(mount: Mount) -> list[dict[str, int]]:
    return [{k: int(v) for k, v in m.groupdict().items()} for m in PASS_LINE.finditer(mount.log())]


def wait_for_passes(mount: Mount, count: int, seconds: float = 60) -> list[dict[str, int]]:
    deadline = time.monotonic() + seconds
    while len(found := pass_lines(mount)) < count:
        assert time.monotonic() < deadline, mount.log()
        time.sleep(0.05)
    return found


def latest(lines: bytes) -> dict[bytes, bytes]:
    return dict(line.split(b":", 1) for line in lines.splitlines())


@needs_fuse
def test_the_daemon_cleans_on_its_schedule(tmp_path: Path, mount_dir: MountDir) -> None:
    # Written through a mount that does not clean; then one that cleans every 200 ms.
    first = mount_compacted(tmp_path, mount_dir, "log.cleaner.enable=false\n")
    partition = first.mountpoint / "t" / "0"
    written = write_rounds(partition, 0, 60)
    before = describe(first.log_dir)
    assert before["Segments"] > 5
    assert partition.read_bytes() == written
    assert first.stop() == 0
    assert pass_lines(first) == []
    config = tmp_path / "cleaning.properties"
    config.write_text("log.cleaner.backoff.ms=200\n")
    mount = mount_dir(first.log_dir, "--config", str(config))
    partition = mount.mountpoint / "t" / "0"
    (done,) = wait_for_passes(mount, 1)
    after = describe(mount.log_dir)
    # What the pass said it did is what the directory shows.
    assert (done["s0"], done["b0"]) == (before["Segments"], before["Size"])
    assert (done["s1"], done["b1"]) == (after["Segments"], after["Size"])
    assert done["b1"] < done["b0"] / 3
    assert done["reclaimed"] == done["b0"] - done["b1"]
    assert done["kept"] == KEYS
    assert after["EndOffset"] == before["EndOffset"] == 60 * KEYS
    cleaned = partition.read_bytes()
    lines = cleaned.splitlines()
    assert len(lines) < 60 * KEYS / 3
    assert latest(cleaned) == latest(written)
    assert len(lines) == len(set(lines))
    # It runs again: new duplicates, once sealed, go at the next passes (every sealed
    # segment is due at once with this ratio, set through the mount).
    assert xattr(mount.mountpoint / "t", "min.cleanable.dirty.ratio", "0.01").returncode == 0
    more = write_rounds(partition, 60, 60)
    passes = wait_for_passes(mount, 2)
    assert passes[-1]["b1"] < passes[-1]["b0"]
    deadline = time.monotonic() + 60
    while True:  # until a pass reached the active segment: one record per key below it
        active_base = max(int(f.stem) for f in (mount.log_dir / "t-0").glob("*.log"))
        lines = partition.read_bytes().splitlines()
        if len(lines) == KEYS + 120 * KEYS - active_base:
            break
        assert time.monotonic() < deadline, (len(lines), active_base, mount.log())
        time.sleep(0.05)
    assert latest(partition.read_bytes()) == latest(written + more)
    assert len(lines) < 120 * KEYS / 3
    assert mount.stop() == 0
    assert "Traceback" not in mount.log()


def test_cleaning_off_runs_no_pass(log_dir: Path, clock: ManualClock) -> None:
    async def main() -> int:
        broker = BrokerConfig(
            log_dirs=(str(log_dir),), cleaner=CleanerConfig(enable=False, backoff_ms=10)
        )
        with LogManager.open(log_dir, broker, clock=clock, extension=position_index_spec) as m:
            size = fill_compacted(m)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(partial(run_maintenance, m, run_sync, read_only=False))
                await trio.sleep(0.5)
                nursery.cancel_scope.cancel()
            assert m.log("t", 0).size == size
            return size

    assert trio.run(main) > 0


def fill_compacted(manager: LogManager) -> int:
    """Topic ``t``: 50 batches of one record per key, in segments of 1,000 bytes."""
    manager.create_topic(
        "t", 1, {"cleanup.policy": "compact", "segment.bytes": "1000"}, key_separator=":"
    )
    log = manager.log("t", 0)
    for r in range(50):
        log.append([b"%d" % r] * KEYS, keys=[b"k%d" % k for k in range(KEYS)])
    return log.size


def test_a_background_pass_is_counted_and_logged(
    log_dir: Path, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    counters = metrics.MountCounters(registry)
    caplog.set_level("INFO", logger="seglogfs.daemon.maintenance")

    async def main() -> tuple[int, int]:
        broker = BrokerConfig(log_dirs=(str(log_dir),), cleaner=CleanerConfig(backoff_ms=50))
        with LogManager.open(log_dir, broker, clock=clock, extension=position_index_spec) as m:
            before = fill_compacted(m)
            log = m.log("t", 0)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(partial(run_maintenance, m, run_sync, read_only=False))
                for _ in range(500):
                    if log.size < before:
                        break
                    await trio.sleep(0.02)
                nursery.cancel_scope.cancel()
            return before, log.size

    metrics.COUNTERS = counters
    try:
        before, after = trio.run(main)
    finally:
        metrics.COUNTERS = None
    assert after < before / 3
    assert registry.get_sample_value("seglogfs_cleaner_passes_total") == 1
    assert registry.get_sample_value("seglogfs_cleaner_bytes_reclaimed_total") == before - after
    clean = {"task": "clean"}
    assert registry.get_sample_value("seglogfs_background_pass_seconds_count", clean) == 1
    assert (registry.get_sample_value("seglogfs_background_pass_seconds_sum", clean) or 0) > 0
    assert f"bytes {before} -> {after} ({before - after} reclaimed)" in caplog.text


@needs_fuse
def test_the_offsets_topic_is_compacted_under_commits(tmp_path: Path, mount_dir: MountDir) -> None:
    # Issue 20's offsets topic on a mount: every close of a P@group= view commits (a
    # record in __consumer_offsets); the daemon's cleaner keeps the latest commit per
    # key, so the topic stops growing with the commits.
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    config = (
        "offsets.topic.num.partitions=1\noffsets.topic.segment.bytes=400\n"
        "log.cleaner.backoff.ms=200\nlog.cleaner.min.cleanable.ratio=0.01\n"
    )
    mount = mount_dir(log_dir, "--config", config_file(tmp_path, config))
    mnt = mount.mountpoint
    cli(log_dir, "topics", "create", "t")
    commits = 40
    for i in range(commits):
        assert sh(f"echo line{i} >> t/0", mnt).returncode == 0
        assert sh("cat 't/0@group:earliest=g'", mnt).stdout == f"line{i}\n"
    described = cli(log_dir, "groups", "describe", "--group", "g").stdout
    assert re.search(rf"\bt\s+0\s+{commits}\b", described), described

    def sealed_keys() -> tuple[int, list[bytes | None]]:
        with LogManager.open(log_dir, read_only=True) as reader:
            log = reader.log("__consumer_offsets", 0)
            active = log.active_segment.base_offset
            records = log.records(log.log_start_offset)
            return log.number_of_segments, [r.key for r in records if r.offset < active]

    # Passes run while the commits go on; once they stop, the next pass (every dirty
    # byte counts at a ratio of 0.01) leaves one commit per key below the active segment.
    deadline = time.monotonic() + 60
    segments, keys = sealed_keys()
    while len(keys) != len(set(keys)) and time.monotonic() < deadline:
        time.sleep(0.2)
        segments, keys = sealed_keys()
    assert segments > 2  # the commits rolled segments: there was something to clean
    assert keys == [b"\x00\x01\x00\x01g\x00\x01t\x00\x00\x00\x00"]  # (g, t, 0), once
    assert "cleaner: compacted 1 log(s) (__consumer_offsets-0)" in mount.log()
    assert "Traceback" not in mount.log()

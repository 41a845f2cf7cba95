"""``seglogfs produce`` into an unmounted log directory (the daemon path is in
test_control.py)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from seglogfs.cli.verify import verify_log_dir
from seglogfs.positions import position_index_spec
from storage import (
    LogManager,
    partition_for_key,
)
from tests.cli.conftest import SCRIPT, Cli, strip_build_notice


def _records(log_dir: Path, topic: str, partition: int) -> list[tuple[bytes | None, bytes | None]]:
    with LogManager.open(log_dir, read_only=True) as manager:
        return [(r.key, r.value) for r in manager.log(topic, partition).records(0)]


def test_lines_become_records_exactly(cli: Cli, log_dir: Path) -> None:
    cli("topics", "create", "t")
    data = b"first\n\nthird with spaces \r\n\xff\xfe binary\nlast without newline"
    result = cli("produce", "t", stdin=data)
    assert (result.code, result.out, result.err) == (0, b"", "")
    assert _records(log_dir, "t", 0) == [
        (None, b"first"),
        (None, b""),
        (None, b"third with spaces \r"),
        (None, b"\xff\xfe binary"),
        (None, b"last without newline"),
    ]


def test_empty_input_appends_nothing(cli: Cli, log_dir: Path) -> None:
    cli("topics", "create", "t")
    assert cli("produce", "t", stdin=b"").code == 0
    assert _records(log_dir, "t", 0) == []


def test_partition_option(cli: Cli, log_dir: Path) -> None:
    cli("topics", "create", "t", "--partitions", "3")
    assert cli("produce", "t", "-p", "2", stdin=b"a\nb\n").code == 0
    assert _records(log_dir, "t", 2) == [(None, b"a"), (None, b"b")]
    assert _records(log_dir, "t", 0) == _records(log_dir, "t", 1) == []
    bad = cli("produce", "t", "-p", "3", stdin=b"c\n")
    assert bad.code == 1
    assert bad.err == "seglogfs produce: error: partition t-3 does not exist\n"
    assert sum(len(_records(log_dir, "t", p)) for p in range(3)) == 2


def test_keys_partition_like_kafka(cli: Cli, log_dir: Path) -> None:
    cli("topics", "create", "t", "--partitions", "5")
    lines = [f"user-{i % 17}|event {i}|x" for i in range(200)]
    assert cli("produce", "t", "-K", "|", stdin="\n".join(lines).encode() + b"\n").code == 0
    expected: dict[int, list[tuple[bytes | None, bytes | None]]] = {p: [] for p in range(5)}
    for line in lines:
        key, _, value = line.partition("|")
        expected[partition_for_key(key.encode(), 5)].append((key.encode(), value.encode()))
    assert {p: _records(log_dir, "t", p) for p in range(5)} == expected


def test_line_without_separator_has_no_key(cli: Cli, log_dir: Path) -> None:
    cli("topics", "create", "t")
    assert cli("produce", "t", "-K", "::", stdin=b"k::v::w\nplain\n::empty key\n").code == 0
    assert _records(log_dir, "t", 0) == [(b"k", b"v::w"), (None, b"plain"), (b"", b"empty key")]


def test_empty_separator_is_a_usage_error(cli: Cli, log_dir: Path) -> None:
    cli("topics", "create", "t")
    result = cli("produce", "t", "-K", "", stdin=b"a\n")
    assert (result.code, result.err) == (
        2,
        "seglogfs produce: error: -K/--key-separator must not be empty\n",
    )
    assert _records(log_dir, "t", 0) == []


def test_topic_separator_is_the_default(cli: Cli, log_dir: Path) -> None:
    cli("topics", "create", "t", "--key-separator", "=")
    assert cli("produce", "t", stdin=b"a=1\n").code == 0
    assert _records(log_dir, "t", 0) == [(b"a", b"1")]


def test_raw_topic_round_trips_binary_bytes(cli: Cli, log_dir: Path) -> None:
    cli("topics", "create", "blobs", "--format", "raw")
    data = bytes(range(256)) * 1000  # 256,000 bytes with every byte value, newlines too
    assert cli("produce", "blobs", stdin=data).code == 0
    records = _records(log_dir, "blobs", 0)
    assert b"".join(v or b"" for _k, v in records) == data
    assert all(len(v or b"") <= 64 * 1024 for _k, v in records)
    assert len(records) >= 4
    assert cli("consume", "blobs").out == data


def test_raw_option_on_a_lines_topic(cli: Cli, log_dir: Path) -> None:
    cli("topics", "create", "t")
    assert cli("produce", "t", "--raw", stdin=b"one\ntwo\n").code == 0
    assert _records(log_dir, "t", 0) == [(None, b"one\ntwo\n")]
    bad = cli("produce", "t", "--raw", "-K", ":", stdin=b"x")
    assert bad.code == 2


def test_large_input_is_batched_and_complete(cli: Cli, log_dir: Path) -> None:
    cli("topics", "create", "t")
    lines = [b"%08d " % i + b"y" * 91 for i in range(100_000)]  # 100-byte lines
    data = b"\n".join(lines) + b"\n"
    assert cli("produce", "t", stdin=data).code == 0
    with LogManager.open(log_dir, read_only=True) as manager:
        log = manager.log("t", 0)
        batches = list(log.batches(0))
        assert log.log_end_offset == 100_000
        # Batched: far fewer batches than records, each well under max.message.bytes.
        assert 10 < len(batches) < 1000
        assert all(batch.size <= 1048588 for batch in batches)
    assert cli("consume", "t").out == data


def test_record_too_large_reports_what_was_already_written(cli: Cli, log_dir: Path) -> None:
    cli("topics", "create", "t", "--config", "max.message.bytes=4000")
    small = b"s" * 99 + b"\n"
    data = small * 3000 + b"L" * 5000 + b"\n" + small * 10
    result = cli("produce", "t", stdin=data)
    assert result.code == 1
    match = re.fullmatch(
        r"seglogfs produce: error: record batch of \d+ bytes exceeds max\.message\.bytes=4000 "
        r"\((\d+) record\(s\) were appended before the error\)\n",
        result.err,
    )
    assert match is not None, result.err
    written = _records(log_dir, "t", 0)
    # Nothing written is lost, nothing after the bad record is appended, and the
    # count the user is told is the count in the log.
    assert int(match.group(1)) == len(written)
    assert 0 < len(written) < 3000
    assert all(value == b"s" * 99 for _key, value in written)


def test_produce_keeps_the_position_index_in_step(cli: Cli, log_dir: Path) -> None:
    cli("topics", "create", "t", "--key-separator", ":", "--config", "segment.bytes=2000")
    lines = b"".join(b"k%d:value %d\n" % (i % 3, i) for i in range(300))
    for start in range(0, 300, 50):  # six runs: each batch rolls a 2000-byte segment
        part = b"".join(b"k%d:value %d\n" % (i % 3, i) for i in range(start, start + 50))
        assert cli("produce", "t", stdin=part).code == 0
    position_files = sorted((log_dir / "t-0").glob("*.seglogpos"))
    assert len(position_files) == len(sorted((log_dir / "t-0").glob("*.log"))) > 1
    with LogManager.open(log_dir, read_only=True, extension=position_index_spec) as manager:
        # The partition file's size is exactly the bytes consume prints.
        assert manager.log("t", 0).extension_end == len(lines)
    assert verify_log_dir(log_dir) == []
    assert cli("consume", "t").out == lines


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupted_produce_closes_the_log_cleanly(log_dir: Path, signum: int, code: int) -> None:
    with LogManager.open(log_dir) as manager:
        manager.create_topic("t", 1)
    env = {**os.environ, "SEGLOG_LOG_DIR": str(log_dir)}
    with subprocess.Popen(
        [str(SCRIPT), "produce", "t"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    ) as process:
        assert process.stdin is not None
        process.stdin.write(b"one\ntwo\n")
        process.stdin.flush()
        deadline = time.monotonic() + 30
        while _records(log_dir, "t", 0) != [(None, b"one"), (None, b"two")]:
            assert time.monotonic() < deadline, "the lines were not appended"
            time.sleep(0.05)
        process.send_signal(signum)  # while it waits for more input
        _out, err = process.communicate(timeout=30)
    assert (process.returncode, strip_build_notice(err)) == (code, b"")
    # Closed, not killed: the clean-shutdown marker says no recovery is needed.
    assert (log_dir / ".kafka_cleanshutdown").exists()
    assert _records(log_dir, "t", 0) == [(None, b"one"), (None, b"two")]

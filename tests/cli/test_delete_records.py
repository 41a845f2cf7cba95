"""``seglogfs delete-records``: Kafka's ``kafka-delete-records.sh``, with and without a
daemon, and the way past a damaged batch (issue 17)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from storage import AppendInfo, LogManager
from tests.cli.conftest import Cli, run_script
from tests.daemon.conftest import HAVE_FUSE, Mount

SEGMENT_BYTES = "4000"


def fill(log_dir: Path) -> list[AppendInfo]:
    """Topic ``t``, 2 partitions: partition 0 holds 60 batches of 10 numbered lines in
    several segments, partition 1 holds 5 lines."""
    with LogManager.open(log_dir) as manager:
        manager.create_topic("t", 2, {"segment.bytes": SEGMENT_BYTES})
        log = manager.log("t", 0)
        infos = [log.append([b"%d" % (10 * i + k) for k in range(10)]) for i in range(60)]
        assert log.number_of_segments > 2
        manager.log("t", 1).append([b"other %d" % i for i in range(5)])
    return infos


def offset_file(tmp_path: Path, *entries: tuple[str, int, int], **extra: object) -> Path:
    path = tmp_path / "offsets.json"
    partitions = [{"topic": t, "partition": p, "offset": o} for t, p, o in entries]
    path.write_text(json.dumps({"partitions": partitions, "version": 1, **extra}))
    return path


def lines(start: int, end: int) -> bytes:
    return b"".join(b"%d\n" % i for i in range(start, end))


def test_moves_log_start_offsets_as_kafka_does(cli: Cli, log_dir: Path, tmp_path: Path) -> None:
    fill(log_dir)
    offsets = offset_file(tmp_path, ("t", 0, 25), ("t", 1, -1))
    result = cli("delete-records", "--offset-json-file", str(offsets))
    assert (result.code, result.err) == (0, "")
    assert result.text == (
        "Executing records delete operation\n"
        "Records delete operation completed:\n"
        "partition: t-0\tlow_watermark: 25\n"
        "partition: t-1\tlow_watermark: 5\n"
    )
    assert cli("consume", "t", "-p", "0").out == lines(25, 600)
    assert cli("consume", "t", "-p", "1").out == b""
    # Never back; past the end, below -1 and unknown partitions are errors of their own.
    again = offset_file(tmp_path, ("t", 0, 3), ("t", 1, 99), ("nope", 0, 1), ("t", 7, 0))
    result = cli("delete-records", "--offset-json-file", str(again))
    assert result.code == 1
    assert result.text.splitlines()[2:] == [
        "partition: t-0\tlow_watermark: 25",
        "partition: t-1\terror: offset 99 is out of range: the log holds [5, 5)",
        "partition: nope-0\terror: topic 'nope' does not exist",
        "partition: t-7\terror: partition t-7 does not exist",
    ]
    # The checkpoint holds it: a reopen (as after a crash) starts there.
    with LogManager.open(log_dir, read_only=True) as reader:
        assert reader.log("t", 0).log_start_offset == 25


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{", "is not valid JSON"),
        ('{"version": 1}', "missing partitions field"),
        ('{"partitions": [], "version": 2}', "not supported version field value 2"),
        (
            '{"partitions": [{"topic": "t", "partition": 0, "offset": 1},'
            ' {"topic": "t", "partition": 0, "offset": 2}]}',
            "duplicate topic partitions: t-0",
        ),
        ('{"partitions": [{"topic": "t", "partition": "0", "offset": 1}]}', "partition must"),
        ('{"partitions": [{"topic": "t", "partition": 0, "offset": -2}]}', "offset -2 of t-0"),
    ],
)
def test_a_bad_offset_file_is_a_usage_error(
    cli: Cli, log_dir: Path, tmp_path: Path, content: str, message: str
) -> None:
    fill(log_dir)
    path = tmp_path / "offsets.json"
    path.write_text(content)
    result = cli("delete-records", "--offset-json-file", str(path))
    assert result.code == 2
    assert message in result.err
    assert result.err.startswith("seglogfs delete-records: error: ")
    assert cli("consume", "t", "-p", "0").out == lines(0, 600)  # nothing changed


def test_an_offset_file_that_is_not_text_is_a_usage_error(
    cli: Cli, log_dir: Path, tmp_path: Path
) -> None:
    # Found by the command-line fuzzer: a binary file was a UnicodeDecodeError traceback.
    fill(log_dir)
    path = tmp_path / "offsets.json"
    path.write_bytes(b'{"partitions": \xff}')
    result = cli("delete-records", "--offset-json-file", str(path))
    assert result.code == 2
    assert result.err == (
        f"seglogfs delete-records: error: offset JSON file {path} is not UTF-8 text "
        "(invalid start byte)\n"
    )
    assert cli("consume", "t", "-p", "0").out == lines(0, 600)  # nothing changed


def damage_length(log_dir: Path, info: AppendInfo) -> None:
    segment = log_dir / "t-0" / f"{info.segment_base_offset:020d}.log"
    data = bytearray(segment.read_bytes())
    data[info.position + 9] ^= 0x01  # the batch length: 64 KiB more, past the segment
    segment.write_bytes(bytes(data))


def test_the_way_past_a_damaged_batch(cli: Cli, log_dir: Path, tmp_path: Path) -> None:
    infos = fill(log_dir)
    bad = infos[5]
    following = next(i for i in infos if i.segment_base_offset > bad.segment_base_offset)
    damage_length(log_dir, bad)
    stopped = cli("consume", "t", "-p", "0")
    assert stopped.code == 1
    assert f"offset {bad.first_offset}" in stopped.err
    # Past it: the first offset of the next segment (its file's name).
    offsets = offset_file(tmp_path, ("t", 0, following.first_offset))
    assert cli("delete-records", "--offset-json-file", str(offsets)).code == 0
    resumed = cli("consume", "t", "-p", "0")
    assert (resumed.code, resumed.err) == (0, "")
    assert resumed.out == lines(following.first_offset, 600)


@pytest.mark.skipif(not HAVE_FUSE, reason="/dev/fuse is missing")
def test_through_a_running_daemon(log_dir: Path, tmp_path: Path) -> None:
    infos = fill(log_dir)
    bad = infos[5]
    following = next(i for i in infos if i.segment_base_offset > bad.segment_base_offset)
    damage_length(log_dir, bad)
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    env = {"SEGLOG_LOG_DIR": str(log_dir)}
    partition = mountpoint / "t" / "0"
    daemon = Mount(log_dir, mountpoint, [], tmp_path / "daemon.log")
    try:
        daemon.start()
        cat = subprocess.run(["cat", str(partition)], capture_output=True, timeout=60)
        assert cat.returncode != 0
        offsets = offset_file(tmp_path, ("t", 0, following.first_offset), ("t", 1, 2))
        # The daemon holds the writer lock: this can only succeed through its socket.
        result = run_script("delete-records", "--offset-json-file", str(offsets), env=env)
        assert (result.code, result.err) == (0, "")
        assert result.out.decode().splitlines()[2:] == [
            f"partition: t-0\tlow_watermark: {following.first_offset}",
            "partition: t-1\tlow_watermark: 2",
        ]
        # Readers of the mount and consume start at the new log start, past the damage.
        assert partition.read_bytes() == lines(following.first_offset, 600)
        assert run_script("consume", "t", "-p", "0", env=env).out == partition.read_bytes()
        checkpoint = (log_dir / "log-start-offset-checkpoint").read_text().splitlines()
        assert f"t 0 {following.first_offset}" in checkpoint
        assert daemon.stop() == 0
    finally:
        daemon.cleanup()
    with LogManager.open(log_dir, read_only=True) as reader:
        assert reader.log("t", 0).log_start_offset == following.first_offset
        assert reader.log("t", 1).log_start_offset == 2

"""``seglogfs consume``: plain output is the partition file's bytes; offsets, counts,
JSON, follow."""

from __future__ import annotations

import base64
import json
import os
import select
import subprocess
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import pytest

from storage import LogManager, build_record_batch
from storage.record.render import render_batch
from tests.cli.conftest import SCRIPT, Cli, strip_build_notice
from tests.conftest import ManualClock

T0 = 1_700_000_000_000


def _fill(log_dir: Path, clock: ManualClock) -> None:
    """Topic ``k`` (2 partitions, separator ':') with keyed, keyless, null-value and
    multi-record batches at known timestamps."""
    with LogManager.open(log_dir, clock=clock) as manager:
        manager.create_topic("k", 2, key_separator=":")
        log = manager.log("k", 0)
        log.append([b"v0", b"v1", b"v2"], keys=[b"a", None, b"c"], timestamps=[T0, T0 + 1, T0 + 2])
        log.append([None], keys=[b"tomb"], timestamps=[T0 + 10])
        log.append([b"v4", b"v5"], timestamps=[T0 + 20, T0 + 21])
        manager.log("k", 1).append([b"other"], timestamps=[T0 + 5])


def _expected_lines(records: Sequence[tuple[bytes | None, bytes | None]]) -> bytes:
    # SPEC §3 rendering written out independently of storage.record.render.
    return b"".join((k + b":" if k is not None else b"") + (v or b"") + b"\n" for k, v in records)


P0 = [(b"a", b"v0"), (None, b"v1"), (b"c", b"v2"), (b"tomb", None), (None, b"v4"), (None, b"v5")]


def test_plain_output_is_the_rendering(cli: Cli, log_dir: Path, clock: ManualClock) -> None:
    _fill(log_dir, clock)
    result = cli("consume", "k", "-p", "0")
    assert (result.code, result.err) == (0, "")
    assert result.out == _expected_lines(P0)
    with LogManager.open(log_dir, read_only=True) as manager:
        rendered = b"".join(
            render_batch(batch, raw=False, key_separator=b":").data
            for batch in manager.log("k", 0).batches(0)
        )
    assert result.out == rendered


def test_all_partitions_in_partition_order(cli: Cli, log_dir: Path, clock: ManualClock) -> None:
    _fill(log_dir, clock)
    assert cli("consume", "k").out == _expected_lines(P0) + b"other\n"
    assert cli("consume", "k", "-e").out == _expected_lines(P0) + b"other\n"


@pytest.mark.parametrize(
    ("spec", "records"),
    [
        ("beginning", P0),
        ("earliest", P0),
        ("end", []),
        ("0", P0),
        ("1", P0[1:]),  # inside the first batch
        ("4", P0[4:]),
        ("6", []),
        ("-2", P0[4:]),
        ("-4", P0[2:]),
        ("-100", P0),
        (f"@{T0 + 2}", P0[2:]),
        (f"@{T0 + 11}", P0[4:]),
        (f"@{T0 + 1000}", []),
        ("@" + datetime.fromtimestamp((T0 + 10) / 1000, UTC).isoformat(), P0[3:]),
        ("@2023-11-14T22:13:20.020Z", P0[4:]),  # T0 + 20 ms
    ],
)
def test_offset_specs(
    cli: Cli, log_dir: Path, clock: ManualClock, spec: str, records: list[tuple[bytes, bytes]]
) -> None:
    _fill(log_dir, clock)
    result = cli("consume", "k", "-p", "0", "-o", spec)
    assert (result.code, result.err) == (0, "")
    assert result.out == _expected_lines(records)


def test_time_without_zone_is_utc(cli: Cli, log_dir: Path, clock: ManualClock) -> None:
    _fill(log_dir, clock)
    naive = cli("consume", "k", "-p", "0", "-o", "@2023-11-14T22:13:20.020")
    assert naive.out == cli("consume", "k", "-p", "0", "-o", f"@{T0 + 20}").out
    assert naive.out == _expected_lines(P0[4:])


@pytest.mark.parametrize(("count", "records"), [("0", []), ("2", P0[:2]), ("4", P0[:4])])
def test_count_stops_inside_and_between_batches(
    cli: Cli, log_dir: Path, clock: ManualClock, count: str, records: list[tuple[bytes, bytes]]
) -> None:
    _fill(log_dir, clock)
    assert cli("consume", "k", "-p", "0", "-c", count).out == _expected_lines(records)


def test_count_spans_partitions(cli: Cli, log_dir: Path, clock: ManualClock) -> None:
    _fill(log_dir, clock)
    assert cli("consume", "k", "-c", "7").out == _expected_lines(P0) + b"other\n"
    assert cli("consume", "k", "-c", "100").out == _expected_lines(P0) + b"other\n"
    assert cli("consume", "k", "-c", "-1").code == 2


def test_follow_and_exit_are_exclusive(cli: Cli, log_dir: Path, clock: ManualClock) -> None:
    _fill(log_dir, clock)
    assert cli("consume", "k", "-f", "-e").code == 2


def test_json_records(cli: Cli, log_dir: Path, clock: ManualClock) -> None:
    with LogManager.open(log_dir, clock=clock) as manager:
        manager.create_topic("j", 1, {"message.timestamp.type": "LogAppendTime"})
        manager.log("j", 0).append(
            [b"caf\xc3\xa9", b"\xff\x00bin", None],
            keys=[None, b"\x80k", b"key"],
            headers=[[("h1", b"x"), ("h2", None)], [("b", b"\xfe")], []],
        )
    result = cli("consume", "j", "--format", "json")
    assert result.code == 0
    documents = [json.loads(line) for line in result.text.splitlines()]
    marker = {"base64": base64.b64encode(b"\xff\x00bin").decode()}
    assert documents == [
        {
            "topic": "j",
            "partition": 0,
            "offset": 0,
            "timestamp": clock.now_ms,
            "timestampType": "LogAppendTime",
            "key": None,
            "value": "café",
            "headers": [["h1", "x"], ["h2", None]],
        },
        {
            "topic": "j",
            "partition": 0,
            "offset": 1,
            "timestamp": clock.now_ms,
            "timestampType": "LogAppendTime",
            "key": {"base64": base64.b64encode(b"\x80k").decode()},
            "value": marker,
            "headers": [["b", {"base64": "/g=="}]],
        },
        {
            "topic": "j",
            "partition": 0,
            "offset": 2,
            "timestamp": clock.now_ms,
            "timestampType": "LogAppendTime",
            "key": "key",
            "value": None,
            "headers": [],
        },
    ]
    two = cli("consume", "j", "--format", "json", "-o", "1", "-c", "1").text.splitlines()
    assert [json.loads(line)["offset"] for line in two] == [1]


def test_control_batches_are_never_shown(cli: Cli, log_dir: Path, clock: ManualClock) -> None:
    with LogManager.open(log_dir, clock=clock) as manager:
        manager.create_topic("tx", 1)
        log = manager.log("tx", 0)
        log.append([b"before"])
        marker = build_record_batch(
            [b"\x00\x00\x00\x00\x00\x05"],
            keys=[b"\x00\x00\x00\x01"],  # version 0, COMMIT
            timestamps=T0,
            base_offset=1,
            producer_id=7,
            producer_epoch=0,
            is_transactional=True,
            is_control=True,
        )
        log.append_batches(marker, assign_offsets=False)  # as copied from a broker
        log.append([b"after"])
    assert cli("consume", "tx").out == b"before\nafter\n"
    lines = cli("consume", "tx", "--format", "json").text.splitlines()
    offsets = [json.loads(line)["offset"] for line in lines]
    assert offsets == [0, 2]
    assert cli("consume", "tx", "-o", "1").out == b"after\n"


def test_after_retention_beginning_is_the_oldest_retained(
    cli: Cli, log_dir: Path, clock: ManualClock
) -> None:
    with LogManager.open(log_dir, clock=clock) as manager:
        manager.create_topic("r", 1, {"segment.bytes": "100", "retention.bytes": "100"})
        log = manager.log("r", 0)
        for i in range(10):
            log.append([b"record %d" % i])
        assert manager.run_retention() > 0
        start = log.log_start_offset
    assert start > 0
    expected = b"".join(b"record %d\n" % i for i in range(start, 10))
    assert cli("consume", "r").out == expected
    gone = cli("consume", "r", "-o", "0")
    assert gone.code == 1
    assert f"offset 0 is out of range: the log holds [{start}, 10)" in gone.err


def _read_until(process: subprocess.Popen[bytes], expected: bytes, timeout: float = 20) -> bytes:
    assert process.stdout is not None
    fd = process.stdout.fileno()
    got = b""
    deadline = time.monotonic() + timeout
    while not got.endswith(expected) and len(got) < len(expected) + 1000:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"timed out with {got!r}, waiting for {expected!r}"
        if select.select([fd], [], [], remaining)[0]:
            chunk = os.read(fd, 65536)
            assert chunk, f"consumer exited early with {got!r}"
            got += chunk
    return got


def test_follow_sees_each_append_as_it_happens(log_dir: Path) -> None:
    with LogManager.open(log_dir) as manager:
        manager.create_topic("f", 2, {"segment.bytes": "200"})
        manager.log("f", 0).append([b"old"])
        env = {**os.environ, "SEGLOG_LOG_DIR": str(log_dir)}
        with subprocess.Popen(
            [str(SCRIPT), "consume", "f", "-f"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        ) as process:
            try:
                seen = [_read_until(process, b"old\n")]
                # Each step is appended only after the previous one was read: the
                # output shows every intermediate state, not just the final log.
                for step in range(12):
                    partition = step % 2
                    values = [b"step %d.%d" % (step, i) for i in range(3)]
                    manager.log("f", partition).append(values)
                    seen.append(_read_until(process, b"".join(v + b"\n" for v in values)))
                assert manager.log("f", 0).number_of_segments > 1  # rolls meanwhile
                assert process.poll() is None  # still following
            finally:
                process.terminate()
                process.wait(timeout=10)
    assert len(seen) == 13
    assert seen[1:] == [
        b"".join(b"step %d.%d\n" % (step, i) for i in range(3)) for step in range(12)
    ]


def test_follow_with_count_stops_when_reached(log_dir: Path) -> None:
    with LogManager.open(log_dir) as manager:
        manager.create_topic("f", 1)
        env = {**os.environ, "SEGLOG_LOG_DIR": str(log_dir)}
        with subprocess.Popen(
            [str(SCRIPT), "consume", "f", "-f", "-c", "3"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        ) as process:
            manager.log("f", 0).append([b"a", b"b"])
            first = _read_until(process, b"a\nb\n")
            assert process.poll() is None  # two of three: still following
            manager.log("f", 0).append([b"c", b"d"])
            rest, err = process.communicate(timeout=20)
    assert (process.returncode, first + rest, strip_build_notice(err)) == (0, b"a\nb\nc\n", b"")


def test_closed_pipe_ends_quietly(log_dir: Path, clock: ManualClock) -> None:
    with LogManager.open(log_dir, clock=clock) as manager:
        manager.create_topic("big", 1)
        manager.log("big", 0).append([b"x" * 1000] * 5000)
    env = {**os.environ, "SEGLOG_LOG_DIR": str(log_dir)}
    shell = subprocess.run(
        f"{SCRIPT} consume big | head -c 10 >/dev/null; echo ${{PIPESTATUS[0]}}",
        shell=True,
        executable="/bin/bash",
        capture_output=True,
        env=env,
        timeout=60,
        check=True,
    )
    assert shell.stdout == b"0\n"
    assert strip_build_notice(shell.stderr) == b""


def test_follow_ends_with_an_error_when_the_topic_is_deleted(log_dir: Path) -> None:
    with LogManager.open(log_dir) as manager:
        manager.create_topic("gone", 1)
        manager.log("gone", 0).append([b"last words"])
        env = {**os.environ, "SEGLOG_LOG_DIR": str(log_dir)}
        with subprocess.Popen(
            [str(SCRIPT), "consume", "gone", "-f"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        ) as process:
            first = _read_until(process, b"last words\n")
            manager.delete_topic("gone")
            rest, err = process.communicate(timeout=30)
    assert first + rest == b"last words\n"
    assert (process.returncode, strip_build_notice(err)) == (
        1,
        b"seglogfs consume: error: topic 'gone' was deleted\n",
    )


def test_follow_continues_while_retention_deletes_segments(log_dir: Path) -> None:
    config = {"segment.bytes": "300", "retention.bytes": "300", "file.delete.delay.ms": "0"}
    with LogManager.open(log_dir) as manager:
        manager.create_topic("r", 1, config)
        log = manager.log("r", 0)
        env = {**os.environ, "SEGLOG_LOG_DIR": str(log_dir)}
        deleted = 0
        with subprocess.Popen(
            [str(SCRIPT), "consume", "r", "-f"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        ) as process:
            try:
                seen = []
                for step in range(15):
                    values = [b"step %02d record %d" % (step, i) for i in range(4)]
                    log.append(values)
                    seen.append(_read_until(process, b"".join(v + b"\n" for v in values)))
                    deleted += manager.run_retention()
                    log.delete_expired_files()
                assert process.poll() is None
            finally:
                process.terminate()
                process.wait(timeout=10)
        assert log.log_start_offset > 0
    assert deleted >= 5  # the follower read on while segments went away under it
    assert seen == [
        b"".join(b"step %02d record %d\n" % (step, i) for i in range(4)) for step in range(15)
    ]


def test_corrupt_batch_stops_with_its_file_and_position(
    cli: Cli, log_dir: Path, clock: ManualClock
) -> None:
    with LogManager.open(log_dir, clock=clock) as manager:
        manager.create_topic("c", 1)
        manager.log("c", 0).append([b"good"])
        second = manager.log("c", 0).append([b"will be corrupted"])
    segment = log_dir / "c-0" / "00000000000000000000.log"
    data = bytearray(segment.read_bytes())
    data[-3] ^= 0x01
    segment.write_bytes(bytes(data))
    result = cli("consume", "c")
    assert result.out == b"good\n"  # what precedes the corruption is served
    assert result.code == 1
    assert result.err == (
        f"seglogfs consume: error: topic c partition 0: corrupt record in {segment} at byte "
        f"{second.position}, offset 1: CRC mismatch\n"
    )


def test_a_length_past_a_sealed_segment_stops_with_one_line_naming_it(
    cli: Cli, log_dir: Path, clock: ManualClock
) -> None:
    # Issue 17: the damaged length ran past the end of its sealed segment; consume took
    # it for an unflushed tail, went on at the next segment and exited 0.
    with LogManager.open(log_dir, clock=clock) as manager:
        manager.create_topic("t", 1, {"segment.bytes": "100000"})
        log = manager.log("t", 0)
        infos = [log.append([b"%d" % (i + k) for k in range(10)]) for i in range(0, 25_000, 10)]
        assert log.number_of_segments > 2
    bad = infos[234]
    segment = log_dir / "t-0" / "00000000000000000000.log"
    assert (bad.first_offset, bad.segment_base_offset) == (2340, 0)
    data = bytearray(segment.read_bytes())
    data[bad.position + 9] ^= 0x01  # the batch length, 64 KiB more
    segment.write_bytes(bytes(data))
    for args in (("-e",), ("-o", "2000"), ("--format", "json")):
        result = cli("consume", "t", *args)
        assert result.code == 1, args
        assert result.err == (
            f"seglogfs consume: error: topic t partition 0: corrupt record in {segment} at "
            f"byte {bad.position}, offset 2340: a batch of {bad.size + 65536} bytes runs "
            f"past the end of the segment at byte {len(data)}\n"
        )
    plain = cli("consume", "t", "-e").out
    assert plain == b"".join(b"%d\n" % i for i in range(2340))
    json_lines = cli("consume", "t", "--format", "json").out.splitlines()
    assert [json.loads(line)["offset"] for line in json_lines] == list(range(2340))

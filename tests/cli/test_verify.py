"""``seglogfs verify``: a clean log directory passes; each injected fault is reported
with its file and byte position and exit code 1."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from seglogfs.cli.verify import verify_log_dir
from seglogfs.positions import position_index_spec
from storage import LogManager
from storage.record.render import rendered_size
from tests.cli.conftest import SCRIPT, Cli, on_terminal, run_script, strip_build_notice
from tests.conftest import ManualClock

TS = 1_700_000_000_000


def _build(log_dir: Path, clock: ManualClock) -> None:
    """Two topics, several rolled segments each, indexes with many entries, retention."""
    with LogManager.open(log_dir, clock=clock) as manager:
        manager.create_topic(
            "a", 2, {"segment.bytes": "800", "index.interval.bytes": "200"}, key_separator=":"
        )
        manager.create_topic("b", 1, {"segment.bytes": "1500", "retention.bytes": "3000"})
        for i in range(60):
            manager.log("a", i % 2).append(
                [b"value %d" % i, None], keys=[b"k%d" % i, None], timestamps=[TS + i, TS + i]
            )
            manager.log("b", 0).append([b"x" * 90], timestamps=[TS + i])
        assert manager.run_retention() > 0
    assert len(list((log_dir / "a-0").glob("*.log"))) > 2


def _segments(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.log"))


def test_clean_log_dir_has_no_problems(cli: Cli, log_dir: Path, clock: ManualClock) -> None:
    _build(log_dir, clock)
    assert verify_log_dir(log_dir) == []
    result = cli("verify")
    assert (result.code, result.out) == (0, b"")
    assert result.err == f"{log_dir}: no problems found\n"
    assert cli("verify", "-q", str(log_dir)).err == ""


def test_flipped_byte_is_a_crc_problem_at_its_batch(
    cli: Cli, log_dir: Path, clock: ManualClock
) -> None:
    _build(log_dir, clock)
    segment = _segments(log_dir / "a-0")[1]
    data = bytearray(segment.read_bytes())
    second_batch = struct.unpack_from(">i", data, 8)[0] + 12
    data[second_batch + 70] ^= 0x01
    segment.write_bytes(bytes(data))
    result = cli("verify")
    assert result.code == 1
    assert result.text.startswith(f"{segment}: byte {second_batch}: CRC mismatch")
    assert result.err == f"1 problem(s) found in {log_dir}\n"
    # -q ("no progress, no summary"): the problem lines and exit 1 only.
    quiet = cli("verify", "-q")
    assert (quiet.code, quiet.out, quiet.err) == (1, result.out, "")


def test_partial_batch_in_a_sealed_segment(cli: Cli, log_dir: Path, clock: ManualClock) -> None:
    _build(log_dir, clock)
    segment = _segments(log_dir / "a-1")[0]
    size = segment.stat().st_size
    os.truncate(segment, size - 5)
    problems = [str(p) for p in verify_log_dir(log_dir)]
    last_batch_start = max(
        int(line.split(": byte ")[1].split(":")[0]) for line in problems if str(segment) in line
    )
    assert f"{segment}: byte {last_batch_start}: partial batch: " in problems[0]
    assert cli("verify").code == 1


def test_sealed_segment_cut_at_a_batch_boundary_names_its_log(
    cli: Cli, log_dir: Path, clock: ManualClock
) -> None:
    # Cut between two batches the .log frames cleanly: only its indexes (entries past
    # its end) and the next segment (a hole of offsets) would be named, not the file
    # the records went from (corruption harness, seed 10).
    _build(log_dir, clock)
    segment = _segments(log_dir / "a-0")[0]
    data = segment.read_bytes()
    first_batch = struct.unpack_from(">i", data, 8)[0] + 12
    assert first_batch < len(data)
    os.truncate(segment, first_batch)
    problems = verify_log_dir(log_dir)
    on_log = [p for p in problems if p.path == segment]
    assert len(on_log) == 1, problems
    assert on_log[0].position == first_batch
    last_offset = struct.unpack_from(">q", data, 0)[0] + struct.unpack_from(">i", data, 23)[0]
    assert on_log[0].message.startswith(
        f"the log ends after offset {last_offset} but {segment.with_suffix('.index').name}"
    ) or on_log[0].message.startswith(
        f"the log ends after offset {last_offset} but {segment.with_suffix('.timeindex').name}"
    )
    assert "cut short" in on_log[0].message
    assert {p.path.suffix for p in problems} >= {".log", ".index", ".timeindex"}
    result = cli("verify")
    assert result.code == 1
    assert f"{segment}: byte {first_batch}: the log ends after offset" in result.text


def test_partial_tail_of_the_active_segment_only_while_a_writer_runs(
    log_dir: Path, clock: ManualClock
) -> None:
    _build(log_dir, clock)
    active = _segments(log_dir / "b-0")[-1]
    with open(active, "ab") as f:
        f.write(b"\x00" * 7)  # a writer in the middle of a write looks like this
    problems = verify_log_dir(log_dir)
    assert [p.message.split(":")[0] for p in problems] == ["partial batch"]
    assert problems[0].path == active
    assert problems[0].position == active.stat().st_size - 7
    os.truncate(active, active.stat().st_size - 7)
    with LogManager.open(log_dir, clock=clock) as manager:  # takes the writer lock
        with open(active, "ab") as f:
            f.write(b"\x00" * 7)
        assert verify_log_dir(log_dir) == []
        os.truncate(active, active.stat().st_size - 7)
        assert manager.log("b", 0).log_end_offset == 60


def test_offset_index_entry_pointing_elsewhere(log_dir: Path, clock: ManualClock) -> None:
    _build(log_dir, clock)
    index = _segments(log_dir / "a-0")[0].with_suffix(".index")
    data = bytearray(index.read_bytes())
    assert len(data) >= 16
    _relative, position = struct.unpack_from(">ii", data, 8)
    struct.pack_into(">i", data, 12, position + 3)
    index.write_bytes(bytes(data))
    problems = verify_log_dir(log_dir)
    assert [(p.path, p.position) for p in problems] == [(index, 8)]
    assert "not a batch start" in problems[0].message


def test_offset_index_wrong_offset_and_odd_size(log_dir: Path, clock: ManualClock) -> None:
    _build(log_dir, clock)
    index = _segments(log_dir / "a-0")[0].with_suffix(".index")
    data = bytearray(index.read_bytes())
    relative, _position = struct.unpack_from(">ii", data, 8)
    struct.pack_into(">i", data, 8, relative - 1)
    index.write_bytes(bytes(data) + b"\x01\x02\x03")
    problems = verify_log_dir(log_dir)
    messages = {(p.position, p.message.split(",")[0]) for p in problems if p.path == index}
    assert (len(data), f"size {len(data) + 3} is not a multiple of 8-byte entries") in messages
    assert any(position == 8 and "ending at offset" in m for position, m in messages)


def test_time_index_going_back(log_dir: Path, clock: ManualClock) -> None:
    _build(log_dir, clock)
    timeindex = _segments(log_dir / "a-0")[0].with_suffix(".timeindex")
    data = bytearray(timeindex.read_bytes())
    assert len(data) >= 36
    timestamp, _relative = struct.unpack_from(">qi", data, 24)
    struct.pack_into(">q", data, 24, TS - 1)
    timeindex.write_bytes(bytes(data))
    problems = [p for p in verify_log_dir(log_dir) if p.path == timeindex]
    assert {p.position for p in problems} == {24}
    text = " | ".join(p.message for p in problems)
    assert "goes back" in text
    assert f"whose max timestamp is {timestamp}" in text


def test_checkpoints(log_dir: Path, clock: ManualClock) -> None:
    _build(log_dir, clock)
    checkpoint = log_dir / "recovery-point-offset-checkpoint"
    lines = checkpoint.read_text().splitlines()
    lines[2:] = [line for line in lines[2:] if not line.startswith("a 0 ")] + ["a 0 999"]
    checkpoint.write_text("\n".join(lines) + "\n")
    problems = verify_log_dir(log_dir)
    assert [str(p) for p in problems] == [
        f"{checkpoint}: recovery point 999 of a-0 is past its log end offset 60"
    ]
    (log_dir / "log-start-offset-checkpoint").write_text("0\n1\nnot a line\n")
    problems = verify_log_dir(log_dir)
    assert any(
        p.path == log_dir / "log-start-offset-checkpoint" and "malformed" in p.message
        for p in problems
    )


def test_segments_overlapping_their_names(log_dir: Path, clock: ManualClock) -> None:
    _build(log_dir, clock)
    second = _segments(log_dir / "a-0")[1]
    base = int(second.name[:20])
    wrong = second.with_name(f"{base - 1:020d}.log")
    second.rename(wrong)
    problems = [str(p) for p in verify_log_dir(log_dir)]
    assert f"{wrong}: the previous segment holds offsets up to {base - 1}" in problems[0]


def test_bad_segment_name_and_topics_file(log_dir: Path, clock: ManualClock) -> None:
    _build(log_dir, clock)
    stray = log_dir / "a-0" / "123.log"
    stray.write_bytes(b"")
    (log_dir / "seglog-topics.json").write_text("{not json")
    problems = {(p.path, p.message.split(":")[0]) for p in verify_log_dir(log_dir)}
    assert (stray, "segment name is not a 20-digit base offset") in problems
    assert any(path == log_dir / "seglog-topics.json" for path, _ in problems)


def _write_position_index(log_dir: Path, topic: str, partition: int) -> list[Path]:
    """Position index files as the file system keeps them (every batch indexed),
    computed here from the rendering: cumulative rendered bytes before each batch."""
    with LogManager.open(log_dir, read_only=True) as manager:
        metadata = manager.topic(topic)
        separator = metadata.key_separator.encode() if metadata.key_separator else None
        log = manager.log(topic, partition)
        units = 0
        files = []
        for segment in log.segments.values():
            entries = []
            for batch in segment.batches():
                entries.append(struct.pack(">qi", units, batch.base_offset - segment.base_offset))
                units += rendered_size(batch, raw=False, key_separator=separator)
            path = segment.path.with_suffix(".seglogpos")
            path.write_bytes(b"".join(entries))
            files.append(path)
    return files


def test_position_index_consistent_and_each_fault_found(log_dir: Path, clock: ManualClock) -> None:
    with LogManager.open(log_dir, clock=clock) as manager:
        manager.create_topic("p", 1, {"segment.bytes": "600"}, key_separator=":")
        for i in range(30):
            manager.log("p", 0).append([b"v%d" % i, None], keys=[b"k", None])
    files = _write_position_index(log_dir, "p", 0)
    assert len(files) > 2
    assert verify_log_dir(log_dir) == []

    middle = files[1]
    good = middle.read_bytes()
    broken = bytearray(good)
    struct.pack_into(">q", broken, 12, struct.unpack_from(">q", broken, 12)[0] + 1)
    middle.write_bytes(bytes(broken))
    problems = verify_log_dir(log_dir)
    assert [(p.path, p.position) for p in problems] == [(middle, 12)]
    assert "which starts at rendered byte" in problems[0].message

    shifted = bytearray(good)
    struct.pack_into(">q", shifted, 0, struct.unpack_from(">q", shifted, 0)[0] + 4)
    middle.write_bytes(bytes(shifted))
    messages = [p.message for p in verify_log_dir(log_dir) if p.path == middle]
    assert any("but the previous segment ends at" in m for m in messages)

    off_batch = bytearray(good)
    struct.pack_into(">i", off_batch, 20, struct.unpack_from(">i", off_batch, 20)[0] + 1)
    middle.write_bytes(bytes(off_batch))
    assert any(p.position == 12 and "starts no batch" in p.message for p in verify_log_dir(log_dir))
    middle.write_bytes(good)
    assert verify_log_dir(log_dir) == []


def test_progress_bar_only_on_a_terminal(log_dir: Path, clock: ManualClock) -> None:
    _build(log_dir, clock)
    env = {**os.environ, "SEGLOG_LOG_DIR": str(log_dir)}
    piped = subprocess.run(
        [str(SCRIPT), "verify"], capture_output=True, env=env, timeout=60, check=False
    )
    assert (piped.returncode, strip_build_notice(piped.stderr)) == (
        0,
        f"{log_dir}: no problems found\n".encode(),
    )
    code, _out, shown = on_terminal(log_dir, "verify", timeout=60)
    assert code == 0
    assert b"verify: 100%" in shown
    assert f"{log_dir}: no problems found".encode() in shown


@pytest.mark.slow
def test_verify_beside_a_writer_finds_nothing(log_dir: Path) -> None:
    config = {
        "segment.bytes": "20000",
        "index.interval.bytes": "500",
        "retention.bytes": "100000",
        "file.delete.delay.ms": "0",
    }
    with LogManager.open(log_dir, extension=position_index_spec) as manager:
        manager.create_topic("w", 2, config)
        stop = threading.Event()
        appended = [0]
        deleted = [0]

        def write() -> None:
            while not stop.is_set():
                manager.log("w", appended[0] % 2).append([b"z" * 100] * 20)
                appended[0] += 1
                if appended[0] % 20 == 0:
                    deleted[0] += manager.run_retention()
                    for log in manager.logs():
                        log.delete_expired_files()

        writer = threading.Thread(target=write)
        writer.start()
        try:
            runs = [
                subprocess.run(
                    [str(SCRIPT), "verify", "-q", str(log_dir)],
                    capture_output=True,
                    timeout=60,
                    check=False,
                )
                for _ in range(3)
            ]
        finally:
            stop.set()
            writer.join()
        rolled = manager.log("w", 0).number_of_segments
    assert [(r.returncode, r.stdout, strip_build_notice(r.stderr)) for r in runs] == [
        (0, b"", b"")
    ] * 3
    # The writer appended, rolled and deleted segments while verify read them.
    assert appended[0] > 50
    assert rolled > 1
    assert deleted[0] > 0
    assert verify_log_dir(log_dir) == []


def test_copy_of_a_kafka_broker_dir_verifies(log_dir: Path) -> None:
    """Segments from kafka-python's builders (v0, v1 gzip, v2 zstd), no index files, and
    the broker's own files beside them: nothing to report; a flipped byte is reported."""
    from kafka.record.default_records import DefaultRecordBatchBuilder
    from kafka.record.legacy_records import LegacyRecordBatchBuilder

    v0 = LegacyRecordBatchBuilder(magic=0, compression_type=0, batch_size=1 << 20)
    v0.append(0, timestamp=None, key=None, value=b"zero")
    v1 = LegacyRecordBatchBuilder(magic=1, compression_type=1, batch_size=1 << 20)
    for i in range(3):
        v1.append(i, timestamp=TS + i, key=b"k", value=b"gzip %d" % i)
    v1_set = bytearray(v1.build())
    struct.pack_into(">q", v1_set, 0, 3)  # the wrapper carries its last inner offset
    v2 = DefaultRecordBatchBuilder(
        magic=2, compression_type=4, is_transactional=False, producer_id=-1,
        producer_epoch=-1, base_sequence=-1, batch_size=1 << 20,
    )  # fmt: skip
    for i in range(4):
        v2.append(i, timestamp=TS + 10 + i, key=None, value=b"zstd %d" % i * 30, headers=[])
    v2_set = bytearray(v2.build())
    struct.pack_into(">q", v2_set, 0, 4)
    partition = log_dir / "events-0"
    partition.mkdir()
    segment = partition / "00000000000000000000.log"
    segment.write_bytes(bytes(v0.build()) + bytes(v1_set) + bytes(v2_set))
    (partition / "leader-epoch-checkpoint").write_text("0\n1\n0 0\n")
    (partition / "partition.metadata").write_text("version: 0\ntopic_id: AAAAAAAAAAAAAAAAAAAAAA\n")
    (log_dir / "meta.properties").write_text("version=1\nnode.id=1\n")
    (log_dir / "recovery-point-offset-checkpoint").write_text("0\n1\nevents 0 8\n")
    assert verify_log_dir(log_dir) == []
    data = bytearray(segment.read_bytes())
    data[-3] ^= 0x10
    segment.write_bytes(bytes(data))
    problems = verify_log_dir(log_dir)
    position = len(data) - len(v2_set)
    assert [(p.path, p.position) for p in problems] == [(segment, position)]
    assert problems[0].message.startswith("CRC mismatch")


def test_directory_with_an_invalid_topic_name(log_dir: Path, clock: ManualClock) -> None:
    _build(log_dir, clock)
    stray = log_dir / "not a topic-0"
    stray.mkdir()
    problems = verify_log_dir(log_dir)
    assert [(p.path, p.message.split(":")[0]) for p in problems] == [
        (stray, "not a partition directory")
    ]


def test_verify_command_is_clean_on_empty_topics(log_dir: Path) -> None:
    """Issue #16 (8): entry 0 of the position index of every empty segment (a new
    topic's) was reported as naming an offset that starts no batch, exit 1."""
    env = {"SEGLOG_LOG_DIR": str(log_dir)}
    for args in (
        ("t", "--partitions", "2"),
        ("r", "--format", "raw"),
        ("k", "--key-separator", ":"),
    ):
        assert run_script("topics", "create", *args, env=env).code == 0
    verified = run_script("verify", str(log_dir), env=env)
    assert (verified.code, verified.text, verified.err) == (
        0, "", f"{log_dir}: no problems found\n",
    )  # fmt: skip


def _open(log_dir: Path, clock: ManualClock) -> LogManager:
    return LogManager.open(log_dir, clock=clock, extension=position_index_spec)


def _values(n: int) -> list[bytes]:
    return [b"value %d" % i for i in range(n)]


def _time_roll(log_dir: Path, clock: ManualClock) -> Iterator[None]:
    with _open(log_dir, clock) as manager:
        manager.create_topic("t", 2, {"segment.ms": "60000"}, key_separator=":")
        manager.log("t", 0).append(_values(5), keys=[b"k"] * 5)
        clock.advance(60_001)
        assert manager.roll_due_segments() == 1  # t-0 rolls; the empty t-1 does not
        yield  # the new active segment is empty
        manager.log("t", 0).append(_values(3))
        clock.advance(60_001)
        assert manager.roll_due_segments() == 1
        yield
    yield


def _retention(log_dir: Path, clock: ManualClock) -> Iterator[None]:
    config = {"segment.bytes": "300", "retention.ms": "60000", "file.delete.delay.ms": "1000"}
    with _open(log_dir, clock) as manager:
        manager.create_topic("t", 1, config)
        manager.create_topic("s", 1, {"segment.bytes": "300", "retention.bytes": "600"})
        for value in _values(40):
            manager.log("t", 0).append([value], timestamps=[clock.now_ms])
            manager.log("s", 0).append([value])
        assert manager.run_retention() > 0  # by size
        yield  # .deleted files waiting for file.delete.delay.ms
        clock.advance(60_001)
        assert manager.run_retention() > 0  # every segment of t: the log rolled first
        yield
        clock.advance(1000)
        assert manager.delete_expired_files() > 0
        yield
    yield


def _delete_records(log_dir: Path, clock: ManualClock) -> Iterator[None]:
    with _open(log_dir, clock) as manager:
        manager.create_topic("t", 3, {"segment.bytes": "300", "file.delete.delay.ms": "0"})
        for partition in range(3):
            for value in _values(40):
                manager.log("t", partition).append([value])
        manager.log("t", 0).advance_log_start_offset(17)  # inside a segment
        base = manager.log("t", 1).segments.base_offsets()[2]
        manager.log("t", 1).advance_log_start_offset(base)  # at a segment start
        manager.log("t", 2).advance_log_start_offset(40)  # the log end
        yield
        assert manager.run_retention() > 0
        yield
        manager.log("t", 2).append(_values(2))
        yield
    yield


def _deleted_and_created_again(log_dir: Path, clock: ManualClock) -> Iterator[None]:
    config = {"segment.bytes": "300", "retention.bytes": "600", "file.delete.delay.ms": "0"}
    with _open(log_dir, clock) as manager:
        manager.create_topic("t", 2, config)
        manager.create_topic("gone", 1)
        for value in _values(40):
            manager.log("t", 0).append([value])
            manager.log("gone", 0).append([value])
        assert manager.run_retention() > 0  # checkpoints log start offsets above 0
        manager.delete_topic("gone")
        yield
        manager.delete_topic("t")
        yield
        manager.create_topic("t", 1)
        yield  # the checkpoints must not name the old t-0's offsets
        manager.log("t", 0).append(_values(2))
        yield
    yield


def _crash_and_recovery(log_dir: Path, clock: ManualClock) -> Iterator[None]:
    writer = """
import os, sys
from seglogfs.positions import position_index_spec
from storage import LogManager
manager = LogManager.open(sys.argv[1], extension=position_index_spec)
manager.create_topic("t", 2, {"segment.bytes": "400", "retention.bytes": "800"})
manager.create_topic("empty", 1)
for i in range(100):
    manager.log("t", i % 2).append([b"line %d" % i] * 3)
    if i % 25 == 0:
        manager.run_retention()
os._exit(9)
"""
    run = subprocess.run(
        [sys.executable, "-c", writer, str(log_dir)], capture_output=True, timeout=60, check=False
    )
    assert run.returncode == 9, run.stderr
    yield  # as the killed writer left it: preallocated indexes, no checkpoint since
    with _open(log_dir, clock):
        yield  # recovered
    yield


def _restarted_at_log_start(log_dir: Path, clock: ManualClock) -> Iterator[None]:
    with _open(log_dir, clock) as manager:
        manager.create_topic("t", 1)
        manager.log("t", 0).append(_values(5))
        manager.log("t", 0).advance_log_start_offset(5)
    # The tail below the checkpointed log start offset was lost in a crash.
    os.truncate(log_dir / "t-0" / "00000000000000000000.log", 0)
    (log_dir / ".kafka_cleanshutdown").unlink()
    with _open(log_dir, clock) as manager:
        assert manager.log("t", 0).log_end_offset == 5
        yield
    yield


def _formats_and_truncation(log_dir: Path, clock: ManualClock) -> Iterator[None]:
    with _open(log_dir, clock) as manager:
        manager.create_topic("f", 1)
        manager.set_topic_rendering("f", "raw", None)
        manager.create_topic("t", 1, {"segment.bytes": "300"}, key_separator=":")
        for i, value in enumerate(_values(40)):
            manager.log("t", 0).append([value], keys=[b"k" if i % 2 else None])
        yield
        manager.log("t", 0).truncate_to(manager.log("t", 0).segments.base_offsets()[1])
        yield
        manager.log("t", 0).truncate_to(0)
        yield
    yield


@pytest.mark.parametrize(
    "states",
    [
        _time_roll,
        _retention,
        _delete_records,
        _deleted_and_created_again,
        _crash_and_recovery,
        _restarted_at_log_start,
        _formats_and_truncation,
    ],
)
def test_every_state_the_engine_leaves_verifies_clean(
    log_dir: Path,
    clock: ManualClock,
    states: Callable[[Path, ManualClock], Iterator[None]],
) -> None:
    """Issue #16 (8): ``verify`` must find nothing in any state the engine leaves, with
    its writer open (each step) and after it closed (the last)."""
    for step, _ in enumerate(states(log_dir, clock)):
        assert [str(p) for p in verify_log_dir(log_dir)] == [], f"after step {step}"


def test_a_wrong_first_position_entry_is_still_reported(log_dir: Path, clock: ManualClock) -> None:
    """Entry 0 of a position index names the segment's start, batch or not; what is
    checked of it still reports a real inconsistency."""
    with _open(log_dir, clock) as manager:
        manager.create_topic("t", 1, {"segment.ms": "60000"})
        manager.log("t", 0).append(_values(3))
        clock.advance(60_001)
        assert manager.roll_due_segments() == 1
        end = manager.log("t", 0).extension_end
    empty = log_dir / "t-0" / "00000000000000000003.seglogpos"
    assert empty.read_bytes() == struct.pack(">qi", end, 0)
    assert verify_log_dir(log_dir) == []

    empty.write_bytes(struct.pack(">qi", end + 1, 0))
    assert [(p.path, p.position, p.message) for p in verify_log_dir(log_dir)] == [
        (empty, 0, f"segment starts at position {end + 1}, but the previous segment ends at {end}")
    ]
    empty.write_bytes(struct.pack(">qi", end, 1))
    assert [(p.path, p.position, p.message) for p in verify_log_dir(log_dir)] == [
        (empty, 0, "entry 0 does not name the segment's base offset")
    ]
    # A second entry in a segment without batches names an offset that starts none.
    empty.write_bytes(struct.pack(">qiqi", end, 0, end + 9, 1))
    assert [(p.path, p.position, p.message) for p in verify_log_dir(log_dir)] == [
        (empty, 12, "entry names offset 4, which starts no batch")
    ]
    empty.write_bytes(struct.pack(">qi", end, 0))
    assert verify_log_dir(log_dir) == []
    # The oldest segment starts at 0 when it is the log's first, else where its start
    # checkpoint (written before retention deleted what came before) says.
    first = log_dir / "t-0" / "00000000000000000000.seglogpos"
    good = first.read_bytes()
    first.write_bytes(struct.pack(">q", 5) + good[8:])
    assert (first, 0, "segment starts at position 5, but no record comes before offset 0") in [
        (p.path, p.position, p.message) for p in verify_log_dir(log_dir)
    ]
    first.write_bytes(good)
    with _open(log_dir, clock) as manager:
        manager.alter_topic_config("t", {"retention.bytes": "0", "file.delete.delay.ms": "0"})
        assert manager.run_retention() == 1
    checkpoint = log_dir / "t-0" / "seglogpos-start-checkpoint"
    assert checkpoint.read_text() == f"0\n3 {end}\n"
    assert verify_log_dir(log_dir) == []
    checkpoint.write_text(f"0\n3 {end - 1}\n")
    assert [(p.path, p.position, p.message) for p in verify_log_dir(log_dir)] == [
        (empty, 0, f"segment starts at position {end}, but {checkpoint.name} says {end - 1}")
    ]
    checkpoint.write_text("0\n3\n")
    problems = verify_log_dir(log_dir)
    assert [(p.path, p.position) for p in problems] == [(checkpoint, None)]
    assert problems[0].message.startswith(f"malformed checkpoint file {checkpoint}, line 2: ")


def test_a_last_batch_after_an_unconfirmed_gap_of_a_crashed_log(log_dir: Path) -> None:
    # Found by test_corruption (seed 26): the active segment's only batch, its base
    # offset damaged upwards (outside the CRC), in a log without a clean-shutdown marker:
    # readers hide it and recovery cuts it, and verify reported nothing.
    with LogManager.open(log_dir) as manager:
        manager.create_topic("t", 1)
        log = manager.log("t", 0)
        for i in range(10):
            log.append([b"record %d" % i])
        log.roll()
        log.append([b"after the roll"])
    active = log_dir / "t-0" / "00000000000000000010.log"
    data = bytearray(active.read_bytes())
    data[7] ^= 0x10  # the base offset's last byte: 10 -> 26
    active.write_bytes(data)
    expected = (
        f"{active}: byte 0: batch offsets 26..26 leave out offsets 10..25 and no batch "
        "after it confirms the gap (its base offset may be damaged): recovery cuts it"
    )
    # After a clean shutdown (its end past the recovery point 11) and after a crash.
    for marker in (True, False):
        if not marker:
            (log_dir / ".kafka_cleanshutdown").unlink()
        assert expected in [str(p) for p in verify_log_dir(log_dir)]
        with LogManager.open(log_dir, read_only=True) as reader:
            served = [r.value for r in reader.log("t", 0).records(0)]
        assert served == [b"record %d" % i for i in range(10)]  # readers: hidden

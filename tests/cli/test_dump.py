"""``seglogfs dump``: Kafka's DumpLogSegments lines for segments written here and for
segments built by kafka-python (an independent implementation of Kafka's format)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.legacy_records import LegacyRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords

from storage import LogManager, build_record_batch
from tests.cli.conftest import Cli
from tests.conftest import ManualClock

TS = 1_700_000_000_000

# The v2 example of KAFKA-FORMAT.md: base offset 100, leader epoch 0, 3 records.
EXAMPLE_V2 = bytes.fromhex(
    "0000000000000064 00000058 00000000 02 b8c7db42 0000 00000002 0000018bcfe56800"
    " 0000018bcfe56802 ffffffffffffffff ffff ffffffff 00000003"
    " 22 00 00 00 04 6b30 0a 68656c6c6f 02 02 68 02 78"
    " 16 00 02 02 01 0a 776f726c64 00"
    " 10 00 04 04 04 6b32 01 00"
)
# The v1 example: offset 7, key "k", value "hello".
EXAMPLE_V1 = bytes.fromhex(
    "0000000000000007 0000001c aa1f6779 01 00 0000018bcfe56800 00000001 6b 00000005 68656c6c6f"
)


def _segment(directory: Path, base: int, data: bytes) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{base:020d}.log"
    path.write_bytes(data)
    return path


def test_v2_example_shallow_deep_and_data(cli: Cli, tmp_path: Path) -> None:
    path = _segment(tmp_path / "t-0", 100, EXAMPLE_V2)
    batch = (
        "baseOffset: 100 lastOffset: 102 count: 3 baseSequence: -1 lastSequence: -1 "
        "producerId: -1 producerEpoch: -1 partitionLeaderEpoch: 0 isTransactional: false "
        "isControl: false deleteHorizonMs: OptionalLong.empty position: 0 "
        "CreateTime: 1700000000002 size: 100 magic: 2 compresscodec: none crc: 3100105538 "
        "isvalid: true"
    )
    head = f"Dumping {path}\nLog starting offset: 100\n{batch}\n"
    assert cli("dump", str(path)).text == head
    records = [
        "| offset: 100 CreateTime: 1700000000000 keySize: 2 valueSize: 5 sequence: -1 "
        "headerKeys: [h]",
        "| offset: 101 CreateTime: 1700000000001 keySize: -1 valueSize: 5 sequence: -1 "
        "headerKeys: []",
        "| offset: 102 CreateTime: 1700000000002 keySize: 2 valueSize: -1 sequence: -1 "
        "headerKeys: []",
    ]
    deep = cli("dump", "--deep-iteration", str(path))
    assert deep.text == head + "".join(line + "\n" for line in records)
    assert deep.err == ""
    data = [" key: k0 payload: hello", " payload: world", " key: k2"]
    printed = cli("dump", "--print-data-log", str(path))
    assert printed.text == head + "".join(r + d + "\n" for r, d in zip(records, data, strict=True))
    skipped = cli("dump", "--print-data-log", "--skip-record-metadata", str(path)).text
    assert skipped == head + "| key: k0 payload: hello\n payload: world\n| key: k2\n"


def test_v1_example_and_kafka_python_legacy_sets(cli: Cli, tmp_path: Path) -> None:
    wrapper = LegacyRecordBatchBuilder(magic=1, compression_type=1, batch_size=1 << 20)
    for i in range(3):
        wrapper.append(i, timestamp=TS + 10 + i, key=b"k" if i else None, value=b"v%d" % i)
    gzip_set = bytearray(wrapper.build())
    struct.pack_into(">q", gzip_set, 0, 10)  # absolute offset of the last inner message
    v0 = LegacyRecordBatchBuilder(magic=0, compression_type=0, batch_size=1 << 20)
    v0.append(11, timestamp=None, key=None, value=b"zero")
    v0_set = bytes(v0.build())
    path = _segment(tmp_path / "t-0", 7, EXAMPLE_V1 + bytes(gzip_set) + v0_set)

    parsed = MemoryRecords(bytes(gzip_set)).next_batch()
    inner = list(parsed)
    assert parsed is not None
    wrapper_crc = parsed._crc
    text = cli("dump", "--print-data-log", str(path)).text
    size_v1, size_gzip, size_v0 = len(EXAMPLE_V1), len(gzip_set), len(v0_set)
    expected = [
        f"Dumping {path}",
        "Log starting offset: 7",
        "offset: 7 position: 0 CreateTime: 1700000000000 size: 40 magic: 1 "
        "compresscodec: none crc: 2854184825 isvalid: true",
        "| offset: 7 CreateTime: 1700000000000 keySize: 1 valueSize: 5 isValid: true "
        "crc: 2854184825} key: k payload: hello",
        # A wrapper's max timestamp is its own timestamp field (kafka-python writes 0).
        f"offset: 10 position: {size_v1} CreateTime: {parsed._timestamp} size: {size_gzip} "
        "magic: 1 "
        f"compresscodec: gzip crc: {wrapper_crc} isvalid: true",
        *(
            f"| offset: {8 + i} CreateTime: {TS + 10 + i} keySize: {-1 if i == 0 else 1} "
            f"valueSize: 2 isValid: true crc: {inner[i].checksum}}}"
            + ("" if i == 0 else " key: k")
            + f" payload: v{i}"
            for i in range(3)
        ),
        f"offset: 11 position: {size_v1 + size_gzip} NoTimestampType: -1 size: {size_v0} "
        f"magic: 0 compresscodec: none crc: {MemoryRecords(v0_set).next_batch()._crc} "
        "isvalid: true",
        f"| offset: 11 NoTimestampType: -1 keySize: -1 valueSize: 4 isValid: true "
        f"crc: {next(iter(MemoryRecords(v0_set).next_batch())).checksum}}} payload: zero",
    ]
    assert text.splitlines() == expected


def test_kafka_python_v2_codecs_and_producer_fields(cli: Cli, tmp_path: Path) -> None:
    parts = []
    offset = 0
    for codec in (0, 1, 2, 3, 4):
        builder = DefaultRecordBatchBuilder(
            magic=2, compression_type=codec, is_transactional=False, producer_id=42,
            producer_epoch=3, base_sequence=2147483646, batch_size=1 << 20,
        )  # fmt: skip
        for i in range(3):
            builder.append(
                i,
                timestamp=TS + i,
                key=None,
                value=b"c%d-%d " % (codec, i) * 50,  # compressible: kafka-python compresses
                headers=[("a", b"1")],
            )
        raw = bytearray(builder.build())
        struct.pack_into(">q", raw, 0, offset)
        parts.append(bytes(raw))
        offset += 3
    path = _segment(tmp_path / "t-0", 0, b"".join(parts))
    lines = cli("dump", "--deep-iteration", str(path)).text.splitlines()
    batches = [line for line in lines if line.startswith("baseOffset")]
    codecs = [line.split("compresscodec: ")[1].split()[0] for line in batches]
    assert codecs == ["none", "gzip", "snappy", "lz4", "zstd"]
    for line, raw_batch in zip(batches, parts, strict=True):
        crc = struct.unpack_from(">I", raw_batch, 17)[0]
        assert f"crc: {crc} isvalid: true" in line
        # lastSequence wraps past int32 as Kafka's DefaultRecordBatch.incrementSequence.
        assert "baseSequence: 2147483646 lastSequence: 0 producerId: 42 producerEpoch: 3" in line
    sequences = [line.split("sequence: ")[1].split()[0] for line in lines if line.startswith("|")]
    assert sequences == ["2147483646", "2147483647", "0"] * 5


def test_segments_written_here_with_indexes(cli: Cli, log_dir: Path, clock: ManualClock) -> None:
    with LogManager.open(log_dir, clock=clock) as manager:
        manager.create_topic("t", 1, {"index.interval.bytes": "100"})
        log = manager.log("t", 0)
        positions = []
        for i in range(20):
            info = log.append([b"x" * 60, b"y" * 60], timestamps=[TS + 2 * i, TS + 2 * i + 1])
            positions.append((info.position, info.last_offset))
    directory = log_dir / "t-0"
    index = directory / "00000000000000000000.index"
    result = cli("dump", str(index))
    lines = result.text.splitlines()
    assert lines[0] == f"Dumping {index}"
    entries = [tuple(int(x) for x in line.split()[1::2]) for line in lines[1:]]
    assert len(entries) >= 10
    # Every entry names a batch by its last offset and points at its start.
    by_position = {p: last for p, last in positions}
    assert all(by_position[position] == offset for offset, position in entries)
    assert result.err == ""
    verified = cli("dump", "--verify-index-only", str(index))
    assert (verified.text, verified.err) == (f"Dumping {index}\n", "")
    timeindex = directory / "00000000000000000000.timeindex"
    times = cli("dump", str(timeindex))
    assert times.err == ""
    time_entries = [
        tuple(int(x) for x in line.split()[1::2]) for line in times.text.splitlines()[1:]
    ]
    assert time_entries
    assert all(ts == TS + offset for ts, offset in time_entries)  # ts of the batch's last record
    sane = cli("dump", "--index-sanity-check", str(index), str(timeindex))
    assert sane.text == (
        f"Dumping {index}\n{index} passed sanity check.\n"
        f"Dumping {timeindex}\n{timeindex} passed sanity check.\n"
    )


def test_index_and_time_index_mismatches_go_to_stderr(
    cli: Cli, log_dir: Path, clock: ManualClock
) -> None:
    with LogManager.open(log_dir, clock=clock) as manager:
        manager.create_topic("t", 1, {"index.interval.bytes": "100"})
        for i in range(10):
            manager.log("t", 0).append([b"x" * 200], timestamps=[TS + i])
    directory = log_dir / "t-0"
    index = directory / "00000000000000000000.index"
    data = bytearray(index.read_bytes())
    relative, _position = struct.unpack_from(">ii", data, 8)
    struct.pack_into(">i", data, 8, relative + 1)  # entry 1 now names the wrong offset
    index.write_bytes(bytes(data))
    result = cli("dump", "--verify-index-only", str(index))
    assert result.text == f"Dumping {index}\n"
    assert result.err == (
        f"Mismatches in :{index.absolute()}\n"
        f"  Index offset: {relative + 1}, log offset: {relative}\n"
    )
    timeindex = directory / "00000000000000000000.timeindex"
    data = bytearray(timeindex.read_bytes())
    last = len(data) - 12  # the last entry: raising it breaks no ordering
    timestamp, time_relative = struct.unpack_from(">qi", data, last)
    struct.pack_into(">q", data, last, timestamp + 5)
    timeindex.write_bytes(bytes(data))
    times = cli("dump", str(timeindex))
    assert f"timestamp: {timestamp + 5} offset: {time_relative}" in times.text
    assert times.err == (
        f"Found timestamp mismatch in :{timeindex.absolute()}\n"
        f"  Index timestamp: {timestamp + 5}, log timestamp: {timestamp}\n"
    )


def test_gaps_trailing_bytes_and_bad_files(cli: Cli, tmp_path: Path) -> None:
    first = build_record_batch([b"a", b"b"], timestamps=TS, base_offset=0)
    # Compaction leaves gaps: the next batch starts at 5.
    second = build_record_batch([b"c"], timestamps=TS, base_offset=5)
    path = _segment(tmp_path / "t-0", 0, first + second + second[:20])
    result = cli("dump", "--deep-iteration", str(path))
    assert result.text.endswith("Found 20 invalid bytes at the end of 00000000000000000000.log\n")
    assert result.err == (
        f"Non-consecutive offsets in {path.absolute()}\n  1 is followed by 5\n"
        f"{path.absolute()}: byte {len(first + second)} (after offset 5): a batch of "
        f"{len(second)} bytes runs past the end of the file; 20 bytes cannot be read as "
        "batches\n"
    )
    corrupt = bytearray(first)
    corrupt[-1] ^= 0xFF
    bad = _segment(tmp_path / "u-0", 0, bytes(corrupt))
    assert "isvalid: false" in cli("dump", str(bad)).text
    odd = tmp_path / "u-0" / "00000000000000000000.index"
    odd.write_bytes(b"\x00" * 9 + b"\x01" * 8)
    insane = cli("dump", "--index-sanity-check", str(odd))
    assert insane.code == 1
    assert "found 17 bytes which is neither positive nor a multiple of 8" in insane.err
    other = tmp_path / "notes.txt"
    other.write_text("x")
    ignored = cli("dump", str(other))
    assert (ignored.code, ignored.err) == (0, f"Ignoring unknown file {other}\n")


def test_files_option_like_kafka(cli: Cli, tmp_path: Path) -> None:
    a = _segment(tmp_path / "t-0", 100, EXAMPLE_V2)
    b = _segment(tmp_path / "t-1", 7, EXAMPLE_V1)
    text = cli("dump", "--files", f"{a},{b}").text
    assert [line for line in text.splitlines() if line.startswith("Dumping")] == [
        f"Dumping {a}",
        f"Dumping {b}",
    ]


def test_control_batch_shows_the_marker(cli: Cli, tmp_path: Path) -> None:
    marker = build_record_batch(
        [b"\x00\x00\x00\x00\x00\x05"],  # version 0, coordinator epoch 5
        keys=[b"\x00\x00\x00\x01"],  # version 0, COMMIT
        timestamps=TS,
        producer_id=9,
        producer_epoch=1,
        is_transactional=True,
        is_control=True,
    )
    path = _segment(tmp_path / "t-0", 0, marker)
    lines = cli("dump", "--print-data-log", str(path)).text.splitlines()
    assert "isTransactional: true isControl: true" in lines[2]
    assert lines[3] == (
        f"| offset: 0 CreateTime: {TS} keySize: 4 valueSize: 6 sequence: -1 headerKeys: [] "
        "endTxnMarker: COMMIT coordinatorEpoch: 5"
    )


@pytest.mark.parametrize("name", ["00000000000000000000.txnindex"])
def test_txnindex(cli: Cli, tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    path.write_bytes(struct.pack(">hqqqq", 0, 42, 10, 20, 15))
    assert cli("dump", str(path)).text == (
        f"Dumping {path}\nversion: 0 producerId: 42 firstOffset: 10 lastOffset: 20 "
        "lastStableOffset: 15\n"
    )


def test_max_message_size_bounds_the_read_at_an_index_entry(
    cli: Cli, log_dir: Path, clock: ManualClock
) -> None:
    with LogManager.open(log_dir, clock=clock) as manager:
        manager.create_topic("t", 1, {"index.interval.bytes": "100"})
        for i in range(5):
            manager.log("t", 0).append([b"x" * 500], timestamps=[TS + i])
    index = log_dir / "t-0" / "00000000000000000000.index"
    assert cli("dump", "--verify-index-only", str(index)).err == ""
    # A 100-byte window cannot hold a 570-byte batch: no batch found at the entries.
    small = cli("dump", "--verify-index-only", "--max-message-size", "100", str(index))
    assert small.err.startswith(f"Mismatches in :{index.absolute()}\n")
    assert "log offset: -1" in small.err


def test_a_damaged_length_says_where_the_batches_stop(cli: Cli, tmp_path: Path) -> None:
    # Kafka's "Found N invalid bytes at the end" is printed for a length damaged in the
    # middle of a sealed segment too: stderr says at which byte, after which offset.
    batches = [build_record_batch([b"v%d" % i], timestamps=TS, base_offset=i) for i in range(6)]
    data = bytearray(b"".join(batches))
    bad = sum(map(len, batches[:3]))
    data[bad + 9] ^= 0x01  # the length of the batch of offset 3, 64 KiB more
    path = _segment(tmp_path / "t-0", 0, bytes(data))
    result = cli("dump", str(path))
    assert result.code == 0  # as kafka-dump-log.sh
    assert result.text.endswith(
        f"Found {len(data) - bad} invalid bytes at the end of 00000000000000000000.log\n"
    )
    assert result.err == (
        f"{path.absolute()}: byte {bad} (after offset 2): a batch of "
        f"{len(batches[3]) + 65536} bytes runs past the end of the file; {len(data) - bad} "
        "bytes cannot be read as batches\n"
    )
    short = _segment(tmp_path / "u-0", 0, b"".join(batches) + b"\x00" * 5)
    assert cli("dump", str(short)).err == (
        f"{short.absolute()}: byte {len(data)} (after offset 5): fewer bytes than a batch "
        "header; 5 bytes cannot be read as batches\n"
    )

"""Whole segment files against kafka-python's independent reader and writer.

Segments written here parse batch by batch in kafka-python (``MemoryRecords``) with
valid CRCs; a segment assembled from kafka-python's builders (v0, v1, v2, several
codecs), with no index files, opens here as a Kafka log directory would.
"""

from __future__ import annotations

import struct
from pathlib import Path

from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.legacy_records import LegacyRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords

from storage import LogManager, TimestampType
from tests.conftest import ManualClock

TS = 1_700_000_000_000


def test_segments_written_here_parse_in_kafka_python(log_dir: Path, clock: ManualClock) -> None:
    expected: list[tuple[int, bytes | None, bytes | None]] = []
    with LogManager.open(log_dir, clock=clock) as manager:
        manager.create_topic("t", 1)
        log = manager.log("t", 0)
        for codec in ["uncompressed", "gzip", "snappy", "lz4", "zstd"]:
            manager.alter_topic_config("t", {"compression.type": codec})
            keys = [b"k%d" % i if i % 2 else None for i in range(50)]
            vals = [b"%s value %d" % (codec.encode(), i) * 3 for i in range(50)]
            info = log.append(vals, keys=keys, headers=[(("h", b"v"),)] * 50)
            expected += [
                (info.first_offset + i, k, v)
                for i, (k, v) in enumerate(zip(keys, vals, strict=True))
            ]
    data = (log_dir / "t-0" / "00000000000000000000.log").read_bytes()
    records = MemoryRecords(data)
    got = []
    batches = 0
    while (batch := records.next_batch()) is not None:
        assert batch.validate_crc()
        batches += 1
        got += [(r.offset, r.key, r.value) for r in batch]
        assert all(list(r.headers) == [("h", b"v")] for r in batch)
    assert batches == 5
    assert got == expected


def _v2(offset: int, codec: int, values: list[bytes]) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=codec, is_transactional=False, producer_id=-1,
        producer_epoch=-1, base_sequence=-1, batch_size=1 << 20,
    )  # fmt: skip
    for i, value in enumerate(values):
        builder.append(i, timestamp=TS + offset + i, key=b"key", value=value, headers=[])
    raw = bytearray(builder.build())
    struct.pack_into(">q", raw, 0, offset)
    return bytes(raw)


def _legacy(magic: int, codec: int, first_offset: int, values: list[bytes]) -> bytes:
    builder = LegacyRecordBatchBuilder(magic=magic, compression_type=codec, batch_size=1 << 20)
    for i, value in enumerate(values):
        # Uncompressed: absolute offsets. Compressed v1: relative inner offsets.
        offset = i if codec else first_offset + i
        builder.append(offset, timestamp=TS + first_offset + i, key=None, value=value)
    raw = bytearray(builder.build())
    if codec:
        # A broker gives the wrapper the absolute offset of its last inner message.
        struct.pack_into(">q", raw, 0, first_offset + len(values) - 1)
    return bytes(raw)


def test_kafka_python_segment_opens_as_a_log(log_dir: Path, clock: ManualClock) -> None:
    segment = b"".join(
        [
            _legacy(0, 0, 0, [b"v0-a", b"v0-b"]),
            _legacy(1, 0, 2, [b"v1-a", b"v1-b"]),
            _legacy(1, 1, 4, [b"v1-gzip-%d" % i * 20 for i in range(3)]),
            _v2(7, 4, [b"v2-zstd-%d" % i * 20 for i in range(3)]),
            _v2(10, 2, [b"v2-snappy-%d" % i * 20 for i in range(2)]),
        ]
    )
    partition = log_dir / "legacy-0"
    partition.mkdir()
    (partition / "00000000000000000000.log").write_bytes(segment)
    expected = (
        [b"v0-a", b"v0-b", b"v1-a", b"v1-b"]
        + [b"v1-gzip-%d" % i * 20 for i in range(3)]
        + [b"v2-zstd-%d" % i * 20 for i in range(3)]
        + [b"v2-snappy-%d" % i * 20 for i in range(2)]
    )
    with LogManager.open(log_dir, read_only=True) as reader:
        log = reader.log("legacy", 0)
        records = list(log.records(0))
        assert [r.offset for r in records] == list(range(12))
        assert [r.value for r in records] == expected
        assert records[0].timestamp_type is TimestampType.NO_TIMESTAMP_TYPE
        assert records[2].timestamp == TS + 2
        assert log.log_end_offset == 12
        assert [r.value for r in log.records(8)] == expected[8:]
    assert sorted(p.name for p in partition.iterdir()) == ["00000000000000000000.log"]
    with LogManager.open(log_dir, clock=clock) as manager:
        log = manager.log("legacy", 0)
        assert log.append([b"new"]).first_offset == 12
        assert [r.value for r in log.records(0)] == [*expected, b"new"]

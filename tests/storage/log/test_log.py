"""The partition log: append, read, index placement, roll, retention, reopen."""

from __future__ import annotations

import itertools
import os
import struct
from pathlib import Path

import crc32c
import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.legacy_records import LegacyRecordBatchBuilder

from storage import (
    CompressionType,
    InvalidRecordError,
    Log,
    LogConfig,
    OffsetOutOfRangeError,
    ReadOnlyLogError,
    RecordTooLargeError,
    TimestampType,
)
from storage.errors import CorruptRecordError, SegmentDeletedError
from storage.record.batch_builder import build_record_batch
from tests.conftest import ManualClock


def open_log(directory: Path, clock: ManualClock, **config: object) -> Log:
    return Log.open(directory / "t-0", LogConfig(**config), clock=clock)  # type: ignore[arg-type]


def values(n: int, start: int = 0, size: int = 10) -> list[bytes]:
    return [str(start + i).encode().rjust(size, b".") for i in range(n)]


def test_append_assigns_offsets_and_reads_back(log_dir: Path, clock: ManualClock) -> None:
    log = open_log(log_dir, clock)
    first = log.append(values(3))
    second = log.append([b"x", None], keys=[b"k", None])
    assert (first.first_offset, first.last_offset) == (0, 2)
    assert (second.first_offset, second.last_offset) == (3, 4)
    assert log.log_end_offset == 5
    got = [(r.offset, r.key, r.value) for r in log.records(0)]
    assert got == [(i, None, v) for i, v in enumerate(values(3))] + [
        (3, b"k", b"x"),
        (4, None, None),
    ]
    assert [r.offset for r in log.records(2, 4)] == [2, 3]
    assert log.read(1, 2)[0].offset == 1
    assert all(r.timestamp == clock.now_ms for r in log.records(0))
    log._check()
    log.close()


def test_read_from_every_offset_across_segments(log_dir: Path, clock: ManualClock) -> None:
    log = open_log(log_dir, clock, segment_bytes=600, index_interval_bytes=100)
    for i in range(60):
        log.append(values(3, 3 * i))
    assert log.number_of_segments > 5
    every = values(180)
    for offset in range(0, 181, 7):
        assert [r.value for r in log.records(offset)] == every[offset:]
    log._check()
    log.close()


def test_reads_of_any_range_across_gapped_batches(log_dir: Path, clock: ManualClock) -> None:
    """records() and record_columns() decode only the range asked for (skipping the
    records before it, stopping after it): the same records as a full read filtered."""
    log = open_log(log_dir, clock, segment_bytes=1000, index_interval_bytes=100)
    base = 0
    for i in range(40):
        count = 1 + i % 13
        deltas = [d * (1 + i % 3) for d in range(count)]  # gaps inside some batches
        log.append_batches(
            build_record_batch(
                values(count, base, size=1 + i % 5),
                keys=None if i % 4 else [b"k"] * count,
                timestamps=clock.now_ms,
                offset_deltas=deltas,
                base_offset=base,
            ),
            assign_offsets=False,
        )
        base += deltas[-1] + 1 + i % 2  # and gaps between some
    assert log.number_of_segments > 3
    every = [(r.offset, r.key, r.value) for r in log.records(0)]
    for start in range(0, log.log_end_offset, 3):
        expected = [r for r in every if r[0] >= start]
        assert [(r.offset, r.key, r.value) for r in log.records(start)] == expected
        end = start + 1 + start % 17
        assert [(r.offset, r.key, r.value) for r in log.records(start, end)] == [
            r for r in expected if r[0] < end
        ]
        columns = list(log.record_columns(start, end))
        assert [o for c in columns for o in c.offsets] == [r[0] for r in expected if r[0] < end]
        assert all(len(c) for c in columns)
    log.close()


def test_records_decode_their_first_batch_lazily(log_dir: Path, clock: ManualClock) -> None:
    """A lookup decodes a few records, not the whole batch: a malformed record (under a
    valid CRC) after them only raises when the iteration reaches it."""
    data = bytearray(build_record_batch([b"%05d" % i for i in range(20)], timestamps=clock.now_ms))
    # Each record: length, attributes, timestamp delta, offset delta, key length, value
    # length (a byte each), the 5-byte value, the header count.
    record_size = 12
    key_length = 61 + 15 * record_size + 4
    assert data[key_length] == 1  # null key
    data[key_length] = 5  # key length -3
    struct.pack_into(">I", data, 17, crc32c.crc32c(bytes(data[21:])))
    log = open_log(log_dir, clock)
    log.append_batches(bytes(data), assign_offsets=False)  # a producer's would be decoded
    assert next(log.records(3)).value == b"00003"
    assert [r.offset for r in itertools.islice(log.records(3), 8)] == list(range(3, 11))
    assert [r.offset for c in log.record_columns(2, 15) for r in c] == list(range(2, 15))
    with pytest.raises(CorruptRecordError, match="invalid key length"):
        list(log.records(3))
    with pytest.raises(CorruptRecordError, match="invalid key length"):
        list(log.record_columns(0))
    log.close()


def test_out_of_range_offsets_raise_with_context(log_dir: Path, clock: ManualClock) -> None:
    log = open_log(log_dir, clock)
    log.append(values(5))
    assert list(log.records(5)) == []
    with pytest.raises(OffsetOutOfRangeError) as info:
        list(log.records(6))
    assert (info.value.offset, info.value.log_start_offset, info.value.log_end_offset) == (6, 0, 5)
    with pytest.raises(OffsetOutOfRangeError):
        list(log.records(-1))
    log.close()


def test_index_entry_every_interval_as_kafka(log_dir: Path, clock: ManualClock) -> None:
    log = open_log(log_dir, clock, index_interval_bytes=4096)
    sizes = []
    for i in range(40):
        sizes.append(log.append(values(10, 10 * i, size=100)).size)
    index = log.active_segment.offset_index
    # Replay Kafka's rule: an entry when more than 4096 bytes were appended since the
    # last one, checked before the batch is counted, keyed by its last offset.
    expected, since, position = [], 0, 0
    for i, size in enumerate(sizes):
        if since > 4096:
            expected.append((10 * i + 9, position))
            since = 0
        since += size
        position += size
    assert [index.entry(n) for n in range(index.entries)] == expected
    log.close()


def test_roll_on_segment_bytes(log_dir: Path, clock: ManualClock) -> None:
    log = open_log(log_dir, clock, segment_bytes=1000)
    for i in range(20):
        log.append(values(5, 5 * i))
    segments = log.segments.values()
    assert len(segments) > 1
    assert all(s.size <= 1000 for s in segments)
    names = sorted(p.name for p in (log_dir / "t-0").iterdir() if p.suffix == ".log")
    assert names == [f"{s.base_offset:020d}.log" for s in segments]
    # Sealed segments have trimmed indexes; the active one is preallocated.
    for sealed in segments[:-1]:
        assert os.path.getsize(sealed.offset_index.path) == sealed.offset_index.entries * 8
    assert os.path.getsize(segments[-1].offset_index.path) == 10 * 1024 * 1024
    log.close()


def test_roll_on_segment_ms_uses_record_timestamps(log_dir: Path, clock: ManualClock) -> None:
    log = open_log(log_dir, clock, segment_ms=1000)
    log.append([b"a"])
    clock.advance(999)
    log.append([b"b"])
    assert log.number_of_segments == 1
    clock.advance(2)
    info = log.append([b"c"])
    assert log.number_of_segments == 2
    assert info.segment_base_offset == 2
    log.close()


def test_roll_if_due_rolls_quiet_segment(log_dir: Path, clock: ManualClock) -> None:
    log = open_log(log_dir, clock, segment_ms=1000)
    assert not log.roll_if_due()  # empty: never rolled
    log.append([b"a"])
    clock.advance(500)
    assert not log.roll_if_due()
    clock.advance(501)
    assert log.roll_if_due()
    assert log.active_segment.base_offset == 1
    assert not log.roll_if_due()
    log.close()


def test_roll_with_jitter_is_earlier(log_dir: Path, clock: ManualClock) -> None:
    log = open_log(log_dir, clock, segment_ms=10_000, segment_jitter_ms=5_000)
    log.append([b"a"])
    log.roll()
    jitter = log.active_segment.rolling_jitter_ms
    assert 0 <= jitter < 5_000
    log.append([b"b"])
    clock.advance(10_000 - jitter + 1)
    assert log.roll_if_due()
    log.close()


def test_roll_when_index_full(log_dir: Path, clock: ManualClock) -> None:
    log = open_log(log_dir, clock, segment_index_bytes=24, index_interval_bytes=0)
    for i in range(10):
        log.append(values(2, 2 * i))
    for segment in log.segments.values():
        assert segment.offset_index.entries <= 3
    assert log.number_of_segments >= 3
    assert [r.value for r in log.records(0)] == values(20)
    log.close()


def test_roll_on_relative_offset_overflow(log_dir: Path, clock: ManualClock) -> None:
    log = open_log(log_dir, clock)
    log.append([b"a"])
    builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, batch_size=1 << 20)
    builder.append(0, timestamp=clock.now_ms, key=None, value=b"far", headers=[])
    far = bytearray(builder.build())
    far[0:8] = (2**31 + 5).to_bytes(8, "big")
    info = log.append_batches(bytes(far), assign_offsets=False)
    assert (info.first_offset, info.last_offset) == (2**31 + 5, 2**31 + 5)
    assert log.number_of_segments == 2
    assert log.active_segment.base_offset == 1
    assert log.log_end_offset == 2**31 + 6
    log.close()


def expired_log(log_dir: Path, clock: ManualClock) -> tuple[Log, int]:
    """A log of 50 records in several segments, all past ``retention.ms`` (10 s)."""
    log = open_log(log_dir, clock, segment_bytes=500, retention_ms=10_000, file_delete_delay_ms=0)
    for i in range(10):
        log.append(values(5, 5 * i))
    clock.advance(10_001)
    return log, log.number_of_segments


def test_retention_by_time_deletes_expired_active_segment_after_rolling(
    log_dir: Path, clock: ManualClock
) -> None:
    # Kafka rolls a non-empty active segment when every segment is expired, then
    # deletes them all: a quiet partition must not serve expired records forever.
    log, count = expired_log(log_dir, clock)
    assert count > 2
    assert log.delete_old_segments() == count
    assert log.number_of_segments == 1
    assert log.active_segment.size == 0
    assert log.log_start_offset == log.log_end_offset == 50
    with pytest.raises(OffsetOutOfRangeError):
        list(log.records(0))
    assert list(log.records(50)) == []
    assert log.append([b"after"]).first_offset == 50
    assert not [p for p in (log_dir / "t-0").iterdir() if p.name.endswith(".deleted")]
    log._check()
    log.close()


def test_retention_by_time_keeps_an_active_segment_that_is_not_expired(
    log_dir: Path, clock: ManualClock
) -> None:
    log, count = expired_log(log_dir, clock)
    log.append(values(5, 50))  # the active segment now holds a fresh record
    assert log.delete_old_segments() == count - 1
    assert log.number_of_segments == 1
    assert log.log_start_offset == log.active_segment.base_offset
    assert [r.value for r in log.records(log.log_start_offset)] == values(55)[
        log.log_start_offset :
    ]
    log._check()
    log.close()


def test_retention_by_size_deletes_oldest_first(log_dir: Path, clock: ManualClock) -> None:
    log = open_log(log_dir, clock, segment_bytes=500, retention_bytes=1200, file_delete_delay_ms=0)
    for i in range(20):
        log.append(values(5, 5 * i))
    assert log.delete_old_segments() > 0
    remaining = log.segments.values()
    # Kafka's rule: delete while the log stays at or above the limit without the segment.
    assert log.size >= 1200
    assert log.size - remaining[0].size < 1200
    assert log.log_start_offset == remaining[0].base_offset
    log.close()


def test_deleted_files_wait_for_delay(log_dir: Path, clock: ManualClock) -> None:
    log = open_log(log_dir, clock, segment_bytes=500, retention_ms=1000, file_delete_delay_ms=5000)
    for i in range(5):
        log.append(values(5, 5 * i))
    clock.advance(1001)
    deleted = log.delete_old_segments()
    assert deleted > 0
    pending = [p for p in (log_dir / "t-0").iterdir() if p.name.endswith(".deleted")]
    assert len(pending) == 3 * deleted
    clock.advance(4999)
    assert log.delete_expired_files() == 0
    clock.advance(1)
    assert log.delete_expired_files() == deleted
    assert not [p for p in (log_dir / "t-0").iterdir() if p.name.endswith(".deleted")]
    log.close()


def test_reader_in_deleted_segment_finishes_it_then_reports_the_deletion(
    log_dir: Path, clock: ManualClock
) -> None:
    log = open_log(log_dir, clock, segment_bytes=500, retention_ms=1000, file_delete_delay_ms=5000)
    for i in range(10):
        log.append(values(5, 5 * i))
    first_segment_end = log.segments.values()[1].base_offset
    reader = log.records(0)
    assert next(reader).offset == 0
    clock.advance(1001)
    log.delete_old_segments()
    start = log.log_start_offset
    assert start > first_segment_end
    # The open segment is read to its end; then the reader learns that what follows
    # was deleted, and where the log starts now (auto.offset.reset=earliest).
    got: list[int] = []
    with pytest.raises(SegmentDeletedError) as deleted:
        got.extend(record.offset for record in reader)
    assert got == list(range(1, first_segment_end))
    assert deleted.value.offset == first_segment_end
    assert deleted.value.log_start_offset == start
    assert isinstance(deleted.value, OffsetOutOfRangeError)
    log.append(values(2, 50))
    assert [r.offset for r in log.records(deleted.value.log_start_offset)] == [50, 51]
    log.close()


def test_reader_finishes_a_segment_whose_files_are_gone(log_dir: Path, clock: ManualClock) -> None:
    # file.delete.delay.ms=0: the segment is closed and unlinked at once. A scan under
    # way reads on from its own descriptor; a new read of that segment is refused
    # with the typed error, never with EBADF or another file's bytes.
    log = open_log(log_dir, clock, segment_bytes=500, file_delete_delay_ms=0)
    for i in range(10):
        log.append(values(5, 5 * i))
    doomed = log.segments.values()[0]
    second_base = log.segments.values()[1].base_offset
    reader = log.records(0)
    assert next(reader).offset == 0
    log.advance_log_start_offset(second_base)
    assert log.delete_old_segments() == 1
    assert not doomed.log.path.exists()
    assert [r.offset for r in reader] == list(range(1, 50))
    with pytest.raises(SegmentDeletedError):
        next(doomed.batches_from(0))
    log.close()


def test_offset_for_timestamp(log_dir: Path, clock: ManualClock) -> None:
    log = open_log(log_dir, clock, segment_bytes=400, index_interval_bytes=50)
    for i in range(30):
        log.append([f"r{i}".encode()], timestamps=[1000 * i])
    assert log.offset_for_timestamp(0) == 0
    assert log.offset_for_timestamp(4500) == 5
    assert log.offset_for_timestamp(5000) == 5
    assert log.offset_for_timestamp(29_000) == 29
    assert log.offset_for_timestamp(29_001) is None
    log.close()


def test_oversized_record_is_refused_and_batches_split(log_dir: Path, clock: ManualClock) -> None:
    log = open_log(log_dir, clock, max_message_bytes=1000)
    with pytest.raises(RecordTooLargeError):
        log.append([b"x" * 2000])
    assert log.log_end_offset == 0
    assert log.active_segment.size == 0
    info = log.append([b"y" * 300 for _ in range(10)])
    assert info.record_count == 10
    assert [r.value for r in log.records(0)] == [b"y" * 300] * 10
    assert all(b.size <= 1000 for b in log.batches(0))
    log.close()


def test_log_append_time_overrides_timestamps(log_dir: Path, clock: ManualClock) -> None:
    log = open_log(log_dir, clock, message_timestamp_type="LogAppendTime")
    log.append([b"a"], timestamps=[5])
    record = next(log.records(0))
    assert record.timestamp == clock.now_ms
    assert record.timestamp_type is TimestampType.LOG_APPEND_TIME
    log.close()


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_compression_type_config(log_dir: Path, clock: ManualClock, codec: str) -> None:
    log = open_log(log_dir, clock, compression_type=codec)
    log.append(values(100))
    batch = next(log.batches(0))
    assert batch.codec is CompressionType[codec.upper()]
    assert [r.value for r in log.records(0)] == values(100)
    log.close()


def test_truncate_to(log_dir: Path, clock: ManualClock) -> None:
    log = open_log(log_dir, clock, segment_bytes=500)
    for i in range(20):
        log.append([str(i).encode()])
    log.truncate_to(7)
    assert log.log_end_offset == 7
    assert [r.value for r in log.records(0)] == [str(i).encode() for i in range(7)]
    log.append([b"new"])
    assert [r.value for r in log.records(6)] == [b"6", b"new"]
    log._check()
    log.close()


def test_reopen_after_close_keeps_everything(log_dir: Path, clock: ManualClock) -> None:
    log = open_log(log_dir, clock, segment_bytes=800)
    for i in range(30):
        log.append(values(3, 3 * i))
    end, segments = log.log_end_offset, log.segments.base_offsets()
    log.close()
    again = open_log(log_dir, clock, segment_bytes=800)
    assert again.log_end_offset == end
    assert again.segments.base_offsets() == segments
    assert [r.value for r in again.records(0)] == values(90)
    again.append([b"more"])
    assert again.log_end_offset == end + 1
    again._check()
    again.close()


def test_closed_or_read_only_log_refuses_writes(log_dir: Path, clock: ManualClock) -> None:
    log = open_log(log_dir, clock)
    log.append([b"a"])
    log.close()
    with pytest.raises(ReadOnlyLogError):
        log.append([b"b"])
    reader = Log.open(log_dir / "t-0", LogConfig(), clock=clock, writable=False)
    with pytest.raises(ReadOnlyLogError):
        reader.append([b"b"])
    assert [r.value for r in reader.records(0)] == [b"a"]
    reader.close()


def test_append_batches_checks_crc(log_dir: Path, clock: ManualClock) -> None:
    log = open_log(log_dir, clock)
    builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, batch_size=1 << 20)
    for i in range(3):
        builder.append(i, timestamp=1, key=None, value=b"v%d" % i, headers=[])
    good = bytes(builder.build())
    log.append([b"first"])
    info = log.append_batches(good)
    assert (info.first_offset, info.last_offset) == (1, 3)
    bad = bytearray(good)
    bad[-1] ^= 1
    with pytest.raises(CorruptRecordError):
        log.append_batches(bytes(bad))
    with pytest.raises(CorruptRecordError):
        log.append_batches(good[:-3])
    assert log.log_end_offset == 4
    assert [r.value for r in log.records(0)] == [b"first", b"v0", b"v1", b"v2"]
    log.close()


def test_reads_run_concurrently_with_appends_rolls_and_retention(
    log_dir: Path, clock: ManualClock
) -> None:
    """Reads take no lock: a reader thread keeps consuming while the writer appends,
    rolls and deletes old segments, and sees every retained record exactly once, in order."""
    import threading

    log = open_log(log_dir, clock, segment_bytes=2000, retention_bytes=6000)
    total = 4000
    done = threading.Event()
    errors: list[BaseException] = []
    seen: list[int] = []

    def reader() -> None:
        try:
            next_offset = 0
            while not done.is_set() or next_offset < log.log_end_offset:
                start = max(next_offset, log.log_start_offset)
                try:
                    for record in log.records(start):
                        assert record.value == b"%08d" % record.offset, record
                        seen.append(record.offset)
                        next_offset = record.offset + 1
                except OffsetOutOfRangeError:
                    continue  # retention passed us between the check and the read
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=reader)
    thread.start()
    for start in range(0, total, 20):
        log.append([b"%08d" % offset for offset in range(start, start + 20)])
        if start % 200 == 0:
            log.delete_old_segments()
    done.set()
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert errors == []
    assert seen == sorted(set(seen))
    assert seen[-1] == total - 1
    assert log.number_of_segments < 10
    log._check()
    log.close()


def _patched(batch: bytes, position: int, fmt: str, value: int) -> bytes:
    """``batch`` with one header field changed and its CRC made to match again."""
    raw = bytearray(batch)
    struct.pack_into(fmt, raw, position, value)
    struct.pack_into(">I", raw, 17, crc32c.crc32c(bytes(raw[21:])))
    return bytes(raw)


@pytest.mark.parametrize(
    ("field", "position", "fmt", "value", "reason"),
    [
        ("lastOffsetDelta", 23, ">i", 0, "does not match the count"),
        ("lastOffsetDelta", 23, ">i", 5, "does not match the count"),
        ("recordsCount", 57, ">i", 2, "does not match the count"),
        ("attributes", 21, ">h", 0x20, "control"),
        ("attributes", 21, ">h", 0x10, "transactional"),
        ("producerId", 43, ">q", 7, "without a base sequence"),
    ],
)
def test_append_batches_refuses_inconsistent_batches(
    log_dir: Path,
    clock: ManualClock,
    field: str,
    position: int,
    fmt: str,
    value: int,
    reason: str,
) -> None:
    log = open_log(log_dir, clock)
    log.append([b"before"])
    good = build_record_batch([b"a", b"b", b"c"], timestamps=clock.now_ms)
    bad = _patched(good, position, fmt, value)
    size = log.size
    with pytest.raises(InvalidRecordError, match=reason):
        log.append_batches(good + bad)  # the good batch is not appended either
    assert (log.log_end_offset, log.size) == (1, size)
    assert [r.value for r in log.records(0)] == [b"before"]
    assert log.append_batches(good).first_offset == 1
    assert [r.offset for r in log.records(0)] == [0, 1, 2, 3]
    log._check()
    log.close()


def test_append_batches_refuses_legacy_batches(log_dir: Path, clock: ManualClock) -> None:
    builder = LegacyRecordBatchBuilder(magic=1, compression_type=0, batch_size=1 << 20)
    builder.append(0, timestamp=clock.now_ms, key=None, value=b"old")
    log = open_log(log_dir, clock)
    with pytest.raises(InvalidRecordError, match="only v2"):
        log.append_batches(bytes(builder.build()))
    assert log.log_end_offset == 0
    log.close()

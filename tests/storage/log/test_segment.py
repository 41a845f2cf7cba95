"""One segment: Kafka's index placement, offset translation, roll causes, seal, recovery."""

from __future__ import annotations

import os
import shutil
import struct
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kafka.record.legacy_records import LegacyRecordBatchBuilder

from storage.log.file_names import log_file, offset_index_file, time_index_file
from storage.log.index import INT32_MAX
from storage.log.log_config import LogConfig
from storage.log.segment import AppendedBatch, LogSegment
from storage.record.batch_builder import build_record_batch
from storage.record.file_records import OffsetPosition, TimestampAndOffset
from storage.record.record_batch import DefaultRecordBatch

CREATED_MS = 1_700_000_000_000
TS = CREATED_MS
DAY_MS = 24 * 3600 * 1000

OpenSegment = Callable[..., LogSegment]


@pytest.fixture
def open_segment(log_dir: Path) -> Iterator[OpenSegment]:
    """Open a segment in ``log_dir`` (or ``directory``); every one is closed at the end."""
    opened: list[LogSegment] = []

    def open_(
        base_offset: int = 0,
        *,
        directory: Path | None = None,
        created_ms: int = CREATED_MS,
        rolling_jitter_ms: int = 0,
        **config: int,
    ) -> LogSegment:
        segment = LogSegment.open(
            directory or log_dir,
            base_offset,
            LogConfig(**config),  # type: ignore[arg-type]
            created_ms,
            rolling_jitter_ms=rolling_jitter_ms,
        )
        opened.append(segment)
        return segment

    yield open_
    for segment in opened:
        segment.close()


def make_batch(base_offset: int, count: int = 3, ts: int | list[int] = TS, size: int = 10) -> bytes:
    return build_record_batch(
        [b"%d" % (base_offset + i) + b"." * size for i in range(count)],
        timestamps=ts,
        base_offset=base_offset,
    )


def described(data: bytes) -> AppendedBatch:
    batch = DefaultRecordBatch(data)
    return AppendedBatch(batch.base_offset, batch.last_offset, batch.max_timestamp, batch.size)


def append(segment: LogSegment, *batches: bytes) -> int:
    return segment.append(b"".join(batches), [described(data) for data in batches])


def offset_entries(segment: LogSegment) -> list[tuple[int, int]]:
    index = segment.offset_index
    return [index.entry(n) for n in range(index.entries)]


def time_entries(segment: LogSegment) -> list[tuple[int, int]]:
    index = segment.time_index
    return [index.entry(n) for n in range(index.entries)]


def kafka_index_entries(
    batches: list[bytes], interval: int
) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Replay Kafka's LogSegment.append over ``batches`` appended to an empty segment."""
    offsets: list[tuple[int, int]] = []
    times: list[tuple[int, int]] = []
    max_ts, max_offset = -1, -1
    since = position = 0
    for data in batches:
        batch = DefaultRecordBatch(data)
        if batch.max_timestamp > max_ts:
            max_ts, max_offset = batch.max_timestamp, batch.last_offset
        if since > interval:
            offsets.append((batch.last_offset, position))
            if max_ts > (times[-1][0] if times else -1):
                times.append((max_ts, max_offset))
            since = 0
        since += batch.size
        position += batch.size
    return offsets, times


def varied_batches(n: int, base_offset: int = 0) -> list[bytes]:
    """Batches of 1-5 records, sizes 80-700 bytes, timestamps that rise and fall."""
    batches, offset = [], base_offset
    for i in range(n):
        count = 1 + i % 5
        stamps = [TS + (i * 37) % 101 + j for j in range(count)]
        batches.append(make_batch(offset, count, stamps, size=(i * 53) % 120))
        offset += count
    return batches


# -- index placement -------------------------------------------------------------


def test_first_batch_is_never_indexed(open_segment: OpenSegment) -> None:
    segment = open_segment(index_interval_bytes=0)
    first = make_batch(0)
    append(segment, first)
    assert offset_entries(segment) == []
    assert time_entries(segment) == []
    second = make_batch(3, ts=TS + 1)
    append(segment, second)
    # Keyed by the batch's last offset, pointing at the batch's start.
    assert offset_entries(segment) == [(5, len(first))]
    assert time_entries(segment) == [(TS + 1, 5)]
    segment.offset_index._check()
    segment.time_index._check()


def test_an_entry_needs_more_than_the_interval_since_the_last(open_segment: OpenSegment) -> None:
    first = make_batch(0)
    size = len(first)
    # Exactly the interval since the last entry is not enough ("more than").
    segment = open_segment(index_interval_bytes=size)
    append(segment, first)
    append(segment, make_batch(3))
    assert offset_entries(segment) == []
    append(segment, make_batch(6))
    assert offset_entries(segment) == [(8, 2 * size)]
    append(segment, make_batch(9, count=2))
    assert len(offset_entries(segment)) == 1


@pytest.mark.parametrize("interval", [0, 100, 500, 4096])
def test_index_entries_are_placed_as_kafka(open_segment: OpenSegment, interval: int) -> None:
    segment = open_segment(index_interval_bytes=interval)
    batches = varied_batches(60)
    for data in batches:
        append(segment, data)
    expected_offsets, expected_times = kafka_index_entries(batches, interval)
    assert offset_entries(segment) == expected_offsets
    assert time_entries(segment) == expected_times
    assert offset_entries(segment), "the test needs index entries"
    segment.offset_index._check()
    segment.time_index._check()


def test_appending_several_batches_at_once_indexes_each_batch(open_segment: OpenSegment) -> None:
    batches = varied_batches(40)
    one_by_one = open_segment(index_interval_bytes=300)
    for data in batches:
        append(one_by_one, data)
    sub = one_by_one.path.parent / "grouped"
    sub.mkdir()
    grouped = open_segment(directory=sub, index_interval_bytes=300)
    append(grouped, batches[0])
    for i in range(1, 40, 4):
        append(grouped, *batches[i : i + 4])
    assert offset_entries(grouped) == offset_entries(one_by_one)
    assert time_entries(grouped) == time_entries(one_by_one)
    assert grouped.path.read_bytes() == one_by_one.path.read_bytes()


def test_first_append_of_several_batches_indexes_the_max_timestamp_so_far(
    open_segment: OpenSegment,
) -> None:
    segment = open_segment(index_interval_bytes=0)
    stamps = [TS + 100, TS + 200, TS + 300, TS + 50]
    batches = [make_batch(i, count=1, ts=ts) for i, ts in enumerate(stamps)]
    append(segment, *batches)
    expected_offsets, expected_times = kafka_index_entries(batches, 0)
    assert offset_entries(segment) == expected_offsets
    assert time_entries(segment) == expected_times  # [(TS+200, 1), (TS+300, 2)]


def test_time_index_gets_an_entry_only_for_a_new_max_timestamp(open_segment: OpenSegment) -> None:
    segment = open_segment(index_interval_bytes=0)
    for i, ts in enumerate([100, 50, 200, 200, 150, 300, 300]):
        append(segment, make_batch(i, count=1, ts=TS + ts))
    assert len(offset_entries(segment)) == 6
    assert time_entries(segment) == [(TS + 100, 0), (TS + 200, 2), (TS + 300, 5)]
    assert segment.max_timestamp_and_offset() == TimestampAndOffset(TS + 300, 5)


def test_batches_without_timestamps_leave_the_time_index_empty(open_segment: OpenSegment) -> None:
    segment = open_segment(index_interval_bytes=0)
    for i in range(5):
        append(segment, make_batch(3 * i, ts=-1))
    assert len(offset_entries(segment)) == 4
    assert time_entries(segment) == []
    assert segment.max_timestamp == -1


# -- reading ---------------------------------------------------------------------


def test_translate_offset_for_every_offset(open_segment: OpenSegment) -> None:
    segment = open_segment(1000, index_interval_bytes=150)
    batches: list[bytes] = []
    offset = 1000
    for i in range(30):
        count = 1 + i % 4
        batches.append(make_batch(offset, count, size=i * 3))
        offset += count + (5 if i % 7 == 6 else 0)  # some gaps between batches
    for data in batches:
        append(segment, data)
    assert len(offset_entries(segment)) > 3
    described_batches, position = [], 0
    for data in batches:
        described_batches.append(OffsetPosition(described(data).last_offset, position, len(data)))
        position += len(data)
    last = described_batches[-1].offset
    for target in range(990, last + 1):
        expected = next(b for b in described_batches if b.offset >= target)
        assert segment.translate_offset(target) == expected, target
    assert segment.translate_offset(last + 1) is None
    assert segment.translate_offset(last + 1000) is None


def test_translate_offset_from_a_starting_position(open_segment: OpenSegment) -> None:
    segment = open_segment(index_interval_bytes=0)
    batches = [make_batch(3 * i) for i in range(5)]
    for data in batches:
        append(segment, data)
    third = len(batches[0]) + len(batches[1])
    assert segment.translate_offset(1, third) == OffsetPosition(8, third, len(batches[2]))
    assert segment.translate_offset(7, third) == OffsetPosition(8, third, len(batches[2]))


def all_translations(segment: LogSegment, first: int, last: int) -> list[OffsetPosition | None]:
    return [segment.translate_offset(target) for target in range(first, last + 2)]


@pytest.mark.parametrize(
    ("wrong", "warned"),
    [
        pytest.param(lambda offset, pos, prev: (offset, pos + 1), True, id="position-inside"),
        pytest.param(lambda offset, pos, prev: (offset, prev), True, id="previous-batch"),
        pytest.param(lambda offset, pos, prev: (offset, 10**6), False, id="past-the-log"),
        pytest.param(lambda offset, pos, prev: (offset + 1, pos), True, id="other-offset"),
    ],
)
def test_reads_ignore_an_index_entry_that_names_no_such_batch(
    open_segment: OpenSegment,
    log_dir: Path,
    caplog: pytest.LogCaptureFixture,
    wrong: Callable[[int, int, int], tuple[int, int]],
    warned: bool,
) -> None:
    """Index entries carry no checksum: reads check the entry's batch header and scan
    the segment instead when it is not the batch the entry names."""
    batches = [make_batch(3 * i) for i in range(6)]
    segment = build_segment(open_segment, batches, index_interval_bytes=0)
    expected = all_translations(segment, 0, 17)
    (_, previous), (last_offset, position) = offset_entries(segment)[-2:]
    segment.close()
    rewrite_last_index_entry(offset_index_file(log_dir, 0), wrong(last_offset, position, previous))
    reopened = open_segment()
    assert all_translations(reopened, 0, 17) == expected
    assert ("ignoring wrong index entry" in caplog.text) is warned


def test_reads_through_index_entries_of_legacy_batches(
    open_segment: OpenSegment, log_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A legacy entry has no v2 header to check: the batch at an index entry is read
    whole to check its last offset."""
    entries = []
    for offset in range(12):
        builder = LegacyRecordBatchBuilder(magic=1, compression_type=0, batch_size=1 << 20)
        builder.append(offset, timestamp=TS + offset, key=None, value=b"v" * (offset * 7))
        entries.append(bytes(builder.build()))
    log_file(log_dir, 0).write_bytes(b"".join(entries))
    segment = open_segment(index_interval_bytes=50)
    segment.recover()  # indexes the legacy entries
    assert len(offset_entries(segment)) > 3
    positions = [sum(len(e) for e in entries[:i]) for i in range(12)]
    expected = [OffsetPosition(o, positions[o], len(entries[o])) for o in range(12)]
    assert all_translations(segment, 0, 11) == [*expected, None]
    assert "ignoring wrong index entry" not in caplog.text


def test_read_next_offset_of_an_empty_segment_is_its_base(open_segment: OpenSegment) -> None:
    assert open_segment(42).read_next_offset() == 42


def test_read_next_offset_follows_the_last_batch(open_segment: OpenSegment) -> None:
    segment = open_segment(10, index_interval_bytes=0)
    append(segment, make_batch(10))
    assert segment.read_next_offset() == 13
    append(segment, make_batch(13, count=5))
    assert segment.read_next_offset() == 18
    # A compacted batch whose last offset delta exceeds its records.
    gap = build_record_batch([b"x"], timestamps=TS, base_offset=18, last_offset_delta=6)
    append(segment, gap)
    assert segment.read_next_offset() == 25
    segment.close()
    reopened = open_segment(10)
    assert reopened.read_next_offset() == 25


def test_find_offset_by_timestamp(open_segment: OpenSegment) -> None:
    segment = open_segment(index_interval_bytes=0)
    for i in range(10):
        append(segment, make_batch(3 * i, ts=[TS + 10 * i, TS + 10 * i + 5, TS + 10 * i + 1]))
    find = segment.find_offset_by_timestamp
    assert find(TS, 0) == TimestampAndOffset(TS, 0)
    assert find(TS + 42, 0) == TimestampAndOffset(TS + 45, 13)
    assert find(TS + 50, 0) == TimestampAndOffset(TS + 50, 15)
    assert find(TS + 42, 20) == TimestampAndOffset(TS + 61, 20)
    assert find(TS + 96, 0) is None


# -- roll --------------------------------------------------------------------------


def neutral_roll_args(segment: LogSegment) -> dict[str, int]:
    """Arguments under which no roll cause applies."""
    return {
        "messages_size": 100,
        "max_timestamp_in_messages": TS,
        "max_offset_in_messages": segment.read_next_offset(),
        "now_ms": CREATED_MS,
        "segment_bytes": 10**9,
        "segment_ms": DAY_MS,
    }


def test_should_roll_on_size(open_segment: OpenSegment) -> None:
    segment = open_segment()
    append(segment, make_batch(0))
    args = neutral_roll_args(segment)
    assert not segment.should_roll(**args)
    size = segment.size
    assert not segment.should_roll(**{**args, "messages_size": 100, "segment_bytes": size + 100})
    assert segment.should_roll(**{**args, "messages_size": 101, "segment_bytes": size + 100})
    assert segment.should_roll(**{**args, "messages_size": 100, "segment_bytes": size + 99})


def test_should_roll_on_time_measured_by_record_timestamps(open_segment: OpenSegment) -> None:
    segment = open_segment()
    append(segment, make_batch(0, ts=[TS + 5, TS + 7, TS + 6]))  # first batch max: TS + 7
    args = neutral_roll_args(segment)
    # The wall clock does not matter while records carry timestamps.
    args["now_ms"] = CREATED_MS + 100 * DAY_MS
    assert not segment.should_roll(**{**args, "max_timestamp_in_messages": TS + 7 + DAY_MS})
    assert segment.should_roll(**{**args, "max_timestamp_in_messages": TS + 8 + DAY_MS})


def test_should_roll_on_time_is_advanced_by_jitter(open_segment: OpenSegment) -> None:
    segment = open_segment(rolling_jitter_ms=1000)
    append(segment, make_batch(0))
    args = neutral_roll_args(segment)
    assert not segment.should_roll(**{**args, "max_timestamp_in_messages": TS + DAY_MS - 1000})
    assert segment.should_roll(**{**args, "max_timestamp_in_messages": TS + DAY_MS - 999})


def test_should_roll_on_time_uses_created_ms_without_record_timestamps(
    open_segment: OpenSegment,
) -> None:
    segment = open_segment()
    append(segment, make_batch(0, ts=-1))
    append(segment, make_batch(3, ts=TS))  # only the first batch decides
    args = neutral_roll_args(segment)
    args["max_timestamp_in_messages"] = TS + 100 * DAY_MS
    assert not segment.should_roll(**{**args, "now_ms": CREATED_MS + DAY_MS})
    assert segment.should_roll(**{**args, "now_ms": CREATED_MS + DAY_MS + 1})


def test_should_roll_on_time_after_reopen_uses_the_first_batch(
    open_segment: OpenSegment,
) -> None:
    segment = open_segment()
    append(segment, make_batch(0, ts=TS + 7))
    append(segment, make_batch(3, ts=TS + 1000))
    segment.close()
    reopened = open_segment(created_ms=CREATED_MS + 5 * DAY_MS)
    # Reopened indexes are trimmed (full) until the log makes room, as for Kafka's
    # active segment; the closed time index ends with the final (max ts, offset) entry.
    assert reopened.time_index.last_entry == (TS + 1000, 5)
    for index in (reopened.offset_index, reopened.time_index):
        index.resize(LogConfig().segment_index_bytes)
    args = neutral_roll_args(reopened)
    assert reopened.first_batch_timestamp() == TS + 7
    assert not reopened.should_roll(**{**args, "max_timestamp_in_messages": TS + 7 + DAY_MS})
    assert reopened.should_roll(**{**args, "max_timestamp_in_messages": TS + 8 + DAY_MS})


def test_an_empty_segment_never_rolls_on_time(open_segment: OpenSegment) -> None:
    segment = open_segment()
    args = neutral_roll_args(segment)
    args.update(now_ms=CREATED_MS + 100 * DAY_MS, max_timestamp_in_messages=TS + 100 * DAY_MS)
    assert not segment.should_roll(**args)


def test_should_roll_on_a_full_offset_index(open_segment: OpenSegment) -> None:
    # 40 bytes: 5 offset entries; the time index (3 slots, full at 2) keeps one entry
    # because every batch has the same timestamp.
    segment = open_segment(index_interval_bytes=0, segment_index_bytes=40)
    append(segment, make_batch(0))
    for i in range(1, 6):
        assert not segment.should_roll(**neutral_roll_args(segment)), i
        append(segment, make_batch(3 * i))
    assert segment.offset_index.is_full
    assert not segment.time_index.is_full
    assert segment.should_roll(**neutral_roll_args(segment))


def test_should_roll_on_a_full_time_index(open_segment: OpenSegment) -> None:
    # 48 bytes: 6 offset entries, 4 time slots of which the last is reserved.
    segment = open_segment(index_interval_bytes=0, segment_index_bytes=48)
    append(segment, make_batch(0))
    for i in range(1, 4):
        assert not segment.should_roll(**neutral_roll_args(segment)), i
        append(segment, make_batch(3 * i, ts=TS + i))
    assert segment.time_index.is_full
    assert not segment.offset_index.is_full
    assert segment.should_roll(**neutral_roll_args(segment))


def test_should_roll_when_offsets_leave_the_relative_range(open_segment: OpenSegment) -> None:
    segment = open_segment(1000)
    append(segment, make_batch(1000))
    args = neutral_roll_args(segment)
    assert not segment.should_roll(**{**args, "max_offset_in_messages": 1000 + INT32_MAX})
    assert segment.should_roll(**{**args, "max_offset_in_messages": 1000 + INT32_MAX + 1})
    assert segment.can_convert_to_relative_offset(1000)
    assert not segment.can_convert_to_relative_offset(999)


# -- seal ------------------------------------------------------------------------


def test_becoming_inactive_appends_the_final_time_entry_and_trims(
    open_segment: OpenSegment,
) -> None:
    # Equal-sized batches with the interval at one batch: every other batch is indexed,
    # so the last (odd) batch's new max timestamp is not in the time index yet.
    batches = [make_batch(10 + 3 * i, ts=TS + i) for i in range(6)]
    segment = open_segment(10, index_interval_bytes=len(batches[0]))
    for data in batches:
        append(segment, data)
    assert time_entries(segment) == [(TS + 2, 18), (TS + 4, 24)]
    assert segment.max_timestamp_and_offset() == TimestampAndOffset(TS + 5, 27)
    assert os.path.getsize(segment.offset_index.path) == 10 * 1024 * 1024
    assert os.path.getsize(segment.time_index.path) == (10 * 1024 * 1024) // 12 * 12
    segment.on_becoming_inactive()
    assert time_entries(segment) == [(TS + 2, 18), (TS + 4, 24), (TS + 5, 27)]
    assert offset_entries(segment) == [(18, 2 * len(batches[0])), (24, 4 * len(batches[0]))]
    assert os.path.getsize(segment.offset_index.path) == 8 * 2
    assert os.path.getsize(segment.time_index.path) == 12 * 3
    # Sealing twice adds nothing.
    segment.on_becoming_inactive()
    assert segment.time_index.entries == 3
    assert os.path.getsize(segment.time_index.path) == 12 * 3


def test_becoming_inactive_without_timestamps_only_trims(open_segment: OpenSegment) -> None:
    segment = open_segment(index_interval_bytes=0)
    append(segment, make_batch(0, ts=-1))
    append(segment, make_batch(3, ts=-1))
    segment.on_becoming_inactive()
    assert time_entries(segment) == []
    assert os.path.getsize(segment.time_index.path) == 0
    assert os.path.getsize(segment.offset_index.path) == 8


def test_becoming_inactive_fills_the_reserved_time_slot(open_segment: OpenSegment) -> None:
    # Equal-sized batches (two-digit offsets); with the interval at one batch, every
    # other batch is indexed. 48 bytes: 4 time slots, the index is full at 3 entries.
    batches = [make_batch(10 + 3 * i, ts=TS + i) for i in range(8)]
    assert len({len(b) for b in batches}) == 1
    segment = open_segment(10, index_interval_bytes=len(batches[0]), segment_index_bytes=48)
    for data in batches:
        append(segment, data)
    assert time_entries(segment) == [(TS + 2, 18), (TS + 4, 24), (TS + 6, 30)]
    assert segment.time_index.is_full
    segment.on_becoming_inactive()
    assert time_entries(segment) == [(TS + 2, 18), (TS + 4, 24), (TS + 6, 30), (TS + 7, 33)]
    assert os.path.getsize(segment.time_index.path) == 48


# -- recovery ----------------------------------------------------------------------


def build_segment(
    open_segment: OpenSegment, batches: list[bytes], base_offset: int = 0, **config: int
) -> LogSegment:
    segment = open_segment(base_offset, **config)
    for data in batches:
        append(segment, data)
    return segment


def test_recover_rebuilds_identical_indexes(open_segment: OpenSegment) -> None:
    segment = build_segment(open_segment, varied_batches(50), index_interval_bytes=200)
    offsets, times = offset_entries(segment), time_entries(segment)
    assert len(offsets) > 5
    assert len(times) > 1
    size, max_ts = segment.size, segment.max_timestamp_and_offset()
    assert segment.recover() == 0
    assert (offset_entries(segment), time_entries(segment)) == (offsets, times)
    assert segment.size == size
    assert segment.max_timestamp_and_offset() == max_ts
    segment.offset_index._check()
    segment.time_index._check()


def test_recover_from_the_log_alone_writes_byte_identical_index_files(
    open_segment: OpenSegment, log_dir: Path
) -> None:
    batches = varied_batches(50)
    original = build_segment(open_segment, batches, index_interval_bytes=200)
    original.on_becoming_inactive()
    original.close()
    rebuilt_dir = log_dir / "rebuilt"
    rebuilt_dir.mkdir()
    shutil.copy(log_file(log_dir, 0), log_file(rebuilt_dir, 0))
    rebuilt = open_segment(directory=rebuilt_dir, index_interval_bytes=200)
    assert rebuilt.recover() == 0
    rebuilt.on_becoming_inactive()
    rebuilt.close()
    for name in (offset_index_file, time_index_file):
        assert name(rebuilt_dir, 0).read_bytes() == name(log_dir, 0).read_bytes()
        assert name(log_dir, 0).stat().st_size > 0


@pytest.mark.parametrize(
    "garbage",
    [
        pytest.param(b"\x00" * 5, id="zeros-short"),
        pytest.param(b"\x00" * 200, id="zeros"),
        pytest.param(b"\xff" * 100, id="ones"),
        pytest.param(make_batch(999)[:-10], id="partial-batch"),
        pytest.param(make_batch(3)[:70], id="partial-next-batch"),
    ],
)
def test_recover_truncates_a_garbage_tail(open_segment: OpenSegment, garbage: bytes) -> None:
    batches = varied_batches(10)
    segment = build_segment(open_segment, batches, index_interval_bytes=200)
    valid = segment.size
    next_offset = segment.read_next_offset()
    offsets, times = offset_entries(segment), time_entries(segment)
    with open(segment.path, "ab") as f:
        f.write(garbage)
    segment.log.refresh_size()
    assert segment.recover() == len(garbage)
    assert segment.size == valid == os.path.getsize(segment.path)
    assert segment.read_next_offset() == next_offset
    assert (offset_entries(segment), time_entries(segment)) == (offsets, times)


def test_recover_truncates_at_a_batch_with_a_bad_crc(open_segment: OpenSegment) -> None:
    batches = varied_batches(10)
    segment = build_segment(open_segment, batches, index_interval_bytes=0)
    victim = sum(len(b) for b in batches[:6])
    with open(segment.path, "r+b") as f:
        f.seek(victim + 70)
        byte = f.read(1)
        f.seek(victim + 70)
        f.write(bytes([byte[0] ^ 0x01]))
    assert segment.recover() == sum(len(b) for b in batches[6:])
    assert segment.size == victim
    assert segment.read_next_offset() == described(batches[5]).last_offset + 1
    assert all(position < victim for _, position in offset_entries(segment))
    assert all(offset <= described(batches[5]).last_offset for _, offset in time_entries(segment))


def test_recover_truncates_at_offsets_going_backwards(open_segment: OpenSegment) -> None:
    segment = build_segment(open_segment, [make_batch(0), make_batch(3)])
    valid = segment.size
    append(segment, make_batch(1))  # offsets 1-3 go backwards after 3-5
    append(segment, make_batch(7))
    assert segment.recover() == len(make_batch(1)) + len(make_batch(7))
    assert segment.size == valid
    assert segment.read_next_offset() == 6


# -- truncation --------------------------------------------------------------------


def test_truncate_to_removes_the_batch_holding_the_offset_and_later(
    open_segment: OpenSegment,
) -> None:
    batches = [make_batch(3 * i, ts=TS + i) for i in range(10)]
    segment = build_segment(open_segment, batches, index_interval_bytes=0)
    positions = [sum(len(b) for b in batches[:i]) for i in range(10)]
    assert segment.truncate_to(13) == sum(len(b) for b in batches[4:])
    assert segment.size == positions[4] == os.path.getsize(segment.path)
    assert segment.read_next_offset() == 12
    assert offset_entries(segment) == [(3 * i + 2, positions[i]) for i in range(1, 4)]
    assert time_entries(segment) == [(TS + i, 3 * i + 2) for i in range(1, 4)]
    assert segment.max_timestamp_and_offset() == TimestampAndOffset(TS + 3, 11)
    # At a batch boundary nothing of the previous batch goes.
    assert segment.truncate_to(9) == len(batches[3])
    assert segment.read_next_offset() == 9
    segment.offset_index._check()
    segment.time_index._check()


def test_truncate_past_the_end_removes_nothing(open_segment: OpenSegment) -> None:
    segment = build_segment(open_segment, [make_batch(0), make_batch(3)])
    size = segment.size
    assert segment.truncate_to(6) == 0
    assert segment.truncate_to(100) == 0
    assert segment.size == size


def test_truncate_to_the_base_empties_the_segment_and_appends_resume(
    open_segment: OpenSegment,
) -> None:
    segment = build_segment(
        open_segment, [make_batch(5 + 3 * i) for i in range(4)], 5, index_interval_bytes=0
    )
    assert segment.truncate_to(5) > 0
    assert segment.size == 0
    assert offset_entries(segment) == []
    assert time_entries(segment) == []
    assert segment.read_next_offset() == 5
    append(segment, make_batch(5, ts=TS + 50))
    assert offset_entries(segment) == []  # the first batch again goes unindexed
    assert segment.first_batch_timestamp() == TS + 50
    append(segment, make_batch(8, ts=TS + 60))
    assert offset_entries(segment) == [(10, len(make_batch(5)))]


# -- files -------------------------------------------------------------------------


def test_change_file_suffixes_renames_all_three_files(
    open_segment: OpenSegment, log_dir: Path
) -> None:
    segment = build_segment(open_segment, [make_batch(0), make_batch(3)], index_interval_bytes=0)
    segment.change_file_suffixes("", ".deleted")
    assert sorted(p.name for p in log_dir.iterdir()) == [
        "00000000000000000000.index.deleted",
        "00000000000000000000.log.deleted",
        "00000000000000000000.timeindex.deleted",
    ]
    assert segment.path == log_file(log_dir, 0, ".deleted")
    assert segment.offset_index.path == offset_index_file(log_dir, 0, ".deleted")
    assert segment.time_index.path == time_index_file(log_dir, 0, ".deleted")
    # Open descriptors stay valid.
    assert segment.read_next_offset() == 6
    assert [b.base_offset for b in segment.batches()] == [0, 3]
    segment.change_file_suffixes(".deleted", "")
    assert sorted(p.name for p in log_dir.iterdir()) == [
        "00000000000000000000.index",
        "00000000000000000000.log",
        "00000000000000000000.timeindex",
    ]


def test_indexes_are_plausible_for_a_consistent_segment(open_segment: OpenSegment) -> None:
    assert open_segment().indexes_plausible()
    segment = build_segment(
        open_segment, varied_batches(20, base_offset=100), 100, index_interval_bytes=100
    )
    assert segment.indexes_plausible()


def rewrite_last_index_entry(path: Path, entry: tuple[int, int]) -> None:
    data = bytearray(path.read_bytes())
    struct.pack_into(">ii", data, len(data) - 8, *entry)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "wrong",
    [
        pytest.param(lambda offset, pos, prev: (offset, pos + 1), id="position-inside-batch"),
        pytest.param(lambda offset, pos, prev: (offset, prev), id="position-of-previous-batch"),
        pytest.param(lambda offset, pos, prev: (offset, 10**6), id="position-past-the-log"),
        pytest.param(lambda offset, pos, prev: (offset + 1, pos), id="offset-not-the-batch's"),
    ],
)
def test_indexes_are_implausible_when_the_last_entry_points_elsewhere(
    open_segment: OpenSegment, log_dir: Path, wrong: Callable[[int, int, int], tuple[int, int]]
) -> None:
    batches = [make_batch(3 * i) for i in range(6)]
    segment = build_segment(open_segment, batches, index_interval_bytes=0)
    assert segment.indexes_plausible()
    (_, previous), (last_offset, position) = offset_entries(segment)[-2:]
    assert last_offset == 17
    segment.close()
    # Replace the last entry (base offset 0: relative = absolute) with a wrong one
    # that still passes Kafka's sanity check.
    rewrite_last_index_entry(offset_index_file(log_dir, 0), wrong(last_offset, position, previous))
    reopened = open_segment()
    reopened.sanity_check()
    assert not reopened.indexes_plausible()


def test_indexes_are_implausible_when_the_time_index_names_an_offset_past_the_log(
    open_segment: OpenSegment, log_dir: Path
) -> None:
    segment = build_segment(
        open_segment, [make_batch(3 * i, ts=TS + i) for i in range(4)], index_interval_bytes=0
    )
    segment.close()
    path = time_index_file(log_dir, 0)
    data = bytearray(path.read_bytes())
    struct.pack_into(">qi", data, len(data) - 12, TS + 1000, 12)  # offset 12 = next offset
    path.write_bytes(bytes(data))
    reopened = open_segment()
    assert not reopened.indexes_plausible()

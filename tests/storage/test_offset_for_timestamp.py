"""``Log.offset_for_timestamp`` at its bounds (issue 17: never lose, skip or invent a
record): the first offset at or after the log start whose record timestamp is at or
above the target, None when every record is older, and ``CorruptRecordError`` when a
damaged batch or a missing segment on the way could hold the answer, never a wrong
offset.

Every answer is checked against an oracle that reads the records one by one
(``first_at_or_after``) for every timestamp in the log, one below and one above each,
and far outside them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from storage import AppendInfo, CorruptRecordError, Log, LogConfig
from storage.log.file_names import log_file
from storage.log.offset_map import OffsetMap
from tests.conftest import ManualClock

CONFIG = LogConfig(segment_bytes=1000, index_interval_bytes=150)
"""Several segments of a few batches each, indexes every other batch or so."""

T0 = 1_700_000_000_000


def open_log(log_dir: Path, clock: ManualClock, config: LogConfig = CONFIG) -> Log:
    return Log.open(log_dir / "t-0", config, clock=clock)


def append_one_each(log: Log, timestamps: list[int]) -> list[AppendInfo]:
    """One record a batch, value ``v<offset>``, at each timestamp."""
    infos = []
    for ts in timestamps:
        offset = log.log_end_offset
        infos.append(log.append([b"v%d" % offset], timestamps=[ts]))
    return infos


def first_at_or_after(log: Log, timestamp: int) -> int | None:
    """The oracle: the first record from the log start, in offset order, whose
    timestamp is >= ``timestamp``."""
    for record in log.records(log.log_start_offset):
        if record.timestamp >= timestamp:
            return record.offset
    return None


def targets(log: Log) -> list[int]:
    stamps = sorted({r.timestamp for r in log.records(log.log_start_offset)})
    around = {t + d for t in stamps for d in (-1, 0, 1)}
    return sorted(around | {-(2**62), -1, 0, 2**62})


def check_every_target(log: Log) -> int:
    """Every target agrees with the oracle; returns how many were checked."""
    checked = targets(log)
    for timestamp in checked:
        assert log.offset_for_timestamp(timestamp) == first_at_or_after(log, timestamp), timestamp
    return len(checked)


# -- bounds ----------------------------------------------------------------------------


def test_below_every_timestamp_above_all_and_equal_to_a_max(
    log_dir: Path, clock: ManualClock
) -> None:
    log = open_log(log_dir, clock)
    try:
        append_one_each(log, [T0 + 10 * i for i in range(60)])
        assert log.number_of_segments >= 4
        assert log.offset_for_timestamp(-(2**62)) == 0
        assert log.offset_for_timestamp(T0 - 1) == 0
        assert log.offset_for_timestamp(T0 + 590) == 59  # the log's max timestamp
        assert log.offset_for_timestamp(T0 + 591) is None
        assert log.offset_for_timestamp(2**62) is None
        for segment in log.segments.values()[:-1]:
            # Each sealed segment's max timestamp names its own last record.
            last = segment.max_timestamp_and_offset().offset
            assert log.offset_for_timestamp(segment.max_timestamp) == last
            assert log.offset_for_timestamp(segment.max_timestamp + 1) == last + 1
        assert check_every_target(log) > 180
    finally:
        log.close()


def test_an_empty_active_segment_after_a_roll(log_dir: Path, clock: ManualClock) -> None:
    log = open_log(log_dir, clock)
    try:
        append_one_each(log, [T0 + 10 * i for i in range(30)])
        log.roll()
        assert log.active_segment.size == 0
        assert log.active_segment.max_timestamp == -1
        assert log.offset_for_timestamp(T0 + 290) == 29
        assert log.offset_for_timestamp(T0 + 291) is None
        assert log.offset_for_timestamp(-5) == 0  # at or below the empty segment's -1
        check_every_target(log)
    finally:
        log.close()


def test_an_empty_log(log_dir: Path, clock: ManualClock) -> None:
    log = open_log(log_dir, clock)
    try:
        assert log.offset_for_timestamp(-5) is None
        assert log.offset_for_timestamp(0) is None
        assert log.offset_for_timestamp(T0) is None
    finally:
        log.close()


# -- the log start ---------------------------------------------------------------------


def test_segments_wholly_below_the_log_start_are_never_answered(
    log_dir: Path, clock: ManualClock
) -> None:
    # The first segments hold the NEWEST timestamps (CreateTime is the producer's), so
    # they are the first whose max timestamp reaches every target; DeleteRecords moved
    # the log start past them, into the middle of a later segment.
    log = open_log(log_dir, clock)
    try:
        infos = append_one_each(log, [T0 + 10_000 + i for i in range(20)])
        infos += append_one_each(log, [T0 + 10 * i for i in range(40)])
        first_bases = sorted({i.segment_base_offset for i in infos})
        start_segment = next(b for b in first_bases if b > 20)
        start = start_segment + 2  # inside a segment, past every newest record
        log.advance_log_start_offset(start)
        assert log.segments.values()[0].base_offset == 0  # not deleted yet
        assert log.offset_for_timestamp(T0 + 10_000) is None  # only below the start
        assert log.offset_for_timestamp(-(2**62)) == start
        assert log.offset_for_timestamp(T0) == start
        start_ts = T0 + 10 * (start - 20)
        assert log.offset_for_timestamp(start_ts - 5) == start
        assert log.offset_for_timestamp(start_ts + 10) == start + 1
        check_every_target(log)
        log.delete_old_segments()
        assert log.segments.values()[0].base_offset == start_segment
        assert log.offset_for_timestamp(T0) == start
        check_every_target(log)
    finally:
        log.close()


# -- timestamps out of order -----------------------------------------------------------


def test_timestamps_that_go_back_inside_a_segment_and_a_batch(
    log_dir: Path, clock: ManualClock
) -> None:
    log = open_log(log_dir, clock, LogConfig(segment_bytes=400, index_interval_bytes=60))
    try:
        stamps = [T0 + s for s in (100, 300, 200, 400, 150, 500, 50, 450, 600, 10)]
        append_one_each(log, stamps)
        # One batch whose records go back and forth.
        log.append([b"a", b"b", b"c", b"d"], timestamps=[T0 + 700, T0 + 20, T0 + 650, T0 + 5])
        append_one_each(log, [T0 + s for s in (640, 800, 30, 900, 870)])
        assert log.number_of_segments >= 3
        # Kafka's answer: the first offset (not the earliest time) at or above the target.
        assert log.offset_for_timestamp(T0 + 150) == 1
        assert log.offset_for_timestamp(T0 + 450) == 5
        assert log.offset_for_timestamp(T0 + 600) == 8
        assert log.offset_for_timestamp(T0 + 660) == 10  # inside the batch
        assert log.offset_for_timestamp(T0 + 701) == 15
        assert check_every_target(log) > 50
    finally:
        log.close()


# -- compaction ------------------------------------------------------------------------


def test_after_compaction_removed_records(log_dir: Path, clock: ManualClock) -> None:
    config = LogConfig(
        cleanup_policy=("compact",),
        segment_bytes=1024,
        index_interval_bytes=100,
        delete_retention_ms=1000,
        file_delete_delay_ms=0,
    )
    log = open_log(log_dir, clock, config)
    try:
        for i in range(120):
            key = b"k%d" % (i % 7)
            log.append([b"v%d" % i], keys=[key], timestamps=[T0 + 10 * i])
        before = [r.offset for r in log.records(0)]
        log.clean(OffsetMap(64 << 20))
        after = [r.offset for r in log.records(log.log_start_offset)]
        assert len(after) < len(before)
        removed = sorted(set(before) - set(after))
        # A target whose own record was removed: the next record kept.
        gone = removed[len(removed) // 2]
        kept = next(o for o in after if o > gone)
        assert log.offset_for_timestamp(T0 + 10 * gone) == kept
        assert check_every_target(log) > 30
    finally:
        log.close()


# -- damage ----------------------------------------------------------------------------


def closed_log_with_a_damaged_batch(
    log_dir: Path, clock: ManualClock, byte: int, mask: int = 0x01
) -> tuple[list[AppendInfo], AppendInfo]:
    """60 batches of 5 records at rising timestamps, closed cleanly; byte ``byte`` of
    the batch in the middle of the second segment (sealed) flipped by ``mask``."""
    log = open_log(log_dir, clock)
    infos = []
    for i in range(60):
        stamps = [T0 + 100 * i + k for k in range(5)]
        infos.append(log.append([b"v%d" % (5 * i + k) for k in range(5)], timestamps=stamps))
    log.close()
    bases = sorted({info.segment_base_offset for info in infos})
    assert len(bases) >= 4
    in_second = [info for info in infos if info.segment_base_offset == bases[1]]
    bad = in_second[len(in_second) // 2]
    path = log_file(log_dir / "t-0", bad.segment_base_offset)
    data = bytearray(path.read_bytes())
    data[bad.position + byte % bad.size] ^= mask
    path.write_bytes(bytes(data))
    return infos, bad


def search_error(log: Log, timestamp: int) -> CorruptRecordError:
    """The error ``offset_for_timestamp(timestamp)`` raises (it must not answer)."""
    try:
        found = log.offset_for_timestamp(timestamp)
    except CorruptRecordError as exc:
        return exc
    raise AssertionError(f"{timestamp - T0} answered {found}")


DAMAGES = {
    "crc": (-3, 0x01),  # a value byte, inside the CRC
    "length": (9, 0x01),  # the length's second byte: runs past the segment's end
    "base-offset": (7, 0x02),  # outside the CRC: the batch claims offsets 2 higher
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
@pytest.mark.parametrize("writable", [True, False], ids=["writer", "reader"])
def test_a_damaged_batch_on_the_way_raises_never_a_wrong_offset(
    log_dir: Path, clock: ManualClock, damage: str, writable: bool
) -> None:
    byte, mask = DAMAGES[damage]
    infos, bad = closed_log_with_a_damaged_batch(log_dir, clock, byte, mask)
    log = Log.open(log_dir / "t-0", CONFIG, clock=clock, writable=writable)
    try:
        bad_ts = T0 + 100 * (bad.first_offset // 5)
        # Before the damaged batch: answered, the damage is never read.
        assert log.offset_for_timestamp(T0) == 0
        assert log.offset_for_timestamp(bad_ts - 100) == bad.first_offset - 5
        assert log.offset_for_timestamp(bad_ts - 96) == bad.first_offset - 1
        # Its own timestamps, and those after it that a scan from before it would pass
        # through it to find: the damage, never an answer.
        for timestamp in (bad_ts - 95, bad_ts, bad_ts + 2, bad_ts + 4, bad_ts + 5):
            error = search_error(log, timestamp)
            assert error.path == log_file(log.dir, bad.segment_base_offset), error
        # After it, where the time index or a later segment proves it older: answered.
        later = next(i for i in infos if i.segment_base_offset > bad.segment_base_offset)
        later_ts = T0 + 100 * (later.first_offset // 5)
        assert log.offset_for_timestamp(later_ts) == later.first_offset
        assert log.offset_for_timestamp(T0 + 100 * 59 + 4) == 299
        assert log.offset_for_timestamp(T0 + 100 * 59 + 5) is None
    finally:
        log.close()


def test_a_missing_segment_on_the_way_raises(log_dir: Path, clock: ManualClock) -> None:
    # A segment file gone from the middle (cleanup.policy=delete: a hole is damage): its
    # records may hold the answer; the segment after it must not answer in its place.
    log = open_log(log_dir, clock)
    infos = append_one_each(log, [T0 + 10 * i for i in range(60)])
    log.close()
    bases = sorted({i.segment_base_offset for i in infos})
    assert len(bases) >= 4
    missing, after = bases[1], bases[2]
    log_file(log_dir / "t-0", missing).unlink()
    log = Log.open(log_dir / "t-0", CONFIG, clock=clock, writable=False)
    try:
        assert log.offset_for_timestamp(T0) == 0
        assert log.offset_for_timestamp(T0 + 10 * (missing - 1)) == missing - 1
        for offset in (missing, after - 1, after, after + 3):
            assert "in no segment file" in search_error(log, T0 + 10 * offset).reason
    finally:
        log.close()

"""Recovery: corruption injection shows that reopening keeps exactly the valid prefix."""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from storage import Log, LogConfig
from storage.record.batch_builder import build_record_batch
from tests.conftest import ManualClock

CONFIG = LogConfig(segment_bytes=2000, index_interval_bytes=200)


def crash(log: Log) -> None:
    """What a killed process leaves: files as written, indexes untrimmed, no flush."""
    for segment in log.segments.values():
        segment.close_handlers()


def build(directory: Path, clock: ManualClock, batches: int = 40) -> tuple[Log, list[bytes]]:
    log = Log.open(directory, CONFIG, clock=clock)
    written = []
    for i in range(batches):
        vals = [f"batch{i}-rec{j}".encode() for j in range(3)]
        log.append(vals)
        written.extend(vals)
    return log, written


@contextmanager
def flipped_copy(original: Path, name: str, position: int, mask: int) -> Iterator[Path]:
    """A copy of the partition directory ``original`` with one byte of file ``name``
    XORed with ``mask``; removed afterwards."""
    work = original.parent.parent / "work" / original.name
    shutil.copytree(original, work)
    try:
        with open(work / name, "r+b") as f:
            f.seek(position)
            byte = f.read(1)[0]
            f.seek(position)
            f.write(bytes([byte ^ mask]))
        yield work
    finally:
        shutil.rmtree(work.parent)


def reopen(directory: Path, clock: ManualClock, recovery_point: int = 0) -> Log:
    return Log.open(
        directory, CONFIG, clock=clock, had_clean_shutdown=False, recovery_point=recovery_point
    )


def test_truncating_last_batch_at_every_byte_keeps_prefix(
    tmp_path: Path, clock: ManualClock
) -> None:
    original = tmp_path / "orig" / "t-0"
    log, written = build(original, clock, batches=8)
    last = list(log.batches(0))[-1]
    segment_path = log.active_segment.path
    crash(log)
    for cut in range(last.position, last.position + last.size):
        work = tmp_path / f"cut{cut}" / "t-0"
        shutil.copytree(original, work)
        os.truncate(work / segment_path.name, cut)
        recovered = reopen(work, clock)
        assert [r.value for r in recovered.records(0)] == written[:-3]
        assert recovered.log_end_offset == len(written) - 3
        assert (work / segment_path.name).stat().st_size == last.position
        recovered._check()
        recovered.append([b"after"])
        assert next(iter(recovered.records(len(written) - 3))).value == b"after"
        recovered.close()
        shutil.rmtree(work.parent)


def test_flipped_byte_truncates_there_and_drops_later_segments(
    tmp_path: Path, clock: ManualClock
) -> None:
    original = tmp_path / "orig" / "t-0"
    log, written = build(original, clock)
    assert log.number_of_segments >= 3
    victim_segment = log.segments.values()[1]
    victim = list(victim_segment.batches())[2]
    valid_before = [r.value for r in log.records(0, victim.base_offset)]
    assert valid_before == written[: victim.base_offset]
    crash(log)
    # Every byte the CRC covers, and the length field, in turn.
    for position in list(range(8, 12)) + list(range(16, victim.size)):
        name = victim_segment.path.name
        with flipped_copy(original, name, victim.position + position, 0x40) as work:
            recovered = reopen(work, clock)
            got = [r.value for r in recovered.records(0)]
            assert got == valid_before, position
            assert recovered.log_end_offset == victim.base_offset
            assert recovered.number_of_segments == 2
            recovered._check()
            recovered.close()


def test_recovery_starts_at_recovery_point(tmp_path: Path, clock: ManualClock) -> None:
    directory = tmp_path / "t-0"
    log, written = build(directory, clock)
    first = log.segments.values()[0]
    assert len(written) == log.log_end_offset
    bad = list(first.batches())[1]
    crash(log)
    # Corruption below the recovery point is not re-validated (Kafka trusts flushed
    # segments), but reads never serve it: the CRC is checked on every read.
    with open(first.path, "r+b") as f:
        f.seek(bad.position + 40)
        f.write(b"\xff")
    recovered = reopen(directory, clock, recovery_point=len(written))
    assert recovered.log_end_offset == len(written)
    with pytest.raises(Exception, match="CRC"):
        list(recovered.records(0))
    recovered.close()


GARBAGE = [
    b"",
    b"\x01" * 13,
    b"\x00" * 8 + b"\x7f" * 8,
    b"\x00\x00\x00\x05\xff\xff\xff\x00",  # a negative position
    *(random.Random(seed).randbytes(800) for seed in range(5)),
]


@pytest.mark.parametrize("garbage", GARBAGE)
def test_garbage_index_is_rebuilt(tmp_path: Path, clock: ManualClock, garbage: bytes) -> None:
    directory = tmp_path / "t-0"
    log, written = build(directory, clock)
    segments = log.segments.values()
    expected = {s.base_offset: [s.offset_index.entry(i) for i in range(s.offset_index.entries)]
                for s in segments[:-1]}  # fmt: skip
    log.close()
    for segment in segments[:-1]:
        segment.offset_index.path.write_bytes(garbage)
        segment.time_index.path.write_bytes(garbage[: len(garbage) // 12 * 12])
    again = Log.open(directory, CONFIG, clock=clock)
    for segment in again.segments.values()[:-1]:
        index = segment.offset_index
        entries = [index.entry(i) for i in range(index.entries)]
        if garbage:
            # Rebuilt from the log: identical to what the appends produced.
            assert entries == expected[segment.base_offset]
        else:
            # An empty index is valid, merely sparse (Kafka keeps it too): lookups scan.
            assert entries == []
    for offset in range(0, len(written), 5):
        assert next(again.records(offset)).value == written[offset]
    again._check()
    again.close()


def test_missing_indexes_are_rebuilt(tmp_path: Path, clock: ManualClock) -> None:
    directory = tmp_path / "t-0"
    log, written = build(directory, clock)
    log.close()
    for path in directory.iterdir():
        if path.suffix in (".index", ".timeindex"):
            path.unlink()
    again = Log.open(directory, CONFIG, clock=clock)
    assert [r.value for r in again.records(0)] == written
    assert all(s.offset_index.entries > 0 for s in again.segments.values()[:-1])
    assert again.offset_for_timestamp(clock.now_ms) == 0
    again._check()
    again.close()


def test_untrimmed_index_after_crash_is_read_correctly(tmp_path: Path, clock: ManualClock) -> None:
    directory = tmp_path / "t-0"
    log, written = build(directory, clock)
    active_entries = log.active_segment.offset_index.entries
    crash(log)
    assert (directory / f"{log.active_segment.base_offset:020d}.index").stat().st_size == 10 << 20
    again = reopen(directory, clock, recovery_point=len(written))
    assert again.active_segment.offset_index.entries == active_entries
    assert [r.value for r in again.records(0)] == written
    again.close()


def test_temporary_files_are_removed_and_swaps_completed(
    tmp_path: Path, clock: ManualClock
) -> None:
    directory = tmp_path / "t-0"
    log, written = build(directory, clock)
    segments = log.segments.values()
    log.close()
    (directory / "00000000000000000000.log.deleted").write_bytes(b"old")
    (directory / "00000000000000000000.index.cleaned").write_bytes(b"old")
    (directory / "00000000000000000000.timeindex.swap").write_bytes(b"old")
    # A cleaned replacement of the first two segments, committed as .swap.
    first, second = segments[0], segments[1]
    survivors = [r for r in Log.open(directory, CONFIG, clock=clock, writable=False).records(0)
                 if r.offset < segments[2].base_offset and r.offset % 2 == 0]  # fmt: skip
    swap = build_record_batch(
        [r.value for r in survivors],
        timestamps=[r.timestamp for r in survivors],
        offset_deltas=[r.offset for r in survivors],
        last_offset_delta=segments[2].base_offset - 1,
    )
    (directory / f"{first.base_offset:020d}.log.swap").write_bytes(swap)
    again = Log.open(directory, CONFIG, clock=clock)
    names = sorted(p.name for p in directory.iterdir())
    assert not [n for n in names if n.endswith((".deleted", ".cleaned", ".swap"))]
    assert f"{second.base_offset:020d}.log" not in names
    got = [(r.offset, r.value) for r in again.records(0)]
    expected_tail = [(i, v) for i, v in enumerate(written) if i >= segments[2].base_offset]
    assert got == [(r.offset, r.value) for r in survivors] + expected_tail
    again._check()
    again.close()


def test_read_only_open_of_crashed_log_changes_nothing(tmp_path: Path, clock: ManualClock) -> None:
    directory = tmp_path / "t-0"
    log, written = build(directory, clock)
    active = log.active_segment.path
    crash(log)
    with open(active, "ab") as f:
        f.write(b"\x00\x00\x00\x00\x00\x00\x00\x99\x00\x00\x01\x00garbage-tail")
    before = {p.name: p.read_bytes() for p in directory.iterdir()}
    reader = Log.open(directory, CONFIG, clock=clock, writable=False, had_clean_shutdown=False)
    assert [r.value for r in reader.records(0)] == written
    assert reader.log_end_offset == len(written)
    reader.close()
    assert {p.name: p.read_bytes() for p in directory.iterdir()} == before


def test_reader_of_live_log_keeps_on_disk_indexes(tmp_path: Path, clock: ManualClock) -> None:
    """A reader opening a log a writer has open (no clean-shutdown marker) validates the
    unflushed tail without rebuilding indexes anywhere."""
    directory = tmp_path / "t-0"
    log, written = build(directory, clock)
    reader = Log.open(directory, CONFIG, clock=clock, writable=False, had_clean_shutdown=False)
    assert reader._scratch_dirs == []
    assert reader.log_end_offset == len(written)
    assert [r.value for r in reader.records(len(written) // 2)] == written[len(written) // 2 :]
    log.append([b"more"])
    reader.refresh()
    assert [r.value for r in reader.records(len(written))] == [b"more"]
    reader.close()
    log.close()


def test_flipped_index_bytes_never_misdirect_reads(tmp_path: Path, clock: ManualClock) -> None:
    """Indexes carry no checksum: whatever byte of an offset index is flipped, every
    offset still reads exactly its record (bad entries are detected and skipped)."""
    original = tmp_path / "orig" / "t-0"
    log, written = build(original, clock)
    sealed = log.segments.values()[1]
    log.close()
    index_name = sealed.offset_index.path.name
    index_size = (original / index_name).stat().st_size
    assert index_size >= 24
    for position in range(index_size):
        with flipped_copy(original, index_name, position, 0xFF) as work:
            again = Log.open(work, CONFIG, clock=clock)
            for offset in range(sealed.base_offset, again.segments.values()[2].base_offset):
                assert next(again.records(offset)).value == written[offset], (position, offset)
            again.close()


def test_flipped_time_index_bytes_never_misdirect_time_lookups(
    tmp_path: Path, clock: ManualClock
) -> None:
    original = tmp_path / "orig" / "t-0"
    log = Log.open(original, CONFIG, clock=clock)
    for i in range(60):
        log.append([b"record %d" % i] * 2, timestamps=[1000 * i, 1000 * i + 500])
    sealed = log.segments.values()[1]
    log.close()
    index_name = sealed.time_index.path.name
    index_size = (original / index_name).stat().st_size
    assert index_size >= 36
    for position in range(index_size):
        with flipped_copy(original, index_name, position, 0xFF) as work:
            again = Log.open(work, CONFIG, clock=clock)
            for target in range(0, 60_250, 250):
                # Offset n has timestamp 500 * n: the first at or after t is ceil(t / 500).
                first = -(-target // 500)
                expected = first if first < 120 else None
                assert again.offset_for_timestamp(target) == expected, (position, target)
            again.close()


def test_read_only_view_of_crashed_log_ends_before_an_indexed_invalid_batch(
    tmp_path: Path, clock: ManualClock
) -> None:
    directory = tmp_path / "t-0"
    log, written = build(directory, clock)
    active = log.active_segment
    last = list(active.batches())[-1]
    assert active.offset_index.lookup(last.last_offset)[1] == last.position  # it is indexed
    crash(log)
    with open(active.path, "r+b") as f:
        f.seek(last.position + 30)
        f.write(b"\xee")
    reader = Log.open(directory, CONFIG, clock=clock, writable=False, had_clean_shutdown=False)
    assert reader.log_end_offset == len(written) - 3
    assert [r.value for r in reader.records(0)] == written[:-3]
    reader.close()


def test_reopen_never_hands_out_offsets_below_the_log_start_offset(
    log_dir: Path, clock: ManualClock
) -> None:
    # Ten records, DeleteRecords past them (the checkpoint records start 10), then a
    # crash loses the unflushed tail. Kafka's loader restarts the log at the
    # checkpointed start: offsets 0-9 must never be handed out again.
    directory = log_dir / "t-0"
    log = Log.open(directory, CONFIG, clock=clock)
    log.append([b"r%d" % i for i in range(10)])
    log.advance_log_start_offset(10)
    crash(log)
    (directory / "00000000000000000000.log").write_bytes(b"")  # the lost page cache
    reopened = Log.open(
        directory,
        CONFIG,
        clock=clock,
        log_start_offset=10,
        recovery_point=0,
        had_clean_shutdown=False,
    )
    assert (reopened.log_start_offset, reopened.log_end_offset) == (10, 10)
    assert reopened.append([b"next"]).first_offset == 10
    assert reopened.segments.base_offsets() == [10]
    assert not (directory / "00000000000000000000.log").exists()
    assert [r.offset for r in reopened.records(10)] == [10]
    reopened._check()
    reopened.close()


def test_closed_and_recovered_time_indexes_end_with_the_max_timestamp(
    log_dir: Path, clock: ManualClock
) -> None:
    # Kafka appends (max timestamp, its batch's last offset) to the time index on
    # close and at the end of recovery. No index point is reached here (the interval
    # is larger than the segment), so that final entry is the only one.
    config = LogConfig(index_interval_bytes=1 << 20)
    directory = log_dir / "t-0"
    log = Log.open(directory, config, clock=clock)
    for i, ts in enumerate((5000, 9000, 7000)):
        log.append([b"a%d" % i, b"b%d" % i], timestamps=[ts - 1, ts])
    log.close()
    time_index = directory / "00000000000000000000.timeindex"
    expected = (9000).to_bytes(8, "big") + (3).to_bytes(4, "big")  # batch 1 ends at offset 3
    assert time_index.read_bytes() == expected

    time_index.unlink()  # recovery rebuilds it, final entry included
    reopened = Log.open(directory, config, clock=clock, had_clean_shutdown=False)
    crash(reopened)
    assert time_index.read_bytes()[:12] == expected
    assert time_index.read_bytes()[12:] == bytes(len(time_index.read_bytes()) - 12)

"""Recovery: corruption injection shows that reopening keeps exactly the valid prefix."""

from __future__ import annotations

import logging
import os
import random
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from storage import CorruptRecordError, Log, LogConfig, RecordBatch
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
def test_garbage_index_is_read_safely_below_the_recovery_point_and_rebuilt_above_it(
    tmp_path: Path, clock: ManualClock, garbage: bytes
) -> None:
    # After a clean shutdown Kafka does not check the indexes of flushed segments (it
    # maps them on first use); every entry is checked against the batch it names
    # before use, so garbage never misdirects a read. Recovery rebuilds the indexes of
    # the segments it re-validates.
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
    for offset in range(0, len(written), 5):
        assert next(again.records(offset)).value == written[offset]
    assert [r.value for r in again.records(0)] == written
    crash(again)
    again = reopen(directory, clock)
    for segment in again.segments.values()[:-1]:
        index = segment.offset_index
        entries = [index.entry(i) for i in range(index.entries)]
        # Rebuilt from the log: identical to what the appends produced.
        assert entries == expected[segment.base_offset]
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


# -- the loader's cuts are recovery's alone, and loud --------------------------------


def build_ticking(
    directory: Path, clock: ManualClock, batches: int = 40
) -> tuple[Log, list[bytes]]:
    """``build`` with the clock one ms further at each append: each segment's final
    time-index entry then names its last batch."""
    log = Log.open(directory, CONFIG, clock=clock)
    written = []
    for i in range(batches):
        vals = [f"batch{i}-rec{j}".encode() for j in range(3)]
        log.append(vals)
        written.extend(vals)
        clock.advance(1)
    return log, written


def flip(path: Path, position: int, mask: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= mask
    path.write_bytes(bytes(data))


def read_all(log: Log, start: int = 0) -> tuple[list[bytes], CorruptRecordError | None]:
    """The values ``records(start)`` served, and the error it stopped with (or None)."""
    values: list[bytes] = []
    try:
        for record in log.records(start):
            assert record.value is not None
            values.append(record.value)
    except CorruptRecordError as exc:
        return values, exc
    return values, None


LENGTH_BYTE = 9
"""A byte of the batch length: flipping 0x01 there adds 64 KiB, so the batch runs past
the end of its segment and the batches after it no longer frame."""
CRC_COVERED_BYTE = 40
"""A byte inside the CRC-covered part of a batch header (the base timestamp)."""


@pytest.mark.parametrize(("byte", "mask"), [(LENGTH_BYTE, 0x01), (CRC_COVERED_BYTE, 0x40)])
@pytest.mark.parametrize("shutdown", ["clean", "unclean past the segment"])
def test_rebuilding_a_sealed_segments_missing_indexes_cuts_nothing(
    log_dir: Path, clock: ManualClock, caplog: pytest.LogCaptureFixture, byte: int, mask: int,
    shutdown: str,
) -> None:  # fmt: skip
    # A sealed segment's data is final: when its indexes are missing (Kafka rebuilds
    # them), the rebuild must not cut the log at a damaged batch. Before, recover()
    # truncated the segment there and logged only that it rebuilt the index: the
    # valid batches after the damage were gone for good.
    directory = log_dir / "t-0"
    log, written = build_ticking(directory, clock)
    sealed = log.segments.values()[1]
    batches = list(sealed.batches())
    victim = batches[len(batches) // 2]
    after = batches[len(batches) // 2 + 1]
    next_segment = log.segments.values()[2].base_offset
    log.close()
    sealed.offset_index.path.unlink()
    sealed.time_index.path.unlink()
    size = sealed.path.stat().st_size
    flip(sealed.path, victim.position + byte, mask)
    recovery_point = 0 if shutdown == "clean" else len(written)
    with caplog.at_level(logging.WARNING, logger="storage"):
        again = Log.open(
            directory, CONFIG, clock=clock, had_clean_shutdown=shutdown == "clean",
            recovery_point=recovery_point,
        )  # fmt: skip
    assert sealed.path.stat().st_size == size  # nothing cut
    values, error = read_all(again)
    assert values == written[: victim.base_offset]
    assert error is not None
    assert (error.path, error.position, error.offset) == (
        sealed.path,
        victim.position,
        victim.base_offset,
    )
    if byte == CRC_COVERED_BYTE:
        # The batches after it still frame: they are indexed and read from their offsets.
        assert read_all(again, after.base_offset) == (written[after.base_offset :], None)
    assert read_all(again, next_segment) == (written[next_segment:], None)
    assert again.log_end_offset == len(written)
    warning = next(r.getMessage() for r in caplog.records if "without cutting" in r.getMessage())
    assert f"at byte {victim.position}" in warning
    assert f"offset {victim.base_offset}" in warning
    again.close()


def test_a_clean_open_trusts_a_sealed_segment_whose_tail_is_damaged(
    log_dir: Path, clock: ManualClock
) -> None:
    # Damage after a sealed segment's last index entry made its indexes look wrong (the
    # final time-index entry names an offset the scan no longer reaches), and the
    # index rebuild then cut the segment there, silently. Kafka does not check a
    # sealed segment's indexes after a clean shutdown; the damage stays damage.
    directory = log_dir / "t-0"
    log, written = build_ticking(directory, clock)
    sealed = log.segments.values()[1]
    last_indexed = sealed.offset_index.entry(sealed.offset_index.entries - 1)[1]
    victim = next(b for b in sealed.batches() if b.position > last_indexed)
    next_segment = log.segments.values()[2].base_offset
    log.close()
    size = sealed.path.stat().st_size
    flip(sealed.path, victim.position + LENGTH_BYTE, 0x01)
    again = Log.open(directory, CONFIG, clock=clock)
    assert sealed.path.stat().st_size == size
    values, error = read_all(again)
    assert values == written[: victim.base_offset]
    assert error is not None
    assert error.offset == victim.base_offset
    assert read_all(again, next_segment) == (written[next_segment:], None)
    again.close()


@pytest.mark.parametrize(("byte", "mask"), [(LENGTH_BYTE, 0x01), (16, 0x07)])
def test_a_clean_open_recovers_an_active_segment_whose_batches_stop_framing(
    log_dir: Path, clock: ManualClock, caplog: pytest.LogCaptureFixture, byte: int, mask: int
) -> None:
    # After a clean shutdown the loader trusted the active segment: damage after its
    # last index entry stopped read_next_offset there, and the writer then handed out
    # offsets that already existed after it (the time index, all one timestamp here,
    # did not reveal it). The active segment is the unflushed tail recovery owns: it
    # is cut at the damage, and the cut is logged. (Byte 16 is the magic.)
    directory = log_dir / "t-0"
    log, written = build(directory, clock)
    active = log.active_segment

    def unindexed() -> list[RecordBatch]:
        index = active.offset_index
        last_indexed = index.entry(index.entries - 1)[1] if index.entries else 0
        return [b for b in active.batches() if b.position > last_indexed]

    while len(unindexed()) < 2:  # a batch after the last entry, and one after it
        written.append(b"more %d" % len(written))
        log.append([written[-1]])
    victim = unindexed()[0]
    log.close()
    flip(active.path, victim.position + byte, mask)
    with caplog.at_level(logging.WARNING, logger="storage"):
        again = Log.open(directory, CONFIG, clock=clock)
    assert active.path.stat().st_size == victim.position
    assert again.log_end_offset == victim.base_offset
    assert again.append([b"after"]).first_offset == victim.base_offset
    assert read_all(again) == ([*written[: victim.base_offset], b"after"], None)
    cut = next(r.getMessage() for r in caplog.records if "recovery cut" in r.getMessage())
    assert f"at byte {victim.position}" in cut
    assert f"the log ends at offset {victim.base_offset}" in cut
    again._check()
    again.close()


def test_a_readers_view_of_a_crashed_log_stays_as_its_recovery_left_it(
    log_dir: Path, clock: ManualClock
) -> None:
    # A reader of a crashed log reads up to the first invalid batch of the unflushed
    # tail (what the writer's recovery will cut) and hides the segments after it.
    # Its refresh put them back: the same bytes then read as damage, and the log end
    # jumped. The view stays until a writer has recovered the log, then follows it.
    directory = log_dir / "t-0"
    log, written = build(directory, clock)
    sealed = log.segments.values()[1]
    victim = list(sealed.batches())[2]
    segments = log.number_of_segments
    crash(log)
    flip(sealed.path, victim.position + CRC_COVERED_BYTE, 0x40)
    reader = Log.open(directory, CONFIG, clock=clock, writable=False, had_clean_shutdown=False)
    view = (reader.log_end_offset, reader.number_of_segments)
    assert view == (victim.base_offset, 2)
    assert read_all(reader) == (written[: victim.base_offset], None)
    for _ in range(2):
        reader.refresh()
        assert (reader.log_end_offset, reader.number_of_segments) == view
        assert read_all(reader) == (written[: victim.base_offset], None)
    assert len(list(directory.glob("*.log"))) == segments  # the reader changed nothing
    writer = reopen(directory, clock)  # recovery cuts at the invalid batch
    writer.append([b"after recovery"])
    reader.refresh()
    assert reader.log_end_offset == victim.base_offset + 1
    assert read_all(reader) == ([*written[: victim.base_offset], b"after recovery"], None)
    writer.close()
    reader.close()


def test_a_missing_segment_file_is_damage_where_reads_reach_it(
    log_dir: Path, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    # A .log deleted from the middle of a log: reads jumped the hole silently and the
    # loader said nothing. Under cleanup.policy=delete segments are contiguous, so the
    # hole is damage: reads that reach it raise, naming the missing offsets.
    directory = log_dir / "t-0"
    log, written = build(directory, clock, batches=100)
    before, missing, after = log.segments.values()[1:4]
    log.close()
    missing.path.unlink()
    lost = range(missing.base_offset, after.base_offset)
    for writable in (True, False):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="storage"):
            again = Log.open(directory, CONFIG, clock=clock, writable=writable)
        assert any(
            f"offsets {lost[0]}..{lost[-1]} are in no segment file" in r.getMessage()
            for r in caplog.records
        )
        for start in (0, lost[0], lost[-1]):
            values, error = read_all(again, start)
            assert values == written[start : lost[0]]
            assert error is not None
            assert (error.path, error.position, error.offset) == (
                before.path, before.path.stat().st_size, max(start, lost[0])
            )  # fmt: skip
            assert f"offsets {max(start, lost[0])}..{lost[-1]} are in no segment" in str(error)
        assert read_all(again, after.base_offset) == (written[after.base_offset :], None)
        skipped: list[tuple[int, int]] = []

        def skip(
            error: CorruptRecordError, resume: int, skipped: list[tuple[int, int]] = skipped
        ) -> None:
            skipped.append((error.offset, resume))

        got = [batch.base_offset for batch in again.batches(0, on_corrupt=skip)]
        assert skipped == [(lost[0], after.base_offset)]
        assert lost[0] not in got
        assert after.base_offset in got
        again._check()
        again.close()


@pytest.mark.parametrize("why", ["compacted", "a broker's directory"])
def test_a_hole_that_compaction_may_have_left_is_not_damage(
    log_dir: Path, clock: ManualClock, why: str
) -> None:
    # Kafka's cleaner drops whole batches at a segment's end: a compacted log (or a
    # broker's partition, whose cleanup.policy seglogfs cannot see) reads across holes.
    directory = log_dir / "t-0"
    log, written = build(directory, clock, batches=100)
    missing, after = log.segments.values()[2:4]
    log.close()
    missing.path.unlink()
    config = CONFIG
    if why == "compacted":
        config = LogConfig(
            segment_bytes=2000, index_interval_bytes=200, cleanup_policy=("compact",)
        )
    else:
        (directory / "leader-epoch-checkpoint").write_text("0\n0\n")
    reader = Log.open(directory, config, clock=clock, writable=False)
    expected = [
        v for i, v in enumerate(written) if not missing.base_offset <= i < after.base_offset
    ]
    assert read_all(reader) == (expected, None)
    reader.close()

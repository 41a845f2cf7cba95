"""Damage is loud: a read that reaches a batch that fails its CRC or its framing stops
with ``CorruptRecordError`` (file, byte position, offset) in every segment but the
unflushed tail; it never passes over the batch to the next segment in silence.

The logs here hold 60 batches of 10 records over four segments and are closed cleanly
before their bytes are damaged, so the loader trusts them (no recovery) and each read
meets the damage as a broker's fetch would. A reader beside a live writer may still see
the writer's last batch half-written: that stays quiet.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from storage import AppendInfo, CorruptRecordError, Log, LogConfig, build_record_batch
from storage.log.file_names import log_file
from tests.conftest import ManualClock

CONFIG = LogConfig(segment_bytes=4000, index_interval_bytes=200)
BATCHES = 60
SPARSE = LogConfig(segment_bytes=4000, index_interval_bytes=1300)
"""Index entries every sixth batch: the last batches of a segment are not indexed."""
LENGTH_HIGH_BYTE = 9
"""The second byte of the batch length (bytes 8-11): flipping its low bit adds 64 KiB."""


def record_value(offset: int) -> bytes:
    return b"record %04d" % offset


def append_numbered(log: Log, batches: range) -> list[AppendInfo]:
    """Append batches number ``batches`` of 10 records each (batch i holds offsets
    10 i .. 10 i + 9 with their ``record_value``)."""
    return [log.append([record_value(10 * i + k) for k in range(10)]) for i in batches]


def writer_and_reader(
    log_dir: Path, clock: ManualClock, config: LogConfig, batches: int
) -> tuple[Log, Log, list[AppendInfo]]:
    """A writable log with ``batches`` numbered batches, a reader opened beside it
    then (as another process would), and the appends."""
    writer = Log.open(log_dir / "t-0", config, clock=clock)
    infos = append_numbered(writer, range(batches))
    return writer, Log.open(writer.dir, config, clock=clock, writable=False), infos


def fill(
    log_dir: Path, clock: ManualClock, config: LogConfig = CONFIG, *, tick: bool = True
) -> list[AppendInfo]:
    """Write the log, one batch of 10 records per append (a new timestamp each when
    ``tick``), and close it cleanly."""
    log = Log.open(log_dir / "t-0", config, clock=clock)
    infos = []
    for i in range(BATCHES):
        infos += append_numbered(log, range(i, i + 1))
        if tick:
            clock.advance(1)
    assert log.number_of_segments >= 3
    log.close()
    return infos


def segment_path(log_dir: Path, info: AppendInfo) -> Path:
    return log_file(log_dir / "t-0", info.segment_base_offset)


def flip(path: Path, position: int, mask: int = 0x01) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= mask
    path.write_bytes(bytes(data))


def read_from(log: Log, start: int) -> tuple[list[int], CorruptRecordError | None]:
    """The offsets ``records(start)`` served, and the error it ended with (or None)."""
    served: list[int] = []
    try:
        for record in log.records(start):
            assert record.value == record_value(record.offset), record
            served.append(record.offset)
    except CorruptRecordError as exc:
        return served, exc
    return served, None


def stops_at(log: Log, bad: AppendInfo) -> CorruptRecordError:
    """Read from offset 0: every record before ``bad`` is served, then the error names
    its file, byte and first offset; returns the error."""
    served, error = read_from(log, 0)
    assert served == list(range(bad.first_offset))
    assert error is not None
    assert (error.path, error.position, error.offset) == (
        log_file(log.dir, bad.segment_base_offset),
        bad.position,
        bad.first_offset,
    )
    return error


def middle_of_first_segment(infos: list[AppendInfo]) -> AppendInfo:
    in_first = [info for info in infos if info.segment_base_offset == 0]
    return in_first[len(in_first) // 2]


def damaged_in_the_middle(
    log_dir: Path, clock: ManualClock, byte: int
) -> tuple[list[AppendInfo], AppendInfo]:
    """``fill``, then flip byte ``byte`` (from the end when negative) of the batch in the
    middle of the first segment; the appends, and that batch."""
    infos = fill(log_dir, clock)
    bad = middle_of_first_segment(infos)
    flip(segment_path(log_dir, bad), bad.position + byte % bad.size)
    return infos, bad


def first_of_next_segment(infos: list[AppendInfo], info: AppendInfo) -> AppendInfo:
    return next(i for i in infos if i.segment_base_offset > info.segment_base_offset)


@pytest.mark.parametrize("writable", [True, False], ids=["writer", "reader"])
def test_a_length_running_past_a_sealed_segment_stops_the_read(
    log_dir: Path, clock: ManualClock, writable: bool
) -> None:
    # Issue 17: the batch's length ran past the end of its sealed segment, the reader
    # took it for an unflushed tail and went on at the next segment, in silence.
    infos, bad = damaged_in_the_middle(log_dir, clock, LENGTH_HIGH_BYTE)
    log = Log.open(log_dir / "t-0", CONFIG, clock=clock, writable=writable)
    try:
        error = stops_at(log, bad)
        assert "runs past the end of the segment" in str(error)
        assert f"offset {bad.first_offset}" in str(error)
        # Every read that reaches it: batches, a lookup inside the batch, by time.
        with pytest.raises(CorruptRecordError):
            list(log.batches(bad.first_offset - 1))
        with pytest.raises(CorruptRecordError):
            next(log.records(bad.first_offset + 5))
        with pytest.raises(CorruptRecordError):
            log.offset_for_timestamp(bad.max_timestamp)
        # Reads that never reach it are served: through an index entry past it, and
        # from the next segment on.
        after = infos[infos.index(bad) + 2].first_offset
        assert next(log.records(after)).offset == after
        following = first_of_next_segment(infos, bad).first_offset
        assert read_from(log, following) == (list(range(following, 10 * BATCHES)), None)
    finally:
        log.close()


@pytest.mark.parametrize("writable", [True, False], ids=["writer", "reader"])
def test_a_crc_mismatch_names_the_offset_and_stops_lookups_by_time(
    log_dir: Path, clock: ManualClock, writable: bool
) -> None:
    _infos, bad = damaged_in_the_middle(log_dir, clock, -3)  # a value byte: in the CRC
    log = Log.open(log_dir / "t-0", CONFIG, clock=clock, writable=writable)
    try:
        # The time index leads into the damaged batch: its records are never decoded
        # into an answer (they were: the lookup returned the batch's first offset).
        with pytest.raises(CorruptRecordError, match="CRC mismatch"):
            log.offset_for_timestamp(bad.max_timestamp)
        assert stops_at(log, bad).reason == "CRC mismatch"
    finally:
        log.close()


@pytest.mark.parametrize("cut", [10, 100], ids=["in-header", "in-records"])
@pytest.mark.parametrize("writable", [True, False], ids=["writer", "reader"])
def test_a_truncated_sealed_segment_stops_the_read(
    log_dir: Path, clock: ManualClock, writable: bool, cut: int
) -> None:
    # The cut is past the last index entry and every record has one timestamp: the
    # indexes still agree with the cut log, so the loader does not rebuild them (which
    # recovers the segment: see test_log_loader) and the reads meet the cut.
    infos = fill(log_dir, clock, SPARSE, tick=False)
    last = [info for info in infos if info.segment_base_offset == 0][-1]
    path = segment_path(log_dir, last)
    with path.open("r+b") as f:
        f.truncate(last.position + cut)
    log = Log.open(log_dir / "t-0", SPARSE, clock=clock, writable=writable)
    try:
        index = log.segments.first_segment.offset_index  # type: ignore[union-attr]
        assert index.entry(index.entries - 1)[1] < last.position
        assert path.stat().st_size == last.position + cut  # nothing cut it on open
        stops_at(log, last)
    finally:
        log.close()


def test_damage_in_the_active_segment_stops_the_writer_and_a_reader(
    log_dir: Path, clock: ManualClock
) -> None:
    # The writer's size ends at a batch end, so its own reads know. A reader cannot
    # tell a length running past the file from the writer's append in flight, unless
    # the writer indexed a later batch.
    one_segment = LogConfig(index_interval_bytes=200)
    writer, reader, infos = writer_and_reader(log_dir, clock, one_segment, 20)
    bad = infos[10]
    flip(segment_path(log_dir, bad), bad.position + LENGTH_HIGH_BYTE)
    try:
        stops_at(writer, bad)
        assert "that the offset index names" in stops_at(reader, bad).reason
    finally:
        reader.close()
        writer.close()


def test_a_reader_passes_the_writers_half_written_batch_quietly(
    log_dir: Path, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    writer, reader, infos = writer_and_reader(log_dir, clock, CONFIG, 5)
    path = segment_path(log_dir, infos[-1])
    # The next batch, as the writer appends it, caught after its first bytes: the
    # reader refreshes then, with 10 bytes (less than a header) and with half of it.
    following = build_record_batch(
        [record_value(50 + k) for k in range(10)], timestamps=clock.now_ms, base_offset=50
    )
    for written in (10, len(following) // 2):
        with path.open("ab") as f:
            f.write(following[:written])
        reader.refresh()
        assert read_from(reader, 0) == (list(range(50)), None)
        assert reader.offset_for_timestamp(clock.now_ms) == 0
        with path.open("r+b") as f:
            f.truncate(len(path.read_bytes()) - written)
    with path.open("ab") as f:
        f.write(following)
    reader.refresh()
    assert read_from(reader, 0) == (list(range(60)), None)
    assert [r for r in caplog.records if r.levelname in ("WARNING", "ERROR")] == []
    reader.close()
    writer.close()


def test_a_reader_whose_view_predates_a_roll_reads_the_sealed_segment_to_its_end(
    log_dir: Path, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A refresh finds the next segment before it reads the older one's size again: in
    # between, the older segment is sealed but this reader's size for it is stale.
    writer, reader, _infos = writer_and_reader(log_dir, clock, CONFIG, 3)
    stale = reader.active_segment.log
    append_numbered(writer, range(3, BATCHES))
    assert writer.number_of_segments > 2
    monkeypatch.setattr(stale, "refresh_size", lambda: stale.size)
    reader.refresh()
    assert stale.size < writer.segments.first_segment.size  # type: ignore[union-attr]
    assert read_from(reader, 0) == (list(range(10 * BATCHES)), None)
    reader.close()
    writer.close()


def test_on_corrupt_skips_to_the_next_batch_that_frames(log_dir: Path, clock: ManualClock) -> None:
    infos = fill(log_dir, clock)
    crc_bad = infos[2]
    length_bad = middle_of_first_segment(infos)
    path = segment_path(log_dir, crc_bad)
    flip(path, crc_bad.position + crc_bad.size - 3)
    flip(path, length_bad.position + LENGTH_HIGH_BYTE)
    log = Log.open(log_dir / "t-0", CONFIG, clock=clock)
    skipped: list[tuple[int, int, int]] = []

    def on_corrupt(error: CorruptRecordError, resume: int) -> None:
        skipped.append((error.position, error.offset, resume))

    served = [
        record.offset
        for batch in log.batches(0, on_corrupt=on_corrupt)
        for record in batch.records()
    ]
    after_crc = crc_bad.last_offset + 1
    # Past the damaged length: the first batch an offset-index entry names after it.
    resume = skipped[1][2]
    assert skipped == [
        (crc_bad.position, crc_bad.first_offset, after_crc),
        (length_bad.position, length_bad.first_offset, resume),
    ]
    assert length_bad.last_offset < resume < first_of_next_segment(infos, length_bad).first_offset
    expected = [
        o
        for o in range(10 * BATCHES)
        if not crc_bad.first_offset <= o < after_crc and not length_bad.first_offset <= o < resume
    ]
    assert served == expected
    log.close()


def test_on_corrupt_skips_to_the_next_segment_when_no_index_entry_helps(
    log_dir: Path, clock: ManualClock
) -> None:
    infos = fill(log_dir, clock, SPARSE, tick=False)
    bad = [info for info in infos if info.segment_base_offset == 0][-2]
    flip(segment_path(log_dir, bad), bad.position + LENGTH_HIGH_BYTE)
    log = Log.open(log_dir / "t-0", SPARSE, clock=clock)
    index = log.segments.first_segment.offset_index  # type: ignore[union-attr]
    assert index.entry(index.entries - 1)[1] < bad.position  # no entry after it
    skipped: list[tuple[int, int]] = []
    batches = log.batches(
        0, on_corrupt=lambda error, resume: skipped.append((error.offset, resume))
    )
    served = [record.offset for batch in batches for record in batch.records()]
    following = first_of_next_segment(infos, bad).first_offset
    assert skipped == [(bad.first_offset, following)]
    assert served == [o for o in range(10 * BATCHES) if not bad.first_offset <= o < following]
    log.close()

"""A read-only log opened while its owner appends: no false corruption, no warning for a
batch caught half-written, a quiet close.

The writer writes log bytes before index entries. A reader that took its log size
before counting the index entries could count an entry naming a batch past that size,
take the index for corrupt and rebuild it in scratch space; and closing a reader must
not try to seal (append Kafka's final time-index entry to) such a scratch index.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

import storage.log.segment
from storage import Log, LogConfig
from storage.log.file_names import offset_index_file, time_index_file
from storage.log.offset_index import OffsetIndex
from tests.conftest import ManualClock

CONFIG = LogConfig(segment_bytes=100_000, index_interval_bytes=50)


def values(start: int, n: int) -> list[bytes]:
    return [b"value %d %s" % (i, b"x" * 40) for i in range(start, start + n)]


def read_all(log: Log) -> list[bytes | None]:
    return [record.value for record in log.records(log.log_start_offset)]


def writer_of_ten(log_dir: Path, clock: ManualClock) -> tuple[Log, list[bytes]]:
    """A writable log holding ten records, one batch each, and their values."""
    writer = Log.open(log_dir / "t-0", CONFIG, clock=clock)
    written = values(0, 10)
    for value in written:
        writer.append([value])
    return writer, written


def test_reader_opening_while_the_writer_appends(
    log_dir: Path,
    clock: ManualClock,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    writer, written = writer_of_ten(log_dir, clock)
    assert writer.active_segment.offset_index.entries > 0

    def offset_index_after_an_append(*args: object, **kwargs: object) -> OffsetIndex:
        # The interleaving: the reader opened the .log, then the writer appended a
        # batch (log bytes, then an index entry), then the reader opens the index.
        if kwargs.get("writable") is False:
            more = values(len(written), 1)
            writer.append(more)
            written.extend(more)
        return OffsetIndex(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(storage.log.segment, "OffsetIndex", offset_index_after_an_append)
    with caplog.at_level(logging.WARNING):
        reader = Log.open(writer.dir, CONFIG, clock=clock, writable=False)
    monkeypatch.undo()
    assert caplog.records == []  # no "corrupt index ... rebuilding"
    assert reader.active_segment.offset_index.writable is False  # the writer's own index
    reader.refresh()
    assert read_all(reader) == written
    reader.close()
    writer.close()
    assert caplog.records == []


def test_closing_a_reader_with_scratch_indexes_is_quiet(
    log_dir: Path, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    writer, written = writer_of_ten(log_dir, clock)
    # The reader finds no index files: it rebuilds them in scratch space (trimmed to
    # their entries).
    base = writer.active_segment.base_offset
    offset_index_file(writer.dir, base).unlink()
    time_index_file(writer.dir, base).unlink()
    reader = Log.open(writer.dir, CONFIG, clock=clock, writable=False)
    assert reader.active_segment.time_index.writable  # a scratch index
    clock.advance(1000)  # a newer max timestamp than the scratch index ends with
    more = values(10, 3)
    writer.append(more)
    reader.refresh()
    assert read_all(reader) == written + more
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        reader.close()
    assert caplog.records == []  # no "no final time-index entry"
    writer.close()


def test_a_half_written_batch_is_read_past_quietly_and_left_alone(
    log_dir: Path, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    # A reader opening without a clean-shutdown marker re-validates the active segment
    # and may meet the writer's append in progress: not a warning ("truncated" would
    # claim a change a reader never makes), and the file stays as it is.
    writer, written = writer_of_ten(log_dir, clock)
    writer.flush()
    path = writer.active_segment.path
    whole = path.read_bytes()
    last = list(writer.batches(0))[-1]
    with open(path, "ab") as f:  # the first half of the next batch, as a write in flight
        f.write(whole[last.position : last.position + last.size // 2])
    half_written = path.read_bytes()
    with caplog.at_level(logging.DEBUG, logger="storage"):
        reader = Log.open(writer.dir, CONFIG, clock=clock, writable=False, had_clean_shutdown=False)
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert any("up to its last valid batch" in r.getMessage() for r in caplog.records)
    assert read_all(reader) == written
    assert reader.log_end_offset == len(written)
    reader.close()
    assert path.read_bytes() == half_written
    writer.close()


def test_a_tail_hidden_for_a_gap_stays_hidden_on_refresh(log_dir: Path, clock: ManualClock) -> None:
    # Found by test_corruption (seed 26): the active segment's only batch, its base
    # offset damaged upwards (outside the CRC: a gap nothing after it can disprove),
    # is hidden by a reader's recovery after a crash; refresh() took it for a batch a
    # writer had appended since (it passes its CRC) and served it again, under offsets
    # it never had.
    writer, written = writer_of_ten(log_dir, clock)
    writer.roll()
    writer.append([b"after the roll"])
    writer.flush()
    path = writer.active_segment.path
    writer.close()
    data = bytearray(path.read_bytes())
    data[7] ^= 0x10  # the base offset's last byte: 10 -> 26
    path.write_bytes(data)
    reader = Log.open(
        log_dir / "t-0", CONFIG, clock=clock, writable=False, had_clean_shutdown=False
    )
    try:
        assert read_all(reader) == written
        for _ in range(2):
            reader.refresh()
            assert read_all(reader) == written
            assert reader.log_end_offset == len(written)
    finally:
        reader.close()

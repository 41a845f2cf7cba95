"""``Log.fetch``: the stored batches a Kafka Fetch sends, checked, as regions of their
files (descriptors of their own) or, for short runs, as bytes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from storage import FetchData, FileRegion, Log, LogConfig, OffsetOutOfRangeError
from storage.errors import CorruptRecordError
from storage.log.fetch_data import REGION_MIN_BYTES
from tests.conftest import ManualClock

BATCH_VALUES = 40
VALUE = b"v" * 500  # a batch of about 20 KiB


def open_log(directory: Path, clock: ManualClock, **config: object) -> Log:
    return Log.open(directory / "t-0", LogConfig(**config), clock=clock)  # type: ignore[arg-type]


def fill(log: Log, batches: int) -> None:
    for _ in range(batches):
        log.append([VALUE] * BATCH_VALUES)


def stored(log: Log) -> bytes:
    """Every segment file's bytes, in log order."""
    return b"".join(s.path.read_bytes() for s in log.segments.values())


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def regions(data: FetchData) -> list[FileRegion]:
    return [p for p in data.parts if isinstance(p, FileRegion)]


def test_a_fetch_is_the_stored_bytes_one_region_per_segment(
    log_dir: Path, clock: ManualClock
) -> None:
    log = open_log(log_dir, clock, segment_bytes=200_000)
    fill(log, 40)
    segments = log.segments.values()
    assert len(segments) >= 4  # the fetch crosses segments
    before = open_descriptors()
    data = log.fetch(0, 100 << 20)
    try:
        assert data.to_bytes() == stored(log)
        assert len(data) == log.size
        # Each segment's batches lie back to back: one region each, sent from the file.
        assert [r.path for r in regions(data)] == [s.path for s in segments]
        assert all(r.size >= REGION_MIN_BYTES for r in regions(data))
        assert open_descriptors() == before + len(regions(data))
    finally:
        data.close()
    assert open_descriptors() == before
    log.close()


def test_short_runs_are_copied_and_a_fetch_holds_no_descriptor(
    log_dir: Path, clock: ManualClock
) -> None:
    log = open_log(log_dir, clock)
    for i in range(50):
        log.append([b"record %d" % i])
    before = open_descriptors()
    data = log.fetch(10, 1 << 20)
    assert not regions(data)
    assert open_descriptors() == before
    # From the batch holding offset 10 (one record a batch here) to the end.
    segment = log.segments.values()[0]
    found = segment.translate_offset(10)
    assert found is not None
    assert data.to_bytes() == segment.path.read_bytes()[found.position :]
    data.close()
    log.close()


def test_max_bytes_ends_at_a_whole_batch_and_the_first_comes_whole(
    log_dir: Path, clock: ManualClock
) -> None:
    log = open_log(log_dir, clock)
    fill(log, 10)
    batch_size = len(stored(log)) // 10
    with_limit = log.fetch(0, 3 * batch_size + batch_size // 2)
    assert len(with_limit) == 3 * batch_size
    assert with_limit.to_bytes() == stored(log)[: 3 * batch_size]
    with_limit.close()
    # Below one batch: the first batch whole (KIP-74), or nothing when not asked.
    first = log.fetch(BATCH_VALUES, 10)
    assert first.to_bytes() == stored(log)[batch_size : 2 * batch_size]
    first.close()
    assert len(log.fetch(0, 10, min_one_batch=False)) == 0
    log.close()


def test_regions_stay_readable_after_retention_deletes_their_files(
    log_dir: Path, clock: ManualClock
) -> None:
    log = open_log(log_dir, clock, segment_bytes=200_000, retention_bytes=1, file_delete_delay_ms=0)
    fill(log, 30)
    expected = stored(log)
    data = log.fetch(0, 100 << 20)
    first_file = log.segments.values()[0].path
    deleted = log.delete_old_segments()
    log.delete_expired_files()
    assert deleted >= 2
    assert not first_file.exists()
    try:
        # What was checked is what is sent, though the files are gone meanwhile.
        assert data.to_bytes() == expected
    finally:
        data.close()
    log.close()


def test_damage_ends_a_fetch_before_it_and_fails_the_next(
    log_dir: Path, clock: ManualClock
) -> None:
    log = open_log(log_dir, clock)
    fill(log, 6)
    path = log.segments.values()[0].path
    log.close()
    raw = bytearray(path.read_bytes())
    batch_size = len(raw) // 6
    raw[3 * batch_size + 100] ^= 0xFF  # inside the fourth batch's CRC-covered records
    path.write_bytes(raw)
    log = open_log(log_dir, clock)
    data = log.fetch(0, 100 << 20)
    assert data.to_bytes() == bytes(raw[: 3 * batch_size])
    data.close()
    log.fetch(2 * BATCH_VALUES, 1).close()  # the offset index is opened on first use
    before = open_descriptors()
    with pytest.raises(CorruptRecordError) as raised:
        log.fetch(3 * BATCH_VALUES, 100 << 20)
    assert raised.value.offset == 3 * BATCH_VALUES
    del raised  # its traceback holds the scan's frames, and their descriptor
    assert open_descriptors() == before
    log.close()


def test_out_of_range(log_dir: Path, clock: ManualClock) -> None:
    log = open_log(log_dir, clock)
    fill(log, 2)
    with pytest.raises(OffsetOutOfRangeError):
        log.fetch(log.log_end_offset + 1, 1 << 20)
    assert len(log.fetch(log.log_end_offset, 1 << 20)) == 0
    log.close()

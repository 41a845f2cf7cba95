"""The sorted map of segments: floor/higher lookups, snapshots, removal, invariants."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from storage.log.log_config import LogConfig
from storage.log.log_segments import LogSegments
from storage.log.segment import AppendedBatch, LogSegment
from storage.record.batch_builder import build_record_batch

CREATED_MS = 1_700_000_000_000


def open_segment(directory: Path, base_offset: int, records: int = 0) -> LogSegment:
    segment = LogSegment.open(directory, base_offset, LogConfig(), CREATED_MS)
    if records:
        data = build_record_batch(
            [b"v%d" % i for i in range(records)], timestamps=CREATED_MS, base_offset=base_offset
        )
        segment.append(
            data, [AppendedBatch(base_offset, base_offset + records - 1, CREATED_MS, len(data))]
        )
    return segment


@pytest.fixture
def opened() -> Iterator[list[LogSegment]]:
    """Segments the test opens; all closed at the end."""
    segments: list[LogSegment] = []
    yield segments
    for segment in segments:
        segment.close()


@pytest.fixture
def three(log_dir: Path, opened: list[LogSegment]) -> LogSegments:
    """Segments at 0 (offsets 0-9), 10 (10-14) and 20 (20-24, a gap before it)."""
    segments = LogSegments()
    for base, records in [(20, 5), (0, 10), (10, 5)]:
        segment = open_segment(log_dir, base, records)
        opened.append(segment)
        segments.add(segment)
    segments._check()
    return segments


def bases(segments: list[LogSegment]) -> list[int]:
    return [s.base_offset for s in segments]


def test_empty_map_has_no_segments() -> None:
    segments = LogSegments()
    assert len(segments) == 0
    assert segments.first_segment is None
    assert segments.last_segment is None
    assert segments.floor_segment(0) is None
    assert segments.higher_segment(-1) is None
    assert segments.values() == []
    assert segments.values(5) == []
    assert segments.base_offsets() == []
    assert segments.size_in_bytes() == 0
    assert list(segments) == []
    segments._check()


def test_segments_are_kept_in_base_offset_order(three: LogSegments) -> None:
    assert three.base_offsets() == [0, 10, 20]
    assert bases(three.values()) == [0, 10, 20]
    assert bases(list(three)) == [0, 10, 20]
    assert len(three) == 3
    first, last = three.first_segment, three.last_segment
    assert first is not None
    assert first.base_offset == 0
    assert last is not None
    assert last.base_offset == 20


@pytest.mark.parametrize(
    ("offset", "expected"),
    [
        (-1, None),  # before the first base offset
        (0, 0),  # at a base offset
        (5, 0),  # between base offsets
        (9, 0),
        (10, 10),
        (14, 10),
        (17, 10),  # in the gap between segments: the earlier one
        (20, 20),
        (24, 20),
        (10**12, 20),  # after the last
    ],
)
def test_floor_segment_holds_the_offset(
    three: LogSegments, offset: int, expected: int | None
) -> None:
    found = three.floor_segment(offset)
    assert (found.base_offset if found is not None else None) == expected


@pytest.mark.parametrize(
    ("offset", "expected"),
    [(-1, 0), (0, 10), (5, 10), (9, 10), (10, 20), (19, 20), (20, None), (10**12, None)],
)
def test_higher_segment_is_strictly_after_the_offset(
    three: LogSegments, offset: int, expected: int | None
) -> None:
    found = three.higher_segment(offset)
    assert (found.base_offset if found is not None else None) == expected


@pytest.mark.parametrize(
    ("from_offset", "expected"),
    [
        (None, [0, 10, 20]),
        (-5, [0, 10, 20]),
        (0, [0, 10, 20]),
        (9, [0, 10, 20]),
        (10, [10, 20]),
        (19, [10, 20]),
        (20, [20]),
        (10**12, [20]),
    ],
)
def test_values_from_offset_start_at_the_segment_holding_it(
    three: LogSegments, from_offset: int | None, expected: list[int]
) -> None:
    assert bases(three.values(from_offset)) == expected


def test_values_is_a_snapshot(three: LogSegments) -> None:
    snapshot = three.values()
    iterator = iter(three)
    removed = three.remove(10)
    assert bases(snapshot) == [0, 10, 20]
    assert bases(list(iterator)) == [0, 10, 20]
    assert bases(three.values()) == [0, 20]
    assert removed in snapshot


def test_get_and_contains(three: LogSegments) -> None:
    segment = three.get(10)
    assert segment is not None
    assert segment.base_offset == 10
    assert three.get(11) is None
    assert 10 in three
    assert 11 not in three
    assert "10" not in three


def test_remove_returns_the_segment_and_updates_lookups(three: LogSegments) -> None:
    removed = three.remove(10)
    assert removed.base_offset == 10
    assert 10 not in three
    assert len(three) == 2
    floor = three.floor_segment(12)
    higher = three.higher_segment(0)
    assert floor is not None
    assert floor.base_offset == 0
    assert higher is not None
    assert higher.base_offset == 20
    three._check()
    three.remove(0)
    three.remove(20)
    assert len(three) == 0
    assert three.first_segment is None


def test_removing_an_absent_base_offset_raises_key_error(three: LogSegments) -> None:
    with pytest.raises(KeyError):
        three.remove(5)
    assert three.base_offsets() == [0, 10, 20]


def test_add_replaces_the_segment_at_the_same_base_offset(
    log_dir: Path, opened: list[LogSegment], three: LogSegments
) -> None:
    other = log_dir / "other"
    other.mkdir()
    replacement = open_segment(other, 10)
    opened.append(replacement)
    three.add(replacement)
    assert len(three) == 3
    assert three.get(10) is replacement
    three._check()


def test_add_all_and_remove_all_publish_what_one_at_a_time_would(
    log_dir: Path, opened: list[LogSegment]
) -> None:
    segments = LogSegments()
    made = [open_segment(log_dir, base, 5) for base in (40, 0, 20, 10, 30)]
    opened.extend(made)
    segments.add_all(made)
    segments._check()
    assert segments.base_offsets() == [0, 10, 20, 30, 40]
    floor = segments.floor_segment(27)
    assert floor is not None
    assert floor.base_offset == 20  # the lock-free lookups see the new snapshot
    assert bases(segments.remove_all([10, 30])) == [10, 30]
    segments._check()
    assert bases(segments.values()) == [0, 20, 40]
    higher = segments.higher_segment(5)
    assert higher is not None
    assert higher.base_offset == 20
    with pytest.raises(KeyError):
        segments.remove_all([0, 15])  # 0 goes, then 15 is missing
    assert segments.base_offsets() == [20, 40]
    first = segments.first_segment
    assert first is not None
    assert first.base_offset == 20  # published although a key was missing
    segments._check()


def test_size_in_bytes_is_the_size_of_the_log_files_on_disk(three: LogSegments) -> None:
    on_disk = sum(os.path.getsize(segment.path) for segment in three.values())
    assert on_disk > 0
    assert three.size_in_bytes() == on_disk


def test_check_rejects_overlapping_segments(log_dir: Path, opened: list[LogSegment]) -> None:
    segments = LogSegments()
    first = open_segment(log_dir, 0, 10)  # offsets 0-9
    second = open_segment(log_dir, 5, 1)
    opened.extend([first, second])
    segments.add(first)
    segments.add(second)
    with pytest.raises(AssertionError):
        segments._check()
    segments.remove(5)
    segments._check()


def test_check_accepts_adjacent_segments(log_dir: Path, opened: list[LogSegment]) -> None:
    segments = LogSegments()
    first = open_segment(log_dir, 0, 10)
    second = open_segment(log_dir, 10, 1)
    opened.extend([first, second])
    segments.add(first)
    segments.add(second)
    segments._check()


def test_check_rejects_a_segment_under_a_wrong_key(log_dir: Path, opened: list[LogSegment]) -> None:
    segments = LogSegments()
    segment = open_segment(log_dir, 3)
    opened.append(segment)
    segments._segments[4] = segment
    with pytest.raises(AssertionError):
        segments._check()

"""A segment's .log file: appends, batch scans across read chunks, partial tails, searches."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from storage.errors import CorruptRecordError
from storage.record import file_records
from storage.record.batch_builder import build_record_batch
from storage.record.file_records import FileRecords, OffsetPosition, TimestampAndOffset

TS = 1_700_000_000_000


def batch(base_offset: int, count: int = 3, size: int = 10, ts: int | list[int] = TS) -> bytes:
    return build_record_batch(
        [b"%d" % (base_offset + i) + b"." * size for i in range(count)],
        timestamps=ts,
        base_offset=base_offset,
    )


@pytest.fixture
def writer(log_dir: Path) -> Iterator[FileRecords]:
    records = FileRecords(log_dir / "00000000000000000000.log", writable=True)
    yield records
    records.close()


@pytest.fixture
def reader(log_dir: Path, writer: FileRecords) -> Iterator[FileRecords]:
    records = FileRecords(writer.path, writable=False)
    yield records
    records.close()


def fill(records: FileRecords, batches: list[bytes]) -> list[int]:
    return [records.append(data) for data in batches]


def scan(records: FileRecords, start: int = 0, end: int | None = None) -> list[tuple[int, int]]:
    return [(b.position, b.base_offset) for b in records.batches(start, end)]


def layout(batches: list[bytes]) -> list[tuple[int, int]]:
    """(position, base offset) of each batch written back to back."""
    result, position = [], 0
    for data in batches:
        result.append((position, int.from_bytes(data[:8], "big")))
        position += len(data)
    return result


# -- appending ---------------------------------------------------------------------


def test_append_returns_positions_and_grows_size(writer: FileRecords) -> None:
    batches = [batch(0), batch(3, count=5), batch(8, size=500)]
    positions = fill(writer, batches)
    assert positions == [p for p, _ in layout(batches)]
    assert writer.size == sum(map(len, batches))
    assert writer.path.read_bytes() == b"".join(batches)


def test_a_new_file_is_empty_and_an_existing_one_opens_at_its_size(log_dir: Path) -> None:
    path = log_dir / "x.log"
    records = FileRecords(path, writable=True)
    assert records.size == 0
    assert list(records.batches()) == []
    records.append(batch(0))
    records.close()
    again = FileRecords(path, writable=True)
    assert again.size == len(batch(0))
    assert again.append(batch(3)) == len(batch(0))
    again.close()


def test_read_only_open_of_a_missing_file_raises(log_dir: Path) -> None:
    with pytest.raises(FileNotFoundError):
        FileRecords(log_dir / "absent.log", writable=False)
    assert not (log_dir / "absent.log").exists()


def test_append_failing_leaves_size_and_file_unchanged(
    writer: FileRecords, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = batch(0)
    writer.append(first)

    def fail(_fd: int, _data: bytes) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", fail)
    with pytest.raises(OSError, match="No space left"):
        writer.append(batch(3))
    monkeypatch.undo()
    assert writer.size == len(first)
    assert writer.path.read_bytes() == first
    assert writer.append(batch(3)) == len(first)


def test_append_failing_after_a_short_write_truncates_it_away(
    writer: FileRecords, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = batch(0)
    writer.append(first)
    real_write = os.write
    calls = 0

    def short_then_fail(fd: int, data: bytes | memoryview) -> int:
        nonlocal calls
        calls += 1
        if calls == 1:
            return real_write(fd, bytes(data[:20]))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", short_then_fail)
    with pytest.raises(OSError, match="No space left"):
        writer.append(batch(3, size=100))
    monkeypatch.undo()
    assert calls == 2
    assert writer.size == len(first)
    assert writer.path.read_bytes() == first


def test_a_short_write_is_continued(writer: FileRecords, monkeypatch: pytest.MonkeyPatch) -> None:
    real_write = os.write

    def at_most_50(fd: int, data: bytes | memoryview) -> int:
        return real_write(fd, bytes(data[:50]))

    data = batch(0, size=200)
    monkeypatch.setattr(os, "write", at_most_50)
    assert writer.append(data) == 0
    monkeypatch.undo()
    assert writer.path.read_bytes() == data
    assert writer.size == len(data)


# -- reading -----------------------------------------------------------------------


def test_read_never_returns_bytes_past_size(writer: FileRecords) -> None:
    data = batch(0)
    writer.append(data)
    assert writer.read(0, 10) == data[:10]
    assert writer.read(5, 10**6) == data[5:]
    assert writer.read(len(data), 10) == b""
    assert writer.read(len(data) + 5, 10) == b""


def test_batches_walks_every_batch_in_order(writer: FileRecords) -> None:
    batches = [batch(3 * i, size=i * 7) for i in range(30)]
    fill(writer, batches)
    assert scan(writer) == layout(batches)
    assert [b.to_bytes() for b in writer.batches()] == batches
    assert all(b.is_valid() for b in writer.batches())


def test_batches_from_a_batch_start(writer: FileRecords) -> None:
    batches = [batch(3 * i) for i in range(10)]
    fill(writer, batches)
    expected = layout(batches)
    for i, (position, _) in enumerate(expected):
        assert scan(writer, position) == expected[i:]
    assert scan(writer, writer.size) == []
    assert scan(writer, writer.size + 100) == []


def test_batches_up_to_end_only_returns_batches_ending_before_it(writer: FileRecords) -> None:
    batches = [batch(3 * i) for i in range(5)]
    fill(writer, batches)
    expected = layout(batches)
    starts = [p for p, _ in expected]
    assert scan(writer, 0, starts[2]) == expected[:2]
    assert scan(writer, 0, starts[2] + 1) == expected[:2]
    assert scan(writer, 0, starts[3] - 1) == expected[:2]
    assert scan(writer, starts[1], starts[4]) == expected[1:4]
    assert scan(writer, 0, 0) == []
    assert scan(writer, 0, 10**9) == expected


def test_empty_batch_is_walked(writer: FileRecords) -> None:
    empty = build_record_batch([], timestamps=TS, base_offset=3, last_offset_delta=4)
    batches = [batch(0), empty, batch(8)]
    fill(writer, batches)
    walked = list(writer.batches())
    assert [b.next_offset for b in walked] == [3, 8, 11]


def test_batches_stop_silently_at_a_partial_tail_cut_at_every_byte(log_dir: Path) -> None:
    batches = [batch(0), batch(3, size=50), batch(6, count=4, size=30)]
    whole = b"".join(batches)
    complete = layout(batches)[:-1]
    path = log_dir / "cut.log"
    for cut in range(len(whole) - len(batches[-1]), len(whole)):
        path.write_bytes(whole[:cut])
        records = FileRecords(path, writable=False)
        try:
            assert scan(records) == complete, cut
        finally:
            records.close()


@pytest.mark.parametrize(
    ("first_read", "chunk"),
    [(17, 17), (17, 64), (32, 100), (61, 61), (100, 1000), (150, 150), (1000, 3000)],
)
def test_batches_straddling_read_chunks_are_each_returned_once(
    writer: FileRecords, monkeypatch: pytest.MonkeyPatch, first_read: int, chunk: int
) -> None:
    monkeypatch.setattr(file_records, "FIRST_READ_BYTES", first_read)
    monkeypatch.setattr(file_records, "READ_CHUNK_BYTES", chunk)
    # Sizes from 78 bytes up to several times the largest chunk, in an irregular order.
    sizes = [0, 5, 300, 1, 40, 3000, 2, 9, 120, 0, 700, 33, 17, 4000, 1, 1]
    batches = [batch(3 * i, size=s) for i, s in enumerate(sizes)]
    fill(writer, batches)
    expected = layout(batches)
    assert scan(writer) == expected
    assert [b.to_bytes() for b in writer.batches()] == batches
    for i in (1, 5, 13):
        assert scan(writer, expected[i][0]) == expected[i:]


@pytest.mark.parametrize("chunk", [64, 200])
def test_partial_tail_with_small_chunks_stops_after_the_complete_batches(
    log_dir: Path, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    monkeypatch.setattr(file_records, "FIRST_READ_BYTES", chunk)
    monkeypatch.setattr(file_records, "READ_CHUNK_BYTES", chunk)
    batches = [batch(0, size=150), batch(3), batch(6, size=400)]
    whole = b"".join(batches)
    path = log_dir / "cut.log"
    for cut in (len(whole) - 1, len(whole) - 300, len(whole) - len(batches[-1]) + 17):
        path.write_bytes(whole[:cut])
        records = FileRecords(path, writable=False)
        try:
            assert scan(records) == layout(batches)[:2], cut
        finally:
            records.close()


def test_a_batch_larger_than_the_default_first_read_is_returned(writer: FileRecords) -> None:
    big = batch(0, count=2, size=file_records.FIRST_READ_BYTES)
    batches = [batch(0, count=1), with_base(big, 1), batch(3)]
    fill(writer, batches)
    assert scan(writer) == layout(batches)


def with_base(data: bytes, base_offset: int) -> bytes:
    return base_offset.to_bytes(8, "big") + data[8:]


@pytest.mark.parametrize(
    ("header", "reason"),
    [
        (
            (0).to_bytes(8, "big") + (10).to_bytes(4, "big") + b"\xff\xff\xff\xff\x02",
            "below the minimum",
        ),
        (
            (0).to_bytes(8, "big") + (100).to_bytes(4, "big") + b"\xff\xff\xff\xff\x07",
            "unknown magic 7",
        ),
        (
            (0).to_bytes(8, "big") + (-5).to_bytes(4, "big", signed=True) + b"\x00\x00\x00\x00\x02",
            "below the minimum",
        ),
    ],
)
@pytest.mark.parametrize("chunk", [None, 64])
def test_an_impossible_header_raises_naming_the_path_and_position(
    writer: FileRecords,
    monkeypatch: pytest.MonkeyPatch,
    header: bytes,
    reason: str,
    chunk: int | None,
) -> None:
    if chunk is not None:
        monkeypatch.setattr(file_records, "FIRST_READ_BYTES", chunk)
        monkeypatch.setattr(file_records, "READ_CHUNK_BYTES", chunk)
    good = [batch(0), batch(3)]
    fill(writer, good)
    writer.append(header + b"\x00" * 100)
    bad_position = sum(map(len, good))
    walked: list[object] = []
    with pytest.raises(CorruptRecordError, match=reason) as info:
        walked.extend(writer.batches())
    assert len(walked) == 2
    assert info.value.path == writer.path
    assert info.value.position == bad_position
    assert str(writer.path) in str(info.value)


# -- searching ---------------------------------------------------------------------


def test_search_for_offset_finds_the_batch_holding_it(writer: FileRecords) -> None:
    # Batches [0-2], [3-5], a gap, [10-12].
    batches = [batch(0), batch(3), batch(10)]
    positions = fill(writer, batches)
    sizes = [len(b) for b in batches]
    expected = {
        0: OffsetPosition(2, positions[0], sizes[0]),
        2: OffsetPosition(2, positions[0], sizes[0]),
        3: OffsetPosition(5, positions[1], sizes[1]),
        5: OffsetPosition(5, positions[1], sizes[1]),
        6: OffsetPosition(12, positions[2], sizes[2]),
        9: OffsetPosition(12, positions[2], sizes[2]),
        12: OffsetPosition(12, positions[2], sizes[2]),
    }
    for offset, found in expected.items():
        assert writer.search_for_offset(offset) == found, offset
    assert writer.search_for_offset(13) is None
    assert writer.search_for_offset(-1) == expected[0]


def test_search_for_offset_scans_from_start(writer: FileRecords) -> None:
    positions = fill(writer, [batch(0), batch(3), batch(6)])
    found = writer.search_for_offset(1, positions[1])
    assert found is not None
    assert found.position == positions[1]
    assert writer.search_for_offset(1, positions[2] + len(batch(6))) is None


def test_search_for_timestamp_finds_the_first_record_at_or_after(writer: FileRecords) -> None:
    # Offsets 0-2 at TS+10, TS+30, TS+20; offsets 3-5 at TS+5, TS+40, TS+25.
    fill(
        writer,
        [
            batch(0, ts=[TS + 10, TS + 30, TS + 20]),
            batch(3, ts=[TS + 5, TS + 40, TS + 25]),
        ],
    )
    search = writer.search_for_timestamp
    assert search(TS, 0, 0) == TimestampAndOffset(TS + 10, 0)
    assert search(TS + 11, 0, 0) == TimestampAndOffset(TS + 30, 1)
    assert search(TS + 30, 0, 0) == TimestampAndOffset(TS + 30, 1)
    assert search(TS + 31, 0, 0) == TimestampAndOffset(TS + 40, 4)
    assert search(TS + 20, 0, 2) == TimestampAndOffset(TS + 20, 2)
    assert search(TS + 21, 0, 2) == TimestampAndOffset(TS + 40, 4)
    assert search(TS, 0, 3) == TimestampAndOffset(TS + 5, 3)
    assert search(TS + 41, 0, 0) is None
    assert search(TS, 0, 6) is None
    second = len(batch(0, ts=[TS + 10, TS + 30, TS + 20]))
    assert search(TS, second, 0) == TimestampAndOffset(TS + 5, 3)


def test_largest_timestamp_after_reports_the_first_batch_with_the_max(
    writer: FileRecords,
) -> None:
    positions = fill(
        writer,
        [batch(0, ts=TS + 5), batch(3, ts=[TS, TS + 50, TS]), batch(6, ts=TS + 50), batch(9)],
    )
    assert writer.largest_timestamp_after(0) == TimestampAndOffset(TS + 50, 5)
    assert writer.largest_timestamp_after(positions[2]) == TimestampAndOffset(TS + 50, 8)
    assert writer.largest_timestamp_after(positions[3]) == TimestampAndOffset(TS, 11)
    assert writer.largest_timestamp_after(writer.size) == TimestampAndOffset(-1, -1)


# -- views, truncation, lifecycle ------------------------------------------------


def test_read_only_truncate_only_shrinks_the_view(writer: FileRecords, reader: FileRecords) -> None:
    batches = [batch(0), batch(3), batch(6)]
    positions = fill(writer, batches)
    reader.refresh_size()
    assert reader.truncate_to(positions[2]) == len(batches[2])
    assert reader.size == positions[2]
    assert scan(reader) == layout(batches)[:2]
    assert reader.read(positions[2], 10) == b""
    assert writer.path.read_bytes() == b"".join(batches)
    assert os.path.getsize(writer.path) == writer.size


def test_refresh_size_sees_appends_by_a_writer(writer: FileRecords, reader: FileRecords) -> None:
    assert reader.size == 0
    writer.append(batch(0))
    assert scan(reader) == []
    assert reader.refresh_size() == writer.size
    writer.append(batch(3))
    assert reader.refresh_size() == writer.size
    assert [o for _, o in scan(reader)] == [0, 3]


def test_writable_truncate_cuts_the_file(writer: FileRecords) -> None:
    positions = fill(writer, [batch(0), batch(3), batch(6)])
    removed = writer.truncate_to(positions[1])
    assert removed == len(batch(3)) + len(batch(6))
    assert writer.size == positions[1] == os.path.getsize(writer.path)
    assert writer.truncate_to(writer.size) == 0
    assert writer.append(batch(3)) == positions[1]
    assert [o for _, o in scan(writer)] == [0, 3]


@pytest.mark.parametrize("size", [-1, 10**6])
def test_truncate_outside_the_file_raises(writer: FileRecords, size: int) -> None:
    writer.append(batch(0))
    with pytest.raises(ValueError, match="cannot truncate"):
        writer.truncate_to(size)
    assert writer.size == len(batch(0))


def test_rename_keeps_the_descriptor(writer: FileRecords) -> None:
    writer.append(batch(0))
    new_path = writer.path.with_name(writer.path.name + ".deleted")
    writer.rename_to(new_path)
    assert writer.path == new_path
    assert new_path.exists()
    writer.append(batch(3))
    assert [o for _, o in scan(writer)] == [0, 3]
    assert new_path.stat().st_size == writer.size


def test_delete_if_exists_closes_and_removes(log_dir: Path) -> None:
    records = FileRecords(log_dir / "d.log", writable=True)
    records.append(batch(0))
    records.flush()
    assert records.delete_if_exists() is True
    assert not (log_dir / "d.log").exists()
    assert records.delete_if_exists() is False
    records.close()  # idempotent

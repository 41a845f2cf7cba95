"""The extension index: a caller-defined cumulative size, kept in step with segments."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from storage import ExtensionIndexSpec, Log, LogConfig, LogManager, TopicMetadata
from storage.errors import InvalidOffsetError
from storage.log.extension_index import ExtensionIndex
from storage.record.record_batch import RecordBatch
from tests.conftest import ManualClock

SUFFIX = ".testunits"


def line_units(batch: RecordBatch) -> int:
    """What a line renders to: the value and a newline."""
    return sum(len(record.value or b"") + 1 for record in batch.records())


SPEC = ExtensionIndexSpec(SUFFIX, interval=64, measure=line_units)


def open_log(directory: Path, clock: ManualClock, **config: object) -> Log:
    settings: dict[str, object] = {"segment_bytes": 600, "index_interval_bytes": 50}
    settings.update(config)
    return Log.open(
        directory / "t-0",
        LogConfig(**settings),  # type: ignore[arg-type]
        clock=clock,
        extension=SPEC,
    )


def lines(n: int, start: int = 0) -> list[bytes]:
    return [b"line %d %s" % (i, b"x" * (i % 7)) for i in range(start, start + n)]


def append_lines(log: Log, values: list[bytes], *, pass_units: bool = True) -> None:
    log.append(values, units=sum(len(v) + 1 for v in values) if pass_units else None)


def expected_positions(values: list[bytes]) -> list[int]:
    positions, total = [], 0
    for value in values:
        positions.append(total)
        total += len(value) + 1
    return positions


def index_files(log: Log) -> list[str]:
    return sorted(name for name in os.listdir(log.dir) if SUFFIX in name)


def assert_floors_exact(log: Log, values: list[bytes], first_offset: int = 0) -> None:
    """Every floor the index gives names a batch start and the right units before it."""
    positions = expected_positions(values)
    end = positions[-1] + len(values[-1]) + 1 if values else 0
    assert log.extension_end == end
    for units in range(positions[first_offset], end, 13):
        offset, before = log.extension_floor(units)
        assert first_offset <= offset < len(values)
        assert before == positions[offset] <= units
        batch = next(log.batches(offset))
        assert batch.base_offset == offset
    for offset in range(first_offset, len(values), 5):
        found, before = log.extension_position(offset)
        assert found <= offset
        assert before == positions[found]


def test_units_add_up_across_rolls(log_dir: Path, clock: ManualClock) -> None:
    log = open_log(log_dir, clock)
    values = []
    for i in range(40):
        batch = lines(3, 3 * i)
        append_lines(log, batch)
        values += batch
    assert log.number_of_segments > 3
    assert_floors_exact(log, values)
    # One index file per segment; each segment starts where the previous one ended.
    assert len(index_files(log)) == log.number_of_segments
    log._check()
    log.close()


def test_measured_units_equal_passed_units(log_dir: Path, clock: ManualClock) -> None:
    passed = open_log(log_dir / "a", clock)
    measured = open_log(log_dir / "b", clock)
    for i in range(30):
        append_lines(passed, lines(2, 2 * i))
        append_lines(measured, lines(2, 2 * i), pass_units=False)
    assert passed.extension_end == measured.extension_end
    for log in (passed, measured):
        log.close()
    names = index_files(passed)
    assert names == index_files(measured)
    for name in names:
        assert (passed.dir / name).read_bytes() == (measured.dir / name).read_bytes()


def test_retention_keeps_the_units_of_retained_records(log_dir: Path, clock: ManualClock) -> None:
    log = open_log(log_dir, clock, retention_bytes=1500, file_delete_delay_ms=0)
    values: list[bytes] = []
    for i in range(40):
        batch = lines(3, 3 * i)
        append_lines(log, batch)
        values += batch
    end = log.extension_end
    assert log.delete_old_segments() > 0
    start = log.log_start_offset
    assert start > 0
    assert log.extension_end == end
    assert log.extension_start == expected_positions(values)[start]
    # Below the oldest retained segment the floor is that segment's start.
    assert log.extension_floor(0) == (start, log.extension_start)
    assert_floors_exact(log, values, first_offset=start)
    assert len(index_files(log)) == log.number_of_segments
    log._check()
    log.close()


@pytest.mark.parametrize("damage", ["clean", "crash", "missing", "garbage", "shifted"])
def test_reopen_rebuilds_what_is_wrong(log_dir: Path, clock: ManualClock, damage: str) -> None:
    log = open_log(log_dir, clock)
    values: list[bytes] = []
    for i in range(30):
        batch = lines(3, 3 * i)
        append_lines(log, batch)
        values += batch
    names = index_files(log)
    log.close()
    target = log.dir / names[1]
    if damage == "missing":
        target.unlink()
    elif damage == "garbage":
        target.write_bytes(os.urandom(36))
    elif damage == "shifted":
        # Well-formed but out of step: entry 0 claims a different start.
        data = bytearray(target.read_bytes())
        data[0:8] = (12345).to_bytes(8, "big")
        target.write_bytes(bytes(data))
    reopened = Log.open(
        log.dir,
        log.config,
        clock=clock,
        extension=SPEC,
        had_clean_shutdown=damage != "crash",
    )
    assert_floors_exact(reopened, values)
    reopened._check()
    reopened.close()


def test_read_only_log_follows_the_writer(log_dir: Path, clock: ManualClock) -> None:
    writer = open_log(log_dir, clock)
    values = lines(3)
    append_lines(writer, values)
    reader = Log.open(writer.dir, writer.config, clock=clock, writable=False, extension=SPEC)
    assert reader.extension_end == writer.extension_end
    for i in range(1, 30):
        batch = lines(3, 3 * i)
        append_lines(writer, batch)
        values += batch
    before = {name: (writer.dir / name).stat().st_mtime_ns for name in os.listdir(writer.dir)}
    reader.refresh()
    assert reader.number_of_segments == writer.number_of_segments > 1
    assert_floors_exact(reader, values)
    after = {name: (writer.dir / name).stat().st_mtime_ns for name in os.listdir(writer.dir)}
    assert before == after  # the reader changed no file
    reader.close()
    writer.close()


def test_truncation_drops_entries_past_the_new_end(log_dir: Path, clock: ManualClock) -> None:
    log = open_log(log_dir, clock, segment_bytes=100_000)
    values: list[bytes] = []
    for i in range(30):
        batch = lines(3, 3 * i)
        append_lines(log, batch)
        values += batch
    log.truncate_to(45)
    assert_floors_exact(log, values[:45])
    append_lines(log, lines(3, 45))
    assert_floors_exact(log, values[:45] + lines(3, 45))
    log._check()
    log.close()


def test_index_files_are_renamed_and_deleted_with_their_segment(
    log_dir: Path, clock: ManualClock
) -> None:
    log = open_log(log_dir, clock, retention_bytes=1500, file_delete_delay_ms=1000)
    for i in range(40):
        append_lines(log, lines(3, 3 * i))
    deleted = log.delete_old_segments()
    assert len([n for n in index_files(log) if n.endswith(".deleted")]) == deleted
    clock.advance(1000)
    log.delete_expired_files()
    assert not [n for n in os.listdir(log.dir) if n.endswith(".deleted")]
    assert len(index_files(log)) == log.number_of_segments
    log.close()


def test_manager_gives_each_topic_its_spec(log_dir: Path, clock: ManualClock) -> None:
    def factory(metadata: TopicMetadata) -> ExtensionIndexSpec | None:
        return SPEC if metadata.format == "lines" else None

    with LogManager.open(log_dir, clock=clock, extension=factory) as manager:
        manager.create_topic("text", 1)
        manager.create_topic("blobs", 1, format="raw")
        manager.log("text", 0).append([b"hello"])
        manager.log("blobs", 0).append([b"hello"])
        assert manager.log("text", 0).extension_end == 6
        assert manager.log("blobs", 0).extension_end == 0
    assert [n for n in os.listdir(log_dir / "text-0") if n.endswith(SUFFIX)]
    assert not [n for n in os.listdir(log_dir / "blobs-0") if n.endswith(SUFFIX)]
    with LogManager.open(log_dir, clock=clock, extension=factory) as manager:
        assert manager.log("text", 0).extension_end == 6


def test_spec_refuses_the_engines_suffixes() -> None:
    for suffix in (".log", ".index", ".timeindex", ".deleted", "log", "."):
        with pytest.raises(ValueError, match="suffix"):
            ExtensionIndexSpec(suffix, 10, line_units)


def test_entries_must_increase(tmp_path: Path) -> None:
    index = ExtensionIndex(tmp_path / "x.testunits", 100, 120)
    with pytest.raises(InvalidOffsetError):
        index.append(101, 0)  # entry 0 names the base offset
    index.append(100, 7)
    index.append(105, 7)  # units may stay (records that measure 0)
    with pytest.raises(InvalidOffsetError):
        index.append(105, 9)
    with pytest.raises(InvalidOffsetError):
        index.append(106, 6)
    assert index.floor_by_units(6) is None
    assert index.floor_by_units(7) == (105, 7)
    assert index.floor_by_offset(104) == (100, 7)
    index._check()
    index.close()

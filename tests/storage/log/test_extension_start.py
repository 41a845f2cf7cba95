"""The extension units of the oldest retained segment survive the loss of its index.

Units are fixed at append (SPEC §3: positions never move). Retention removes the
segments that held the units before the oldest retained one, so a rebuild from the log
alone cannot know where that segment starts; the loader must take it from what is
left: the ``<suffix>-start-checkpoint`` file retention and close write, or a later
segment's intact index (its entry 0, minus what the segments before it measure).
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest

import storage.log.checkpoint
from storage import Log
from storage.errors import CorruptCheckpointError
from storage.log.checkpoint import read_extension_start_checkpoint, write_extension_start_checkpoint
from tests.conftest import ManualClock
from tests.storage.log.test_extension_index import (
    SPEC,
    SUFFIX,
    append_lines,
    assert_floors_exact,
    lines,
    open_log,
)

CHECKPOINT = f"{SUFFIX[1:]}-start-checkpoint"


def filled_log(log_dir: Path, clock: ManualClock, batches: int = 40) -> tuple[Log, list[bytes]]:
    log = open_log(log_dir, clock, file_delete_delay_ms=0)
    values: list[bytes] = []
    for i in range(batches):
        batch = lines(3, 3 * i)
        append_lines(log, batch)
        values += batch
    return log, values


def retain_from(log: Log, offset: int) -> None:
    """DeleteRecords up to the segment holding ``offset``, then retention."""
    segment = log.segments.floor_segment(offset)
    assert segment is not None
    log.advance_log_start_offset(segment.base_offset)
    assert log.delete_old_segments() > 0


def index_paths(directory: Path) -> list[Path]:
    return sorted(directory.glob(f"*{SUFFIX}"))


def reopen(directory: Path, log: Log, clock: ManualClock, *, writable: bool = True) -> Log:
    return Log.open(directory, log.config, clock=clock, extension=SPEC, writable=writable)


def test_every_index_missing_after_retention(log_dir: Path, clock: ManualClock) -> None:
    # The checkpoint is all that is left of the units before the oldest segment.
    log, values = filled_log(log_dir, clock)
    retain_from(log, 40)
    start, end = log.extension_start, log.extension_end
    assert start > 0
    log.close()
    for path in index_paths(log.dir):
        path.unlink()
    reopened = reopen(log.dir, log, clock)
    assert (reopened.extension_start, reopened.extension_end) == (start, end)
    assert_floors_exact(reopened, values, first_offset=reopened.log_start_offset)
    reopened._check()
    reopened.close()


def test_oldest_index_missing_is_computed_back_from_a_later_one(
    log_dir: Path, clock: ManualClock
) -> None:
    # A directory without the checkpoint (written before it existed, or lost): the
    # next segment's entry 0 minus what the oldest segment's log measures.
    log, values = filled_log(log_dir, clock)
    retain_from(log, 40)
    start = log.extension_start
    assert log.number_of_segments > 2
    log.close()
    (log.dir / CHECKPOINT).unlink(missing_ok=True)
    index_paths(log.dir)[0].unlink()
    reopened = reopen(log.dir, log, clock)
    assert reopened.extension_start == start
    assert_floors_exact(reopened, values, first_offset=reopened.log_start_offset)
    reopened._check()
    reopened.close()


def test_checkpoint_written_before_the_segments_are_renamed(
    log_dir: Path, clock: ManualClock
) -> None:
    # A crash between retention's checkpoint write and its renames leaves the old
    # oldest segment on disk with a checkpoint naming a later one: the units of the
    # older segments are computed back from the checkpoint.
    log, values = filled_log(log_dir, clock)
    retain_from(log, 40)
    before_crash = log_dir / "copy" / log.dir.name
    log.flush()
    shutil.copytree(log.dir, before_crash)
    start = log.extension_start
    retain_from(log, 200)
    assert log.extension_start > start
    shutil.copy(log.dir / CHECKPOINT, before_crash / CHECKPOINT)
    log.close()
    for path in index_paths(before_crash):
        path.unlink()
    reopened = reopen(before_crash, log, clock)
    assert reopened.extension_start == start
    assert_floors_exact(reopened, values, first_offset=reopened.log_start_offset)
    reopened._check()
    reopened.close()


def test_a_reader_rebuilds_the_start_and_writes_nothing(log_dir: Path, clock: ManualClock) -> None:
    log, values = filled_log(log_dir, clock)
    retain_from(log, 40)
    start = log.extension_start
    log.close()
    for path in index_paths(log.dir):
        path.unlink()
    files = {path.name: path.stat().st_mtime_ns for path in log.dir.iterdir()}
    reader = reopen(log.dir, log, clock, writable=False)
    assert reader.extension_start == start
    assert_floors_exact(reader, values, first_offset=reader.log_start_offset)
    reader.close()
    assert {path.name: path.stat().st_mtime_ns for path in log.dir.iterdir()} == files


def test_close_checkpoints_the_oldest_segment(log_dir: Path, clock: ManualClock) -> None:
    log, _values = filled_log(log_dir, clock)
    retain_from(log, 40)
    (log.dir / CHECKPOINT).unlink()
    first = log.segments.first_segment
    assert first is not None
    base, start = first.base_offset, first.extension_start
    log.close()
    assert (log.dir / CHECKPOINT).read_text() == f"0\n{base} {start}\n"


def test_a_corrupt_checkpoint_is_ignored(log_dir: Path, clock: ManualClock) -> None:
    # The checkpoint is a hint like the indexes: garbage in it must not stop the log
    # from opening (the oldest segment's own index still gives its start).
    log, values = filled_log(log_dir, clock)
    retain_from(log, 40)
    start = log.extension_start
    log.close()
    (log.dir / CHECKPOINT).write_bytes(os.urandom(20))
    reopened = reopen(log.dir, log, clock)
    assert reopened.extension_start == start
    assert_floors_exact(reopened, values, first_offset=reopened.log_start_offset)
    reopened.close()


def test_checkpoint_round_trip_and_malformed_files(tmp_path: Path) -> None:
    path = tmp_path / CHECKPOINT
    assert read_extension_start_checkpoint(path) is None
    write_extension_start_checkpoint(path, 1200, 48213)
    assert path.read_bytes() == b"0\n1200 48213\n"
    assert read_extension_start_checkpoint(path) == (1200, 48213)
    assert not (tmp_path / f"{CHECKPOINT}.tmp").exists()
    for bad in (b"1\n1 2\n", b"0\n1\n", b"0\n1 2 3\n", b"0\n-1 2\n", b"0\n1 2\n3 4\n", b"\xff"):
        path.write_bytes(bad)
        with pytest.raises(CorruptCheckpointError):
            read_extension_start_checkpoint(path)
    with pytest.raises(ValueError, match="cannot be written"):
        write_extension_start_checkpoint(path, 1, -5)
    assert path.read_bytes() == b"\xff"  # refused before the old file was replaced


def test_retention_goes_on_when_the_checkpoint_cannot_be_written(
    log_dir: Path,
    clock: ManualClock,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A full disk is when retention matters most: the checkpoint is a hint like the
    # indexes, so a failed write is logged and the segments still go.
    log, values = filled_log(log_dir, clock)

    def disk_full(path: Path, data: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(storage.log.checkpoint, "write_atomically", disk_full)
    retain_from(log, 40)
    assert log.log_start_offset > 0
    assert "extension start not checkpointed" in caplog.text
    assert not (log.dir / CHECKPOINT).exists()
    monkeypatch.undo()
    assert_floors_exact(log, values, first_offset=log.log_start_offset)
    log.close()
    assert (log.dir / CHECKPOINT).exists()  # close wrote it

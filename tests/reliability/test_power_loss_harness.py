"""The harness itself: the recorder, the crash-state models, and that it can fail.

The last group injects known-bad engine behaviour while a workload is recorded (an
fsync skipped, a checkpoint written past the data, a checkpoint renamed before its
bytes are synced, a recovery that does nothing) and requires the checker to report
it: a harness that cannot fail proves nothing.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import random
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from storage import LogManager
from storage.atomic_file import fsync_directory
from storage.log import checkpoint as checkpoint_module
from storage.log import log_loader
from storage.log.file_names import RECOVERY_POINT_CHECKPOINT
from storage.record.file_records import FileRecords

from .power_loss.crash_states import (
    Analysis,
    Model,
    choose_cuts,
    recovery_cuts,
    swap_commit_cuts,
)
from .power_loss.explore import Budget, Exploration, explore, scratch
from .power_loss.recorder import Kind, Op, Recorder, RecorderError, Tree
from .power_loss.workloads import record_recovery, record_workload

# -- the recorder ---------------------------------------------------------------------------


@pytest.fixture
def scratch_path() -> Iterator[Path]:
    """On tmpfs where there is one: recordings fsync a lot, and their fsyncs prove
    nothing (the recorder says what is durable), so they need not reach a disk."""
    with scratch() as path:
        yield path


@pytest.fixture
def root(scratch_path: Path) -> Path:
    path = scratch_path / "root"
    path.mkdir()
    return path


def _kinds(ops: list[Op]) -> list[tuple[Kind, str]]:
    return [(op.kind, op.call) for op in ops if op.kind is not Kind.MARK]


def test_recorder_records_calls_by_node(root: Path) -> None:
    recorder = Recorder(root)
    with recorder.recording():
        fd = os.open(root / "a.tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, b"hello")
        os.fsync(fd)
        os.close(fd)
        os.replace(root / "a.tmp", root / "a")
        fsync_directory(root)
        (root / "d").mkdir()
        fd = os.open(root / "d" / "log", os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(fd, b"12345")
        os.ftruncate(fd, 3)
        os.write(fd, b"x")
        os.fdatasync(fd)
        os.close(fd)
        os.unlink(root / "a")
    recorder.check_fidelity()
    ops = recorder.ops
    assert _kinds(ops) == [
        (Kind.CREATE, "os.open"),
        (Kind.WRITE, "os.write"),
        (Kind.FSYNC, "os.fsync"),
        (Kind.RENAME, "os.replace"),
        (Kind.DIRSYNC, "os.fsync"),
        (Kind.CREATE, "os.mkdir"),
        (Kind.CREATE, "os.open"),
        (Kind.WRITE, "os.write"),
        (Kind.TRUNCATE, "os.ftruncate"),
        (Kind.WRITE, "os.write"),
        (Kind.FSYNC, "os.fdatasync"),
        (Kind.UNLINK, "os.unlink"),
    ]
    # The rename moved the name, not the node: the same node was written and removed.
    assert ops[0].node == ops[1].node == ops[3].node == ops[-1].node
    # O_APPEND writes land at the end the recorded calls made.
    assert ops[9].offset == 3
    assert bytes(recorder.tree.nodes[ops[6].node].content) == b"123x"


def test_recorder_sees_mapped_stores_and_msync(root: Path) -> None:
    recorder = Recorder(root)
    with recorder.recording():
        fd = os.open(root / "index", os.O_RDWR | os.O_CREAT, 0o644)
        os.ftruncate(fd, 64)
        mapping = mmap.mmap(fd, 64, access=mmap.ACCESS_WRITE)
        os.close(fd)
        mapping[8:12] = b"\x00\x00\x00\x07"
        recorder.mark("between")
        mapping[0:4] = b"abcd"
        mapping.flush()
        del mapping
        recorder.mark("after")
    recorder.check_fidelity()
    kinds = [(op.kind, op.offset, op.data) for op in recorder.ops if op.kind is not Kind.CREATE]
    assert kinds == [
        (Kind.TRUNCATE, 0, b""),
        (Kind.STORE, 11, b"\x07"),
        (Kind.MARK, 0, b""),
        (Kind.STORE, 0, b"abcd"),
        (Kind.FSYNC, 0, b""),
        (Kind.MARK, 0, b""),
    ]
    assert recorder.ops[-2].call == "mmap.flush"


def test_recorder_sees_a_mapping_resize_the_file(scratch_path: Path) -> None:
    recorder = Recorder(scratch_path)
    with recorder.recording():
        fd = os.open(scratch_path / "index", os.O_RDWR | os.O_CREAT, 0o644)
        os.ftruncate(fd, 64)
        mapping = mmap.mmap(fd, 64, access=mmap.ACCESS_WRITE)
        os.close(fd)
        mapping[0:4] = b"abcd"
        mapping.resize(8)  # ftruncate through the mapping's own descriptor
        recorder.mark("after")
        del mapping
    recorder.check_fidelity()
    resized = [op for op in recorder.ops if op.call == "mmap.resize"]
    assert [(op.kind, op.length) for op in resized] == [(Kind.TRUNCATE, 8)]
    assert recorder.ops[resized[0].seq - 1].kind is Kind.STORE  # the store came first


def test_recorder_refuses_unmodelled_writes(root: Path) -> None:
    recorder = Recorder(root)
    with recorder.recording(), pytest.raises(RecorderError, match="unmodelled"):
        open(root / "f", "w")  # noqa: SIM115 - the call must be refused
    with recorder.recording(), pytest.raises(RecorderError, match="symlink"):
        os.symlink("x", root / "link")


def test_recorder_follows_rmtree(root: Path) -> None:
    (root / "t-0").mkdir()
    (root / "t-0" / "00000000000000000000.log").write_bytes(b"data")
    recorder = Recorder(root)
    with recorder.recording():
        os.rename(root / "t-0", root / "t-0.x-delete")
        shutil.rmtree(root / "t-0.x-delete")
    recorder.check_fidelity()
    assert [op.kind for op in recorder.ops] == [Kind.RENAME, Kind.UNLINK, Kind.RMDIR]


def test_recorder_covers_an_engine_workload(scratch_path: Path) -> None:
    # Every kind of call the engine makes shows up, and the recorded tree equals the
    # real directory at the end (record_workload checks it).
    recording = record_workload("topics", scratch_path / "logs")
    calls = {(op.kind, op.call) for op in recording.ops}
    for expected in [
        (Kind.CREATE, "os.open"),
        (Kind.CREATE, "os.mkdir"),
        (Kind.WRITE, "os.write"),
        (Kind.STORE, "mmap store"),
        (Kind.TRUNCATE, "os.ftruncate"),
        (Kind.FSYNC, "os.fdatasync"),
        (Kind.FSYNC, "mmap.flush"),
        (Kind.FSYNC, "os.fsync"),
        (Kind.DIRSYNC, "os.fsync"),
        (Kind.RENAME, "os.replace"),
        (Kind.RENAME, "os.rename"),
        (Kind.RMDIR, "shutil.rmtree"),
        (Kind.UNLINK, "shutil.rmtree"),
    ]:
        assert expected in calls, expected


# -- the crash-state models -------------------------------------------------------------


def _toy(root: Path, *, dirsync: bool) -> Recorder:
    """A file created, written, fsynced, then appended to without an fsync."""
    recorder = Recorder(root)
    with recorder.recording():
        fd = os.open(root / "f", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.write(fd, b"durable|")
        os.fsync(fd)
        if dirsync:
            fsync_directory(root)
        os.write(fd, b"maybe")
        os.close(fd)
    return recorder


def _all_states(recorder: Recorder, model: Model, draws: int = 40) -> Iterator[dict[str, bytes]]:
    analysis = Analysis(recorder.initial, recorder.ops)
    for state in analysis.states(len(recorder.ops), model, draws, random.Random(3)):
        yield state.files


def test_posix_model_name_needs_a_directory_fsync(root: Path) -> None:
    states = list(_all_states(_toy(root, dirsync=False), Model.POSIX))
    assert {} in states  # the name was never made durable
    assert {"f": b"durable|maybe"} in states
    contents = {files["f"] for files in states if files}
    assert all(content.startswith(b"durable|") for content in contents)
    # Prefixes of the unsynced write, at byte cuts inside it, appear.
    assert len(contents) >= 3


def test_analysis_says_which_call_makes_each_operation_durable(scratch_path: Path) -> None:
    recorder = _toy(scratch_path, dirsync=True)
    analysis = Analysis(recorder.initial, recorder.ops)
    create, first, fsync, dirsync, second = recorder.ops
    assert analysis.covered_by(create) == dirsync.seq
    assert analysis.covered_by(first) == fsync.seq
    assert analysis.covered_by(second) is None


def test_posix_model_keeps_synced_bytes_once_the_name_is_durable(root: Path) -> None:
    states = list(_all_states(_toy(root, dirsync=True), Model.POSIX))
    assert all("f" in files and files["f"].startswith(b"durable|") for files in states)
    assert {"f": b"durable|"} in states


def test_ext4_model_commits_the_name_with_the_files_fsync(root: Path) -> None:
    states = list(_all_states(_toy(root, dirsync=False), Model.EXT4_ORDERED))
    assert all(files.get("f", b"").startswith(b"durable|") for files in states)
    assert {"f": b"durable|"} in states
    assert {"f": b"durable|maybe"} in states


def test_models_lose_mapped_stores_without_msync(root: Path) -> None:
    recorder = Recorder(root)
    with recorder.recording():
        fd = os.open(root / "index", os.O_RDWR | os.O_CREAT, 0o644)
        os.ftruncate(fd, 16)
        os.fsync(fd)
        fsync_directory(root)
        mapping = mmap.mmap(fd, 16, access=mmap.ACCESS_WRITE)
        os.close(fd)
        mapping[0:4] = b"sync"
        mapping.flush()
        mapping[8:12] = b"lost"
        recorder.mark("end")
        del mapping
    for model in Model:
        states = list(_all_states(recorder, model))
        assert all(files["index"][:4] == b"sync" for files in states), model
        assert {files["index"][8:12] for files in states} == {b"lost", bytes(4)}, model


def test_choose_cuts_prefers_marks_and_syncs() -> None:
    ops = [Op(i, Kind.MARK if i % 10 == 0 else Kind.WRITE) for i in range(100)]
    cuts = choose_cuts(ops, 9, random.Random(0))
    assert len(cuts) == 9
    assert sum(1 for c in cuts if (c - 1) % 10 == 0) >= 6
    assert choose_cuts(ops, 1000, random.Random(0)) == list(range(1, 101))


def test_tree_skips_operations_whose_names_are_missing() -> None:
    tree = Tree()
    assert not tree.apply_namespace(Op(0, Kind.UNLINK, node=5, parent=0, name="x"))
    assert tree.apply_namespace(Op(1, Kind.CREATE, node=5, parent=0, name="x"))
    assert not tree.apply_namespace(Op(2, Kind.CREATE, node=6, parent=0, name="x"))


# -- the harness can fail ------------------------------------------------------------------


def _explore_bad(
    scratch_path: Path, name: str, model: Model, bad: contextlib.AbstractContextManager[Any]
) -> Exploration:
    """Record under ``bad``."""
    with bad:
        recording = record_workload(name, scratch_path / "logs")
    return explore(recording, model, Budget(cuts=60, states_per_cut=3), stop_after=1)


@pytest.mark.parametrize("model", list(Model))
def test_harness_detects_a_skipped_fsync(scratch_path: Path, model: Model) -> None:
    skipped = mock.patch.object(FileRecords, "flush", return_value=None)
    result = _explore_bad(scratch_path, "appends_and_flushes", model, skipped)
    assert any("durable records lost" in v.what for v in result.violations), result.summary()


def test_harness_detects_a_checkpoint_past_the_data(scratch_path: Path) -> None:
    def lying(self: LogManager) -> None:
        offsets = {(log.topic, log.partition): log.log_end_offset + 2 for log in self.logs()}
        checkpoint_module.write_offset_checkpoint(self.log_dir / RECOVERY_POINT_CHECKPOINT, offsets)

    bad = mock.patch.object(LogManager, "checkpoint_recovery_points", lying)
    result = _explore_bad(scratch_path, "flush_ms", Model.EXT4_ORDERED, bad)
    assert any("recovery-point checkpoint" in v.what for v in result.violations), result.summary()


def test_harness_detects_a_checkpoint_renamed_before_its_bytes_are_synced(
    scratch_path: Path,
) -> None:
    def unsynced(path: Path, data: bytes) -> None:
        tmp = path.with_name(path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, data)
        os.close(fd)
        os.replace(tmp, path)
        fsync_directory(path.parent)

    bad = mock.patch.object(checkpoint_module, "write_atomically", unsynced)
    result = _explore_bad(scratch_path, "reopen", Model.POSIX, bad)
    assert any("checkpoint" in v.what.lower() for v in result.violations), result.summary()


def test_harness_detects_a_recovery_that_keeps_a_torn_tail(scratch_path: Path) -> None:
    # Recovery that validates nothing: a torn last batch stays, and reading or
    # appending after it fails. (Byte-level tears are the POSIX model's.)
    recording = record_workload("appends_and_flushes", scratch_path / "logs")
    with mock.patch.object(log_loader, "_recover_from", return_value=None):
        result = explore(recording, Model.POSIX, Budget(cuts=60, states_per_cut=4), stop_after=1)
    assert result.violations, result.summary()


def test_harness_detects_an_unordered_swap_completion_during_recovery(
    scratch_path: Path,
) -> None:
    # Recovery completing an interrupted cleaning swap without making its unlinks
    # durable before the rename (power-loss D7): the runs that start from a pass's
    # commit point and cut every recovery step must find it.
    first = record_workload("compaction", scratch_path / "logs")
    cut = swap_commit_cuts(first.ops)[0]
    analysis = Analysis(first.recorder.initial, first.ops)
    state = analysis.states(cut, Model.POSIX, 1, random.Random(0))[0]
    with mock.patch.object(log_loader, "fsync_directory", return_value=None):
        second = record_recovery(
            state, first.oracle.at(cut), scratch_path / "again", now_ms=first.now_ms, name="swap"
        )
    result = explore(
        second,
        Model.POSIX,
        Budget(cuts=0, states_per_cut=2),
        extra_cuts=recovery_cuts(second.ops),
        stop_after=1,
    )
    assert any("durable records lost" in v.what for v in result.violations), result.summary()

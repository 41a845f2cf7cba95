"""Deleting a topic is all or nothing: a failure or a crash at any step leaves either the
whole topic (metadata, every partition, every record) or none of it, and a deleted
topic's data never comes back (issue #16, item 5)."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from seglogfs.cli.verify import verify_log_dir
from seglogfs.positions import position_index_spec
from storage import BrokerConfig, ConfigError, LogManager, TopicMetadata
from storage.log import log_manager as log_manager_module
from storage.log.file_names import is_delete_dir_name
from storage.log.log import Log
from tests.conftest import ManualClock

ROOT = Path(__file__).resolve().parents[3]
OVERRIDES = {"retention.ms": "86400000", "segment.bytes": "300"}


def _build(log_dir: Path, name: str, clock: ManualClock) -> dict[int, list[bytes]]:
    """A topic of three partitions with several segments each, beside a topic
    ``other``; returns the values of each partition of ``name``."""
    values: dict[int, list[bytes]] = {}
    with LogManager.open(log_dir, clock=clock, extension=position_index_spec) as manager:
        manager.create_topic(name, 3, OVERRIDES, key_separator=":")
        manager.create_topic("other", 1)
        manager.log("other", 0).append([b"kept"])
        for partition in range(3):
            values[partition] = [b"%d-%d" % (partition, i) for i in range(30)]
            for value in values[partition]:
                manager.log(name, partition).append([value])
    return values


def _entries(log_dir: Path, name: str) -> list[str]:
    """Directory entries that belong to ``name`` (its partition directories)."""
    return sorted(e for e in os.listdir(log_dir) if e.rsplit("-", 1)[0] == name)


def _assert_whole_or_none(
    log_dir: Path, name: str, values: dict[int, list[bytes]], clock: ManualClock
) -> bool:
    """The topic is either whole (returns True) or entirely gone (False); the other
    topic is untouched, the directory verifies clean. Opens the directory writable
    (what a restart after a crash does)."""
    with LogManager.open(log_dir, clock=clock, extension=position_index_spec) as manager:
        assert [r.value for r in manager.log("other", 0).records(0)] == [b"kept"]
        whole = name in manager.topics()
        if whole:
            assert manager.topic(name) == TopicMetadata(name, 3, "lines", ":", OVERRIDES)
            for partition, expected in values.items():
                log = manager.log(name, partition)
                assert [r.value for r in log.records(0)] == expected
        else:
            assert _entries(log_dir, name) == []
            assert not [e for e in os.listdir(log_dir) if is_delete_dir_name(e)]
    assert verify_log_dir(log_dir) == []
    if not whole:
        # Nothing of the old topic comes back under its name.
        with LogManager.open(log_dir, clock=clock, extension=position_index_spec) as manager:
            manager.create_topic(name, 3)
            assert all(manager.log(name, p).log_end_offset == 0 for p in range(3))
    return whole


def test_failed_metadata_write_leaves_the_whole_topic(
    log_dir: Path, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    values = _build(log_dir, "t", clock)
    with LogManager.open(log_dir, clock=clock, extension=position_index_spec) as manager:

        def full_disk(*_args: object, **_kwargs: object) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        with monkeypatch.context() as patch:
            patch.setattr(log_manager_module, "write_topics_file", full_disk)
            with pytest.raises(OSError, match="No space left"):
                manager.delete_topic("t")
        # Visible and usable, as if nothing had been asked.
        assert manager.topics() == ["other", "t"]
        assert _entries(log_dir, "t") == ["t-0", "t-1", "t-2"]
        manager.log("t", 2).append([b"after"])
        values[2].append(b"after")
    assert _assert_whole_or_none(log_dir, "t", values, clock)


def _failing_rename(monkeypatch: pytest.MonkeyPatch, directory_name: str) -> None:
    real_rename = os.rename

    def rename(source: str | Path, target: str | Path) -> None:
        if Path(source).name == directory_name:
            raise OSError(errno.EIO, "Input/output error")
        real_rename(source, target)

    monkeypatch.setattr(os, "rename", rename)


@pytest.mark.parametrize("failing", [0, 1, 2])
def test_failed_rename_of_partition_k_leaves_none_of_the_topic(
    log_dir: Path, clock: ManualClock, monkeypatch: pytest.MonkeyPatch, failing: int
) -> None:
    """Once the metadata says the topic is deleted, a partition directory that cannot be
    renamed away stays hidden (never loaded as a topic of its own, never adopted by a
    topic created with the name) and goes at the next open."""
    values = _build(log_dir, "t", clock)
    with (
        LogManager.open(log_dir, clock=clock, extension=position_index_spec) as manager,
        monkeypatch.context() as patch,
    ):
        _failing_rename(patch, f"t-{failing}")
        manager.delete_topic("t")
        assert manager.topics() == ["other"]
        assert _entries(log_dir, "t") == [f"t-{failing}"]
        with LogManager.open(log_dir, read_only=True) as reader:
            assert reader.topics() == ["other"]
        assert verify_log_dir(log_dir) == []
        with pytest.raises(OSError, match="Input/output error"):
            manager.create_topic("t", 1)
        assert manager.topics() == ["other"]
    assert _entries(log_dir, "t") == [f"t-{failing}"]
    assert not _assert_whole_or_none(log_dir, "t", values, clock)


def test_a_topic_created_after_a_failed_delete_starts_empty(
    log_dir: Path, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    _build(log_dir, "t", clock)
    with LogManager.open(log_dir, clock=clock, extension=position_index_spec) as manager:
        with monkeypatch.context() as patch:
            _failing_rename(patch, "t-1")
            manager.delete_topic("t")
        manager.create_topic("t", 3)
        assert [manager.log("t", p).log_end_offset for p in range(3)] == [0, 0, 0]
        manager.log("t", 1).append([b"new"])
    with LogManager.open(log_dir, clock=clock, extension=position_index_spec) as manager:
        assert [r.value for r in manager.log("t", 1).records(0)] == [b"new"]
        assert manager.log("t", 0).log_end_offset == 0
    assert verify_log_dir(log_dir) == []


_CRASHING_DELETE = """
import os, sys
from seglogfs.positions import position_index_spec
from storage import LogManager

log_dir, name, crash_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
manager = LogManager.open(log_dir, extension=position_index_spec)
calls = 0

def crashing(real):
    def call(*args, **kwargs):
        global calls
        calls += 1
        if calls == crash_at:
            os._exit(9)
        return real(*args, **kwargs)
    return call

# Every step of a delete that changes the directory: renames (of partition
# directories and of each atomically replaced file) and the removal of the data.
os.rename, os.replace = crashing(os.rename), crashing(os.replace)
os.rmdir = crashing(os.rmdir)
manager.delete_topic(name)
print(calls)
os._exit(0)
"""


def test_a_crash_at_any_step_of_a_delete_recovers_to_all_or_nothing(
    tmp_path: Path, clock: ManualClock
) -> None:
    """A process killed before each step of ``delete_topic`` in turn: the next open
    finds the whole topic or none of it, and once the metadata was replaced, none."""
    outcomes = []
    crash_at = 1
    while True:
        log_dir = tmp_path / f"crash-{crash_at}"
        log_dir.mkdir()
        values = _build(log_dir, "t", clock)
        run = subprocess.run(
            [sys.executable, "-c", _CRASHING_DELETE, str(log_dir), "t", str(crash_at)],
            capture_output=True,
            cwd=ROOT,
            timeout=60,
            check=False,
        )
        assert run.returncode in (0, 9), run.stderr
        outcomes.append(_assert_whole_or_none(log_dir, "t", values, clock))
        if run.returncode == 0:
            break
        crash_at += 1
    # The first step is the commit (the metadata file): whole before it, none after.
    assert outcomes[0] is True
    assert not any(outcomes[1:])
    assert len(outcomes) > 5  # three partitions' renames and removals were crossed


_DELETE_CREATE_CRASH = """
import os, sys
from storage import LogManager

manager = LogManager.open(sys.argv[1])
config = {"segment.bytes": "200", "retention.bytes": "300", "file.delete.delay.ms": "0"}
manager.create_topic("t", 1, config)
for i in range(30):
    manager.log("t", 0).append([b"old %d" % i])
assert manager.run_retention() > 0  # checkpoints a log start offset above 0
manager.delete_topic("t")
manager.create_topic("t", 1)
manager.log("t", 0).append([b"new"])
manager.log("t", 0).flush()
print(manager.log("t", 0).log_end_offset)
os._exit(9)
"""


def test_a_topic_created_again_keeps_its_records_after_a_crash(
    log_dir: Path, clock: ManualClock
) -> None:
    """The checkpoints kept the deleted partitions' offsets until the next periodic
    checkpoint: after a crash, the new partition of the same name was opened with the
    old log start offset, above its end, and its records were deleted. A delete writes
    both checkpoints, as Kafka's ``asyncDelete`` does."""
    run = subprocess.run(
        [sys.executable, "-c", _DELETE_CREATE_CRASH, str(log_dir)],
        capture_output=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert (run.returncode, run.stdout) == (9, b"1\n"), run.stderr
    assert verify_log_dir(log_dir) == []
    with LogManager.open(log_dir, clock=clock) as manager:
        log = manager.log("t", 0)
        assert (log.log_start_offset, [r.value for r in log.records(0)]) == (0, [b"new"])


def test_a_partition_directory_name_must_fit_the_file_system(
    log_dir: Path, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``<topic>-<partition>`` of a 249-character topic exceeds 255 bytes from partition
    100000 on: such a topic is refused before anything is written; and a create that
    fails on the way leaves no trace of the topic."""

    class Stop(Exception):
        pass

    def stop(*_args: object, **_kwargs: object) -> Log:
        raise Stop

    # Over the default max.topic.partitions (1000), which is checked first.
    broker = BrokerConfig(
        log_dirs=(str(log_dir),), max_topic_partitions=100_001, max_broker_partitions=100_001
    )
    with LogManager.open(log_dir, broker, clock=clock) as manager:
        monkeypatch.setattr(Log, "open", stop)
        with pytest.raises(ConfigError, match="256 bytes"):
            manager.create_topic("t" * 249, 100_001)
        with pytest.raises(Stop):
            manager.create_topic("t" * 249, 100_000)  # partition 99999: 255 bytes, fine
        monkeypatch.undo()
        assert manager.topics() == []
    assert json.loads((log_dir / "seglog-topics.json").read_text())["topics"] == {}
    assert _entries(log_dir, "t" * 249) == []

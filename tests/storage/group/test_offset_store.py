"""``OffsetStore``: a real broker's ``__consumer_offsets``, commits, deletion, expiry and
the members that make a group consuming."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from storage import (
    OFFSETS_TOPIC,
    GroupConfig,
    GroupIdNotFoundError,
    InvalidGroupIdError,
    LogManager,
    NonEmptyGroupError,
    OffsetStore,
    PartitionAssignedError,
    ReadOnlyLogError,
    UnknownMemberIdError,
    UnknownTopicError,
    partition_for_group,
)
from storage.group.coordinator_record import OffsetCommitKey, parse_key, parse_offset_commit_value
from tests.conftest import ManualClock

KAFKA_LOGS = Path(__file__).with_name("kafka-logs")


@pytest.fixture
def broker_copy(tmp_path: Path) -> Path:
    copy = tmp_path / "kafka-logs"
    shutil.copytree(KAFKA_LOGS, copy)
    return copy


def test_a_real_brokers_groups(broker_copy: Path) -> None:
    with LogManager.open(broker_copy, read_only=True) as manager:
        store = OffsetStore(manager)
        # console-consumer-14837's metadata is tombstoned and it never committed: gone.
        assert store.list_groups() == ["console-consumer-61334", "user_activity_group"]
        group = store.describe_group("user_activity_group")
        (committed,) = group.offsets.items()
        assert committed[0] == ("user_activity", 0)
        assert (committed[1].offset, committed[1].leader_epoch) == (21, 0)
        assert committed[1].commit_timestamp == 1709548696192
        # The members librdkafka's last rebalance recorded (group metadata value v3).
        assert group.recorded
        assert [m.client_id for m in group.members] == ["rdkafka", "rdkafka"]
        assert [m.assignment for m in group.members] == [(("user_activity", 0),), ()]
        assert manager.log("user_activity", 0).log_end_offset == 21  # lag 0
        assert store.offsets_of_partition("user_activity", 0) == {"user_activity_group": 21}
        with pytest.raises(GroupIdNotFoundError):
            store.describe_group("console-consumer-14837")
        with pytest.raises(ReadOnlyLogError):
            store.commit("user_activity_group", {("user_activity", 0): 3})


def _store(log_dir: Path, clock: ManualClock, **config: int) -> tuple[LogManager, OffsetStore]:
    manager = LogManager.open(log_dir, clock=clock)
    if "t" not in manager.topics():
        manager.create_topic("t", 2)
        manager.log("t", 0).append([b"a", b"b", b"c"])
    return manager, OffsetStore(manager, GroupConfig(**config))


def test_commits_are_kafkas_records_in_the_groups_partition(
    log_dir: Path, clock: ManualClock
) -> None:
    manager, store = _store(log_dir, clock)
    with manager:
        assert OFFSETS_TOPIC not in manager.topics()
        store.commit("g", {("t", 0): 2, ("t", 1): 0}, metadata="m")
        assert manager.topic(OFFSETS_TOPIC).partitions == 50
        overrides = manager.topic(OFFSETS_TOPIC).overrides
        # Kafka's: compacted, segments of offsets.topic.segment.bytes.
        assert overrides == {"cleanup.policy": "compact", "segment.bytes": "104857600"}
        log = manager.log(OFFSETS_TOPIC, partition_for_group("g", 50))
        records = list(log.records(0))
        assert [parse_key(r.key or b"") for r in records] == [
            OffsetCommitKey("g", "t", 0),
            OffsetCommitKey("g", "t", 1),
        ]
        value = parse_offset_commit_value(records[0].value or b"")
        assert (value.offset, value.metadata, value.commit_timestamp) == (2, "m", clock.now_ms)
        store.commit("g", {("t", 0): 3})
        assert {tp: v.offset for tp, v in store.committed("g").items()} == {
            ("t", 0): 3,
            ("t", 1): 0,
        }
    # Loaded at open: the latest commit per key.
    manager, store = _store(log_dir, clock)
    with manager:
        assert store.committed("g")[("t", 0)].offset == 3
        assert store.list_groups() == ["g"]


def test_commit_refuses_what_kafka_refuses(log_dir: Path, clock: ManualClock) -> None:
    manager, store = _store(log_dir, clock)
    with manager:
        with pytest.raises(InvalidGroupIdError):
            store.commit("", {("t", 0): 1})
        with pytest.raises(UnknownTopicError):
            store.commit("g", {("nope", 0): 1})
        with pytest.raises(UnknownTopicError):
            store.commit("g", {("t", 9): 1})


def test_delete_group_writes_tombstones(log_dir: Path, clock: ManualClock) -> None:
    manager, store = _store(log_dir, clock)
    with manager:
        store.commit("g", {("t", 0): 2})
        store.commit("h", {("t", 0): 1})
        store.delete_group("g")
        assert store.list_groups() == ["h"]
        with pytest.raises(GroupIdNotFoundError):
            store.delete_group("g")
        log = manager.log(OFFSETS_TOPIC, partition_for_group("g", 50))
        tail = list(log.records(0))[-2:]
        assert [r.value for r in tail] == [None, None]  # the offset and the metadata key
    manager, store = _store(log_dir, clock)
    with manager:
        assert store.list_groups() == ["h"]


def test_offsets_of_empty_groups_expire(log_dir: Path, clock: ManualClock) -> None:
    manager, store = _store(log_dir, clock, offsets_retention_minutes=10)
    with manager:
        store.commit("old", {("t", 0): 1})
        clock.advance(5 * 60_000)
        store.commit("new", {("t", 0): 2})
        member, _ = store.join("busy", "t", [1], client_id="c")
        store.commit("busy", {("t", 1): 0}, member_id=member)
        clock.advance(6 * 60_000)
        assert store.expire_offsets() == 1  # "old"; "busy" has a live member
        assert store.list_groups() == ["busy", "new"]
        store.leave("busy", member)
        clock.advance(9 * 60_000)  # "busy" emptied 9 minutes ago: kept
        assert store.expire_offsets() == 1  # "new"
        clock.advance(60_000)
        assert store.expire_offsets() == 1  # "busy": 10 minutes after it became empty
        assert store.list_groups() == []
    manager, store = _store(log_dir, clock)
    with manager:
        assert store.list_groups() == []


def test_one_member_per_partition(log_dir: Path, clock: ManualClock) -> None:
    manager, store = _store(log_dir, clock)
    with manager:
        first, got = store.join("g", "t", [0, 1], client_id="a")
        assert got == [0, 1]
        with pytest.raises(PartitionAssignedError, match="being consumed by member a-"):
            store.join("g", "t", [0], client_id="b")
        other, got = store.join("other", "t", [0], client_id="b")  # another group: free
        assert got == [0]
        with pytest.raises(PartitionAssignedError):
            store.commit("g", {("t", 0): 1})  # not a member: refused for a held partition
        with pytest.raises(UnknownMemberIdError):
            store.commit("g", {("t", 0): 1}, member_id="nobody")
        store.commit("g", {("t", 0): 1}, member_id=first)
        description = store.describe_group("g")
        assert description.state == "Stable"
        assert [m.assignment for m in description.members] == [(("t", 0), ("t", 1))]
        with pytest.raises(NonEmptyGroupError):
            store.reset_offsets("g", {("t", 0): 0})
        with pytest.raises(NonEmptyGroupError):
            store.delete_group("g")
        store.leave("g", first)
        assert store.describe_group("g").state == "Empty"
        store.reset_offsets("g", {("t", 0): 0})
        assert store.committed("g")[("t", 0)].offset == 0
        store.leave("other", other)


def test_a_member_whose_process_died_leaves(log_dir: Path, clock: ManualClock) -> None:
    manager, store = _store(log_dir, clock)
    with manager:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        try:
            store.join("g", "t", [0], client_id="a", pid=child.pid)
            with pytest.raises(PartitionAssignedError):
                store.join("g", "t", [0], client_id="b")
        finally:
            child.kill()
            child.wait()
        # No session timeout: the partition is free as soon as the process is gone.
        second, got = store.join("g", "t", [0, 1], client_id="b")
        assert got == [0, 1]
        assert [m.member_id for m in store.describe_group("g").members] == [second]


def test_a_member_picks_up_freed_partitions(log_dir: Path, clock: ManualClock) -> None:
    manager, store = _store(log_dir, clock)
    with manager:
        first, _ = store.join("g", "t", [0], client_id="a")
        second, got = store.join("g", "t", [0, 1], client_id="b")
        assert got == [1]
        assert store.heartbeat("g", second) == [1]
        store.leave("g", first)
        assert store.heartbeat("g", second) == [0, 1]
        store.leave("g", second)
        with pytest.raises(UnknownMemberIdError):
            store.heartbeat("g", second)


def test_a_read_only_store_follows_the_writer(log_dir: Path, clock: ManualClock) -> None:
    manager, store = _store(log_dir, clock)
    with manager, LogManager.open(log_dir, read_only=True) as reader:
        store.commit("g", {("t", 0): 1})
        follower = OffsetStore(reader)
        assert follower.committed("g")[("t", 0)].offset == 1
        store.commit("g", {("t", 0): 2})
        assert follower.committed("g")[("t", 0)].offset == 2


def test_shared_is_one_store_per_manager(log_dir: Path, clock: ManualClock) -> None:
    manager, _store_unused = _store(log_dir, clock)
    with manager:
        assert OffsetStore.shared(manager) is OffsetStore.shared(manager)


def test_compaction_keeps_the_latest_commit_per_key(tmp_path: Path, clock: ManualClock) -> None:
    # Kafka compacts __consumer_offsets: once the cleaner has run, each sealed segment
    # holds at most the latest commit of each (group, topic, partition), and a store
    # opened afresh reads the same committed offsets as before.
    log_dir = tmp_path / "logs"
    manager, store = _store(log_dir, clock, offsets_topic_segment_bytes=1024)
    with manager:
        for i in range(300):
            store.commit("g", {("t", i % 2): i})
            store.commit("h", {("t", 0): 1000 + i})
        log = manager.log(OFFSETS_TOPIC, partition_for_group("g", 50))
        before = sum(1 for _ in log.records(0))
        summary = manager.clean([OFFSETS_TOPIC], force=True, until_clean=True)
        assert summary is not None
        active = log.segments.last_segment
        assert active is not None
        sealed_keys = [
            parse_key(r.key or b"") for r in log.records(0) if r.offset < active.base_offset
        ]
        after = sum(1 for _ in log.records(0))
    assert before >= 300  # one commit record each time (h may share g's partition)
    assert after < before / 3
    assert len(sealed_keys) == len(set(sealed_keys)), sealed_keys
    manager, store = _store(log_dir, clock)
    with manager:
        assert {tp: v.offset for tp, v in store.committed("g").items()} == {
            ("t", 0): 298,
            ("t", 1): 299,
        }
        assert {tp: v.offset for tp, v in store.committed("h").items()} == {("t", 0): 1299}

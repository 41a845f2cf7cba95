"""The group coordinator's rebalance state machine over a real ``OffsetStore``,
without a socket (pytest-trio; timeouts on trio's autojump clock)."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
import trio.testing

from seglogfs.kafka.codec import ErrorCode
from seglogfs.kafka.coordinator import Coordinator, JoinResult, assigned_partitions
from seglogfs.positions import position_index_spec
from storage import BrokerConfig, LogManager, OffsetStore


async def _run_sync(fn: object, *args: object) -> object:
    return await trio.to_thread.run_sync(fn, *args)  # type: ignore[arg-type]


@pytest.fixture
def manager(log_dir: Path) -> Iterator[LogManager]:
    broker = BrokerConfig(log_dirs=(str(log_dir),), num_partitions=2)
    with LogManager.open(log_dir, broker, extension=position_index_spec) as manager:
        manager.create_topic("t", 2)
        yield manager


@pytest.fixture
def coordinator(manager: LogManager) -> Coordinator:
    return Coordinator(OffsetStore(manager), _run_sync)


def _assignment(topic: str, partitions: list[int]) -> bytes:
    """A ``ConsumerProtocolAssignment`` v0 of one topic."""
    name = topic.encode()
    body = struct.pack(">hih", 0, 1, len(name)) + name + struct.pack(">i", len(partitions))
    body += b"".join(struct.pack(">i", p) for p in partitions)
    return body + struct.pack(">i", -1)  # null user data


async def _join(coordinator: Coordinator, member_id: str = "", **kwargs: object) -> JoinResult:
    settings: dict[str, object] = {
        "client_id": "c",
        "host": "/127.0.0.1",
        "protocol_type": "consumer",
        "protocols": [("range", b"sub")],
        "session_timeout_ms": 10000,
        "rebalance_timeout_ms": 30000,
    }
    settings.update(kwargs)
    return await coordinator.join("g", member_id, **settings)  # type: ignore[arg-type]


def test_assigned_partitions_decodes_the_consumer_protocol() -> None:
    assert assigned_partitions(_assignment("t", [0, 1])) == {"t": [0, 1]}
    assert assigned_partitions(b"\x00") == {}
    assert assigned_partitions(b"\x00\x00\xff") == {}


@pytest.mark.trio
async def test_a_lone_member_joins_syncs_and_commits(
    coordinator: Coordinator, manager: LogManager
) -> None:
    joined = await _join(coordinator)
    assert joined.error is ErrorCode.none
    assert joined.generation == 1
    assert joined.leader == joined.member_id
    assert joined.members == ((joined.member_id, b"sub"),)
    error, assignment, _, name = await coordinator.sync(
        "g", 1, joined.member_id, {joined.member_id: _assignment("t", [0, 1])}
    )
    assert (error, name) == (ErrorCode.none, "range")
    assert assigned_partitions(assignment) == {"t": [0, 1]}
    store = coordinator.store
    description = store.describe_group("g")
    assert description.state == "Stable"
    assert [m.assignment for m in description.members] == [(("t", 0), ("t", 1))]
    assert coordinator.heartbeat("g", 1, joined.member_id) is ErrorCode.none
    assert coordinator.heartbeat("g", 0, joined.member_id) is ErrorCode.illegal_generation
    assert coordinator.heartbeat("g", 1, "nobody") is ErrorCode.unknown_member_id
    results = await coordinator.commit("g", 1, joined.member_id, {("t", 0): 5}, {})
    assert results == {("t", 0): ErrorCode.none}
    assert store.committed("g")[("t", 0)].offset == 5
    assert (await coordinator.commit("g", 7, joined.member_id, {("t", 0): 6}, {})) == {
        ("t", 0): ErrorCode.illegal_generation
    }
    assert (await coordinator.leave("g", [joined.member_id])) == {joined.member_id: ErrorCode.none}
    assert store.describe_group("g").state == "Empty"


@pytest.mark.trio
async def test_a_second_member_makes_the_first_rejoin(coordinator: Coordinator) -> None:
    first = await _join(coordinator)
    await coordinator.sync("g", 1, first.member_id, {first.member_id: _assignment("t", [0, 1])})
    results: dict[str, JoinResult] = {}

    async def join_second() -> None:
        results["second"] = await _join(coordinator)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(join_second)
        await trio.testing.wait_all_tasks_blocked()
        # The first member learns of the rebalance from its heartbeat, and rejoins.
        assert coordinator.heartbeat("g", 1, first.member_id) is ErrorCode.rebalance_in_progress
        results["first"] = await _join(coordinator, first.member_id)
    second, again = results["second"], results["first"]
    assert second.generation == again.generation == 2
    assert again.leader == first.member_id
    assert {m for m, _ in again.members} == {first.member_id, second.member_id}
    assert second.members == ()  # only the leader gets the subscriptions

    async def sync_follower() -> None:
        results_sync.append(await coordinator.sync("g", 2, second.member_id, {}))

    results_sync: list[tuple[ErrorCode, bytes, str | None, str | None]] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sync_follower)
        await trio.testing.wait_all_tasks_blocked()
        assert results_sync == []  # the follower waits for the leader's assignment
        await coordinator.sync(
            "g",
            2,
            first.member_id,
            {first.member_id: _assignment("t", [0]), second.member_id: _assignment("t", [1])},
        )
    assert assigned_partitions(results_sync[0][1]) == {"t": [1]}


@pytest.mark.trio
async def test_a_silent_member_is_removed_after_its_session_timeout(
    coordinator: Coordinator, autojump_clock: trio.testing.MockClock
) -> None:
    joined = await _join(coordinator, session_timeout_ms=2000)
    await coordinator.sync("g", 1, joined.member_id, {joined.member_id: _assignment("t", [0])})
    async with trio.open_nursery() as nursery:
        nursery.start_soon(coordinator.expire_forever)
        await trio.sleep(1.5)
        assert coordinator.heartbeat("g", 1, joined.member_id) is ErrorCode.none
        assert len(coordinator.store.describe_group("g").members) == 1
        await trio.sleep(3)
        assert coordinator.heartbeat("g", 1, joined.member_id) is ErrorCode.unknown_member_id
        nursery.cancel_scope.cancel()
    # No member and no commit: the group is gone from the store.
    assert "g" not in coordinator.store.list_groups()


@pytest.mark.trio
async def test_inconsistent_protocols_are_refused(coordinator: Coordinator) -> None:
    await _join(coordinator)
    other = await _join(coordinator, protocol_type="connect")
    assert other.error is ErrorCode.inconsistent_group_protocol
    other = await _join(coordinator, protocols=[("sticky", b"")])
    assert other.error is ErrorCode.inconsistent_group_protocol
    assert (await coordinator.join(
        "", "", client_id="c", host="h", protocol_type="consumer",
        protocols=[("range", b"")], session_timeout_ms=1, rebalance_timeout_ms=1,
    )).error is ErrorCode.invalid_group_id  # fmt: skip


@pytest.mark.trio
async def test_a_follower_rejoining_unchanged_keeps_the_generation(
    coordinator: Coordinator,
) -> None:
    first = await _join(coordinator)
    await coordinator.sync("g", 1, first.member_id, {})
    results: dict[str, JoinResult] = {}

    async def join(name: str, member_id: str = "") -> None:
        results[name] = await _join(coordinator, member_id)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(join, "second")
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(join, "first", first.member_id)
    second = results["second"]
    assignments = {first.member_id: _assignment("t", [0]), second.member_id: _assignment("t", [1])}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(coordinator.sync, "g", 2, second.member_id, {})
        await trio.testing.wait_all_tasks_blocked()
        await coordinator.sync("g", 2, first.member_id, assignments)
    # The follower joins again with the same subscription: generation 2 still, at once.
    again = await _join(coordinator, second.member_id)
    assert (again.error, again.generation, again.members) == (ErrorCode.none, 2, ())
    assert coordinator.heartbeat("g", 2, first.member_id) is ErrorCode.none

    # With another subscription it is a rebalance: the leader is told to rejoin.
    async def join_changed() -> None:
        await _join(coordinator, second.member_id, protocols=[("range", b"other")])

    async with trio.open_nursery() as nursery:
        nursery.start_soon(join_changed)
        await trio.testing.wait_all_tasks_blocked()
        assert coordinator.heartbeat("g", 2, first.member_id) is ErrorCode.rebalance_in_progress
        nursery.cancel_scope.cancel()

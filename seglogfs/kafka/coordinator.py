"""The classic consumer-group protocol's coordinator (Kafka's ``GroupCoordinator``),
for the one broker, over the directory's ``OffsetStore``.

The rebalance state machine lives here, in memory, on the trio thread:
``Empty`` -> ``PreparingRebalance`` (a member joined, left or timed out: every member
must send JoinGroup again, told by ``REBALANCE_IN_PROGRESS`` on its heartbeat) ->
``CompletingRebalance`` (all joined, or the largest ``rebalance_timeout`` ran out and
the members that did not rejoin were removed: a new generation, the leader gets every
member's subscription) -> ``Stable`` (the leader's SyncGroup brought the assignment,
each member gets its share). A member that sends no heartbeat for its
``session_timeout`` is removed.

Committed offsets and who reads what are the ``OffsetStore``'s, the same store the
mount's ``P@group=NAME`` views and ``seglogfs groups`` use: once a generation is
stable each member's assigned partitions are registered there (one store member per
member and topic: ``seglogfs groups describe`` shows them with the client id and
host), commits are appended to ``__consumer_offsets`` with Kafka's schemas, and a
partition a ``P@group=NAME`` view holds is not given to a Kafka member's commit.
Static membership (``group.instance.id``) and the KIP-848 protocol are not kept:
instance ids are ignored, and ConsumerGroupHeartbeat is not advertised.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import trio
from kio.index import load_entity_schema
from kio.serial import entity_reader
from kio.static.constants import EntityType

from storage import (
    GroupError,
    OffsetStore,
    PartitionAssignedError,
    StorageError,
    UnknownTopicError,
)

from .codec import ErrorCode

__all__ = ["Coordinator", "GroupView", "JoinResult", "MemberView", "assigned_partitions"]

logger = logging.getLogger(__name__)

EMPTY = "Empty"
PREPARING = "PreparingRebalance"
COMPLETING = "CompletingRebalance"
STABLE = "Stable"

EXPIRY_CHECK_S = 0.5
"""How often session timeouts and rebalance deadlines are checked."""

TopicPartition = tuple[str, int]


@dataclass
class _Member:
    member_id: str
    client_id: str
    host: str
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    session_timeout_s: float
    rebalance_timeout_s: float
    last_seen: float
    joined: bool = False
    waiting: bool = False  # inside JoinGroup or SyncGroup: not expired meanwhile


@dataclass
class _Group:
    group_id: str
    state: str = EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str | None = None
    members: dict[str, _Member] = field(default_factory=dict)
    deadline: float = 0.0
    joined_round: trio.Event = field(default_factory=trio.Event)
    synced: trio.Event = field(default_factory=trio.Event)
    assignments: dict[str, bytes] = field(default_factory=dict)
    # (member id, topic) -> the store member registered for it
    store_members: dict[tuple[str, str], str] = field(default_factory=dict)


@dataclass(frozen=True)
class JoinResult:
    """What a JoinGroup response carries."""

    error: ErrorCode
    generation: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    member_id: str = ""
    members: tuple[tuple[str, bytes], ...] = ()


@dataclass(frozen=True)
class MemberView:
    """A live member as DescribeGroups shows it."""

    member_id: str
    client_id: str
    host: str
    metadata: bytes
    """Its subscription for the group's protocol."""
    assignment: bytes
    """Its share of the stable generation's assignment (empty while rebalancing)."""


@dataclass(frozen=True)
class GroupView:
    """A group as ListGroups and DescribeGroups show it."""

    state: str
    protocol_type: str
    protocol_name: str
    members: tuple[MemberView, ...]


class Coordinator:
    """Every classic group of the directory (see the module). Runs on the trio thread;
    store calls go through ``run_sync``."""

    def __init__(self, store: OffsetStore, run_sync: Callable[..., Awaitable[Any]]) -> None:
        self.store = store
        self.run_sync = run_sync
        self._groups: dict[str, _Group] = {}

    # -- the protocol ----------------------------------------------------------------

    async def join(
        self,
        group_id: str,
        member_id: str,
        *,
        client_id: str,
        host: str,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
    ) -> JoinResult:
        """JoinGroup: wait until the round completes; the member's view of it."""
        if not group_id:
            return JoinResult(ErrorCode.invalid_group_id, member_id=member_id)
        if not protocols or not protocol_type:
            return JoinResult(ErrorCode.inconsistent_group_protocol, member_id=member_id)
        group = self._groups.setdefault(group_id, _Group(group_id))
        if group.members and group.protocol_type not in (None, protocol_type):
            return JoinResult(ErrorCode.inconsistent_group_protocol, member_id=member_id)
        if group.members and not self._common_protocol(group, [p for p, _ in protocols]):
            return JoinResult(ErrorCode.inconsistent_group_protocol, member_id=member_id)
        now = trio.current_time()
        if member_id and member_id not in group.members:
            return JoinResult(ErrorCode.unknown_member_id, member_id=member_id)
        if not member_id:
            member_id = f"{client_id}-{uuid.uuid4()}"
            logger.info("kafka: group %s: member %s joins", group_id, member_id)
        member = group.members.get(member_id)
        if (
            member is not None
            and member.protocols == protocols
            and (group.state == COMPLETING or (group.state == STABLE and member_id != group.leader))
        ):
            # As Kafka's coordinator: a member that joins again with the same
            # subscription while nothing changed gets the current generation, no
            # rebalance (kafka-python rejoins once after its first metadata update).
            member.last_seen = now
            return self._join_result(group, member_id)
        rebalance_s = max(rebalance_timeout_ms, session_timeout_ms) / 1000
        if member is None:
            member = _Member(
                member_id,
                client_id,
                host,
                protocol_type,
                protocols,
                session_timeout_ms / 1000,
                rebalance_s,
                now,
            )
            group.members[member_id] = member
        else:
            member.protocols = protocols
            member.session_timeout_s = session_timeout_ms / 1000
            member.rebalance_timeout_s = rebalance_s
            member.last_seen = now
        group.protocol_type = protocol_type
        if group.state != PREPARING:
            self._prepare_rebalance(group, f"member {member_id} joined")
        member.joined = True
        round_done = group.joined_round
        self._maybe_complete(group)
        member.waiting = True
        try:
            await round_done.wait()
        finally:
            member.waiting = False
            member.last_seen = trio.current_time()
        if group.members.get(member_id) is not member:
            return JoinResult(ErrorCode.unknown_member_id, member_id=member_id)
        return self._join_result(group, member_id)

    def _join_result(self, group: _Group, member_id: str) -> JoinResult:
        """The JoinGroup answer of the group's current generation (the subscriptions
        for the leader only)."""
        members: tuple[tuple[str, bytes], ...] = ()
        if group.leader == member_id:
            assert group.protocol_name is not None
            members = tuple(
                (m.member_id, dict(m.protocols)[group.protocol_name])
                for m in group.members.values()
            )
        return JoinResult(
            ErrorCode.none,
            group.generation,
            group.protocol_type,
            group.protocol_name,
            group.leader or "",
            member_id,
            members,
        )

    async def sync(
        self, group_id: str, generation: int, member_id: str, assignments: dict[str, bytes]
    ) -> tuple[ErrorCode, bytes, str | None, str | None]:
        """SyncGroup: the member's assignment (error, assignment, protocol type, name)."""
        group = self._groups.get(group_id)
        error = self._check_member(group, generation, member_id)
        if error is not ErrorCode.none or group is None:
            return error, b"", None, None
        member = group.members[member_id]
        member.last_seen = trio.current_time()
        if group.state == PREPARING:
            return ErrorCode.rebalance_in_progress, b"", None, None
        if group.state == COMPLETING and member_id == group.leader:
            group.assignments = dict(assignments)
            group.state = STABLE
            logger.info(
                "kafka: group %s: generation %d stable with %d member(s)",
                group_id,
                generation,
                len(group.members),
            )
            # The followers of this generation wait on this event; a join during the
            # registration below replaces group.synced (and sets the old one).
            synced = group.synced
            await self._register(group)
            synced.set()
        elif group.state == COMPLETING:
            synced = group.synced
            member.waiting = True
            try:
                with trio.move_on_after(member.rebalance_timeout_s):
                    await synced.wait()
            finally:
                member.waiting = False
                member.last_seen = trio.current_time()
        if group.generation != generation or group.state != STABLE:
            return ErrorCode.rebalance_in_progress, b"", None, None
        if group.members.get(member_id) is not member:
            return ErrorCode.unknown_member_id, b"", None, None
        assignment = group.assignments.get(member_id, b"")
        return ErrorCode.none, assignment, group.protocol_type, group.protocol_name

    def heartbeat(self, group_id: str, generation: int, member_id: str) -> ErrorCode:
        """Heartbeat: keeps the member; tells it when a rebalance needs it."""
        group = self._groups.get(group_id)
        error = self._check_member(group, generation, member_id)
        if error is not ErrorCode.none or group is None:
            return error
        group.members[member_id].last_seen = trio.current_time()
        if group.state == PREPARING:
            return ErrorCode.rebalance_in_progress
        return ErrorCode.none

    async def leave(self, group_id: str, member_ids: list[str]) -> dict[str, ErrorCode]:
        """LeaveGroup: each member's outcome."""
        group = self._groups.get(group_id)
        outcome: dict[str, ErrorCode] = {}
        gone: list[str] = []
        for member_id in member_ids:
            if group is None or member_id not in group.members:
                outcome[member_id] = ErrorCode.unknown_member_id
                continue
            outcome[member_id] = ErrorCode.none
            gone.append(member_id)
        if group is not None and gone:
            await self._remove(group, gone, "left")
        return outcome

    async def commit(
        self,
        group_id: str,
        generation: int,
        member_id: str,
        offsets: dict[TopicPartition, int],
        metadata: dict[TopicPartition, str],
    ) -> dict[TopicPartition, ErrorCode]:
        """OffsetCommit: each partition's outcome. A commit with generation -1 and no
        member id is a simple commit (a consumer that ``assign()``s, or an admin)."""
        if not group_id:
            return dict.fromkeys(offsets, ErrorCode.invalid_group_id)
        group = self._groups.get(group_id)
        store_members: dict[str, str | None] = {}
        if generation >= 0 or member_id:
            # While the group rebalances the generation is still the last one: its
            # members may commit what they consumed, as Kafka lets them.
            error = self._check_member(group, generation, member_id)
            if error is not ErrorCode.none or group is None:
                return dict.fromkeys(offsets, error)
            group.members[member_id].last_seen = trio.current_time()
            store_members = {
                topic: store_id
                for (owner, topic), store_id in group.store_members.items()
                if owner == member_id
            }
        by_topic: dict[str, dict[TopicPartition, int]] = {}
        for tp, offset in offsets.items():
            by_topic.setdefault(tp[0], {})[tp] = offset
        results: dict[TopicPartition, ErrorCode] = {}
        for topic, part in by_topic.items():
            text = next((metadata[tp] for tp in part if metadata.get(tp)), "")
            code = await self.run_sync(
                self._commit_to_store, group_id, part, store_members.get(topic), text
            )
            results.update(dict.fromkeys(part, code))
        return results

    def _commit_to_store(
        self,
        group_id: str,
        offsets: dict[TopicPartition, int],
        store_member: str | None,
        metadata: str,
    ) -> ErrorCode:
        try:
            self.store.commit(group_id, offsets, member_id=store_member, metadata=metadata)
        except UnknownTopicError:
            return ErrorCode.unknown_topic_or_partition
        except PartitionAssignedError as exc:
            # A P@group= view (or another member of an older generation) holds it.
            logger.warning("kafka: group %s: commit refused: %s", group_id, exc)
            return ErrorCode.unknown_server_error
        except (GroupError, StorageError, OSError) as exc:
            logger.warning("kafka: group %s: commit failed: %s", group_id, exc)
            return ErrorCode.unknown_server_error
        return ErrorCode.none

    # -- the admin APIs (ListGroups, DescribeGroups, DeleteGroups) --------------------

    def live_groups(self) -> dict[str, GroupView]:
        """The groups this coordinator knows, by id (their state and members)."""
        return {group_id: self._view(group) for group_id, group in self._groups.items()}

    def live_group(self, group_id: str) -> GroupView | None:
        """One group this coordinator knows, None when it knows none of that id."""
        group = self._groups.get(group_id)
        return None if group is None else self._view(group)

    def forget(self, group_id: str) -> None:
        """Drop an empty group's in-memory state (DeleteGroups deleted it)."""
        group = self._groups.get(group_id)
        if group is not None and not group.members:
            del self._groups[group_id]

    def _view(self, group: _Group) -> GroupView:
        protocol = group.protocol_name
        members = tuple(
            MemberView(
                m.member_id,
                m.client_id,
                m.host,
                dict(m.protocols).get(protocol or "", b""),
                group.assignments.get(m.member_id, b"") if group.state == STABLE else b"",
            )
            for m in group.members.values()
        )
        return GroupView(group.state, group.protocol_type or "", protocol or "", members)

    # -- time ------------------------------------------------------------------------

    async def expire_forever(self) -> None:
        """Remove members past their session timeout and finish rebalances past their
        deadline, until cancelled."""
        while True:
            await trio.sleep(EXPIRY_CHECK_S)
            now = trio.current_time()
            for group in list(self._groups.values()):
                late = [
                    m.member_id
                    for m in group.members.values()
                    if not m.waiting and now - m.last_seen > m.session_timeout_s
                ]
                if late:
                    await self._remove(group, late, "session timeout")
                if group.state == PREPARING and now >= group.deadline:
                    await self._remove(
                        group,
                        [m.member_id for m in group.members.values() if not m.joined],
                        "did not rejoin within the rebalance timeout",
                    )
                    self._maybe_complete(group)

    # -- the state machine -----------------------------------------------------------

    def _check_member(self, group: _Group | None, generation: int, member_id: str) -> ErrorCode:
        if group is None or member_id not in group.members:
            return ErrorCode.unknown_member_id
        if generation != group.generation:
            return ErrorCode.illegal_generation
        return ErrorCode.none

    def _common_protocol(self, group: _Group, extra: list[str] | None = None) -> str | None:
        """The first protocol of the leader's (else any member's) preference that every
        member (and ``extra``'s candidate) supports."""
        members = list(group.members.values())
        if not members:
            return extra[0] if extra else None
        first = group.members.get(group.leader or "") or members[0]
        for name, _ in first.protocols:
            if all(name in dict(m.protocols) for m in members) and (extra is None or name in extra):
                return name
        return None

    def _prepare_rebalance(self, group: _Group, reason: str) -> None:
        logger.info("kafka: group %s: rebalancing (%s)", group.group_id, reason)
        group.state = PREPARING
        for member in group.members.values():
            member.joined = False
        group.deadline = trio.current_time() + max(
            (m.rebalance_timeout_s for m in group.members.values()), default=0.0
        )
        # Followers waiting in SyncGroup for the old generation learn it is gone.
        group.synced.set()
        group.synced = trio.Event()

    def _maybe_complete(self, group: _Group) -> None:
        if group.state != PREPARING or not all(m.joined for m in group.members.values()):
            return
        group.generation += 1
        done = group.joined_round
        group.joined_round = trio.Event()
        if not group.members:
            group.state = EMPTY
            group.leader = group.protocol_name = group.protocol_type = None
        else:
            group.protocol_name = self._common_protocol(group)
            if group.leader not in group.members:
                group.leader = next(iter(group.members))
            group.state = COMPLETING
            group.assignments = {}
        done.set()

    async def _remove(self, group: _Group, member_ids: list[str], reason: str) -> None:
        for member_id in member_ids:
            if group.members.pop(member_id, None) is not None:
                logger.info("kafka: group %s: member %s %s", group.group_id, member_id, reason)
        stale = [k for k in group.store_members if k[0] in member_ids]
        await self._unregister(group, stale)
        if group.state == PREPARING:
            self._maybe_complete(group)
        elif group.members:
            self._prepare_rebalance(group, f"{len(member_ids)} member(s) {reason}")
        else:
            group.state = EMPTY
            group.generation += 1
            group.leader = group.protocol_name = group.protocol_type = None
            group.synced.set()
            group.synced = trio.Event()

    async def _register(self, group: _Group) -> None:
        """Make the store's members match the stable generation's assignment."""
        await self._unregister(group, list(group.store_members))
        wanted: dict[tuple[str, str], list[int]] = {}
        if group.protocol_type == "consumer":
            for member_id, data in group.assignments.items():
                for topic, partitions in assigned_partitions(data).items():
                    wanted[(member_id, topic)] = partitions
        for (member_id, topic), partitions in wanted.items():
            member = group.members.get(member_id)
            if member is None or not partitions:
                continue
            try:
                store_id, _ = await self.run_sync(
                    lambda m=member, t=topic, p=partitions: self.store.join(
                        group.group_id, t, p, client_id=m.client_id, host=m.host
                    )
                )
            except (GroupError, StorageError) as exc:
                logger.warning(
                    "kafka: group %s: member %s cannot hold %s %s: %s",
                    group.group_id,
                    member_id,
                    topic,
                    partitions,
                    exc,
                )
                continue
            group.store_members[(member_id, topic)] = store_id

    async def _unregister(self, group: _Group, keys: list[tuple[str, str]]) -> None:
        for key in keys:
            store_id = group.store_members.pop(key)
            await self.run_sync(self.store.leave, group.group_id, store_id)


def assigned_partitions(data: bytes) -> dict[str, list[int]]:
    """The partitions of a ``consumer`` protocol assignment (Kafka's
    ``ConsumerProtocolAssignment``: a version, then the schema of that version), by
    topic; empty when it does not decode."""
    if len(data) < 2:
        return {}
    version = min(int.from_bytes(data[:2], "big", signed=True), 3)
    try:
        cls: Any = load_entity_schema("consumer_protocol_assignment", version, EntityType.data)
        assignment, _ = entity_reader(cls)(data, 2)
    except Exception:  # kio's decoding errors: a client's own protocol
        return {}
    found: dict[str, list[int]] = {}
    for tp in assignment.assigned_partitions:
        found.setdefault(tp.topic, []).extend(int(p) for p in tp.partitions)
    return found

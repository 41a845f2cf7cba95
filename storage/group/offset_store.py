"""Committed offsets of consumer groups, kept in ``__consumer_offsets`` (Kafka's
``GroupMetadataManager`` / ``OffsetMetadataManager``), and the groups' live members.

Storage. A commit of group G for topic-partition T-P is one record of the offsets topic
in partition ``partition_for_group(G)``: key ``OffsetCommitKey(G, T, P)`` (version 1),
value ``OffsetCommitValue`` (version 3), exactly as a Kafka broker writes it; a deleted
group or an expired offset is a tombstone (null value) of its key. The latest record per
key is the truth (the topic is compacted in Kafka; here it is created ``delete`` with
infinite retention until the engine compacts: ``offsets_topic_overrides``). The store
keeps the latest value per key in memory: each partition of the topic is read once,
from its start, the first time a group in it is used (``list_groups``: all of them),
then only the records appended since (a read-only store follows a live writer so).
Commits are appended with ``Log.append`` and so flushed by the topic's ``flush.*``
settings, as every append; the topic is created on the first commit, with
``offsets.topic.num.partitions`` partitions. Group metadata records (key version 2) are
read for what they say of a broker's members; newer record types are skipped.

Members. Kafka's coordinator knows which consumers are in a group; here the process
that writes the log directory (the daemon, or a command holding the writer lock) keeps
that registry in memory: a consumer ``join``s with the partitions it wants and gets
those no other live member holds (one reader per partition and group: nothing is read
twice by a group, as Kafka's assignment guarantees), ``heartbeat`` picks up partitions
freed since, ``leave`` frees them. A member is live while it has not left and, when it
gave a process id, while that process runs (the same pid with the same start time in
``/proc``): a consumer killed with ``SIGKILL`` frees its partitions at once, without
Kafka's session timeout. A group with a live member is *Stable*: its offsets cannot be
reset (``reset_offsets``) nor the group deleted (``delete_group``), and a commit for a
partition another member holds is refused. A group without one is *Empty*.

Expiry (``offsets.retention.minutes``): the offsets of an Empty group expire that long
after their commit, or after the group became empty in this process if later (Kafka's
rule for consumer groups; v1 values carry their own expire timestamp); an expired
offset gets a tombstone. A writable store checks at most every
``offsets.retention.check.interval.ms``, on its next call. A read-only store (a copy of
a broker's directory) shows what the topic holds and expires nothing.

Thread-safety: every method takes the store's lock; the engine's logs are thread-safe.
"""

from __future__ import annotations

import logging
import os
import threading
import uuid
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ..clock import Clock
from ..errors import ConfigError, CorruptRecordError, UnknownTopicError
from ..log.log import Log
from ..log.log_manager import LogManager
from .coordinator_record import (
    GroupMetadataKey,
    GroupMetadataValue,
    OffsetCommitKey,
    OffsetCommitValue,
    assigned_partitions,
    group_metadata_key,
    offset_commit_key,
    offset_commit_value,
    parse_group_metadata_value,
    parse_key,
    parse_offset_commit_value,
)
from .errors import (
    GroupIdNotFoundError,
    InvalidGroupIdError,
    NonEmptyGroupError,
    PartitionAssignedError,
    UnknownMemberIdError,
)
from .offsets_topic import (
    COMPACTED_OFFSETS_TOPIC,
    OFFSETS_TOPIC,
    GroupConfig,
    compaction_supported,
    offsets_topic_overrides,
    partition_for_group,
)

__all__ = [
    "EMPTY",
    "STABLE",
    "GroupDescription",
    "MemberDescription",
    "OffsetStore",
    "TopicPartition",
]

logger = logging.getLogger(__name__)

TopicPartition = tuple[str, int]

STABLE = "Stable"
"""A group with live members (Kafka's state name)."""
EMPTY = "Empty"
"""A group with committed offsets and no live member."""


@dataclass(frozen=True)
class MemberDescription:
    """A member as ``describe`` shows it: ``CONSUMER-ID``, ``HOST``, ``CLIENT-ID`` and
    the partitions it reads."""

    member_id: str
    client_id: str
    host: str
    assignment: tuple[TopicPartition, ...]


@dataclass(frozen=True)
class GroupDescription:
    """A group: its state, members and committed offsets.

    ``recorded`` says the members are those a Kafka broker last recorded in the topic
    (a read-only store of a broker's directory knows no live members)."""

    group: str
    state: str
    members: tuple[MemberDescription, ...]
    offsets: Mapping[TopicPartition, OffsetCommitValue]
    recorded: bool = False


@dataclass
class _Member:
    member_id: str
    group: str
    client_id: str
    host: str
    topic: str
    wanted: tuple[int, ...]
    assigned: set[int]
    pid: int | None
    started: str | None

    def describe(self) -> MemberDescription:
        return MemberDescription(
            self.member_id,
            self.client_id,
            self.host,
            tuple((self.topic, p) for p in sorted(self.assigned)),
        )


@dataclass
class _Group:
    offsets: dict[TopicPartition, OffsetCommitValue] = field(default_factory=dict)
    metadata: GroupMetadataValue | None = None
    has_metadata_record: bool = False
    empty_since: int = -1

    @property
    def exists(self) -> bool:
        return bool(self.offsets) or self.metadata is not None


def _process_start(pid: int) -> str | None:
    """Field 22 of ``/proc/PID/stat`` (the start time), None when it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read().decode("ascii", "replace")
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces.
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[19] if len(fields) > 19 else None


def _process_alive(pid: int, started: str | None) -> bool:
    if started is not None:
        return _process_start(pid) == started
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_SHARED: weakref.WeakKeyDictionary[LogManager, OffsetStore] = weakref.WeakKeyDictionary()
_SHARED_LOCK = threading.Lock()


class OffsetStore:
    """The consumer groups of one log directory (see the module).

    Use ``OffsetStore.shared(manager)``: one store per ``LogManager``, so that every
    part of a process (the file system and the control socket of a daemon) sees the
    same members and commits.
    """

    def __init__(self, manager: LogManager, config: GroupConfig | None = None) -> None:
        self.manager = manager
        self.config = config or GroupConfig()
        self.clock: Clock = manager.clock
        self._lock = threading.RLock()
        self._groups: dict[str, _Group] = {}
        self._next_offset: dict[int, int] = {}  # per partition of the topic: read up to
        self._logs: dict[int, Log] = {}  # the log each partition was read from
        self._members: dict[str, _Member] = {}
        self._next_expiry = (
            self.clock.milliseconds() + self.config.offsets_retention_check_interval_ms
        )
        if not manager.read_only:
            self._compact_when_supported()

    @classmethod
    def shared(cls, manager: LogManager, config: GroupConfig | None = None) -> OffsetStore:
        """The store of ``manager``, made on first use (``config`` applies then).

        Cost: O(1); reading the topic happens on first use of each partition."""
        with _SHARED_LOCK:
            store = _SHARED.get(manager)
            if store is None:
                store = _SHARED[manager] = cls(manager, config)
            return store

    @property
    def read_only(self) -> bool:
        return self.manager.read_only

    # -- the topic ---------------------------------------------------------------------

    def _compact_when_supported(self) -> None:
        # A topic created while the engine refused compaction carries the stand-in
        # settings of offsets_topic_overrides; once compaction exists it gets Kafka's.
        if OFFSETS_TOPIC not in self.manager.topics():
            return
        overrides = self.manager.topic(OFFSETS_TOPIC).overrides
        stand_in = (
            overrides.get("cleanup.policy") == "delete" and overrides.get("retention.ms") == "-1"
        )
        if stand_in and compaction_supported(self.manager.broker_config):
            self.manager.alter_topic_config(
                OFFSETS_TOPIC, COMPACTED_OFFSETS_TOPIC, ["retention.ms"]
            )
            logger.info("%s: now compacted, as Kafka keeps it", OFFSETS_TOPIC)

    def _partition_count(self) -> int:
        # A broker's directory holds only the partitions that broker led or followed
        # (the topic's count is then its highest partition directory's, plus one):
        # groups are placed by offsets.topic.num.partitions, as Kafka places them.
        configured = self.config.offsets_topic_num_partitions
        if OFFSETS_TOPIC in self.manager.topics():
            return max(self.manager.topic(OFFSETS_TOPIC).partitions, configured)
        return configured

    def partition_of(self, group: str) -> int:
        """The partition of the offsets topic that holds ``group``."""
        return partition_for_group(group, self._partition_count())

    def _log(self, partition: int, *, create: bool) -> Log | None:
        manager = self.manager
        if OFFSETS_TOPIC not in manager.topics() and manager.read_only:
            manager.refresh()  # a live writer may have created it since
        if OFFSETS_TOPIC not in manager.topics():
            if not create:
                return None
            manager.create_topic(
                OFFSETS_TOPIC,
                self.config.offsets_topic_num_partitions,
                offsets_topic_overrides(manager.broker_config, self.config),
            )
            logger.info(
                "created %s with %d partitions",
                OFFSETS_TOPIC,
                self.config.offsets_topic_num_partitions,
            )
        try:
            return manager.log(OFFSETS_TOPIC, partition)
        except UnknownTopicError:
            if create:
                raise
            return None  # a copy of a broker's directory may lack a partition

    def _catch_up(self, partition: int) -> None:
        """Read the records of ``partition`` appended since the last call (all of them
        the first time); a log replaced since (the topic deleted and created again) is
        read from its start. The caller holds the lock.

        Cost: O(records appended since).
        """
        log = self._log(partition, create=False)
        if log is None:
            return
        if self._logs.get(partition) is not log:
            if partition in self._logs:
                self._forget_partition(partition)
            self._logs[partition] = log
            self._next_offset[partition] = log.log_start_offset
        if self.read_only:
            log.refresh()
        start = max(self._next_offset[partition], log.log_start_offset)
        if start >= log.log_end_offset:
            return
        position = start
        for batch in log.batches(start):
            if batch.is_control:
                position = batch.next_offset
                continue
            for record in batch.records():
                if record.offset >= start:
                    self._apply(record.key, record.value, record.offset, partition)
            position = batch.next_offset
        self._next_offset[partition] = position

    def _forget_partition(self, partition: int) -> None:
        count = self._partition_count()
        for name in [g for g in self._groups if partition_for_group(g, count) == partition]:
            del self._groups[name]

    def _apply(self, key: bytes | None, value: bytes | None, offset: int, partition: int) -> None:
        if key is None:
            logger.warning(
                "%s-%d offset %d: a record without key, skipped", OFFSETS_TOPIC, partition, offset
            )
            return
        try:
            parsed = parse_key(key)
            if isinstance(parsed, OffsetCommitKey):
                group = self._groups.setdefault(parsed.group, _Group())
                tp = (parsed.topic, parsed.partition)
                if value is None:
                    group.offsets.pop(tp, None)
                else:
                    group.offsets[tp] = parse_offset_commit_value(value)
            elif isinstance(parsed, GroupMetadataKey):
                group = self._groups.setdefault(parsed.group, _Group())
                group.has_metadata_record = True
                group.metadata = None if value is None else parse_group_metadata_value(value)
            else:
                return  # a newer record type (KIP-848 groups, share groups, ...)
        except CorruptRecordError as exc:
            # Kafka's loader would fail the partition; one unreadable record must not
            # hide every other group's offsets.
            logger.warning("%s-%d offset %d skipped: %s", OFFSETS_TOPIC, partition, offset, exc)
            return
        if not self._groups[parsed.group].exists:
            del self._groups[parsed.group]

    def _group(self, group: str) -> _Group | None:
        self._catch_up(self.partition_of(group))
        self._maybe_expire()
        return self._groups.get(group)

    def _all_groups(self) -> dict[str, _Group]:
        for partition in range(self._partition_count()):
            self._catch_up(partition)
        self._maybe_expire()
        return self._groups

    def _append(self, group: str, keys: list[bytes], values: list[bytes | None]) -> None:
        """Append records of ``group`` as one batch, then read them back into the cache.
        The caller holds the lock.

        Raises:
            ReadOnlyLogError: a read-only store.
            OSError: the append failed; nothing changed.
        """
        partition = self.partition_of(group)
        self._catch_up(partition)
        log = self._log(partition, create=True)
        assert log is not None
        record_keys: list[bytes | None] = list(keys)
        log.append(values, keys=record_keys, timestamps=self.clock.milliseconds())
        self._catch_up(partition)

    # -- queries -----------------------------------------------------------------------

    def list_groups(self) -> list[str]:
        """Every group with committed offsets, recorded metadata or live members, sorted.

        Cost: the first call reads every partition of the topic."""
        with self._lock:
            names = {name for name, group in self._all_groups().items() if group.exists}
            names.update(m.group for m in self._live_members())
            return sorted(names)

    def committed(
        self, group: str, topic: str | None = None
    ) -> dict[TopicPartition, OffsetCommitValue]:
        """The committed offsets of ``group`` (of ``topic`` only, when given)."""
        with self._lock:
            found = self._group(group)
            if found is None:
                return {}
            return {tp: v for tp, v in found.offsets.items() if topic is None or tp[0] == topic}

    def offsets_of_partition(self, topic: str, partition: int) -> dict[str, int]:
        """Each group's committed offset of ``topic``-``partition``, by group.

        Cost: the first call reads every partition of the topic; then O(groups)."""
        with self._lock:
            tp = (topic, partition)
            return {
                name: group.offsets[tp].offset
                for name, group in sorted(self._all_groups().items())
                if tp in group.offsets
            }

    def describe_group(self, group: str) -> GroupDescription:
        """The state, members and offsets of ``group``.

        Raises:
            GroupIdNotFoundError: no offsets, recorded metadata or live member.
        """
        with self._lock:
            found = self._group(group)
            live = [m for m in self._live_members() if m.group == group]
            if (found is None or not found.exists) and not live:
                raise GroupIdNotFoundError(group)
            offsets = dict(found.offsets) if found is not None else {}
            if live:
                members = tuple(m.describe() for m in live)
                return GroupDescription(group, STABLE, members, offsets)
            metadata = found.metadata if found is not None else None
            if self.read_only and metadata is not None and metadata.members:
                recorded = tuple(
                    MemberDescription(
                        m.member_id,
                        m.client_id,
                        m.client_host,
                        tuple(_assignment(m.assignment)),
                    )
                    for m in metadata.members
                )
                return GroupDescription(group, STABLE, recorded, offsets, recorded=True)
            return GroupDescription(group, EMPTY, (), offsets)

    # -- commits -----------------------------------------------------------------------

    def commit(
        self,
        group: str,
        offsets: Mapping[TopicPartition, int],
        *,
        member_id: str | None = None,
        metadata: str = "",
    ) -> None:
        """Commit ``offsets`` (the next offset to read, per partition) for ``group``: one
        batch appended to its partition of the offsets topic, then cached.

        A member commits its own partitions; a commit without ``member_id`` (an admin's,
        or a consumer outside the group protocol's, as Kafka's ``assign()``) is refused
        for partitions a live member holds.

        Raises:
            InvalidGroupIdError: an empty group id.
            ConfigError: a negative offset.
            UnknownTopicError: a topic or partition that does not exist.
            UnknownMemberIdError: ``member_id`` is not a live member of the group.
            PartitionAssignedError: a partition another live member holds.
            ReadOnlyLogError: a read-only store.
        """
        _check_group(group)
        with self._lock:
            for (topic, partition), offset in offsets.items():
                if offset < 0:
                    raise ConfigError("offset", offset, "a committed offset must not be negative")
                self.manager.log(topic, partition)  # UnknownTopicError
            self._check_holder(group, offsets.keys(), member_id)
            self._write_offsets(group, offsets, metadata)

    def _write_offsets(
        self, group: str, offsets: Mapping[TopicPartition, int], metadata: str
    ) -> None:
        if not offsets:
            return
        now = self.clock.milliseconds()
        keys = [offset_commit_key(group, t, p) for t, p in offsets]
        values: list[bytes | None] = [
            offset_commit_value(o, metadata, now) for o in offsets.values()
        ]
        self._append(group, keys, values)

    def reset_offsets(self, group: str, offsets: Mapping[TopicPartition, int]) -> None:
        """``kafka-consumer-groups.sh --reset-offsets --execute``: commit ``offsets``
        for ``group``, which must be inactive (no live member).

        Raises:
            NonEmptyGroupError: the group is consuming.
            as ``commit`` otherwise.
        """
        with self._lock:
            live = [m.member_id for m in self._live_members() if m.group == group]
            if live:
                raise NonEmptyGroupError(group, live)
            self.commit(group, offsets)

    def delete_group(self, group: str) -> None:
        """Delete ``group``: a tombstone for each of its committed offsets and for its
        metadata, in one batch (Kafka's ``DeleteGroups``).

        Raises:
            GroupIdNotFoundError: no such group.
            NonEmptyGroupError: the group has live members.
            ReadOnlyLogError: a read-only store.
        """
        _check_group(group)
        with self._lock:
            found = self._group(group)
            live = [m.member_id for m in self._live_members() if m.group == group]
            if live:
                raise NonEmptyGroupError(group, live)
            if found is None or not found.exists:
                raise GroupIdNotFoundError(group)
            keys = [offset_commit_key(group, t, p) for t, p in found.offsets]
            keys.append(group_metadata_key(group))
            self._append(group, keys, [None] * len(keys))
            self._groups.pop(group, None)

    # -- expiry ------------------------------------------------------------------------

    def _maybe_expire(self) -> None:
        if self.read_only:
            return
        now = self.clock.milliseconds()
        if now < self._next_expiry:
            return
        self._next_expiry = now + self.config.offsets_retention_check_interval_ms
        self.expire_offsets(now)

    def expire_offsets(self, now: int | None = None) -> int:
        """Write tombstones for the expired offsets of every Empty group (see the
        module); returns how many expired. A read-only store expires nothing.

        Cost: reads every partition of the topic on first use; O(offsets) after.
        """
        if self.read_only:
            return 0
        with self._lock:
            if now is None:
                now = self.clock.milliseconds()
            self._next_expiry = now + self.config.offsets_retention_check_interval_ms
            busy = {m.group for m in self._live_members()}
            retention = self.config.retention_ms
            expired = 0
            for partition in range(self._partition_count()):
                self._catch_up(partition)
            for name, group in list(self._groups.items()):
                if name in busy:
                    continue
                gone = [
                    tp
                    for tp, value in group.offsets.items()
                    if _expired(value, group.empty_since, retention, now)
                ]
                if gone:
                    keys = [offset_commit_key(name, t, p) for t, p in gone]
                    self._append(name, keys, [None] * len(keys))
                    expired += len(gone)
                    logger.info("group %s: %d offset(s) expired", name, len(gone))
            return expired

    # -- members -----------------------------------------------------------------------

    def _live_members(self) -> list[_Member]:
        """The members still alive, sorted by id; the others leave now."""
        for member in list(self._members.values()):
            if member.pid is not None and not _process_alive(member.pid, member.started):
                logger.info(
                    "group %s: member %s left (its process %d is gone)",
                    member.group,
                    member.member_id,
                    member.pid,
                )
                self._remove(member)
        return sorted(self._members.values(), key=lambda m: m.member_id)

    def _remove(self, member: _Member) -> None:
        del self._members[member.member_id]
        if not any(m.group == member.group for m in self._members.values()):
            group = self._groups.get(member.group)
            if group is not None:
                group.empty_since = self.clock.milliseconds()

    def _holders(self, group: str) -> dict[TopicPartition, _Member]:
        return {
            (m.topic, p): m for m in self._live_members() if m.group == group for p in m.assigned
        }

    def _check_holder(
        self, group: str, partitions: Iterable[TopicPartition], member_id: str | None
    ) -> None:
        if member_id is not None:
            member = self._members.get(member_id)
            if member is None or member.group != group or member not in self._live_members():
                raise UnknownMemberIdError(group, member_id)
        holders = self._holders(group)
        for tp in partitions:
            holder = holders.get(tp)
            if holder is not None and holder.member_id != member_id:
                raise PartitionAssignedError(group, [tp], holder.member_id)

    def join(
        self,
        group: str,
        topic: str,
        partitions: Iterable[int],
        *,
        client_id: str,
        host: str = "localhost",
        pid: int | None = None,
    ) -> tuple[str, list[int]]:
        """Make a new member of ``group`` that wants ``partitions`` of ``topic``; return
        its member id and the partitions it got: those no live member holds. ``pid``:
        the member lives while that process runs (None: until it leaves).

        Raises:
            InvalidGroupIdError: an empty group id.
            UnknownTopicError: a partition that does not exist.
            PartitionAssignedError: every partition wanted is held by another member.
        """
        _check_group(group)
        wanted = tuple(sorted(set(partitions)))
        with self._lock:
            for p in wanted:
                self.manager.log(topic, p)
            holders = self._holders(group)
            assigned = {p for p in wanted if (topic, p) not in holders}
            if wanted and not assigned:
                first = holders[(topic, wanted[0])]
                raise PartitionAssignedError(group, [(topic, p) for p in wanted], first.member_id)
            member_id = f"{client_id}-{uuid.uuid4()}"
            started = _process_start(pid) if pid is not None else None
            self._members[member_id] = _Member(
                member_id, group, client_id, host, topic, wanted, assigned, pid, started
            )
            logger.debug(
                "group %s: member %s joined for %s %s", group, member_id, topic, sorted(assigned)
            )
            return member_id, sorted(assigned)

    def heartbeat(self, group: str, member_id: str) -> list[int]:
        """The partitions ``member_id`` holds now, taking those it wants that no live
        member holds any more.

        Raises:
            UnknownMemberIdError: not a live member of ``group``.
        """
        with self._lock:
            member = self._members.get(member_id)
            if member is None or member.group != group or member not in self._live_members():
                raise UnknownMemberIdError(group, member_id)
            holders = self._holders(group)
            member.assigned |= {p for p in member.wanted if (member.topic, p) not in holders}
            return sorted(member.assigned)

    def leave(self, group: str, member_id: str) -> None:
        """``member_id`` leaves ``group`` (no error when it already left)."""
        with self._lock:
            member = self._members.get(member_id)
            if member is not None and member.group == group:
                self._remove(member)


def _check_group(group: str) -> None:
    if not group:
        raise InvalidGroupIdError(group)


def _assignment(data: bytes) -> list[TopicPartition]:
    try:
        return assigned_partitions(data)
    except CorruptRecordError:
        return []


def _expired(value: OffsetCommitValue, empty_since: int, retention: int, now: int) -> bool:
    if value.expire_timestamp >= 0:
        return now >= value.expire_timestamp
    return now - max(value.commit_timestamp, empty_since) >= retention

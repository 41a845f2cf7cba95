"""The records of ``__consumer_offsets``: Kafka's group coordinator record schemas.

Every record of the offsets topic has a key and a value that start with an ``int16``
version; the key's version says what the record is (Kafka's ``CoordinatorRecord``
types, ``group-coordinator/src/main/resources/common/message/*.json``):

- key versions 0 and 1: an offset commit, ``OffsetCommitKey`` (``group`` string,
  ``topic`` string, ``partition`` int32); its value ``OffsetCommitValue``:

  ====  ==========================================================================
  v0    offset int64, metadata string, commitTimestamp int64
  v1    offset int64, metadata string, commitTimestamp int64, expireTimestamp int64
  v2    offset int64, metadata string, commitTimestamp int64
  v3    offset int64, leaderEpoch int32, metadata string, commitTimestamp int64
  v4+   as v3, flexible: compact string, then tagged fields (KIP-915: later
        versions only add tagged fields, so they read as v4)
  ====  ==========================================================================

- key version 2: a classic group's metadata, ``GroupMetadataKey`` (``group`` string);
  its value ``GroupMetadataValue`` (protocolType, generation, protocol, leader,
  currentStateTimestamp from v2, members: memberId, groupInstanceId from v3, clientId,
  clientHost, rebalanceTimeout from v1, sessionTimeout, subscription, assignment;
  flexible from v4);
- key versions 3 and up: the record types of newer group protocols (KIP-848 consumer
  groups, share and streams groups): ``UnknownKey``, skipped by readers.

A null value is a tombstone: the key's offset, or the group, is deleted.

Non-flexible encodings: ``string`` is an int16 length (-1: null) and UTF-8 bytes,
``bytes`` an int32 length, an array an int32 count. Flexible versions use compact
forms (an unsigned varint of length + 1, 0 for null) and end every struct with tagged
fields (an unsigned varint count, then per field its tag, size and bytes), which a
reader skips.

This engine writes offset commits as Kafka 2.1+ brokers do: key version 1, value
version 3 (``offset_commit_key``, ``offset_commit_value``).

Thread-safety: pure functions and frozen dataclasses.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ..errors import CorruptRecordError

__all__ = [
    "GroupMetadataKey",
    "GroupMetadataValue",
    "MemberMetadata",
    "OffsetCommitKey",
    "OffsetCommitValue",
    "UnknownKey",
    "assigned_partitions",
    "group_metadata_key",
    "offset_commit_key",
    "offset_commit_value",
    "parse_group_metadata_value",
    "parse_key",
    "parse_offset_commit_value",
]

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")

OFFSET_COMMIT_KEY_VERSION = 1
OFFSET_COMMIT_VALUE_VERSION = 3
GROUP_METADATA_KEY_VERSION = 2
_FLEXIBLE_VALUE_VERSION = 4  # the first flexible version of both value schemas


@dataclass(frozen=True)
class OffsetCommitKey:
    """The key of an offset commit (key versions 0 and 1)."""

    group: str
    topic: str
    partition: int


@dataclass(frozen=True)
class GroupMetadataKey:
    """The key of a classic group's metadata (key version 2)."""

    group: str


@dataclass(frozen=True)
class UnknownKey:
    """A key of a record type this engine does not read (version 3 and up)."""

    version: int


CoordinatorKey = OffsetCommitKey | GroupMetadataKey | UnknownKey


@dataclass(frozen=True)
class OffsetCommitValue:
    """A committed offset: where the group's next read of the partition starts.

    ``leader_epoch`` -1 and ``expire_timestamp`` -1 mean none (``expire_timestamp``
    exists in value version 1 only)."""

    offset: int
    metadata: str = ""
    commit_timestamp: int = -1
    leader_epoch: int = -1
    expire_timestamp: int = -1


@dataclass(frozen=True)
class MemberMetadata:
    """One member of a classic group, as its metadata record lists it.
    ``subscription`` and ``assignment`` are the consumer protocol's bytes."""

    member_id: str
    client_id: str
    client_host: str
    session_timeout: int
    subscription: bytes
    assignment: bytes
    rebalance_timeout: int = -1
    group_instance_id: str | None = None


@dataclass(frozen=True)
class GroupMetadataValue:
    """A classic group's state as the coordinator last recorded it."""

    protocol_type: str
    generation: int
    protocol: str | None
    leader: str | None
    members: tuple[MemberMetadata, ...] = ()
    current_state_timestamp: int = -1


class _Reader:
    """Reads the schemas' primitive types from ``data``; a record cut short or holding
    an impossible length is a ``CorruptRecordError`` naming ``what``."""

    __slots__ = ("data", "flexible", "position", "what")

    def __init__(self, data: bytes, what: str, flexible: bool = False) -> None:
        self.data = data
        self.position = 0
        self.what = what
        self.flexible = flexible

    def _take(self, n: int) -> bytes:
        end = self.position + n
        if n < 0 or end > len(self.data):
            raise CorruptRecordError(f"{self.what} is cut short or has a bad length")
        chunk = self.data[self.position : end]
        self.position = end
        return chunk

    def int16(self) -> int:
        value: int = _INT16.unpack(self._take(2))[0]
        return value

    def int32(self) -> int:
        value: int = _INT32.unpack(self._take(4))[0]
        return value

    def int64(self) -> int:
        value: int = _INT64.unpack(self._take(8))[0]
        return value

    def uvarint(self) -> int:
        value = shift = 0
        while True:
            byte = self._take(1)[0]
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
            if shift > 28:
                raise CorruptRecordError(f"{self.what} has an unsigned varint over 5 bytes")

    def _length(self, fixed: int) -> int:
        # The length of a string, bytes or array; -1 for null.
        if self.flexible:
            return self.uvarint() - 1
        return self.int16() if fixed == 2 else self.int32()

    def nullable_string(self) -> str | None:
        n = self._length(2)
        if n < 0:
            return None
        try:
            return self._take(n).decode("utf-8")
        except UnicodeDecodeError:
            raise CorruptRecordError(f"{self.what} holds a string that is not UTF-8") from None

    def string(self) -> str:
        value = self.nullable_string()
        if value is None:
            raise CorruptRecordError(f"{self.what} holds a null where a string must be")
        return value

    def nullable_bytes(self) -> bytes | None:
        n = self._length(4)
        return None if n < 0 else self._take(n)

    def array_length(self) -> int:
        n = self._length(4)
        if n > len(self.data) - self.position:  # each element takes at least a byte
            raise CorruptRecordError(f"{self.what} has an array longer than the record")
        return max(n, 0)

    def tagged_fields(self) -> None:
        """Skip a struct's tagged fields (flexible versions only)."""
        if not self.flexible:
            return
        for _ in range(self.uvarint()):
            self.uvarint()  # the tag
            self._take(self.uvarint())


def parse_key(data: bytes) -> CoordinatorKey:
    """The key of a record of the offsets topic.

    Raises:
        CorruptRecordError: the key is cut short, or its strings are not UTF-8.
    """
    reader = _Reader(data, "an offsets topic record key")
    version = reader.int16()
    if version in (0, 1):
        return OffsetCommitKey(reader.string(), reader.string(), reader.int32())
    if version == GROUP_METADATA_KEY_VERSION:
        return GroupMetadataKey(reader.string())
    if version < 0:
        raise CorruptRecordError(f"an offsets topic record key has version {version}")
    return UnknownKey(version)


def _value_reader(data: bytes, what: str) -> tuple[_Reader, int]:
    """A reader past a value's version, flexible from version 4, and the version.

    Raises:
        CorruptRecordError: no version, or a negative one.
    """
    reader = _Reader(data, what)
    version = reader.int16()
    if version < 0:
        raise CorruptRecordError(f"{what} has version {version}")
    reader.flexible = version >= _FLEXIBLE_VALUE_VERSION
    return reader, version


def parse_offset_commit_value(data: bytes) -> OffsetCommitValue:
    """An ``OffsetCommitValue`` of any version (see the module).

    Raises:
        CorruptRecordError: the value is cut short or has a negative version.
    """
    reader, version = _value_reader(data, "an offset commit value")
    offset = reader.int64()
    leader_epoch = reader.int32() if version >= 3 else -1
    metadata = reader.string()
    commit_timestamp = reader.int64()
    expire_timestamp = reader.int64() if version == 1 else -1
    reader.tagged_fields()
    return OffsetCommitValue(offset, metadata, commit_timestamp, leader_epoch, expire_timestamp)


def parse_group_metadata_value(data: bytes) -> GroupMetadataValue:
    """A ``GroupMetadataValue`` of any version (see the module).

    Raises:
        CorruptRecordError: the value is cut short or has a negative version.
    """
    reader, version = _value_reader(data, "a group metadata value")
    protocol_type = reader.string()
    generation = reader.int32()
    protocol = reader.nullable_string()
    leader = reader.nullable_string()
    state_timestamp = reader.int64() if version >= 2 else -1
    members = []
    for _ in range(reader.array_length()):
        member_id = reader.string()
        instance_id = reader.nullable_string() if version >= 3 else None
        client_id = reader.string()
        client_host = reader.string()
        rebalance_timeout = reader.int32() if version >= 1 else -1
        session_timeout = reader.int32()
        subscription = reader.nullable_bytes() or b""
        assignment = reader.nullable_bytes() or b""
        reader.tagged_fields()
        members.append(
            MemberMetadata(
                member_id,
                client_id,
                client_host,
                session_timeout,
                subscription,
                assignment,
                rebalance_timeout,
                instance_id,
            )
        )
    reader.tagged_fields()
    return GroupMetadataValue(
        protocol_type, generation, protocol, leader, tuple(members), state_timestamp
    )


def assigned_partitions(assignment: bytes) -> list[tuple[str, int]]:
    """The (topic, partition) pairs of a consumer protocol assignment
    (``ConsumerProtocolAssignment`` v0-v3: int16 version, then an array of topic
    string and int32 partitions, then user data); none for empty or other bytes.

    Raises:
        CorruptRecordError: the assignment is cut short.
    """
    if len(assignment) < 2:
        return []
    reader = _Reader(assignment, "a consumer protocol assignment")
    if reader.int16() < 0:
        return []
    found = []
    for _ in range(reader.array_length()):
        topic = reader.string()
        for _ in range(reader.array_length()):
            found.append((topic, reader.int32()))
    return found


def _string(text: str) -> bytes:
    data = text.encode("utf-8")
    if len(data) > 0x7FFF:
        raise ValueError(f"a string of {len(data)} bytes does not fit an int16 length")
    return _INT16.pack(len(data)) + data


def offset_commit_key(group: str, topic: str, partition: int) -> bytes:
    """The key (version 1) of an offset commit of ``group`` for ``topic``-``partition``.

    Raises:
        ValueError: a name over 32,767 bytes of UTF-8.
    """
    return (
        _INT16.pack(OFFSET_COMMIT_KEY_VERSION)
        + _string(group)
        + _string(topic)
        + _INT32.pack(partition)
    )


def group_metadata_key(group: str) -> bytes:
    """The key (version 2) of ``group``'s metadata: what a group deletion tombstones."""
    return _INT16.pack(GROUP_METADATA_KEY_VERSION) + _string(group)


def offset_commit_value(
    offset: int, metadata: str = "", commit_timestamp: int = -1, leader_epoch: int = -1
) -> bytes:
    """The value (version 3) of an offset commit.

    Raises:
        ValueError: metadata over 32,767 bytes of UTF-8.
    """
    return (
        _INT16.pack(OFFSET_COMMIT_VALUE_VERSION)
        + _INT64.pack(offset)
        + _INT32.pack(leader_epoch)
        + _string(metadata)
        + _INT64.pack(commit_timestamp)
    )

"""The offsets topic's record schemas against a reference encoder written from Kafka's
JSON schemas (``OffsetCommitKey.json``, ``OffsetCommitValue.json``, ``GroupMetadataKey.json``,
``GroupMetadataValue.json`` of ``group-coordinator/src/main/resources/common/message``),
kafka-python's consumer protocol, and Java's ``String.hashCode``."""

from __future__ import annotations

import struct

import pytest
from kafka.protocol.consumer.metadata import ConsumerProtocolAssignment

from storage import CorruptRecordError, java_string_hash, partition_for_group
from storage.group.coordinator_record import (
    GroupMetadataKey,
    OffsetCommitKey,
    UnknownKey,
    assigned_partitions,
    group_metadata_key,
    offset_commit_key,
    offset_commit_value,
    parse_group_metadata_value,
    parse_key,
    parse_offset_commit_value,
)

# -- the reference: Kafka's schemas as data, and a generic encoder of them ----------------

# (name, type, versions "a+" / "a" / "a-b", nullable from version or None)
Schema = list[tuple[str, str, str, int | None]]
OFFSET_COMMIT_VALUE: Schema = [
    ("offset", "int64", "0+", None),
    ("leaderEpoch", "int32", "3+", None),
    ("metadata", "string", "0+", None),
    ("commitTimestamp", "int64", "0+", None),
    ("expireTimestamp", "int64", "1", None),
]
MEMBER_METADATA: Schema = [
    ("memberId", "string", "0+", None),
    ("groupInstanceId", "string", "3+", 3),
    ("clientId", "string", "0+", None),
    ("clientHost", "string", "0+", None),
    ("rebalanceTimeout", "int32", "1+", None),
    ("sessionTimeout", "int32", "0+", None),
    ("subscription", "bytes", "0+", None),
    ("assignment", "bytes", "0+", None),
]
GROUP_METADATA_VALUE: Schema = [
    ("protocolType", "string", "0+", None),
    ("generation", "int32", "0+", None),
    ("protocol", "string", "0+", 0),
    ("leader", "string", "0+", 0),
    ("currentStateTimestamp", "int64", "2+", None),
    ("members", "[]MemberMetadata", "0+", None),
]
FLEXIBLE_FROM = 4


def _in(versions: str, version: int) -> bool:
    if versions.endswith("+"):
        return version >= int(versions[:-1])
    low, _, high = versions.partition("-")
    return int(low) <= version <= int(high or low)


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _encode(
    schema: Schema,
    values: dict[str, object],
    version: int,
    tags: bytes,
) -> bytes:
    flexible = version >= FLEXIBLE_FROM
    out = b""
    for name, kind, versions, _nullable in schema:
        if not _in(versions, version):
            continue
        value = values[name]
        if kind == "int32":
            out += struct.pack(">i", value)
        elif kind == "int64":
            out += struct.pack(">q", value)
        elif kind in ("string", "bytes"):
            data = value.encode() if isinstance(value, str) else value
            assert data is None or isinstance(data, bytes)
            if flexible:
                out += _uvarint(0 if data is None else len(data) + 1)
            elif kind == "string":
                out += struct.pack(">h", -1 if data is None else len(data))
            else:
                out += struct.pack(">i", -1 if data is None else len(data))
            out += data or b""
        else:  # []MemberMetadata
            assert isinstance(value, list)
            out += _uvarint(len(value) + 1) if flexible else struct.pack(">i", len(value))
            for member in value:
                out += _encode(MEMBER_METADATA, member, version, tags)
    if flexible:
        out += tags
    return out


# A tagged field a later Kafka could add: tag 7, 3 bytes. Readers must skip it.
TAGS = _uvarint(1) + _uvarint(7) + _uvarint(3) + b"xyz"


def reference_value(schema: Schema, values: dict[str, object], version: int) -> bytes:
    return struct.pack(">h", version) + _encode(schema, values, version, TAGS)


@pytest.mark.parametrize("version", [0, 1, 2, 3, 4, 5])
def test_offset_commit_value_every_version(version: int) -> None:
    values = {
        "offset": 1234,
        "leaderEpoch": 7,
        "metadata": "méta",
        "commitTimestamp": 1_700_000_000_000,
        "expireTimestamp": 1_700_000_600_000,
    }
    parsed = parse_offset_commit_value(reference_value(OFFSET_COMMIT_VALUE, values, version))
    assert parsed.offset == 1234
    assert parsed.metadata == "méta"
    assert parsed.commit_timestamp == 1_700_000_000_000
    assert parsed.leader_epoch == (7 if version >= 3 else -1)
    assert parsed.expire_timestamp == (1_700_000_600_000 if version == 1 else -1)


def test_written_commits_are_key_v1_and_value_v3() -> None:
    values = {"offset": 5, "leaderEpoch": -1, "metadata": "", "commitTimestamp": 99}
    assert offset_commit_value(5, "", 99) == reference_value(OFFSET_COMMIT_VALUE, values, 3)
    key = offset_commit_key("g", "orders", 3)
    assert key == struct.pack(">h", 1) + b"\x00\x01g" + b"\x00\x06orders" + struct.pack(">i", 3)
    assert parse_key(key) == OffsetCommitKey("g", "orders", 3)
    assert parse_key(struct.pack(">h", 0) + key[2:]) == OffsetCommitKey("g", "orders", 3)
    assert parse_key(group_metadata_key("g")) == GroupMetadataKey("g")


@pytest.mark.parametrize("version", [3, 4, 7, 11])
def test_newer_record_types_are_unknown_keys(version: int) -> None:
    assert parse_key(struct.pack(">h", version) + b"\x00\x01g") == UnknownKey(version)


@pytest.mark.parametrize("version", [0, 1, 2, 3, 4])
def test_group_metadata_value_every_version(version: int) -> None:
    assignment = ConsumerProtocolAssignment(
        version=0, assigned_partitions=[("t", [0, 2]), ("u", [1])], user_data=b""
    ).encode()
    member = {
        "memberId": "consumer-1-abc",
        "groupInstanceId": "instance-1",
        "clientId": "consumer-1",
        "clientHost": "/127.0.0.1",
        "rebalanceTimeout": 300000,
        "sessionTimeout": 45000,
        "subscription": b"sub",
        "assignment": assignment,
    }
    values = {
        "protocolType": "consumer",
        "generation": 3,
        "protocol": "range",
        "leader": None,
        "currentStateTimestamp": 1_700_000_000_000,
        "members": [member],
    }
    parsed = parse_group_metadata_value(reference_value(GROUP_METADATA_VALUE, values, version))
    assert (parsed.protocol_type, parsed.generation, parsed.protocol, parsed.leader) == (
        "consumer",
        3,
        "range",
        None,
    )
    assert parsed.current_state_timestamp == (1_700_000_000_000 if version >= 2 else -1)
    (m,) = parsed.members
    assert (m.member_id, m.client_id, m.client_host, m.session_timeout) == (
        "consumer-1-abc",
        "consumer-1",
        "/127.0.0.1",
        45000,
    )
    assert m.group_instance_id == ("instance-1" if version >= 3 else None)
    assert m.rebalance_timeout == (300000 if version >= 1 else -1)
    assert assigned_partitions(m.assignment) == [("t", 0), ("t", 2), ("u", 1)]


@pytest.mark.parametrize("cut", [1, 5, 12])
def test_a_value_cut_short_is_corrupt(cut: int) -> None:
    data = offset_commit_value(5, "meta", 99)
    with pytest.raises(CorruptRecordError):
        parse_offset_commit_value(data[:-cut])


def test_java_string_hash_and_kafka_partition() -> None:
    # Values of Java's String.hashCode.
    assert java_string_hash("") == 0
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("polygenelubricants") == -(2**31)  # Integer.MIN_VALUE
    assert java_string_hash("\U0001d11e") == 0xD834 * 31 + 0xDD1E  # two UTF-16 units
    # Utils.abs(Integer.MIN_VALUE) is 0, not negative.
    assert partition_for_group("polygenelubricants", 50) == 0
    # Where a real broker put these groups (tests/storage/group/kafka-logs).
    assert partition_for_group("user_activity_group", 50) == 25
    assert partition_for_group("console-consumer-61334", 50) == 38
    assert partition_for_group("console-consumer-14837", 50) == 14
    assert partition_for_group("my-group", 50) == 12

"""The admin APIs through real admin clients (kafka-python's ``KafkaAdminClient``,
confluent-kafka's ``AdminClient``) against a real mount's Kafka listener, cross-checked
with the mount (``ls``, ``getfattr``, ``cat``) and ``seglogfs topics``/``groups``."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin import ConfigResource as CkConfigResource  # type: ignore[attr-defined]
from confluent_kafka.admin import NewTopic as CkNewTopic  # type: ignore[attr-defined]
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.admin import AlterConfigOp, ConfigResource, ConfigResourceType, NewPartitions, NewTopic
from kafka.errors import (
    InvalidConfigurationError,
    InvalidPartitionsError,
    InvalidTopicError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from seglogfs.kafka.codec import build
from tests.kafka.conftest import KafkaMount, RawClient, needs_fuse, seglogfs

pytestmark = needs_fuse


def _getfattr(path: Path, name: str) -> str:
    done = subprocess.run(
        ["getfattr", "--only-values", "-n", f"user.seglog.{name}", str(path)],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


@pytest.fixture
def admin(kafka_mount: KafkaMount) -> Iterator[KafkaAdminClient]:
    client = KafkaAdminClient(bootstrap_servers=kafka_mount.bootstrap, request_timeout_ms=30000)
    try:
        yield client
    finally:
        client.close()


def _ls(path: Path) -> list[str]:
    return sorted(os.listdir(path))


def test_create_partitions_and_delete_topics(
    kafka_mount: KafkaMount, admin: KafkaAdminClient
) -> None:
    mnt = kafka_mount.mountpoint
    admin.create_topics(
        [
            NewTopic("made", num_partitions=3, replication_factor=1),
            # -1: the directory's num.partitions (1 by default), as a broker does.
            NewTopic("defaults", topic_configs={"retention.ms": "3600000"}),
        ]
    )
    assert {"made", "defaults"} <= set(_ls(mnt))
    assert [p for p in _ls(mnt / "made") if p.isdigit()] == ["0", "1", "2"]
    assert [p for p in _ls(mnt / "defaults") if p.isdigit()] == ["0"]
    assert _getfattr(mnt / "defaults", "retention.ms") == "3600000"
    assert "retention.ms=3600000" in seglogfs(
        "topics", "describe", "-d", str(kafka_mount.log_dir), "defaults"
    )

    # Kafka's errors, each for its reason; nothing is created by a refused request.
    with pytest.raises(TopicAlreadyExistsError):
        admin.create_topics([NewTopic("made", num_partitions=1)])
    with pytest.raises(InvalidPartitionsError):
        admin.create_topics([NewTopic("zero", num_partitions=0)])
    with pytest.raises(InvalidConfigurationError):
        admin.create_topics([NewTopic("badcfg", 1, topic_configs={"retention.ms": "soon"})])
    with pytest.raises(InvalidConfigurationError):
        admin.create_topics([NewTopic("nokey", 1, topic_configs={"no.such.key": "1"})])
    with pytest.raises(InvalidTopicError):
        admin.create_topics([NewTopic("bad/name", 1)])
    admin.create_topics([NewTopic("checked", 2)], validate_only=True)
    assert not {"zero", "badcfg", "nokey", "checked"} & set(_ls(mnt))

    admin.create_partitions({"made": NewPartitions(5)})
    assert [p for p in _ls(mnt / "made") if p.isdigit()] == ["0", "1", "2", "3", "4"]
    with pytest.raises(InvalidPartitionsError):
        admin.create_partitions({"made": NewPartitions(2)})
    with pytest.raises(UnknownTopicOrPartitionError):
        admin.create_partitions({"missing": NewPartitions(2)})

    admin.delete_topics(["made", "defaults"])
    assert not {"made", "defaults"} & set(_ls(mnt))
    with pytest.raises(UnknownTopicOrPartitionError):
        admin.delete_topics(["made"])


def test_describe_and_alter_configs(kafka_mount: KafkaMount, admin: KafkaAdminClient) -> None:
    mnt = kafka_mount.mountpoint
    (mnt / "cfg").mkdir()
    topic = ConfigResource(ConfigResourceType.TOPIC, "cfg")

    def described() -> dict[str, tuple[str, str]]:
        # kafka-python 3: {resource type: {name: {key: entry}}}, sources by name.
        found = admin.describe_configs([topic], config_filter="all")["topic"]["cfg"]
        return {name: (e["value"], e["config_source"]) for name, e in found.items()}

    def alter(configs: dict[str, Any], *, incremental: bool = True) -> str:
        # kafka-python 3 answers {resource type: {name: "OK" or the error}}.
        resource = ConfigResource(ConfigResourceType.TOPIC, "cfg", configs)
        result = admin.alter_configs([resource], incremental=incremental)
        return str(result["topic"]["cfg"])

    before = described()
    assert before["cleanup.policy"] == ("delete", "DEFAULT_CONFIG")
    assert before["retention.ms"][1] == "DEFAULT_CONFIG"

    assert alter({"retention.ms": (AlterConfigOp.SET, "86400000")}) == "OK"
    assert described()["retention.ms"] == ("86400000", "DYNAMIC_TOPIC_CONFIG")
    assert _getfattr(mnt / "cfg", "retention.ms") == "86400000"

    assert alter({"cleanup.policy": (AlterConfigOp.APPEND, "compact")}) == "OK"
    assert described()["cleanup.policy"] == ("delete,compact", "DYNAMIC_TOPIC_CONFIG")
    assert alter({"cleanup.policy": (AlterConfigOp.SUBTRACT, "compact")}) == "OK"
    assert described()["cleanup.policy"] == ("delete", "DYNAMIC_TOPIC_CONFIG")

    refused = alter({"retention.ms": (AlterConfigOp.SET, "never")})
    assert refused.startswith("[Error 40] InvalidConfigurationError"), refused
    assert _getfattr(mnt / "cfg", "retention.ms") == "86400000"  # unchanged
    refused = alter({"retention.ms": (AlterConfigOp.APPEND, "1")})  # not a list
    assert "InvalidConfigurationError" in refused, refused

    assert alter({"retention.ms": (AlterConfigOp.DELETE, None)}) == "OK"
    assert described()["retention.ms"] == before["retention.ms"]

    # The legacy AlterConfigs (kafka-python sends the other overrides along).
    assert alter({"segment.ms": "3600000"}, incremental=False) == "OK"
    after = described()
    assert after["segment.ms"] == ("3600000", "DYNAMIC_TOPIC_CONFIG")
    assert after["retention.ms"] == before["retention.ms"]
    assert _getfattr(mnt / "cfg", "segment.ms") == "3600000"


def test_delete_records(kafka_mount: KafkaMount, admin: KafkaAdminClient) -> None:
    topic = kafka_mount.mountpoint / "recs"
    topic.mkdir()
    with open(topic / "0", "a") as f:
        f.write("a\nb\nc\nd\n")
    admin.delete_records({TopicPartition("recs", 0): 2})
    assert (topic / "0").read_bytes() == b"c\nd\n"
    described = seglogfs("topics", "describe", "-d", str(kafka_mount.log_dir), "recs")
    assert "Partition: 0\tStartOffset: 2\tEndOffset: 4\t" in described, described


def test_list_describe_and_delete_groups(kafka_mount: KafkaMount, admin: KafkaAdminClient) -> None:
    topic = kafka_mount.mountpoint / "gt"
    topic.mkdir()
    with open(topic / "0", "a") as f:
        f.write("x\ny\n")
    consumer = KafkaConsumer(
        "gt",
        bootstrap_servers=kafka_mount.bootstrap,
        group_id="admins",
        client_id="grp-client",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    try:
        seen: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(seen) < 2 and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                seen.extend(r.value for r in records)
        consumer.commit()
        assert seen == [b"x", b"y"]

        # kafka-python 3 answers dicts of the response's fields.
        assert {
            "group_id": "admins",
            "protocol_type": "consumer",
            "group_state": "Stable",
            "group_type": "classic",
        } in admin.list_groups()
        group = admin.describe_groups(["admins"])["admins"]
        assert (group["group_state"], group["protocol_data"]) == ("Stable", "range")
        (member,) = group["members"]
        assert (member["client_id"], member["client_host"]) == ("grp-client", "/127.0.0.1")
        assert member["member_metadata"]["topics"] == ["gt"]
        assert member["member_assignment"]["assigned_partitions"] == [
            {"topic": "gt", "partitions": [0]}
        ]
        # The same member in seglogfs groups describe (the store's member id is its own).
        shown = seglogfs("groups", "describe", "--group", "admins", "-d", str(kafka_mount.log_dir))
        (row,) = [line.split() for line in shown.splitlines() if line.startswith("admins")]
        assert (row[1], row[2], row[3], row[-2:]) == ("gt", "0", "2", ["/127.0.0.1", "grp-client"])

        # kafka-python 3 answers {group: "OK" or the error's class name}.
        assert admin.delete_groups(["admins"]) == {"admins": "NonEmptyGroupError"}
    finally:
        consumer.close()

    assert "admins" in seglogfs("groups", "list", "-d", str(kafka_mount.log_dir)).split()
    # Left: Empty, its offsets kept.
    assert admin.describe_groups(["admins"])["admins"]["group_state"] == "Empty"
    assert [g["group_state"] for g in admin.list_groups() if g["group_id"] == "admins"] == ["Empty"]
    assert admin.delete_groups(["admins"]) == {"admins": "OK"}
    assert "admins" not in seglogfs("groups", "list", "-d", str(kafka_mount.log_dir)).split()
    assert admin.delete_groups(["admins"]) == {"admins": "GroupIdNotFoundError"}
    assert admin.list_groups() == []


def test_confluent_admin_client(kafka_mount: KafkaMount) -> None:
    mnt = kafka_mount.mountpoint
    admin = AdminClient({"bootstrap.servers": kafka_mount.bootstrap})
    futures = admin.create_topics(
        [
            CkNewTopic(
                "ck", num_partitions=2, replication_factor=1, config={"retention.ms": "7200000"}
            )
        ],
        operation_timeout=10,
    )
    futures["ck"].result(timeout=30)
    assert [p for p in _ls(mnt / "ck") if p.isdigit()] == ["0", "1"]
    assert _getfattr(mnt / "ck", "retention.ms") == "7200000"

    (future,) = admin.describe_configs([CkConfigResource("topic", "ck")]).values()
    configs = future.result(timeout=30)
    assert configs["retention.ms"].value == "7200000"
    assert configs["retention.ms"].source == 1  # DYNAMIC_TOPIC_CONFIG

    again = admin.create_topics([CkNewTopic("ck", num_partitions=1, replication_factor=1)])
    with pytest.raises(KafkaException) as refused:
        again["ck"].result(timeout=30)
    assert refused.value.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS

    admin.delete_topics(["ck"], operation_timeout=10)["ck"].result(timeout=30)
    assert "ck" not in _ls(mnt)


def test_confluent_admin_groups(kafka_mount: KafkaMount) -> None:
    (kafka_mount.mountpoint / "cg").mkdir()
    with open(kafka_mount.mountpoint / "cg" / "0", "a") as f:
        f.write("one\n")
    admin = AdminClient({"bootstrap.servers": kafka_mount.bootstrap})
    consumer = Consumer(
        {
            "bootstrap.servers": kafka_mount.bootstrap,
            "group.id": "ckgroup",
            "client.id": "ck-client",
            "auto.offset.reset": "earliest",
        }
    )
    try:
        consumer.subscribe(["cg"])
        deadline = time.monotonic() + 30
        message = None
        while message is None and time.monotonic() < deadline:
            message = consumer.poll(0.5)
        assert message is not None
        assert message.value() == b"one"
        consumer.commit(asynchronous=False)

        listed = admin.list_consumer_groups().result(timeout=30)
        states = {g.group_id: g.state.name for g in listed.valid}
        assert states.get("ckgroup") == "STABLE", states
        (future,) = admin.describe_consumer_groups(["ckgroup"]).values()
        group = future.result(timeout=30)
        assert group.state.name == "STABLE"
        (member,) = group.members
        assert member.client_id == "ck-client"
        assert [(tp.topic, tp.partition) for tp in member.assignment.topic_partitions] == [
            ("cg", 0)
        ]
        (busy,) = admin.delete_consumer_groups(["ckgroup"]).values()
        with pytest.raises(KafkaException) as refused:
            busy.result(timeout=30)
        assert refused.value.args[0].code() == KafkaError.NON_EMPTY_GROUP
    finally:
        consumer.close()
    (done,) = admin.delete_consumer_groups(["ckgroup"]).values()
    done.result(timeout=30)
    assert "ckgroup" not in seglogfs("groups", "list", "-d", str(kafka_mount.log_dir)).split()


def test_alter_configs_replaces_the_overrides(kafka_mount: KafkaMount) -> None:
    """The legacy AlterConfigs (as Kafka's) leaves a topic with exactly the overrides it
    names; kafka-python sends the others along, so a raw request shows it."""
    mnt = kafka_mount.mountpoint
    (mnt / "legacy").mkdir()
    subprocess.run(
        ["setfattr", "-n", "user.seglog.retention.ms", "-v", "1000", str(mnt / "legacy")],
        check=True,
    )
    assert _getfattr(mnt / "legacy", "retention.ms") == "1000"
    client = RawClient(kafka_mount.port)
    try:
        body = build(
            load_request_schema(33, 1),
            resources=[
                {
                    "resource_type": 2,
                    "resource_name": "legacy",
                    "configs": [{"name": "segment.ms", "value": "3600000"}],
                }
            ],
            validate_only=False,
        )
        (result,) = client.call(33, 1, body).responses
        assert result.error_code == ErrorCode.none
    finally:
        client.close()
    assert _getfattr(mnt / "legacy", "segment.ms") == "3600000"
    assert _getfattr(mnt / "legacy", "retention.ms") == "604800000"  # Kafka's default again

"""librdkafka against a real mount's Kafka listener: Debian's ``kcat`` (``-L``,
``-P``, ``-C -o beginning -e``) and confluent-kafka (producer with ``linger.ms``,
group consumer, admin ``list_topics``), cross-checked with ``cat`` and ``seglogfs
groups describe``."""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest

from tests.kafka.conftest import KafkaMount, needs_fuse, seglogfs

pytestmark = needs_fuse

needs_kcat = pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not installed")


@needs_kcat
def test_kcat_lists_produces_and_consumes(kafka_mount: KafkaMount) -> None:
    topic = kafka_mount.mountpoint / "k"
    topic.mkdir()
    with open(topic / "0", "a") as f:
        f.write("one\ntwo\n")
    listing = subprocess.run(
        ["kcat", "-b", kafka_mount.bootstrap, "-L"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert f"broker 0 at {kafka_mount.bootstrap} (controller)" in listing
    assert 'topic "k" with 1 partitions:' in listing
    assert "partition 0, leader 0, replicas: 0, isrs: 0" in listing
    subprocess.run(
        ["kcat", "-b", kafka_mount.bootstrap, "-P", "-t", "k", "-p", "0"],
        input="three\nfour\n",
        text=True,
        timeout=60,
        check=True,
    )
    assert (topic / "0").read_bytes() == b"one\ntwo\nthree\nfour\n"
    consumed = subprocess.run(
        ["kcat", "-b", kafka_mount.bootstrap, "-C", "-t", "k", "-o", "beginning", "-e", "-q"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert consumed == "one\ntwo\nthree\nfour\n"


def test_confluent_kafka_produce_and_group_consume(kafka_mount: KafkaMount) -> None:
    confluent_kafka = pytest.importorskip("confluent_kafka")
    admin_module = pytest.importorskip("confluent_kafka.admin")
    topic = kafka_mount.mountpoint / "c"
    topic.mkdir()
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": kafka_mount.bootstrap, "linger.ms": 20}
    )
    for i in range(500):
        producer.produce("c", value=f"r{i}".encode(), partition=0)
    assert producer.flush(30) == 0
    expected = [f"r{i}".encode() for i in range(500)]
    assert (topic / "0").read_bytes() == b"".join(v + b"\n" for v in expected)
    topics = admin_module.AdminClient({"bootstrap.servers": kafka_mount.bootstrap}).list_topics(
        timeout=30
    )
    assert "c" in topics.topics
    assert list(topics.topics["c"].partitions) == [0]
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": kafka_mount.bootstrap,
            "group.id": "cgroup",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": True,
            "auto.commit.interval.ms": 200,
        }
    )
    values: list[bytes] = []
    try:
        consumer.subscribe(["c"])
        deadline = time.monotonic() + 60
        while len(values) < 500 and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            assert message.error() is None, message.error()
            values.append(message.value())
    finally:
        consumer.close()  # commits the consumed offsets, leaves the group
    assert values == expected
    described = seglogfs("groups", "describe", "--group", "cgroup", "-d", str(kafka_mount.log_dir))
    row = next(line.split() for line in described.splitlines() if line.startswith("cgroup"))
    assert row[:5] == ["cgroup", "c", "0", "500", "500"], described

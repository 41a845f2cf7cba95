"""kafka-python's ``KafkaProducer`` and ``KafkaConsumer`` against a real mount's Kafka
listener, cross-checked with ``cat`` through the mount and ``seglogfs groups
describe``."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import InvalidRequestError, KafkaTimeoutError

from tests.cli.conftest import SCRIPT
from tests.daemon.conftest import MountDir
from tests.kafka.conftest import KafkaMount, needs_fuse, seglogfs, start_kafka_mount

pytestmark = needs_fuse


def _cat(path: Path) -> bytes:
    return subprocess.run(["cat", str(path)], capture_output=True, check=True).stdout


def _consume(consumer: KafkaConsumer, count: int, timeout_s: float = 30.0) -> list[bytes]:
    values: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    while len(values) < count and time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=500).values():
            values.extend(r.value for r in records)
    return values


def test_producer_acks_appear_on_the_mount(kafka_mount: KafkaMount) -> None:
    topic = kafka_mount.mountpoint / "orders"
    topic.mkdir()
    sent: list[tuple[int, int]] = []
    for acks in (1, "all"):
        producer = KafkaProducer(bootstrap_servers=kafka_mount.bootstrap, acks=acks)
        for i in range(3):
            meta = producer.send("orders", f"acks={acks} {i}".encode()).get(timeout=30)
            sent.append((meta.partition, meta.offset))
        producer.close()
    # acks=0: no response; flush only hands the batch to the socket.
    producer = KafkaProducer(bootstrap_servers=kafka_mount.bootstrap, acks=0)
    producer.send("orders", b"acks=0")
    producer.flush()
    producer.close()
    assert sent == [(0, i) for i in range(6)]
    expected = b"".join(f"acks={a} {i}\n".encode() for a in (1, "all") for i in range(3))
    deadline = time.monotonic() + 10
    while _cat(topic / "0") != expected + b"acks=0\n" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _cat(topic / "0") == expected + b"acks=0\n"


def test_group_consumer_reads_echoed_lines_and_commits(kafka_mount: KafkaMount) -> None:
    topic = kafka_mount.mountpoint / "t"
    topic.mkdir()
    lines = [f"line {i}" for i in range(20)]
    with open(topic / "0", "a") as f:
        f.write("".join(f"{line}\n" for line in lines))
    consumer = KafkaConsumer(
        "t",
        bootstrap_servers=kafka_mount.bootstrap,
        group_id="readers",
        enable_auto_commit=True,
        auto_commit_interval_ms=200,
        auto_offset_reset="earliest",
    )
    try:
        assert _consume(consumer, 20) == [line.encode() for line in lines]
        # While it is a member, the group is Stable and the member is shown.
        described = ""
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            described = seglogfs(
                "groups", "describe", "--group", "readers", "-d", str(kafka_mount.log_dir)
            )
            if "kafka-python" in described and " 20 " in described:
                break
            time.sleep(0.2)
        assert "kafka-python" in described, described
        assert "/127.0.0.1" in described, described
    finally:
        consumer.close()
    described = seglogfs("groups", "describe", "--group", "readers", "-d", str(kafka_mount.log_dir))
    row = next(line.split() for line in described.splitlines() if line.startswith("readers"))
    assert row[:5] == ["readers", "t", "0", "20", "20"], described
    # The mount's P@group= view resumes from the commit: only what came after.
    with open(topic / "0", "a") as f:
        f.write("after\n")
    assert _cat(topic / "0@group=readers") == b"after\n"


def test_consumer_assign_seek_and_offsets(kafka_mount: KafkaMount) -> None:
    topic = kafka_mount.mountpoint / "s"
    topic.mkdir()
    with open(topic / "0", "a") as f:
        f.write("".join(f"{i}\n" for i in range(10)))
    consumer = KafkaConsumer(bootstrap_servers=kafka_mount.bootstrap, enable_auto_commit=False)
    try:
        tp = TopicPartition("s", 0)
        consumer.assign([tp])
        assert consumer.beginning_offsets([tp]) == {tp: 0}
        assert consumer.end_offsets([tp]) == {tp: 10}
        consumer.seek(tp, 7)
        assert _consume(consumer, 3) == [b"7", b"8", b"9"]
        found = consumer.offsets_for_times({tp: 0})
        assert found[tp] is not None
        assert found[tp].offset == 0
        assert consumer.offsets_for_times({tp: 2**62})[tp] is None
    finally:
        consumer.close()


def test_two_consumers_of_one_group_share_partitions(kafka_mount: KafkaMount) -> None:
    seglogfs("topics", "create", "p3", "--partitions", "3", "-d", str(kafka_mount.log_dir))
    producer = KafkaProducer(bootstrap_servers=kafka_mount.bootstrap)
    for i in range(30):
        producer.send("p3", f"v{i}".encode(), partition=i % 3)
    producer.flush()
    producer.close()
    config = {
        "bootstrap_servers": kafka_mount.bootstrap,
        "group_id": "pair",
        "auto_offset_reset": "earliest",
        "enable_auto_commit": False,
    }
    first = KafkaConsumer("p3", **config)
    second = KafkaConsumer("p3", **config)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            first.poll(timeout_ms=200)
            second.poll(timeout_ms=200)
            a, b = first.assignment(), second.assignment()
            if a and b and len(a | b) == 3:
                break
        assert first.assignment()
        assert second.assignment()
        assert not first.assignment() & second.assignment()
        assert {tp.partition for tp in first.assignment() | second.assignment()} == {0, 1, 2}
    finally:
        second.close()
    # The one left gets every partition after the rebalance.
    try:
        deadline = time.monotonic() + 60
        while len(first.assignment()) < 3 and time.monotonic() < deadline:
            first.poll(timeout_ms=200)
        assert {tp.partition for tp in first.assignment()} == {0, 1, 2}
    finally:
        first.close()


def test_every_codec_keys_and_headers_render_on_the_mount(kafka_mount: KafkaMount) -> None:
    seglogfs("topics", "create", "keyed", "--key-separator", ":", "-d", str(kafka_mount.log_dir))
    expected = b""
    for codec in (None, "gzip", "snappy", "lz4", "zstd"):
        producer = KafkaProducer(bootstrap_servers=kafka_mount.bootstrap, compression_type=codec)
        for i in range(3):
            producer.send(
                "keyed",
                key=f"k{i}".encode(),
                value=f"{codec} {i}".encode(),
                headers=[("h", b"v")],
                partition=0,
            )
            expected += f"k{i}:{codec} {i}\n".encode()
        producer.flush()
        producer.close()
    assert _cat(kafka_mount.mountpoint / "keyed" / "0") == expected
    # The stored batches keep their codecs: a consumer decodes each.
    consumer = KafkaConsumer(bootstrap_servers=kafka_mount.bootstrap, enable_auto_commit=False)
    try:
        tp = TopicPartition("keyed", 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        records: list[Any] = []
        deadline = time.monotonic() + 30
        while len(records) < 15 and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=500).values():
                records.extend(batch)
        assert [(r.key, r.value) for r in records][:3] == [
            (b"k0", b"None 0"),
            (b"k1", b"None 1"),
            (b"k2", b"None 2"),
        ]
        assert len(records) == 15
        assert all(list(r.headers) == [("h", b"v")] for r in records)
    finally:
        consumer.close()


def test_read_only_mount_serves_fetch_and_refuses_produce(
    log_dir: Path, mount_dir: MountDir
) -> None:
    seglogfs("topics", "create", "ro", "-d", str(log_dir))
    subprocess.run([str(SCRIPT), "produce", "ro", "-d", str(log_dir)], input=b"a\nb\n", check=True)
    mount = start_kafka_mount(mount_dir, log_dir, "-o", "ro")
    consumer = KafkaConsumer(bootstrap_servers=mount.bootstrap, enable_auto_commit=False)
    try:
        tp = TopicPartition("ro", 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        assert _consume(consumer, 2) == [b"a", b"b"]
    finally:
        consumer.close()
    producer = KafkaProducer(bootstrap_servers=mount.bootstrap, enable_idempotence=False, retries=0)
    try:
        with pytest.raises(InvalidRequestError):
            producer.send("ro", b"c", partition=0).get(timeout=30)
    finally:
        producer.close()
    assert _cat(mount.mountpoint / "ro" / "0") == b"a\nb\n"


def test_the_seeds_consumer_program_reads_what_echo_wrote(kafka_mount: KafkaMount) -> None:
    """The seeds' consumer, unchanged but for its bootstrap servers (and a timeout so
    the iteration ends), over a topic produced with ``echo >>``."""
    topic = kafka_mount.mountpoint / "test"
    topic.mkdir()
    for word in ("alpha", "beta", "gamma"):
        subprocess.run(["sh", "-c", f'echo {word} >> "$0"', str(topic / "0")], check=True)
    consumer = KafkaConsumer(
        "test",
        bootstrap_servers=[kafka_mount.bootstrap],
        enable_auto_commit=True,
        auto_offset_reset="earliest",
        consumer_timeout_ms=5000,
    )
    try:
        values = [message.value.decode() for message in consumer]
    finally:
        consumer.close()
    assert values == ["alpha", "beta", "gamma"]


def test_producer_to_a_missing_topic_creates_it(
    tmp_path: Path, log_dir: Path, mount_dir: MountDir
) -> None:
    """auto.create.topics.enable (Kafka's default true): the producer's Metadata
    request creates the topic with num.partitions in the mount's default format; a
    consumer's Metadata request that does not allow creation leaves a topic missing;
    with the setting false the producer never finds the topic."""
    config = tmp_path / "server.properties"
    config.write_text("num.partitions=3\n")
    kafka = start_kafka_mount(mount_dir, log_dir, "--config", str(config))
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap)
    meta = producer.send("fresh", b"hello", partition=2).get(timeout=30)
    producer.close()
    assert (meta.partition, meta.offset) == (2, 0)
    assert sorted(p.name for p in (kafka.mountpoint / "fresh").iterdir() if p.name.isdigit()) == [
        "0",
        "1",
        "2",
    ]
    assert _cat(kafka.mountpoint / "fresh" / "2") == b"hello\n"
    described = seglogfs("topics", "describe", "fresh", "-d", str(kafka.log_dir))
    assert "PartitionCount: 3\t" in described, described
    # kafka-python's consumer asks without allowing creation (allow.auto.create.topics
    # false): its topic stays missing.
    consumer = KafkaConsumer(
        bootstrap_servers=kafka.bootstrap, allow_auto_create_topics=False, consumer_timeout_ms=1000
    )
    try:
        assert not consumer.partitions_for_topic("absent")  # unknown: empty
    finally:
        consumer.close()
    assert not (kafka.mountpoint / "absent").exists()
    assert kafka.mount.stop() == 0

    config.write_text("num.partitions=3\nauto.create.topics.enable=false\n")
    kafka = start_kafka_mount(mount_dir, log_dir, "--config", str(config))
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap, max_block_ms=2000)
    try:
        with pytest.raises(KafkaTimeoutError):
            producer.send("never", b"x").get(timeout=10)
    finally:
        producer.close(timeout=5)
    assert not (kafka.mountpoint / "never").exists()
    assert "never" not in seglogfs("topics", "list", "-d", str(kafka.log_dir)).split()

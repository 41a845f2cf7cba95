"""A copy of a Kafka broker's log directory holding legacy v0 and v1 message sets
(plain and compressed) and v2 batches in every codec, mounted
read-only with the listener: Fetch serves the stored message sets as they are, and
kafka-python and librdkafka (kcat, confluent-kafka) read the values a consumer of the
original broker reads, as ``cat`` through the mount shows them. A client that speaks
only the protocol versions Kafka 4 removed is refused."""

from __future__ import annotations

import shutil
import struct
import subprocess
import time
from pathlib import Path

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import KafkaError
from kafka.record.legacy_records import LegacyRecordBatchBuilder
from kio.index import load_request_schema

from seglogfs.kafka.codec import build
from tests.daemon.conftest import MountDir
from tests.daemon.test_kafka_copy import v2_batch
from tests.kafka.conftest import KafkaMount, RawClient, needs_fuse, start_kafka_mount

pytestmark = needs_fuse

TS = 1_700_000_000_000


def _legacy(magic: int, codec: int, first_offset: int, values: list[bytes | None]) -> bytes:
    """A message set as a broker of that format wrote it (kafka-python's builder):
    inner messages of a compressed v0 set carry absolute offsets, those of a v1 set
    offsets relative to the wrapper, which carries the last one (KIP-31)."""
    builder = LegacyRecordBatchBuilder(magic=magic, compression_type=codec, batch_size=1 << 20)
    for i, value in enumerate(values):
        offset = i if codec and magic == 1 else first_offset + i
        timestamp = TS + first_offset + i if magic else None
        builder.append(offset, timestamp=timestamp, key=b"k", value=value)
    raw = bytearray(builder.build())
    if codec:
        struct.pack_into(">q", raw, 0, first_offset + len(values) - 1)
    return bytes(raw)


def build_broker_dir(log_dir: Path) -> list[bytes | None]:
    """A Kafka broker's directory whose topic ``legacy`` went through every message
    format; the values its consumers read."""
    values: list[bytes | None] = []
    parts: list[bytes] = []
    legacy: list[tuple[int, int, list[bytes | None]]] = [
        (0, 0, [b"v0 plain a", b"v0 plain b"]),
        (0, 1, [b"v0 gzip %d" % i for i in range(3)]),
        (1, 0, [b"v1 plain", None]),
        (1, 2, [b"v1 snappy %d" % i for i in range(3)]),
        (1, 1, [b"v1 gzip %d" % i for i in range(2)]),
    ]
    for magic, codec, batch in legacy:
        parts.append(_legacy(magic, codec, len(values), batch))
        values.extend(batch)
    for codec in range(5):
        batch = [b"v2 codec %d %d" % (codec, i) for i in range(3)]
        parts.append(v2_batch(len(values), codec, [(b"key", v) for v in batch]))
        values.extend(batch)
    partition = log_dir / "legacy-0"
    partition.mkdir(parents=True)
    (partition / "00000000000000000000.log").write_bytes(b"".join(parts))
    (log_dir / "meta.properties").write_text("version=1\nbroker.id=0\ncluster.id=abc\n")
    (log_dir / "recovery-point-offset-checkpoint").write_text("0\n1\nlegacy 0 0\n")
    return values


def test_legacy_message_sets_are_served_as_stored(tmp_path: Path, mount_dir: MountDir) -> None:
    log_dir = tmp_path / "kafka-logs"
    values = build_broker_dir(log_dir)
    stored = (log_dir / "legacy-0" / "00000000000000000000.log").read_bytes()
    kafka = start_kafka_mount(mount_dir, log_dir, "-o", "ro")
    expected_text = b"".join((v or b"") + b"\n" for v in values)
    assert (kafka.mountpoint / "legacy" / "0").read_bytes() == expected_text

    # The raw Fetch answers the segment's bytes: magic 0 and 1 message sets included.
    client = RawClient(kafka.port)
    try:
        fetch = build(
            load_request_schema(1, 12),
            replica_id=-1,
            max_wait=0,
            min_bytes=0,
            max_bytes=1 << 20,
            session_epoch=-1,
            topics=[
                {
                    "topic": "legacy",
                    "partitions": [
                        {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}
                    ],
                }
            ],
        )
        response = client.call(1, 12, fetch)
    finally:
        client.close()
    part = response.responses[0].partitions[0]
    assert part.error_code == 0
    assert bytes(part.records) == stored
    assert stored[16] == 0  # the first message set's magic byte: v0, as stored

    # kafka-python: every value at its offset, the null one included.
    consumer = KafkaConsumer(bootstrap_servers=kafka.bootstrap, consumer_timeout_ms=5000)
    try:
        consumer.assign([TopicPartition("legacy", 0)])
        consumer.seek_to_beginning()
        got: list[bytes | None] = []
        offsets: list[int] = []
        deadline = time.monotonic() + 30
        while len(got) < len(values) and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                got.extend(r.value for r in records)
                offsets.extend(r.offset for r in records)
    finally:
        consumer.close()
    assert got == values
    assert offsets == list(range(len(values)))

    # librdkafka: kcat prints each value (a null one as an empty line).
    if shutil.which("kcat") is not None:
        consumed = subprocess.run(
            ["kcat", "-b", kafka.bootstrap, "-C", "-t", "legacy", "-o", "beginning", "-e", "-q"],
            capture_output=True,
            timeout=60,
            check=True,
        ).stdout
        assert consumed == expected_text


def test_confluent_kafka_reads_legacy_message_sets(tmp_path: Path, mount_dir: MountDir) -> None:
    confluent_kafka = pytest.importorskip("confluent_kafka")
    log_dir = tmp_path / "kafka-logs"
    values = build_broker_dir(log_dir)
    kafka = start_kafka_mount(mount_dir, log_dir, "-o", "ro")
    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": kafka.bootstrap, "group.id": "legacy-readers"}
    )
    got: list[bytes | None] = []
    try:
        consumer.assign([confluent_kafka.TopicPartition("legacy", 0, 0)])
        deadline = time.monotonic() + 60
        while len(got) < len(values) and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            assert message.error() is None, message.error()
            got.append(message.value())
    finally:
        consumer.close()
    assert got == values


def test_a_client_of_the_removed_versions_is_refused(kafka_mount: KafkaMount) -> None:
    """kafka-python told ``api_version=(0, 10)`` sends Produce v2, a version Kafka 4
    removed (KIP-896) and kio has no schema for: the answer is the header and
    UNSUPPORTED_VERSION, which that client cannot decode, so the send fails (nothing is
    appended) and the connection is not dropped; a current client then goes on."""
    (kafka_mount.mountpoint / "o").mkdir()
    old = KafkaProducer(
        bootstrap_servers=kafka_mount.bootstrap, api_version=(0, 10), max_block_ms=5000
    )
    try:
        with pytest.raises(KafkaError):
            old.send("o", b"from 0.10").get(timeout=30)
    finally:
        old.close(timeout=5)
    assert (kafka_mount.mountpoint / "o" / "0").read_bytes() == b""
    assert "closing the connection" not in kafka_mount.log()
    current = KafkaProducer(bootstrap_servers=kafka_mount.bootstrap)
    try:
        assert current.send("o", b"current").get(timeout=30).offset == 0
    finally:
        current.close()
    assert (kafka_mount.mountpoint / "o" / "0").read_bytes() == b"current\n"

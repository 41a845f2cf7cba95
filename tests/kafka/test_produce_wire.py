"""Produce at the frame level on a real mount: an idempotent producer's retried
batch is not appended twice, a gap in its sequence is refused, transactional
producers are refused, and the daemon stops cleanly with clients connected."""

from __future__ import annotations

import random
import struct
import time
from pathlib import Path

import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from seglogfs.kafka.codec import build
from tests.daemon.conftest import MountDir
from tests.kafka.conftest import KafkaMount, RawClient, needs_fuse, seglogfs, start_kafka_mount

pytestmark = needs_fuse


def _batch(values: list[bytes], producer_id: int = -1, sequence: int = -1) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=False,
        producer_id=producer_id,
        producer_epoch=0 if producer_id >= 0 else -1,
        base_sequence=sequence,
        batch_size=1 << 20,
    )
    for i, value in enumerate(values):
        builder.append(i, timestamp=int(time.time() * 1000), key=None, value=value, headers=[])
    return bytes(builder.build())


def _produce(client: RawClient, topic: str, records: bytes, **fields: object) -> tuple[int, int]:
    request = build(
        load_request_schema(0, 9),
        transactional_id=fields.get("transactional_id"),
        acks=-1,
        timeout=30000,
        topic_data=[{"name": topic, "partition_data": [{"index": 0, "records": records}]}],
    )
    response = client.call(0, 9, request)
    part = response.responses[0].partition_responses[0]
    return int(part.error_code), int(part.base_offset)


def _init_producer(client: RawClient) -> int:
    """A producer id from InitProducerId (no transactional id)."""
    init = client.call(
        22, 4, build(load_request_schema(22, 4), transactional_id=None, transaction_timeout=-1,
                     producer_id=-1, producer_epoch=-1)
    )  # fmt: skip
    assert init.error_code == ErrorCode.none
    producer_id = int(init.producer_id)
    assert producer_id >= 0
    return producer_id


def test_idempotent_retry_is_not_appended_twice(kafka_mount: KafkaMount) -> None:
    topic = kafka_mount.mountpoint / "i"
    topic.mkdir()
    client = RawClient(kafka_mount.port)
    try:
        producer_id = _init_producer(client)
        first = _batch([b"a", b"b"], producer_id, 0)
        assert _produce(client, "i", first) == (0, 0)
        second = _batch([b"c"], producer_id, 2)
        assert _produce(client, "i", second) == (0, 2)
        # The response of the first was lost: the producer sends it again.
        assert _produce(client, "i", first) == (0, 0)
        # A gap (sequence 4 after 2) is refused.
        gap = _batch([b"e"], producer_id, 4)
        assert _produce(client, "i", gap)[0] == ErrorCode.out_of_order_sequence_number.value
        # A batch without a producer id is appended as it comes.
        assert _produce(client, "i", _batch([b"d"])) == (0, 3)
        assert _produce(client, "i", b"\0" * 61)[0] != 0  # not a batch: refused
        transactional = _produce(client, "i", _batch([b"x"]), transactional_id="tx")
        assert transactional[0] == ErrorCode.transactional_id_authorization_failed.value
    finally:
        client.close()
    assert (topic / "0").read_bytes() == b"a\nb\nc\nd\n"


def test_a_topic_made_again_does_not_keep_its_producers(
    kafka_mount: KafkaMount,
) -> None:
    """A topic deleted (``seglogfs topics delete`` through the daemon) and made again
    (mkdir) while an idempotent producer writes: a batch it sends
    again is appended to the new topic (a duplicate of one in the deleted topic only),
    not answered with the deleted copy's offset; a gap after it is refused by the new
    topic's own table."""
    topic = kafka_mount.mountpoint / "r"
    topic.mkdir()
    client = RawClient(kafka_mount.port)
    try:
        producer_id = _init_producer(client)
        first = _batch([b"a", b"b"], producer_id, 0)
        second = _batch([b"c"], producer_id, 2)
        assert _produce(client, "r", first) == (0, 0)
        assert _produce(client, "r", second) == (0, 2)
        seglogfs("topics", "delete", "-d", str(kafka_mount.log_dir), "r")
        topic.mkdir()
        # Sent again: the new topic never had it.
        assert _produce(client, "r", second) == (0, 0)
        assert _produce(client, "r", second) == (0, 0)  # now a duplicate, in this topic
        assert _produce(client, "r", first)[0] == ErrorCode.out_of_order_sequence_number.value
        # And the other way: the table read from the new log after an append.
        seglogfs("topics", "delete", "-d", str(kafka_mount.log_dir), "r")
        topic.mkdir()
        third = _batch([b"d"], producer_id, 3)
        assert _produce(client, "r", third) == (0, 0)
        assert _produce(client, "r", third) == (0, 0)
    finally:
        client.close()
    assert (topic / "0").read_bytes() == b"d\n"


def test_garbage_frames_never_take_the_daemon_down(kafka_mount: KafkaMount) -> None:
    rng = random.Random(24)
    for _ in range(60):
        client = RawClient(kafka_mount.port)
        try:
            kind = rng.randrange(4)
            if kind == 0:  # a valid header, then random bytes
                key = rng.choice([0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 18, 22])
                body = struct.pack(">hhi", key, rng.randrange(0, 13), 1)
                body += bytes(rng.randrange(256) for _ in range(rng.randrange(40)))
                client.send_frame(body)
            elif kind == 1:  # random bytes with a size prefix
                client.send_frame(bytes(rng.randrange(256) for _ in range(rng.randrange(30))))
            elif kind == 2:  # a frame cut short, then closed
                client.sock.sendall(struct.pack(">i", 100) + b"\0\x03\0\x01")
            else:  # a negative size
                client.sock.sendall(struct.pack(">i", -5))
        finally:
            client.close()
    # Every request a real client makes still works.
    check = RawClient(kafka_mount.port)
    try:
        body = build(
            load_request_schema(18, 3), client_software_name="t", client_software_version="1"
        )
        assert check.call(18, 3, body).error_code == ErrorCode.none
    finally:
        check.close()
    assert kafka_mount.mount.proc is not None
    assert kafka_mount.mount.proc.poll() is None


def test_unmount_with_a_fetch_waiting(log_dir: Path, mount_dir: MountDir) -> None:
    mount = start_kafka_mount(mount_dir, log_dir)
    (mount.mountpoint / "u").mkdir()
    idle = RawClient(mount.port)
    waiting = RawClient(mount.port)
    try:
        # A Fetch at the log end that would wait 60 s for a record.
        fetch = build(
            load_request_schema(1, 12),
            replica_id=-1,
            max_wait=60000,
            min_bytes=1,
            max_bytes=1 << 20,
            session_epoch=-1,
            topics=[
                {
                    "topic": "u",
                    "partitions": [
                        {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}
                    ],
                }
            ],
        )
        waiting.send_frame(waiting.request_bytes(1, 12, fetch))
        time.sleep(0.3)
        started = time.monotonic()
        assert mount.mount.stop() == 0
        assert time.monotonic() - started < 10
        assert idle.receive_frame() == b""  # closed by the daemon
        assert waiting.receive_frame() == b""
    finally:
        idle.close()
        waiting.close()
    assert mount.log().count("closed (the daemon is stopping)") == 2, mount.log()


def _stored_batches(log_dir: Path, topic: str) -> list[tuple[int, int, int, int, bytes]]:
    """(base offset, producer id, epoch, base sequence, bytes) of each batch stored in
    partition 0's segment files."""
    found = []
    for segment in sorted((log_dir / f"{topic}-0").glob("*.log")):
        data = segment.read_bytes()
        position = 0
        while position + 61 <= len(data):
            base_offset, length = struct.unpack_from(">qi", data, position)
            producer_id, epoch, sequence = struct.unpack_from(">qhi", data, position + 43)
            size = 12 + length
            found.append(
                (base_offset, producer_id, epoch, sequence, data[position : position + size])
            )
            position += size
    return found


def test_idempotent_retry_after_a_restart_is_not_appended_twice(
    log_dir: Path, mount_dir: MountDir
) -> None:
    """librdkafka's idempotent producer writes; the daemon restarts (its sequence table
    gone from memory); the producer's last batch sent again is answered with the offset
    it got before, not appended, because the table is read back from the log."""
    confluent_kafka = pytest.importorskip("confluent_kafka")
    mount = start_kafka_mount(mount_dir, log_dir)
    (mount.mountpoint / "r").mkdir()
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": mount.bootstrap, "enable.idempotence": True, "linger.ms": 5}
    )
    for i in range(3):
        for j in range(10):
            producer.produce("r", value=f"v{i}-{j}".encode(), partition=0)
        assert producer.flush(30) == 0  # three batches of ten
    expected = b"".join(f"v{i}-{j}\n".encode() for i in range(3) for j in range(10))
    assert (mount.mountpoint / "r" / "0").read_bytes() == expected
    del producer  # librdkafka's handle is destroyed: no reconnecting to the old port
    assert mount.mount.stop() == 0

    batches = _stored_batches(log_dir, "r")
    assert len(batches) >= 2
    base_offset, producer_id, epoch, sequence, stored = batches[-1]
    assert producer_id >= 0  # librdkafka's idempotent producer
    assert epoch == 0
    assert sequence > 0
    count = struct.unpack_from(">i", stored, 57)[0]

    mount = start_kafka_mount(mount_dir, log_dir)
    client = RawClient(mount.port)
    try:
        # The last batch again, as the producer sends it when its response was lost.
        assert _produce(client, "r", stored) == (0, base_offset)
        # An earlier one too (within the last five).
        earlier = batches[-2]
        assert _produce(client, "r", earlier[4]) == (0, earlier[0])
        # A gap after the last sequence is refused: the table knows where it stands.
        gap = _batch([b"gap"], producer_id, sequence + count + 1)
        assert _produce(client, "r", gap)[0] == ErrorCode.out_of_order_sequence_number.value
        # The next sequence is appended at the log end.
        following = _batch([b"next"], producer_id, sequence + count)
        assert _produce(client, "r", following) == (0, 30)
    finally:
        client.close()
    assert (mount.mountpoint / "r" / "0").read_bytes() == expected + b"next\n"
    assert len(_stored_batches(log_dir, "r")) == len(batches) + 1


def test_produce_creates_a_missing_topic(
    tmp_path: Path, log_dir: Path, mount_dir: MountDir
) -> None:
    """A Produce naming a missing topic creates it with num.partitions (from --config)
    when auto.create.topics.enable is true; with it false the topic stays missing."""
    config = tmp_path / "server.properties"
    config.write_text("num.partitions=2\n")
    mount = start_kafka_mount(mount_dir, log_dir, "--config", str(config))
    client = RawClient(mount.port)
    try:
        assert _produce(client, "made", _batch([b"one", b"two"])) == (0, 0)
    finally:
        client.close()
    assert sorted(p.name for p in (mount.mountpoint / "made").iterdir() if p.name.isdigit()) == [
        "0",
        "1",
    ]
    assert (mount.mountpoint / "made" / "0").read_bytes() == b"one\ntwo\n"
    assert "created topic made with 2 partitions (auto.create.topics.enable, Produce)" in (
        mount.log()
    )
    assert mount.mount.stop() == 0

    config.write_text("num.partitions=2\nauto.create.topics.enable=false\n")
    mount = start_kafka_mount(mount_dir, log_dir, "--config", str(config))
    client = RawClient(mount.port)
    try:
        code, _ = _produce(client, "other", _batch([b"x"]))
        assert code == ErrorCode.unknown_topic_or_partition.value
    finally:
        client.close()
    assert not (mount.mountpoint / "other").exists()

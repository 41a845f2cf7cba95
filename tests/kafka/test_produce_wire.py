"""Produce at the frame level on a real mount: an idempotent producer's retried
batch is not appended twice, a gap in its sequence is refused, transactional
producers are refused, and the daemon stops cleanly with clients connected."""

from __future__ import annotations

import random
import struct
import time
from pathlib import Path

from kafka.record.default_records import DefaultRecordBatchBuilder
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from seglogfs.kafka.codec import build
from tests.daemon.conftest import MountDir
from tests.kafka.conftest import KafkaMount, RawClient, needs_fuse, start_kafka_mount

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


def test_idempotent_retry_is_not_appended_twice(kafka_mount: KafkaMount) -> None:
    topic = kafka_mount.mountpoint / "i"
    topic.mkdir()
    client = RawClient(kafka_mount.port)
    try:
        init = client.call(
            22, 4, build(load_request_schema(22, 4), transactional_id=None, transaction_timeout=-1,
                         producer_id=-1, producer_epoch=-1)
        )  # fmt: skip
        assert init.error_code == ErrorCode.none
        producer_id = int(init.producer_id)
        assert producer_id >= 0
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

"""aiokafka (asyncio, its own protocol code) against a real mount's Kafka listener:
produce, a group consumer committing, a second consumer of the group resuming from the
commit, cross-checked with ``cat`` through the mount and ``seglogfs groups describe``."""

from __future__ import annotations

import asyncio
import subprocess

import pytest

from tests.kafka.conftest import KafkaMount, needs_fuse, seglogfs

pytestmark = needs_fuse

aiokafka = pytest.importorskip("aiokafka")


def _cat(path: object) -> bytes:
    return subprocess.run(["cat", str(path)], capture_output=True, check=True).stdout


async def _produce(bootstrap: str, topic: str, values: list[bytes]) -> list[tuple[int, int]]:
    producer = aiokafka.AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        sent = []
        for value in values:
            meta = await producer.send_and_wait(topic, value, partition=0)
            sent.append((meta.partition, meta.offset))
        # A batch of several records (send, then wait for all).
        futures = [await producer.send(topic, b"batched %d" % i, partition=0) for i in range(5)]
        for future in futures:
            meta = await future
            sent.append((meta.partition, meta.offset))
        return sent
    finally:
        await producer.stop()


async def _consume_and_commit(bootstrap: str, topic: str, group: str, count: int) -> list[bytes]:
    consumer = aiokafka.AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    values: list[bytes] = []
    try:
        async with asyncio.timeout(60):
            while len(values) < count:
                batches = await consumer.getmany(timeout_ms=500, max_records=count - len(values))
                for records in batches.values():
                    values.extend(r.value for r in records)
        await consumer.commit()
    finally:
        await consumer.stop()
    return values


async def _resume(bootstrap: str, topic: str, group: str) -> list[bytes]:
    """A new consumer of the group: what it reads after the committed offset."""
    consumer = aiokafka.AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    values: list[bytes] = []
    try:
        async with asyncio.timeout(60):
            while not values:
                batches = await consumer.getmany(timeout_ms=500)
                for records in batches.values():
                    values.extend(r.value for r in records)
    finally:
        await consumer.stop()
    return values


def test_aiokafka_produce_consume_and_commit(kafka_mount: KafkaMount) -> None:
    topic = kafka_mount.mountpoint / "aio"
    topic.mkdir()
    with open(topic / "0", "a") as f:
        f.write("echoed\n")
    values = [b"first", b"second"]
    sent = asyncio.run(_produce(kafka_mount.bootstrap, "aio", values))
    assert sent == [(0, i) for i in range(1, 8)]
    expected = [b"echoed", *values, *(b"batched %d" % i for i in range(5))]
    assert _cat(topic / "0") == b"".join(v + b"\n" for v in expected)

    consumed = asyncio.run(_consume_and_commit(kafka_mount.bootstrap, "aio", "aiogroup", 8))
    assert consumed == expected
    described = seglogfs(
        "groups", "describe", "--group", "aiogroup", "-d", str(kafka_mount.log_dir)
    )
    row = next(line.split() for line in described.splitlines() if line.startswith("aiogroup"))
    assert row[:5] == ["aiogroup", "aio", "0", "8", "8"], described

    # An append through the mount; the group's next consumer starts after the commit.
    with open(topic / "0", "a") as f:
        f.write("after the commit\n")
    assert asyncio.run(_resume(kafka_mount.bootstrap, "aio", "aiogroup")) == [b"after the commit"]

"""The listener at the frame level, with a raw client: what the clients never send
(unsupported APIs and versions, malformed and oversized frames), and Fetch's
``min_bytes``/``max_wait_ms`` and size limits, on a real mount."""

from __future__ import annotations

import os
import struct
import threading
import time
from pathlib import Path
from typing import Any

from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from seglogfs.kafka.codec import build
from storage import LogManager
from tests.daemon.conftest import MountDir
from tests.kafka.conftest import KafkaMount, RawClient, needs_fuse, start_kafka_mount

pytestmark = needs_fuse


def _api_versions(client: RawClient, version: int = 3) -> Any:
    body = build(
        load_request_schema(18, version),
        client_software_name="raw",
        client_software_version="1",
    )
    return client.call(18, version, body)


def test_unsupported_apis_get_unsupported_version(kafka_mount: KafkaMount) -> None:
    client = RawClient(kafka_mount.port)
    try:
        # DescribeAcls (key 29) has a schema but no handler: its own response.
        acls = build(load_request_schema(29, 1))
        response = client.call(29, 1, acls)
        assert response.error_code == ErrorCode.unsupported_version
        # A version nobody knows of ApiVersions: version 0 with the supported list.
        frame = struct.pack(">hhih", 18, 99, 77, 3) + b"raw"
        client.send_frame(frame)
        answer = client.receive_frame()
        (correlation, error) = struct.unpack_from(">ih", answer)
        assert (correlation, error) == (77, ErrorCode.unsupported_version.value)
        # An API key nobody knows: the header and the error code.
        client.send_frame(struct.pack(">hhih", 999, 0, 78, -1))
        assert client.receive_frame() == struct.pack(">ih", 78, 35)
        # The connection is still up.
        versions = _api_versions(client)
        keys = {k.api_key: (k.min_version, k.max_version) for k in versions.api_keys}
        assert keys[0] == (3, 9)
        assert keys[1] == (4, 12)
        assert 29 not in keys
        assert keys[19] == (2, 7)
    finally:
        client.close()


def test_malformed_frame_closes_only_its_connection(kafka_mount: KafkaMount) -> None:
    good = RawClient(kafka_mount.port)
    bad = RawClient(kafka_mount.port)
    try:
        # Metadata v12 whose body stops inside its topics array.
        bad.send_frame(struct.pack(">hhih", 3, 12, 1, 3) + b"raw\x00\x05\x00")
        assert bad.receive_frame() == b""
        assert _api_versions(good).error_code == ErrorCode.none
    finally:
        good.close()
        bad.close()
    # Logged once: one WARNING, then the connection's INFO line when it closed.
    deadline = time.monotonic() + 5
    while "closed (malformed request" not in kafka_mount.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    lines = kafka_mount.log().splitlines()
    warnings = [line for line in lines if "WARNING" in line and "malformed request" in line]
    assert len(warnings) == 1, kafka_mount.log()
    assert "api key 3 version 12" in warnings[0]


def test_oversized_frame_is_refused_before_reading(
    tmp_path: Path, log_dir: Path, mount_dir: MountDir
) -> None:
    config = tmp_path / "server.properties"
    config.write_text("socket.request.max.bytes=1000\n")
    mount = start_kafka_mount(mount_dir, log_dir, "--config", str(config))
    client = RawClient(mount.port)
    try:
        client.sock.sendall(struct.pack(">i", 1001) + b"\0" * 10)
        assert client.receive_frame() == b""
    finally:
        client.close()
    other = RawClient(mount.port)
    try:
        assert _api_versions(other).error_code == ErrorCode.none
    finally:
        other.close()
    assert "a frame of 1001 bytes (socket.request.max.bytes=1000)" in mount.log()


def _fetch(
    client: RawClient,
    topic: str,
    offset: int,
    *,
    wait_ms: int,
    min_bytes: int,
    partition_max: int = 1 << 20,
) -> tuple[bytes, int]:
    request = build(
        load_request_schema(1, 12),
        replica_id=-1,
        max_wait=wait_ms,
        min_bytes=min_bytes,
        max_bytes=50 << 20,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=[
            {
                "topic": topic,
                "partitions": [
                    {
                        "partition": 0,
                        "current_leader_epoch": -1,
                        "fetch_offset": offset,
                        "last_fetched_epoch": -1,
                        "log_start_offset": -1,
                        "partition_max_bytes": partition_max,
                    }
                ],
            }
        ],
        forgotten_topics_data=[],
        rack_id="",
    )
    response = client.call(1, 12, request)
    part = response.responses[0].partitions[0]
    assert part.error_code == ErrorCode.none
    return bytes(part.records or b""), part.high_watermark


def test_fetch_waits_for_an_append_and_honours_max_wait(kafka_mount: KafkaMount) -> None:
    topic = kafka_mount.mountpoint / "w"
    topic.mkdir()
    with open(topic / "0", "a") as f:
        f.write("first\n")
    client = RawClient(kafka_mount.port)
    try:
        # Nothing past offset 1: the answer comes after max_wait, empty.
        started = time.monotonic()
        records, high = _fetch(client, "w", 1, wait_ms=600, min_bytes=1)
        elapsed = time.monotonic() - started
        assert (records, high) == (b"", 1)
        assert 0.5 <= elapsed < 5, elapsed

        # An append through the mount during a long wait ends it early.
        def append() -> None:
            time.sleep(0.5)
            with open(topic / "0", "a") as f:
                f.write("second\n")

        writer = threading.Thread(target=append)
        writer.start()
        started = time.monotonic()
        records, high = _fetch(client, "w", 1, wait_ms=20000, min_bytes=1)
        elapsed = time.monotonic() - started
        writer.join()
        assert high == 2
        assert b"second" in records
        assert elapsed < 5, elapsed
    finally:
        client.close()


def test_fetch_returns_whole_stored_batches_within_max_bytes(kafka_mount: KafkaMount) -> None:
    topic = kafka_mount.mountpoint / "b"
    topic.mkdir()
    for i in range(3):  # three writes: three batches
        with open(topic / "0", "a") as f:
            f.write(f"batch {i} " + "x" * 200 + "\n")
    segment = kafka_mount.log_dir / "b-0" / "00000000000000000000.log"
    stored = segment.read_bytes()
    client = RawClient(kafka_mount.port)
    try:
        records, _ = _fetch(client, "b", 0, wait_ms=0, min_bytes=0)
        assert records == stored
        # A limit below one batch still returns the first batch whole (KIP-74).
        records, _ = _fetch(client, "b", 0, wait_ms=0, min_bytes=0, partition_max=10)
        first_size = 12 + struct.unpack_from(">i", stored, 8)[0]
        assert records == stored[:first_size]
        # From offset 1: the batches from the one holding it.
        records, _ = _fetch(client, "b", 1, wait_ms=0, min_bytes=0)
        assert records == stored[first_size:]
    finally:
        client.close()


def _high_water_rss(pid: int) -> int:
    """The process's peak resident memory, in bytes (``VmHWM``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def test_a_large_fetch_is_sent_from_the_segment_files(log_dir: Path, mount_dir: MountDir) -> None:
    """40 MB of stored batches over three segments in one response: the bytes are the
    files', and the daemon neither holds them in memory (its peak RSS grows by far less
    than the response: the copies it made before grew it by three times the response)
    nor keeps a descriptor after the send."""
    with LogManager.open(log_dir) as manager:
        manager.create_topic("big", 1, {"segment.bytes": str(16 << 20)})
        log = manager.log("big", 0)
        value = b"x" * 100
        while log.size < 40 << 20:
            log.append([value] * 2000)
        files = [s.path for s in log.segments.values()]
    stored = b"".join(f.read_bytes() for f in files)
    assert len(files) == 3
    mount = start_kafka_mount(mount_dir, log_dir)
    assert mount.mount.proc is not None
    pid = mount.mount.proc.pid
    client = RawClient(mount.port)
    try:
        _fetch(client, "big", 0, wait_ms=0, min_bytes=0, partition_max=1000)  # warm up
        descriptors = len(os.listdir(f"/proc/{pid}/fd"))
        peak = _high_water_rss(pid)
        records, high = _fetch(client, "big", 0, wait_ms=0, min_bytes=0, partition_max=50 << 20)
        assert high == log.log_end_offset
        assert records == stored
        growth = _high_water_rss(pid) - peak
        assert growth < len(stored) // 4, f"peak RSS grew by {growth} bytes"
        deadline = time.monotonic() + 10
        while len(os.listdir(f"/proc/{pid}/fd")) > descriptors:
            assert time.monotonic() < deadline, "descriptors left open after the send"
            time.sleep(0.05)
    finally:
        client.close()


def test_connections_are_bounded_and_a_stalled_frame_is_closed(
    tmp_path: Path, log_dir: Path, mount_dir: MountDir
) -> None:
    # max.connections: one more connection is closed at once, and the file system and
    # the connections already open go on; connections.max.idle.ms also bounds a client
    # that stops inside a frame (else it would hold its descriptor for ever).
    config = tmp_path / "server.properties"
    config.write_text("max.connections=2\nconnections.max.idle.ms=1500\n")
    mount = start_kafka_mount(mount_dir, log_dir, "--config", str(config))
    first, stalled = RawClient(mount.port), RawClient(mount.port)
    try:
        assert _api_versions(first).error_code == ErrorCode.none
        stalled.sock.sendall(struct.pack(">i", 100) + b"\0" * 10)  # 10 of 100 bytes
        time.sleep(0.3)
        third = RawClient(mount.port)
        try:
            assert third.receive_frame() == b""  # closed: two are open
        finally:
            third.close()
        assert _api_versions(first).error_code == ErrorCode.none
        (mount.mountpoint / "t").mkdir()
        with open(mount.mountpoint / "t" / "0", "a") as f:
            f.write("still writable\n")
        assert (mount.mountpoint / "t" / "0").read_bytes() == b"still writable\n"
        # The stalled frame is closed after connections.max.idle.ms.
        started = time.monotonic()
        assert stalled.receive_frame() == b""
        assert time.monotonic() - started < 10
    finally:
        first.close()
        stalled.close()
    assert "connection(s) refused: max.connections=2 are open" in mount.log()
    assert "silent inside a frame for connections.max.idle.ms" in mount.log()

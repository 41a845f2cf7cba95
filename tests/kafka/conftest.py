"""Fixtures of the Kafka protocol suites: a real mount started with ``--kafka`` on a
free loopback port (the daemon binds port 0 and logs the port it got), and a small
raw client speaking Kafka's framing with kio's message types, for what the clients
never send (unsupported APIs, malformed and oversized frames, raw Fetch timing)."""

from __future__ import annotations

import io
import re
import socket
import struct
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kio.index import load_response_schema
from kio.serial import entity_reader, entity_writer

from tests.cli.conftest import SCRIPT
from tests.daemon.conftest import HAVE_FUSE, Mount, MountDir, mount_dir, mounts

__all__ = [
    "KafkaMount",
    "RawClient",
    "kafka_mount",
    "mount_dir",
    "mounts",
    "needs_fuse",
    "seglogfs",
]

needs_fuse = pytest.mark.skipif(not HAVE_FUSE, reason="/dev/fuse is missing")

LISTEN_TIMEOUT_S = 30.0
_LISTENING = re.compile(r"kafka: listening on 127\.0\.0\.1:(\d+)")


@dataclass
class KafkaMount:
    """A mount with its Kafka listener."""

    mount: Mount
    port: int

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def mountpoint(self) -> Path:
        return self.mount.mountpoint

    @property
    def log_dir(self) -> Path:
        return self.mount.log_dir

    def log(self) -> str:
        return self.mount.log()


def start_kafka_mount(mount_dir: MountDir, log_dir: Path, *args: str) -> KafkaMount:
    """Mount ``log_dir`` with ``--kafka 127.0.0.1:0`` and wait for the listener."""
    mount = mount_dir(log_dir, "--kafka", "127.0.0.1:0", *args)
    deadline = time.monotonic() + LISTEN_TIMEOUT_S
    while True:
        found = _LISTENING.search(mount.log())
        if found:
            return KafkaMount(mount, int(found.group(1)))
        if time.monotonic() > deadline:
            raise AssertionError(f"no Kafka listener after {LISTEN_TIMEOUT_S} s: {mount.log()}")
        time.sleep(0.02)


@pytest.fixture
def kafka_mount(log_dir: Path, mount_dir: MountDir) -> KafkaMount:
    return start_kafka_mount(mount_dir, log_dir)


def seglogfs(*args: str) -> str:
    """Run the ``seglogfs`` command; its stdout (exit 0 asserted)."""
    done = subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


class RawClient:
    """One connection speaking Kafka's framing: requests built with kio's classes."""

    def __init__(self, port: int, client_id: str = "raw-test") -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.client_id = client_id
        self.correlation = 0

    def close(self) -> None:
        self.sock.close()

    def send_frame(self, payload: bytes) -> None:
        self.sock.sendall(struct.pack(">i", len(payload)) + payload)

    def request_bytes(self, api_key: int, version: int, body: Any) -> bytes:
        """The frame body of ``body`` (a kio request of that key and version)."""
        self.correlation += 1
        out = io.BytesIO()
        header_cls = type(body).__header_schema__
        header = header_cls(
            request_api_key=api_key,
            request_api_version=version,
            correlation_id=self.correlation,
            client_id=self.client_id,
        )
        entity_writer(header_cls)(out, header)
        entity_writer(type(body))(out, body)
        return out.getvalue()

    def receive_frame(self) -> bytes:
        """The next response frame's bytes; b"" when the server closed the connection."""
        head = self._exactly(4)
        if not head:
            return b""
        (size,) = struct.unpack(">i", head)
        return self._exactly(size)

    def _exactly(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                return b""
            data += chunk
        return data

    def call(self, api_key: int, version: int, body: Any) -> Any:
        """Send a request and decode its response with kio."""
        self.send_frame(self.request_bytes(api_key, version, body))
        frame = self.receive_frame()
        assert frame, "the server closed the connection"
        (correlation,) = struct.unpack_from(">i", frame)
        assert correlation == self.correlation
        cls = load_response_schema(api_key, version)
        # Response header v1 (flexible) has a tagged-field byte after the id.
        offset = 5 if cls.__header_schema__.__flexible__ else 4
        response, _ = entity_reader(cls)(frame, offset)
        return response

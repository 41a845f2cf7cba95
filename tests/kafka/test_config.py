"""The listener's settings: ``--kafka``, ``--kafka-advertised`` and ``listeners=`` /
``advertised.listeners=`` in ``--config``, parsed and on a real mount."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from kio.index import load_request_schema

from seglogfs.kafka.codec import build
from seglogfs.kafka.config import KafkaConfig, parse_host_port
from storage import ConfigError
from tests.daemon.conftest import ROOT, MountDir
from tests.kafka.conftest import RawClient, needs_fuse


def test_host_port_forms() -> None:
    assert parse_host_port("127.0.0.1:9092", "k") == ("127.0.0.1", 9092)
    assert parse_host_port(":9092", "k") == ("127.0.0.1", 9092)
    assert parse_host_port("PLAINTEXT://0.0.0.0:1", "k") == ("0.0.0.0", 1)
    assert parse_host_port("[::1]:9092", "k") == ("::1", 9092)
    for bad in ("9092", "host:", "host:port", "SSL://h:1", "h:70000", "a:1,b:2"):
        with pytest.raises(ConfigError):
            parse_host_port(bad, "k")


def test_settings_precedence() -> None:
    assert KafkaConfig.from_settings({}) is None
    config = KafkaConfig.from_settings(
        {
            "listeners": "PLAINTEXT://127.0.0.2:9000",
            "advertised.listeners": "PLAINTEXT://kafka.local:9000",
            "broker.id": "3",
            "auto.create.topics.enable": "false",
        }
    )
    assert config == KafkaConfig(
        "127.0.0.2", 9000, "kafka.local", 9000, 3, 104857600, False, 57671680
    )
    # The command line wins over the file.
    config = KafkaConfig.from_settings({"listeners": "PLAINTEXT://:1"}, ":2", "h:3")
    assert config is not None
    assert (config.host, config.port, config.advertised_host, config.advertised_port) == (
        "127.0.0.1",
        2,
        "h",
        3,
    )
    with pytest.raises(ConfigError):
        KafkaConfig.from_settings({"listeners": ":1", "node.id": "x"})


@needs_fuse
def test_listeners_in_config_and_advertised_address(
    tmp_path: Path, log_dir: Path, mount_dir: MountDir
) -> None:
    config = tmp_path / "server.properties"
    config.write_text(
        "listeners=PLAINTEXT://127.0.0.1:0\n"
        "advertised.listeners=PLAINTEXT://kafka.example:19999\n"
        "node.id=7\n"
    )
    # No --kafka: the file alone starts the listener.
    mount = mount_dir(log_dir, "--config", str(config))
    found: list[str] = []
    deadline = time.monotonic() + 30
    while not found and time.monotonic() < deadline:
        found = [line for line in mount.log().splitlines() if "kafka: listening on" in line]
        time.sleep(0.05)
    assert found, mount.log()
    port = int(found[0].split("127.0.0.1:")[1].split()[0])
    client = RawClient(port)
    try:
        body = build(load_request_schema(3, 12), topics=None, allow_auto_topic_creation=False)
        response = client.call(3, 12, body)
    finally:
        client.close()
    assert [(b.node_id, b.host, b.port) for b in response.brokers] == [(7, "kafka.example", 19999)]
    assert response.controller_id == 7


@needs_fuse
def test_a_bad_listener_is_a_usage_error(log_dir: Path, tmp_path: Path) -> None:
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "seglogfs.daemon", str(log_dir), str(mountpoint),
         "--kafka", "nowhere"],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--kafka" in done.stderr
    assert "expected HOST:PORT" in done.stderr

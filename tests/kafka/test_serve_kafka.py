"""``seglogfs serve-kafka``: the Kafka listener on a log directory without a mount
(no FUSE needed), with the control socket and a clean stop."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka import KafkaConsumer, KafkaProducer

from tests.cli.conftest import SCRIPT
from tests.kafka.conftest import seglogfs

START_TIMEOUT_S = 30.0
_LISTENING = re.compile(r"kafka: listening on 127\.0\.0\.1:(\d+)")


class Server:
    def __init__(self, log_dir: Path, log_path: Path, *args: str) -> None:
        self.log_path = log_path
        with open(log_path, "ab") as out:
            self.proc = subprocess.Popen(
                [str(SCRIPT), "serve-kafka", str(log_dir), *args],
                stdout=out,
                stderr=out,
                stdin=subprocess.DEVNULL,
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def port(self) -> int:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            found = _LISTENING.search(self.log())
            if found:
                return int(found.group(1))
            assert self.proc.poll() is None, self.log()
            assert time.monotonic() < deadline, self.log()
            time.sleep(0.02)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[list[Server]]:
    started: list[Server] = []
    yield started
    for server in started:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()


def test_serves_kafka_clients_and_the_command_line_then_stops_cleanly(
    tmp_path: Path, servers: list[Server]
) -> None:
    log_dir = tmp_path / "logs"
    server = Server(log_dir, tmp_path / "daemon.log", "--kafka", "127.0.0.1:0")
    servers.append(server)
    bootstrap = f"127.0.0.1:{server.port()}"

    producer = KafkaProducer(bootstrap_servers=bootstrap)
    for i in range(3):
        producer.send("orders", key=b"k%d" % i, value=b"record %d" % i)
    producer.flush()
    producer.close()
    # The command line writes through the daemon's control socket while it holds the
    # directory's lock.
    done = subprocess.run(
        [str(SCRIPT), "produce", "-d", str(log_dir), "orders"],
        input="from the command line\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr

    consumer = KafkaConsumer(
        "orders",
        bootstrap_servers=bootstrap,
        group_id="g",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=5000,
    )
    values = [m.value for m in consumer]
    consumer.commit()
    consumer.close()
    assert values == [b"record 0", b"record 1", b"record 2", b"from the command line"]
    assert re.search(
        r"\bg\s+orders\s+0\s+4\s+4\s+0\b",
        seglogfs("groups", "describe", "-d", str(log_dir), "--group", "g"),
    )

    assert server.stop() == 0
    assert "SIGTERM: stopping" in server.log()
    assert (log_dir / ".kafka_cleanshutdown").exists()
    # Stopped: the directory is the engine's to read directly.
    assert seglogfs("consume", "-d", str(log_dir), "-e", "orders").splitlines() == [
        "record 0",
        "record 1",
        "record 2",
        "from the command line",
    ]
    seglogfs("verify", str(log_dir))


def test_one_writer_and_an_address_in_use_are_one_line_each(
    tmp_path: Path, servers: list[Server]
) -> None:
    log_dir = tmp_path / "logs"
    first = Server(log_dir, tmp_path / "first.log", "--kafka", "127.0.0.1:0")
    servers.append(first)
    port = first.port()

    second = Server(log_dir, tmp_path / "second.log", "--kafka", "127.0.0.1:0")
    servers.append(second)
    assert second.proc.wait(30) == 1
    assert second.log().strip().splitlines() == [
        f"seglogfs serve-kafka: error: log directory {log_dir} is already mounted or "
        "written by another process (its writer lock is held)"
    ]

    other_dir = tmp_path / "other"
    taken = Server(other_dir, tmp_path / "taken.log", "--kafka", f"127.0.0.1:{port}")
    servers.append(taken)
    assert taken.proc.wait(30) == 1
    assert f"seglogfs serve-kafka: error: cannot listen on 127.0.0.1:{port}:" in taken.log()
    # The engine it opened was closed: the directory is free for the next one.
    assert (other_dir / ".kafka_cleanshutdown").exists()
    assert first.stop() == 0


def test_a_bad_setting_is_a_usage_error(tmp_path: Path) -> None:
    config = tmp_path / "server.properties"
    config.write_text("log.segment.bytes=nope\n")
    done = subprocess.run(
        [str(SCRIPT), "serve-kafka", str(tmp_path / "logs"), "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("seglogfs serve-kafka: error: --config")
    assert "log.segment.bytes" in done.stderr
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    done = subprocess.run(
        [str(SCRIPT), "serve-kafka", str(not_a_dir)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    assert "not a directory" in done.stderr


def test_the_default_address_is_kafkas_on_loopback(tmp_path: Path) -> None:
    probe = socket.socket()
    try:
        probe.bind(("127.0.0.1", 9092))
    except OSError:
        pytest.skip("port 9092 is in use on this machine")
    probe.close()
    server = Server(tmp_path / "logs", tmp_path / "daemon.log")
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while "kafka: listening on 127.0.0.1:9092" not in server.log():
            assert server.proc.poll() is None, server.log()
            assert time.monotonic() < deadline, server.log()
            time.sleep(0.02)
    finally:
        assert server.stop() == 0

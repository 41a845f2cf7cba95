"""``seglogfs mount --metrics``: ``/metrics`` of a real mount, scraped while ``echo >>``
and ``cat`` run, parsed with ``prometheus_client``'s own parser; every counter and gauge
must move by exactly what was done."""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from seglogfs.daemon import metrics

from .conftest import MountDir, needs_fuse

pytestmark = needs_fuse

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    """A sample's value; 0 when absent (a counter not incremented yet)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def shell(command: str) -> str:
    return subprocess.run(
        ["bash", "-c", command], check=True, capture_output=True, text=True, timeout=30
    ).stdout


def test_counters_and_gauges_move_by_what_was_done(tmp_path: Path, mount_dir: MountDir) -> None:
    port = free_port()
    mount = mount_dir(tmp_path / "logs", "--metrics", f":{port}")
    mnt = mount.mountpoint
    (mnt / "orders").mkdir()
    tp = {"topic": "orders", "partition": "0"}
    by_topic = {"topic": "orders", "path": "mount"}

    before = scrape(port)
    assert value(before, "kafka_log_log_logendoffset", **tp) == 0
    assert value(before, "kafka_log_log_numlogsegments", **tp) == 1
    size_before = value(before, "kafka_log_log_size", **tp)
    writes_before = value(before, "seglogfs_fuse_requests_total", operation="write")

    shell(f"echo one >> {mnt}/orders/0; echo two >> {mnt}/orders/0")
    fd = os.open(mnt / "orders" / "0", os.O_WRONLY | os.O_APPEND)
    try:
        assert os.write(fd, b"x\ny\nz\n") == 6
    finally:
        os.close(fd)
    after_write = scrape(port)
    # Five records in three write() calls, each one append (one batch).
    assert value(after_write, "kafka_log_log_logendoffset", **tp) == 5
    assert value(after_write, "kafka_log_log_logstartoffset", **tp) == 0
    assert value(after_write, "kafka_server_brokertopicmetrics_messagesin_total", **by_topic) == 5
    grown = value(after_write, "kafka_log_log_size", **tp) - size_before
    on_disk = sum(f.stat().st_size for f in (tmp_path / "logs" / "orders-0").glob("*.log"))
    assert grown == on_disk > 0
    # Bytes in are the batches appended: exactly what the log grew by.
    assert value(after_write, "kafka_server_brokertopicmetrics_bytesin_total", **by_topic) == grown
    assert (
        value(after_write, "seglogfs_fuse_requests_total", operation="write") - writes_before == 3
    )
    assert value(after_write, "seglogfs_read_bytes_total", **by_topic) == 0

    text = shell(f"cat {mnt}/orders/0")
    assert text == "one\ntwo\nx\ny\nz\n"
    after_read = scrape(port)
    assert value(after_read, "seglogfs_read_bytes_total", **by_topic) == len(text.encode())
    # Reading appends nothing.
    assert value(after_read, "kafka_server_brokertopicmetrics_messagesin_total", **by_topic) == 5
    assert value(after_read, "kafka_log_log_logendoffset", **tp) == 5


def test_errors_are_counted_by_errno(tmp_path: Path, mount_dir: MountDir) -> None:
    port = free_port()
    mount = mount_dir(tmp_path / "logs", "--metrics", f"127.0.0.1:{port}")
    before = scrape(port)
    assert not (mount.mountpoint / "missing").exists()
    after = scrape(port)
    labels = {"operation": "lookup", "errno": "ENOENT"}
    assert value(after, "seglogfs_fuse_errors_total", **labels) > value(
        before, "seglogfs_fuse_errors_total", **labels
    )


def test_config_key_serves_metrics(tmp_path: Path, mount_dir: MountDir) -> None:
    port = free_port()
    config = tmp_path / "server.properties"
    config.write_text(f"{metrics.METRICS_KEY}=127.0.0.1:{port}\n")
    mount = mount_dir(tmp_path / "logs", "--config", str(config))
    (mount.mountpoint / "t").mkdir()
    samples = scrape(port)
    assert value(samples, "kafka_log_log_numlogsegments", topic="t", partition="0") == 1
    assert value(samples, "seglogfs_fuse_requests_total", operation="mkdir") == 1


def test_off_by_default(tmp_path: Path, mount_dir: MountDir) -> None:
    mount = mount_dir(tmp_path / "logs")
    (mount.mountpoint / "t").mkdir()
    assert "metrics at" not in mount.log()
    listening = shell("ss -Hltnp 2>/dev/null || true")
    assert f"pid={mount.proc.pid}," not in listening  # type: ignore[union-attr]


def test_address_in_use_is_one_line_and_no_mount(tmp_path: Path, mount_dir: MountDir) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        mount = mount_dir(tmp_path / "logs", "--metrics", f"127.0.0.1:{port}", wait=False)
        assert mount.proc is not None
        assert mount.proc.wait(30) == 1
    assert f"cannot serve metrics on 127.0.0.1:{port}" in mount.log()


@pytest.mark.parametrize("value_", ["nope", "host:", "1:99999"])
def test_bad_listener_is_a_usage_error(value_: str) -> None:
    with pytest.raises(ValueError, match="--metrics"):
        metrics.parse_listener(value_, "--metrics")


def test_listener_defaults_to_localhost() -> None:
    assert metrics.parse_listener(":9404", "--metrics") == ("127.0.0.1", 9404)
    assert metrics.parse_listener("9404", "--metrics") == ("127.0.0.1", 9404)
    assert metrics.parse_listener("0.0.0.0:1", "--metrics") == ("0.0.0.0", 1)
    assert metrics.parse_listener("[::1]:2", "--metrics") == ("::1", 2)


def test_roll_and_retention_move_the_gauges_and_counters(
    tmp_path: Path, mount_dir: MountDir
) -> None:
    port = free_port()
    config = tmp_path / "server.properties"
    # Each one-record batch of these lines is the same size, over half a segment: every
    # append after the first rolls; retention (at most 100 bytes) deletes the oldest.
    config.write_text(
        "log.segment.bytes=100\nlog.retention.check.interval.ms=100\n"
        f"log.retention.bytes=100\n{metrics.METRICS_KEY}=127.0.0.1:{port}\n"
    )
    mount = mount_dir(tmp_path / "logs", "--config", str(config))
    mnt = mount.mountpoint
    (mnt / "t").mkdir()
    tp = {"topic": "t", "partition": "0"}
    for line in ("aaaa", "bbbb", "cccc"):
        shell(f"echo {line} >> {mnt}/t/0")
    deadline = time.monotonic() + 20
    while True:
        samples = scrape(port)
        if value(samples, "kafka_log_log_logstartoffset", **tp) > 0 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert value(samples, "kafka_log_log_logendoffset", **tp) == 3
    # Three segments rolled by size, the oldest deleted by retention.bytes.
    assert value(samples, "kafka_log_log_logstartoffset", **tp) == 1
    assert value(samples, "kafka_log_log_numlogsegments", **tp) == 2
    assert value(samples, "seglogfs_retention_segments_deleted_total") == 1
    assert value(samples, "seglogfs_segments_rolled_on_time_total") == 0  # by size, not time
    live = [f for f in (tmp_path / "logs" / "t-0").glob("*.log")]
    assert value(samples, "kafka_log_log_size", **tp) == sum(f.stat().st_size for f in live)
    assert shell(f"cat {mnt}/t/0") == "bbbb\ncccc\n"


def test_bad_value_is_exit_2_naming_it(tmp_path: Path, mount_dir: MountDir) -> None:
    config = tmp_path / "server.properties"
    config.write_text(f"{metrics.METRICS_KEY}=host:port\n")
    mount = mount_dir(tmp_path / "logs", "--config", str(config), wait=False)
    assert mount.proc is not None
    assert mount.proc.wait(30) == 2
    assert f"{metrics.METRICS_KEY}='host:port': expected HOST:PORT" in mount.log()

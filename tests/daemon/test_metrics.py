"""``seglogfs mount --metrics``: ``/metrics`` of a real mount, scraped while ``echo >>``
and ``cat`` run, parsed with ``prometheus_client``'s own parser; every counter and gauge
must move by exactly what was done."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from seglogfs.daemon import metrics
from seglogfs.daemon.metrics_server import MetricsServer, ServerBounds

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
        # The pass moves the log start and deletes; the counter counts once the pass
        # returns: a scrape in between (seen on a loaded machine) shows the start moved
        # and nothing counted.
        done = (
            value(samples, "kafka_log_log_logstartoffset", **tp) > 0
            and value(samples, "seglogfs_retention_segments_deleted_total") > 0
        )
        if done or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert value(samples, "kafka_log_log_logendoffset", **tp) == 3
    # Three segments rolled by size, the oldest deleted by retention.bytes.
    assert value(samples, "kafka_log_log_logstartoffset", **tp) == 1
    assert value(samples, "kafka_log_log_numlogsegments", **tp) == 2
    assert value(samples, "seglogfs_retention_segments_deleted_total") == 1
    # Every retention pass is timed (it checks every 100 ms here).
    assert value(samples, "seglogfs_background_pass_seconds_count", task="retention") >= 1
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


# -- the server's bounds (seglog.metrics.*) ------------------------------------------


def metrics_mount(
    tmp_path: Path, mount_dir: MountDir, *lines: str
) -> tuple[int, subprocess.Popen[bytes], Path]:
    """A mount serving metrics with ``lines`` in its ``--config``: (port, daemon, mnt)."""
    port = free_port()
    config = tmp_path / "server.properties"
    config.write_text("".join(f"{line}\n" for line in (f"{metrics.METRICS_KEY}=:{port}", *lines)))
    mount = mount_dir(tmp_path / "logs", "--config", str(config))
    assert mount.proc is not None
    return port, mount.proc, mount.mountpoint


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def answer(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes (b"" for a bare close)."""
    chunks = []
    try:
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    except ConnectionResetError:
        pass
    return b"".join(chunks)


def connections_of(pid: int, port: int) -> int:
    """The TCP connections on ``port`` that ``pid`` holds open now (not the listener).

    Only those: a count of all the daemon's sockets moves for other reasons (under
    ``pytest -n 2`` it went from 3 to 9 with no metrics client left).
    """
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(FileNotFoundError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    count = 0
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(FileNotFoundError):
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
            for line in lines:
                fields = line.split()
                local_port = int(fields[1].rsplit(":", 1)[1], 16)
                listening = fields[3] == "0A"
                if local_port == port and not listening and fields[9] in inodes:
                    count += 1
    return count


def threads_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def wait_for(what: Callable[[], object], expected: object, seconds: float = 10.0) -> None:
    """Wait until ``what()`` is ``expected``."""
    deadline = time.monotonic() + seconds
    while (now := what()) != expected:
        assert time.monotonic() < deadline, f"{now} after {seconds} s, not {expected}"
        time.sleep(0.02)


def test_connections_over_max_are_refused_and_the_mount_goes_on(
    tmp_path: Path, mount_dir: MountDir
) -> None:
    port, proc, mnt = metrics_mount(
        tmp_path, mount_dir, "seglog.metrics.max.connections=3", f"{metrics.IDLE_KEY}=60000"
    )
    threads = threads_of(proc.pid)
    with contextlib.ExitStack() as held:
        silent = [held.enter_context(connect(port)) for _ in range(3)]
        _over_max(port, proc.pid, mnt, threads, silent)


def _over_max(port: int, pid: int, mnt: Path, threads: int, silent: list[socket.socket]) -> None:
    # The test's body; the caller closes the silent connections whatever happens here
    # (a socket left open would fail a later test with a ResourceWarning).
    try:
        wait_for(lambda: connections_of(pid, port), 3)
        # 100 more: each refused at accept with a 503, none kept.
        for _ in range(100):
            with connect(port) as extra:
                assert answer(extra).startswith(b"HTTP/1.1 503 ")
        assert connections_of(pid, port) == 3
        # One server thread whatever the clients (trio's idle worker threads may exit).
        assert threads_of(pid) <= threads
        # The mount does not notice.
        (mnt / "t").mkdir()
        shell(f"echo one >> {mnt}/t/0")
        assert shell(f"cat {mnt}/t/0") == "one\n"
        with pytest.raises(urllib.error.HTTPError, match="503"):
            scrape(port)
    finally:
        silent.pop().close()
    # A slot is free again: the next scrape is served, and says what was refused.
    wait_for(lambda: connections_of(pid, port), 2)
    samples = scrape(port)
    closed = "seglogfs_metrics_connections_closed_total"
    assert value(samples, closed, reason="max_connections") == 101
    assert value(samples, "seglogfs_metrics_connections") == 3  # two silent, this scrape


def test_a_client_that_trickles_is_closed_at_its_deadline(
    tmp_path: Path, mount_dir: MountDir
) -> None:
    port, proc, mnt = metrics_mount(tmp_path, mount_dir, f"{metrics.IDLE_KEY}=1000")
    with connect(port) as slow, connect(port) as silent:
        started = time.monotonic()
        closed_after = None
        # One byte every 0.2 s, forever: an idle timer reset by each byte would never fire.
        for byte in b"GET /metrics HTTP/1.1\r\nX-Padding: " + b"x" * 100:
            try:
                slow.send(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                closed_after = time.monotonic() - started
                break
            time.sleep(0.2)
        assert closed_after is not None
        assert 1.0 <= closed_after < 3.0
        assert answer(silent) == b""  # closed too, without a word
    wait_for(lambda: connections_of(proc.pid, port), 0)
    samples = scrape(port)
    closed = "seglogfs_metrics_connections_closed_total"
    assert value(samples, closed, reason="idle_timeout") == 2
    (mnt / "t").mkdir()
    assert shell(f"echo x >> {mnt}/t/0; cat {mnt}/t/0") == "x\n"


def test_a_request_over_max_bytes_is_refused_unread(tmp_path: Path, mount_dir: MountDir) -> None:
    port, _, _ = metrics_mount(tmp_path, mount_dir, f"{metrics.REQUEST_MAX_BYTES_KEY}=512")
    with connect(port) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nCookie: " + b"c" * 600 + b"\r\n\r\n")
        assert answer(sock).startswith(b"HTTP/1.1 431 ")
    # Within the bound, a request is served.
    with connect(port) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nCookie: " + b"c" * 400 + b"\r\n\r\n")
        response = answer(sock)
    assert response.startswith(b"HTTP/1.1 200 OK\r\n")
    samples = scrape(port)
    closed = "seglogfs_metrics_connections_closed_total"
    assert value(samples, closed, reason="request_too_large") == 1


def test_http_methods_paths_and_encodings(tmp_path: Path, mount_dir: MountDir) -> None:
    port, _, _ = metrics_mount(tmp_path, mount_dir)

    def exchange(request: bytes) -> bytes:
        with connect(port) as sock:
            sock.sendall(request)
            return answer(sock)

    assert exchange(b"GET /nothing HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 404 ")
    assert exchange(b"POST /metrics HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 405 ")
    assert exchange(b"nonsense\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    head = exchange(b"HEAD /metrics HTTP/1.1\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert head.endswith(b"\r\n\r\n")  # headers only
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/metrics?name[]=process_open_fds",
        headers={"Accept-Encoding": "gzip"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.headers["Content-Encoding"] == "gzip"
        text = gzip.decompress(response.read()).decode()
    names = {f.name for f in text_string_to_metric_families(text)}
    assert names == {"process_open_fds"}


@pytest.mark.parametrize(
    "line",
    [
        f"{metrics.MAX_CONNECTIONS_KEY}=0",
        f"{metrics.IDLE_KEY}=soon",
        f"{metrics.REQUEST_MAX_BYTES_KEY}=100",
    ],
)
def test_bad_bound_is_exit_2_naming_it(tmp_path: Path, mount_dir: MountDir, line: str) -> None:
    config = tmp_path / "server.properties"
    config.write_text(f"{metrics.METRICS_KEY}=127.0.0.1:0\n{line}\n")
    mount = mount_dir(tmp_path / "logs", "--config", str(config), wait=False)
    assert mount.proc is not None
    assert mount.proc.wait(30) == 2
    assert line.split("=")[0] in mount.log()


# -- what is exported beside the counters -------------------------------------------


def test_fuse_latency_histogram_counts_every_request(tmp_path: Path, mount_dir: MountDir) -> None:
    port, _, mnt = metrics_mount(tmp_path, mount_dir)
    (mnt / "t").mkdir()
    before = scrape(port)
    fd = os.open(mnt / "t" / "0", os.O_WRONLY | os.O_APPEND)
    try:
        for _ in range(7):
            os.write(fd, b"line\n")
    finally:
        os.close(fd)
    after = scrape(port)
    name = "seglogfs_fuse_request_duration_seconds"
    op = {"operation": "write"}
    counted = value(after, f"{name}_count", **op) - value(before, f"{name}_count", **op)
    assert counted == 7
    assert value(after, f"{name}_bucket", le="+Inf", **op) == value(after, f"{name}_count", **op)
    assert value(after, "seglogfs_fuse_requests_total", **op) == value(after, f"{name}_count", **op)
    assert value(after, f"{name}_sum", **op) > value(before, f"{name}_sum", **op)
    # Buckets are cumulative.
    buckets = [value(after, f"{name}_bucket", le=str(b), **op) for b in metrics.FUSE_BUCKETS]
    assert buckets == sorted(buckets)


def test_group_lag_is_log_end_minus_committed(tmp_path: Path, mount_dir: MountDir) -> None:
    port, _, mnt = metrics_mount(tmp_path, mount_dir)
    (mnt / "t").mkdir()
    shell(f"printf 'a\\nb\\nc\\nd\\ne\\n' >> {mnt}/t/0")
    assert not any(name == "kafka_consumergroup_lag" for (name, _) in scrape(port))
    seglogfs = Path(sys.executable).parent / "seglogfs"
    subprocess.run(
        [
            *(seglogfs, "groups", "reset-offsets", "-d", tmp_path / "logs", "--group", "g"),
            *("--topic", "t", "--to-offset", "2", "--execute"),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    labels = {"consumergroup": "g", "topic": "t", "partition": "0"}
    samples = scrape(port)
    assert value(samples, "kafka_consumergroup_current_offset", **labels) == 2
    assert value(samples, "kafka_consumergroup_lag", **labels) == 3
    shell(f"printf 'f\\ng\\n' >> {mnt}/t/0")
    assert value(scrape(port), "kafka_consumergroup_lag", **labels) == 5


def test_process_and_segment_files(tmp_path: Path, mount_dir: MountDir) -> None:
    port, proc, mnt = metrics_mount(tmp_path, mount_dir)
    for topic in ("a", "b"):
        (mnt / topic).mkdir()
        shell(f"echo x >> {mnt}/{topic}/0")
    samples = scrape(port)
    assert value(samples, "process_open_fds") == pytest.approx(
        len(os.listdir(f"/proc/{proc.pid}/fd")), abs=3
    )
    assert value(samples, "process_resident_memory_bytes") > 10_000_000
    # Each partition's active segment: its .log open, its indexes mapped.
    assert value(samples, "seglogfs_segment_log_files_open") == 2
    mapped = value(samples, "seglogfs_index_files_mapped")
    with open(f"/proc/{proc.pid}/maps") as f:
        expected = {line.split()[-1] for line in f if line.rstrip().endswith(".index")}
    assert mapped >= len(expected)


def test_render_process_fills_are_counted(tmp_path: Path, mount_dir: MountDir) -> None:
    port, _, mnt = metrics_mount(tmp_path, mount_dir)
    (mnt / "t").mkdir()
    source = tmp_path / "lines.txt"
    source.write_bytes((b"y" * 99 + b"\n") * 300_000)  # 30 MB: a sequential reader streams
    shell(f"cat {source} >> {mnt}/t/0")
    before = scrape(port)
    assert value(before, "seglogfs_render_process_up") == 1
    shell(f"cat {mnt}/t/0 > /dev/null")
    after = scrape(port)
    fills = value(after, "seglogfs_render_fills_total") - value(
        before, "seglogfs_render_fills_total"
    )
    filled = value(after, "seglogfs_render_filled_bytes_total") - value(
        before, "seglogfs_render_filled_bytes_total"
    )
    assert fills >= 1
    assert 0 < filled <= 30_000_000


# -- the Grafana dashboard (systemd/grafana/) ----------------------------------------

DASHBOARD = Path(__file__).resolve().parents[2] / "systemd" / "grafana" / "seglogfs-dashboard.json"

_NOT_METRICS = {"by", "without", "and", "or", "unless", "offset", "bool", "on", "ignoring"}


def promql_metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers left once strings,
    label matchers, ranges, offsets and grouping clauses are removed, that are neither
    functions nor aggregations (followed by a parenthesis) nor keywords."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = re.sub(r"\boffset\s+-?\w+", "", text)
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    names = set()
    for found in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        if text[found.end() :].lstrip().startswith("(") or found.group() in _NOT_METRICS:
            continue
        names.add(found.group())
    return names


def dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            found = re.fullmatch(r"label_values\((\w+), *(\w+)\)", variable["definition"])
            assert found, variable["definition"]
            queries.append(found.group(1))
    return queries


def test_promql_metric_names() -> None:
    assert promql_metric_names(
        'histogram_quantile(0.99, sum by (le, op) (rate(a_bucket{i=~"$i", j="x{y}"}[$__r])))'
    ) == {"a_bucket"}
    assert promql_metric_names("sum by (t) (rate(a_sum[5m])) / sum(rate(b_count[5m]))") == {
        "a_sum",
        "b_count",
    }
    assert promql_metric_names("process_open_fds offset 1h") == {"process_open_fds"}


def test_dashboard_is_an_importable_grafana_dashboard() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert isinstance(dashboard["title"], str)
    assert dashboard["title"]
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,40}", dashboard["uid"])
    assert isinstance(dashboard["schemaVersion"], int)
    assert dashboard["schemaVersion"] >= 36
    assert "__inputs" not in dashboard  # imported as is: the data source is a variable
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    occupied: set[tuple[int, int]] = set()
    for panel in dashboard["panels"]:
        assert panel["type"] in {"row", "timeseries", "stat", "gauge", "table"}
        grid = panel["gridPos"]
        assert set(grid) == {"h", "w", "x", "y"}
        assert grid["x"] >= 0
        assert grid["x"] + grid["w"] <= 24
        assert grid["h"] >= 1
        cells = {
            (grid["y"] + dy, grid["x"] + dx) for dy in range(grid["h"]) for dx in range(grid["w"])
        }
        assert not cells & occupied, f"panel {panel['title']!r} overlaps another"
        occupied |= cells
        if panel["type"] == "row":
            continue
        assert panel["title"]
        assert panel["description"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        refs = [t["refId"] for t in panel["targets"]]
        assert refs
        assert len(refs) == len(set(refs))
        for target in panel["targets"]:
            assert target["expr"].count("(") == target["expr"].count(")")
            # Every selector is limited to the chosen instances.
            selectors = len(promql_metric_names(target["expr"]))
            assert target["expr"].count('{instance=~"$instance"}') >= selectors


def test_every_metric_the_dashboard_queries_is_exported(
    tmp_path: Path, mount_dir: MountDir
) -> None:
    queried = set().union(*map(promql_metric_names, dashboard_queries()))
    assert len(queried) >= 20
    port, _, mnt = metrics_mount(tmp_path, mount_dir)
    # What brings every labelled series into being: appends, reads, an error, a group.
    (mnt / "t").mkdir()
    shell(f"echo a >> {mnt}/t/0; echo b >> {mnt}/t/0; cat {mnt}/t/0")
    assert not (mnt / "missing").exists()
    subprocess.run(
        [
            *(Path(sys.executable).parent / "seglogfs", "groups", "reset-offsets"),
            *("-d", tmp_path / "logs", "--group", "g", "--topic", "t", "--to-offset", "1"),
            "--execute",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    exported = {name for (name, _) in scrape(port)}
    assert queried - exported == set()


# -- the other paths: the Kafka listener and the control socket ----------------------


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not installed")
def test_kafka_listener_requests_and_bytes_are_counted(tmp_path: Path, mount_dir: MountDir) -> None:
    port, kafka = free_port(), free_port()
    mount = mount_dir(tmp_path / "logs", "--metrics", f":{port}", "--kafka", f":{kafka}")
    (mount.mountpoint / "k").mkdir()
    bootstrap = f"127.0.0.1:{kafka}"
    subprocess.run(
        ["kcat", "-b", bootstrap, "-P", "-t", "k", "-p", "0"],
        input="three\nfour\n",
        text=True,
        timeout=60,
        check=True,
    )
    tp = {"topic": "k", "partition": "0"}
    by_kafka = {"topic": "k", "path": "kafka"}
    samples = scrape(port)
    size = value(samples, "kafka_log_log_size", **tp)
    assert value(samples, "kafka_server_brokertopicmetrics_messagesin_total", **by_kafka) == 2
    assert value(samples, "kafka_server_brokertopicmetrics_bytesin_total", **by_kafka) == size > 0
    assert (
        value(samples, "kafka_server_brokertopicmetrics_messagesin_total", path="mount", topic="k")
        == 0
    )
    consumed = subprocess.run(
        ["kcat", "-b", bootstrap, "-C", "-t", "k", "-o", "beginning", "-e", "-q"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert consumed == "three\nfour\n"
    samples = scrape(port)
    assert value(samples, "kafka_server_brokertopicmetrics_bytesout_total", **by_kafka) == size
    requests = "kafka_network_requestmetrics_requests_total"
    timed = "seglogfs_kafka_request_duration_seconds_count"
    for api in ("Produce", "Fetch", "Metadata"):
        assert value(samples, requests, request=api) >= 1, api
        assert value(samples, timed, request=api) == value(samples, requests, request=api)


def test_control_socket_requests_and_records_are_counted(
    tmp_path: Path, mount_dir: MountDir
) -> None:
    port, _, mnt = metrics_mount(tmp_path, mount_dir)
    (mnt / "c").mkdir()
    subprocess.run(
        [Path(sys.executable).parent / "seglogfs", "produce", "-d", tmp_path / "logs", "c"],
        input=b"a\nb\nc\n",
        check=True,
        capture_output=True,
        timeout=60,
    )
    samples = scrape(port)
    by_control = {"topic": "c", "path": "control"}
    assert value(samples, "kafka_server_brokertopicmetrics_messagesin_total", **by_control) == 3
    requests = value(samples, "seglogfs_control_requests_total", op="produce")
    assert requests >= 1
    assert (
        value(samples, "seglogfs_control_request_duration_seconds_count", op="produce") == requests
    )
    assert value(samples, "kafka_log_log_logendoffset", topic="c", partition="0") == 3


# -- the server alone (no mount) ------------------------------------------------------


class _Flaky:
    """A collector that fails while ``broken``."""

    def __init__(self) -> None:
        self.broken = True

    def collect(self) -> Iterator[Metric]:
        if self.broken:
            raise RuntimeError("a collector's bug")
        yield GaugeMetricFamily("flaky", "a gauge", value=1)


def test_a_failing_collector_is_a_500_and_the_next_scrape_works() -> None:
    registry = CollectorRegistry(auto_describe=False)
    flaky = _Flaky()
    registry.register(flaky)
    server = MetricsServer(registry, "127.0.0.1", 0, ServerBounds())
    try:
        port = server.address[1]
        with pytest.raises(urllib.error.HTTPError, match="500"):
            scrape(port)
        flaky.broken = False
        assert value(scrape(port), "flaky") == 1
    finally:
        server.close()
    # Closed: the thread is gone and nothing listens on the port. (Binding it again
    # may fail for a while: the server's side of the scrapes' connections is in
    # TIME_WAIT.)
    assert not any(t.name == "seglogfs-metrics" for t in threading.enumerate())
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


def test_close_calls_on_close_and_ends_open_connections() -> None:
    closed = []
    server = MetricsServer(
        CollectorRegistry(), "127.0.0.1", 0, ServerBounds(), on_close=lambda: closed.append(1)
    )
    with connect(server.address[1]) as silent:
        wait_for(lambda: server.open_connections, 1)
        server.close()
        assert answer(silent) == b""
    assert closed == [1]

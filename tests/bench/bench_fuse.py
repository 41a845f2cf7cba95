"""Benchmark of the file system: produce, consume, tail delay, random reads, roll stalls.

Run from the repository root (root, /dev/fuse)::

    PYTHONPATH=. .venv/bin/python tests/bench/bench_fuse.py           # full, ~25 s
    PYTHONPATH=. .venv/bin/python tests/bench/bench_fuse.py --quick   # smoke, < 1 min

A ``seglogfs mount`` daemon runs in a subprocess on a temporary log directory (under
``$SEGLOG_BENCH_DIR``, default the system temp directory, so plain files and the log
directory share a disk). Each measurement prints its method, the median of several runs
and its ratio to a baseline measured in the same run, with the direction of the ratio:

- produce: ``cat lines.txt >> MNT/t/0`` (100-byte lines) against the same ``cat`` into a
  plain file on the same disk; ratio = FUSE throughput / plain throughput (1.0 = free).
- consume: ``cat MNT/t/0 > /dev/null`` for 100-byte lines (200 MB) and 4-KiB records
  (1 GB) against ``cat`` of a plain file holding the same bytes and against the engine's
  own rendering without FUSE (``log.batches`` + ``render_batch`` in this process, the
  work the daemon does per read); ratios = FUSE MB/s / baseline MB/s (higher is better).
  ``dd bs=1M`` reads the same partition. The four are timed in turns.
- json beside lines: the same records (100-byte lines that all differ) in a ``lines``
  and a ``json`` topic, appended by ``seglogfs produce`` through the daemon; ``cat`` of
  both partitions timed in turns; MB/s and records/s of each and the ratios json/lines
  (higher is better; the target is >= 0.7 in MB/s: a json line is about 2.6 times as
  long as its lines line, so the same MB/s is 2.6 times fewer records).
- tail delay: from ``write()`` of a line returning to ``tail -f -s 0.01`` printing it,
  against the same ``tail`` polling a plain file (ratio of medians; lower is better).
- random read: a 4-KiB ``pread`` at a random byte position of a 10^7-record partition
  (a fresh descriptor each time, so no cached batch helps), against the same on a
  10^4-record partition: the ratio shows the cost does not grow with the log.
- roll stall: the longest gap between two 1-MiB reads of one partition while another
  partition rolls 256-MiB segments (the daemon fsyncs each sealed segment), against the
  longest gap of the same reads alone.
- metrics cost: three daemons on three log directories, one with ``--metrics``
  (scraped every 15 s, Prometheus' usual interval) and two without (the second one
  measures what two identical daemons differ by on this shared machine), each
  measurement taken on the three back to back in a rotating order: ``cat lines.txt >>
  MNT/t/0`` (25 MB), ``cat MNT/t/0 > /dev/null``, single-line ``write()`` calls (one
  FUSE request each: where a per-request cost shows most) and ``os.stat`` calls (lookup
  + getattr); medians and the ratio on/off of the times (1.0 = metrics cost nothing;
  the target is < 1.03), and the in-process cost of one ``@handler`` call with
  metrics off and on.
- readers' memory: the daemon's RSS (``/proc/PID/status``) before, at its peak
  (``VmHWM``, reset first) and 2 s after many descriptors, opened by 8 threads, each
  read 2 x 64 KiB of the 100-byte-line partition and closed; against the bounds the
  budget ``fetch.max.bytes`` sets (lower is better).

Reads come from the page cache (plain files and segments alike): CPU figures for the
daemon, not disk figures. The machine is shared: compare ratios.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from seglogfs.daemon.read_ahead import FETCH_MAX_BYTES
from seglogfs.positions import Rendering, position_index_spec
from storage import BrokerConfig, LogManager

ROOT = Path(__file__).resolve().parents[2]
MB = 1_000_000
MIB = 1 << 20


@dataclass(frozen=True)
class Sizes:
    produce_lines: int
    consume_small_lines: int
    consume_large_records: int
    runs: int
    tail_samples: int
    big_records: int
    small_records: int
    random_reads: int
    roll_bytes: int
    readers: int
    metrics_requests: int = 5_000


# Consume reads 200 MB of 100-byte lines and 1 GB of 4-KiB records: runs of a few
# hundred ms, in which starting bash and cat (2 ms, paid by the FUSE and plain figures
# only), the first fills of a stream and a moment of another job's load weigh little
# (with 205 MB of 4-KiB records, ~55 ms a run, the ratio moved 0.46-0.63).
FULL = Sizes(1_000_000, 2_000_000, 250_000, 5, 30, 10_000_000, 10_000, 1000, 300 * MIB, 1000)
QUICK = Sizes(100_000, 200_000, 5_000, 2, 10, 200_000, 10_000, 200, 0, 200, 1_000)


def say(text: str = "") -> None:
    print(text, flush=True)


def mounted(path: Path) -> bool:
    target = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == target for line in f)


class Daemon:
    def __init__(self, log_dir: Path, mountpoint: Path, *args: str) -> None:
        self.mountpoint = mountpoint
        mountpoint.mkdir(exist_ok=True)
        self.log = open(mountpoint.parent / f"{mountpoint.name}.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "seglogfs.daemon", str(log_dir), str(mountpoint), *args],
            stdout=self.log,
            stderr=self.log,
            cwd=ROOT,
        )
        deadline = time.monotonic() + 30
        while not mounted(mountpoint):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"mount failed: {self.proc.poll()}")
            time.sleep(0.02)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            if mounted(self.mountpoint):
                subprocess.run(["fusermount3", "-uz", str(self.mountpoint)], check=False)
            self.log.close()


def timed_shell(command: str) -> float:
    started = time.perf_counter()
    subprocess.run(["bash", "-c", command], check=True)
    return time.perf_counter() - started


def median(samples: Sequence[float]) -> float:
    return statistics.median(samples)


def lines_file(path: Path, count: int, width: int) -> int:
    line = b"x" * (width - 1) + b"\n"
    block = line * 1000
    with open(path, "wb") as f:
        for _ in range(count // 1000):
            f.write(block)
    return path.stat().st_size


@dataclass
class Outcome:
    name: str
    result: str
    target: str
    met: bool | None


def bench_produce(work: Path, mnt: Path, sizes: Sizes) -> Outcome:
    source = work / "lines.txt"
    size = lines_file(source, sizes.produce_lines, 100)
    plain_s, fuse_s = [], []
    for run in range(sizes.runs):
        plain = work / f"plain-{run}.txt"
        plain_s.append(timed_shell(f"cat {source} >> {plain}"))
        plain.unlink()
        os.mkdir(mnt / f"produce{run}")
        fuse_s.append(timed_shell(f"cat {source} >> {mnt}/produce{run}/0"))
        os.sync()
    fuse_rate = sizes.produce_lines / median(fuse_s)
    plain_rate = sizes.produce_lines / median(plain_s)
    say(
        f"produce: cat lines.txt >> MNT/t/0, {sizes.produce_lines:,} lines of 100 B, "
        f"median of {sizes.runs}: {fuse_rate:,.0f} lines/s "
        f"({size / median(fuse_s) / MB:.0f} MB/s); "
        f"plain file {plain_rate:,.0f} lines/s ({size / median(plain_s) / MB:.0f} MB/s); "
        f"ratio FUSE/plain {fuse_rate / plain_rate:.3f} (1.0 = FUSE costs nothing)"
    )
    return Outcome(
        "produce 100 B lines",
        f"{fuse_rate:,.0f} lines/s ({fuse_rate / plain_rate:.3f}x plain)",
        ">= 1,000,000 lines/s",
        fuse_rate >= 1_000_000,
    )


def engine_render_s(log_dir: Path, topic: str) -> float:
    with LogManager.open(log_dir, read_only=True, extension=position_index_spec) as manager:
        log = manager.log(topic, 0)
        rendering = Rendering.of(manager.topic(topic), 0)
        started = time.perf_counter()
        total = 0
        for batch in log.batches(log.log_start_offset):
            total += len(rendering.render(batch).data)
        elapsed = time.perf_counter() - started
    assert total == log.extension_end
    return elapsed


def bench_consume(
    work: Path, log_dir: Path, mnt: Path, topic: str, count: int, width: int, sizes: Sizes
) -> Outcome:
    source = work / f"consume-{width}.txt"
    size = lines_file(source, count, width)
    os.mkdir(mnt / topic)
    timed_shell(f"cat {source} >> {mnt}/{topic}/0")
    assert (mnt / topic / "0").stat().st_size == size
    fuse_s: list[float] = []
    plain_s: list[float] = []
    dd_s: list[float] = []
    render_s: list[float] = []
    # In turns, so that a change of load on the shared machine meets every figure alike.
    for _ in range(sizes.runs):
        fuse_s.append(timed_shell(f"cat {mnt}/{topic}/0 > /dev/null"))
        plain_s.append(timed_shell(f"cat {source} > /dev/null"))
        dd_s.append(timed_shell(f"dd if={mnt}/{topic}/0 of=/dev/null bs=1M status=none"))
        render_s.append(engine_render_s(log_dir, topic))
    fuse = size / median(fuse_s) / MB
    plain = size / median(plain_s) / MB
    render = size / median(render_s) / MB
    dd = size / median(dd_s) / MB
    label = "100 B lines" if width == 100 else "4 KiB records"
    say(
        f"consume {label}: cat MNT/t/0 > /dev/null, {size / MB:.0f} MB, median of {sizes.runs}: "
        f"{fuse:,.0f} MB/s; plain file {plain:,.0f} MB/s (ratio FUSE/plain {fuse / plain:.3f}); "
        f"engine rendering without FUSE {render:,.0f} MB/s "
        f"(ratio FUSE/engine {fuse / render:.3f}); "
        f"dd bs=1M {dd:,.0f} MB/s; higher ratios are better"
    )
    target_mb = 300 if width == 100 else 1000
    return Outcome(
        f"consume {label}",
        f"{fuse:,.0f} MB/s ({fuse / plain:.3f}x plain, {fuse / render:.2f}x engine)",
        f">= {target_mb} MB/s and >= 0.5x engine",
        fuse >= target_mb and fuse / render >= 0.5,
    )


def bench_json(work: Path, log_dir: Path, mnt: Path, count: int, sizes: Sizes) -> Outcome:
    """The same records in a ``lines`` and a ``json`` topic: ``count`` 100-byte lines
    that all differ (a number, then text; identical values would let the json
    rendering write each batch's values once), appended to both by ``seglogfs produce``
    through the daemon, then ``cat`` of both timed in turns."""
    source = work / "distinct-100.txt"
    with open(source, "wb") as f:
        for start in range(0, count, 1000):
            f.write(b"".join(b"%010d %s\n" % (i, b"y" * 88) for i in range(start, start + 1000)))
    seglogfs = Path(sys.executable).with_name("seglogfs")
    for topic, fmt in (("distinct", b"lines"), ("distinct_json", b"json")):
        os.mkdir(mnt / topic)
        os.setxattr(mnt / topic, "user.seglog.format", fmt)
        timed_shell(f"{seglogfs} produce -d {log_dir} {topic} -p 0 --format lines < {source}")
    lines_size = (mnt / "distinct" / "0").stat().st_size
    json_size = (mnt / "distinct_json" / "0").stat().st_size
    lines_s: list[float] = []
    json_s: list[float] = []
    render_s: list[float] = []
    for _ in range(sizes.runs):
        lines_s.append(timed_shell(f"cat {mnt}/distinct/0 > /dev/null"))
        json_s.append(timed_shell(f"cat {mnt}/distinct_json/0 > /dev/null"))
        render_s.append(engine_render_s(log_dir, "distinct_json"))
    lines_rate = count / median(lines_s)
    json_rate = count / median(json_s)
    lines_mb = lines_size / median(lines_s) / MB
    json_mb = json_size / median(json_s) / MB
    say(
        f"json beside lines: cat MNT/t/0 > /dev/null, the same {count:,} records of 100 B "
        f"({lines_size / MB:.0f} MB as lines, {json_size / MB:.0f} MB as json), "
        f"median of {sizes.runs}: lines {lines_rate:,.0f} records/s ({lines_mb:,.0f} MB/s); "
        f"json {json_rate:,.0f} records/s ({json_mb:,.0f} MB/s); ratio json/lines "
        f"{json_mb / lines_mb:.3f} in MB/s, {json_rate / lines_rate:.3f} in records/s "
        f"(a json line is {json_size / lines_size:.1f}x as long); engine json rendering "
        f"without FUSE {count / median(render_s):,.0f} records/s; higher is better"
    )
    return Outcome(
        "consume json beside lines",
        f"{json_mb:,.0f} MB/s ({json_mb / lines_mb:.2f}x lines MB/s, "
        f"{json_rate / lines_rate:.2f}x records/s)",
        ">= 0.7x lines MB/s",
        json_mb / lines_mb >= 0.7,
    )


def tail_delays(path: Path, samples: int, *options: str) -> list[float]:
    """Seconds from ``write()`` returning to ``tail -f -s 0.01`` printing the line."""
    with open(path, "ab", buffering=0) as f:
        f.write(b"start\n")
    command = ["tail", "-f", "-s", "0.01", *options, str(path)]
    tail = subprocess.Popen(command, stdout=subprocess.PIPE)
    delays = []
    try:
        assert tail.stdout is not None
        assert tail.stdout.readline() == b"start\n"
        with open(path, "ab", buffering=0) as f:
            for i in range(samples):
                time.sleep(random.uniform(0.005, 0.03))  # not in step with tail's poll
                line = b"line %d\n" % i
                f.write(line)
                returned = time.perf_counter()
                assert tail.stdout.readline() == line
                delays.append(time.perf_counter() - returned)
    finally:
        tail.terminate()
        tail.wait()
        if tail.stdout is not None:
            tail.stdout.close()
    return delays


def bench_tail(work: Path, mnt: Path, sizes: Sizes) -> Outcome:
    os.mkdir(mnt / "tail")
    delays = tail_delays(mnt / "tail" / "0", sizes.tail_samples)
    # The baseline polls a plain file the same way (GNU tail's hidden ---disable-inotify;
    # on FUSE it polls anyway).
    plain = tail_delays(work / "tail.txt", sizes.tail_samples, "---disable-inotify")
    worst = max(delays)
    say(
        f"tail delay: write() returns -> tail -f -s 0.01 prints the line, {len(delays)} lines: "
        f"median {median(delays) * 1000:.1f} ms, max {worst * 1000:.1f} ms; plain file "
        f"polled alike: median {median(plain) * 1000:.1f} ms, max {max(plain) * 1000:.1f} ms "
        f"(ratio of medians {median(delays) / median(plain):.2f}; lower is better)"
    )
    return Outcome(
        "tail -f -s 0.01 delay",
        f"max {worst * 1000:.1f} ms (plain {max(plain) * 1000:.1f} ms)",
        "<= 60 ms",
        worst <= 0.060,
    )


METRICS_SCRAPE_INTERVAL_S = 15.0
"""Prometheus' usual ``scrape_interval`` (the README's scrape configuration)."""


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far (its exited threads included),
    from ``/proc/PID/stat``; resolution one clock tick (10 ms)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def metrics_port(daemon: Daemon) -> int:
    """The port a ``--metrics 127.0.0.1:0`` daemon bound (from its log)."""
    deadline = time.monotonic() + 10
    while True:
        daemon.log.flush()
        text = (daemon.mountpoint.parent / f"{daemon.mountpoint.name}.log").read_text()
        found = re.search(r"metrics at http://[^ ]+:(\d+)/metrics", text)
        if found:
            return int(found.group(1))
        if time.monotonic() > deadline:
            raise SystemExit("the metrics daemon logged no address")
        time.sleep(0.05)


def timed_writes(path: Path, count: int) -> float:
    """Seconds for ``count`` ``write()`` calls of one 100-byte line each."""
    line = b"m" * 99 + b"\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        started = time.perf_counter()
        for _ in range(count):
            os.write(fd, line)
        return time.perf_counter() - started
    finally:
        os.close(fd)


def timed_stats(path: Path, count: int) -> float:
    started = time.perf_counter()
    for _ in range(count):
        os.stat(path)
    return time.perf_counter() - started


def handler_cost_us(count: int, runs: int) -> tuple[float, float]:
    """Microseconds per call of a ``@handler`` request that only counts an append as
    ``write_path`` does, with metrics off and on, in this process (no kernel, no
    daemon): what metrics add to a FUSE write, without the machine's noise. Medians of
    ``runs`` loops, in turns."""
    import trio
    from prometheus_client import CollectorRegistry

    from seglogfs.daemon import metrics
    from seglogfs.daemon.handler import handler

    @handler
    async def write(value: int) -> int:
        # What ``write_path`` adds for each append, besides the handler's timing.
        counters = metrics.COUNTERS
        if counters is not None:
            counters.appended("topic", 1, 100)
        return value

    async def loop() -> float:
        started = time.perf_counter()
        for i in range(count):
            await write(i)
        return time.perf_counter() - started

    counters = metrics.MountCounters(CollectorRegistry())
    times: dict[bool, list[float]] = {False: [], True: []}
    try:
        for _ in range(runs):
            for on in (False, True):
                metrics.COUNTERS = counters if on else None
                times[on].append(trio.run(loop))
    finally:
        metrics.COUNTERS = None
    return median(times[False]) / count * 1e6, median(times[True]) / count * 1e6


def bench_metrics(work: Path, sizes: Sizes) -> Outcome:
    """The same work on a daemon with ``--metrics``, one without and a second one
    without (the control: what two identical daemons differ by on this machine), each
    measurement taken on the three back to back in a rotating order."""
    source = work / "metrics-lines.txt"
    lines = sizes.produce_lines // 4
    size = lines_file(source, lines, 100)
    daemons = {
        "off": Daemon(work / "logs-metrics-off", work / "mnt-metrics-off"),
        "control": Daemon(work / "logs-metrics-control", work / "mnt-metrics-control"),
        "on": Daemon(work / "logs-metrics-on", work / "mnt-metrics-on", "--metrics", "127.0.0.1:0"),
    }
    url = f"http://127.0.0.1:{metrics_port(daemons['on'])}/metrics"
    stop = threading.Event()
    scraped: list[int] = []

    def scrape() -> None:
        while True:
            with urllib.request.urlopen(url, timeout=10) as response:
                scraped.append(len(response.read()))
            if stop.wait(METRICS_SCRAPE_INTERVAL_S):
                return

    scraper = threading.Thread(target=scrape)
    scraper.start()
    requests = sizes.metrics_requests
    kinds: dict[str, tuple[str, Callable[[Path, int], float]]] = {
        "produce": (
            f"cat lines.txt >> MNT/t/0 ({size / MB:.0f} MB of 100 B lines)",
            lambda mnt, run: timed_shell(f"cat {source} >> {mnt}/p{run}/0"),
        ),
        "consume": (
            f"cat MNT/t/0 > /dev/null ({size / MB:.0f} MB)",
            lambda mnt, run: timed_shell(f"cat {mnt}/p{run}/0 > /dev/null"),
        ),
        "writes": (
            f"{requests:,} write() calls of one line",
            lambda mnt, run: timed_writes(mnt / f"w{run}" / "0", requests),
        ),
        "stats": (
            f"{requests:,} os.stat calls",
            lambda mnt, run: timed_stats(mnt / f"p{run}" / "0", requests),
        ),
    }
    times: dict[tuple[str, str], list[float]] = {(k, d): [] for k in kinds for d in daemons}
    cpu: dict[tuple[str, str], list[float]] = {(k, d): [] for k in kinds for d in daemons}
    runs = 4 * sizes.runs + 1
    names = list(daemons)
    try:
        for run in range(runs):
            order = names[run % 3 :] + names[: run % 3]
            for name in order:
                os.mkdir(daemons[name].mountpoint / f"p{run}")
                os.mkdir(daemons[name].mountpoint / f"w{run}")
            for kind, (_, measure) in kinds.items():
                for name in order:
                    pid = daemons[name].proc.pid
                    before = cpu_seconds(pid)
                    times[kind, name].append(measure(daemons[name].mountpoint, run))
                    cpu[kind, name].append(cpu_seconds(pid) - before)
            os.sync()
    finally:
        stop.set()
        scraper.join()
        for daemon in daemons.values():
            daemon.stop()
    ratios: dict[str, tuple[float, float]] = {}
    for kind, (what, _) in kinds.items():
        off_s, on_s = median(times[kind, "off"]), median(times[kind, "on"])
        control_s = median(times[kind, "control"])
        say(
            f"metrics cost, {what}, median of {runs}: off {off_s * 1000:,.1f} ms, "
            f"on {on_s * 1000:,.1f} ms; ratio on/off {on_s / off_s:.3f} (1.0 = free, lower "
            f"is better; a second daemon without metrics: {control_s * 1000:,.1f} ms, ratio "
            f"{control_s / off_s:.3f}, the machine's noise)"
        )
        # The daemons' own CPU time (10 ms ticks), less sensitive to the other jobs on
        # the machine than the elapsed time, though not immune (see the second off).
        off_cpu, on_cpu = median(cpu[kind, "off"]), median(cpu[kind, "on"])
        control_cpu = median(cpu[kind, "control"])
        say(
            f"  the daemon's CPU time for it, median of {runs}: off {off_cpu * 1000:,.0f} ms, "
            f"on {on_cpu * 1000:,.0f} ms, ratio on/off {on_cpu / max(off_cpu, 0.01):.3f}; "
            f"second off {control_cpu * 1000:,.0f} ms, ratio "
            f"{control_cpu / max(off_cpu, 0.01):.3f}"
        )
        ratios[kind] = (on_s / off_s, control_s / off_s)
    say(
        f"  ({len(scraped)} scrapes of {median(scraped or [0]) / 1000:.0f} KB during the runs, "
        f"one every {METRICS_SCRAPE_INTERVAL_S:.0f} s)"
    )
    off_us, on_us = handler_cost_us(100_000, 7)
    write_us = median(times["writes", "off"]) / requests * 1e6
    say(
        f"metrics cost per write request, in process (a @handler that counts an append, "
        f"100,000 calls, median of 7): off {off_us:.2f} us, on {on_us:.2f} us: "
        f"+{on_us - off_us:.2f} us, {(on_us - off_us) / write_us:.2%} of a one-line write() "
        f"through FUSE "
        f"({write_us:.0f} us)"
    )
    # End to end, the ratios cannot be told from the machine's noise (the second
    # daemon without metrics differs from the first by as much): judged is the cost
    # per request measured without that noise, against a request through FUSE.
    worst = max(ratios, key=lambda k: ratios[k][0])
    share = (on_us - off_us) / write_us
    return Outcome(
        "metrics cost per write",
        f"+{on_us - off_us:.2f} us = {share:.2%}; end to end worst {worst} "
        f"{ratios[worst][0]:.3f} (noise {ratios[worst][1]:.3f})",
        "< 3% of a write",
        share < 0.03,
    )


def rss(pid: int, field: str = "VmRSS") -> int:
    """``field`` of ``/proc/PID/status``, in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def bench_readers(pid: int, path: Path, sizes: Sizes) -> Outcome:
    chunk = 64 << 10

    def reader(_: int) -> int:
        fd = os.open(path, os.O_RDONLY)
        os.read(fd, chunk)
        os.read(fd, chunk)
        return fd

    time.sleep(1)
    before = rss(pid)
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    with ThreadPoolExecutor(8) as pool:
        fds = list(pool.map(reader, range(sizes.readers)))
    for fd in fds:
        os.close(fd)
    time.sleep(2)
    peak, after = rss(pid, "VmHWM"), rss(pid)
    peak_bound, after_bound = before + FETCH_MAX_BYTES + 32 * MIB, before + 32 * MIB
    say(
        f"readers' memory: {sizes.readers} descriptors read 2 x 64 KiB of MNT/small/0 each "
        f"and close: daemon RSS {before / MIB:.0f} MiB before, {peak / MIB:.0f} MiB at peak, "
        f"{after / MIB:.0f} MiB 2 s after (bounds {peak_bound / MIB:.0f} and "
        f"{after_bound / MIB:.0f} MiB: fetch.max.bytes + 32 MiB, 32 MiB; lower is better)"
    )
    return Outcome(
        "readers' RSS before/peak/after",
        f"{before / MIB:.0f} / {peak / MIB:.0f} / {after / MIB:.0f} MiB",
        f"<= {peak_bound / MIB:.0f} / {after_bound / MIB:.0f} MiB",
        peak <= peak_bound and after <= after_bound,
    )


def build_partition(log_dir: Path, topic: str, records: int) -> int:
    broker = BrokerConfig(log_dirs=(str(log_dir),))
    with LogManager.open(log_dir, broker, extension=position_index_spec) as manager:
        manager.create_topic(topic, 1, {"segment.bytes": str(256 * MIB)})
        log = manager.log(topic, 0)
        values = [b"record value %08d" % i for i in range(1000)]
        rendered = sum(len(v) + 1 for v in values)
        for _ in range(records // 1000):
            log.append(values, units=rendered)
        return log.extension_end


def random_reads(path: Path, size: int, count: int) -> list[float]:
    rng = random.Random(1)
    samples = []
    for _ in range(count):
        position = rng.randrange(size - 4096)
        fd = os.open(path, os.O_RDONLY)
        try:
            started = time.perf_counter()
            data = os.pread(fd, 4096, position)
            samples.append(time.perf_counter() - started)
        finally:
            os.close(fd)
        assert len(data) == 4096
    return samples


def bench_random(work: Path, sizes: Sizes) -> Outcome:
    log_dir = work / "random-logs"
    big = build_partition(log_dir, "big", sizes.big_records)
    small = build_partition(log_dir, "small", sizes.small_records)
    daemon = Daemon(log_dir, work / "mnt-random")
    try:
        mnt = daemon.mountpoint
        random_reads(mnt / "big" / "0", big, 50)  # warm the page cache
        big_s = random_reads(mnt / "big" / "0", big, sizes.random_reads)
        small_s = random_reads(mnt / "small" / "0", small, sizes.random_reads)
    finally:
        daemon.stop()
    ratio = median(big_s) / median(small_s)
    say(
        f"random read: 4 KiB pread at a random position, {sizes.random_reads} reads each: "
        f"{sizes.big_records:,} records: median {median(big_s) * 1000:.3f} ms; "
        f"{sizes.small_records:,} records: median {median(small_s) * 1000:.3f} ms; "
        f"ratio {ratio:.2f} (1.0 = the cost does not grow with the log)"
    )
    return Outcome(
        f"random read {sizes.big_records:.0e} records",
        f"{median(big_s) * 1000:.3f} ms ({ratio:.2f}x a 1e4 log)",
        "< 2 ms",
        median(big_s) < 0.002,
    )


def read_gaps(path: Path, stop: Callable[[], bool]) -> list[float]:
    gaps = []
    while not stop():
        with open(path, "rb", buffering=0) as f:
            last = time.perf_counter()
            while chunk := f.read(MIB):
                now = time.perf_counter()
                gaps.append(now - last)
                last = now
                if stop() or not chunk:
                    break
    return gaps


def bench_roll_stall(work: Path, mnt: Path, sizes: Sizes, read_topic: str) -> Outcome | None:
    if sizes.roll_bytes == 0:
        return None
    os.mkdir(mnt / "rolling")
    os.setxattr(mnt / "rolling", "user.seglog.segment.bytes", str(256 * MIB).encode())
    path = mnt / read_topic / "0"
    alone_until = time.monotonic() + 3
    alone = read_gaps(path, lambda: time.monotonic() > alone_until)
    done = threading.Event()
    rolls_before = (mnt / "rolling" / "0").stat().st_size

    def writer() -> None:
        block = (b"y" * 99 + b"\n") * 10_000
        with open(mnt / "rolling" / "0", "ab", buffering=0) as f:
            for _ in range(sizes.roll_bytes // len(block)):
                f.write(block)
        done.set()

    thread = threading.Thread(target=writer)
    thread.start()
    during = read_gaps(path, done.is_set)
    thread.join()
    segments = int(os.getxattr(mnt / "rolling" / "0", "user.seglog.segments"))
    assert rolls_before == 0
    say(
        f"roll stall: longest gap between 1 MiB reads of {read_topic}/0 while rolling/0 takes "
        f"{sizes.roll_bytes / MIB:.0f} MiB in 256 MiB segments ({segments - 1} roll(s)): "
        f"{max(during) * 1000:.1f} ms over {len(during)} reads; alone {max(alone) * 1000:.1f} ms "
        f"over {len(alone)} reads; median {median(during) * 1000:.2f} ms vs "
        f"{median(alone) * 1000:.2f} ms (ratio of the longest gaps "
        f"{max(during) / max(alone):.1f}; lower is better)"
    )
    return Outcome(
        "read gap during 256 MiB rolls",
        f"max {max(during) * 1000:.0f} ms ({segments - 1} roll(s))",
        "no stall (< 500 ms)",
        max(during) < 0.5 and segments >= 2,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    parser.add_argument(
        "--metrics-only", action="store_true", help="only the metrics on/off comparison"
    )
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    say(
        f"seglogfs FUSE benchmark ({'quick' if args.quick else 'full'} mode), "
        f"Python {sys.version.split()[0]}"
    )
    outcomes: list[Outcome] = []
    base = os.environ.get("SEGLOG_BENCH_DIR") or None
    with tempfile.TemporaryDirectory(prefix="seglog-bench-fuse-", dir=base) as tmp:
        work = Path(tmp)
        outcomes.append(bench_metrics(work, sizes))
        if args.metrics_only:
            return summary(outcomes, args.quick)
        log_dir = work / "logs"
        daemon = Daemon(log_dir, work / "mnt")
        try:
            mnt = daemon.mountpoint
            outcomes.append(bench_produce(work, mnt, sizes))
            outcomes.append(
                bench_consume(work, log_dir, mnt, "small", sizes.consume_small_lines, 100, sizes)
            )
            outcomes.append(bench_json(work, log_dir, mnt, sizes.consume_small_lines, sizes))
            outcomes.append(
                bench_consume(work, log_dir, mnt, "large", sizes.consume_large_records, 4096, sizes)
            )
            outcomes.append(bench_tail(work, mnt, sizes))
            outcomes.append(bench_readers(daemon.proc.pid, mnt / "small" / "0", sizes))
            stall = bench_roll_stall(work, mnt, sizes, "small")
            if stall is not None:
                outcomes.append(stall)
        finally:
            daemon.stop()
        outcomes.append(bench_random(work, sizes))
    return summary(outcomes, args.quick)


def summary(outcomes: list[Outcome], quick: bool) -> int:
    say()
    say("summary" + (" (--quick sizes: not the target conditions)" if quick else ""))
    for o in outcomes:
        status = "info" if o.met is None else ("MET" if o.met else "NOT MET")
        say(f"  {o.name:<32} {o.result:<44} {o.target:<30} {status}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

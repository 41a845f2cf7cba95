"""Benchmark of the storage engine, compiled (mypyc) against pure Python in the same run.

Run from the repository root::

    .venv/bin/python tests/bench/bench_storage.py           # full sizes, a few minutes
    .venv/bin/python tests/bench/bench_storage.py --quick   # smoke, under a minute

Every measurement runs in fresh interpreters started by this script, with the installed
build (the compiled modules when ``storage.compiled`` is true) and with
``SEGLOG_PURE_PYTHON=1`` (the same modules from source); runs alternate between the
two, one run per interpreter, so a burst of load on a shared machine hits both (lookups:
one interpreter per build, after a warm-up). Each prints its median over several runs
(the count is shown); the ratio is pure time / compiled time, so above 1 means the
compiled build is that many times faster. Appends also print ``os.write`` of the same
bytes, their ceiling. Targets apply to the compiled build. A table at the end gives
every figure. The engine under test is the one this script imports (``PYTHONPATH``
chooses another checkout).

Files live in a temporary directory under ``$SEGLOG_BENCH_DIR`` (default: the system
temp directory), removed at the end. The page cache cannot be dropped without root, so
reads come from memory: these are CPU figures for the engine's code, not disk figures.
Appends are not fsynced (as a broker leaves flushing to the OS); ``os.sync()`` runs
between runs, outside the timed sections.

The file is named ``bench_*.py`` so that pytest (which collects ``test_*.py``) ignores it.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import storage
from storage import Log, LogConfig, build_record_batch, render_batch

T = TypeVar("T")

TIMESTAMP_MS = 1_700_000_000_000
"""One fixed create time for every record: no time-based roll, deterministic bytes."""
BATCH_RECORDS = 1000
MIB = 1 << 20
GIB = 1 << 30
VALUE_POOL_BATCHES = 8
"""Distinct value lists cycled through on append (values are built outside the timing)."""
PURE_ENV = "SEGLOG_PURE_PYTHON"


class FixedClock:
    """A clock that never moves: roll and retention never trigger on time."""

    def milliseconds(self) -> int:
        return TIMESTAMP_MS


CLOCK = FixedClock()


@dataclass(frozen=True)
class Sizes:
    """Workload sizes of one mode."""

    runs: int
    append_records: int
    read_records: int
    render_bytes: int
    lookup_small: int
    lookup_large: int
    lookup_count: int
    lookup_segment_bytes: int
    recovery_runs: int
    recovery_bytes: int
    recovery_segment_bytes: int


FULL = Sizes(
    runs=5,
    append_records=1_000_000,
    read_records=1_000_000,
    render_bytes=256 * MIB,
    lookup_small=10_000,
    lookup_large=10_000_000,
    lookup_count=2000,
    lookup_segment_bytes=64 * MIB,
    recovery_runs=3,
    recovery_bytes=GIB,
    recovery_segment_bytes=256 * MIB,
)
QUICK = Sizes(
    runs=3,
    append_records=100_000,
    read_records=100_000,
    render_bytes=16 * MIB,
    lookup_small=10_000,
    lookup_large=1_000_000,
    lookup_count=300,
    lookup_segment_bytes=8 * MIB,
    recovery_runs=3,
    recovery_bytes=64 * MIB,
    recovery_segment_bytes=16 * MIB,
)


# -- helpers (both processes) -----------------------------------------------------------


def say(text: str = "") -> None:
    print(text, flush=True)


def timed(action: Callable[[], T]) -> tuple[float, T]:
    """Seconds ``action`` took and its result, measured after a full collection (so that
    garbage of the previous run is not collected inside this one)."""
    gc.collect()
    start = time.perf_counter()
    result = action()
    return time.perf_counter() - start, result


def percentile(samples: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(samples)
    return ordered[max(1, math.ceil(fraction * len(ordered))) - 1]


def value_pool(value_size: int, seed: int = 0) -> list[list[bytes]]:
    """``VALUE_POOL_BATCHES`` lists of ``BATCH_RECORDS`` distinct random values."""
    rng = random.Random(value_size * 1000 + seed)
    return [
        [rng.randbytes(value_size) for _ in range(BATCH_RECORDS)] for _ in range(VALUE_POOL_BATCHES)
    ]


def open_log(log_dir: Path, segment_bytes: int = GIB, *, writable: bool = True) -> Log:
    return Log.open(log_dir, LogConfig(segment_bytes=segment_bytes), clock=CLOCK, writable=writable)


def fill(log: Log, pool: list[list[bytes]], batches: int, keys: list[list[bytes]] | None) -> None:
    for i in range(batches):
        log.append(
            pool[i % VALUE_POOL_BATCHES],
            keys=None if keys is None else keys[i % VALUE_POOL_BATCHES],
            timestamps=TIMESTAMP_MS,
        )


def crash(log: Log) -> None:
    """Leave the files as a killed process would: no flush, no index trim, no close."""
    for segment in log.segments.values():
        segment.close_handlers()


@contextmanager
def scratch_dir() -> Iterator[Path]:
    parent = os.environ.get("SEGLOG_BENCH_DIR") or None
    if parent is not None:
        Path(parent).mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="seglog-bench-", dir=parent))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# -- measurements (run in the worker processes) -----------------------------------------
#
# Each returns {"median": seconds, "runs": [...], "units": work per run, ...}; the
# parent turns seconds into rates.


def measure_append(root: Path, sizes: Sizes, value_size: int, keyed: bool) -> dict[str, Any]:
    batches = sizes.append_records // BATCH_RECORDS
    pool = value_pool(value_size)
    keys = value_pool(8, seed=1) if keyed else None
    encoded = [
        build_record_batch(values, keys=None if keys is None else keys[i], timestamps=TIMESTAMP_MS)
        for i, values in enumerate(pool)
    ]
    times = []
    write_times = []
    for run in range(sizes.runs):
        log_dir = root / f"append-{run}"
        log = open_log(log_dir)
        seconds, _ = timed(partial(fill, log, pool, batches, keys))
        times.append(seconds)
        assert log.log_end_offset == batches * BATCH_RECORDS
        log.close()
        shutil.rmtree(log_dir)
        os.sync()
        seconds, _ = timed(partial(write_raw, root / "raw.bin", encoded, batches))
        write_times.append(seconds)
        (root / "raw.bin").unlink()
        os.sync()
    return {"runs": times, "units": batches * BATCH_RECORDS, "write_runs": write_times}


def write_raw(path: Path, encoded: list[bytes], batches: int) -> None:
    """The ceiling: ``os.write`` of the same batch bytes, one write per batch."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_TRUNC, 0o644)
    try:
        for i in range(batches):
            os.write(fd, encoded[i % VALUE_POOL_BATCHES])
    finally:
        os.close(fd)


def sum_record_values(log: Log) -> int:
    total = 0
    for record in log.records(0):
        value = record.value
        if value is not None:
            total += len(value)
    return total


def sum_column_values(log: Log) -> int:
    total = 0
    for columns in log.record_columns(0):
        for value in columns.values:
            if value is not None:
                total += len(value)
    return total


def rendered_bytes(log: Log) -> int:
    total = 0
    for batch in log.batches(0):
        total += len(render_batch(batch, raw=False, key_separator=None).data)
    return total


READERS: dict[str, Callable[[Log], int]] = {
    "records": sum_record_values,
    "columns": sum_column_values,
    "render": rendered_bytes,
}


def measure_read(shared: Path, sizes: Sizes, log_name: str, reader: str) -> dict[str, Any]:
    log = open_log(shared / log_name, writable=False)
    try:
        read_all = READERS[reader]
        expected = read_all(log)  # also warms the page cache
        times = []
        for _ in range(sizes.runs):
            seconds, got = timed(partial(read_all, log))
            assert got == expected, (got, expected)
            times.append(seconds)
        return {"runs": times, "units": log.log_end_offset, "bytes": expected}
    finally:
        log.close()


def measure_lookup(shared: Path, sizes: Sizes, log_name: str) -> dict[str, Any]:
    log = open_log(shared / log_name, writable=False)
    try:
        n = log.log_end_offset
        rng = random.Random(n)
        offsets = [rng.randrange(n) for _ in range(sizes.lookup_count)]
        for offset in offsets[:50]:  # warm the index pages and the segment map
            next(log.records(offset))
        gc.collect()
        clock = time.perf_counter
        samples = []
        for offset in offsets:
            start = clock()
            record = next(log.records(offset))
            samples.append(clock() - start)
            assert record.offset == offset, (record.offset, offset)
        positioning = []
        for offset in offsets:
            start = clock()
            next(log.batches(offset))
            positioning.append(clock() - start)
        return {
            "runs": samples,
            "units": 1,
            "p99": percentile(samples, 0.99),
            "positioning": statistics.median(positioning),
            "segments": log.number_of_segments,
            "records": n,
        }
    finally:
        log.close()


def measure_recovery(shared: Path, sizes: Sizes, recovery_point: int) -> dict[str, Any]:
    log_dir = shared / "recovery"
    config = LogConfig(segment_bytes=sizes.recovery_segment_bytes)
    times = []
    end = -1
    for _ in range(sizes.recovery_runs):
        os.sync()
        start = time.perf_counter()
        log = Log.open(
            log_dir,
            config,
            had_clean_shutdown=False,
            recovery_point=recovery_point,
            clock=CLOCK,
            writable=True,
        )
        times.append(time.perf_counter() - start)
        end = log.log_end_offset
        crash(log)  # back to the crashed state: indexes untrimmed, nothing closed
    return {"runs": times, "units": 1, "end": end}


def run_worker(name: str, sizes: Sizes, shared: Path) -> dict[str, Any]:
    kind, _, arg = name.partition(":")
    with scratch_dir() as root:
        if kind == "append":
            size, _, keyed = arg.partition(",")
            result = measure_append(root, sizes, int(size), keyed == "keys")
        elif kind in READERS:
            log_name = "render1024" if arg == "1024" else "read100"
            result = measure_read(shared, sizes, log_name, kind)
        elif kind == "lookup":
            result = measure_lookup(shared, sizes, f"lookup-{arg}")
        elif kind == "recovery":
            result = measure_recovery(shared, sizes, int(arg))
        else:
            raise SystemExit(f"unknown measurement {name}")
    result["median"] = statistics.median(result["runs"])
    result["compiled"] = storage.compiled
    result["build"] = storage.build_info
    return result


# -- shared inputs (built once by the parent, read by both workers) ---------------------


def build_shared(shared: Path, sizes: Sizes) -> dict[str, int]:
    """The logs the read, lookup and recovery measurements open; returns facts about them."""
    facts: dict[str, int] = {}
    started = time.perf_counter()
    for name, value_size, records in (
        ("read100", 100, sizes.read_records),
        ("render1024", 1024, sizes.render_bytes // 1024),
    ):
        log = open_log(shared / name)
        fill(log, value_pool(value_size), records // BATCH_RECORDS, None)
        log.close()
    for records in (sizes.lookup_small, sizes.lookup_large):
        log = open_log(shared / f"lookup-{records}", sizes.lookup_segment_bytes)
        fill(log, value_pool(10), records // BATCH_RECORDS, None)
        facts[f"lookup-{records}-segments"] = log.number_of_segments
        log.close()
    facts["recovery_point"] = build_crashed_log(
        shared / "recovery", sizes.recovery_bytes, sizes.recovery_segment_bytes
    )
    files = sorted((shared / "recovery").glob("*.log"))
    facts["recovery_segments"] = len(files)
    facts["recovery_bytes"] = sum(p.stat().st_size for p in files)
    facts["recovery_active_bytes"] = files[-1].stat().st_size
    os.sync()
    say(f"shared logs built in {time.perf_counter() - started:.0f} s (with the installed build)")
    return facts


def build_crashed_log(log_dir: Path, target_bytes: int, segment_bytes: int) -> int:
    """Write up to ``target_bytes`` of 1-KiB values, flushing at each roll as Kafka does,
    then crash; return the recovery point checkpointed at the last roll.

    Writing stops when the next batch would roll past ``target_bytes // segment_bytes``
    segments: the active segment is then nearly full, the most a realistic recovery
    (active segment only) has to re-validate.
    """
    pool = value_pool(1024)
    log = open_log(log_dir, segment_bytes)
    recovery_point = 0
    segments = log.number_of_segments
    max_segments = max(1, target_bytes // segment_bytes)
    i = 0
    batch_size = 0
    while not (
        log.number_of_segments == max_segments
        and log.active_segment.size + batch_size > segment_bytes
    ):
        batch_size = log.append(pool[i % VALUE_POOL_BATCHES], timestamps=TIMESTAMP_MS).size
        i += 1
        if log.number_of_segments != segments:
            segments = log.number_of_segments
            log.flush()
            recovery_point = log.active_segment.base_offset
    crash(log)
    return recovery_point


# -- the parent: run each measurement in both builds, print, summarise -----------------


@dataclass(frozen=True)
class Measurement:
    name: str
    worker: str
    method: str
    kind: str  # "rate" (units/s), "bandwidth" (MB/s of result bytes), "latency", "time"
    target: float | None  # compiled build; rates and bandwidths at least, times at most


def append_measurements(sizes: Sizes) -> list[Measurement]:
    """Run first, before the shared logs (about 1.5 GB) are written: appends right after
    them were slower in some runs here, whichever build made them."""
    return [
        Measurement(
            "append 100 B values",
            "append:100",
            f"Log.append(values, timestamps=int) of {sizes.append_records:,} 100-byte values "
            f"in batches of {BATCH_RECORDS} into a fresh log (build + CRC + write + index)",
            "rate",
            4_000_000,
        ),
        Measurement(
            "append 100 B values, 8 B keys",
            "append:100,keys",
            "the same with an 8-byte key per record (Log.append(values, keys=keys, ...))",
            "rate",
            2_500_000,
        ),
    ]


def measurements(sizes: Sizes, facts: dict[str, int]) -> list[Measurement]:
    large = sizes.lookup_large
    return [
        Measurement(
            "read 100 B values, records()",
            "records",
            f"for record in log.records(0): total += len(record.value), {sizes.read_records:,}"
            " records (CRC-checked, a Record tuple per record)",
            "rate",
            None,
        ),
        Measurement(
            "read 100 B values, record_columns()",
            "columns",
            "for columns in log.record_columns(0): for value in columns.values: total += "
            "len(value) (CRC-checked; no object per record)",
            "rate",
            6_000_000,
        ),
        Measurement(
            "render lines, 100 B values",
            "render:100",
            "for batch in log.batches(0): render_batch(batch, raw=False, key_separator=None)"
            " (CRC-checked); MB/s of rendered bytes",
            "bandwidth",
            800e6,
        ),
        Measurement(
            "render lines, 1 KiB values",
            "render:1024",
            f"the same over {sizes.render_bytes // MIB} MiB of 1-KiB values",
            "bandwidth",
            2e9,
        ),
        Measurement(
            f"lookup median at {large:.0e}".replace("+0", ""),
            f"lookup:{large}",
            f"next(log.records(offset)) for {sizes.lookup_count} random offsets, timed one by "
            f"one, on a log of {large:,} 10-byte values "
            f"({facts[f'lookup-{large}-segments']} segments of "
            f"{sizes.lookup_segment_bytes // MIB} MiB): segment bisection, index search, "
            "the index entry's header and the wanted batch read, CRC of the 1000-record "
            "batch, a skip to the offset and a decode of the first records from it",
            "latency",
            100e-6,
        ),
        Measurement(
            f"lookup median at {sizes.lookup_small:.0e}".replace("+0", ""),
            f"lookup:{sizes.lookup_small}",
            f"the same on a log of {sizes.lookup_small:,} records (the size baseline: the "
            "cost must not grow with the log)",
            "latency",
            None,
        ),
        Measurement(
            "reopen after crash, realistic",
            f"recovery:{facts['recovery_point']}",
            f"Log.open(had_clean_shutdown=False) of {facts['recovery_bytes'] / MIB:,.0f} MiB "
            f"in {facts['recovery_segments']} segments, recovery point at the last roll: the "
            f"active segment ({facts['recovery_active_bytes'] / MIB:,.0f} MiB) re-validated",
            "time",
            2.0,
        ),
        Measurement(
            "reopen after crash, worst case",
            "recovery:0",
            "the same with recovery point 0: every segment re-validated",
            "time",
            2.0,
        ),
    ]


def run_in(
    build: str, worker: str, sizes_name: str, shared: Path, runs: int | None = None
) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != PURE_ENV}
    if build == "pure":
        env[PURE_ENV] = "1"
    result = subprocess.run(
        [
            sys.executable,
            __file__,
            "--worker",
            worker,
            "--sizes",
            sizes_name,
            "--shared",
            str(shared),
            *(["--runs", str(runs)] if runs is not None else []),
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise SystemExit(f"worker {worker} ({build}) failed:\n{result.stderr}")
    report: dict[str, Any] = json.loads(result.stdout.splitlines()[-1])
    return report


def figure(m: Measurement, report: dict[str, Any]) -> tuple[str, float]:
    """The figure as text, and its value in the target's unit."""
    median: float = report["median"]
    if m.kind == "rate":
        value = report["units"] / median
        return f"{value:,.0f} rec/s", value
    if m.kind == "bandwidth":
        value = report["bytes"] / median
        return f"{value / 1e6:,.0f} MB/s", value
    if m.kind == "latency":
        return f"{median * 1e6:,.0f} us", median
    return f"{median * 1e3:,.1f} ms", median


def met(m: Measurement, value: float) -> bool | None:
    if m.target is None:
        return None
    return value >= m.target if m.kind in ("rate", "bandwidth") else value <= m.target


def target_text(m: Measurement) -> str:
    if m.target is None:
        return "-"
    if m.kind == "rate":
        return f">= {m.target:,.0f} rec/s"
    if m.kind == "bandwidth":
        return f">= {m.target / 1e6:,.0f} MB/s"
    if m.kind == "latency":
        return f"<= {m.target * 1e6:,.0f} us"
    return f"< {m.target:.0f} s"


def print_table(rows: Sequence[tuple[str, ...]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for n, row in enumerate(rows):
        say("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        if n == 0:
            say("  ".join("-" * w for w in widths))


def measure_builds(
    m: Measurement, builds: Sequence[str], sizes: Sizes, sizes_name: str, shared: Path
) -> dict[str, dict[str, Any]]:
    """Each build's report. Runs alternate between the builds, one run per fresh
    interpreter, so that a burst of load on this shared machine (or the page cache
    state after the previous run) hits both alike; lookups run in one interpreter per
    build (they warm up first)."""
    if m.kind == "latency":
        return {build: run_in(build, m.worker, sizes_name, shared) for build in builds}
    reports: dict[str, dict[str, Any]] = {}
    rounds = sizes.recovery_runs if m.kind == "time" else sizes.runs
    for n in range(rounds):
        for build in builds if n % 2 == 0 else list(reversed(builds)):
            report = run_in(build, m.worker, sizes_name, shared, runs=1)
            if build in reports:
                for key in ("runs", "write_runs"):
                    if key in report:
                        reports[build][key] += report[key]
            else:
                reports[build] = report
    for report in reports.values():
        report["median"] = statistics.median(report["runs"])
    return reports


def run_measurement(
    m: Measurement, builds: Sequence[str], sizes: Sizes, sizes_name: str, shared: Path
) -> tuple[str, ...]:
    """Run ``m`` in every build, print its lines, return its summary row."""
    say(f"[{m.name}] {m.method}")
    reports = measure_builds(m, builds, sizes, sizes_name, shared)
    figures = {}
    for build, report in reports.items():
        if report["compiled"] != (build == "compiled"):
            raise SystemExit(f"the {build} worker ran: {report['build']}")
        text, value = figure(m, report)
        figures[build] = (text, value)
        extra = ""
        if m.kind == "latency":
            extra = (
                f", p99 {report['p99'] * 1e6:,.0f} us, positioning only "
                f"(next(log.batches(offset))) {report['positioning'] * 1e6:,.0f} us"
            )
        if "write_runs" in report:
            ceiling = report["units"] / statistics.median(report["write_runs"])
            extra = f"; os.write of the same bytes: {ceiling:,.0f} rec/s"
        count = len(report["runs"])
        unit = "lookups" if m.kind == "latency" else "runs"
        say(f"  {build:8}: {text} (median of {count} {unit}{extra})")
    ratio = ""
    if len(builds) == 2:
        ratio_value = reports["pure"]["median"] / reports["compiled"]["median"]
        ratio = f"{ratio_value:.1f}x"
        say(f"  ratio pure/compiled time: {ratio} (compiled faster when above 1)")
    ok = met(m, figures[builds[0]][1])
    status = "info" if ok is None else ("MET" if ok else "NOT MET")
    say()
    return (m.name, *(figures[b][0] for b in builds), ratio, target_text(m), status)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--sizes", default="full", help=argparse.SUPPRESS)
    parser.add_argument("--shared", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--runs", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        sizes = QUICK if args.sizes == "quick" else FULL
        if args.runs is not None:
            sizes = replace(sizes, runs=args.runs, recovery_runs=args.runs)
        print(json.dumps(run_worker(args.worker, sizes, args.shared)))
        return 0

    sizes_name = "quick" if args.quick else "full"
    sizes = QUICK if args.quick else FULL
    say(
        f"seglogfs storage benchmark ({sizes_name} sizes); Python {sys.version.split()[0]}, "
        f"{os.cpu_count()} CPUs; storage.compiled = {storage.compiled} "
        f"({storage.build_info})"
    )
    builds = ["compiled", "pure"] if storage.compiled else ["pure"]
    if not storage.compiled:
        say("the compiled build is not in use here: only pure-Python figures follow")
    say(
        "runs alternate between the builds, one fresh interpreter per run; lookups"
        " run in one interpreter per build; medians; ratio = pure time / compiled time"
        " (above 1: compiled faster)"
    )
    say()
    started = time.perf_counter()
    rows = [("measurement", *builds, "ratio" if len(builds) == 2 else "", "target", "status")]
    with scratch_dir() as shared:
        for m in append_measurements(sizes):
            rows.append(run_measurement(m, builds, sizes, sizes_name, shared))
        facts = build_shared(shared, sizes)
        say()
        for m in measurements(sizes, facts):
            rows.append(run_measurement(m, builds, sizes, sizes_name, shared))
    title = "summary (--quick sizes: not the target conditions)" if args.quick else "summary"
    say(f"{title}; targets apply to the {builds[0]} build")
    print_table(rows)
    say(f"\ntotal time {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

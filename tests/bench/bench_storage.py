"""Benchmark of the storage engine: append, sequential read, random lookup, crash reopen.

Run from the repository root::

    PYTHONPATH=. .venv/bin/python tests/bench/bench_storage.py           # full, ~10 min
    PYTHONPATH=. .venv/bin/python tests/bench/bench_storage.py --quick   # smoke, < 30 s

Each measurement prints its method, the median of several runs (the count is printed)
and the ratio to a baseline measured in the same process run, as STYLE.md point 10 asks;
a summary table at the end gives each figure against its target. Files live in a
temporary directory under ``$SEGLOG_BENCH_DIR`` (default: the system temp directory),
removed at the end.

The page cache cannot be dropped without root, so every read (the engine's and the
baselines') is served from the page cache: these are CPU-bound figures for the Python
code, not disk figures. Writes are not fsynced (``flush.messages`` is left at its
default, as a broker leaves flushing to the OS); dirty pages are written back with
``os.sync()`` between runs, outside the timed sections, so one run's writeback does
not land in the next one's timing.

The file is named ``bench_*.py`` so that pytest (which collects ``test_*.py``) ignores it.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TypeVar

from storage import Log, LogConfig, build_record_batch

T = TypeVar("T")

TIMESTAMP_MS = 1_700_000_000_000
"""One fixed create time for every record: no time-based roll, deterministic bytes."""
BATCH_RECORDS = 1000
READ_CHUNK = 1 << 20
MIB = 1 << 20
GIB = 1 << 30
VALUE_POOL_BATCHES = 8
"""Distinct value lists cycled through on append (values are built outside the timing)."""


class FixedClock:
    """A clock that never moves: roll and retention never trigger on time."""

    def milliseconds(self) -> int:
        return TIMESTAMP_MS


CLOCK = FixedClock()


@dataclass(frozen=True)
class Sizes:
    """Workload sizes of one mode."""

    append_runs: int
    append_records_small: int
    append_records_large: int
    read_runs: int
    lookup_small: int
    lookup_large: int
    lookup_count: int
    lookup_segment_bytes: int
    lookup_build_budget_s: float
    recovery_runs: int
    recovery_bytes: int
    recovery_segment_bytes: int


FULL = Sizes(
    append_runs=5,
    append_records_small=1_000_000,
    append_records_large=200_000,
    read_runs=5,
    lookup_small=10_000,
    lookup_large=10_000_000,
    lookup_count=2000,
    lookup_segment_bytes=64 * MIB,
    lookup_build_budget_s=120.0,
    recovery_runs=3,
    recovery_bytes=GIB,
    recovery_segment_bytes=256 * MIB,
)
QUICK = Sizes(
    append_runs=3,
    append_records_small=100_000,
    append_records_large=20_000,
    read_runs=3,
    lookup_small=10_000,
    lookup_large=1_000_000,
    lookup_count=300,
    lookup_segment_bytes=8 * MIB,
    lookup_build_budget_s=10.0,
    recovery_runs=3,
    recovery_bytes=64 * MIB,
    recovery_segment_bytes=16 * MIB,
)


@dataclass(frozen=True)
class Outcome:
    """One line of the summary table."""

    name: str
    figure: str
    target: str
    met: bool | None  # None: informational, no target


# -- helpers -------------------------------------------------------------------------


def say(text: str = "") -> None:
    print(text, flush=True)


def fmt_rate(records_per_s: float) -> str:
    return f"{records_per_s:,.0f} rec/s"


def fmt_seconds(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} us"
    if seconds < 1.0:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s"


def percentile(samples: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(samples)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


def timed(action: Callable[[], T]) -> tuple[float, T]:
    """Seconds ``action`` took and its result, measured after a full collection (so that
    garbage of the previous run is not collected inside this one)."""
    gc.collect()
    start = time.perf_counter()
    result = action()
    return time.perf_counter() - start, result


def segment_files(log_dir: Path) -> list[Path]:
    return sorted(log_dir.glob("*.log"))


def total_size(paths: Sequence[Path]) -> int:
    return sum(p.stat().st_size for p in paths)


def read_files_raw(paths: Sequence[Path]) -> int:
    """The baseline reader: plain ``os.read`` in 1 MiB chunks; returns bytes read."""
    total = 0
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            while chunk := os.read(fd, READ_CHUNK):
                total += len(chunk)
        finally:
            os.close(fd)
    return total


def value_pool(value_size: int) -> list[list[bytes]]:
    """``VALUE_POOL_BATCHES`` lists of ``BATCH_RECORDS`` distinct random values."""
    rng = random.Random(value_size)
    return [
        [rng.randbytes(value_size) for _ in range(BATCH_RECORDS)] for _ in range(VALUE_POOL_BATCHES)
    ]


def open_log(log_dir: Path, segment_bytes: int) -> Log:
    return Log.open(log_dir, LogConfig(segment_bytes=segment_bytes), clock=CLOCK, writable=True)


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


# -- 1. append -----------------------------------------------------------------------


def append_records(log: Log, pool: list[list[bytes]], batches: int) -> None:
    for i in range(batches):
        log.append(pool[i % VALUE_POOL_BATCHES], timestamps=TIMESTAMP_MS)


def write_raw(path: Path, encoded: list[bytes], batches: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_TRUNC, 0o644)
    try:
        for i in range(batches):
            os.write(fd, encoded[i % VALUE_POOL_BATCHES])
    finally:
        os.close(fd)


def bench_append(
    root: Path, value_size: int, records: int, runs: int, target: float | None
) -> tuple[Outcome, Path]:
    """Append throughput; returns the summary line and the log of the last run (kept)."""
    batches = records // BATCH_RECORDS
    records = batches * BATCH_RECORDS
    pool = value_pool(value_size)
    encoded = [build_record_batch(values, timestamps=TIMESTAMP_MS) for values in pool]
    total_bytes = sum(len(encoded[i % VALUE_POOL_BATCHES]) for i in range(batches))
    say(
        f"[append {value_size} B] {records:,} records/run in {batches} batches of "
        f"{BATCH_RECORDS}, {total_bytes / MIB:.0f} MiB encoded, segment.bytes 1 GiB; "
        f"{runs} runs of each, log and baseline alternating"
    )
    say(
        "  method: Log.append(values, timestamps=int) per batch into a fresh log (build "
        "+ CRC + write + index);"
    )
    say(
        "  baseline: os.write of the same encoded batch bytes, one write per batch, to a "
        "plain O_APPEND file"
    )
    log_times: list[float] = []
    raw_times: list[float] = []
    kept = root / f"append{value_size}-0"
    for run in range(runs):
        log_dir = root / f"append{value_size}-{run}"
        raw_path = root / f"raw{value_size}.bin"
        log = open_log(log_dir, GIB)
        log_s, _ = timed(partial(append_records, log, pool, batches))
        log_times.append(log_s)
        assert log.log_end_offset == records
        assert log.size == total_bytes, (log.size, total_bytes)
        log.close()
        raw_s, _ = timed(partial(write_raw, raw_path, encoded, batches))
        raw_times.append(raw_s)
        raw_path.unlink()
        if run < runs - 1:
            shutil.rmtree(log_dir)
        else:
            kept = log_dir
        os.sync()
    log_s = statistics.median(log_times)
    raw_s = statistics.median(raw_times)
    rate = records / log_s
    say(
        f"  log     : median {fmt_seconds(log_s)} = {fmt_rate(rate)}, "
        f"{total_bytes / log_s / 1e6:,.0f} MB/s of encoded bytes, "
        f"{records * value_size / log_s / 1e6:,.0f} MB/s of values"
    )
    say(
        f"  baseline: median {fmt_seconds(raw_s)} = {fmt_rate(records / raw_s)}, "
        f"{total_bytes / raw_s / 1e6:,.0f} MB/s"
    )
    say(f"  ratio log/baseline time: {log_s / raw_s:.2f}x")
    say()
    met = None if target is None else rate >= target
    target_text = "-" if target is None else f">= {fmt_rate(target)}"
    outcome = Outcome(
        f"append {value_size} B values",
        f"{fmt_rate(rate)} ({log_s / raw_s:.1f}x os.write)",
        target_text,
        met,
    )
    return outcome, kept


# -- 2. sequential read ----------------------------------------------------------------


def sum_value_lengths(log: Log) -> int:
    total = 0
    for record in log.records(0):
        value = record.value
        if value is not None:
            total += len(value)
    return total


def sum_column_value_lengths(log: Log) -> int:
    total = 0
    for columns in log.record_columns(0):
        for value in columns.values:
            if value is not None:
                total += len(value)
    return total


READ_PATHS = {
    "records": (
        sum_value_lengths,
        "for record in log.records(0): total += len(record.value) "
        "(CRC-checked, every record decoded into a Record tuple)",
    ),
    "columns": (
        sum_column_value_lengths,
        "for columns in log.record_columns(0): for value in columns.values: total += len(value)"
        " (CRC-checked, every record decoded; the bulk path meant for the FUSE renderer and Spark"
        " source)",
    ),
}


def bench_read(
    log_dir: Path, value_size: int, runs: int, target: float | None, path: str
) -> Outcome:
    read_all, method = READ_PATHS[path]
    files = segment_files(log_dir)
    size = total_size(files)
    log = Log.open(log_dir, LogConfig(segment_bytes=GIB), clock=CLOCK, writable=False)
    try:
        records = log.log_end_offset
        say(
            f"[read {value_size} B, {path}] {records:,} records, {size / MIB:.0f} MiB in "
            f"{len(files)} segment(s), from the page cache; {runs} runs of each"
        )
        say(f"  method: {method}")
        say("  baseline: os.read of the same .log files in 1 MiB chunks")
        log_times: list[float] = []
        raw_times: list[float] = []
        expected = records * value_size
        for _ in range(runs):
            log_s, got = timed(partial(read_all, log))
            assert got == expected, (got, expected)
            log_times.append(log_s)
            raw_s, _ = timed(partial(read_files_raw, files))
            raw_times.append(raw_s)
    finally:
        log.close()
    log_s = statistics.median(log_times)
    raw_s = statistics.median(raw_times)
    rate = records / log_s
    say(
        f"  log     : median {fmt_seconds(log_s)} = {fmt_rate(rate)}, "
        f"{size / log_s / 1e6:,.0f} MB/s of file bytes"
    )
    say(f"  baseline: median {fmt_seconds(raw_s)} = {size / raw_s / 1e6:,.0f} MB/s")
    say(f"  ratio log/baseline time: {log_s / raw_s:.1f}x")
    say()
    met = None if target is None else rate >= target
    target_text = "-" if target is None else f">= {fmt_rate(target)}"
    return Outcome(
        f"read {value_size} B values ({path})",
        f"{fmt_rate(rate)} ({log_s / raw_s:.0f}x os.read)",
        target_text,
        met,
    )


# -- 3. random lookup ----------------------------------------------------------------


@dataclass(frozen=True)
class LookupResult:
    records: int
    segments: int
    median_s: float
    p99_s: float
    positioning_median_s: float


def build_lookup_log(log_dir: Path, records: int, segment_bytes: int, budget_s: float) -> Log:
    """Append ``records`` 10-byte values (fewer if ``budget_s`` runs out); report it."""
    rng = random.Random(10)
    pool = [[rng.randbytes(10) for _ in range(BATCH_RECORDS)] for _ in range(VALUE_POOL_BATCHES)]
    log = open_log(log_dir, segment_bytes)
    batches = records // BATCH_RECORDS
    start = time.perf_counter()
    for i in range(batches):
        log.append(pool[i % VALUE_POOL_BATCHES], timestamps=TIMESTAMP_MS)
        if i % 100 == 99 and time.perf_counter() - start > budget_s:
            say(f"  build stopped by its {budget_s:.0f} s budget at {log.log_end_offset:,}")
            break
    elapsed = time.perf_counter() - start
    say(
        f"  built {log.log_end_offset:,} records ({log.size / MIB:.0f} MiB, "
        f"{log.number_of_segments} segment(s)) in {elapsed:.1f} s "
        f"= {fmt_rate(log.log_end_offset / elapsed)}"
    )
    return log


def measure_lookups(log: Log, count: int) -> LookupResult:
    n = log.log_end_offset
    rng = random.Random(n)
    offsets = [rng.randrange(n) for _ in range(count)]
    # Warm the index pages and the segment map once, outside the samples.
    for offset in offsets[:50]:
        next(log.records(offset))
    gc.collect()
    samples: list[float] = []
    clock = time.perf_counter
    for offset in offsets:
        start = clock()
        record = next(log.records(offset))
        samples.append(clock() - start)
        assert record.offset == offset, (record.offset, offset)
    positioning: list[float] = []
    for offset in offsets:
        start = clock()
        next(log.batches(offset))
        positioning.append(clock() - start)
    return LookupResult(
        n,
        log.number_of_segments,
        statistics.median(samples),
        percentile(samples, 0.99),
        statistics.median(positioning),
    )


def bench_lookup(root: Path, sizes: Sizes) -> Outcome:
    count = sizes.lookup_count
    say(
        f"[lookup] random offsets, {count} lookups per log; 10-byte values, batches of "
        f"{BATCH_RECORDS}, segment.bytes {sizes.lookup_segment_bytes // MIB} MiB, "
        "index.interval.bytes 4096 (default)"
    )
    say(
        "  method: next(log.records(offset)) timed one by one (segment bisection, index "
        "lookup, forward scan, CRC check and decode of the 1000-record batch holding it)"
    )
    say("  also:   next(log.batches(offset)) (positioning + CRC, no record decode)")
    say(f"  baseline: the same lookups on a {sizes.lookup_small:,}-record log")
    results: list[LookupResult] = []
    for records in (sizes.lookup_small, sizes.lookup_large):
        log_dir = root / f"lookup-{records}" / "bench-0"
        budget = sizes.lookup_build_budget_s
        log = build_lookup_log(log_dir, records, sizes.lookup_segment_bytes, budget)
        try:
            results.append(measure_lookups(log, count))
        finally:
            log.close()
        shutil.rmtree(log_dir.parent)
        os.sync()
    for r in results:
        say(
            f"  {r.records:>12,} records, {r.segments} segment(s): median "
            f"{fmt_seconds(r.median_s)}, p99 {fmt_seconds(r.p99_s)}; batches() positioning "
            f"median {fmt_seconds(r.positioning_median_s)}"
        )
    small, large = results
    ratio = large.median_s / small.median_s
    say(f"  ratio median({large.records:,}) / median({small.records:,}): {ratio:.2f}")
    say(
        f"  positioning ratio (batches()): "
        f"{large.positioning_median_s / small.positioning_median_s:.2f}"
    )
    say()
    return Outcome(
        f"lookup median {large.records:.0e}/{small.records:.0e}".replace("+0", ""),
        f"{ratio:.2f} ({fmt_seconds(large.median_s)} vs {fmt_seconds(small.median_s)})",
        "<= 1.5",
        ratio <= 1.5,
    )


# -- 4. reopen after a crash -----------------------------------------------------------


def build_crashed_log(log_dir: Path, target_bytes: int, segment_bytes: int) -> tuple[int, int]:
    """Write up to ``target_bytes`` of 1-KiB values, flushing at each roll as Kafka does,
    then crash. Returns ``(log end offset, recovery point checkpointed at the last roll)``.

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
            # Kafka flushes the sealed segments after a roll and checkpoints the new
            # active segment's base offset as the recovery point.
            segments = log.number_of_segments
            log.flush()
            recovery_point = log.active_segment.base_offset
    end = log.log_end_offset
    crash(log)
    return end, recovery_point


def bench_recovery(root: Path, sizes: Sizes) -> list[Outcome]:
    log_dir = root / "recovery" / "bench-0"
    seg = sizes.recovery_segment_bytes
    config = LogConfig(segment_bytes=seg)
    end, checkpoint = build_crashed_log(log_dir, sizes.recovery_bytes, seg)
    files = segment_files(log_dir)
    active = files[-1]
    say(
        f"[reopen after crash] {end:,} records of 1 KiB in batches of {BATCH_RECORDS}, "
        f"{total_size(files) / MIB:,.0f} MiB in {len(files)} segments of segment.bytes "
        f"{seg // MIB} MiB; active segment {active.stat().st_size / MIB:.0f} MiB"
    )
    say(
        "  method: crash = close file handles without flush, index trim or close; time "
        "Log.open(had_clean_shutdown=False, recovery_point=...);"
    )
    say(
        "  os.sync() before each timed open (its fsyncs then find clean pages); the "
        f"crashed state is restored after each run; {sizes.recovery_runs} runs"
    )
    say("  baseline: os.read in 1 MiB chunks of the .log bytes that recovery re-validates")
    outcomes: list[Outcome] = []
    cases = (
        ("realistic", checkpoint, [active], "flushed at each roll: active segment"),
        ("worst case", 0, files, "every segment"),
    )
    for name, recovery_point, revalidated, description in cases:
        open_times: list[float] = []
        raw_times: list[float] = []
        for _ in range(sizes.recovery_runs):
            os.sync()
            reopen = partial(
                Log.open,
                log_dir,
                config,
                had_clean_shutdown=False,
                recovery_point=recovery_point,
                clock=CLOCK,
                writable=True,
            )
            open_s, log = timed(reopen)
            open_times.append(open_s)
            assert log.log_end_offset == end, (log.log_end_offset, end)
            # Back to the crashed state: indexes untrimmed, nothing closed.
            crash(log)
            raw_s, _ = timed(partial(read_files_raw, revalidated))
            raw_times.append(raw_s)
        open_s = statistics.median(open_times)
        raw_s = statistics.median(raw_times)
        size = total_size(revalidated)
        say(
            f"  {name} (recovery point {recovery_point:,}; {description}, "
            f"{size / MIB:,.0f} MiB): median {fmt_seconds(open_s)} "
            f"(runs: {', '.join(fmt_seconds(t) for t in open_times)}); baseline "
            f"{fmt_seconds(raw_s)}; ratio {open_s / raw_s:.1f}x"
        )
        outcomes.append(
            Outcome(
                f"reopen after crash, {name}",
                f"{fmt_seconds(open_s)} for {size / MIB:,.0f} MiB ({open_s / raw_s:.1f}x os.read)",
                "< 2 s",
                open_s < 2.0,
            )
        )
    say()
    shutil.rmtree(log_dir.parent)
    return outcomes


# -- main --------------------------------------------------------------------------------


def print_summary(outcomes: Sequence[Outcome], quick: bool) -> None:
    headers = ("measurement", "result", "target", "status")
    rows = [
        (
            o.name,
            o.figure,
            o.target,
            "info" if o.met is None else ("MET" if o.met else "NOT MET"),
        )
        for o in outcomes
    ]
    widths = [max(len(row[i]) for row in (headers, *rows)) for i in range(4)]
    title = "summary (--quick sizes: not the target conditions)" if quick else "summary"
    say(title)
    for row in (headers, tuple("-" * w for w in widths), *rows):
        say("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    say(
        f"seglogfs storage benchmark ({'quick' if args.quick else 'full'} mode); Python "
        f"{sys.version.split()[0]}, {os.cpu_count()} CPUs; medians of the run counts shown"
    )
    say()
    started = time.perf_counter()
    outcomes: list[Outcome] = []
    with scratch_dir() as root:
        say(f"files under {root}")
        say()
        small, small_log = bench_append(
            root, 100, sizes.append_records_small, sizes.append_runs, 1_000_000
        )
        large, large_log = bench_append(
            root, 1024, sizes.append_records_large, sizes.append_runs, None
        )
        outcomes += [small, large]
        for path in READ_PATHS:
            outcomes.append(bench_read(small_log, 100, sizes.read_runs, 1_000_000, path))
            outcomes.append(bench_read(large_log, 1024, sizes.read_runs, None, path))
        shutil.rmtree(small_log)
        shutil.rmtree(large_log)
        outcomes.append(bench_lookup(root, sizes))
        outcomes += bench_recovery(root, sizes)
    print_summary(outcomes, args.quick)
    say(f"\ntotal time {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

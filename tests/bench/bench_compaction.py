"""Benchmark of log compaction: one cleaning pass over 10^6 records of 100 bytes, 10^4 keys.

Run from the repository root::

    .venv/bin/python tests/bench/bench_compaction.py            # full size, a few minutes
    .venv/bin/python tests/bench/bench_compaction.py --quick    # 10^5 records, a smoke run
    SEGLOG_PURE_PYTHON=1 .venv/bin/python tests/bench/bench_compaction.py   # pure Python

Method. A compacted log is written once: ``--records`` records (default 10^6) of
``--value-bytes`` (100) bytes each, keys ``key-00000`` .. round robin over ``--keys``
(10^4), 1,000 records a batch (uncompressed), ``segment.bytes`` 16 MiB, then a roll so
that every record is in a sealed segment. Each run copies that directory (untimed,
then ``os.sync()``) and times, one after the other in one thread:

- **baseline**: a plain sequential read of the same ``.log`` files (1 MiB ``read``s,
  nothing decoded), the floor any pass that reads every byte has;
- **decode**: every batch through ``Log.batches`` and ``RecordBatch.columns()`` (the
  read path's decode of every key and value);
- **clean**: ``Log.clean`` (one pass: the offset map over every record, then the
  recopy of every segment, the swaps and their ``fsync``s) with the offset map of
  ``log.cleaner.dedupe.buffer.size`` (``--dedupe-mib``, Kafka's default 128) at
  Kafka's load factor 0.9; opening and closing the log are not timed.

The median of ``--runs`` runs (default 5) is printed for each, with the ratios of clean
to the baseline and to decode measured in the same runs (times: lower is better).
Records a second is records read by the pass's recopy (every record below where it
stopped; the map read each of them once before) over its median time; the target is
1,000,000 compiled. Bytes reclaimed: the ``.log`` bytes before minus after.

Stalls. Then, ``--runs`` more times, a pass runs in the main thread (as the daemon's
cleaner runs in a worker thread) while two other threads of the same process do what
the file system's readers and writers do: one reads a sealed 16 MiB segment of
another partition in 1 MiB reads (``FileRecords.read``, a ``pread``), one every
``--read-period-ms`` (10), round and round; one appends a batch of 10 records of 100
B to a third partition (``Log.append_batches``, no ``fsync``) every
``--append-period-ms`` (5). An operation's latency runs from when it was due to when
it returned, so it includes waiting for the interpreter lock (the pass holds it while
it computes) and for the CPU. A stall is the longest latency of an operation due while
the pass ran; the median over the runs is printed against the target (< 100 ms), with
the worst run, and with the longest latency of the same load over as long a time
without a pass, measured in the same run (the idle baseline; the ratio is stall over
idle: higher is worse). The machine's load (``os.getloadavg``) is printed too:
other processes on the cores show in the latencies.

Peak memory: ``tracemalloc``'s peak over one extra pass (its tracing slows it: not
timed), next to the dedupe buffer setting and the offset map's own size. The page
cache is warm (it cannot be dropped without root): CPU figures, not disk figures.

The file is named ``bench_*.py`` so that pytest (which collects ``test_*.py``) ignores it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import tracemalloc
from collections.abc import Callable
from functools import partial
from pathlib import Path

import storage
from storage import Log, LogConfig, OffsetMap, build_record_batch
from storage.log.offset_map import OffsetMap as _OffsetMap

TIMESTAMP_MS = 1_700_000_000_000
BATCH_RECORDS = 1000
APPEND_RECORDS = 10
MIB = 1 << 20
STALL_TARGET_S = 0.100
RECORDS_PER_S_TARGET = 1_000_000
CONFIG = LogConfig(
    cleanup_policy=("compact",),
    segment_bytes=16 * MIB,
    file_delete_delay_ms=0,
)
OTHER_CONFIG = LogConfig(segment_bytes=16 * MIB, file_delete_delay_ms=0)


class _Clock:
    def milliseconds(self) -> int:
        return TIMESTAMP_MS + 1000


def write_log(directory: Path, records: int, keys: int, value_bytes: int) -> None:
    """The dirty log: ``records`` records round robin over ``keys`` keys, all sealed."""
    log = Log.open(directory, CONFIG, clock=_Clock())
    try:
        pad = b"v" * value_bytes
        for start in range(0, records, BATCH_RECORDS):
            n = min(BATCH_RECORDS, records - start)
            batch_keys: list[bytes | None] = [b"key-%05d" % ((start + i) % keys) for i in range(n)]
            values: list[bytes | None] = [pad] * n
            log.append_batches(
                build_record_batch(values, keys=batch_keys, timestamps=TIMESTAMP_MS, base_offset=0)
            )
        log.roll()
    finally:
        log.close()


def write_sealed_segment(directory: Path, value_bytes: int) -> None:
    """A partition whose first segment is sealed and full (16 MiB): what the reader reads."""
    log = Log.open(directory, OTHER_CONFIG, clock=_Clock())
    try:
        values: list[bytes | None] = [b"r" * value_bytes] * BATCH_RECORDS
        while log.number_of_segments < 2:
            log.append_batches(build_record_batch(values, timestamps=TIMESTAMP_MS))
    finally:
        log.close()


def read_plain(directory: Path) -> int:
    total = 0
    for path in sorted(directory.glob("*.log")):
        with open(path, "rb", buffering=0) as file:
            while chunk := file.read(MIB):
                total += len(chunk)
    return total


def decode_all(directory: Path) -> int:
    log = Log.open(directory, CONFIG, clock=_Clock(), writable=False)
    try:
        count = 0
        for batch in log.batches(log.log_start_offset):
            count += len(batch.columns())
        return count
    finally:
        log.close()


def clean_once(directory: Path, dedupe_bytes: int) -> tuple[float, int, int, int]:
    """(seconds of ``Log.clean``, records read by the pass, .log bytes before, after);
    opening and closing the log are not timed."""
    log = Log.open(directory, CONFIG, clock=_Clock())
    try:
        before = log.size
        offset_map = OffsetMap(dedupe_bytes, 0.9)
        start = time.perf_counter()
        _end, stats = log.clean(offset_map)
        seconds = time.perf_counter() - start
        return seconds, stats.records_read, before, log.size
    finally:
        log.close()


def timed(action: Callable[[], object]) -> tuple[float, object]:
    start = time.perf_counter()
    result = action()
    return time.perf_counter() - start, result


class PeriodicLoad:
    """One thread doing ``operation`` every ``period`` seconds until stopped; records
    ``(due, latency)`` of each: latency from when it was due to when it returned. An
    operation that finishes late makes the next one due at once, not a burst."""

    def __init__(self, name: str, operation: Callable[[], object], period: float) -> None:
        self.samples: list[tuple[float, float]] = []
        self._operation = operation
        self._period = period
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def __enter__(self) -> PeriodicLoad:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        due = time.perf_counter()
        while not self._stop.is_set():
            now = time.perf_counter()
            if now < due:
                time.sleep(due - now)
            self._operation()
            done = time.perf_counter()
            self.samples.append((due, done - due))
            due = max(due + self._period, done)

    def longest(self, start: float, end: float) -> float:
        """The longest latency of an operation due in ``[start, end)``."""
        return max((latency for due, latency in self.samples if start <= due < end), default=0.0)


class SegmentReader:
    """1 MiB reads of a sealed segment, round and round (what ``cat`` of a file does)."""

    def __init__(self, log: Log) -> None:
        segment = log.segments.first_segment
        assert segment is not None
        assert segment is not log.active_segment
        self._records = segment.log
        self._size = segment.size
        self._position = 0

    def __call__(self) -> None:
        data = self._records.read(self._position, MIB)
        self._position = (self._position + len(data)) % self._size


def stall_run(
    source: Path, other: Path, work: Path, dedupe: int, args: argparse.Namespace
) -> tuple[float, float, float, float, float]:
    """One pass under the reader and appender, then the same load alone as long:
    (pass seconds, longest read and append latency during the pass, and idle)."""
    shutil.copytree(source, work / "t-0")
    shutil.copytree(other, work / "t-1")
    os.sync()
    reading = Log.open(work / "t-1", OTHER_CONFIG, clock=_Clock(), writable=False)
    appending = Log.open(work / "t-2", OTHER_CONFIG, clock=_Clock())
    value: list[bytes | None] = [b"a" * args.value_bytes] * APPEND_RECORDS
    batch = build_record_batch(value, timestamps=TIMESTAMP_MS)
    try:
        with (
            PeriodicLoad("reader", SegmentReader(reading), args.read_period_ms / 1000) as reads,
            PeriodicLoad(
                "appender", partial(appending.append_batches, batch), args.append_period_ms / 1000
            ) as appends,
        ):
            time.sleep(0.2)  # both running
            start = time.perf_counter()
            clean_once(work / "t-0", dedupe)
            end = time.perf_counter()  # the pass, and its log's open and close
            # The idle baseline: the same load, as long again, with no pass.
            time.sleep(max(end - start, 0.5) + 0.05)
            idle_end = time.perf_counter()
        return (
            end - start,
            reads.longest(start, end),
            appends.longest(start, end),
            reads.longest(end + 0.05, idle_end),
            appends.longest(end + 0.05, idle_end),
        )
    finally:
        reading.close()
        appending.close()


def verdict(met: bool) -> str:
    return "met" if met else "MISSED"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--dedupe-mib", type=int, default=128)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--read-period-ms", type=float, default=10.0)
    parser.add_argument("--append-period-ms", type=float, default=5.0)
    parser.add_argument("--quick", action="store_true", help="10^5 records, 3 runs")
    args = parser.parse_args()
    if args.quick:
        args.records, args.runs = 100_000, 3
    dedupe = args.dedupe_mib * MIB
    root = Path(
        tempfile.mkdtemp(prefix="seglog-bench-compaction-", dir=os.environ.get("SEGLOG_BENCH_DIR"))
    )
    try:
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
        print(f"storage build: {storage.build_info} (compiled={storage.compiled})")
        print(f"machine: {os.cpu_count()} CPUs, load average {load} (1, 5, 15 min) at start")
        print(
            f"{args.records:,} records of {args.value_bytes} B, {args.keys:,} keys, "
            f"dedupe buffer {args.dedupe_mib} MiB, {args.runs} runs, median"
        )
        source = root / "source" / "t-0"
        write_log(source, args.records, args.keys, args.value_bytes)
        other = root / "source" / "t-1"
        write_sealed_segment(other, args.value_bytes)
        size = sum(p.stat().st_size for p in source.glob("*.log"))
        clean_times: list[float] = []
        plain_times: list[float] = []
        decode_times: list[float] = []
        result = [0, 0, 0]
        for run in range(args.runs):
            work = root / f"run{run}" / "t-0"
            shutil.copytree(source, work)
            os.sync()
            seconds, read = timed(partial(read_plain, work))
            assert read == size
            plain_times.append(seconds)
            seconds, _count = timed(partial(decode_all, work))
            decode_times.append(seconds)
            seconds, *result = clean_once(work, dedupe)
            clean_times.append(seconds)
            shutil.rmtree(work.parent)
        records_read, before, after = result
        clean = statistics.median(clean_times)
        plain = statistics.median(plain_times)
        decode = statistics.median(decode_times)
        rate = records_read / clean
        print(f"log bytes                 {size:,}")
        print(
            f"plain sequential read     {plain * 1000:9.1f} ms  ({size / plain / MIB:,.0f} MiB/s)"
            "  baseline"
        )
        print(f"decode every batch        {decode * 1000:9.1f} ms")
        print(
            f"clean (one pass)          {clean * 1000:9.1f} ms  "
            f"{rate:,.0f} records/s  {size / clean / MIB:,.1f} MiB/s  "
            f"(target >= {RECORDS_PER_S_TARGET:,} records/s compiled: "
            f"{verdict(rate >= RECORDS_PER_S_TARGET) if storage.compiled else 'n/a, pure'})"
        )
        print(f"  runs                    {', '.join(f'{t * 1000:.0f}' for t in clean_times)} ms")
        print(f"clean / plain read        {clean / plain:9.1f} x  (time ratio: lower is better)")
        print(f"clean / decode            {clean / decode:9.2f} x  (time ratio: lower is better)")
        print(f"bytes reclaimed           {before - after:,} ({before:,} -> {after:,})")

        passes: list[float] = []
        read_stalls: list[float] = []
        append_stalls: list[float] = []
        read_idle: list[float] = []
        append_idle: list[float] = []
        for run in range(args.runs):
            work = root / f"stall{run}"
            seconds, read_stall, append_stall, read_base, append_base = stall_run(
                source, other, work, dedupe, args
            )
            passes.append(seconds)
            read_stalls.append(read_stall)
            append_stalls.append(append_stall)
            read_idle.append(read_base)
            append_idle.append(append_base)
            shutil.rmtree(work)
        print(
            f"stalls: a pass in the main thread; a 1 MiB read of a sealed segment every "
            f"{args.read_period_ms:g} ms and a {APPEND_RECORDS}-record append to another "
            f"partition every {args.append_period_ms:g} ms in two other threads; latency from "
            f"due to done; median of {args.runs} runs (worst run); idle: the same load "
            "without a pass"
        )
        print(f"  pass under that load    {statistics.median(passes) * 1000:9.1f} ms")
        for name, stalls, idle in (
            ("1 MiB read", read_stalls, read_idle),
            ("append", append_stalls, append_idle),
        ):
            stall = statistics.median(stalls)
            base = statistics.median(idle)
            print(
                f"  longest {name:<15} {stall * 1000:9.1f} ms  (worst {max(stalls) * 1000:.1f} ms;"
                f" idle {base * 1000:.1f} ms, stall / idle {stall / base if base else 0:.1f} x:"
                f" higher is worse; target < {STALL_TARGET_S * 1000:.0f} ms:"
                f" {verdict(stall < STALL_TARGET_S)})"
            )

        # Memory: one more pass under tracemalloc (Python allocations, not timed).
        work = root / "memory" / "t-0"
        shutil.copytree(source, work)
        tracemalloc.start()
        clean_once(work, dedupe)
        _current, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        probe = _OffsetMap(dedupe, 0.9)
        probe.put_all([b"key-%05d" % i for i in range(args.keys)], list(range(args.keys)), 0)
        map_bytes = sys.getsizeof(probe._entries) + sum(
            sys.getsizeof(k) + sys.getsizeof(v) for k, v in probe._entries.items()
        )
        print(
            f"peak traced memory        {peak / MIB:9.1f} MiB  (dedupe buffer {args.dedupe_mib} MiB"
            f" = room for {probe.max_entries:,} keys; this map, {args.keys:,} keys: "
            f"{map_bytes / MIB:.1f} MiB)"
        )
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
        print(f"load average at the end   {load}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

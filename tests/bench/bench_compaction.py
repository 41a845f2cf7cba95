"""Benchmark of log compaction: one cleaning pass over 10^6 records of 100 bytes, 10^4 keys.

Run from the repository root::

    .venv/bin/python tests/bench/bench_compaction.py            # full size, a few minutes
    .venv/bin/python tests/bench/bench_compaction.py --quick    # 10^5 records, a smoke run
    SEGLOG_PURE_PYTHON=1 .venv/bin/python tests/bench/bench_compaction.py   # pure Python

Method. A compacted log is written once: ``--records`` records (default 10^6) of
``--value-bytes`` (100) bytes each, keys ``key-00000`` .. round robin over ``--keys``
(10^4), 1,000 records a batch (uncompressed), ``segment.bytes`` 16 MiB, then a roll so
that every record is in a sealed segment. Each run copies that directory (untimed,
then ``os.sync()``) and times:

- **clean**: ``Log.clean`` (one pass: the offset map over every record, then the
  recopy of every segment) with the offset map of ``log.cleaner.dedupe.buffer.size``
  (``--dedupe-mib``, Kafka's default 128) at Kafka's load factor 0.9;
- **baseline**: a plain sequential read of the same ``.log`` files (1 MiB ``read``s,
  nothing decoded), the floor any pass that reads every byte has;
- **decode**: every batch through ``Log.batches`` and ``RecordBatch.columns()`` (the
  read path's decode of every key and value), what the pass's two scans cost at least.

The median of ``--runs`` runs (default 5) is printed for each, with the ratio of clean
to the baseline and to decode measured in the same runs. Records a second is records
read by the pass over its median time. Bytes reclaimed: the ``.log`` bytes before minus
after. Peak memory: ``tracemalloc``'s peak over one extra pass (its tracing slows it:
not timed), next to the dedupe buffer setting and the offset map's own size. The page
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
MIB = 1 << 20
CONFIG = LogConfig(
    cleanup_policy=("compact",),
    segment_bytes=16 * MIB,
    file_delete_delay_ms=0,
)


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


def clean_once(directory: Path, dedupe_bytes: int) -> tuple[int, int, int]:
    """(records read by the pass, .log bytes before, after)."""
    log = Log.open(directory, CONFIG, clock=_Clock())
    try:
        before = log.size
        _end, stats = log.clean(OffsetMap(dedupe_bytes, 0.9))
        return stats.records_read, before, log.size
    finally:
        log.close()


def timed(action: Callable[[], object]) -> tuple[float, object]:
    start = time.perf_counter()
    result = action()
    return time.perf_counter() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--dedupe-mib", type=int, default=128)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="10^5 records, 3 runs")
    args = parser.parse_args()
    if args.quick:
        args.records, args.runs = 100_000, 3
    dedupe = args.dedupe_mib * MIB
    root = Path(
        tempfile.mkdtemp(prefix="seglog-bench-compaction-", dir=os.environ.get("SEGLOG_BENCH_DIR"))
    )
    try:
        print(f"storage build: {storage.build_info} (compiled={storage.compiled})")
        print(
            f"{args.records:,} records of {args.value_bytes} B, {args.keys:,} keys, "
            f"dedupe buffer {args.dedupe_mib} MiB, {args.runs} runs, median"
        )
        source = root / "source" / "t-0"
        write_log(source, args.records, args.keys, args.value_bytes)
        size = sum(p.stat().st_size for p in source.glob("*.log"))
        clean_times: list[float] = []
        plain_times: list[float] = []
        decode_times: list[float] = []
        result = (0, 0, 0)
        for run in range(args.runs):
            work = root / f"run{run}" / "t-0"
            shutil.copytree(source, work)
            os.sync()
            seconds, read = timed(partial(read_plain, work))
            assert read == size
            plain_times.append(seconds)
            seconds, _count = timed(partial(decode_all, work))
            decode_times.append(seconds)
            seconds, outcome = timed(partial(clean_once, work, dedupe))
            assert isinstance(outcome, tuple)
            result = outcome
            clean_times.append(seconds)
            shutil.rmtree(work.parent)
        records_read, before, after = result
        clean = statistics.median(clean_times)
        plain = statistics.median(plain_times)
        decode = statistics.median(decode_times)
        print(f"log bytes                 {size:,}")
        print(
            f"plain sequential read     {plain * 1000:9.1f} ms  ({size / plain / MIB:,.0f} MiB/s)"
        )
        print(f"decode every batch        {decode * 1000:9.1f} ms")
        print(
            f"clean (one pass)          {clean * 1000:9.1f} ms  "
            f"{records_read / clean:,.0f} records/s  {size / clean / MIB:,.1f} MiB/s"
        )
        print(f"clean / plain read        {clean / plain:9.1f} x")
        print(f"clean / decode            {clean / decode:9.2f} x")
        print(f"bytes reclaimed           {before - after:,} ({before:,} -> {after:,})")
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
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

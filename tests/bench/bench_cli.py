"""Benchmark of the command line: ``seglogfs produce`` and ``consume`` against ``cat``.

Run: ``.venv/bin/python tests/bench/bench_cli.py`` (about a minute; ``--quick`` for a
smoke run). Not collected by pytest.

Method: a file of N lines of 100 bytes (99 characters and a newline) in a temporary
directory on the same file system as the log directory. Each measurement is the wall
time of the whole command as a user runs it (interpreter start included), median of
several runs, each on a fresh log directory for produce:

- baseline: ``cat FILE > COPY`` (the same bytes read and written once, no pipe);
- ``seglogfs produce t -d DIR < FILE`` into an unmounted log directory (topic created
  beforehand, untimed); the target is at least 1,000,000 lines/s;
- ``seglogfs consume t -d DIR > OUT`` of the produced log (plain output, which is
  checked to be byte-identical to FILE).

Ratios are command time / cat time: higher means slower than cat.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCRIPT = Path(sys.executable).with_name("seglogfs")
TARGET_LINES_PER_S = 1_000_000


def _write_input(path: Path, lines: int) -> None:
    block = 10_000
    with open(path, "wb") as f:
        for start in range(0, lines, block):
            f.write(
                b"".join(
                    b"%010d " % i + b"x" * 88 + b"\n"
                    for i in range(start, min(lines, start + block))
                )
            )


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _timed(argv: list[str], stdin: Path, stdout: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the command: user + system)."""
    with open(stdin, "rb") as source, open(stdout, "wb") as out:
        cpu = _children_cpu()
        began = time.perf_counter()
        subprocess.run(argv, stdin=source, stdout=out, check=True)
        return time.perf_counter() - began, _children_cpu() - cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100,000 lines, 3 runs")
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    lines, runs = (100_000, 3) if args.quick else (args.lines, args.runs)

    with tempfile.TemporaryDirectory(prefix="bench-cli-") as tmp:
        work = Path(tmp)
        source = work / "input.txt"
        _write_input(source, lines)
        size = source.stat().st_size
        print(f"input: {lines:,} lines of 100 bytes ({size / 1e6:.0f} MB) in {work}")
        print(f"method: wall time of each command, median of {runs} runs, fresh log dir per")
        print("produce run; ratio = command wall time / cat wall time (higher is slower)\n")

        cat_times = [_timed(["cat", str(source)], source, work / "copy") for _ in range(runs)]
        produce_times = []
        log_dir = work / "logs"
        for _ in range(runs):
            shutil.rmtree(log_dir, ignore_errors=True)
            subprocess.run(
                [str(SCRIPT), "topics", "create", "t", "-d", str(log_dir)],
                check=True,
                stdout=subprocess.DEVNULL,
            )
            produce_times.append(
                _timed([str(SCRIPT), "produce", "t", "-d", str(log_dir)], source, work / "null")
            )
        consume_times = [
            _timed([str(SCRIPT), "consume", "t", "-d", str(log_dir)], source, work / "out.txt")
            for _ in range(runs)
        ]
        identical = (work / "out.txt").read_bytes() == source.read_bytes()
        log_bytes = sum(f.stat().st_size for f in (log_dir / "t-0").glob("*.log"))

    def medians(samples: list[tuple[float, float]]) -> tuple[float, float, float, float]:
        walls = [wall for wall, _cpu in samples]
        return (
            statistics.median(walls),
            min(walls),
            max(walls),
            statistics.median(cpu for _wall, cpu in samples),
        )

    cat, cat_lo, cat_hi, cat_cpu = medians(cat_times)
    produce, produce_lo, produce_hi, produce_cpu = medians(produce_times)
    consume, consume_lo, consume_hi, consume_cpu = medians(consume_times)
    rate = lines / produce
    cpu_rate = lines / produce_cpu
    print(
        f"{'measurement':<27} {'wall median':>11} {'min-max':>13} {'CPU':>7} "
        f"{'wall ratio':>11}  target / status"
    )
    print("-" * 104)
    rows = [
        ("cat FILE > COPY (baseline)", cat, cat_lo, cat_hi, cat_cpu, "1.0x", "-"),
        (
            "seglogfs produce < FILE",
            produce,
            produce_lo,
            produce_hi,
            produce_cpu,
            f"{produce / cat:.0f}x cat",
            f">= {TARGET_LINES_PER_S:,} lines/s: "
            + ("MET" if rate >= TARGET_LINES_PER_S else "NOT MET"),
        ),
        (
            "seglogfs consume > OUT",
            consume,
            consume_lo,
            consume_hi,
            consume_cpu,
            f"{consume / cat:.0f}x cat",
            "byte-identical to FILE: " + ("MET" if identical else "NOT MET"),
        ),
    ]
    for name, median, lo, hi, cpu, ratio, target in rows:
        print(
            f"{name:<27} {median:>9.2f} s {lo:>5.2f}-{hi:<5.2f} s {cpu:>5.2f} s "
            f"{ratio:>11}  {target}"
        )
    print(
        f"\nproduce: {rate:,.0f} lines/s by wall time, {cpu_rate:,.0f} lines/s per CPU second "
        f"({log_bytes / 1e6:.0f} MB of segments); consume: {lines / consume:,.0f} lines/s"
    )
    print(
        f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, "
        f"Python {sys.version.split()[0]}; wall includes interpreter start and waiting "
        "for a CPU, CPU is the command's user + system time"
    )
    return 0 if rate >= TARGET_LINES_PER_S and identical else 1


if __name__ == "__main__":
    sys.exit(main())

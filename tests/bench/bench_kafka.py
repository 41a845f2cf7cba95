"""Benchmark of the Kafka listener: confluent-kafka producing and consuming 100-byte
records against ``cat`` of the same partition through the mount.

Run from the repository root (root, /dev/fuse)::

    PYTHONPATH=. .venv/bin/python tests/bench/bench_kafka.py --quick   # 2*10^5 records
    PYTHONPATH=. .venv/bin/python tests/bench/bench_kafka.py           # 10^6 records

A ``seglogfs mount --kafka 127.0.0.1:0`` daemon runs in a subprocess on a temporary log
directory. Measured, each once per run (the machine is shared: compare ratios):

- produce: a confluent-kafka ``Producer`` (``linger.ms=20``, ``batch.size`` 1 MiB,
  uncompressed, acks=1) sending N records of 100 bytes to one partition, from the first
  ``produce`` to the end of ``flush``; records/s. The issue's target: >= 500,000/s.
- consume: a confluent-kafka ``Consumer`` (assign from the beginning, no group)
  reading the N records; records/s, and the ratio to ``cat MNT/t/0 > /dev/null`` of
  the same partition (records/s of cat: N / its time). The issue's target: >= 10^6/s.

This is the first slice's benchmark: the issue's 10^7-record consume, the batching
producer's ratio to the engine's own append rate and the raw 1-GB Fetch against
``cat`` of the segment files are still to come.
"""

from __future__ import annotations

import argparse
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

ROOT = Path(__file__).resolve().parents[2]
RECORD = b"x" * 99 + b"\n"  # 100 bytes rendered as "value\n": 99 + newline


def _start(log_dir: Path, mountpoint: Path, log_path: Path) -> tuple[subprocess.Popen[bytes], int]:
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "seglogfs.daemon", str(log_dir), str(mountpoint),
             "--kafka", "127.0.0.1:0"],
            stdout=log, stderr=log, cwd=ROOT,
        )  # fmt: skip
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = re.search(r"kafka: listening on 127\.0\.0\.1:(\d+)", log_path.read_text())
        if found:
            return proc, int(found.group(1))
        time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"no listener: {log_path.read_text()}")


def _produce(bootstrap: str, count: int) -> float:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "batch.size": 1 << 20,
            "acks": 1,
            "queue.buffering.max.messages": 1_000_000,
        }
    )
    value = RECORD[:-1]
    started = time.perf_counter()
    for _ in range(count):
        while True:
            try:
                producer.produce("t", value, partition=0)
                break
            except BufferError:
                producer.poll(0.01)
    assert producer.flush(120) == 0
    return time.perf_counter() - started


def _consume(bootstrap: str, count: int) -> float:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench",
            "enable.auto.commit": False,
            "fetch.max.bytes": 50 << 20,
            "max.partition.fetch.bytes": 8 << 20,
        }
    )
    consumer.assign([TopicPartition("t", 0, 0)])
    got = 0
    started = time.perf_counter()
    while got < count:
        for message in consumer.consume(10000, timeout=5):
            if message.error() is None:
                got += 1
    elapsed = time.perf_counter() - started
    consumer.close()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="2*10^5 records")
    count = 200_000 if parser.parse_args().quick else 1_000_000
    with tempfile.TemporaryDirectory() as tmp:
        log_dir, mountpoint = Path(tmp) / "log", Path(tmp) / "mnt"
        log_dir.mkdir()
        mountpoint.mkdir()
        proc, port = _start(log_dir, mountpoint, Path(tmp) / "daemon.log")
        bootstrap = f"127.0.0.1:{port}"
        try:
            (mountpoint / "t").mkdir()
            produce_s = _produce(bootstrap, count)
            consume_s = _consume(bootstrap, count)
            started = time.perf_counter()
            subprocess.run(
                ["cat", str(mountpoint / "t" / "0")], stdout=subprocess.DEVNULL, check=True
            )
            cat_s = time.perf_counter() - started
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
    print(f"{'measurement':<34} {'value':>22}  target")
    print(
        f"{'produce (confluent, linger 20 ms)':<34} {count / produce_s:>14,.0f} rec/s  >= 500,000"
    )
    print(
        f"{'consume (confluent, assign)':<34} {count / consume_s:>14,.0f} rec/s  >= 1,000,000;"
        f" {cat_s / consume_s:.2f}x cat ({count / cat_s:,.0f} rec/s)"
    )


if __name__ == "__main__":
    main()

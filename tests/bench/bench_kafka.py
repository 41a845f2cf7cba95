"""Benchmark of the Kafka listener: confluent-kafka producing and consuming 100-byte
records, and a raw Fetch of the stored batches, each against its baseline measured in
the same run (issue #24).

Run from the repository root (root, /dev/fuse)::

    PYTHONPATH=. .venv/bin/python tests/bench/bench_kafka.py --quick   # 2*10^5 records
    PYTHONPATH=. .venv/bin/python tests/bench/bench_kafka.py           # 10^6 records
    PYTHONPATH=. .venv/bin/python tests/bench/bench_kafka.py --records 10000000

A ``seglogfs mount --kafka 127.0.0.1:0`` daemon runs in a subprocess on a temporary log
directory. Each measurement runs ``--runs`` times (default 3), its baseline right after
it, and the medians are printed with the load average before and after (the machine
is shared: compare ratios). N records of 100 bytes (``--records``, default 10^6; the
issue's figures are at 10^7, 1.09 GB stored):

- produce vs engine: a confluent-kafka ``Producer`` (``linger.ms=20``, ``batch.size``
  1 MiB, uncompressed, acks=1) sends the N records to one partition of a new topic per
  run, timed from the first ``produce`` to the end of ``flush``; records/s (the issue's
  target: >= 500,000/s). Baseline: the engine's own append rate, in this process, on a
  fresh log directory opened as the daemon opens it (``LogManager.open(...,
  extension=position_index_spec)``): the same N records as ``Log.append_batches`` of
  batches built beforehand with ``build_record_batch``, each holding as many records as
  the producer's stored batches held on average in that run (at 10^7 both roll the
  1-GiB segment once, its ``fsync`` inside the time). Ratio: produce/engine (1.0
  = the wire and the listener cost nothing; below 1 is the engine's rate the listener
  does not reach).
- consume vs cat: a confluent-kafka ``Consumer`` (assign from the beginning, no group,
  ``fetch.queue.backoff.ms=10``: librdkafka's default of 1000 ms paused it a second
  each time its queue filled) reading the N records of the first topic; records/s
  (the issue's target: >= 10^6/s).
  Baseline: ``cat MNT/p0/0 > /dev/null`` of the same partition through the mount,
  records/s = N / its time. Ratio: consume/cat (above 1: the consumer reads the
  records faster than ``cat`` reads them rendered as lines).
- raw Fetch vs cat of the segments: one socket, no Kafka library: Fetch v12 requests
  built with kio (as ``seglogfs.kafka.codec`` and the tests' ``RawClient`` do) read the
  partition's stored batches from offset 0 to the high watermark, ``max_bytes`` and
  ``partition_max_bytes`` 64 MiB (the broker's ``fetch.max.bytes``, 55 MiB, bounds each
  response), each response read into one reused buffer and decoded with kio (which
  copies the records: the client's share, about a third of the time since the listener
  sends the records with ``sendfile``: 200 of 600 ms for 231 MB measured); MB/s (10^6
  bytes) of batch bytes received, connecting included.
  Baseline: ``cat`` of the partition's ``.log`` segment files (in the page cache) to
  ``/dev/null``: the ceiling a zero-copy Fetch could approach. Ratio: fetch/cat (below
  1: the fraction of the ceiling reached).
"""

from __future__ import annotations

import argparse
import io
import os
import re
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer

from seglogfs.kafka.codec import build
from seglogfs.positions import position_index_spec
from storage import LogManager, build_record_batch

ROOT = Path(__file__).resolve().parents[2]
RECORD = b"x" * 99 + b"\n"  # 100 bytes rendered as "value\n": 99 + newline
FETCH_VERSION = 12
FETCH_MAX_BYTES = 64 << 20
# A v2 batch header: base offset (i64), batch length (i32), then at byte 23 the last
# offset delta (i32).
BATCH_HEAD = struct.Struct(">qi")
LAST_OFFSET_DELTA = struct.Struct(">i")
LAST_OFFSET_DELTA_AT = 23


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


def _produce(bootstrap: str, topic: str, count: int) -> float:
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
                producer.produce(topic, value, partition=0)
                break
            except BufferError:
                producer.poll(0.01)
    assert producer.flush(600) == 0
    return time.perf_counter() - started


def _consume(bootstrap: str, topic: str, count: int) -> float:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench",
            "enable.auto.commit": False,
            "fetch.max.bytes": 50 << 20,
            "max.partition.fetch.bytes": 8 << 20,
            # librdkafka's default (1000 ms) stalls the consumer for a second whenever its
            # queue holds queued.min.messages: a client-side pause, not the listener's.
            "fetch.queue.backoff.ms": 10,
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    got = 0
    started = time.perf_counter()
    while got < count:
        for message in consumer.consume(10000, timeout=5):
            if message.error() is None:
                got += 1
    elapsed = time.perf_counter() - started
    consumer.close()
    return elapsed


def _cat(paths: list[Path]) -> float:
    started = time.perf_counter()
    subprocess.run(["cat", *map(str, paths)], stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - started


def _segments(log_dir: Path, topic: str) -> list[Path]:
    return sorted((log_dir / f"{topic}-0").glob("*.log"))


def _batch_count(segments: list[Path]) -> int:
    """The number of batches in the segment files (reads each batch's 12-byte head)."""
    count = 0
    for path in segments:
        size = path.stat().st_size
        with open(path, "rb") as f:
            position = 0
            while position + BATCH_HEAD.size <= size:
                f.seek(position)
                _, length = BATCH_HEAD.unpack(f.read(BATCH_HEAD.size))
                if length <= 0:  # preallocated tail
                    break
                position += BATCH_HEAD.size + length
                count += 1
    return count


def _engine_append(log_dir: Path, count: int, per_batch: int) -> float:
    """Seconds for the engine to append ``count`` records as producer batches of
    ``per_batch`` records (built before the clock starts) to a fresh log."""
    manager = LogManager.open(log_dir, extension=position_index_spec)
    try:
        manager.create_topic("t", 1)
        log = manager.log("t", 0)
        now = int(time.time() * 1000)
        value = RECORD[:-1]
        full = build_record_batch([value] * per_batch, timestamps=now)
        rest = count % per_batch
        batches = [full] * (count // per_batch)
        if rest:
            batches.append(build_record_batch([value] * rest, timestamps=now))
        started = time.perf_counter()
        for batch in batches:
            log.append_batches(batch)
        elapsed = time.perf_counter() - started
        assert log.log_end_offset == count
    finally:
        manager.close()
    return elapsed


class _RawClient:
    """One connection speaking Kafka's framing, requests and responses through kio."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=120)
        self.correlation = 0
        response_cls: type[Any] = load_response_schema(1, FETCH_VERSION)
        self.read_response = entity_reader(response_cls)
        self.head = bytearray(4)
        self.buffer = bytearray()

    def close(self) -> None:
        self.sock.close()

    def fetch(self, topic: str, offset: int) -> tuple[bytes, int]:
        """The records of one Fetch from ``offset`` and the high watermark."""
        self.correlation += 1
        body = build(
            load_request_schema(1, FETCH_VERSION),
            replica_id=-1,
            max_wait=0,
            min_bytes=1,
            max_bytes=FETCH_MAX_BYTES,
            isolation_level=0,
            session_id=0,
            session_epoch=-1,
            topics=[
                {
                    "topic": topic,
                    "partitions": [
                        {
                            "partition": 0,
                            "current_leader_epoch": -1,
                            "fetch_offset": offset,
                            "last_fetched_epoch": -1,
                            "log_start_offset": -1,
                            "partition_max_bytes": FETCH_MAX_BYTES,
                        }
                    ],
                }
            ],
            forgotten_topics_data=[],
            rack_id="",
        )
        out = io.BytesIO()
        out.write(b"\0\0\0\0")
        header_cls = type(body).__header_schema__
        header = header_cls(
            request_api_key=1,
            request_api_version=FETCH_VERSION,
            correlation_id=self.correlation,
            client_id="bench-raw",
        )
        entity_writer(header_cls)(out, header)
        entity_writer(type(body))(out, body)
        frame = out.getbuffer()
        struct.pack_into(">i", frame, 0, len(frame) - 4)
        self.sock.sendall(frame)
        del frame
        self._read_into(memoryview(self.head))
        (size,) = struct.unpack(">i", self.head)
        if size > len(self.buffer):  # one buffer for every response: no fresh 55 MB each
            self.buffer = bytearray(size)
        data = memoryview(self.buffer)[:size]
        self._read_into(data)
        (correlation,) = struct.unpack_from(">i", data)
        assert correlation == self.correlation
        # kio reads read-only buffers only (its records field is a copy: the buffer is
        # reused). Header v1 (flexible): the correlation id, then empty tagged fields.
        response, _ = self.read_response(data.toreadonly(), 5)
        part = response.responses[0].partitions[0]
        assert part.error_code == 0, part.error_code
        return part.records or b"", part.high_watermark

    def _read_into(self, view: memoryview) -> None:
        got = 0
        while got < len(view):
            n = self.sock.recv_into(view[got:])
            if n == 0:
                raise SystemExit("the listener closed the connection")
            got += n


def _next_offset(records: bytes) -> int:
    """The offset after the last batch of a Fetch response's records."""
    position = 0
    last = 0
    while position + BATCH_HEAD.size <= len(records):
        last = position
        _, length = BATCH_HEAD.unpack_from(records, position)
        position += BATCH_HEAD.size + length
    assert position == len(records), "a Fetch response ends inside a batch"
    base, _ = BATCH_HEAD.unpack_from(records, last)
    (delta,) = LAST_OFFSET_DELTA.unpack_from(records, last + LAST_OFFSET_DELTA_AT)
    return int(base + delta + 1)


def _raw_fetch(port: int, topic: str) -> tuple[int, float]:
    """Bytes of batches received and the seconds, fetching the whole partition."""
    started = time.perf_counter()
    client = _RawClient(port)
    try:
        received = 0
        offset = 0
        while True:
            records, high_watermark = client.fetch(topic, offset)
            if offset >= high_watermark:
                break
            received += len(records)
            offset = _next_offset(records)
            if offset >= high_watermark:
                break
    finally:
        client.close()
    return received, time.perf_counter() - started


@dataclass
class _Row:
    name: str
    unit: str
    values: list[float]
    baseline_name: str
    baselines: list[float]
    direction: str
    target: str = ""

    def line(self, fmt: Callable[[float], str]) -> str:
        value, baseline = statistics.median(self.values), statistics.median(self.baselines)
        runs = ", ".join(fmt(v) for v in self.values)
        target = f"  target {self.target}" if self.target else ""
        return (
            f"{self.name}: {fmt(value)} {self.unit} (runs: {runs}){target}\n"
            f"    vs {self.baseline_name}: {fmt(baseline)} {self.unit}"
            f" (runs: {', '.join(fmt(b) for b in self.baselines)})\n"
            f"    ratio of the medians {value / baseline:.2f} ({self.direction})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="2*10^5 records")
    parser.add_argument("--records", type=int, default=1_000_000, help="default 10^6")
    parser.add_argument("--runs", type=int, default=3, help="runs of each measurement")
    args = parser.parse_args()
    count: int = 200_000 if args.quick else args.records
    runs: int = args.runs
    produced: list[float] = []
    appended: list[float] = []
    per_batch: list[int] = []
    consumed: list[float] = []
    cat_mount: list[float] = []
    fetched: list[float] = []
    cat_segments: list[float] = []
    stored = 0
    segments: list[Path] = []
    print(f"{count:,} records of 100 B, {runs} runs; load before: {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as tmp:
        log_dir, mountpoint = Path(tmp) / "log", Path(tmp) / "mnt"
        log_dir.mkdir()
        mountpoint.mkdir()
        proc, port = _start(log_dir, mountpoint, Path(tmp) / "daemon.log")
        bootstrap = f"127.0.0.1:{port}"
        try:
            for run in range(runs):
                topic = f"p{run}"
                (mountpoint / topic).mkdir()
                produced.append(count / _produce(bootstrap, topic, count))
                per_batch.append(round(count / _batch_count(_segments(log_dir, topic))))
                engine_dir = Path(tmp) / f"engine{run}"
                appended.append(count / _engine_append(engine_dir, count, per_batch[-1]))
                shutil.rmtree(engine_dir)
            for _ in range(runs):
                consumed.append(count / _consume(bootstrap, "p0", count))
                cat_mount.append(count / _cat([mountpoint / "p0" / "0"]))
            segments = _segments(log_dir, "p0")
            stored = sum(p.stat().st_size for p in segments)
            for _ in range(runs):
                received, seconds = _raw_fetch(port, "p0")
                assert received == stored, (received, stored)
                fetched.append(received / seconds / 1e6)
                cat_segments.append(stored / _cat(segments) / 1e6)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
    print(f"load after: {os.getloadavg()}")

    def records(v: float) -> str:
        return f"{v:,.0f}"

    def megabytes(v: float) -> str:
        return f"{v:,.0f}"

    rows = [
        _Row(
            "produce (confluent, linger 20 ms, 1 MiB batches)",
            "rec/s",
            produced,
            f"engine append_batches in-process ({statistics.median(per_batch):,.0f}"
            " records/batch, as the producer's)",
            appended,
            "produce/engine: below 1 = the engine's rate the listener does not reach",
            ">= 500,000",
        ),
        _Row(
            "consume (confluent, assign)",
            "rec/s",
            consumed,
            "cat MNT/p0/0 > /dev/null (N / its time)",
            cat_mount,
            "consume/cat: above 1 = faster than cat through the mount",
            ">= 1,000,000",
        ),
    ]
    for row in rows:
        print(row.line(records))
    print(
        _Row(
            f"raw Fetch v{FETCH_VERSION} (socket + kio, {FETCH_MAX_BYTES >> 20} MiB max_bytes,"
            f" {stored / 1e6:,.0f} MB from offset 0)",
            "MB/s",
            fetched,
            f"cat of the {len(segments)} .log segment file(s) > /dev/null",
            cat_segments,
            "fetch/cat: below 1 = the fraction of the zero-copy ceiling reached",
        ).line(megabytes)
    )


if __name__ == "__main__":
    main()

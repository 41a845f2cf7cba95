"""Readers beside a writer that rolls and deletes: threads of one process, and processes.

The daemon serves many reader threads while one writer appends, rolls segments and
applies retention, and other processes read the same files. A reader may only ever see
the documented errors (``OffsetOutOfRangeError``, including ``SegmentDeletedError``),
and every record it gets must be the right one. Each test counts the rolls and
deletions it caused, so it cannot pass without having hit them.

The default run takes a few seconds; ``pytest -m long`` runs the same tests for a
minute each.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from storage import ExtensionIndexSpec, Log, LogConfig, LogManager, OffsetOutOfRangeError
from storage.record.record_batch import RecordBatch

ROOT = Path(__file__).resolve().parents[2]

DURATIONS = [
    pytest.param(3.0, id="3s"),
    pytest.param(60.0, id="60s", marks=pytest.mark.long),
]


def value_of(offset: int) -> bytes:
    return b"value-%08d" % offset


def units_of(batch: RecordBatch) -> int:
    return sum(len(record.value or b"") + 1 for record in batch.records())


SPEC = ExtensionIndexSpec(".stressunits", 64, units_of)


@pytest.mark.parametrize("seconds", DURATIONS)
def test_reader_threads_during_appends_rolls_and_deletions(log_dir: Path, seconds: float) -> None:
    config = LogConfig(
        segment_bytes=3000,
        index_interval_bytes=0,
        retention_bytes=12_000,
        file_delete_delay_ms=0,
    )
    log = Log.open(log_dir / "t-0", config, extension=SPEC)
    stop = threading.Event()
    errors: list[BaseException] = []
    counts = {"reads": 0, "out_of_range": 0, "time_lookups": 0, "unit_lookups": 0}
    counts_lock = threading.Lock()

    def count(key: str) -> None:
        with counts_lock:
            counts[key] += 1

    def reader(seed: int) -> None:
        rng = random.Random(seed)
        try:
            while not stop.is_set():
                start, end = log.log_start_offset, log.log_end_offset
                if end == start:
                    continue
                offset = rng.randrange(start, end)
                try:
                    record = next(log.records(offset))
                    assert record.offset == offset, (record.offset, offset)
                    assert record.value == value_of(offset), record
                    count("reads")
                    found = log.offset_for_timestamp(record.timestamp)
                    # At or before the record, unless retention deleted it meanwhile
                    # (then the answer is the log start offset, Kafka's ListOffsets).
                    assert found is not None
                    assert found <= offset or found <= log.log_start_offset
                    count("time_lookups")
                    batch_offset, units = log.extension_floor(log.extension_end // 2)
                    assert batch_offset >= 0
                    assert units >= 0
                    count("unit_lookups")
                except OffsetOutOfRangeError:
                    count("out_of_range")  # retention passed us: documented
        except BaseException as exc:
            errors.append(exc)
            stop.set()

    threads = [threading.Thread(target=reader, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    rolls = deletions = appends = 0
    deadline = time.monotonic() + seconds
    next_offset = 0
    try:
        while time.monotonic() < deadline and not stop.is_set():
            segments_before = log.number_of_segments
            active_before = log.active_segment.base_offset
            values = [value_of(next_offset + i) for i in range(3)]
            log.append(values, units=sum(len(v) + 1 for v in values))
            next_offset += 3
            appends += 1
            if log.active_segment.base_offset != active_before:
                rolls += 1
            if appends % 20 == 0:
                deletions += log.delete_old_segments()
            assert log.number_of_segments <= segments_before + 1
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
    assert errors == []
    assert not any(thread.is_alive() for thread in threads)
    assert rolls >= 10, rolls
    assert deletions >= 10, deletions
    assert counts["reads"] >= 100, counts
    log._check()
    log.close()


READER_PROCESS = r"""
import json, random, sys, time
from storage import LogManager, OffsetOutOfRangeError
log_dir, seconds, mode = sys.argv[1], float(sys.argv[2]), sys.argv[3]
manager = LogManager.open(log_dir, read_only=True)
print("ready", flush=True)
rng = random.Random(7)
ends, reads, out_of_range, seen = set(), 0, 0, []
deadline = time.monotonic() + seconds
while time.monotonic() < deadline:
    manager.refresh()
    log = manager.log("t", 0)
    ends.add(log.log_end_offset)
    if mode == "follow":
        start = seen[-1] + 1 if seen else 0
        for record in log.records(start):
            assert record.value == b"value-%08d" % record.offset, record
            seen.append(record.offset)
        if len(seen) >= int(sys.argv[4]):
            break
        continue
    start, end = log.log_start_offset, log.log_end_offset
    if end == start:
        continue
    offset = rng.randrange(start, end)
    try:
        record = next(log.records(offset))
        assert record.offset == offset and record.value == b"value-%08d" % offset, record
        reads += 1
    except OffsetOutOfRangeError:
        out_of_range += 1
print(json.dumps({"ends": len(ends), "reads": reads, "out_of_range": out_of_range,
                  "seen": len(seen), "in_order": seen == list(range(len(seen)))}))
"""


def start_reader(log_dir: Path, seconds: float, mode: str, want: int = 0) -> subprocess.Popen[str]:
    reader = subprocess.Popen(
        [sys.executable, "-c", READER_PROCESS, str(log_dir), str(seconds), mode, str(want)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    # The writer starts only once the reader has imported the engine and opened the
    # log directory, so that the reader sees the log grow rather than its final state.
    assert reader.stdout is not None
    assert reader.stdout.readline().strip() == "ready", reader.stderr
    return reader


def finish(reader: subprocess.Popen[str]) -> dict[str, int]:
    out, err = reader.communicate(timeout=120)
    assert reader.returncode == 0, err
    summary: dict[str, int] = json.loads(out)
    return summary


def test_reader_process_follows_a_writer(log_dir: Path) -> None:
    total = 3000
    with LogManager.open(log_dir) as manager:
        manager.create_topic("t", 1, {"segment.bytes": "4000"})
        log = manager.log("t", 0)
        reader = start_reader(log_dir, 60, "follow", total)
        for start in range(0, total, 10):
            log.append([value_of(start + i) for i in range(10)])
            time.sleep(0.002)  # a producer's pace: the reader catches up in between
        summary = finish(reader)
        segments = log.number_of_segments
    assert summary["seen"] == total
    assert summary["in_order"]
    # It followed: it saw the log end at many values on the way, not just the last.
    assert summary["ends"] >= 10, summary
    assert segments > 5


@pytest.mark.parametrize("seconds", DURATIONS)
def test_reader_process_during_appends_rolls_and_deletions(log_dir: Path, seconds: float) -> None:
    with LogManager.open(log_dir) as manager:
        manager.create_topic(
            "t",
            1,
            {
                "segment.bytes": "3000",
                "index.interval.bytes": "0",
                "retention.bytes": "12000",
                "file.delete.delay.ms": "0",
            },
        )
        log = manager.log("t", 0)
        reader = start_reader(log_dir, seconds, "random")
        rolls = deletions = appends = 0
        next_offset = 0
        while reader.poll() is None:
            active = log.active_segment.base_offset
            log.append([value_of(next_offset + i) for i in range(3)])
            next_offset += 3
            appends += 1
            rolls += log.active_segment.base_offset != active
            if appends % 20 == 0:
                deletions += log.delete_old_segments()
            time.sleep(0.0005)
        summary = finish(reader)
    assert rolls >= 10, rolls
    assert deletions >= 10, deletions
    assert summary["reads"] >= 100, summary
    assert summary["ends"] >= 10, summary

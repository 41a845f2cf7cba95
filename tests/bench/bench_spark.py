"""Benchmark of the ``seglog`` Spark data source, beside ``spark.read.text`` in the same run.

Run from the repository root::

    .venv/bin/python tests/bench/bench_spark.py                    # 10^6 and 10^7 records
    .venv/bin/python tests/bench/bench_spark.py --sizes 1000000    # one size
    .venv/bin/python tests/bench/bench_spark.py --quick            # smoke: 10^5, short stream

Method. One SparkSession (``local[*]``, default 2 cores here) for the whole run. For each
size N: a topic ``bench`` of 4 partitions holding N records of 100-byte values (appended
in batches of 1000, as a producer sends them), and the same N values as 100-byte lines
in 4 text files (one per partition). Each query and its baseline run once each to warm
up (Python workers, JIT), then ``--runs`` times each (default 5), in turns (seglog,
text, seglog, text, ...) so that both meet the same load on a shared machine; the
median wall time of each is reported:

- ``count``: ``spark.read.format("seglog")...load().count()``, the whole Kafka schema;
- ``groupBy``: ``...groupBy("partition").count().collect()``, the whole schema;
- ``value count``: ``....schema("value binary").load().count()``, the value column alone;
- ``value groupBy``: ``....schema("value string").load().groupBy(substring(value, 1, 2))
  .count().collect()``, the value alone as a string (the tag of each value: four groups);
- ``partition count``, ``partition groupBy``: ``.schema("partition int")``, a column
  every record of a batch shares, so the records are never decoded (``RecordSpan``);
- baseline ``text count``: ``spark.read.text(files).count()``;
- baseline ``text groupBy``: ``spark.read.text(files).groupBy("_metadata.file_name")
  .count().collect()`` (the file is the text analogue of the partition), for both
  ``groupBy`` and ``partition groupBy``;
- baseline for ``value groupBy``: ``spark.read.text(files).groupBy(substring(value, 1,
  2)).count().collect()``, the same query over the same strings;
- ``floor count``, ``floor groupBy``: ``value count`` and ``value groupBy`` over a
  Python source that decodes nothing (``floor_source``): the same tasks as seglog's
  plan, each yielding one ready-made Arrow batch of 8192 of the same 100-byte values
  again and again. What Spark itself costs a Python source for these rows (its
  planning round trips, a Python worker per task, the Arrow stream and its conversion
  to rows): the ceiling of any Python source, seglog's reader included.

Rows/s = N / median. The ratio is seglog rows/s over text rows/s of the same query
shape: higher is better, 1.0 means as fast as reading plain text files.

Streaming: the shipped word count (``seglogfs.spark.wordcount``) runs with a 1 s
trigger while a producer appends lines of 8 words to ``lines`` at ``--rate`` lines/s
(default 100,000) for ``--seconds`` s. The producer appends in-process through the log
directory's owner (a control server, as the FUSE daemon runs it), and the pipeline's
sink writes ``word-counts`` through that server's socket. Reported: lines produced,
the time from the first append until the query has counted them all, lines/s end to end
(produced / that time) and the lag after the producer stopped; it keeps up when the lag
stays within about two trigger intervals.

Spark's Python workers talk to the JVM over TCP by default, where every task of a
Python source used to wait about 40 ms between its command and its input, which Spark
sends in two small writes, and again for its last write (strace of a worker; 40 ms is
Linux's delayed ACK, which Nagle's algorithm waits for). The source now avoids both
from the worker's side (``seglogfs.spark.worker_socket``; ``SEGLOG_SPARK_QUICKACK=0``
in the environment brings the stalls back, for comparison). ``--unix-socket`` sets
``spark.python.unix.domain.socket.enabled`` (Spark 4.1+), which has no such stalls;
the default run keeps Spark's default, what a user gets without it. The text baseline
runs no Python either way.

The first line names the storage engine build in the driver and in the Python workers
(which read the segment files): an engine source edited since the last build makes both
run pure Python, several times slower. To measure a committed tree while its working
copy is being edited, copy it (``git archive HEAD``), build it in place
(``python setup.py build_ext --inplace``) and run this script from the copy with
``PYTHONPATH`` set to it: the workers inherit it.

Files live in a temporary directory under ``$SEGLOG_BENCH_DIR`` (default: the system
temp directory), removed at the end. Reads come from the page cache (it cannot be
dropped here): CPU figures, not disk figures. The file is named ``bench_*.py`` so that
pytest ignores it.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

PARTITIONS = 4
BATCH_RECORDS = 1000
VALUE_BYTES = 100


def build_data(root: Path, n: int) -> tuple[Path, Path]:
    """A log directory with topic ``bench`` and a directory of text files, same values."""
    from storage import LogManager

    log_dir = root / f"logs-{n}"
    text_dir = root / f"text-{n}"
    text_dir.mkdir()
    per_partition = n // PARTITIONS
    with LogManager.open(log_dir) as manager:
        manager.create_topic("bench", PARTITIONS, {"segment.bytes": str(256 << 20)})
        for p in range(PARTITIONS):
            log = manager.log("bench", p)
            with open(text_dir / f"part-{p}.txt", "wb") as text:
                for start in range(0, per_partition, BATCH_RECORDS):
                    count = min(BATCH_RECORDS, per_partition - start)
                    # 100 bytes: a partition tag, the record number, padding.
                    values = [b"p%d-%012d-" % (p, start + i) + b"x" * 84 for i in range(count)]
                    log.append(values)
                    text.write(b"\n".join(values) + b"\n")
    return log_dir, text_dir


def timed_pair(
    fn: Callable[[], object], base_fn: Callable[[], object], runs: int
) -> tuple[list[float], list[float]]:
    """Wall times of ``runs`` runs of ``fn`` and of ``base_fn``, taken in turns after
    one warm-up run of each (Python workers, JIT, page cache).

    Taking them in turns, not all of one then all of the other, exposes both to the
    same moments of a shared machine's load, so their ratio is the fairer figure.
    """
    fn()
    base_fn()
    times: list[float] = []
    base_times: list[float] = []
    for _ in range(runs):
        for f, out in ((fn, times), (base_fn, base_times)):
            start = time.perf_counter()
            f()
            out.append(time.perf_counter() - start)
    return times, base_times


QUERIES = (
    "count",
    "groupBy",
    "value count",
    "value groupBy",
    "partition count",
    "partition groupBy",
    "floor count",
    "floor groupBy",
)


def floor_source() -> type:
    """The ``seglog-floor`` source (see the module docstring): seglog's plan, no
    decoding. Defined in a function so that Spark's workers get it by value (cloudpickle)
    without importing this file."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    class FloorReader(DataSourceReader):
        def __init__(self, options: dict[str, str], string: bool) -> None:
            self.options = options
            self.string = string

        def partitions(self) -> list[InputPartition]:
            from seglogfs.spark.options import ReadOptions
            from seglogfs.spark.reader import SeglogBatchReader

            return SeglogBatchReader(ReadOptions.parse(self.options, streaming=False)).partitions()

        def read(self, partition: InputPartition) -> Any:
            import numpy as np
            import pyarrow as pa

            from seglogfs.spark.reader import OffsetRange, OffsetRanges

            rows = 8192
            ranges: tuple[OffsetRange, ...] = (
                partition.ranges if isinstance(partition, OffsetRanges) else (partition,)  # type: ignore[assignment]
            )
            for r in ranges:
                data = b"".join(b"p%d-%012d-" % (r.partition, i) + b"x" * 84 for i in range(rows))
                ends = np.arange(rows + 1, dtype=np.int32) * np.int32(VALUE_BYTES)
                type_ = pa.string() if self.string else pa.binary()
                values = pa.Array.from_buffers(
                    type_, rows, [None, pa.py_buffer(ends), pa.py_buffer(data)]
                )
                batch = pa.RecordBatch.from_arrays([values], names=["value"])
                for start in range(r.start, r.end, rows):
                    yield batch if r.end - start >= rows else batch.slice(0, r.end - start)

    class FloorSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "seglog-floor"

        def schema(self) -> str:
            return "value binary"

        def reader(self, schema: Any) -> DataSourceReader:
            return FloorReader(dict(self.options), schema.fields[0].dataType.typeName() == "string")

    return FloorSource


def bench_batch(
    spark: Any, root: Path, n: int, runs: int, queries: Sequence[str] = QUERIES
) -> list[tuple[str, str]]:
    from pyspark.sql import functions as F

    log_dir, text_dir = build_data(root, n)

    def seglog(schema: str | None = None) -> Callable[[], Any]:
        """The seglog DataFrame, loaded afresh by each timed query (``load`` is a round
        trip to a Python worker, part of a query's cost)."""
        # A reader per query: DataFrameReader.schema() changes the reader it is called on.
        reader = spark.read.format("seglog").option("subscribe", "bench")
        if schema is not None:
            reader = reader.schema(schema)
        return lambda: reader.load(str(log_dir))

    def floor(schema: str) -> Callable[[], Any]:
        reader = spark.read.format("seglog-floor").option("subscribe", "bench").schema(schema)
        return lambda: reader.load(str(log_dir))

    text = spark.read.text(str(text_dir))
    per_group = [n // PARTITIONS] * PARTITIONS
    # The first two bytes of a value are its partition's tag (p0..p3): four groups, as
    # many as partitions and files.
    tag = F.substring("value", 1, 2).alias("tag")

    def counted(df: Callable[[], Any]) -> Callable[[], None]:
        def count() -> None:
            assert df().count() == n

        return count

    def grouped(df: Callable[[], Any], *by: Any) -> Callable[[], None]:
        def group() -> None:
            rows = df().groupBy(*by).count().collect()
            assert sorted(r["count"] for r in rows) == per_group

        return group

    text_count = counted(lambda: text)
    text_by_file = grouped(lambda: text.select(F.col("_metadata.file_name").alias("f")), "f")
    pairs = {
        "count": (counted(seglog()), text_count),
        "groupBy": (grouped(seglog(), "partition"), text_by_file),
        "value count": (counted(seglog("value binary")), text_count),
        "value groupBy": (grouped(seglog("value string"), tag), grouped(lambda: text, tag)),
        "partition count": (counted(seglog("partition int")), text_count),
        "partition groupBy": (grouped(seglog("partition int"), "partition"), text_by_file),
        "floor count": (counted(floor("value binary")), text_count),
        "floor groupBy": (grouped(floor("value string"), tag), grouped(lambda: text, tag)),
    }
    lines = []
    for name in queries:
        fn, base_fn = pairs[name]
        times, base_times = timed_pair(fn, base_fn, runs)
        median, base = statistics.median(times), statistics.median(base_times)
        rate, base_rate = n / median, n / base
        print(
            f"N={n:>10,} {name:<17} seglog {rate:>12,.0f} rows/s (median {median:.2f} s of "
            f"{', '.join(f'{t:.2f}' for t in times)}); text {base_rate:>12,.0f} rows/s "
            f"(median {base:.2f} s of {', '.join(f'{t:.2f}' for t in base_times)}); "
            f"ratio seglog/text {rate / base_rate:.2f} (higher is better); load average "
            f"{os.getloadavg()[0]:.2f}",
            flush=True,
        )
        lines.append((f"{name} N={n:,}", f"{rate:,.0f} rows/s, {rate / base_rate:.2f}x text"))
    shutil.rmtree(log_dir)
    shutil.rmtree(text_dir)
    return lines


def bench_stream(spark: Any, root: Path, rate: int, seconds: float) -> list[tuple[str, str]]:
    import trio

    from seglogfs.control.server import serve
    from seglogfs.spark import wordcount
    from storage import LogManager

    log_dir = root / "stream-logs"
    checkpoint = root / "stream-checkpoint"
    with LogManager.open(log_dir) as manager:
        manager.create_topic(wordcount.SOURCE_TOPIC, 2)
        manager.create_topic(wordcount.SINK_TOPIC, 2)
    owner = LogManager.open(log_dir)
    started = threading.Event()
    handle: list[Any] = []

    async def serve_control() -> None:
        with trio.CancelScope() as scope:
            handle.append((scope, trio.lowlevel.current_trio_token()))
            async with trio.open_nursery() as nursery:
                await nursery.start(serve, log_dir, owner, trio.to_thread.run_sync)
                started.set()

    server = threading.Thread(target=trio.run, args=(serve_control,), daemon=True)
    server.start()
    assert started.wait(10)
    vocabulary = [f"word{i}" for i in range(1000)]
    rng = random.Random(1)
    pool = [
        [" ".join(rng.choices(vocabulary, k=8)).encode() for _ in range(rate // 10)]
        for _ in range(8)
    ]
    produced = 0
    query = wordcount.start(spark, str(log_dir), str(checkpoint), trigger_seconds=1.0)
    try:
        lines_log = owner.log(wordcount.SOURCE_TOPIC, 0)
        lines_log1 = owner.log(wordcount.SOURCE_TOPIC, 1)
        # Warm-up (Python workers, code generation, state store) outside the timing.
        lines_log.append(pool[0])
        warm_up = len(pool[0])
        query.processAllAvailable()
        warm_batches = len(query.recentProgress)
        first = time.perf_counter()
        tick = 0
        while time.perf_counter() - first < seconds:
            chunk = pool[tick % len(pool)]
            (lines_log if tick % 2 else lines_log1).append(chunk)
            produced += len(chunk)
            tick += 1
            pause = first + tick * 0.1 - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
        stopped = time.perf_counter()
        query.processAllAvailable()
        done = time.perf_counter()
        timed_batches = [p for p in query.recentProgress[warm_batches:] if p["numInputRows"]]
        if os.environ.get("SEGLOG_BENCH_VERBOSE"):
            for progress in timed_batches:
                print(progress["batchId"], progress["numInputRows"], progress["durationMs"])
    finally:
        query.stop()
        scope, token = handle[0]
        trio.from_thread.run_sync(scope.cancel, trio_token=token)
        server.join(10)
        owner.close()
    with LogManager.open(log_dir, read_only=True) as manager:
        total: dict[bytes, int] = {}
        for p in range(2):
            for record in manager.log(wordcount.SINK_TOPIC, p).records(0):
                total[record.key or b""] = int(record.value or b"0")
    assert sum(total.values()) == (warm_up + produced) * 8, "every word is counted once"
    elapsed = done - first
    produce_rate = produced / (stopped - first)
    batch_rates = sorted(
        p["numInputRows"] / (p["durationMs"]["triggerExecution"] / 1000) for p in timed_batches
    )
    print(
        f"stream word count: {produced:,} lines produced at {produce_rate:,.0f} lines/s for "
        f"{stopped - first:.1f} s after a warm-up batch; all counted {elapsed:.1f} s after the "
        f"first append: {produced / elapsed:,.0f} lines/s end to end; lag after the producer "
        f"stopped {done - stopped:.1f} s (trigger 1 s; smaller is better); "
        f"{len(timed_batches)} micro-batches, median {statistics.median(batch_rates):,.0f} "
        "lines/s each (rows / trigger execution time)",
        flush=True,
    )
    return [
        ("stream word count", f"{produced / elapsed:,.0f} lines/s end to end"),
        ("stream lag at the end", f"{done - stopped:.1f} s at {produce_rate:,.0f} lines/s"),
        ("stream micro-batch", f"median {statistics.median(batch_rates):,.0f} lines/s"),
    ]


def engine_build() -> str:
    """Which build of the storage engine this process runs, and from where."""
    import storage

    where = Path(storage.__file__).parent.parent
    build = "compiled (mypyc)" if storage.compiled else f"pure Python ({storage.build_info})"
    return f"{build} from {where}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[10**6, 10**7])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--rate", type=int, default=100_000, help="lines/s produced")
    parser.add_argument("--seconds", type=float, default=20.0, help="production time")
    parser.add_argument("--no-stream", action="store_true")
    parser.add_argument(
        "--queries", nargs="*", choices=QUERIES, default=QUERIES, help="batch queries to run"
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: 10^5, 5 s stream")
    parser.add_argument(
        "--unix-socket",
        action="store_true",
        help="Python workers over Unix sockets (spark.python.unix.domain.socket.enabled)",
    )
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.runs, args.seconds = [10**5], 1, 5.0

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from seglogfs.spark import register

    spark = (
        SparkSession.builder.master("local[*]")
        .appName("seglog bench")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "2g")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.python.unix.domain.socket.enabled", str(args.unix_socket).lower())
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    spark.dataSource.register(floor_source())
    # The engine's decoding is most of a read's CPU: say which build ran, in the driver
    # and in the Python workers, which read the segment files (an edited engine source
    # makes both fall back to pure Python, several times slower).
    engine = engine_build()
    worker = spark.sparkContext.parallelize([0], 1).map(lambda _: engine_build()).first()
    if worker != engine:
        engine = f"{engine} in the driver, {worker} in the Python workers"
    print(
        f"Spark {spark.version}, {spark.sparkContext.defaultParallelism} cores "
        f"(local[*]), Python {sys.version.split()[0]}, storage engine {engine}; Python "
        f"workers over {'Unix' if args.unix_socket else 'TCP (Spark default)'} sockets; median of "
        f"{args.runs} runs after a warm-up; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    table: list[tuple[str, str]] = []
    root = Path(tempfile.mkdtemp(prefix="bench-spark-", dir=os.environ.get("SEGLOG_BENCH_DIR")))
    try:
        for n in args.sizes:
            table += bench_batch(spark, root, n, args.runs, args.queries)
        if not args.no_stream:
            table += bench_stream(spark, root, args.rate, args.seconds)
    finally:
        spark.stop()
        shutil.rmtree(root, ignore_errors=True)
    width = max(len(name) for name, _ in table)
    print(
        f"\nend {time.strftime('%H:%M UTC', time.gmtime())}, load average {os.getloadavg()[0]:.2f}"
    )
    for name, figure in table:
        print(f"{name:<{width}}  {figure}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

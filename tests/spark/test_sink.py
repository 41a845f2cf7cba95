"""The sink: batch and streaming writes, partitioning, errors, and no duplicate batches."""

from __future__ import annotations

import contextlib
import shutil
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import trio
from pyspark.errors import PySparkException
from pyspark.sql.types import StructType

from seglogfs.control.server import serve
from seglogfs.positions import position_index_spec
from seglogfs.spark import wordcount
from seglogfs.spark import writer as sink
from seglogfs.spark.errors import SinkError
from seglogfs.spark.writer import SPARK_DIR, SeglogStreamWriter, SinkState
from storage import LogManager, partition_for_key

Stored = tuple[str, int, bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...]]

SINK_SCHEMA = (
    "key string, value binary, partition int, headers array<struct<key: string, value: binary>>"
)


def _stored(log_dir: Path, topic: str) -> list[Stored]:
    with LogManager.open(log_dir, read_only=True) as manager:
        return [
            (topic, p, r.key, r.value, tuple(r.headers))
            for p in range(manager.topic(topic).partitions)
            for r in manager.log(topic, p).records(0)
        ]


def _create(log_dir: Path, *topics: tuple[str, int]) -> None:
    with LogManager.open(log_dir) as manager:
        for name, partitions in topics:
            manager.create_topic(name, partitions)


def _staged_files(log_dir: Path) -> list[Path]:
    return [p for p in (log_dir / SPARK_DIR / "staging").rglob("*") if p.is_file()]


def test_batch_sink_round_trips(spark: Any, tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    _create(log_dir, ("out", 3))
    rows: list[tuple[Any, ...]] = []
    rows += [(f"user-{i}", b"keyed %d" % i, None, None) for i in range(40)]
    rows += [("pinned", b"to partition 2", 2, [("trace", b"abc"), ("empty", None)])]
    rows += [(None, b"keyless %d" % i, None, None) for i in range(30)]
    rows += [("tombstone", None, None, None)]
    df = spark.createDataFrame(rows, SINK_SCHEMA).repartition(2)
    df.write.format("seglog").mode("append").option("topic", "out").save(str(log_dir))

    stored = _stored(log_dir, "out")
    assert Counter((k, v, h) for _, _, k, v, h in stored) == Counter(
        (None if k is None else k.encode(), v, tuple(h or ())) for k, v, _, h in rows
    )
    for _, partition, key, _value, _ in stored:
        if key == b"pinned":
            assert partition == 2
        elif key is not None:
            assert partition == partition_for_key(key, 3), key  # Kafka's producer's choice
    assert len({p for _, p, k, _, _ in stored if k is None}) >= 1
    assert _staged_files(log_dir) == []
    # The sink kept the file system's position index: each partition file's size is
    # the rendered bytes of its records (value + newline in a lines topic).
    with LogManager.open(log_dir, read_only=True, extension=position_index_spec) as manager:
        for p in range(3):
            assert list((log_dir / f"out-{p}").glob("*.seglogpos"))
            rendered = sum(len(v or b"") + 1 for _, q, _, v, _ in stored if q == p)
            assert manager.log("out", p).extension_end == rendered

    # And back through the source: the same records.
    back = spark.read.format("seglog").option("subscribe", "out").option("includeHeaders", "true")
    again = Counter(
        (r.key, r.value, tuple((h.key, h.value) for h in r.headers or ()))
        for r in back.load(str(log_dir)).collect()
    )
    assert again == Counter((k, v, h) for _, _, k, v, h in stored)


def test_sink_routes_by_topic_column_and_explains_mistakes(spark: Any, tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    _create(log_dir, ("left", 1), ("right", 2))
    df = spark.createDataFrame(
        [("left", "a"), ("right", "b"), ("right", "c")], "topic string, value string"
    )
    df.write.format("seglog").mode("append").save(str(log_dir))
    assert [v for *_, v, _ in _stored(log_dir, "left")] == [b"a"]
    assert sorted(v or b"" for *_, v, _ in _stored(log_dir, "right")) == [b"b", b"c"]

    def write(frame: Any, mode: str = "append", **options: str) -> None:
        writer = frame.write.format("seglog").mode(mode)
        for name, value in options.items():
            writer = writer.option(name, value)
        writer.save(str(log_dir))

    with pytest.raises(PySparkException, match="append-only"):
        write(df, mode="overwrite")
    with pytest.raises(PySparkException, match="topic 'nowhere' does not exist"):
        write(df, topic="nowhere", **{"auto.create.topics.enable": "false"})
    with pytest.raises(PySparkException, match="needs a value column"):
        write(spark.createDataFrame([("x",)], "key string"), topic="left")
    # Nothing was appended by the refused writes, and nothing is left staged.
    assert len(_stored(log_dir, "left")) == 1
    assert _staged_files(log_dir) == []


def test_sink_refuses_a_locked_directory_without_a_daemon(spark: Any, tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    _create(log_dir, ("t", 1))
    df = spark.createDataFrame([("v",)], "value string")
    with LogManager.open(log_dir) as other_writer:
        other_writer.log("t", 0).append([b"already there"])
        with pytest.raises(PySparkException, match="locked by another writer process"):
            df.write.format("seglog").mode("append").option("topic", "t").save(str(log_dir))
    assert [v for *_, v, _ in _stored(log_dir, "t")] == [b"already there"]


@contextlib.contextmanager
def _daemon(log_dir: Path) -> Iterator[LogManager]:
    """A real control server owning ``log_dir`` (what the FUSE daemon runs), in a thread."""
    manager = LogManager.open(log_dir)
    started = threading.Event()
    stop: list[Any] = []

    async def main() -> None:
        with trio.CancelScope() as scope:
            stop.append((scope, trio.lowlevel.current_trio_token()))
            async with trio.open_nursery() as nursery:
                await nursery.start(serve, log_dir, manager, trio.to_thread.run_sync)
                started.set()

    thread = threading.Thread(target=trio.run, args=(main,), daemon=True)
    thread.start()
    try:
        assert started.wait(10)
        yield manager
    finally:
        scope, token = stop[0]
        trio.from_thread.run_sync(scope.cancel, trio_token=token)
        thread.join(10)
        manager.close()


def test_sink_writes_through_the_daemon_that_owns_the_directory(spark: Any, tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    _create(log_dir, ("t", 2))
    df = spark.createDataFrame(
        [(f"k{i}", f"v{i}") for i in range(20)], "key string, value string"
    ).coalesce(1)
    with _daemon(log_dir) as daemon_manager:
        # The daemon holds the writer lock: a direct write could not happen.
        df.write.format("seglog").mode("append").option("topic", "t").save(str(log_dir))
        written = sorted(
            (p, r.key, r.value) for p in range(2) for r in daemon_manager.log("t", p).records(0)
        )
    assert written == sorted(
        (partition_for_key(b"k%d" % i, 2), b"k%d" % i, b"v%d" % i) for i in range(20)
    )


def test_pipeline_topics_are_created_through_the_daemon(tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    _create(log_dir, (wordcount.SOURCE_TOPIC, 3))
    with _daemon(log_dir) as daemon_manager:
        wordcount.ensure_topics(log_dir, partitions=2)
        assert daemon_manager.topics() == [wordcount.SOURCE_TOPIC, wordcount.SINK_TOPIC]
        assert daemon_manager.topic(wordcount.SOURCE_TOPIC).partitions == 3  # kept
        assert daemon_manager.topic(wordcount.SINK_TOPIC).partitions == 2
    wordcount.ensure_topics(log_dir)  # and without a daemon: nothing to do
    with LogManager.open(log_dir, read_only=True) as manager:
        assert manager.topics() == [wordcount.SOURCE_TOPIC, wordcount.SINK_TOPIC]


def test_streaming_sink_does_not_append_a_replayed_batch_twice(spark: Any, tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    checkpoint = tmp_path / "checkpoint"
    _create(log_dir, ("src", 2), ("dst", 2))
    with LogManager.open(log_dir) as manager:
        for p in range(2):
            manager.log("src", p).append([b"record %d-%d" % (p, i) for i in range(12)])

    def run() -> Any:
        query = (
            spark.readStream.format("seglog")
            .option("subscribe", "src")
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", "12")
            .load(str(log_dir))
            .select("value")
            .writeStream.format("seglog")
            .option("topic", "dst")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start(str(log_dir))
        )
        query.awaitTermination(120)
        return query

    first = run()
    batches = [p["batchId"] for p in first.recentProgress if p["numInputRows"]]
    assert len(batches) >= 2
    assert sorted(v or b"" for *_, v, _ in _stored(log_dir, "dst")) == sorted(
        b"record %d-%d" % (p, i) for p in range(2) for i in range(12)
    )
    state = SinkState(log_dir, str(checkpoint))
    assert state.committed == batches[-1]

    # Spark crashed after the sink committed the last batch but before its own commit
    # log entry: the restarted query replays that batch with the same id.
    (checkpoint / "commits" / str(batches[-1])).unlink()
    (checkpoint / "commits" / f".{batches[-1]}.crc").unlink(missing_ok=True)
    second = run()
    replayed = [p for p in second.recentProgress if p["batchId"] == batches[-1]]
    assert replayed
    assert replayed[0]["numInputRows"] > 0
    stored = [v for *_, v, _ in _stored(log_dir, "dst")]
    assert len(stored) == 24
    assert Counter(stored).most_common(1)[0][1] == 1
    assert _staged_files(log_dir) == []

    # A new query in a recreated checkpoint directory starts at batch 0 again: its
    # batches are new, not replays.
    shutil.rmtree(checkpoint)
    run()
    assert len(_stored(log_dir, "dst")) == 48


def _stage(writer: SeglogStreamWriter, values: list[bytes], keys: list[bytes | None]) -> Any:
    batch = pa.RecordBatch.from_pydict(
        {"key": pa.array(keys, pa.binary()), "value": pa.array(values, pa.binary())}
    )
    return writer.write(iter([batch]))


def test_commit_resumes_after_a_crash_mid_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log_dir = tmp_path / "logs"
    _create(log_dir, ("t", 3))
    checkpoint = str(tmp_path / "checkpoint")
    values = [b"v%d" % i for i in range(30)]
    keys: list[bytes | None] = [b"k%d" % i if i % 3 else None for i in range(30)]
    first = SeglogStreamWriter(str(log_dir), "t", checkpoint)
    message = _stage(first, values, keys)

    # Crash after the first partition's rows are in the log (some of the second's too).
    real_append = sink._Target.append
    calls: list[tuple[str, int]] = []

    def crashing_append(self: Any, tp: tuple[str, int], rows: Any) -> None:
        calls.append(tp)
        if len(calls) == 2:
            real_append(self, tp, rows[:2])
            raise OSError("simulated crash")
        real_append(self, tp, rows)

    monkeypatch.setattr(sink._Target, "append", crashing_append)
    with pytest.raises(OSError, match="simulated crash"):
        first.commit([message], 0)
    monkeypatch.setattr(sink._Target, "append", real_append)
    state = SinkState(log_dir, checkpoint)
    assert state.committed == -1
    assert state.pending is not None
    partial = _stored(log_dir, "t")
    assert 2 < len(partial) < 30

    # The restarted query replays batch 0; its keyless rows would be partitioned
    # differently (another writer, other staged files): the recorded files win.
    second = SeglogStreamWriter(str(log_dir), "t", checkpoint)
    replay = _stage(second, values, keys)
    second.commit([replay], 0)
    stored = _stored(log_dir, "t")
    assert sorted(v or b"" for *_, v, _ in stored) == sorted(values)
    assert {(p, k) for _, p, k, _, _ in partial} <= {(p, k) for _, p, k, _, _ in stored}
    assert SinkState(log_dir, checkpoint).committed == 0
    assert _staged_files(log_dir) == []

    # A crash after the appends but before the batch was recorded as committed.
    third = SeglogStreamWriter(str(log_dir), "t", checkpoint)
    more = [b"w%d" % i for i in range(10)]
    message = _stage(third, more, [None] * 10)
    real_save = SinkState.save
    saves: list[int] = []

    def crashing_save(self: SinkState) -> None:
        saves.append(1)
        if len(saves) == 2:
            raise OSError("simulated crash")
        real_save(self)

    monkeypatch.setattr(SinkState, "save", crashing_save)
    with pytest.raises(OSError, match="simulated crash"):
        third.commit([message], 1)
    monkeypatch.setattr(SinkState, "save", real_save)
    third.commit([_stage(third, more, [None] * 10)], 1)
    assert sorted(v or b"" for *_, v, _ in _stored(log_dir, "t")) == sorted(values + more)
    # And an ordinary replay of a committed batch appends nothing.
    third.commit([_stage(third, more, [None] * 10)], 1)
    assert len(_stored(log_dir, "t")) == 40
    assert _staged_files(log_dir) == []


def test_checkpoint_spellings_share_one_sink_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    keys = {
        SeglogStreamWriter(str(tmp_path), "t", spelling).checkpoint
        for spelling in ("ck", f"{tmp_path}/ck", f"{tmp_path}/ck/", f"file:{tmp_path}/ck")
    }
    assert keys == {str(tmp_path / "ck")}
    assert SeglogStreamWriter(str(tmp_path), "t", "hdfs://nn/ck/").checkpoint == "hdfs://nn/ck"


def test_sink_schema_checks() -> None:
    check = sink.check_sink_schema
    check(_schema("value binary"), "t")
    with pytest.raises(SinkError, match="column key must be binary or string"):
        check(_schema("key int, value binary"), "t")
    with pytest.raises(SinkError, match="give the topic"):
        check(_schema("value binary"), None)
    with pytest.raises(SinkError, match="column partition must be int"):
        check(_schema("value binary, partition bigint"), "t")


def _schema(ddl: str) -> StructType:
    from pyspark.sql.types import BinaryType, IntegerType, LongType, StringType, StructField

    types = {
        "binary": BinaryType(),
        "int": IntegerType(),
        "bigint": LongType(),
        "string": StringType(),
    }
    fields = []
    for part in ddl.split(","):
        name, kind = part.split()
        fields.append(StructField(name, types[kind]))
    return StructType(fields)


def test_batch_writes_with_a_transaction_version_are_idempotent(spark: Any, tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    _create(log_dir, ("t", 1))
    df = spark.createDataFrame([("a",), ("b",)], "value string")

    def write(version: int) -> None:
        writer = df.write.format("seglog").mode("append").option("topic", "t")
        writer = writer.option("txnAppId", "job-1").option("txnVersion", str(version))
        writer.save(str(log_dir))

    write(3)
    write(3)  # a retried batch: already committed
    write(2)  # an older one: also already covered
    assert [v for *_, v, _ in _stored(log_dir, "t")] == [b"a", b"b"]
    write(4)
    assert [v for *_, v, _ in _stored(log_dir, "t")] == [b"a", b"b", b"a", b"b"]
    assert SinkState(log_dir, "job-1").committed == 4
    with pytest.raises(PySparkException, match="give both or neither"):
        df.write.format("seglog").mode("append").option("topic", "t").option(
            "txnVersion", "5"
        ).save(str(log_dir))

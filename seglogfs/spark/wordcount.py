"""The shipped streaming pipeline: word counts from topic ``lines`` into ``word-counts``.

Run it with one command (it creates both topics when missing)::

    python -m seglogfs.spark.wordcount LOGDIR CHECKPOINT            # runs until Ctrl-C
    python -m seglogfs.spark.wordcount LOGDIR CHECKPOINT --available-now

It is the classic Kafka + Spark Streaming word count with the offsets kept by Spark:
every line of ``lines`` is split on white space, the words are counted in Spark's
state (in ``CHECKPOINT``), and every micro-batch appends the words whose count changed
to ``word-counts`` as ``key=word, value=count`` (ASCII digits), partitioned by word
as Kafka's producer would. ``word-counts`` is created with a tab as its key separator,
so ``cat MNT/word-counts/0`` and ``seglogfs consume word-counts`` show ``word<TAB>count``
lines (words never hold a tab: lines are split on white space). The latest record of
a key is its count (a changelog, which ``cleanup.policy=compact`` will suit once the
engine compacts). Restarted with the same checkpoint it continues where it stopped: no
line is counted twice and no count is appended twice.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from storage import LogDirLockedError, LogManager, StorageError

SOURCE_TOPIC = "lines"
SINK_TOPIC = "word-counts"
SINK_KEY_SEPARATOR = "\t"
"""How ``word-counts`` renders its records: ``word<TAB>count``, not the bare counts."""


def ensure_topics(log_dir: Path, partitions: int = 1) -> None:
    """Create ``lines`` and ``word-counts`` when missing, through the daemon if one
    owns the directory.

    Raises:
        LogDirLockedError: another process writes the directory and no daemon answers.
        StorageError: the directory cannot be written.
        ControlError: the daemon refused.
    """
    from seglogfs.control import ControlError, daemon_socket, request

    # (name, config overrides, key separator): the counts' keys are the words.
    specs: list[tuple[str, dict[str, str], str | None]] = [
        (SOURCE_TOPIC, {}, None),
        (SINK_TOPIC, {}, SINK_KEY_SEPARATOR),
    ]
    if daemon_socket(log_dir) is None:
        try:
            with LogManager.open(log_dir) as manager:
                for name, config, separator in specs:
                    if name not in manager.topics():
                        manager.create_topic(name, partitions, config, key_separator=separator)
            return
        except LogDirLockedError:
            if daemon_socket(log_dir) is None:  # not a daemon that just started
                raise
    existing = request(log_dir, "list_topics")
    for name, config, separator in specs:
        if isinstance(existing, list) and name in existing:
            continue
        try:
            request(
                log_dir, "create_topic", name=name, partitions=partitions, config=config,
                format="lines", key_separator=separator,
            )  # fmt: skip
        except ControlError as exc:
            if exc.kind != "TopicExistsError":  # created meanwhile: fine
                raise


def word_counts(spark: Any, log_dir: str, *, max_offsets_per_trigger: int | None = None) -> Any:
    """The streaming DataFrame of (key=word, value=count) for the sink, update mode."""
    from pyspark.sql import functions as F

    # The lines' values alone, as strings (the value bytes under Spark's string type,
    # as cast(value as string) gives them): Spark converts every column a Python
    # source yields into its rows, and counting words needs no other.
    reader = (
        spark.readStream.format("seglog")
        .option("subscribe", SOURCE_TOPIC)
        .option("startingOffsets", "earliest")
        .schema("value string")
    )
    if max_offsets_per_trigger is not None:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
    lines = reader.load(log_dir)
    words = lines.select(F.explode(F.split("value", r"\s+")).alias("word")).where(
        F.col("word") != ""
    )
    counts = words.groupBy("word").count()
    return counts.select(
        F.col("word").cast("binary").alias("key"),
        F.col("count").cast("string").cast("binary").alias("value"),
    )


def start(
    spark: Any,
    log_dir: str,
    checkpoint: str,
    *,
    available_now: bool = False,
    trigger_seconds: float = 1.0,
    max_offsets_per_trigger: int | None = None,
) -> Any:
    """Start the pipeline; return the ``StreamingQuery``.

    Update mode reaches a Python sink only through ``foreachBatch``. A micro-batch's
    counts are few (one row per word it saw), so they are collected to the driver as
    Arrow and appended from there (``append_exactly_once``: no writer tasks), under the
    checkpoint as ``txnAppId`` and the batch id as ``txnVersion``, so a micro-batch
    Spark replays after a failure is not appended twice.
    """
    from seglogfs.spark import register
    from seglogfs.spark.writer import append_exactly_once

    register(spark)
    app_id = str(Path(checkpoint).resolve())

    def write_batch(batch: Any, batch_id: int) -> None:
        append_exactly_once(
            log_dir, batch.toArrow(), topic=SINK_TOPIC, app_id=app_id, version=batch_id
        )

    writer = (
        word_counts(spark, log_dir, max_offsets_per_trigger=max_offsets_per_trigger)
        .writeStream.outputMode("update")
        .foreachBatch(write_batch)
        .option("checkpointLocation", checkpoint)
    )
    if available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{trigger_seconds} seconds")
    return writer.start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m seglogfs.spark.wordcount",
        description=f"Streaming word count from topic {SOURCE_TOPIC!r} into {SINK_TOPIC!r}.",
    )
    parser.add_argument("log_dir", type=Path, help="the seglog log directory")
    parser.add_argument("checkpoint", help="Spark checkpoint directory (offsets and counts)")
    parser.add_argument(
        "--available-now", action="store_true", help="process what is there, then exit"
    )
    parser.add_argument("--trigger-seconds", type=float, default=1.0, help="micro-batch interval")
    parser.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    args = parser.parse_args(argv)

    # Local Spark runs its Python workers with PYSPARK_PYTHON (default: "python3" on
    # the PATH, which may lack seglogfs): this interpreter has it.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.errors import PySparkException
    from pyspark.sql import SparkSession

    from seglogfs.control import ControlError
    from seglogfs.spark import WorkerPythonError

    try:
        ensure_topics(args.log_dir)
    except (StorageError, ControlError) as exc:
        print(f"word count: cannot create the topics in {args.log_dir}: {exc}", file=sys.stderr)
        return 1
    spark = (
        SparkSession.builder.master(args.master)
        .appName("seglog word count")
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    try:
        query = start(
            spark, str(args.log_dir.resolve()), args.checkpoint,
            available_now=args.available_now, trigger_seconds=args.trigger_seconds,
        )  # fmt: skip
    except WorkerPythonError as exc:  # a PYSPARK_PYTHON without pyarrow: one line
        print(f"word count: {exc}", file=sys.stderr)
        spark.stop()
        return 1
    try:
        query.awaitTermination()
    except KeyboardInterrupt:
        query.stop()
    except PySparkException as exc:
        print(f"word count failed: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 1
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The shipped batch example: a topic (all partitions, earliest to latest) to Parquet.

    python -m seglogfs.spark.to_parquet LOGDIR TOPIC OUTPUT_DIR
    python -m seglogfs.spark.to_parquet LOGDIR TOPIC OUTPUT_DIR --columns value,timestamp

Writes the Kafka source's columns (with headers), partitioned by ``partition``; with
``--columns``, only those (and ``partition``), which are then the only ones read.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def topic_to_parquet(
    spark: Any, log_dir: str, topic: str, output: str, columns: Sequence[str] | None = None
) -> int:
    """Copy ``topic`` into Parquet files under ``output``; return the row count.

    ``columns``: the Kafka columns to copy (default: all of them, with ``headers``);
    ``partition`` is added when missing, as the files are partitioned by it. The read
    is then a projection (``.schema(...)``): the other columns are never built.

    Raises:
        SchemaError: a column the Kafka schema lacks, or one given twice.
    """
    from seglogfs.spark import register
    from seglogfs.spark.arrow import kafka_columns

    register(spark)
    reader = spark.read.format("seglog").option("subscribe", topic).option("includeHeaders", "true")
    if columns is not None:
        names = [*columns, *(["partition"] if "partition" not in columns else [])]
        reader = reader.schema(kafka_columns(names, include_headers=True))
    reader.load(log_dir).write.mode("overwrite").partitionBy("partition").parquet(output)
    return int(spark.read.parquet(output).count())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m seglogfs.spark.to_parquet",
        description="Read a seglog topic into Parquet files.",
    )
    parser.add_argument("log_dir", type=Path)
    parser.add_argument("topic")
    parser.add_argument("output")
    parser.add_argument(
        "--columns",
        help="comma-separated Kafka columns to copy (default: all, with headers)",
    )
    parser.add_argument("--master", default="local[*]")
    args = parser.parse_args(argv)
    columns = None if args.columns is None else [c.strip() for c in args.columns.split(",")]
    if columns is not None:
        from seglogfs.spark.arrow import kafka_columns
        from seglogfs.spark.errors import SchemaError

        try:
            kafka_columns(columns, include_headers=True)
        except SchemaError as exc:
            parser.error(str(exc))

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers need seglogfs
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.master(args.master).appName("seglog to parquet").getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    try:
        rows = topic_to_parquet(
            spark, str(args.log_dir.resolve()), args.topic, args.output, columns
        )
    finally:
        spark.stop()
    print(f"wrote {rows} rows of {args.topic} to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

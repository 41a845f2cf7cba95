"""The shipped batch example: a topic (all partitions, earliest to latest) to Parquet.

    python -m seglogfs.spark.to_parquet LOGDIR TOPIC OUTPUT_DIR

Writes the Kafka source's columns (with headers), partitioned by ``partition``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any


def topic_to_parquet(spark: Any, log_dir: str, topic: str, output: str) -> int:
    """Copy ``topic`` into Parquet files under ``output``; return the row count."""
    from seglogfs.spark import register

    register(spark)
    df = (
        spark.read.format("seglog")
        .option("subscribe", topic)
        .option("includeHeaders", "true")
        .load(log_dir)
    )
    df.write.mode("overwrite").partitionBy("partition").parquet(output)
    return int(spark.read.parquet(output).count())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m seglogfs.spark.to_parquet",
        description="Read a seglog topic into Parquet files.",
    )
    parser.add_argument("log_dir", type=Path)
    parser.add_argument("topic")
    parser.add_argument("output")
    parser.add_argument("--master", default="local[*]")
    args = parser.parse_args(argv)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers need seglogfs
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.master(args.master).appName("seglog to parquet").getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    try:
        rows = topic_to_parquet(spark, str(args.log_dir.resolve()), args.topic, args.output)
    finally:
        spark.stop()
    print(f"wrote {rows} rows of {args.topic} to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

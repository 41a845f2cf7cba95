"""seglogfs.spark: the ``seglog`` PySpark data source and sink.

One call registers it::

    from seglogfs.spark import register
    register(spark)
    df = spark.read.format("seglog").option("subscribe", "orders").load("/var/lib/seglog")

The schema and options are those of Spark's built-in Kafka source and sink (see
``options``, ``reader``, ``stream`` and ``writer``). Readers read the segment files
directly (the log directory must be at the same path on every node); writers append
through the daemon when one owns the directory, else through the engine's writer lock.
"""

from __future__ import annotations

from typing import Any

from .errors import DataLossError, OptionError, SchemaError, SeglogSparkError, SinkError
from .source import SeglogDataSource
from .worker_python import WorkerPythonError, check_worker_python

__all__ = [
    "DataLossError",
    "OptionError",
    "SchemaError",
    "SeglogDataSource",
    "SeglogSparkError",
    "SinkError",
    "WorkerPythonError",
    "register",
]


def register(spark: Any) -> None:
    """Register the ``seglog`` format with ``spark`` (a ``SparkSession``).

    Also turns on Spark's Python filter pushdown
    (``spark.sql.python.filterPushdown.enabled``): Spark refuses to plan a Python
    source that accepts pushed filters while it is off, and the source uses them to
    skip partitions and offsets.

    Raises:
        WorkerPythonError: a local session's Python workers (``PYSPARK_PYTHON``,
            default ``python3`` from ``PATH``) lack pyarrow, numpy or seglogfs: said
            now rather than by the first query's worker (``worker_python``).
    """
    check_worker_python(spark)
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    spark.dataSource.register(SeglogDataSource)

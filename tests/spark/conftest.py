"""One local[2] SparkSession for every Spark test (starting one costs about 10 s).

The session's time zone is deliberately not UTC: timestamps must still come out as the
same instants. Spark tests never skip: pyspark, pyarrow and Java are installed by
``.ci/setup``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

SESSION_TIME_ZONE = "America/New_York"


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    # Workers must run this interpreter (the venv holding seglogfs), and the driver must
    # not go looking for a routable address on a machine without one.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from seglogfs.spark import register

    session = (
        SparkSession.builder.master("local[2]")
        .appName("seglogfs tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.session.timeZone", SESSION_TIME_ZONE)
        .config("spark.sql.streaming.stopTimeout", "30s")
        # Stateful test queries need no extra batch just to advance a watermark.
        .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()

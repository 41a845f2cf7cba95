"""What a read leaves in the Python worker: no pandas, and a frozen heap only in a reused
Spark worker. Each case runs in a fresh interpreter, so pytest's own collector is never
frozen."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from storage import LogManager

ROOT = Path(__file__).resolve().parents[2]

READ_ONE_RANGE = """
import gc, json, sys
from seglogfs.spark.arrow import Projection
from seglogfs.spark.reader import OffsetRange, read_offset_range
batches = list(read_offset_range(
    sys.argv[1], OffsetRange("t", 0, 0, 1000), projection=Projection.full(False),
    fail_on_data_loss=True,
))
print(json.dumps({
    "rows": sum(b.num_rows for b in batches),
    "pandas": "pandas" in sys.modules,
    "frozen": gc.get_freeze_count(),
}))
"""


def _read_in_subprocess(log_dir: Path, **env: str) -> dict[str, object]:
    environ = {k: v for k, v in os.environ.items() if k != "SPARK_REUSE_WORKER"}
    result = subprocess.run(
        [sys.executable, "-c", READ_ONE_RANGE, str(log_dir)],
        cwd=ROOT,
        env={**environ, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    out: dict[str, object] = json.loads(result.stdout)
    return out


def _log(log_dir: Path) -> None:
    with LogManager.open(log_dir) as manager:
        manager.create_topic("t", 1)
        manager.log("t", 0).append([b"v%d" % i for i in range(1000)])


def test_a_read_imports_no_pandas(log_dir: Path) -> None:
    """pyarrow imports pandas on its first conversion of numpy or Python objects (some
    33,000 objects that Spark's daemon would scan after every task): the reader builds
    its arrays from buffers instead."""
    _log(log_dir)
    got = _read_in_subprocess(log_dir)
    assert got["rows"] == 1000
    assert got["pandas"] is False


def test_the_heap_is_frozen_only_in_a_reused_spark_worker(log_dir: Path) -> None:
    _log(log_dir)
    assert _read_in_subprocess(log_dir)["frozen"] == 0
    reused = _read_in_subprocess(log_dir, SPARK_REUSE_WORKER="1")
    assert reused["rows"] == 1000
    assert isinstance(reused["frozen"], int)
    assert reused["frozen"] > 10_000  # the imported modules' objects

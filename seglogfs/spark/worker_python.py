"""Whether Spark's Python workers can run the ``seglog`` source, asked once by
``register``.

Spark runs its Python workers (the planner of a Python data source, and every task)
with ``PYSPARK_PYTHON``, default ``python3`` from ``PATH``: not necessarily the
interpreter that created the session. One without ``pyarrow`` (or without seglogfs)
failed the first query with ``No module named 'pyarrow'`` deep inside a Java stack
trace, however the session was set up. ``register`` checks that interpreter first and
names ``PYSPARK_PYTHON`` in the error.

Cheap by design: nothing is checked when the workers run this very interpreter (the
usual case once ``PYSPARK_PYTHON`` is set), and otherwise one interpreter start that
looks the modules up (``importlib.util.find_spec``) without importing them: 0.14 s
measured through a pyenv shim. Only local masters are checked: a cluster's workers
run elsewhere.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from typing import Any

from .errors import SeglogSparkError

__all__ = ["REQUIRED_MODULES", "WorkerPythonError", "check_worker_python"]

REQUIRED_MODULES = ("pyarrow", "numpy", "seglogfs")
"""What a worker imports to read or write ``seglog`` (``storage`` comes with seglogfs)."""

_FIND_MISSING = (
    "import importlib.util, sys\n"
    "print(' '.join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))\n"
)


class WorkerPythonError(SeglogSparkError):
    """Spark's Python workers would run an interpreter that cannot load the source."""


def check_worker_python(spark: Any) -> None:
    """Refuse, before any query, a local session whose Python workers lack what the
    ``seglog`` source needs.

    Raises:
        WorkerPythonError: naming the workers' interpreter, what it lacks, and the
            ``PYSPARK_PYTHON`` setting that fixes it.
    """
    try:
        context = spark.sparkContext
        python, master = str(context.pythonExec), str(context.master)
    except Exception:  # Spark Connect has no SparkContext here: its server's workers
        return
    if not master.startswith("local"):
        return
    found = shutil.which(python)
    source = "PYSPARK_PYTHON" if "PYSPARK_PYTHON" in os.environ else "PYSPARK_PYTHON unset"
    fix = (
        f"set PYSPARK_PYTHON={sys.executable} (this interpreter) before the SparkSession is created"
    )
    if found is None:
        raise WorkerPythonError(
            f"Spark's Python workers would run {python!r} ({source}), which is not found: {fix}"
        )
    # Unresolved paths: a venv's python is a symlink to the system's, yet only the
    # venv's path loads the venv's packages.
    if os.path.abspath(found) == os.path.abspath(sys.executable):
        return
    try:
        completed = subprocess.run(
            [found, "-c", _FIND_MISSING, *REQUIRED_MODULES],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise WorkerPythonError(
            f"Spark's Python workers would run {found} ({source}), which cannot be run "
            f"({exc}): {fix}"
        ) from None
    missing = completed.stdout.split()
    if completed.returncode != 0 or missing:
        lacks = ", ".join(missing) if missing else "a working Python 3"
        raise WorkerPythonError(
            f"Spark's Python workers would run {found} ({source}), which lacks {lacks}: {fix}"
        )

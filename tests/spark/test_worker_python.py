"""``register`` refuses a local session whose Python workers cannot load the source
(#23 item 8): the error names the interpreter, what it lacks and ``PYSPARK_PYTHON``,
before any query runs. A fake session stands in: the check reads only
``sparkContext.pythonExec`` and ``master``, and a real session fixes both at start."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from seglogfs.spark import WorkerPythonError, register


class _Recorder:
    """What ``register`` did to the session's config and data source registry."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def set(self, key: str, value: str) -> None:
        self.calls.append(f"conf {key}={value}")

    def register(self, source: type) -> None:
        self.calls.append(f"register {source.__name__}")


def _session(python: str, master: str = "local[*]") -> tuple[Any, _Recorder]:
    recorder = _Recorder()
    context = SimpleNamespace(pythonExec=python, master=master)
    return SimpleNamespace(sparkContext=context, conf=recorder, dataSource=recorder), recorder


@pytest.fixture
def bare_python(tmp_path: Path) -> Path:
    """An interpreter that finds no site-packages (``-I -S``): it lacks pyarrow,
    numpy and seglogfs, as a system ``python3`` beside a venv does."""
    script = tmp_path / "python3"
    script.write_text(f'#!/bin/sh\nexec {sys.executable} -I -S "$@"\n')
    script.chmod(0o755)
    return script


def test_workers_without_pyarrow_fail_at_register(bare_python: Path) -> None:
    session, recorder = _session(str(bare_python))
    with pytest.raises(WorkerPythonError) as caught:
        register(session)
    message = str(caught.value)
    assert message.startswith(f"Spark's Python workers would run {bare_python} (PYSPARK_")
    assert "which lacks pyarrow, numpy, seglogfs" in message
    assert message.endswith(
        f"set PYSPARK_PYTHON={sys.executable} (this interpreter) before the SparkSession is created"
    )
    assert recorder.calls == []  # nothing registered


def test_a_worker_python_that_does_not_exist(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    session, _ = _session("no-such-python3")
    with pytest.raises(WorkerPythonError, match=r"'no-such-python3' \(PYSPARK_PYTHON unset\), "):
        register(session)


def test_this_interpreter_registers_without_a_subprocess(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_subprocess(*args: object, **kwargs: object) -> None:
        raise AssertionError("checked in a subprocess although the workers run this Python")

    monkeypatch.setattr("seglogfs.spark.worker_python.subprocess.run", no_subprocess)
    session, recorder = _session(sys.executable)
    register(session)
    assert recorder.calls == [
        "conf spark.sql.python.filterPushdown.enabled=true",
        "register SeglogDataSource",
    ]


def test_another_interpreter_with_the_modules_passes_quickly(tmp_path: Path) -> None:
    # Another path to this venv's python (a wrapper, as pyenv's shims are): checked
    # in a subprocess, which finds the modules.
    other = tmp_path / "python"
    other.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    other.chmod(0o755)
    session, recorder = _session(str(other))
    started = time.monotonic()
    register(session)
    assert time.monotonic() - started < 5  # one interpreter start, nothing imported
    assert len(recorder.calls) == 2


def test_a_cluster_is_not_checked(bare_python: Path) -> None:
    session, recorder = _session(str(bare_python), master="spark://head:7077")
    register(session)  # its workers run on other machines: nothing to check here
    assert len(recorder.calls) == 2

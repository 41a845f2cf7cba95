"""A reader that goes away (``seglogfs ... | head``) ends every command quietly, as
Unix tools end: no ``error: Broken pipe``, no traceback, exit 0 (as ``consume`` always
did). A broken pipe that is not stdout's stays an error."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from seglogfs.cli import main
from storage import LogManager

from .conftest import SCRIPT, strip_build_notice

SEGMENT = "t-0/00000000000000000000.log"


@pytest.fixture
def filled(log_dir: Path) -> Path:
    """A log directory with one topic of 3 partitions, partition 0 holding far more
    than a pipe's 64 KiB of output for every command that prints records."""
    with LogManager.open(log_dir) as manager:
        manager.create_topic("t", 3)
        for _ in range(20):
            manager.log("t", 0).append([b"x" * 100] * 500)
    return log_dir


def _into_closed_pipe(log_dir: Path, *args: str) -> tuple[int, bytes]:
    """Run the console script with stdout a pipe whose reader has already closed, so
    its first write fails with ``EPIPE`` however little it prints."""
    reader, writer = os.pipe()
    os.close(reader)
    try:
        completed = subprocess.run(
            [str(SCRIPT), *args],
            stdout=writer,
            stderr=subprocess.PIPE,
            env={**os.environ, "SEGLOG_LOG_DIR": str(log_dir)},
            timeout=60,
            check=False,
        )
    finally:
        os.close(writer)
    return completed.returncode, strip_build_notice(completed.stderr)


@pytest.mark.parametrize(
    "args",
    [
        ("topics", "list"),
        ("topics", "describe"),
        ("dump", "--print-data-log", "{log_dir}/" + SEGMENT),
        ("dump", "--deep-iteration", "{log_dir}/" + SEGMENT),
        ("consume", "t"),
        ("groups", "list"),
        ("--help",),
        ("topics", "describe", "--help"),
    ],
    ids=lambda args: " ".join(args).replace("{log_dir}/", ""),
)
def test_every_command_ends_quietly_when_stdout_closes(filled: Path, args: tuple[str, ...]) -> None:
    given = [arg.format(log_dir=filled) for arg in args]
    assert _into_closed_pipe(filled, *given) == (0, b"")


def test_verify_ends_quietly_when_stdout_closes(filled: Path) -> None:
    # Damage the segment so that verify has problem lines to print to stdout.
    segment = filled / SEGMENT
    with open(segment, "r+b") as handle:
        handle.seek(70)
        handle.write(b"\xff")
    code, err = _into_closed_pipe(filled, "verify", "-q")
    # Quiet, but still exit 1: the problem lines that went unread were problems.
    assert (code, err) == (1, b"")


def test_head_of_a_dump(filled: Path) -> None:
    """The issue's own pipeline: the first line, then a quiet exit 0."""
    shell = subprocess.run(
        f"{SCRIPT} dump --print-data-log {filled / SEGMENT} | head -1; echo ${{PIPESTATUS[0]}}",
        shell=True,
        executable="/bin/bash",
        capture_output=True,
        timeout=60,
        check=True,
    )
    assert shell.stdout == f"Dumping {filled / SEGMENT}\n0\n".encode()
    assert strip_build_notice(shell.stderr) == b""


def test_a_broken_pipe_elsewhere_is_still_an_error(
    filled: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``EPIPE`` from something other than stdout (the daemon's socket closing under a
    request) is a failure to report, not a reader that had enough: stdout here is a
    real pipe whose reader is still there."""

    def broken(*args: object, **kwargs: object) -> None:
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(LogManager, "open", broken)
    monkeypatch.setenv("SEGLOG_LOG_DIR", str(filled))
    reader, writer = os.pipe()
    with open(reader, "rb") as kept_open, open(writer, "w") as stdout:
        monkeypatch.setattr(sys, "stdout", stdout)
        code = main(["topics", "list"])
        monkeypatch.undo()
        assert kept_open is not None
    assert (code, capsys.readouterr().err) == (
        1,
        f"seglogfs topics list: error: {filled}: Broken pipe\n",
    )

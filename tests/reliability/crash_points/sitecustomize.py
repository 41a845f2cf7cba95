"""Crash-point injection for the process-crash harness: tests only, never installed.

``tests/reliability/test_process_crash.py`` starts the daemon with this directory first
on ``PYTHONPATH``, so Python imports this module at start-up. With
``SEGLOG_TEST_CRASH_AT=OPERATION:K`` set, the daemon kills itself with ``SIGKILL`` just
before the K-th file-system call (write, fsync, rename, truncate, unlink, open, mkdir)
that one run of OPERATION makes, in whichever thread runs it, after writing
``OPERATION K CALL`` to ``SEGLOG_TEST_CRASH_MARKER``, once the file
``SEGLOG_TEST_CRASH_ARMED`` exists (so the harness can read the mount before it arms
the crash). Production code has no hook: the
engine's methods are wrapped here, from outside. An operation that makes fewer than K
calls runs to its end; the next run of it counts again from 1.

Operations: ``roll`` (``Log.roll``), ``retention`` (``Log._delete_segments``),
``checkpoint`` (both ``LogManager`` checkpoint writers), ``create_topic``,
``set_rendering`` (``LogManager.set_topic_rendering``), ``delete_topic``, ``append``
(``Log.append``), ``flush`` (``Log.flush``) and ``clean`` (``LogManager.clean``: a
cleaning pass, the daemon's background cleaner).
"""

from __future__ import annotations

import functools
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

CRASH_AT_ENV = "SEGLOG_TEST_CRASH_AT"
MARKER_ENV = "SEGLOG_TEST_CRASH_MARKER"
ARMED_ENV = "SEGLOG_TEST_CRASH_ARMED"

# The os functions the engine reaches the file system through (pathlib calls these too).
FILE_CALLS = (
    "open",
    "write",
    "pwrite",
    "writev",
    "fsync",
    "fdatasync",
    "ftruncate",
    "truncate",
    "rename",
    "replace",
    "unlink",
    "rmdir",
    "mkdir",
)


def _targets() -> dict[str, list[tuple[Any, str]]]:
    from storage.log.log import Log
    from storage.log.log_manager import LogManager

    return {
        "roll": [(Log, "roll")],
        "retention": [(Log, "_delete_segments")],
        "checkpoint": [
            (LogManager, "checkpoint_recovery_points"),
            (LogManager, "checkpoint_log_start_offsets"),
        ],
        "create_topic": [(LogManager, "create_topic")],
        "set_rendering": [(LogManager, "set_topic_rendering")],
        "delete_topic": [(LogManager, "delete_topic")],
        "append": [(Log, "append")],
        "flush": [(Log, "flush")],
        "clean": [(LogManager, "clean")],
    }


def _install(operation: str, target: int, marker: str, armed: str) -> None:
    state = threading.local()

    def crash(call: str) -> None:
        # Two threads may reach their K-th call together: the first to create the
        # marker names the crash point and kills the process; the others wait for it.
        try:
            fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            threading.Event().wait()
        original_write(fd, f"{operation} {target} {call}\n".encode())
        original_fsync(fd)
        os.kill(os.getpid(), signal.SIGKILL)

    original_write = os.write
    original_fsync = os.fsync

    def counting(call: str, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if getattr(state, "depth", 0) > 0:
                state.calls += 1
                if state.calls == target and os.path.exists(armed):
                    crash(call)
            return original(*args, **kwargs)

        return wrapper

    for call in FILE_CALLS:
        original = getattr(os, call, None)
        if original is not None:
            setattr(os, call, counting(call, original))

    def operation_wrapper(method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            depth = getattr(state, "depth", 0)
            if depth == 0:
                state.calls = 0
            state.depth = depth + 1
            try:
                return method(*args, **kwargs)
            finally:
                state.depth = depth

        return wrapper

    for cls, name in _targets()[operation]:
        setattr(cls, name, operation_wrapper(getattr(cls, name)))


def _from_environment() -> None:
    spec = os.environ.get(CRASH_AT_ENV)
    marker = os.environ.get(MARKER_ENV)
    armed = os.environ.get(ARMED_ENV)
    if not spec or not marker or not armed:
        return
    operation, _, count = spec.partition(":")
    _install(operation, int(count), marker, armed)


_from_environment()

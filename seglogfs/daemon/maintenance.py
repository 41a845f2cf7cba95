"""The daemon's background work: trio tasks in its nursery, stopped with it.

A writable mount runs what Kafka's ``LogManager`` schedules, on the engine's calls:

- retention every ``log.retention.check.interval.ms`` (``run_retention``: time and
  size), and also as soon as a segment's ``retention.ms`` runs out;
- roll by time (``segment.ms``): Kafka rolls on time only when a record arrives, the
  daemon also seals a quiet partition's segment on time (``roll_due_segments``);
- removal of ``.deleted`` files after ``file.delete.delay.ms``;
- flush by ``flush.ms`` (``flush_due_logs``; ``flush.messages`` is the engine's, on
  append);
- recovery-point and log-start-offset checkpoints on their broker intervals.

The timed work sleeps until ``LogManager.next_maintenance_due_ms`` (at most
``MAX_SLEEP_S``, so a config changed through ``setfattr`` is noticed). A read-only mount
instead follows the writer: ``LogManager.refresh`` every ``REFRESH_S`` (each log is also
refreshed when it is read or stat'ed).

Every engine call goes through the daemon's ``run_sync`` bridge to a worker thread, so
an fsync of a large sealed segment never stalls the event loop. A failing task logs the
error (its traceback once) and tries again later: background work never takes the mount
down.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from storage import LogManager

from .state import RunSync

__all__ = ["run_maintenance"]

logger = logging.getLogger(__name__)

MAX_SLEEP_S = 1.0
REFRESH_S = 1.0


async def run_maintenance(manager: LogManager, run_sync: RunSync, *, read_only: bool) -> None:
    """Run the background schedules until cancelled."""
    broker = manager.broker_config
    async with trio.open_nursery() as nursery:
        if read_only:
            nursery.start_soon(_every, REFRESH_S, "refresh", run_sync, manager.refresh)
            return
        nursery.start_soon(
            _every,
            broker.log_retention_check_interval_ms / 1000,
            "retention",
            run_sync,
            lambda: _retention(manager),
        )
        nursery.start_soon(_when_due, manager, run_sync)
        nursery.start_soon(
            _every,
            broker.log_flush_offset_checkpoint_interval_ms / 1000,
            "recovery-point checkpoint",
            run_sync,
            manager.checkpoint_recovery_points,
        )
        nursery.start_soon(
            _every,
            broker.log_flush_start_offset_checkpoint_interval_ms / 1000,
            "log-start-offset checkpoint",
            run_sync,
            manager.checkpoint_log_start_offsets,
        )


class _Failures:
    """A background task's error log: the traceback the first time, a line after."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.seen = False

    def report(self, exc: Exception) -> None:
        if self.seen:
            logger.error("%s failed again: %s", self.what, exc)
        else:
            logger.error("%s failed; retrying", self.what, exc_info=exc)
        self.seen = True


async def _every(seconds: float, what: str, run_sync: RunSync, work: Callable[[], object]) -> None:
    failures = _Failures(what)
    while True:
        await trio.sleep(seconds)
        try:
            await run_sync(work)
        except Exception as exc:
            failures.report(exc)


def _retention(manager: LogManager) -> None:
    deleted = manager.run_retention()
    if deleted:
        logger.info("retention deleted %d segment(s)", deleted)


def _due_work(manager: LogManager) -> int:
    """Do what is due now; return the engine-clock time (ms) the next work is due."""
    rolled = manager.roll_due_segments()
    if rolled:
        logger.info("rolled %d segment(s) on time (segment.ms)", rolled)
    now = manager.clock.milliseconds()
    if any(
        (due := log.next_retention_due_ms()) is not None and due <= now for log in manager.logs()
    ):
        _retention(manager)
    manager.delete_expired_files()
    manager.flush_due_logs()
    return manager.next_maintenance_due_ms() - manager.clock.milliseconds()


async def _when_due(manager: LogManager, run_sync: RunSync) -> None:
    failures = _Failures("roll/delete/flush")
    wait_ms = 0
    while True:
        await trio.sleep(min(max(wait_ms, 10) / 1000, MAX_SLEEP_S))
        try:
            wait_ms = await run_sync(_due_work, manager)
        except Exception as exc:
            failures.report(exc)
            wait_ms = int(MAX_SLEEP_S * 1000)

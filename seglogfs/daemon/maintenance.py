"""The daemon's background work: trio tasks in its nursery, stopped with it.

A writable mount runs what Kafka's ``LogManager`` schedules, on the engine's calls:

- retention every ``log.retention.check.interval.ms`` (``run_retention``: time and
  size), and also as soon as a segment's ``retention.ms`` runs out;
- roll by time (``segment.ms``): Kafka rolls on time only when a record arrives, the
  daemon also seals a quiet partition's segment on time (``roll_due_segments``);
- removal of ``.deleted`` files after ``file.delete.delay.ms``;
- flush by ``flush.ms`` (``flush_due_logs``; ``flush.messages`` is the engine's, on
  append);
- recovery-point and log-start-offset checkpoints on their broker intervals;
- log compaction, as Kafka's ``LogCleaner`` thread (``log.cleaner.enable``, on by
  default): a pass over the compacted logs that are due (dirty ratio above
  ``min.cleanable.dirty.ratio``, or a record older than ``max.compaction.lag.ms``;
  ``LogManager.clean``), dirtiest first, then ``log.cleaner.backoff.ms`` of sleep; at
  once again when a log has more to clean than one pass's offset map held. A pass that
  did something is one INFO line (logs, passes, segments, bytes and records before
  and after). One pass at a time in the process: a ``seglogfs compact`` request waits
  for it, and it for the request (``control.admin.CLEANING``). Stopping the daemon
  waits for a pass in progress (engine calls are not interrupted).

The timed work sleeps until ``LogManager.next_maintenance_due_ms`` (at most
``MAX_SLEEP_S``, so a config changed through ``setfattr`` is noticed). A read-only mount
instead follows the writer: ``LogManager.refresh`` every ``REFRESH_S`` (each log is also
refreshed when it is read or stat'ed).

Every engine call goes through the daemon's ``run_sync`` bridge to a worker thread, so
an fsync of a large sealed segment never stalls the event loop. A failing task logs the
error and tries again later: background work never takes the mount down. The log stays
short however long the failure lasts (a full disk fails every checkpoint until room is
made, or fills and frees again and again): a task logs at most a line a minute
(``REPEAT_LOG_S``), counting the failures left out; an ``OSError`` is the environment,
not a bug, so its line has no traceback (anything else has its traceback once); and a
line says when the task works again.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

import trio

from storage import CleanSummary, LogManager

from ..control import admin
from . import metrics
from .state import RunSync

__all__ = ["run_maintenance"]

logger = logging.getLogger(__name__)

MAX_SLEEP_S = 1.0
REFRESH_S = 1.0
REPEAT_LOG_S = 60.0
"""A task that keeps failing logs at most one line per this many seconds."""


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
        if broker.cleaner.enable:
            nursery.start_soon(_clean_when_due, manager, run_sync)


class _Failures:
    """A background task's error log (see the module): at most a line a minute, the
    first with the traceback when it is not an ``OSError`` (once per task), each one
    counting the failures left out before it; a line when the task works again after
    a failure that was logged. A disk that fills and frees again and again is a line
    a minute too."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.failing = False  # the last attempt failed
        self.told = False  # and a line said so
        self.unlogged = 0  # failures since the last line
        self.logged_at = -math.inf
        self.traceback_logged = False

    def report(self, exc: Exception) -> None:
        now = trio.current_time()
        self.failing = True
        if now - self.logged_at < REPEAT_LOG_S:
            self.unlogged += 1
            return
        more = f" ({self.unlogged} more time(s) since the last line)" if self.unlogged else ""
        if isinstance(exc, OSError) or self.traceback_logged:
            logger.error("%s failed%s; retrying: %s", self.what, more, exc)
        else:
            self.traceback_logged = True
            logger.error("%s failed%s; retrying", self.what, more, exc_info=exc)
        self.unlogged = 0
        self.logged_at = now
        self.told = True

    def succeeded(self) -> None:
        if self.failing and self.told:
            logger.info("%s works again", self.what)
        self.failing = self.told = False


async def _every(seconds: float, what: str, run_sync: RunSync, work: Callable[[], object]) -> None:
    failures = _Failures(what)
    while True:
        await trio.sleep(seconds)
        try:
            await run_sync(work)
        except Exception as exc:
            failures.report(exc)
        else:
            failures.succeeded()


def _retention(manager: LogManager) -> None:
    started = time.perf_counter()
    deleted = manager.run_retention()
    counters = metrics.COUNTERS
    if counters is not None:
        counters.background("retention", time.perf_counter() - started)
        if deleted:
            counters.segments_deleted.inc(deleted)
    if deleted:
        logger.info("retention deleted %d segment(s)", deleted)


def _due_work(manager: LogManager) -> int:
    """Do what is due now; return the engine-clock time (ms) the next work is due."""
    started = time.perf_counter()
    rolled = manager.roll_due_segments()
    counters = metrics.COUNTERS
    if counters is not None and rolled:
        counters.background("roll", time.perf_counter() - started)
        counters.segments_rolled.inc(rolled)
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
        else:
            failures.succeeded()


def _cleaning_pass(manager: LogManager) -> bool:
    """One pass of the cleaner over the due logs; whether a log has more to clean now."""
    started = time.perf_counter()
    summary = admin.clean(manager)
    if summary.cleaned:
        _count_pass(summary, time.perf_counter() - started)
        logger.info("%s", _cleaning_line(summary))
    return any(result.more_to_clean for result in summary.cleaned)


def _count_pass(summary: CleanSummary, seconds: float) -> None:
    counters = metrics.COUNTERS
    if counters is not None:
        counters.background("clean", seconds)
        counters.cleaned(
            sum(result.passes for result in summary.cleaned),
            max(summary.bytes_before - summary.bytes_after, 0),
        )


def _cleaning_line(summary: CleanSummary) -> str:
    """What a pass did, in one line (``summary.cleaned`` is not empty)."""
    results = summary.cleaned
    reclaimed = summary.bytes_before - summary.bytes_after
    names = ", ".join(f"{r.topic}-{r.partition}" for r in results[:5])
    if len(results) > 5:
        names += f" and {len(results) - 5} more"
    return (
        f"cleaner: compacted {len(results)} log(s) ({names}) in "
        f"{sum(r.passes for r in results)} pass(es): segments {summary.segments_before} -> "
        f"{summary.segments_after}, bytes {summary.bytes_before} -> {summary.bytes_after} "
        f"({reclaimed} reclaimed), records {summary.records_read} read, "
        f"{summary.records_kept} kept"
    )


async def _clean_when_due(manager: LogManager, run_sync: RunSync) -> None:
    # Kafka's CleanerThread.doWork: clean, and back off only when nothing is left to
    # clean now (a log whose keys overflowed the offset map goes on at once).
    backoff_s = manager.broker_config.cleaner.backoff_ms / 1000
    failures = _Failures("log cleaning")
    while True:
        try:
            more = await run_sync(_cleaning_pass, manager)
        except Exception as exc:
            failures.report(exc)
            more = False
        else:
            failures.succeeded()
        await trio.sleep(0 if more else backoff_s)

"""The daemon's background work, one trio task per schedule, all in its nursery.

A writable mount runs what Kafka's ``LogManager`` schedules:

- retention every ``log.retention.check.interval.ms`` (``LogManager.run_retention``);
- roll by time (``segment.ms``) and the delayed removal of ``.deleted`` files
  (``file.delete.delay.ms``), checked every second: Kafka rolls on time only when a
  record arrives, the daemon also seals a quiet partition's segment on time;
- flush by ``flush.ms``: a log with unflushed records whose last flush is older than
  its ``flush.ms`` is fsynced (``flush.messages`` is the engine's, on append);
- recovery-point and log-start-offset checkpoints on their broker intervals.

A read-only mount instead follows the writer: ``LogManager.refresh`` once a second for
new topics and partitions (each log is also refreshed when it is read or stat'ed).

Every engine call goes through the daemon's ``run_sync`` bridge to a worker thread, so
an fsync of a large sealed segment never stalls the event loop. A failing task logs the
error (its traceback once) and tries again at its next interval: background work never
takes the mount down.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import trio

from storage import Log, LogManager
from storage.log_config import LONG_MAX

from .fs import RunSync

__all__ = ["run_maintenance"]

logger = logging.getLogger(__name__)

ROLL_CHECK_S = 1.0
REFRESH_S = 1.0
FLUSH_TICK_S = 0.1


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
        nursery.start_soon(_every, ROLL_CHECK_S, "roll", run_sync, lambda: _roll(manager))
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
        nursery.start_soon(_flush_by_time, manager, run_sync)


async def _every(seconds: float, what: str, run_sync: RunSync, work: Callable[[], object]) -> None:
    failed_before = False
    while True:
        await trio.sleep(seconds)
        try:
            await run_sync(work)
        except Exception as exc:
            if failed_before:
                logger.error("%s failed again: %s", what, exc)
            else:
                logger.error("%s failed; retrying every %.3g s", what, seconds, exc_info=exc)
            failed_before = True


def _retention(manager: LogManager) -> None:
    deleted = manager.run_retention()
    if deleted:
        logger.info("retention deleted %d segment(s)", deleted)


def _roll(manager: LogManager) -> None:
    rolled = manager.roll_due_segments()
    if rolled:
        logger.info("rolled %d segment(s) on time (segment.ms)", rolled)
    for log in manager.logs():
        log.delete_expired_files()


async def _flush_by_time(manager: LogManager, run_sync: RunSync) -> None:
    # flush.ms per log (Kafka's LogManager.flushDirtyLogs): cheap in-memory checks every
    # tick; a thread only for the logs that are due.
    last_flush: dict[tuple[str, int], float] = {}
    failed_before = False
    while True:
        await trio.sleep(FLUSH_TICK_S)
        now = time.monotonic()
        due = []
        for log in manager.logs():
            flush_ms = log.config.flush_ms
            if flush_ms >= LONG_MAX or log.recovery_point >= log.log_end_offset:
                continue
            key = (log.topic, log.partition)
            if (now - last_flush.setdefault(key, now)) * 1000 >= flush_ms:
                due.append(log)
                last_flush[key] = now
        if not due:
            continue
        try:
            await run_sync(_flush_logs, due)
        except Exception as exc:
            if not failed_before:
                logger.error("flush.ms flush failed", exc_info=exc)
            failed_before = True


def _flush_logs(logs: list[Log]) -> None:
    for log in logs:
        log.flush()

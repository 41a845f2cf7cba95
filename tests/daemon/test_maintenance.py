"""The daemon's background schedules, run in a trio nursery against a real engine."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest
import trio

from seglogfs.daemon.maintenance import run_maintenance
from seglogfs.positions import position_index_spec
from storage import BrokerConfig, LogManager
from tests.conftest import ManualClock


async def run_sync(fn: object, *args: object) -> object:
    return await trio.to_thread.run_sync(fn, *args)  # type: ignore[arg-type]


def open_manager(log_dir: Path, clock: ManualClock) -> LogManager:
    broker = BrokerConfig(
        log_dirs=(str(log_dir),),
        log_retention_check_interval_ms=100,
        log_flush_offset_checkpoint_interval_ms=100,
        log_flush_start_offset_checkpoint_interval_ms=100,
    )
    return LogManager.open(log_dir, broker, clock=clock, extension=position_index_spec)


async def wait_for(condition: Callable[[], bool], seconds: float = 5.0) -> None:
    # The engine has no events to wait on: poll its state.
    for _ in range(int(seconds / 0.02)):
        if condition():
            return
        await trio.sleep(0.02)
    raise AssertionError(f"not true after {seconds} s")


@pytest.mark.trio
async def test_flush_ms_flushes_a_dirty_log(log_dir: Path, clock: ManualClock) -> None:
    with open_manager(log_dir, clock) as manager:
        manager.create_topic("fast", 1, {"flush.ms": "50"})
        manager.create_topic("never", 1)
        fast, never = manager.log("fast", 0), manager.log("never", 0)
        fast.append([b"a", b"b"])
        never.append([b"c"])
        assert fast.recovery_point == 0
        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(run_maintenance, manager, run_sync, read_only=False))
            await trio.sleep(0.3)
            assert fast.recovery_point == 0  # flush.ms has not passed on the log's clock
            clock.advance(60)
            await wait_for(lambda: fast.recovery_point == 2)
            nursery.cancel_scope.cancel()
        assert never.recovery_point == 0  # flush.ms unlimited: left to the OS


@pytest.mark.trio
async def test_retention_roll_by_time_and_delayed_deletes(
    log_dir: Path, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    with open_manager(log_dir, clock) as manager:
        manager.create_topic(
            "t", 1, {"segment.ms": "60000", "retention.ms": "120000", "file.delete.delay.ms": "0"}
        )
        log = manager.log("t", 0)
        log.append([b"old"], timestamps=[clock.milliseconds()])
        caplog.set_level("INFO", logger="seglogfs.daemon.maintenance")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(run_maintenance, manager, run_sync, read_only=False))
            clock.advance(61_000)  # the quiet active segment is due to roll on time
            await wait_for(lambda: log.number_of_segments == 2)
            clock.advance(100_000)
            log.append([b"new"], timestamps=[clock.milliseconds()])
            clock.advance(21_000)  # the first segment's record is now too old, not this one
            await wait_for(lambda: log.log_start_offset == 1)
            await wait_for(lambda: not list(log.dir.glob("*.deleted")))
            nursery.cancel_scope.cancel()
        assert [r.value for r in log.records(log.log_start_offset)] == [b"new"]
        assert "rolled 1 segment(s) on time" in caplog.text
        assert "retention deleted 1 segment(s)" in caplog.text
        checkpoint = (log_dir / "log-start-offset-checkpoint").read_text()
        assert "t 0 1" in checkpoint

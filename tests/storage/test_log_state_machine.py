"""A hypothesis state machine: a log against an in-memory list through appends, rolls,
retention, DeleteRecords, flushes, clean reopens and crashes that drop an arbitrary
unflushed tail.

The model decides the log start offset itself: retention is simulated on the segment
facts (base offsets, sizes, newest timestamps) with Kafka's rules, and a crash never
moves the start below what was checkpointed, so offsets are never handed out twice."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from storage import Log, LogConfig
from tests.conftest import ManualClock

CONFIG = LogConfig(
    segment_bytes=600,
    index_interval_bytes=128,
    segment_index_bytes=120,  # 15 entries: index-full rolls happen too
    retention_ms=60_000,
    retention_bytes=2_000,
    file_delete_delay_ms=0,
)

Entry = tuple[int, bytes | None, bytes | None, int]  # offset, key, value, timestamp


class LogMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="seglog-sm-"))
        self.dir = self.root / "t-0"
        self.clock = ManualClock()
        self.log = Log.open(self.dir, CONFIG, clock=self.clock)
        self.model: list[Entry] = []
        self.end = 0
        self.start = 0
        self.checkpointed_start = 0
        self.flushed_sizes: dict[int, int] = {}

    def _reopen(self, recovery_point: int, *, had_clean_shutdown: bool) -> None:
        """Open the log again with what a log manager would have checkpointed."""
        self.log = Log.open(
            self.dir,
            CONFIG,
            clock=self.clock,
            log_start_offset=self.checkpointed_start,
            recovery_point=recovery_point,
            had_clean_shutdown=had_clean_shutdown,
        )

    def _all_flushed(self) -> None:
        """Every byte now in the segments is durable (after a flush, reopen, recovery)."""
        self.flushed_sizes = {s.base_offset: s.size for s in self.log.segments.values()}

    def teardown(self) -> None:
        self.log.close()
        shutil.rmtree(self.root, ignore_errors=True)

    @rule(
        rows=st.lists(
            st.tuples(st.none() | st.binary(max_size=20), st.none() | st.binary(max_size=120)),
            min_size=1,
            max_size=8,
        )
    )
    def append(self, rows: list[tuple[bytes | None, bytes | None]]) -> None:
        keys = [k for k, _ in rows]
        vals = [v for _, v in rows]
        info = self.log.append(vals, keys=keys)
        assert info.first_offset == self.end
        for i, (key, value) in enumerate(rows):
            self.model.append((info.first_offset + i, key, value, self.clock.now_ms))
        self.end = info.last_offset + 1

    @rule(ms=st.integers(min_value=0, max_value=40_000))
    def advance_clock(self, ms: int) -> None:
        self.clock.advance(ms)

    @rule()
    def roll(self) -> None:
        self.log.roll()

    def _expected_retention(self) -> list[int]:
        """The base offsets Kafka's retention leaves, simulated on the segment facts."""
        segments = [(s.base_offset, s.size, s.largest_timestamp()) for s in self.log.segments]
        now = self.clock.milliseconds()

        def apply(predicate: Callable[[int], bool]) -> None:
            nonlocal segments
            n = 0
            for i, (_base, size, _ts) in enumerate(segments):
                if (i == len(segments) - 1 and size == 0) or not predicate(i):
                    break
                n += 1
            if n == len(segments):
                segments = [*segments, (self.end, 0, -1)]  # roll first, as Kafka does
            segments = segments[n:]

        apply(lambda i: i + 1 < len(segments) and segments[i + 1][0] <= self.start)
        apply(lambda i: now - segments[i][2] > CONFIG.retention_ms)
        excess = sum(size for _, size, _ in segments) - CONFIG.retention_bytes

        def over_size(i: int) -> bool:
            nonlocal excess
            if excess > 0 and excess - segments[i][1] >= 0:
                excess -= segments[i][1]
                return True
            return False

        apply(over_size)
        return [base for base, _, _ in segments]

    @rule()
    def retention(self) -> None:
        expected_bases = self._expected_retention()
        self.log.delete_old_segments()
        assert self.log.segments.base_offsets() == expected_bases
        self.start = max(self.start, expected_bases[0])
        self.end = max(self.end, self.start)
        self.checkpointed_start = self.start
        self.model = [e for e in self.model if e[0] >= self.start]

    @rule(fraction=st.floats(min_value=0, max_value=1))
    def delete_records(self, fraction: float) -> None:
        """Kafka's DeleteRecords: the start moves; a manager checkpoints it."""
        target = self.start + int((self.end - self.start) * fraction)
        self.log.advance_log_start_offset(target)
        self.start = max(self.start, target)
        self.checkpointed_start = self.start
        self.model = [e for e in self.model if e[0] >= self.start]

    @rule()
    def flush(self) -> None:
        self.log.flush()
        self._all_flushed()

    @rule()
    def reopen_clean(self) -> None:
        recovery_point = self.log.recovery_point
        self.log.close()
        self._reopen(recovery_point, had_clean_shutdown=True)
        self._all_flushed()

    @precondition(lambda self: self.model)
    @rule(keep=st.lists(st.floats(min_value=0, max_value=1), min_size=8, max_size=8))
    def crash(self, keep: list[float]) -> None:
        recovery_point = self.log.recovery_point
        segments = self.log.segments.values()
        for segment in segments:
            segment.close_handlers()
        # Unflushed bytes of each segment survive only in part (page cache lost).
        # A segment wholly below the recovery point was fsynced (on flush or roll).
        for i, segment in enumerate(segments):
            size = segment.path.stat().st_size
            following = self.log.segments.higher_segment(segment.base_offset)
            if following is not None and following.base_offset <= recovery_point:
                flushed = size
            else:
                flushed = self.flushed_sizes.get(segment.base_offset, 0)
            if size > flushed:
                os.truncate(segment.path, flushed + int((size - flushed) * keep[i % len(keep)]))
        self._reopen(recovery_point, had_clean_shutdown=False)
        survivors = [(r.offset, r.key, r.value, r.timestamp) for r in self.log.records(self.start)]
        assert survivors == self.model[: len(survivors)], "recovery kept a non-prefix"
        assert all(e in survivors for e in self.model if e[0] < recovery_point), "lost flushed data"
        # Offsets are never reused: the end may stay past the survivors (an empty
        # rolled segment fixes it), but never beyond what was assigned, and never
        # below the checkpointed log start offset (the log restarts there).
        assert (survivors[-1][0] + 1 if survivors else self.start) <= self.log.log_end_offset
        assert self.log.log_end_offset <= self.end
        assert self.log.log_end_offset >= self.checkpointed_start
        self.model = survivors
        self.end = self.log.log_end_offset
        self._all_flushed()

    @invariant()
    def matches_model(self) -> None:
        log = self.log
        assert log.log_start_offset == self.start
        assert log.log_end_offset == self.end
        got = [(r.offset, r.key, r.value, r.timestamp) for r in log.records(self.start)]
        assert got == self.model
        if self.model:
            middle = self.model[len(self.model) // 2]
            assert next(iter(log.records(middle[0])))[0] == middle[0]
        log._check()


TestLogMachine = LogMachine.TestCase
TestLogMachine.settings = settings(max_examples=100, stateful_step_count=50, deadline=None)

"""A hypothesis state machine: a compacted log against a model of what Kafka's cleaner
keeps, through appends of keyed records and tombstones, rolls, time passing, cleaning
passes, clean reopens, and crashes after each step of a pass.

The model is a list of records with their tombstone delete horizons. A pass (with a
map large enough for every key) keeps, below the first uncleanable offset (the active
segment's base), the latest record of each key, a tombstone only while the clock is
before its horizon; the pass that first keeps a tombstone sets its horizon to now +
``delete.retention.ms``. A pass with a small map maps the dirty records in order until a
new key does not fit and cleans only up to there. A crash after step k of a group's
swap leaves, after recovery, the groups before it cleaned, the crashed group cleaned
when its swap was committed (k >= ``SWAP_RENAMED``), and the rest as it was: the
machine checks that the
log is exactly the new records below some group boundary and the old ones above it
(never a mix inside a group), then adopts that state.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from storage import (
    CleaningStep,
    DefaultRecordBatch,
    ExtensionIndexSpec,
    Log,
    LogConfig,
    OffsetMap,
    RecordBatch,
)
from storage.log.segment import LogSegment
from tests.conftest import ManualClock

RETENTION = 500  # delete.retention.ms
CONFIG = LogConfig(
    cleanup_policy=("compact",),
    segment_bytes=400,
    index_interval_bytes=64,
    delete_retention_ms=RETENTION,
    file_delete_delay_ms=0,
)
MAP_MEMORY = 24 * 10_000

Entry = tuple[int, bytes, bytes | None, int | None, int]
"""offset, key, value, the tombstone's delete horizon (None: unset or not a tombstone),
the base offset of its batch"""


class Crash(BaseException):
    """Stops a pass where a crash would (cleanup handlers catch ``Exception`` only)."""


def a_pass(
    model: list[Entry],
    first_dirty: int,
    uncleanable: int,
    recopied_below: int,
    now: int,
    max_keys: int | None = None,
) -> tuple[list[Entry], int]:
    """What one pass keeps and where it ends, by Kafka's rules.

    The map takes the dirty records ``[first_dirty, uncleanable)`` in order until a new
    key would be key ``max_keys + 1``; the pass ends after the last record mapped
    (``uncleanable`` when all fit). Below the end a record stays when it is the latest
    of its key in the map (or its key is not there), a tombstone only before its
    horizon; from the end on, every record stays. Every batch below
    ``recopied_below`` (the segments the pass recopies: those starting below its end)
    that keeps a tombstone without a horizon gets one, now + ``delete.retention.ms``
    (Kafka's filterTo marks the batch, past-the-map tombstones included).
    """
    mapped: dict[bytes, int] = {}
    end = uncleanable
    for offset, key, _value, _horizon, _batch in model:
        if not first_dirty <= offset < uncleanable:
            continue
        if max_keys is not None and key not in mapped and len(mapped) >= max_keys:
            end = max(mapped.values()) + 1
            break
        mapped[key] = offset
    kept: list[Entry] = []
    for entry in model:
        offset, key, value, horizon, _batch = entry
        if offset >= end:
            kept.append(entry)
        elif offset < mapped.get(key, -1):
            continue  # superseded by a record the map holds
        elif value is not None or horizon is None or now < horizon:
            kept.append(entry)
    marked = {e[4] for e in kept if e[4] < recopied_below and e[2] is None and e[3] is None}
    return [
        (o, k, v, now + RETENTION, b) if b in marked and v is None else (o, k, v, h, b)
        for o, k, v, h, b in kept
    ], end


class CleanerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="seglog-cleaner-sm-"))
        self.dir = self.root / "t-0"
        self.clock = ManualClock()
        self.log = self._open()
        self.model: list[Entry] = []
        self.first_dirty = 0  # the cleaner checkpoint a manager would keep

    def _open(self, **kwargs: Any) -> Log:
        return Log.open(self.dir, CONFIG, clock=self.clock, **kwargs)

    def teardown(self) -> None:
        if not self.log.closed:
            self.log.close()
        shutil.rmtree(self.root, ignore_errors=True)

    # -- rules ---------------------------------------------------------------------------

    @rule(
        records=st.lists(
            st.tuples(
                st.sampled_from([b"a", b"b", b"c", b"d", b"e"]),
                st.one_of(st.none(), st.binary(min_size=0, max_size=30)),
            ),
            min_size=1,
            max_size=4,
        )
    )
    def append(self, records: list[tuple[bytes, bytes | None]]) -> None:
        keys = [key for key, _ in records]
        values = [value for _, value in records]
        info = self.log.append(values, keys=keys, timestamps=self.clock.now_ms)
        for i, (key, value) in enumerate(records):
            self.model.append((info.first_offset + i, key, value, None, info.first_offset))

    @rule()
    def roll(self) -> None:
        self.log.roll()

    @rule(ms=st.integers(min_value=1, max_value=2 * RETENTION))
    def time_passes(self, ms: int) -> None:
        self.clock.advance(ms)

    def _recopied_below(self, end: int) -> int:
        # The pass recopies every segment starting below its end, whole.
        return min(b for b in self.log.segments.base_offsets() if b >= end)

    def _expected(self) -> list[Entry]:
        # Kafka cleans nothing while nothing is dirty (no pass for expired tombstones
        # alone: they go with the next pass that has dirty records).
        uncleanable = self.log.active_segment.base_offset
        if uncleanable <= self.first_dirty:
            return list(self.model)
        kept, _end = a_pass(
            self.model, self.first_dirty, uncleanable, uncleanable, self.clock.now_ms
        )
        return kept

    @rule()
    def clean(self) -> None:
        uncleanable = self.log.active_segment.base_offset
        expected = self._expected()
        end, _stats = self.log.clean(OffsetMap(MAP_MEMORY), first_dirty_offset=self.first_dirty)
        assert end == max(uncleanable, self.first_dirty)
        self.first_dirty = end
        self.model = expected

    @rule(max_keys=st.integers(min_value=1, max_value=4))
    def clean_with_a_small_map(self, max_keys: int) -> None:
        # Fewer keys than the log holds: a pass cleans a prefix, several clean it all.
        uncleanable = self.log.active_segment.base_offset
        if uncleanable <= self.first_dirty:
            return
        _kept, model_end = a_pass(
            self.model, self.first_dirty, uncleanable, uncleanable, 0, max_keys
        )
        expected, _ = a_pass(
            self.model,
            self.first_dirty,
            uncleanable,
            self._recopied_below(model_end),
            self.clock.now_ms,
            max_keys,
        )
        small = OffsetMap(24 * max_keys, load_factor=1.0)
        end, _stats = self.log.clean(small, first_dirty_offset=self.first_dirty)
        # The map may end past its last record (a batch's or segment's end after it):
        # no record lies between.
        assert end >= model_end
        assert not [e for e in self.model if model_end <= e[0] < end]
        assert end > self.first_dirty  # progress
        self.first_dirty = end
        self.model = expected

    @rule(step=st.sampled_from(list(CleaningStep)), group=st.integers(min_value=0, max_value=3))
    def crash_during_a_pass(self, step: CleaningStep, group: int) -> None:
        old = list(self.model)
        new = self._expected()
        seen = {"groups": 0, "base": -1}

        def crash(done: CleaningStep, segment: LogSegment) -> None:
            if done is step:
                if seen["groups"] == group:
                    seen["base"] = segment.base_offset
                    raise Crash
                seen["groups"] += 1

        crashed = False
        try:
            end, _ = self.log.clean(
                OffsetMap(MAP_MEMORY), first_dirty_offset=self.first_dirty, on_step=crash
            )
        except Crash:
            crashed = True
        if not crashed:  # fewer groups than ``group``: the pass completed
            self.first_dirty = end
            self.model = new
            return
        recovery_point = self.log.recovery_point
        for segment in self.log.segments.values():
            segment.close_handlers()  # a killed process: nothing flushed, sealed or trimmed
        self.log = self._open(recovery_point=recovery_point, had_clean_shutdown=False)
        # The checkpoint was not written: the next pass starts where the last one did.
        actual = self._entries()
        bounds = sorted({e[0] for e in old} | {e[0] for e in new} | {2**63})
        splits = [
            x
            for x in bounds
            if [e for e in new if e[0] < x] + [e for e in old if e[0] >= x] == actual
        ]
        assert splits, "the log mixes old and cleaned records within a group"
        self._check_recovered(step, seen["base"], actual, old, new)
        self.model = actual

    def _check_recovered(
        self,
        step: CleaningStep,
        base: int,
        actual: list[Entry],
        old: list[Entry],
        new: list[Entry],
    ) -> None:
        # Each group commits on its own: the crashed group ends at the next segment's
        # base after recovery.
        group_end = min((b for b in self.log.segments.base_offsets() if b > base), default=2**63)
        if step is CleaningStep.CLEANED_WRITTEN:  # not committed: rolled back
            assert [e for e in actual if e[0] >= base] == [e for e in old if e[0] >= base]
        else:  # committed: completed
            assert [e for e in actual if e[0] < group_end] == [e for e in new if e[0] < group_end]

    @rule()
    def reopen(self) -> None:
        self.log.close()
        self.log = self._open(recovery_point=self.log.recovery_point)

    # -- what must hold after every step ----------------------------------------------

    def _entries(self) -> list[Entry]:
        entries: list[Entry] = []
        for batch in self.log.batches(self.log.log_start_offset):
            assert isinstance(batch, DefaultRecordBatch)
            assert batch.is_valid()
            horizon = batch.delete_horizon_ms
            for record in batch.records():
                assert record.key is not None
                entries.append(
                    (
                        record.offset,
                        record.key,
                        record.value,
                        horizon if record.value is None else None,
                        batch.base_offset,
                    )
                )
        return entries

    @invariant()
    def log_holds_what_kafka_keeps(self) -> None:
        assert self._entries() == self.model
        if self.model:
            assert self.log.log_end_offset > self.model[-1][0]
        segments = self.log.segments.values()
        for segment, following in itertools.pairwise(segments):
            # Cleaned groups end where they ended: no hole between segments.
            assert segment.read_next_offset() == following.base_offset
        assert not [n for n in self.dir.iterdir() if n.suffix in (".cleaned", ".swap")]


CleanerMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
TestCleanerMachine = CleanerMachine.TestCase


# -- a log laid out in extension units (the file system's positions) ---------------------


def measure(batch: RecordBatch) -> int:
    """Units of a batch: a line per record, ``key value\n`` (a pure function of the
    bytes, as an extension index needs)."""
    return sum(2 + len(r.key or b"") + len(r.value or b"") for r in batch.records())


SPEC = ExtensionIndexSpec(".units", 32, measure)


class PositionedCleanerMachine(CleanerMachine):
    """The machine above on a log with an extension index: a pass's groups are swapped
    together and the units it removes leave from the front. After every step the units
    are laid end to end from ``extension_start`` and every batch's units are what its
    index says; a pass moves no unit at or after the first segment it did not clean."""

    def _open(self, **kwargs: Any) -> Log:
        return Log.open(self.dir, CONFIG, clock=self.clock, extension=SPEC, **kwargs)

    def _units_by_batch(self) -> dict[int, int]:
        units = self.log.extension_start
        found: dict[int, int] = {}
        for batch in self.log.batches(self.log.log_start_offset):
            found[batch.base_offset] = units
            units += measure(batch)
        assert units == self.log.extension_end
        return found

    @rule()
    def clean(self) -> None:
        before = self._units_by_batch()
        start, epoch = self.log.extension_start, self.log.layout_epoch
        removed = sum(len(e[1]) + len(e[2] or b"") + 2 for e in self.model) - sum(
            len(e[1]) + len(e[2] or b"") + 2 for e in self._expected()
        )
        uncleanable = self.log.active_segment.base_offset
        super().clean()
        after = self._units_by_batch()
        # What the pass did not clean kept its units; the rest moved up, never down.
        assert {b: u for b, u in after.items() if b >= uncleanable} == {
            b: u for b, u in before.items() if b >= uncleanable
        }
        assert all(u >= before[b] for b, u in after.items())
        assert self.log.extension_start == start + removed
        assert self.log.layout_epoch == epoch + (removed > 0)

    def _check_recovered(
        self,
        step: CleaningStep,
        base: int,
        actual: list[Entry],
        old: list[Entry],
        new: list[Entry],
    ) -> None:
        # The groups commit together: before the commit nothing, after it all.
        assert actual == (old if step is CleaningStep.CLEANED_WRITTEN else new)

    @invariant()
    def units_are_laid_end_to_end(self) -> None:
        self.log._check()  # each segment starts where the one before ends
        for offset, units in self._units_by_batch().items():
            floor_offset, floor_units = self.log.extension_position(offset)
            scanned = floor_units
            for batch in self.log.batches(floor_offset):
                if batch.base_offset >= offset:
                    break
                scanned += measure(batch)
            assert scanned == units, (offset, scanned, units)


PositionedCleanerMachine.TestCase.settings = settings(
    max_examples=40, stateful_step_count=40, deadline=None
)
TestPositionedCleanerMachine = PositionedCleanerMachine.TestCase

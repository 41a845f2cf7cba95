"""TimeIndex: bytes on disk, the reserved slot, maybe_append rules, lookups, truncation."""

from __future__ import annotations

import bisect
import shutil
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from storage.errors import CorruptIndexError, IndexFullError, InvalidOffsetError, ReadOnlyLogError
from storage.log.time_index import TimeIndex
from storage.record.record import NO_TIMESTAMP

BASE = 100
EMPTY = (NO_TIMESTAMP, BASE)


@pytest.fixture
def index_path(tmp_path: Path) -> Path:
    return tmp_path / "00000000000000000100.timeindex"


@pytest.fixture
def index(index_path: Path) -> Iterator[TimeIndex]:
    idx = TimeIndex(index_path, BASE, max_index_size=120)
    yield idx
    idx.close()


def filled(path: Path, entries: list[tuple[int, int]], max_index_size: int = 120) -> TimeIndex:
    idx = TimeIndex(path, BASE, max_index_size=max_index_size)
    for timestamp, offset in entries:
        idx.maybe_append(timestamp, offset)
    return idx


def entries_of(idx: TimeIndex) -> list[tuple[int, int]]:
    return [idx.entry(n) for n in range(idx.entries)]


# -- layout, preallocation, trimming ------------------------------------------------


def test_new_index_is_preallocated_zero_filled(index: TimeIndex, index_path: Path) -> None:
    assert index_path.read_bytes() == bytes(120)
    assert index.entries == 0
    assert index.max_entries == 10
    assert index.last_entry == EMPTY
    index._check()


def test_preallocation_rounds_down_to_whole_entries(index_path: Path) -> None:
    with TimeIndex(index_path, BASE, max_index_size=100) as idx:
        assert idx.max_entries == 8
        assert index_path.stat().st_size == 96


def test_exact_bytes_on_disk_after_close(index_path: Path) -> None:
    filled(index_path, [(1_700_000_000_000, 105), (1_700_000_000_500, 110)]).close()
    assert index_path.read_bytes() == (
        b"\x00\x00\x01\x8b\xcf\xe5\x68\x00\x00\x00\x00\x05"
        b"\x00\x00\x01\x8b\xcf\xe5\x69\xf4\x00\x00\x00\x0a"
    )
    assert index_path.read_bytes() == struct.pack(
        ">qiqi", 1_700_000_000_000, 5, 1_700_000_000_500, 10
    )


def test_reopen_after_close(index_path: Path) -> None:
    filled(index_path, [(1000, 110), (2000, 120)]).close()
    with TimeIndex(index_path, BASE, max_index_size=120) as idx:
        assert entries_of(idx) == [(1000, 110), (2000, 120)]
        assert idx.last_entry == (2000, 120)
        assert idx.is_full
        assert idx.resize(120)
        idx.maybe_append(3000, 130)
        idx._check()
    assert index_path.stat().st_size == 36


def test_crash_reopen_finds_exactly_the_entries(index_path: Path, tmp_path: Path) -> None:
    idx = filled(index_path, [(0, 101), (10, 150), (20, 180)])
    crashed = tmp_path / "crashed.timeindex"
    shutil.copyfile(index_path, crashed)  # never closed: zeros follow the entries
    idx.close()
    assert crashed.stat().st_size == 120
    for writable in (False, True):  # the writable pass appends: read first
        with TimeIndex(crashed, BASE, max_index_size=120, writable=writable) as reopened:
            assert entries_of(reopened) == [(0, 101), (10, 150), (20, 180)]
            assert reopened.last_entry == (20, 180)
            reopened.sanity_check()
            reopened._check()
            if writable:
                reopened.maybe_append(30, 190)
                assert reopened.entries == 4


def test_crash_reopen_of_untouched_preallocation_is_empty(index_path: Path) -> None:
    TimeIndex(index_path, BASE, max_index_size=120).close_handler()
    with TimeIndex(index_path, BASE, writable=False) as reader:
        assert reader.entries == 0
        assert reader.lookup(10**12) == EMPTY


def test_crash_reopen_after_truncation_does_not_revive_entries(index_path: Path) -> None:
    idx = filled(index_path, [(1000, 110), (2000, 120), (3000, 130)])
    idx.truncate_to(120)
    idx.close_handler()
    with TimeIndex(index_path, BASE, writable=False) as reader:
        assert entries_of(reader) == [(1000, 110)]


# -- read-only instances ------------------------------------------------------------


def test_reader_sees_appends_after_refresh(index_path: Path) -> None:
    writer = TimeIndex(index_path, BASE, max_index_size=120)
    reader = TimeIndex(index_path, BASE, max_index_size=120, writable=False)
    try:
        writer.maybe_append(1000, 110)
        assert reader.lookup(5000) == EMPTY
        assert reader.refresh()
        assert reader.lookup(5000) == (1000, 110)
        writer.maybe_append(2000, 120)
        assert reader.refresh()
        assert reader.last_entry == (2000, 120)
        assert reader.lookup(1999) == (1000, 110)
        reader._check()
        writer.close()
        assert reader.refresh()
        assert reader.length == 24
        assert not reader.refresh()
        assert entries_of(reader) == [(1000, 110), (2000, 120)]
    finally:
        writer.close()
        reader.close()


def test_reader_rejects_mutation(index_path: Path) -> None:
    filled(index_path, [(1000, 110)]).close()
    with TimeIndex(index_path, BASE, writable=False) as reader:
        with pytest.raises(ReadOnlyLogError):
            reader.maybe_append(2000, 120)
        with pytest.raises(ReadOnlyLogError):
            reader.truncate_to(BASE)
    assert index_path.stat().st_size == 12


# -- lookup ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        (-5, EMPTY),
        (0, EMPTY),
        (999, EMPTY),  # before the first entry
        (1000, (1000, 110)),  # exact
        (1500, (1000, 110)),  # between
        (2000, (2000, 120)),
        (3000, (3000, 130)),  # exact last
        (2**62, (3000, 130)),  # after the last
    ],
)
def test_lookup(index: TimeIndex, target: int, expected: tuple[int, int]) -> None:
    for entry in ((1000, 110), (2000, 120), (3000, 130)):
        index.maybe_append(*entry)
    assert index.lookup(target) == expected


def test_lookup_in_empty_index(index: TimeIndex) -> None:
    assert index.lookup(0) == EMPTY
    assert index.lookup(10**12) == EMPTY


def test_lookup_across_warm_and_cold_sections(tmp_path: Path) -> None:
    # 8 KiB warm section = 682 entries: 3000 entries exercise both branches.
    timestamps = [10 + 7 * n for n in range(3000)]
    with TimeIndex(tmp_path / "big.timeindex", BASE, max_index_size=3001 * 12) as idx:
        for n, ts in enumerate(timestamps):
            idx.maybe_append(ts, BASE + 1 + n)
        for target in range(0, timestamps[-1] + 10, 3):
            slot = bisect.bisect_right(timestamps, target) - 1
            expected = (timestamps[slot], BASE + 1 + slot) if slot >= 0 else EMPTY
            assert idx.lookup(target) == expected


def test_entry_out_of_range(index: TimeIndex) -> None:
    index.maybe_append(1000, 110)
    assert index.entry(0) == (1000, 110)
    with pytest.raises(IndexError):
        index.entry(1)


# -- maybe_append -------------------------------------------------------------------


def test_no_timestamp_is_not_indexed(index: TimeIndex) -> None:
    index.maybe_append(NO_TIMESTAMP, 110)
    assert index.entries == 0


def test_equal_timestamp_or_repeated_entry_is_ignored(index: TimeIndex) -> None:
    index.maybe_append(1000, 110)
    index.maybe_append(1000, 110)  # the log re-appends its last entry on roll
    index.maybe_append(1000, 120)
    assert entries_of(index) == [(1000, 110)]


def test_larger_timestamp_at_same_offset_is_appended(index: TimeIndex) -> None:
    # Kafka rejects only a smaller offset.
    index.maybe_append(1000, 110)
    index.maybe_append(2000, 110)
    assert entries_of(index) == [(1000, 110), (2000, 110)]
    index._check()


def test_smaller_offset_raises(index: TimeIndex) -> None:
    index.maybe_append(1000, 110)
    with pytest.raises(InvalidOffsetError, match="offset"):
        index.maybe_append(2000, 109)
    assert index.entries == 1


def test_smaller_timestamp_raises(index: TimeIndex) -> None:
    index.maybe_append(1000, 110)
    with pytest.raises(InvalidOffsetError, match="timestamp"):
        index.maybe_append(999, 120)
    assert index.entries == 1


@pytest.mark.parametrize("offset", [BASE - 1, BASE + 2**31])
def test_unrepresentable_offset_raises(index: TimeIndex, offset: int) -> None:
    with pytest.raises(InvalidOffsetError):
        index.maybe_append(1000, offset)


def test_last_slot_is_reserved_for_the_roll(index_path: Path) -> None:
    with TimeIndex(index_path, BASE, max_index_size=36) as idx:
        assert idx.max_entries == 3
        idx.maybe_append(1000, 110)
        assert not idx.is_full
        idx.maybe_append(2000, 120)
        assert idx.is_full  # one slot left, reserved
        with pytest.raises(IndexFullError):
            idx.maybe_append(3000, 130)
        idx.maybe_append(3000, 130, skip_full_check=True)
        assert idx.entries == 3
        idx.maybe_append(3000, 130, skip_full_check=True)  # a repeat needs no slot
        with pytest.raises(IndexFullError):
            idx.maybe_append(4000, 140, skip_full_check=True)
        idx._check()


# -- truncate_to, reset -------------------------------------------------------------


@pytest.mark.parametrize(
    ("offset", "remaining"),
    [
        (0, []),
        (110, []),
        (111, [110]),
        (120, [110]),
        (130, [110, 120]),
        (131, [110, 120, 130]),
        (10**9, [110, 120, 130]),
    ],
)
def test_truncate_to(index: TimeIndex, offset: int, remaining: list[int]) -> None:
    for ts, o in ((1000, 110), (2000, 120), (3000, 130)):
        index.maybe_append(ts, o)
    index.truncate_to(offset)
    assert [index.entry(n)[1] for n in range(index.entries)] == remaining
    assert index.last_entry == (index.entry(index.entries - 1) if remaining else EMPTY)
    index._check()
    index.maybe_append(500 if not remaining else 5000, 140)  # the last entry sets the floor
    index._check()


def test_truncate_to_removes_every_entry_at_the_offset(index: TimeIndex) -> None:
    for ts, o in ((1000, 110), (2000, 120), (3000, 120), (4000, 130)):
        index.maybe_append(ts, o)
    index.truncate_to(120)
    assert entries_of(index) == [(1000, 110)]


def test_reset_keeps_preallocation(index_path: Path) -> None:
    idx = filled(index_path, [(1000, 110)])
    idx.trim_to_valid_size()
    idx.reset()
    assert index_path.read_bytes() == bytes(120)
    assert idx.last_entry == EMPTY
    idx.maybe_append(5, 101)
    idx.close()


# -- sanity_check -------------------------------------------------------------------


def test_sanity_check_passes_on_valid_index(index: TimeIndex) -> None:
    index.sanity_check()
    index.maybe_append(1000, 110)
    index.sanity_check()


def test_sanity_check_size_not_multiple_of_entry(index_path: Path) -> None:
    index_path.write_bytes(struct.pack(">qi", 1000, 10) + b"\x01")
    with (
        TimeIndex(index_path, BASE, writable=False) as idx,
        pytest.raises(CorruptIndexError, match="multiple of 12"),
    ):
        idx.sanity_check()


def test_sanity_check_decreasing_timestamps(index_path: Path) -> None:
    index_path.write_bytes(struct.pack(">qiqi", 1000, 10, 500, 20))
    with (
        TimeIndex(index_path, BASE, writable=False) as idx,
        pytest.raises(CorruptIndexError, match="less than the first timestamp"),
    ):
        idx.sanity_check()


def test_sanity_check_last_offset_below_base(index_path: Path) -> None:
    index_path.write_bytes(struct.pack(">qiqi", 1000, 10, 2000, -3))
    with (
        TimeIndex(index_path, BASE, writable=False) as idx,
        pytest.raises(CorruptIndexError, match="less than the base offset"),
    ):
        idx.sanity_check()


# -- model-based ------------------------------------------------------------------------


@settings(max_examples=50, deadline=None)
@given(
    steps=st.lists(st.tuples(st.integers(1, 100), st.integers(1, 50)), max_size=60),
    targets=st.lists(st.integers(-2, 8000), max_size=30),
)
def test_lookup_matches_sorted_list(steps: list[tuple[int, int]], targets: list[int]) -> None:
    model: list[tuple[int, int]] = []
    ts, offset = 0, BASE
    for ts_gap, offset_gap in steps:
        ts, offset = ts + ts_gap, offset + offset_gap
        model.append((ts, offset))
    with (
        tempfile.TemporaryDirectory() as tmp,
        TimeIndex(Path(tmp) / "x.timeindex", BASE, max_index_size=12 * 64) as idx,
    ):
        for entry in model:
            idx.maybe_append(*entry)
        timestamps = [t for t, _ in model]
        for target in targets:
            slot = bisect.bisect_right(timestamps, target) - 1
            assert idx.lookup(target) == (model[slot] if slot >= 0 else EMPTY)


class TimeIndexMachine(RuleBasedStateMachine):
    """Drive a writer (and a reader) against a sorted list of (timestamp, offset)."""

    MAX_ENTRIES = 30

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp())
        self.path = self.dir / "00000000000000000100.timeindex"
        self.model: list[tuple[int, int]] = []
        self.index = TimeIndex(self.path, BASE, max_index_size=self.MAX_ENTRIES * 12)
        self.reader = TimeIndex(self.path, BASE, writable=False)

    def teardown(self) -> None:
        self.index.close()
        self.reader.close()
        shutil.rmtree(self.dir)

    def last(self) -> tuple[int, int]:
        return self.model[-1] if self.model else EMPTY

    @rule(
        ts_gap=st.integers(-2, 40),
        offset_gap=st.integers(-2, 40),
        skip_full_check=st.booleans(),
    )
    def maybe_append(self, ts_gap: int, offset_gap: int, skip_full_check: bool) -> None:
        last_ts, last_offset = self.last()
        ts, offset = last_ts + ts_gap, last_offset + offset_gap
        n = len(self.model)
        if not skip_full_check and n >= self.MAX_ENTRIES - 1:
            error: type[Exception] | None = IndexFullError
        elif n and (offset < last_offset or ts < last_ts):
            error = InvalidOffsetError
        elif ts <= last_ts:
            error = None  # ignored
        elif offset < BASE:
            error = InvalidOffsetError
        elif n >= self.MAX_ENTRIES:
            error = IndexFullError
        else:
            self.index.maybe_append(ts, offset, skip_full_check)
            self.model.append((ts, offset))
            return
        if error is None:
            self.index.maybe_append(ts, offset, skip_full_check)
        else:
            with pytest.raises(error):
                self.index.maybe_append(ts, offset, skip_full_check)

    @rule(wanted=st.integers(-3, 1300))
    def lookup(self, wanted: int) -> None:
        timestamps = [t for t, _ in self.model]
        slot = bisect.bisect_right(timestamps, wanted) - 1
        assert self.index.lookup(wanted) == (self.model[slot] if slot >= 0 else EMPTY)

    @rule(offset=st.integers(BASE - 3, BASE + 1300))
    def truncate_to(self, offset: int) -> None:
        self.index.truncate_to(offset)
        self.model = [e for e in self.model if e[1] < offset]

    @rule()
    def reset(self) -> None:
        self.index.reset()
        self.model = []

    def reopen_sees_all(self) -> bool:
        # A reopen stops at a relative offset 0 after the first entry (a repeated base
        # offset), and an all-zero first entry alone reads as preallocation.
        return all(o > BASE for _, o in self.model[1:]) and self.model != [(0, BASE)]

    @precondition(reopen_sees_all)
    @rule()
    def clean_reopen(self) -> None:
        self.index.close()
        self.index = TimeIndex(self.path, BASE, max_index_size=self.MAX_ENTRIES * 12)
        self.index.resize(self.MAX_ENTRIES * 12)

    @precondition(reopen_sees_all)
    @rule()
    def crash_reopen(self) -> None:
        self.index.close_handler()
        self.index = TimeIndex(self.path, BASE, max_index_size=self.MAX_ENTRIES * 12)

    @precondition(reopen_sees_all)
    @rule()
    def reader_refresh(self) -> None:
        self.reader.refresh()
        assert [self.reader.entry(n) for n in range(self.reader.entries)] == self.model
        self.reader._check()

    @invariant()
    def matches_model(self) -> None:
        self.index._check()
        assert self.index.entries == len(self.model)
        assert self.index.last_entry == self.last()
        self.index.sanity_check()


TimeIndexMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None
)
test_time_index_state_machine = TimeIndexMachine.TestCase

"""OffsetIndex: bytes on disk, preallocation, crash reopen, readers, lookups, truncation."""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
import shutil
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)

from storage.errors import (
    ConfigError,
    CorruptIndexError,
    IndexFullError,
    InvalidOffsetError,
    ReadOnlyLogError,
    StorageError,
)
from storage.log.offset_index import OffsetIndex

BASE = 100


@pytest.fixture
def index_path(tmp_path: Path) -> Path:
    return tmp_path / "00000000000000000100.index"


@pytest.fixture
def index(index_path: Path) -> Iterator[OffsetIndex]:
    idx = OffsetIndex(index_path, BASE, max_index_size=80)
    yield idx
    idx.close()


def filled(path: Path, entries: list[tuple[int, int]], max_index_size: int = 80) -> OffsetIndex:
    idx = OffsetIndex(path, BASE, max_index_size=max_index_size)
    for offset, position in entries:
        idx.append(offset, position)
    return idx


# -- layout, preallocation, trimming ------------------------------------------------


def test_new_index_is_preallocated_zero_filled(index: OffsetIndex, index_path: Path) -> None:
    assert index_path.read_bytes() == bytes(80)
    assert index.entries == 0
    assert index.max_entries == 10
    assert index.length == 80
    assert index.size_in_bytes == 0
    assert index.last_offset == BASE
    index._check()


def test_preallocation_rounds_down_to_whole_entries(index_path: Path) -> None:
    with OffsetIndex(index_path, BASE, max_index_size=30) as idx:
        assert idx.max_entries == 3
        assert index_path.stat().st_size == 24


def test_default_preallocation_is_ten_mebibytes(index_path: Path) -> None:
    with OffsetIndex(index_path, BASE) as idx:
        assert index_path.stat().st_size == 10 * 1024 * 1024
        assert idx.max_entries == 10 * 1024 * 1024 // 8


def test_max_index_size_below_one_entry_is_rejected(index_path: Path) -> None:
    with pytest.raises(ConfigError):
        OffsetIndex(index_path, BASE, max_index_size=7)


def test_exact_bytes_on_disk_after_close(index_path: Path) -> None:
    idx = filled(index_path, [(105, 0x1234), (110, 4096), (2**31 - 1 + BASE, 2**31 - 1)])
    idx.close()
    assert index_path.read_bytes() == (
        b"\x00\x00\x00\x05\x00\x00\x12\x34"
        b"\x00\x00\x00\x0a\x00\x00\x10\x00"
        b"\x7f\xff\xff\xff\x7f\xff\xff\xff"
    )


def test_close_trims_and_is_idempotent(index_path: Path) -> None:
    idx = filled(index_path, [(101, 10), (102, 20)])
    assert index_path.stat().st_size == 80
    idx.close()
    idx.close()
    assert idx.closed
    assert index_path.stat().st_size == 16


def _descriptors_of(path: Path) -> int:
    """Open descriptors of this process on ``path`` (a mapping's own one included)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor, closed by now
            count += os.readlink(f"/proc/self/fd/{fd}") == str(path)
    return count


def test_a_writable_index_keeps_only_its_mappings_descriptor(index_path: Path) -> None:
    # CPython's mmap holds a duplicate of the descriptor it maps; the index's own would
    # be a second per index, two more per segment (as Kafka, it closes it once mapped).
    idx = filled(index_path, [(101, 10), (102, 20)])
    assert _descriptors_of(index_path) == 1
    idx.trim_to_valid_size()  # a resize opens the file by name, and closes it again
    assert _descriptors_of(index_path) == 1
    assert idx.resize(80)
    idx.append(103, 30)
    idx._check()
    idx.close()
    assert _descriptors_of(index_path) == 0
    assert len(index_path.read_bytes()) == 24


def test_a_reader_keeps_its_descriptor_and_follows_a_rename(index_path: Path) -> None:
    writer = filled(index_path, [(101, 10)])
    reader = OffsetIndex(index_path, BASE, writable=False)
    assert _descriptors_of(index_path) == 3  # the writer's mapping, the reader's two
    deleted = index_path.with_name(index_path.name + ".deleted")
    writer.rename_to(deleted)
    writer.append(102, 20)
    assert reader.refresh()  # through its descriptor: the name changed under it
    assert reader.entries == 2
    reader.close()
    writer.close()
    assert deleted.stat().st_size == 16


def test_an_index_deleted_under_its_writer_is_written_again(
    index_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    idx = filled(index_path, [(105, 0x1234), (110, 4096)])
    index_path.unlink()
    with caplog.at_level(logging.WARNING, logger="storage.log.index"):
        idx.close()  # trims: the file is opened by name, and is gone
    assert "was deleted while open" in caplog.text
    assert index_path.read_bytes() == (
        b"\x00\x00\x00\x05\x00\x00\x12\x34\x00\x00\x00\x0a\x00\x00\x10\x00"
    )
    with OffsetIndex(index_path, BASE, writable=False) as reader:
        assert reader.lookup(111) == (110, 4096)


def test_close_of_empty_index_leaves_empty_file(index_path: Path) -> None:
    OffsetIndex(index_path, BASE, max_index_size=80).close()
    assert index_path.stat().st_size == 0


def test_reopen_after_close_is_full_until_resized(index_path: Path) -> None:
    filled(index_path, [(110, 10), (120, 20)]).close()
    with OffsetIndex(index_path, BASE, max_index_size=80) as idx:
        assert idx.entries == 2
        assert idx.last_offset == 120
        assert idx.lookup(125) == (120, 20)
        assert idx.is_full
        assert index_path.stat().st_size == 16  # a writable reopen does not regrow
        assert idx.resize(80)
        assert not idx.resize(80)
        assert not idx.is_full
        idx.append(130, 30)
        idx._check()
    assert index_path.stat().st_size == 24


def test_reopen_of_empty_file_is_full_until_resized(index_path: Path) -> None:
    # As Kafka (only a file it creates is preallocated): the empty index of a sealed
    # segment is not grown to 10 MiB and mapped at every open of the log.
    index_path.touch()
    with OffsetIndex(index_path, BASE, max_index_size=80) as idx:
        assert index_path.stat().st_size == 0
        assert (idx.entries, idx.is_full, idx.lookup(105)) == (0, True, (BASE, 0))
        idx._check()
        assert idx.resize(80)
        idx.append(101, 7)
        idx._check()
    assert index_path.stat().st_size == 8


def test_crash_reopen_finds_exactly_the_entries(index_path: Path, tmp_path: Path) -> None:
    idx = filled(index_path, [(101, 0), (150, 4100), (180, 8300)])
    idx.flush()
    crashed = tmp_path / "crashed.index"
    shutil.copyfile(index_path, crashed)  # the writer never closed: zeros follow
    idx.close()
    assert crashed.stat().st_size == 80
    for writable in (False, True):  # the writable pass appends: read first
        with OffsetIndex(crashed, BASE, max_index_size=80, writable=writable) as reopened:
            assert reopened.entries == 3
            assert reopened.last_offset == 180
            assert [reopened.entry(n) for n in range(3)] == [(101, 0), (150, 4100), (180, 8300)]
            reopened.sanity_check()
            reopened._check()
            if writable:
                assert reopened.max_entries == 10
                reopened.append(190, 9000)
                assert reopened.entries == 4


def test_crash_reopen_of_untouched_preallocation_is_empty(index_path: Path) -> None:
    idx = OffsetIndex(index_path, BASE, max_index_size=80)
    idx.close_handler()  # a crash: no trim
    assert index_path.stat().st_size == 80
    with OffsetIndex(index_path, BASE, writable=False) as reader:
        assert reader.entries == 0
        assert reader.lookup(500) == (BASE, 0)


def test_crash_reopen_after_truncation_does_not_revive_entries(index_path: Path) -> None:
    idx = filled(index_path, [(110, 10), (120, 20), (130, 30)])
    idx.truncate_to(120)
    idx.close_handler()  # a crash: no trim
    with OffsetIndex(index_path, BASE, writable=False) as reader:
        assert reader.entries == 1
        assert reader.last_offset == 110


def test_full_entry_with_relative_offset_zero_is_kept(index_path: Path) -> None:
    idx = filled(index_path, [(BASE, 0), (110, 10)])
    idx.close_handler()
    with OffsetIndex(index_path, BASE, writable=False) as reader:
        assert reader.entries == 2
    index_path.write_bytes(struct.pack(">ii", 0, 7) + bytes(16))
    with OffsetIndex(index_path, BASE, writable=False) as reader:
        assert reader.entries == 1
        assert reader.entry(0) == (BASE, 7)


# -- read-only instances ------------------------------------------------------------


def test_reader_sees_appends_after_refresh(index_path: Path) -> None:
    writer = OffsetIndex(index_path, BASE, max_index_size=80)
    reader = OffsetIndex(index_path, BASE, max_index_size=80, writable=False)
    try:
        assert reader.entries == 0
        assert not reader.refresh()
        writer.append(110, 10)
        writer.append(120, 20)
        assert reader.entries == 0  # a stale view until refreshed
        assert reader.lookup(125) == (BASE, 0)
        assert reader.refresh()
        assert reader.entries == 2
        assert reader.lookup(125) == (120, 20)
        reader._check()
        writer.close()  # trims under the reader
        assert reader.refresh()
        assert reader.length == 16
        assert reader.entries == 2
        assert reader.lookup(10**9) == (120, 20)
        reader._check()
    finally:
        writer.close()
        reader.close()


def test_reader_sees_truncation_after_refresh(index_path: Path) -> None:
    with (
        filled(index_path, [(110, 10), (120, 20)]) as writer,
        OffsetIndex(index_path, BASE, writable=False) as reader,
    ):
        assert reader.entries == 2
        writer.truncate_to(115)
        assert reader.refresh()
        assert reader.entries == 1
        assert reader.last_offset == 110


def test_reader_of_missing_file_is_empty_and_creates_nothing(index_path: Path) -> None:
    with OffsetIndex(index_path, BASE, writable=False) as reader:
        assert reader.entries == 0
        assert reader.lookup(123) == (BASE, 0)
        assert not index_path.exists()
        assert not reader.refresh()
        filled(index_path, [(110, 10)]).close()
        assert reader.refresh()
        assert reader.lookup(123) == (110, 10)


def test_reader_never_changes_the_file(index_path: Path) -> None:
    idx = filled(index_path, [(110, 10)])
    idx.close_handler()
    before = index_path.read_bytes()
    reader = OffsetIndex(index_path, BASE, max_index_size=8000, writable=False)
    reader.flush()
    reader.close()
    assert index_path.read_bytes() == before


@pytest.mark.parametrize(
    "mutation",
    [
        lambda idx: idx.append(200, 0),
        lambda idx: idx.truncate_to(0),
        lambda idx: idx.resize(800),
        lambda idx: idx.reset(),
        lambda idx: idx.trim_to_valid_size(),
    ],
)
def test_reader_rejects_mutations(index_path: Path, mutation: object) -> None:
    filled(index_path, [(110, 10)]).close()
    with OffsetIndex(index_path, BASE, writable=False) as reader, pytest.raises(ReadOnlyLogError):
        mutation(reader)  # type: ignore[operator]


def test_reader_follows_a_renamed_file(index_path: Path, tmp_path: Path) -> None:
    with (
        filled(index_path, [(110, 10)]) as writer,
        OffsetIndex(index_path, BASE, writable=False) as reader,
    ):
        writer.rename_to(tmp_path / "renamed.index.deleted")
        writer.append(120, 20)
        assert reader.refresh()
        assert reader.last_offset == 120


# -- lookup ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        (0, (BASE, 0)),  # below the base offset
        (BASE, (BASE, 0)),
        (109, (BASE, 0)),  # before the first entry
        (110, (110, 10)),  # exact
        (115, (110, 10)),  # between
        (120, (120, 20)),
        (130, (130, 30)),  # exact last
        (131, (130, 30)),  # after the last
        (2**63 - 1, (130, 30)),
    ],
)
def test_lookup(index: OffsetIndex, target: int, expected: tuple[int, int]) -> None:
    for offset in (110, 120, 130):
        index.append(offset, offset - BASE)
    assert index.lookup(target) == expected


def test_lookup_in_empty_index(index: OffsetIndex) -> None:
    assert index.lookup(BASE) == (BASE, 0)
    assert index.lookup(10**6) == (BASE, 0)


def test_lookup_across_warm_and_cold_sections(tmp_path: Path) -> None:
    # 8 KiB warm section = 1024 entries: 5000 entries exercise both branches.
    offsets = [BASE + 1 + 3 * n for n in range(5000)]
    with OffsetIndex(tmp_path / "big.index", BASE, max_index_size=5000 * 8) as idx:
        for offset in offsets:
            idx.append(offset, offset * 2)
        assert idx.is_full
        for target in range(BASE - 1, offsets[-1] + 3):
            slot = bisect.bisect_right(offsets, target) - 1
            expected = (offsets[slot], offsets[slot] * 2) if slot >= 0 else (BASE, 0)
            assert idx.lookup(target) == expected


def test_entry(index: OffsetIndex) -> None:
    index.append(110, 10)
    assert index.entry(0) == (110, 10)
    with pytest.raises(IndexError):
        index.entry(1)
    with pytest.raises(IndexError):
        index.entry(-1)


# -- append -------------------------------------------------------------------------


@pytest.mark.parametrize("offset", [110, 109, 50])
def test_append_out_of_order_raises(index: OffsetIndex, offset: int) -> None:
    index.append(110, 10)
    with pytest.raises(InvalidOffsetError):
        index.append(offset, 20)
    assert index.entries == 1


@pytest.mark.parametrize("offset", [BASE - 1, BASE + 2**31])
def test_append_of_unrepresentable_offset_raises(index: OffsetIndex, offset: int) -> None:
    assert not index.can_append_offset(offset)
    with pytest.raises(InvalidOffsetError):
        index.append(offset, 0)
    assert index.entries == 0


def test_can_append_offset_bounds(index: OffsetIndex) -> None:
    assert index.can_append_offset(BASE)
    assert index.can_append_offset(BASE + 2**31 - 1)
    assert not index.can_append_offset(BASE + 2**31)
    assert not index.can_append_offset(BASE - 1)


def test_full_index_rejects_append(index_path: Path) -> None:
    with OffsetIndex(index_path, BASE, max_index_size=24) as idx:
        for offset in (110, 120, 130):
            assert not idx.is_full
            idx.append(offset, 0)
        assert idx.is_full
        with pytest.raises(IndexFullError) as info:
            idx.append(140, 0)
        assert isinstance(info.value, IndexError)
        assert isinstance(info.value, StorageError)
        assert idx.entries == 3


def test_closed_index_rejects_use(index_path: Path) -> None:
    idx = filled(index_path, [(110, 10)])
    idx.close()
    with pytest.raises(ValueError, match="closed"):
        idx.lookup(110)
    with pytest.raises(ValueError, match="closed"):
        idx.append(120, 0)


# -- truncate_to, reset, resize -----------------------------------------------------


@pytest.mark.parametrize(
    ("offset", "remaining"),
    [
        (0, []),
        (110, []),
        (115, [110]),
        (120, [110]),
        (125, [110, 120]),
        (130, [110, 120]),
        (131, [110, 120, 130]),
        (10**9, [110, 120, 130]),
    ],
)
def test_truncate_to(index: OffsetIndex, offset: int, remaining: list[int]) -> None:
    for o in (110, 120, 130):
        index.append(o, o)
    index.truncate_to(offset)
    assert [index.entry(n)[0] for n in range(index.entries)] == remaining
    assert index.last_offset == (remaining[-1] if remaining else BASE)
    index._check()
    index.append(140, 140)  # appends resume after the new last entry
    index._check()


def test_reset_keeps_preallocation(index_path: Path) -> None:
    idx = filled(index_path, [(110, 10), (120, 20)])
    idx.trim_to_valid_size()
    assert index_path.stat().st_size == 16
    idx.reset()
    assert idx.entries == 0
    assert index_path.read_bytes() == bytes(80)
    idx.append(105, 5)
    idx._check()
    idx.close()


def test_trim_to_zero_entries_then_grow(index_path: Path) -> None:
    with OffsetIndex(index_path, BASE, max_index_size=80) as idx:
        idx.trim_to_valid_size()
        assert idx.length == 0
        assert idx.max_entries == 0
        with pytest.raises(IndexFullError):
            idx.append(110, 0)
        assert idx.lookup(110) == (BASE, 0)
        idx.resize(40)
        idx.append(110, 0)
        idx._check()


def test_resize_below_entries_is_refused(index: OffsetIndex) -> None:
    index.append(110, 0)
    index.append(120, 0)
    with pytest.raises(ValueError, match="drop entries"):
        index.resize(8)
    assert index.entries == 2


# -- files ----------------------------------------------------------------------------


def test_rename_then_close_trims_the_new_file(index_path: Path, tmp_path: Path) -> None:
    idx = filled(index_path, [(110, 10)])
    target = tmp_path / "00000000000000000100.index.deleted"
    idx.rename_to(target)
    assert idx.path == target
    assert not index_path.exists()
    idx.close()
    assert target.stat().st_size == 8


def test_delete_if_exists(index_path: Path) -> None:
    idx = filled(index_path, [(110, 10)])
    assert idx.delete_if_exists()
    assert not index_path.exists()
    assert idx.closed
    assert not idx.delete_if_exists()


# -- sanity_check -------------------------------------------------------------------


def test_sanity_check_passes_on_valid_index(index: OffsetIndex) -> None:
    index.sanity_check()
    index.append(110, 10)
    index.sanity_check()


def test_sanity_check_size_not_multiple_of_entry(index_path: Path) -> None:
    index_path.write_bytes(struct.pack(">ii", 10, 100) + b"\x00\x01\x02\x03")
    with OffsetIndex(index_path, BASE, writable=False) as idx:
        assert idx.entries == 1
        with pytest.raises(CorruptIndexError, match="multiple of 8"):
            idx.sanity_check()


def test_sanity_check_last_offset_below_base(index_path: Path) -> None:
    index_path.write_bytes(struct.pack(">ii", 10, 100) + struct.pack(">ii", -5, 200))
    with OffsetIndex(index_path, BASE, writable=False) as idx:
        with pytest.raises(CorruptIndexError, match="less than the base offset") as info:
            idx.sanity_check()
        assert info.value.path == index_path


def test_garbage_file_is_reported_not_crashed_on(index_path: Path) -> None:
    index_path.write_bytes(bytes(range(256)) * 3 + b"\xff")
    with OffsetIndex(index_path, BASE, writable=False) as idx:
        idx.lookup(BASE + 10)
        with pytest.raises(CorruptIndexError):
            idx.sanity_check()


# -- model-based ------------------------------------------------------------------------


@settings(max_examples=50, deadline=None)
@given(
    gaps=st.lists(st.integers(1, 1000), max_size=60),
    targets=st.lists(st.integers(0, 70_000), max_size=30),
)
def test_lookup_matches_sorted_list(gaps: list[int], targets: list[int]) -> None:
    offsets: list[int] = []
    for gap in gaps:
        offsets.append((offsets[-1] if offsets else BASE) + gap)
    with (
        tempfile.TemporaryDirectory() as tmp,
        OffsetIndex(Path(tmp) / "x.index", BASE, max_index_size=8 * 64) as idx,
    ):
        for n, offset in enumerate(offsets):
            idx.append(offset, n)
        for target in targets:
            slot = bisect.bisect_right(offsets, target) - 1
            expected = (offsets[slot], slot) if slot >= 0 else (BASE, 0)
            assert idx.lookup(target) == expected


class OffsetIndexMachine(RuleBasedStateMachine):
    """Drive a writer (and a reader) against a sorted list of (offset, position)."""

    MAX_ENTRIES = 40

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp())
        self.path = self.dir / "00000000000000000100.index"
        self.model: list[tuple[int, int]] = []
        self.index = OffsetIndex(self.path, BASE, max_index_size=self.MAX_ENTRIES * 8)
        self.reader = OffsetIndex(self.path, BASE, writable=False)

    def teardown(self) -> None:
        self.index.close()
        self.reader.close()
        shutil.rmtree(self.dir)

    def last(self) -> int:
        return self.model[-1][0] if self.model else BASE

    @rule(gap=st.integers(-3, 50), position=st.integers(0, 2**31 - 1))
    def append(self, gap: int, position: int) -> None:
        offset = self.last() + gap
        if len(self.model) >= self.MAX_ENTRIES:
            with pytest.raises(IndexFullError):
                self.index.append(offset, position)
        elif offset < BASE or (self.model and gap <= 0):
            with pytest.raises(InvalidOffsetError):
                self.index.append(offset, position)
        else:
            self.index.append(offset, position)
            self.model.append((offset, position))

    @rule(wanted=st.integers(BASE - 5, BASE + 2500))
    def lookup(self, wanted: int) -> None:
        offsets = [o for o, _ in self.model]
        slot = bisect.bisect_right(offsets, wanted) - 1
        expected = self.model[slot] if slot >= 0 else (BASE, 0)
        assert self.index.lookup(wanted) == expected

    @rule(offset=st.integers(BASE - 5, BASE + 2500))
    def truncate_to(self, offset: int) -> None:
        self.index.truncate_to(offset)
        self.model = [e for e in self.model if e[0] < offset]

    @rule()
    def reset(self) -> None:
        self.index.reset()
        self.model = []

    def reopen_sees_all(self) -> bool:
        # An all-zero first entry alone, (base_offset, 0), reads as preallocation.
        return self.model != [(BASE, 0)]

    @precondition(reopen_sees_all)
    @rule()
    def clean_reopen(self) -> None:
        self.index.close()
        self.index = OffsetIndex(self.path, BASE, max_index_size=self.MAX_ENTRIES * 8)
        self.index.resize(self.MAX_ENTRIES * 8)  # becoming the active segment again

    @precondition(reopen_sees_all)
    @rule()
    def crash_reopen(self) -> None:
        self.index.close_handler()
        self.index = OffsetIndex(self.path, BASE, max_index_size=self.MAX_ENTRIES * 8)

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
        assert self.index.last_offset == self.last()
        self.index.sanity_check()


OffsetIndexMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None
)
test_offset_index_state_machine = OffsetIndexMachine.TestCase

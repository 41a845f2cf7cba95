"""Log compaction with Kafka's semantics: the offset map, one pass over a log, the
choice of log, the checkpoint, a crash at each step of a swap, and kafka-python's view
of cleaned segments."""

from __future__ import annotations

import itertools
import os
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka.record.memory_records import MemoryRecords

from storage import (
    CleaningStep,
    CompressionType,
    DefaultRecordBatch,
    ExtensionIndexSpec,
    Log,
    LogCleaningAbortedError,
    LogConfig,
    LogManager,
    OffsetMap,
    RecordBatch,
    build_record_batch,
)
from storage.log.checkpoint import read_extension_start_checkpoint, read_offset_checkpoint
from storage.log.cleaner import filter_batch, group_segments_by_size
from storage.log.cleaner_manager import cleanable_offsets
from storage.log.segment import LogSegment
from tests.conftest import ManualClock

DAY = 24 * 3600 * 1000
BIG_MAP = 64 * 1024 * 1024

Triple = tuple[int, bytes | None, bytes | None]


def compacted(**overrides: object) -> LogConfig:
    settings: dict[str, object] = {
        "cleanup_policy": ("compact",),
        "segment_bytes": 1024,
        "delete_retention_ms": 1000,
        "file_delete_delay_ms": 0,
    }
    settings.update(overrides)
    return LogConfig(**settings)  # type: ignore[arg-type]


def triples(log: Log) -> list[Triple]:
    return [(r.offset, r.key, r.value) for r in log.records(log.log_start_offset)]


def batches(log: Log) -> Iterator[DefaultRecordBatch]:
    for batch in log.batches(log.log_start_offset):
        assert isinstance(batch, DefaultRecordBatch)
        yield batch


def kafka_rules(appended: list[Triple], uncleanable: int) -> list[Triple]:
    """What one pass with room for every key keeps: below ``uncleanable`` the latest
    record of each key (tombstones too, before their horizon), the rest as it is."""
    latest = {key: offset for offset, key, _ in appended if offset < uncleanable}
    return [t for t in appended if t[0] >= uncleanable or latest[t[1]] == t[0]]


@pytest.fixture
def log(log_dir: Path, clock: ManualClock) -> Iterator[Log]:
    opened = Log.open(log_dir / "t-0", compacted(), clock=clock)
    yield opened
    opened.close()


def fill(
    log: Log, clock: ManualClock, n: int, keys: int, *, tombstone_every: int = 0
) -> list[Triple]:
    appended: list[Triple] = []
    for i in range(n):
        key = b"key-%d" % (i % keys)
        value = None if tombstone_every and i % tombstone_every == 0 else b"value-%d" % i
        info = log.append([value], keys=[key], timestamps=clock.now_ms)
        appended.append((info.first_offset, key, value))
        clock.advance(1)
    return appended


# -- the offset map ---------------------------------------------------------------------


def test_offset_map_is_bounded_by_kafkas_cost_per_entry() -> None:
    offset_map = OffsetMap(24 * 100, load_factor=0.5)
    assert (offset_map.slots, offset_map.max_entries) == (100, 50)
    keys: list[bytes | None] = [b"k%d" % i for i in range(80)]
    taken = offset_map.put_all(keys, list(range(80)), 0)
    assert taken == 50
    assert len(offset_map) == 50
    assert offset_map.is_full
    assert offset_map.latest_offset == 49  # the last offset mapped
    assert offset_map.get(b"k49") == 49
    assert offset_map.get(b"k50") == -1
    offset_map.put(b"k0", 100)  # a known key still fits
    assert offset_map.get(b"k0") == 100
    with pytest.raises(OverflowError):
        offset_map.put(b"new", 101)
    with pytest.raises(ValueError, match="holds no entry"):
        OffsetMap(23)


def test_offset_map_hashes_long_keys_and_skips_null_keys() -> None:
    offset_map = OffsetMap(24 * 10)
    long_key = b"x" * 100
    assert offset_map.put_all([long_key, None, b"short"], [5, 6, 7], 0) == 3
    assert offset_map.get(long_key) == 5
    assert offset_map.get(b"x" * 99) == -1
    assert offset_map.offsets_of([long_key, None, b"short", b"other"]) == [5, -1, 7, -1]
    assert offset_map.put_all([b"a", b"b"], [1, 8], 8) == 2  # below ``start``: not mapped
    assert offset_map.get(b"a") == -1
    assert offset_map.latest_offset == 8


# -- one pass ------------------------------------------------------------------------------


def test_a_pass_keeps_the_latest_record_of_each_key_at_its_offset(
    log: Log, clock: ManualClock
) -> None:
    appended = fill(log, clock, 200, 7)
    uncleanable = log.active_segment.base_offset
    size_before = log.size
    end, stats = log.clean(OffsetMap(BIG_MAP))
    assert end == uncleanable
    assert triples(log) == kafka_rules(appended, uncleanable)
    assert stats.records_read == uncleanable
    assert stats.records_written == 7
    assert log.size < size_before
    assert log.log_end_offset == 200  # the log end never moves
    log._check()


def test_the_active_segment_is_never_cleaned(log: Log, clock: ManualClock) -> None:
    log.append([b"a", b"b", b"c"], keys=[b"k", b"k", b"k"])  # all in the active segment
    end, _ = log.clean(OffsetMap(BIG_MAP))
    assert end == 0
    assert triples(log) == [(0, b"k", b"a"), (1, b"k", b"b"), (2, b"k", b"c")]


def test_cleaned_segments_end_where_their_groups_ended(log: Log, clock: ManualClock) -> None:
    # Every record of the first segments is superseded later: each group keeps its last
    # batch empty, so segments stay contiguous (no hole between them).
    fill(log, clock, 60, 1)
    log.clean(OffsetMap(BIG_MAP))
    segments = log.segments.values()
    for segment, following in itertools.pairwise(segments):
        assert segment.read_next_offset() == following.base_offset
    emptied = [b for b in batches(log) if b.records_count == 0]
    assert emptied, "a group whose records all went keeps its last batch, empty"
    assert all(b.attributes & 0x07 == 0 for b in emptied)


def test_tombstones_stay_until_the_delete_horizon_written_in_their_batch(
    log: Log, clock: ManualClock
) -> None:
    log.append([b"v1"], keys=[b"a"])
    log.append([None], keys=[b"a"])  # a tombstone, the latest of "a"
    log.append([b"v2"], keys=[b"b"])
    log.roll()
    log.append([b"x"], keys=[b"c"])
    first_pass = clock.now_ms
    log.clean(OffsetMap(BIG_MAP))
    assert triples(log) == [(1, b"a", None), (2, b"b", b"v2"), (3, b"c", b"x")]
    tombstone_batch = next(b for b in batches(log) if b.base_offset == 1)
    # Kafka 2.8+ (KIP-534): attribute bit 6 and baseTimestamp = the horizon.
    assert tombstone_batch.attributes & 0x40
    assert tombstone_batch.delete_horizon_ms == first_pass + 1000
    assert tombstone_batch.base_timestamp == first_pass + 1000
    assert [r.timestamp for r in tombstone_batch.records()] == [first_pass]  # as written
    other = next(b for b in batches(log) if b.base_offset == 2)
    assert other.delete_horizon_ms is None
    assert other.to_bytes() == other.to_bytes()
    clock.advance(999)
    log.clean(OffsetMap(BIG_MAP))  # before the horizon: kept, horizon unchanged
    assert (1, b"a", None) in triples(log)
    assert next(b for b in batches(log) if b.base_offset == 1).delete_horizon_ms == (
        first_pass + 1000
    )
    clock.advance(1)
    log.clean(OffsetMap(BIG_MAP))  # at the horizon: gone
    assert triples(log) == [(2, b"b", b"v2"), (3, b"c", b"x")]


def test_batches_keep_their_producer_fields_codec_and_offsets(
    log_dir: Path, clock: ManualClock
) -> None:
    log = Log.open(log_dir / "t-0", compacted(), clock=clock)
    try:
        raw = build_record_batch(
            [b"old", b"keep", b"old2"],
            keys=[b"a", b"b", b"c"],
            timestamps=[clock.now_ms, clock.now_ms + 1, clock.now_ms + 2],
            codec=CompressionType.GZIP,
            producer_id=77,
            producer_epoch=3,
            base_sequence=10,
            partition_leader_epoch=5,
        )
        log.append_batches(raw, assign_offsets=False)
        log.append([b"new", b"new2"], keys=[b"a", b"c"])
        log.roll()
        log.append([b"x"], keys=[b"z"])
        log.clean(OffsetMap(BIG_MAP))
        first = next(batches(log))
        assert (first.base_offset, first.last_offset, first.records_count) == (0, 2, 1)
        assert (first.producer_id, first.producer_epoch, first.base_sequence) == (77, 3, 10)
        assert first.partition_leader_epoch == 5
        assert first.codec is CompressionType.GZIP
        assert [(r.offset, r.key, r.value, r.timestamp) for r in first.records()] == [
            (1, b"b", b"keep", clock.now_ms + 1)
        ]
        assert first.is_valid()
        assert triples(log) == [
            (1, b"b", b"keep"),
            (3, b"a", b"new"),
            (4, b"c", b"new2"),
            (5, b"z", b"x"),
        ]
    finally:
        log.close()


def test_a_batch_whose_records_all_stay_is_copied_byte_for_byte(
    log: Log, clock: ManualClock
) -> None:
    log.append([b"1", b"2"], keys=[b"a", b"b"], headers=[(("h", b"v"),), ()])
    before = next(batches(log)).to_bytes()
    log.append([b"3"], keys=[b"c"])
    log.roll()
    log.append([b"4"], keys=[b"d"])
    log.clean(OffsetMap(BIG_MAP))
    assert next(batches(log)).to_bytes() == before


def test_keyless_records_of_a_topic_switched_to_compact_are_removed(
    log_dir: Path, clock: ManualClock
) -> None:
    with LogManager.open(log_dir, clock=clock) as manager:
        manager.create_topic("t", 1, {"segment.bytes": "1024"})
        log = manager.log("t", 0)
        log.append([b"no key", b"keyed"], keys=[None, b"k"])
        log.roll()
        log.append([b"later"], keys=[b"j"])
        manager.alter_topic_config("t", {"cleanup.policy": "compact"})
        summary = manager.clean()
        assert [(r.topic, r.partition) for r in summary.cleaned] == [("t", 0)]
        assert triples(log) == [(1, b"k", b"keyed"), (2, b"j", b"later")]


def test_a_log_too_big_for_the_map_is_cleaned_in_several_passes(
    log: Log, clock: ManualClock
) -> None:
    appended = fill(log, clock, 300, 40)
    uncleanable = log.active_segment.base_offset
    small = OffsetMap(24 * 20, load_factor=1.0)  # 20 keys a pass, 40 keys in the log
    first_dirty = 0
    passes = 0
    while first_dirty < uncleanable:
        end, _stats = log.clean(small, first_dirty_offset=first_dirty)
        assert end > first_dirty, "every pass makes progress"
        first_dirty = end
        passes += 1
        assert passes < 50
    assert passes >= 2
    assert triples(log) == kafka_rules(appended, uncleanable)


def test_groups_respect_segment_bytes_and_the_index_limit(log: Log, clock: ManualClock) -> None:
    fill(log, clock, 120, 120)  # nothing superseded: sizes stay
    segments = log.segments.values()[:-1]
    assert len(segments) >= 4
    sizes = [s.size for s in segments]
    groups = group_segments_by_size(segments, sizes[0] * 2, 10**6, log.active_segment.base_offset)
    assert all(sum(s.size for s in g) <= sizes[0] * 2 for g in groups)
    assert [s for g in groups for s in g] == segments
    assert len(group_segments_by_size(segments, 10**9, 10**6, 10**9)) == 1
    one_entry = max(s.offset_index.size_in_bytes for s in segments)
    by_index = group_segments_by_size(segments, 10**9, one_entry, 10**9)
    assert all(sum(s.offset_index.size_in_bytes for s in g) <= max(one_entry, 8) for g in by_index)


def test_small_cleaned_segments_merge_into_one_on_the_next_pass(
    log: Log, clock: ManualClock
) -> None:
    fill(log, clock, 200, 3)
    log.clean(OffsetMap(BIG_MAP))
    before = log.number_of_segments
    log.clean(OffsetMap(BIG_MAP))  # the small cleaned segments now fit a group
    # 15 one-batch segments of 61 bytes fit one group of segment.bytes (1024); the
    # next (246 bytes) does not: Kafka's grouping, by the sizes before the pass.
    assert (before, log.number_of_segments) == (17, 3)
    log._check()


def test_filter_batch_drops_superseded_records_and_passes_unmapped_ones() -> None:
    batch = DefaultRecordBatch(
        build_record_batch([b"1", b"2", b"3"], keys=[b"a", b"b", b"a"], timestamps=5)
    )
    offset_map = OffsetMap(24 * 10)
    offset_map.put_all([b"a"], [2], 0)
    data, read, kept = filter_batch(batch, offset_map, 0, 100)
    assert (read, kept) == (3, 2)
    assert data is not None
    rebuilt = DefaultRecordBatch(data)
    assert [(r.offset, r.key) for r in rebuilt.records()] == [(1, b"b"), (2, b"a")]
    assert rebuilt.is_valid()
    assert rebuilt.last_offset == 2
    offset_map.clear()
    offset_map.put_all([b"a"], [0], 0)  # the map ends at 0: offsets 1 and 2 stay
    _, read, kept = filter_batch(batch, offset_map, 0, 100)
    assert kept == 3


# -- choosing logs, the checkpoint ------------------------------------------------------------


def test_dirty_ratio_min_lag_and_max_lag_decide_as_kafka(log_dir: Path, clock: ManualClock) -> None:
    config = compacted(min_cleanable_dirty_ratio=0.5, min_compaction_lag_ms=1000)
    log = Log.open(log_dir / "t-0", config, clock=clock)
    try:
        fill(log, clock, 60, 60)
        to_clean = cleanable_offsets(log, None, clock.now_ms)
        # min.compaction.lag.ms: every sealed segment is younger than a second.
        assert to_clean.first_uncleanable_offset == 0
        assert to_clean.cleanable_bytes == 0
        assert not to_clean.cleanable
        clock.advance(2000)
        to_clean = cleanable_offsets(log, None, clock.now_ms)
        assert to_clean.first_uncleanable_offset == log.active_segment.base_offset
        assert to_clean.cleanable_ratio > 0.5
        assert to_clean.cleanable
        # Checkpoint at the first uncleanable offset: nothing dirty.
        done = cleanable_offsets(log, to_clean.first_uncleanable_offset, clock.now_ms)
        assert done.cleanable_bytes == 0
        assert not done.cleanable
        # max.compaction.lag.ms makes a barely dirty log due.
        log.config = compacted(min_cleanable_dirty_ratio=0.99, max_compaction_lag_ms=100)
        last_sealed = log.segments.values()[-2]
        barely = cleanable_offsets(log, last_sealed.base_offset, clock.now_ms)
        assert barely.cleanable_ratio < 0.99
        assert barely.need_compaction_now
        assert barely.cleanable
    finally:
        log.close()


def test_a_checkpoint_outside_the_log_resets_to_the_log_start(log: Log, clock: ManualClock) -> None:
    fill(log, clock, 40, 5)
    log.advance_log_start_offset(10)
    assert cleanable_offsets(log, 3, clock.now_ms).first_dirty_offset == 10
    assert cleanable_offsets(log, 10**6, clock.now_ms).first_dirty_offset == 10
    assert cleanable_offsets(log, 12, clock.now_ms).first_dirty_offset == 12


def test_the_manager_cleans_the_dirtiest_first_and_checkpoints_as_kafka(
    log_dir: Path, clock: ManualClock
) -> None:
    with LogManager.open(log_dir, clock=clock) as manager:
        for topic in ("a", "b", "plain"):
            policy = "delete" if topic == "plain" else "compact"
            manager.create_topic(topic, 1, {"cleanup.policy": policy, "segment.bytes": "1024"})
        fill(manager.log("a", 0), clock, 100, 50)  # half superseded
        fill(manager.log("b", 0), clock, 100, 2)
        fill(manager.log("plain", 0), clock, 100, 2)
        assert [r.topic for r in manager.clean(["b"]).cleaned] == ["b"]
        fill(manager.log("b", 0), clock, 40, 2)  # b: a clean head, then dirty records
        manager.alter_topic_config("b", {"min.cleanable.dirty.ratio": "0.95"})
        chosen = manager.cleaner_manager.logs_to_clean(manager.logs(), clock.now_ms)
        # a: ratio 1 (never cleaned); b: under its 0.95; plain: delete.
        assert [(t.log.topic, t.cleanable_ratio) for t in chosen] == [("a", 1.0)]
        forced = manager.cleaner_manager.logs_to_clean(manager.logs(), clock.now_ms, force=True)
        assert [t.log.topic for t in forced] == ["a", "b"]  # dirtiest first
        assert 0.5 < forced[1].cleanable_ratio < 0.95
        summary = manager.clean()
        (result,) = summary.cleaned
        assert (result.topic, result.partition, result.passes) == ("a", 0, 1)
        assert result.bytes_after < result.bytes_before
        assert result.records_read > result.records_kept
        assert not result.more_to_clean
        path = log_dir / "cleaner-offset-checkpoint"
        assert path.read_text().splitlines()[:3] == ["0", "2", f"a 0 {result.first_dirty_offset}"]
        checkpoints = read_offset_checkpoint(path)
        assert checkpoints[("a", 0)] == result.first_dirty_offset
        assert set(checkpoints) == {("a", 0), ("b", 0)}
        assert manager.clean().cleaned == ()  # nothing due now
        skipped = manager.clean(["plain"]).skipped
        assert skipped == (("plain", 0, "cleanup.policy has no compact"),)
        manager.delete_topic("a")
        assert set(read_offset_checkpoint(path)) == {("b", 0)}  # a new "a" starts dirty


def units(batch: RecordBatch) -> int:
    """An extension index's units: a line per record (pure function of the bytes)."""
    return sum(2 + len(r.key or b"") + len(r.value or b"") for r in batch.records())


UNITS = ExtensionIndexSpec(".units", 64, units)


def units_by_batch(log: Log) -> dict[int, int]:
    """The units before each batch, laid end to end from ``extension_start``; checks
    that the index agrees at every batch (a floor entry, then a scan)."""
    found: dict[int, int] = {}
    total = log.extension_start
    for batch in log.batches(log.log_start_offset):
        found[batch.base_offset] = total
        floor_offset, floor_units = log.extension_position(batch.base_offset)
        for before in log.batches(floor_offset):
            if before.base_offset >= batch.base_offset:
                break
            floor_units += units(before)
        assert floor_units == total, (batch.base_offset, floor_units, total)
        total += units(batch)
    assert total == log.extension_end
    return found


def test_a_log_with_an_extension_index_loses_units_from_the_front(
    log_dir: Path, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    with LogManager.open(log_dir, clock=clock, extension=lambda _m: UNITS) as manager:
        manager.create_topic("t", 1, {"cleanup.policy": "compact", "segment.bytes": "1024"})
        log = manager.log("t", 0)
        appended = fill(log, clock, 300, 7)
        uncleanable = log.active_segment.base_offset
        before = units_by_batch(log)
        start, end = log.extension_start, log.extension_end
        summary = manager.clean(force=True)
        (result,) = summary.cleaned
        assert summary.skipped == ()
        assert result.records_kept < result.records_read
        assert triples(log) == kafka_rules(appended, uncleanable)
        after = units_by_batch(log)
        # The records the pass did not reach keep their units; the log end too.
        assert {b: u for b, u in after.items() if b >= uncleanable} == {
            b: u for b, u in before.items() if b >= uncleanable
        }
        assert log.extension_end == end
        removed = sum(
            2 + len(k or b"") + len(v or b"")
            for o, k, v in appended
            if (o, k, v) not in set(triples(log))
        )
        assert log.extension_start == start + removed > start
        assert log.layout_epoch == 1
        log._check()
        checkpoint = read_extension_start_checkpoint(log.dir / UNITS.start_checkpoint_name)
        first = log.segments.first_segment
        assert first is not None
        assert checkpoint == (first.base_offset, log.extension_start)
        kept = triples(log)
    caplog.clear()
    with LogManager.open(log_dir, clock=clock, extension=lambda _m: UNITS) as manager:
        log = manager.log("t", 0)
        assert triples(log) == kept
        assert units_by_batch(log) == after  # reopened as laid: nothing rebuilt
        assert "rebuilding extension index" not in caplog.text


@pytest.mark.parametrize("step", list(CleaningStep))
def test_a_crash_in_a_positioned_pass_leaves_all_old_or_all_new_segments(
    step: CleaningStep, log_dir: Path, clock: ManualClock
) -> None:
    directory = log_dir / "t-0"
    log = Log.open(directory, compacted(), clock=clock, extension=UNITS)
    appended = fill(log, clock, 300, 6, tombstone_every=11)
    uncleanable = log.active_segment.base_offset
    old = triples(log)
    steps: list[CleaningStep] = []

    def crash(done: CleaningStep, segment: LogSegment) -> None:
        steps.append(done)
        if done is step and steps.count(done) == 2:  # the second group's step
            raise Crash

    with pytest.raises(Crash):
        log.clean(OffsetMap(BIG_MAP), on_step=crash)
    recovery_point = log.recovery_point
    abandon(log)
    reopened = Log.open(
        directory,
        compacted(),
        clock=clock,
        recovery_point=recovery_point,
        had_clean_shutdown=False,
        extension=UNITS,
    )
    try:
        expected = (
            old if step is CleaningStep.CLEANED_WRITTEN else kafka_rules(appended, uncleanable)
        )
        assert triples(reopened) == expected
        assert not [
            n for n in os.listdir(directory) if n.endswith((".cleaned", ".swap", ".deleted"))
        ]
        reopened._check()
        units_by_batch(reopened)  # laid end to end, the index right at every batch
        reopened.clean(OffsetMap(BIG_MAP))
        assert triples(reopened) == kafka_rules(appended, uncleanable)
        units_by_batch(reopened)
    finally:
        reopened.close()


def test_a_group_changed_under_the_pass_is_abandoned(log: Log, clock: ManualClock) -> None:
    appended = fill(log, clock, 80, 4)

    def retention_meanwhile(step: CleaningStep, segment: LogSegment) -> None:
        if step is CleaningStep.CLEANED_WRITTEN:
            log.truncate_to(5)  # the group's segments leave the map

    cleaner_dir = set(os.listdir(log.dir))
    from storage.log.cleaner import Cleaner

    to_clean = cleanable_offsets(log, None, clock.now_ms)
    with pytest.raises(LogCleaningAbortedError, match="changed while they were cleaned"):
        Cleaner(OffsetMap(BIG_MAP), clock=clock, on_step=retention_meanwhile).clean(to_clean)
    assert triples(log) == appended[:5]
    assert not [n for n in os.listdir(log.dir) if n.endswith((".cleaned", ".swap"))]
    assert cleaner_dir  # the directory was listed


# -- crash safety -------------------------------------------------------------------------------


class Crash(BaseException):
    """Stops a pass where a crash would: no cleanup handler runs."""


def abandon(log: Log) -> None:
    """What a killed process leaves: descriptors gone, nothing flushed or sealed."""
    for segment in log.segments.values():
        segment.close_handlers()
    log._closed = True


@pytest.mark.parametrize("step", list(CleaningStep))
def test_a_crash_after_each_step_leaves_the_old_or_the_new_segments(
    step: CleaningStep, log_dir: Path, clock: ManualClock
) -> None:
    directory = log_dir / "t-0"
    log = Log.open(directory, compacted(), clock=clock)
    appended = fill(log, clock, 150, 6, tombstone_every=11)
    uncleanable = log.active_segment.base_offset
    old = triples(log)
    steps: list[CleaningStep] = []

    logs_before = {name for name in os.listdir(directory) if name.endswith(".log")}

    def crash(done: CleaningStep, segment: LogSegment) -> None:
        steps.append(done)
        if done is CleaningStep.SWAP_RENAMED and steps.count(done) == 1:
            # The commit point comes before any old segment is touched.
            assert logs_before <= set(os.listdir(directory))
        if done is step:
            raise Crash

    with pytest.raises(Crash):
        log.clean(OffsetMap(BIG_MAP), on_step=crash)
    recovery_point = log.recovery_point
    abandon(log)
    reopened = Log.open(
        directory,
        compacted(),
        clock=clock,
        recovery_point=recovery_point,
        had_clean_shutdown=False,
    )
    try:
        after = triples(reopened)
        assert not [
            n for n in os.listdir(directory) if n.endswith((".cleaned", ".swap", ".deleted"))
        ]
        first_group_end = next(s.base_offset for s in reopened.segments.values()[1:])
        if step is CleaningStep.CLEANED_WRITTEN:
            assert after == old  # not committed: rolled back
        else:
            # The first group was committed: its range holds what Kafka keeps, the rest
            # of the log is as it was.
            expected = kafka_rules(appended, uncleanable)
            head = [t for t in expected if t[0] < first_group_end]
            tail = [t for t in old if t[0] >= first_group_end]
            assert after == head + tail
        reopened._check()
        # A pass after the crash finishes the job.
        reopened.clean(OffsetMap(BIG_MAP))
        assert triples(reopened) == kafka_rules(appended, uncleanable)
    finally:
        reopened.close()
    assert steps[-1] is step


# -- kafka-python -----------------------------------------------------------------------------


def test_kafka_python_reads_cleaned_segments_and_agrees(log_dir: Path, clock: ManualClock) -> None:
    with LogManager.open(log_dir, clock=clock) as manager:
        manager.create_topic(
            "t",
            1,
            {"cleanup.policy": "compact", "segment.bytes": "2048", "compression.type": "lz4"},
        )
        log = manager.log("t", 0)
        fill(log, clock, 300, 9, tombstone_every=13)
        manager.clean(force=True)
        expected = triples(log)
    got: list[Triple] = []
    files = sorted((log_dir / "t-0").glob("*.log"))
    assert len(files) > 1
    for path in files:
        records = MemoryRecords(path.read_bytes())
        while (batch := records.next_batch()) is not None:
            assert batch.validate_crc()
            got += [(r.offset, r.key, r.value) for r in batch]
    assert got == expected
    # Reopened by the engine after a restart: the same records.
    with LogManager.open(log_dir, clock=clock) as manager:
        assert triples(manager.log("t", 0)) == expected


def test_delete_horizon_bytes_are_kafkas(log: Log, clock: ManualClock) -> None:
    log.append([None], keys=[b"gone"])
    log.roll()
    log.append([b"x"], keys=[b"y"])
    log.clean(OffsetMap(BIG_MAP))
    data = (log.dir / "00000000000000000000.log").read_bytes()
    attributes, base_timestamp = (
        struct.unpack_from(">h", data, 21)[0],
        struct.unpack_from(">q", data, 27)[0],
    )
    assert attributes & 0x40
    assert base_timestamp == clock.now_ms + 1000
    (batch,) = (MemoryRecords(data).next_batch(),)
    assert batch is not None
    assert batch.validate_crc()
    assert [(r.key, r.value) for r in batch] == [(b"gone", None)]


def test_appends_and_reads_go_on_while_a_log_is_cleaned(log: Log, clock: ManualClock) -> None:
    import threading

    appended = fill(log, clock, 300, 5)
    uncleanable = log.active_segment.base_offset
    stop = threading.Event()
    more: list[Triple] = []
    reads: list[int] = []
    problems: list[list[int]] = []

    def writer() -> None:
        i = 0
        while not stop.is_set() and i < 400:
            info = log.append([b"w%d" % i], keys=[b"w%d" % (i % 3)], timestamps=clock.now_ms)
            more.append((info.first_offset, b"w%d" % (i % 3), b"w%d" % i))
            i += 1

    def reader() -> None:
        while not stop.is_set():
            offsets = [r.offset for r in log.records(log.log_start_offset)]
            if offsets != sorted(set(offsets)):  # repeated or reordered
                problems.append(offsets)
            reads.append(len(offsets))

    threads = [threading.Thread(target=writer), threading.Thread(target=reader)]
    for thread in threads:
        thread.start()
    try:
        end, _ = log.clean(OffsetMap(BIG_MAP))
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    # The pass cleans up to the active segment it finds when it starts: the writer
    # may have rolled it by then (a loaded machine), never afterwards.
    assert end >= uncleanable
    assert reads, "the reader ran"
    assert problems == []
    assert triples(log) == kafka_rules(appended + more, end)
    log._check()


def test_transactional_batches_are_copied_whole_and_supersede_nothing(
    log: Log, clock: ManualClock
) -> None:
    # No transaction index here: a transactional batch may have been aborted, so its
    # keys must not remove older records, and it is kept as it is (its records too).
    log.append([b"old"], keys=[b"k"])
    txn = build_record_batch(
        [b"txn", b"txn2"],
        keys=[b"k", b"k"],
        timestamps=clock.now_ms,
        base_offset=1,
        producer_id=9,
        producer_epoch=0,
        base_sequence=0,
        is_transactional=True,
    )
    log.append_batches(txn, assign_offsets=False)
    log.roll()
    log.append([b"x"], keys=[b"z"])
    log.clean(OffsetMap(BIG_MAP))
    assert triples(log) == [
        (0, b"k", b"old"),
        (1, b"k", b"txn"),
        (2, b"k", b"txn2"),
        (3, b"z", b"x"),
    ]
    assert next(b for b in batches(log) if b.base_offset == 1).to_bytes() == txn


def test_a_read_only_follower_picks_up_a_pass_of_the_writer(
    log_dir: Path, clock: ManualClock
) -> None:
    directory = log_dir / "t-0"
    writer = Log.open(directory, compacted(), clock=clock, extension=UNITS)
    reader = Log.open(directory, compacted(), clock=clock, extension=UNITS, writable=False)
    try:
        appended = fill(writer, clock, 300, 7)
        reader.refresh()
        assert triples(reader) == appended
        writer.clean(OffsetMap(BIG_MAP))
        reader.refresh()
        # The swapped segments are opened anew (same names, other files): the reader
        # holds what the writer holds, at the writer's units.
        assert triples(reader) == triples(writer) != appended
        assert reader.segments.base_offsets() == writer.segments.base_offsets()
        assert (reader.extension_start, reader.extension_end) == (
            writer.extension_start,
            writer.extension_end,
        )
        assert units_by_batch(reader) == units_by_batch(writer)
        assert reader.layout_epoch == 1
        reader.refresh()
        assert reader.layout_epoch == 1  # nothing replaced since
    finally:
        reader.close()
        writer.close()


def test_an_aborted_pass_leaves_the_log_as_it_was(log_dir: Path, clock: ManualClock) -> None:
    # Kafka's abortCleaning on shutdown: a pass stops at its next batch; with a
    # position index the groups written so far are removed (none was swapped in).
    directory = log_dir / "t-0"
    abort = threading.Event()
    log = Log.open(directory, compacted(), clock=clock, extension=UNITS)
    try:
        fill(log, clock, 300, 6)
        old = triples(log)
        units = units_by_batch(log)
        written: list[int] = []

        def shut_down(step: CleaningStep, segment: LogSegment) -> None:
            written.append(segment.base_offset)
            abort.set()  # while the first group is written, before the second

        with pytest.raises(LogCleaningAbortedError, match="aborted"):
            log.clean(OffsetMap(BIG_MAP), on_step=shut_down, abort=abort)
        assert written == [0]
        assert triples(log) == old
        assert units_by_batch(log) == units
        assert not [n for n in os.listdir(directory) if n.endswith((".cleaned", ".swap"))]
    finally:
        log.close()
    with LogManager.open(log_dir, clock=clock) as manager:
        manager.create_topic("c", 1, {"cleanup.policy": "compact", "segment.bytes": "1024"})
        fill(manager.log("c", 0), clock, 200, 5)
        manager.abort_cleaning()
        summary = manager.clean(force=True)
        assert summary.cleaned == ()
        assert summary.skipped == (("c", 0, "cleaning aborted (shutting down)"),)

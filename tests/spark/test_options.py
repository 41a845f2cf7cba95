"""Option parsing, offset resolution, planning and pushdown, without a SparkSession."""

from __future__ import annotations

import datetime as dt
import itertools
from pathlib import Path

import pytest
from pyspark.sql.datasource import EqualTo, GreaterThan, GreaterThanOrEqual, In, LessThan

from seglogfs.spark import reader as reader_module
from seglogfs.spark.errors import DataLossError, OptionError
from seglogfs.spark.options import (
    ReadOptions,
    Subscription,
    from_json_offsets,
    resolve_ending_offsets,
    resolve_starting_offsets,
    to_json_offsets,
)
from seglogfs.spark.reader import (
    MAX_PACKED_BYTES,
    OPEN_COST_BYTES,
    OffsetRange,
    OffsetRanges,
    SeglogBatchReader,
    plan_tasks,
    split_ranges,
)
from seglogfs.spark.stream import rate_limit
from storage import LogManager
from tests.conftest import ManualClock

TS = 1_700_000_000_000


@pytest.fixture(autouse=True)
def two_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plans as on a machine of 2 cores, whatever this one has (``plan_tasks``)."""
    monkeypatch.setattr(reader_module, "planner_cores", lambda: 2)


def _parse(streaming: bool = False, **options: str) -> ReadOptions:
    return ReadOptions.parse({"path": "/logs", **options}, streaming=streaming)


def test_defaults_are_kafkas() -> None:
    batch = _parse(subscribe="a")
    assert (batch.starting, batch.ending) == ("earliest", "latest")
    assert batch.fail_on_data_loss is True
    assert batch.include_headers is False
    assert _parse(streaming=True, subscribe="a").starting == "latest"


def test_option_names_are_case_insensitive() -> None:
    opts = ReadOptions.parse(
        {"PATH": "/l", "SUBSCRIBE": "a, b", "failondataloss": "False", "INCLUDEHEADERS": "true"},
        streaming=False,
    )
    assert opts.subscription == Subscription(topics=("a", "b"))
    assert (opts.fail_on_data_loss, opts.include_headers) == (False, True)


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({}, "subscribe"),
        ({"subscribe": "a", "assign": '{"a": [0]}'}, "assign, subscribe"),
        ({"subscribe": "a", "startingOffsets": "latest"}, "startingOffsets"),
        ({"subscribe": "a", "startingOffsets": '{"a": {"0": -1}}'}, "startingOffsets"),
        ({"subscribe": "a", "endingOffsets": "earliest"}, "endingOffsets"),
        ({"subscribe": "a", "startingOffsets": "{not json"}, "startingOffsets"),
        ({"subscribe": "a", "startingOffsets": '{"a": {"x": 1}}'}, "startingOffsets"),
        ({"subscribe": "a", "minPartitions": "0"}, "minPartitions"),
        ({"subscribe": "a", "maxOffsetsPerTrigger": "ten"}, "maxOffsetsPerTrigger"),
        ({"subscribe": "a", "failOnDataLoss": "maybe"}, "failOnDataLoss"),
        ({"subscribePattern": "("}, "subscribePattern"),
        ({"assign": '{"a": ["0"]}'}, "assign"),
        ({"subscribe": "a", "startingTimestamp": "-5"}, "startingTimestamp"),
    ],
)
def test_bad_options_name_the_option(options: dict[str, str], named: str) -> None:
    with pytest.raises(OptionError) as info:
        ReadOptions.parse({"path": "/logs", **options}, streaming=False)
    assert info.value.name == named
    assert named in str(info.value)


def test_ending_offsets_refused_in_streaming() -> None:
    with pytest.raises(OptionError, match="not valid in streaming"):
        _parse(streaming=True, subscribe="a", endingOffsets="latest")


def test_missing_path() -> None:
    with pytest.raises(OptionError, match="path"):
        ReadOptions.parse({"subscribe": "a"}, streaming=False)


def test_subscriptions_select_existing_partitions() -> None:
    counts = {"orders": 2, "orders-eu": 1, "other": 3}
    assert Subscription(topics=("orders", "missing")).topic_partitions(counts) == [
        ("orders", 0),
        ("orders", 1),
    ]
    assert Subscription(pattern="orders.*").topic_partitions(counts) == [
        ("orders", 0),
        ("orders", 1),
        ("orders-eu", 0),
    ]
    # The pattern matches whole names, as Java's Pattern.matcher().matches().
    assert Subscription(pattern="order").topic_partitions(counts) == []
    assigned = Subscription(assigned=(("other", 2), ("other", 7)))
    assert assigned.topic_partitions(counts) == [("other", 2)]


def test_json_offsets_round_trip() -> None:
    offsets = {("b", 1): 5, ("a", 0): 3, ("b", 0): 9}
    document = to_json_offsets(offsets)
    assert document == {"a": {"0": 3}, "b": {"0": 9, "1": 5}}
    assert from_json_offsets(document) == offsets


def _log_dir(tmp_path: Path, clock: ManualClock) -> Path:
    """Topic t, 2 partitions: p0 offsets 0-9 at TS+0..9, p1 offsets 0-4 at TS+100.."""
    path = tmp_path / "logs"
    with LogManager.open(path, clock=clock) as manager:
        manager.create_topic("t", 2)
        manager.log("t", 0).append(
            [b"%d" % i for i in range(10)], timestamps=[TS + i for i in range(10)]
        )
        manager.log("t", 1).append([b"x"] * 5, timestamps=[TS + 100 + i for i in range(5)])
    return path


def test_resolve_offsets_and_timestamps(tmp_path: Path, clock: ManualClock) -> None:
    path = _log_dir(tmp_path, clock)
    tps = [("t", 0), ("t", 1)]
    with LogManager.open(path, read_only=True) as manager:
        opts = _parse(subscribe="t", startingOffsets='{"t": {"0": 4, "1": -2}}')
        assert resolve_starting_offsets(opts, manager, tps) == {("t", 0): 4, ("t", 1): 0}
        assert resolve_ending_offsets(opts, manager, tps) == {("t", 0): 10, ("t", 1): 5}
        by_time = _parse(
            subscribe="t", startingTimestamp=str(TS + 3), endingTimestamp=str(TS + 102)
        )
        assert resolve_starting_offsets(by_time, manager, tps) == {("t", 0): 3, ("t", 1): 0}
        assert resolve_ending_offsets(by_time, manager, tps) == {("t", 0): 10, ("t", 1): 2}
        # A time after every record of p0: Kafka's default strategy refuses it...
        late = _parse(
            subscribe="t", startingOffsetsByTimestamp=f'{{"t": {{"0": {TS + 50}, "1": {TS}}}}}'
        )
        with pytest.raises(OptionError, match="no record of t-0"):
            resolve_starting_offsets(late, manager, tps)
        # ... and the latest strategy starts at the end.
        latest = _parse(
            subscribe="t",
            startingOffsetsByTimestamp=f'{{"t": {{"0": {TS + 50}, "1": {TS}}}}}',
            startingOffsetsByTimestampStrategy="latest",
        )
        assert resolve_starting_offsets(latest, manager, tps) == {("t", 0): 10, ("t", 1): 0}
        # A JSON spec must name every subscribed partition, as Kafka asserts.
        partial = _parse(subscribe="t", startingOffsets='{"t": {"0": 1}}')
        with pytest.raises(OptionError, match="missing t-1"):
            resolve_starting_offsets(partial, manager, tps)


def test_planning_with_pushdown_and_min_partitions(tmp_path: Path, clock: ManualClock) -> None:
    path = _log_dir(tmp_path, clock)
    reader = SeglogBatchReader(
        ReadOptions.parse({"path": str(path), "subscribe": "t"}, streaming=False)
    )
    assert reader.partitions() == [OffsetRange("t", 0, 0, 10), OffsetRange("t", 1, 0, 5)]
    after = dt.datetime.fromtimestamp((TS + 4) / 1000, tz=dt.UTC)
    filters = [
        EqualTo(("partition",), 0),
        GreaterThanOrEqual(("offset",), 2),
        LessThan(("offset",), 8),
        GreaterThan(("timestamp",), after),
        In(("value",), (b"x",)),
    ]
    left = list(reader.pushFilters(filters))
    # Partition and offset filters are applied exactly; timestamps only narrow.
    assert left == [filters[3], filters[4]]
    assert reader.partitions() == [OffsetRange("t", 0, 2, 8, TS + 4)]

    split = SeglogBatchReader(
        ReadOptions.parse(
            {"path": str(path), "subscribe": "t", "minPartitions": "6"}, streaming=False
        )
    ).partitions()
    assert len(split) == 6
    assert [(r.partition, r.start, r.end) for r in split if isinstance(r, OffsetRange)] == [
        (0, 0, 2), (0, 2, 5), (0, 5, 8), (0, 8, 10), (1, 0, 2), (1, 2, 5),
    ]  # fmt: skip


def test_planning_names_missing_topics_and_partitions(tmp_path: Path, clock: ManualClock) -> None:
    path = _log_dir(tmp_path, clock)

    def plan(**options: str) -> object:
        opts = ReadOptions.parse({"path": str(path), **options}, streaming=False)
        return SeglogBatchReader(opts).partitions()

    with pytest.raises(OptionError, match="no topic 'typo'"):
        plan(subscribe="t,typo")
    with pytest.raises(OptionError, match="t-5"):
        plan(assign='{"t": [0, 5]}')
    with pytest.raises(OptionError, match="does not exist"):
        SeglogBatchReader(_parse(subscribe="t")).partitions()
    assert plan(subscribePattern="nothing.*") == []


def test_planning_refuses_lost_offsets(tmp_path: Path, clock: ManualClock) -> None:
    path = _log_dir(tmp_path, clock)
    with LogManager.open(path, clock=clock) as manager:
        log = manager.log("t", 0)
        log.roll()
        log.append([b"late"])
        log.advance_log_start_offset(10)
        assert manager.run_retention() == 1
    opts = {"path": str(path), "subscribe": "t", "startingOffsets": '{"t": {"0": 3, "1": 0}}'}
    with pytest.raises(DataLossError, match=r"t-0: offsets \[3, 10\)"):
        SeglogBatchReader(ReadOptions.parse(opts, streaming=False)).partitions()
    lenient = SeglogBatchReader(
        ReadOptions.parse({**opts, "failOnDataLoss": "false"}, streaming=False)
    )
    assert lenient.partitions() == [OffsetRange("t", 0, 10, 11), OffsetRange("t", 1, 0, 5)]


def test_split_ranges_is_proportional() -> None:
    ranges = [OffsetRange("a", 0, 0, 90), OffsetRange("a", 1, 0, 10), OffsetRange("a", 2, 5, 5)]
    split = split_ranges(ranges, 10)
    assert [(r.partition, r.start, r.end) for r in split if r.partition == 1] == [(1, 0, 10)]
    assert len([r for r in split if r.partition == 0]) == 9
    assert sum(r.size for r in split) == 100
    assert split_ranges(ranges, None) == ranges[:2]


MiB = 1 << 20


def _pieces(tasks: list[OffsetRange | OffsetRanges]) -> list[list[tuple[int, int, int]]]:
    return [
        [(r.partition, r.start, r.end) for r in (t.ranges if isinstance(t, OffsetRanges) else (t,))]
        for t in tasks
    ]


def test_plan_tasks_splits_a_range_to_keep_every_core_busy() -> None:
    # 1000 MiB in one partition on 2 cores: two tasks of half the offsets each, the
    # minimum timestamp kept; on 8 cores eight.
    big = OffsetRange("t", 0, 100, 10_000_100, 42)
    tasks = plan_tasks([big], [1000 * MiB], cores=2)
    assert tasks == [
        OffsetRange("t", 0, 100, 5_000_100, 42), OffsetRange("t", 0, 5_000_100, 10_000_100, 42),
    ]  # fmt: skip
    pieces = [p for [p] in _pieces(plan_tasks([big], [1000 * MiB], cores=8))]
    assert len(pieces) == 8
    assert pieces[0][1] == 100
    assert pieces[-1][2] == 10_000_100
    assert all(a[2] == b[1] for a, b in itertools.pairwise(pieces))
    assert {p[2] - p[1] for p in pieces} == {1_250_000}
    # Ranges already as many as the cores are not split: four of 250 MiB on 2 cores
    # stay four tasks (too large to be packed), as Kafka's source plans them.
    four = [OffsetRange("t", p, 0, 2_500_000) for p in range(4)]
    assert plan_tasks(four, [250 * MiB] * 4, cores=2) == four
    # 40 MiB on 2 cores: tasks of (40 + 4) / 2 = 22 MiB at most, so 2.
    assert _pieces(plan_tasks([OffsetRange("t", 0, 0, 1000)], [40 * MiB], cores=2)) == [
        [(0, 0, 500)], [(0, 500, 1000)],
    ]  # fmt: skip
    # A range under OPEN_COST_BYTES is never split.
    assert plan_tasks([OffsetRange("t", 0, 0, 1000)], [MiB], cores=64) == [
        OffsetRange("t", 0, 0, 1000)
    ]


def test_plan_tasks_packs_small_ranges_as_text_packs_small_files() -> None:
    # Four 25 MiB partitions on 2 cores: (4 * (25 + 4)) / 2 = 58 MiB a task, two
    # ranges each (25 + 4 + 25 <= 58), so two tasks, not four.
    ranges = [OffsetRange("t", p, 0, 250_000) for p in range(4)]
    tasks = plan_tasks(ranges, [25 * MiB] * 4, cores=2)
    assert _pieces(tasks) == [
        [(0, 0, 250_000), (1, 0, 250_000)], [(2, 0, 250_000), (3, 0, 250_000)],
    ]  # fmt: skip
    # On 8 cores the same data is read by eight tasks: 4 * 29 / 8 = 14.5 MiB a task,
    # so each partition in two halves.
    assert _pieces(plan_tasks(ranges, [25 * MiB] * 4, cores=8)) == [
        [(p, lo, lo + 125_000)] for p in range(4) for lo in (0, 125_000)
    ]
    # Tiny ranges count OPEN_COST_BYTES each: on one core a task takes 12 MiB, so
    # all three; on 4 cores a task takes 4 MiB, so one each.
    tiny = [OffsetRange("t", p, 0, 10) for p in range(3)]
    assert len(plan_tasks(tiny, [1000] * 3, cores=1)) == 1
    assert len(plan_tasks(tiny, [1000] * 3, cores=4)) == 3


def test_plan_tasks_reads_every_offset_once() -> None:
    ranges = [
        OffsetRange("a", 0, 0, 7_000_000),
        OffsetRange("a", 1, 5, 5),  # empty: dropped
        OffsetRange("a", 2, 10, 13),  # 3 records of 100 MiB
        OffsetRange("a", 3, 0, 1),  # 1 record of 300 MiB: cannot be split
        OffsetRange("b", 0, 0, 20_000),
    ]
    sizes = [700 * MiB, 0, 300 * MiB, 300 * MiB, 2 * MiB]
    per_record = {
        (r.topic, r.partition): size / max(r.size, 1) for r, size in zip(ranges, sizes, strict=True)
    }
    expected = sorted((r.topic, r.partition, o) for r in ranges for o in range(r.start, r.end))
    for cores in (1, 2, 3, 16):
        tasks = plan_tasks(ranges, sizes, cores)
        parts = [t.ranges if isinstance(t, OffsetRanges) else (t,) for t in tasks]
        read = sorted(
            (r.topic, r.partition, o) for rs in parts for r in rs for o in range(r.start, r.end)
        )
        assert read == expected
        # Tasks of several ranges hold no more than MAX_PACKED_BYTES; on a few cores
        # every core has a task (on 16, 82 MiB a core: 9 + 3 + 1 + 1 tasks).
        for rs in parts:
            task_bytes = sum(per_record[(r.topic, r.partition)] * r.size for r in rs)
            assert len(rs) == 1 or task_bytes <= MAX_PACKED_BYTES
        assert len(tasks) >= min(cores, 14)
    assert plan_tasks([], [], 2) == []
    assert plan_tasks([OffsetRange("a", 0, 3, 3)], [0], 2) == []
    assert OPEN_COST_BYTES < MAX_PACKED_BYTES


def test_min_partitions_keeps_kafkas_plan(tmp_path: Path, clock: ManualClock) -> None:
    """With ``minPartitions`` the plan is Kafka's: one range per topic-partition at
    least, never packed, whatever the sizes."""
    path = _log_dir(tmp_path, clock)
    one = SeglogBatchReader(
        ReadOptions.parse(
            {"path": str(path), "subscribe": "t", "minPartitions": "1"}, streaming=False
        )
    )
    assert one.partitions() == [OffsetRange("t", 0, 0, 10), OffsetRange("t", 1, 0, 5)]


def test_rate_limit_shares_by_backlog() -> None:
    start = {("a", 0): 0, ("a", 1): 100, ("a", 2): 7}
    until = {("a", 0): 300, ("a", 1): 200, ("a", 2): 7}
    limited = rate_limit(100, start, until)
    assert limited == {("a", 0): 75, ("a", 1): 125, ("a", 2): 7}
    # A share under one record rounds up: a small partition is never starved.
    assert rate_limit(1, {("a", 0): 0, ("a", 1): 0}, {("a", 0): 1000, ("a", 1): 1})[("a", 1)] == 1
    assert rate_limit(10**9, start, until) == until

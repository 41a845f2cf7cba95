"""Reading one planned range in a task: data loss, control batches, Arrow batching."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql.types import StructType

from seglogfs.spark.arrow import Projection, arrow_schema, kafka_columns
from seglogfs.spark.errors import DataLossError
from seglogfs.spark.reader import OffsetRange, engine_columns, read_offset_range
from storage import LogManager, TimestampType, build_record_batch
from tests.conftest import ManualClock
from tests.storage.test_kafka_compat import TS, _legacy


def _two_segments(log_dir: Path, clock: ManualClock) -> None:
    """t-0: offsets 0-9 in a first segment, 10-19 in a second."""
    with LogManager.open(log_dir, clock=clock) as manager:
        manager.create_topic("t", 1)
        log = manager.log("t", 0)
        log.append([b"old %d" % i for i in range(10)])
        log.roll()
        log.append([b"new %d" % i for i in range(10)])


def test_records_removed_by_retention_are_data_loss(log_dir: Path, clock: ManualClock) -> None:
    _two_segments(log_dir, clock)
    r = OffsetRange("t", 0, 5, 15)
    with LogManager.open(log_dir, read_only=True) as reader:
        # A reader planned the range; then retention removes the first segment.
        with LogManager.open(log_dir, clock=clock) as writer:
            writer.log("t", 0).advance_log_start_offset(10)
            assert writer.run_retention() == 1
        reader.refresh()
        with pytest.raises(DataLossError, match=r"t-0: offsets \[5, 10\) are below"):
            list(engine_columns(reader, r, fail_on_data_loss=True))
        columns = list(engine_columns(reader, r, fail_on_data_loss=False))
        assert [o for c in columns for o in c.offsets] == list(range(10, 15))


def test_a_range_past_the_log_end_is_data_loss(log_dir: Path, clock: ManualClock) -> None:
    _two_segments(log_dir, clock)
    with LogManager.open(log_dir, read_only=True) as reader:
        r = OffsetRange("t", 0, 18, 25)
        with pytest.raises(DataLossError, match=r"offsets \[20, 25\) are past the log end"):
            list(engine_columns(reader, r, fail_on_data_loss=True))
        lenient = list(engine_columns(reader, r, fail_on_data_loss=False))
        assert [o for c in lenient for o in c.offsets] == [18, 19]
        gone = OffsetRange("deleted", 0, 0, 5)
        with pytest.raises(DataLossError, match="deleted"):
            list(engine_columns(reader, gone, fail_on_data_loss=True))
        assert list(engine_columns(reader, gone, fail_on_data_loss=False)) == []


def test_arrow_batches_gather_small_engine_batches(log_dir: Path, clock: ManualClock) -> None:
    with LogManager.open(log_dir, clock=clock) as manager:
        manager.create_topic("t", 1)
        log = manager.log("t", 0)
        for i in range(300):  # one record per engine batch, as a line-by-line producer
            log.append([b"line %d" % i], keys=[b"k" if i == 150 else None])
    batches = list(
        read_offset_range(str(log_dir), OffsetRange("t", 0, 7, 300),
                          projection=Projection.full(True), fail_on_data_loss=True)
    )  # fmt: skip
    assert [b.num_rows for b in batches] == [293]
    batch = batches[0]
    assert batch.schema == arrow_schema(True)
    assert batch.column("offset").to_pylist() == list(range(7, 300))
    keys = batch.column("key").to_pylist()
    assert keys[150 - 7] == b"k"
    assert keys.count(None) == 292
    assert batch.column("headers").null_count == 293


def test_a_topic_deleted_and_created_again_is_read_afresh(log_dir: Path) -> None:
    with LogManager.open(log_dir) as manager:
        manager.create_topic("t", 1)
        manager.log("t", 0).append([b"old 1", b"old 2"])

    def values(start: int, end: int) -> list[bytes]:
        r = OffsetRange("t", 0, start, end)
        batches = read_offset_range(
            str(log_dir), r, projection=Projection.full(False), fail_on_data_loss=True
        )
        return [v for b in batches for v in b.column("value").to_pylist()]

    assert values(0, 2) == [b"old 1", b"old 2"]  # this process now caches a manager
    with LogManager.open(log_dir) as manager:
        manager.delete_topic("t")
        manager.create_topic("t", 1)
        manager.log("t", 0).append([b"new"])
    assert values(0, 1) == [b"new"]


def test_columns_from_batch_headers_match_the_decoded_records(log_dir: Path) -> None:
    """A projection that needs no record (offsets, partition, topic, timestamp type, or
    no column) reads contiguous v2 batches from their headers alone, and still decodes
    a compacted batch (its offsets have gaps) and legacy messages: the rows are the
    same as the decoded ones, ranges cut inside batches included."""
    segment = b"".join(
        [
            _legacy(1, 0, 0, [b"v1-a", b"v1-b"]),
            build_record_batch(
                [b"a%d" % i for i in range(5)], timestamps=TS, base_offset=2,
                timestamp_type=TimestampType.LOG_APPEND_TIME,
            ),
            build_record_batch(
                [b"c5", b"c7", b"c9"], timestamps=TS, base_offset=7, offset_deltas=[0, 2, 4],
                last_offset_delta=4,
            ),
            build_record_batch([b"b%d" % i for i in range(4)], timestamps=TS, base_offset=12),
        ]
    )  # fmt: skip
    (log_dir / "h-0").mkdir(parents=True)
    (log_dir / "h-0" / "00000000000000000000.log").write_bytes(segment)
    schema = kafka_columns(["offset", "timestampType", "partition", "topic"], include_headers=False)
    projection = Projection.of(schema, include_headers=False)
    assert not projection.needs_records
    with LogManager.open(log_dir, read_only=True) as reader:
        spans = [
            type(c).__name__
            for c in engine_columns(reader, OffsetRange("h", 0, 0, 16), fail_on_data_loss=True,
                                    records=False)
        ]  # fmt: skip
    # Two legacy messages, a v2 batch, a compacted one, a v2 batch.
    assert spans == ["RecordColumns"] * 2 + ["RecordSpan", "RecordColumns", "RecordSpan"]

    def rows(r: OffsetRange, projection: Projection) -> list[dict[str, object]]:
        batches = read_offset_range(str(log_dir), r, projection=projection, fail_on_data_loss=True)
        return [row for b in batches for row in b.to_pylist()]

    for start, end in [(0, 16), (1, 15), (3, 5), (8, 10), (9, 13)]:
        r = OffsetRange("h", 0, start, end)
        decoded = [
            {k: row[k] for k in projection.columns} for row in rows(r, Projection.full(False))
        ]
        assert rows(r, projection) == decoded
        count = Projection.of(StructType(), include_headers=False)
        assert len(rows(r, count)) == len(decoded)
    assert [row["offset"] for row in rows(OffsetRange("h", 0, 0, 16), projection)] == [
        0, 1, 2, 3, 4, 5, 6, 7, 9, 11, 12, 13, 14, 15,
    ]  # fmt: skip

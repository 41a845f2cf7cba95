"""The idempotent producers' table read back from a log (``producer_entries``,
``SequenceTable.load``) on a real engine, without a listener: which batches count
(the last segments up to the byte bound, none older than producer.id.expiration.ms),
and what the table then answers."""

from __future__ import annotations

import time
from pathlib import Path

from kafka.record.default_records import DefaultRecordBatchBuilder
from kio.schema.errors import ErrorCode

from seglogfs.kafka.producers import (
    AppendedBatch,
    BatchIdentity,
    SequenceTable,
    producer_entries,
)
from seglogfs.positions import position_index_spec
from storage import LogManager

HOUR_MS = 3_600_000


def _batch(producer_id: int, sequence: int, count: int, timestamp: int, epoch: int = 0) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=False, producer_id=producer_id,
        producer_epoch=epoch, base_sequence=sequence, batch_size=1 << 20,
    )  # fmt: skip
    for i in range(count):
        builder.append(i, timestamp=timestamp, key=None, value=b"v" * 100, headers=[])
    return bytes(builder.build())


def test_the_tail_is_read_back_within_its_bounds(log_dir: Path) -> None:
    now = int(time.time() * 1000)
    with LogManager.open(log_dir, extension=position_index_spec) as manager:
        # Segments of about 1 KiB: each batch of 5 records (about 600 bytes) rolls soon.
        manager.create_topic("t", 1, {"segment.bytes": "1024"})
        log = manager.log("t", 0)
        log.append_batches(_batch(7, 0, 5, now - 30 * HOUR_MS))  # expired: over a day old
        log.append_batches(_batch(7, 5, 5, now - 2 * HOUR_MS))
        log.append_batches(_batch(-1, -1, 5, now - HOUR_MS))  # not idempotent
        log.append_batches(_batch(8, 0, 5, now))
        log.append_batches(_batch(7, 10, 5, now, epoch=0))
        assert log.number_of_segments > 2
        everything = producer_entries(log, now, tail_bytes=1 << 30)
        assert everything == [
            AppendedBatch(7, 0, 5, 9, 5),
            AppendedBatch(8, 0, 0, 4, 15),
            AppendedBatch(7, 0, 10, 14, 20),
        ]
        # A day later than now: every batch has expired.
        assert producer_entries(log, now + 25 * HOUR_MS, tail_bytes=1 << 30) == []
        # The byte bound: only the active segment (always read) and what fits.
        last = producer_entries(log, now, tail_bytes=1)
        assert last == [AppendedBatch(7, 0, 10, 14, 20)]

    table = SequenceTable()
    table.load("t", 0, log, everything)
    assert table.loaded("t", 0)
    assert not table.loaded("t", 1)
    # The last batches are duplicates answered with their offsets; a gap is refused;
    # the next sequence is appended; an older epoch is fenced.
    assert table.check("t", 0, BatchIdentity(7, 0, 10, 14)) == 20
    assert table.check("t", 0, BatchIdentity(7, 0, 5, 9)) == 5
    assert table.check("t", 0, BatchIdentity(8, 0, 0, 4)) == 15
    assert (
        table.check("t", 0, BatchIdentity(7, 0, 16, 16)) is ErrorCode.out_of_order_sequence_number
    )
    assert table.check("t", 0, BatchIdentity(7, 0, 15, 15)) is None
    # An id from another daemon, above this one's time-based ids: fenced by its epoch,
    # and the ids handed out next are above it.
    table.load("t", 0, log, [AppendedBatch(2**50, 3, 0, 0, 30)])
    assert table.check("t", 0, BatchIdentity(2**50, 2, 1, 1)) is ErrorCode.invalid_producer_epoch
    assert table.new_producer_id() == 2**50 + 1
    table.forget("t")
    assert not table.loaded("t", 0)
    assert table.check("t", 0, BatchIdentity(7, 0, 10, 14)) is None

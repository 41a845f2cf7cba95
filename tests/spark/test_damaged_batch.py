"""A damaged batch under the seglog source: the task fails naming it, unless
``failOnDataLoss=false``, which skips the damaged range and logs it (issue 17).

``t-0`` holds 60 batches of 10 records in 4000-byte segments; the length of the batch
at offset 70, in the middle of the first (sealed) segment, is flipped so that it runs
past the segment's end. Before the fix the read took it for an unflushed tail and went
on at the next segment, in silence, whatever ``failOnDataLoss`` said.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import PySparkException

from seglogfs.spark.errors import CorruptDataError
from seglogfs.spark.reader import OffsetRange, engine_columns
from storage import AppendInfo, LogManager

RECORDS = 600


def damaged_log(log_dir: Path) -> tuple[AppendInfo, Path]:
    """The log (see the module); the damaged batch and its segment file."""
    with LogManager.open(log_dir) as manager:
        manager.create_topic("t", 1, {"segment.bytes": "4000", "index.interval.bytes": "200"})
        log = manager.log("t", 0)
        infos = [log.append([b"record %04d" % (10 * i + k) for k in range(10)]) for i in range(60)]
        assert log.number_of_segments > 2
    bad = infos[7]
    assert (bad.first_offset, bad.segment_base_offset) == (70, 0)
    segment = log_dir / "t-0" / "00000000000000000000.log"
    data = bytearray(segment.read_bytes())
    data[bad.position + 9] ^= 0x01  # the batch length, 64 KiB more
    segment.write_bytes(bytes(data))
    return bad, segment


def test_a_task_fails_naming_the_damaged_batch(log_dir: Path) -> None:
    bad, segment = damaged_log(log_dir)
    with LogManager.open(log_dir, read_only=True) as reader:
        r = OffsetRange("t", 0, 0, RECORDS)
        with pytest.raises(CorruptDataError) as info:
            list(engine_columns(reader, r, fail_on_data_loss=True))
    message = str(info.value)
    assert message.startswith(
        f"corrupt data in topic t partition 0 at offset 70: corrupt record in {segment} at "
        f"byte {bad.position}, offset 70: a batch of "
    )
    assert '"failOnDataLoss" to "false"' in message


def test_fail_on_data_loss_false_skips_the_damaged_range_and_logs_it(
    log_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bad, segment = damaged_log(log_dir)
    with LogManager.open(log_dir, read_only=True) as reader:
        columns = list(
            engine_columns(reader, OffsetRange("t", 0, 0, RECORDS), fail_on_data_loss=False)
        )
    # To the next batch that frames: the first an offset-index entry names after it.
    assert [o for c in columns for o in c.offsets] == [
        o for o in range(RECORDS) if not 70 <= o < 80
    ]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert warnings[0].startswith(
        f"seglog: skipping offsets [70, 80) of topic t partition 0: corrupt record in "
        f"{segment} at byte {bad.position}, offset 70: "
    )


def test_spark_fails_the_task_or_skips_the_range(spark: Any, log_dir: Path) -> None:
    damaged_log(log_dir)
    reader = spark.read.format("seglog").option("subscribe", "t")
    with pytest.raises(PySparkException, match="corrupt data in topic t partition 0 at offset 70"):
        reader.load(str(log_dir)).count()
    lenient = reader.option("failOnDataLoss", "false").load(str(log_dir))
    offsets = sorted(row.offset for row in lenient.select("offset").collect())
    assert offsets == [o for o in range(RECORDS) if not 70 <= o < 80]

"""What the corruption harness (``tests/reliability/test_corruption.py``) found, each
fixed with a test here (issue #17).

1. A v2 batch's base offset (bytes 0-7) lies outside its CRC, in Kafka's format as
   here: a bit flipped there passed every check, and the batch was served under
   offsets it never had (1125899906842709 in a segment named 80 whose successor starts
   at 95), the next one then "going back". Reads now check that a batch's offsets lie
   in its segment and go on from the last offset served, and a batch after a gap (only
   compaction makes one) waits for the batch after it, which a damaged base offset
   contradicts; recovery cuts such a batch in the unflushed tail.
2. A corrupt ``recovery-point-offset-checkpoint`` or ``log-start-offset-checkpoint``
   made every open of the directory fail. As Kafka's ``LogManager.loadLogs``, the
   file is ignored with a warning: recovery from offset 0, each log from its first
   segment.
3. A writable open with an extension index (the mount's position index) failed on a
   damaged batch it had to measure (a record count flipped in a sealed segment), and
   on a position index cut inside its first entry.
4. An append to an active segment whose first batch does not frame failed.
5. A reader of a crashed log failed to open it when the active segment's ``.index``
   was garbage.
6. (seed 29) After a clean shutdown, a last batch whose offsets go back (a flipped
   last offset delta; a base offset flipped downwards) set the log end: -2147483251,
   every offset out of range. The loader now recovers such an active segment.
7. (seed 4) After a crash, the segments recovery re-validates had their position
   index settled across a missing segment as if none were missing: every position
   after it moved (a read-only mount's ``pread`` returned other bytes).
8. (the render process's fills checked against the daemon's reads) A read that goes
   on at a batch whose base offset was damaged downwards served it under wrong
   offsets, or skipped it.
9. (seed 10) A sealed segment cut at a batch boundary was passed over: its stale
   index entries "proved" it ended right before the next segment.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from seglogfs.positions import position_index_spec
from storage import CorruptRecordError, Log, LogConfig, LogManager
from storage.log.file_names import (
    CLEAN_SHUTDOWN_FILE,
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
)
from storage.log.topic import TopicMetadata
from tests.conftest import ManualClock
from tests.storage.log.test_damaged_batch import (
    BATCHES,
    CONFIG,
    fill,
    flip,
    middle_of_first_segment,
    read_from,
    segment_path,
    stops_at,
)

SPEC = position_index_spec(TopicMetadata("t", 1))
RECORD_COUNT = 57
"""Byte of a v2 batch where its record count starts (inside the CRC)."""


def flip_base_offset_bit(path: Path, position: int, base_offset: int, *, upwards: bool,
                         at_least: int = 0) -> int:  # fmt: skip
    """Flip one bit of the base offset of the batch at ``position`` of ``path``: the
    lowest bit at or above ``at_least`` that is clear (``upwards``: the offset grows)
    or set (it shrinks); return the damaged base offset."""
    bit = next(b for b in range(at_least, 63) if bool(base_offset >> b & 1) is not upwards)
    flip(path, position + 7 - bit // 8, 1 << bit % 8)
    return base_offset ^ (1 << bit)


FLIPS = {
    "up by 1 bit": (True, 0),
    "up by 2^20": (True, 20),
    "up by 2^50": (True, 50),
    "down": (False, 0),
}


@pytest.mark.parametrize("flip_kind", FLIPS)
@pytest.mark.parametrize("writable", [True, False], ids=["writer", "reader"])
def test_a_damaged_base_offset_in_a_sealed_segment_stops_the_read(
    log_dir: Path, clock: ManualClock, writable: bool, flip_kind: str
) -> None:
    infos = fill(log_dir, clock)
    bad = middle_of_first_segment(infos)
    upwards, at_least = FLIPS[flip_kind]
    flip_base_offset_bit(segment_path(log_dir, bad), bad.position, bad.first_offset,
                         upwards=upwards, at_least=at_least)  # fmt: skip
    log = Log.open(log_dir / "t-0", CONFIG, clock=clock, writable=writable)
    try:
        error = stops_at(log, bad)  # not one record under a wrong offset
        assert error.offset == bad.first_offset
        # Spark's failOnDataLoss=false: the batch is skipped, reported from its true
        # first offset to the one after its span (its last offset delta is in the CRC).
        skipped: list[tuple[int, int]] = []
        served = [
            b.base_offset
            for b in log.batches(0, on_corrupt=lambda e, resume: skipped.append((e.offset, resume)))
        ]
        assert skipped == [(bad.first_offset, bad.last_offset + 1)]
        assert served == [info.first_offset for info in infos if info is not bad]
    finally:
        log.close()


@pytest.mark.parametrize("flip_kind", FLIPS)
def test_recovery_cuts_a_damaged_base_offset_in_the_unflushed_tail(
    log_dir: Path, clock: ManualClock, flip_kind: str
) -> None:
    infos = fill(log_dir, clock)
    bad = middle_of_first_segment(infos)
    upwards, at_least = FLIPS[flip_kind]
    flip_base_offset_bit(segment_path(log_dir, bad), bad.position, bad.first_offset,
                         upwards=upwards, at_least=at_least)  # fmt: skip
    log = Log.open(log_dir / "t-0", CONFIG, clock=clock, had_clean_shutdown=False)
    try:
        assert log.log_end_offset == bad.first_offset
        assert read_from(log, 0) == (list(range(bad.first_offset)), None)
        assert log.append([b"next"]).first_offset == bad.first_offset
    finally:
        log.close()


@pytest.mark.parametrize("clean", [True, False], ids=["clean", "crashed"])
@pytest.mark.parametrize("writable", [True, False], ids=["writer", "reader"])
def test_a_damaged_base_offset_of_the_last_batch_is_cut(
    log_dir: Path, clock: ManualClock, clean: bool, writable: bool
) -> None:
    """The log's last batch has no batch after it to contradict a base offset damaged
    upwards (within the segment's 32-bit range). After a clean shutdown the
    checkpointed recovery point is the log end, which it passes; after a crash
    recovery keeps only what it can verify (a log copied with gaps is copied again)."""
    infos = fill(log_dir, clock)
    last = infos[-1]
    flip_base_offset_bit(segment_path(log_dir, last), last.position, last.first_offset,
                         upwards=True, at_least=20)  # fmt: skip
    log = Log.open(log_dir / "t-0", CONFIG, clock=clock, writable=writable,
                   had_clean_shutdown=clean, recovery_point=10 * BATCHES)  # fmt: skip
    try:
        assert log.log_end_offset == last.first_offset
        assert read_from(log, 0) == (list(range(last.first_offset)), None)
    finally:
        log.close()


def test_contiguous_batches_past_a_stale_recovery_point_are_kept(
    log_dir: Path, clock: ManualClock
) -> None:
    """A clean-shutdown marker beside an older recovery point (what the harness's
    "marker" damage makes): only a batch after a gap is judged by it."""
    fill(log_dir, clock)
    log = Log.open(log_dir / "t-0", CONFIG, clock=clock, recovery_point=10)
    try:
        assert log.log_end_offset == 10 * BATCHES
        assert read_from(log, 0) == (list(range(10 * BATCHES)), None)
    finally:
        log.close()


@pytest.mark.parametrize("broker", [False, True], ids=["seglogfs", "broker"])
def test_gaps_a_compacted_log_leaves_are_still_read(
    log_dir: Path, clock: ManualClock, broker: bool
) -> None:
    """Batches after gaps (as replication copies a compacted log) are not damage: the
    batch after each goes on past it. After a crash, the last batch of a seglogfs log
    of ``cleanup.policy=delete`` after a gap is cut, as nothing can confirm it (the
    copy is made again); in a broker's directory (whose topic may be compacted) it
    stays."""
    from storage import build_record_batch

    log = Log.open(log_dir / "t-0", CONFIG, clock=clock)
    if broker:
        (log.dir / "partition.metadata").write_text("version: 0\n")
    expected = []
    for base in (0, 5, 30, 32, 100):
        log.append_batches(
            build_record_batch([b"%d" % base, b"x"], timestamps=clock.now_ms, base_offset=base),
            assign_offsets=False,
        )
        expected += [base, base + 1]
    assert [r.offset for r in log.records(0)] == expected
    log.close()
    log = Log.open(log_dir / "t-0", CONFIG, clock=clock, recovery_point=102)
    assert [r.offset for r in log.records(0)] == expected
    log.close()
    log = Log.open(log_dir / "t-0", CONFIG, clock=clock, had_clean_shutdown=False)
    assert [r.offset for r in log.records(0)] == (expected if broker else expected[:-2])
    log.close()


def test_an_undecodable_batch_does_not_fail_the_open_of_a_log_with_a_position_index(
    log_dir: Path, clock: ManualClock
) -> None:
    """The position index is measured from the records; a damaged batch after its last
    entry cannot be. The open measured it anyway and failed (``negative record
    count``): now such a batch measures nothing, the next segment's own entry 0 keeps
    the positions after it, and reads stop at it."""
    log = Log.open(log_dir / "t-0", CONFIG, clock=clock, extension=SPEC)
    for i in range(BATCHES):
        log.append([b"record %04d" % (10 * i + k) for k in range(10)])
    end = log.extension_end
    infos = [b for b in log.batches(0)]
    log.close()
    in_first = [b for b in infos if b.base_offset < log.segments.values()[1].base_offset]
    bad = in_first[-1]  # after the segment's last position-index entry
    flip(log_dir / "t-0" / "00000000000000000000.log", bad.position + RECORD_COUNT, 0x80)
    log = Log.open(log_dir / "t-0", CONFIG, clock=clock, extension=SPEC)
    try:
        assert log.extension_end == end  # the positions after the damage kept
        with pytest.raises(CorruptRecordError) as error:
            list(log.records(0))
        assert error.value.offset == bad.base_offset
    finally:
        log.close()


def test_a_position_index_cut_inside_its_first_entry_is_rebuilt(
    log_dir: Path, clock: ManualClock
) -> None:
    log = Log.open(log_dir / "t-0", CONFIG, clock=clock, extension=SPEC)
    for i in range(BATCHES):
        log.append([b"record %04d" % (10 * i + k) for k in range(10)])
    end = log.extension_end
    log.close()
    with open(log_dir / "t-0" / "00000000000000000000.seglogpos", "r+b") as f:
        f.truncate(2)
    log = Log.open(log_dir / "t-0", CONFIG, clock=clock, extension=SPEC)
    try:
        assert log.extension_end == end
        assert log.extension_position(0) == (0, 0)
    finally:
        log.close()


@pytest.mark.parametrize("name", [RECOVERY_POINT_CHECKPOINT, LOG_START_OFFSET_CHECKPOINT])
@pytest.mark.parametrize("clean", [True, False], ids=["clean", "crashed"])
def test_a_corrupt_checkpoint_is_ignored_loudly(
    tmp_path: Path, clock: ManualClock, caplog: pytest.LogCaptureFixture, name: str,
    clean: bool,
) -> None:  # fmt: skip
    with LogManager.open(tmp_path, clock=clock) as manager:
        manager.create_topic("t", 1, {"segment.bytes": "1000"})
        log = manager.log("t", 0)
        for i in range(30):
            log.append([b"record %d" % i] * 5)
        log.advance_log_start_offset(20)
        assert log.number_of_segments > 2
    if not clean:
        (tmp_path / CLEAN_SHUTDOWN_FILE).unlink()
    (tmp_path / name).write_bytes(b"0\n1\nt 0 \x93\n")
    with caplog.at_level(logging.WARNING):
        with LogManager.open(tmp_path, clock=clock, read_only=True) as reader:
            log = reader.log("t", 0)
            start = log.log_start_offset
            assert [r.offset for r in log.records(start)] == list(range(start, 150))
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len([w for w in warnings if name in w]) == 1, warnings
        with LogManager.open(tmp_path, clock=clock) as manager:
            log = manager.log("t", 0)
            # Kafka's fallbacks: no recovery point (recover all), no log start offset
            # (the first segment's base offset).
            assert log.log_start_offset == (0 if name == LOG_START_OFFSET_CHECKPOINT else 20)
            assert log.log_end_offset == 150
    # The writable open wrote the checkpoint again.
    assert b"\x93" not in (tmp_path / name).read_bytes()


def test_an_active_segment_whose_first_batch_does_not_frame_still_takes_appends(
    log_dir: Path, clock: ManualClock
) -> None:
    """4. After a clean shutdown the loader checks the active segment's tail from its
    last index entry, so damage before it stays (reads stop there). The first append
    then failed: ``segment.ms`` is measured from the first batch's timestamp, read by a
    scan that met the damage. It now counts from the segment's creation."""
    one_segment = LogConfig(index_interval_bytes=200)
    log = Log.open(log_dir / "t-0", one_segment, clock=clock)
    for i in range(20):
        log.append([b"record %04d" % (10 * i + k) for k in range(10)])
    log.close()
    flip(log_dir / "t-0" / "00000000000000000000.log", 16, 0x20)  # the first batch's magic
    log = Log.open(log_dir / "t-0", one_segment, clock=clock)
    try:
        assert log.append([b"after"]).first_offset == 200
        with pytest.raises(CorruptRecordError) as error:
            list(log.records(0))
        assert (error.value.position, error.value.offset) == (0, 0)
        assert next(log.records(200)).value == b"after"
    finally:
        log.close()


def test_a_reader_of_a_crashed_log_rebuilds_a_garbage_index_of_the_active_segment(
    log_dir: Path, clock: ManualClock
) -> None:
    """5. A reader's recovery kept the on-disk indexes of the segments it re-validates;
    a garbage ``.index`` of the active segment named a negative position, and the open
    failed with ``EINVAL`` from ``pread``. It rebuilds damaged ones in scratch space."""
    infos = fill(log_dir, clock)
    active = infos[-1].segment_base_offset
    (log_dir / "t-0" / f"{active:020d}.index").write_bytes(b"\xff" * 46)
    log = Log.open(log_dir / "t-0", CONFIG, clock=clock, writable=False,
                   had_clean_shutdown=False, recovery_point=active)  # fmt: skip
    try:
        assert log.log_end_offset == 10 * BATCHES
        assert read_from(log, 0) == (list(range(10 * BATCHES)), None)
    finally:
        log.close()


@pytest.mark.parametrize("writable", [True, False], ids=["writer", "reader"])
def test_a_sealed_segment_cut_short_keeps_the_positions_after_it(
    log_dir: Path, clock: ManualClock, writable: bool
) -> None:
    """3 (found through the mount: ``pread`` after the damage returned other bytes).
    The position index is measured from the log, and a scan that measures ends quietly
    at a batch the file cuts off, so a sealed segment cut short measured fewer units
    and every later segment's index was rebuilt from there: each position after the
    cut moved. Now the cut segment's end is only a lower bound, and the next segment's
    own entry 0 keeps the positions."""
    log = Log.open(log_dir / "t-0", CONFIG, clock=clock, extension=SPEC)
    for i in range(BATCHES):
        log.append([b"record %04d" % (10 * i + k) for k in range(10)])
    starts = [(s.base_offset, s.extension_start) for s in log.segments.values()]
    first = log.segments.values()[0]
    size = first.size
    log.close()
    with open(first.path, "r+b") as f:
        f.truncate(size - 30)  # inside its last batch
    log = Log.open(log_dir / "t-0", CONFIG, clock=clock, extension=SPEC, writable=writable)
    try:
        assert [(s.base_offset, s.extension_start) for s in log.segments.values()] == starts
        assert not log.segments.values()[0].extension_exact
    finally:
        log.close()


@pytest.mark.parametrize("where", ["middle", "last"])
def test_verify_names_the_segment_of_a_damaged_base_offset(
    log_dir: Path, clock: ManualClock, where: str
) -> None:
    """``seglogfs verify`` reported a base offset damaged upwards only in the batch or
    the segment after it ("does not follow", "the previous segment holds offsets up to
    ..."), never in the segment that holds it."""
    from seglogfs.cli.verify import verify_log_dir

    infos = fill(log_dir, clock)
    in_first = [info for info in infos if info.segment_base_offset == 0]
    bad = middle_of_first_segment(infos) if where == "middle" else in_first[-1]
    flip_base_offset_bit(segment_path(log_dir, bad), bad.position, bad.first_offset,
                         upwards=True, at_least=3)  # fmt: skip
    problems = verify_log_dir(log_dir)
    assert (segment_path(log_dir, bad), bad.position) in {(p.path, p.position) for p in problems}


LAST_OFFSET_DELTA = 23
"""Byte of a v2 batch where its last offset delta (a big-endian int32, inside the CRC)
starts: flipping its high bit makes the delta negative."""


@pytest.mark.parametrize("damage", ["last offset delta", "base offset down"])
@pytest.mark.parametrize("clean_end", [True, False], ids=["checkpointed", "no checkpoint"])
@pytest.mark.parametrize("writable", [True, False], ids=["writer", "reader"])
def test_a_last_batch_whose_offsets_go_back_is_cut_after_a_clean_shutdown(
    log_dir: Path, clock: ManualClock, damage: str, clean_end: bool, writable: bool
) -> None:
    """6 (seed 29). After a clean shutdown the active segment's end offset is read from
    the headers of its last batches, without their CRC. A last offset delta with its
    high bit flipped (inside the CRC) made the log end -2147483251: the log start
    followed it down, every read failed with "offset 0 is out of range" and an append
    would have taken that offset. A base offset flipped downwards (outside the CRC)
    ended the log inside offsets it holds, to be handed out again. The loader now takes
    a batch whose offsets go back (or end before they begin) for damage, and recovers
    the active segment: cut at it (a reader hides it), as any unflushed tail."""
    infos = fill(log_dir, clock)
    last = infos[-1]
    path = segment_path(log_dir, last)
    if damage == "last offset delta":
        flip(path, last.position + LAST_OFFSET_DELTA, 0x80)
    else:
        flip_base_offset_bit(path, last.position, last.first_offset, upwards=False)
    log = Log.open(log_dir / "t-0", CONFIG, clock=clock, writable=writable,
                   had_clean_shutdown=True,
                   recovery_point=10 * BATCHES if clean_end else 0)  # fmt: skip
    try:
        assert (log.log_start_offset, log.log_end_offset) == (0, last.first_offset)
        assert read_from(log, 0) == (list(range(last.first_offset)), None)
        if writable:
            assert log.append([b"next"]).first_offset == last.first_offset
    finally:
        log.close()


@pytest.mark.parametrize("writable", [True, False], ids=["writer", "reader"])
def test_a_missing_segment_after_the_recovery_point_keeps_the_positions_after_it(
    log_dir: Path, clock: ManualClock, writable: bool
) -> None:
    """7 (seed 4, through a read-only mount: ``pread`` after the hole returned other
    bytes). After a crash, the segments recovery re-validates get their position index
    settled after it, each from the end of the one before, a hole of offsets or not: a
    segment file missing from the middle moved every later position back by its size.
    They are settled as the pass settles the others: after a hole, from the segment's
    own entry 0."""
    log = Log.open(log_dir / "t-0", CONFIG, clock=clock, extension=SPEC)
    for i in range(BATCHES):
        log.append([b"record %04d" % (10 * i + k) for k in range(10)])
    starts = [(s.base_offset, s.extension_start) for s in log.segments.values()]
    assert len(starts) >= 4
    log.close()
    missing = starts[2][0]
    (log_dir / "t-0" / f"{missing:020d}.log").unlink()
    log = Log.open(log_dir / "t-0", CONFIG, clock=clock, extension=SPEC, writable=writable,
                   had_clean_shutdown=False, recovery_point=starts[1][0])  # fmt: skip
    try:
        assert [(s.base_offset, s.extension_start) for s in log.segments.values()] == [
            start for start in starts if start[0] != missing
        ]
        with pytest.raises(CorruptRecordError, match="missing"):
            list(log.records(0))
    finally:
        log.close()


def _set_base_offset(path: Path, position: int, base_offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        f.write(base_offset.to_bytes(8, "big"))


@pytest.mark.parametrize("down", [2, 10, 13], ids=["into the batch before", "onto it", "below"])
@pytest.mark.parametrize("where", ["middle", "first of a segment"])
@pytest.mark.parametrize("writable", [True, False], ids=["writer", "reader"])
def test_a_read_that_goes_on_at_a_batch_whose_base_offset_went_down_stops_there(
    log_dir: Path, clock: ManualClock, down: int, where: str, writable: bool
) -> None:
    """8 (found by checking the render process's fills against the daemon's reads). A
    read from the offset right after a batch (where the daemon's reader goes on after
    the bytes it rendered, and where it enters the next segment) met a batch whose base
    offset was damaged downwards (outside the CRC) as its first: still reaching that
    offset, it was served under offsets it never had (the first batch of a read may
    start before the offset asked for); ending below it, it was passed over, and the
    next batch served after what looked like compaction's gap. The read now scans the
    batch before too (from a segment's first byte when it enters it) and judges the
    next one by it."""
    infos = fill(log_dir, clock)
    if where == "middle":
        bad = middle_of_first_segment(infos)
    else:
        bad = next(i for i in infos if i.segment_base_offset > 0 and i.position == 0)
    before = next(i for i in infos if i.last_offset == bad.first_offset - 1)
    _set_base_offset(segment_path(log_dir, bad), bad.position, bad.first_offset - down)
    log = Log.open(log_dir / "t-0", CONFIG, clock=clock, writable=writable)
    try:
        # From the start, and from each offset a reader goes on at before it.
        for start in (0, before.first_offset, bad.first_offset):
            served, error = read_from(log, start)
            assert served == list(range(start, bad.first_offset)), (start, served[-3:])
            assert error is not None, start
            assert error.path == segment_path(log_dir, bad)
            assert error.offset == bad.first_offset
        with pytest.raises(CorruptRecordError):
            next(iter(log.batches(bad.first_offset)))
    finally:
        log.close()


@pytest.mark.parametrize("cut", ["middle", "last batch"])
@pytest.mark.parametrize("writable", [True, False], ids=["writer", "reader"])
def test_a_sealed_segment_cut_at_a_batch_boundary_is_not_passed_over(
    log_dir: Path, clock: ManualClock, cut: str, writable: bool
) -> None:
    """9 (seed 10). A sealed segment cut short at a batch boundary keeps index entries
    naming the batches it lost (the time index's final entry names its last offset):
    taken as proof that it ends right before the next segment, the read ran out of it
    and went on at the next one, the lost offsets skipped in silence. (Its end was
    measured from its last offset-index entry, which lay past the end of the file: a
    scan of the whole segment found none of the batches wanted and framed nothing.) Now
    an index entry proves the end only when the batch it names ends the file, and the
    scan starts from an entry only when the entry's batch is there: the offsets the
    cut lost are a hole, and reads raise there."""
    infos = fill(log_dir, clock)
    in_first = [info for info in infos if info.segment_base_offset == 0]
    kept = in_first[len(in_first) // 2] if cut == "middle" else in_first[-1]
    with open(segment_path(log_dir, kept), "r+b") as f:
        f.truncate(kept.position)  # the batches from ``kept`` on are gone
    log = Log.open(log_dir / "t-0", CONFIG, clock=clock, writable=writable)
    try:
        served, error = read_from(log, 0)
        assert served == list(range(kept.first_offset))
        assert error is not None
        assert (error.path, error.offset) == (segment_path(log_dir, kept), kept.first_offset)
    finally:
        log.close()


@pytest.mark.parametrize("where", ["middle", "first of a segment"])
@pytest.mark.parametrize("writable", [True, False], ids=["writer", "reader"])
def test_a_read_from_inside_a_batch_whose_base_offset_went_up_serves_nothing_of_it(
    log_dir: Path, clock: ManualClock, where: str, writable: bool
) -> None:
    """10. A read by offset starting past a batch's true offsets but inside the ones its
    base offset, damaged upwards (outside the CRC), makes it claim took it for the
    batch holding the offset (the first batch of a read may start before it) and
    served its last records under offsets they never had (``consume -o N``), then
    blamed the next batch. A read from inside a batch now judges it as a read from the
    batch before it would."""
    infos = fill(log_dir, clock)
    if where == "middle":
        bad = middle_of_first_segment(infos)
    else:
        bad = next(i for i in infos if i.segment_base_offset > 0 and i.position == 0)
    _set_base_offset(segment_path(log_dir, bad), bad.position, bad.first_offset + 2)
    log = Log.open(log_dir / "t-0", CONFIG, clock=clock, writable=writable)
    try:
        for start in (bad.last_offset + 1, bad.last_offset + 2, bad.first_offset + 5):
            served, error = read_from(log, start)
            assert served == [], (start, served)
            assert error is not None
            assert (error.path, error.position, error.offset) == (
                segment_path(log_dir, bad),
                bad.position,
                start,
            )
    finally:
        log.close()

"""Reads that START by seek inside, at or past a damaged batch, through a real mount
(issue 17: never lose, skip or invent a record).

The partition holds 250,000 lines of exactly 100 bytes (the line of offset ``o`` is at
byte ``100 o``), 100 a batch, in segments of 4 MB: seven segments, 25 MB, so ``tail
-c`` seeks (a file up to ``st_blksize``, 1 MiB here, it reads from the start) and a
sequential reader streams through the render process. It is written as the daemon
writes it (position index included), closed cleanly, and one batch of a sealed segment
is damaged: a CRC-covered value byte, or its length (its framing), and the batch is in
the middle of its segment or its last one, with more segments after it.

What is required, and checked for ``dd bs=1 skip=N``, ``tail -c 100``, ``tail -c +N``,
``f.seek(N); f.read()``, ``cat`` and ``dd bs=1M``:

- a read that needs a byte of the damaged batch fails with ``EIO`` after the bytes
  before it (a read starting inside it, or exactly at its start, returns nothing);
- a read wholly after it returns the right bytes where the positions of what follows
  are known for certain: from the next segment on (its position index's entry 0 was
  written when it was created), and inside the segment from the first batch the offset
  index names past the damage (its position-index entry was written at its append);
  where the engine would have to frame its way through the damaged batch, ``EIO``;
- nothing else: no read returns a byte that is not the one at its position;
- the daemon logs one WARNING naming the topic, partition, file, byte and offset of
  the damaged batch, however many reads meet it and wherever they start (a read past a
  damaged length used to log a second one, at a byte inside the batch's true bytes).

The engine's reads by offset (``Log.batches``, ``Log.records``, ``seglogfs consume -o
N``) starting inside the damaged batch's offsets raise (print) the corruption error
naming the batch, never go on at the next batch (``test_engine_reads_by_offset...``).

``test_a_missing_segment_is_never_passed_over`` checks the same of a segment file
missing from the middle: the render process's fills went on at the next segment and
laid its bytes where the missing one's belong (``cat`` exited 0, 3.7 MB short).
``test_a_position_index_rebuilt_over_a_damaged_batch...``: a rebuilt ``.seglogpos``
laid the batches after an undecodable one a batch too early (a read at the damaged
batch's position got the next batch's lines). ``test_a_damaged_base_offset_is_not...``:
the render process checked each batch's CRC and framing, not that its base offset
(outside the CRC) follows the offsets before it, and streamed a json topic's damaged
batch under offsets it never had (``cat`` exited 0); ``test_fills_serve_what_the_...``
checks every fill against the daemon's own read past gaps and damaged base offsets
(which found the daemon's read going on at a batch whose base offset was damaged
downwards serving it, or skipping it).
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import shutil
import struct
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from seglogfs.cli import main
from seglogfs.daemon.render_process import FillRequest, SegmentFiles, fill
from seglogfs.positions import Rendering, position_index_spec
from storage import AppendInfo, CorruptRecordError, Log, LogManager
from storage.log.file_names import log_file
from tests.daemon.conftest import HAVE_FUSE, Mount
from tests.daemon.test_kafka_copy import v2_batch

pytestmark = pytest.mark.skipif(not HAVE_FUSE, reason="/dev/fuse is missing")

LINES = 250_000
PER_BATCH = 100
LINE = 100  # bytes a line renders to, newline included
SIZE = LINES * LINE

DAMAGE = {"crc": -3, "length": 9}
"""The byte of the batch flipped: a value byte, inside the CRC's range; the length's
second byte (+64 KiB: in the middle of a segment the batch then still fits, and frames
garbage after it, but fails its CRC; as the last batch it runs past the segment's end)."""
REASON = {
    ("crc", "middle"): "CRC mismatch",
    ("crc", "last-of-segment"): "CRC mismatch",
    ("length", "middle"): "CRC mismatch",
    ("length", "last-of-segment"): "runs past the end of the segment",
}


def expected(position: int, size: int) -> bytes:
    """The ``size`` bytes of the undamaged partition file at ``position``."""
    end = min(position + size, SIZE)
    if position >= end:
        return b""
    first, last = position // LINE, (end - 1) // LINE
    lines = b"".join(b"%099d\n" % i for i in range(first, last + 1))
    return lines[position - first * LINE : end - first * LINE]


def write_partition(log_dir: Path) -> list[AppendInfo]:
    with LogManager.open(log_dir, extension=position_index_spec) as manager:
        manager.create_topic("t", 1, {"segment.bytes": "4000000"})
        log = manager.log("t", 0)
        infos = [
            log.append([b"%099d" % (i + k) for k in range(PER_BATCH)])
            for i in range(0, LINES, PER_BATCH)
        ]
        assert log.number_of_segments >= 6
    return infos


def flip(path: Path, position: int, mask: int = 0x01) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        byte = f.read(1)[0]
        f.seek(position)
        f.write(bytes([byte ^ mask]))


@contextlib.contextmanager
def mounted(tmp_path: Path, log_dir: Path, options: list[str]) -> Iterator[Path]:
    """``log_dir`` mounted with ``options`` at ``tmp_path / "mnt"`` (yielded), unmounted
    afterwards whatever happens."""
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    mount = Mount(log_dir, mountpoint, options, tmp_path / "daemon.log")
    try:
        mount.start()
        yield mountpoint
    finally:
        mount.cleanup()


@dataclass
class Damaged:
    mount: Mount
    partition: Path
    bad: AppendInfo
    segment: Path
    following: int  # the base offset of the segment after the damaged one

    @property
    def start(self) -> int:  # the damaged batch's first byte in the partition file
        return self.bad.first_offset * LINE

    @property
    def end(self) -> int:  # the byte after it
        return (self.bad.last_offset + 1) * LINE


MountDamaged = Callable[..., Damaged]
"""``mount_damaged(damage, where, *mount options)``."""


@pytest.fixture
def mount_damaged(tmp_path: Path) -> Iterator[MountDamaged]:
    started: list[Mount] = []

    def make(damage: str, where: str, *options: str) -> Damaged:
        log_dir = tmp_path / "logs"
        infos = write_partition(log_dir)
        bases = sorted({info.segment_base_offset for info in infos})
        base = bases[3]  # sealed, three segments after it
        in_segment = [info for info in infos if info.segment_base_offset == base]
        bad = in_segment[len(in_segment) // 2] if where == "middle" else in_segment[-1]
        segment = log_file(log_dir / "t-0", base)
        flip(segment, bad.position + DAMAGE[damage] % bad.size)
        mountpoint = tmp_path / "mnt"
        mountpoint.mkdir()
        mount = Mount(log_dir, mountpoint, list(options), tmp_path / "daemon.log")
        started.append(mount)
        mount.start()
        return Damaged(mount, mountpoint / "t" / "0", bad, segment, bases[4])

    yield make
    for mount in started:
        mount.cleanup()


def dd(partition: Path, skip: int, count: int = 100) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["dd", f"if={partition}", "bs=1", f"skip={skip}", f"count={count}", "status=none"],
        capture_output=True,
        timeout=120,
    )


def assert_eio(result: subprocess.CompletedProcess[bytes], what: str) -> None:
    assert result.returncode != 0, (what, result)
    assert b"Input/output error" in result.stderr, (what, result.stderr)


def seek_read(partition: Path, position: int, size: int) -> bytes | OSError:
    with open(partition, "rb", buffering=0) as f:
        f.seek(position)
        try:
            return f.read(size)
        except OSError as exc:
            return exc


@pytest.mark.parametrize("damage", sorted(DAMAGE))
@pytest.mark.parametrize(
    ("where", "options"),
    [("middle", ()), ("last-of-segment", ("-o", "ro"))],
    ids=["middle-rw", "last-of-segment-ro"],
)
def test_reads_that_start_inside_at_or_after_a_damaged_batch(
    mount_damaged: MountDamaged, damage: str, where: str, options: tuple[str, ...]
) -> None:
    d = mount_damaged(damage, where, *options)
    partition, start, end = d.partition, d.start, d.end
    assert partition.stat().st_size == SIZE  # the size never lies
    next_segment = d.following * LINE
    if where == "last-of-segment":
        assert end == next_segment

    # A read that starts before it and runs into it: the bytes before it, then EIO.
    result = dd(partition, start - 50)
    assert_eio(result, "dd into it")
    assert result.stdout == expected(start - 50, 50)

    # A read that starts inside it or exactly at its start: nothing, EIO.
    for skip in (start, start + 1, start + 37, (start + end) // 2, end - 1):
        result = dd(partition, skip)
        assert_eio(result, f"dd skip={skip}")
        assert result.stdout == b"", skip
        error = seek_read(partition, skip, 4096)
        assert isinstance(error, OSError), (skip, error)
        assert error.errno == errno.EIO, (skip, error)
    result = subprocess.run(
        ["tail", "-c", f"+{start + 11}", str(partition)], capture_output=True, timeout=120
    )
    assert_eio(result, "tail -c +N inside it")
    assert result.stdout == b""

    # Reads wholly after it: the right bytes, or EIO where the engine would frame its
    # way through the damaged batch; never other bytes.
    served_in_segment = []
    batch_bytes = PER_BATCH * LINE
    probes = {end, end + 1, end + batch_bytes - 1, end + batch_bytes, end + batch_bytes + 1}
    probes |= set(range(end, next_segment, (next_segment - end) // 23 + 1))
    for skip in sorted(p for p in probes if p < next_segment):
        result = dd(partition, skip)
        if result.returncode == 0:
            assert result.stdout == expected(skip, 100), skip
            served_in_segment.append(skip)
        else:
            assert_eio(result, f"dd skip={skip} after it")
            assert result.stdout == b"", skip
    if where == "middle":
        # An offset-index entry names a batch past the damage, whose position-index
        # entry was written when it was appended: served from there. After a damaged
        # CRC the next batch frames (its entry names the damaged batch, whose header
        # says where it ends); after a damaged length only the batch after it, which
        # the next offset-index entry names.
        first_served = end if damage == "crc" else end + batch_bytes
        assert served_in_segment, "nothing served after it in its segment"
        assert min(served_in_segment) == first_served, served_in_segment
    # The next segment on: its positions are certain.
    for skip in (next_segment, next_segment + 1, next_segment + 12_345, SIZE - 100):
        result = dd(partition, skip)
        assert result.returncode == 0, (skip, result.stderr)
        assert result.stdout == expected(skip, 100), skip
        assert seek_read(partition, skip, 4096) == expected(skip, 4096), skip
    tail = subprocess.run(["tail", "-c", "100", str(partition)], capture_output=True, timeout=120)
    assert (tail.returncode, tail.stdout) == (0, expected(SIZE - 100, 100)), tail.stderr
    # From the next segment to the end, sequentially (through the render process).
    tail = subprocess.run(
        ["tail", "-c", f"+{next_segment + 1}", str(partition)], capture_output=True, timeout=120
    )
    assert tail.returncode == 0, tail.stderr
    assert tail.stdout == expected(next_segment, SIZE), "tail -c +N after it"

    # From the start: every byte before it, then EIO (through the render process).
    for command in (["cat", str(partition)], ["dd", f"if={partition}", "bs=1M", "status=none"]):
        result = subprocess.run(command, capture_output=True, timeout=120)
        assert_eio(result, command[0])
        assert result.stdout == expected(0, start), command[0]

    assert d.mount.stop() == 0
    warnings = [line for line in d.mount.log().splitlines() if "corrupt record" in line]
    assert len(warnings) == 1, warnings  # one, however many reads met it, wherever
    assert "WARNING" in warnings[0]
    for fact in (
        "topic t partition 0",
        f"corrupt record in {d.segment} at byte {d.bad.position}, offset",
        REASON[damage, where],
    ):
        assert fact in warnings[0], (fact, warnings[0])


def test_a_missing_segment_is_never_passed_over(tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    infos = write_partition(log_dir)
    bases = sorted({info.segment_base_offset for info in infos})
    missing, following = bases[3], bases[4]
    log_file(log_dir / "t-0", missing).unlink()
    with mounted(tmp_path, log_dir, ["-o", "ro"]) as mountpoint:
        partition = mountpoint / "t" / "0"
        assert partition.stat().st_size == SIZE
        for command in (
            ["cat", str(partition)],
            ["dd", f"if={partition}", "bs=1M", "status=none"],
        ):
            result = subprocess.run(command, capture_output=True, timeout=120)
            assert_eio(result, command[0])
            assert result.stdout == expected(0, missing * LINE), (command[0], len(result.stdout))
        for skip in (missing * LINE, following * LINE - 1):
            assert_eio(dd(partition, skip), f"dd skip={skip} in the missing segment")
        # After the hole: the next segment's positions are its own (entry 0).
        result = dd(partition, following * LINE + 7)
        assert (result.returncode, result.stdout) == (0, expected(following * LINE + 7, 100))
        with open(partition, "rb", buffering=0) as f:
            assert os.pread(f.fileno(), 100, SIZE - 100) == expected(SIZE - 100, 100)


# -- the engine, by offset ---------------------------------------------------------------


def damaged_log_dir(log_dir: Path, damage: str) -> tuple[list[AppendInfo], AppendInfo, Path]:
    """The partition of the mount tests, the batch in the middle of its fourth segment
    damaged; (appends, that batch, its segment file)."""
    infos = write_partition(log_dir)
    bases = sorted({info.segment_base_offset for info in infos})
    in_segment = [info for info in infos if info.segment_base_offset == bases[3]]
    bad = in_segment[len(in_segment) // 2]
    segment = log_file(log_dir / "t-0", bad.segment_base_offset)
    flip(segment, bad.position + DAMAGE[damage] % bad.size)
    return infos, bad, segment


@pytest.mark.parametrize("damage", sorted(DAMAGE))
@pytest.mark.parametrize("writable", [False, True], ids=["reader", "writer"])
def test_engine_reads_by_offset_inside_a_damaged_batch_raise(
    tmp_path: Path, damage: str, writable: bool
) -> None:
    log_dir = tmp_path / "logs"
    infos, bad, segment = damaged_log_dir(log_dir, damage)
    following = infos[infos.index(bad) + 1]
    with LogManager.open(log_dir, extension=position_index_spec, read_only=not writable) as m:
        log: Log = m.log("t", 0)
        assert next(iter(log.batches(bad.first_offset - 1))).last_offset == bad.first_offset - 1
        for offset in (bad.first_offset, bad.first_offset + 1, bad.first_offset + 57):
            for how in ("batches", "records"):
                error = _read_error(log, how, offset)
                assert (error.path, error.position, error.offset) == (segment, bad.position, offset)
        assert _read_error(log, "batches", bad.last_offset).position == bad.position
        # The next batch: served after a damaged CRC (its framing holds); after a damaged
        # length the scan cannot frame past it: the error names the damaged batch (not
        # the garbage its wrong length frames next).
        if damage == "crc":
            assert next(log.records(following.first_offset)).offset == following.first_offset
        else:
            with pytest.raises(CorruptRecordError) as info:
                next(log.records(following.first_offset))
            assert (info.value.path, info.value.position) == (segment, bad.position)
            after = infos[infos.index(bad) + 2].first_offset  # an offset-index entry names it
            assert next(log.records(after)).offset == after


def _read_error(log: Log, how: str, offset: int) -> CorruptRecordError:
    # The error ``batches(offset)`` or ``records(offset)`` raises before serving anything.
    try:
        got: object = (
            next(iter(log.batches(offset))) if how == "batches" else next(log.records(offset))
        )
    except CorruptRecordError as exc:
        return exc
    raise AssertionError(f"{how}({offset}) served {got!r}")


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_consume_from_an_offset_inside_a_damaged_batch_fails(
    tmp_path: Path, damage: str, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    log_dir = tmp_path / "logs"
    _infos, bad, segment = damaged_log_dir(log_dir, damage)
    for offset in (bad.first_offset, bad.first_offset + 42, bad.last_offset):
        capsysbinary.readouterr()
        code = main(["consume", "-d", str(log_dir), "t", "-p", "0", "-o", str(offset), "-e"])
        out, err = capsysbinary.readouterr()
        assert code == 1, (offset, err)
        assert out == b"", offset  # not the records of the next batch
        lines = err.decode().splitlines()
        assert len(lines) == 1, lines
        assert lines[0].startswith(
            f"seglogfs consume: error: topic t partition 0: corrupt record in {segment} at "
            f"byte {bad.position}, offset {offset}: "
        ), lines
    # From just before it: the record before, then the error.
    capsysbinary.readouterr()
    code = main(["consume", "-d", str(log_dir), "t", "-p", "0", "-o", str(bad.first_offset - 1)])
    out, err = capsysbinary.readouterr()
    assert (code, out) == (1, expected((bad.first_offset - 1) * LINE, LINE))
    assert f"at byte {bad.position}, offset {bad.first_offset}: ".encode() in err


# -- a position index rebuilt over the damage ----------------------------------------------

FIRST_RECORD_LENGTH = 61
"""The first byte after a v2 batch header: the first record's length (a zigzag varint,
inside the CRC). Flipping its low bit makes it negative: the records do not decode, so
a rebuild of the position index cannot measure the batch."""


@pytest.mark.parametrize("options", [("-o", "ro"), ()], ids=["ro", "rw"])
def test_a_position_index_rebuilt_over_a_damaged_batch_serves_no_guessed_positions(
    tmp_path: Path, options: tuple[str, ...]
) -> None:
    # The damaged segment's .seglogpos is gone (or a copied Kafka directory never had
    # one): the daemon rebuilds it from the .log. The damaged batch measures nothing;
    # entries after it used to be laid from there, a batch too early: a read at the
    # damaged batch's own position got the next batch's lines, and every later position
    # of the segment the lines of a batch further on, in silence.
    log_dir = tmp_path / "logs"
    infos = write_partition(log_dir)
    bases = sorted({info.segment_base_offset for info in infos})
    in_segment = [info for info in infos if info.segment_base_offset == bases[3]]
    bad = in_segment[len(in_segment) // 2]
    flip(log_file(log_dir / "t-0", bases[3]), bad.position + FIRST_RECORD_LENGTH)
    (log_dir / "t-0" / f"{bases[3]:020d}.seglogpos").unlink()
    start, end, next_segment = (
        bad.first_offset * LINE,
        (bad.last_offset + 1) * LINE,
        bases[4] * LINE,
    )
    with mounted(tmp_path, log_dir, list(options)) as mountpoint:
        partition = mountpoint / "t" / "0"
        result = dd(partition, start - 50)
        assert_eio(result, "dd into it")
        assert result.stdout == expected(start - 50, 50)
        for skip in (start, start + 1, end - 1, end, end + 1, end + 7 * PER_BATCH * LINE):
            result = dd(partition, skip)
            assert_eio(result, f"dd skip={skip}")
            assert result.stdout == b"", skip
        probes = range(end, next_segment, (next_segment - end) // 17 + 1)
        for skip in (*probes, next_segment - 1):
            error = seek_read(partition, skip, 100)
            assert isinstance(error, OSError), (skip, error)
        # The next segment keeps its own positions (its index's entry 0).
        for skip in (next_segment, next_segment + 4321, SIZE - 100):
            result = dd(partition, skip)
            assert (result.returncode, result.stdout) == (0, expected(skip, 100)), skip
        tail = subprocess.run(
            ["tail", "-c", "100", str(partition)], capture_output=True, timeout=120
        )
        assert (tail.returncode, tail.stdout) == (0, expected(SIZE - 100, 100)), tail.stderr
        cat = subprocess.run(["cat", str(partition)], capture_output=True, timeout=120)
        assert_eio(cat, "cat")
        assert cat.stdout == expected(0, start)


# -- the render process ----------------------------------------------------------------------


def test_a_damaged_base_offset_is_not_streamed_by_the_render_process(tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    with LogManager.open(log_dir, extension=position_index_spec) as manager:
        manager.create_topic("t", 1, {"segment.bytes": "4000000"}, format="json")
        log = manager.log("t", 0)
        infos = [
            log.append([b"%099d" % (i + k) for k in range(PER_BATCH)])
            for i in range(0, LINES, PER_BATCH)
        ]
    bases = sorted({info.segment_base_offset for info in infos})
    in_segment = [info for info in infos if info.segment_base_offset == bases[3]]
    bad = in_segment[len(in_segment) // 2]
    # The base offset's low byte: +2, outside the CRC.
    flip(log_file(log_dir / "t-0", bases[3]), bad.position + 7, 0x02)
    with mounted(tmp_path, log_dir, ["-o", "ro"]) as mountpoint:
        cat = subprocess.run(["cat", str(mountpoint / "t" / "0")], capture_output=True, timeout=300)
        lines = cat.stdout.splitlines()
        # Every line served names its own offset, and the read stops at the damage.
        assert all(b'"offset": %d,' % i in line for i, line in enumerate(lines))
        assert_eio(cat, "cat")
        assert len(lines) == bad.first_offset


def _gapped_log_dir(log_dir: Path) -> list[tuple[int, int, int]]:
    """A ``json`` topic copied as replication copies it, with compaction's gaps (a gap
    in the middle of a segment, one before a segment's last batch, one at a segment's
    start), closed cleanly; ``(segment base, position, base offset)`` of each batch."""
    with LogManager.open(log_dir, extension=position_index_spec) as manager:
        manager.create_topic("t", 1, {"segment.bytes": "1500"}, format="json")
        log = manager.log("t", 0)
        offset = 0
        for i in range(60):
            offset += 4 if i % 7 == 3 else 0  # the gaps
            log.append_batches(
                v2_batch(offset, 0, [(b"k%d" % j, b"v%d-%d" % (offset + j, j)) for j in range(3)]),
                assign_offsets=False,
            )
            offset += 3
        assert log.number_of_segments >= 4
        return [
            (segment.base_offset, batch.position, batch.base_offset)
            for segment in log.segments.values()
            for batch in segment.batches()
        ]


def _offsets(bases: list[int]) -> set[int]:
    return {base + k for base in bases for k in range(3)}


def _daemon_reads(log: Log, rendering: Rendering) -> tuple[bytes, CorruptRecordError | None]:
    # What the daemon's own read (Log.batches) renders from the log start, and its error.
    out = bytearray()
    try:
        for batch in log.batches(log.log_start_offset):
            out += rendering.render(batch).data
    except CorruptRecordError as exc:
        return bytes(out), exc
    return bytes(out), None


def _fills_as_the_daemon_chains_them(
    log: Log, rendering: Rendering, capacities: random.Random
) -> tuple[bytes, CorruptRecordError | None, int]:
    """Fills of random capacity, segment after segment; where a fill renders nothing
    or raises, the daemon renders the next batch itself (``Log.batches``, which raises
    at damage) and the fills go on after it, as ``ReadPath`` does. The bytes, the
    daemon's error, and how many batches the daemon had to render itself."""
    arena = memoryview(bytearray(1 << 16))
    files = SegmentFiles()
    out = bytearray()
    by_daemon = 0
    next_offset, skip = log.log_start_offset, 0
    try:
        for segment in log.segments.values():
            position = 0
            if next_offset < segment.base_offset:
                next_offset = segment.base_offset  # read_path's _fill_plan: no fill across
            while position < segment.size:
                request = FillRequest(
                    1, str(segment.path), segment.base_offset, position, segment.size,
                    next_offset, skip, 0, capacities.randint(1, 900), rendering.raw,
                    rendering.key_separator, json_of=rendering.json_of,
                )  # fmt: skip
                try:
                    result = fill(files, request, arena)
                except CorruptRecordError:
                    result = None
                if result is not None and result.written:
                    out += arena[: result.written]
                    next_offset, position, skip = result.next_offset, result.position, result.skip
                    continue
                # The daemon's own read of the batch there.
                by_daemon += 1
                try:
                    batch = next(log.batches(next_offset))
                except CorruptRecordError as exc:
                    return bytes(out), exc, by_daemon
                assert batch.position == position
                out += rendering.render(batch).data[skip:]
                next_offset, position, skip = batch.next_offset, batch.position + batch.size, 0
    finally:
        files.close()
    return bytes(out), None, by_daemon


@pytest.mark.parametrize("delta", [0, 2, 3, -2, -3, 1 << 40], ids=lambda d: f"base{d:+d}")
def test_fills_serve_what_the_daemon_serves_past_gaps_and_damaged_base_offsets(
    tmp_path: Path, delta: int
) -> None:
    # Issue 17: a fill checked each batch's CRC and framing, not that its base offset
    # (outside the CRC) follows the offsets before it: a json topic's batch whose base
    # offset was damaged by +2 was served under offsets it never had, where the
    # daemon's own read fails. Downwards (-2, -3), the daemon's own read that went on
    # at that batch (Log.batches from the offset after the batch before) served it
    # under wrong offsets, or skipped it and went on after a "gap". Compaction's gaps
    # are not damage: fills still render past them.
    log_dir = tmp_path / "logs"
    layout = _gapped_log_dir(log_dir)
    segments = sorted({base for base, _p, _o in layout})
    bases = [base_offset for _s, _p, base_offset in layout]
    # Every batch of two sealed segments: the first, after a gap, before one, last.
    targets = [n for n, entry in enumerate(layout) if entry[0] in segments[1:3]]
    detected = 0
    for n in targets if delta else [-1]:
        segment_base, position, base_offset = layout[n]
        state = tmp_path / f"state{n}"
        shutil.copytree(log_dir, state)
        if delta:
            with open(log_file(state / "t-0", segment_base), "r+b") as f:
                f.seek(position)
                f.write(struct.pack(">q", base_offset + delta))
        with LogManager.open(state, read_only=True, extension=position_index_spec) as manager:
            log = manager.log("t", 0)
            rendering = Rendering.of(manager.topic("t"), 0)
            expected, error = _daemon_reads(log, rendering)
            # Between batches it follows and that follow it, damage is certain (the
            # read stops there, or at the batch before when that one came after a gap:
            # either could be the damaged one); next to a gap a base offset moved by
            # less than the gap looks like one.
            contiguous = 0 < n < len(bases) - 1 and bases[n - 1] + 3 == base_offset == (
                bases[n + 1] - 3
            )
            if not delta:
                assert error is None
            elif contiguous or delta == 1 << 40:
                assert error is not None, (n, position)
                assert error.offset <= base_offset
                assert expected.count(b"\n") == error.offset - len(
                    [o for o in range(error.offset) if o not in _offsets(bases)]
                )
            detected += error is not None
            for seed in range(3):
                got, fill_error, by_daemon = _fills_as_the_daemon_chains_them(
                    log, rendering, random.Random(seed)
                )
                assert got == expected, (n, seed)
                assert (fill_error is None) == (error is None), (n, seed, fill_error, error)
                if error is not None and fill_error is not None:
                    assert (fill_error.position, fill_error.offset) == (
                        error.position,
                        error.offset,
                    )
                if not delta:
                    # Past the gaps the fills went on; only a gap before a segment's
                    # last batch (no batch after it to confirm it) is the daemon's.
                    assert by_daemon <= len(segments), by_daemon
    assert detected >= (len(targets) // 2 if delta else 0)


@pytest.mark.parametrize("which", ["last", "second to last"])
def test_a_damaged_batch_the_position_index_never_measured_fails_cat(
    tmp_path: Path, which: str
) -> None:
    # Seed 23 of test_corruption: after a clean shutdown, a batch of the active segment
    # past its last position-index entry whose records do not decode measures nothing
    # when the index is loaded, so the partition file's size ended before it: ``cat``
    # read to that end and exited 0, where the engine's read fails. The end of the file
    # is now checked.
    log_dir = tmp_path / "logs"
    with LogManager.open(log_dir, extension=position_index_spec) as manager:
        manager.create_topic("t", 1)
        log = manager.log("t", 0)
        infos = [log.append([b"%099d" % (i * 5 + k) for k in range(5)]) for i in range(20)]
        assert log.number_of_segments == 1
    bad = infos[-1] if which == "last" else infos[-2]
    flip(log_file(log_dir / "t-0", 0), bad.position + FIRST_RECORD_LENGTH)
    with mounted(tmp_path, log_dir, ["-o", "ro"]) as mountpoint:
        cat = subprocess.run(["cat", str(mountpoint / "t" / "0")], capture_output=True, timeout=60)
        assert_eio(cat, "cat")
        assert cat.stdout == expected(0, bad.first_offset * LINE)

"""The render process: ``fill`` against the daemon's own rendering, the handlers reading
through a real render process, and a real mount streaming a large partition.

What must hold: the bytes a reader gets are the bytes the daemon would render itself,
whatever the cuts between fills, the formats, retention under the reader or the death of
the process; and a sequential reader really streams through the process (fills are
counted and replies are views of the shared arena), or the tests would pass without it.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import random
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pyfuse3
import pytest
import trio

from seglogfs.daemon.lines import append_lines
from seglogfs.daemon.operations import BLOCK_SIZE, Operations
from seglogfs.daemon.render_process import FillRequest, SegmentFiles, fill
from seglogfs.daemon.renderer import SLOT_BYTES, SLOTS, SLOTS_PER_FILE, Renderer
from seglogfs.positions import Rendering, position_index_spec
from storage import CorruptRecordError, Log, LogManager
from tests.conftest import ManualClock
from tests.daemon.conftest import MountDir, needs_fuse, open_manager, run_sync
from tests.daemon.test_kafka_copy import CODECS, legacy_batch, v2_batch
from tests.daemon.test_operations import CTX, inode_of
from tests.storage.record.test_json_format import reference

MIB = 1 << 20


def _lines(count: int, seed: int, keyed: bool) -> bytes:
    rng = random.Random(seed)
    out = []
    for i in range(count):
        value = b"v%06d " % i + b"x" * rng.choice([0, 5, 99, 700, 4000])
        out.append((b"k%d:" % (i % 7) + value) if keyed and i % 3 else value)
    return b"\n".join(out) + b"\n"


def _render_all(log: Log, rendering: Rendering) -> bytes:
    return b"".join(rendering.render(batch).data for batch in log.batches(log.log_start_offset))


def _fill_all(
    log: Log, rendering: Rendering, capacities: random.Random, max_capacity: int = 1 << 20
) -> tuple[bytes, int]:
    # Walk the segments with fills of random capacity, as the daemon chains them.
    arena = mmap.mmap(-1, 1 << 20)
    view = memoryview(arena)
    files = SegmentFiles()
    out = bytearray()
    cut = 0
    try:
        next_offset, skip = log.log_start_offset, 0
        for segment in log.segments.values():
            position = 0
            while True:
                request = FillRequest(
                    1,
                    str(segment.path),
                    segment.base_offset,
                    position,
                    segment.size,
                    next_offset,
                    skip,
                    0,
                    capacities.randint(1, max_capacity),
                    rendering.raw,
                    rendering.key_separator,
                    json_of=rendering.json_of,
                )
                result = fill(files, request, view)
                out += view[: result.written]
                next_offset, position, skip = result.next_offset, result.position, result.skip
                cut += skip > 0
                if result.written == 0 or position >= segment.size:
                    break
    finally:
        files.close()
        view.release()
        arena.close()
    return bytes(out), cut


@pytest.mark.parametrize(
    ("topic_format", "separator", "keyed"),
    [("lines", None, False), ("lines", ":", True), ("raw", None, False), ("lines", None, True)],
)
def test_fills_render_what_the_daemon_renders(
    log_dir: Path, topic_format: str, separator: str | None, keyed: bool
) -> None:
    with LogManager.open(log_dir, extension=position_index_spec) as manager:
        manager.create_topic(
            "t", 1, {"segment.bytes": "200000"}, format=topic_format, key_separator=separator
        )
        log = manager.log("t", 0)
        lines = _lines(3000, 1, keyed).splitlines(keepends=True)
        for start in range(0, len(lines), 40):  # batches of 40 lines
            append_lines(
                log, b"".join(lines[start : start + 40]), None if separator is None else b":"
            )
        assert log.number_of_segments > 3
        rendering = Rendering.of(manager.topic("t"), 0)
        expected = _render_all(log, rendering)
        for seed in range(5):
            got, cuts = _fill_all(log, rendering, random.Random(seed))
            assert got == expected
            assert cuts > 0  # some fills ended inside a batch and the next went on there


def test_fills_of_a_json_topic_render_what_the_daemon_renders(log_dir: Path) -> None:
    # Partition 3 (named in every line), keys, headers, binary values, newlines, nulls:
    # the render process's json lines are the daemon's, cut anywhere between fills.
    with LogManager.open(log_dir, extension=position_index_spec) as manager:
        manager.create_topic("t", 4, {"segment.bytes": "8000"}, format="json")
        log = manager.log("t", 3)
        for i in range(300):
            values = [b"v%d\n%s" % (i, b"x" * (i % 50)), b"\xff%d" % i, None, b"%d%%" % i]
            log.append(
                values,
                keys=[b"k%d" % (i % 7), None, b"k", b"\x00"],
                headers=[[("h", b"%d" % i)], [], [("b", b"\x80")], []],
            )
        assert log.number_of_segments > 3
        rendering = Rendering.of(manager.topic("t"), 3)
        expected = _render_all(log, rendering)
        assert len(expected) == log.extension_end  # the position index counts these bytes
        for seed in range(5):
            got, cuts = _fill_all(log, rendering, random.Random(seed), max_capacity=900)
            assert got == expected
            assert cuts > 0  # some fills ended inside a batch and the next went on there


def test_fills_of_kafka_segments_in_every_format(tmp_path: Path) -> None:
    # Segments written by another implementation (kafka-python): legacy v0/v1 message
    # sets plain and compressed, v2 in every codec, transaction markers; read-only, as
    # a mounted copy of a broker's directory.
    parts: list[bytes] = []
    offset = 0
    for round_ in range(40):
        values = [b"r%d-%d %s" % (round_, i, b"w" * (round_ * 37 % 900)) for i in range(3)]
        for magic, codec in [(0, 0), (0, 1), (1, 0), (1, 2)]:
            parts.append(legacy_batch(magic, codec, offset, list(values)))
            offset += len(values)
        for codec in CODECS.values():
            parts.append(v2_batch(offset, codec, [(b"k", v) for v in values]))
            offset += len(values)
        parts.append(v2_batch(offset, 0, [(b"\x00\x00\x00\x01", b"\x00" * 6)], control=True))
        offset += 1
    log_dir = tmp_path / "kafka-logs"
    (log_dir / "copy-0").mkdir(parents=True)
    (log_dir / "copy-0" / "00000000000000000000.log").write_bytes(b"".join(parts))
    with LogManager.open(log_dir, read_only=True, extension=position_index_spec) as manager:
        log = manager.log("copy", 0)
        rendering = Rendering.of(manager.topic("copy"), 0)
        expected = _render_all(log, rendering)
        assert expected.count(b"\n") == 40 * 3 * 9  # markers render nothing
        for seed in range(3):
            got, cuts = _fill_all(log, rendering, random.Random(seed), max_capacity=20_000)
            assert got == expected
            assert cuts > 0


def _flip_byte(path: Path, position: int) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        byte = f.read(1)[0]
        f.seek(position)
        f.write(bytes([byte ^ 0xFF]))


def _one_segment_log(log_dir: Path) -> tuple[LogManager, Log]:
    manager = LogManager.open(log_dir, extension=position_index_spec)
    manager.create_topic("t", 1)
    log = manager.log("t", 0)
    for i in range(3):
        append_lines(log, b"".join(b"batch %d line %d\n" % (i, j) for j in range(50)), None)
    return manager, log


@pytest.mark.parametrize(
    ("byte", "refusal"),
    [(-3, "CRC"), (9, "runs past the end of the segment")],
    ids=["crc", "length"],
)
def test_fill_stops_before_a_damaged_batch_and_refuses_it(
    log_dir: Path, byte: int, refusal: str
) -> None:
    # A value byte fails the CRC; a batch length byte runs past the end the daemon
    # wrote, which is a batch end: damage, not "no further complete batch" (that left
    # the bytes after it to a read that went on at the next segment, in silence).
    manager, log = _one_segment_log(log_dir)
    with manager:
        segment = log.segments.values()[0]
        rendering = Rendering.of(manager.topic("t"), 0)
        batches = list(log.batches(0))
        good = rendering.render(batches[0]).data
        _flip_byte(segment.path, batches[1].position + byte % batches[1].size)
        arena = memoryview(bytearray(1 << 20))
        files = SegmentFiles()
        try:
            # The good batch before it is served, and the fill ends there.
            request = FillRequest(
                1, str(segment.path), 0, 0, segment.size, 0, 0, 0, 1 << 20, False, None
            )
            result = fill(files, request, arena)
            assert bytes(arena[: result.written]) == good
            assert (result.next_offset, result.position) == (1 * 50, batches[1].position)
            # The next fill begins with the bad batch: refused, nothing served.
            request = request._replace(position=result.position, next_offset=50)
            with pytest.raises(CorruptRecordError, match=refusal):
                fill(files, request, arena)
            if byte == 9:
                # A read-only mount's view of a segment another process appends to may
                # end inside the batch in flight: that fill just stops.
                assert fill(files, request._replace(end_is_final=False), arena).written == 0
        finally:
            files.close()


def test_fill_refuses_a_position_that_does_not_hold_the_offset(log_dir: Path) -> None:
    manager, log = _one_segment_log(log_dir)
    with manager:
        segment = log.segments.values()[0]
        second = list(log.batches(0))[1]
        # The daemon asked for offset 0 but named the second batch's position.
        request = FillRequest(
            1, str(segment.path), 0, second.position, segment.size, 0, 3, 0, 1 << 20, False, None
        )
        files = SegmentFiles()
        try:
            with pytest.raises(CorruptRecordError, match="not 0"):
                fill(files, request, memoryview(bytearray(1 << 20)))
        finally:
            files.close()


# -- the handlers with a real render process -----------------------------------------


@pytest.fixture
def manager(log_dir: Path, clock: ManualClock) -> Iterator[LogManager]:
    with open_manager(log_dir, clock) as manager:
        yield manager


@contextlib.asynccontextmanager
async def _streaming(
    manager: LogManager, lines: int, width: int
) -> AsyncIterator[tuple[Operations, Renderer, bytes]]:
    """Handlers with a running render process over topic ``t``, whose partition 0 holds
    ``lines`` lines of ``width`` bytes in 8 MB segments; the process stops after."""
    async with trio.open_nursery() as nursery:
        ops = Operations(manager, run_sync)
        renderer = Renderer.start()
        nursery.start_soon(renderer.run)
        ops.use_renderer(renderer, nursery)
        await ops.mkdir(pyfuse3.ROOT_INODE, b"t", 0o755, CTX)
        topic = await inode_of(ops, "/t")
        await ops.setxattr(topic, b"user.seglog.segment.bytes", b"8000000", CTX)
        line = b"y" * (width - 1) + b"\n"
        expected = line * lines
        log = manager.log("t", 0)
        step = width * (MIB // width)  # whole lines, at most 1 MiB a batch
        for start in range(0, len(expected), step):
            appended, _infos = append_lines(log, expected[start : start + step], None)
            assert appended == min(step, len(expected) - start)
        try:
            yield ops, renderer, expected
        finally:
            renderer.close()
            nursery.cancel_scope.cancel()


async def _read_sequentially(
    ops: Operations, renderer: Renderer, fh: int, start: int, expected: bytes
) -> tuple[bytes, int]:
    got = bytearray()
    zero_copy = 0
    offset = start
    while True:
        data = await ops.read(fh, offset, BLOCK_SIZE)
        if not data:
            return bytes(got), zero_copy
        zero_copy += renderer.owns(data)
        got += data
        offset += len(data)
        assert got == expected[start : start + len(got)]


@pytest.mark.trio
async def test_sequential_reads_stream_through_the_render_process(
    manager: LogManager,
) -> None:
    async with _streaming(manager, 12_000, 4096) as (ops, renderer, expected):
        assert manager.log("t", 0).number_of_segments > 3  # fills cross segment ends
        fh = (await ops.open(await inode_of(ops, "/t/0"), os.O_RDONLY, CTX)).fh
        got, zero_copy = await _read_sequentially(ops, renderer, fh, 0, expected)
        assert got == expected
        reads = len(expected) // BLOCK_SIZE
        assert renderer.fills >= len(expected) // SLOT_BYTES - 2
        assert renderer.filled_bytes > len(expected) // 2
        # Fills end on 1 MiB kernel offsets: nearly every read is a view of the arena.
        assert zero_copy >= reads * 3 // 4
        await ops.release(fh)


@pytest.mark.trio
async def test_a_json_partition_streams_through_the_render_process(manager: LogManager) -> None:
    # The daemon hands the process a json topic's topic and partition (json_of): the
    # lines it streams are the documented ones (json.dumps of each record).
    async with trio.open_nursery() as nursery:
        ops = Operations(manager, run_sync)
        renderer = Renderer.start()
        nursery.start_soon(renderer.run)
        ops.use_renderer(renderer, nursery)
        try:
            manager.create_topic("j", 2, {"segment.bytes": "8000000"}, format="json")
            log = manager.log("j", 1)
            for i in range(60):
                log.append(
                    [b"value %d-%d %s" % (i, j, b"z" * 300) for j in range(999)] + [b"\xff"],
                    keys=[b"k%d" % j if j % 3 else None for j in range(1000)],
                    headers=[[("h", b"%d" % j)] for j in range(1000)],
                )
            records = list(log.records(0))
            expected = b"".join(reference(r, "j", 1) for r in records)
            assert len(expected) > 3 * SLOT_BYTES
            fh = (await ops.open(await inode_of(ops, "/j/1"), os.O_RDONLY, CTX)).fh
            got, zero_copy = await _read_sequentially(ops, renderer, fh, 0, expected)
            assert got == expected
            assert renderer.fills >= len(expected) // SLOT_BYTES - 2
            assert zero_copy > 0
            await ops.release(fh)
        finally:
            renderer.close()
            nursery.cancel_scope.cancel()


@pytest.mark.trio
async def test_a_view_and_a_reader_starting_midway_stream_correctly(manager: LogManager) -> None:
    async with _streaming(manager, 10_000, 3000) as (ops, renderer, expected):
        # A read at an odd offset, then sequential reads from there: the fills are cut
        # at kernel offsets `start + k MiB`, which are not multiples of 1 MiB.
        fh = (await ops.open(await inode_of(ops, "/t/0"), os.O_RDONLY, CTX)).fh
        start = 5 * MIB + 12345
        got = bytes(await ops.read(fh, start, 777))
        rest, _zero_copy = await _read_sequentially(ops, renderer, fh, start + 777, expected)
        assert got + rest == expected[start:]
        await ops.release(fh)
        # A view from the middle: kernel offset 0 is the 3000th record.
        view = await inode_of(ops, "/t/0@3000")
        fh = (await ops.open(view, os.O_RDONLY, CTX)).fh
        tail, _zero_copy = await _read_sequentially(ops, renderer, fh, 0, expected[3000 * 3000 :])
        assert tail == expected[3000 * 3000 :]
        assert renderer.fills > 3
        await ops.release(fh)


@pytest.mark.trio
async def test_more_readers_than_slots_each_read_their_own_bytes(manager: LogManager) -> None:
    # Five readers in turn: four stream through the process (SLOTS is four files'
    # worth), the fifth renders in the daemon; no reader ever sees another's slot.
    async with _streaming(manager, 9000, 4096) as (ops, renderer, expected):
        inode = await inode_of(ops, "/t/0")
        files = [
            (await ops.open(inode, os.O_RDONLY, CTX)).fh for _ in range(SLOTS // SLOTS_PER_FILE + 1)
        ]
        got = {fh: bytearray() for fh in files}
        served = {fh: 0 for fh in files}
        while any(len(got[fh]) < len(expected) for fh in files):
            for i, fh in enumerate(files):
                # Unequal steps: the readers drift apart, slots are in use at once.
                for _ in range(1 + i % 3):
                    data = await ops.read(fh, len(got[fh]), BLOCK_SIZE)
                    served[fh] += renderer.owns(data)
                    got[fh] += data
        assert all(bytes(got[fh]) == expected for fh in files)
        assert sum(1 for fh in files if served[fh] > 0) == SLOTS // SLOTS_PER_FILE
        for fh in files:
            await ops.release(fh)


@pytest.mark.trio
async def test_retention_under_a_streaming_reader(manager: LogManager) -> None:
    async with _streaming(manager, 12_000, 4096) as (ops, renderer, expected):
        log = manager.log("t", 0)
        fh = (await ops.open(await inode_of(ops, "/t/0"), os.O_RDONLY, CTX)).fh
        got = bytearray()
        while len(got) < 10 * MIB:
            got += await ops.read(fh, len(got), BLOCK_SIZE)
        fills = renderer.fills
        assert fills > 0
        # Retention deletes what the reader has read and what lies just ahead of it.
        log.advance_log_start_offset(4000)
        assert log.delete_old_segments() >= 1
        assert log.log_start_offset * 4096 > len(got)
        offset = len(got)
        rest = bytearray()
        while data := await ops.read(fh, offset, BLOCK_SIZE):
            rest += data
            offset += len(data)
        # The reader goes on at the oldest retained record, nothing twice or lost.
        assert bytes(got) == expected[: len(got)]
        assert bytes(rest) == expected[log.log_start_offset * 4096 :]
        assert renderer.fills > fills  # and streams again after the jump
        await ops.release(fh)


@pytest.mark.trio
async def test_a_corrupt_batch_mid_stream_is_eio_and_no_fill_loop(manager: LogManager) -> None:
    async with _streaming(manager, 12_000, 4096) as (ops, renderer, expected):
        log = manager.log("t", 0)
        corrupt = next(b for b in log.batches(0) if b.base_offset >= 3000)  # at ~12 MiB
        segment = log.segments.floor_segment(corrupt.last_offset)
        assert segment is not None
        _flip_byte(segment.path, corrupt.position + corrupt.size - 100)  # a bad CRC
        fh = (await ops.open(await inode_of(ops, "/t/0"), os.O_RDONLY, CTX)).fh
        got = bytearray()
        for _ in range(2):
            got += await ops.read(fh, len(got), BLOCK_SIZE)
        # A slow reader (less, a full pipe): the fills run ahead on their own and one
        # meets the corrupt batch while no read is in progress. It must not be asked
        # for again and again.
        await trio.sleep(0.3)
        requests = renderer.requests
        assert renderer.fills >= 1
        await trio.sleep(0.3)
        assert renderer.requests == requests
        code = 0
        while code == 0:
            try:
                data = await ops.read(fh, len(got), BLOCK_SIZE)
            except pyfuse3.FUSEError as error:
                code = error.errno
            else:
                assert data, "read to the end past a corrupt batch"
                got += data
        assert code == errno.EIO
        assert bytes(got) == expected[: corrupt.base_offset * 4096]  # all before it
        after = renderer.requests
        assert after <= requests + 2  # not one failing fill per read before the batch
        await trio.sleep(0.2)
        assert renderer.requests == after
        await ops.release(fh)


@pytest.mark.trio
async def test_a_damaged_length_in_a_sealed_segment_is_eio_after_the_bytes_before_it(
    manager: LogManager, caplog: pytest.LogCaptureFixture
) -> None:
    # Issue 17 through the render process: the fills and the daemon's own reads took
    # the length running past the sealed segment's end for a tail and went on at the
    # next segment, in silence.
    async with _streaming(manager, 12_000, 4096) as (ops, renderer, expected):
        log = manager.log("t", 0)
        damaged = next(b for b in log.batches(0) if b.base_offset >= 3000)  # at ~12 MiB
        segment = log.segments.floor_segment(damaged.last_offset)
        assert segment is not None
        assert log.segments.higher_segment(segment.base_offset) is not None  # sealed
        _flip_byte(segment.path, damaged.position + 9)
        fh = (await ops.open(await inode_of(ops, "/t/0"), os.O_RDONLY, CTX)).fh
        got = bytearray()
        codes = []
        for _ in range(3):  # the read that reaches it, and each read after
            while True:
                try:
                    data = await ops.read(fh, len(got), BLOCK_SIZE)
                except pyfuse3.FUSEError as error:
                    codes.append(error.errno)
                    break
                assert data, "read to the end past a damaged batch"
                got += data
        assert codes == [errno.EIO] * 3
        assert bytes(got) == expected[: damaged.base_offset * 4096]
        assert renderer.fills >= 1
        warnings = [r for r in caplog.records if r.levelname == "WARNING"]
        assert len(warnings) == 1, warnings
        assert f"offset {damaged.base_offset}" in warnings[0].getMessage()
        await ops.release(fh)


@pytest.mark.trio
async def test_reads_go_on_when_the_render_process_dies(
    manager: LogManager, caplog: pytest.LogCaptureFixture
) -> None:
    async with _streaming(manager, 8000, 4096) as (ops, renderer, expected):
        fh = (await ops.open(await inode_of(ops, "/t/0"), os.O_RDONLY, CTX)).fh
        got = bytearray()
        while len(got) < 12 * MIB:
            got += await ops.read(fh, len(got), BLOCK_SIZE)
        assert renderer.fills > 0
        renderer._process.kill()  # as the OOM killer would
        while data := await ops.read(fh, len(got), BLOCK_SIZE):
            got += data
        assert bytes(got) == expected
        assert not renderer.alive
        assert "render process ended" in caplog.text
        await ops.release(fh)


# -- a real mount --------------------------------------------------------------------


@needs_fuse
def test_cat_dd_and_tail_of_a_large_partition_through_the_render_process(
    tmp_path: Path, mount_dir: MountDir
) -> None:
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    mount = mount_dir(log_dir)
    assert mount.proc is not None
    children = subprocess.run(
        ["pgrep", "-P", str(mount.proc.pid), "-f", "seglogfs.daemon.render_process"],
        capture_output=True,
        check=False,
    )
    assert children.stdout.strip(), "the daemon runs no render process"
    source = tmp_path / "lines.txt"
    line = b"z" * 4095 + b"\n"
    source.write_bytes(line * 10_000)  # 41 MB: several fills
    partition = mount.mountpoint / "t" / "0"
    os.mkdir(mount.mountpoint / "t")
    subprocess.run(f"cat {source} >> {partition}", shell=True, check=True)
    expected = source.read_bytes()
    cat = subprocess.run(["cat", str(partition)], capture_output=True, check=True)
    assert cat.stdout == expected
    dd = subprocess.run(
        ["dd", f"if={partition}", "bs=1M", "skip=7", "status=none"],
        capture_output=True,
        check=True,
    )
    assert dd.stdout == expected[7 * MIB :]
    tail = subprocess.run(
        ["tail", "-c", f"+{3 * MIB + 5}", str(partition)], capture_output=True, check=True
    )
    assert tail.stdout == expected[3 * MIB + 4 :]
    assert mount.stop() == 0
    assert "render process ended" not in mount.log()  # a clean unmount is not a failure


@needs_fuse
def test_without_the_render_process_reads_are_the_same(tmp_path: Path, mount_dir: MountDir) -> None:
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    mount = mount_dir(log_dir, env={"SEGLOG_RENDER_PROCESS": "0"})
    assert mount.proc is not None
    children = subprocess.run(
        ["pgrep", "-P", str(mount.proc.pid)], capture_output=True, check=False
    )
    assert not children.stdout.strip()
    os.mkdir(mount.mountpoint / "t")
    data = b"".join(b"line %d %s\n" % (i, b"q" * (i % 5000)) for i in range(8000))
    with (mount.mountpoint / "t" / "0").open("ab") as f:
        f.write(data)
    assert (mount.mountpoint / "t" / "0").read_bytes() == data

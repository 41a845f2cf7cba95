"""The ``Operations`` handlers driven directly, without a kernel (pytest-trio).

Each test runs a real ``LogManager`` on a temporary log directory; handlers run their
engine calls in worker threads exactly as under a mount.
"""

from __future__ import annotations

import errno
import logging
import os
import random
from pathlib import Path

import pyfuse3
import pytest

from seglogfs.daemon.operations import Kind, Operations
from storage import Log, LogConfig, LogManager, partition_for_key
from tests.conftest import ManualClock

from .conftest import open_manager, run_sync

CTX = pyfuse3.RequestContext()
APPEND = os.O_WRONLY | os.O_APPEND


class Caller(pyfuse3.RequestContext):
    """A request from thread ``pid`` (pyfuse3's own context cannot be made with one;
    ``CTX`` names no thread: a caller that holds no file)."""

    def __init__(self, pid: int) -> None:
        self._pid = pid

    @property
    def pid(self) -> int:
        return self._pid


HOLDER = Caller(os.getpid())
"""A request from this process: it sees the sizes of the files it holds open."""


async def inode_of(ops: Operations, path: str) -> int:
    inode = pyfuse3.ROOT_INODE
    for part in filter(None, path.split("/")):
        inode = (await ops.lookup(inode, part.encode(), CTX)).st_ino
    return inode


async def fuse_errno(awaitable: object) -> int:
    with pytest.raises(pyfuse3.FUSEError) as info:
        await awaitable  # type: ignore[misc]
    return info.value.errno


async def write(ops: Operations, path: str, *chunks: bytes, flags: int = APPEND) -> None:
    fh = (await ops.open(await inode_of(ops, path), flags, CTX)).fh
    try:
        for chunk in chunks:
            assert await ops.write(fh, 0, chunk) == len(chunk)
        await ops.flush(fh)
    finally:
        await ops.release(fh)


async def read_all(ops: Operations, path: str, size: int = 1 << 20) -> bytes:
    fh = (await ops.open(await inode_of(ops, path), os.O_RDONLY, CTX)).fh
    out = b""
    try:
        while chunk := bytes(await ops.read(fh, len(out), size)):
            out += chunk
    finally:
        await ops.release(fh)
    return out


async def size_of(ops: Operations, path: str) -> int:
    return (await ops.getattr(await inode_of(ops, path), CTX)).st_size


async def listing(ops: Operations, path: str) -> list[str]:
    """The names readdir gives, two per call as if the kernel's buffer were small."""
    inode = await inode_of(ops, path)
    fh = await ops.opendir(inode, CTX)
    names: list[str] = []
    page: list[tuple[str, int]] = []
    real_reply = pyfuse3.readdir_reply

    # readdir_reply fills the kernel's buffer; without a kernel, collect the entries.
    def reply(token: object, name: bytes, attr: pyfuse3.EntryAttributes, next_id: int) -> bool:
        assert attr.st_ino > 0
        if len(page) == 2:
            return False  # the buffer is full: the kernel asks again from next_id
        page.append((name.decode(), next_id))
        return True

    pyfuse3.readdir_reply = reply
    try:
        start = 0
        while True:
            page.clear()
            await ops.readdir(fh, start, None)  # type: ignore[arg-type]
            if not page:
                break
            names += [name for name, _next in page]
            start = page[-1][1]
    finally:
        pyfuse3.readdir_reply = real_reply
    await ops.releasedir(fh)
    return names


@pytest.mark.trio
async def test_mkdir_creates_a_topic_listed_with_its_partitions(log_dir: Path) -> None:
    with open_manager(log_dir, partitions=3) as manager:
        ops = Operations(manager, run_sync)
        attr = await ops.mkdir(pyfuse3.ROOT_INODE, b"orders", 0o755, CTX)
        assert attr.st_mode & 0o170000 == 0o040000
        assert manager.topic("orders").partitions == 3
        assert await listing(ops, "/") == ["orders"]
        assert await listing(ops, "/orders") == ["0", "1", "2", "produce"]
        assert await inode_of(ops, "/orders") == attr.st_ino  # stable inode


@pytest.mark.trio
async def test_mkdir_refusals(ops: Operations, manager: LogManager) -> None:
    assert await fuse_errno(ops.mkdir(pyfuse3.ROOT_INODE, b"bad name", 0o755, CTX)) == errno.EINVAL
    assert await fuse_errno(ops.mkdir(pyfuse3.ROOT_INODE, b"x" * 250, 0o755, CTX)) == errno.EINVAL
    await ops.mkdir(pyfuse3.ROOT_INODE, b"t", 0o755, CTX)
    assert await fuse_errno(ops.mkdir(pyfuse3.ROOT_INODE, b"t", 0o755, CTX)) == errno.EEXIST
    topic = await inode_of(ops, "/t")
    assert await fuse_errno(ops.mkdir(topic, b"sub", 0o755, CTX)) == errno.EPERM
    assert manager.topics() == ["t"]


@pytest.mark.trio
async def test_lines_read_back_as_written(ops: Operations, manager: LogManager) -> None:
    await ops.mkdir(pyfuse3.ROOT_INODE, b"t", 0o755, CTX)
    await write(ops, "/t/0", b"first\nsecond\n", b"\n", b"third\n")
    assert [r.value for r in manager.log("t", 0).records(0)] == [
        b"first",
        b"second",
        b"",
        b"third",
    ]
    assert await read_all(ops, "/t/0") == b"first\nsecond\n\nthird\n"
    assert await size_of(ops, "/t/0") == len(b"first\nsecond\n\nthird\n")


@pytest.mark.trio
async def test_partial_line_waits_for_newline_or_close(
    ops: Operations, manager: LogManager
) -> None:
    await ops.mkdir(pyfuse3.ROOT_INODE, b"t", 0o755, CTX)
    log = manager.log("t", 0)
    fh = (await ops.open(await inode_of(ops, "/t/0"), APPEND, CTX)).fh
    await ops.write(fh, 0, b"abc")
    assert log.log_end_offset == 0  # nothing appended yet
    await ops.write(fh, 0, b"def\ngh")
    assert [r.value for r in log.records(0)] == [b"abcdef"]
    await ops.flush(fh)  # close(): flush, then (the last close) release appends it
    await ops.release(fh)
    assert [r.value for r in log.records(0)] == [b"abcdef", b"gh"]
    assert await read_all(ops, "/t/0") == b"abcdef\ngh\n"
    assert await size_of(ops, "/t/0") == 10


@pytest.mark.trio
async def test_one_write_of_many_lines_is_one_batch(ops: Operations, manager: LogManager) -> None:
    await ops.mkdir(pyfuse3.ROOT_INODE, b"t", 0o755, CTX)
    await write(ops, "/t/0", b"".join(b"line %d\n" % i for i in range(500)))
    batches = list(manager.log("t", 0).batches(0))
    assert len(batches) == 1
    assert batches[0].last_offset == 499


@pytest.mark.trio
async def test_key_separator_set_on_a_fresh_topic(log_dir: Path) -> None:
    with open_manager(log_dir, partitions=3) as manager:
        ops = Operations(manager, run_sync)
        topic = (await ops.mkdir(pyfuse3.ROOT_INODE, b"keyed", 0o755, CTX)).st_ino
        await ops.setxattr(topic, b"user.seglog.key.separator", b":", CTX)
        assert manager.topic("keyed").key_separator == ":"
        assert manager.topic("keyed").partitions == 3
        lines = [b"k%d:value %d" % (i % 5, i) for i in range(40)]
        await write(ops, "/keyed/produce", b"".join(line + b"\n" for line in lines))
        for partition in range(3):
            records = list(manager.log("keyed", partition).records(0))
            for record in records:
                assert record.key is not None
                assert partition_for_key(record.key, 3) == partition
            expected = [
                line for line in lines if partition_for_key(line.split(b":")[0], 3) == partition
            ]
            shown = await read_all(ops, f"/keyed/{partition}")
            assert shown == b"".join(line + b"\n" for line in expected)
        # Records exist now: the rendering is fixed.
        assert (
            await fuse_errno(ops.setxattr(topic, b"user.seglog.format", b"raw", CTX)) == errno.EPERM
        )
        assert (
            await fuse_errno(ops.setxattr(topic, b"user.seglog.key.separator", b"=", CTX))
            == errno.EPERM
        )
        assert manager.topic("keyed").key_separator == ":"


@pytest.mark.trio
async def test_raw_topic_reads_back_the_bytes_written(ops: Operations, manager: LogManager) -> None:
    topic = (await ops.mkdir(pyfuse3.ROOT_INODE, b"blobs", 0o755, CTX)).st_ino
    await ops.setxattr(topic, b"user.seglog.format", b"raw", CTX)
    # A separator is only for lines: refused as invalid, nothing changed.
    assert (
        await fuse_errno(ops.setxattr(topic, b"user.seglog.key.separator", b":", CTX))
        == errno.EINVAL
    )
    assert manager.topic("blobs").key_separator is None
    chunks = [b"\x00\x01binary", b"no newline", b"\n\n"]
    await write(ops, "/blobs/0", *chunks)
    assert [r.value for r in manager.log("blobs", 0).records(0)] == chunks
    assert await read_all(ops, "/blobs/0") == b"".join(chunks)
    assert (
        await fuse_errno(ops.setxattr(topic, b"user.seglog.format", b"lines", CTX)) == errno.EPERM
    )


@pytest.mark.trio
async def test_keyless_produce_lines_spread_one_write_per_partition(log_dir: Path) -> None:
    with open_manager(log_dir, partitions=4) as manager:
        ops = Operations(manager, run_sync)
        await ops.mkdir(pyfuse3.ROOT_INODE, b"t", 0o755, CTX)
        fh = (await ops.open(await inode_of(ops, "/t/produce"), os.O_WRONLY, CTX)).fh
        for i in range(12):
            await ops.write(fh, 0, b"a%d\nb%d\n" % (i, i))
        await ops.release(fh)
        used = []
        for partition in range(4):
            batches = list(manager.log("t", partition).batches(0))
            # Sticky per write: both lines of a write are one batch in one partition.
            assert all(b.last_offset - b.base_offset == 1 for b in batches)
            used.append(len(batches))
        assert sum(used) == 12
        assert sum(1 for n in used if n) >= 2


@pytest.mark.trio
async def test_record_too_large_is_efbig_and_appends_nothing(
    ops: Operations, manager: LogManager
) -> None:
    topic = (await ops.mkdir(pyfuse3.ROOT_INODE, b"t", 0o755, CTX)).st_ino
    await ops.setxattr(topic, b"user.seglog.max.message.bytes", b"200", CTX)
    log = manager.log("t", 0)
    fh = (await ops.open(await inode_of(ops, "/t/0"), APPEND, CTX)).fh
    await ops.write(fh, 0, b"small\n")
    assert await fuse_errno(ops.write(fh, 0, b"ok\n" + b"x" * 500 + b"\n")) == errno.EFBIG
    assert await fuse_errno(ops.write(fh, 0, b"y" * 500)) == errno.EFBIG  # a partial line too
    await ops.write(fh, 0, b"after\n")
    await ops.release(fh)
    assert [r.value for r in log.records(0)] == [b"small", b"after"]
    assert await read_all(ops, "/t/0") == b"small\nafter\n"


@pytest.mark.trio
async def test_refused_operations_change_nothing(ops: Operations, manager: LogManager) -> None:
    await ops.mkdir(pyfuse3.ROOT_INODE, b"t", 0o755, CTX)
    await write(ops, "/t/0", b"keep\n")
    root = pyfuse3.ROOT_INODE
    topic = await inode_of(ops, "/t")
    partition = await inode_of(ops, "/t/0")
    produce = await inode_of(ops, "/t/produce")
    assert await fuse_errno(ops.open(partition, os.O_WRONLY | os.O_TRUNC, CTX)) == errno.EPERM
    fh = (await ops.open(partition, os.O_WRONLY, CTX)).fh  # no O_APPEND
    assert await fuse_errno(ops.write(fh, 0, b"middle\n")) == errno.EPERM
    await ops.release(fh)
    assert await fuse_errno(ops.unlink(topic, b"0", CTX)) == errno.EPERM
    assert await fuse_errno(ops.unlink(topic, b"9", CTX)) == errno.ENOENT
    assert await fuse_errno(ops.rmdir(root, b"t", CTX)) == errno.EPERM
    assert await fuse_errno(ops.rmdir(root, b"nope", CTX)) == errno.ENOENT
    assert await fuse_errno(ops.rename(topic, b"0", topic, b"1", 0, CTX)) == errno.EPERM
    assert await fuse_errno(ops.create(topic, b"foo", 0o644, APPEND, CTX)) == errno.EINVAL
    assert await fuse_errno(ops.create(topic, b"7", 0o644, APPEND, CTX)) == errno.ENOENT
    assert await fuse_errno(ops.create(root, b"file", 0o644, APPEND, CTX)) == errno.EPERM
    fh = (await ops.open(produce, os.O_RDONLY, CTX)).fh  # reads as an empty file
    assert await ops.read(fh, 0, 4096) == b""
    await ops.release(fh)
    assert await fuse_errno(ops.lookup(topic, b"1", CTX)) == errno.ENOENT
    assert await fuse_errno(ops.lookup(root, b"nope", CTX)) == errno.ENOENT
    view = await inode_of(ops, "/t/0@earliest")
    assert await fuse_errno(ops.open(view, APPEND, CTX)) == errno.EPERM
    assert manager.topics() == ["t"]
    assert [r.value for r in manager.log("t", 0).records(0)] == [b"keep"]
    assert await read_all(ops, "/t/0") == b"keep\n"


@pytest.mark.trio
async def test_write_at_the_end_without_o_append_appends(
    ops: Operations, manager: LogManager
) -> None:
    await ops.mkdir(pyfuse3.ROOT_INODE, b"t", 0o755, CTX)
    await write(ops, "/t/0", b"one\n")
    fh = (await ops.open(await inode_of(ops, "/t/0"), os.O_WRONLY, CTX)).fh
    await ops.write(fh, 4, b"two\n")
    await ops.release(fh)
    assert await read_all(ops, "/t/0") == b"one\ntwo\n"


@pytest.mark.trio
async def test_views_start_where_their_name_says(
    ops: Operations, manager: LogManager, clock: ManualClock
) -> None:
    await ops.mkdir(pyfuse3.ROOT_INODE, b"t", 0o755, CTX)
    for i in range(10):
        await write(ops, "/t/0", b"r%d\n" % i)
        clock.advance(1000)
    all_lines = [b"r%d\n" % i for i in range(10)]
    assert await read_all(ops, "/t/0@earliest") == b"".join(all_lines)
    assert await read_all(ops, "/t/0@latest") == b""
    assert await read_all(ops, "/t/0@-3") == b"".join(all_lines[7:])
    assert await read_all(ops, "/t/0@4") == b"".join(all_lines[4:])
    assert await read_all(ops, "/t/0@10") == b""
    assert await fuse_errno(ops.lookup(await inode_of(ops, "/t"), b"0@11", CTX)) == errno.ENOENT
    ts = manager.log("t", 0).read(6, 1)[0].timestamp
    assert await read_all(ops, f"/t/0@{ts}") == b"".join(all_lines[6:])
    assert await size_of(ops, "/t/0@-3") == 9
    # latest: resolved at lookup, then follows the appends.
    latest = await inode_of(ops, "/t/0@latest")
    fh = (await ops.open(latest, os.O_RDONLY, CTX)).fh
    await write(ops, "/t/0", b"new\n")
    assert bytes(await ops.read(fh, 0, 100)) == b"new\n"
    await ops.release(fh)


@pytest.mark.trio
async def test_a_view_number_past_a_long_names_nothing(ops: Operations) -> None:
    # Python's int() refuses over 4,300 digits (a ValueError: EIO and a traceback);
    # one past Long.MAX_VALUE is no offset, count or time of any log: ENOENT.
    await ops.mkdir(pyfuse3.ROOT_INODE, b"t", 0o755, CTX)
    await write(ops, "/t/0", b"a\nb\n")
    topic = await inode_of(ops, "/t")
    huge = "9" * 5000
    for name in (f"0@{huge}", f"0@-{huge}", f"0@{2**63}", f"0@-{2**63}", f"0@{huge}x"):
        assert await fuse_errno(ops.lookup(topic, name.encode(), CTX)) == errno.ENOENT, name[:30]
    # Leading zeros are Java's parseLong's, however many (13 or more digits: a time).
    assert await read_all(ops, f"/t/0@{'0' * 5000}1") == b"a\nb\n"
    assert await read_all(ops, f"/t/0@-{'0' * 5000}1") == b"b\n"
    assert await read_all(ops, f"/t/0@{2**63 - 1}") == b""  # a time after every record


def _expected_bytes(lines: list[bytes]) -> bytes:
    return b"".join(line + b"\n" for line in lines)


@pytest.mark.trio
async def test_read_at_any_position(ops: Operations, manager: LogManager) -> None:
    topic = (await ops.mkdir(pyfuse3.ROOT_INODE, b"t", 0o755, CTX)).st_ino
    await ops.setxattr(topic, b"user.seglog.segment.bytes", b"20000", CTX)
    rng = random.Random(7)
    lines = [b"%d:" % i + b"x" * rng.randrange(0, 300) for i in range(2000)]
    for start in range(0, len(lines), 37):
        await write(ops, "/t/0", _expected_bytes(lines[start : start + 37]))
    expected = _expected_bytes(lines)
    assert manager.log("t", 0).number_of_segments > 5
    assert await size_of(ops, "/t/0") == len(expected)
    inode = await inode_of(ops, "/t/0")
    for _ in range(200):
        fh = (await ops.open(inode, os.O_RDONLY, CTX)).fh  # a fresh reader: no cached batch
        position = rng.randrange(len(expected) + 10)
        size = rng.randrange(1, 5000)
        assert bytes(await ops.read(fh, position, size)) == expected[position : position + size]
        await ops.release(fh)


async def segmented_lines(ops: Operations, manager: LogManager) -> tuple[Log, list[bytes]]:
    """Topic t's partition 0 holding 200 lines of 50 bytes, a batch each, in segments
    of 1000 bytes; its log and the lines."""
    topic = (await ops.mkdir(pyfuse3.ROOT_INODE, b"t", 0o755, CTX)).st_ino
    await ops.setxattr(topic, b"user.seglog.segment.bytes", b"1000", CTX)
    lines = [b"line %04d" % i + b"." * 40 for i in range(200)]
    for line in lines:
        await write(ops, "/t/0", line + b"\n")
    return manager.log("t", 0), lines


@pytest.mark.trio
async def test_read_after_retention_continues_at_oldest_record(
    ops: Operations, manager: LogManager
) -> None:
    log, lines = await segmented_lines(ops, manager)
    expected = _expected_bytes(lines)
    inode = await inode_of(ops, "/t/0")
    reader = (await ops.open(inode, os.O_RDONLY, HOLDER)).fh
    head = bytes(await ops.read(reader, 0, 100))
    assert head == expected[:100]
    size_before = (await ops.getattr(inode, HOLDER)).st_size
    assert size_before == len(expected)
    # Retention removes the oldest segments under the open reader.
    log.advance_log_start_offset(120)
    deleted = log.delete_old_segments()
    assert deleted >= 2
    assert log.extension_start > 100
    # The holder's size never shrinks; anyone else's is what a fresh open reads.
    assert (await ops.getattr(inode, HOLDER)).st_size == size_before
    first_kept = log.log_start_offset
    retained = _expected_bytes(lines[first_kept:])
    assert await size_of(ops, "/t/0") == len(retained)
    rest = bytes(await ops.read(reader, 100, 1 << 20))
    assert rest == retained
    # Kernel offset 100 + len(rest) is the end for this reader (its shift absorbed the
    # gap): nothing more, nothing twice.
    assert bytes(await ops.read(reader, 100 + len(rest), 100)) == b""
    assert (await ops.getattr(inode, HOLDER)).st_size == size_before
    await ops.release(reader)
    assert (await ops.getattr(inode, HOLDER)).st_size == len(retained)
    # A file opened now starts at the oldest retained record: its byte 0.
    assert await read_all(ops, "/t/0") == retained
    fh = (await ops.open(inode, os.O_RDONLY, HOLDER)).fh
    assert (await ops.getattr(inode, HOLDER)).st_size == len(retained)
    assert bytes(await ops.read(fh, len(retained) - 25, 25)) == expected[-25:]
    await ops.release(fh)


@pytest.mark.trio
async def test_after_retention_readers_start_at_the_log_start_and_writers_stay_global(
    ops: Operations, manager: LogManager
) -> None:
    log, lines = await segmented_lines(ops, manager)
    inode = await inode_of(ops, "/t/0")
    view = await inode_of(ops, "/t/0@5")  # resolved before retention
    log.advance_log_start_offset(123)
    assert log.delete_old_segments() >= 2
    retained = _expected_bytes(lines[123:])
    assert log.extension_start < log.extension_end - len(retained)  # 123: inside a segment
    start = await ops.getxattr(inode, b"user.seglog.start_position", CTX)
    assert int(start) == log.extension_end - len(retained)
    # A view whose start retention removed begins at the log start too.
    assert (await ops.getattr(view, CTX)).st_size == len(retained)
    fh = (await ops.open(view, os.O_RDONLY, CTX)).fh
    assert bytes(await ops.read(fh, 0, 1 << 20)) == retained
    await ops.release(fh)
    # A writer's positions stay global: its process sees the end it appends at (what
    # lseek(SEEK_END) asks), and a write there without O_APPEND appends.
    fh = (await ops.open(inode, os.O_WRONLY, HOLDER)).fh
    end = (await ops.getattr(inode, HOLDER)).st_size
    assert end == log.extension_end > len(retained)
    assert await ops.write(fh, end, b"more\n") == 5
    await ops.release(fh)
    assert await read_all(ops, "/t/0") == retained + b"more\n"
    assert await size_of(ops, "/t/0") == len(retained) + 5


@pytest.mark.trio
async def test_sequential_reads_are_answered_from_bytes_rendered_ahead(
    manager: LogManager,
) -> None:
    # A sequential reader's worker-thread read renders READ_AHEAD bytes past its end;
    # the reads that follow are answered from them on the event loop (no thread hop),
    # byte for byte what a fresh reader gets, also across retention under the reader.
    hops = 0

    async def counting_run_sync(fn: object, *args: object) -> object:
        nonlocal hops
        hops += 1
        return await run_sync(fn, *args)

    ops = Operations(manager, counting_run_sync)
    topic = (await ops.mkdir(pyfuse3.ROOT_INODE, b"t", 0o755, CTX)).st_ino
    await ops.setxattr(topic, b"user.seglog.segment.bytes", b"20000", CTX)
    lines = [b"line %05d " % i + b"x" * (i % 300) for i in range(3000)]
    for start in range(0, len(lines), 50):
        await write(ops, "/t/0", _expected_bytes(lines[start : start + 50]))
    expected = _expected_bytes(lines)
    fh = (await ops.open(await inode_of(ops, "/t/0"), os.O_RDONLY, CTX)).fh
    hops = 0
    got = b""
    while chunk := bytes(await ops.read(fh, len(got), 4096)):
        got += chunk
    assert got == expected
    reads = -(-len(expected) // 4096) + 1
    assert hops < reads // 10  # READ_AHEAD is 4 MiB: a handful of hops
    await ops.release(fh)

    log = manager.log("t", 0)
    fh = (await ops.open(await inode_of(ops, "/t/0"), os.O_RDONLY, CTX)).fh
    head = bytes(await ops.read(fh, 0, 100)) + bytes(await ops.read(fh, 100, 100))
    assert head == expected[:200]  # the second read rendered ahead
    log.advance_log_start_offset(1500)
    assert log.delete_old_segments() >= 2
    rest = bytes(await ops.read(fh, 200, 1 << 30))
    assert rest == _expected_bytes(lines[log.log_start_offset :])
    await ops.release(fh)


@pytest.mark.trio
async def test_xattrs_of_partitions_and_topics(
    ops: Operations, manager: LogManager, caplog: pytest.LogCaptureFixture
) -> None:
    topic = (await ops.mkdir(pyfuse3.ROOT_INODE, b"t", 0o755, CTX)).st_ino
    await write(ops, "/t/0", b"a\nb\n")
    partition = await inode_of(ops, "/t/0")
    names = set(await ops.listxattr(partition, CTX))
    for key in [
        "log_start_offset",
        "log_end_offset",
        "segments",
        "size",
        "first_timestamp",
        "last_timestamp",
    ]:
        assert b"user.seglog." + key.encode() in names
    assert await ops.getxattr(partition, b"user.seglog.log_end_offset", CTX) == b"2"
    assert await ops.getxattr(partition, b"user.seglog.segments", CTX) == b"1"
    topic_names = set(await ops.listxattr(topic, CTX))
    assert {
        b"user.seglog.partitions",
        b"user.seglog.format",
        b"user.seglog.retention.ms",
    } <= topic_names
    assert len(topic_names) >= len(LogConfig().to_properties()) + 2
    assert await ops.getxattr(topic, b"user.seglog.format", CTX) == b"lines"
    await ops.setxattr(topic, b"user.seglog.retention.ms", b"3600000", CTX)
    assert manager.topic_config("t").retention_ms == 3_600_000
    assert await ops.getxattr(topic, b"user.seglog.retention.ms", CTX) == b"3600000"
    with caplog.at_level(logging.WARNING, logger="seglogfs.daemon"):
        assert (
            await fuse_errno(ops.setxattr(topic, b"user.seglog.retention.ms", b"soon", CTX))
            == errno.EINVAL
        )
        assert (
            await fuse_errno(ops.setxattr(topic, b"user.seglog.no.such.key", b"1", CTX))
            == errno.EINVAL
        )
    assert "retention.ms" in caplog.text
    assert "no.such.key" in caplog.text
    assert manager.topic_config("t").retention_ms == 3_600_000
    await ops.removexattr(topic, b"user.seglog.retention.ms", CTX)
    assert "retention.ms" not in manager.topic("t").overrides
    assert await fuse_errno(ops.setxattr(partition, b"user.seglog.size", b"1", CTX)) == errno.EPERM
    assert await fuse_errno(ops.getxattr(partition, b"user.other", CTX)) == pyfuse3.ENOATTR
    assert await fuse_errno(ops.setxattr(topic, b"user.other", b"1", CTX)) == errno.ENOTSUP


@pytest.mark.trio
async def test_unexpected_error_is_eio_logged_once_with_traceback(
    ops: Operations, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    await ops.mkdir(pyfuse3.ROOT_INODE, b"t", 0o755, CTX)
    partition = await inode_of(ops, "/t/0")

    def broken(node: object) -> dict[str, str]:
        raise RuntimeError("a bug in a handler")

    monkeypatch.setattr(ops, "_sync_xattrs", broken)
    with caplog.at_level(logging.ERROR, logger="seglogfs.daemon"):
        for _ in range(3):
            assert await fuse_errno(ops.listxattr(partition, CTX)) == errno.EIO
    tracebacks = [r for r in caplog.records if r.exc_info is not None]
    assert len(tracebacks) == 1
    assert "a bug in a handler" in caplog.text
    assert len(caplog.records) == 3
    # The file system still answers.
    assert (await ops.getattr(partition, CTX)).st_size == 0


@pytest.mark.trio
async def test_read_only_operations_refuse_every_change(log_dir: Path) -> None:
    with open_manager(log_dir) as writer:
        writer.create_topic("t", 1)
        writer.log("t", 0).append([b"x"])
    with open_manager(log_dir, read_only=True) as manager:
        ops = Operations(manager, run_sync, read_only=True)
        assert await listing(ops, "/t") == ["0"]  # no produce file on a read-only mount
        topic = await inode_of(ops, "/t")
        partition = await inode_of(ops, "/t/0")
        assert await fuse_errno(ops.mkdir(pyfuse3.ROOT_INODE, b"new", 0o755, CTX)) == errno.EROFS
        assert await fuse_errno(ops.open(partition, APPEND, CTX)) == errno.EROFS
        assert (
            await fuse_errno(ops.setxattr(topic, b"user.seglog.retention.ms", b"1", CTX))
            == errno.EROFS
        )
        assert await fuse_errno(ops.unlink(topic, b"0", CTX)) == errno.EROFS
        assert await read_all(ops, "/t/0") == b"x\n"


@pytest.mark.trio
async def test_statfs_is_the_log_dirs_file_system(ops: Operations, log_dir: Path) -> None:
    data = await ops.statfs(CTX)
    expected = os.statvfs(log_dir)
    assert data.f_blocks == expected.f_blocks
    assert data.f_bsize == expected.f_bsize
    assert abs(data.f_bavail - expected.f_bavail) < 1024


@pytest.mark.trio
async def test_inodes_are_stable_and_kinds_right(ops: Operations) -> None:
    await ops.mkdir(pyfuse3.ROOT_INODE, b"t", 0o755, CTX)
    first = await inode_of(ops, "/t/0")
    assert await inode_of(ops, "/t/0") == first
    assert ops._nodes[first].kind is Kind.PARTITION
    assert ops._nodes[await inode_of(ops, "/t/produce")].kind is Kind.PRODUCE
    attr = await ops.getattr(await inode_of(ops, "/t/produce"), CTX)
    assert attr.st_mode & 0o777 == 0o644  # readable, as an empty file
    assert attr.st_size == 0


@pytest.mark.trio
async def test_write_over_the_batch_limit_is_cut_and_a_later_failure_is_a_short_write(
    ops: Operations, manager: LogManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = (await ops.mkdir(pyfuse3.ROOT_INODE, b"t", 0o755, CTX)).st_ino
    await ops.setxattr(topic, b"user.seglog.max.message.bytes", b"2000", CTX)
    log = manager.log("t", 0)
    lines = [b"line %02d %s" % (i, b"." * 90) for i in range(60)]
    data = b"".join(line + b"\n" for line in lines)
    await write(ops, "/t/0", data)
    batches = list(log.batches(0))
    assert len(batches) >= 3
    assert all(b.size <= 2000 for b in batches)
    assert [r.value for r in log.records(0)] == lines
    # A disk that fills after the first piece: the write reports what went in.
    real_append = log.append
    calls = []

    def append_then_fail(*args: object, **kwargs: object) -> object:
        calls.append(1)
        if len(calls) > 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_append(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(log, "append", append_then_fail)
    fh = (await ops.open(await inode_of(ops, "/t/0"), APPEND, CTX)).fh
    await ops.write(fh, 0, b"partial ")
    written = await ops.write(fh, 0, data)
    first_piece = written + len(b"partial ")
    assert 0 < written < len(data)
    assert data[written - 1 : written] == b"\n"
    records = [r.value for r in log.records(0)]
    assert records[len(lines)] == b"partial " + lines[0]
    assert len(records) == len(lines) + data[:written].count(b"\n")
    assert await fuse_errno(ops.write(fh, 0, data[written:])) == errno.ENOSPC
    await ops.release(fh)
    assert first_piece < 2000
    assert log.log_end_offset == len(records)


@pytest.mark.trio
async def test_namespace_follows_topics_changed_behind_the_file_system(
    ops: Operations, manager: LogManager
) -> None:
    manager.create_topic("made-elsewhere", 2)  # as the control socket would
    assert await listing(ops, "/") == ["made-elsewhere"]
    topic = await inode_of(ops, "/made-elsewhere")
    partition = await inode_of(ops, "/made-elsewhere/1")
    manager.delete_topic("made-elsewhere")
    assert await listing(ops, "/") == []
    assert await fuse_errno(ops.getattr(topic, CTX)) == errno.ENOENT
    assert await fuse_errno(ops.getattr(partition, CTX)) == errno.ENOENT
    assert await fuse_errno(ops.lookup(pyfuse3.ROOT_INODE, b"made-elsewhere", CTX)) == errno.ENOENT
    manager.create_topic("made-elsewhere", 1)
    assert await inode_of(ops, "/made-elsewhere") == topic  # the same name, the same inode
    internal = manager.create_topic("__internal", 1)
    assert internal.name not in await listing(ops, "/")
    assert await fuse_errno(ops.lookup(pyfuse3.ROOT_INODE, b"__internal", CTX)) == errno.ENOENT
    shown = Operations(manager, run_sync, show_internal=True)
    assert "__internal" in await listing(shown, "/")


@pytest.mark.trio
async def test_view_inodes_are_dropped_when_the_kernel_forgets_them(ops: Operations) -> None:
    await ops.mkdir(pyfuse3.ROOT_INODE, b"t", 0o755, CTX)
    topic = await inode_of(ops, "/t")
    partition = await inode_of(ops, "/t/0")
    before = len(ops._nodes)
    views = []
    for i in range(5):
        await write(ops, "/t/0", b"r%d\n" % i)
        views.append((await ops.lookup(topic, b"0@latest", CTX)).st_ino)
    assert len(set(views)) == 5  # each resolution starts elsewhere
    again = (await ops.lookup(topic, b"0@latest", CTX)).st_ino
    assert again == views[-1]
    assert len(ops._nodes) == before + 5
    await ops.forget([(inode, 1) for inode in views] + [(partition, 3), (topic, 9)])
    assert len(ops._nodes) == before + 1  # the last one was looked up twice
    assert await fuse_errno(ops.getattr(views[0], CTX)) == errno.ENOENT
    assert (await ops.getattr(views[-1], CTX)).st_size == 0
    await ops.forget([(views[-1], 1)])
    assert len(ops._nodes) == before
    assert (await ops.getattr(partition, CTX)).st_size == 15  # partitions are never dropped


@pytest.mark.trio
async def test_fsync_appends_the_partial_line_and_flushes(
    ops: Operations, manager: LogManager
) -> None:
    await ops.mkdir(pyfuse3.ROOT_INODE, b"t", 0o755, CTX)
    log = manager.log("t", 0)
    fh = (await ops.open(await inode_of(ops, "/t/0"), APPEND, CTX)).fh
    await ops.write(fh, 0, b"whole\nhalf")
    assert log.recovery_point == 0
    await ops.fsync(fh, False)
    assert [r.value for r in log.records(0)] == [b"whole", b"half"]
    assert log.recovery_point == 2  # fsynced: recovery starts after it
    await ops.release(fh)
    produce = (await ops.open(await inode_of(ops, "/t/produce"), os.O_WRONLY, CTX)).fh
    await ops.write(produce, 0, b"via produce\n")
    await ops.fsync(produce, True)
    await ops.release(produce)
    assert log.recovery_point == 3


@pytest.mark.trio
async def test_rolls_are_logged_at_info_and_requests_are_not(
    ops: Operations, manager: LogManager, caplog: pytest.LogCaptureFixture
) -> None:
    topic = (await ops.mkdir(pyfuse3.ROOT_INODE, b"t", 0o755, CTX)).st_ino
    await ops.setxattr(topic, b"user.seglog.segment.bytes", b"300", CTX)
    with caplog.at_level(logging.INFO, logger="seglogfs"):
        for i in range(20):
            await write(ops, "/t/0", b"line %02d %s\n" % (i, b"r" * 50))
        await read_all(ops, "/t/0")
    rolls = [r for r in caplog.records if "rolled to segment" in r.getMessage()]
    assert len(rolls) == manager.log("t", 0).number_of_segments - 1 >= 3
    assert all(r.levelno == logging.INFO for r in rolls)
    assert len(caplog.records) == len(rolls)  # nothing per read or write

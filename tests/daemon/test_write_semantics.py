"""What a write does, handler by handler (issue #16): no record split, dropped,
misplaced or written into another topic, and a position index that always matches the
records. The same defects through a real mount are in ``test_mount_writes.py``; random
sequences of all of this against a model in ``test_write_model.py``.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from pathlib import Path

import pyfuse3
import pytest
import trio
import trio.testing

from seglogfs.daemon.lines import RecordLimit, raw_pieces
from seglogfs.daemon.operations import Operations
from seglogfs.positions import Rendering
from storage import CompressionType, Log, LogManager, build_record_batch, partition_for_key
from tests.daemon.test_operations import (
    APPEND,
    CTX,
    fuse_errno,
    inode_of,
    read_all,
    size_of,
    write,
)

from .conftest import open_manager, run_sync

ROOT = pyfuse3.ROOT_INODE
DEFAULT_MAX_MESSAGE_BYTES = 1_048_588


def values(log: Log) -> list[bytes | None]:
    return [r.value for r in log.records(log.log_start_offset)]


def rendered_total(manager: LogManager, topic: str, partition: int = 0) -> int:
    """The rendered size of every record of the partition: what its position index must
    say the file holds (the log start is 0 in these tests)."""
    log = manager.log(topic, partition)
    rendering = Rendering.of(manager.topic(topic), partition)
    return sum(len(rendering.render(batch).data) for batch in log.batches(0))


async def write_errno(ops: Operations, fh: int, data: bytes) -> int | None:
    """None when ``data`` was written whole, else the errno of the refusal."""
    try:
        assert await ops.write(fh, 0, data) == len(data)
    except pyfuse3.FUSEError as exc:
        return exc.errno
    return None


async def open_fh(ops: Operations, path: str, flags: int = APPEND) -> int:
    return (await ops.open(await inode_of(ops, path), flags, CTX)).fh


# -- 1. only the last close (release) or fsync ends a partial line ----------------------


@pytest.mark.trio
async def test_flush_of_a_duplicate_descriptor_does_not_end_a_partial_line(
    ops: Operations, manager: LogManager
) -> None:
    # `{ printf 'part1-'; /bin/true; printf 'part2\n'; } >> f`: the child's exit closes
    # its inherited copy of the descriptor: FUSE sends flush, not release.
    await ops.mkdir(ROOT, b"t", 0o755, CTX)
    log = manager.log("t", 0)
    fh = await open_fh(ops, "/t/0")
    await ops.write(fh, 0, b"part1-")
    await ops.flush(fh)
    await ops.write(fh, 0, b"part2\n")
    await ops.write(fh, 0, b"tail-")
    await ops.flush(fh)
    await ops.flush(fh)
    assert values(log) == [b"part1-part2"]
    await ops.write(fh, 0, b"end")
    await ops.flush(fh)  # the last close: flush, then release
    assert values(log) == [b"part1-part2"]
    await ops.release(fh)
    assert values(log) == [b"part1-part2", b"tail-end"]
    assert await read_all(ops, "/t/0") == b"part1-part2\ntail-end\n"
    assert await size_of(ops, "/t/0") == rendered_total(manager, "t")


@pytest.mark.trio
async def test_flush_of_the_produce_file_does_not_end_a_partial_line(log_dir: Path) -> None:
    with open_manager(log_dir, partitions=3) as manager:
        ops = Operations(manager, run_sync)
        await ops.mkdir(ROOT, b"t", 0o755, CTX)
        fh = await open_fh(ops, "/t/produce", os.O_WRONLY)
        await ops.write(fh, 0, b"one ")
        await ops.flush(fh)
        await ops.write(fh, 0, b"line")
        await ops.flush(fh)
        assert sum(manager.log("t", p).log_end_offset for p in range(3)) == 0
        await ops.release(fh)
        records = [v for p in range(3) for v in values(manager.log("t", p))]
        assert records == [b"one line"]


@pytest.mark.trio
async def test_reads_after_a_release_see_its_partial_line(
    ops: Operations, manager: LogManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The kernel sends release after the last close has returned; a stat, open or read
    # of the partition that arrives after it waits for its append (a slow one here).
    await ops.mkdir(ROOT, b"t", 0o755, CTX)
    log = manager.log("t", 0)
    real_append = log.append

    def slow_append(*args: object, **kwargs: object) -> object:
        time.sleep(0.3)
        return real_append(*args, **kwargs)  # type: ignore[arg-type]

    partition = await inode_of(ops, "/t/0")
    reader = await open_fh(ops, "/t/0", os.O_RDONLY)
    fh = await open_fh(ops, "/t/0")
    await ops.write(fh, 0, b"no newline")
    monkeypatch.setattr(log, "append", slow_append)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ops.release, fh)
        await trio.testing.wait_all_tasks_blocked()  # release is appending
        assert (await ops.getattr(partition, CTX)).st_size == len(b"no newline\n")
        assert bytes(await ops.read(reader, 0, 100)) == b"no newline\n"
    await ops.release(reader)


# -- 2. a pending line that could never be one record is refused by its write ----------


@pytest.mark.trio
@pytest.mark.parametrize("size", [140, 150, 199, 200])
async def test_a_partial_line_too_large_for_one_record_is_refused_by_its_write(
    ops: Operations, manager: LogManager, size: int
) -> None:
    topic = (await ops.mkdir(ROOT, b"t", 0o755, CTX)).st_ino
    await ops.setxattr(topic, b"user.seglog.max.message.bytes", b"200", CTX)
    log = manager.log("t", 0)
    fh = await open_fh(ops, "/t/0")
    assert await fuse_errno(ops.write(fh, 0, b"x" * size)) == errno.EFBIG
    await ops.write(fh, 0, b"y" * 100)  # accepted: pending
    # The write that makes the pending line too large is refused; the 100 bytes stay.
    assert await fuse_errno(ops.write(fh, 0, b"z" * (size - 100))) == errno.EFBIG
    await ops.flush(fh)
    await ops.release(fh)
    assert values(log) == [b"y" * 100]
    assert await read_all(ops, "/t/0") == b"y" * 100 + b"\n"


@pytest.mark.trio
async def test_every_accepted_partial_line_is_appended_at_release(
    ops: Operations, manager: LogManager
) -> None:
    # The largest partial line a write accepts is appended at release: the write-time
    # check is exact (here: 120 fits, 140 does not, and every size between).
    topic = (await ops.mkdir(ROOT, b"t", 0o755, CTX)).st_ino
    await ops.setxattr(topic, b"user.seglog.max.message.bytes", b"200", CTX)
    log = manager.log("t", 0)
    accepted = []
    for size in range(100, 160):
        fh = await open_fh(ops, "/t/0")
        code = await write_errno(ops, fh, b"v" * size)
        if code is None:
            accepted.append(size)
        assert code in (None, errno.EFBIG)
        await ops.release(fh)
    assert 120 in accepted
    assert 140 not in accepted
    assert accepted == list(range(100, accepted[-1] + 1))
    assert [len(v or b"") for v in values(log)] == accepted


@pytest.mark.trio
async def test_a_keyed_partial_line_is_measured_as_its_record(log_dir: Path) -> None:
    with open_manager(log_dir) as manager:
        ops = Operations(manager, run_sync)
        topic = (await ops.mkdir(ROOT, b"k", 0o755, CTX)).st_ino
        await ops.setxattr(topic, b"user.seglog.key.separator", b"::", CTX)
        await ops.setxattr(topic, b"user.seglog.max.message.bytes", b"200", CTX)
        accepted = []
        for size in range(100, 160):
            fh = await open_fh(ops, "/k/0")
            code = await write_errno(ops, fh, b"key::" + b"v" * size)
            if code is None:
                accepted.append(size)
            assert code in (None, errno.EFBIG)
            await ops.release(fh)
        records = list(manager.log("k", 0).records(0))
        assert [len(r.value or b"") for r in records] == accepted
        assert all(r.key == b"key" for r in records)


@pytest.mark.parametrize("codec", list(CompressionType))
@pytest.mark.parametrize("separator", [None, b":"])
def test_record_limit_agrees_with_the_batch_builder(
    codec: CompressionType, separator: bytes | None
) -> None:
    # `RecordLimit.fits` answers whether the engine will take the line as one record:
    # exactly the builder's batch size against the limit.
    import random

    rng = random.Random(int(codec) * 7 + (separator is None))
    for limit in (70, 100, 200, 1000, 20_000):
        check = RecordLimit(limit, codec, separator)
        for _ in range(60):
            n = rng.randrange(0, limit + 40)
            line = bytes(rng.randrange(256) for _ in range(n)).replace(b"\n", b"")
            if rng.random() < 0.3:
                line = b"a" * n
            key: bytes | None = None
            value = line
            if separator is not None and separator in line:
                key, value = line.split(separator, 1)
            batch = build_record_batch([value], keys=[key], timestamps=1, codec=codec)
            assert check.fits(line) == (len(batch) <= limit), (limit, n)


@pytest.mark.trio
async def test_a_keyed_produce_write_with_a_line_too_large_appends_nothing(
    log_dir: Path,
) -> None:
    # Keyed lines are appended per partition: a line refused after another partition's
    # append would fail a write that is partly done, and the retry would append twice.
    with open_manager(log_dir, partitions=2) as manager:
        ops = Operations(manager, run_sync)
        topic = (await ops.mkdir(ROOT, b"k", 0o755, CTX)).st_ino
        await ops.setxattr(topic, b"user.seglog.key.separator", b":", CTX)
        await ops.setxattr(topic, b"user.seglog.max.message.bytes", b"200", CTX)
        first = next(b"a%d" % i for i in range(100) if partition_for_key(b"a%d" % i, 2) == 0)
        last = next(b"b%d" % i for i in range(100) if partition_for_key(b"b%d" % i, 2) == 1)
        fh = await open_fh(ops, "/k/produce", os.O_WRONLY)
        data = first + b":small\n" + last + b":" + b"x" * 300 + b"\n"
        assert await fuse_errno(ops.write(fh, 0, data)) == errno.EFBIG
        await ops.release(fh)
        assert [manager.log("k", p).log_end_offset for p in range(2)] == [0, 0]


@pytest.mark.trio
async def test_a_limit_lowered_under_a_pending_line_is_refused_or_reported_at_close(
    ops: Operations, manager: LogManager, caplog: pytest.LogCaptureFixture
) -> None:
    topic = (await ops.mkdir(ROOT, b"t", 0o755, CTX)).st_ino
    fh = await open_fh(ops, "/t/0")
    line = os.urandom(300).replace(b"\n", b"")[:150]  # incompressible
    await ops.write(fh, 0, line)
    # Through the mount: refused while the accepted line would no longer fit.
    for name, value in ((b"max.message.bytes", b"200"), (b"compression.type", b"gzip")):
        if name == b"compression.type":
            await ops.setxattr(topic, b"user.seglog.max.message.bytes", b"220", CTX)
        code = await fuse_errno(ops.setxattr(topic, b"user.seglog." + name, value, CTX))
        assert code == errno.EBUSY
    await ops.setxattr(topic, b"user.seglog.max.message.bytes", b"5000", CTX)  # larger: fine
    await ops.removexattr(topic, b"user.seglog.max.message.bytes", CTX)
    # Behind the mount (the control socket): the close reports that the line is lost.
    manager.alter_topic_config("t", {"max.message.bytes": "100"})
    assert await fuse_errno(ops.flush(fh)) == errno.EFBIG
    with caplog.at_level(logging.ERROR, logger="seglogfs.daemon"):
        await ops.release(fh)
    assert "150 bytes lost" in caplog.text
    assert manager.log("t", 0).log_end_offset == 0


# -- 3. raw topics take writes of any size ----------------------------------------------


@pytest.mark.trio
@pytest.mark.parametrize("size", [1 << 20, DEFAULT_MAX_MESSAGE_BYTES, 3 << 20])
async def test_a_raw_write_of_any_size_reads_back_byte_for_byte(
    ops: Operations, manager: LogManager, size: int
) -> None:
    topic = (await ops.mkdir(ROOT, b"bin", 0o755, CTX)).st_ino
    await ops.setxattr(topic, b"user.seglog.format", b"raw", CTX)
    data = os.urandom(size)
    fh = await open_fh(ops, "/bin/0")
    assert await ops.write(fh, 0, data) == size
    assert await ops.write(fh, 0, b"after") == 5
    await ops.release(fh)
    log = manager.log("bin", 0)
    assert b"".join(v or b"" for v in values(log)) == data + b"after"
    assert all(batch.size <= DEFAULT_MAX_MESSAGE_BYTES for batch in log.batches(0))
    assert await read_all(ops, "/bin/0") == data + b"after"
    assert await size_of(ops, "/bin/0") == size + 5 == rendered_total(manager, "bin")


@pytest.mark.trio
async def test_a_raw_write_split_into_records_is_appended_all_or_nothing(
    ops: Operations, manager: LogManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = (await ops.mkdir(ROOT, b"bin", 0o755, CTX)).st_ino
    await ops.setxattr(topic, b"user.seglog.format", b"raw", CTX)
    log = manager.log("bin", 0)
    calls = []
    real_append = log.append

    def counting_append(*args: object, **kwargs: object) -> object:
        calls.append(len(args[0]))  # type: ignore[arg-type]
        return real_append(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(log, "append", counting_append)
    fh = await open_fh(ops, "/bin/0")
    await ops.write(fh, 0, b"r" * (2 << 20))
    assert calls == [3]  # three records of 699,051 bytes or less, one append: one write
    # A full disk during that write: nothing of it appended, the write refused.
    monkeypatch.setattr(
        log, "append", lambda *a, **k: (_ for _ in ()).throw(OSError(errno.ENOSPC, "full"))
    )
    assert await fuse_errno(ops.write(fh, 0, b"s" * (2 << 20))) == errno.ENOSPC
    await ops.release(fh)
    assert b"".join(v or b"" for v in values(log)) == b"r" * (2 << 20)


@pytest.mark.parametrize("codec", list(CompressionType))
def test_raw_pieces_fit_the_limit(codec: CompressionType) -> None:
    for limit in (100, 1000, DEFAULT_MAX_MESSAGE_BYTES):
        check = RecordLimit(limit, codec, None)
        for size in (1, limit - 77, limit - 60, limit, 3 * limit + 5):
            data = os.urandom(size)
            pieces = raw_pieces(data, check)
            assert b"".join(pieces) == data
            assert all(check.fits(piece) for piece in pieces)
            if codec is CompressionType.NONE:  # the fewest: a codec may need smaller
                assert len(pieces) == -(-size // (limit - 77)), (limit, size)


# -- 4. the rendering never changes under a pending line --------------------------------


@pytest.mark.trio
@pytest.mark.parametrize(("key", "value"), [(b"format", b"raw"), (b"key.separator", b":")])
async def test_rendering_change_is_ebusy_while_a_partial_line_is_pending(
    ops: Operations, manager: LogManager, key: bytes, value: bytes
) -> None:
    topic = (await ops.mkdir(ROOT, b"fmt", 0o755, CTX)).st_ino
    fh = await open_fh(ops, "/fmt/0")
    await ops.write(fh, 0, b"abc")
    assert await fuse_errno(ops.setxattr(topic, b"user.seglog." + key, value, CTX)) == errno.EBUSY
    assert manager.topic("fmt").format == "lines"
    assert manager.topic("fmt").key_separator is None
    await ops.write(fh, 0, b"def\nghi\n")
    await ops.release(fh)
    assert await read_all(ops, "/fmt/0") == b"abcdef\nghi\n"
    assert await size_of(ops, "/fmt/0") == len(b"abcdef\nghi\n") == rendered_total(manager, "fmt")


@pytest.mark.trio
async def test_rendering_change_applies_to_files_open_without_pending_bytes(
    ops: Operations, manager: LogManager
) -> None:
    # An open writer and reader with nothing pending follow the new rendering.
    topic = (await ops.mkdir(ROOT, b"fmt", 0o755, CTX)).st_ino
    writer = await open_fh(ops, "/fmt/0")
    reader = await open_fh(ops, "/fmt/0", os.O_RDONLY)
    assert bytes(await ops.read(reader, 0, 100)) == b""
    await ops.setxattr(topic, b"user.seglog.format", b"raw", CTX)
    await ops.write(writer, 0, b"abc")
    await ops.write(writer, 0, b"de\nf")
    await ops.release(writer)
    assert bytes(await ops.read(reader, 0, 100)) == b"abcde\nf"
    await ops.release(reader)
    assert values(manager.log("fmt", 0)) == [b"abc", b"de\nf"]
    assert await size_of(ops, "/fmt/0") == 7 == rendered_total(manager, "fmt")


# -- 6. a handle of a deleted topic stays dead --------------------------------------------


@pytest.mark.trio
async def test_handles_of_a_deleted_topic_never_reach_its_successor(
    ops: Operations, manager: LogManager
) -> None:
    await ops.mkdir(ROOT, b"rt", 0o755, CTX)
    fh = await open_fh(ops, "/rt/0")
    await ops.write(fh, 0, b"old 1\nold 2\n")
    reader = await open_fh(ops, "/rt/0", os.O_RDONLY)
    assert bytes(await ops.read(reader, 0, 6)) == b"old 1\n"
    view = await open_fh(ops, "/rt/0@earliest", os.O_RDONLY)
    produce = await open_fh(ops, "/rt/produce", os.O_WRONLY)
    await ops.write(fh, 0, b"pending")
    manager.delete_topic("rt")  # as the control socket does
    await ops.mkdir(ROOT, b"rt", 0o755, CTX)
    writer = await open_fh(ops, "/rt/0")
    await ops.write(writer, 0, b"new 1\nnew 2\n")
    await ops.release(writer)
    dead = (errno.ESTALE, errno.ENOENT)
    for _ in range(2):  # every later call, not only the first
        assert await fuse_errno(ops.read(reader, 6, 100)) in dead
        assert await fuse_errno(ops.read(view, 0, 100)) in dead
        assert await fuse_errno(ops.write(fh, 0, b"stray\n")) in dead
        assert await fuse_errno(ops.write(produce, 0, b"stray\n")) in dead
        assert await fuse_errno(ops.fsync(fh, False)) in dead
    # close() tells the writer its pending line is lost; release appends nothing.
    assert await fuse_errno(ops.flush(fh)) in dead
    for handle in (fh, reader, view, produce):
        await ops.release(handle)
    assert values(manager.log("rt", 0)) == [b"new 1", b"new 2"]
    assert await read_all(ops, "/rt/0") == b"new 1\nnew 2\n"
    assert await size_of(ops, "/rt/0") == rendered_total(manager, "rt")


@pytest.mark.trio
async def test_a_handle_of_a_deleted_topic_is_dead_without_a_successor(
    ops: Operations, manager: LogManager
) -> None:
    manager.create_topic("gone", 1)
    fh = await open_fh(ops, "/gone/0", os.O_RDWR | os.O_APPEND)
    await ops.write(fh, 0, b"a\n")
    manager.delete_topic("gone")
    assert await fuse_errno(ops.read(fh, 0, 10)) in (errno.ESTALE, errno.ENOENT)
    assert await fuse_errno(ops.write(fh, 0, b"b\n")) in (errno.ESTALE, errno.ENOENT)
    await ops.release(fh)
    assert manager.topics() == []


@pytest.mark.trio
async def test_a_view_resolved_before_a_delete_opens_nothing_of_the_successor(
    ops: Operations, manager: LogManager
) -> None:
    # The kernel looks a name up, then opens the inode: a delete and a re-creation in
    # between must not give the old start's position in the new topic.
    manager.create_topic("v", 1)
    await write(ops, "/v/0", b"a-long-old-line-0\na-long-old-line-1\na-long-old-line-2\n")
    view = await inode_of(ops, "/v/0@2")
    manager.delete_topic("v")
    manager.create_topic("v", 1)
    await write(ops, "/v/0", b"n0\nn1\nn2\nn3\n")
    assert await fuse_errno(ops.open(view, os.O_RDONLY, CTX)) == errno.ESTALE
    assert await fuse_errno(ops.getattr(view, CTX)) == errno.ESTALE
    assert await read_all(ops, "/v/0@2") == b"n2\nn3\n"  # resolved again: the new topic


# -- 7. mkdir never creates what cannot be reached ------------------------------------------


@pytest.mark.trio
async def test_mkdir_of_an_internal_name_is_refused_unless_internal_topics_are_shown(
    ops: Operations, manager: LogManager, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="seglogfs.daemon"):
        assert await fuse_errno(ops.mkdir(ROOT, b"__name", 0o755, CTX)) == errno.EINVAL
    assert manager.topics() == []
    refusals = [r for r in caplog.records if "__name" in r.getMessage()]
    assert len(refusals) == 1
    assert refusals[0].levelno == logging.INFO
    assert "internal" in refusals[0].getMessage()
    assert "-o internal" in refusals[0].getMessage()
    shown = Operations(manager, run_sync, show_internal=True)
    await shown.mkdir(ROOT, b"__name", 0o755, CTX)
    assert (await shown.lookup(ROOT, b"__name", CTX)).st_ino > 0
    assert manager.topics() == ["__name"]


@pytest.mark.trio
async def test_a_refused_topic_name_is_logged_once_per_refusal(
    ops: Operations, manager: LogManager, caplog: pytest.LogCaptureFixture
) -> None:
    await ops.mkdir(ROOT, b"a.b", 0o755, CTX)
    with caplog.at_level(logging.INFO, logger="seglogfs"):
        for name in (b"bad name", b"bad name", b"x" * 250, b"a_b"):
            assert await fuse_errno(ops.mkdir(ROOT, name, 0o755, CTX)) == errno.EINVAL
    lines = [r for r in caplog.records if "refused" in r.getMessage()]
    assert len(lines) == 4
    assert all(r.levelno == logging.INFO for r in lines)
    assert "'bad name'" in lines[0].getMessage()
    assert "collides" in lines[3].getMessage()
    assert manager.topics() == ["a.b"]

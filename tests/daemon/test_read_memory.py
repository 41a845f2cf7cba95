"""What readers of the mount make the daemon hold: one budget, ``fetch.max.bytes``.

Issue #18 (5): 1,000 descriptors each reading 2 x 64 KiB of an 18.6 MB partition took
the daemon from 1.0 to 5.0 GB, and 2.45 GB stayed after they closed. What must hold:
what all readers keep rendered is at most ``fetch.max.bytes`` (a reader past it reads
without read-ahead: the same bytes, slower); idle readers give it up to active ones;
the memory goes back once they close; a real daemon's RSS shows it.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
import tracemalloc
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyfuse3
import pytest
import trio

from seglogfs.daemon import state
from seglogfs.daemon.operations import Operations
from seglogfs.daemon.read_ahead import (
    FETCH_MAX_BYTES,
    IDLE_S,
    MIN_FETCH_MAX_BYTES,
    ReadAheadBudget,
    fetch_max_bytes,
)
from seglogfs.daemon.read_path import READ_AHEAD
from storage import ConfigError, LogManager

from .conftest import MountDir, needs_fuse, run_sync
from .test_operations import CTX, inode_of, read_all, write

MIB = 1 << 20
READ = 64 << 10


def _lines(size: int) -> bytes:
    """About ``size`` bytes of numbered 100-byte lines."""
    return b"".join(b"line %08d %s\n" % (i, b"x" * 85) for i in range(size // 100))


async def _produce(ops: Operations, data: bytes) -> None:
    await ops.mkdir(pyfuse3.ROOT_INODE, b"t", 0o755, CTX)
    chunks = [data[i : i + MIB] for i in range(0, len(data), MIB)]
    await write(ops, "/t/0", *chunks)


async def _open_and_read(ops: Operations, reads: int = 2) -> tuple[int, bytes]:
    fh = (await ops.open(await inode_of(ops, "/t/0"), os.O_RDONLY, CTX)).fh
    got = b"".join([bytes(await ops.read(fh, i * READ, READ)) for i in range(reads)])
    return fh, got


# -- handlers, without a kernel ---------------------------------------------------------


@pytest.mark.trio
async def test_open_readers_keep_at_most_fetch_max_bytes(ops: Operations) -> None:
    # Each reader used to keep its 4 MiB of read-ahead for as long as it was open: 40
    # readers held 160 MiB. Counted by tracemalloc, in this process, worker threads too.
    data = _lines(6 * MIB)
    await _produce(ops, data)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        handles = []
        for _ in range(40):
            fh, got = await _open_and_read(ops)
            assert got == data[: 2 * READ]
            handles.append(fh)
        kept = tracemalloc.get_traced_memory()[0] - before
        assert kept < FETCH_MAX_BYTES + 8 * MIB, f"{kept / MIB:.0f} MiB kept by 40 readers"
        assert ops._read_ahead.used <= FETCH_MAX_BYTES
        for fh in handles:
            await ops.release(fh)
        assert ops._read_ahead.used == 0
        left = tracemalloc.get_traced_memory()[0] - before
        assert left < 4 * MIB, f"{left / MIB:.0f} MiB left after every reader closed"
    finally:
        tracemalloc.stop()


@pytest.mark.trio
async def test_a_reader_past_the_budget_reads_the_same_bytes_without_read_ahead(
    manager: LogManager,
) -> None:
    ops = Operations(manager, run_sync, fetch_max_bytes=READ_AHEAD + 2 * MIB)
    data = _lines(12 * MIB)
    await _produce(ops, data)
    first, got = await _open_and_read(ops)
    assert got == data[: 2 * READ]
    assert ops._read_ahead.charged(ops._files[first]) > READ_AHEAD  # it read ahead
    # The others find no room: each keeps nothing, and reads what a reader with
    # read-ahead reads, sequentially and anywhere.
    others = []
    for _ in range(3):
        fh, got = await _open_and_read(ops, reads=5)
        assert got == data[: 5 * READ]
        assert ops._read_ahead.charged(ops._files[fh]) < 2 * MIB
        assert ops._read_ahead.used <= ops._read_ahead.limit
        others.append(fh)
    assert bytes(await ops.read(others[0], 5 * MIB + 3, 1000)) == data[5 * MIB + 3 : 5 * MIB + 1003]
    assert await read_all(ops, "/t/0", 100_000) == data  # a whole sequential read
    for fh in [first, *others]:
        await ops.release(fh)
    assert ops._read_ahead.used == 0


@pytest.mark.trio
async def test_an_idle_reader_gives_its_read_ahead_to_an_active_one(ops: Operations) -> None:
    now = [0.0]
    ops._read_ahead = ReadAheadBudget(READ_AHEAD + 2 * MIB, clock=lambda: now[0])
    budget = ops._read_ahead
    data = _lines(12 * MIB)
    await _produce(ops, data)
    idle, _ = await _open_and_read(ops)
    active, _ = await _open_and_read(ops)
    assert budget.charged(ops._files[idle]) > READ_AHEAD
    assert budget.charged(ops._files[active]) < 2 * MIB  # no room: no read-ahead

    async def read_on(start: int, end: int) -> None:
        # Sequential 64 KiB reads of the active reader, past the batch it keeps.
        for offset in range(start, end, READ):
            assert bytes(await ops.read(active, offset, READ)) == data[offset : offset + READ]

    now[0] += IDLE_S / 2
    await read_on(2 * READ, 2 * MIB)
    assert budget.charged(ops._files[active]) < 2 * MIB  # the other is not idle yet
    now[0] += IDLE_S
    await read_on(2 * MIB, 3 * MIB)
    assert budget.charged(ops._files[active]) > READ_AHEAD
    assert budget.charged(ops._files[idle]) == 0
    # The idle reader lost nothing but speed.
    assert bytes(await ops.read(idle, 2 * READ, READ)) == data[2 * READ : 3 * READ]
    assert budget.used <= budget.limit
    await ops.release(idle)
    await ops.release(active)


@pytest.mark.trio
async def test_memory_is_given_back_after_readers_holding_the_budget_close(
    ops: Operations, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[str] = []  # where glibc's malloc_trim would run
    monkeypatch.setattr(
        state, "release_free_memory", lambda: threads.append(threading.current_thread().name)
    )
    started = 0
    give_back = ops._give_back_memory

    def counted() -> None:
        nonlocal started
        started += 1
        give_back()

    monkeypatch.setattr(ops, "_give_back_memory", counted)
    data = _lines(6 * MIB)
    await _produce(ops, data)
    async with trio.open_nursery() as nursery:
        ops.use_renderer(None, nursery)  # no render process; a nursery to work in
        handles = [(await _open_and_read(ops))[0] for _ in range(12)]
        assert ops._read_ahead.used > 40 * MIB
        for fh in handles[:2]:
            await ops.release(fh)
        assert started == 0  # a cat or two closing is not worth a trim
        for fh in handles[2:]:
            await ops.release(fh)
        assert started == 1
    assert len(threads) == 1
    assert threads[0] != threading.current_thread().name  # in a worker thread


def test_fetch_max_bytes_setting() -> None:
    assert fetch_max_bytes({}) == FETCH_MAX_BYTES == 57671680  # Kafka's default
    assert fetch_max_bytes({"fetch.max.bytes": "1048576"}) == MIB
    assert fetch_max_bytes({"fetch.max.bytes": str(MIN_FETCH_MAX_BYTES)}) == 1024
    for bad in ["1023", "-1", "2147483648", "1MB", "", "9" * 5000]:
        with pytest.raises(ConfigError, match=r"fetch\.max\.bytes"):
            fetch_max_bytes({"fetch.max.bytes": bad})
    with pytest.raises(ConfigError, match=r"fetch\.max\.bytes"):
        ReadAheadBudget(1000)


# -- a real daemon ------------------------------------------------------------------------


def _memory(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of ``pid``, in bytes."""
    values = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                values[key] = int(value.split()[0]) * 1024
    return values


READERS = 100
PEAK_BOUND = FETCH_MAX_BYTES + 32 * MIB
"""The budget, plus requests in flight (a reply and the batch around it, per worker
thread) and the open files themselves."""
AFTER_BOUND = 32 * MIB


@needs_fuse
def test_many_readers_of_a_real_mount_stay_in_budget_and_give_memory_back(
    tmp_path: Path, mount_dir: MountDir
) -> None:
    mount = mount_dir(tmp_path / "logs")  # the daemon makes the log directory
    assert mount.proc is not None
    pid = mount.proc.pid
    partition = mount.mountpoint / "t" / "0"
    os.mkdir(partition.parent)
    source = tmp_path / "lines.txt"
    source.write_bytes(_lines(19_000_000))  # the 18.6 MB
    subprocess.run(f"cat {source} >> {partition}", shell=True, check=True)
    expected = source.read_bytes()
    time.sleep(0.5)
    before = _memory(pid)["VmRSS"]
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS: the peak from here on

    def reader(_: int) -> int:
        fd = os.open(partition, os.O_RDONLY)
        assert os.read(fd, READ) + os.read(fd, READ) == expected[: 2 * READ]
        return fd

    with ThreadPoolExecutor(8) as pool:
        fds = list(pool.map(reader, range(READERS)))
    try:
        # The mount and a sequential reader go on, whatever the others keep.
        cat = subprocess.run(["cat", str(partition)], capture_output=True, check=True)
        assert cat.stdout == expected
        peak = _memory(pid)["VmHWM"]
    finally:
        for fd in fds:
            os.close(fd)
    deadline = time.monotonic() + 10
    while (after := _memory(pid)["VmRSS"]) - before > AFTER_BOUND and time.monotonic() < deadline:
        time.sleep(0.1)
    figures = f"RSS {before / MIB:.0f} MiB, {peak / MIB:.0f} at peak, {after / MIB:.0f} after"
    assert peak - before <= PEAK_BOUND, figures
    assert after - before <= AFTER_BOUND, figures
    assert mount.stop() == 0


@needs_fuse
def test_fetch_max_bytes_is_read_from_the_mount_config(tmp_path: Path, mount_dir: MountDir) -> None:
    # The daemon reads the budget from --config: a value under Kafka's minimum stops the
    # mount with one line naming the key (a bad value in --config: usage error, exit 2);
    # a valid one mounts and serves reads.
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    properties = tmp_path / "server.properties"
    properties.write_text("fetch.max.bytes=12\n")
    refused = mount_dir(log_dir, "--config", str(properties), wait=False)
    assert refused.proc is not None
    assert refused.proc.wait(60) == 2
    assert "fetch.max.bytes" in refused.log().strip().splitlines()[-1]
    properties.write_text("fetch.max.bytes=1048576\n")
    mount = mount_dir(log_dir, "--config", str(properties))
    (mount.mountpoint / "t").mkdir()
    with open(mount.mountpoint / "t" / "0", "ab") as f:
        f.write(b"x\n" * 1000)
    assert (mount.mountpoint / "t" / "0").read_bytes() == b"x\n" * 1000

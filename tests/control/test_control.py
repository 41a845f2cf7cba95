"""The control socket: a real server (``serve``) over a writable LogManager in a
temp dir, driven by the blocking client and by the console script in a subprocess."""

from __future__ import annotations

import json
import os
import socket
import stat
import struct
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from seglogfs import control
from seglogfs.control.server import serve
from seglogfs.producer import append_records
from storage import LogDirLockedError, LogManager, StickyPartitioner, partition_for_key
from tests.cli.conftest import SCRIPT, strip_build_notice
from tests.conftest import ManualClock

pytestmark = pytest.mark.trio


def _bridge() -> Callable[..., Awaitable[object]]:
    limiter = trio.CapacityLimiter(4)

    async def run_sync(fn: Callable[..., object], *args: object) -> object:
        return await trio.to_thread.run_sync(fn, *args, limiter=limiter)

    return run_sync


@asynccontextmanager
async def serving(log_dir: Path, manager: LogManager) -> AsyncIterator[Path]:
    async with trio.open_nursery() as nursery:
        path = await nursery.start(partial(serve, log_dir, manager, _bridge()))
        yield path
        nursery.cancel_scope.cancel()


async def call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return await trio.to_thread.run_sync(partial(fn, *args, **kwargs))


async def test_serve_binds_socket_and_removes_it_on_exit(log_dir: Path, clock: ManualClock) -> None:
    with LogManager.open(log_dir, clock=clock) as manager:
        async with serving(log_dir, manager) as path:
            assert path == log_dir / control.SOCKET_NAME
            assert stat.S_ISSOCK(path.stat().st_mode)
            assert await call(control.daemon_socket, log_dir) == path
            assert await call(control.request, log_dir, "ping") == "pong"
        assert not path.exists()
        assert control.daemon_socket(log_dir) is None


async def test_stale_socket_is_not_a_daemon_and_is_replaced(
    log_dir: Path, clock: ManualClock
) -> None:
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(log_dir / control.SOCKET_NAME))
    stale.close()  # the file stays, nobody listens: a killed daemon's leftover
    assert (log_dir / control.SOCKET_NAME).exists()
    assert control.daemon_socket(log_dir) is None
    with LogManager.open(log_dir, clock=clock) as manager:
        async with serving(log_dir, manager):
            assert await call(control.request, log_dir, "ping") == "pong"


async def test_admin_ops_act_on_the_manager(log_dir: Path, clock: ManualClock) -> None:
    with LogManager.open(log_dir, clock=clock) as manager:
        async with serving(log_dir, manager):
            created = await call(
                control.request,
                log_dir,
                "create_topic",
                name="orders",
                partitions=3,
                config={"retention.ms": "1000"},
                format="lines",
                key_separator=":",
            )
            assert created["partitions"] == 3
            assert manager.topic("orders").key_separator == ":"
            assert await call(control.request, log_dir, "list_topics") == ["orders"]
            overrides = await call(
                control.request,
                log_dir,
                "alter_topic",
                name="orders",
                set={"segment.bytes": "100000"},
                delete=["retention.ms"],
            )
            assert overrides == {"segment.bytes": "100000"}
            assert manager.topic_config("orders").segment_bytes == 100000
            described = await call(control.request, log_dir, "describe_topic", name="orders")
            assert [p["partition"] for p in described["partition_states"]] == [0, 1, 2]
            assert await call(control.request, log_dir, "delete_topic", name="orders") is None
            assert manager.topics() == []


@pytest.mark.parametrize(
    ("op", "args", "kind"),
    [
        ("create_topic", {"name": "a b"}, "InvalidTopicError"),
        ("create_topic", {"name": "t", "config": {"no.such.key": "1"}}, "ConfigError"),
        ("create_topic", {"name": "t", "format": "raw", "key_separator": ":"}, "ConfigError"),
        ("delete_topic", {"name": "missing"}, "UnknownTopicError"),
        ("alter_topic", {"name": "missing", "set": {"retention.ms": "1"}}, "UnknownTopicError"),
        ("no_such_op", {}, "ProtocolError"),
        ("create_topic", {"name": 5}, "ProtocolError"),
    ],
)
async def test_errors_carry_the_engine_error_class(
    log_dir: Path, clock: ManualClock, op: str, args: dict[str, object], kind: str
) -> None:
    with LogManager.open(log_dir, clock=clock) as manager:
        async with serving(log_dir, manager):
            with pytest.raises(control.ControlError) as caught:
                await call(control.request, log_dir, op, **args)
            assert caught.value.kind == kind
            assert caught.value.message
            # The server survives a refused request.
            assert await call(control.request, log_dir, "ping") == "pong"


async def test_existing_topic_error_matches_the_engine_message(
    log_dir: Path, clock: ManualClock
) -> None:
    with LogManager.open(log_dir, clock=clock) as manager:
        manager.create_topic("t", 1)
        try:
            manager.create_topic("t", 1)
        except Exception as exc:
            direct = str(exc)
        async with serving(log_dir, manager):
            with pytest.raises(control.ControlError) as caught:
                await call(control.request, log_dir, "create_topic", name="t", partitions=1)
    assert caught.value.kind == "TopicExistsError"
    assert caught.value.message == direct


async def test_produce_partitions_like_kafka_and_keeps_every_field(
    log_dir: Path, clock: ManualClock
) -> None:
    with LogManager.open(log_dir, clock=clock) as manager:
        manager.create_topic("t", 4)
        keys = [f"key-{i}".encode() for i in range(40)]
        records = [
            (key, b"v" + key, [("h", b"x"), ("n", None)], 1_600_000_000_000 + i)
            for i, key in enumerate(keys)
        ]
        async with serving(log_dir, manager):
            written = await call(control.produce, log_dir, "t", records)
        expected: dict[int, list[bytes]] = {}
        for key in keys:
            expected.setdefault(partition_for_key(key, 4), []).append(key)
        assert [p for p, _first, _last in written] == sorted(expected)
        for p, first, last in written:
            assert (first, last) == (0, len(expected[p]) - 1)
            got = list(manager.log("t", p).records(0))
            assert [r.key for r in got] == expected[p]
            assert [r.value for r in got] == [b"v" + k for k in expected[p]]
            assert all(r.headers == (("h", b"x"), ("n", None)) for r in got)
            assert [r.timestamp for r in got] == [
                1_600_000_000_000 + keys.index(k) for k in expected[p]
            ]


async def test_produce_without_timestamps_uses_the_daemon_clock(
    log_dir: Path, clock: ManualClock
) -> None:
    with LogManager.open(log_dir, clock=clock) as manager:
        manager.create_topic("t", 1)
        async with serving(log_dir, manager):
            written = await call(
                control.produce, log_dir, "t", [(None, b"a", (), None), (None, None, (), None)]
            )
        assert written == [(0, 0, 1)]
        got = list(manager.log("t", 0).records(0))
        assert [(r.key, r.value, r.timestamp) for r in got] == [
            (None, b"a", clock.now_ms),
            (None, None, clock.now_ms),
        ]


async def test_keyless_produce_calls_spread_over_partitions(
    log_dir: Path, clock: ManualClock
) -> None:
    with LogManager.open(log_dir, clock=clock) as manager:
        manager.create_topic("t", 3)
        async with serving(log_dir, manager):
            partitions = set()
            for i in range(6):
                written = await call(control.produce, log_dir, "t", [(None, b"%d" % i, (), None)])
                assert len(written) == 1
                partitions.add(written[0][0])
        # The sticky partitioner moves on after each call: never twice in a row.
        assert len(partitions) >= 2


async def test_produce_matches_the_direct_path(
    tmp_path: Path, log_dir: Path, clock: ManualClock
) -> None:
    records = [(b"k%d" % (i % 5), b"value %d" % i, (), 1_700_000_000_000) for i in range(50)]
    other = tmp_path / "direct"
    with LogManager.open(other, clock=clock) as direct:
        direct.create_topic("t", 3)
        expected = append_records(
            direct,
            "t",
            [r[1] for r in records],
            keys=[r[0] for r in records],
            timestamps=[r[3] for r in records],
            partitioner=StickyPartitioner(3),
        )
        direct_logs = {p: list(direct.log("t", p).records(0)) for p in range(3)}
    with LogManager.open(log_dir, clock=clock) as manager:
        manager.create_topic("t", 3)
        async with serving(log_dir, manager):
            written = await call(control.produce, log_dir, "t", records)
        assert written == expected
        assert {p: list(manager.log("t", p).records(0)) for p in range(3)} == direct_logs


async def test_produce_errors(log_dir: Path, clock: ManualClock) -> None:
    with LogManager.open(log_dir, clock=clock) as manager:
        manager.create_topic("t", 2, {"max.message.bytes": "1000"})
        async with serving(log_dir, manager):
            with pytest.raises(control.ControlError) as caught:
                await call(control.produce, log_dir, "missing", [(None, b"x", (), None)])
            assert caught.value.kind == "UnknownTopicError"
            with pytest.raises(control.ControlError) as caught:
                await call(control.produce, log_dir, "t", [(None, b"x", (), None)], partition=2)
            assert caught.value.kind == "UnknownTopicError"
            assert "t-2" in caught.value.message
            with pytest.raises(control.ControlError) as caught:
                await call(control.produce, log_dir, "t", [(None, b"x" * 2000, (), None)])
            assert caught.value.kind == "RecordTooLargeError"
        assert all(manager.log("t", p).log_end_offset == 0 for p in range(2))


async def test_concurrent_producers_get_distinct_contiguous_offsets(
    log_dir: Path, clock: ManualClock
) -> None:
    with LogManager.open(log_dir, clock=clock) as manager:
        manager.create_topic("t", 1)
        results: list[tuple[int, int, int]] = []

        async def producer(n: int) -> None:
            for i in range(20):
                written = await call(
                    control.produce, log_dir, "t", [(None, b"%d-%d" % (n, i), (), None)] * 5
                )
                results.extend(written)

        async with serving(log_dir, manager), trio.open_nursery() as nursery:
            for n in range(4):
                nursery.start_soon(producer, n)
        ranges = sorted((first, last) for _p, first, last in results)
        assert len(ranges) == 80
        assert all(last - first == 4 for first, last in ranges)
        assert [first for first, _ in ranges] == list(range(0, 400, 5))
        assert manager.log("t", 0).log_end_offset == 400


async def test_long_log_dir_path_is_reached_through_proc(
    tmp_path: Path, clock: ManualClock
) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    assert len(str(deep / control.SOCKET_NAME)) > 108
    with LogManager.open(deep, clock=clock) as manager:
        async with serving(deep, manager) as path:
            assert path.exists()
            assert await call(control.daemon_socket, deep) == path
            assert await call(control.request, deep, "ping") == "pong"


async def test_cli_in_a_subprocess_goes_through_the_daemon(
    log_dir: Path, clock: ManualClock
) -> None:
    env = {**os.environ, "SEGLOG_LOG_DIR": str(log_dir)}

    async def seglogfs(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
        return await trio.run_process(
            [str(SCRIPT), *args],
            stdin=stdin,
            capture_stdout=True,
            capture_stderr=True,
            env=env,
            check=False,
        )

    with LogManager.open(log_dir, clock=clock) as manager:
        # This test holds the writer lock: a CLI that opened the directory itself
        # would fail with LogDirLockedError; success means it went through the socket.
        with pytest.raises(LogDirLockedError):
            LogManager.open(log_dir)
        async with serving(log_dir, manager):
            created = await seglogfs("topics", "create", "orders", "--partitions", "2")
            assert (created.returncode, created.stdout) == (0, b"Created topic orders.\n")
            assert manager.topic("orders").partitions == 2
            again = await seglogfs("topics", "create", "orders")
            assert again.returncode == 1
            assert strip_build_notice(again.stderr) == (
                b"seglogfs topics create: error: topic 'orders' already exists\n"
            )
            quiet = await seglogfs("topics", "create", "orders", "--if-not-exists")
            assert (quiet.returncode, quiet.stdout) == (0, b"")
            produced = await seglogfs("produce", "orders", "-p", "1", stdin=b"one\ntwo\nthree\n")
            assert produced.returncode == 0, produced.stderr
            assert [r.value for r in manager.log("orders", 1).records(0)] == [
                b"one",
                b"two",
                b"three",
            ]
            keyed = await seglogfs("produce", "orders", "-K", ":", stdin=b"a:1\nb:2\n")
            assert keyed.returncode == 0, keyed.stderr
            for key in (b"a", b"b"):
                log = manager.log("orders", partition_for_key(key, 2))
                assert key in [r.key for r in log.records(0)]
            altered = await seglogfs("topics", "alter", "orders", "--add-config", "retention.ms=5")
            assert altered.returncode == 0, altered.stderr
            assert manager.topic("orders").overrides == {"retention.ms": "5"}
            bad = await seglogfs("topics", "alter", "orders", "--add-config", "nope=1")
            assert bad.returncode == 2
            assert b"nope" in bad.stderr
            assert b"Traceback" not in bad.stderr
            # A read-only command works beside the daemon, directly on the files.
            consumed = await seglogfs("consume", "orders", "-p", "1")
            assert consumed.stdout == b"one\ntwo\nthree\n"
            deleted = await seglogfs("topics", "delete", "orders")
            assert deleted.returncode == 0, deleted.stderr
            assert manager.topics() == []


async def test_produce_error_is_the_same_with_and_without_the_daemon(
    tmp_path: Path, log_dir: Path, clock: ManualClock
) -> None:
    small = b"s" * 99 + b"\n"
    # From a file, not a pipe: reads then return whole 256-KiB blocks, so both runs
    # append the same blocks before the failing one (a pipe's timing would decide).
    source = tmp_path / "input"
    source.write_bytes(small * 3000 + b"L" * 5000 + b"\n" + small * 10)
    direct_dir = tmp_path / "direct"
    with LogManager.open(direct_dir, clock=clock) as manager:
        manager.create_topic("t", 1, {"max.message.bytes": "4000"})
    stdin = os.open(source, os.O_RDONLY)
    try:
        direct = await trio.run_process(
            [str(SCRIPT), "produce", "t", "-d", str(direct_dir)],
            stdin=stdin,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    finally:
        os.close(stdin)
    with LogManager.open(log_dir, clock=clock) as manager:
        manager.create_topic("t", 1, {"max.message.bytes": "4000"})
        async with serving(log_dir, manager):
            stdin = os.open(source, os.O_RDONLY)
            try:
                through = await trio.run_process(
                    [str(SCRIPT), "produce", "t", "-d", str(log_dir)],
                    stdin=stdin,
                    capture_stdout=True,
                    capture_stderr=True,
                    check=False,
                )
            finally:
                os.close(stdin)
        daemon_values = [r.value for r in manager.log("t", 0).records(0)]
    with LogManager.open(direct_dir, read_only=True) as manager:
        direct_values = [r.value for r in manager.log("t", 0).records(0)]
    assert direct.returncode == through.returncode == 1
    assert strip_build_notice(through.stderr) == strip_build_notice(direct.stderr)
    assert b"record(s) were appended before the error" in direct.stderr
    assert 0 < len(daemon_values) == len(direct_values) < 3000
    assert daemon_values == direct_values


def _raw_exchange(path: Path, frame: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(path))
        sock.sendall(frame)
        sock.shutdown(socket.SHUT_WR)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
        return received


async def test_malformed_frames_never_stop_the_server(log_dir: Path, clock: ManualClock) -> None:
    with LogManager.open(log_dir, clock=clock) as manager:
        async with serving(log_dir, manager) as path:
            not_json = struct.pack(">IQ", 5, 0) + b"{oops"
            reply = await call(_raw_exchange, path, not_json)
            length = struct.unpack_from(">I", reply)[0]
            header = json.loads(reply[12 : 12 + length])
            assert header["ok"] is False
            assert header["kind"] == "ProtocolError"
            # A frame claiming gigabytes is refused before it is read, and closed.
            reply = await call(_raw_exchange, path, struct.pack(">IQ", 1 << 30, 0))
            header = json.loads(reply[12 : 12 + struct.unpack_from(">I", reply)[0]])
            assert header["kind"] == "ProtocolError"
            assert "exceeds 4194304" in header["message"]
            # A client gone mid-frame leaves nothing behind.
            assert await call(_raw_exchange, path, struct.pack(">IQ", 100, 0) + b"{") == b""
            bad_payload = json.dumps({"op": "produce", "args": {"topic": "t"}}).encode()
            frame = struct.pack(">IQ", len(bad_payload), 3) + bad_payload + b"xyz"
            reply = await call(_raw_exchange, path, frame)
            header = json.loads(reply[12 : 12 + struct.unpack_from(">I", reply)[0]])
            assert header["ok"] is False
            assert await call(control.request, log_dir, "ping") == "pong"

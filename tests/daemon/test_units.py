"""The daemon's small pure parts: the errno table, sd_notify, view names, line splitting."""

from __future__ import annotations

import errno
import itertools
import os
import platform
import socket
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seglogfs.daemon import sd_notify
from seglogfs.daemon.errno_map import errno_for
from seglogfs.daemon.lines import (
    LineBuffer,
    RecordLimit,
    append_lines,
    batch_estimate,
    line_chunks,
    split_lines,
)
from seglogfs.daemon.mount import MALLOC_TUNING_ENV, tune_malloc
from seglogfs.daemon.views import ViewName, parse_view_name
from seglogfs.positions import position_index_spec
from storage import (
    CompressionType,
    ConfigError,
    CorruptRecordError,
    InvalidTopicError,
    LogManager,
    OffsetOutOfRangeError,
    ReadOnlyLogError,
    RecordTooLargeError,
    StorageError,
    TopicExistsError,
    UnknownTopicError,
)


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (UnknownTopicError("t"), errno.ENOENT),
        (UnknownTopicError("t", 3), errno.ENOENT),
        (TopicExistsError("t"), errno.EEXIST),
        (InvalidTopicError("a b", "bad"), errno.EINVAL),
        (ConfigError("retention.ms", "x", "bad"), errno.EINVAL),
        (RecordTooLargeError(10, 5), errno.EFBIG),
        (ReadOnlyLogError("ro"), errno.EROFS),
        (OffsetOutOfRangeError(9, 0, 5), errno.ENOENT),
        (CorruptRecordError("crc"), errno.EIO),
        (StorageError("other"), errno.EIO),
        (OSError(errno.ENOSPC, "full"), errno.ENOSPC),
        (OSError("no errno"), errno.EIO),
    ],
)
def test_errno_for_engine_errors(error: BaseException, code: int) -> None:
    assert errno_for(error) == code


def test_errno_for_unknown_error_is_none() -> None:
    assert errno_for(RuntimeError("bug")) is None
    assert errno_for(KeyError("bug")) is None


def test_sd_notify_sends_datagrams(tmp_path: Path) -> None:
    path = tmp_path / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind(str(path))
        env = {"NOTIFY_SOCKET": str(path)}
        assert sd_notify.notify("READY=1", env)
        assert sd_notify.notify("STOPPING=1", env)
        assert server.recv(100) == b"READY=1"
        assert server.recv(100) == b"STOPPING=1"


def test_sd_notify_abstract_socket() -> None:
    name = f"seglogfs-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind(b"\0" + name.encode())
        assert sd_notify.notify("WATCHDOG=1", {"NOTIFY_SOCKET": "@" + name})
        assert server.recv(100) == b"WATCHDOG=1"


def test_sd_notify_without_socket_does_nothing(tmp_path: Path) -> None:
    assert not sd_notify.notify("READY=1", {})
    assert not sd_notify.notify("READY=1", {"NOTIFY_SOCKET": str(tmp_path / "absent")})


def test_watchdog_interval_is_half_of_watchdog_usec() -> None:
    env = {"NOTIFY_SOCKET": "/x", "WATCHDOG_USEC": "4000000"}
    assert sd_notify.watchdog_interval(env) == 2.0
    assert sd_notify.watchdog_interval({**env, "WATCHDOG_PID": str(os.getpid())}) == 2.0
    assert sd_notify.watchdog_interval({**env, "WATCHDOG_PID": "1"}) is None
    assert sd_notify.watchdog_interval({"WATCHDOG_USEC": "4000000"}) is None
    assert sd_notify.watchdog_interval({**env, "WATCHDOG_USEC": "0"}) is None


@pytest.mark.parametrize(
    "variable", [MALLOC_TUNING_ENV, "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES"]
)
def test_malloc_tuning_can_be_turned_off(monkeypatch: pytest.MonkeyPatch, variable: str) -> None:
    # SEGLOG_MALLOC_TUNING=0 turns it off; glibc settings of the user's own win.
    monkeypatch.setenv(variable, "0" if variable == MALLOC_TUNING_ENV else "1048576")
    assert tune_malloc() is False


def test_malloc_tuning_applies_on_glibc(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (MALLOC_TUNING_ENV, "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    # mallopt refuses values out of its range (returns 0): the thresholds must be valid.
    assert tune_malloc() is (platform.libc_ver()[0] == "glibc")


def test_view_names() -> None:
    assert parse_view_name("0@earliest") == ViewName(0, named="earliest")
    assert parse_view_name("2@latest") == ViewName(2, named="latest")
    assert parse_view_name("0@-10") == ViewName(0, last=10)
    assert parse_view_name("1@1234") == ViewName(1, offset=1234)
    assert parse_view_name("0@1700000000000") == ViewName(0, timestamp=1_700_000_000_000)
    moment = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
    millis = int(moment.timestamp() * 1000)
    assert parse_view_name("0@2026-11-22T10:00:00Z") == ViewName(0, timestamp=millis)
    assert parse_view_name("0@2026-11-22T10:00:00") == ViewName(0, timestamp=millis)
    assert parse_view_name("0@2026-11-22T11:00:00+01:00") == ViewName(0, timestamp=millis)
    assert parse_view_name(f"0@{2**63 - 1}") == ViewName(0, timestamp=2**63 - 1)
    assert parse_view_name(f"0@-{'0' * 5000}7") == ViewName(0, last=7)
    past_a_long = [f"0@{2**63}", f"0@-{2**63}", "0@" + "9" * 5000, "0@-" + "9" * 5000]
    for bad in ["0", "0@", "@1", "00@1", "0@x", "0@-", "0@--1", "a@1", "0@1.5", "0@١٢", "0@+1"]:
        assert parse_view_name(bad) is None, bad
    for bad in past_a_long:
        assert parse_view_name(bad) is None, bad[:30]


def test_split_lines_with_and_without_separator() -> None:
    assert split_lines(b"a\n\nb c\n", None) == ([b"a", b"", b"b c"], None)
    values, keys = split_lines(b"k:v\nnokey\n:empty key\nk2:\n", b":")
    assert values == [b"v", b"nokey", b"empty key", b""]
    assert keys == [b"k", None, b"", b"k2"]


def test_line_buffer_keeps_partial_lines() -> None:
    buffer = LineBuffer()
    limit = RecordLimit(200, CompressionType.NONE, None)
    assert buffer.split(b"abc", limit) == (b"", b"abc")
    buffer.commit(b"abc")
    assert buffer.split(b"def\ngh", limit) == (b"abcdef\n", b"gh")
    buffer.commit(b"gh")
    assert buffer.split(b"\n", limit) == (b"gh\n", b"")
    assert buffer.completed() == b"gh\n"
    buffer.commit(b"")
    assert buffer.completed() == b""
    # The partial line must fit one record: a 200-byte batch holds 130 bytes of value.
    assert buffer.split(b"x" * 130, limit) == (b"", b"x" * 130)
    with pytest.raises(RecordTooLargeError):
        buffer.split(b"x" * 131, limit)
    assert buffer.pending == b""


def test_line_chunks_fit_the_batch_limit_and_cut_at_line_ends() -> None:
    data = b"".join(b"%d %s\n" % (i, b"v" * (i % 150)) for i in range(5000))
    assert line_chunks(data, 10 << 20) == [data]
    chunks = line_chunks(data, 20_000)
    assert len(chunks) > 10
    assert b"".join(chunks) == data
    for chunk in chunks:
        assert chunk.endswith(b"\n")
        assert batch_estimate(len(chunk), chunk.count(b"\n")) <= 20_000 * 1.1


@settings(max_examples=60, deadline=None)
@given(
    lines=st.lists(st.binary(max_size=300).filter(lambda b: b"\n" not in b), max_size=60),
    cuts=st.lists(st.integers(0, 20000), max_size=30),
    limit=st.sampled_from([1200, 5000, 1 << 20]),
)
def test_any_chunking_of_writes_gives_one_record_per_line(
    tmp_path_factory: pytest.TempPathFactory, lines: list[bytes], cuts: list[int], limit: int
) -> None:
    data = b"".join(line + b"\n" for line in lines)
    with LogManager.open(tmp_path_factory.mktemp("logs"), extension=position_index_spec) as m:
        m.create_topic("t", 1, {"max.message.bytes": str(limit)})
        log = m.log("t", 0)
        buffer = LineBuffer()
        record_limit = RecordLimit(limit, CompressionType.NONE, None)
        bounds = sorted({0, len(data), *(c for c in cuts if c < len(data))})
        for lo, hi in itertools.pairwise(bounds):
            complete, tail = buffer.split(data[lo:hi], record_limit)
            if complete:
                appended, _infos = append_lines(log, complete, None)
                assert appended == len(complete)
            buffer.commit(tail)
        assert buffer.completed() == b""  # the data ends with a newline
        assert [r.value for r in log.records(0)] == lines
        assert log.extension_end == len(data)
        assert all(b.size <= limit for b in log.batches(0))

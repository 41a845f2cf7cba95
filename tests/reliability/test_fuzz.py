"""Fuzzing: malformed input gets the documented error, never another exception or a hang.

Each target is fed inputs from a seeded generator: valid inputs mutated (bytes flipped,
set, inserted, cut; length-like fields set to extremes) and arbitrary ones. A target
may return or raise its documented errors (``storage.StorageError`` for the engine);
anything else is a failure, and so is an input that takes longer than ``SLOW_S``. The
CI run tries ``CI_INPUTS`` batches (and fewer of the costlier targets); ``pytest -m
long`` tries ``LONG_INPUTS`` (10^6) batches. Each test prints how many inputs it tried.

Targets: record batches of every codec and both legacy formats through the parser,
the decoders and the broker-side validation of client batches; segment files holding
mutated batches opened and read through a log; ``.properties`` text; view names;
control-socket frames (random, mutated from a valid request of every op, extreme
lengths, arguments of the wrong shape, deep nesting) against a real server, which must
answer each with a well-formed reply or close, never log a traceback, and keep serving;
``user.seglog.*`` xattr values set and removed on a real mount (a documented errno or
success, never ``EIO``, the mount answering, no ERROR line); Spark option maps planning
batch and streaming reads and a write (the source's ``SeglogSparkError`` or the
engine's errors: it found an ``OSError`` for a path too long, now ``OptionError``);
``seglogfs`` argument lists (exit 0, 1 or 2, never a traceback).
"""

from __future__ import annotations

import collections
import contextlib
import errno
import io
import json
import logging
import os
import random
import socket
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import pytest
import trio
from kafka.record.legacy_records import LegacyRecordBatchBuilder

from seglogfs.control import SOCKET_NAME
from seglogfs.control import request as control_request
from seglogfs.control.config import ControlConfig
from seglogfs.control.protocol import FRAME, OPS, encode_records, frame
from seglogfs.control.server import serve
from seglogfs.daemon.views import parse_view_name
from storage import (
    CompressionType,
    LogManager,
    StorageError,
    build_record_batch,
    iter_batches,
    parse_properties,
)
from storage.record.record_batch import validate_client_batch
from tests.daemon.conftest import Mount, is_mounted, needs_fuse

CI_INPUTS = 20_000
LONG_INPUTS = 1_000_000
SLOW_S = 1.0
SEED = 20261125

EXTREMES = (b"\xff\xff\xff\xff", b"\x7f\xff\xff\xff", b"\x00\x00\x00\x00", b"\x80\x00\x00\x00")


def seed_batches(rng: random.Random) -> list[bytes]:
    """Valid batches: v2 in every codec (keys, headers, nulls, one timestamp per
    record), a control batch, and legacy v0/v1 plain and compressed message sets."""
    seeds = []
    for codec in CompressionType:
        for n in (1, 7, 60):
            values = [b"value %d " % i * rng.randint(1, 20) for i in range(n)]
            seeds.append(
                build_record_batch(
                    values,
                    keys=[b"k%d" % i for i in range(n)],
                    headers=[[("h", b"x"), ("n", None)]] * n,
                    timestamps=1_700_000_000_000,
                    codec=codec,
                    base_offset=rng.randint(0, 1 << 40),
                )
            )
            seeds.append(
                build_record_batch(
                    [None if i % 3 == 0 else b"v" * i for i in range(n)],
                    timestamps=[1_700_000_000_000 + i for i in range(n)],
                    codec=codec,
                )
            )
    seeds.append(
        build_record_batch(
            [b""], keys=[b"\x00\x00\x00\x01"], timestamps=1_700_000_000_000, is_control=True
        )
    )
    for magic in (0, 1):
        for legacy_codec in (0, 1, 2, 3):
            builder = LegacyRecordBatchBuilder(magic, legacy_codec, batch_size=1 << 30)
            for i in range(5):
                builder.append(i, timestamp=1_700_000_000_000 + i, key=b"k", value=b"v%d" % i)
            seeds.append(bytes(builder.build()))
    return seeds


def mutate(rng: random.Random, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(6)
        if op == 0 and out:
            out[rng.randrange(len(out))] = rng.randrange(256)
        elif op == 1 and out:
            del out[rng.randrange(len(out)) :]
        elif op == 2:
            at = rng.randrange(len(out) + 1)
            out[at:at] = rng.randbytes(rng.randint(1, 8))
        elif op == 3 and len(out) > 8:
            at = rng.randrange(len(out) - 4)
            out[at : at + 4] = rng.choice(EXTREMES)
        elif op == 4 and out:
            out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
        elif op == 5 and out:
            at = rng.randrange(len(out))
            del out[at : at + rng.randint(1, 16)]
    return bytes(out)


def batch_inputs(rng: random.Random, count: int) -> Iterator[bytes]:
    seeds = seed_batches(rng)
    for i in range(count):
        if i % 20 == 0:
            yield rng.randbytes(rng.randint(0, 200))
        elif i % 20 == 1:
            # Two batches back to back, the second mutated: the parser must walk on.
            yield rng.choice(seeds) + mutate(rng, rng.choice(seeds))
        else:
            yield mutate(rng, rng.choice(seeds))


def parse_every_way(data: bytes) -> None:
    for batch in iter_batches(data):
        batch.is_valid()
        batch.records()
        batch.columns()
        batch.packed_columns(0, 1 << 62)
        with contextlib.suppress(StorageError):
            validate_client_batch(batch, 1 << 20)


def run_target(
    name: str, inputs: Iterator[object], target: Callable[[object], object]
) -> tuple[int, float]:
    """Feed every input; fail on an undocumented exception or a slow input. Returns
    (inputs tried, slowest seconds)."""
    tried = 0
    slowest = 0.0
    for value in inputs:
        started = time.perf_counter()
        try:
            target(value)
        except StorageError:
            pass
        except Exception as exc:
            raise AssertionError(f"{name}: {type(exc).__name__} for input {value!r:.300}") from exc
        took = time.perf_counter() - started
        slowest = max(slowest, took)
        assert took < SLOW_S, f"{name}: {took:.2f} s for input {value!r:.300}"
        tried += 1
    print(f"{name}: {tried:,} inputs, slowest {slowest * 1000:.1f} ms")
    return tried, slowest


def _batches(count: int) -> None:
    rng = random.Random(SEED)
    tried, _ = run_target("record batches", batch_inputs(rng, count), parse_every_way)  # type: ignore[arg-type]
    assert tried == count


def test_fuzz_record_batches() -> None:
    _batches(CI_INPUTS)


@pytest.mark.long
@pytest.mark.timeout(7200)
def test_fuzz_record_batches_long() -> None:
    _batches(LONG_INPUTS)


def _segments(tmp_path: Path, count: int) -> None:
    """Mutated batches as the last segment of a log: opening it (recovery truncates a
    bad tail) and reading it back give records or the documented errors."""
    rng = random.Random(SEED + 1)
    seeds = seed_batches(rng)
    inputs = iter(range(count))

    def open_and_read(i: object) -> None:
        log_dir = tmp_path / f"d{i}"
        partition = log_dir / "t-0"
        partition.mkdir(parents=True)
        good = build_record_batch([b"a", b"b"], timestamps=1_700_000_000_000)
        (partition / "00000000000000000000.log").write_bytes(good + mutate(rng, rng.choice(seeds)))
        for read_only in (True, False):
            with LogManager.open(log_dir, read_only=read_only) as manager:
                log = manager.log("t", 0)
                for _record in log.records(log.log_start_offset):
                    pass

    run_target("segment files", inputs, open_and_read)


def test_fuzz_segment_files(tmp_path: Path) -> None:
    _segments(tmp_path, 300)


@pytest.mark.long
@pytest.mark.timeout(7200)
def test_fuzz_segment_files_long(tmp_path: Path) -> None:
    _segments(tmp_path, 20_000)


def properties_inputs(rng: random.Random, count: int) -> Iterator[str]:
    alphabet = "ab=:# \t\\\r\nu0123456789éx!\f"
    valid = "log.segment.bytes=1024\nlog.retention.ms : 5\\\n  00\nkey\\ with\\:colon=v\\u00e9\n"
    for i in range(count):
        if i % 2:
            yield "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))
        else:
            text = list(valid)
            for _ in range(rng.randint(1, 4)):
                text.insert(rng.randrange(len(text) + 1), rng.choice(alphabet))
            yield "".join(text)


def test_fuzz_properties() -> None:
    rng = random.Random(SEED + 2)
    run_target("properties", properties_inputs(rng, CI_INPUTS), parse_properties)  # type: ignore[arg-type]


def view_inputs(rng: random.Random, count: int) -> Iterator[str]:
    wheres = ["earliest", "latest", "-10", "5", "1700000000000", "2026-11-22T10:00:00Z"]
    for i in range(count):
        if i % 4 == 0:
            digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 6000)))
            yield f"0@{rng.choice(['', '-'])}{digits}"
        elif i % 4 == 1:
            yield "".join(rng.choice("0123456789@-:TZ+.e") for _ in range(rng.randint(0, 40)))
        else:
            where = list(rng.choice(wheres))
            for _ in range(rng.randint(0, 3)):
                where.insert(rng.randrange(len(where) + 1), rng.choice("0@-:TZ+9x"))
            yield f"{rng.choice(['0', '1', '00', '4294967296'])}@{''.join(where)}"


def test_fuzz_view_names() -> None:
    rng = random.Random(SEED + 3)
    run_target("view names", view_inputs(rng, 5_000), parse_view_name)  # type: ignore[arg-type]


# -- control-socket frames ------------------------------------------------------------

_CONTROL_OK_KINDS = {"ProtocolError", "OSError"}
"""Error kinds a reply may carry besides the engine's own error classes; never
``InternalError`` (an exception the server did not expect)."""


def control_seed_frames() -> list[bytes]:
    """A valid request of every op (produce with its record batch)."""
    payload = encode_records([(b"k", b"v" * 30, [("h", b"x")], None), (None, b"w", [], 5)])
    requests: list[tuple[dict[str, object], bytes]] = [
        ({"op": "ping", "args": {}}, b""),
        ({"op": "list_topics", "args": {}}, b""),
        ({"op": "create_topic", "args": {"name": "n", "config": {"retention.ms": "9"}}}, b""),
        ({"op": "alter_topic", "args": {"name": "t", "set": {"segment.bytes": "999999"}}}, b""),
        ({"op": "alter_topic", "args": {"name": "t", "delete": ["retention.ms"]}}, b""),
        ({"op": "describe_topic", "args": {"name": "t"}}, b""),
        ({"op": "delete_topic", "args": {"name": "gone"}}, b""),
        ({"op": "produce", "args": {"topic": "t", "partition": 0}}, payload),
        ({"op": "produce", "args": {"topic": "t"}}, payload),
        (
            {
                "op": "delete_records",
                "args": {"partitions": [{"topic": "t", "partition": 0, "offset": 1}]},
            },
            b"",
        ),
    ]
    return [frame(header, body) for header, body in requests]


def _json_value(rng: random.Random, depth: int = 0) -> object:
    kind = rng.randrange(9 if depth < 30 else 5)
    if kind == 0:
        return rng.choice([None, True, False])
    if kind == 1:
        return rng.choice([0, -1, 1 << 31, 1 << 63, -(1 << 63) - 1, 10**19, 2.5, 1e300])
    if kind == 2:
        return int("9" * rng.randint(1, 30))
    if kind == 3:
        return "".join(rng.choice('t-_.a[{"\\é0') for _ in range(rng.randint(0, 12)))
    if kind == 4:
        return rng.choice(["t", "n", "gone", "", "a" * 300, "retention.ms"])
    if kind in (5, 6):
        return [_json_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    keys = ["name", "partitions", "config", "topic", "partition", "offset", "set", "delete", "x"]
    return {rng.choice(keys): _json_value(rng, depth + 1) for _ in range(rng.randint(0, 3))}


def control_frame_inputs(rng: random.Random, count: int) -> Iterator[bytes]:
    seeds = control_seed_frames()
    ops = [*OPS, "nope"]
    for i in range(count):
        if i % 10 == 0:
            yield rng.randbytes(rng.randint(0, 64))
        elif i % 10 == 1:
            # Extreme lengths in the prefix, then a little of a frame.
            yield rng.choice(EXTREMES) + rng.choice(EXTREMES * 2) + rng.randbytes(8)
        elif i % 10 == 2:
            # Well-formed JSON of the wrong shape for a real op.
            args = _json_value(rng)
            yield frame({"op": rng.choice(ops), "args": args}, rng.choice([b"", rng.randbytes(70)]))
        elif i % 10 == 3:
            depth = rng.choice([15, 16, 17, 1000, 100_000])
            nested = b"[" * depth + b"]" * depth
            yield frame_bytes(b'{"op": "ping", "args": {"x": ' + nested + b"}}")
        else:
            yield mutate(rng, rng.choice(seeds))


def frame_bytes(header: bytes, payload: bytes = b"") -> bytes:
    return FRAME.pack(len(header), len(payload)) + header + payload


class _ServerErrors(logging.Handler):
    """The control server's log records that carry a traceback or an error."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.ERROR or record.exc_info:
            self.records.append(record)


@contextlib.contextmanager
def control_server(log_dir: Path) -> Iterator[Path]:
    """A real control server (``serve``) over a writable log directory, its trio loop
    in a thread of its own; cancelled when the block ends."""
    started = threading.Event()
    stopped: list[Callable[[], object]] = []

    async def main() -> None:
        async def run_sync(fn: Callable[..., object], *args: object) -> object:
            return await trio.to_thread.run_sync(fn, *args)

        with LogManager.open(log_dir) as manager:
            manager.create_topic("t", 2, {})
            async with trio.open_nursery() as nursery:
                config = ControlConfig(control_frame_timeout_ms=2000)
                await nursery.start(partial(serve, log_dir, manager, run_sync, config=config))
                token = trio.lowlevel.current_trio_token()
                stopped.append(lambda: token.run_sync_soon(nursery.cancel_scope.cancel))
                started.set()

    thread = threading.Thread(target=trio.run, args=(main,), daemon=True)
    thread.start()
    assert started.wait(30), "the control server did not start"
    try:
        yield log_dir / SOCKET_NAME
    finally:
        stopped[0]()
        thread.join(30)


def _control_exchange(path: Path, data: bytes) -> None:
    """Send ``data`` and end the connection's sending side; every reply until the
    server closes must be a well-formed frame with a documented answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(path))
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        received = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(1 << 16):
                received += chunk
    while received:
        header_length, payload_length = FRAME.unpack_from(received)
        end = FRAME.size + header_length + payload_length
        assert len(received) >= end, f"a reply cut short: {received!r:.200}"
        reply = json.loads(received[FRAME.size : FRAME.size + header_length])
        if reply["ok"] is not True:
            kind = reply["kind"]
            assert kind in _CONTROL_OK_KINDS or kind.endswith("Error"), reply
            assert kind != "InternalError", reply
        received = received[end:]


def _control_frames(tmp_path: Path, count: int) -> None:
    rng = random.Random(SEED + 4)
    errors = _ServerErrors()
    server_logger = logging.getLogger("seglogfs.control.server")
    server_logger.addHandler(errors)
    try:
        with control_server(tmp_path / "logs") as path:

            def exchange(data: object) -> None:
                assert isinstance(data, bytes)
                _control_exchange(path, data)

            run_target("control frames", control_frame_inputs(rng, count), exchange)
            # The server still serves: a ping through the client.
            assert control_request(tmp_path / "logs", "ping") == "pong"
    finally:
        server_logger.removeHandler(errors)
    assert errors.records == [], [r.getMessage() for r in errors.records[:5]]


def test_fuzz_control_frames(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    _control_frames(tmp_path, 3_000)


@pytest.mark.long
@pytest.mark.timeout(7200)
def test_fuzz_control_frames_long(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    _control_frames(tmp_path, 100_000)


# -- xattr values through a mount ------------------------------------------------------

_XATTR_KEYS = (
    "segment.bytes",
    "retention.ms",
    "retention.bytes",
    "cleanup.policy",
    "min.cleanable.dirty.ratio",
    "max.message.bytes",
    "message.timestamp.type",
    "compression.type",
    "format",
    "key.separator",
    "partitions",
    "flush.messages",
    "index.interval.bytes",
    "nonsense",
)
_XATTR_ERRNOS = {
    errno.EINVAL,
    errno.ENODATA,
    errno.ENOTSUP,
    errno.EPERM,
    errno.E2BIG,
    errno.ERANGE,
    errno.ENOSPC,
}
"""What a refused ``setxattr``/``removexattr`` may say: never ``EIO`` (a handler
error), never a dead mount."""


def xattr_value(rng: random.Random) -> bytes:
    kind = rng.randrange(8)
    if kind == 0:
        return rng.randbytes(rng.randint(0, 40))
    if kind == 1:
        return str(rng.choice([0, -1, 1, 1 << 31, 1 << 63, -(1 << 63), 10**30])).encode()
    if kind == 2:
        return rng.choice([b"compact", b"delete", b"compact,delete", b"lines", b"raw", b"json"])
    if kind == 3:
        return rng.choice([b"", b" ", b"\x00", b"\xff\xfe", b"1e9", b"0.5", b"nan", b"-0"])
    if kind == 4:
        return b"9" * rng.randint(1, 5000)
    if kind == 5:
        return rng.choice([b"CreateTime", b"LogAppendTime", b"gzip", b"zstd", b"producer"])
    if kind == 6:
        return rng.choice([b":", b"\t", b"=>", b"\n", "é".encode(), b"ab" * 50])
    return str(rng.randint(-10, 10**7)).encode()


def _xattr_call(target: Path, key: str, value: bytes | None) -> int | None:
    """``setxattr`` (``removexattr`` when ``value`` is None); the errno of a refusal."""
    try:
        if value is None:
            os.removexattr(target, key)
        else:
            os.setxattr(target, key, value)
    except OSError as exc:
        return exc.errno
    return None


def _fuzz_xattrs(tmp_path: Path, count: int) -> None:
    """Random ``user.seglog.*`` values set and removed on topics and partition files of
    a real mount: each call succeeds or fails with a documented errno, the mount keeps
    answering, and the daemon logs no handler error."""
    rng = random.Random(SEED + 7)
    log_dir = tmp_path / "logs"
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    mount = Mount(log_dir, mountpoint, [], tmp_path / "daemon.log")
    mount.start()
    try:
        for name in ("a", "b"):
            (mountpoint / name).mkdir()
        with open(mountpoint / "a" / "0", "a") as f:
            f.write("k:v\n")
        tried = refused = 0
        started = time.monotonic()
        for i in range(count):
            topic = mountpoint / rng.choice(["a", "b"])
            target = topic if rng.random() < 0.8 else topic / "0"
            key = "user.seglog." + rng.choice(_XATTR_KEYS)
            value = None if rng.random() < 0.15 else xattr_value(rng)
            code = _xattr_call(target, key, value)
            assert code is None or code in _XATTR_ERRNOS, f"{key}={value!r:.80} on {target}: {code}"
            refused += code is not None
            tried += 1
            if i % 50 == 0:
                assert is_mounted(mountpoint)
                os.listdir(topic)  # the mount answers
        assert is_mounted(mountpoint)
        log = mount.log()
        assert "Traceback" not in log, log[-3000:]
        assert " ERROR " not in log, log[-3000:]
        took = time.monotonic() - started
        print(f"xattr values: {tried:,} inputs ({refused:,} refused), {took:.1f} s")
        assert 0 < refused < tried  # both outcomes were reached
    finally:
        assert mount.stop() == 0, mount.log()[-3000:]


@needs_fuse
def test_fuzz_xattr_values(tmp_path: Path) -> None:
    _fuzz_xattrs(tmp_path, 600)


@pytest.mark.long
@pytest.mark.timeout(3600)
@needs_fuse
def test_fuzz_xattr_values_long(tmp_path: Path) -> None:
    _fuzz_xattrs(tmp_path, 20_000)


# -- Spark options ----------------------------------------------------------------------

_SPARK_KEYS = (
    "path",
    "subscribe",
    "subscribePattern",
    "assign",
    "startingOffsets",
    "endingOffsets",
    "startingTimestamp",
    "endingTimestamp",
    "startingOffsetsByTimestamp",
    "endingOffsetsByTimestamp",
    "startingOffsetsByTimestampStrategy",
    "minPartitions",
    "maxOffsetsPerTrigger",
    "failOnDataLoss",
    "includeHeaders",
    "commitOffsets",
    "kafka.group.id",
    "topic",
    "txnAppId",
    "txnVersion",
    "auto.create.topics.enable",
)


def spark_option_value(rng: random.Random, log_dir: str) -> str:
    kind = rng.randrange(8)
    if kind == 0:
        return rng.choice(["earliest", "latest", "true", "false", "t", "t,u", "", " "])
    if kind == 1:
        return str(rng.choice([0, -1, -2, 1, 1 << 31, 1 << 63, 10**30]))
    if kind == 2:
        return json.dumps(_json_value(rng))
    if kind == 3:
        return rng.choice(['{"t": {"0": -2}}', '{"t": [0, 1]}', '{"t": {"0": 5}}', "{", "[1]"])
    if kind == 4:
        return rng.choice([log_dir, log_dir + "/nope", "/", "", "relative"])
    if kind == 5:
        return rng.choice(["t.*", "(", "[", "*", "a|b"])
    if kind == 6:
        return "".join(rng.choice('t{}[]":,0-9é\\') for _ in range(rng.randint(0, 20)))
    return rng.choice(["error", "latest", "LATEST", "1e3", "0x10", "NaN"])


def _fuzz_spark_options(tmp_path: Path, count: int) -> None:
    """Random option maps given to the data source: planning a batch and a streaming
    read and a write either works or fails with the source's documented errors
    (``SeglogSparkError``: ``OptionError``, ``SinkError``) or the engine's."""
    from pyspark.sql.types import BinaryType, StringType, StructField, StructType

    from seglogfs.spark.errors import SeglogSparkError
    from seglogfs.spark.source import SeglogDataSource

    log_dir = tmp_path / "logs"
    with LogManager.open(log_dir) as manager:
        manager.create_topic("t", 2)
        manager.log("t", 0).append([b"a", b"b"])
    rng = random.Random(SEED + 8)
    sink_schema = StructType(
        [StructField("value", BinaryType()), StructField("topic", StringType())]
    )

    def plan(options: object) -> None:
        assert isinstance(options, dict)
        source = SeglogDataSource(options)
        # Python's re warns (FutureWarning, once) of a subscribePattern whose meaning a
        # later Python may change ("[[": a nested set): a warning, not an error, as in
        # Java's regular expressions, which Kafka uses.
        with warnings.catch_warnings(), contextlib.suppress(SeglogSparkError):
            warnings.simplefilter("ignore", FutureWarning)
            schema = source.schema()
            reader = source.reader(schema)
            reader.partitions()
            source.streamReader(schema)
            source.writer(sink_schema, False)

    def inputs() -> Iterator[dict[str, str]]:
        for _ in range(count):
            options = {"path": str(log_dir), "subscribe": "t"} if rng.random() < 0.5 else {}
            for _ in range(rng.randint(0, 5)):
                options[rng.choice(_SPARK_KEYS)] = spark_option_value(rng, str(log_dir))
            yield options

    run_target("Spark options", inputs(), plan)


def test_fuzz_spark_options(tmp_path: Path) -> None:
    _fuzz_spark_options(tmp_path, 2_000)


@pytest.mark.long
@pytest.mark.timeout(3600)
def test_fuzz_spark_options_long(tmp_path: Path) -> None:
    _fuzz_spark_options(tmp_path, 100_000)


# -- command-line arguments ---------------------------------------------------------------

_CLI_WORDS = (
    "topics", "create", "list", "describe", "alter", "delete", "produce", "consume",
    "dump", "verify", "delete-records", "compact", "groups", "reset-offsets", "--help",
    "-d", "--partitions", "--config", "--add-config", "--delete-config", "--format",
    "--key-separator", "--if-not-exists", "--if-exists", "-p", "-o", "-c", "-e", "-K",
    "-g", "--reset", "--group", "--all-groups", "--to-offset", "--to-earliest",
    "--execute", "--offset-json-file", "--print-data-log", "-q", "--broker-config",
    "--version", "t", "u", "nope", "__consumer_offsets", "0", "-1", "3", "99999999999",
    "end", "beginning", "@2026-11-22T10:00:00Z", "@x", "retention.ms=5", "segment.bytes=0",
    "cleanup.policy=compact", "json", "raw", "lines", ":", "", "é", "a" * 300,
)  # fmt: skip


def _fuzz_cli(tmp_path: Path, count: int) -> None:
    """Random argument lists to ``seglogfs`` (no daemon; ``mount``, ``serve-kafka`` and
    ``--follow`` left out, which run until stopped): each exits 0, 1 or 2 with its
    messages on stderr, never a traceback or another exception."""
    from seglogfs.cli.main import main

    log_dir = tmp_path / "logs"
    with LogManager.open(log_dir) as manager:
        manager.create_topic("t", 2)
        manager.log("t", 0).append([b"a", b"b"])
    segment = str(log_dir / "t-0" / "00000000000000000000.log")
    paths = (str(log_dir), segment, str(tmp_path / "missing"), str(tmp_path))
    rng = random.Random(SEED + 9)
    codes: collections.Counter[int] = collections.Counter()

    def run(argv: object) -> None:
        assert isinstance(argv, list)
        with _standard_streams() as err:
            try:
                code = main(argv)
            except SystemExit as exc:  # argparse: --help, --version, usage errors
                code = exc.code if isinstance(exc.code, int) else 0
        message = err.getvalue().decode(errors="replace")
        assert code in (0, 1, 2), (argv, code, message[-500:])
        assert "Traceback" not in message, (argv, message[-2000:])
        codes[code] += 1

    def inputs() -> Iterator[list[str]]:
        for _ in range(count):
            argv = [rng.choice(_CLI_WORDS[:13])]
            for _ in range(rng.randint(0, 6)):
                argv.append(rng.choice(paths) if rng.random() < 0.2 else rng.choice(_CLI_WORDS))
            if rng.random() < 0.7:
                argv += ["-d", str(log_dir)]
            yield argv

    run_target("command lines", inputs(), run)
    print(f"command lines: exit codes {dict(sorted(codes.items()))}")
    assert set(codes) == {0, 1, 2}  # every outcome was reached


@contextlib.contextmanager
def _standard_streams() -> Iterator[io.BytesIO]:
    """The command's stdin empty, its stdout (which may carry any bytes: a record's
    value) and stderr captured as bytes; yields stderr's."""
    import sys

    saved = sys.stdin, sys.stdout, sys.stderr
    err = io.BytesIO()
    out = io.TextIOWrapper(io.BytesIO(), write_through=True)
    err_text = io.TextIOWrapper(err, write_through=True)
    with open(os.devnull) as stdin:
        sys.stdin, sys.stdout, sys.stderr = stdin, out, err_text
        try:
            yield err
        finally:
            sys.stdin, sys.stdout, sys.stderr = saved
            # Detached: a wrapper closes its buffer when it is collected.
            with contextlib.suppress(ValueError):
                err_text.flush()
            err_text.detach()


def test_fuzz_command_lines(tmp_path: Path) -> None:
    _fuzz_cli(tmp_path, 600)


@pytest.mark.long
@pytest.mark.timeout(3600)
def test_fuzz_command_lines_long(tmp_path: Path) -> None:
    _fuzz_cli(tmp_path, 30_000)

"""``seglogfs produce TOPIC``: stdin lines (or raw chunks) to records, the console producer.

Through the daemon when one owns the log directory (``seglogfs.control``), else on the
directory opened for writing; both append through ``seglogfs.producer``, so the
partitions, offsets and errors are the same. Ctrl-C and SIGTERM stop between appends,
never inside one.

A missing topic is created first, with ``num.partitions`` and the default format, as
a Kafka broker creates a topic its producer names (``auto.create.topics.enable``,
Kafka's default true; ``false`` in ``--broker-config`` keeps the refusal), saying so
on stderr. With a daemon, it creates the topic (its ``num.partitions`` and format);
the setting is still read from ``--broker-config``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn, Protocol

from storage import (
    ConfigError,
    Header,
    LogManager,
    StickyPartitioner,
    StorageError,
    TopicExistsError,
    TopicMetadata,
    UnknownTopicError,
    parse_json_lines,
)

from .. import control
from ..producer import append_records, split_keys
from ..setup_check import config_file_error, read_config_file
from .common import (
    EXIT_OK,
    Parents,
    Parser,
    UsageError,
    existing_log_dir,
    open_writable,
)

__all__ = ["PRODUCE_CHUNK_BYTES", "RAW_RECORD_BYTES", "PartialProduceError", "add_parser"]

PRODUCE_CHUNK_BYTES = 256 * 1024
"""Input bytes per producer batch: large enough that per-call costs vanish next to
encoding, small enough to stay under the default ``max.message.bytes`` (1 MiB)."""
RAW_RECORD_BYTES = 64 * 1024
"""In raw mode each read of at most this many bytes is one record."""


def _read_chunks(fd: int, size: int) -> Iterator[bytes]:
    """Blocks of input, each handed on as soon as nothing more is ready to read, so
    an interactive producer appends each line at once and a pipe is read in bulk."""
    pending: list[bytes] = []
    pending_bytes = 0
    while True:
        block = os.read(fd, size - pending_bytes)
        if not block:
            break
        pending.append(block)
        pending_bytes += len(block)
        if pending_bytes >= size or not select.select([fd], [], [], 0)[0]:
            yield b"".join(pending)
            pending.clear()
            pending_bytes = 0
    if pending:
        yield b"".join(pending)


def _line_batches(fd: int) -> Iterator[list[bytes]]:
    """stdin lines (without ``\\n``), a batch at a time; a last line without its
    newline is a record too."""
    carry = b""
    for block in _read_chunks(fd, PRODUCE_CHUNK_BYTES):
        lines = block.split(b"\n")
        if carry:
            lines[0] = carry + lines[0]
        carry = lines.pop()
        if lines:
            yield lines
    if carry:
        yield [carry]


def _raw_batches(fd: int, record_bytes: int) -> Iterator[list[bytes]]:
    for block in _read_chunks(fd, PRODUCE_CHUNK_BYTES):
        yield [block[i : i + record_bytes] for i in range(0, len(block), record_bytes)]


def _cmd_produce(args: argparse.Namespace) -> int:
    log_dir = existing_log_dir(args)
    topic = args.topic
    if control.daemon_socket(log_dir) is not None:
        result = _described_or_created(log_dir, topic, args)
        assert isinstance(result, dict)
        metadata = TopicMetadata(
            topic,
            int(result["partitions"]),
            str(result["format"]),
            result["key_separator"],
            dict(result["config"]),
        )

        def send(
            values: list[bytes | None],
            keys: list[bytes | None] | None,
            headers: list[tuple[Header, ...]] | None = None,
            timestamps: list[int] | None = None,
        ) -> list[tuple[int, int, int]]:
            records = [
                (
                    None if keys is None else keys[i],
                    values[i],
                    () if headers is None else headers[i],
                    None if timestamps is None else timestamps[i],
                )
                for i in range(len(values))
            ]
            return control.produce(log_dir, topic, records, partition=args.partition)

        return _produce_stream(args, metadata, send)
    with open_writable(log_dir, args) as manager:
        metadata = _topic_or_created(manager, topic, args)
        partitioner = StickyPartitioner(metadata.partitions)

        def append(
            values: list[bytes | None],
            keys: list[bytes | None] | None,
            headers: list[tuple[Header, ...]] | None = None,
            timestamps: list[int] | None = None,
        ) -> list[tuple[int, int, int]]:
            return append_records(
                manager,
                topic,
                values,
                keys=keys,
                headers=headers,
                timestamps=timestamps,
                partition=args.partition,
                partitioner=partitioner,
            )

        return _produce_stream(args, metadata, append)


AUTO_CREATE_KEY = "auto.create.topics.enable"


def _auto_create(args: argparse.Namespace) -> bool:
    """``auto.create.topics.enable`` from ``--broker-config`` (Kafka's default: true).

    Raises:
        SetupError: the file cannot be read, or the value is not true or false.
    """
    if args.broker_config is None:
        return True
    properties = read_config_file(args.broker_config, "--broker-config")
    raw = properties.get(AUTO_CREATE_KEY, "true").strip().lower()
    if raw not in ("true", "false"):
        error = ConfigError(AUTO_CREATE_KEY, raw, "must be true or false")
        raise config_file_error(args.broker_config, "--broker-config", error)
    return raw == "true"


def _created(topic: str, partitions: int) -> None:
    print(
        f"seglogfs produce: created topic {topic} with {partitions} partition"
        f"{'' if partitions == 1 else 's'} ({AUTO_CREATE_KEY})",
        file=sys.stderr,
    )


def _topic_or_created(manager: LogManager, topic: str, args: argparse.Namespace) -> TopicMetadata:
    """The topic's metadata, the topic created first when missing and the setting allows.

    Raises:
        UnknownTopicError: missing, and ``auto.create.topics.enable`` is false.
        InvalidTopicError, ConfigError: the engine refused to create it.
    """
    try:
        return manager.topic(topic)
    except UnknownTopicError:
        if not _auto_create(args):
            raise
    try:
        metadata = manager.create_topic(topic)
    except TopicExistsError:  # created meanwhile (the writer lock makes this rare)
        return manager.topic(topic)
    _created(topic, metadata.partitions)
    return metadata


def _described_or_created(log_dir: Path, topic: str, args: argparse.Namespace) -> object:
    """``describe_topic`` through the daemon, the topic created by it first when missing
    and the setting allows.

    Raises:
        control.ControlError: as ``describe_topic``/``create_topic``.
    """
    try:
        return control.request(log_dir, "describe_topic", name=topic)
    except control.ControlError as exc:
        if exc.kind != "UnknownTopicError" or not _auto_create(args):
            raise
    try:
        result = control.request(
            log_dir,
            "create_topic",
            name=topic,
            partitions=None,
            config=None,
            format=None,
            key_separator=None,
        )
    except control.ControlError as exc:
        if exc.kind != "TopicExistsError":
            raise
        return control.request(log_dir, "describe_topic", name=topic)
    assert isinstance(result, dict)
    _created(topic, int(result["partitions"]))
    return result


class _Send(Protocol):
    """Append one producer call's records: values, keys, headers and timestamps (None:
    no keys, no headers, the append time); return (partition, first, last offset) per
    partition written."""

    def __call__(
        self,
        values: list[bytes | None],
        keys: list[bytes | None] | None,
        headers: list[tuple[Header, ...]] | None = None,
        timestamps: list[int] | None = None,
    ) -> list[tuple[int, int, int]]: ...


def _produce_stream(
    args: argparse.Namespace,
    metadata: TopicMetadata,
    send: _Send,
) -> int:
    if args.partition is not None and not 0 <= args.partition < metadata.partitions:
        raise UnknownTopicError(metadata.name, args.partition)
    input_format = args.format or ("raw" if args.raw else metadata.format)
    if args.raw and input_format != "raw":
        raise UsageError(f"--raw and --format {input_format}: choose one")
    raw = input_format == "raw"
    if input_format == "json" and args.key_separator:
        raise UsageError('-K/--key-separator does not apply to json input: give "key"')
    if args.key_separator == "":
        raise UsageError("-K/--key-separator must not be empty")
    separator_text = args.key_separator or metadata.key_separator
    separator = separator_text.encode() if separator_text else None
    if raw and args.key_separator:
        raise UsageError("-K/--key-separator does not apply to raw input")
    fd = sys.stdin.fileno()
    written = 0
    guard = _InterruptGuard()
    try:
        with guard:
            if raw:
                max_record = int(metadata.overrides.get("max.message.bytes", 1 << 30)) - 128
                for chunks in _raw_batches(fd, max(1, min(RAW_RECORD_BYTES, max_record))):
                    with guard.appending():
                        send(list(chunks), None)
                    written += len(chunks)
            elif input_format == "json":
                for lines in _line_batches(fd):
                    # A batch of lines is parsed whole before any is appended: a bad
                    # line stops the command with what came before it appended.
                    records = parse_json_lines(lines, time.time_ns() // 1_000_000)
                    with guard.appending():
                        send(records.values, records.keys, records.headers, records.timestamps)
                    written += len(lines)
            else:
                for lines in _line_batches(fd):
                    with guard.appending():
                        if separator is None:
                            send(list(lines), None)
                        else:
                            keys, values = split_keys(lines, separator)
                            send(values, keys)
                    written += len(lines)
    except (StorageError, control.ControlError, OSError) as exc:
        # Say what is already in the log: those records stay, a retry would repeat them.
        raise PartialProduceError(exc, written) from exc
    return EXIT_OK


class _InterruptGuard:
    """Ctrl-C (SIGINT) and SIGTERM stop ``produce`` between appends, never inside one.

    Outside an append (waiting for input) the signal stops at once; inside, it is held
    until the append returns, so the log is closed cleanly (flushed, checkpointed,
    marked clean) with every record it acknowledged and nothing half-done. SIGINT ends
    as ``KeyboardInterrupt`` (exit 130), SIGTERM as exit 143.
    """

    def __init__(self) -> None:
        self._inside = False
        self._pending: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _InterruptGuard:
        for signum in (signal.SIGINT, signal.SIGTERM):
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum: int, _frame: object) -> None:
        if self._inside:
            self._pending = signum
        else:
            self._stop(signum)

    @staticmethod
    def _stop(signum: int) -> NoReturn:
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + signum)

    @contextlib.contextmanager
    def appending(self) -> Iterator[None]:
        self._inside = True
        try:
            yield
        finally:
            self._inside = False
        if self._pending is not None:
            self._stop(self._pending)


class PartialProduceError(Exception):
    """A produce that stopped part-way: ``written`` records were appended before it."""

    def __init__(self, cause: BaseException, written: int) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.written = written


def add_parser(commands: argparse._SubParsersAction[Parser], shared: Parents) -> None:
    """Add ``produce`` to ``commands``."""
    produce = commands.add_parser(
        "produce",
        parents=[shared.log_dir, shared.writer],
        help="stdin lines to records (console producer)",
        description="Append stdin to a topic: one record per line (a last line without "
        "newline too), or raw chunks for a raw topic or with --raw.",
    )
    produce.add_argument("topic", metavar="TOPIC")
    produce.add_argument(
        "-p", "--partition", type=int, metavar="N", help="write to partition N only"
    )
    produce.add_argument(
        "-K",
        "--key-separator",
        metavar="SEP",
        help="split each line at the first SEP into key and value "
        "(default: the topic's key.separator; a line without SEP has no key)",
    )
    produce.add_argument(
        "--format",
        choices=("lines", "raw", "json"),
        help="how stdin is read: lines, raw chunks, or one JSON object a line as a "
        'json topic renders records ({"key": ..., "value": ..., "headers": [[k, v]], '
        '"timestamp": ms}; topic, partition, offset ignored) (default: the topic\'s '
        "format)",
    )
    produce.add_argument(
        "--raw",
        action="store_true",
        help=f"binary input: each read of up to {RAW_RECORD_BYTES} bytes is one record "
        "(the default for raw topics)",
    )
    produce.set_defaults(handler=_cmd_produce, command_parser=produce)

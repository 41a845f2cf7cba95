"""``seglogfs``: the command line.

Commands: ``mount`` (the FUSE daemon, ``seglogfs.mount``), ``topics create|list|
describe|alter|delete`` (like ``kafka-topics.sh``), ``produce`` (the console producer),
``consume`` (like ``kcat -C``), ``dump`` (Kafka's ``kafka-dump-log.sh``) and ``verify``.

Exit codes: 0 ok, 1 runtime error (the log directory said no: unknown topic, locked
directory, corrupt data, I/O), 2 usage error (the command line is wrong: a bad option,
offset spec, topic name or config key). Errors are one line on stderr, never a
traceback.

Never a second writer: when a daemon owns the log directory (its control socket
answers), ``topics`` and ``produce`` send their request to it (``seglogfs.control``)
and get the same results and errors; the read-only commands (``consume``, ``topics
list|describe``, ``dump``, ``verify``) open the files read-only and work while it writes.
"""

from __future__ import annotations

import argparse
import base64
import bisect
import contextlib
import importlib
import json
import os
import select
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, NoReturn

from storage import (
    BrokerConfig,
    ConfigError,
    InvalidTopicError,
    Log,
    LogManager,
    OffsetOutOfRangeError,
    RecordBatch,
    SegmentDeletedError,
    StickyPartitioner,
    StorageError,
    TopicExistsError,
    TopicMetadata,
    UnknownTopicError,
    load_properties,
)
from storage.render import render_batch

from . import __version__, control
from .open_files_limit import raise_open_files_limit
from .positions import position_index_spec

PROG = "seglogfs"
LOG_DIR_ENV = "SEGLOG_LOG_DIR"

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2

# Engine errors that mean the command line asked for something impossible.
_USAGE_ERROR_KINDS = frozenset({"InvalidTopicError", "ConfigError"})

PRODUCE_CHUNK_BYTES = 256 * 1024
"""Input bytes per producer batch: large enough that per-call costs vanish next to
encoding, small enough to stay under the default ``max.message.bytes`` (1 MiB)."""
RAW_RECORD_BYTES = 64 * 1024
"""In raw mode each read of at most this many bytes is one record."""
FOLLOW_POLL_S = 0.2
_MAX_REPOSITIONS = 8


class UsageError(Exception):
    """The command line is wrong: exit 2."""


class CommandError(Exception):
    """The command cannot be done: exit 1."""


class _Parser(argparse.ArgumentParser):
    """argparse with the project's error line: one line on stderr, exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


# -- log directory and daemon ---------------------------------------------------------


def _log_dir(args: argparse.Namespace) -> Path:
    value = getattr(args, "log_dir", None) or os.environ.get(LOG_DIR_ENV)
    if not value:
        raise UsageError(f"no log directory: pass -d/--log-dir or set {LOG_DIR_ENV}")
    return Path(value)


def _existing_log_dir(args: argparse.Namespace) -> Path:
    path = _log_dir(args)
    if not path.is_dir():
        raise CommandError(f"log directory {path} does not exist")
    return path


def _open_read_only(log_dir: Path) -> LogManager:
    if not log_dir.is_dir():
        raise CommandError(f"log directory {log_dir} does not exist")
    return LogManager.open(log_dir, read_only=True)


def _open_writable(log_dir: Path, args: argparse.Namespace) -> LogManager:
    """Open for writing as the daemon does: with the broker config it was given
    (``--broker-config``, else Kafka's defaults) and the file system's position index,
    so that every append here keeps the ``.seglogpos`` files the mount reads in step.

    Raises:
        LogDirLockedError: another process writes the directory.
        ConfigError: the broker config file has a bad value.
        OSError: the broker config file cannot be read.
    """
    broker = None
    if args.broker_config is not None:
        broker = BrokerConfig.from_properties(load_properties(args.broker_config))
    return LogManager.open(log_dir, broker, extension=position_index_spec)


def _topic_name(args: argparse.Namespace) -> str:
    name: str | None = args.topic or args.topic_option
    if args.topic and args.topic_option and args.topic != args.topic_option:
        raise UsageError(f"two topics given: {args.topic!r} and --topic {args.topic_option!r}")
    if not name:
        raise UsageError("a topic is required")
    return name


def _parse_config_pairs(pairs: Sequence[str] | None, option: str) -> dict[str, str]:
    config: dict[str, str] = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"{option} takes KEY=VALUE, not {pair!r}")
        config[key.strip()] = value
    return config


# -- topics ---------------------------------------------------------------------------


def _cmd_topics_create(args: argparse.Namespace) -> int:
    log_dir = _log_dir(args)
    name = _topic_name(args)
    config = _parse_config_pairs(args.config, "--config")
    try:
        if control.daemon_socket(log_dir) is not None:
            control.request(
                log_dir,
                "create_topic",
                name=name,
                partitions=args.partitions,
                config=config,
                format=args.format,
                key_separator=args.key_separator,
            )
        else:
            with _open_writable(log_dir, args) as manager:
                manager.create_topic(
                    name,
                    args.partitions,
                    config,
                    format=args.format,
                    key_separator=args.key_separator,
                )
    except (TopicExistsError, control.ControlError) as exc:
        if args.if_not_exists and _is_error(exc, TopicExistsError):
            return EXIT_OK  # as kafka-topics.sh --if-not-exists: quietly nothing to do
        raise
    print(f"Created topic {name}.")
    return EXIT_OK


def _is_error(exc: BaseException, kind: type[StorageError]) -> bool:
    """``exc`` is the engine's ``kind``, raised here or reported by the daemon."""
    if isinstance(exc, control.ControlError):
        return exc.kind == kind.__name__
    return isinstance(exc, kind)


def _cmd_topics_list(args: argparse.Namespace) -> int:
    with _open_read_only(_log_dir(args)) as manager:
        for name in manager.topics():
            print(name)
    return EXIT_OK


def _format_config(config: dict[str, str]) -> str:
    return ",".join(f"{key}={value}" for key, value in sorted(config.items()))


def _cmd_topics_describe(args: argparse.Namespace) -> int:
    wanted = args.topic or args.topic_option
    with _open_read_only(_log_dir(args)) as manager:
        names = [wanted] if wanted else manager.topics()
        for name in names:
            description = manager.describe_topic(name)
            metadata = description.metadata
            separator = metadata.key_separator if metadata.key_separator is not None else ""
            print(
                f"Topic: {name}\tPartitionCount: {metadata.partitions}\t"
                f"Format: {metadata.format}\tKeySeparator: {separator}\t"
                f"Configs: {_format_config(dict(metadata.overrides))}"
            )
            for p in description.partitions:
                print(
                    f"\tTopic: {name}\tPartition: {p.partition}\t"
                    f"StartOffset: {p.log_start_offset}\tEndOffset: {p.log_end_offset}\t"
                    f"Segments: {p.segment_count}\tSize: {p.size}\t"
                    f"FirstTimestamp: {p.first_timestamp}\tLastTimestamp: {p.last_timestamp}"
                )
    return EXIT_OK


def _cmd_topics_alter(args: argparse.Namespace) -> int:
    log_dir = _existing_log_dir(args)
    name = _topic_name(args)
    to_set = _parse_config_pairs(args.add_config, "--add-config")
    to_delete = list(args.delete_config or ())
    if not to_set and not to_delete:
        raise UsageError("nothing to alter: give --add-config and/or --delete-config")
    try:
        if control.daemon_socket(log_dir) is not None:
            control.request(log_dir, "alter_topic", name=name, set=to_set, delete=to_delete)
        else:
            with _open_writable(log_dir, args) as manager:
                manager.alter_topic_config(name, to_set, to_delete)
    except (UnknownTopicError, control.ControlError) as exc:
        if args.if_exists and _is_error(exc, UnknownTopicError):
            return EXIT_OK
        raise
    print(f"Completed updating config for topic {name}.")
    return EXIT_OK


def _cmd_topics_delete(args: argparse.Namespace) -> int:
    log_dir = _log_dir(args)
    name = _topic_name(args)
    if args.if_exists and not log_dir.is_dir():
        return EXIT_OK
    log_dir = _existing_log_dir(args)
    try:
        if control.daemon_socket(log_dir) is not None:
            control.request(log_dir, "delete_topic", name=name)
        else:
            with _open_writable(log_dir, args) as manager:
                manager.delete_topic(name)
    except (UnknownTopicError, control.ControlError) as exc:
        if args.if_exists and _is_error(exc, UnknownTopicError):
            return EXIT_OK
        raise
    print(f"Deleted topic {name}.")
    return EXIT_OK


# -- produce --------------------------------------------------------------------------


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


def _split_keys(
    lines: list[bytes], separator: bytes
) -> tuple[list[bytes | None], list[bytes | None]]:
    keys: list[bytes | None] = []
    values: list[bytes | None] = []
    for line in lines:
        key, sep, value = line.partition(separator)
        if sep:
            keys.append(key)
            values.append(value)
        else:
            keys.append(None)
            values.append(line)
    return keys, values


def _cmd_produce(args: argparse.Namespace) -> int:
    log_dir = _existing_log_dir(args)
    topic = args.topic
    if control.daemon_socket(log_dir) is not None:
        result = control.request(log_dir, "describe_topic", name=topic)
        assert isinstance(result, dict)
        metadata = TopicMetadata(
            topic,
            int(result["partitions"]),
            str(result["format"]),
            result["key_separator"],
            dict(result["config"]),
        )

        def send(
            values: list[bytes | None], keys: list[bytes | None] | None
        ) -> list[tuple[int, int, int]]:
            records = [
                (None if keys is None else keys[i], values[i], (), None) for i in range(len(values))
            ]
            return control.produce(log_dir, topic, records, partition=args.partition)

        return _produce_stream(args, metadata, send)
    with _open_writable(log_dir, args) as manager:
        metadata = manager.topic(topic)
        partitioner = StickyPartitioner(metadata.partitions)

        def append(
            values: list[bytes | None], keys: list[bytes | None] | None
        ) -> list[tuple[int, int, int]]:
            return control.append_records(
                manager,
                topic,
                values,
                keys=keys,
                partition=args.partition,
                partitioner=partitioner,
            )

        return _produce_stream(args, metadata, append)


def _produce_stream(
    args: argparse.Namespace,
    metadata: TopicMetadata,
    send: Callable[[list[bytes | None], list[bytes | None] | None], list[tuple[int, int, int]]],
) -> int:
    if args.partition is not None and not 0 <= args.partition < metadata.partitions:
        raise UnknownTopicError(metadata.name, args.partition)
    raw = args.raw or metadata.format == "raw"
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
            else:
                for lines in _line_batches(fd):
                    with guard.appending():
                        if separator is None:
                            send(list(lines), None)
                        else:
                            keys, values = _split_keys(lines, separator)
                            send(values, keys)
                    written += len(lines)
    except (StorageError, control.ControlError, OSError) as exc:
        # Say what is already in the log: those records stay, a retry would repeat them.
        raise _Partial(exc, written) from exc
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


class _Partial(Exception):
    """A produce that stopped part-way: ``written`` records were appended before it."""

    def __init__(self, cause: BaseException, written: int) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.written = written


# -- consume --------------------------------------------------------------------------


def parse_offset_spec(spec: str) -> tuple[str, int]:
    """``beginning``, ``end``, ``N``, ``-N`` or ``@TIME`` (epoch ms or ISO 8601) as
    ``(kind, value)`` with kind in beginning/end/offset/last/time.

    Raises:
        UsageError: anything else.
    """
    text = spec.strip()
    if text in ("beginning", "earliest"):
        return ("beginning", 0)
    if text in ("end", "latest"):
        return ("end", 0)
    if text.startswith("@"):
        when = text[1:]
        if when.isdigit():
            return ("time", int(when))
        try:
            moment = datetime.fromisoformat(when)
        except ValueError:
            raise UsageError(
                f"bad offset spec {spec!r}: after '@' give epoch milliseconds or an ISO 8601 time"
            ) from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)  # as the file system's 0@TIME views
        return ("time", round(moment.timestamp() * 1000))
    if text.startswith("-") and text[1:].isdigit():
        return ("last", int(text[1:]))
    if text.isdigit():
        return ("offset", int(text))
    raise UsageError(
        f"bad offset spec {spec!r}: use beginning, end, N, -N or @TIME (epoch ms or ISO 8601)"
    )


def _start_offset(log: Log, spec: tuple[str, int]) -> int:
    kind, value = spec
    start, end = log.log_start_offset, log.log_end_offset
    if kind == "beginning":
        return start
    if kind == "end":
        return end
    if kind == "last":
        return max(start, end - value)
    if kind == "time":
        found = log.offset_for_timestamp(value)
        return end if found is None else found
    if not start <= value <= end:
        raise OffsetOutOfRangeError(value, start, end)
    return value


def _text_or_base64(data: bytes | None) -> object:
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode("ascii")}


class _Consumer:
    """Writes the records of some partitions from their start offsets to ``out``."""

    def __init__(
        self,
        manager: LogManager,
        topic: str,
        partitions: list[int],
        spec: tuple[str, int],
        *,
        json_format: bool,
        count: int | None,
        out: IO[bytes],
    ) -> None:
        self.manager = manager
        self.metadata = manager.topic(topic)
        self.topic = topic
        self.raw = self.metadata.format == "raw"
        separator = self.metadata.key_separator
        self.separator = separator.encode() if separator is not None else None
        self.json_format = json_format
        self.remaining = count
        self.out = out
        self.positions = {p: _start_offset(manager.log(topic, p), spec) for p in partitions}

    @property
    def done(self) -> bool:
        return self.remaining is not None and self.remaining <= 0

    def drain(self, partition: int) -> int:
        """Write every record of ``partition`` from its position to the log end (or
        until the count is reached); return how many were written."""
        log = self.manager.log(self.topic, partition)
        written = 0
        for _attempt in range(_MAX_REPOSITIONS):
            # Below the log start, retention took the records: continue at the oldest
            # retained one (Kafka's auto.offset.reset=earliest), as the file system does.
            position = max(self.positions[partition], log.log_start_offset)
            try:
                for batch in log.batches(position):
                    if self.done:
                        break
                    if batch.is_control:
                        position = batch.next_offset
                        continue
                    if self.json_format:
                        n, position = self._write_json(batch, partition, position)
                    else:
                        n, position = self._write_rendered(batch, position)
                    written += n
                    self.positions[partition] = position
            except SegmentDeletedError:
                # Retention removed the segment under the read: what was written stays
                # written; pick up the new log start and go on from there.
                log.refresh()
                continue
            self.positions[partition] = position
            return written
        raise CommandError(
            f"partition {self.topic}-{partition} is deleted by retention faster than it is read"
        )

    def _take(self, available: int) -> int:
        if self.remaining is None:
            return available
        taken = min(available, self.remaining)
        self.remaining -= taken
        return taken

    def _write_rendered(self, batch: RecordBatch, start: int) -> tuple[int, int]:
        rendered = render_batch(batch, raw=self.raw, key_separator=self.separator)
        offsets = rendered.offsets
        first = bisect.bisect_left(offsets, start)
        n = self._take(len(offsets) - first)
        if n < len(offsets) - first:
            if n == 0:
                return 0, start
            next_position = offsets[first + n - 1] + 1
        else:
            next_position = batch.next_offset
        if n:
            ends = rendered.ends
            lo = ends[first - 1] if first > 0 else 0
            self.out.write(rendered.data[lo : ends[first + n - 1]])
        return n, next_position

    def _write_json(self, batch: RecordBatch, partition: int, start: int) -> tuple[int, int]:
        chosen = [r for r in batch.records() if r.offset >= start]
        n = self._take(len(chosen))
        if n < len(chosen):
            if n == 0:
                return 0, start
            next_position = chosen[n - 1].offset + 1
        else:
            next_position = batch.next_offset
        lines = []
        for record in chosen[:n]:
            document = {
                "topic": self.topic,
                "partition": partition,
                "offset": record.offset,
                "timestamp": record.timestamp,
                "timestampType": record.timestamp_type.display_name,
                "key": _text_or_base64(record.key),
                "value": _text_or_base64(record.value),
                "headers": [[k, _text_or_base64(v)] for k, v in record.headers],
            }
            lines.append(json.dumps(document, ensure_ascii=False) + "\n")
        if lines:
            self.out.write("".join(lines).encode("utf-8"))
        return n, next_position


def _cmd_consume(args: argparse.Namespace) -> int:
    spec = parse_offset_spec(args.offset)
    if args.count is not None and args.count < 0:
        raise UsageError("-c/--count must not be negative")
    with _open_read_only(_log_dir(args)) as manager:
        metadata = manager.topic(args.topic)
        if args.partition is not None:
            manager.log(args.topic, args.partition)  # UnknownTopicError for a bad one
            partitions = [args.partition]
        else:
            partitions = list(range(metadata.partitions))
        out = sys.stdout.buffer
        consumer = _Consumer(
            manager,
            args.topic,
            partitions,
            spec,
            json_format=args.format == "json",
            count=args.count,
            out=out,
        )
        try:
            for partition in partitions:
                if consumer.done:
                    break
                consumer.drain(partition)
            out.flush()
            while args.follow and not consumer.done:
                time.sleep(FOLLOW_POLL_S)
                for partition in partitions:
                    log = manager.log(args.topic, partition)
                    if not log.dir.is_dir():
                        raise CommandError(f"topic {args.topic!r} was deleted")
                    log.refresh()
                    if consumer.drain(partition):
                        out.flush()
                    if consumer.done:
                        break
            out.flush()
        except BrokenPipeError:
            # The reader went away (``| head``): stop quietly, as cat does.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
    return EXIT_OK


# -- dump and verify ------------------------------------------------------------------


def _cmd_dump(args: argparse.Namespace) -> int:
    from .dump import DumpOptions, dump_files

    files = list(args.files)
    for group in args.files_option or ():
        files.extend(name for name in group.split(",") if name)
    if not files:
        raise UsageError("give at least one .log, .index or .timeindex file")
    options = DumpOptions(
        print_data_log=args.print_data_log,
        deep_iteration=args.deep_iteration or args.print_data_log,
        verify_index_only=args.verify_index_only,
        index_sanity_check=args.index_sanity_check,
        skip_record_metadata=args.skip_record_metadata,
        max_message_size=args.max_message_size,
    )
    for name in files:
        if not Path(name).exists():
            raise CommandError(f"no such file: {name}")
        if not Path(name).is_file():
            raise CommandError(f"not a file: {name}")
    return dump_files([Path(name) for name in files], options, sys.stdout, sys.stderr)


def _cmd_verify(args: argparse.Namespace) -> int:
    from .verify import verify_log_dir

    value = args.log_dir_positional or args.log_dir or os.environ.get(LOG_DIR_ENV)
    if not value:
        raise UsageError(f"no log directory: give LOGDIR, -d/--log-dir or set {LOG_DIR_ENV}")
    log_dir = Path(value)
    if not log_dir.is_dir():
        raise CommandError(f"log directory {log_dir} does not exist")
    problems = verify_log_dir(log_dir, progress=not args.quiet and sys.stderr.isatty())
    for problem in problems:
        print(problem)
    if problems:
        print(f"{len(problems)} problem(s) found in {log_dir}", file=sys.stderr)
        return EXIT_ERROR
    if not args.quiet:
        print(f"{log_dir}: no problems found", file=sys.stderr)
    return EXIT_OK


# -- mount ----------------------------------------------------------------------------


def _run_mount(argv: list[str]) -> int:
    try:
        # Imported only for this command: it loads pyfuse3 and trio, which the other
        # commands do not need.
        mount: Any = importlib.import_module("seglogfs.mount")
    except ImportError as exc:
        raise CommandError(f"mount is not available: {exc}") from None
    parser = _Parser(
        prog=f"{PROG} mount",
        description="Mount a log directory: topics as directories, partitions as files.",
    )
    mount.add_arguments(parser)
    return int(mount.run(parser.parse_args(argv)))


# -- the parser -----------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The whole command line (``mount`` is parsed by ``seglogfs.mount`` itself)."""
    log_dir = _Parser(add_help=False)
    log_dir.add_argument(
        "-d",
        "--log-dir",
        metavar="DIR",
        help=f"the log directory (default: ${LOG_DIR_ENV})",
    )
    writer = _Parser(add_help=False)
    writer.add_argument(
        "--broker-config",
        metavar="FILE",
        type=Path,
        help="a server.properties for the log.* defaults when no daemon owns the log "
        "directory (a daemon uses its own --config)",
    )
    parser = _Parser(
        prog=PROG,
        description="A Kafka-style segmented log store used through the file system.",
        epilog="Exit codes: 0 ok, 1 runtime error, 2 usage error. "
        "Run 'seglogfs COMMAND --help' for a command's options.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True

    commands.add_parser(
        "mount",
        help="mount a log directory (seglogfs mount LOGDIR MOUNTPOINT [-o ro,allow_other])",
        add_help=False,
    )

    topics = commands.add_parser(
        "topics", help="create, list, describe, alter or delete topics (like kafka-topics.sh)"
    )
    actions = topics.add_subparsers(dest="action", metavar="ACTION", parser_class=_Parser)
    actions.required = True

    def topic_arguments(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("topic", nargs="?", metavar="TOPIC", help="the topic name")
        sub.add_argument(
            "--topic", dest="topic_option", metavar="TOPIC", help="the topic name (alternative)"
        )

    create = actions.add_parser("create", parents=[log_dir, writer], help="create a topic")
    topic_arguments(create)
    create.add_argument(
        "--partitions", type=int, metavar="N", help="partition count (default num.partitions)"
    )
    create.add_argument(
        "--config",
        action="append",
        metavar="KEY=VALUE",
        help="a topic config override, e.g. retention.ms=86400000 (repeatable)",
    )
    create.add_argument(
        "--format",
        choices=("lines", "raw"),
        default="lines",
        help="how partition files render records (fixed at creation; default lines)",
    )
    create.add_argument(
        "--key-separator", metavar="SEP", help="lines topics: text between key and value"
    )
    create.add_argument(
        "--if-not-exists", action="store_true", help="do nothing (exit 0) if the topic exists"
    )
    create.set_defaults(handler=_cmd_topics_create, command_parser=create)

    listing = actions.add_parser("list", parents=[log_dir], help="list topic names, one a line")
    listing.set_defaults(handler=_cmd_topics_list, command_parser=listing)

    describe = actions.add_parser(
        "describe",
        parents=[log_dir],
        help="partitions (start/end offsets, segments, size) and config overrides",
    )
    topic_arguments(describe)
    describe.set_defaults(handler=_cmd_topics_describe, command_parser=describe)

    alter = actions.add_parser("alter", parents=[log_dir, writer], help="change config overrides")
    topic_arguments(alter)
    alter.add_argument(
        "--add-config", action="append", metavar="KEY=VALUE", help="set an override (repeatable)"
    )
    alter.add_argument(
        "--delete-config", action="append", metavar="KEY", help="remove an override (repeatable)"
    )
    alter.add_argument(
        "--if-exists", action="store_true", help="do nothing (exit 0) if there is no such topic"
    )
    alter.set_defaults(handler=_cmd_topics_alter, command_parser=alter)

    delete = actions.add_parser(
        "delete", parents=[log_dir, writer], help="delete a topic and its data"
    )
    topic_arguments(delete)
    delete.add_argument(
        "--if-exists", action="store_true", help="do nothing (exit 0) if there is no such topic"
    )
    delete.set_defaults(handler=_cmd_topics_delete, command_parser=delete)

    produce = commands.add_parser(
        "produce",
        parents=[log_dir, writer],
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
        "--raw",
        action="store_true",
        help=f"binary input: each read of up to {RAW_RECORD_BYTES} bytes is one record "
        "(the default for raw topics)",
    )
    produce.set_defaults(handler=_cmd_produce, command_parser=produce)

    consume = commands.add_parser(
        "consume",
        parents=[log_dir],
        help="records to stdout (like kcat -C)",
        description="Write a topic's records to stdout: by default the same bytes as "
        "cat of the partition files, or one JSON object per record.",
    )
    consume.add_argument("topic", metavar="TOPIC")
    consume.add_argument("-p", "--partition", type=int, metavar="N", help="partition N only")
    consume.add_argument(
        "-o",
        "--offset",
        default="beginning",
        metavar="SPEC",
        help="start at beginning (default), end, N, -N (the last N) or @TIME "
        "(epoch ms or ISO 8601, e.g. @2026-11-22T10:00:00Z; no zone means UTC)",
    )
    consume.add_argument("-c", "--count", type=int, metavar="COUNT", help="stop after COUNT")
    stop = consume.add_mutually_exclusive_group()
    stop.add_argument("-f", "--follow", action="store_true", help="wait for new records")
    stop.add_argument(
        "-e", "--exit", action="store_true", help="exit at the end of the log (the default)"
    )
    consume.add_argument(
        "--format",
        choices=("plain", "json"),
        default="plain",
        help="plain (the partition file's bytes) or json (one object per record; "
        'bytes that are not UTF-8 as {"base64": ...})',
    )
    consume.set_defaults(handler=_cmd_consume, command_parser=consume)

    dump = commands.add_parser(
        "dump",
        help="print segment and index files as kafka-dump-log.sh does",
        description="Print .log, .index, .timeindex and .txnindex files as Kafka's "
        "DumpLogSegments (kafka-dump-log.sh) does.",
    )
    dump.add_argument("files", nargs="*", metavar="FILE")
    dump.add_argument(
        "--files", dest="files_option", action="append", metavar="F1,F2", help="as Kafka's tool"
    )
    dump.add_argument(
        "--print-data-log", action="store_true", help="print keys and payloads (implies deep)"
    )
    dump.add_argument(
        "--deep-iteration", action="store_true", help="print every record, not only batches"
    )
    dump.add_argument(
        "--verify-index-only", action="store_true", help="check index entries, print no entries"
    )
    dump.add_argument(
        "--index-sanity-check",
        action="store_true",
        help="only the sanity check an open runs on an index",
    )
    dump.add_argument(
        "--skip-record-metadata", action="store_true", help="records without their metadata"
    )
    dump.add_argument(
        "--max-message-size",
        type=int,
        default=5 * 1024 * 1024,
        metavar="BYTES",
        help="largest batch read at an index entry",
    )
    dump.set_defaults(handler=_cmd_dump, command_parser=dump)

    verify = commands.add_parser(
        "verify",
        parents=[log_dir],
        help="check every invariant of a log directory; exit 1 on any problem",
        description="Check CRCs, offsets, indexes, checkpoints and position indexes of "
        "a log directory; print each problem with its file and byte position.",
    )
    verify.add_argument("log_dir_positional", nargs="?", metavar="LOGDIR")
    verify.add_argument("-q", "--quiet", action="store_true", help="no progress, no summary")
    verify.set_defaults(handler=_cmd_verify, command_parser=verify)
    return parser


def _error_line(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        where = f"{exc.filename}: " if exc.filename else ""
        return f"{where}{exc.strerror}"
    return str(exc)


def _exit_code(exc: BaseException) -> int:
    if isinstance(exc, UsageError | InvalidTopicError | ConfigError):
        return EXIT_USAGE
    if isinstance(exc, control.ControlError) and exc.kind in _USAGE_ERROR_KINDS:
        return EXIT_USAGE
    return EXIT_ERROR


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit code."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    prog = PROG
    raise_open_files_limit()  # a log holds descriptors per segment (see the module)
    try:
        if arguments and arguments[0] == "mount":
            prog = f"{PROG} mount"
            return _run_mount(arguments[1:])
        parser = build_parser()
        args, extra = parser.parse_known_args(arguments)
        if extra:
            # Name the subcommand in the error, as argparse does for its other errors.
            command_parser = getattr(args, "command_parser", parser)
            command_parser.error(f"unrecognized arguments: {' '.join(extra)}")
        prog = f"{PROG} {args.command}" + (f" {args.action}" if args.command == "topics" else "")
        handler: Callable[[argparse.Namespace], int] = args.handler
        return handler(args)
    except _Partial as exc:
        cause = exc.cause
        sys.stderr.write(
            f"{prog}: error: {_error_line(cause)} "
            f"({exc.written} record(s) were appended before the error)\n"
        )
        return _exit_code(cause)
    except (UsageError, CommandError, StorageError, control.ControlError, OSError) as exc:
        sys.stderr.write(f"{prog}: error: {_error_line(exc)}\n")
        return _exit_code(exc)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

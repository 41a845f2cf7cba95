"""``seglogfs``: the command line.

Commands: ``mount`` (the FUSE daemon, ``seglogfs.daemon``), ``serve-kafka`` (the
Kafka listener without a mount), ``topics create|list|
describe|alter|delete`` (like ``kafka-topics.sh``), ``produce`` (the console producer),
``consume`` (like ``kcat -C``), ``dump`` (Kafka's ``kafka-dump-log.sh``), ``verify``,
``delete-records``, ``compact`` (the log cleaner, now) and ``groups list|describe|
reset-offsets|delete`` (like ``kafka-consumer-groups.sh``).

One module per command family, as Kafka keeps one class per tool: ``topics``,
``produce``, ``consume``, ``dump``, ``verify``, ``mount``, ``delete_records``,
``compact``, ``groups``; this one holds the parser and
the rules that turn errors into exit codes.

Exit codes: 0 ok, 1 runtime error (the log directory said no: unknown topic, locked
directory, corrupt data, I/O), 2 usage error (the command line is wrong: a bad option,
offset spec, topic name or config key). Errors are one line on stderr, never a
traceback.

Never a second writer: when a daemon owns the log directory (its control socket
answers), ``topics``, ``produce``, ``delete-records`` and ``compact`` send their request
to it (``seglogfs.control``) and get the same results and errors; the read-only
commands (``consume``, ``topics list|describe``, ``dump``, ``verify``) open the files
read-only and work while it writes.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from storage import ConfigError, InvalidTopicError, StorageError

from .. import __version__, control
from ..open_files_limit import raise_open_files_limit
from ..setup_check import SetupError
from . import (
    compact,
    consume,
    delete_records,
    dump,
    groups,
    mount,
    produce,
    serve_kafka,
    topics,
    verify,
)
from .common import (
    EXIT_ERROR,
    EXIT_OK,
    EXIT_USAGE,
    PROG,
    CommandError,
    Parser,
    UsageError,
    parents,
    silence_stdout,
    stdout_reader_gone,
)
from .produce import PartialProduceError

__all__ = ["build_parser", "main"]

# Engine errors that mean the command line asked for something impossible.
_USAGE_ERROR_KINDS = frozenset({"InvalidTopicError", "ConfigError", "InvalidGroupIdError"})


def build_parser() -> argparse.ArgumentParser:
    """The whole command line (``mount`` is parsed by ``seglogfs.daemon.mount`` itself)."""
    shared = parents()
    parser = Parser(
        prog=PROG,
        description="A Kafka-style segmented log store used through the file system.",
        epilog="Exit codes: 0 ok, 1 runtime error, 2 usage error. "
        "Run 'seglogfs COMMAND --help' for a command's options.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    commands.required = True

    families = (
        mount,
        serve_kafka,
        topics,
        produce,
        consume,
        dump,
        verify,
        delete_records,
        compact,
        groups,
    )
    for family in families:
        family.add_parser(commands, shared)
    return parser


def _error_line(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        where = f"{exc.filename}: " if exc.filename else ""
        return f"{where}{exc.strerror}"
    return str(exc)


def _exit_code(exc: BaseException) -> int:
    if isinstance(exc, UsageError | InvalidTopicError | ConfigError):
        return EXIT_USAGE
    if isinstance(exc, SetupError):
        return EXIT_USAGE if exc.usage else EXIT_ERROR
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
            return mount.run_mount(arguments[1:])
        if arguments and arguments[0] == "serve-kafka":
            prog = f"{PROG} serve-kafka"
            return serve_kafka.run_serve_kafka(arguments[1:])
        parser = build_parser()
        try:
            args, extra = parser.parse_known_args(arguments)
        except SystemExit:
            sys.stdout.flush()  # ``--help | head``: a closed pipe ends quietly, below
            raise
        if extra:
            # Name the subcommand in the error, as argparse does for its other errors.
            command_parser = getattr(args, "command_parser", parser)
            command_parser.error(f"unrecognized arguments: {' '.join(extra)}")
        prog = f"{PROG} {args.command}"
        if args.command in ("topics", "groups"):
            prog += f" {args.action}"
        handler: Callable[[argparse.Namespace], int] = args.handler
        code = handler(args)
        # Flush here, not at interpreter exit, so a reader gone meanwhile is the
        # quiet end below instead of an ignored exception and exit 120.
        sys.stdout.flush()
        return code
    except BrokenPipeError as exc:
        if stdout_reader_gone():
            # ``seglogfs ... | head``: the reader has what it wanted. Stop quietly and
            # exit 0, as ``consume`` always has: the output was not wrong.
            silence_stdout()
            return EXIT_OK
        sys.stderr.write(f"{prog}: error: {_error_line(exc)}\n")
        return EXIT_ERROR
    except PartialProduceError as exc:
        cause = exc.cause
        sys.stderr.write(
            f"{prog}: error: {_error_line(cause)} "
            f"({exc.written} record(s) were appended before the error)\n"
        )
        return _exit_code(cause)
    except (
        UsageError,
        CommandError,
        SetupError,
        StorageError,
        control.ControlError,
        OSError,
    ) as exc:
        sys.stderr.write(f"{prog}: error: {_error_line(exc)}\n")
        return _exit_code(exc)
    except KeyboardInterrupt:
        return 130

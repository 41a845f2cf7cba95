"""What every command of the command line shares: exit codes, errors, the log directory.

Exit codes: 0 ok, 1 runtime error (the log directory said no: unknown topic, locked
directory, corrupt data, I/O), 2 usage error (the command line is wrong). Commands
raise ``UsageError`` or ``CommandError`` (or let an engine error through); ``main``
turns each into one line on stderr and its exit code, by the rules in
``seglogfs.cli.main``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import select
import sys
from pathlib import Path
from typing import Any, NoReturn

from storage import BrokerConfig, ConfigError, LogManager

from ..positions import position_index_spec
from ..setup_check import check_log_dir, config_file_error, log_dir_error, read_config_file

__all__ = [
    "EXIT_ERROR",
    "EXIT_OK",
    "EXIT_USAGE",
    "LOG_DIR_ENV",
    "PROG",
    "CommandError",
    "Parents",
    "Parser",
    "UsageError",
    "broker_config_of",
    "daemon_command",
    "existing_log_dir",
    "log_dir_of",
    "open_read_only",
    "open_writable",
    "parents",
    "silence_stdout",
    "stdout_reader_gone",
]

PROG = "seglogfs"
LOG_DIR_ENV = "SEGLOG_LOG_DIR"

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2


class UsageError(Exception):
    """The command line is wrong: exit 2."""


class CommandError(Exception):
    """The command cannot be done: exit 1."""


class Parser(argparse.ArgumentParser):
    """argparse with the project's error line: one line on stderr, exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


class Parents:
    """The option groups several commands share, as argparse parent parsers:
    ``log_dir`` (``-d/--log-dir``) and ``writer`` (``--broker-config``)."""

    def __init__(self, log_dir: Parser, writer: Parser) -> None:
        self.log_dir = log_dir
        self.writer = writer


def parents() -> Parents:
    """Fresh parent parsers for one ``build_parser``."""
    log_dir = Parser(add_help=False)
    log_dir.add_argument(
        "-d",
        "--log-dir",
        metavar="DIR",
        # Unset unless given: ``topics`` and ``groups`` take -d before their action
        # too, and argparse copies every attribute of the action's namespace over the
        # family's, so a default of None after the action would erase a -d before it.
        default=argparse.SUPPRESS,
        help=f"the log directory (default: ${LOG_DIR_ENV})",
    )
    writer = Parser(add_help=False)
    writer.add_argument(
        "--broker-config",
        metavar="FILE",
        type=Path,
        help="a server.properties for the log.* defaults when no daemon owns the log "
        "directory (a daemon uses its own --config)",
    )
    return Parents(log_dir, writer)


def log_dir_of(args: argparse.Namespace) -> Path:
    """The log directory the command was given (it may not exist yet).

    Raises:
        UsageError: none was given.
        SetupError: it cannot be a log directory (a file, a seglogfs mount).
    """
    path = _given_log_dir(args)
    check_log_dir(path, must_exist=False)
    return path


def existing_log_dir(args: argparse.Namespace) -> Path:
    """The log directory the command was given, which must exist.

    Raises:
        UsageError: none was given.
        SetupError: it does not exist or cannot be a log directory.
    """
    path = _given_log_dir(args)
    check_log_dir(path, must_exist=True)
    return path


def _given_log_dir(args: argparse.Namespace) -> Path:
    value = getattr(args, "log_dir", None) or os.environ.get(LOG_DIR_ENV)
    if not value:
        raise UsageError(f"no log directory: pass -d/--log-dir or set {LOG_DIR_ENV}")
    return Path(value)


def open_read_only(log_dir: Path) -> LogManager:
    """Open ``log_dir`` read-only (no lock, no file changed).

    Raises:
        SetupError: it does not exist, cannot be a log directory, or cannot be read.
    """
    check_log_dir(log_dir, must_exist=True)
    try:
        return LogManager.open(log_dir, read_only=True)
    except OSError as exc:
        raise log_dir_error(log_dir, exc, writing=False) from None


def broker_config_of(log_dir: Path, args: argparse.Namespace) -> BrokerConfig:
    """The broker config a writing command works with: ``--broker-config``, else
    Kafka's defaults, for ``log_dir``.

    Raises:
        SetupError: the broker config file cannot be read or has a bad key or value.
    """
    if args.broker_config is None:
        return BrokerConfig(log_dirs=(str(log_dir),))
    properties = read_config_file(args.broker_config, "--broker-config")
    try:
        return BrokerConfig.from_properties(properties)
    except ConfigError as exc:
        raise config_file_error(args.broker_config, "--broker-config", exc) from None


def open_writable(
    log_dir: Path, args: argparse.Namespace, broker: BrokerConfig | None = None
) -> LogManager:
    """Open for writing as the daemon does: with the broker config it was given
    (``broker``, else ``broker_config_of``) and the file system's position index, so
    that every append here keeps the ``.seglogpos`` files the mount reads in step.

    Raises:
        LogDirLockedError: another process writes the directory.
        SetupError: the broker config file cannot be read or has a bad value; the
            log directory cannot be created or written (permissions, a read-only
            file system).
    """
    if broker is None:
        broker = broker_config_of(log_dir, args)
    try:
        return LogManager.open(log_dir, broker, extension=position_index_spec)
    except OSError as exc:
        raise log_dir_error(
            log_dir,
            exc,
            writing=True,
            read_only_hint=": the commands that read (consume, topics list|describe) work",
        ) from None


def stdout_reader_gone() -> bool:
    """Whether stdout is a pipe (or socket) whose reader has gone (``| head``).

    A ``BrokenPipeError`` may also come from the daemon's control socket; only a
    closed stdout is the quiet end every Unix tool makes. The kernel reports a pipe
    without readers as ``POLLERR`` on its write end, so this asks without writing.
    """
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # replaced stdout (tests, embedding)
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def silence_stdout() -> None:
    """Point stdout at ``/dev/null`` so the interpreter's final flush of what is still
    buffered cannot fail again (``Exception ignored ... BrokenPipeError``, exit 120)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def daemon_command(
    module_name: str, command: str, description: str, argv: list[str]
) -> tuple[Any, argparse.Namespace]:
    """A daemon's module and its parsed arguments. The module parses its own options
    and is imported only for its command: it loads trio (and pyfuse3 or kio), which
    the other commands do not need.

    Raises:
        CommandError: the module cannot be imported (a dependency is missing).
    """
    try:
        module: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise CommandError(f"{command} is not available: {exc}") from None
    parser = Parser(prog=f"{PROG} {command}", description=description)
    module.add_arguments(parser)
    return module, parser.parse_args(argv)

"""What every command of the command line shares: exit codes, errors, the log directory.

Exit codes: 0 ok, 1 runtime error (the log directory said no: unknown topic, locked
directory, corrupt data, I/O), 2 usage error (the command line is wrong). Commands
raise ``UsageError`` or ``CommandError`` (or let an engine error through); ``main``
turns each into one line on stderr and its exit code, by the rules in
``seglogfs.cli.main``.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import NoReturn

from storage import BrokerConfig, LogManager, load_properties

from ..positions import position_index_spec

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
    "existing_log_dir",
    "log_dir_of",
    "open_read_only",
    "open_writable",
    "parents",
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
    value = getattr(args, "log_dir", None) or os.environ.get(LOG_DIR_ENV)
    if not value:
        raise UsageError(f"no log directory: pass -d/--log-dir or set {LOG_DIR_ENV}")
    return Path(value)


def existing_log_dir(args: argparse.Namespace) -> Path:
    path = log_dir_of(args)
    if not path.is_dir():
        raise CommandError(f"log directory {path} does not exist")
    return path


def open_read_only(log_dir: Path) -> LogManager:
    if not log_dir.is_dir():
        raise CommandError(f"log directory {log_dir} does not exist")
    return LogManager.open(log_dir, read_only=True)


def broker_config_of(log_dir: Path, args: argparse.Namespace) -> BrokerConfig:
    """The broker config a writing command works with: ``--broker-config``, else
    Kafka's defaults, for ``log_dir``.

    Raises:
        ConfigError: the broker config file has a bad value.
        OSError: the broker config file cannot be read.
    """
    if args.broker_config is None:
        return BrokerConfig(log_dirs=(str(log_dir),))
    return BrokerConfig.from_properties(load_properties(args.broker_config))


def open_writable(
    log_dir: Path, args: argparse.Namespace, broker: BrokerConfig | None = None
) -> LogManager:
    """Open for writing as the daemon does: with the broker config it was given
    (``broker``, else ``broker_config_of``) and the file system's position index, so
    that every append here keeps the ``.seglogpos`` files the mount reads in step.

    Raises:
        LogDirLockedError: another process writes the directory.
        ConfigError: the broker config file has a bad value.
        OSError: the broker config file cannot be read.
    """
    if broker is None:
        broker = broker_config_of(log_dir, args)
    return LogManager.open(log_dir, broker, extension=position_index_spec)

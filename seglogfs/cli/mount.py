"""``seglogfs mount LOGDIR MOUNTPOINT``: start the FUSE daemon (``seglogfs.daemon``).

The daemon parses its own options (``seglogfs.daemon.mount.add_arguments``); it is
imported only for this command, so the other commands never load pyfuse3 and trio.
"""

from __future__ import annotations

import argparse

from .common import Parents, Parser, daemon_command

__all__ = ["add_parser", "run_mount"]


def run_mount(argv: list[str]) -> int:
    mount, args = daemon_command(
        "seglogfs.daemon.mount",
        "mount",
        "Mount a log directory: topics as directories, partitions as files.",
        argv,
    )
    # After a mount, exit as soon as the work is done, without the interpreter's teardown.
    return int(mount.exit_when_done(mount.run(args)))


def add_parser(commands: argparse._SubParsersAction[Parser], shared: Parents) -> None:
    """List ``mount`` in ``seglogfs --help``; ``main`` hands its arguments to
    ``run_mount`` before the rest of the command line is parsed."""
    commands.add_parser(
        "mount",
        help="mount a log directory (seglogfs mount LOGDIR MOUNTPOINT [-o ro,allow_other])",
        add_help=False,
    )

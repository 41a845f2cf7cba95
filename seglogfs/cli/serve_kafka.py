"""``seglogfs serve-kafka LOGDIR``: serve a log directory to Kafka clients without a
mount (``seglogfs.daemon.serve_kafka``).

The daemon parses its own options; it is imported only for this command, so the other
commands never load trio and kio.
"""

from __future__ import annotations

import argparse

from .common import Parents, Parser, daemon_command

__all__ = ["add_parser", "run_serve_kafka"]


def run_serve_kafka(argv: list[str]) -> int:
    daemon, args = daemon_command(
        "seglogfs.daemon.serve_kafka",
        "serve-kafka",
        "Serve a log directory to Kafka clients (a single-node Kafka endpoint), without a mount.",
        argv,
    )
    return int(daemon.run(args))


def add_parser(commands: argparse._SubParsersAction[Parser], shared: Parents) -> None:
    """List ``serve-kafka`` in ``seglogfs --help``; ``main`` hands its arguments to
    ``run_serve_kafka`` before the rest of the command line is parsed."""
    commands.add_parser(
        "serve-kafka",
        help="serve a log directory to Kafka clients without a mount "
        "(seglogfs serve-kafka LOGDIR [--kafka HOST:PORT])",
        add_help=False,
    )

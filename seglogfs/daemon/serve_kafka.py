"""``seglogfs serve-kafka LOGDIR``: a log directory served to Kafka clients, no mount.

For machines without FUSE (a container without ``/dev/fuse``), and for users who
only want a single-node Kafka endpoint on a seglogfs directory. It is the mount's
daemon without the file system: the same engine open (writer lock, recovery report),
background work (roll, retention, flush, checkpoints, compaction), control socket
(``seglogfs topics``/``produce``/``compact``/``groups`` write through it while it
runs), Kafka listener, metrics and systemd notifications (``lifecycle``). Mount the
directory later (after stopping this) and the topics Kafka clients made are there,
rendered in ``seglog.default.format``.

The listener is the point: without ``--kafka`` or ``listeners=`` in ``--config`` it
binds Kafka's default ``127.0.0.1:9092``, and an address that cannot be bound ends the
daemon with one line and exit 1 (a mount goes on without it). SIGTERM, SIGINT or SIGHUP
stop it: a cleaning pass is aborted, connections are closed, the engine is closed
(flush, checkpoints, clean-shutdown marker). Exit codes: 0 after a clean stop, 1 a
runtime error, 2 a usage error.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import trio

from storage import ConfigError, LogManager

from ..control.config import ControlConfig
from ..kafka.config import KafkaConfig
from ..open_files_limit import raise_open_files_limit
from ..setup_check import SetupError, check_log_dir, read_config_file
from . import sd_notify
from .lifecycle import (
    StartError,
    ThreadBridge,
    close_manager,
    configure_logging,
    configured_default_format,
    kafka_settings,
    metrics_settings,
    open_manager,
    read_settings,
    run_serving,
    serve_metrics,
    start_services,
    watchdog,
)
from .malloc_tuning import tune_malloc

__all__ = ["DEFAULT_LISTENER", "add_arguments", "main", "run"]

logger = logging.getLogger(__name__)

DEFAULT_LISTENER = "127.0.0.1:9092"
"""Kafka's port, on loopback: the listener has no TLS and no authentication."""

_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``seglogfs serve-kafka``."""
    parser.add_argument("log_dir", metavar="LOGDIR", type=Path, help="the log directory")
    parser.add_argument(
        "--kafka",
        metavar="HOST:PORT",
        help=f"where to listen (default {DEFAULT_LISTENER}, or listeners= in --config; "
        "no host: 127.0.0.1; 0.0.0.0: every address)",
    )
    parser.add_argument(
        "--kafka-advertised",
        metavar="HOST:PORT",
        help="the address clients are told to connect to (default: --kafka's)",
    )
    parser.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="a server.properties file (log.* defaults, num.partitions, "
        "auto.create.topics.enable, listeners, ...), as seglogfs mount takes",
    )
    parser.add_argument(
        "--metrics",
        metavar="HOST:PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics (off by default)",
    )
    parser.add_argument("--debug", action="store_true", help="log every request (verbose)")


def _error(message: str) -> None:
    print(f"seglogfs serve-kafka: error: {message}", file=sys.stderr)


def _listener_settings(args: argparse.Namespace) -> KafkaConfig:
    """``kafka_settings``, with Kafka's default address when none is given.

    Raises:
        SetupError: the file cannot be read (exit 1) or has a bad value (exit 2).
    """
    config = kafka_settings(args)
    if config is not None:
        return config
    properties = {} if args.config is None else read_config_file(args.config, "--config")
    try:
        config = KafkaConfig.from_settings(properties, DEFAULT_LISTENER, args.kafka_advertised)
    except ConfigError as exc:
        raise SetupError(str(exc), usage=True) from None
    assert config is not None  # a listener was given
    return config


def run(args: argparse.Namespace) -> int:
    """Serve until signalled; the exit code."""
    configure_logging(args.debug)
    logger.debug("open files limit %d", raise_open_files_limit())
    tune_malloc()
    log_dir: Path = args.log_dir
    try:
        check_log_dir(log_dir, must_exist=False)
        settings = read_settings(args.config)
        default_format = configured_default_format(args.config)
        kafka_config = _listener_settings(args)
        metrics_listener = metrics_settings(args)
    except SetupError as exc:
        _error(str(exc))
        return 2 if exc.usage else 1
    try:
        manager = open_manager(log_dir, settings, default_format=default_format)
    except StartError as exc:
        _error(str(exc))
        return 1

    def serve() -> None:
        with contextlib.ExitStack() as stack:
            stack.callback(close_manager, manager)
            if metrics_listener is not None:
                serve_metrics(stack, manager, metrics_listener)
            trio.run(_serve, manager, settings.control, kafka_config)

    code = run_serving(serve, _error)
    if code == 0:
        logger.info("stopped serving %s", log_dir)
    return code


async def _serve(
    manager: LogManager, control_config: ControlConfig, kafka_config: KafkaConfig
) -> None:
    """Serve until a stop signal.

    Raises:
        StartError: the listener cannot be bound (raised outside the nursery: one
            line, not an exception group).
    """
    bridge = ThreadBridge()
    failed: StartError | None = None
    # Listened to before anything starts: a stop signal from here on is a clean stop.
    with trio.open_signal_receiver(*_STOP_SIGNALS) as signals:
        async with trio.open_nursery() as nursery:
            try:
                await start_services(
                    nursery, manager, bridge, control_config, kafka_config, kafka_required=True
                )
            except StartError as exc:
                failed = exc
            else:
                sd_notify.notify("READY=1")
                interval = sd_notify.watchdog_interval()
                if interval is not None:
                    nursery.start_soon(watchdog, interval)
                async for signum in signals:
                    logger.info("%s: stopping", signal.Signals(signum).name)
                    break
                sd_notify.notify("STOPPING=1")
            # A cleaning pass in a worker thread stops at its next batch: the
            # cancellation waits for the threads.
            manager.abort_cleaning()
            nursery.cancel_scope.cancel()
    if failed is not None:
        raise failed


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m seglogfs.daemon.serve_kafka LOGDIR ...`` (as ``seglogfs serve-kafka``)."""
    parser = argparse.ArgumentParser(
        prog="seglogfs serve-kafka",
        description="Serve a log directory to Kafka clients, without a mount.",
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

"""What every seglogfs daemon does around its face: the settings ``--config`` gives,
the engine opened (recovery reported, the writer lock taken), the worker-thread bridge,
the background work, the control socket and the Kafka listener in one trio nursery,
metrics, systemd notifications, and the engine closed on the way out.

Two daemons use it: ``seglogfs mount`` (``mount``: the file system in front) and
``seglogfs serve-kafka`` (``serve_kafka``: the Kafka listener alone, for machines
without FUSE or users without a need for files). No FUSE here: this module never
imports pyfuse3.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from storage import (
    BrokerConfig,
    ConfigError,
    GroupConfig,
    LogDirLockedError,
    LogManager,
    OffsetStore,
    StorageError,
)
from storage.log.topic import FORMATS

from ..control import server as control_server
from ..control.config import ControlConfig
from ..kafka.config import KafkaConfig
from ..positions import position_index_spec
from ..setup_check import SetupError, config_file_error, log_dir_error, read_config_file
from . import metrics, sd_notify
from .maintenance import run_maintenance
from .malloc_tuning import release_free_memory
from .read_ahead import fetch_max_bytes
from .recovery_report import RecoveryReport

__all__ = [
    "DEFAULT_FORMAT_KEY",
    "WORKER_THREADS",
    "DaemonSettings",
    "StartError",
    "ThreadBridge",
    "close_manager",
    "configure_logging",
    "configured_default_format",
    "kafka_settings",
    "metrics_settings",
    "open_manager",
    "read_settings",
    "run_serving",
    "serve_metrics",
    "start_services",
    "watchdog",
]

logger = logging.getLogger(__name__)

WORKER_THREADS = 16
"""Worker threads for engine calls. A roll's fsync holds one; reads of other partitions
go on in the others."""


DEFAULT_FORMAT_KEY = "seglog.default.format"
"""The ``--config`` key of the format of topics that carry none of their own (a Kafka
broker's, one a Kafka client creates) and of mkdir (``-o default_format`` wins)."""


class StartError(Exception):
    """The daemon cannot start: one line, exit code 1."""


def configure_logging(debug: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


@dataclass(frozen=True)
class DaemonSettings:
    """What ``--config`` sets: the broker config (``None``: Kafka's defaults), the
    control socket's bounds, the readers' ``fetch.max.bytes`` and the group
    coordinator's settings (``offsets.topic.*``, ``offsets.retention.*``)."""

    broker: BrokerConfig | None
    control: ControlConfig
    read_ahead_bytes: int
    groups: GroupConfig


def read_settings(config: Path | None) -> DaemonSettings:
    """The settings of ``--config`` (Kafka's defaults without one).

    Raises:
        SetupError: the file cannot be read (exit 1) or has a bad key or value (exit 2).
    """
    if config is None:
        return DaemonSettings(None, ControlConfig(), fetch_max_bytes({}), GroupConfig())
    properties = read_config_file(config, "--config")
    try:
        return DaemonSettings(
            BrokerConfig.from_properties(properties),
            ControlConfig.from_properties(properties),
            fetch_max_bytes(properties),
            GroupConfig.from_properties(properties),
        )
    except ConfigError as exc:
        raise config_file_error(config, "--config", exc) from None


def configured_default_format(config: Path | None) -> str:
    """``seglog.default.format`` in ``--config``, else ``lines``.

    Raises:
        SetupError: the file cannot be read (exit 1), or names no format (exit 2).
    """
    if config is None:
        return "lines"
    value = read_config_file(config, "--config").get(DEFAULT_FORMAT_KEY)
    if value is None:
        return "lines"
    value = value.strip()
    if value not in FORMATS:
        raise SetupError(
            f"--config {config}: {DEFAULT_FORMAT_KEY}={value!r}: "
            f"must be one of {', '.join(FORMATS)}",
            usage=True,
        )
    return value


def kafka_settings(args: argparse.Namespace) -> KafkaConfig | None:
    """The Kafka listener's settings (``--kafka``, ``--kafka-advertised``, ``listeners``
    and ``advertised.listeners`` in ``--config``); None: no listener.

    Raises:
        SetupError: the file cannot be read (exit 1) or has a bad value (exit 2).
    """
    properties = {} if args.config is None else read_config_file(args.config, "--config")
    try:
        return KafkaConfig.from_settings(properties, args.kafka, args.kafka_advertised)
    except ConfigError as exc:
        raise SetupError(str(exc), usage=True) from None


def metrics_settings(args: argparse.Namespace) -> metrics.MetricsConfig | None:
    """Where ``/metrics`` is served (``--metrics``, else ``seglog.metrics.listener`` in
    ``--config``) and the server's ``seglog.metrics.*`` bounds; None: no metrics.

    Raises:
        SetupError: the file cannot be read (exit 1) or has a bad value (exit 2).
    """
    properties = {} if args.config is None else read_config_file(args.config, "--config")
    value: str | None = args.metrics
    where = "--metrics"
    if value is None and args.config is not None:
        value = properties.get(metrics.METRICS_KEY)
        where = f"--config {args.config}: {metrics.METRICS_KEY}"
    try:
        return metrics.MetricsConfig.from_settings(properties, value, where)
    except ValueError as exc:
        raise SetupError(str(exc), usage=True) from None
    except ConfigError as exc:
        raise config_file_error(args.config, "--config", exc) from None


def open_manager(
    log_dir: Path,
    settings: DaemonSettings,
    *,
    read_only: bool = False,
    default_format: str = "lines",
    read_only_hint: str = "",
) -> LogManager:
    """The engine on ``log_dir`` as a daemon opens it (the position index of the
    mount's readers, the group coordinator's offset store made with ``settings``),
    with one INFO line per partition recovery worked on after a crash.

    Raises:
        StartError: the directory is locked by another writer, unreadable, or holds
            metadata the engine refuses (``read_only_hint`` ends the line of the
            first two).
    """
    # After a crash the open recovers each partition: say per partition what it did.
    recovery = None if read_only else RecoveryReport.before_open(log_dir)
    try:
        manager = LogManager.open(
            log_dir,
            settings.broker,
            read_only=read_only,
            extension=position_index_spec,
            default_format=default_format,
        )
    except LogDirLockedError:
        raise StartError(
            f"log directory {log_dir} is already mounted or written by another process "
            f"(its writer lock is held){read_only_hint}"
        ) from None
    except OSError as exc:
        hint = "" if read_only else read_only_hint
        error = log_dir_error(log_dir, exc, writing=not read_only, read_only_hint=hint)
        raise StartError(str(error)) from None
    except StorageError as exc:  # unreadable metadata, a stored override that is invalid
        raise StartError(str(exc)) from None
    finally:
        if recovery is not None:
            recovery.stop()  # the engine's lines were collected during the open only
    if recovery is not None:
        recovery.log_lines(manager)
    # The directory's one offset store (the views, the control socket and the Kafka
    # listener share it) takes the --config group settings: made here, first.
    OffsetStore.shared(manager, settings.groups)
    return manager


def run_serving(serve: Callable[[], object], error: Callable[[str], object]) -> int:
    """Run ``serve`` (a daemon's life once the engine is open); the exit code: 0, or 1
    with one line through ``error`` when it could not start or could not stop cleanly.
    """
    try:
        serve()
    except StartError as exc:
        error(str(exc))
        return 1
    except (StorageError, OSError) as exc:
        # The engine could not flush or checkpoint on the way out (a full disk): the
        # data written so far is in the segments; without the clean-shutdown marker the
        # next open recovers.
        error(f"unclean shutdown: {exc}")
        return 1
    return 0


def close_manager(manager: LogManager) -> None:
    # Flush every log, write both checkpoints, then the clean-shutdown marker.
    manager.close()


def serve_metrics(
    stack: contextlib.ExitStack, manager: LogManager, listener: metrics.MetricsConfig
) -> None:
    """Serve ``/metrics`` in a thread of its own (a scrape never runs on the event
    loop) until ``stack`` closes.

    Raises:
        StartError: the address cannot be bound.
    """
    try:
        server = metrics.serve(manager, listener)
    except OSError as exc:
        raise StartError(
            f"cannot serve metrics on {listener.host}:{listener.port}: {exc}"
        ) from None
    stack.callback(server.close)
    logger.info("metrics at http://%s:%d/metrics", *server.address)


class ThreadBridge:
    """The one bridge from the event loop to worker threads (``trio.to_thread`` under a
    ``CapacityLimiter`` of ``WORKER_THREADS``). Made before ``trio.run``; the limiter
    is created inside it."""

    def __init__(self) -> None:
        self._limiter: trio.CapacityLimiter | None = None

    async def __call__(self, fn: Any, *args: Any) -> Any:
        if self._limiter is None:
            self._limiter = trio.CapacityLimiter(WORKER_THREADS)
        return await trio.to_thread.run_sync(fn, *args, limiter=self._limiter)


async def start_services(
    nursery: trio.Nursery,
    manager: LogManager,
    bridge: ThreadBridge,
    control_config: ControlConfig,
    kafka_config: KafkaConfig | None,
    *,
    read_only: bool = False,
    kafka_required: bool = False,
) -> None:
    """Start the background work, the control socket (writable daemons) and the Kafka
    listener (when configured) in ``nursery``.

    A control socket or listener that cannot be bound is an ERROR line and the daemon
    goes on without it, unless it is the daemon's reason to be (``kafka_required``).

    Raises:
        StartError: the required listener cannot be bound.
    """
    nursery.start_soon(functools.partial(run_maintenance, manager, bridge, read_only=read_only))
    if not read_only:
        try:
            serve_control = functools.partial(
                control_server.serve,
                config=control_config,
                release_memory=release_free_memory,
            )
            await nursery.start(serve_control, manager.log_dir, manager, bridge)
        except OSError as exc:
            # The daemon is still worth having: only the command line's writes
            # (which need the daemon while it holds the lock) are unavailable.
            logger.error(
                "control socket unavailable (%s): seglogfs topics/produce "
                "cannot write while this daemon runs",
                exc,
            )
    if kafka_config is not None:
        # Imported only when asked for: it loads kio (Kafka's message types).
        from ..kafka import server as kafka_server

        try:
            serve_kafka = functools.partial(kafka_server.serve, counters=metrics.COUNTERS)
            await nursery.start(serve_kafka, manager, bridge, kafka_config)
        except OSError as exc:
            where = f"{kafka_config.host}:{kafka_config.port}"
            if kafka_required:
                raise StartError(f"cannot listen on {where}: {exc}") from None
            logger.error("kafka listener unavailable on %s (%s)", where, exc)


async def watchdog(interval: float) -> None:
    """Tell systemd the daemon is alive every ``interval`` seconds."""
    while True:
        sd_notify.notify("WATCHDOG=1")
        await trio.sleep(interval)

"""``seglogfs mount LOGDIR MOUNTPOINT``: the FUSE daemon's lifecycle.

The order of the steps matters:

0. the set-up is checked (``seglogfs.setup_check``) before anything is created or
   mounted: ``/dev/fuse`` usable, a mount point that exists, is a directory and holds
   no FUSE mount, a log directory that is a directory outside the mount point (and
   outside any seglogfs mount), a readable ``--config`` with valid keys and values;
   each mistake is one line naming it;
1. the engine is opened first (``LogManager.open``): it takes the writer lock, so a
   second writable mount of the same log directory fails with one line before anything
   is mounted; ``-o ro`` opens it read-only (no lock, no file ever changed);
2. ``pyfuse3.init`` mounts; from here on one exit stack undoes everything, in reverse:
   partial lines of files still open are appended, the engine is closed (flush,
   checkpoints, Kafka's ``.kafka_cleanshutdown`` marker, lock released), and only then
   is the file system unmounted, so whoever waits for the mount to disappear finds the
   data durable;
3. one trio nursery runs the FUSE main loop, the background work
   (``maintenance``), the control socket (``seglogfs.control.server``) the command
   line writes through, the render process's answers (``renderer``), the
   systemd watchdog, and the signal handler: SIGTERM/SIGINT call
   ``pyfuse3.terminate()``, the main loop returns, the nursery is cancelled and the
   render process is stopped (it ignores SIGINT and exits when its socket closes).

``READY=1`` goes to systemd once the mount exists and the control socket listens,
``STOPPING=1`` when a signal starts the shutdown. Exit codes: 0 after a clean unmount,
1 for a runtime error (a set-up mistake, a locked log directory, a mount failure), 2 for
a usage error (an unknown option, a bad key or value in ``--config``).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pyfuse3
import trio

from storage import LogManager
from storage.log.topic import FORMATS

from ..control.config import ControlConfig
from ..kafka.config import KafkaConfig
from ..open_files_limit import raise_open_files_limit
from ..setup_check import (
    SetupError,
    check_apart,
    check_fuse_device,
    check_log_dir,
    check_mount_point,
    check_mount_point_empty,
)
from . import metrics, sd_notify
from .lifecycle import (
    WORKER_THREADS,
    DaemonSettings,
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
from .malloc_tuning import (
    MALLOC_TUNING_ENV,
    MMAP_THRESHOLD,
    TRIM_THRESHOLD,
    tune_malloc,
)
from .operations import Operations, enable_request_logging
from .renderer import Renderer

__all__ = [
    "MALLOC_TUNING_ENV",
    "WORKER_THREADS",
    "add_arguments",
    "exit_when_done",
    "main",
    "run",
    "tune_malloc",
]

logger = logging.getLogger(__name__)

_KNOWN_OPTIONS = ("ro", "rw", "allow_other", "internal", "nonempty", "default_format=FORMAT")

RENDER_PROCESS_ENV = "SEGLOG_RENDER_PROCESS"
"""Set to ``0`` to render every read in the daemon's threads (no render process)."""


class UsageError(Exception):
    """A command-line mistake: exit code 2."""


class _MountError(StartError):
    """The kernel mount failed: exit code 1 with one line."""


@dataclass(frozen=True)
class MountOptions:
    read_only: bool = False
    allow_other: bool = False
    show_internal: bool = False
    nonempty: bool = False  # mount over a directory holding files (they stay hidden)
    # The format of topics without one of their own (a Kafka broker's), and of mkdir.
    default_format: str | None = None


def parse_options(values: Sequence[str]) -> MountOptions:
    """Parse ``-o`` values (each a comma-separated list).

    Raises:
        UsageError: an unknown option.
    """
    read_only = allow_other = show_internal = nonempty = False
    default_format: str | None = None
    for value in values:
        for option in filter(None, value.split(",")):
            if option == "ro":
                read_only = True
            elif option == "rw":
                read_only = False
            elif option == "allow_other":
                allow_other = True
            elif option == "internal":
                show_internal = True
            elif option == "nonempty":
                nonempty = True
            elif option.startswith("default_format="):
                default_format = _checked_format(option.partition("=")[2], "-o default_format")
            else:
                raise UsageError(
                    f"unknown mount option {option!r} (known: {', '.join(_KNOWN_OPTIONS)})"
                )
    return MountOptions(
        read_only, allow_other, show_internal, nonempty=nonempty, default_format=default_format
    )


def _checked_format(value: str, where: str) -> str:
    """Raises: UsageError: ``value`` is not a topic format."""
    if value not in FORMATS:
        raise UsageError(f"{where}={value!r}: must be one of {', '.join(FORMATS)}")
    return value


def default_format_of(options: MountOptions, config: Path | None) -> str:
    """The mount's default topic format: ``-o default_format``, else the ``--config``
    file's ``seglog.default.format``, else ``lines``.

    Raises:
        SetupError: the file cannot be read (exit 1), or names no format (exit 2).
    """
    if options.default_format is not None:
        return options.default_format
    return configured_default_format(config)


def _fuse_option_value(text: str) -> str:
    """``text`` escaped for one libfuse option value. libfuse splits ``-o`` at commas
    and reads ``\\c`` as ``c`` and ``\\ooo`` as an octal byte; pyfuse3 passes options
    as ASCII. So commas and backslashes are escaped, and every byte outside printable
    ASCII (a UTF-8 path, a control character) is written in octal: any path a log
    directory can have comes through byte for byte."""
    escaped = []
    for byte in os.fsencode(text):
        if byte in b",\\":
            escaped.append("\\" + chr(byte))
        elif 0x20 <= byte < 0x7F:
            escaped.append(chr(byte))
        else:
            escaped.append(f"\\{byte:03o}")
    return "".join(escaped)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``seglogfs mount``."""
    parser.add_argument("log_dir", metavar="LOGDIR", type=Path, help="the log directory")
    parser.add_argument("mountpoint", metavar="MOUNTPOINT", type=Path, help="an empty directory")
    parser.add_argument(
        "-o",
        dest="options",
        action="append",
        default=[],
        metavar="OPT[,OPT...]",
        help="ro: read-only (never changes a file; follows a live writer); "
        "allow_other: let other users in; internal: show Kafka's internal __* topics; "
        "nonempty: mount over a directory that holds files (hidden while mounted); "
        "default_format=lines|raw|json: the format of topics that carry none of their "
        "own (a Kafka broker's) and of mkdir (default lines)",
    )
    parser.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="a server.properties file (log.* defaults, num.partitions, intervals, "
        "the control socket's socket.request.max.bytes, max.connections, ...)",
    )
    parser.add_argument("--debug", action="store_true", help="log every request (verbose)")
    parser.add_argument(
        "--kafka",
        metavar="HOST:PORT",
        help="serve Kafka's wire protocol there too (off by default; no host: 127.0.0.1; "
        "also listeners=PLAINTEXT://HOST:PORT in --config)",
    )
    parser.add_argument(
        "--metrics",
        metavar="HOST:PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics (off by default; no "
        f"host: 127.0.0.1; also {metrics.METRICS_KEY}=HOST:PORT in --config)",
    )
    parser.add_argument(
        "--kafka-advertised",
        metavar="HOST:PORT",
        help="the address Kafka clients are told to connect to (default: --kafka's)",
    )


def _configure_logging(debug: bool) -> None:
    configure_logging(debug)
    enable_request_logging(debug)
    if not debug:
        # pyfuse3 logs each worker task start at DEBUG only; keep INFO quiet.
        logging.getLogger("pyfuse3").setLevel(logging.INFO)


def _error(message: str) -> None:
    print(f"seglogfs mount: error: {message}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    """Run the daemon in the foreground until unmounted or signalled; the exit code."""
    _configure_logging(args.debug)
    logger.debug("open files limit %d", raise_open_files_limit())
    if tune_malloc():
        logger.debug("malloc: mmap threshold %d, trim threshold %d", MMAP_THRESHOLD, TRIM_THRESHOLD)
    try:
        options = parse_options(args.options)
    except UsageError as exc:
        _error(str(exc))
        return 2
    log_dir: Path = args.log_dir
    mountpoint: Path = args.mountpoint
    try:
        # Each mistake named before anything is created or mounted.
        check_fuse_device()
        check_mount_point(mountpoint)
        if not options.nonempty:
            check_mount_point_empty(mountpoint)
        check_log_dir(log_dir, must_exist=options.read_only)
        check_apart(log_dir, mountpoint)
        settings = read_settings(args.config)
        default_format = default_format_of(options, args.config)
        kafka_config = kafka_settings(args)
        metrics_listener = metrics_settings(args)
    except SetupError as exc:
        _error(str(exc))
        return 2 if exc.usage else 1
    try:
        manager = open_manager(
            log_dir,
            settings,
            read_only=options.read_only,
            default_format=default_format,
            read_only_hint="; mount it read-only with -o ro",
        )
    except StartError as exc:
        _error(str(exc))
        return 1
    code = run_serving(
        lambda: _mount_and_serve(
            log_dir,
            mountpoint,
            manager,
            options,
            settings,
            kafka_config,
            metrics_listener,
        ),
        _error,
    )
    if code == 0:
        logger.info("unmounted %s", mountpoint)
    return code


def _mount_and_serve(
    log_dir: Path,
    mountpoint: Path,
    manager: LogManager,
    options: MountOptions,
    settings: DaemonSettings,
    kafka_config: KafkaConfig | None = None,
    metrics_listener: metrics.MetricsConfig | None = None,
) -> None:
    with contextlib.ExitStack() as stack:
        mounted = _Mounted()
        stack.callback(mounted.unmount)  # last: after the engine is closed
        stack.callback(close_manager, manager)
        if metrics_listener is not None:
            # Before the mount, so that an address in use is one line and no mount;
            # stopped before the engine is closed.
            serve_metrics(stack, manager, metrics_listener)
        bridge = ThreadBridge()
        ops = Operations(
            manager,
            bridge,
            read_only=options.read_only,
            show_internal=options.show_internal,
            fetch_max_bytes=settings.read_ahead_bytes,
        )
        stack.callback(ops.finish)  # first: partial lines of files still open
        # The log directory as the file system's name and seglogfs as its type, as sshfs
        # shows user@host:path: mount, df and findmnt then say what is mounted (a bare
        # "seglogfs" source was even taken for a path relative to the caller's cwd).
        fuse_options = {
            f"fsname={_fuse_option_value(os.path.realpath(log_dir))}",
            "subtype=seglogfs",
            "default_permissions",
        }
        if options.read_only:
            fuse_options.add("ro")
        if options.allow_other:
            fuse_options.add("allow_other")
        # From the moment the mount exists until the event loop's receiver takes over
        # (``_handle_signals``), a stop signal is kept rather than left to its default
        # action, which killed the daemon and left a dead mount behind.
        for signum in _STOP_SIGNALS:
            signal.signal(signum, _keep_early_signal)
        try:
            pyfuse3.init(ops, str(mountpoint), fuse_options)
        except RuntimeError as exc:
            # What could be checked was (check_mount_point); libfuse or fusermount3
            # printed the reason on the line before this one.
            raise _MountError(f"cannot mount on {mountpoint}: {exc}") from None
        mounted.mounted = True
        global _served
        _served = True
        logger.info(
            "mounted %s on %s (%s)",
            log_dir,
            mountpoint,
            "read-only" if options.read_only else "read-write",
        )
        trio.run(_serve, ops, manager, bridge, options, settings.control, kafka_config)


class _Mounted:
    """Unmounts at exit if the mount was made (the exit stack's first entry)."""

    mounted = False

    def unmount(self) -> None:
        if self.mounted:
            pyfuse3.close(unmount=True)


async def _serve(
    ops: Operations,
    manager: LogManager,
    bridge: ThreadBridge,
    options: MountOptions,
    control_config: ControlConfig,
    kafka_config: KafkaConfig | None = None,
) -> None:
    async with trio.open_nursery() as nursery:
        renderer = _start_renderer()
        metrics.watch_renderer(renderer)
        if renderer is not None:
            nursery.start_soon(renderer.run)
        ops.use_renderer(renderer, nursery)  # also without one: memory is given back there
        nursery.start_soon(_handle_signals)
        # The mount is worth having without the control socket or the Kafka listener.
        await start_services(
            nursery, manager, bridge, control_config, kafka_config, read_only=options.read_only
        )
        sd_notify.notify("READY=1")
        interval = sd_notify.watchdog_interval()
        if interval is not None:
            nursery.start_soon(watchdog, interval)
        try:
            await pyfuse3.main()
        finally:
            # A cleaning pass in a worker thread stops at its next batch: the
            # cancellation below waits for the threads.
            manager.abort_cleaning()
            nursery.cancel_scope.cancel()
            if renderer is not None:
                renderer.close()


def _start_renderer() -> Renderer | None:
    if os.environ.get(RENDER_PROCESS_ENV) == "0":
        return None
    try:
        return Renderer.start()
    except (OSError, AttributeError) as exc:  # AttributeError: no memfd_create
        logger.warning("render process unavailable (%s): partitions render in threads", exc)
        return None


_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_early_signals: list[int] = []
"""Stop signals that came before ``_handle_signals`` listened (see ``_mount_and_serve``)."""


def _keep_early_signal(signum: int, frame: object) -> None:
    _early_signals.append(signum)


async def _handle_signals() -> None:
    with trio.open_signal_receiver(*_STOP_SIGNALS) as signals:
        if not _early_signals:
            async for signum in signals:
                _early_signals.append(signum)
                break
        # pyfuse3.main() may not have started yet: the session is marked exited, so
        # its loop returns at once when it does.
        logger.info("%s: unmounting", signal.Signals(_early_signals[0]).name)
        sd_notify.notify("STOPPING=1")
        pyfuse3.terminate()


_served = False
"""Whether this process mounted (see ``exit_when_done``)."""


def exit_when_done(code: int) -> int:
    """Return ``code``, unless this process mounted: then end it with ``code`` now.

    When ``run`` returns after a mount, the daemon's work is done: partial lines
    appended, every log flushed and checkpointed, the clean-shutdown marker written,
    the file system unmounted, the render process stopped. What remains is the
    interpreter's teardown, which frees every object the daemon made, one by one, with
    the mount already gone: 0.3-0.4 s measured after a few reads, longer the more the
    daemon held, during which a supervisor (systemd, a script waiting for the exit)
    still sees it running. Logging and standard streams are flushed first; a process
    that never mounted (a refused set-up) exits as usual.
    """
    if not _served:
        return code
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m seglogfs.daemon LOGDIR MOUNTPOINT ...`` (the same as ``seglogfs mount``)."""
    parser = argparse.ArgumentParser(
        prog="seglogfs mount", description="Mount a log directory (foreground daemon)."
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))

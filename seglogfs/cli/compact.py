"""``seglogfs compact [TOPIC...]``: run the log cleaner now (Kafka has no such tool: its
cleaner threads run on their own schedule, as the daemon's background work does here).

A forced pass over every log of the topics named (none named: of every topic whose
``cleanup.policy`` has ``compact``), repeated until each log's dirty section is clean
(a log with more keys than the offset map holds takes several passes):
``LogManager.clean(topics, force=True, until_clean=True)``, through
``seglogfs.control.admin.compact``. As the cleaner does, it never touches a log's
active segment, nor records younger than ``min.compaction.lag.ms``.

When a daemon owns the log directory (its control socket answers) the request goes
through it (op ``compact``): the daemon runs the same call in a worker thread, after a
background pass in progress, and answers with the same summary. Otherwise the
directory is opened for writing here (``--broker-config`` for the ``log.cleaner.*``
settings).

Output, on stdout: a line per log compacted, tab-separated (shown as ``|``) as
``topics describe``::

    Compacted orders-0|passes: 1|segments: 12 -> 2|records: 20000 -> 100|bytes: 1228800 -> 10240

(records: those the passes read below where they stopped, and those they kept), then
``Total: N log(s) compacted`` with the same sums and the bytes reclaimed. A progress
bar over the bytes of the topics goes to stderr when it is a terminal (through a
daemon, the time elapsed).

Exit codes, as Unix tools treat their operands (``rm a b``): every topic named is
done that can be; 1 if any could not be, after the others, with a line on stderr for
each: an unknown topic (checked first: then nothing is compacted), a topic whose
policy has no ``compact`` (``seglogfs topics alter T --add-config
cleanup.policy=compact`` makes it compactable), a log whose pass failed (damage, or
the log changed under the pass; the log is whole). Nothing to compact (every log
clean already) is not an error: exit 0 and ``Total: 0 log(s) compacted``.
"""

from __future__ import annotations

import argparse
import sys
import threading
from collections.abc import Callable
from typing import Any

from tqdm import tqdm

from .. import control
from ..control.admin import compact
from .common import (
    EXIT_ERROR,
    EXIT_OK,
    PROG,
    Parents,
    Parser,
    existing_log_dir,
    open_writable,
)

__all__ = ["COMPACT_TIMEOUT_S", "add_parser"]

COMPACT_TIMEOUT_S = 24 * 3600.0
"""How long a ``compact`` through the daemon may take: the passes over a large log
run for minutes, after any background pass in progress."""

NO_COMPACT = "cleanup.policy has no compact"
"""The engine's reason for a named topic it does not clean."""


def _cmd_compact(args: argparse.Namespace) -> int:
    log_dir = existing_log_dir(args)
    topics: list[str] = list(args.topics)
    progress = sys.stderr.isatty()
    if control.daemon_socket(log_dir) is not None:
        result = _through_daemon(log_dir, topics, progress)
    else:
        with (
            open_writable(log_dir, args) as manager,
            tqdm(total=0, unit="B", unit_scale=True, desc="compact", disable=not progress) as bar,
        ):
            result = compact(manager, topics, _bar_hook(bar))
    return _report(result)


def _bar_hook(bar: tqdm[Any]) -> Callable[[int, int], None]:
    def update(done: int, total: int) -> None:
        bar.total = total
        bar.n = done
        bar.refresh()

    return update


def _through_daemon(log_dir: Any, topics: list[str], progress: bool) -> dict[str, Any]:
    """The daemon's answer to ``compact``; on a terminal, the time elapsed meanwhile."""
    if not progress:
        answer = control.request(log_dir, "compact", topics=topics, timeout=COMPACT_TIMEOUT_S)
        assert isinstance(answer, dict)
        return answer
    outcome: list[object] = []

    def ask() -> None:
        try:
            outcome.append(
                control.request(log_dir, "compact", topics=topics, timeout=COMPACT_TIMEOUT_S)
            )
        except BaseException as exc:
            outcome.append(exc)

    asking = threading.Thread(target=ask, name="compact-request", daemon=True)
    with tqdm(
        total=None, desc="compact (through the daemon)", bar_format="{desc}: {elapsed}"
    ) as bar:
        asking.start()
        while asking.is_alive():
            asking.join(0.5)
            bar.refresh()
    answer = outcome[0]
    if isinstance(answer, BaseException):
        raise answer
    assert isinstance(answer, dict)
    return answer


def _report(result: dict[str, Any]) -> int:
    cleaned: list[dict[str, Any]] = result["cleaned"]
    skipped: list[dict[str, Any]] = result["skipped"]
    for r in cleaned:
        print(
            f"Compacted {r['topic']}-{r['partition']}\tpasses: {r['passes']}\t"
            f"segments: {r['segments_before']} -> {r['segments_after']}\t"
            f"records: {r['records_read']} -> {r['records_kept']}\t"
            f"bytes: {r['bytes_before']} -> {r['bytes_after']}"
        )
    before = sum(r["bytes_before"] for r in cleaned)
    after = sum(r["bytes_after"] for r in cleaned)
    print(
        f"Total: {len(cleaned)} log(s) compacted\t"
        f"segments: {sum(r['segments_before'] for r in cleaned)} -> "
        f"{sum(r['segments_after'] for r in cleaned)}\t"
        f"records: {sum(r['records_read'] for r in cleaned)} -> "
        f"{sum(r['records_kept'] for r in cleaned)}\t"
        f"bytes: {before} -> {after} ({max(before - after, 0)} reclaimed)"
    )
    sys.stdout.flush()  # the summary before the error lines, when both are the terminal
    # A topic whose policy has no compact is one line, not one per partition.
    told: set[str] = set()
    for s in skipped:
        if s["reason"] == NO_COMPACT:
            if s["topic"] not in told:
                told.add(s["topic"])
                sys.stderr.write(
                    f"{PROG} compact: error: topic {s['topic']!r} not compacted: its {NO_COMPACT}\n"
                )
        else:
            sys.stderr.write(
                f"{PROG} compact: error: {s['topic']}-{s['partition']} not compacted: "
                f"{s['reason']}\n"
            )
    return EXIT_ERROR if skipped else EXIT_OK


def add_parser(commands: argparse._SubParsersAction[Parser], shared: Parents) -> None:
    """Add ``compact`` to ``commands``."""
    command = commands.add_parser(
        "compact",
        parents=[shared.log_dir, shared.writer],
        help="compact topics now (cleanup.policy=compact): keep the latest record per key",
        description="Run the log cleaner now over the topics named (default: every topic "
        "whose cleanup.policy has compact): forced passes until each log is clean, the "
        "active segment excepted. Through the daemon when one owns the log directory. "
        "Exit 1 if a topic could not be compacted (the others are).",
    )
    command.add_argument("topics", nargs="*", metavar="TOPIC", help="a topic to compact")
    command.set_defaults(handler=_cmd_compact, command_parser=command)

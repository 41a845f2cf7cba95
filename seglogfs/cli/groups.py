"""``seglogfs groups list|describe|reset-offsets|delete``: Kafka's
``kafka-consumer-groups.sh`` (``ConsumerGroupCommand``).

Groups are Kafka's: committed offsets in ``__consumer_offsets`` (``storage.OffsetStore``),
so a copy of a broker's log directory shows the groups committed there. The output is
the tool's: ``describe`` prints ``GROUP TOPIC PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG
CONSUMER-ID HOST CLIENT-ID`` with ``-`` for what is unknown (a partition nobody
consumes, a topic missing from the directory), and says on stderr when a group has no
active members; ``reset-offsets`` prints ``GROUP TOPIC PARTITION NEW-OFFSET``;
``delete`` prints ``Deletion of requested consumer groups ('g') was successful.``.

Rules, as Kafka's: a group that is consuming (a live member: a ``seglogfs consume -g``
or an open ``P@group=NAME`` view of the mount, see ``storage.OffsetStore``) can be
neither reset nor deleted. ``reset-offsets`` is a dry run unless ``--execute``; offsets
are kept within the log (``--to-offset`` and ``--shift-by`` past either end are moved
to it, with a warning); ``--to-datetime`` takes ISO 8601 (no zone means UTC, as
everywhere in seglogfs; Kafka's tool takes local time) and a partition with no record at
or after it resets to its log end.

Where the groups live: when a daemon owns the log directory (its control socket
answers) every command goes through it, since it knows the live members; without one,
``list`` and ``describe`` read the files (also beside a writer, and on a copy of a
broker's directory, whose last recorded members are shown) and ``reset-offsets
--execute`` and ``delete`` open the directory for writing (the writer lock: they fail
while a ``seglogfs consume -g`` or ``produce`` writes it).

``Coordinator`` is what this module and ``consume -g`` ask of the groups, answered by
the daemon (``DaemonCoordinator``) or by a store of this process (``LocalCoordinator``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import socket
import sys
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from storage import (
    GroupIdNotFoundError,
    LogManager,
    NonEmptyGroupError,
    OffsetStore,
    StorageError,
)
from storage.number import abbreviated, decimal_long, parse_java_integer

from .. import control
from ..control.protocol import group_result
from .common import (
    EXIT_OK,
    CommandError,
    Parents,
    Parser,
    UsageError,
    existing_log_dir,
    open_read_only,
    open_writable,
)

__all__ = [
    "Coordinator",
    "DaemonCoordinator",
    "LocalCoordinator",
    "add_parser",
    "coordinator",
    "parse_duration",
]

MISSING = "-"
"""Kafka's ``MISSING_COLUMN_VALUE``."""

Offsets = Mapping[tuple[str, int], int]


class Coordinator(Protocol):
    """The group operations, wherever the groups are kept. Results are the JSON shapes
    of the control socket (``control.protocol.group_result``)."""

    def list_groups(self) -> list[str]: ...
    def describe(self, group: str) -> dict[str, Any]: ...
    def commit(self, group: str, offsets: Offsets, member_id: str | None = None) -> None: ...
    def reset(self, group: str, offsets: Offsets) -> None: ...
    def delete(self, group: str) -> None: ...
    def join(self, group: str, topic: str, partitions: list[int]) -> tuple[str, list[int]]: ...
    def heartbeat(self, group: str, member_id: str) -> list[int]: ...
    def leave(self, group: str, member_id: str) -> None: ...


CLIENT_ID = "seglogfs-consume"
"""The ``CLIENT-ID`` of ``seglogfs consume -g`` members."""


class LocalCoordinator:
    """The groups of a log directory this process opened (the writer, or a reader)."""

    def __init__(self, manager: LogManager) -> None:
        self.store = OffsetStore.shared(manager)

    def list_groups(self) -> list[str]:
        return self.store.list_groups()

    def describe(self, group: str) -> dict[str, Any]:
        return group_result(self.store.describe_group(group))

    def commit(self, group: str, offsets: Offsets, member_id: str | None = None) -> None:
        self.store.commit(group, offsets, member_id=member_id)

    def reset(self, group: str, offsets: Offsets) -> None:
        self.store.reset_offsets(group, offsets)

    def delete(self, group: str) -> None:
        self.store.delete_group(group)

    def join(self, group: str, topic: str, partitions: list[int]) -> tuple[str, list[int]]:
        return self.store.join(
            group, topic, partitions, client_id=CLIENT_ID, host=socket.gethostname()
        )

    def heartbeat(self, group: str, member_id: str) -> list[int]:
        return self.store.heartbeat(group, member_id)

    def leave(self, group: str, member_id: str) -> None:
        self.store.leave(group, member_id)


def _offsets_json(offsets: Offsets) -> list[dict[str, object]]:
    return [{"topic": t, "partition": p, "offset": o} for (t, p), o in offsets.items()]


class DaemonCoordinator:
    """The groups the daemon owning ``log_dir`` keeps, through its control socket. A
    member joined here lives while this process runs (the daemon checks its pid)."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir

    def _request(self, op: str, **args: Any) -> Any:
        return control.request(self.log_dir, op, **args)

    def list_groups(self) -> list[str]:
        return list(self._request("list_groups"))

    def describe(self, group: str) -> dict[str, Any]:
        result: dict[str, Any] = self._request("describe_group", group=group)
        return result

    def commit(self, group: str, offsets: Offsets, member_id: str | None = None) -> None:
        self._request(
            "commit_offsets", group=group, offsets=_offsets_json(offsets), member_id=member_id
        )

    def reset(self, group: str, offsets: Offsets) -> None:
        self._request("reset_offsets", group=group, offsets=_offsets_json(offsets))

    def delete(self, group: str) -> None:
        self._request("delete_group", group=group)

    def join(self, group: str, topic: str, partitions: list[int]) -> tuple[str, list[int]]:
        result = self._request(
            "join_group",
            group=group,
            topic=topic,
            partitions=partitions,
            client_id=CLIENT_ID,
            host=socket.gethostname(),
            pid=os.getpid(),
        )
        return str(result["member_id"]), [int(p) for p in result["partitions"]]

    def heartbeat(self, group: str, member_id: str) -> list[int]:
        return [int(p) for p in self._request("heartbeat", group=group, member_id=member_id)]

    def leave(self, group: str, member_id: str) -> None:
        self._request("leave_group", group=group, member_id=member_id)


@contextlib.contextmanager
def coordinator(log_dir: Path, args: argparse.Namespace, *, write: bool) -> Iterator[Coordinator]:
    """The daemon's groups when one owns ``log_dir``; else a store of a read-only open
    (``write`` False) or of the writer (``write``: takes the writer lock)."""
    if control.daemon_socket(log_dir) is not None:
        yield DaemonCoordinator(log_dir)
        return
    opened = open_writable(log_dir, args) if write else open_read_only(log_dir)
    with opened as manager:
        yield LocalCoordinator(manager)


def is_error(exc: BaseException, kind: type[StorageError]) -> bool:
    """``exc`` is the engine's ``kind``, raised here or reported by the daemon."""
    if isinstance(exc, control.ControlError):
        return exc.kind == kind.__name__
    return isinstance(exc, kind)


# -- list -------------------------------------------------------------------------------


def _cmd_list(args: argparse.Namespace) -> int:
    with coordinator(existing_log_dir(args), args, write=False) as groups:
        for name in groups.list_groups():
            print(name)
    return EXIT_OK


# -- describe ---------------------------------------------------------------------------


def _log_end_offsets(
    manager: LogManager, partitions: list[tuple[str, int]]
) -> dict[tuple[str, int], int]:
    ends = {}
    for topic, partition in partitions:
        with contextlib.suppress(StorageError):
            ends[(topic, partition)] = manager.log(topic, partition).log_end_offset
    return ends


def describe_rows(
    description: Mapping[str, Any], ends: Mapping[tuple[str, int], int]
) -> list[list[str]]:
    """The rows ``kafka-consumer-groups.sh --describe`` prints for a group: each
    member's partitions (members with the most first), then the committed partitions
    nobody holds, with ``-`` for unknown values."""
    group = description["group"]
    committed = {(o["topic"], o["partition"]): o["offset"] for o in description["offsets"]}
    rows: list[list[str]] = []
    assigned: set[tuple[str, int]] = set()

    def row(tp: tuple[str, int], member: Mapping[str, Any] | None) -> list[str]:
        offset = committed.get(tp)
        end = ends.get(tp)
        lag = end - offset if offset is not None and end is not None else None
        return [
            group,
            tp[0],
            str(tp[1]),
            MISSING if offset is None else str(offset),
            MISSING if end is None else str(end),
            MISSING if lag is None else str(lag),
            member["member_id"] if member else MISSING,
            member["host"] if member else MISSING,
            member["client_id"] if member else MISSING,
        ]

    members = [m for m in description["members"] if m["assignment"]]
    for member in sorted(members, key=lambda m: -len(m["assignment"])):
        partitions = sorted((t, p) for t, p in member["assignment"])
        assigned.update(partitions)
        rows.extend(row(tp, member) for tp in partitions)
    rows.extend(row(tp, None) for tp in sorted(committed) if tp not in assigned)
    return rows


def _table(header: list[str], rows: list[list[str]], widths: list[int | None]) -> str:
    # Kafka's printf formats: "%-Ns" per column but the last, each line after a "\n".
    def line(cells: list[str]) -> str:
        parts = [
            cell.ljust(width) if width is not None else cell
            for cell, width in zip(cells, widths, strict=True)
        ]
        return " ".join(parts)

    return "\n" + "\n".join(line(cells) for cells in [header, *rows]) + "\n"


_DESCRIBE_HEADER = [
    "GROUP",
    "TOPIC",
    "PARTITION",
    "CURRENT-OFFSET",
    "LOG-END-OFFSET",
    "LAG",
    "CONSUMER-ID",
    "HOST",
    "CLIENT-ID",
]


def describe_table(rows: list[list[str]]) -> str:
    """The rows as ``kafka-consumer-groups.sh --describe`` prints them."""

    def widest(column: int) -> int:
        return max([15, *(len(r[column]) for r in rows)])

    widths: list[int | None] = [widest(0), widest(1), 10, 15, 15, 15, widest(6), widest(7), None]
    return _table(_DESCRIBE_HEADER, rows, widths)


def _cmd_describe(args: argparse.Namespace) -> int:
    log_dir = existing_log_dir(args)
    with coordinator(log_dir, args, write=False) as groups, open_read_only(log_dir) as manager:
        names = groups.list_groups() if args.all_groups else _group_names(args)
        for name in sorted(set(names)):
            try:
                description = groups.describe(name)
            except (GroupIdNotFoundError, control.ControlError) as exc:
                if is_error(exc, GroupIdNotFoundError):
                    raise CommandError(f"consumer group '{name}' does not exist") from None
                raise
            if description["state"] != "Stable":
                sys.stderr.write(f"\nConsumer group '{name}' has no active members.\n")
            elif description["recorded"]:
                sys.stderr.write(
                    f"\nConsumer group '{name}': members as a Kafka broker last recorded them.\n"
                )
            tps = {(o["topic"], o["partition"]) for o in description["offsets"]}
            for member in description["members"]:
                tps.update((t, p) for t, p in member["assignment"])
            rows = describe_rows(description, _log_end_offsets(manager, sorted(tps)))
            if rows:
                sys.stdout.write(describe_table(rows))
    return EXIT_OK


def _group_names(args: argparse.Namespace) -> list[str]:
    if not args.group:
        raise UsageError("give --group GROUP (repeatable) or --all-groups")
    return list(args.group)


# -- reset-offsets ----------------------------------------------------------------------

_DURATION = re.compile(
    r"([-+]?)P(?:([-+]?[0-9]+)D)?(?:T(?:([-+]?[0-9]+)H)?(?:([-+]?[0-9]+)M)?"
    r"(?:([-+]?[0-9]+)(?:[.,]([0-9]{0,9}))?S)?)?",
    re.IGNORECASE,
)


def parse_duration(text: str) -> int:
    """Java's ``Duration.parse`` of ``PnDTnHnMn.nS`` (as ``--by-duration`` takes it), in
    milliseconds.

    Raises:
        UsageError: not such a duration.
    """
    match = _DURATION.fullmatch(text.strip())
    if (
        match is None
        or not any(match.group(i) for i in (2, 3, 4, 5))
        or text.strip().upper().endswith("T")
    ):
        raise UsageError(f"bad duration {abbreviated(text)!r}: use ISO 8601, e.g. P1DT2H30M")
    sign, days, hours, minutes, seconds, fraction = match.groups()
    millis = 0
    for value, unit in ((days, 86_400_000), (hours, 3_600_000), (minutes, 60_000), (seconds, 1000)):
        if value:
            number = decimal_long(value.lstrip("+-"))
            if number is None:
                raise UsageError(f"bad duration {abbreviated(text)!r}: a number too large")
            millis += (-number if value.startswith("-") else number) * unit
    if fraction:
        part = int(fraction.ljust(3, "0")[:3])
        millis += -part if seconds and seconds.startswith("-") else part
    return -millis if sign == "-" else millis


def _parse_datetime(text: str) -> int:
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise UsageError(
            f"bad date-time {abbreviated(text)!r}: use ISO 8601, e.g. 2026-11-22T10:00:00.000"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return round(moment.timestamp() * 1000)


def _partitions_to_reset(
    args: argparse.Namespace, manager: LogManager, committed: list[tuple[str, int]]
) -> list[tuple[str, int]]:
    """``--topic T`` (every partition), ``--topic T:0,2`` or ``--all-topics`` (the
    topics the group has offsets for), as Kafka's tool reads them."""
    if args.all_topics:
        topics = sorted({t for t, _p in committed})
        return [
            (t, p)
            for t in topics
            if t in manager.topics()
            for p in range(manager.topic(t).partitions)
        ]
    found: list[tuple[str, int]] = []
    for spec in args.topic:
        if ":" in spec:
            name, _colon, numbers = spec.partition(":")
            if not name or ":" in numbers:
                raise UsageError(f"invalid topic arg '{spec}', expected topic name and partitions")
            for number in numbers.split(","):
                partition = parse_java_integer(number, 0, 2**31 - 1)
                if partition is None:
                    raise UsageError(
                        f"invalid partition '{number}' specified in topic arg '{spec}'"
                    )
                manager.log(name, partition)  # UnknownTopicError
                found.append((name, partition))
        else:
            found.extend((spec, p) for p in range(manager.topic(spec).partitions))
    return sorted(set(found))


def _new_offsets(
    args: argparse.Namespace,
    manager: LogManager,
    partitions: list[tuple[str, int]],
    committed: Mapping[tuple[str, int], int],
) -> dict[tuple[str, int], int]:
    offsets: dict[tuple[str, int], int] = {}
    now = manager.clock.milliseconds()
    for tp in partitions:
        log = manager.log(*tp)
        start, end = log.log_start_offset, log.log_end_offset
        if args.to_earliest:
            offsets[tp] = start
        elif args.to_latest:
            offsets[tp] = end
        elif args.to_current:
            offsets[tp] = committed.get(tp, end)
        elif args.to_datetime is not None or args.by_duration is not None:
            when = (
                _parse_datetime(args.to_datetime)
                if args.to_datetime is not None
                else now - parse_duration(args.by_duration)
            )
            found = log.offset_for_timestamp(when)
            offsets[tp] = end if found is None else max(found, start)
        else:
            if args.shift_by is not None:
                if tp not in committed:
                    raise UsageError(
                        f"cannot shift offset for partition {tp[0]}-{tp[1]} since there is no "
                        "current committed offset"
                    )
                wanted = committed[tp] + args.shift_by
            else:
                wanted = args.to_offset
            offsets[tp] = _within(tp, wanted, start, end)
    return offsets


def _within(tp: tuple[str, int], offset: int, start: int, end: int) -> int:
    # Kafka's checkOffsetsRange: out-of-range offsets move to the nearest end, with a warning.
    if offset > end:
        sys.stderr.write(
            f"WARN: New offset ({offset}) is higher than latest offset for topic partition "
            f"{tp[0]}-{tp[1]}. Value will be set to {end}.\n"
        )
        return end
    if offset < start:
        sys.stderr.write(
            f"WARN: New offset ({offset}) is lower than earliest offset for topic partition "
            f"{tp[0]}-{tp[1]}. Value will be set to {start}.\n"
        )
        return start
    return offset


def _reset_table(group: str, offsets: Mapping[tuple[str, int], int]) -> str:
    rows = [[group, t, str(p), str(o)] for (t, p), o in sorted(offsets.items())]
    widths: list[int | None] = [
        max(15, len(group)),
        max([15, *(len(t) for t, _p in offsets)]),
        10,
        None,
    ]
    return _table(["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"], rows, widths)


def _not_inactive(group: str) -> CommandError:
    return CommandError(
        f"Assignments can only be reset if the group '{group}' is inactive, but the current "
        "state is Stable."
    )


def _cmd_reset_offsets(args: argparse.Namespace) -> int:
    log_dir = existing_log_dir(args)
    if not args.all_topics and not args.topic:
        raise UsageError("give --topic TOPIC[:P,...] (repeatable) or --all-topics")
    group = args.group
    with (
        coordinator(log_dir, args, write=args.execute) as groups,
        open_read_only(log_dir) as manager,
    ):
        try:
            description = groups.describe(group)
        except (GroupIdNotFoundError, control.ControlError) as exc:
            if not is_error(exc, GroupIdNotFoundError):
                raise
            description = {"state": "Dead", "offsets": [], "members": []}
        if description["state"] == "Stable" and not description.get("recorded"):
            raise _not_inactive(group)
        committed = {(o["topic"], o["partition"]): o["offset"] for o in description["offsets"]}
        partitions = _partitions_to_reset(args, manager, sorted(committed))
        offsets = _new_offsets(args, manager, partitions, committed)
        if args.execute and offsets:
            try:
                groups.reset(group, offsets)
            except (NonEmptyGroupError, control.ControlError) as exc:
                if is_error(exc, NonEmptyGroupError):
                    raise _not_inactive(group) from None
                raise
    if not args.execute and not args.dry_run:
        sys.stderr.write(
            "WARN: No action will be performed as the --execute option is missing: "
            "this is a dry run (add --dry-run to say so, --execute to reset).\n"
        )
    sys.stdout.write(_reset_table(group, offsets))
    return EXIT_OK


# -- delete -----------------------------------------------------------------------------


def _cmd_delete(args: argparse.Namespace) -> int:
    log_dir = existing_log_dir(args)
    names = _group_names(args)
    failed: list[str] = []
    with coordinator(log_dir, args, write=True) as groups:
        for name in names:
            try:
                groups.delete(name)
            except (StorageError, control.ControlError) as exc:
                if isinstance(exc, control.ControlError) and exc.kind in (
                    "OSError",
                    "ProtocolError",
                ):
                    raise
                failed.append(f"* Group '{name}' could not be deleted due to: {exc}")
    deleted = [n for n in names if not any(f"'{n}'" in line for line in failed)]
    if failed:
        sys.stderr.write(
            "Error: Deletion of some consumer groups failed:\n" + "\n".join(failed) + "\n"
        )
        if deleted:
            print(f"These consumer groups were deleted successfully: {_quoted(deleted)}")
        raise CommandError(f"{len(failed)} consumer group(s) not deleted")
    print(f"Deletion of requested consumer groups ({_quoted(names)}) was successful.")
    return EXIT_OK


def _quoted(names: list[str]) -> str:
    return ", ".join(f"'{n}'" for n in names)


def add_parser(commands: argparse._SubParsersAction[Parser], shared: Parents) -> None:
    """Add ``groups`` and its actions to ``commands``."""
    groups = commands.add_parser(
        "groups",
        parents=[shared.log_dir],  # -d before the action too: groups -d DIR list
        help="list, describe, reset or delete consumer groups (like kafka-consumer-groups.sh)",
    )
    actions = groups.add_subparsers(dest="action", metavar="ACTION", parser_class=Parser)
    actions.required = True

    listing = actions.add_parser("list", parents=[shared.log_dir], help="group ids, one a line")
    listing.set_defaults(handler=_cmd_list, command_parser=listing)

    describe = actions.add_parser(
        "describe",
        parents=[shared.log_dir],
        help="committed offsets, log end offsets, lag and members of groups",
    )
    which = describe.add_mutually_exclusive_group()
    which.add_argument("--group", action="append", metavar="GROUP", help="a group (repeatable)")
    which.add_argument("--all-groups", action="store_true", help="every group")
    describe.set_defaults(handler=_cmd_describe, command_parser=describe)

    reset = actions.add_parser(
        "reset-offsets",
        parents=[shared.log_dir, shared.writer],
        help="set a group's committed offsets (the group must be inactive)",
    )
    reset.add_argument("--group", required=True, metavar="GROUP", help="the group")
    scope = reset.add_mutually_exclusive_group()
    scope.add_argument(
        "--topic",
        action="append",
        metavar="TOPIC[:P,...]",
        help="a topic, or some of its partitions (repeatable)",
    )
    scope.add_argument(
        "--all-topics", action="store_true", help="every topic the group has offsets for"
    )
    to = reset.add_mutually_exclusive_group(required=True)
    to.add_argument("--to-earliest", action="store_true", help="the log start offset")
    to.add_argument("--to-latest", action="store_true", help="the log end offset")
    to.add_argument("--to-current", action="store_true", help="the committed offset (else end)")
    to.add_argument("--to-offset", type=int, metavar="N", help="offset N (kept within the log)")
    to.add_argument(
        "--to-datetime",
        metavar="ISO",
        help="the first record at or after a time, e.g. 2026-11-22T10:00:00.000 (UTC "
        "unless a zone is given)",
    )
    to.add_argument(
        "--shift-by", type=int, metavar="N", help="the committed offset plus N (N may be < 0)"
    )
    to.add_argument(
        "--by-duration", metavar="PnDTnHnM", help="the first record at or after now - duration"
    )
    mode = reset.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="show the new offsets (default)")
    mode.add_argument("--execute", action="store_true", help="commit the new offsets")
    reset.set_defaults(handler=_cmd_reset_offsets, command_parser=reset)

    delete = actions.add_parser(
        "delete",
        parents=[shared.log_dir, shared.writer],
        help="delete groups and their offsets (they must be inactive)",
    )
    delete.add_argument("--group", action="append", metavar="GROUP", help="a group (repeatable)")
    delete.set_defaults(handler=_cmd_delete, command_parser=delete)

"""The unlisted views ``P@<where>``: a partition shown from a chosen record on.

``<where>`` is one of (SPEC §3):

- ``earliest`` / ``latest``: the log start / log end offset;
- ``-N``: the last N records (clamped at the log start);
- an offset (``1234``), clamped up to the log start (Kafka's
  ``auto.offset.reset=earliest``); past the log end it does not exist;
- a time: ISO-8601 (``2026-11-22T10:00:00Z``; no zone means UTC) or epoch milliseconds,
  resolved through the time index to the first record at or after it (the log end if
  every record is older). A number of 13 or more digits is epoch milliseconds: offsets
  that large (10^12 records in one partition) do not occur, times since 2001 do.

- ``group=NAME``: where consumer group NAME's committed offset is (``group_view``); a
  group without one (or one outside the log) starts at the log end, as Kafka's
  ``auto.offset.reset=latest``; ``group:earliest=NAME``, ``group:latest=NAME`` and
  ``group:none=NAME`` choose that rule (``none``: no such view without an offset). NAME
  is everything after the first ``=``: any group id a file name can hold.

Numbers are Kafka's longs: one past ``Long.MAX_VALUE`` names nothing (no offset, count
or time that large exists), so such a name is not a view (``ENOENT``), however many
digits it has.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

from storage import Log
from storage.number import decimal_long

__all__ = ["ViewName", "parse_view_name", "resolve_offset"]

_VIEW = re.compile(r"(0|[1-9][0-9]{0,9})@(.+)")
_EPOCH_MS_DIGITS = 13
_RESETS = ("earliest", "latest", "none")


@dataclass(frozen=True)
class ViewName:
    """A parsed ``P@<where>``: exactly one of the ``where`` fields is set."""

    partition: int
    named: str | None = None  # "earliest" or "latest"
    last: int | None = None  # -N
    offset: int | None = None
    timestamp: int | None = None  # epoch milliseconds
    group: str | None = None  # group=NAME
    reset: str = "latest"  # group:RULE=NAME


def parse_view_name(name: str) -> ViewName | None:
    """Parse ``P@<where>``; ``None`` when ``name`` is not a well-formed view name, also
    when its number is not a long.

    Cost: O(len(name)); no ``int()`` of more than 20 characters.
    """
    match = _VIEW.fullmatch(name)
    if match is None:
        return None
    partition = int(match.group(1))
    where = match.group(2)
    if where.startswith("group"):
        prefix, equals, group = where.partition("=")
        rule = "latest" if prefix == "group" else prefix.removeprefix("group:")
        if not equals or not group or rule not in _RESETS or prefix == f"group{rule}":
            return None
        return ViewName(partition, group=group, reset=rule)
    if where in ("earliest", "latest"):
        return ViewName(partition, named=where)
    if where[:1] == "-" and where[1:].isdigit():
        last = decimal_long(where[1:])
        return None if last is None else ViewName(partition, last=last)
    if where.isdigit():
        number = decimal_long(where)
        if number is None:
            return None
        if len(where) >= _EPOCH_MS_DIGITS:
            return ViewName(partition, timestamp=number)
        return ViewName(partition, offset=number)
    try:
        moment = datetime.fromisoformat(where)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return ViewName(partition, timestamp=int(moment.timestamp() * 1000))


def resolve_offset(log: Log, view: ViewName) -> int | None:
    """The first offset the view shows, or ``None`` when it shows nothing that exists
    (an offset past the log end).

    Cost: O(1) for names, offsets and ``-N``; a time goes through the time index
    (``Log.offset_for_timestamp``: O(segments) + O(log n)).
    """
    start = log.log_start_offset
    end = log.log_end_offset
    if view.named == "earliest":
        return start
    if view.named == "latest":
        return end
    if view.last is not None:
        return max(start, end - view.last)
    if view.offset is not None:
        return None if view.offset > end else max(start, view.offset)
    assert view.timestamp is not None, "a group view resolves through group_view"
    found = log.offset_for_timestamp(view.timestamp)
    return end if found is None else max(start, found)

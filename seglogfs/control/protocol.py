"""The control socket's wire format, shared by its client and its server.

One process writes a log directory (the engine's lock enforces it). While the FUSE
daemon runs, ``seglogfs topics`` and ``seglogfs produce`` must not open the directory
for writing; they send their request to the daemon instead, over the Unix socket
``LOGDIR/.seglog.sock`` (a name Kafka never uses, so the directory stays a Kafka log
directory). The daemon runs the same engine call the command would have run itself,
so results and errors are the same with or without a daemon.

Wire format (both directions, one request and one response per exchange, any number
of exchanges per connection)::

    header_length uint32 | payload_length uint64 | header (UTF-8 JSON) | payload bytes

A request header is ``{"op": NAME, "args": {...}}``. A response header is
``{"ok": true, "result": ...}`` or ``{"ok": false, "kind": ERROR_CLASS, "message":
TEXT, "errno": N or null}``. Only ``produce`` carries a payload: the records as one
uncompressed v2 record batch (Kafka's own encoding, so headers, null keys and values
and timestamps need no second format); a timestamp of -1 means "the daemon's now".

Ops: ``ping``, ``list_topics``, ``create_topic(name, partitions, config, format,
key_separator)``, ``alter_topic(name, set, delete)``, ``add_partitions(name,
partitions)`` (increase only; the result is the new count), ``delete_topic(name)``,
``describe_topic(name)``, ``produce(topic, partition)``, ``delete_records(partitions)``
(``[{"topic": T, "partition": P, "offset": O}, ...]``, as in the file
``kafka-delete-records.sh`` reads; the result is ``delete_records``'s),
``compact(topics)`` (``seglogfs compact``: the result is ``admin.compact``'s); for consumer
groups (``storage.OffsetStore``, which the daemon keeps): ``list_groups``,
``describe_group(group)`` (``group_result``), ``commit_offsets(group, offsets,
member_id, metadata)`` and ``reset_offsets(group, offsets)`` (``offsets``: ``[{"topic":
T, "partition": P, "offset": O}, ...]``), ``delete_group(group)``, and the membership
that makes a group consuming: ``join_group(group, topic, partitions, client_id, host,
pid)`` (the result: ``{"member_id", "partitions"}``), ``heartbeat(group, member_id)``
(the partitions held now), ``leave_group(group, member_id)``. ``OPS`` gives
each op's arguments and their types; ``parse_request`` checks a request against it, so
a wrongly typed argument is a ``ProtocolError`` naming it, never an exception inside
the daemon.

Bounds on what a request may be (each answered with a ``ProtocolError``): a header of
at most ``MAX_HEADER`` bytes nested at most ``MAX_NESTING`` deep (checked on the raw
bytes before ``json.loads``, whose recursion a header of 100,000 ``[`` exhausted),
numbers of at most ``MAX_NUMBER_DIGITS`` digits (Python's ``int()`` refuses more than
4,300, slowly), whole numbers within the Java type Kafka gives the argument; the frame
as a whole within the server's ``socket.request.max.bytes`` (``config``).

Pure functions and constants: thread-safe.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import struct
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from storage import (
    DefaultRecordBatch,
    GroupDescription,
    Header,
    LogManager,
    OffsetOutOfRangeError,
    StorageError,
    TopicDescription,
    build_record_batch,
)
from storage.number import INT_MAX, INT_MIN, LONG_MAX, LONG_MIN

__all__ = [
    "FRAME",
    "MAX_HEADER",
    "MAX_NESTING",
    "MAX_NUMBER_DIGITS",
    "OPS",
    "SOCKET_NAME",
    "ControlError",
    "ProduceRecord",
    "check_lengths",
    "decode_records",
    "delete_records",
    "describe_result",
    "encode_records",
    "error_header",
    "frame",
    "group_result",
    "parse_header",
    "parse_partition_offsets",
    "parse_request",
    "socket_address",
    "socket_path",
]

SOCKET_NAME = ".seglog.sock"
"""The control socket's name inside the log directory (Kafka never uses it)."""

FRAME = struct.Struct(">IQ")
MAX_HEADER = 4 << 20
"""The largest JSON header a frame may carry: a ``delete_records`` of every partition a
log directory may hold (4,000), each topic name 250 characters long, takes 1.2 MB and
53 ms to parse."""
MAX_NESTING = 16
"""How deep a header's JSON may nest: a request needs 4 (``delete_records``)."""
MAX_NUMBER_DIGITS = 20
"""The most characters a JSON number may have: a Java long has 19 digits and a sign."""
# The socket path must fit sockaddr_un (108 bytes with the NUL); longer log-dir paths
# are reached through /proc/self/fd/N of an O_PATH descriptor of the directory.
_MAX_SUN_PATH = 107

ProduceRecord = tuple[bytes | None, bytes | None, Sequence[Header], int | None]
"""(key, value, headers, timestamp or None for now): one record to produce."""

PartitionOffset = tuple[str, int, int]
"""(topic, partition, offset): one partition of a ``delete_records`` request."""

HIGH_WATERMARK = -1
"""A ``delete_records`` offset meaning the log end offset (Kafka's high watermark)."""


class ControlError(Exception):
    """The daemon refused a request: ``kind`` names the engine error class
    (``"TopicExistsError"``, ``"ConfigError"``, ...) or ``"OSError"``, ``"ProtocolError"``,
    ``"InternalError"``; ``message`` is the error's text, ``errno`` set for OSError."""

    def __init__(self, kind: str, message: str, errno: int | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.errno = errno


def socket_path(log_dir: Path) -> Path:
    """Where a daemon owning ``log_dir`` listens."""
    return Path(log_dir) / SOCKET_NAME


def describe_result(description: TopicDescription) -> dict[str, object]:
    """A topic description as the JSON the ``describe_topic`` op returns."""
    metadata = description.metadata
    return {
        "name": metadata.name,
        "partitions": metadata.partitions,
        "format": metadata.format,
        "key_separator": metadata.key_separator,
        "config": dict(sorted(metadata.overrides.items())),
        "partition_states": [
            {
                "partition": p.partition,
                "log_start_offset": p.log_start_offset,
                "log_end_offset": p.log_end_offset,
                "segment_count": p.segment_count,
                "size": p.size,
                "first_timestamp": p.first_timestamp,
                "last_timestamp": p.last_timestamp,
            }
            for p in description.partitions
        ],
    }


def group_result(description: GroupDescription) -> dict[str, object]:
    """A group description as the JSON the ``describe_group`` op returns (and the
    command line prints from, with or without a daemon)."""
    return {
        "group": description.group,
        "state": description.state,
        "recorded": description.recorded,
        "members": [
            {
                "member_id": m.member_id,
                "client_id": m.client_id,
                "host": m.host,
                "assignment": [[t, p] for t, p in m.assignment],
            }
            for m in description.members
        ],
        "offsets": [
            {
                "topic": t,
                "partition": p,
                "offset": v.offset,
                "leader_epoch": v.leader_epoch,
                "metadata": v.metadata,
                "commit_timestamp": v.commit_timestamp,
            }
            for (t, p), v in sorted(description.offsets.items())
        ],
    }


def parse_partition_offsets(items: object) -> list[PartitionOffset]:
    """The ``partitions`` list of a ``delete_records`` request (and of the file
    ``kafka-delete-records.sh --offset-json-file`` reads), checked.

    Raises:
        ValueError: not a list of ``{"topic": str, "partition": int, "offset": int}``,
            or a topic-partition given twice (the message names them).
    """
    if not isinstance(items, list):
        raise ValueError("partitions must be a list")
    found: list[PartitionOffset] = []
    for item in items:
        if not isinstance(item, dict):
            raise ValueError(f"each partition must be an object, not {item!r}")
        topic = item.get("topic")
        if not isinstance(topic, str):
            raise ValueError(f"topic must be a string in {item!r}")
        found.append((topic, _integer(item, "partition"), _integer(item, "offset")))
    counts = Counter((topic, partition) for topic, partition, _offset in found)
    twice = sorted(tp for tp, n in counts.items() if n > 1)
    if twice:
        raise ValueError("duplicate topic partitions: " + ",".join(f"{t}-{p}" for t, p in twice))
    return found


def _integer(item: dict[str, Any], name: str) -> int:
    value = item.get(name)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name} must be an integer in {item!r}")
    return value


def delete_records(
    manager: LogManager, partitions: Sequence[PartitionOffset]
) -> list[dict[str, object]]:
    """Kafka's DeleteRecords: move each partition's log start offset up to its offset
    (``HIGH_WATERMARK``: the log end offset; never back), then checkpoint the log start
    offsets so that it holds after a crash. The records below become unreadable at
    once; the segments wholly below go at the next retention check, as in Kafka.

    Returns, per partition in order, ``{"topic", "partition", "low_watermark"}`` (the
    log start offset now) or ``{"topic", "partition", "error"}`` (an unknown
    partition, an offset past the log end or below -1): one partition's error does not
    stop the others, as Kafka's tool reports each.

    Blocking: one ``fsync``'d checkpoint write.
    """
    results: list[dict[str, object]] = []
    for topic, partition, offset in partitions:
        result: dict[str, object] = {"topic": topic, "partition": partition}
        try:
            log = manager.log(topic, partition)
            target = log.log_end_offset if offset == HIGH_WATERMARK else offset
            if target < 0:
                raise OffsetOutOfRangeError(offset, log.log_start_offset, log.log_end_offset)
            log.advance_log_start_offset(target)
            result["low_watermark"] = log.log_start_offset
        except StorageError as exc:
            result["error"] = str(exc)
        results.append(result)
    if any("low_watermark" in result for result in results):
        manager.checkpoint_log_start_offsets()
    return results


def encode_records(records: Sequence[ProduceRecord]) -> bytes:
    keys = [r[0] for r in records]
    values = [r[1] for r in records]
    headers = [tuple(r[2]) for r in records]
    stamps = [r[3] for r in records]
    timestamps: list[int] | int
    if all(t is None for t in stamps):
        timestamps = -1
    else:
        timestamps = [-1 if t is None else t for t in stamps]
        if any(t < 0 for t in timestamps if t != -1):
            raise ValueError("record timestamps must not be negative")
    return build_record_batch(
        values,
        timestamps=timestamps,
        keys=None if all(k is None for k in keys) else keys,
        headers=None if not any(headers) else headers,
    )


def decode_records(
    payload: bytes, now_ms: int, max_message_bytes: int
) -> tuple[
    Sequence[bytes | None],
    Sequence[bytes | None] | None,
    Sequence[Sequence[Header]] | None,
    Sequence[int] | None,
]:
    """The records of a ``produce`` payload: values, keys, headers and timestamps
    (-1 replaced by ``now_ms``), None where every record has none.

    Raises:
        ControlError: ``ProtocolError``: not one valid v2 batch.
        CorruptRecordError: its records do not parse.
        RecordTooLargeError: a compressed batch (this client sends none) whose records
            inflate past ``max_message_bytes``: inflating stops there.
    """
    batch = DefaultRecordBatch(payload)
    if batch.size != len(payload) or not batch.is_valid():
        raise ControlError("ProtocolError", "produce payload is not one valid record batch")
    columns = batch.columns(max_size=max_message_bytes)
    keys = columns.keys if any(k is not None for k in columns.keys) else None
    headers = columns.headers if any(columns.headers) else None
    timestamps: Sequence[int] | None = None
    if batch.max_timestamp != -1:
        timestamps = [now_ms if t == -1 else t for t in columns.timestamps]
    return columns.values, keys, headers, timestamps


# -- framing ----------------------------------------------------------------------------


def frame(header: Mapping[str, object], payload: bytes = b"") -> bytes:
    encoded = json.dumps(header, separators=(",", ":")).encode()
    return FRAME.pack(len(encoded), len(payload)) + encoded + payload


def check_lengths(header_length: int, payload_length: int, max_frame: int) -> None:
    """Refuse a frame whose prefix declares more than the receiver will hold, before
    any of it is read: a header over ``MAX_HEADER`` or a frame over ``max_frame``
    (the server's ``socket.request.max.bytes``).

    Raises:
        ControlError: ``ProtocolError`` naming the sizes and the bound, with errno
            ``EMSGSIZE`` (nothing of the frame was done: a client may send less).
    """
    if header_length > MAX_HEADER:
        raise ControlError(
            "ProtocolError",
            f"frame header of {header_length} bytes exceeds {MAX_HEADER}",
            errno.EMSGSIZE,
        )
    if header_length + payload_length > max_frame:
        raise ControlError(
            "ProtocolError",
            f"frame of {header_length + payload_length} bytes exceeds "
            f"socket.request.max.bytes={max_frame}",
            errno.EMSGSIZE,
        )


# A JSON string (escapes included) or a bracket: what the nesting check looks at.
_JSON_STRING_OR_BRACKET = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')


def _check_nesting(data: bytes) -> None:
    # Brackets inside strings do not nest (a key separator may be "["), so strings
    # are skipped; a header with few brackets cannot be too deep and is not scanned.
    if data.count(b"[") + data.count(b"{") <= MAX_NESTING:
        return
    depth = 0
    for match in _JSON_STRING_OR_BRACKET.finditer(data):
        token = match.group()
        if token in (b"[", b"{"):
            depth += 1
            if depth > MAX_NESTING:
                raise ControlError(
                    "ProtocolError", f"frame header nests deeper than {MAX_NESTING} levels"
                )
        elif token in (b"]", b"}"):
            depth -= 1


def _bounded_number(text: str) -> int:
    if len(text) > MAX_NUMBER_DIGITS:
        raise ControlError(
            "ProtocolError", f"a number of {len(text)} characters in the frame header"
        )
    return int(text)


def parse_header(data: bytes) -> dict[str, Any]:
    """The JSON object of a frame header, its nesting and numbers bounded.

    Cost: O(len(data)); a header holding more than ``MAX_NESTING`` brackets is scanned
    once more (a regular expression over its strings and brackets).

    Raises:
        ControlError: ``ProtocolError``: not UTF-8 JSON, not an object, nested deeper
            than ``MAX_NESTING`` or holding a number of over ``MAX_NUMBER_DIGITS``
            characters.
    """
    _check_nesting(data)
    try:
        header = json.loads(data.decode(), parse_int=_bounded_number)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ControlError("ProtocolError", f"malformed frame header: {exc}") from None
    if not isinstance(header, dict):
        raise ControlError("ProtocolError", "frame header is not a JSON object")
    return header


# -- requests ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Type:
    """What a JSON value must be, as the error says it (``description``)."""

    description: str

    def check(self, value: object, where: str) -> None:
        """Raises: ControlError: ``ProtocolError`` naming ``where`` (``delete[0]``)."""
        if not self.matches(value):
            raise ControlError("ProtocolError", f"argument {where!r} must be {self.description}")

    def matches(self, value: object) -> bool:
        raise NotImplementedError


@dataclass(frozen=True)
class _String(_Type):
    def matches(self, value: object) -> bool:
        return isinstance(value, str)


@dataclass(frozen=True)
class _Integer(_Type):
    """A whole number (not a bool) from ``low`` to ``high``."""

    low: int
    high: int

    def matches(self, value: object) -> bool:
        if not isinstance(value, int) or isinstance(value, bool):
            return False
        return self.low <= value <= self.high


@dataclass(frozen=True)
class _ListOf(_Type):
    item: _Type

    def check(self, value: object, where: str) -> None:
        super().check(value, where)
        assert isinstance(value, list)
        for i, item in enumerate(value):
            self.item.check(item, f"{where}[{i}]")

    def matches(self, value: object) -> bool:
        return isinstance(value, list)


@dataclass(frozen=True)
class _MapOf(_Type):
    """An object with any keys, each value of one type."""

    value: _Type

    def check(self, value: object, where: str) -> None:
        super().check(value, where)
        assert isinstance(value, dict)
        for key, item in value.items():
            self.value.check(item, f"{where}.{key[:100]}")

    def matches(self, value: object) -> bool:
        return isinstance(value, dict)


@dataclass(frozen=True)
class _Object(_Type):
    """An object with exactly these members, each of its type."""

    members: tuple[tuple[str, _Type], ...]

    def check(self, value: object, where: str) -> None:
        super().check(value, where)
        assert isinstance(value, dict)
        names = {name for name, _type in self.members}
        for key in value:
            if key not in names:
                raise ControlError("ProtocolError", f"unknown member {key[:100]!r} in {where!r}")
        for name, member in self.members:
            member.check(value.get(name), f"{where}.{name}")

    def matches(self, value: object) -> bool:
        return isinstance(value, dict)


@dataclass(frozen=True)
class Arg:
    """One argument of an op: its type, and whether it may be absent or null."""

    type: _Type
    optional: bool = False


_STRING = _String("a string")
_INT32 = _Integer(f"a whole number from {INT_MIN} to {INT_MAX}", INT_MIN, INT_MAX)
_INT64 = _Integer(f"a whole number from {LONG_MIN} to {LONG_MAX}", LONG_MIN, LONG_MAX)
_CONFIG = _MapOf("an object of string values", _STRING)
_PARTITION_OFFSETS = _ListOf(
    "a list of {topic, partition, offset} objects",
    _Object(
        "an object of topic, partition and offset",
        (("topic", _STRING), ("partition", _INT32), ("offset", _INT64)),
    ),
)

OPS: dict[str, dict[str, Arg]] = {
    "ping": {},
    "list_topics": {},
    "create_topic": {
        "name": Arg(_STRING),
        "partitions": Arg(_INT32, optional=True),
        "config": Arg(_CONFIG, optional=True),
        "format": Arg(_STRING, optional=True),
        "key_separator": Arg(_STRING, optional=True),
    },
    "alter_topic": {
        "name": Arg(_STRING),
        "set": Arg(_CONFIG, optional=True),
        "delete": Arg(_ListOf("a list of strings", _STRING), optional=True),
    },
    "add_partitions": {"name": Arg(_STRING), "partitions": Arg(_INT32)},
    "delete_topic": {"name": Arg(_STRING)},
    "describe_topic": {"name": Arg(_STRING)},
    "produce": {"topic": Arg(_STRING), "partition": Arg(_INT32, optional=True)},
    "delete_records": {"partitions": Arg(_PARTITION_OFFSETS)},
    "compact": {"topics": Arg(_ListOf("a list of topic names", _STRING), optional=True)},
    "list_groups": {},
    "describe_group": {"group": Arg(_STRING)},
    "commit_offsets": {
        "group": Arg(_STRING),
        "offsets": Arg(_PARTITION_OFFSETS),
        "member_id": Arg(_STRING, optional=True),
        "metadata": Arg(_STRING, optional=True),
    },
    "reset_offsets": {"group": Arg(_STRING), "offsets": Arg(_PARTITION_OFFSETS)},
    "delete_group": {"group": Arg(_STRING)},
    "join_group": {
        "group": Arg(_STRING),
        "topic": Arg(_STRING),
        "partitions": Arg(_ListOf("a list of partition numbers", _INT32)),
        "client_id": Arg(_STRING),
        "host": Arg(_STRING, optional=True),
        "pid": Arg(_INT32, optional=True),
    },
    "heartbeat": {"group": Arg(_STRING), "member_id": Arg(_STRING)},
    "leave_group": {"group": Arg(_STRING), "member_id": Arg(_STRING)},
}
"""Each op's arguments: the wire schema ``parse_request`` enforces. The engine checks
what the values mean (names, counts, configs) and answers with its own errors."""


def parse_request(header: Mapping[str, object]) -> tuple[str, dict[str, Any]]:
    """The op and its arguments of a request header, checked against ``OPS``; an
    optional argument absent or null is None.

    Raises:
        ControlError: ``ProtocolError`` naming the op, the argument or the member that
            is unknown, missing or of the wrong type (a number is not echoed back).
    """
    op = header.get("op")
    args = header.get("args", {})
    if not isinstance(op, str) or not isinstance(args, dict):
        raise ControlError("ProtocolError", "a request needs 'op' and 'args'")
    spec = OPS.get(op)
    if spec is None:
        raise ControlError("ProtocolError", f"unknown op {op[:100]!r}")
    for name in args:
        if name not in spec:
            raise ControlError("ProtocolError", f"unknown argument {name[:100]!r} of {op}")
    checked: dict[str, Any] = {}
    for name, arg in spec.items():
        value = args.get(name)
        if value is None:
            if not arg.optional:
                raise ControlError("ProtocolError", f"argument {name!r} of {op} is missing")
        else:
            arg.type.check(value, name)
        checked[name] = value
    return op, checked


@contextlib.contextmanager
def socket_address(log_dir: Path) -> Iterator[str]:
    path = str(socket_path(log_dir))
    if len(os.fsencode(path)) <= _MAX_SUN_PATH:
        yield path
        return
    fd = os.open(log_dir, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{fd}/{SOCKET_NAME}"
    finally:
        os.close(fd)


def error_header(exc: BaseException) -> dict[str, object]:
    if isinstance(exc, ControlError):
        return {"ok": False, "kind": exc.kind, "message": exc.message, "errno": exc.errno}
    if isinstance(exc, StorageError):
        return {"ok": False, "kind": type(exc).__name__, "message": str(exc), "errno": None}
    if isinstance(exc, OSError):
        message = exc.strerror or str(exc)
        if exc.filename is not None:
            message = f"{exc.filename}: {message}"
        return {"ok": False, "kind": "OSError", "message": message, "errno": exc.errno}
    return {"ok": False, "kind": "InternalError", "message": f"{type(exc).__name__}: {exc}"}

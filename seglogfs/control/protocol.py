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
key_separator)``, ``alter_topic(name, set, delete)``, ``delete_topic(name)``,
``describe_topic(name)``, ``produce(topic, partition)``, ``delete_records(partitions)``
(``[{"topic": T, "partition": P, "offset": O}, ...]``, as in the file
``kafka-delete-records.sh`` reads; the result is ``delete_records``'s).

Pure functions and constants: thread-safe.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from storage import (
    DefaultRecordBatch,
    Header,
    LogManager,
    OffsetOutOfRangeError,
    StorageError,
    TopicDescription,
    build_record_batch,
)

__all__ = [
    "FRAME",
    "MAX_HEADER",
    "MAX_PAYLOAD",
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
    "parse_header",
    "parse_partition_offsets",
    "socket_address",
    "socket_path",
]

SOCKET_NAME = ".seglog.sock"
"""The control socket's name inside the log directory (Kafka never uses it)."""

FRAME = struct.Struct(">IQ")
MAX_HEADER = 1 << 20
MAX_PAYLOAD = 1 << 31
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
    payload: bytes, now_ms: int
) -> tuple[
    Sequence[bytes | None],
    Sequence[bytes | None] | None,
    Sequence[Sequence[Header]] | None,
    Sequence[int] | None,
]:
    batch = DefaultRecordBatch(payload)
    if batch.size != len(payload) or not batch.is_valid():
        raise ControlError("ProtocolError", "produce payload is not one valid record batch")
    columns = batch.columns()
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


def check_lengths(header_length: int, payload_length: int) -> None:
    if header_length > MAX_HEADER or payload_length > MAX_PAYLOAD:
        raise ControlError(
            "ProtocolError", f"frame too large ({header_length} + {payload_length} bytes)"
        )


def parse_header(data: bytes) -> dict[str, Any]:
    try:
        header = json.loads(data.decode())
    except (UnicodeDecodeError, ValueError) as exc:
        raise ControlError("ProtocolError", f"malformed frame header: {exc}") from None
    if not isinstance(header, dict):
        raise ControlError("ProtocolError", "frame header is not a JSON object")
    return header


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

"""Kafka's offset checkpoint files: one offset per topic-partition, as text.

``recovery-point-offset-checkpoint``, ``log-start-offset-checkpoint``,
``replication-offset-checkpoint`` and ``cleaner-offset-checkpoint`` at the root of
a log directory all share this layout (Kafka's ``CheckpointFile`` with the
``OffsetCheckpointFile`` entry format, version 0)::

    0                      version
    2                      number of entries
    orders 0 1234          <topic> <partition> <offset>, one per line
    orders 1 987

Lines end with ``\\n``; fields are separated by whitespace. Kafka reads an empty
file, or one holding only the version, as no entries, and so do we.

Writes are crash-safe: the new contents go to ``<name>.tmp``, are fsynced, and
are renamed over the old file, whose directory is then fsynced; a reader sees
the old or the new file, never a mix. A leftover ``.tmp`` from a crash is
ignored by readers and overwritten by the next write.

Thread-safety: the functions keep no state. Concurrent writers of the same
checkpoint would share the ``.tmp`` name, so callers serialise writes per file
(the log manager writes each checkpoint under its lock); reads may run at any
time.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from ..atomic_file import write_atomically
from ..errors import CorruptCheckpointError
from ..number import parse_java_integer

__all__ = [
    "CHECKPOINT_VERSION",
    "read_extension_start_checkpoint",
    "read_offset_checkpoint",
    "write_extension_start_checkpoint",
    "write_offset_checkpoint",
]

CHECKPOINT_VERSION = 0
"""The only version of the offset checkpoint format Kafka has written."""

_INT_RANGE = (-(2**31), 2**31 - 1)
_LONG_RANGE = (-(2**63), 2**63 - 1)
# Java's BufferedReader.readLine ends a line at \n, \r or \r\n.
_LINE_END = re.compile(r"\r\n|\r|\n")
# Kafka splits entries on \s+, which in Java is ASCII whitespace only.
_FIELD_SEPARATOR = re.compile(r"[ \t\n\x0b\f\r]+")
_WHITESPACE = frozenset(" \t\n\x0b\f\r")


def _parse_java_int(text: str, bounds: tuple[int, int]) -> int | None:
    """``Integer.parseInt`` / ``Long.parseLong``: sign and ASCII digits, in range."""
    return parse_java_integer(text, *bounds)


def read_offset_checkpoint(path: Path) -> dict[tuple[str, int], int]:
    """Read a checkpoint file into ``{(topic, partition): offset}``.

    A missing file, an empty file or one with only a version line mean "no
    checkpoint" and give ``{}``, as in Kafka. A ``path.tmp`` next to it is never
    read. If a topic-partition appears twice, the later line wins.

    Runtime complexity: O(size of the file).

    Raises:
        CorruptCheckpointError: the file is malformed: a version other than 0, a count or
            entry that does not parse, or a count that does not match the
            entries. The message names the file and the line number.
        OSError: the file exists but cannot be read.
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return {}
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CorruptCheckpointError(path, 0, f"not UTF-8 ({e})") from e

    lines = _LINE_END.split(text)
    if lines[-1] == "":
        # The terminator of the last line does not start another line.
        lines.pop()
    if not lines:
        return {}

    def malformed(line_number: int, why: str) -> CorruptCheckpointError:
        line = lines[line_number - 1] if line_number <= len(lines) else ""
        return CorruptCheckpointError(path, line_number, f"{why}: {line!r}")

    version = _parse_java_int(lines[0], _INT_RANGE)
    if version is None:
        raise malformed(1, "version is not an integer")
    if version != CHECKPOINT_VERSION:
        raise malformed(1, f"unrecognised version {version}, expected {CHECKPOINT_VERSION}")
    if len(lines) == 1:
        return {}

    expected = _parse_java_int(lines[1], _INT_RANGE)
    if expected is None or expected < 0:
        raise malformed(2, "entry count is not a non-negative integer")

    offsets: dict[tuple[str, int], int] = {}
    for line_number, line in enumerate(lines[2:], start=3):
        fields = _FIELD_SEPARATOR.split(line)
        # Java's String.split drops trailing empty strings, so trailing
        # whitespace is tolerated; leading whitespace yields an empty first
        # field and is an error, as in Kafka.
        while fields and fields[-1] == "":
            fields.pop()
        if len(fields) != 3 or not fields[0]:
            raise malformed(line_number, "expected '<topic> <partition> <offset>'")
        topic, partition_text, offset_text = fields
        partition = _parse_java_int(partition_text, _INT_RANGE)
        offset = _parse_java_int(offset_text, _LONG_RANGE)
        if partition is None or offset is None:
            raise malformed(line_number, "partition or offset is not an integer")
        offsets[(topic, partition)] = offset

    found = len(lines) - 2
    if found != expected:
        raise CorruptCheckpointError(path, 0, f"expected {expected} entries but found {found}")
    return offsets


def _render(offsets: Mapping[tuple[str, int], int]) -> bytes:
    """Validate the entries and render the file, sorted by topic then partition."""
    entries = sorted(offsets.items())
    parts = [f"{CHECKPOINT_VERSION}\n{len(entries)}\n"]
    for (topic, partition), offset in entries:
        # Anything that would not read back must fail here, before the old
        # checkpoint is replaced.
        if not topic or any(c in _WHITESPACE for c in topic):
            raise ValueError(f"topic {topic!r} cannot be written to a checkpoint")
        if not _INT_RANGE[0] <= partition <= _INT_RANGE[1]:
            raise ValueError(f"partition {partition} of {topic!r} is not a 32-bit integer")
        if not _LONG_RANGE[0] <= offset <= _LONG_RANGE[1]:
            raise ValueError(f"offset {offset} of {topic}-{partition} is not a 64-bit integer")
        parts.append(f"{topic} {partition} {offset}\n")
    return "".join(parts).encode("utf-8")


def write_offset_checkpoint(path: Path, offsets: Mapping[tuple[str, int], int]) -> None:
    """Atomically replace the checkpoint at ``path`` with ``offsets``.

    Entries are sorted by topic, then partition, so equal inputs give equal
    bytes. Cost: O(n log n) for n entries, plus two fsyncs.

    Raises:
        ValueError: a topic that is empty or contains whitespace, or a
            partition or offset outside Kafka's int/long range; nothing is
            written.
        OSError: the temporary file cannot be written, synced or renamed (the
            previous checkpoint, if any, is left intact and the temporary file
            removed), or the directory cannot be synced after the rename (the
            new checkpoint is in place but may not survive a crash).
    """
    write_atomically(path, _render(offsets))


def read_extension_start_checkpoint(path: Path) -> tuple[int, int] | None:
    """Read a partition's extension-start checkpoint: ``(base_offset, units)`` or None.

    The file (``ExtensionIndexSpec.start_checkpoint_name`` in the partition directory,
    a name Kafka never uses) says where the extension units of the oldest retained
    segment start, in the version-0 layout of the offset checkpoints::

        0                      version
        1200 48213             <base offset of the segment> <units at its start>

    A missing or empty file gives None.

    Raises:
        CorruptCheckpointError: the file does not parse, or names a negative offset or
            negative units.
        OSError: the file exists but cannot be read.
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        lines = _LINE_END.split(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise CorruptCheckpointError(path, 0, f"not UTF-8 ({e})") from e
    if lines[-1] == "":
        lines.pop()
    if not lines:
        return None
    if _parse_java_int(lines[0], _INT_RANGE) != CHECKPOINT_VERSION:
        raise CorruptCheckpointError(path, 1, f"expected version {CHECKPOINT_VERSION}")
    if len(lines) != 2:
        raise CorruptCheckpointError(path, 0, f"expected 2 lines, found {len(lines)}")
    fields = lines[1].split(" ")
    values = [_parse_java_int(field, _LONG_RANGE) for field in fields]
    match values:
        case [int(base_offset), int(units)] if base_offset >= 0 and units >= 0:
            return base_offset, units
    raise CorruptCheckpointError(path, 2, f"expected '<base offset> <units>': {lines[1]!r}")


def write_extension_start_checkpoint(path: Path, base_offset: int, units: int) -> None:
    """Atomically replace the extension-start checkpoint at ``path`` (layout above).

    Cost: two fsyncs.

    Raises:
        ValueError: a negative or out-of-range value; nothing is written.
        OSError: as ``write_offset_checkpoint``; the previous file is left intact.
    """
    for value in (base_offset, units):
        if not 0 <= value <= _LONG_RANGE[1]:
            raise ValueError(f"{value} cannot be written to {path}")
    write_atomically(path, f"{CHECKPOINT_VERSION}\n{base_offset} {units}\n".encode())

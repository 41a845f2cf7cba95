"""``seglogfs dump``: what Kafka's ``kafka-dump-log.sh`` (``DumpLogSegments``) prints.

The same lines, field names and order as the Kafka tool, for ``.log`` (batches; every
record with ``--deep-iteration``; keys and payloads with ``--print-data-log``),
``.index`` and ``.timeindex`` (entries, each checked against the log as Kafka checks
it; ``--verify-index-only`` prints only the problems, ``--index-sanity-check`` only the
check a broker runs at startup) and ``.txnindex`` files. The problem reports go to
stderr after all files, as Kafka prints them.

Files are read directly, never through a ``Log``: a dump shows the bytes on disk, not
what recovery would make of them, and it works on any copy of a segment, written here
or by a Kafka broker, while a writer appends to it.

Known differences from Kafka: control records other than transaction markers print
``controlType: NAME(id)`` (Kafka decodes KRaft snapshot records to JSON), producer
snapshot (``.snapshot``) files are not decoded, and the problem reports come in the
order the files were given (Kafka's come in hash-map order).
"""

from __future__ import annotations

import argparse
import mmap
import os
import struct
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from storage import (
    CompressionType,
    CorruptRecordError,
    DefaultRecordBatch,
    Record,
    RecordBatch,
    TimestampType,
    iter_batches,
)
from storage.record.compression import decompress
from storage.record.legacy_record import legacy_entry_header, legacy_entry_is_valid
from storage.record.record_batch import HEADER_SIZE_UP_TO_MAGIC, batch_size_at

from .common import CommandError, Parents, Parser, UsageError

_OFFSET_ENTRY = struct.Struct(">ii")
_TIME_ENTRY = struct.Struct(">qi")
_TXN_ENTRY = struct.Struct(">hqqqq")
_CONTROL_KEY = struct.Struct(">hh")
_END_TXN_VALUE = struct.Struct(">hi")
_CONTROL_TYPES = {
    0: "ABORT",
    1: "COMMIT",
    2: "LEADER_CHANGE",
    3: "SNAPSHOT_HEADER",
    4: "SNAPSHOT_FOOTER",
    5: "KRAFT_VERSION",
    6: "KRAFT_VOTERS",
}
_CODEC_NAMES = {
    CompressionType.NONE: "none",
    CompressionType.GZIP: "gzip",
    CompressionType.SNAPPY: "snappy",
    CompressionType.LZ4: "lz4",
    CompressionType.ZSTD: "zstd",
}
_INT32_MAX = 0x7FFFFFFF
RECORD_INDENT = "|"


@dataclass(frozen=True)
class DumpOptions:
    """Kafka's options of the same names (``deep_iteration`` already implied by
    ``print_data_log`` when the caller wants Kafka's behaviour)."""

    print_data_log: bool = False
    deep_iteration: bool = False
    verify_index_only: bool = False
    index_sanity_check: bool = False
    skip_record_metadata: bool = False
    max_message_size: int = 5 * 1024 * 1024


@dataclass
class _Problems:
    """What Kafka collects while dumping and prints to stderr at the end."""

    index_mismatches: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    time_mismatches: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    time_out_of_order: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    time_not_found: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    non_consecutive: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    unframed: list[str] = field(default_factory=list)
    failed: bool = False

    def print(self, err: TextIO) -> None:
        # Kafka prepends to these lists (Scala ``::=``), so they print newest first.
        for name, mismatches in self.index_mismatches.items():
            err.write(f"Mismatches in :{name}\n")
            for index_offset, log_offset in reversed(mismatches):
                err.write(f"  Index offset: {index_offset}, log offset: {log_offset}\n")
        for name, mismatches in self.time_mismatches.items():
            err.write(f"Found timestamp mismatch in :{name}\n")
            for index_ts, log_ts in mismatches:
                err.write(f"  Index timestamp: {index_ts}, log timestamp: {log_ts}\n")
        for name, disorder in self.time_out_of_order.items():
            err.write(f"Found out of order timestamp in :{name}\n")
            for index_ts, previous in disorder:
                err.write(
                    f"  Index timestamp: {index_ts}, Previously indexed timestamp: {previous}\n"
                )
        for missing in self.time_not_found.values():
            err.write("The following indexed offsets are not found in the log.\n")
            for indexed, found in missing:
                err.write(f"Indexed offset: {indexed}, found log offset: {found}\n")
        for name, pairs in self.non_consecutive.items():
            err.write(f"Non-consecutive offsets in {name}\n")
            for first, second in reversed(pairs):
                err.write(f"  {first} is followed by {second}\n")
        for line in self.unframed:
            err.write(line + "\n")


def _java_bool(value: bool) -> str:
    return "true" if value else "false"


def _base_offset(path: Path) -> int:
    prefix = path.name.split(".")[0]
    try:
        return int(prefix)
    except ValueError:
        raise ValueError(f"{path.name} is not named by a base offset") from None


def _read(path: Path) -> bytes:
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return b""
        with mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) as mapped:
            return mapped[:]


def _log_for(index_path: Path) -> Path:
    return index_path.absolute().parent / (index_path.name.split(".")[0] + ".log")


def dump_files(paths: list[Path], options: DumpOptions, out: TextIO, err: TextIO) -> int:
    """Dump each file as ``kafka-dump-log.sh --files`` does; return the exit code
    (1 when a file could not be read or failed ``--index-sanity-check``)."""
    problems = _Problems()
    for path in paths:
        out.write(f"Dumping {path}\n")
        name = path.name
        suffix = name[name.rfind(".") :] if "." in name else ""
        try:
            if suffix == ".log":
                _dump_log(path, options, problems, out)
            elif suffix == ".index":
                _dump_index(path, options, problems, out, err)
            elif suffix == ".timeindex":
                _dump_time_index(path, options, problems, out, err)
            elif suffix == ".txnindex":
                _dump_txn_index(path, out)
            elif suffix == ".snapshot":
                err.write(f"Ignoring {path}: producer snapshots are not decoded here\n")
            else:
                err.write(f"Ignoring unknown file {path}\n")
        except BrokenPipeError:
            raise  # stdout's reader left (``| head``), not a file's problem: main ends
        except (OSError, ValueError, CorruptRecordError) as exc:
            out.flush()
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            err.write(f"seglogfs dump: error: {path}: {reason}\n")
            problems.failed = True
    out.flush()
    problems.print(err)
    return 1 if problems.failed else 0


# -- .log ---------------------------------------------------------------------------


def _batch_line(batch: RecordBatch, position: int) -> str:
    if isinstance(batch, DefaultRecordBatch):
        horizon = batch.delete_horizon_ms
        head = (
            f"baseOffset: {batch.base_offset} lastOffset: {batch.last_offset} "
            f"count: {batch.records_count} baseSequence: {batch.base_sequence} "
            f"lastSequence: {batch.last_sequence} producerId: {batch.producer_id} "
            f"producerEpoch: {batch.producer_epoch} "
            f"partitionLeaderEpoch: {batch.partition_leader_epoch} "
            f"isTransactional: {_java_bool(batch.is_transactional)} "
            f"isControl: {_java_bool(batch.is_control)} "
            f"deleteHorizonMs: "
            + ("OptionalLong.empty" if horizon is None else f"OptionalLong[{horizon}]")
        )
    else:
        head = f"offset: {batch.last_offset}"
    return (
        f"{head} position: {position} {_timestamp_type(batch).display_name}: "
        f"{batch.max_timestamp} size: {batch.size} magic: {batch.magic} "
        f"compresscodec: {_CODEC_NAMES[batch.codec]} crc: {batch.crc} "  # type: ignore[attr-defined]
        f"isvalid: {_java_bool(batch.is_valid())}"
    )


def _timestamp_type(batch: RecordBatch) -> TimestampType:
    if isinstance(batch, DefaultRecordBatch):
        return batch.timestamp_type
    # The legacy entry's own attributes byte (17): LegacyRecordBatch.timestamp_type
    # reads byte 21, the v2 attributes position, which in a v1 entry is the timestamp.
    return legacy_entry_header(batch.to_bytes()).timestamp_type


def _sequence(batch: DefaultRecordBatch, offset: int) -> int:
    # Kafka's DefaultRecord.sequence: baseSequence + offsetDelta, wrapping past int32.
    if batch.base_sequence < 0:
        return -1
    delta = offset - batch.base_offset
    if batch.base_sequence > _INT32_MAX - delta:
        return delta - (_INT32_MAX - batch.base_sequence) - 1
    return batch.base_sequence + delta


def _size(data: bytes | None) -> int:
    return -1 if data is None else len(data)


def _text(data: bytes) -> str:
    # Kafka's StringDecoder: new String(bytes, UTF_8), malformed input replaced.
    return data.decode("utf-8", errors="replace")


def _legacy_messages(batch: RecordBatch) -> Iterator[tuple[int, bool]]:
    """(stored crc, valid) of each message of a legacy entry, in record order."""
    entry = batch.to_bytes()
    header = legacy_entry_header(entry)
    if header.codec is CompressionType.NONE:
        yield header.crc, legacy_entry_is_valid(entry)
        return
    value_start = header.entry_size - header.value_size
    data = decompress(header.codec, entry[value_start:], magic=header.magic)
    pos = 0
    while pos < len(data):
        inner = legacy_entry_header(data[pos:])
        yield inner.crc, legacy_entry_is_valid(data[pos : pos + inner.entry_size])
        pos += inner.entry_size


def _record_line(
    batch: RecordBatch,
    record: Record,
    options: DumpOptions,
    legacy: tuple[int, bool] | None,
) -> str:
    parts: list[str] = []
    prefix = f"{RECORD_INDENT} "
    if not options.skip_record_metadata:
        parts.append(
            f"{prefix}offset: {record.offset} {_timestamp_type(batch).display_name}: "
            f"{record.timestamp} keySize: {_size(record.key)} valueSize: {_size(record.value)}"
        )
        prefix = " "
        if isinstance(batch, DefaultRecordBatch):
            header_keys = ",".join(key for key, _value in record.headers)
            parts.append(
                f" sequence: {_sequence(batch, record.offset)} headerKeys: [{header_keys}]"
            )
        if legacy is not None:
            # Kafka prints a stray '}' here; kept so the lines compare equal.
            parts.append(f" isValid: {_java_bool(legacy[1])} crc: {legacy[0]}}}")
        if batch.is_control:
            parts.append(_control_text(record))
    if options.print_data_log and not batch.is_control:
        if record.key is not None:
            parts.append(f"{prefix}key: {_text(record.key)}")
            prefix = " "
        if record.value is not None:
            parts.append(f" payload: {_text(record.value)}")
    return "".join(parts)


def _control_text(record: Record) -> str:
    key = record.key or b""
    if len(key) < _CONTROL_KEY.size:
        return " controlType: UNKNOWN(-1)"
    _version, type_id = _CONTROL_KEY.unpack_from(key)
    name = _CONTROL_TYPES.get(type_id, "UNKNOWN")
    value = record.value or b""
    if type_id in (0, 1) and len(value) >= _END_TXN_VALUE.size:
        _value_version, coordinator_epoch = _END_TXN_VALUE.unpack_from(value)
        return f" endTxnMarker: {name} coordinatorEpoch: {coordinator_epoch}"
    return f" controlType: {name}({type_id})"


def _dump_log(path: Path, options: DumpOptions, problems: _Problems, out: TextIO) -> None:
    out.write(f"Log starting offset: {_base_offset(path)}\n")
    data = _read(path)
    valid_bytes = 0
    last_offset = -1
    last_batch_offset = -1
    name = str(path.absolute())
    for batch in iter_batches(data):
        out.write(_batch_line(batch, valid_bytes) + "\n")
        last_batch_offset = batch.last_offset
        if options.deep_iteration:
            legacy = list(_legacy_messages(batch)) if batch.magic < 2 else None
            for i, record in enumerate(batch.records()):
                if last_offset != -1 and record.offset != last_offset + 1:
                    problems.non_consecutive.setdefault(name, []).append(
                        (last_offset, record.offset)
                    )
                last_offset = record.offset
                line = _record_line(batch, record, options, legacy[i] if legacy else None)
                out.write(line + "\n")
        valid_bytes += batch.size
    trailing = len(data) - valid_bytes
    if trailing > 0:
        out.write(f"Found {trailing} invalid bytes at the end of {path.name}\n")
        # Kafka's line says neither where nor why; "at the end" may be the middle of a
        # sealed segment whose batch length was damaged.
        if trailing < HEADER_SIZE_UP_TO_MAGIC:
            why = "fewer bytes than a batch header"
        else:
            size, _magic = batch_size_at(data, valid_bytes)
            why = f"a batch of {size} bytes runs past the end of the file"
        after = f" (after offset {last_batch_offset})" if last_batch_offset >= 0 else ""
        problems.unframed.append(
            f"{path.absolute()}: byte {valid_bytes}{after}: {why}; {trailing} bytes cannot "
            "be read as batches"
        )


# -- indexes ------------------------------------------------------------------------


def _offset_entries(data: bytes, base_offset: int) -> list[tuple[int, int]]:
    """Every slot of an offset index as (offset, position), as Kafka's read-only
    ``OffsetIndex`` sees them (the file length rounded down to whole entries)."""
    return [
        (base_offset + rel, pos)
        for rel, pos in _OFFSET_ENTRY.iter_unpack(data[: len(data) - len(data) % 8])
    ]


def _first_batch(log: bytes, position: int, limit: int) -> RecordBatch | None:
    window = log[position : position + limit]
    return next(iter_batches(window, position), None)


def _dump_index(
    path: Path, options: DumpOptions, problems: _Problems, out: TextIO, err: TextIO
) -> None:
    base = _base_offset(path)
    data = _read(path)
    entries = _offset_entries(data, base)
    if not entries:
        out.write(f"{path} is empty.\n")
        return
    if options.index_sanity_check:
        _offset_index_sanity(path, data, entries, base)
        out.write(f"{path} passed sanity check.\n")
        return
    log = _read(_log_for(path))
    name = str(path.absolute())
    for i, (offset, position) in enumerate(entries):
        # A preallocated (active or crashed) index ends in zero slots: stop at the first.
        if offset == base and i > 0:
            return
        batch = _first_batch(log, position, options.max_message_size)
        log_offset = batch.last_offset if batch is not None else -1
        if log_offset != offset:
            problems.index_mismatches.setdefault(name, []).append((offset, log_offset))
        if not options.verify_index_only:
            out.write(f"offset: {offset} position: {position}\n")


def _offset_index_sanity(
    path: Path, data: bytes, entries: list[tuple[int, int]], base: int
) -> None:
    last_offset = entries[-1][0]
    absolute = path.absolute()
    if last_offset < base:
        raise ValueError(
            f"Corrupt index found, index file ({absolute}) has non-zero size but the last "
            f"offset is {last_offset} which is less than the base offset {base}."
        )
    if len(data) % _OFFSET_ENTRY.size:
        raise ValueError(
            f"Index file {absolute} is corrupt, found {len(data)} bytes which is neither "
            f"positive nor a multiple of {_OFFSET_ENTRY.size}."
        )


def _dump_time_index(
    path: Path, options: DumpOptions, problems: _Problems, out: TextIO, err: TextIO
) -> None:
    base = _base_offset(path)
    data = _read(path)
    entries = [
        (ts, base + rel) for ts, rel in _TIME_ENTRY.iter_unpack(data[: len(data) - len(data) % 12])
    ]
    if options.index_sanity_check:
        _time_index_sanity(path, data, entries, base)
        out.write(f"{path} passed sanity check.\n")
        return
    log = _read(_log_for(path))
    index_path = _log_for(path).with_suffix(".index")
    offset_index = _offset_entries(_read(index_path), base) if index_path.exists() else []
    name = str(path.absolute())
    previous = -1
    for i, (timestamp, offset) in enumerate(entries):
        if offset == base and i > 0:
            return
        position = _lookup(offset_index, base, offset)
        found = next(
            (b for b in iter_batches(log[position:], position) if b.last_offset >= offset), None
        )
        if found is None:
            problems.time_not_found.setdefault(name, []).append((offset, -1))
        elif found.last_offset != offset:
            problems.time_not_found.setdefault(name, []).append((offset, found.last_offset))
        else:
            max_timestamp = max((r.timestamp for r in found.records()), default=-1)
            if max_timestamp != timestamp:
                problems.time_mismatches.setdefault(name, []).append((timestamp, max_timestamp))
            if previous >= timestamp:
                problems.time_out_of_order.setdefault(name, []).append((timestamp, previous))
        if not options.verify_index_only:
            out.write(f"timestamp: {timestamp} offset: {offset}\n")
        previous = timestamp


def _lookup(entries: list[tuple[int, int]], base: int, target: int) -> int:
    """Kafka's ``OffsetIndex.lookup(target).position``: the largest entry <= target
    (slots after the first zero one ignored), else the segment start."""
    position = 0
    for i, (offset, entry_position) in enumerate(entries):
        if (offset == base and i > 0) or offset > target:
            break
        position = entry_position
    return position


def _time_index_sanity(path: Path, data: bytes, entries: list[tuple[int, int]], base: int) -> None:
    absolute = path.absolute()
    if entries:
        last_timestamp, last_offset = entries[-1]
        first_timestamp = entries[0][0]
        if last_timestamp < first_timestamp:
            raise ValueError(
                f"Corrupt time index found, time index file ({absolute}) has non-zero size "
                f"but the last timestamp is {last_timestamp} which is less than the first "
                f"timestamp {first_timestamp}"
            )
        if last_offset < base:
            raise ValueError(
                f"Corrupt time index found, time index file ({absolute}) has non-zero size "
                f"but the last offset is {last_offset} which is less than the first offset "
                f"{base}"
            )
    if len(data) % _TIME_ENTRY.size:
        raise ValueError(
            f"Time index file {absolute} is corrupt, found {len(data)} bytes which is "
            f"neither positive nor a multiple of {_TIME_ENTRY.size}."
        )


def _dump_txn_index(path: Path, out: TextIO) -> None:
    data = _read(path)
    usable = len(data) - len(data) % _TXN_ENTRY.size
    for version, producer_id, first, last, last_stable in _TXN_ENTRY.iter_unpack(data[:usable]):
        out.write(
            f"version: {version} producerId: {producer_id} firstOffset: {first} "
            f"lastOffset: {last} lastStableOffset: {last_stable}\n"
        )


__all__ = ["DumpOptions", "dump_files"]


def _cmd_dump(args: argparse.Namespace) -> int:
    files = list(args.files)
    for group in args.files_option or ():
        files.extend(name for name in group.split(",") if name)
    if not files:
        raise UsageError("give at least one .log, .index or .timeindex file")
    options = DumpOptions(
        print_data_log=args.print_data_log,
        deep_iteration=args.deep_iteration or args.print_data_log,
        verify_index_only=args.verify_index_only,
        index_sanity_check=args.index_sanity_check,
        skip_record_metadata=args.skip_record_metadata,
        max_message_size=args.max_message_size,
    )
    for name in files:
        if not Path(name).exists():
            raise CommandError(f"no such file: {name}")
        if not Path(name).is_file():
            raise CommandError(f"not a file: {name}")
    return dump_files([Path(name) for name in files], options, sys.stdout, sys.stderr)


def add_parser(commands: argparse._SubParsersAction[Parser], shared: Parents) -> None:
    """Add ``dump`` to ``commands``."""
    dump = commands.add_parser(
        "dump",
        help="print segment and index files as kafka-dump-log.sh does",
        description="Print .log, .index, .timeindex and .txnindex files as Kafka's "
        "DumpLogSegments (kafka-dump-log.sh) does.",
    )
    dump.add_argument("files", nargs="*", metavar="FILE")
    dump.add_argument(
        "--files", dest="files_option", action="append", metavar="F1,F2", help="as Kafka's tool"
    )
    dump.add_argument(
        "--print-data-log", action="store_true", help="print keys and payloads (implies deep)"
    )
    dump.add_argument(
        "--deep-iteration", action="store_true", help="print every record, not only batches"
    )
    dump.add_argument(
        "--verify-index-only", action="store_true", help="check index entries, print no entries"
    )
    dump.add_argument(
        "--index-sanity-check",
        action="store_true",
        help="only the sanity check an open runs on an index",
    )
    dump.add_argument(
        "--skip-record-metadata", action="store_true", help="records without their metadata"
    )
    dump.add_argument(
        "--max-message-size",
        type=int,
        default=5 * 1024 * 1024,
        metavar="BYTES",
        help="largest batch read at an index entry",
    )
    dump.set_defaults(handler=_cmd_dump, command_parser=dump)

"""``seglogfs delete-records``: Kafka's ``kafka-delete-records.sh`` (``DeleteRecordsCommand``).

Moves the log start offset of each partition named in ``--offset-json-file`` up to the
offset given there (``-1``: the log end offset), as Kafka's DeleteRecords does: the
records below it are no longer served (readers continue at the new log start, as after
retention), and the segments wholly below it go at the next retention check. It is the
way past a damaged batch (see the README, "A damaged segment"): move the log start to
the first offset after it.

The file is Kafka's::

    {"partitions": [{"topic": "t", "partition": 0, "offset": 2350}], "version": 1}

and so is the output: ``Executing records delete operation``, ``Records delete
operation completed:``, then per partition ``partition: t-0<TAB>low_watermark: N`` (the
log start offset now) or ``partition: t-0<TAB>error: REASON``. Unlike Kafka's tool,
the exit code is 1 when any partition failed.

When a daemon owns the log directory (its control socket answers) the request goes
through it (op ``delete_records``), else the directory is opened for writing here; the
engine call and the results are the same (``seglogfs.control.protocol.delete_records``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .. import control
from ..control.protocol import HIGH_WATERMARK, delete_records, parse_partition_offsets
from .common import (
    EXIT_ERROR,
    EXIT_OK,
    Parents,
    Parser,
    UsageError,
    existing_log_dir,
    log_dir_of,
    open_writable,
)

__all__ = ["add_parser", "parse_offset_json"]

_VERSION = 1


def parse_offset_json(text: str) -> list[tuple[str, int, int]]:
    """The (topic, partition, offset) entries of a ``--offset-json-file``, checked as
    Kafka's ``DeleteRecordsCommand`` checks them.

    Raises:
        UsageError: not JSON, a missing ``partitions`` field, another ``version``, a
            malformed entry, or a topic-partition given twice.
    """
    try:
        document = json.loads(text)
    except ValueError:
        raise UsageError("the offset JSON file is not valid JSON") from None
    if not isinstance(document, dict):
        raise UsageError("the offset JSON file must hold a JSON object")
    version = document.get("version", _VERSION)
    if version != _VERSION:
        raise UsageError(f"not supported version field value {version!r} (only 1)")
    if "partitions" not in document:
        raise UsageError("missing partitions field in the offset JSON file")
    try:
        entries = parse_partition_offsets(document["partitions"])
    except ValueError as exc:
        raise UsageError(f"offset JSON file: {exc}") from None
    for topic, partition, offset in entries:
        if offset < HIGH_WATERMARK:
            raise UsageError(
                f"offset JSON file: offset {offset} of {topic}-{partition} is neither an "
                "offset nor -1 (the log end)"
            )
    return entries


def _cmd_delete_records(args: argparse.Namespace) -> int:
    log_dir = log_dir_of(args)
    path: Path = args.offset_json_file
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"no such offset JSON file: {path}") from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"offset JSON file {path} is not UTF-8 text ({exc.reason})") from None
    entries = parse_offset_json(text)
    print("Executing records delete operation", flush=True)
    if control.daemon_socket(log_dir) is not None:
        wire = [{"topic": t, "partition": p, "offset": o} for t, p, o in entries]
        answer = control.request(log_dir, "delete_records", partitions=wire)
        assert isinstance(answer, list)
        results: list[dict[str, object]] = answer
    else:
        with open_writable(existing_log_dir(args), args) as manager:
            results = delete_records(manager, entries)
    print("Records delete operation completed:")
    failed = False
    for result in results:
        name = f"{result['topic']}-{result['partition']}"
        if "error" in result:
            failed = True
            print(f"partition: {name}\terror: {result['error']}")
        else:
            print(f"partition: {name}\tlow_watermark: {result['low_watermark']}")
    return EXIT_ERROR if failed else EXIT_OK


def add_parser(commands: argparse._SubParsersAction[Parser], shared: Parents) -> None:
    """Add ``delete-records`` to ``commands``."""
    command = commands.add_parser(
        "delete-records",
        parents=[shared.log_dir, shared.writer],
        help="move partitions' log start offsets forward (kafka-delete-records.sh)",
        description="Delete the records of the given partitions below the given offsets, "
        "as Kafka's kafka-delete-records.sh does: each partition's log start offset moves "
        "up to its offset (-1: the log end).",
    )
    command.add_argument(
        "--offset-json-file",
        required=True,
        type=Path,
        metavar="FILE",
        help='the JSON file with an offset per partition: {"partitions": [{"topic": "t", '
        '"partition": 0, "offset": 10}], "version": 1}',
    )
    command.set_defaults(handler=_cmd_delete_records, command_parser=command)

"""The ``json`` format on the command line: ``topics create --format json``, ``produce``
of JSON lines (the topic's default input, or ``--format json``), ``consume`` printing the
same bytes as the partition file, ``consume --format json`` of any topic through the
same renderer, and ``verify`` of a json topic's position index."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

from seglogfs.cli.verify import verify_log_dir
from seglogfs.positions import position_index_spec
from storage import LogManager, TopicMetadata
from tests.cli.conftest import Cli
from tests.storage.record.test_json_format import reference

NOW = int(time.time() * 1000)
LINES = [
    {"key": "k1", "value": "v\n1", "headers": [["h", "x"], ["n", None]], "timestamp": NOW},
    {"value": {"base64": "//79"}, "timestamp": NOW + 1},
    {"key": {"base64": "AAE="}, "value": None},
    # Where a rendered record was is ignored: it goes where it is produced.
    {"topic": "elsewhere", "partition": 7, "offset": 99, "value": "moved", "timestamp": NOW},
]
EXPECTED = [
    (b"k1", b"v\n1", (("h", b"x"), ("n", None))),
    (None, b"\xff\xfe\xfd", ()),
    (b"\x00\x01", None, ()),
    (None, b"moved", ()),
]


def _stdin() -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in LINES)


def test_a_json_topic_takes_json_lines_and_consume_prints_its_file_bytes(
    cli: Cli, log_dir: Path
) -> None:
    assert cli("topics", "create", "t", "--format", "json").code == 0
    assert "Format: json" in cli("topics", "describe", "t").text
    before = int(time.time() * 1000)
    result = cli("produce", "t", "-p", "0", stdin=_stdin())
    assert (result.code, result.err) == (0, "")
    with LogManager.open(log_dir, read_only=True) as manager:
        records = list(manager.log("t", 0).records(0))
    assert [(r.key, r.value, r.headers) for r in records] == EXPECTED
    assert records[0].timestamp == NOW
    assert records[2].timestamp >= before  # no timestamp: stamped when produced
    shown = cli("consume", "t").out
    assert shown == b"".join(reference(r, "t", 0) for r in records)
    assert cli("consume", "t", "--format", "json").out == shown  # one renderer
    assert verify_log_dir(log_dir) == []


def test_produce_format_json_into_a_lines_topic_and_a_bad_line_stops_it(
    cli: Cli, log_dir: Path
) -> None:
    cli("topics", "create", "plain")
    result = cli("produce", "plain", "-p", "0", "--format", "json", stdin=_stdin())
    assert result.code == 0
    assert cli("consume", "plain").out == b"v\n1\n\xff\xfe\xfd\n\nmoved\n"
    bad = cli("produce", "plain", "-p", "0", "--format", "json", stdin=b'{"value": "a"}\nnope\n')
    assert bad.code != 0
    assert "line 2 of 2" in bad.err
    with LogManager.open(log_dir, read_only=True) as manager:
        assert manager.log("plain", 0).log_end_offset == 4  # nothing of the bad batch
    assert cli("produce", "plain", "--raw", "--format", "json", stdin=b"{}\n").code == 2


def test_verify_checks_the_position_index_of_a_json_topic(log_dir: Path) -> None:
    # Partition 10: its number is part of every line, one digit longer than partition
    # 0's, so verify must render each partition's own lines to find the index right;
    # and an index counted in lines units must be found wrong. Enough batches for the
    # index to hold entries past entry 0 (one per 4 KiB rendered).
    def counted_as_lines(metadata: TopicMetadata):  # type: ignore[no-untyped-def]
        return position_index_spec(dataclasses.replace(metadata, format="lines"))

    def fill(manager: LogManager, topic: str) -> None:
        manager.create_topic(topic, 11, format="json")
        for i in range(40):
            manager.log(topic, 10).append([b"value %d" % i] * 20, keys=[b"k", None] * 10)

    with LogManager.open(log_dir, extension=position_index_spec) as manager:
        fill(manager, "good")
    assert verify_log_dir(log_dir) == []
    with LogManager.open(log_dir, extension=counted_as_lines) as manager:
        fill(manager, "bad")
    problems = [str(p) for p in verify_log_dir(log_dir)]
    assert problems
    assert all("bad-10" in p for p in problems), problems

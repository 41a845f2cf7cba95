"""The ``json`` rendering and its inverse: byte-equal to ``json.dumps`` of the documented
document (a reference spelled out here, record by record), one line per record whatever
it holds, exact sizes, and lines parsed back to the records they render; refusals name
their reason."""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.legacy_records import LegacyRecordBatchBuilder

from storage import (
    JsonRecordError,
    Record,
    json_rendered_size,
    parse_json_record,
    render_json_batch,
)
from storage.record.batch_builder import build_record_batch
from storage.record.json_format import parse_json_lines, render_json_data
from storage.record.record import Header
from storage.record.record_batch import RecordBatch, read_batch

TS = 1_700_000_000_000


def _text(data: bytes | None) -> object:
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode("ascii")}


def reference(record: Record, topic: str, partition: int) -> bytes:
    """The documented line of one record, built with ``json.dumps`` (not the module)."""
    document = {
        "topic": topic,
        "partition": partition,
        "offset": record.offset,
        "timestamp": record.timestamp,
        "timestampType": record.timestamp_type.display_name,
        "key": _text(record.key),
        "value": _text(record.value),
        "headers": [[k, _text(v)] for k, v in record.headers],
    }
    return (json.dumps(document, ensure_ascii=False) + "\n").encode("utf-8")


def batch_of(
    values: Sequence[bytes | None],
    keys: Sequence[bytes | None] | None = None,
    headers: Sequence[Sequence[Header]] | None = None,
    timestamps: Sequence[int] | int = TS,
    base_offset: int = 0,
) -> RecordBatch:
    data = build_record_batch(
        values, keys=keys, headers=headers, timestamps=timestamps, base_offset=base_offset
    )
    return read_batch(data)


def check(batch: RecordBatch, topic: str = "orders", partition: int = 3) -> bytes:
    rendered = render_json_batch(batch, topic, partition)
    lines = [reference(r, topic, partition) for r in batch.records()]
    assert rendered.data == b"".join(lines)
    assert list(rendered.ends) == [sum(map(len, lines[: i + 1])) for i in range(len(lines))]
    assert list(rendered.offsets) == [r.offset for r in batch.records()]
    assert json_rendered_size(batch, topic, partition) == len(rendered.data)
    assert render_json_data(batch, topic, partition) == rendered.data  # the render process's
    return rendered.data


def test_keys_headers_binary_newlines_and_nulls_render_one_line_each() -> None:
    values = [b"plain", b"two\nlines", b"\xff\xfe binary", None, "ünïcödé \u2028".encode(), b""]
    keys = [b"k", None, b"\x00\x01", b"k3", b'"quoted" \\', None]
    # A '%' in a value or the topic: the lines are a %-format (_LineTemplate).
    check(batch_of([b"100%", b"%s %d %%"], base_offset=7), "t%d", 1)
    check(batch_of([b"100%", b"%s %d %%"], [b"%", b"%%"], [[("%s", b"%")], []]))
    headers: list[list[Header]] = [
        [("trace", b"abc"), ("none", None)],
        [],
        [("bin", b"\x80")],
        [("é\n", b"x")],
        [],
        [],
    ]
    data = check(batch_of(values, keys, headers, [TS + i for i in range(6)], base_offset=98))
    lines = data.split(b"\n")
    assert lines.pop() == b""
    assert len(lines) == len(values)  # a newline inside a value never splits its line
    first = json.loads(lines[0])
    assert list(first) == [
        "topic",
        "partition",
        "offset",
        "timestamp",
        "timestampType",
        "key",
        "value",
        "headers",
    ]
    assert first["offset"] == 98
    assert json.loads(lines[2])["value"] == {
        "base64": base64.b64encode(b"\xff\xfe binary").decode()
    }
    assert json.loads(lines[3])["value"] is None


def test_control_batches_render_nothing_and_legacy_records_have_no_timestamp_type() -> None:
    builder = LegacyRecordBatchBuilder(magic=0, compression_type=0, batch_size=1 << 20)
    builder.append(0, timestamp=None, key=b"k", value=b"v0")
    legacy = read_batch(bytes(builder.build()))
    data = check(legacy)
    assert b'"timestamp": -1, "timestampType": "NoTimestampType"' in data


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.one_of(st.none(), st.binary(max_size=20), st.text(max_size=10).map(str.encode)),
            st.one_of(st.none(), st.binary(max_size=40), st.text(max_size=20).map(str.encode)),
            st.lists(
                st.tuples(st.text(max_size=5), st.one_of(st.none(), st.binary(max_size=8))),
                max_size=3,
            ),
        ),
        min_size=1,
        max_size=8,
    ),
    st.integers(0, 10**12),
    st.integers(0, 10_000),
)
def test_rendering_is_json_dumps_and_parses_back(
    records: list[tuple[bytes | None, bytes | None, list[Header]]], offset: int, partition: int
) -> None:
    keys = [r[0] for r in records]
    values = [r[1] for r in records]
    headers = [r[2] for r in records]
    batch = batch_of(values, keys, headers, base_offset=offset)
    data = check(batch, "t.x_y-1", partition)
    for line, record in zip(data.split(b"\n"), batch.records(), strict=False):
        parsed = parse_json_record(line)
        assert (parsed.key, parsed.value, parsed.headers, parsed.timestamp) == (
            record.key,
            record.value,
            record.headers,
            record.timestamp,
        )


def test_missing_fields_are_what_a_producer_leaves_unset() -> None:
    parsed = parse_json_record(b"{}")
    assert (parsed.key, parsed.value, parsed.headers, parsed.timestamp) == (None, None, (), None)
    columns = parse_json_lines([b'{"value": "a"}', b'{"value": "b", "timestamp": 5}'], now=777)
    assert columns.timestamps == [777, 5]
    assert columns.values == [b"a", b"b"]


def test_where_a_rendered_record_was_is_ignored() -> None:
    line = (
        b'{"topic": "other", "partition": 9, "offset": 12345, "timestamp": 1, '
        b'"timestampType": "LogAppendTime", "key": {"base64": "AAE="}, "value": "v", '
        b'"headers": [["h", null]]}'
    )
    parsed = parse_json_record(line)
    assert parsed == (b"\x00\x01", b"v", (("h", None),), 1)


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b"plain text", "not a JSON document"),
        (b"\xff", "not a JSON document"),
        (b'"a string"', "a JSON string, not an object"),
        (b"[1]", "a JSON array, not an object"),
        (b'{"valeu": "x"}', "unknown field 'valeu'"),
        (b'{"value": 5}', "'value' must be a string"),
        (b'{"key": {"base64": "!!"}}', "'key': bad base64"),
        (b'{"key": {"base64": "AA==", "x": 1}}', "'key' must be a string"),
        (b'{"timestamp": "now"}', "'timestamp' must be epoch milliseconds"),
        (b'{"timestamp": true}', "'timestamp' must be epoch milliseconds"),
        (b'{"timestamp": 1.5}', "'timestamp' must be epoch milliseconds"),
        (b'{"headers": {"h": "x"}}', "'headers' must be an array"),
        (b'{"headers": [["h"]]}', "'headers' must be an array"),
        (b'{"headers": [[1, "x"]]}', "'headers' must be an array"),
        (b'{"offset": "5"}', "'offset' must be an integer"),
        (b'{"partition": null}', "'partition' must be an integer"),
        (b'{"topic": 1}', "'topic' must be a string"),
        (b'{"timestampType": "Later"}', "'timestampType' must be one of"),
        (b'{"value": "\\ud800"}', "lone surrogate"),
    ],
)
def test_lines_that_are_no_record_object_are_refused_with_their_reason(
    line: bytes, reason: str
) -> None:
    with pytest.raises(JsonRecordError, match=r"^not a json record: ") as caught:
        parse_json_record(line)
    assert reason in caught.value.reason


def test_a_refused_line_among_several_is_named_by_its_number() -> None:
    with pytest.raises(JsonRecordError, match="line 2 of 3"):
        parse_json_lines([b"{}", b"nope", b"{}"], now=0)

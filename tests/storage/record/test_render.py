"""Rendering batches as partition-file bytes: both formats, keys, nulls, control and
legacy batches, and a property check against a record-by-record reference."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.legacy_records import LegacyRecordBatchBuilder

from storage import RenderedBatch, render_batch, rendered_size
from storage.errors import CorruptRecordError
from storage.record.batch_builder import build_record_batch
from storage.record.record import CompressionType
from storage.record.record_batch import RecordBatch, read_batch

TS = 1_700_000_000_000


def batch_of(
    values: Sequence[bytes | None],
    keys: Sequence[bytes | None] | None = None,
    **kwargs: object,
) -> RecordBatch:
    return read_batch(build_record_batch(values, keys=keys, timestamps=TS, **kwargs))  # type: ignore[arg-type]


def reference(batch: RecordBatch, *, raw: bool, key_separator: bytes | None) -> list[bytes]:
    """Each record's rendering, one ``Record`` at a time (the formats, spelled out)."""
    if batch.is_control:
        return []
    out = []
    for record in batch.records():
        value = record.value or b""
        if raw:
            out.append(value)
        elif key_separator is not None and record.key is not None:
            out.append(record.key + key_separator + value + b"\n")
        else:
            out.append(value + b"\n")
    return out


def pieces_of(rendered: RenderedBatch) -> list[bytes]:
    starts = [0, *rendered.ends][: len(rendered.ends)]
    return [rendered.data[s:e] for s, e in zip(starts, rendered.ends, strict=True)]


def check(batch: RecordBatch, *, raw: bool, key_separator: bytes | None) -> RenderedBatch:
    rendered = render_batch(batch, raw=raw, key_separator=key_separator)
    expected = reference(batch, raw=raw, key_separator=key_separator)
    assert pieces_of(rendered) == expected
    assert rendered.data == b"".join(expected)
    assert rendered.ends.typecode == "q"
    assert len(rendered) == len(rendered.ends) == len(rendered.offsets) == len(expected)
    if not batch.is_control:
        assert list(rendered.offsets) == [r.offset for r in batch.records()]
    assert rendered_size(batch, raw=raw, key_separator=key_separator) == len(rendered.data)
    return rendered


def test_lines_without_keys() -> None:
    rendered = check(batch_of([b"alpha", b"", b"gamma"]), raw=False, key_separator=None)
    assert rendered.data == b"alpha\n\ngamma\n"
    assert list(rendered.ends) == [6, 7, 13]
    assert rendered.offsets == range(0, 3)


def test_lines_show_keys_only_with_a_separator() -> None:
    batch = batch_of([b"v1", b"v2", None], keys=[b"k1", None, b"k3"])
    assert check(batch, raw=False, key_separator=b"\t").data == b"k1\tv1\nv2\nk3\t\n"
    assert check(batch, raw=False, key_separator=None).data == b"v1\nv2\n\n"
    assert check(batch, raw=False, key_separator=b"::").data == b"k1::v1\nv2\nk3::\n"


def test_null_value_is_an_empty_line_in_lines_and_nothing_in_raw() -> None:
    batch = batch_of([None, b"x", None])
    assert check(batch, raw=False, key_separator=None).data == b"\nx\n\n"
    rendered = check(batch, raw=True, key_separator=None)
    assert rendered.data == b"x"
    assert list(rendered.ends) == [0, 1, 1]  # null records keep their (empty) entry


def test_raw_ignores_keys_and_adds_no_newlines() -> None:
    batch = batch_of([b"ab\n", b"cd"], keys=[b"k", b"k"])
    assert check(batch, raw=True, key_separator=b"=").data == b"ab\ncd"


def test_control_batch_renders_nothing() -> None:
    control_value = b"\x00\x00\x00\x00\x00\x00"  # version 0, type COMMIT (unused here)
    batch = batch_of(
        [control_value], keys=[b"\x00\x00\x00\x00"], is_control=True, is_transactional=True,
        base_offset=42,
    )  # fmt: skip
    for raw in (False, True):
        rendered = check(batch, raw=raw, key_separator=b"\t")
        assert rendered.data == b""
        assert len(rendered.ends) == 0
        assert len(rendered.offsets) == 0


def test_compaction_gaps_keep_their_offsets() -> None:
    batch = batch_of([b"a", b"b"], offset_deltas=[0, 5], last_offset_delta=7, base_offset=100)
    rendered = check(batch, raw=False, key_separator=None)
    assert list(rendered.offsets) == [100, 105]


@pytest.mark.parametrize("codec", list(CompressionType))
def test_compressed_batches_render_like_plain_ones(codec: CompressionType) -> None:
    values: list[bytes | None] = [b"line %d" % i for i in range(50)]
    plain = check(batch_of(values), raw=False, key_separator=None)
    compressed = check(batch_of(values, codec=codec), raw=False, key_separator=None)
    assert compressed == plain


@pytest.mark.parametrize("magic", [0, 1])
def test_legacy_messages_render(magic: int) -> None:
    builder = LegacyRecordBatchBuilder(magic=magic, compression_type=0, batch_size=1 << 20)
    builder.append(0, timestamp=TS, key=b"k", value=b"first")
    buffer = bytes(builder.build())
    rendered = check(read_batch(buffer), raw=False, key_separator=b"=")
    assert rendered.data == b"k=first\n"


def test_corrupt_records_raise() -> None:
    data = bytearray(build_record_batch([b"abc", b"def"], timestamps=TS))
    data[-1] = 0x7F  # the last record's header count now runs past the batch
    with pytest.raises(CorruptRecordError):
        render_batch(read_batch(bytes(data)), raw=False, key_separator=None)
    with pytest.raises(CorruptRecordError):
        rendered_size(read_batch(bytes(data)), raw=False, key_separator=None)


maybe_bytes = st.none() | st.binary(max_size=300)


@settings(max_examples=300, deadline=None)
@given(
    records=st.lists(st.tuples(maybe_bytes, maybe_bytes), min_size=1, max_size=40),
    raw=st.booleans(),
    key_separator=st.none() | st.sampled_from([b"\t", b"=", b"::"]),
    keyed=st.booleans(),
    headers=st.booleans(),
)
def test_rendering_matches_the_record_by_record_reference(
    records: list[tuple[bytes | None, bytes | None]],
    raw: bool,
    key_separator: bytes | None,
    keyed: bool,
    headers: bool,
) -> None:
    values = [value for _key, value in records]
    keys = [key for key, _value in records] if keyed else None
    header_column = [(("h", b"x"),)] * len(values) if headers else None
    batch = batch_of(values, keys, headers=header_column)
    check(batch, raw=raw, key_separator=key_separator)


def test_rendered_batches_compare_by_value_and_show_their_fields() -> None:
    a = render_batch(batch_of([b"x", b"yz"]), raw=False, key_separator=None)
    assert a == render_batch(batch_of([b"x", b"yz"]), raw=False, key_separator=None)
    assert a != render_batch(batch_of([b"x", b"y"]), raw=False, key_separator=None)
    assert a != "rendered"
    assert "data=b'x\\nyz\\n'" in repr(a)
    with pytest.raises(TypeError):
        hash(a)

"""The one produce path shared by every writer (``seglogfs.producer``)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from seglogfs.producer import rendered_units, split_keys
from storage import DefaultRecordBatch, TopicMetadata, build_record_batch, rendered_size


@given(
    records=st.lists(
        st.tuples(
            st.one_of(st.none(), st.binary(max_size=20)),
            st.one_of(st.none(), st.binary(max_size=40)),
        ),
        min_size=1,
        max_size=30,
    ),
    fmt=st.sampled_from(["lines", "raw"]),
    separator=st.one_of(st.none(), st.sampled_from([":", "=>", "é"])),
)
def test_rendered_units_equal_the_rendering(
    records: list[tuple[bytes | None, bytes | None]], fmt: str, separator: str | None
) -> None:
    """The units produce hands the engine are exactly what storage.record.render renders."""
    if fmt == "raw":
        separator = None
    metadata = TopicMetadata("t", 1, fmt, separator)
    keys = [key for key, _value in records]
    values = [value for _key, value in records]
    batch = DefaultRecordBatch(build_record_batch(values, keys=keys, timestamps=0))
    expected = rendered_size(
        batch, raw=fmt == "raw", key_separator=None if separator is None else separator.encode()
    )
    assert rendered_units(metadata, values, keys) == expected


def test_split_keys_at_the_first_separator_and_keeps_keyless_lines_whole() -> None:
    keys, values = split_keys([b"k:v", b"no key", b"a:b:c", b":empty key", b""], b":")
    assert keys == [b"k", None, b"a", b"", None]
    assert values == [b"v", b"no key", b"b:c", b"empty key", b""]

"""The ``json`` rendering of batches as producers of lines write them (distinct values,
one key, one set of headers, one timestamp for every record): long batches that cross
thousands of offsets (``json_format._joined_lines`` builds each offset from shared
digits) render byte for byte what ``json.dumps`` does, whatever the values hold."""

from __future__ import annotations

import base64
import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage.record.record import Header
from tests.storage.record.test_json_format import TS, batch_of, check

_SPECIAL = ['"', "\\", "\n", "\t", "\x00", "\x1f", "%", "%d", "%%", "\u2028", "é", "\U0001f600"]


def _value(rng: random.Random, kind: str, i: int) -> bytes | None:
    if kind == "ascii":
        return b"%010d %s" % (i, b"y" * rng.randrange(0, 30))
    if kind == "special":
        return "".join(rng.choice(_SPECIAL) + str(i) for _ in range(rng.randrange(1, 4))).encode()
    if kind == "binary":
        return bytes([0xFF, *(rng.randrange(256) for _ in range(rng.randrange(0, 8)))])
    if kind == "empty":
        return b""
    return None


def _lines_checked(data: bytes, values: list[bytes | None], key: bytes | None) -> None:
    """Every line parses with ``json.loads`` to the record's fields."""
    lines = data.split(b"\n")
    assert lines.pop() == b""
    assert len(lines) == len(values)
    for line, value in zip(lines, values, strict=True):
        document = json.loads(line)
        assert [_bytes(document["key"]), _bytes(document["value"])] == [key, value]


def _bytes(parsed: object) -> bytes | None:
    if isinstance(parsed, dict):
        assert list(parsed) == ["base64"]
        return base64.b64decode(parsed["base64"], validate=True)
    if parsed is None:
        return None
    assert isinstance(parsed, str)
    return parsed.encode("utf-8")


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 2600),
    st.sampled_from([0, 1, 999, 1000, 1001, 1998, 123_456, 9_999_000, 10**15 - 1500]),
    st.lists(st.sampled_from(["ascii", "special", "binary", "empty", "null"]), min_size=1),
    st.sampled_from([None, b"k", b'"q%\\', b"\xff"]),
    st.sampled_from([[], [("trace", b"x")], [("h%", None), ("bin", b"\x80")]]),
    st.integers(0, 2**32),
)
def test_lines_of_one_key_and_distinct_values_are_json_dumps(
    n: int,
    base_offset: int,
    kinds: list[str],
    key: bytes | None,
    headers: list[Header],
    seed: int,
) -> None:
    rng = random.Random(seed)
    values = [_value(rng, rng.choice(kinds), i) for i in range(n)]
    batch = batch_of(values, [key] * n, [headers] * n, TS, base_offset)
    data = check(batch, "t.x%d_y-1", 7)
    _lines_checked(data, values, key)


@pytest.mark.parametrize(
    ("base_offset", "n"),
    [(1000, 2600), (1999, 2), (9_999_000, 2600), (10**18, 1001), (997, 5)],
)
def test_offsets_across_thousands_and_digit_counts(base_offset: int, n: int) -> None:
    values = [b"%010d %s" % (i, b"y" * 88) for i in range(n)]
    data = check(batch_of(values, base_offset=base_offset))
    offsets = [json.loads(line)["offset"] for line in data.splitlines()]
    assert offsets == list(range(base_offset, base_offset + n))

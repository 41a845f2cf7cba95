"""Kafka's varints: ZigZag then LEB128, checked against known bytes and kafka-python."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kafka.record import util as kafka_util

from storage.errors import CorruptRecordError
from storage.record.varint import (
    SMALL_VARINTS,
    decode_varint,
    encode_varint,
    zigzag_encode,
)

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

KNOWN_ENCODINGS = [
    (0, "00"),
    (-1, "01"),
    (1, "02"),
    (-2, "03"),
    (63, "7e"),
    (-64, "7f"),
    (64, "8001"),
    (-65, "8101"),
    (300, "d804"),
    (8191, "fe7f"),
    (8192, "808001"),
    (16383, "feff01"),
    (16384, "808002"),
    (-8193, "818001"),
    (INT32_MAX, "feffffff0f"),
    (INT32_MIN, "ffffffff0f"),
    (INT64_MAX, "feffffffffffffffff01"),
    (INT64_MIN, "ffffffffffffffffff01"),
]


def zigzag_decode(u: int) -> int:
    """The reference inverse of ZigZag (the decoder inlines it)."""
    return (u >> 1) ^ -(u & 1)


def kafka_python_encoding(n: int) -> bytes:
    out = bytearray()
    kafka_util.encode_varint(n, out.append)
    return bytes(out)


@pytest.mark.parametrize(("n", "hex_bytes"), KNOWN_ENCODINGS)
def test_encode_matches_known_bytes(n: int, hex_bytes: str) -> None:
    assert encode_varint(n).hex() == hex_bytes


@pytest.mark.parametrize(("n", "hex_bytes"), KNOWN_ENCODINGS)
def test_decode_known_bytes_returns_value_and_next_position(n: int, hex_bytes: str) -> None:
    data = b"\xaa" + bytes.fromhex(hex_bytes) + b"\xbb"
    assert decode_varint(data, 1) == (n, 1 + len(hex_bytes) // 2)


@pytest.mark.parametrize(
    ("signed", "unsigned"),
    [(0, 0), (-1, 1), (1, 2), (-2, 3), (2, 4), (INT64_MAX, 2**64 - 2), (INT64_MIN, 2**64 - 1)],
)
def test_zigzag_maps_small_magnitudes_to_small_numbers(signed: int, unsigned: int) -> None:
    assert zigzag_encode(signed) & (2**64 - 1) == unsigned
    assert zigzag_decode(unsigned) == signed


@pytest.mark.parametrize("n", [INT32_MIN, INT32_MIN + 1, -1, 0, 1, INT32_MAX - 1, INT32_MAX])
def test_int32_extremes_round_trip_in_at_most_five_bytes(n: int) -> None:
    encoded = encode_varint(n)
    assert len(encoded) <= 5
    assert decode_varint(encoded, 0, max_bytes=5) == (n, len(encoded))


@pytest.mark.parametrize("n", [INT64_MIN, INT64_MIN + 1, INT32_MIN - 1, INT32_MAX + 1, INT64_MAX])
def test_int64_extremes_round_trip_in_at_most_ten_bytes(n: int) -> None:
    encoded = encode_varint(n)
    assert len(encoded) <= 10
    assert decode_varint(encoded, 0) == (n, len(encoded))


@given(st.integers(min_value=INT64_MIN, max_value=INT64_MAX))
def test_round_trip_and_kafka_python_agree_over_int64(n: int) -> None:
    encoded = encode_varint(n)
    assert encoded == kafka_python_encoding(n)
    assert decode_varint(encoded, 0) == (n, len(encoded))
    # Every byte but the last carries the continuation bit.
    assert all(b & 0x80 for b in encoded[:-1])
    assert not encoded[-1] & 0x80


def test_small_varints_agree_with_the_general_encoder() -> None:
    assert len(SMALL_VARINTS) == 16384
    for n, encoded in enumerate(SMALL_VARINTS):
        assert encoded == kafka_python_encoding(n), n
        assert decode_varint(encoded, 0) == (n, len(encoded))
    assert encode_varint(len(SMALL_VARINTS)) == kafka_python_encoding(len(SMALL_VARINTS))


def test_decode_reads_from_a_memoryview() -> None:
    view = memoryview(b"\x00" + encode_varint(-12345))
    assert decode_varint(view, 1) == (-12345, 4)


def test_decode_rejects_a_varint_over_five_bytes_when_max_is_five() -> None:
    six_bytes = bytes.fromhex("ffffffffff01")
    with pytest.raises(CorruptRecordError, match="over 5 bytes"):
        decode_varint(six_bytes, 0, max_bytes=5)
    # The same bytes are a legal varlong.
    assert decode_varint(six_bytes, 0) == (zigzag_decode(2**36 - 1), 6)


def test_decode_rejects_a_varlong_over_ten_bytes() -> None:
    eleven_bytes = b"\xff" * 10 + b"\x01"
    with pytest.raises(CorruptRecordError, match="over 10 bytes"):
        decode_varint(eleven_bytes, 0)


@pytest.mark.parametrize("n", [64, -65, INT32_MAX, INT64_MIN])
def test_decode_rejects_truncated_input(n: int) -> None:
    encoded = encode_varint(n)
    for cut in range(len(encoded)):
        with pytest.raises(CorruptRecordError):
            decode_varint(encoded[:cut], 0)
        with pytest.raises(CorruptRecordError):
            decode_varint(b"\x00" + encoded[:cut], 1)


def test_decode_rejects_a_position_at_the_end_of_the_buffer() -> None:
    with pytest.raises(CorruptRecordError):
        decode_varint(b"\x02", 1)

"""storage.number: whole numbers read as Kafka's Java reads them, whatever their length."""

from __future__ import annotations

import time

import pytest

from storage.number import (
    INT_MAX,
    INT_MIN,
    LONG_MAX,
    LONG_MIN,
    abbreviated,
    decimal_long,
    parse_java_integer,
    shown_integer,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", 0),
        ("42", 42),
        ("+42", 42),
        ("-42", -42),
        ("007", 7),
        ("-0", 0),
        ("0" * 5000 + "1", 1),  # Long.parseLong takes any number of leading zeros
        ("9223372036854775807", LONG_MAX),
        ("-9223372036854775808", LONG_MIN),
        ("9223372036854775808", None),
        ("-9223372036854775809", None),
        ("99999999999999999999", None),  # 20 significant digits: never a long
        ("9" * 5000, None),  # int() would raise ValueError past 4,300 digits
        ("1" * 65000, None),
        ("", None),
        ("+", None),
        ("-", None),
        ("1_000", None),  # int() takes these four; Java does not
        (" 1", None),
        ("1\n", None),
        ("\u0663", None),  # ARABIC-INDIC DIGIT THREE
        ("1.0", None),
        ("0x10", None),
        ("--1", None),
    ],
)
def test_parse_java_integer_reads_as_long_parse_long(text: str, expected: int | None) -> None:
    assert parse_java_integer(text) == expected


def test_parse_java_integer_bounds_are_inclusive() -> None:
    assert parse_java_integer("2147483647", INT_MIN, INT_MAX) == INT_MAX
    assert parse_java_integer("2147483648", INT_MIN, INT_MAX) is None
    assert parse_java_integer("-2147483648", INT_MIN, INT_MAX) == INT_MIN
    assert parse_java_integer("-1", 0) is None
    assert parse_java_integer("0", 0) == 0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", True),
        ("1234", True),
        ("1732550400000", True),  # epoch milliseconds
        ("9223372036854775807", True),
        ("9223372036854775808", False),
        ("9" * 5000, False),
        ("+1", False),
        ("-1", False),
        ("", False),
        ("\u0663", False),
        ("\u00b2", False),  # SUPERSCRIPT TWO: str.isdigit() says yes, int() says no
        ("1 ", False),
        ("0" * 5000 + "5", True),  # int() refuses it; Long.parseLong does not
    ],
)
def test_decimal_long(text: str, expected: bool) -> None:
    value = decimal_long(text)
    assert (value is not None) is expected
    if expected:
        assert value == parse_java_integer(text) == int(text.lstrip("0") or "0")


def test_a_long_text_is_judged_in_linear_time() -> None:
    started = time.monotonic()
    for _ in range(10):
        assert parse_java_integer("1" * 65000 + "x") is None
        assert parse_java_integer("0" * 65000 + "x") is None
        assert decimal_long("7" * 65000) is None
    assert time.monotonic() - started < 1


def test_abbreviated_keeps_short_text_and_shortens_long_text() -> None:
    assert abbreviated("86400000") == "86400000"
    assert abbreviated("x" * 40) == "x" * 40
    shown = abbreviated("1" * 65000)
    assert shown == "1" * 28 + "..." + "1" * 10 + " (65000 characters)"


def test_shown_integer_describes_what_repr_cannot_print() -> None:
    assert shown_integer(LONG_MAX) == LONG_MAX
    assert shown_integer(LONG_MIN) == LONG_MIN
    assert shown_integer(10**5000) == "a number of 16610 bits"
    assert shown_integer(-(10**5000)) == "-a number of 16610 bits"

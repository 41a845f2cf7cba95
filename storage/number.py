"""Whole numbers read from text as Kafka's Java reads them, bounded before they are built.

Kafka parses numbers with ``Integer.parseInt`` and ``Long.parseLong``: an optional ``+``
or ``-`` and ASCII digits, within 32 or 64 bits (``INT``/``LONG`` in ``ConfigDef``,
offsets, partitions, timestamps). Python's ``int()`` takes more (``_`` separators,
surrounding spaces, digits of any script) and refuses strings of over 4,300 digits with
a ``ValueError`` (its guard against quadratic conversion time), which a caller that
checks only ``str.isdigit()`` lets through as a traceback. The functions here look at
the text first, in one linear pass, and build an ``int`` of at most 19 significant
digits, so a request of 65,000 digits is refused like any other malformed number.

Everything that parses a number a client typed goes through here: config values
(``log_config``), checkpoint files, the command line's ``--partitions``, ``consume -o``
and the mount's ``P@<where>`` views.

Pure functions: thread-safe.
"""

from __future__ import annotations

import re

__all__ = [
    "INT_MAX",
    "INT_MIN",
    "LONG_MAX",
    "LONG_MIN",
    "abbreviated",
    "decimal_long",
    "parse_java_integer",
    "shown_integer",
]

INT_MIN = -(2**31)
INT_MAX = 2**31 - 1
"""Java's ``Integer.MIN_VALUE`` / ``MAX_VALUE``: Kafka's ``INT`` (partitions, sizes)."""
LONG_MIN = -(2**63)
LONG_MAX = 2**63 - 1
"""Java's ``Long.MIN_VALUE`` / ``MAX_VALUE``: Kafka's ``LONG`` (offsets, times)."""

# A sign, any leading zeros (Java accepts them), then the digits that count: a long has
# at most 19, so 20 or more can only be out of range and are refused by the pattern.
_JAVA_INTEGER = re.compile(r"([+-]?)0*([0-9]{1,19})")
_SHOWN_CHARS = 40


def parse_java_integer(text: str, low: int = LONG_MIN, high: int = LONG_MAX) -> int | None:
    """``text`` as ``Long.parseLong`` reads it, or None when it is not such a number or
    lies outside ``[low, high]`` (``INT_MIN, INT_MAX`` for an ``Integer.parseInt``).

    Nothing is stripped: surrounding whitespace, ``_`` and non-ASCII digits make it no
    number, as in Java.

    Cost: O(len(text)), one regular-expression match; ``int()`` sees at most 20
    characters.
    """
    match = _JAVA_INTEGER.fullmatch(text)
    if match is None:
        return None
    value = int(match.group(1) + match.group(2))
    return value if low <= value <= high else None


def decimal_long(text: str) -> int | None:
    """``text`` as a non-negative long written in ASCII digits alone (no sign, no space;
    leading zeros allowed, as Java's), else None: how ``consume -o N``, ``-o -N``,
    ``-o @MS`` and the views ``P@N``, ``P@-N`` and ``P@<epoch ms>`` spell their numbers.
    Use the value it returns, never ``int(text)``: 5,000 zeros before a digit are a
    long here and a ``ValueError`` there.

    Cost: O(len(text)).
    """
    if not text[:1].isdigit():
        return None
    return parse_java_integer(text, 0)


def shown_integer(value: int) -> int | str:
    """``value`` itself when it is a long, else a description, for the value of an
    error: ``repr()`` of an int of over 4,300 digits raises ``ValueError``."""
    if LONG_MIN <= value <= LONG_MAX:
        return value
    return f"{'-' if value < 0 else ''}a number of {value.bit_length()} bits"


def abbreviated(text: str) -> str:
    """``text`` itself when short, else its start and end with its length, for an error
    message or a log line that must not repeat 65,000 characters a client sent:
    ``'1111111111111111111111111111...1111111111 (65000 characters)'``."""
    if len(text) <= _SHOWN_CHARS:
        return text
    return f"{text[:28]}...{text[-10:]} ({len(text)} characters)"

"""Java ``.properties`` syntax, as Kafka reads ``server.properties``.

Pure functions: thread-safe.
"""

from __future__ import annotations

import os
import re

from ..errors import ConfigError

__all__ = ["load_properties", "parse_properties"]

_PROPERTIES_WHITESPACE = " \t\f"
_NATURAL_LINES = re.compile(r"\r\n|\r|\n")
_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _trailing_backslashes(line: str) -> int:
    return len(line) - len(line.rstrip("\\"))


def _unescape(text: str, line_number: int, key_for_errors: str) -> str:
    """Apply ``Properties.load`` escapes: ``\\t \\n \\r \\f \\uXXXX``, else drop the ``\\``."""
    out: list[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c != "\\" or i + 1 == len(text):
            # A lone trailing backslash (only possible at end of input) is dropped.
            if c != "\\":
                out.append(c)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "u":
            digits = text[i + 2 : i + 6]
            if len(digits) != 4 or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise ConfigError(
                    key_for_errors, text, f"Malformed \\uxxxx encoding on line {line_number}"
                )
            out.append(chr(int(digits, 16)))
            i += 6
        else:
            out.append(_ESCAPES.get(nxt, nxt))
            i += 2
    return "".join(out)


def parse_properties(text: str) -> dict[str, str]:
    """Parse Java ``.properties`` text into a dict, as ``Properties.load`` does.

    - Lines end at ``\\n``, ``\\r`` or ``\\r\\n``; leading spaces, tabs and form
      feeds are skipped; blank lines and lines whose first other character is
      ``#`` or ``!`` are comments.
    - A line ending in an odd number of backslashes continues on the next one,
      whose leading whitespace is dropped (a comment line never continues).
    - The key ends at the first unescaped ``=``, ``:`` or whitespace; then
      whitespace, at most one ``=``/``:`` and more whitespace are skipped; the
      rest of the line, trailing whitespace included, is the value.
    - Escapes: ``\\t \\n \\r \\f \\uXXXX``; any other ``\\c`` is ``c`` (so
      ``\\= \\: \\# \\\\`` and ``\\ `` work).
    - A later duplicate key replaces an earlier one.

    Runtime complexity: O(len(text)).

    Raises:
        ConfigError: a malformed ``\\uXXXX`` escape (the line is named).
    """
    result: dict[str, str] = {}
    lines = _NATURAL_LINES.split(text)
    i = 0
    while i < len(lines):
        line_number = i + 1
        logical = lines[i].lstrip(_PROPERTIES_WHITESPACE)
        i += 1
        if not logical or logical[0] in "#!":
            continue
        while _trailing_backslashes(logical) % 2 == 1:
            logical = logical[:-1]
            if i == len(lines):
                break
            logical += lines[i].lstrip(_PROPERTIES_WHITESPACE)
            i += 1

        key_end = len(logical)
        escaped = False
        for j, c in enumerate(logical):
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c in "=:" or c in _PROPERTIES_WHITESPACE:
                key_end = j
                break
        raw_key = logical[:key_end]
        value_start = key_end
        seen_separator = False
        while value_start < len(logical):
            c = logical[value_start]
            if c in _PROPERTIES_WHITESPACE:
                value_start += 1
            elif c in "=:" and not seen_separator:
                seen_separator = True
                value_start += 1
            else:
                break

        key = _unescape(raw_key, line_number, raw_key)
        result[key] = _unescape(logical[value_start:], line_number, key)
    return result


def load_properties(path: str | os.PathLike[str]) -> dict[str, str]:
    """Read and parse a ``.properties`` file (see ``parse_properties``).

    The file is decoded as UTF-8, falling back to ISO-8859-1 (what Java's
    ``Properties.load(InputStream)`` assumes) when it is not valid UTF-8; for
    ASCII files, which Kafka's are, both agree.

    Raises:
        OSError: the file cannot be read.
        ConfigError: as ``parse_properties``.
    """
    with open(path, "rb") as f:
        data = f.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = data.decode("iso-8859-1")
    return parse_properties(text.removeprefix("\ufeff"))

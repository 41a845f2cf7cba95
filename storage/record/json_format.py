"""The ``json`` rendering: one JSON object a record, one record a line, and its inverse.

A record of topic ``t``, partition ``p`` renders as one line (the bytes of
``json.dumps(document, ensure_ascii=False)`` and ``\\n``)::

    {"topic": "t", "partition": 0, "offset": 5, "timestamp": 1700000000000,
     "timestampType": "CreateTime", "key": "k", "value": "v", "headers": [["h", "x"]]}

Fields always in that order. ``key``, ``value`` and header values are JSON strings when
their bytes are UTF-8, ``{"base64": "..."}`` (standard alphabet, padded) when they are
not, ``null`` when null; header keys are strings (Kafka's are UTF-8). Newlines and other
control characters inside a string are escaped, so every record is exactly one line
whatever it holds. ``seglogfs consume --format json`` and the partition files of a
``json`` topic both print these bytes: this module is the one renderer.

``parse_json_record`` is the inverse, for what is written to a ``json`` topic: one such
object a line gives ``key``, ``value``, ``headers`` and ``timestamp`` (base64 objects
decoded); ``topic``, ``partition``, ``offset`` and ``timestampType`` describe where a
rendered record was and are checked for their type, then ignored (the record goes where
it is written; its type is the topic's ``message.timestamp.type``), so the lines of one
partition file can be appended to another topic as they are. Missing fields are what
Kafka's producer leaves unset: a null key, a null value, no headers, the append time.

Pure functions over immutable inputs: thread-safe.
"""

from __future__ import annotations

import base64
import binascii
import json
from array import array
from collections.abc import Callable, Iterable, Sequence
from itertools import accumulate, repeat
from json.encoder import encode_basestring
from operator import add
from typing import Final, NamedTuple, TypeVar

from ..errors import JsonRecordError
from .record import Header, TimestampType
from .record_batch import RecordBatch
from .record_columns import RecordColumns
from .render import RenderedBatch, _int64_array

__all__ = [
    "JsonRecord",
    "JsonRecords",
    "json_line_prefix",
    "json_rendered_size",
    "json_text",
    "parse_json_lines",
    "parse_json_record",
    "render_json_batch",
    "render_json_columns",
    "render_json_data",
]

FIELDS: Final = (
    "topic",
    "partition",
    "offset",
    "timestamp",
    "timestampType",
    "key",
    "value",
    "headers",
)
"""The fields of a rendered record, in their order."""

_NULL: Final = b"null"
_NUL: Final = b"\x00"
# What stands between a line's tokens (the prefix and the "key" label vary per batch).
_BEFORE_TIMESTAMP: Final = b', "timestamp": '
_BEFORE_VALUE: Final = b', "value": '
_BEFORE_HEADERS: Final = b', "headers": ['
_LINE_END: Final = b"]}\n"
_BACKSLASH: Final = b"\\"
_QUOTE: Final = b'"'
_PERCENT: Final = b"%"
_ESCAPED: Final = [bytes([b]) for b in range(0x20)] + [b'"', b"\\"]
"""The bytes JSON escapes in a string (``ensure_ascii=False``): controls, quote,
backslash; one ``in`` (memchr) each is faster than one ``translate`` of them all."""
_TIMESTAMP_TYPE_NAMES: Final = frozenset(t.display_name for t in TimestampType)
_MAX_TIMESTAMP: Final = (1 << 63) - 1
_Entry = TypeVar("_Entry")


def json_text(data: bytes | None) -> bytes:
    """``data`` as a JSON value: a string when it is UTF-8, else ``{"base64": ...}``;
    ``null`` for None. Cost: O(len(data)), in C (decode, escape, encode)."""
    if data is None:
        return _NULL
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return b'{"base64": "' + base64.b64encode(data) + b'"}'
    # encode_basestring is json.dumps(ensure_ascii=False)'s own string encoder (C):
    # the same escapes, so this module and json.dumps agree byte for byte.
    return encode_basestring(text).encode("utf-8")


def json_line_prefix(topic: str, partition: int) -> bytes:
    """What every line of a partition begins with, up to the offset's digits."""
    return (
        b'{"topic": '
        + encode_basestring(topic).encode("utf-8")
        + b', "partition": '
        + str(partition).encode("ascii")
        + b', "offset": '
    )


def render_json_batch(batch: RecordBatch, topic: str, partition: int) -> RenderedBatch:
    """Render every consumer-visible record of ``batch`` (of ``topic``'s ``partition``)
    as ``json`` lines; control batches render nothing, as in ``render_batch``. The CRC
    is not checked here (``Log.batches`` does).

    Cost: O(records + bytes): one decode of the batch into columns, a few C passes
    over each column, one join (distinct values, the rest alike: ``_joined_lines``) or
    one ``%``-format of the batch; Python code per record only for a column taken entry
    by entry (headers that differ from record to record, nulls among keys or values,
    bytes that are not UTF-8 or hold a NUL or a backslash: see ``_column_tokens``).

    Raises:
        CorruptRecordError: the records do not parse (as ``RecordBatch.columns()``).
    """
    if batch.is_control:
        next_offset = batch.next_offset
        return RenderedBatch(b"", _int64_array(b""), range(next_offset, next_offset))
    return render_json_columns(batch.columns(), topic, partition)


def render_json_data(batch: RecordBatch, topic: str, partition: int) -> bytes:
    """``render_json_batch(batch, topic, partition).data`` without the record ends:
    what the render process copies into its slot, and what the position index counts.
    Cost: as ``render_json_batch`` less the ends (a fifth of it for short values).

    Raises:
        CorruptRecordError: the records do not parse.
    """
    if batch.is_control:
        return b""
    return _render(batch.columns(), topic, partition, None)


def render_json_columns(columns: RecordColumns, topic: str, partition: int) -> RenderedBatch:
    """``render_json_batch`` of decoded columns. Cost: as ``render_json_batch``."""
    ends = _int64_array(b"")
    return RenderedBatch(_render(columns, topic, partition, ends), ends, columns.offsets)


def _render(columns: RecordColumns, topic: str, partition: int, ends: array[int] | None) -> bytes:
    """The lines of ``columns``; each line's end appended to ``ends`` unless None."""
    # No Python code runs per record in the common case. Keys, values and headers
    # become JSON tokens by whole-column operations (``_column_tokens``: a few C passes
    # over the joined column); a column that is the same for every record (no keys, no
    # headers) is one token. The lines are then one bytes %-format of the line template
    # repeated once per record (``_LineTemplate``): what every record shares is in the
    # template, the rest are its arguments. Against it (1,000 100-byte values, CPU time
    # on the 2-core machine): a Python loop per record took several times as long, and
    # a loop of native writes into a BytesWriter compiled by mypyc as long (77 against
    # 81 µs: its calls per record cost what the one %-format does), so this module
    # needs no compiling. When only the values and offsets differ from record to record
    # (what producers of lines write), one join replaces the %-format: 0.14 against
    # 0.21 µs a record for 100-byte values, decode included (``_joined_lines``). The
    # render process renders every byte a streaming reader reads: this is its hot loop.
    n = len(columns.offsets)
    if n == 0:
        return b""
    prefix = json_line_prefix(topic, partition)
    before_key = (
        b', "timestampType": "'
        + columns.timestamp_type.display_name.encode("ascii")
        + b'", "key": '
    )
    keys = _Tokens.of(columns.keys, n, _column_tokens)
    values = _Tokens.of(columns.values, n, _column_tokens)
    headers = _Tokens.of(columns.headers, n, _header_tokens)
    return _render_template(columns, prefix, before_key, keys, values, headers, n, ends)


class _Tokens:
    """A column as JSON tokens: ``same`` (one token for every record: ``tokens`` holds
    it alone) or one a record; ``quoted``: the tokens are the text, the quotes go around
    them; ``percent``: some token may hold a ``%`` (False only when known to hold none)."""

    __slots__ = ("percent", "quoted", "same", "tokens")

    def __init__(self, found: _Found, same: bool) -> None:
        self.tokens = found.tokens
        self.quoted = found.quoted
        self.percent = found.percent
        self.same = same

    @staticmethod
    def of(
        column: Sequence[_Entry], n: int, tokens: Callable[[Sequence[_Entry]], _Found]
    ) -> _Tokens:
        """Cost: O(1) when the first and last entries differ (distinct values: the
        common case), else a ``count`` (C); then ``tokens`` of the column unless it is
        one entry."""
        first = column[0]
        if column[-1] == first and column.count(first) == n:
            return _Tokens(tokens(column[:1]), True)
        return _Tokens(tokens(column), False)


class _Found(NamedTuple):
    """What ``_column_tokens`` and ``_header_tokens`` return (see ``_Tokens``)."""

    tokens: list[bytes]
    quoted: bool
    percent: bool = True


def _render_template(
    columns: RecordColumns,
    prefix: bytes,
    before_key: bytes,
    keys: _Tokens,
    values: _Tokens,
    headers: _Tokens,
    n: int,
    ends: array[int] | None,
) -> bytes:
    """The line template rendered ``n`` times (see ``_LineTemplate.render``); the line
    ends appended to ``ends`` unless None."""
    line = _LineTemplate()
    line.constant(prefix)
    line.argument(b"%d", columns.offsets)
    # Each line's length: the template's constant bytes plus its arguments' (a column
    # whose tokens all have one length adds a constant, else each record's is added).
    lengths: list[Iterable[int]] = []
    line.fixed += _count_digits(columns.offsets, lengths, ascending=True)
    line.constant(_BEFORE_TIMESTAMP)
    timestamps = columns.timestamps
    if timestamps.count(timestamps[0]) == n:
        line.constant(_decimal(timestamps[0]))
    else:
        line.argument(b"%d", timestamps)
        line.fixed += _count_digits(timestamps, lengths)
    line.constant(before_key)
    for tokens, label in ((keys, _BEFORE_VALUE), (values, _BEFORE_HEADERS), (headers, _LINE_END)):
        if tokens.quoted:
            line.constant(_QUOTE)
        if tokens.same:
            line.constant(tokens.tokens[0])
        else:
            if tokens is values:
                line.inline(tokens.tokens, percent=tokens.percent)
            else:
                line.argument(b"%s", tokens.tokens)
            lengths.append(map(len, tokens.tokens))
        if tokens.quoted:
            line.constant(_QUOTE)
        line.constant(label)
    data, fixed = line.render(n), line.fixed
    if ends is None:
        return data
    if lengths:
        total = lengths[0] if len(lengths) == 1 else map(sum, zip(*lengths, strict=True))
        ends.extend(accumulate(map(add, total, repeat(fixed))))
    else:
        ends.extend(range(fixed, fixed * n + 1, fixed))
    return data


def _header_tokens(column: Sequence[tuple[Header, ...]]) -> _Found:
    # A header (key and value) recurs from record to record (a source, a content
    # type, ...): each distinct one is rendered once per batch.
    pairs: dict[Header, bytes] = {}
    return _Found([_headers_text(headers, pairs) for headers in column], False)


class _LineTemplate:
    """A bytes %-format of one line: constant pieces (``%`` escaped), arguments (a
    column of values for each), at most one inlined column (joined into the format
    itself, see ``render``), and the count of the constant bytes."""

    __slots__ = ("arguments", "fixed", "inline_at", "inlined", "inlined_percent", "pieces", "texts")

    def __init__(self) -> None:
        self.pieces: list[bytes] = []
        self.texts: list[bytes] = []  # the pieces unescaped (an argument's: its spec)
        self.arguments: list[Sequence[object]] = []
        self.inlined: list[bytes] | None = None
        self.inlined_percent = True
        self.inline_at = 0
        self.fixed = 0

    def constant(self, piece: bytes) -> None:
        self.pieces.append(piece.replace(b"%", b"%%"))
        self.texts.append(piece)
        self.fixed += len(piece)

    def argument(self, spec: bytes, column: Sequence[object]) -> None:
        self.pieces.append(spec)
        self.texts.append(spec)
        self.arguments.append(column)

    def inline(self, tokens: list[bytes], *, percent: bool) -> None:
        """Put ``tokens`` (JSON text: never a raw NUL) here, one a line; ``percent``
        False: none of them holds a ``%`` (spares ``render`` a join to look)."""
        assert self.inlined is None
        self.inlined = tokens
        self.inlined_percent = percent
        self.inline_at = len(self.pieces)

    def render(self, n: int) -> bytes:
        """The lines of ``n`` records: one % of the template repeated ``n`` times, the
        arguments record by record (column j of record i at ``i * k + j``). An inlined
        column is joined with the template between two of its entries as separator
        (its ``%`` escaped) and makes the format itself: the largest column costs
        one C join, not a ``%s`` per record.

        When the offsets (always the first argument) are the only one, contiguous and
        at least ``_LOW_SPAN``, and a column is inlined (distinct values, the rest the
        same for every record: what producers of lines write), the lines are one join
        without a ``%`` (``_joined_lines``)."""
        k = len(self.arguments)
        tokens = self.inlined
        if k == 1 and tokens is not None and len(tokens) == n:
            offsets = self.arguments[0]
            if isinstance(offsets, range) and offsets.step == 1 and offsets.start >= _LOW_SPAN:
                texts = self.texts
                return _joined_lines(
                    texts[0],
                    b"".join(texts[2 : self.inline_at]),
                    b"".join(texts[self.inline_at :]),
                    offsets.start,
                    tokens,
                )
        flat: list[object] = [None] * (k * n)
        for j, column in enumerate(self.arguments):
            flat[j::k] = column
        if tokens is None:
            return (b"".join(self.pieces) * n) % tuple(flat)
        before = b"".join(self.pieces[: self.inline_at])
        after = b"".join(self.pieces[self.inline_at :])
        if len(tokens) > 1 and not (self.inlined_percent and b"%" in b"".join(tokens)):
            # One join makes the whole format: before + t0 + after + before + t1 ... after.
            edges = [before + tokens[0], *tokens[1:-1], tokens[-1] + after]
            return (after + before).join(edges) % tuple(flat)
        body = _NUL.join(tokens).replace(b"%", b"%%").replace(_NUL, after + before)
        return (before + body + after) % tuple(flat)


_LOW_SPAN: Final = 1000
_LOW_DIGITS: Final = [b"%03d" % low for low in range(_LOW_SPAN)]
"""The last three digits of every offset from 1000 on, shared by every rendering."""


def _joined_lines(
    head: bytes, middle: bytes, tail: bytes, first: int, tokens: list[bytes]
) -> bytes:
    """``head + offset + middle + token + tail`` for every token, the offsets counting
    from ``first`` (at least ``_LOW_SPAN``), by one join: no Python code per record.

    An offset is its digits above the last three (``high``, the same for up to 1000
    records in a row) and its last three, taken from ``_LOW_DIGITS``; the line's
    ``tail`` and the next line's ``head`` and ``high`` make one shared piece. The join's
    list holds four pieces a record (low digits, middle, token, tail-head-high) and is
    filled by slice assignments (C), one per 1000 offsets for the tail pieces. Against
    the %-format of ``render`` (offsets by ``%d``, the format first joined with the
    tokens): a third less time for 100-byte values (2,600 a batch)."""
    n = len(tokens)
    parts: list[bytes] = [middle] * (4 * n + 1)
    lows: list[bytes] = []
    start = 0
    while start < n:
        high, low = divmod(first + start, _LOW_SPAN)
        end = min(n, start + _LOW_SPAN - low)
        lows += _LOW_DIGITS[low : low + end - start]
        high_digits = _decimal(high)
        parts[4 * start : 4 * end : 4] = [tail + head + high_digits] * (end - start)
        if start == 0:
            parts[0] = head + high_digits
        start = end
    parts[1::4] = lows
    parts[3::4] = tokens
    parts[-1] = tail
    return b"".join(parts)


def _count_digits(
    numbers: Sequence[int], lengths: list[Iterable[int]], *, ascending: bool = False
) -> int:
    """The digits of a column of integers in a line's length: returned, a constant, when
    its smallest and largest number have as many (the offsets and timestamps of one
    batch, nearly always), else each number's appended to ``lengths`` (and 0 returned).
    ``ascending``: the column is sorted (offsets), so its ends are its extremes."""
    low, high = (numbers[0], numbers[-1]) if ascending else (min(numbers), max(numbers))
    if low >= 0 and len(str(low)) == len(str(high)):
        return len(str(low))
    lengths.append(map(len, map(str, numbers)))
    return 0


def _headers_text(headers: tuple[Header, ...], pairs: dict[Header, bytes]) -> bytes:
    """The headers' JSON (without the brackets around them all); ``pairs``: the
    headers rendered so far, extended here."""
    if not headers:
        return b""
    tokens: list[bytes] = []
    for pair in headers:
        token = pairs.get(pair)
        if token is None:
            token = b"[%s, %s]" % (encode_basestring(pair[0]).encode("utf-8"), json_text(pair[1]))
            pairs[pair] = token
        tokens.append(token)
    return b", ".join(tokens)


def _decimal(number: int) -> bytes:
    return str(number).encode("ascii")


def _column_tokens(column: Sequence[bytes | None]) -> _Found:
    """``json_text`` of every entry of a column, by whole-column operations when it
    can; whether the tokens still need their quotes (they are the entries); and
    whether a token may hold a ``%`` (the ``%``-format escapes it).

    Entries that are ASCII without a byte JSON escapes (text a producer of lines
    writes) are their own tokens inside quotes: one ``isascii`` and one ``in``
    (memchr) per such byte over the concatenated column. Else, without a NUL or a
    backslash in any entry, the entries are joined with NUL: when that decodes as UTF-8
    (only when every entry does: a separator is no continuation byte),
    ``encode_basestring`` escapes them all at once and the separators come out as
    ``\\u0000`` (an escaped backslash before ``u0000`` would look alike: hence no
    backslash). Columns with nulls and other columns go entry by entry. Cost: O(bytes),
    a few C passes.
    """
    entries = column if isinstance(column, list) else list(column)
    try:
        # A None among the entries makes join raise: no separate scan for nulls.
        whole = b"".join(entries)  # type: ignore[arg-type]  # a None raises
    except TypeError:
        return _Found(list(map(json_text, entries)), False)
    if whole.isascii() and not any(byte in whole for byte in _ESCAPED):
        return _Found(entries, True, _PERCENT in whole)  # type: ignore[arg-type]  # no None
    if _BACKSLASH in whole or _NUL in whole:
        return _Found(list(map(json_text, entries)), False)
    joined = _NUL.join(entries)  # type: ignore[arg-type]  # no None: join checked
    try:
        text = joined.decode("utf-8")
    except UnicodeDecodeError:
        return _Found(list(map(json_text, entries)), False)
    escaped = encode_basestring(text).encode("utf-8")
    # '"a\u0000b"' -> '"a"\x00"b"' -> ['"a"', '"b"']: a raw NUL never survives escaping.
    percent = _PERCENT in escaped
    return _Found(escaped.replace(b"\\u0000", b'"\x00"').split(_NUL), False, percent)


def json_rendered_size(batch: RecordBatch, topic: str, partition: int) -> int:
    """``len(render_json_batch(batch, topic, partition).data)``: the position-index
    units of a batch of a ``json`` topic. Escapes and base64 make a line's length
    depend on every byte, so this renders the batch.

    Cost: as ``render_json_batch``.

    Raises:
        CorruptRecordError: the records do not parse.
    """
    return len(render_json_data(batch, topic, partition))


class JsonRecord(NamedTuple):
    """What one written ``json`` line describes; ``timestamp`` None: the append time."""

    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...]
    timestamp: int | None


def parse_json_record(line: bytes) -> JsonRecord:
    """The record one written line (without its newline) describes; see the module.

    Cost: O(len(line)): ``json.loads`` and one base64 decode per base64 object.

    Raises:
        JsonRecordError: the line is not UTF-8 JSON, not an object, has a field this
            format does not have, or a field of the wrong type (a ``base64`` object
            with bad base64 included); the message says which.
    """
    try:
        document = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise JsonRecordError(f"not a JSON document: {exc}") from None
    if not isinstance(document, dict):
        raise JsonRecordError(f"a JSON {_kind(document)}, not an object")
    unknown = [name for name in document if name not in FIELDS]
    if unknown:
        raise JsonRecordError(f"unknown field {unknown[0]!r} (fields: {', '.join(FIELDS)})")
    if not isinstance(document.get("topic", ""), str):
        raise JsonRecordError("'topic' must be a string")
    for name in ("partition", "offset"):
        if not _is_integer(document.get(name, 0)):
            raise JsonRecordError(f"{name!r} must be an integer")
    timestamp_type = document.get("timestampType", "CreateTime")
    if timestamp_type not in _TIMESTAMP_TYPE_NAMES:
        raise JsonRecordError(
            f"'timestampType' must be one of {', '.join(sorted(_TIMESTAMP_TYPE_NAMES))}"
        )
    timestamp = document.get("timestamp")
    if timestamp is not None and not (_is_integer(timestamp) and timestamp <= _MAX_TIMESTAMP):
        raise JsonRecordError("'timestamp' must be epoch milliseconds (an integer) or null")
    if timestamp is not None and timestamp < 0:
        # A negative timestamp is Kafka's "none" (-1, legacy records): the append time.
        timestamp = None
    return JsonRecord(
        _bytes_of(document.get("key"), "key"),
        _bytes_of(document.get("value"), "value"),
        _headers_of(document.get("headers", [])),
        timestamp,
    )


def _is_integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _kind(value: object) -> str:
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    return "number"


def _bytes_of(value: object, name: str) -> bytes | None:
    """A rendered key, value or header value back to its bytes."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            return value.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate escaped as \\udXXX
            raise JsonRecordError(f"{name!r} holds a lone surrogate: not UTF-8") from None
    if isinstance(value, dict) and list(value) == ["base64"] and isinstance(value["base64"], str):
        try:
            return base64.b64decode(value["base64"], validate=True)
        except (binascii.Error, ValueError):
            raise JsonRecordError(f"{name!r}: bad base64") from None
    raise JsonRecordError(f'{name!r} must be a string, {{"base64": "..."}} or null')


def _headers_of(value: object) -> tuple[Header, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise JsonRecordError("'headers' must be an array of [key, value] pairs")
    headers: list[Header] = []
    for pair in value:
        if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str)):
            raise JsonRecordError("'headers' must be an array of [key, value] pairs")
        key: str = pair[0]
        try:
            key.encode("utf-8")
        except UnicodeEncodeError:
            raise JsonRecordError("a header key holds a lone surrogate: not UTF-8") from None
        headers.append((key, _bytes_of(pair[1], "header value")))
    return tuple(headers)


class JsonRecords(NamedTuple):
    """The records of several written lines, as columns ``Log.append`` takes."""

    values: list[bytes | None]
    keys: list[bytes | None]
    headers: list[tuple[Header, ...]]
    timestamps: list[int]


def parse_json_lines(lines: Sequence[bytes], now: int) -> JsonRecords:
    """Every line of ``lines`` (each without its newline) as ``parse_json_record``
    reads it; a line without a timestamp gets ``now`` (epoch ms), as Kafka's producer
    stamps a record at ``send``. All or nothing: the caller appends only after every
    line parsed.

    Cost: O(bytes), one ``json.loads`` per line.

    Raises:
        JsonRecordError: the first line that is not a record object; its reason names
            the line (1-based) when there are several.
    """
    records = JsonRecords([], [], [], [])
    for number, line in enumerate(lines, 1):
        try:
            record = parse_json_record(line)
        except JsonRecordError as exc:
            if len(lines) == 1:
                raise
            raise JsonRecordError(f"line {number} of {len(lines)}: {exc.reason}") from None
        records.values.append(record.value)
        records.keys.append(record.key)
        records.headers.append(record.headers)
        records.timestamps.append(now if record.timestamp is None else record.timestamp)
    return records

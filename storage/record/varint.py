"""Kafka's variable-length integers: ZigZag, then LEB128 (7 bits a byte, low group first).

A varint (int32) takes at most 5 bytes, a varlong (int64) at most 10. ``-1`` encodes
as ``01``, which is how v2 records write a null key or value.

Encoding small non-negative numbers is the hot path of the record builder (offset
deltas and lengths), so their encodings are precomputed in ``SMALL_VARINTS``.
Pure functions: thread-safe.
"""

from __future__ import annotations

from typing import Final

from ..errors import CorruptRecordError

SMALL_VARINT_LIMIT: Final = 1 << 14
"""``SMALL_VARINTS`` covers ``0 <= n < SMALL_VARINT_LIMIT`` (a literal: compiled code
inlines it)."""


def zigzag_encode(n: int) -> int:
    """Map a signed integer to an unsigned one: 0,-1,1,-2 -> 0,1,2,3."""
    return (n << 1) ^ (n >> 63)


def encode_varint(n: int) -> bytes:
    """Encode ``n`` (signed, up to 64 bits) as a ZigZag LEB128 varint/varlong."""
    if 0 <= n < SMALL_VARINT_LIMIT:
        return SMALL_VARINTS[n]
    u = zigzag_encode(n) & 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while u >= 0x80:
        out.append((u & 0x7F) | 0x80)
        u >>= 7
    out.append(u)
    return bytes(out)


def decode_varint(buf: bytes | memoryview, pos: int, max_bytes: int = 10) -> tuple[int, int]:
    """Decode one ZigZag varint at ``buf[pos]``; return ``(value, next_pos)``.

    Raises:
        CorruptRecordError: the varint runs past the buffer or over ``max_bytes``
            (5 for a varint, 10 for a varlong).
    """
    shift = 0
    u = 0
    end = min(len(buf), pos + max_bytes)
    while pos < end:
        b = buf[pos]
        pos += 1
        u |= (b & 0x7F) << shift
        if b < 0x80:
            return (u >> 1) ^ -(u & 1), pos
        shift += 7
    raise CorruptRecordError(f"malformed varint (over {max_bytes} bytes or truncated)")


def _build_small() -> tuple[bytes, ...]:
    table = []
    for n in range(SMALL_VARINT_LIMIT):
        u = n << 1
        out = bytearray()
        while u >= 0x80:
            out.append((u & 0x7F) | 0x80)
            u >>= 7
        out.append(u)
        table.append(bytes(out))
    return tuple(table)


SMALL_VARINTS: tuple[bytes, ...] = _build_small()
"""``SMALL_VARINTS[n]`` is the encoding of ``n`` for ``0 <= n < 16384``."""

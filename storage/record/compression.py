"""Kafka's compression codecs, byte-compatible with what Kafka writes and reads.

A compressed batch (v2) or wrapper message (v0/v1) carries one blob; this module turns
records' bytes into that blob and back. The framing of each codec is Kafka's, which is
not always the library's default:

- gzip: one RFC 1952 stream (several concatenated members are accepted on read).
- snappy: xerial's block framing, not Google's framing format::

      82 53 4E 41 50 50 59 00 | int32 version = 1 | int32 compatible = 1   (16-byte header)
      then blocks: int32 compressedLength | raw snappy block (<= 32 KiB uncompressed)

  All integers big-endian. On read a bare raw snappy block (no header) is accepted too,
  as xerial's stream does: some clients wrote that. The version fields are not checked
  on read because some producers wrote them little-endian.
- lz4: one LZ4 frame with independent blocks, 64 KiB maximum block size, no content
  size and no checksums: exactly Kafka's ``Lz4BlockOutputStream``. Kafka rejects linked
  blocks, and so does this reader. Under magic 0 Kafka computes the frame descriptor
  checksum (HC byte) over the 4 magic bytes too (KAFKA-3160); ``compress`` reproduces
  that for ``magic=0`` and ``decompress`` ignores the HC byte for ``magic=0``, as Kafka
  does, so both correct and quirky frames decode.
- zstd: standard zstd frames (several concatenated frames are accepted on read).
  Kafka's streaming writer leaves out the content size, so reading never relies on it.

Decoding failures of every kind surface as ``CorruptRecordError``: callers never see a
codec library's exception. Pure functions over immutable inputs: thread-safe.

Inflation is bounded: every codec stops as soon as its output would pass a size the
caller gives (``decompress``'s ``max_size``), having held at most that much output. A
batch of a few hundred KB of gzip can hold gigabytes of zeros; without the bound it was
inflated whole before any size check (4 such batches through the control socket took a
daemon to 4.8 GB). An append passes the topic's ``max.message.bytes`` and gets
``RecordTooLargeError`` (Kafka bounds a batch by that size; here its records are held to
it too); a reader of stored batches passes nothing and gets the generous
``MAX_STORED_INFLATION``, past which a batch counts as corrupt. gzip and lz4 use their
libraries' output bounds, snappy checks each block's declared length before inflating
it, and zstd is fed one block at a time (at most 128 KiB of output each), because its
streaming decoder has no output bound.

Cost: one pass over the data in the codec library; snappy and lz4 framing add one
``bytes.join`` of the output, zstd a walk over its block headers (3 bytes a block of up
to 128 KiB).
"""

from __future__ import annotations

import gzip
import struct
import zlib
from typing import Final

import lz4.frame
import snappy
import zstandard

from ..errors import CorruptRecordError, RecordTooLargeError
from .record import CompressionType

__all__ = ["MAX_STORED_INFLATION", "codec_from_name", "compress", "decompress"]

MAX_STORED_INFLATION: Final = 1 << 30
"""The most a stored batch may inflate to when read (1 GiB): a thousand times Kafka's
default ``max.message.bytes``, for batches a broker accepted with a larger one and data
that compresses well; past it the batch is reported corrupt, not inflated further."""

_CODEC_BY_NAME = {
    "uncompressed": CompressionType.NONE,
    "none": CompressionType.NONE,
    "gzip": CompressionType.GZIP,
    "snappy": CompressionType.SNAPPY,
    "lz4": CompressionType.LZ4,
    "zstd": CompressionType.ZSTD,
}

# Kafka's GZIPOutputStream uses Deflater.DEFAULT_COMPRESSION, which is zlib level 6.
_GZIP_LEVEL = 6
# Kafka's ZstdOutputStream default level (zstd's own default).
_ZSTD_LEVEL = 3

_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = _XERIAL_MAGIC + struct.pack(">ii", 1, 1)
_XERIAL_BLOCK_SIZE = 32 * 1024
_INT32 = struct.Struct(">i")

_LZ4_MAGIC = b"\x04\x22\x4d\x18"
_LZ4_FLG_BLOCK_INDEPENDENT = 0x20
_LZ4_FLG_CONTENT_SIZE = 0x08
_LZ4_FLG_DICT_ID = 0x01


def codec_from_name(name: str) -> CompressionType:
    """Return the codec a Kafka ``compression.type`` value names.

    Accepts ``uncompressed`` and ``none`` (both mean no compression), ``gzip``,
    ``snappy``, ``lz4`` and ``zstd``, lower case, as Kafka's config validation does.
    The broker-only value ``producer`` names no codec and is rejected.

    Raises:
        ValueError: ``name`` is not one of those values.
    """
    try:
        return _CODEC_BY_NAME[name]
    except KeyError:
        raise ValueError(
            f"unknown compression.type {name!r}: expected one of {', '.join(_CODEC_BY_NAME)}"
        ) from None


def compress(codec: CompressionType, data: bytes, *, magic: int = 2) -> bytes:
    """Return ``data`` compressed with ``codec`` in Kafka's framing for ``magic``.

    ``magic`` only matters for lz4: under magic 0 the frame carries Kafka 0.8/0.9's
    incorrect header checksum, which those brokers and clients require. ``NONE``
    returns the data unchanged (as ``bytes``).

    Raises:
        ValueError: ``codec`` is not a known codec id.
    """
    if codec == CompressionType.NONE:
        return bytes(data)
    if codec == CompressionType.GZIP:
        # mtime=0 keeps the output a pure function of the input, as Java's writer does.
        return gzip.compress(data, compresslevel=_GZIP_LEVEL, mtime=0)
    if codec == CompressionType.SNAPPY:
        return _snappy_xerial_compress(data)
    if codec == CompressionType.LZ4:
        return _lz4_compress(data, magic)
    if codec == CompressionType.ZSTD:
        return zstandard.ZstdCompressor(level=_ZSTD_LEVEL).compress(data)
    raise ValueError(f"unknown compression codec id {int(codec)}")


def decompress(
    codec: CompressionType | int,
    data: bytes | memoryview,
    *,
    magic: int = 2,
    max_size: int | None = None,
) -> bytes:
    """Return the bytes that ``data``, compressed with ``codec`` under ``magic``, holds.

    ``codec`` may be the raw id from a batch's attributes: ids 5-7 are reported as
    corruption, not as a programming error, because they come from disk. ``magic``
    only matters for lz4 (see the module docstring). ``NONE`` returns a copy.

    ``max_size``: an append's ``max.message.bytes``; decompression stops as soon as the
    output would pass it. None (a reader of stored batches): ``MAX_STORED_INFLATION``.
    Either way at most that much output is ever held.

    Raises:
        RecordTooLargeError: with ``max_size``, the output would pass it (``size`` is
            what was inflated before stopping, over the limit).
        CorruptRecordError: ``codec`` is not a known id, or ``data`` is not a complete,
            valid blob of that codec (truncated, bad checksum, bad framing, ...), or,
            without ``max_size``, it inflates past ``MAX_STORED_INFLATION``.
    """
    limit = MAX_STORED_INFLATION if max_size is None else max_size
    try:
        if codec == CompressionType.NONE:
            if len(data) > limit:
                raise _Oversize(len(data))
            return bytes(data)
        if codec == CompressionType.GZIP:
            return _gzip_decompress(data, limit)
        if codec == CompressionType.SNAPPY:
            return _snappy_decompress(data, limit)
        if codec == CompressionType.LZ4:
            return _lz4_decompress(data, magic, limit)
        if codec == CompressionType.ZSTD:
            return _zstd_decompress(data, limit)
    except _Oversize as over:
        if max_size is not None:
            raise RecordTooLargeError(over.size, max_size) from None
        raise CorruptRecordError(
            f"{CompressionType(codec).config_name} data inflates to more than "
            f"{MAX_STORED_INFLATION} bytes"
        ) from None
    raise CorruptRecordError(f"unknown compression codec id {int(codec)}")


class _Oversize(Exception):
    """Inflating went past the caller's limit after ``size`` bytes of output."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size


class _Output:
    """The pieces of a decompressed blob, refused as soon as they pass ``limit``."""

    __slots__ = ("limit", "parts", "size")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.parts: list[bytes] = []
        self.size = 0

    @property
    def room(self) -> int:
        """How much more output may be asked for: one byte past the limit, so that
        passing it is seen."""
        return self.limit - self.size + 1

    def add(self, part: bytes) -> None:
        self.size += len(part)
        if self.size > self.limit:
            raise _Oversize(self.size)
        self.parts.append(part)

    def joined(self) -> bytes:
        return self.parts[0] if len(self.parts) == 1 else b"".join(self.parts)


# -- gzip ------------------------------------------------------------------------------


_GZIP_WBITS = 16 + zlib.MAX_WBITS  # zlib parses the gzip header and checks its trailer


def _gzip_decompress(data: bytes | memoryview, limit: int) -> bytes:
    # Python reads no bytes as no members; Java's GZIPInputStream (Kafka) fails on them.
    if not len(data):
        raise CorruptRecordError("gzip data is empty: no gzip header")
    output = _Output(limit)
    remaining: bytes | memoryview = data
    try:
        # One member per pass; zero padding between and after members is skipped, as
        # gzip.decompress does.
        while remaining:
            inflater = zlib.decompressobj(_GZIP_WBITS)
            chunk = remaining
            while not inflater.eof:
                part = inflater.decompress(chunk, output.room)
                output.add(part)
                chunk = inflater.unconsumed_tail
                if not part and not chunk and not inflater.eof:
                    raise CorruptRecordError("gzip data is truncated: no end of stream")
            remaining = inflater.unused_data.lstrip(b"\x00")
    except zlib.error as e:
        raise CorruptRecordError(f"invalid gzip data: {e}") from e
    return output.joined()


# -- snappy ----------------------------------------------------------------------------


def _snappy_xerial_compress(data: bytes) -> bytes:
    view = memoryview(data)
    parts = [_XERIAL_HEADER]
    for start in range(0, len(view), _XERIAL_BLOCK_SIZE):
        block = snappy.compress(view[start : start + _XERIAL_BLOCK_SIZE])
        parts.append(_INT32.pack(len(block)))
        parts.append(block)
    return b"".join(parts)


def _snappy_decompress(data: bytes | memoryview, limit: int) -> bytes:
    view = memoryview(data)
    output = _Output(limit)
    # xerial's reader falls back to one raw block when the magic is absent; so do we.
    if len(view) < len(_XERIAL_HEADER) or view[: len(_XERIAL_MAGIC)] != _XERIAL_MAGIC:
        output.add(_snappy_raw_decompress(view, 0, output))
        return output.joined()
    pos = len(_XERIAL_HEADER)
    end = len(view)
    while pos < end:
        if end - pos < 4:
            raise CorruptRecordError(f"snappy block length at byte {pos} is truncated")
        (length,) = _INT32.unpack_from(view, pos)
        pos += 4
        if length < 0 or length > end - pos:
            raise CorruptRecordError(
                f"snappy block at byte {pos} claims {length} bytes, {end - pos} remain"
            )
        output.add(_snappy_raw_decompress(view[pos : pos + length], pos, output))
        pos += length
    return output.joined()


def _snappy_raw_decompress(block: memoryview, position: int, output: _Output) -> bytes:
    # A raw block starts with its uncompressed length (a varint of up to 32 bits), which
    # python-snappy allocates before it inflates: check it first.
    declared = 0
    for i in range(min(5, len(block))):
        declared |= (block[i] & 0x7F) << (7 * i)
        if not block[i] & 0x80:
            break
    if declared >= output.room:
        raise _Oversize(output.size + declared)
    try:
        result: bytes = snappy.uncompress(block)
    except snappy.UncompressError as e:
        raise CorruptRecordError(f"invalid raw snappy block at byte {position}") from e
    return result


# -- lz4 -------------------------------------------------------------------------------


def _lz4_compress(data: bytes, magic: int) -> bytes:
    frame: bytes = lz4.frame.compress(
        data,
        block_size=lz4.frame.BLOCKSIZE_MAX64KB,
        block_linked=False,
        content_checksum=False,
        block_checksum=False,
        store_size=False,
    )
    if magic != 0:
        return frame
    # Without content size the descriptor is FLG, BD, HC: bytes 4, 5 and 6. Kafka 0.8/0.9
    # hashed bytes 0-5 (magic included) for HC; their readers check that wrong value.
    broken_hc = (_xxh32(frame[:6]) >> 8) & 0xFF
    return b"".join((frame[:6], bytes((broken_hc,)), frame[7:]))


def _lz4_decompress(data: bytes | memoryview, magic: int, limit: int) -> bytes:
    view = memoryview(data)
    if len(view) < 7 or view[:4] != _LZ4_MAGIC:
        raise CorruptRecordError("lz4 data does not start with an LZ4 frame header")
    flg = view[4]
    if not flg & _LZ4_FLG_BLOCK_INDEPENDENT:
        raise CorruptRecordError("lz4 frame uses linked blocks, which Kafka does not support")
    hc_pos = 6
    if flg & _LZ4_FLG_CONTENT_SIZE:
        hc_pos += 8
    if flg & _LZ4_FLG_DICT_ID:
        hc_pos += 4
    if len(view) <= hc_pos:
        raise CorruptRecordError("lz4 frame descriptor is truncated")
    header = bytes(view[: hc_pos + 1])
    if magic == 0:
        # KAFKA-3160: magic 0 writers hashed the magic bytes too. Kafka ignores HC for
        # magic 0, so we replace it by the correct value, accepting either variant.
        header = header[:hc_pos] + bytes(((_xxh32(header[4:hc_pos]) >> 8) & 0xFF,))
    decompressor = lz4.frame.LZ4FrameDecompressor()
    output = _Output(limit)
    try:
        # Feeding the header apart avoids copying the whole frame to patch one byte.
        output.add(decompressor.decompress(header))
        output.add(decompressor.decompress(view[hc_pos + 1 :], output.room))
        while not decompressor.eof and not decompressor.needs_input:
            output.add(decompressor.decompress(b"", output.room))
    except RuntimeError as e:
        raise CorruptRecordError(f"invalid lz4 frame: {e}") from e
    if not decompressor.eof:
        raise CorruptRecordError("lz4 frame is truncated: no end mark")
    # Bytes after the end mark are ignored, as Kafka's Lz4BlockInputStream ignores them.
    return output.joined()


_PRIME32_1 = 0x9E3779B1
_PRIME32_2 = 0x85EBCA77
_PRIME32_3 = 0xC2B2AE3D
_PRIME32_4 = 0x27D4EB2F
_PRIME32_5 = 0x165667B1
_MASK32 = 0xFFFFFFFF


def _rotl32(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _MASK32


def _xxh32(data: bytes, seed: int = 0) -> int:
    """Return the XXH32 hash of ``data``.

    Only LZ4 frame descriptors (at most 19 bytes) are hashed here, so a pure-Python
    version costs nothing worth a dependency. Runtime: O(len(data)).
    """
    n = len(data)
    pos = 0
    if n >= 16:
        v1 = (seed + _PRIME32_1 + _PRIME32_2) & _MASK32
        v2 = (seed + _PRIME32_2) & _MASK32
        v3 = seed & _MASK32
        v4 = (seed - _PRIME32_1) & _MASK32
        while pos <= n - 16:
            l1, l2, l3, l4 = struct.unpack_from("<4I", data, pos)
            v1 = (_rotl32((v1 + l1 * _PRIME32_2) & _MASK32, 13) * _PRIME32_1) & _MASK32
            v2 = (_rotl32((v2 + l2 * _PRIME32_2) & _MASK32, 13) * _PRIME32_1) & _MASK32
            v3 = (_rotl32((v3 + l3 * _PRIME32_2) & _MASK32, 13) * _PRIME32_1) & _MASK32
            v4 = (_rotl32((v4 + l4 * _PRIME32_2) & _MASK32, 13) * _PRIME32_1) & _MASK32
            pos += 16
        h = (_rotl32(v1, 1) + _rotl32(v2, 7) + _rotl32(v3, 12) + _rotl32(v4, 18)) & _MASK32
    else:
        h = (seed + _PRIME32_5) & _MASK32
    h = (h + n) & _MASK32
    while pos <= n - 4:
        (lane,) = struct.unpack_from("<I", data, pos)
        h = (_rotl32((h + lane * _PRIME32_3) & _MASK32, 17) * _PRIME32_4) & _MASK32
        pos += 4
    while pos < n:
        h = (_rotl32((h + data[pos] * _PRIME32_5) & _MASK32, 11) * _PRIME32_1) & _MASK32
        pos += 1
    h ^= h >> 15
    h = (h * _PRIME32_2) & _MASK32
    h ^= h >> 13
    h = (h * _PRIME32_3) & _MASK32
    h ^= h >> 16
    return h


# -- zstd ------------------------------------------------------------------------------


_ZSTD_MAGIC = 0xFD2FB528
_ZSTD_SKIPPABLE_MASK = 0xFFFFFFF0
_ZSTD_SKIPPABLE_MAGIC = 0x184D2A50
_ZSTD_BLOCK_MAX = 128 * 1024
_ZSTD_DID_SIZES = (0, 1, 2, 4)
_ZSTD_FCS_SIZES = (0, 2, 4, 8)
_UINT32_LE = struct.Struct("<I")


def _zstd_decompress(data: bytes | memoryview, limit: int) -> bytes:
    # A streaming decompressor, because Kafka's frames carry no content size, which
    # ZstdDecompressor.decompress() needs. One decompressobj decodes one frame. It has
    # no output bound, so it is fed pieces that end at block boundaries and together
    # hold no more output than the room left (a block inflates to 128 KiB at most).
    dctx = zstandard.ZstdDecompressor()
    view = memoryview(data)
    output = _Output(limit)
    remaining: bytes | memoryview = view
    try:
        while True:
            dobj = dctx.decompressobj()
            start = 0
            for end in _zstd_piece_ends(remaining, output.room):
                output.add(dobj.decompress(remaining[start:end]))
                start = end
            if not dobj.eof:
                raise CorruptRecordError("zstd frame is truncated")
            remaining = dobj.unused_data
            if not remaining:
                break
    except zstandard.ZstdError as e:
        raise CorruptRecordError(f"invalid zstd data: {e}") from e
    return output.joined()


def _zstd_piece_ends(frame: bytes | memoryview, room: int) -> list[int]:
    """Where to cut the zstd frame at the start of ``frame`` so that no piece can
    inflate to more than ``room`` bytes (or one block): the end of a run of blocks
    whose most output fits, the last piece running to the end of ``frame``.

    Only the framing is read (RFC 8878: the frame header's size from its descriptor
    byte, then 3-byte block headers); the decompressor checks everything else, so a
    frame this walk cannot follow is fed whole and refused there. Runtime: O(blocks).
    """
    n = len(frame)
    if n < 5:
        return [n]
    (magic,) = _UINT32_LE.unpack_from(frame, 0)
    if magic & _ZSTD_SKIPPABLE_MASK == _ZSTD_SKIPPABLE_MAGIC or magic != _ZSTD_MAGIC:
        return [n]  # skippable frames inflate to nothing; bad magic is refused
    descriptor = frame[4]
    single_segment = descriptor >> 5 & 1
    fcs_size = _ZSTD_FCS_SIZES[descriptor >> 6] or single_segment
    pos = 5 + (1 - single_segment) + _ZSTD_DID_SIZES[descriptor & 3] + fcs_size
    ends: list[int] = []
    bound = 0
    while pos + 3 <= n:
        header = frame[pos] | frame[pos + 1] << 8 | frame[pos + 2] << 16
        last = header & 1
        kind = header >> 1 & 3
        size = header >> 3
        most = size if kind < 2 else _ZSTD_BLOCK_MAX  # raw, RLE: exactly their size
        if bound and bound + most > room:
            ends.append(pos)
            room -= bound
            bound = 0
        bound += most
        pos += 3 + (1 if kind == 1 else size)
        if last or kind == 3:
            break
    ends.append(n)
    return ends

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

Cost: one pass over the data in the codec library; snappy and lz4 framing add one
``bytes.join`` of the output.
"""

from __future__ import annotations

import gzip
import struct
import zlib

import lz4.frame
import snappy
import zstandard

from ..errors import CorruptRecordError
from .record import CompressionType

__all__ = ["codec_from_name", "compress", "decompress"]

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


def decompress(codec: CompressionType | int, data: bytes | memoryview, *, magic: int = 2) -> bytes:
    """Return the bytes that ``data``, compressed with ``codec`` under ``magic``, holds.

    ``codec`` may be the raw id from a batch's attributes: ids 5-7 are reported as
    corruption, not as a programming error, because they come from disk. ``magic``
    only matters for lz4 (see the module docstring). ``NONE`` returns a copy.

    Raises:
        CorruptRecordError: ``codec`` is not a known id, or ``data`` is not a complete,
            valid blob of that codec (truncated, bad checksum, bad framing, ...).
    """
    if codec == CompressionType.NONE:
        return bytes(data)
    if codec == CompressionType.GZIP:
        return _gzip_decompress(data)
    if codec == CompressionType.SNAPPY:
        return _snappy_decompress(data)
    if codec == CompressionType.LZ4:
        return _lz4_decompress(data, magic)
    if codec == CompressionType.ZSTD:
        return _zstd_decompress(data)
    raise CorruptRecordError(f"unknown compression codec id {int(codec)}")


# -- gzip ------------------------------------------------------------------------------


def _gzip_decompress(data: bytes | memoryview) -> bytes:
    # Python reads no bytes as no members; Java's GZIPInputStream (Kafka) fails on them.
    if not len(data):
        raise CorruptRecordError("gzip data is empty: no gzip header")
    try:
        return gzip.decompress(data)
    # BadGzipFile is an OSError; EOFError is a truncated stream; zlib.error bad deflate.
    except (OSError, EOFError, zlib.error) as e:
        raise CorruptRecordError(f"invalid gzip data: {e}") from e


# -- snappy ----------------------------------------------------------------------------


def _snappy_xerial_compress(data: bytes) -> bytes:
    view = memoryview(data)
    parts = [_XERIAL_HEADER]
    for start in range(0, len(view), _XERIAL_BLOCK_SIZE):
        block = snappy.compress(view[start : start + _XERIAL_BLOCK_SIZE])
        parts.append(_INT32.pack(len(block)))
        parts.append(block)
    return b"".join(parts)


def _snappy_decompress(data: bytes | memoryview) -> bytes:
    view = memoryview(data)
    # xerial's reader falls back to one raw block when the magic is absent; so do we.
    if len(view) < len(_XERIAL_HEADER) or view[: len(_XERIAL_MAGIC)] != _XERIAL_MAGIC:
        return _snappy_raw_decompress(view, 0)
    parts = []
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
        parts.append(_snappy_raw_decompress(view[pos : pos + length], pos))
        pos += length
    return b"".join(parts)


def _snappy_raw_decompress(block: memoryview, position: int) -> bytes:
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


def _lz4_decompress(data: bytes | memoryview, magic: int) -> bytes:
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
    try:
        # Feeding the header apart avoids copying the whole frame to patch one byte.
        parts = [decompressor.decompress(header), decompressor.decompress(view[hc_pos + 1 :])]
    except RuntimeError as e:
        raise CorruptRecordError(f"invalid lz4 frame: {e}") from e
    if not decompressor.eof:
        raise CorruptRecordError("lz4 frame is truncated: no end mark")
    # Bytes after the end mark are ignored, as Kafka's Lz4BlockInputStream ignores them.
    return b"".join(parts)


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


def _zstd_decompress(data: bytes | memoryview) -> bytes:
    # A streaming decompressor, because Kafka's frames carry no content size, which
    # ZstdDecompressor.decompress() needs. One decompressobj decodes one frame.
    dctx = zstandard.ZstdDecompressor()
    parts = []
    remaining: bytes | memoryview = data
    try:
        while True:
            dobj = dctx.decompressobj()
            parts.append(dobj.decompress(remaining))
            if not dobj.eof:
                raise CorruptRecordError("zstd frame is truncated")
            remaining = dobj.unused_data
            if not remaining:
                break
    except zstandard.ZstdError as e:
        raise CorruptRecordError(f"invalid zstd data: {e}") from e
    return b"".join(parts)

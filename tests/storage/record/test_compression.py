"""Kafka codecs: round trips, cross-checks against kafka-python, and corrupt input."""

from __future__ import annotations

import random
import struct
from typing import Any

import kafka.codec
import lz4.frame
import pytest
import snappy
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from storage import DefaultRecordBatch, build_record_batch
from storage.errors import CorruptRecordError, RecordTooLargeError
from storage.record import compression
from storage.record.compression import _xxh32, codec_from_name, compress, decompress
from storage.record.record import CompressionType
from storage.record.record_batch import validate_client_batch

XERIAL_HEADER = bytes.fromhex("82534e4150505900") + struct.pack(">ii", 1, 1)
CODECS = list(CompressionType)
COMPRESSED_CODECS = [c for c in CompressionType if c is not CompressionType.NONE]


def _payload(size: int, seed: int = 0) -> bytes:
    """Half random, half repetitive bytes: exercises both literal and match paths."""
    rng = random.Random(seed)
    half = size // 2
    text = b"offset=%d key=k value=hello world " * (size // 20 + 1)
    return rng.randbytes(half) + text[: size - half]


SIZES = {
    "empty": 0,
    "one-byte": 1,
    "small": 100,
    "over-32KiB": 32 * 1024 + 1,
    "over-1MiB": (1 << 20) + 12345,
}


# -- codec_from_name ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "codec"),
    [
        ("uncompressed", CompressionType.NONE),
        ("none", CompressionType.NONE),
        ("gzip", CompressionType.GZIP),
        ("snappy", CompressionType.SNAPPY),
        ("lz4", CompressionType.LZ4),
        ("zstd", CompressionType.ZSTD),
    ],
)
def test_codec_from_name_maps_kafka_values(name: str, codec: CompressionType) -> None:
    assert codec_from_name(name) is codec


@pytest.mark.parametrize("codec", CODECS)
def test_codec_from_name_accepts_config_name(codec: CompressionType) -> None:
    assert codec_from_name(codec.config_name) is codec


@pytest.mark.parametrize("name", ["producer", "brotli", "", "GZIP"])
def test_codec_from_name_rejects_other_values(name: str) -> None:
    with pytest.raises(ValueError, match=r"compression\.type"):
        codec_from_name(name)


# -- round trips ------------------------------------------------------------------------


@pytest.mark.parametrize("size", SIZES.values(), ids=SIZES.keys())
@pytest.mark.parametrize("magic", [0, 1, 2])
@pytest.mark.parametrize("codec", CODECS, ids=[c.name for c in CODECS])
def test_round_trip(codec: CompressionType, magic: int, size: int) -> None:
    data = _payload(size, seed=size)
    compressed = compress(codec, data, magic=magic)
    assert decompress(codec, compressed, magic=magic) == data
    assert decompress(codec, memoryview(compressed), magic=magic) == data


@pytest.mark.parametrize("codec", COMPRESSED_CODECS, ids=[c.name for c in COMPRESSED_CODECS])
def test_round_trip_from_memoryview_slice(codec: CompressionType) -> None:
    data = _payload(5000)
    buffer = b"head" + compress(codec, data) + b"tail"
    view = memoryview(buffer)[4:-4]
    assert decompress(codec, view) == data


def test_none_returns_bytes_unchanged() -> None:
    assert compress(CompressionType.NONE, b"abc") == b"abc"
    assert decompress(CompressionType.NONE, memoryview(b"abc")) == b"abc"


def test_compression_shrinks_repetitive_data() -> None:
    data = b"a" * 100_000
    for codec in COMPRESSED_CODECS:
        assert len(compress(codec, data)) < len(data) // 10, codec


def test_compress_is_deterministic() -> None:
    data = _payload(70_000)
    for codec in CODECS:
        assert compress(codec, data) == compress(codec, data), codec


# -- snappy -----------------------------------------------------------------------------


def _xerial_blocks(framed: bytes) -> list[bytes]:
    blocks = []
    pos = len(XERIAL_HEADER)
    while pos < len(framed):
        (length,) = struct.unpack_from(">i", framed, pos)
        blocks.append(framed[pos + 4 : pos + 4 + length])
        pos += 4 + length
    assert pos == len(framed)
    return blocks


def test_snappy_writes_xerial_header_and_32kib_blocks() -> None:
    data = _payload(100_000)
    framed = compress(CompressionType.SNAPPY, data)
    assert framed.startswith(XERIAL_HEADER)
    sizes = [len(snappy.uncompress(block)) for block in _xerial_blocks(framed)]
    assert sizes == [32768, 32768, 32768, 100_000 - 3 * 32768]


def test_snappy_empty_is_header_only() -> None:
    assert compress(CompressionType.SNAPPY, b"") == XERIAL_HEADER
    assert decompress(CompressionType.SNAPPY, XERIAL_HEADER) == b""


@pytest.mark.parametrize("size", [1, 100, 32 * 1024 + 1, (1 << 20) + 1])
def test_snappy_decodes_with_kafka_python(size: int) -> None:
    data = _payload(size)
    assert kafka.codec.snappy_decode(compress(CompressionType.SNAPPY, data)) == data


@pytest.mark.parametrize("size", [0, 1, 100, 32 * 1024 + 1, (1 << 20) + 1])
def test_snappy_reads_kafka_python_xerial(size: int) -> None:
    data = _payload(size)
    encoded = kafka.codec.snappy_encode(data, xerial_compatible=True)
    assert decompress(CompressionType.SNAPPY, encoded) == data


def test_snappy_reads_xerial_with_other_block_size() -> None:
    data = _payload(200_000)
    encoded = kafka.codec.snappy_encode(data, xerial_compatible=True, xerial_blocksize=64 * 1024)
    assert decompress(CompressionType.SNAPPY, encoded) == data


def test_snappy_reads_bare_raw_block() -> None:
    data = _payload(50_000)
    raw = kafka.codec.snappy_encode(data, xerial_compatible=False)
    assert not raw.startswith(XERIAL_HEADER[:8])
    assert decompress(CompressionType.SNAPPY, raw) == data


def test_snappy_ignores_xerial_version_fields() -> None:
    # Some producers wrote the version fields little-endian; xerial readers cope.
    data = _payload(1000)
    framed = bytearray(compress(CompressionType.SNAPPY, data))
    framed[8:16] = struct.pack("<ii", 1, 1)
    assert decompress(CompressionType.SNAPPY, bytes(framed)) == data


# -- lz4 --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"", 0x02CC5D05),
        (b"a", 0x550D7456),
        (b"abc", 0x32D153FF),
        (b"Nobody inspects the spammish repetition", 0xE2293B2F),
    ],
)
def test_xxh32_matches_published_vectors(data: bytes, expected: int) -> None:
    assert _xxh32(data) == expected


@pytest.mark.parametrize("store_size", [False, True])
@pytest.mark.parametrize("block_size", [lz4.frame.BLOCKSIZE_MAX64KB, lz4.frame.BLOCKSIZE_MAX4MB])
@pytest.mark.parametrize("content_checksum", [False, True])
def test_xxh32_reproduces_lz4_header_checksum(
    store_size: bool, block_size: int, content_checksum: bool
) -> None:
    frame = lz4.frame.compress(
        b"x" * 10,
        store_size=store_size,
        block_size=block_size,
        content_checksum=content_checksum,
        block_linked=False,
    )
    hc_pos = 14 if store_size else 6
    assert frame[hc_pos] == (_xxh32(frame[4:hc_pos]) >> 8) & 0xFF


def test_lz4_writes_kafka_frame_descriptor() -> None:
    frame = compress(CompressionType.LZ4, b"hello")
    # Kafka's Lz4BlockOutputStream: version 1 + independent blocks, 64 KiB blocks.
    assert frame[:4] == bytes.fromhex("04224d18")
    assert frame[4] == 0x60
    assert frame[5] == 0x40
    assert frame[6] == (_xxh32(frame[4:6]) >> 8) & 0xFF


@pytest.mark.parametrize("size", [0, 1, 100, 70_000, (1 << 20) + 1])
def test_lz4_interoperates_with_kafka_python(size: int) -> None:
    data = _payload(size)
    assert kafka.codec.lz4_decode(compress(CompressionType.LZ4, data)) == data
    assert decompress(CompressionType.LZ4, kafka.codec.lz4_encode(data)) == data


@pytest.mark.parametrize("size", [0, 1, 100, 70_000, (1 << 20) + 1])
def test_lz4_magic0_quirk_interoperates_with_kafka_python(size: int) -> None:
    data = _payload(size)
    ours = compress(CompressionType.LZ4, data, magic=0)
    theirs = kafka.codec.lz4_encode_old_kafka(data)
    assert ours == theirs
    assert kafka.codec.lz4_decode_old_kafka(ours) == data
    assert decompress(CompressionType.LZ4, theirs, magic=0) == data


def test_lz4_magic0_header_checksum_covers_magic_bytes() -> None:
    frame = compress(CompressionType.LZ4, b"hello", magic=0)
    assert frame[6] == (_xxh32(frame[:6]) >> 8) & 0xFF
    assert frame[6] != (_xxh32(frame[4:6]) >> 8) & 0xFF  # differs for this descriptor


def test_lz4_magic0_reads_correct_checksum_too() -> None:
    # Kafka ignores HC under magic 0, so frames from fixed clients must decode as well.
    data = _payload(1000)
    assert decompress(CompressionType.LZ4, compress(CompressionType.LZ4, data), magic=0) == data


def test_lz4_magic0_reads_quirky_frame_with_content_size() -> None:
    data = _payload(1000)
    frame = bytearray(lz4.frame.compress(data, block_linked=False, store_size=True))
    frame[14] = (_xxh32(bytes(frame[:14])) >> 8) & 0xFF
    assert decompress(CompressionType.LZ4, bytes(frame), magic=0) == data


@pytest.mark.parametrize("magic", [1, 2])
def test_lz4_quirky_checksum_is_corrupt_after_magic0(magic: int) -> None:
    quirky = compress(CompressionType.LZ4, b"hello", magic=0)
    with pytest.raises(CorruptRecordError, match="lz4"):
        decompress(CompressionType.LZ4, quirky, magic=magic)


def test_lz4_ignores_bytes_after_end_mark() -> None:
    # Kafka's Lz4BlockInputStream stops at the end mark and ignores what follows.
    frame = compress(CompressionType.LZ4, b"hello")
    assert decompress(CompressionType.LZ4, frame + b"junk") == b"hello"


def test_lz4_rejects_linked_blocks() -> None:
    frame = lz4.frame.compress(_payload(200_000), block_linked=True)
    with pytest.raises(CorruptRecordError, match="linked blocks"):
        decompress(CompressionType.LZ4, frame)


# -- gzip and zstd ----------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, 100, (1 << 20) + 1])
def test_gzip_interoperates_with_kafka_python(size: int) -> None:
    data = _payload(size)
    ours = compress(CompressionType.GZIP, data)
    assert ours[:3] == b"\x1f\x8b\x08"  # RFC 1952 magic and deflate
    assert kafka.codec.gzip_decode(ours) == data
    assert decompress(CompressionType.GZIP, kafka.codec.gzip_encode(data)) == data


def test_gzip_reads_concatenated_members() -> None:
    both = compress(CompressionType.GZIP, b"abc") + compress(CompressionType.GZIP, b"def")
    assert decompress(CompressionType.GZIP, both) == b"abcdef"


@pytest.mark.parametrize("size", [0, 1, 100, (1 << 20) + 1])
def test_zstd_interoperates_with_kafka_python(size: int) -> None:
    data = _payload(size)
    assert kafka.codec.zstd_decode(compress(CompressionType.ZSTD, data)) == data
    assert decompress(CompressionType.ZSTD, kafka.codec.zstd_encode(data)) == data


def test_zstd_reads_frame_without_content_size() -> None:
    # Kafka's streaming ZstdOutputStream never writes the content size.
    data = _payload(300_000)
    cctx = zstandard.ZstdCompressor(write_content_size=False)
    cobj = cctx.compressobj()
    frame = cobj.compress(data) + cobj.flush()
    with pytest.raises(zstandard.ZstdError):
        zstandard.ZstdDecompressor().decompress(frame)  # what a naive reader would do
    assert decompress(CompressionType.ZSTD, frame) == data


def test_zstd_reads_concatenated_frames() -> None:
    both = compress(CompressionType.ZSTD, b"abc") + compress(CompressionType.ZSTD, b"def")
    assert decompress(CompressionType.ZSTD, both) == b"abcdef"


# -- corrupt input ----------------------------------------------------------------------


@pytest.mark.parametrize("codec", [5, 6, 7])
def test_unknown_codec_id_is_corrupt(codec: int) -> None:
    with pytest.raises(CorruptRecordError, match=f"codec id {codec}"):
        decompress(codec, b"data")


def test_compress_rejects_unknown_codec() -> None:
    with pytest.raises(ValueError, match="codec id 5"):
        compress(5, b"data")  # type: ignore[arg-type]


@pytest.mark.parametrize("codec", COMPRESSED_CODECS, ids=[c.name for c in COMPRESSED_CODECS])
def test_truncated_input_is_corrupt(codec: CompressionType) -> None:
    compressed = compress(codec, _payload(100_000))
    for cut in (1, 5, len(compressed) // 2, len(compressed) - 3):
        with pytest.raises(CorruptRecordError):
            decompress(codec, compressed[:cut])


@pytest.mark.parametrize("codec", COMPRESSED_CODECS, ids=[c.name for c in COMPRESSED_CODECS])
# b"\x00" would be a valid raw snappy block holding nothing.
@pytest.mark.parametrize("garbage", [b"", b"\x07", b"not compressed at all", b"\xff" * 64])
def test_garbage_input_is_corrupt(codec: CompressionType, garbage: bytes) -> None:
    with pytest.raises(CorruptRecordError):
        decompress(codec, garbage)


def test_snappy_bad_block_length_is_corrupt() -> None:
    framed = bytearray(compress(CompressionType.SNAPPY, _payload(1000)))
    framed[16:20] = struct.pack(">i", -5)
    with pytest.raises(CorruptRecordError, match="claims -5 bytes"):
        decompress(CompressionType.SNAPPY, bytes(framed))


def test_gzip_flipped_byte_is_corrupt() -> None:
    # gzip is the only codec here whose Kafka framing carries a checksum of the content.
    compressed = bytearray(compress(CompressionType.GZIP, _payload(10_000)))
    compressed[len(compressed) // 2] ^= 0x01
    with pytest.raises(CorruptRecordError, match="gzip"):
        decompress(CompressionType.GZIP, bytes(compressed))


def test_errors_chain_the_library_exception() -> None:
    with pytest.raises(CorruptRecordError) as info:
        decompress(CompressionType.ZSTD, b"\x28\xb5\x2f\xfd" + b"\xff" * 20)
    assert isinstance(info.value.__cause__, zstandard.ZstdError)


def _decode_or_corrupt(codec: CompressionType, data: bytes, magic: int) -> None:
    try:
        result: Any = decompress(codec, data, magic=magic)
    except CorruptRecordError:
        return
    assert isinstance(result, bytes)


@settings(deadline=None)
@given(
    codec=st.sampled_from(COMPRESSED_CODECS),
    data=st.binary(max_size=200),
    magic=st.sampled_from([0, 2]),
)
def test_random_bytes_never_raise_library_errors(
    codec: CompressionType, data: bytes, magic: int
) -> None:
    _decode_or_corrupt(codec, data, magic)


@settings(deadline=None)
@given(
    codec=st.sampled_from(COMPRESSED_CODECS),
    payload=st.binary(max_size=2000),
    flips=st.lists(st.tuples(st.integers(min_value=0), st.integers(1, 255)), max_size=4),
    cut=st.integers(min_value=0, max_value=50),
    magic=st.sampled_from([0, 2]),
)
def test_mutated_frames_never_raise_library_errors(
    codec: CompressionType, payload: bytes, flips: list[tuple[int, int]], cut: int, magic: int
) -> None:
    mutated = bytearray(compress(codec, payload, magic=magic))
    for index, mask in flips:
        mutated[index % len(mutated)] ^= mask
    _decode_or_corrupt(codec, bytes(mutated[: len(mutated) - cut]), magic)


# -- inflation bounds ---------------------------------------------------------------------

BOMB_SIZE = 256 << 20
"""Zeros a bomb inflates to: gzip holds them in 255 KB, zstd in 8 KB, lz4 in 1 MB."""
APPEND_LIMIT = 1 << 20


@pytest.fixture(scope="module")
def bombs() -> dict[CompressionType, bytes]:
    zeros = bytes(BOMB_SIZE)
    return {codec: compress(codec, zeros) for codec in COMPRESSED_CODECS}


def status_bytes(field: str) -> int:
    """A size from ``/proc/self/status``: ``VmRSS`` (resident now), ``VmHWM`` (peak)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(field)


def reset_peak_rss() -> int:
    """Reset this process's peak RSS (Linux: ``clear_refs`` 5); its RSS now."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return status_bytes("VmRSS")


def _peak_rss_growth(fn: Any) -> int:
    """Bytes by which this process's peak RSS rose above its RSS while ``fn`` ran."""
    before = reset_peak_rss()
    fn()
    return status_bytes("VmHWM") - before


@pytest.mark.parametrize("codec", COMPRESSED_CODECS, ids=[c.name for c in COMPRESSED_CODECS])
def test_a_bomb_stops_inflating_at_the_append_limit(
    codec: CompressionType, bombs: dict[CompressionType, bytes]
) -> None:
    def inflate() -> None:
        with pytest.raises(RecordTooLargeError) as info:
            decompress(codec, bombs[codec], max_size=APPEND_LIMIT)
        assert info.value.limit == APPEND_LIMIT
        assert APPEND_LIMIT < info.value.size <= APPEND_LIMIT + (256 << 10)

    # Unbounded, each of these held 256 MiB (and the joined copy) before any check.
    assert _peak_rss_growth(inflate) < 16 << 20


@pytest.mark.parametrize("codec", CODECS, ids=[c.name for c in CODECS])
def test_output_of_exactly_the_limit_passes(codec: CompressionType) -> None:
    data = _payload((1 << 20) + 12345)
    compressed = compress(codec, data)
    assert decompress(codec, compressed, max_size=len(data)) == data
    with pytest.raises(RecordTooLargeError):
        decompress(codec, compressed, max_size=len(data) - 1)


def test_zstd_bound_holds_across_frames_and_blocks() -> None:
    # Three frames of many blocks each: the room left carries from frame to frame.
    frames = [compress(CompressionType.ZSTD, _payload(300_000, seed)) for seed in range(3)]
    whole = b"".join(_payload(300_000, seed) for seed in range(3))
    assert decompress(CompressionType.ZSTD, b"".join(frames), max_size=len(whole)) == whole
    with pytest.raises(RecordTooLargeError):
        decompress(CompressionType.ZSTD, b"".join(frames), max_size=650_000)


def test_snappy_block_declaring_more_than_the_room_is_not_inflated() -> None:
    # A raw block whose length varint claims 4 GiB is refused from its first bytes.
    block = b"\xff\xff\xff\xff\x0f" + b"\x00" * 16
    framed = XERIAL_HEADER + struct.pack(">i", len(block)) + block
    with pytest.raises(RecordTooLargeError):
        decompress(CompressionType.SNAPPY, framed, max_size=APPEND_LIMIT)


def test_a_stored_batch_past_the_reader_bound_is_corrupt(
    monkeypatch: pytest.MonkeyPatch, bombs: dict[CompressionType, bytes]
) -> None:
    # Readers pass no limit and get MAX_STORED_INFLATION (1 GiB): lowered here so that
    # the test need not inflate a gigabyte.
    monkeypatch.setattr(compression, "MAX_STORED_INFLATION", 8 << 20)
    for codec in COMPRESSED_CODECS:
        with pytest.raises(CorruptRecordError, match="inflates to more than 8388608 bytes"):
            decompress(codec, bombs[codec])
    assert len(
        decompress(CompressionType.GZIP, compress(CompressionType.GZIP, bytes(8 << 20)))
    ) == (8 << 20)


def test_client_batch_is_refused_once_its_records_pass_max_message_bytes() -> None:
    # 64 MiB of one value in a 65 KB gzip batch: under max.message.bytes as stored, far
    # over it once inflated. The broker-side check stops inflating at the limit.
    batch = DefaultRecordBatch(
        build_record_batch(
            [bytes(64 << 20)], timestamps=1_700_000_000_000, codec=CompressionType.GZIP
        )
    )
    assert batch.size < APPEND_LIMIT

    def validate() -> None:
        with pytest.raises(RecordTooLargeError):
            validate_client_batch(batch, APPEND_LIMIT)

    assert _peak_rss_growth(validate) < 16 << 20
    # A stored batch is still read whole.
    assert batch.records()[0].value == bytes(64 << 20)

"""A copy of a Kafka broker's log directory, mounted read-only, reads as a consumer sees it.

The segments are built with kafka-python's record builders (an implementation
independent of ours): legacy v0 and v1 message sets, v2 batches in every codec, a
transaction marker (a control batch, which consumers never see), and an internal
``__consumer_offsets`` topic, which is hidden unless ``-o internal`` asks for it.
"""

from __future__ import annotations

import struct
import subprocess
from pathlib import Path

import crc32c
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.legacy_records import LegacyRecordBatchBuilder

from .conftest import Mount, MountDir, needs_fuse

pytestmark = needs_fuse

TS = 1_700_000_000_000
CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def v2_batch(
    offset: int,
    codec: int,
    records: list[tuple[bytes | None, bytes | None]],
    *,
    control: bool = False,
) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=codec, is_transactional=control, producer_id=7 if control else -1,
        producer_epoch=0 if control else -1, base_sequence=-1, batch_size=1 << 20,
    )  # fmt: skip
    for i, (key, value) in enumerate(records):
        builder.append(i, timestamp=TS + offset + i, key=key, value=value, headers=[])
    raw = bytearray(builder.build())
    struct.pack_into(">q", raw, 0, offset)
    if control:
        # kafka-python builds no control batches: set the control bit, re-checksum.
        attributes = struct.unpack_from(">h", raw, 21)[0] | 0x20
        struct.pack_into(">h", raw, 21, attributes)
        struct.pack_into(">I", raw, 17, crc32c.crc32c(bytes(raw[21:])))
    return bytes(raw)


def legacy_batch(magic: int, codec: int, first_offset: int, values: list[bytes | None]) -> bytes:
    builder = LegacyRecordBatchBuilder(magic=magic, compression_type=codec, batch_size=1 << 20)
    for i, value in enumerate(values):
        offset = i if codec else first_offset + i
        builder.append(
            offset, timestamp=TS + first_offset + i if magic else None, key=b"k", value=value
        )
    raw = bytearray(builder.build())
    if codec:
        struct.pack_into(">q", raw, 0, first_offset + len(values) - 1)
    return bytes(raw)


def build_broker_dir(log_dir: Path) -> list[bytes | None]:
    """A Kafka-like log directory; returns the values a consumer of ``legacy-0`` sees."""
    values: list[bytes | None] = []
    parts: list[bytes] = []
    offset = 0

    def legacy(magic: int, codec: int, batch: list[bytes | None]) -> None:
        nonlocal offset
        parts.append(legacy_batch(magic, codec, offset, batch))
        values.extend(batch)
        offset += len(batch)

    def v2(codec: int, batch: list[tuple[bytes | None, bytes | None]]) -> None:
        nonlocal offset
        parts.append(v2_batch(offset, codec, batch))
        values.extend(value for _key, value in batch)
        offset += len(batch)

    legacy(0, 0, [b"v0 plain a", b"v0 plain b"])
    legacy(0, 1, [b"v0 gzip %d" % i for i in range(3)])
    legacy(1, 0, [b"v1 plain", None])
    legacy(1, 2, [b"v1 snappy %d" % i for i in range(3)])
    for name, codec in CODECS.items():
        v2(codec, [(b"key", b"v2 %s %d" % (name.encode(), i)) for i in range(4)])
    v2(0, [(None, None), (b"k", b"after a null")])
    # A commit marker: a control record (key: version 0, type 1), invisible to consumers.
    parts.append(
        v2_batch(offset, 0, [(b"\x00\x00\x00\x01", b"\x00\x00\x00\x00\x00\x00")], control=True)
    )
    offset += 1
    v2(0, [(None, b"after the marker")])

    partition = log_dir / "legacy-0"
    partition.mkdir(parents=True)
    (partition / "00000000000000000000.log").write_bytes(b"".join(parts))
    internal = log_dir / "__consumer_offsets-0"
    internal.mkdir()
    (internal / "00000000000000000000.log").write_bytes(v2_batch(0, 0, [(b"group", b"offset")]))
    (log_dir / "meta.properties").write_text("version=1\nbroker.id=0\ncluster.id=abc\n")
    (log_dir / "recovery-point-offset-checkpoint").write_text("0\n1\nlegacy 0 0\n")
    return values


def mount_copy_after_delete_records(
    tmp_path: Path, mount_dir: MountDir, options: str
) -> tuple[Mount, bytes]:
    """``build_broker_dir`` after Kafka's DeleteRecords (the log start offset checkpoint
    names offset 8, in the middle of the segment), mounted with ``-o options``; the
    mount and what ``legacy/0`` must show: the values from offset 8."""
    log_dir = tmp_path / "kafka-logs"
    values = build_broker_dir(log_dir)
    (log_dir / "log-start-offset-checkpoint").write_text("0\n1\nlegacy 0 8\n")
    return mount_dir(log_dir, "-o", options), b"".join((v or b"") + b"\n" for v in values[8:])


def test_kafka_copy_reads_as_a_consumer_sees_it(tmp_path: Path, mount_dir: MountDir) -> None:
    log_dir = tmp_path / "kafka-logs"
    values = build_broker_dir(log_dir)
    mount = mount_dir(log_dir, "-o", "ro")
    mnt = mount.mountpoint
    assert sorted(p.name for p in mnt.iterdir()) == ["legacy"]
    shown = (mnt / "legacy" / "0").read_bytes()
    expected = b"".join((v or b"") + b"\n" for v in values)
    assert shown == expected
    assert (
        subprocess.run(["cat", str(mnt / "legacy" / "0")], capture_output=True, check=True).stdout
        == expected
    )
    assert (mnt / "legacy" / "0").stat().st_size == len(expected)
    assert b"after the marker" in shown
    # Any position reads the right bytes (through the rebuilt position index).
    for position in [1, 17, len(expected) // 2, len(expected) - 5]:
        with open(mnt / "legacy" / "0", "rb") as f:
            f.seek(position)
            assert f.read(40) == expected[position : position + 40]
    # -N counts offsets, as Kafka does: the marker holds one and shows nothing.
    assert (mnt / "legacy" / "0@-3").read_bytes() == b"after a null\nafter the marker\n"
    assert (mnt / "legacy" / "0@-2").read_bytes() == b"after the marker\n"


def test_internal_topics_shown_when_asked(tmp_path: Path, mount_dir: MountDir) -> None:
    log_dir = tmp_path / "kafka-logs"
    build_broker_dir(log_dir)
    mount = mount_dir(log_dir, "-o", "ro,internal")
    assert sorted(p.name for p in mount.mountpoint.iterdir()) == ["__consumer_offsets", "legacy"]
    assert (mount.mountpoint / "__consumer_offsets" / "0").read_bytes() == b"offset\n"


def test_log_start_inside_a_segment_hides_the_records_below_it(
    tmp_path: Path, mount_dir: MountDir
) -> None:
    # After Kafka's DeleteRecords the log start offset checkpoint names an offset in
    # the middle of a segment: a consumer sees nothing below it.
    mount, expected = mount_copy_after_delete_records(tmp_path, mount_dir, "ro")
    shown = (mount.mountpoint / "legacy" / "0").read_bytes()
    assert shown == expected
    assert (mount.mountpoint / "legacy" / "0@earliest").read_bytes() == shown
    assert (mount.mountpoint / "legacy" / "0@3").read_bytes() == shown  # raised to the start
    # The file begins at the log start: its size is what it reads, and a position in
    # it counts from there.
    assert (mount.mountpoint / "legacy" / "0").stat().st_size == len(shown)
    with open(mount.mountpoint / "legacy" / "0", "rb") as f:
        f.seek(len(shown) - 30)
        assert f.read() == shown[-30:]

"""A damaged batch through a real mount: the bytes before it, then ``EIO``, and one
warning in the daemon's log however many reads meet it (issue 17).

The partition is written as the daemon writes it (with the position index), closed
cleanly, and one byte of a batch length in the middle of its first, sealed segment is
flipped: the length then runs past the segment's end. Before the fix the daemon took it
for an unflushed tail and went on at the next segment: ``cat`` read fewer bytes than
``stat`` said, exited 0, and the daemon logged nothing.
"""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest

from seglogfs.positions import position_index_spec
from storage import AppendInfo, LogManager

from .conftest import MountDir, needs_fuse

LINES = 25_000


DAMAGE = {
    "length": (9, "runs past the end of the segment"),  # the length's second byte: +64 KiB
    "crc": (-3, "CRC mismatch"),  # a value byte, inside the CRC's range
}


def damaged_partition(log_dir: Path, damage: str) -> tuple[bytes, AppendInfo, Path]:
    """``t-0``: lines 0..24999, ten a batch, in 100 kB segments, with a byte of the batch
    at offset 2340 flipped (``DAMAGE``); returns what the file showed before, that batch,
    and its segment file."""
    with LogManager.open(log_dir, extension=position_index_spec) as manager:
        manager.create_topic("t", 1, {"segment.bytes": "100000"})
        log = manager.log("t", 0)
        infos = [log.append([b"%d" % (i + k) for k in range(10)]) for i in range(0, LINES, 10)]
        assert log.number_of_segments > 2
    bad = infos[234]
    assert (bad.first_offset, bad.segment_base_offset) == (2340, 0)
    segment = log_dir / "t-0" / "00000000000000000000.log"
    byte_in_batch = DAMAGE[damage][0] % bad.size
    with open(segment, "r+b") as f:
        f.seek(bad.position + byte_in_batch)
        byte = f.read(1)[0]
        f.seek(bad.position + byte_in_batch)
        f.write(bytes([byte ^ 0x01]))
    return b"".join(b"%d\n" % i for i in range(LINES)), bad, segment


@needs_fuse
@pytest.mark.parametrize("damage", sorted(DAMAGE))
@pytest.mark.parametrize("options", [(), ("-o", "ro")], ids=["rw", "ro"])
def test_reads_stop_with_eio_at_a_damaged_batch_and_the_daemon_warns_once(
    tmp_path: Path, mount_dir: MountDir, options: tuple[str, ...], damage: str
) -> None:
    log_dir = tmp_path / "logs"
    written, bad, segment = damaged_partition(log_dir, damage)
    before = written[: written.index(b"\n2340\n") + 1]
    mount = mount_dir(log_dir, *options)
    partition = mount.mountpoint / "t" / "0"
    assert partition.stat().st_size == len(written)  # the size never lies
    for _ in range(3):
        cat = subprocess.run(["cat", str(partition)], capture_output=True, timeout=60)
        assert cat.returncode != 0
        assert b"Input/output error" in cat.stderr
        assert cat.stdout == before
    with open(partition, "rb", buffering=0) as f:
        # A read that reaches the batch returns the bytes before it; one at it fails.
        assert os.pread(f.fileno(), 200, len(before) - 100) == before[-100:]
        with pytest.raises(OSError, match="Input/output error") as info:
            os.pread(f.fileno(), 100, len(before))
        assert info.value.errno == errno.EIO
    dd = subprocess.run(
        ["dd", f"if={partition}", "bs=4096", "status=none"], capture_output=True, timeout=60
    )
    assert dd.returncode != 0
    assert dd.stdout == before
    assert mount.stop() == 0
    lines = [line for line in mount.log().splitlines() if "corrupt record" in line]
    assert len(lines) == 1, lines  # one warning, not one per read
    assert "WARNING" in lines[0]
    for fact in (
        "topic t partition 0",
        f"corrupt record in {segment} at byte {bad.position}, offset 2340",
        DAMAGE[damage][1],
    ):
        assert fact in lines[0], (fact, lines[0])

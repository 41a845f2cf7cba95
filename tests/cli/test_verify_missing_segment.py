"""A segment file missing from the middle of a partition: ``verify`` names the missing
offsets, ``consume`` stops there with exit 1, and a writable open keeps the positions
of the records after the hole (it rebuilt them from the segment before it, in silence).
"""

from __future__ import annotations

import struct
from pathlib import Path

from seglogfs.cli.verify import verify_log_dir
from seglogfs.positions import position_index_spec
from storage import LogManager
from tests.cli.conftest import Cli
from tests.conftest import ManualClock


def _partition_without_its_third_segment(
    log_dir: Path, clock: ManualClock
) -> tuple[Path, int, int]:
    """A topic ``t`` of 40 lines over ten segments, written as the mount writes it (with
    its position index), whose third ``.log`` is then deleted by hand; returns the
    deleted file and the first and last offset it held."""
    with LogManager.open(log_dir, clock=clock, extension=position_index_spec) as manager:
        manager.create_topic("t", 1, {"segment.bytes": "300"})
        log = manager.log("t", 0)
        for i in range(40):
            log.append([b"line %d" % i])
        bases = log.segments.base_offsets()
    assert len(bases) >= 5
    victim = log_dir / "t-0" / f"{bases[2]:020d}.log"
    victim.unlink()
    return victim, bases[2], bases[3] - 1


def _entry0_units(path: Path) -> int:
    units: int = struct.unpack_from(">q", path.read_bytes(), 0)[0]
    return units


def test_verify_consume_and_open_name_a_missing_segment(
    cli: Cli, log_dir: Path, clock: ManualClock
) -> None:
    # Before: verify only said the next position index disagreed with its
    # predecessor, the open then rebuilt every later position index from there
    # (moving every later record's position) and verify found nothing; consume
    # printed 36 of the 40 lines and exited 0.
    victim, first, last = _partition_without_its_third_segment(log_dir, clock)
    after = victim.with_name(f"{last + 1:020d}.log")
    expected = f"{after}: offsets {first}..{last} are in no segment file"
    assert [str(p) for p in verify_log_dir(log_dir)] == [
        f"{expected}: a segment between {first - 4:020d}.log and this one is missing"
    ]
    positions = {p.name: _entry0_units(p) for p in (log_dir / "t-0").glob("*.seglogpos")}
    with LogManager.open(log_dir, clock=clock, extension=position_index_spec):
        pass
    assert {p.name: _entry0_units(p) for p in (log_dir / "t-0").glob("*.seglogpos")} == {
        name: units for name, units in positions.items() if not name.startswith(victim.stem)
    }
    assert [str(p).split(": a segment")[0] for p in verify_log_dir(log_dir)] == [expected]
    result = cli("verify")
    assert result.code == 1
    consumed = cli("consume", "t", "-e")
    assert consumed.code == 1
    assert consumed.out == b"".join(b"line %d\n" % i for i in range(first))
    assert f"offsets {first}..{last} are in no segment file" in consumed.err

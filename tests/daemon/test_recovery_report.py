"""After a crash the remount says per partition what recovery did (#23 item 6): which
segments it re-validated from the recovery point, the bytes it cut, the indexes it
rebuilt, where the log ends; a clean remount says nothing of the kind."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from seglogfs.daemon.recovery_report import RecoveryReport
from storage import LogManager
from storage.log.checkpoint import read_offset_checkpoint
from tests.daemon.conftest import MountDir, needs_fuse

SEGMENT = "00000000000000000000.log"


def _recovery_lines(log: str) -> list[str]:
    return [line.split(": ", 1)[1] for line in log.splitlines() if " recover" in line]


@needs_fuse
def test_a_remount_after_sigkill_logs_what_recovery_did(
    tmp_path: Path, mount_dir: MountDir
) -> None:
    logs = tmp_path / "logs"
    config = tmp_path / "server.properties"
    config.write_text("num.partitions=2\n")
    first = mount_dir(logs, "--config", str(config))
    (first.mountpoint / "t").mkdir()
    with open(first.mountpoint / "t" / "0", "a") as partition:
        partition.write("one\ntwo\nthree\n")
    first.kill()  # no clean shutdown: the next open recovers
    subprocess.run(["fusermount3", "-u", "-z", str(first.mountpoint)], check=False)
    # A write the crash left half done: bytes that frame no batch.
    segment = logs / "t-0" / SEGMENT
    with open(segment, "ab") as torn:
        torn.write(b"\x00\x00\x00\x00\x00\x00\x00\x03\x00\x00\x01")
    size = segment.stat().st_size
    points = read_offset_checkpoint(logs / "recovery-point-offset-checkpoint")

    second = mount_dir(logs, "--config", str(config))
    assert (second.mountpoint / "t" / "0").read_text() == "one\ntwo\nthree\n"
    lines = _recovery_lines(second.log())
    p0 = points.get(("t", 0), 0)
    p1 = points.get(("t", 1), 0)
    assert f"recovered {logs} after an unclean shutdown (no .kafka_cleanshutdown)" in lines
    assert (
        f"recovery of t-0: re-validated 1 segment(s) from the recovery point {p0} "
        f"({size:,} bytes, offsets 0..2) and rebuilt their indexes; cut 11 bytes at the "
        "first invalid batch; the log ends at offset 3"
    ) in lines
    assert (
        f"recovery of t-1: re-validated 1 segment(s) from the recovery point {p1} "
        "(0 bytes, no records) and rebuilt their indexes; cut nothing; the log ends at "
        "offset 0"
    ) in lines
    # Said before the mount is announced, once per partition.
    log = second.log()
    assert log.index("recovery of t-0") < log.index(f"mounted {logs}")
    assert len(re.findall(r"recovery of t-0", log)) == 1


@needs_fuse
def test_a_clean_remount_reports_no_recovery(tmp_path: Path, mount_dir: MountDir) -> None:
    logs = tmp_path / "logs"
    first = mount_dir(logs)
    (first.mountpoint / "t").mkdir()
    with open(first.mountpoint / "t" / "0", "a") as partition:
        partition.write("kept\n")
    assert first.stop() == 0
    second = mount_dir(logs)
    assert (second.mountpoint / "t" / "0").read_text() == "kept\n"
    assert _recovery_lines(second.log()) == []


def test_index_rebuilds_the_loader_logs_are_counted(
    log_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A sealed segment below the recovery point is not re-validated, but a missing
    index of it is rebuilt, and the loader says so: the line counts it."""
    with LogManager.open(log_dir) as manager:
        manager.create_topic("t", 1, {"segment.bytes": "200"})
        for i in range(6):
            manager.log("t", 0).append([b"record %d" % i * 5])
        assert manager.log("t", 0).number_of_segments > 2
    (log_dir / ".kafka_cleanshutdown").unlink()  # as after a crash
    (log_dir / "t-0" / "00000000000000000000.index").unlink()
    report = RecoveryReport.before_open(log_dir)
    assert report is not None
    caplog.set_level("INFO")
    with LogManager.open(log_dir) as manager:
        report.log_lines(manager)
        end = manager.log("t", 0).log_end_offset
    line = next(r.getMessage() for r in caplog.records if "recovery of t-0" in r.getMessage())
    assert line.startswith("recovery of t-0: re-validated 1 segment(s) from the recovery point")
    assert line.endswith(
        f"cut nothing; 1 more index rebuild(s) logged above; the log ends at offset {end}"
    )


def test_nothing_to_report_after_a_clean_shutdown(log_dir: Path) -> None:
    with LogManager.open(log_dir) as manager:
        manager.create_topic("t", 1)
    assert RecoveryReport.before_open(log_dir) is None

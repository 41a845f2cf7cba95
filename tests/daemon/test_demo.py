"""The quick-start demo (``bash .ci/demo``) runs end to end on a real mount."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from .conftest import ROOT, is_mounted, needs_fuse

pytestmark = needs_fuse


def test_demo_mounts_produces_consumes_and_unmounts(tmp_path: Path) -> None:
    log_dir = tmp_path / "kept"
    result = subprocess.run(
        [sys.executable, "-m", "seglogfs.cli.demo", str(log_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "order 1: 2 coffees\norder 2: 1 tea\norder 3: 3 croissants\n" in out
    lines = out.splitlines()
    for i in (4, 5, 6):  # printed by tail -f, each after the echo that produced it
        echo = lines.index(next(line for line in lines if f"echo 'order {i}:" in line))
        assert f"order {i}: {i} muffins" in lines[echo + 1 :]
    assert "$ cat " in out
    assert 'user.seglog.log_end_offset="6"' in out
    # seglogfs consume reads while the daemon runs; dump prints kafka-dump-log.sh lines.
    assert '"offset": 5, ' in out
    assert '"value": "order 6: 6 muffins"' in out
    assert "| offset: 0 CreateTime: " in out
    assert out.count("isvalid: true") == 6
    assert (log_dir / ".kafka_cleanshutdown").exists()  # unmounted cleanly
    assert (log_dir / "orders-0" / "00000000000000000000.log").stat().st_size > 0
    assert lines[0].startswith("# storage engine: ")  # compiled or pure, and why
    mountpoint = Path(
        next(line for line in lines if line.startswith("$ seglogfs mount")).split()[-2]
    )
    assert mountpoint.name == "mnt"
    assert not is_mounted(mountpoint)


def test_demo_runs_again_on_the_same_directory(tmp_path: Path) -> None:
    """``bash .ci/demo DIR`` twice (#23 item 8): the second run ended in a traceback
    (``mkdir: File exists``); now it appends to the kept topic."""
    log_dir = tmp_path / "kept"
    runs = [
        subprocess.run(
            [sys.executable, "-m", "seglogfs.cli.demo", str(log_dir)],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
        )
        for _ in range(2)
    ]
    assert [run.returncode for run in runs] == [0, 0], runs[1].stderr
    assert "Traceback" not in runs[1].stderr
    second = runs[1].stdout
    assert "# orders exists from an earlier run: this run appends to it" in second
    assert "# orders exists" not in runs[0].stdout
    assert 'user.seglog.log_end_offset="12"' in second
    assert second.count("isvalid: true") == 12

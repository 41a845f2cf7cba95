"""Readers of a compacted partition across a cleaning pass, through a real mount.

A pass lays the records it keeps up against the first record it did not clean (the
removed bytes leave from the front of the file's positions, as retention's do), so:
a fresh ``cat`` shows the compacted records in offset order and ``st_size`` matches
it; ``tail -f`` following the file never sees a truncation and goes on receiving new
appends; a reader holding the file open in the cleaned range (``less``, a script's
``read``) goes on with what it had read ahead, then the records the log still holds,
with no repeat, no reorder and none missing; ``dd skip=`` on a fresh open reads the compacted bytes.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

from tests.daemon.conftest import MountDir, needs_fuse
from tests.daemon.test_compaction_mount import KEYS, cli, describe, mount_compacted, write_rounds

LINE = re.compile(rb"k(\d+):(\d+)-(\d+)")


def records(data: bytes) -> list[tuple[int, int]]:
    """The (round, key) of each whole line (``write_rounds``' lines name both)."""
    found = []
    for line in data.split(b"\n")[:-1]:
        match = LINE.fullmatch(line)
        assert match is not None, line
        key, round_, again = (int(g) for g in match.groups())
        assert key == again
        found.append((round_, key))
    return found


def in_order_once(got: list[tuple[int, int]]) -> bool:
    return got == sorted(set(got))


@needs_fuse
def test_readers_across_a_pass(tmp_path: Path, mount_dir: MountDir) -> None:
    mount = mount_compacted(tmp_path, mount_dir, "log.cleaner.enable=false\n")
    partition = mount.mountpoint / "t" / "0"
    written = write_rounds(partition, 0, 40)
    before = describe(mount.log_dir)
    assert before["Segments"] > 3
    # Followers before the pass: tail -f from the first byte, and a script holding the
    # file open halfway (what less does between screens).
    tail = subprocess.Popen(
        ["tail", "-c", "+1", "-f", "-s", "0.1", str(partition)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    held = open(partition, "rb", buffering=0)  # noqa: SIM115 - closed below
    try:
        first = held.read(len(written) // 2)
        assert first == written[: len(first)]
        deadline = time.monotonic() + 30
        while os.stat(partition).st_size != len(written) and time.monotonic() < deadline:
            time.sleep(0.05)

        compacted = cli(mount.log_dir, "compact", "t").stdout
        assert re.search(r"Compacted t-0\|passes: 1\|", compacted.replace("\t", "|")), compacted
        after = describe(mount.log_dir)
        assert after["Size"] < before["Size"]
        assert after["EndOffset"] == before["EndOffset"]

        # A fresh reader (another process: this one holds the file open at its old
        # origin, and sizes are seen from there) reads what st_size says.
        fresh = subprocess.run(["cat", str(partition)], capture_output=True, check=True).stdout
        size = subprocess.run(["stat", "-c", "%s", str(partition)], capture_output=True, text=True)
        assert int(size.stdout) == len(fresh) < len(written)
        got = records(fresh)
        assert in_order_once(got)
        assert len(got) < 40 * KEYS
        # The latest record of every key is there, and everything is a written line.
        assert {(39, k) for k in range(KEYS)} <= set(got)
        assert set(got) <= set(records(written))
        # dd on a fresh open reads the compacted bytes.
        skip = len(fresh) // 3
        dd = subprocess.run(
            ["dd", f"if={partition}", "bs=1", f"skip={skip}", "count=200", "status=none"],
            capture_output=True,
            timeout=60,
            check=True,
        )
        assert dd.stdout == fresh[skip : skip + 200]

        # The held reader goes on from where it was: the rest of its line, then the
        # records after it that the log still holds.
        rest = held.read()
        seen = records(first + rest)
        assert in_order_once(seen), seen
        last_before = records(first[: first.rfind(b"\n") + 1])[-1]
        # Read ahead before the pass, it may still show records the pass removed (what
        # it had rendered: a view as of then), never one twice, never one missing.
        assert {r for r in got if r > last_before} <= set(seen)
        assert set(seen) <= set(records(written))

        # tail -f saw the whole file before the pass, no truncation, and gets appends.
        more = write_rounds(partition, 40, 3)
        expected_tail = records(more)
        deadline = time.monotonic() + 30
        out = b""
        assert tail.stdout is not None
        os.set_blocking(tail.stdout.fileno(), False)
        while time.monotonic() < deadline:
            chunk = tail.stdout.read()
            if chunk:
                out += chunk
            if out.endswith(more):
                break
            time.sleep(0.05)
        followed = records(out)
        assert followed[: 40 * KEYS] == records(written)  # all of it, before the pass
        assert followed[-len(expected_tail) :] == expected_tail
        assert in_order_once(followed)
    finally:
        held.close()
        tail.terminate()
        _, err = tail.communicate(timeout=30)
    assert b"truncated" not in err, err
    assert "Traceback" not in mount.log()

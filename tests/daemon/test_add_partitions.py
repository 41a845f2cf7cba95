"""``setfattr -n user.seglog.partitions -v N MNT/TOPIC`` (#23 item 4): Kafka's
``kafka-topics.sh --alter --partitions N`` through the mount: increase only, the new
partition files there at once, keyed lines to ``produce`` mapped by the new count."""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

from storage import LogManager, partition_for_key
from tests.daemon.conftest import MountDir, needs_fuse

pytestmark = needs_fuse


def _setfattr(path: Path, value: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["setfattr", "-n", "user.seglog.partitions", "-v", value, str(path)],
        capture_output=True,
        text=True,
        check=False,
    )


def test_setfattr_partitions_adds_partition_files_at_once(
    tmp_path: Path, mount_dir: MountDir
) -> None:
    logs = tmp_path / "logs"
    mount = mount_dir(logs)
    topic = mount.mountpoint / "t"
    topic.mkdir()
    os.setxattr(topic, "user.seglog.key.separator", b":")
    with open(topic / "0", "a") as partition:
        partition.write("k:before\n")
    assert sorted(os.listdir(topic)) == ["0", "produce"]

    assert _setfattr(topic, "3").returncode == 0
    assert sorted(os.listdir(topic)) == ["0", "1", "2", "produce"]  # no wait, no remount
    assert os.getxattr(topic, "user.seglog.partitions") == b"3"
    assert (topic / "2").stat().st_size == 0
    assert (topic / "0").read_text() == "k:before\n"

    keys = [f"key{i}" for i in range(12)]
    with open(topic / "produce", "a") as produce:
        produce.write("".join(f"{key}:v\n" for key in keys))
    for p in range(3):
        lines = (topic / str(p)).read_text().splitlines()
        mapped = sorted(f"{k}:v" for k in keys if partition_for_key(k.encode(), 3) == p)
        assert sorted(line for line in lines if line != "k:before") == mapped
    assert mount.stop() == 0
    with LogManager.open(logs, read_only=True) as manager:
        assert manager.topic("t").partitions == 3  # durable


def test_setfattr_partitions_refusals(tmp_path: Path, mount_dir: MountDir) -> None:
    mount = mount_dir(tmp_path / "logs")
    topic = mount.mountpoint / "t"
    topic.mkdir()
    assert _setfattr(topic, "2").returncode == 0
    for value in ("2", "1", "0", "many", "5000"):
        refused = _setfattr(topic, value)
        assert refused.returncode == 1, value
        assert os.strerror(errno.EINVAL) in refused.stderr, refused.stderr
    assert sorted(os.listdir(topic)) == ["0", "1", "produce"]
    log = mount.log()
    assert (
        "setfattr partitions on topic t refused: topic 't' has 2 partition(s); the count "
        "can only be increased"
    ) in log
    assert "setfattr partitions on topic t refused: 'many' is not a whole number" in log
    assert "max.topic.partitions (1000)" in log
    # A partition's attributes are facts, not settings.
    assert _setfattr(topic / "0", "3").returncode == 1

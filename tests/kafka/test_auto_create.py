"""``auto.create.topics.enable`` beyond the listener: ``seglogfs produce`` to a missing
topic creates it as a Kafka broker does for its producers (``num.partitions``, the
default format), on a directory it opens itself (the setting and the count from
``--broker-config``) and through a running daemon (the daemon's ``num.partitions``),
and refuses as before with the setting false."""

from __future__ import annotations

from pathlib import Path

from storage import LogManager
from tests.cli.conftest import run_script
from tests.daemon.conftest import MountDir
from tests.kafka.conftest import needs_fuse, start_kafka_mount


def test_produce_creates_a_missing_topic(tmp_path: Path, log_dir: Path) -> None:
    with LogManager.open(log_dir) as manager:
        manager.create_topic("t", 1)
    config = tmp_path / "server.properties"
    config.write_text("num.partitions=2\n")
    done = run_script(
        "produce", "new", "-p", "1", "-d", str(log_dir), "--broker-config", str(config),
        stdin=b"one\ntwo\n",
    )  # fmt: skip
    assert done.code == 0, done.err
    assert done.err == (
        "seglogfs produce: created topic new with 2 partitions (auto.create.topics.enable)\n"
    )
    consumed = run_script("consume", "new", "-p", "1", "-d", str(log_dir))
    assert consumed.out == b"one\ntwo\n"
    # Without --broker-config: Kafka's defaults (true, one partition).
    done = run_script("produce", "other", "-d", str(log_dir), stdin=b"x\n")
    assert done.code == 0, done.err
    assert "created topic other with 1 partition " in done.err
    with LogManager.open(log_dir) as manager:
        assert manager.topic("new").partitions == 2
        assert manager.topic("other").partitions == 1
        assert manager.log("new", 1).log_end_offset == 2


def test_produce_refuses_a_missing_topic_when_the_setting_is_false(
    tmp_path: Path, log_dir: Path
) -> None:
    with LogManager.open(log_dir) as manager:
        manager.create_topic("t", 1)
    config = tmp_path / "server.properties"
    config.write_text("auto.create.topics.enable=false\n")
    args = ["-d", str(log_dir), "--broker-config", str(config)]
    done = run_script("produce", "missing", *args, stdin=b"x\n")
    assert done.code == 1
    assert done.err == "seglogfs produce: error: topic 'missing' does not exist\n"
    config.write_text("auto.create.topics.enable=maybe\n")
    done = run_script("produce", "missing", *args, stdin=b"x\n")
    assert done.code == 2
    assert "auto.create.topics.enable" in done.err
    assert "must be true or false" in done.err
    with LogManager.open(log_dir) as manager:
        assert manager.topics() == ["t"]
    # An existing topic is produced to whatever the setting says.
    done = run_script("produce", "t", "-d", str(log_dir), stdin=b"x\n")
    assert done.code == 0, done.err
    assert done.err == ""


@needs_fuse
def test_produce_through_the_daemon_creates_a_missing_topic(
    tmp_path: Path, log_dir: Path, mount_dir: MountDir
) -> None:
    config = tmp_path / "server.properties"
    config.write_text("num.partitions=3\n")
    kafka = start_kafka_mount(mount_dir, log_dir, "--config", str(config))
    done = run_script("produce", "via", "-p", "2", "-d", str(log_dir), stdin=b"hello\n")
    assert done.code == 0, done.err
    assert done.err == (
        "seglogfs produce: created topic via with 3 partitions (auto.create.topics.enable)\n"
    )
    partitions = sorted(p.name for p in (kafka.mountpoint / "via").iterdir() if p.name.isdigit())
    assert partitions == ["0", "1", "2"]
    assert (kafka.mountpoint / "via" / "2").read_bytes() == b"hello\n"

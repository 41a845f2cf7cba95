"""``seglogfs topics alter TOPIC --partitions N`` (#23 item 4): Kafka's
``kafka-topics.sh --alter --partitions``, increase only, without a daemon and through
one; the new partitions take keyed records at once, by the new count."""

from __future__ import annotations

import subprocess
from pathlib import Path

from storage import LogManager, partition_for_key
from tests.cli.conftest import Cli, refused, run_script
from tests.cli.test_with_daemon import mounted

__all__ = ["mounted"]  # a fixture, used by name

WARNING = (
    "WARNING: If partitions are increased for a topic that has a key, the partition "
    "logic or ordering of the messages will be affected\n"
)


def test_alter_partitions_without_a_daemon(cli: Cli, log_dir: Path) -> None:
    assert cli("topics", "create", "orders", "--partitions", "2").code == 0
    result = cli("topics", "alter", "orders", "--partitions", "5")
    assert (result.code, result.text, result.err) == (
        0,
        "Adding partitions succeeded! Topic orders now has 5 partitions.\n",
        WARNING,
    )
    with LogManager.open(log_dir, read_only=True) as manager:
        assert manager.topic("orders").partitions == 5
    assert sorted(p.name for p in log_dir.iterdir() if p.name.startswith("orders-")) == [
        f"orders-{p}" for p in range(5)
    ]
    # Keyed records now map by the new count (Kafka's murmur2 % 5).
    keys = [b"k%d" % i for i in range(20)]
    produced = cli("produce", "orders", "-K", ":", stdin=b"".join(k + b":v\n" for k in keys))
    assert produced.code == 0, produced.err
    with LogManager.open(log_dir, read_only=True) as manager:
        where = {r.key: p for p in range(5) for r in manager.log("orders", p).records(0) if r.key}
    assert where == {key: partition_for_key(key, 5) for key in keys}
    assert any(partition_for_key(key, 5) >= 2 for key in keys)  # the new ones are used


def test_alter_partitions_refusals(cli: Cli, log_dir: Path) -> None:
    assert cli("topics", "create", "t", "--partitions", "3").code == 0
    refused(
        cli("topics", "alter", "t", "--partitions", "3"),
        2,
        "invalid value 3 for configuration partitions: topic 't' has 3 partition(s); the "
        "count can only be increased",
    )
    refused(
        cli("topics", "alter", "t", "--partitions", "2000"),
        2,
        "invalid value 2000 for configuration partitions: more than max.topic.partitions "
        "(1000) for one topic",
    )
    refused(
        cli("topics", "alter", "t", "--partitions", "4", "--add-config", "retention.ms=1"),
        2,
        "--partitions cannot be combined with --add-config/--delete-config: run one "
        "command for each",
    )
    refused(cli("topics", "alter", "nope", "--partitions", "4"), 1, "topic 'nope' does not exist")
    assert cli("topics", "alter", "nope", "--partitions", "4", "--if-exists").code == 0
    refused(
        cli("topics", "alter", "t"),
        2,
        "nothing to alter: give --partitions, or --add-config and/or --delete-config",
    )
    with LogManager.open(log_dir, read_only=True) as manager:
        assert manager.topic("t").partitions == 3


def test_alter_partitions_through_the_daemon(mounted: tuple[Path, Path]) -> None:
    """With a mount running, the request goes through its control socket, and the new
    partition files are in the mount as soon as the command returns."""
    log_dir, mountpoint = mounted
    env = {"SEGLOG_LOG_DIR": str(log_dir)}
    assert run_script("topics", "create", "t", "--partitions", "1", env=env).code == 0
    result = run_script("topics", "alter", "t", "--partitions", "3", env=env)
    assert (result.code, result.err) == (0, WARNING), result.err
    assert sorted((mountpoint / "t").iterdir()) == [
        mountpoint / "t" / name for name in ("0", "1", "2", "produce")
    ]
    subprocess.run(f"echo new >> {mountpoint / 't' / '2'}", shell=True, check=True)
    assert (mountpoint / "t" / "2").read_text() == "new\n"
    refused(
        run_script("topics", "alter", "t", "--partitions", "2", env=env),
        2,
        "invalid value 2 for configuration partitions: topic 't' has 3 partition(s); the "
        "count can only be increased",
    )

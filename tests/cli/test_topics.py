"""``seglogfs topics create|list|describe|alter|delete`` without a daemon."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest
import trio

from seglogfs import control
from storage import LogManager
from tests.cli.conftest import SCRIPT, Cli, strip_build_notice
from tests.conftest import ManualClock
from tests.control.test_control import call, serving
from tests.storage.log.test_lock_file import (
    as_user,
    flock_command,
    holding,
    older_version_layout,
    other_user,
    shared_dir,
)
from tests.storage.log.test_log_manager import open_files_limit

__all__ = ["other_user", "shared_dir"]  # fixtures, used by name


def test_create_with_every_option(cli: Cli, log_dir: Path) -> None:
    result = cli(
        "topics",
        "create",
        "orders",
        "--partitions",
        "3",
        "--config",
        "retention.ms=86400000",
        "--config",
        "segment.bytes=1048576",
        "--key-separator",
        ":",
    )
    assert (result.code, result.text, result.err) == (0, "Created topic orders.\n", "")
    with LogManager.open(log_dir, read_only=True) as manager:
        metadata = manager.topic("orders")
        assert metadata.partitions == 3
        assert metadata.format == "lines"
        assert metadata.key_separator == ":"
        assert metadata.overrides == {"retention.ms": "86400000", "segment.bytes": "1048576"}
        assert sorted(p.name for p in log_dir.iterdir() if p.is_dir()) == [
            "orders-0",
            "orders-1",
            "orders-2",
        ]


def test_create_raw_topic_and_topic_option(cli: Cli, log_dir: Path) -> None:
    assert cli("topics", "create", "--topic", "blobs", "--format", "raw").code == 0
    with LogManager.open(log_dir, read_only=True) as manager:
        assert manager.topic("blobs").format == "raw"
        assert manager.topic("blobs").partitions == 1  # num.partitions


def test_create_creates_a_missing_log_dir(cli: Cli, tmp_path: Path) -> None:
    fresh = tmp_path / "fresh" / "logs"
    assert cli("topics", "create", "t", "-d", str(fresh)).code == 0
    assert (fresh / "t-0").is_dir()


def test_create_refuses_separator_on_raw_topic(cli: Cli) -> None:
    result = cli("topics", "create", "t", "--format", "raw", "--key-separator", ":")
    assert result.code == 2
    assert "key.separator" in result.err


def test_create_twice_is_an_error_and_keeps_the_first(cli: Cli, log_dir: Path) -> None:
    assert cli("topics", "create", "t", "--partitions", "2").code == 0
    result = cli("topics", "create", "t", "--partitions", "5")
    assert result.code == 1
    assert result.err == "seglogfs topics create: error: topic 't' already exists\n"
    with LogManager.open(log_dir, read_only=True) as manager:
        assert manager.topic("t").partitions == 2


def test_two_different_topic_names_is_a_usage_error(cli: Cli) -> None:
    result = cli("topics", "create", "a", "--topic", "b")
    assert result.code == 2
    assert "two topics given" in result.err


def test_list_one_name_a_line_sorted(cli: Cli) -> None:
    assert cli("topics", "list").text == ""
    for name in ("zeta", "alpha", "mid.dle"):
        assert cli("topics", "create", name).code == 0
    assert cli("topics", "list").text == "alpha\nmid.dle\nzeta\n"


def test_describe_shows_offsets_segments_size_and_overrides(cli: Cli, log_dir: Path) -> None:
    assert (
        cli(
            "topics",
            "create",
            "t",
            "--partitions",
            "2",
            "--config",
            "segment.bytes=200",
            "--key-separator",
            "=",
        ).code
        == 0
    )
    with LogManager.open(log_dir) as manager:
        log = manager.log("t", 1)
        for i in range(10):
            log.append([b"x" * 50], timestamps=[1_700_000_000_000 + i])
        size, segments = log.size, log.number_of_segments
    assert segments > 1  # segment.bytes=200 rolled it
    lines = cli("topics", "describe", "t").text.splitlines()
    assert lines == [
        "Topic: t\tPartitionCount: 2\tFormat: lines\tKeySeparator: =\tConfigs: segment.bytes=200",
        "\tTopic: t\tPartition: 0\tStartOffset: 0\tEndOffset: 0\tSegments: 1\tSize: 0\t"
        "FirstTimestamp: -1\tLastTimestamp: -1",
        f"\tTopic: t\tPartition: 1\tStartOffset: 0\tEndOffset: 10\tSegments: {segments}\t"
        f"Size: {size}\tFirstTimestamp: 1700000000000\tLastTimestamp: 1700000000009",
    ]


def test_describe_without_topic_describes_all(cli: Cli) -> None:
    for name in ("b", "a"):
        cli("topics", "create", name)
    heads = [line for line in cli("topics", "describe").text.splitlines() if line.startswith("T")]
    assert [line.split("\t")[0] for line in heads] == ["Topic: a", "Topic: b"]


def test_alter_adds_and_deletes_overrides(cli: Cli, log_dir: Path) -> None:
    cli("topics", "create", "t", "--config", "retention.ms=1000")
    result = cli(
        "topics",
        "alter",
        "t",
        "--add-config",
        "segment.bytes=4096",
        "--add-config",
        "message.timestamp.type=LogAppendTime",
        "--delete-config",
        "retention.ms",
    )
    assert (result.code, result.text) == (0, "Completed updating config for topic t.\n")
    with LogManager.open(log_dir, read_only=True) as manager:
        assert manager.topic("t").overrides == {
            "segment.bytes": "4096",
            "message.timestamp.type": "LogAppendTime",
        }


def test_alter_errors_change_nothing(cli: Cli, log_dir: Path) -> None:
    cli("topics", "create", "t", "--config", "retention.ms=1000")
    nothing = cli("topics", "alter", "t")
    assert nothing.code == 2
    assert "nothing to alter" in nothing.err
    bad = cli("topics", "alter", "t", "--add-config", "retention.ms=-5", "--delete-config", "x")
    assert bad.code == 2
    unknown = cli("topics", "alter", "missing", "--add-config", "retention.ms=5")
    assert unknown.code == 1
    assert unknown.err == "seglogfs topics alter: error: topic 'missing' does not exist\n"
    with LogManager.open(log_dir, read_only=True) as manager:
        assert manager.topic("t").overrides == {"retention.ms": "1000"}


def test_delete_removes_topic_and_data(cli: Cli, log_dir: Path) -> None:
    cli("topics", "create", "t", "--partitions", "2")
    cli("produce", "t", stdin=b"a\nb\n")
    result = cli("topics", "delete", "t")
    assert (result.code, result.text) == (0, "Deleted topic t.\n")
    assert cli("topics", "list").text == ""
    assert not any(p.name.startswith("t-") for p in log_dir.iterdir())
    again = cli("topics", "delete", "t")
    assert again.code == 1
    assert "topic 't' does not exist" in again.err


def test_if_not_exists_and_if_exists_make_scripts_rerunnable(cli: Cli, log_dir: Path) -> None:
    assert cli("topics", "create", "t", "--partitions", "2", "--if-not-exists").code == 0
    again = cli("topics", "create", "t", "--partitions", "5", "--if-not-exists")
    assert (again.code, again.text, again.err) == (0, "", "")
    with LogManager.open(log_dir, read_only=True) as manager:
        assert manager.topic("t").partitions == 2  # the first one stays
    # Other errors still fail: the flag only forgives an existing topic.
    assert cli("topics", "create", "bad name", "--if-not-exists").code == 2
    missing = cli("topics", "alter", "nope", "--add-config", "retention.ms=5", "--if-exists")
    assert (missing.code, missing.err) == (0, "")
    assert cli("topics", "alter", "t", "--add-config", "bogus=1", "--if-exists").code == 2
    assert cli("topics", "delete", "t", "--if-exists").text == "Deleted topic t.\n"
    gone = cli("topics", "delete", "t", "--if-exists")
    assert (gone.code, gone.text, gone.err) == (0, "", "")
    assert cli("topics", "delete", "t").code == 1


def test_broker_config_file_gives_the_defaults(cli: Cli, log_dir: Path, tmp_path: Path) -> None:
    properties = tmp_path / "server.properties"
    properties.write_text("broker.id=1\nnum.partitions=4\nlog.segment.bytes=300\n")
    assert cli("topics", "create", "t", "--broker-config", str(properties)).code == 0
    lines = b"".join(b"line %d\n" % i for i in range(100))
    assert cli("produce", "t", "-p", "0", "--broker-config", str(properties), stdin=lines).code == 0
    assert cli("produce", "t", "-p", "0", "--broker-config", str(properties), stdin=lines).code == 0
    with LogManager.open(log_dir, read_only=True) as manager:
        assert manager.topic("t").partitions == 4
        assert manager.log("t", 0).number_of_segments == 2  # log.segment.bytes=300 rolled
    bad = tmp_path / "bad.properties"
    bad.write_text("log.segment.bytes=lots\n")
    wrong = cli("topics", "create", "u", "--broker-config", str(bad))
    assert wrong.code == 2
    assert "log.segment.bytes" in wrong.err
    missing = cli("topics", "create", "u", "--broker-config", str(tmp_path / "none"))
    assert missing.code == 1
    assert missing.err == (
        f"seglogfs topics create: error: --broker-config {tmp_path / 'none'} does not exist\n"
    )


def test_delete_a_topic_with_the_longest_name(cli: Cli, log_dir: Path) -> None:
    """Issue #16 (5): the ``.<uuid>-delete`` name of a 249-character topic's partition
    directory was 291 bytes, the rename failed with "File name too long" after the
    topic had left the metadata, and creating the name again brought the old data
    back. Kafka cuts the topic part of that name to fit 255 bytes; so does the engine."""
    name = "t" * 249
    assert cli("topics", "create", name, "--partitions", "2").code == 0
    assert cli("produce", name, "-p", "1", stdin=b"old data\n").code == 0
    result = cli("topics", "delete", name)
    assert (result.code, result.text, result.err) == (0, f"Deleted topic {name}.\n", "")
    assert cli("topics", "list").text == ""
    assert [entry for entry in os.listdir(log_dir) if entry.startswith("t")] == []
    assert cli("topics", "create", name, "--partitions", "2").code == 0
    assert cli("consume", name).out == b""
    assert cli("verify", "-q").code == 0


# --- Bounds (issue #18) ---------------------------------------------------------------


def test_a_partition_count_over_the_maximum_is_refused_before_anything_is_made(
    cli: Cli, log_dir: Path, tmp_path: Path
) -> None:
    """Issue #18 (1): ``--partitions 100000`` ran for 53 s, left 5,000 partition
    directories and a log directory no command could open again ("Too many open
    files"). Now: exit 2 naming the bound, nothing made, not even a missing log
    directory."""
    assert cli("topics", "create", "small").code == 0
    before = sorted(os.listdir(log_dir))
    with open_files_limit(200):
        result = cli("topics", "create", "big", "--partitions", "100000")
    assert (result.code, result.text) == (2, "")
    assert result.err == (
        "seglogfs topics create: error: invalid value 100000 for configuration partitions: "
        "more than max.topic.partitions (1000) for one topic\n"
    )
    assert sorted(os.listdir(log_dir)) == before
    assert cli("topics", "list").text == "small\n"
    fresh = tmp_path / "fresh"
    with open_files_limit(200):
        missing = cli("topics", "create", "big", "--partitions", "100000", "-d", str(fresh))
    assert missing.code == 2
    assert not fresh.exists()
    bounded = tmp_path / "server.properties"
    bounded.write_text("max.topic.partitions=100000\nmax.broker.partitions=4\n")
    over = cli("topics", "create", "four", "--partitions", "4", "--broker-config", str(bounded))
    assert over.code == 2
    assert "max.broker.partitions (4)" in over.err
    assert sorted(os.listdir(log_dir)) == before


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("9" * 5000, id="5000-nines"),
        pytest.param("99999999999999999999", id="over-long"),
        pytest.param("2147483648", id="over-int"),
        pytest.param("3.0", id="decimal"),
    ],
)
def test_partitions_that_are_no_int_are_a_usage_error(cli: Cli, log_dir: Path, value: str) -> None:
    result = cli("topics", "create", "big", "--partitions", value)
    assert result.code == 2
    assert result.err.startswith(
        "seglogfs topics create: error: argument --partitions: invalid int value: "
    )
    assert len(result.err) < 200
    assert os.listdir(log_dir) == []


def test_config_values_of_thousands_of_digits_are_a_usage_error(cli: Cli, log_dir: Path) -> None:
    """Issue #18 (6): ``--config retention.ms=<5,000 nines>`` gave a traceback and
    exit 1 (``int()`` refuses over 4,300 digits). Now exit 2 with the usual line,
    the value shortened."""
    nines = "9" * 5000
    expected = (
        "error: invalid value '9999999999999999999999999999...9999999999 (5000 characters)' "
        "for configuration retention.ms: Not a number of type LONG\n"
    )
    created = cli("topics", "create", "t", "--config", f"retention.ms={nines}")
    assert (created.code, created.err) == (2, f"seglogfs topics create: {expected}")
    assert os.listdir(log_dir) == []
    assert cli("topics", "create", "t").code == 0
    altered = cli("topics", "alter", "t", "--add-config", f"retention.ms={nines}")
    assert (altered.code, altered.err) == (2, f"seglogfs topics alter: {expected}")
    ones = cli("topics", "alter", "t", "--add-config", "segment.bytes=" + "1" * 65000)
    assert ones.code == 2
    assert "segment.bytes: Not a number of type INT" in ones.err
    assert cli("topics", "describe", "t").text.startswith("Topic: t\tPartitionCount: 1\t")
    assert "Configs: \n" in cli("topics", "describe", "t").text


@pytest.mark.trio
async def test_the_daemon_answers_a_partition_count_over_the_maximum_with_an_error(
    log_dir: Path, clock: ManualClock
) -> None:
    """Through the control socket the engine validates too: ``"partitions": 10**30``
    was written to the topics file and never answered (the undo of the failed create
    counted to 10**30), 100000 opened partitions until the daemon ran out of
    descriptors. Now each is a ``ConfigError`` reply, exit 2 from the command line, and
    the daemon and its directory carry on."""
    env = {**os.environ, "SEGLOG_LOG_DIR": str(log_dir)}
    with LogManager.open(log_dir, clock=clock) as manager, open_files_limit(300):
        manager.create_topic("small")
        async with serving(log_dir, manager):
            before = sorted(os.listdir(log_dir)), (log_dir / "seglog-topics.json").read_bytes()
            # (10**30 is now refused by the protocol, before the engine: a ProtocolError.)
            for partitions in (100_000, 2**31 - 1):
                with pytest.raises(control.ControlError) as refused:
                    await call(
                        control.request, log_dir, "create_topic", name="big", partitions=partitions
                    )
                assert refused.value.kind == "ConfigError"
                assert "configuration partitions" in refused.value.message
            created = await trio.run_process(
                [str(SCRIPT), "topics", "create", "big", "--partitions", "100000"],
                capture_stdout=True,
                capture_stderr=True,
                env=env,
                check=False,
            )
            assert created.returncode == 2
            assert strip_build_notice(created.stderr) == (
                b"seglogfs topics create: error: invalid value 100000 for configuration "
                b"partitions: more than max.topic.partitions (1000) for one topic\n"
            )
            assert (sorted(os.listdir(log_dir)), (log_dir / "seglog-topics.json").read_bytes()) == (
                before
            )
            assert await call(control.request, log_dir, "list_topics") == ["small"]
    with LogManager.open(log_dir, clock=clock) as reopened:
        assert reopened.topics() == ["small"]


def test_another_users_flock_does_not_block_topics_create(
    cli: Cli, other_user: pwd.struct_passwd, shared_dir: Path
) -> None:
    """Issue #18 (8), from the command line: with ``flock -x -n LOGDIR/.seglog.lock``
    held by another user, ``topics create`` failed with "locked by another writer
    process"; now it creates the topic (see ``tests/storage/log/test_lock_file.py``)."""
    log_dir = shared_dir / "logs"
    lock = older_version_layout(log_dir)
    with holding(as_user(other_user, *flock_command(lock))) as held:
        assert held
        result = cli("topics", "create", "orders", "-d", str(log_dir))
        assert (result.code, result.text, result.err) == (0, "Created topic orders.\n", "")
        assert cli("topics", "list", "-d", str(log_dir)).text == "orders\n"

"""``seglogfs topics create|list|describe|alter|delete`` without a daemon."""

from __future__ import annotations

from pathlib import Path

from storage import LogManager
from tests.cli.conftest import Cli


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
        f"seglogfs topics create: error: {tmp_path / 'none'}: No such file or directory\n"
    )

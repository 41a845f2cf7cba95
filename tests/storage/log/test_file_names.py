"""File and directory names, as Kafka's LogFileUtils and LocalLog spell and parse them."""

from __future__ import annotations

from pathlib import Path

import pytest

from storage.log.file_names import (
    DELETED_FILE_SUFFIX,
    MAX_FILE_NAME_BYTES,
    SWAP_FILE_SUFFIX,
    delete_dir_name,
    filename_prefix_from_offset,
    is_delete_dir_name,
    log_file,
    offset_from_file_name,
    offset_index_file,
    parse_topic_partition_name,
    partition_dir_name_problem,
    time_index_file,
    topic_partition_dir_name,
)

UUID_HEX = "0123456789abcdef0123456789abcdef"


@pytest.mark.parametrize(
    ("offset", "prefix"),
    [
        (0, "00000000000000000000"),
        (368769, "00000000000000368769"),
        (2**63 - 1, "09223372036854775807"),
    ],
)
def test_prefix_is_twenty_zero_padded_digits(offset: int, prefix: str) -> None:
    assert filename_prefix_from_offset(offset) == prefix
    assert len(prefix) == 20


def test_segment_file_paths_use_the_prefix_and_suffixes(tmp_path: Path) -> None:
    assert log_file(tmp_path, 42) == tmp_path / "00000000000000000042.log"
    assert offset_index_file(tmp_path, 42) == tmp_path / "00000000000000000042.index"
    assert time_index_file(tmp_path, 42) == tmp_path / "00000000000000000042.timeindex"
    assert log_file(tmp_path, 42, DELETED_FILE_SUFFIX) == tmp_path / (
        "00000000000000000042.log.deleted"
    )
    assert (
        offset_index_file(tmp_path, 7, SWAP_FILE_SUFFIX).name == "00000000000000000007.index.swap"
    )


@pytest.mark.parametrize(
    ("name", "offset"),
    [
        ("00000000000000000000.log", 0),
        ("00000000000000368769.log", 368769),
        ("00000000000000368769.index", 368769),
        ("00000000000000368769.timeindex", 368769),
        ("00000000000000000100.log.swap", 100),
        ("00000000000000000100.log.deleted", 100),
        ("00000000000000000100.index.cleaned", 100),
        ("09223372036854775807.log", 2**63 - 1),
    ],
)
def test_offset_from_a_segment_file_name(name: str, offset: int) -> None:
    assert offset_from_file_name(name) == offset


def test_offset_from_file_name_inverts_the_prefix() -> None:
    for offset in (0, 1, 99, 10**19):
        assert offset_from_file_name(log_file(Path("/x"), offset).name) == offset


@pytest.mark.parametrize(
    "name",
    [
        "0000000000000000000.log",  # 19 digits
        "000000000000000000000.log",  # 21 digits
        "0000000000000000000a.log",
        "-0000000000000000001.log",
        "+0000000000000000001.log",
        " 0000000000000000001.log",
        "recovery-point-offset-checkpoint",
        ".kafka_cleanshutdown",
        "leader-epoch-checkpoint",
        "",
    ],
)
def test_offset_from_file_name_is_none_for_other_names(name: str) -> None:
    assert offset_from_file_name(name) is None


@pytest.mark.parametrize(
    "name",
    [
        "0000000000000000000\u00b2.log",  # superscript two: isdigit() but not int()
        "0000000000000000000\uff11.log",  # fullwidth one
        "0000000000000000000\u0663.log",  # Arabic-Indic three
    ],
)
def test_offset_from_file_name_is_none_for_non_ascii_digits(name: str) -> None:
    assert offset_from_file_name(name) is None


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("orders-0", ("orders", 0)),
        ("my-topic-12", ("my-topic", 12)),
        ("a.b_c-3", ("a.b_c", 3)),
        ("__consumer_offsets-49", ("__consumer_offsets", 49)),
        ("x-0-1", ("x-0", 1)),
        ("t-2147483647", ("t", 2147483647)),
    ],
)
def test_parse_partition_directory_name(name: str, expected: tuple[str, int]) -> None:
    assert parse_topic_partition_name(name) == expected


def test_parse_inverts_topic_partition_dir_name() -> None:
    for topic, partition in [("orders", 0), ("my-topic", 12), ("a.b_c", 3)]:
        name = topic_partition_dir_name(topic, partition)
        assert parse_topic_partition_name(name) == (topic, partition)


@pytest.mark.parametrize(
    "name",
    [
        f"orders-0.{UUID_HEX}-delete",
        f"orders-0.{UUID_HEX}-future",
        f"orders-0.{UUID_HEX}-stray",
        f"my-topic-12.{UUID_HEX}-delete",
        "__cluster_metadata-0",
        "__cluster_metadata-1",
    ],
)
def test_parse_ignores_kafka_directories_that_are_not_data_partitions(name: str) -> None:
    assert parse_topic_partition_name(name) is None


@pytest.mark.parametrize(
    "name", ["orders", "orders-", "-0", "orders-x", "orders-1a", "orders_0", "orders-+1", ""]
)
def test_parse_is_none_without_a_partition_number(name: str) -> None:
    assert parse_topic_partition_name(name) is None


def test_parse_is_none_for_a_non_ascii_partition_number() -> None:
    assert parse_topic_partition_name("orders-\u0663") is None


def test_delete_dir_names_fit_the_file_system() -> None:
    """Kafka's ``LocalLog.logDeleteDirName``: the topic part is cut so that the name of
    the longest topic with a 5-digit partition still fits 255 bytes."""
    for topic, partition in (("t" * 249, 99999), ("a.b_c-d" * 35, 7), ("short", 0)):
        name = delete_dir_name(topic, partition)
        assert len(name.encode()) <= MAX_FILE_NAME_BYTES
        assert name.endswith("-delete")
        assert is_delete_dir_name(name)
        assert parse_topic_partition_name(name) is None  # never taken for a partition
        assert topic.startswith(name.rsplit(f"-{partition}.", 1)[0])
    assert delete_dir_name("short", 3).startswith("short-3.")
    for not_ours in ("backup-delete", "t-0", "t-0.xyz-delete", "t-0.0123-future"):
        assert not is_delete_dir_name(not_ours)


def test_partition_directory_names_longer_than_a_file_name_are_a_problem() -> None:
    assert partition_dir_name_problem("t" * 249, 100_000) is None  # t...t-99999: 255 bytes
    problem = partition_dir_name_problem("t" * 249, 100_001)
    assert problem is not None
    assert "partition 100000" in problem
    assert "256 bytes" in problem

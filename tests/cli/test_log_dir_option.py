"""``-d/--log-dir`` of the commands with actions (``topics``, ``groups``) goes before
the action or after it: ``seglogfs topics -d DIR list`` and ``seglogfs topics list -d
DIR`` are the same command."""

from __future__ import annotations

from pathlib import Path

import pytest

from storage import LogManager

from .conftest import Cli, refused


@pytest.fixture
def no_env(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> Cli:
    """The ``cli`` fixture without ``SEGLOG_LOG_DIR``: only the option names the log
    directory, so a ``-d`` that was dropped is an error, not a silent fallback."""
    monkeypatch.delenv("SEGLOG_LOG_DIR")
    return cli


@pytest.fixture
def topic(log_dir: Path) -> None:
    with LogManager.open(log_dir) as manager:
        manager.create_topic("orders", 2)


@pytest.mark.parametrize("option", ["-d", "--log-dir"])
def test_topics_log_dir_before_or_after_the_action(
    no_env: Cli, log_dir: Path, topic: None, option: str
) -> None:
    before = no_env("topics", option, str(log_dir), "list")
    after = no_env("topics", "list", option, str(log_dir))
    assert (before.code, before.text, before.err) == (0, "orders\n", "")
    assert (after.code, after.text, after.err) == (0, "orders\n", "")
    described = no_env("topics", option, str(log_dir), "describe", "orders")
    assert (described.code, described.text.count("Partition: ")) == (0, 2)


def test_topics_create_with_log_dir_before_the_action(no_env: Cli, log_dir: Path) -> None:
    created = no_env("topics", "-d", str(log_dir), "create", "fresh", "--partitions", "1")
    assert (created.code, created.text) == (0, "Created topic fresh.\n")
    with LogManager.open(log_dir, read_only=True) as manager:
        assert manager.topics() == ["fresh"]


def test_groups_log_dir_before_the_action(no_env: Cli, log_dir: Path, topic: None) -> None:
    result = no_env("groups", "-d", str(log_dir), "list")
    assert (result.code, result.err) == (0, "")


def test_after_the_action_wins_over_before(no_env: Cli, log_dir: Path, tmp_path: Path) -> None:
    """Given in both places, the later one counts, as a repeated option does."""
    missing = tmp_path / "missing"
    refused(
        no_env("topics", "-d", str(log_dir), "list", "-d", str(missing)),
        1,
        f"log directory {missing} does not exist",
    )


def test_without_log_dir_anywhere(no_env: Cli) -> None:
    refused(
        no_env("topics", "list"),
        2,
        "no log directory: pass -d/--log-dir or set SEGLOG_LOG_DIR",
    )

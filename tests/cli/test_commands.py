"""The command line as a whole: help, version, exit codes, error lines, log dir choice."""

from __future__ import annotations

from pathlib import Path

import pytest

from seglogfs import __version__
from storage import LogManager
from tests.cli.conftest import Cli, run_script

COMMANDS = [
    [],
    ["topics"],
    ["topics", "create"],
    ["topics", "list"],
    ["topics", "describe"],
    ["topics", "alter"],
    ["topics", "delete"],
    ["produce"],
    ["consume"],
    ["dump"],
    ["verify"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "seglogfs")
def test_help_everywhere(cli: Cli, command: list[str]) -> None:
    result = cli(*command, "--help")
    assert result.code == 0
    assert result.text.startswith("usage: seglogfs")
    assert result.err == ""


def test_top_level_help_lists_every_command(cli: Cli) -> None:
    text = cli("--help").text
    for command in ("mount", "topics", "produce", "consume", "dump", "verify"):
        assert command in text


def test_version(cli: Cli) -> None:
    result = cli("--version")
    assert (result.code, result.text) == (0, f"seglogfs {__version__}\n")


def test_no_command_is_a_usage_error(cli: Cli) -> None:
    result = cli()
    assert result.code == 2
    assert result.err.count("\n") == 1
    assert "required" in result.err


def test_unknown_option_is_one_line_and_exit_2(cli: Cli) -> None:
    result = cli("topics", "list", "--bogus")
    assert result.code == 2
    assert result.err == (
        "seglogfs topics list: error: unrecognized arguments: --bogus (see --help)\n"
    )


def test_log_dir_from_option_beats_environment(cli: Cli, tmp_path: Path) -> None:
    other = tmp_path / "other"
    with LogManager.open(other) as manager:
        manager.create_topic("only-in-other", 1)
    assert cli("topics", "list").text == ""
    assert cli("topics", "list", "-d", str(other)).text == "only-in-other\n"
    assert cli("topics", "list", "--log-dir", str(other)).text == "only-in-other\n"


def test_missing_log_dir_setting_is_a_usage_error(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SEGLOG_LOG_DIR")
    result = cli("topics", "list")
    assert result.code == 2
    assert result.err == (
        "seglogfs topics list: error: no log directory: pass -d/--log-dir or set SEGLOG_LOG_DIR\n"
    )


def test_nonexistent_log_dir_is_a_runtime_error(cli: Cli, tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    for command in (
        ["topics", "list"],
        ["topics", "describe"],
        ["topics", "delete", "t"],
        ["consume", "t"],
        ["produce", "t"],
        ["verify"],
    ):
        result = cli(*command, "-d", str(missing))
        assert result.code == 1, command
        assert result.err.endswith(f"error: log directory {missing} does not exist\n"), command
    assert not missing.exists()


USER_MISTAKES = [
    (["topics", "create", "bad/name"], 2, "invalid topic name 'bad/name'"),
    (["topics", "create", "new", "--config", "no.such.key=1"], 2, "no.such.key"),
    (["topics", "create", "new", "--config", "retention.ms=soon"], 2, "retention.ms"),
    (["topics", "create", "new", "--config", "novalue"], 2, "KEY=VALUE"),
    (["topics", "create", "new", "--partitions", "x"], 2, "invalid int value"),
    (["topics", "describe", "missing"], 1, "topic 'missing' does not exist"),
    (["consume", "t", "-o", "sometime"], 2, "bad offset spec 'sometime'"),
    (["consume", "t", "-o", "@2026-13-45"], 2, "bad offset spec"),
    (["consume", "missing"], 1, "topic 'missing' does not exist"),
    (["consume", "t", "-p", "7"], 1, "partition t-7 does not exist"),
    (["consume", "t", "-o", "99"], 1, "offset 99 is out of range"),
    (["produce", "bad/name"], 2, "invalid topic name 'bad/name'"),  # created when missing
    (["dump", "/no/such/00000000000000000000.log"], 1, "no such file"),
]


@pytest.mark.parametrize(("args", "code", "message"), USER_MISTAKES, ids=lambda v: str(v))
def test_user_mistakes_are_one_line_without_traceback(
    log_dir: Path, args: list[str], code: int, message: str
) -> None:
    with LogManager.open(log_dir) as manager:
        manager.create_topic("t", 1)
    result = run_script(*args, env={"SEGLOG_LOG_DIR": str(log_dir)})
    assert result.code == code, result.err
    assert result.out == b""
    assert result.err.count("\n") == 1, result.err
    assert "Traceback" not in result.err
    assert message in result.err
    assert result.err.startswith("seglogfs ")


def test_locked_log_dir_is_a_clear_error(log_dir: Path) -> None:
    with LogManager.open(log_dir) as manager:
        manager.create_topic("t", 1)
        # A writer holds the lock and no daemon socket answers: refuse, never a second writer.
        result = run_script("produce", "t", "-d", str(log_dir), stdin=b"x\n")
        assert result.code == 1
        assert result.err == (
            f"seglogfs produce: error: log directory {log_dir} is locked by another writer "
            "process\n"
        )
        assert manager.log("t", 0).log_end_offset == 0
        # Read-only commands still work beside the writer.
        listed = run_script("topics", "list", "-d", str(log_dir))
        assert (listed.code, listed.out) == (0, b"t\n")


def test_mount_is_registered_with_its_own_arguments(cli: Cli, tmp_path: Path) -> None:
    helped = cli("mount", "--help")
    assert helped.code == 0
    assert helped.text.startswith("usage: seglogfs mount")
    assert "LOGDIR MOUNTPOINT" in helped.text
    missing = cli("mount")
    assert missing.code == 2
    assert missing.err == (
        "seglogfs mount: error: the following arguments are required: LOGDIR, MOUNTPOINT "
        "(see --help)\n"
    )
    nowhere = run_script("mount", str(tmp_path / "logs"), str(tmp_path / "nowhere"))
    assert nowhere.code == 1
    assert nowhere.err == (
        f"seglogfs mount: error: mount point {tmp_path / 'nowhere'} does not exist\n"
    )

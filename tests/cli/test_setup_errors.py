"""Bad set-up, tried as a new user would, through the console script: each mistake with
the log directory or a config file is one line naming it, with the README's exit code
(1: the machine said no, 2: the command line is wrong), no traceback, nothing created
(issue #17 "Bad set-up", #23 item 2). The mistakes that need a mount (a mount point
given as the log directory, the daemon's own checks) are in
``tests/daemon/test_setup_errors.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from storage import LogManager
from tests.cli.conftest import (
    Result,
    as_nobody,
    needs_root,
    public_dir,
    read_only_file_system,
    refused,
    run_script,
    tree,
    write,
)


@pytest.fixture
def a_file(tmp_path: Path) -> Path:
    path = tmp_path / "hostname"
    path.write_text("box\n")
    return path


COMMANDS = [
    ["topics", "create", "t"],
    ["topics", "list"],
    ["topics", "describe"],
    ["topics", "alter", "t", "--add-config", "retention.ms=1"],
    ["topics", "delete", "t"],
    ["produce", "t"],
    ["consume", "t"],
    ["verify"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_a_file_given_as_the_log_dir_is_not_a_directory(
    tmp_path: Path, a_file: Path, command: list[str]
) -> None:
    # Was "File exists" (topics create: mkdir's word) or "does not exist" (the others).
    before = tree(tmp_path)
    refused(
        run_script(*command, "-d", str(a_file), stdin=b"x\n"),
        1,
        f"log directory {a_file} is not a directory",
    )
    assert a_file.read_text() == "box\n"
    assert tree(tmp_path) == before


def test_a_path_through_a_file_names_the_file(tmp_path: Path, a_file: Path) -> None:
    inside = a_file / "logs"
    refused(
        run_script("topics", "create", "t", "-d", str(inside)),
        1,
        f"log directory {inside}: {a_file} is not a directory",
    )
    refused(run_script("verify", str(a_file)), 1, f"log directory {a_file} is not a directory")


def test_delete_records_on_a_file_is_not_a_directory(tmp_path: Path, a_file: Path) -> None:
    offsets = tmp_path / "offsets.json"
    offsets.write_text('{"partitions": [{"topic": "t", "partition": 0, "offset": 1}]}')
    result = run_script("delete-records", "--offset-json-file", str(offsets), "-d", str(a_file))
    assert result.code == 1
    assert result.err.endswith(f"error: log directory {a_file} is not a directory\n")


@pytest.fixture
def topic_dir(log_dir: Path) -> Path:
    with LogManager.open(log_dir) as manager:
        manager.create_topic("t", 1)
    return log_dir


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--add-config", "nosuch.key=1"], "unknown topic configuration 'nosuch.key'"),
        (
            ["--add-config", "retention.mss=1"],
            "unknown topic configuration 'retention.mss' (did you mean retention.ms?)",
        ),
        (
            ["--add-config", "Retention.MS=1"],
            "unknown topic configuration 'Retention.MS' (did you mean retention.ms?)",
        ),
        (
            ["--delete-config", "segment.byte"],
            "unknown topic configuration 'segment.byte' (did you mean segment.bytes?)",
        ),
    ],
)
def test_an_unknown_config_key_is_named_with_the_closest_known_key(
    topic_dir: Path, args: list[str], message: str
) -> None:
    # Was "invalid value '1' for configuration nosuch.key: unknown topic configuration"
    # (and "invalid value None" for --delete-config): the value is not what is wrong.
    refused(run_script("topics", "alter", "t", "-d", str(topic_dir), *args), 2, message)
    with LogManager.open(topic_dir, read_only=True) as manager:
        assert manager.topic("t").overrides == {}


def test_an_unknown_config_key_at_create_makes_nothing(log_dir: Path) -> None:
    refused(
        run_script("topics", "create", "t", "-d", str(log_dir), "--config", "max.message.byte=1"),
        2,
        "unknown topic configuration 'max.message.byte' (did you mean max.message.bytes?)",
    )
    assert tree(log_dir) == set()


def test_broker_config_mistakes_name_the_option_and_the_file(tmp_path: Path, log_dir: Path) -> None:
    def create(config: Path) -> Result:
        return run_script(
            "topics", "create", "t", "-d", str(log_dir), "--broker-config", str(config)
        )

    missing = tmp_path / "server.properties"
    refused(create(missing), 1, f"--broker-config {missing} does not exist")
    refused(
        create(tmp_path), 1, f"--broker-config {tmp_path} is a directory, not a properties file"
    )
    typo = write(tmp_path / "typo.properties", "num.partitions=2\nlog.segment.byte=1000\n")
    refused(
        create(typo),
        2,
        f"--broker-config {typo}: unknown log configuration 'log.segment.byte' "
        "(did you mean log.segment.bytes?)",
    )
    bad_line = write(tmp_path / "escape.properties", "log.segment.bytes=\\uZZZZ\n")
    refused(
        create(bad_line),
        2,
        f"--broker-config {bad_line}: invalid value '\\\\uZZZZ' for configuration "
        "log.segment.bytes: Malformed \\uxxxx encoding on line 1",
    )
    bad_value = write(tmp_path / "value.properties", "num.partitions=two\n")
    refused(
        create(bad_value),
        2,
        f"--broker-config {bad_value}: invalid value 'two' for configuration num.partitions: "
        "Not a number of type INT",
    )
    assert tree(log_dir) == set()


# -- what only another user or a tmpfs shows (root only) ----------------------------


@needs_root
def test_another_users_log_dir_says_whose_it_is() -> None:
    with public_dir() as public:
        another_users_log_dir(public)


def another_users_log_dir(public_dir: Path) -> None:
    logs = public_dir / "logs"
    with LogManager.open(logs) as manager:  # root's, mode 0750
        manager.create_topic("t", 1)
    logs.chmod(0o755)
    before = tree(logs)
    # Was "logs/.seglog.lock: Permission denied": a file the user never named.
    refused(
        as_nobody("topics", "create", "z", "-d", str(logs)),
        1,
        f"no permission to write log directory {logs} (owned by root, mode 0755; "
        "running as nobody)",
    )
    assert tree(logs) == before
    logs.chmod(0o700)
    refused(
        as_nobody("topics", "list", "-d", str(logs)),
        1,
        f"no permission to read log directory {logs} (owned by root, mode 0700; running as nobody)",
    )
    refused(
        as_nobody("topics", "create", "z", "-d", str(logs / "inner")),
        1,
        f"no permission to reach log directory {logs / 'inner'} ({logs} owned by root, "
        "mode 0700; running as nobody)",
    )
    fresh = public_dir / "fresh"
    refused(
        as_nobody("topics", "create", "z", "-d", str(fresh)),
        1,
        f"no permission to create log directory {fresh} ({public_dir} owned by root, "
        "mode 0755; running as nobody)",
    )
    assert not fresh.exists()
    unreadable = write(public_dir / "server.properties", "num.partitions=2\n")
    unreadable.chmod(0o600)
    refused(
        as_nobody("topics", "create", "z", "-d", str(fresh), "--broker-config", str(unreadable)),
        1,
        f"--broker-config {unreadable}: Permission denied",
    )


@needs_root
def test_a_log_dir_on_a_read_only_file_system_says_so(tmp_path: Path, topic_dir: Path) -> None:
    with read_only_file_system(tmp_path / "ro", holding=topic_dir) as logs:
        # Was "ro/logs/.seglog.lock: Read-only file system".
        refused(
            run_script("topics", "create", "z", "-d", str(logs)),
            1,
            f"log directory {logs} is on a read-only file system: the commands that read "
            "(consume, topics list|describe) work",
        )
        missing = logs.parent / "new"
        refused(
            run_script("produce", "t", "-d", str(logs), stdin=b"x\n"),
            1,
            f"log directory {logs} is on a read-only file system: the commands that read "
            "(consume, topics list|describe) work",
        )
        refused(
            run_script("topics", "create", "z", "-d", str(missing)),
            1,
            f"log directory {missing} is on a read-only file system",
        )
        listed = run_script("topics", "list", "-d", str(logs))
        assert (listed.code, listed.out) == (0, b"t\n")

"""``seglogfs groups`` and ``seglogfs consume -g / -K`` without a daemon: Kafka's
columns and rules, a real broker's groups, commits at every kind of end, and a crash
between output and commit that repeats records and never skips one."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from storage import LogManager, OffsetStore
from tests.cli.conftest import SCRIPT, Cli, refused, run_script

KAFKA_LOGS = Path(__file__).parents[1] / "storage" / "group" / "kafka-logs"
HEADER = (
    "GROUP           TOPIC           PARTITION  CURRENT-OFFSET  LOG-END-OFFSET  LAG      "
    "       CONSUMER-ID     HOST            CLIENT-ID"
)


@pytest.fixture
def topic(cli: Cli) -> None:
    assert cli("topics", "create", "t", "--partitions", "2", "--key-separator", ":").code == 0
    zero = b"".join(b"k%d:v%d\n" % (i % 3, i) for i in range(6))
    assert cli("produce", "t", "-p", "0", stdin=zero).code == 0
    one = b"".join(b"k%d:v%d\n" % (i % 3, i) for i in range(6, 10))
    assert cli("produce", "t", "-p", "1", stdin=one).code == 0


def test_describe_a_real_brokers_groups(tmp_path: Path) -> None:
    copy = tmp_path / "kafka-logs"
    shutil.copytree(KAFKA_LOGS, copy)
    listed = run_script("groups", "list", "-d", str(copy))
    assert listed.text == "console-consumer-61334\nuser_activity_group\n"
    described = run_script("groups", "describe", "-d", str(copy), "--group", "user_activity_group")
    assert described.code == 0, described.err
    lines = described.text.split("\n")
    assert lines[0] == ""
    assert lines[1].split() == [
        "GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG",
        "CONSUMER-ID", "HOST", "CLIENT-ID",
    ]  # fmt: skip
    assert lines[2].split() == [
        "user_activity_group", "user_activity", "0", "21", "21", "0",
        "rdkafka-ac86302d-be6d-4ec6-b20a-14bee817a2d6", "/127.0.0.1", "rdkafka",
    ]  # fmt: skip
    assert "members as a Kafka broker last recorded them" in described.err
    # A group whose topic is missing from the directory: '-' for what is unknown.
    other = run_script("groups", "describe", "-d", str(copy), "--group", "console-consumer-61334")
    assert other.text.split("\n")[2].split()[3:6] == ["-", "21", "-"]


def test_describe_columns_and_errors(cli: Cli, topic: None) -> None:
    assert cli("consume", "t", "-g", "g", "--reset", "earliest").code == 0
    described = cli("groups", "describe", "--group", "g")
    assert described.text == (
        f"\n{HEADER}\n"
        "g               t               0          6               6               0        "
        "       -               -               -\n"
        "g               t               1          4               4               0        "
        "       -               -               -\n"
    )
    assert "Consumer group 'g' has no active members." in described.err
    assert cli("groups", "describe", "--all-groups").text == described.text
    refused(cli("groups", "describe", "--group", "nope"), 1, "consumer group 'nope' does not exist")
    refused(cli("groups", "describe"), 2, "give --group GROUP (repeatable) or --all-groups")
    assert cli("groups", "list").text == "g\n"


def test_consume_resumes_where_the_group_committed(cli: Cli, topic: None) -> None:
    first = cli("consume", "t", "-g", "g", "--reset", "earliest", "-c", "4")
    assert first.code == 0, first.err
    assert len(first.out.splitlines()) == 4
    rest = cli("consume", "t", "-g", "g")
    assert sorted(first.out.splitlines() + rest.out.splitlines()) == sorted(
        cli("consume", "t").out.splitlines()
    )
    assert cli("consume", "t", "-g", "g").out == b""
    assert cli("produce", "t", "-p", "1", stdin=b"k:new\n").code == 0
    assert cli("consume", "t", "-g", "g").out == b"k:new\n"
    # Without a committed offset: latest by default, as Kafka.
    assert cli("consume", "t", "-g", "fresh").out == b""
    refused(
        cli("consume", "t", "-g", "other", "--reset", "none"),
        1,
        "consumer group 'other' has no committed offset for partition t-0 and the reset "
        "rule is none",
    )
    refused(cli("consume", "t", "-g", "g", "-o", "5"), 2, "-o and -g: a group starts at "
            "its committed offsets (--reset says where when it has none)")  # fmt: skip
    refused(cli("consume", "t", "-g", ""), 2, "the group id must not be empty")


def test_key_delimiter_prints_as_kcat(cli: Cli, topic: None) -> None:
    out = cli("consume", "t", "-p", "0", "-K", " => ").out.splitlines()
    assert out[0] == b"k0 => v0"
    assert cli("produce", "t", "-p", "1", stdin=b"no key\n").code == 0
    assert cli("consume", "t", "-p", "1", "-o", "-1", "-K", "|").out == b"|no key\n"
    refused(cli("consume", "t", "-K", ":", "--format", "json"), 2,
            "-K prints key and value as text: not with --format json")  # fmt: skip


def test_reset_offsets_every_rule(cli: Cli, topic: None, log_dir: Path) -> None:
    assert cli("consume", "t", "-g", "g", "--reset", "earliest", "-p", "0", "-c", "3").code == 0

    def reset(*how: str) -> str:
        result = cli("groups", "reset-offsets", "--group", "g", "--topic", "t:0", *how, "--execute")
        assert result.code == 0, result.err
        return result.text.split("\n")[2].split()[3]

    assert reset("--to-latest") == "6"
    assert reset("--to-earliest") == "0"
    assert reset("--to-offset", "4") == "4"
    assert reset("--shift-by", "-3") == "1"
    assert reset("--shift-by", "100") == "6"  # kept within the log, with Kafka's warning
    assert reset("--to-current") == "6"
    assert reset("--to-datetime", "2000-01-01T00:00:00") == "0"
    assert reset("--to-datetime", "2100-01-01T00:00:00.000Z") == "6"
    assert reset("--by-duration", "P1DT2H") == "0"
    assert reset("--by-duration", "PT0S") == "6"
    dry = cli("groups", "reset-offsets", "--group", "g", "--all-topics", "--to-earliest")
    assert dry.text == (
        "\nGROUP           TOPIC           PARTITION  NEW-OFFSET\n"
        "g               t               0          0\n"
        "g               t               1          0\n"
    )
    assert "No action will be performed" in dry.err
    assert cli("groups", "describe", "--group", "g").text.split("\n")[2].split()[3] == "6"
    both = cli("groups", "reset-offsets", "--group", "g", "--topic", "t", "--to-earliest",
               "--dry-run", "--execute")  # fmt: skip
    assert both.code == 2
    refused(
        cli("groups", "reset-offsets", "--group", "g", "--topic", "t:x", "--to-earliest"),
        2,
        "invalid partition 'x' specified in topic arg 't:x'",
    )
    refused(
        cli("groups", "reset-offsets", "--group", "new", "--topic", "t", "--shift-by", "1"),
        2,
        "cannot shift offset for partition t-0 since there is no current committed offset",
    )
    refused(cli("groups", "reset-offsets", "--group", "g", "--topic", "t", "--by-duration",
                "1 day"), 2, "bad duration '1 day': use ISO 8601, e.g. P1DT2H30M")  # fmt: skip
    # A group that does not exist yet is created by an executed reset, as Kafka's tool.
    assert cli("groups", "reset-offsets", "--group", "new", "--topic", "t", "--to-earliest",
               "--execute").code == 0  # fmt: skip
    assert cli("groups", "list").text == "g\nnew\n"


def test_delete_groups(cli: Cli, topic: None) -> None:
    assert cli("consume", "t", "-g", "g", "--reset", "earliest").code == 0
    deleted = cli("groups", "delete", "--group", "g")
    assert deleted.text == "Deletion of requested consumer groups ('g') was successful.\n"
    assert cli("groups", "list").text == ""
    failed = cli("groups", "delete", "--group", "g")
    assert failed.code == 1
    assert (
        "* Group 'g' could not be deleted due to: consumer group 'g' does not exist" in failed.err
    )


def _consume_group(log_dir: Path, *args: str) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k != "SEGLOG_LOG_DIR"}
    return subprocess.Popen(
        [str(SCRIPT), "consume", "-d", str(log_dir), "t", "-g", "g", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )


def _committed(log_dir: Path) -> dict[int, int]:
    with LogManager.open(log_dir, read_only=True) as manager:
        return {p: v.offset for (_t, p), v in OffsetStore(manager).committed("g").items()}


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_commits_what_was_written(
    cli: Cli, topic: None, log_dir: Path, signum: int
) -> None:
    consumer = _consume_group(log_dir, "--reset", "earliest", "-f")
    assert consumer.stdout is not None
    out = os.read(consumer.stdout.fileno(), 1 << 16)  # it is running and has written
    assert out
    time.sleep(0.5)
    consumer.send_signal(signum)
    rest, err = consumer.communicate(timeout=30)
    assert consumer.returncode == (143 if signum == signal.SIGTERM else 130), err
    assert len((out + rest).splitlines()) == 10
    assert _committed(log_dir) == {0: 6, 1: 4}


def _slow_reader(consumer: subprocess.Popen[bytes], into: list[bytes]) -> threading.Thread:
    """Read ``consumer``'s stdout to its end, about 1 MB/s (so a run lasts seconds)."""

    def read() -> None:
        assert consumer.stdout is not None
        while chunk := os.read(consumer.stdout.fileno(), 1024):
            into.append(chunk)
            time.sleep(0.001)

    thread = threading.Thread(target=read)
    thread.start()
    return thread


def test_a_crash_between_output_and_commit_repeats_and_never_skips(cli: Cli, log_dir: Path) -> None:
    assert cli("topics", "create", "t", "--partitions", "1").code == 0
    lines = b"".join(b"line %d\n" % i for i in range(200_000))
    assert cli("produce", "t", stdin=lines).code == 0
    seen: list[bytes] = []
    last: dict[int, int] = {}
    for _ in range(2):
        consumer = _consume_group(log_dir, "--reset", "earliest")
        chunks: list[bytes] = []
        reader = _slow_reader(consumer, chunks)
        deadline = time.monotonic() + 60
        while _committed(log_dir) == last and consumer.poll() is None:
            assert time.monotonic() < deadline
            time.sleep(0.1)  # until it committed, and went on writing after it
        last = _committed(log_dir)
        consumer.kill()  # SIGKILL: no last commit
        reader.join()
        consumer.communicate()
        output = b"".join(chunks)
        seen.extend(output[: output.rfind(b"\n") + 1].splitlines())  # whole lines only
    rest = run_script("consume", "-d", str(log_dir), "t", "-g", "g")
    assert rest.code == 0, rest.err
    seen.extend(rest.out.splitlines())
    # Every record was written at least once; those after the last commit twice.
    assert set(seen) == set(lines.splitlines())
    assert len(seen) >= 200_000
    assert _committed(log_dir) == {0: 200_000}


def test_without_a_daemon_consume_g_holds_the_writer_lock(
    cli: Cli, topic: None, log_dir: Path
) -> None:
    consumer = _consume_group(log_dir, "--reset", "earliest", "-f")
    try:
        assert consumer.stdout is not None
        os.read(consumer.stdout.fileno(), 6)
        reset = run_script("groups", "reset-offsets", "-d", str(log_dir), "--group", "g",
                           "--all-topics", "--to-earliest", "--execute")  # fmt: skip
        assert reset.code == 1
        assert "is locked by another writer process" in reset.err
    finally:
        consumer.terminate()
        consumer.communicate(timeout=30)

"""``seglogfs compact``: a forced cleaning pass until clean, with and without a daemon, its
summary and exit codes; and the rule that a compacted ``lines`` topic needs a
``key.separator`` (``topics create|alter``)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from seglogfs.positions import position_index_spec
from storage import BrokerConfig, LogManager, Record
from tests.cli.conftest import (
    SCRIPT,
    Cli,
    on_terminal,
    refused,
    run_script,
    strip_build_notice,
    tree,
)
from tests.daemon.conftest import HAVE_FUSE, Mount

KEYS = 7
ROUNDS = 40
SEGMENT_BYTES = "1000"
COMPACTED = {"cleanup.policy": "compact", "segment.bytes": SEGMENT_BYTES}
NEEDS_SEPARATOR = (
    "a lines topic with cleanup.policy compact needs a key.separator: a compacted topic "
    "refuses records without a key, and lines without a separator have none (set "
    "key.separator first, or use format json or raw)"
)
LINE = re.compile(
    r"Compacted (?P<log>\S+)\tpasses: (?P<passes>\d+)\tsegments: (?P<s0>\d+) -> (?P<s1>\d+)\t"
    r"records: (?P<r0>\d+) -> (?P<r1>\d+)\tbytes: (?P<b0>\d+) -> (?P<b1>\d+)"
)
TOTAL = re.compile(
    r"Total: (?P<logs>\d+) log\(s\) compacted\tsegments: (?P<s0>\d+) -> (?P<s1>\d+)\t"
    r"records: (?P<r0>\d+) -> (?P<r1>\d+)\tbytes: (?P<b0>\d+) -> (?P<b1>\d+) "
    r"\((?P<reclaimed>\d+) reclaimed\)"
)


def open_writer(log_dir: Path) -> LogManager:
    """The directory opened for writing as the command line and the daemon open it."""
    return LogManager.open(
        log_dir, BrokerConfig(log_dirs=(str(log_dir),)), extension=position_index_spec
    )


def fill(
    log_dir: Path,
    topic: str = "t",
    config: dict[str, str] | None = None,
    *,
    partitions: int = 1,
    rounds: int = ROUNDS,
) -> None:
    """``topic`` (key separator ``:``): each partition gets ``rounds`` batches, each
    holding one record of every one of ``KEYS`` keys (values ``round-key``)."""
    with open_writer(log_dir) as manager:
        manager.create_topic(
            topic, partitions, COMPACTED if config is None else config, key_separator=":"
        )
        for p in range(partitions):
            log = manager.log(topic, p)
            for r in range(rounds):
                log.append(
                    [b"%d-%d" % (r, k) for k in range(KEYS)],
                    keys=[b"k%d" % k for k in range(KEYS)],
                )
            assert log.number_of_segments > 3


class State:
    """A partition's records and files, read as a reader process reads them."""

    def __init__(self, log_dir: Path, topic: str = "t", partition: int = 0) -> None:
        with LogManager.open(log_dir, read_only=True) as reader:
            log = reader.log(topic, partition)
            self.records: list[Record] = list(log.records(log.log_start_offset))
            self.segments = log.number_of_segments
            self.size = log.size
            self.active_base = log.active_segment.base_offset
            self.end = log.log_end_offset

    def below_active(self) -> list[Record]:
        return [r for r in self.records if r.offset < self.active_base]

    def latest(self) -> dict[bytes | None, bytes | None]:
        return {r.key: r.value for r in self.records}

    def rendered(self) -> bytes:
        return b"".join(b"%s:%s\n" % (r.key, r.value) for r in self.records)


def check_compacted(before: State, after: State) -> None:
    """What Kafka's cleaner leaves: offsets kept, the latest record of every key kept,
    one record per key below the active segment, the active segment untouched."""
    assert after.end == before.end
    offsets = [r.offset for r in after.records]
    assert offsets == sorted(offsets)
    assert set(offsets) <= {r.offset for r in before.records}
    assert after.latest() == before.latest()
    cleaned = after.below_active()
    last_of_key = {r.key: r.offset for r in before.below_active()}
    assert sorted(r.offset for r in cleaned) == sorted(last_of_key.values())
    assert [r for r in after.records if r.offset >= before.active_base] == [
        r for r in before.records if r.offset >= before.active_base
    ]


def parse(out: str) -> tuple[dict[str, dict[str, int]], dict[str, int]]:
    """The per-log lines and the total line of a summary."""
    lines = out.splitlines()
    per_log = {}
    for line in lines[:-1]:
        match = LINE.fullmatch(line)
        assert match, line
        per_log[match["log"]] = {k: int(v) for k, v in match.groupdict().items() if k != "log"}
    total = TOTAL.fullmatch(lines[-1])
    assert total, lines[-1]
    return per_log, {k: int(v) for k, v in total.groupdict().items()}


def test_compacts_to_the_latest_record_of_each_key(cli: Cli, log_dir: Path) -> None:
    fill(log_dir)
    before = State(log_dir)
    result = cli("compact", "t")
    assert (result.code, result.err) == (0, "")
    after = State(log_dir)
    check_compacted(before, after)
    per_log, total = parse(result.text)
    assert per_log == {
        "t-0": {
            "passes": per_log["t-0"]["passes"],
            "s0": before.segments,
            "s1": after.segments,
            "r0": len(before.below_active()),
            "r1": len(after.below_active()),
            "b0": before.size,
            "b1": after.size,
        }
    }
    assert len(after.below_active()) == KEYS
    assert after.size < before.size / 4
    assert total == {
        "logs": 1,
        "s0": before.segments,
        "s1": after.segments,
        "r0": len(before.below_active()),
        "r1": KEYS,
        "b0": before.size,
        "b1": after.size,
        "reclaimed": before.size - after.size,
    }
    # Readers see the compacted records, rendered as the topic renders them; Kafka's
    # dump tool shows the same offsets, with the gaps the pass left.
    assert cli("consume", "t").out == after.rendered()
    logs = sorted(str(path) for path in (log_dir / "t-0").glob("*.log"))
    dumped = cli("dump", "--deep-iteration", *logs).out.decode()
    assert [int(o) for o in re.findall(r"^\| offset: (\d+)", dumped, re.M)] == [
        r.offset for r in after.records
    ]


def test_a_second_run_has_nothing_to_do(cli: Cli, log_dir: Path) -> None:
    fill(log_dir)
    assert cli("compact").code == 0
    compacted = State(log_dir)
    again = cli("compact", "t")
    assert (again.code, again.err) == (0, "")
    assert again.text == (
        "Total: 0 log(s) compacted\tsegments: 0 -> 0\trecords: 0 -> 0\tbytes: 0 -> 0 "
        "(0 reclaimed)\n"
    )
    assert State(log_dir).records == compacted.records


def test_without_topics_every_compacted_topic_is_compacted(cli: Cli, log_dir: Path) -> None:
    fill(log_dir, "a", partitions=2)
    fill(log_dir, "b", {**COMPACTED, "cleanup.policy": "compact,delete"})
    fill(log_dir, "c", {"segment.bytes": SEGMENT_BYTES})
    plain = State(log_dir, "c")
    result = cli("compact")
    assert (result.code, result.err) == (0, "")
    per_log, total = parse(result.text)
    assert sorted(per_log) == ["a-0", "a-1", "b-0"]
    assert total["logs"] == 3
    for topic, partition in (("a", 0), ("a", 1), ("b", 0)):
        assert len(State(log_dir, topic, partition).below_active()) == KEYS
    assert State(log_dir, "c").records == plain.records  # cleanup.policy=delete


def test_an_unknown_topic_compacts_nothing(cli: Cli, log_dir: Path) -> None:
    fill(log_dir)
    before = State(log_dir)
    refused(cli("compact", "t", "nope"), 1, "topic 'nope' does not exist")
    assert State(log_dir).records == before.records


def test_a_topic_without_compact_is_named_the_others_compacted(cli: Cli, log_dir: Path) -> None:
    fill(log_dir, "d", {"segment.bytes": SEGMENT_BYTES}, partitions=2)
    fill(log_dir)
    plain = State(log_dir, "d", 1)
    result = cli("compact", "d", "t")
    assert result.code == 1
    assert result.err == (
        "seglogfs compact: error: topic 'd' not compacted: its cleanup.policy has no compact\n"
    )
    per_log, _total = parse(result.text)
    assert list(per_log) == ["t-0"]
    assert State(log_dir, "d", 1).records == plain.records


def test_a_missing_log_directory_is_an_error(cli: Cli, tmp_path: Path) -> None:
    result = cli("compact", "-d", str(tmp_path / "nothing"))
    assert result.code == 1
    assert result.err.startswith("seglogfs compact: error: ")
    assert not (tmp_path / "nothing").exists()


def test_a_compacted_directory_verifies_clean(cli: Cli, log_dir: Path) -> None:
    fill(log_dir)
    assert cli("compact").code == 0
    verified = cli("verify")
    assert (verified.code, verified.out) == (0, b""), verified.err


def test_progress_only_on_a_terminal(log_dir: Path) -> None:
    fill(log_dir)
    env = {**os.environ, "SEGLOG_LOG_DIR": str(log_dir)}
    code, out, shown = on_terminal(log_dir, "compact")
    assert code == 0, shown
    assert b"compact: 100%" in shown
    assert out.startswith(b"Compacted t-0\t")
    # Not a terminal: no bar.
    piped = subprocess.run(
        [str(SCRIPT), "compact"], capture_output=True, env=env, timeout=120, check=False
    )
    assert (piped.returncode, strip_build_notice(piped.stderr)) == (0, b"")
    assert piped.stdout.startswith(b"Total: 0 log(s) compacted")


# -- a compacted lines topic needs a key separator ---------------------------------------


@pytest.mark.parametrize("policy", ["compact", "compact,delete", "delete,compact"])
def test_a_compacted_lines_topic_without_separator_is_refused(
    cli: Cli, log_dir: Path, policy: str
) -> None:
    result = cli("topics", "create", "t", "--config", f"cleanup.policy={policy}")
    refused(
        result, 2, f"invalid value {policy!r} for configuration cleanup.policy: " + NEEDS_SEPARATOR
    )
    assert tree(log_dir) == set()  # nothing was made, not even the metadata file
    for fmt in ("--format=json", "--format=raw", "--key-separator=:"):
        name = fmt.split("=")[1].replace(":", "keyed")
        made = cli("topics", "create", name, "--config", f"cleanup.policy={policy}", fmt)
        assert (made.code, made.err) == (0, ""), made.err
    assert cli("topics", "list").text.split() == ["json", "keyed", "raw"]


def test_altering_a_lines_topic_to_compact_needs_a_separator(cli: Cli, log_dir: Path) -> None:
    assert cli("topics", "create", "t").code == 0
    refused(
        cli("topics", "alter", "t", "--add-config", "cleanup.policy=compact"),
        2,
        "invalid value 'compact' for configuration cleanup.policy: " + NEEDS_SEPARATOR,
    )
    assert "Configs: \n" in cli("topics", "describe", "t").text  # unchanged
    assert cli("topics", "create", "k", "--key-separator", ":").code == 0
    altered = cli("topics", "alter", "k", "--add-config", "cleanup.policy=compact")
    assert (altered.code, altered.err) == (0, "")
    # A topic compacted already (a Kafka client made it) keeps taking other settings.
    with open_writer(log_dir) as manager:
        manager.create_topic("kafka", 1, {"cleanup.policy": "compact"})
    other = cli("topics", "alter", "kafka", "--add-config", "retention.ms=1000")
    assert (other.code, other.err) == (0, "")


def test_a_broker_default_of_compact_needs_a_separator_too(
    cli: Cli, log_dir: Path, tmp_path: Path
) -> None:
    properties = tmp_path / "server.properties"
    properties.write_text("log.cleanup.policy=compact\n")
    broker = ("--broker-config", str(properties))
    refused(
        cli("topics", "create", "t", *broker),
        2,
        "invalid value 'compact' for configuration cleanup.policy: " + NEEDS_SEPARATOR,
    )
    made = cli("topics", "create", "d", "--config", "cleanup.policy=delete", *broker)
    assert (made.code, made.err) == (0, "")
    # Removing the override would make it compacted by the broker's default.
    refused(
        cli("topics", "alter", "d", "--delete-config", "cleanup.policy", *broker),
        2,
        "invalid value 'compact' for configuration cleanup.policy: " + NEEDS_SEPARATOR,
    )
    assert "Configs: cleanup.policy=delete\n" in cli("topics", "describe", "d").text


# -- through a running daemon ------------------------------------------------------------


@pytest.fixture
def daemon(log_dir: Path, tmp_path: Path) -> Mount:
    """A mount of ``log_dir`` whose background cleaner is off (the passes seen are the
    command's); always unmounted."""
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    config = tmp_path / "server.properties"
    config.write_text("log.cleaner.enable=false\n")
    mount = Mount(log_dir, mountpoint, ["--config", str(config)], tmp_path / "daemon.log")
    return mount


@pytest.mark.skipif(not HAVE_FUSE, reason="/dev/fuse is missing")
def test_through_a_running_daemon(log_dir: Path, daemon: Mount) -> None:
    fill(log_dir)
    fill(log_dir, "d", {"segment.bytes": SEGMENT_BYTES})
    before = State(log_dir)
    env = {"SEGLOG_LOG_DIR": str(log_dir)}
    try:
        daemon.start()
        partition = daemon.mountpoint / "t" / "0"
        assert partition.read_bytes() == before.rendered()
        # The daemon holds the writer lock: this can only succeed through its socket.
        result = run_script("compact", "t", env=env)
        assert (result.code, result.err) == (0, ""), daemon.log()
        after = State(log_dir)
        check_compacted(before, after)
        per_log, total = parse(result.text)
        assert per_log["t-0"]["b0"] == before.size
        assert per_log["t-0"]["b1"] == after.size
        assert per_log["t-0"]["r1"] == KEYS
        assert total["reclaimed"] == before.size - after.size
        # A fresh read through the mount shows the compacted records.
        assert partition.read_bytes() == after.rendered()
        # Errors come back as without a daemon.
        refused(run_script("compact", "nope", env=env), 1, "topic 'nope' does not exist")
        skipped = run_script("compact", "d", env=env)
        assert (skipped.code, skipped.err) == (
            1,
            "seglogfs compact: error: topic 'd' not compacted: its cleanup.policy has no compact\n",
        )
        refused(
            run_script("topics", "create", "x", "--config", "cleanup.policy=compact", env=env),
            2,
            "invalid value 'compact' for configuration cleanup.policy: " + NEEDS_SEPARATOR,
        )
        assert "x" not in os.listdir(daemon.mountpoint)
        # On a terminal, the time the daemon took.
        code, out, shown = on_terminal(log_dir, "compact")
        assert (code, out) == (0, b"Total: 0 log(s) compacted\tsegments: 0 -> 0\trecords: "
                               b"0 -> 0\tbytes: 0 -> 0 (0 reclaimed)\n"), shown  # fmt: skip
        assert b"compact (through the daemon): 00:0" in shown
        # ``st_size`` is what a fresh read returns (tar, cp, wc -c rely on it).
        assert os.stat(partition).st_size == len(after.rendered())
        assert daemon.stop() == 0
    finally:
        daemon.cleanup()
    assert "Traceback" not in daemon.log()
    assert State(log_dir).records == after.records  # as the daemon left it, after a reopen

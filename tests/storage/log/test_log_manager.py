"""The log directory: topics, config, checkpoints, clean shutdown, the writer lock."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from storage import (
    BrokerConfig,
    ConfigError,
    ExtensionIndexSpec,
    InvalidTopicError,
    LogConfig,
    LogDirLockedError,
    LogManager,
    ReadOnlyLogError,
    RecordBatch,
    TopicExistsError,
    TopicMetadata,
    TopicNotEmptyError,
    UnknownTopicError,
)
from storage.log.checkpoint import read_offset_checkpoint
from tests.conftest import ManualClock

ROOT = Path(__file__).resolve().parents[3]


def test_create_list_describe_delete(log_dir: Path, clock: ManualClock) -> None:
    with LogManager.open(log_dir, clock=clock) as manager:
        manager.create_topic("orders", 3, {"retention.ms": "1000"})
        manager.create_topic("raw.events", format="raw")
        assert manager.topics() == ["orders", "raw.events"]
        assert sorted(p.name for p in log_dir.iterdir() if p.is_dir()) == [
            "orders-0", "orders-1", "orders-2", "raw.events-0",
        ]  # fmt: skip
        manager.log("orders", 1).append([b"a", b"b"])
        description = manager.describe_topic("orders")
        assert description.config.retention_ms == 1000
        assert description.metadata.partitions == 3
        p1 = description.partitions[1]
        assert (p1.log_end_offset, p1.segment_count, p1.first_timestamp) == (2, 1, clock.now_ms)
        assert manager.topic("raw.events").format == "raw"
        manager.delete_topic("orders")
        assert manager.topics() == ["raw.events"]
        assert not [p for p in log_dir.iterdir() if p.name.startswith("orders")]
        with pytest.raises(UnknownTopicError):
            manager.log("orders", 0)


def test_topic_rules_and_errors(log_dir: Path, clock: ManualClock) -> None:
    with LogManager.open(log_dir, clock=clock) as manager:
        for bad in ["", ".", "..", "a/b", "x" * 250, "spaces here", "é"]:
            with pytest.raises(InvalidTopicError):
                manager.create_topic(bad)
        manager.create_topic("x" * 249)
        manager.create_topic("a.b")
        with pytest.raises(TopicExistsError):
            manager.create_topic("a.b")
        with pytest.raises(InvalidTopicError, match="collides"):
            manager.create_topic("a_b")
        with pytest.raises(ConfigError) as info:
            manager.create_topic("c", config={"retention.mss": "1"})
        assert info.value.key == "retention.mss"
        with pytest.raises(ConfigError):
            manager.create_topic("c", config={"segment.bytes": "1"})
        with pytest.raises(ConfigError):
            manager.create_topic("c", 0)
        assert "c" not in manager.topics()
        with pytest.raises(UnknownTopicError, match=r"partition a\.b-5"):
            manager.log("a.b", 5)


def test_alter_config_applies_and_persists(log_dir: Path, clock: ManualClock) -> None:
    with LogManager.open(log_dir, clock=clock) as manager:
        manager.create_topic("t", 2)
        config = manager.alter_topic_config("t", {"retention.bytes": "100", "segment.ms": "60000"})
        assert config.retention_bytes == 100
        assert manager.log("t", 1).config.segment_ms == 60000
        with pytest.raises(ConfigError):
            manager.alter_topic_config("t", {"retention.bytes": "lots"})
        assert manager.log("t", 1).config.retention_bytes == 100
        manager.alter_topic_config("t", delete_configs=["segment.ms"])
    stored = json.loads((log_dir / "seglog-topics.json").read_text())
    assert stored["topics"]["t"]["config"] == {"retention.bytes": "100"}
    with LogManager.open(log_dir, clock=clock) as manager:
        assert manager.topic_config("t").retention_bytes == 100
        assert manager.topic_config("t").segment_ms == LogConfig().segment_ms


def test_broker_defaults_apply_to_topics(log_dir: Path, clock: ManualClock) -> None:
    broker = BrokerConfig.from_properties(
        {"log.dirs": str(log_dir), "num.partitions": "4", "log.retention.hours": "1"}
    )
    with LogManager.open(log_dir, broker, clock=clock) as manager:
        manager.create_topic("t")
        assert manager.topic("t").partitions == 4
        assert manager.topic_config("t").retention_ms == 3_600_000


def test_clean_shutdown_marker_and_checkpoints(log_dir: Path, clock: ManualClock) -> None:
    manager = LogManager.open(log_dir, clock=clock)
    assert not (log_dir / ".kafka_cleanshutdown").exists()
    manager.create_topic("t", 2)
    manager.log("t", 0).append([b"x"] * 5)
    manager.close()
    assert (log_dir / ".kafka_cleanshutdown").exists()
    assert read_offset_checkpoint(log_dir / "recovery-point-offset-checkpoint") == {
        ("t", 0): 5, ("t", 1): 0,
    }  # fmt: skip
    assert read_offset_checkpoint(log_dir / "log-start-offset-checkpoint") == {
        ("t", 0): 0, ("t", 1): 0,
    }  # fmt: skip
    manager = LogManager.open(log_dir, clock=clock)
    assert not (log_dir / ".kafka_cleanshutdown").exists()
    assert manager.log("t", 0).log_end_offset == 5
    manager.close()


def test_retention_checkpoints_log_start(log_dir: Path, clock: ManualClock) -> None:
    with LogManager.open(log_dir, clock=clock) as manager:
        manager.create_topic(
            "t", 1, {"segment.bytes": "300", "retention.ms": "100", "file.delete.delay.ms": "0"}
        )
        log = manager.log("t", 0)
        for i in range(20):
            log.append([b"%03d" % i * 10])
        clock.advance(101)
        assert manager.run_retention() > 0
        start = log.log_start_offset
        assert start > 0
        assert read_offset_checkpoint(log_dir / "log-start-offset-checkpoint")[("t", 0)] == start
    with LogManager.open(log_dir, clock=clock) as manager:
        assert manager.log("t", 0).log_start_offset == start


def test_second_writer_is_locked_out(log_dir: Path, clock: ManualClock) -> None:
    with LogManager.open(log_dir, clock=clock):
        with pytest.raises(LogDirLockedError):
            LogManager.open(log_dir, clock=clock)
        code = (
            "import sys; from storage import LogManager, LogDirLockedError\n"
            "try:\n    LogManager.open(sys.argv[1])\nexcept LogDirLockedError:\n    sys.exit(3)\n"
        )
        result = subprocess.run(
            [sys.executable, "-c", code, str(log_dir)], cwd=ROOT, check=False, timeout=60
        )
        assert result.returncode == 3
        reader = LogManager.open(log_dir, read_only=True)
        reader.close()
    LogManager.open(log_dir, clock=clock).close()


def test_read_only_manager_refuses_changes(log_dir: Path, clock: ManualClock) -> None:
    with LogManager.open(log_dir, clock=clock) as manager:
        manager.create_topic("t")
    before = sorted(os.listdir(log_dir))
    with LogManager.open(log_dir, read_only=True) as reader:
        for call in (
            lambda: reader.create_topic("u"),
            lambda: reader.delete_topic("t"),
            lambda: reader.alter_topic_config("t", {"retention.ms": "1"}),
            lambda: reader.log("t", 0).append([b"x"]),
        ):
            with pytest.raises(ReadOnlyLogError):
                call()
    assert sorted(os.listdir(log_dir)) == before


def _open_files_under(directory: Path) -> set[str]:
    """Names of the files below ``directory`` this process holds open or mapped."""
    names = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # the listing's own descriptor
        if target.startswith(f"{directory}/"):
            names.add(os.path.relpath(target, directory))
    return names


def test_a_reader_opens_a_partitions_log_on_first_use(log_dir: Path, clock: ManualClock) -> None:
    # A reader of one topic must not map every segment of the directory (the command
    # line and Spark open read-only managers per command and per plan).
    with LogManager.open(log_dir, clock=clock) as manager:
        manager.create_topic("a", 2, {"segment.bytes": "200"})
        manager.create_topic("b", 1, {"segment.bytes": "200"})
        for tp in (("a", 0), ("a", 1), ("b", 0)):
            for i in range(20):
                manager.log(*tp).append([b"%s %d" % (tp[0].encode(), i)])
        manager.log("a", 0).advance_log_start_offset(5)  # DeleteRecords, inside a segment
    with LogManager.open(log_dir, read_only=True, clock=clock) as reader:
        assert _open_files_under(log_dir) == set()
        log = reader.log("a", 0)
        assert log.log_start_offset == 5  # the checkpoint, read when the log opened
        assert [r.value for r in log.records(5)][:2] == [b"a 5", b"a 6"]
        assert {name.split("/")[0] for name in _open_files_under(log_dir)} == {"a-0"}
        assert [p.partition for p in reader.describe_topic("a").partitions] == [0, 1]
        assert {f"{log.topic}-{log.partition}" for log in reader.logs()} == {"a-0", "a-1", "b-0"}
        with pytest.raises(UnknownTopicError):
            reader.log("a", 2)
    assert _open_files_under(log_dir) == set()


def test_a_reader_finds_partitions_created_after_it_after_refresh(
    log_dir: Path, clock: ManualClock
) -> None:
    with LogManager.open(log_dir, clock=clock) as manager:
        manager.create_topic("a")
        with LogManager.open(log_dir, read_only=True, clock=clock) as reader:
            manager.create_topic("b")
            manager.log("b", 0).append([b"new"])
            with pytest.raises(UnknownTopicError):
                reader.log("b", 0)
            reader.refresh()
            assert [r.value for r in reader.log("b", 0).records(0)] == [b"new"]


def test_kafka_broker_directory_is_tolerated(log_dir: Path, clock: ManualClock) -> None:
    """Files a Kafka broker leaves beside its logs do not disturb opening."""
    with LogManager.open(log_dir, clock=clock) as manager:
        manager.create_topic("orders", 2)
        manager.log("orders", 0).append([b"a"])
    (log_dir / "seglog-topics.json").unlink()
    (log_dir / "meta.properties").write_text("version=1\nnode.id=1\n")
    (log_dir / "replication-offset-checkpoint").write_text("0\n0\n")
    (log_dir / "orders-0" / "leader-epoch-checkpoint").write_text("0\n1\n0 0\n")
    (log_dir / "orders-0" / "partition.metadata").write_text("version: 0\ntopic_id: x\n")
    (log_dir / "orders-0" / "00000000000000000001.snapshot").write_bytes(b"\0" * 20)
    for name in (
        "__consumer_offsets-0",
        "__cluster_metadata-0",
        "orders-1.0123456789abcdef0123456789abcdef-delete",
        "not a topic-0",
    ):
        (log_dir / name).mkdir()
    (log_dir / "__cluster_metadata-0" / "00000000000000000000-0000000000.checkpoint").write_bytes(
        b"x"
    )
    with LogManager.open(log_dir, read_only=True) as reader:
        assert reader.topics() == ["__consumer_offsets", "orders"]
        assert [r.value for r in reader.log("orders", 0).records(0)] == [b"a"]
    with LogManager.open(log_dir, clock=clock) as manager:
        assert manager.topics() == ["__consumer_offsets", "orders"]
        assert not (log_dir / "orders-1.0123456789abcdef0123456789abcdef-delete").exists()
        assert (log_dir / "orders-0" / "leader-epoch-checkpoint").exists()


def test_maintenance_says_when_it_is_due(log_dir: Path, clock: ManualClock) -> None:
    broker = BrokerConfig(log_dirs=(str(log_dir),), log_retention_check_interval_ms=300_000)
    with LogManager.open(log_dir, broker, clock=clock) as manager:
        manager.create_topic("t", 1, {"segment.ms": "60000", "flush.ms": "5000"})
        now = clock.now_ms
        assert manager.next_maintenance_due_ms() == now + 300_000  # nothing but the check
        manager.log("t", 0).append([b"x"])
        assert manager.next_maintenance_due_ms() == now + 5000  # flush.ms
        clock.advance(5000)
        assert manager.flush_due_logs() == 1
        assert manager.flush_due_logs() == 0
        assert manager.next_maintenance_due_ms() == now + 60_001  # the roll by segment.ms
        clock.advance(55_001)
        assert manager.roll_due_segments() == 1
        assert manager.log("t", 0).number_of_segments == 2


def test_maintenance_skips_a_log_closed_under_it(log_dir: Path, clock: ManualClock) -> None:
    with LogManager.open(log_dir, clock=clock) as manager:
        manager.create_topic("t", 1, {"segment.ms": "1", "retention.ms": "1"})
        log = manager.log("t", 0)
        log.append([b"x"])
        clock.advance(10)
        logs = manager.logs()
        manager.delete_topic("t")  # a maintenance pass may still hold the old list
        assert all(old.closed for old in logs)
        assert sum(old.delete_old_segments() for old in logs) == 0
        assert not any(old.roll_if_due() for old in logs)
        for old in logs:
            old.flush()


def test_rendering_changes_only_before_the_first_record(log_dir: Path, clock: ManualClock) -> None:
    def spec_for(metadata: TopicMetadata) -> ExtensionIndexSpec:
        # Units that depend on the rendering, so a stale spec would show.
        per_record = 1 if metadata.format == "lines" else 0

        def measure(batch: RecordBatch) -> int:
            return sum(len(r.value or b"") + per_record for r in batch.records())

        return ExtensionIndexSpec(".units", 64, measure)

    with LogManager.open(log_dir, clock=clock, extension=spec_for) as manager:
        manager.create_topic("t", 2)
        changed = manager.set_topic_rendering("t", "raw", None)
        assert (changed.format, changed.key_separator) == ("raw", None)
        manager.log("t", 0).append([b"abc"])
        assert manager.log("t", 0).extension_end == 3  # raw: no newline counted
        with pytest.raises(TopicNotEmptyError):
            manager.set_topic_rendering("t", "lines", None)
        manager.create_topic("u", 1)
        with pytest.raises(ConfigError):
            manager.set_topic_rendering("u", "raw", ":")  # a separator needs lines
        assert manager.topic("u").format == "lines"
    with LogManager.open(log_dir, clock=clock, extension=spec_for) as manager:
        assert manager.topic("t").format == "raw"  # the metadata file was written
        assert manager.log("t", 0).extension_end == 3


def test_reader_follows_a_topic_deleted_and_created_again(
    log_dir: Path, clock: ManualClock
) -> None:
    with LogManager.open(log_dir, clock=clock) as writer:
        writer.create_topic("t", 1)
        writer.create_topic("gone", 1)
        writer.log("t", 0).append([b"old"])
        with LogManager.open(log_dir, read_only=True) as reader:
            assert [r.value for r in reader.log("t", 0).records(0)] == [b"old"]
            writer.delete_topic("t")
            writer.delete_topic("gone")
            writer.create_topic("t", 1)
            writer.log("t", 0).append([b"new"])
            reader.refresh()
            assert [r.value for r in reader.log("t", 0).records(0)] == [b"new"]
            assert reader.topics() == ["t"]
            with pytest.raises(UnknownTopicError):
                reader.log("gone", 0)


# --- Bounded partitions (issue #18, item 1) -------------------------------------------


@contextlib.contextmanager
def open_files_limit(headroom: int) -> Iterator[None]:
    """This process's soft ``RLIMIT_NOFILE`` lowered to ``headroom`` descriptors above
    the highest one open now, until the block ends: code that opens descriptors
    without bound fails fast (``EMFILE``) instead of running for a minute."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    highest = max(int(fd) for fd in os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, highest + headroom), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _state(log_dir: Path) -> tuple[list[str], bytes]:
    return sorted(os.listdir(log_dir)), (log_dir / "seglog-topics.json").read_bytes()


@pytest.mark.parametrize(
    ("partitions", "reason"),
    [
        pytest.param(100_000, "more than max.topic.partitions (1000)", id="100000"),
        pytest.param(1001, "more than max.topic.partitions (1000)", id="1001"),
        pytest.param(10**30, "Not a number of type INT", id="10**30"),
        pytest.param(2**31, "Not a number of type INT", id="2**31"),
        pytest.param("3", "must be a whole number", id="str"),
        pytest.param(True, "must be a whole number", id="bool"),
        pytest.param(0, "must be at least 1", id="0"),
    ],
)
def test_a_partition_count_out_of_bounds_creates_nothing(
    log_dir: Path, clock: ManualClock, partitions: object, reason: str
) -> None:
    """Issue #18 (1): ``--partitions 100000`` opened partitions until "Too many open
    files" (53 s, 5,000 directories left, a directory no command could open again), and
    ``"partitions": 10**30`` on the control socket was written to the topics file. The
    count is now validated before anything is written, against ``max.topic.partitions``
    (and Kafka's INT); the manager, and the directory, keep working."""
    with LogManager.open(log_dir, clock=clock) as manager:
        manager.create_topic("small", 2)
        before = _state(log_dir)
        with open_files_limit(200), pytest.raises(ConfigError) as info:
            manager.create_topic("big", partitions)  # type: ignore[arg-type]
        assert info.value.key == "partitions"
        assert reason in info.value.reason
        assert _state(log_dir) == before
        assert manager.topics() == ["small"]
        manager.log("small", 1).append([b"still served"])
    with LogManager.open(log_dir, clock=clock) as reopened:
        assert reopened.topics() == ["small"]
        assert [r.value for r in reopened.log("small", 1).records(0)] == [b"still served"]


def test_the_directory_maximum_counts_the_partitions_of_every_topic(
    log_dir: Path, clock: ManualClock
) -> None:
    broker = BrokerConfig(log_dirs=(str(log_dir),), max_topic_partitions=4, max_broker_partitions=6)
    with LogManager.open(log_dir, broker, clock=clock) as manager:
        manager.create_topic("a", 4)
        with pytest.raises(ConfigError, match="holds 4 partitions and may hold at most"):
            manager.create_topic("b", 3)
        manager.create_topic("b", 2)
        with pytest.raises(ConfigError, match=r"max\.broker\.partitions \(6\)"):
            manager.create_topic("c")  # num.partitions: 1
        assert sorted(os.listdir(log_dir)).count("c-0") == 0
        manager.delete_topic("a")
        manager.create_topic("c", 4)
        assert manager.topics() == ["b", "c"]
    with LogManager.open(log_dir, broker, clock=clock) as reopened:
        assert reopened.topics() == ["b", "c"]


_EMFILE_DURING_CREATE = """
import errno, os, resource, sys
from storage import LogManager
from storage.log import log_manager

resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))
held = []

def take_every_descriptor():
    # What the daemon's other clients do meanwhile: each descriptor let go is taken.
    while True:
        try:
            held.append(os.open("/dev/null", os.O_RDONLY))
        except OSError as exc:
            assert exc.errno == errno.EMFILE
            return

real_open = log_manager.Log.open

def open_log(*args, **kwargs):
    try:
        return real_open(*args, **kwargs)
    except OSError as exc:
        if exc.errno == errno.EMFILE:
            take_every_descriptor()
        raise

log_manager.Log.open = open_log
with LogManager.open(sys.argv[1]) as manager:
    manager.create_topic("small", 1)
    try:
        manager.create_topic("big", 100)
    except OSError as exc:
        print("create", errno.errorcode[exc.errno])
    print("topics", *manager.topics())
    for fd in held:
        os.close(fd)
    manager.log("small", 0).append([b"after"])
    manager.create_topic("next", 2)
with LogManager.open(sys.argv[1]) as reopened:
    print("reopened", *reopened.topics())
"""


def test_running_out_of_descriptors_in_the_middle_of_a_create_undoes_it(
    log_dir: Path,
) -> None:
    """A create that meets ``EMFILE`` part way (a daemon whose other clients hold the
    rest of its descriptors) undoes itself: it closes the logs it opened before it
    writes the metadata and checkpoints that drop the topic (they need descriptors
    too; the undo used to write first, fail the same way, and leave a topic no process
    under that limit could open). Run under ``RLIMIT_NOFILE=128`` in a subprocess; the
    directory then opens again under the same limit."""
    result = subprocess.run(
        [sys.executable, "-c", _EMFILE_DURING_CREATE, str(log_dir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "create EMFILE",
        "topics small",
        "reopened next small",
    ]
    assert sorted(os.listdir(log_dir)) == [
        ".kafka_cleanshutdown",
        ".seglog.lock",
        "log-start-offset-checkpoint",
        "next-0",
        "next-1",
        "recovery-point-offset-checkpoint",
        "seglog-topics.json",
        "small-0",
    ]


def test_directories_of_a_topic_over_the_maximum_are_left_alone(
    log_dir: Path, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A directory ``t-99999999999`` alone made a topic of 10^11 partitions, whose
    missing directories a writable open created until it ran out of descriptors (and
    ``describe`` counted to 10^11). A topic found only as directories is loaded when
    its count is within ``max.topic.partitions``, else ignored with a warning."""
    for name in ("t-99999999999", "u-2147483647", "v-1000", "w-2"):
        (log_dir / name).mkdir()
    with open_files_limit(200), LogManager.open(log_dir, clock=clock) as manager:
        assert manager.topics() == ["w"]
        assert [p.partition for p in manager.describe_topic("w").partitions] == [0, 1, 2]
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 2  # t-99999999999 is no partition directory at all
    assert "ignoring the directories of topic u" in warnings[0] + warnings[1]
    assert "v-1000" in os.listdir(log_dir)
    broker = BrokerConfig(log_dirs=(str(log_dir),), max_topic_partitions=1001)
    with LogManager.open(log_dir, broker, read_only=True) as reader:
        assert reader.topics() == ["v", "w"]


def test_an_override_of_thousands_of_digits_changes_nothing(
    log_dir: Path, clock: ManualClock
) -> None:
    """What ``setfattr -n user.seglog.retention.ms -v <65,000 ones>`` asks of the
    engine: a ``ConfigError`` (``EINVAL``), not the ``ValueError`` of ``int()`` that
    became ``EIO`` and an ERROR traceback in the daemon."""
    with LogManager.open(log_dir, clock=clock) as manager:
        manager.create_topic("t", config={"retention.ms": "1000"})
        for key in ("retention.ms", "segment.bytes", "flush.messages"):
            with pytest.raises(ConfigError) as info:
                manager.alter_topic_config("t", {key: "1" * 65000})
            assert info.value.key == key
            with pytest.raises(ConfigError):
                manager.create_topic("u", config={key: "9" * 5000})
        assert manager.topic("t").overrides == {"retention.ms": "1000"}
        assert manager.topics() == ["t"]

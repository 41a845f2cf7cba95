"""``json`` topics through a real mount, read and written with real tools.

Records a Kafka client would write (keys, headers, binary values, values with
newlines, null keys and values) are appended through the engine; the mount must show
each as the line ``json.dumps`` makes of the documented document (the reference in
``tests/storage/record/test_json_format.py``, not the module under test) to ``cat``,
``jq``, ``tail -f``, ``dd skip=`` and the views, with an exact ``st_size``; lines
written back through another ``json`` topic give the same records. A copy of a Kafka
broker's directory mounted with ``-o default_format=json`` shows every record as
kafka-python decodes it.
"""

from __future__ import annotations

import base64
import errno
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords

from storage import Header, LogManager, Record, partition_for_key
from tests.storage.record.test_json_format import reference

from .conftest import MountDir, needs_fuse, open_manager
from .test_kafka_copy import build_broker_dir

pytestmark = needs_fuse

NOW = int(time.time() * 1000)  # recent: retention.ms counts from a record's timestamp
PARTITION = 10  # two digits: a rendering of the wrong partition has another size
RECORDS: list[tuple[bytes | None, bytes | None, list[Header]]] = [
    (b"user-1", b'{"amount": 5}', [("trace", b"t-1"), ("empty", None)]),
    (b"user-2", bytes(range(256)), [("bin", b"\xff\x00")]),
    (None, b"line one\nline two\r\n\ttabbed", []),
    (b"user-1", None, []),  # a tombstone
    (None, b"", [("k\u00e9y", "\u2713".encode())]),
    (b"\xc3\xa9", '\u00e9 \u2028 \x7f \\ "q"'.encode(), []),
]


def _sh(command: str, cwd: Path) -> bytes:
    return subprocess.run(
        ["bash", "-c", command], cwd=cwd, capture_output=True, check=True, timeout=60
    ).stdout


def _build(log_dir: Path, batches: int = 60) -> list[Record]:
    """``batches`` appends of ``RECORDS`` to partition 10 of a json topic ``events``, and
    one to partition 0; the records of partition 10 as stored."""
    with open_manager(log_dir, partitions=11) as manager:
        manager.create_topic("events", 11, format="json")
        for i in range(batches):
            for p in (PARTITION, 0) if i == 0 else (PARTITION,):
                manager.log("events", p).append(
                    [value for _key, value, _headers in RECORDS],
                    keys=[key for key, _value, _headers in RECORDS],
                    headers=[headers for _key, _value, headers in RECORDS],
                    timestamps=[NOW - 60_000 + i * 10 + j for j in range(len(RECORDS))],
                )
        return list(manager.log("events", PARTITION).records(0))


def _stored(log_dir: Path, topic: str, partition: int) -> list[Record]:
    with LogManager.open(log_dir, read_only=True) as manager:
        return list(manager.log(topic, partition).records(0))


def test_a_json_partition_reads_with_cat_jq_dd_tail_and_views(
    tmp_path: Path, mount_dir: MountDir
) -> None:
    log_dir = tmp_path / "logs"
    records = _build(log_dir)
    lines = [reference(r, "events", PARTITION) for r in records]
    expected = b"".join(lines)
    assert len(expected) > 3 * 4096  # several position-index entries
    mount = mount_dir(log_dir)
    mnt = mount.mountpoint
    path = mnt / "events" / str(PARTITION)
    name = f"events/{PARTITION}"

    assert _sh(f"cat {name}", mnt) == expected
    assert path.stat().st_size == len(expected)
    assert _sh("getfattr -n user.seglog.format --only-values events", mnt) == b"json"
    # Every line is one JSON object for jq, with the record's key, value and headers.
    shown = _sh(f"jq -c '[.offset, .key, .value, .headers]' {name}", mnt).splitlines()
    assert len(shown) == len(records)
    for line, record in zip(shown, records, strict=True):
        offset, key, value, headers = json.loads(line)
        assert offset == record.offset
        assert _bytes(key) == record.key
        assert _bytes(value) == record.value
        assert [(k, _bytes(v)) for k, v in headers] == list(record.headers)
    assert _sh(f"jq -r 'select(.key == \"user-1\") | .offset' {name} | wc -l", mnt) == (
        b"%d\n" % (2 * len(records) // len(RECORDS))
    )
    # Any byte position, through the position index.
    for skip in (1, 4095, 4097, len(expected) // 2, len(expected) - 7):
        out = _sh(f"dd if={name} bs=65536 iflag=skip_bytes skip={skip} status=none", mnt)
        assert out == expected[skip:], skip
    assert _sh(f"dd if={name} bs=4096 skip=2 status=none", mnt) == expected[8192:]
    # Views: the last N offsets, a time, a consumer group.
    assert (mnt / "events" / f"{PARTITION}@-10").read_bytes() == b"".join(lines[-10:])
    at = records[100].timestamp
    assert (mnt / "events" / f"{PARTITION}@{at}").read_bytes() == b"".join(lines[100:])
    group_view = mnt / "events" / f"{PARTITION}@group:earliest=readers"
    assert group_view.read_bytes() == expected
    assert (mnt / "events" / f"{PARTITION}@group=readers").read_bytes() == b""  # committed
    assert (mnt / "events" / "0").read_bytes() == b"".join(
        reference(r, "events", 0)
        for r in _stored(log_dir, "events", 0)  # beside the daemon
    )

    # tail -f sees a record written through the mount as its one rendered line.
    tail = subprocess.Popen(
        ["tail", "-f", "-s", "0.1", "-n", "0", str(path)], stdout=subprocess.PIPE
    )
    try:
        time.sleep(0.5)
        written = {"key": "k", "value": "new\nvalue", "headers": [["h", "x"]], "timestamp": NOW}
        with open(path, "ab") as f:
            f.write(json.dumps(written).encode() + b"\n")
        assert tail.stdout is not None
        line = tail.stdout.readline()
    finally:
        tail.terminate()
        tail.wait(10)
        assert tail.stdout is not None
        tail.stdout.close()
    document = json.loads(line)
    assert (document["offset"], document["key"], document["value"]) == (
        len(records),
        "k",
        "new\nvalue",
    )
    assert document["headers"] == [["h", "x"]]
    assert document["timestamp"] == NOW
    assert path.stat().st_size == len(expected) + len(line)


def _bytes(value: object) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, dict):
        return base64.b64decode(value["base64"])
    assert isinstance(value, str)
    return value.encode()


def test_lines_written_back_give_the_same_records_and_bad_lines_append_nothing(
    tmp_path: Path, mount_dir: MountDir
) -> None:
    log_dir = tmp_path / "logs"
    records = _build(log_dir, batches=800)  # over 1 MiB: cat writes it in pieces
    with open_manager(log_dir) as manager:
        manager.create_topic("keyed", 4, format="json")
    mount = mount_dir(log_dir)
    mnt = mount.mountpoint
    (mnt / "copy").mkdir()
    _sh("setfattr -n user.seglog.format -v json copy", mnt)
    _sh(f"cat events/{PARTITION} >> copy/0", mnt)
    copied = _stored(log_dir, "copy", 0)
    assert [(r.key, r.value, r.headers, r.timestamp) for r in copied] == [
        (r.key, r.value, r.headers, r.timestamp) for r in records
    ]
    # seglogfs produce through the daemon's control socket: the daemon's position index
    # (st_size) counts the json lines the records render as, not the input's bytes.
    seglogfs = str(Path(sys.executable).with_name("seglogfs"))
    lines = b"".join(
        b'{"key": "p", "value": "%d", "headers": [["h", null]]}\n' % i for i in range(99)
    )
    for _ in range(2):
        subprocess.run(
            [seglogfs, "produce", "-d", str(log_dir), "copy", "-p", "0"], input=lines, check=True
        )
    copied = _stored(log_dir, "copy", 0)
    assert len(copied) == len(records) + 198
    size = (mnt / "copy" / "0").stat().st_size
    assert size == sum(len(reference(r, "copy", 0)) for r in copied)

    # A write holding a line that is no record object is refused whole: EINVAL,
    # nothing appended (the good line before it neither), one line in the daemon's log.
    fd = os.open(mnt / "copy" / "0", os.O_WRONLY | os.O_APPEND)
    try:
        with pytest.raises(OSError, match="Invalid argument") as caught:
            os.write(fd, b'{"value": "good"}\n{"value": 5}\n')
        assert caught.value.errno == errno.EINVAL
    finally:
        os.close(fd)
    assert len(_stored(log_dir, "copy", 0)) == len(copied)
    assert (mnt / "copy" / "0").stat().st_size == size
    refusals = [line for line in mount.log().splitlines() if "refused" in line]
    assert len(refusals) == 1, refusals
    assert "copy-0" in refusals[0]
    assert "line 2 of 2: 'value' must be a string" in refusals[0]
    # The produce file partitions by key, as Kafka's producer does; keyless records of
    # one write go to one partition.
    keys = [f"key-{i}" for i in range(12)]
    written = [{"key": key, "value": str(i)} for i, key in enumerate(keys)]
    written += [{"value": "keyless 1"}, {"value": "keyless 2"}]
    (mnt / "keyed" / "produce").write_bytes(
        b"".join(json.dumps(w).encode() + b"\n" for w in written)
    )
    where = {r.key or r.value: p for p in range(4) for r in _stored(log_dir, "keyed", p)}
    assert {k: where[k.encode()] for k in keys} == {
        k: partition_for_key(k.encode(), 4) for k in keys
    }
    assert where[b"keyless 1"] == where[b"keyless 2"]
    # A record too large for one batch refuses the whole write (EFBIG) before any
    # partition's append, though the other record goes to another partition.
    _sh("setfattr -n user.seglog.max.message.bytes -v 2000 keyed", mnt)
    # (appended in partition order: the small record's partition comes first)
    assert partition_for_key(b"key-1", 4) < partition_for_key(b"key-3", 4)
    large = [{"key": "key-1", "value": "small"}, {"key": "key-3", "value": "v" * 3000}]
    before = sum(len(_stored(log_dir, "keyed", p)) for p in range(4))
    with pytest.raises(OSError) as too_large:  # noqa: PT011  # the errno is checked
        (mnt / "keyed" / "produce").write_bytes(
            b"".join(json.dumps(w).encode() + b"\n" for w in large)
        )
    assert too_large.value.errno == errno.EFBIG
    assert sum(len(_stored(log_dir, "keyed", p)) for p in range(4)) == before
    assert mount.stop() == 0
    verify = subprocess.run(
        [seglogfs, "verify", str(log_dir)],
        capture_output=True,
        check=False,
    )
    assert verify.returncode == 0, verify.stderr


def _kafka_python_lines(segment: Path, topic: str) -> list[dict[str, object]]:
    """What kafka-python decodes of a segment file, as the documented documents."""
    names = {None: "NoTimestampType", -1: "NoTimestampType", 0: "CreateTime"}
    names[1] = "LogAppendTime"
    documents: list[dict[str, object]] = []
    records = MemoryRecords(segment.read_bytes())
    while records.has_next():
        batch = records.next_batch()
        if getattr(batch, "is_control_batch", False):
            continue
        for record in batch:
            timestamp = record.timestamp
            documents.append(
                {
                    "topic": topic,
                    "partition": 0,
                    "offset": record.offset,
                    "timestamp": -1 if timestamp is None else timestamp,
                    "timestampType": names[record.timestamp_type],
                    "key": _text(record.key),
                    "value": _text(record.value),
                    "headers": [[k, _text(v)] for k, v in record.headers],
                }
            )
    return documents


def _text(data: bytes | None) -> object:
    if data is None:
        return None
    try:
        return bytes(data).decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode("ascii")}


def _clients_topic(log_dir: Path) -> None:
    """A partition a Kafka client wrote: headers, binary values, newlines, nulls."""
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=False, producer_id=-1,
        producer_epoch=-1, base_sequence=-1, batch_size=1 << 20,
    )  # fmt: skip
    for i, (key, value, headers) in enumerate(RECORDS):
        builder.append(i, timestamp=NOW + i, key=key, value=value, headers=headers)
    (log_dir / "clients-0").mkdir()
    (log_dir / "clients-0" / "00000000000000000000.log").write_bytes(bytes(builder.build()))


def test_a_kafka_copy_mounted_with_default_format_json_shows_what_kafka_python_decodes(
    tmp_path: Path, mount_dir: MountDir
) -> None:
    log_dir = tmp_path / "kafka-logs"
    build_broker_dir(log_dir)  # legacy v0/v1, every codec, a transaction marker
    _clients_topic(log_dir)
    mount = mount_dir(log_dir, "-o", "ro,default_format=json")
    mnt = mount.mountpoint
    for topic in ("legacy", "clients"):
        expected = _kafka_python_lines(log_dir / f"{topic}-0" / "00000000000000000000.log", topic)
        shown = _sh(f"cat {topic}/0", mnt)
        assert [json.loads(line) for line in shown.splitlines()] == expected
        assert len(shown.splitlines()) == len(expected)  # one line a record
        assert (mnt / topic / "0").stat().st_size == len(shown)
        assert _sh(f"getfattr -n user.seglog.format --only-values {topic}", mnt) == b"json"
        assert _sh(f"jq -c . {topic}/0 | wc -l", mnt) == b"%d\n" % len(expected)
    # Nothing of the copy changed: no metadata file, no position index.
    assert not (log_dir / "seglog-topics.json").exists()
    assert not list(log_dir.glob("*/*.seglogpos"))


def test_default_format_from_the_config_file_and_for_a_writable_mount(
    tmp_path: Path, mount_dir: MountDir
) -> None:
    log_dir = tmp_path / "kafka-logs"
    build_broker_dir(log_dir)
    config = tmp_path / "server.properties"
    # The copy's records are from 2023: no retention, or the writable mount deletes them.
    config.write_text("seglog.default.format=json\nlog.retention.ms=-1\n")
    mount = mount_dir(log_dir, "--config", str(config))
    mnt = mount.mountpoint
    first = json.loads(_sh("head -n 1 legacy/0", mnt))
    assert (first["topic"], first["offset"], first["value"]) == ("legacy", 0, "v0 plain a")
    (mnt / "made").mkdir()  # mkdir without a format: the mount's default
    assert _sh("getfattr -n user.seglog.format --only-values made", mnt) == b"json"
    assert mount.stop() == 0
    # The writable mount recorded the format its position indexes were counted in.
    topics = json.loads((log_dir / "seglog-topics.json").read_text())["topics"]
    assert (topics["legacy"]["format"], topics["made"]["format"]) == ("json", "json")
    # A topic recorded so keeps its format under another default.
    again = mount_dir(log_dir, "-o", "ro,default_format=lines")
    assert json.loads(_sh("head -n 1 legacy/0", again.mountpoint))["value"] == "v0 plain a"
    # -o wins over the file (a fresh copy: its topics carry no format).
    fresh = tmp_path / "fresh"
    build_broker_dir(fresh)
    plain = mount_dir(fresh, "-o", "ro,default_format=lines", "--config", str(config))
    assert _sh("head -n 1 legacy/0", plain.mountpoint) == b"v0 plain a\n"
    # A bad value is a usage error, exit 2, naming the key.
    config.write_text("seglog.default.format=yaml\n")
    empty = tmp_path / "empty"
    empty.mkdir()
    bad = subprocess.run(
        [sys.executable, "-m", "seglogfs.daemon", str(fresh), str(empty), "--config", str(config)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert bad.returncode == 2, bad.stderr
    assert "seglog.default.format='yaml': must be one of lines, raw, json" in bad.stderr
    assert not os.path.ismount(empty)


def test_a_copy_opened_writable_as_lines_stays_lines_under_a_json_default(
    tmp_path: Path,
) -> None:
    # A writable open counts the found topics' positions in its default format: it must
    # record that format, lines included, or a later open with default json renders
    # them as json over position indexes counted in lines (positions and st_size wrong,
    # nothing noticed).
    from seglogfs.daemon.position_reader import PositionReader
    from seglogfs.positions import Rendering, position_index_spec

    log_dir = tmp_path / "kafka-logs"
    build_broker_dir(log_dir)
    with LogManager.open(log_dir, extension=position_index_spec) as manager:
        assert manager.topic("legacy").format == "lines"
        assert list((log_dir / "legacy-0").glob("*.seglogpos"))  # counted in lines
    with LogManager.open(log_dir, extension=position_index_spec, default_format="json") as again:
        metadata = again.topic("legacy")
        assert metadata.format == "lines"
        log = again.log("legacy", 0)
        body = bytes(PositionReader().read(log, Rendering.of(metadata, 0), 0, 1 << 30))
        assert len(body) == log.extension_end - log.extension_start
        assert body.startswith(b"v0 plain a\n")

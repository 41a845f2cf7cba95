"""The sink: batch and streaming writes of Kafka-sink rows into topics.

Rows have Spark's Kafka sink columns: ``value`` (binary or string, required), ``key``
(binary or string), ``topic`` (string; the ``topic`` option overrides it), ``partition``
(int; null or absent means "let the partitioner choose") and ``headers``
(``array<struct<key: string, value: binary>>``). Other columns are ignored.

Why tasks do not append themselves: a log directory has one writer process (the
engine's lock, or the FUSE daemon that holds it), and a streaming sink must not
append a micro-batch twice when Spark replays it after a failure, which only the
driver can tell (it alone learns the batch id, in ``commit``). So each task *stages*
its rows in an Arrow IPC file under ``LOGDIR/.seglog-spark/staging/`` (the log
directory is shared by every node, and Kafka never uses the name), and the driver's
``commit`` appends the staged rows, partitioned as Kafka's producer does
(``partition_for_key`` for keyed rows, a sticky partition per staged Arrow batch for
keyless ones), either through the daemon's control socket when a daemon owns the
directory or through a writable ``LogManager`` (the writer lock) otherwise.

Exactly once for streaming (the order of steps matters; a crash can strike anywhere):

1. ``LOGDIR/.seglog-spark/sinks/<id>.json`` (``id`` from the query's checkpoint
   location, so a restarted query finds it) holds the last committed batch id. A batch
   at or below it is a replay: its staged files are dropped, nothing is appended.
2. Before appending, the sink durably records the *intent*: the batch id, its staged
   files and the log end offset of every partition it will append to.
3. It appends each partition's rows, fsyncs the logs (direct path), then durably
   records the batch id as committed and only then deletes the staged files.

A crash after step 2 leaves the intent: the replayed batch (Spark re-runs it with the
same id) completes the *recorded* files, not the replay's (keyless rows may pick other
partitions; the keyless sticky choice is seeded by the staged file's name so that a
re-read groups identically), skipping in each partition the prefix of its rows already
found in the log after the recorded offset. The sink's state is keyed by the
checkpoint directory and remembers Spark's query id: a checkpoint deleted and recreated
at the same path is a new query whose batch ids restart at 0, so its state starts
afresh. A batch write appends directly (no replay to guard against), unless it names
a ``txnAppId`` and ``txnVersion``: it is then one batch of that sink, at most once.

A topic the rows name that does not exist is created before the intent is recorded,
with ``num.partitions`` and the default format (through the daemon when one owns the
directory: its own), as a Kafka broker creates the topics its producers name
(``auto.create.topics.enable``, Kafka's default true; the sink's option of that name
set to false keeps the refusal).

Through a daemon, the sink cannot ask for an fsync (the daemon flushes on its own
schedule) and other producers may append between the sink's chunks; recovery then
finds the sink's rows as the first run equal to them after the recorded offset.

Cost: the driver appends every row (one Python pass over the staged rows, one murmur2
per keyed row); tasks only normalise and write Arrow files.

Thread-safety: Spark calls a writer's ``commit`` from one thread; tasks run ``write``
in their own processes on their own staged files.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import random
import shutil
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    StringType,
    StructType,
)

from storage import (
    Header,
    LogDirLockedError,
    LogManager,
    StickyPartitioner,
    StorageError,
    TopicExistsError,
    partition_for_key,
)

from .errors import SinkError

logger = logging.getLogger(__name__)

SPARK_DIR: Final = ".seglog-spark"
"""The sink's directory inside the log directory (a name Kafka never uses)."""
APPEND_CHUNK: Final = 4096
"""Records per engine append (or daemon produce) call: bounded memory per call."""

TopicPartition = tuple[str, int]
Row = tuple[bytes | None, bytes | None, tuple[Header, ...]]  # key, value, headers

_HEADERS_TYPE: Final = pa.list_(
    pa.field("element", pa.struct([("key", pa.string()), ("value", pa.binary())]))
)
STAGED_SCHEMA: Final = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("headers", _HEADERS_TYPE),
    ]
)


def check_sink_schema(schema: StructType, topic_option: str | None) -> None:
    """Refuse a DataFrame the Kafka sink would refuse, before any task runs.

    Raises:
        SinkError: naming the column and the types it may have.
    """
    fields = {f.name.lower(): f.dataType for f in schema.fields}
    text_or_bytes = (StringType, BinaryType)
    if "value" not in fields:
        raise SinkError("the sink needs a value column (binary or string)")
    for name in ("key", "value"):
        if name in fields and not isinstance(fields[name], text_or_bytes):
            raise SinkError(f"column {name} must be binary or string, not {fields[name]}")
    if topic_option is None and "topic" not in fields:
        raise SinkError("give the topic: a topic column (string) or the option topic")
    if "topic" in fields and not isinstance(fields["topic"], StringType):
        raise SinkError(f"column topic must be string, not {fields['topic']}")
    if "partition" in fields and not isinstance(fields["partition"], IntegerType):
        raise SinkError(f"column partition must be int, not {fields['partition']}")
    headers = fields.get("headers")
    if headers is not None and not (
        isinstance(headers, ArrayType)
        and isinstance(headers.elementType, StructType)
        and [f.name for f in headers.elementType.fields] == ["key", "value"]
        and isinstance(headers.elementType.fields[0].dataType, StringType)
        and isinstance(headers.elementType.fields[1].dataType, BinaryType)
    ):
        raise SinkError(
            f"column headers must be array<struct<key: string, value: binary>>, not {headers}"
        )


def _column(batch: pa.RecordBatch, name: str) -> pa.Array | None:
    for i, column_name in enumerate(batch.schema.names):
        if column_name.lower() == name:
            return batch.column(i)
    return None


def staged_batch(batch: pa.RecordBatch, topic_option: str | None) -> pa.RecordBatch:
    """One input batch normalised to ``STAGED_SCHEMA`` (strings to bytes, the topic
    option applied, missing columns as nulls).

    Raises:
        SinkError: a null topic with no topic option.
    """
    n = batch.num_rows
    value = _column(batch, "value")
    assert value is not None, "check_sink_schema ran on the driver"
    key = _column(batch, "key")
    topic = _column(batch, "topic")
    partition = _column(batch, "partition")
    headers = _column(batch, "headers")
    if topic_option is not None:
        topic = pa.repeat(pa.scalar(topic_option, pa.string()), n)
    elif topic is None or topic.null_count:
        raise SinkError("a row has a null topic and the option topic is not set")
    return pa.RecordBatch.from_arrays(
        [
            topic.cast(pa.string()),
            pa.nulls(n, pa.int32()) if partition is None else partition.cast(pa.int32()),
            pa.nulls(n, pa.binary()) if key is None else key.cast(pa.binary()),
            value.cast(pa.binary()),
            pa.nulls(n, _HEADERS_TYPE) if headers is None else headers.cast(_HEADERS_TYPE),
        ],
        schema=STAGED_SCHEMA,
    )


@dataclass
class StagedFile(WriterCommitMessage):
    """A task's commit message: where it staged its rows and how many."""

    path: str
    rows: int


def _write_json_durably(path: Path, document: object) -> None:
    """Replace ``path`` with ``document``: temp file, fsync, rename, fsync directory.

    A crash leaves either the old or the new content, never a torn file.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    with open(tmp, "wb") as f:
        f.write(json.dumps(document, indent=1).encode("utf-8"))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class Grouped:
    """Staged rows grouped by the topic-partition they go to, in staging order."""

    rows: dict[TopicPartition, list[Row]] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return sum(len(rows) for rows in self.rows.values())


def group_staged(files: Sequence[str], partition_counts: dict[str, int]) -> Grouped:
    """Read staged files and choose each row's partition as Kafka's producer does: the
    row's partition if given, else ``partition_for_key`` of its key, else a sticky
    partition per staged Arrow batch (seeded by the file name: deterministic).

    Cost: O(rows) Python work (one murmur2 per keyed row).

    Raises:
        SinkError: an unknown topic, or a partition the topic does not have.
    """
    grouped = Grouped()
    # Keys repeat (users, words, devices): murmur2 in Python costs microseconds, a
    # dictionary hit tens of nanoseconds.
    key_partitions: dict[tuple[bytes, int], int] = {}
    for path in files:
        sticky: dict[str, StickyPartitioner] = {}
        rng = random.Random(os.path.basename(path))
        with pa.memory_map(path) as source:
            reader = pa.ipc.open_file(source)
            for i in range(reader.num_record_batches):
                batch = reader.get_batch(i)
                topics = batch.column(0).to_pylist()
                partitions = batch.column(1).to_pylist()
                keys = batch.column(2).to_pylist()
                values = batch.column(3).to_pylist()
                headers = batch.column(4).to_pylist()
                for topic, partition, key, value, row_headers in zip(
                    topics, partitions, keys, values, headers, strict=True
                ):
                    count = partition_counts.get(topic)
                    if count is None:
                        raise SinkError(
                            f"topic {topic!r} does not exist; create it first "
                            f"(seglogfs topics create {topic})"
                        )
                    if partition is None:
                        if key is not None:
                            found = key_partitions.get((key, count))
                            if found is None:
                                found = partition_for_key(key, count)
                                if len(key_partitions) < 1 << 20:
                                    key_partitions[(key, count)] = found
                            partition = found
                        else:
                            if topic not in sticky:
                                sticky[topic] = StickyPartitioner(count, rng)
                            partition = sticky[topic].partition()
                    elif not 0 <= partition < count:
                        raise SinkError(
                            f"partition {partition} does not exist: topic {topic!r} has "
                            f"{count} partition(s)"
                        )
                    hs: tuple[Header, ...] = ()
                    if row_headers:
                        hs = tuple((h["key"], h["value"]) for h in row_headers)
                    grouped.rows.setdefault((topic, partition), []).append((key, value, hs))
                for partitioner in sticky.values():
                    partitioner.next_batch()
    return grouped


class _Target:
    """Where appends go: the daemon's control socket or this process's writer lock."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.manager: LogManager | None = None  # direct path
        self.reader: LogManager | None = None  # daemon path: reads of what was written
        self.daemon = _daemon_socket(log_dir) is not None
        if not self.daemon:
            try:
                self.manager = _open_writable(log_dir)
            except LogDirLockedError:
                # The lock holder may be a daemon that just started.
                if _daemon_socket(log_dir) is None:
                    raise SinkError(
                        f"log directory {log_dir} is locked by another writer process and "
                        f"no seglogfs daemon answers on {log_dir / '.seglog.sock'}: stop "
                        "the other writer, or mount the directory (seglogfs mount) so that "
                        "writes go through its daemon"
                    ) from None
                self.daemon = True
        if self.daemon:
            self.reader = LogManager.open(log_dir, read_only=True)

    def view(self) -> LogManager:
        """A manager to read partition facts and records from (fresh)."""
        if self.manager is not None:
            return self.manager
        assert self.reader is not None
        self.reader.refresh()
        return self.reader

    def partition_counts(self) -> dict[str, int]:
        view = self.view()
        return {name: view.topic(name).partitions for name in view.topics()}

    def create_topic(self, name: str) -> None:
        """Create the missing topic ``name`` with ``num.partitions`` (the daemon's when
        one owns the directory) and the default format; no error when another writer
        created it meanwhile.

        Raises:
            SinkError: the engine or the daemon refused (a bad name, too many
                partitions, ...).
        """
        if self.manager is not None:
            try:
                partitions = self.manager.create_topic(name).partitions
            except TopicExistsError:
                return
            except (StorageError, OSError) as exc:
                raise SinkError(f"cannot create topic {name!r}: {exc}") from exc
        else:
            from seglogfs.control import ControlError, request

            try:
                result = request(
                    self.log_dir,
                    "create_topic",
                    name=name,
                    partitions=None,
                    config=None,
                    format=None,
                    key_separator=None,
                )
            except ControlError as exc:
                if exc.kind == "TopicExistsError":
                    return
                raise SinkError(f"the daemon refused to create topic {name!r}: {exc}") from exc
            assert isinstance(result, dict)
            partitions = int(result["partitions"])
        logger.info(
            "seglog sink: created topic %s with %d partitions (auto.create.topics.enable)",
            name,
            partitions,
        )

    def append(self, tp: TopicPartition, rows: Sequence[Row]) -> None:
        """Append ``rows`` to ``tp`` in chunks of ``APPEND_CHUNK`` records.

        Raises:
            SinkError: the engine or the daemon refused (the message says why).
        """
        for lo in range(0, len(rows), APPEND_CHUNK):
            chunk = rows[lo : lo + APPEND_CHUNK]
            keys = [r[0] for r in chunk]
            values = [r[1] for r in chunk]
            headers = [r[2] for r in chunk]
            try:
                if self.manager is not None:
                    self.manager.log(*tp).append(
                        values,
                        keys=None if keys.count(None) == len(keys) else keys,
                        headers=None if headers.count(()) == len(headers) else headers,
                    )
                else:
                    _daemon_produce(self.log_dir, tp, chunk)
            except StorageError as exc:
                raise SinkError(f"cannot append to {tp[0]}-{tp[1]}: {exc}") from exc

    def flush(self) -> None:
        """Make the appended records durable (direct path: fsync every dirty log)."""
        if self.manager is not None:
            self.manager.flush_dirty_logs()

    def close(self) -> None:
        for manager in (self.manager, self.reader):
            if manager is not None:
                manager.close()


def _daemon_socket(log_dir: Path) -> Path | None:
    from seglogfs.control import daemon_socket

    return daemon_socket(log_dir)


def _daemon_produce(log_dir: Path, tp: TopicPartition, rows: Sequence[Row]) -> None:
    from seglogfs.control import ControlError, produce

    try:
        produce(log_dir, tp[0], [(k, v, h, None) for k, v, h in rows], partition=tp[1])
    except ControlError as exc:
        raise SinkError(f"the daemon refused to append to {tp[0]}-{tp[1]}: {exc.message}") from exc


def _open_writable(log_dir: Path) -> LogManager:
    """A writable manager that keeps the file system's position index in step.

    The FUSE layer indexes the rendered byte positions of each partition file in an
    extension index (``seglogfs.positions``); appending without it would leave that
    index to be rebuilt on the next mount, so the sink opens the directory with the
    same spec as the daemon does.

    Raises:
        LogDirLockedError: another process writes the directory.
    """
    from seglogfs.positions import position_index_spec

    return LogManager.open(log_dir, extension=position_index_spec)


def present_prefix(view: LogManager, tp: TopicPartition, start: int, rows: Sequence[Row]) -> int:
    """How many leading ``rows`` are already in ``tp`` at or after ``start``.

    The first record equal to ``rows[0]`` (key, value, headers) at or after ``start``
    begins the run (other writers may have appended before it through a daemon); the
    run ends at the first record that differs. Cost: O(records after ``start``).
    """
    if not rows:
        return 0
    log = view.log(*tp)
    if start >= log.log_end_offset:
        return 0
    matched = 0
    for record in log.records(max(start, log.log_start_offset)):
        if matched == len(rows):
            break
        key, value, headers = rows[matched]
        if record.key == key and record.value == value and tuple(record.headers) == headers:
            matched += 1
        elif matched:
            break
    return matched


class SinkState:
    """The durable state of one sink: ``sinks/<id>.json``.

    Layout: ``{"checkpoint": KEY, "query": QUERY_ID or null, "committed": BATCH_ID (-1
    for none), "pending": null or {"batch": ID, "files": [PATH...], "starts": {"topic":
    {"p": OFFSET}}}}``.

    ``query`` is the id Spark keeps in the checkpoint's ``metadata`` file. A checkpoint
    directory deleted and recreated at the same path starts a new query whose batch ids
    start again at 0; a different id therefore starts a fresh state instead of skipping
    the new query's batches as replays.
    """

    def __init__(self, log_dir: Path, checkpoint: str, query_id: str | None = None) -> None:
        digest = _sink_id(checkpoint)
        self.sink_id = digest
        self.path = log_dir / SPARK_DIR / "sinks" / f"{digest}.json"
        self.checkpoint = checkpoint
        try:
            document = json.loads(self.path.read_bytes())
        except FileNotFoundError:
            document = {"committed": -1, "pending": None}
        except ValueError as exc:
            raise SinkError(f"sink state {self.path} is unreadable: {exc}") from exc
        stored_query = document.get("query")
        if query_id is not None and stored_query is not None and stored_query != query_id:
            document = {"committed": -1, "pending": None}
        self.query_id = query_id if query_id is not None else stored_query
        self.committed: int = int(document["committed"])
        self.pending: dict[str, Any] | None = document.get("pending")

    def save(self) -> None:
        _write_json_durably(
            self.path,
            {
                "checkpoint": self.checkpoint,
                "query": self.query_id,
                "committed": self.committed,
                "pending": self.pending,
            },
        )


def query_id(checkpoint: str) -> str | None:
    """The query id Spark recorded in ``CHECKPOINT/metadata``, if it can be read here
    (a local or mounted checkpoint directory)."""
    if "://" in checkpoint and not checkpoint.startswith("file:"):
        return None
    try:
        with open(Path(checkpoint) / "metadata", encoding="utf-8") as f:
            document = json.loads(f.readline())
    except (OSError, ValueError):
        return None
    found = document.get("id") if isinstance(document, dict) else None
    return found if isinstance(found, str) else None


def staged_topics(files: Sequence[str]) -> set[str]:
    """The topics the rows of ``files`` name.

    Cost: one pass over the topic column (Arrow's ``unique`` per batch).
    """
    names: set[str] = set()
    for path in files:
        with pa.memory_map(path) as source:
            reader = pa.ipc.open_file(source)
            for i in range(reader.num_record_batches):
                found = reader.get_batch(i).column(0).unique().to_pylist()
                names.update(name for name in found if name is not None)
    return names


def commit_staged(
    log_dir: Path,
    files: Sequence[str],
    *,
    state: SinkState | None,
    batch_id: int | None,
    auto_create: bool = True,
) -> int:
    """Append the rows of ``files`` (see the module docstring); return how many rows
    were appended (0 for a replayed batch). Missing topics are created first when
    ``auto_create`` (``auto.create.topics.enable``).

    Raises:
        SinkError: unknown topic (``auto_create`` false) or partition, a topic the
            engine refuses to create, locked directory, refused append.
    """
    if state is not None and batch_id is not None and batch_id <= state.committed:
        return 0  # a replay of a batch whose rows are already in the log
    target = _Target(log_dir)
    try:
        counts = target.partition_counts()
        pending = state.pending if state is not None else None
        resuming = pending is not None and pending["batch"] == batch_id
        if pending is not None and resuming:
            files = pending["files"]
            starts = {
                (topic, int(p)): int(offset)
                for topic, partitions in pending["starts"].items()
                for p, offset in partitions.items()
            }
        missing = staged_topics(files) - counts.keys() if auto_create else set()
        if missing:
            for name in sorted(missing):
                target.create_topic(name)
            counts = target.partition_counts()
        grouped = group_staged(files, counts)
        view = target.view()
        if not resuming:
            starts = {tp: view.log(*tp).log_end_offset for tp in grouped.rows}
            if state is not None:
                starts_json: dict[str, dict[str, int]] = {}
                for (topic, p), offset in starts.items():
                    starts_json.setdefault(topic, {})[str(p)] = offset
                state.pending = {"batch": batch_id, "files": list(files), "starts": starts_json}
                state.save()  # the intent is durable before the first append
        appended = 0
        for tp in sorted(grouped.rows):
            rows = grouped.rows[tp]
            skip = present_prefix(target.view(), tp, starts[tp], rows) if resuming else 0
            target.append(tp, rows[skip:])
            appended += len(rows) - skip
        target.flush()
        if state is not None and batch_id is not None:
            state.committed = batch_id
            state.pending = None
            state.save()  # after the records are durable: from now on a replay is skipped
        return appended
    finally:
        target.close()


def _remove_files(paths: Sequence[str]) -> None:
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


class _Staging:
    """Staged files of one writer object: ``staging/<group>/<writer uuid>/``."""

    def __init__(self, log_dir: str, group: str) -> None:
        self.log_dir = log_dir
        self.group = group
        self.writer_id = uuid.uuid4().hex

    @property
    def directory(self) -> Path:
        return Path(self.log_dir) / SPARK_DIR / "staging" / self.group / self.writer_id

    def stage(self, batches: Iterator[pa.RecordBatch], topic_option: str | None) -> StagedFile:
        """Write a task's rows to a new staged file (fsynced: the driver may append
        them after this process is gone)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"{uuid.uuid4().hex}.arrow"
        rows = 0
        with open(path, "wb") as f:
            with pa.ipc.new_file(f, STAGED_SCHEMA) as out:
                for batch in batches:
                    if batch.num_rows:
                        out.write_batch(staged_batch(batch, topic_option))
                        rows += batch.num_rows
            f.flush()
            os.fsync(f.fileno())
        return StagedFile(str(path), rows)

    def remove_others(self, keep: Sequence[str]) -> None:
        """Delete every staged file of this group but ``keep``: leftovers of failed
        task attempts and of earlier runs whose batches are now committed."""
        root = self.directory.parent
        kept = set(keep)
        if not root.is_dir():
            return
        for writer_dir in root.iterdir():
            for path in writer_dir.iterdir():
                if str(path) not in kept:
                    with contextlib.suppress(FileNotFoundError):
                        path.unlink()
            with contextlib.suppress(OSError):
                writer_dir.rmdir()


def _files(messages: Sequence[WriterCommitMessage | None]) -> list[str]:
    return [m.path for m in messages if isinstance(m, StagedFile) and m.rows]


def _checkpoint_key(location: str) -> str:
    """One spelling per checkpoint directory: a restart that names it ``file:/x``,
    ``/x/`` or a relative path from the same directory finds the same sink state."""
    path = location
    for scheme in ("file://", "file:"):
        if path.startswith(scheme):
            path = path[len(scheme) :]
            break
    else:
        if "://" in location:
            return location.rstrip("/")  # another file system: as given
    return os.path.abspath(path)


def _sink_id(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:24]


def commit_exactly_once(
    log_dir: str,
    staging: _Staging,
    key: str,
    files: Sequence[str],
    batch_id: int,
    query: str | None = None,
    *,
    auto_create: bool = True,
) -> None:
    """Commit batch ``batch_id`` of the sink named ``key`` (of the query ``query`` when
    known) at most once, then drop every staged file of that sink (this batch's, a
    replay's, failed attempts')."""
    state = SinkState(Path(log_dir), key, query)
    commit_staged(Path(log_dir), files, state=state, batch_id=batch_id, auto_create=auto_create)
    staging.remove_others(keep=[])


def abort_exactly_once(log_dir: str, key: str, files: Sequence[str]) -> None:
    """Drop a failed batch's staged files, except those a recorded intent still needs."""
    state = SinkState(Path(log_dir), key)
    pending = state.pending["files"] if state.pending is not None else []
    _remove_files([f for f in files if f not in pending])


class SeglogBatchWriter(DataSourceArrowWriter):
    """``df.write.format("seglog")``: append-only, at least once (as Kafka's sink).

    With the options ``txnAppId`` (a string naming the writer) and ``txnVersion`` (a
    batch number), the write is idempotent as Delta Lake's writes with the same
    options: a version at or below the last one committed for that ``txnAppId`` appends
    nothing. This makes ``foreachBatch(lambda df, id: df.write...option("txnVersion",
    id)...)`` exactly once, which is how a stateful query in update mode (not offered
    to Python streaming sinks by Spark) writes to seglog.
    """

    def __init__(
        self,
        log_dir: str,
        topic: str | None,
        txn: tuple[str, int] | None = None,
        auto_create: bool = True,
    ) -> None:
        self.log_dir = log_dir
        self.topic = topic
        self.txn = txn
        self.auto_create = auto_create
        self.staging = _Staging(log_dir, "batch" if txn is None else _sink_id(txn[0]))

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return self.staging.stage(iterator, self.topic)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.txn is not None:
            commit_exactly_once(
                self.log_dir,
                self.staging,
                self.txn[0],
                _files(messages),
                self.txn[1],
                auto_create=self.auto_create,
            )
            return
        try:
            commit_staged(
                Path(self.log_dir),
                _files(messages),
                state=None,
                batch_id=None,
                auto_create=self.auto_create,
            )
        finally:
            shutil.rmtree(self.staging.directory, ignore_errors=True)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.txn is not None:
            abort_exactly_once(self.log_dir, self.txn[0], _files(messages))
        else:
            shutil.rmtree(self.staging.directory, ignore_errors=True)


class SeglogStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("seglog")``: each micro-batch appended exactly once per
    checkpoint, replays included (see the module docstring). Output modes append and
    complete (complete appends every row of the result table, as Kafka's sink does);
    Spark offers update mode to Python sinks only through ``foreachBatch`` (see
    ``SeglogBatchWriter``)."""

    def __init__(
        self, log_dir: str, topic: str | None, checkpoint: str | None, auto_create: bool = True
    ) -> None:
        self.log_dir = log_dir
        self.topic = topic
        self.auto_create = auto_create
        # Without a checkpoint location Spark uses a temporary one that no restart
        # reuses, so there is no replay to recognise: a fresh id per query.
        self.checkpoint = (
            _checkpoint_key(checkpoint) if checkpoint else f"temporary:{uuid.uuid4().hex}"
        )
        self.staging = _Staging(log_dir, _sink_id(self.checkpoint))

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return self.staging.stage(iterator, self.topic)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        query = query_id(self.checkpoint)
        commit_exactly_once(
            self.log_dir,
            self.staging,
            self.checkpoint,
            _files(messages),
            batchId,
            query,
            auto_create=self.auto_create,
        )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        abort_exactly_once(self.log_dir, self.checkpoint, _files(messages))


def append_exactly_once(
    log_dir: str | Path,
    table: pa.Table,
    *,
    topic: str | None,
    app_id: str,
    version: int,
    auto_create: bool = True,
) -> int:
    """Append the rows of ``table`` (Kafka-sink columns) once per (``app_id``,
    ``version``), from the calling process: what a batch write with ``txnAppId`` and
    ``txnVersion`` does, without Spark tasks. Meant for ``foreachBatch`` on small
    results (``batch.toArrow()``), where starting writer tasks would cost more than the
    rows; returns the rows appended (0 for a version already committed).

    Raises:
        SinkError: as the sink (unknown topic, bad columns, locked directory).
    """
    staging = _Staging(str(log_dir), _sink_id(app_id))
    state = SinkState(Path(log_dir), app_id)
    if version <= state.committed:
        return 0
    if "value" not in [name.lower() for name in table.column_names]:
        raise SinkError("the sink needs a value column (binary or string)")
    staged = staging.stage(iter(table.to_batches()), topic)
    files = [staged.path] if staged.rows else []
    appended = commit_staged(
        Path(log_dir), files, state=state, batch_id=version, auto_create=auto_create
    )
    staging.remove_others(keep=[])
    return appended

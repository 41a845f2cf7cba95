"""The log directory: its topics, their partition logs, checkpoints and the writer lock.

``LogManager`` is Kafka's ``LogManager`` for a single ``log.dirs`` entry plus the
topic administration Kafka's controller does (create, describe, alter, delete).

Lifecycle of a writable manager (``LogManager.open``):

1. take the writer lock (one writer process per log directory);
2. read the topic metadata, the recovery-point and log-start-offset checkpoints and
   whether ``.kafka_cleanshutdown`` exists;
3. load every partition (recovering each after an unclean shutdown); directories of
   deleted topics (``deleting`` in the metadata) are not partitions: they are renamed
   away and removed with the ``-delete`` directories a crash left (``delete_topic``);
4. remove the clean-shutdown marker: from now on a crash must be noticed.

``close()`` flushes every log, writes both checkpoints, then the marker, then releases
the lock. A read-only manager takes no lock and changes nothing; ``refresh()`` follows
the writer.

Thread-safety: topic administration and the maintenance methods take the manager's
lock; each ``Log`` serialises its own appends.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType

from ..atomic_file import fsync_directory, write_atomically
from ..clock import SYSTEM_CLOCK, Clock
from ..errors import (
    ConfigError,
    CorruptCheckpointError,
    CorruptRecordError,
    InvalidTopicError,
    LogCleaningAbortedError,
    ReadOnlyLogError,
    StorageError,
    TopicExistsError,
    TopicNotEmptyError,
    UnknownTopicError,
)
from .checkpoint import read_offset_checkpoint, write_offset_checkpoint
from .cleaner_manager import (
    CleanSummary,
    LogCleanerManager,
    LogCleanResult,
    cleanable_offsets,
)
from .extension_index import ExtensionIndexSpec
from .file_names import (
    CLEAN_SHUTDOWN_FILE,
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    SEGLOG_TOPICS_FILE,
    delete_dir_name,
    is_delete_dir_name,
    parse_topic_partition_name,
    partition_dir_name_problem,
    topic_partition_dir_name,
)
from .lock_file import LogDirLock
from .log import Log
from .log_config import TOPIC_CONFIG_NAMES, BrokerConfig, LogConfig, unknown_topic_config
from .offset_map import OffsetMap
from .segment import OPEN_SEGMENTS
from .topic import (
    FORMATS,
    TopicMetadata,
    collision_key,
    read_topics_document,
    validate_new_topic_name,
    validate_topic_name,
    write_topics_file,
)

logger = logging.getLogger(__name__)

TopicPartition = tuple[str, int]

LOG_DIR_MODE = 0o750
"""The mode of a log directory ``LogManager.open`` creates (narrowed by the umask)."""

ExtensionFactory = Callable[[TopicMetadata], ExtensionIndexSpec | None]
"""Chooses each topic's extension index (or none), e.g. from its format."""


@dataclass(frozen=True)
class PartitionDescription:
    """What ``getfattr`` and ``describe`` show of one partition."""

    topic: str
    partition: int
    log_start_offset: int
    log_end_offset: int
    segment_count: int
    size: int
    first_timestamp: int
    last_timestamp: int


@dataclass(frozen=True)
class TopicDescription:
    metadata: TopicMetadata
    config: LogConfig
    partitions: tuple[PartitionDescription, ...]


class LogManager:
    """All topic-partition logs of one log directory. Use ``LogManager.open``."""

    def __init__(
        self,
        log_dir: Path,
        broker_config: BrokerConfig,
        *,
        clock: Clock,
        read_only: bool,
        extension: ExtensionFactory | None = None,
        default_format: str = "lines",
    ) -> None:
        self.log_dir = log_dir
        self.extension = extension
        # The format of topics that carry none of their own (found only as partition
        # directories: a Kafka broker's) and of creates that name none.
        self.default_format = default_format
        self.broker_config = broker_config
        self.clock = clock
        self.read_only = read_only
        self._lock = threading.RLock()
        self._dir_lock = LogDirLock(log_dir)
        self._topics: dict[str, TopicMetadata] = {}
        # Deleted topics whose partition directories may remain (``delete_topic``).
        self._deleting: frozenset[str] = frozenset()
        self._logs: dict[TopicPartition, Log] = {}
        # The (device, inode) of each partition directory a read-only log was opened on.
        self._dir_ids: dict[TopicPartition, tuple[int, int] | None] = {}
        # Read-only: partitions found on disk, opened on first use (``log``, ``logs``).
        self._unopened: set[TopicPartition] = set()
        # Topics found only as directories that are not loaded (``_with_found_topics``).
        self._ignored: set[str] = set()
        # Problems with a checkpoint file already logged (``_read_checkpoint``).
        self._checkpoint_problems: set[str] = set()
        self._closed = False
        self.cleaner_manager = LogCleanerManager(log_dir)
        # Set to stop the cleaning passes in progress at their next batch (shutdown).
        self._cleaning_abort = threading.Event()
        """The cleaner's checkpoint and choice of logs (``clean``)."""

    @classmethod
    def open(
        cls,
        log_dir: Path | str,
        broker_config: BrokerConfig | None = None,
        *,
        clock: Clock = SYSTEM_CLOCK,
        read_only: bool = False,
        extension: ExtensionFactory | None = None,
        default_format: str = "lines",
    ) -> LogManager:
        """Open the log directory (creating it, mode 0750, when writable) and load every
        log.

        Read-only, the topics are read now and each partition's log is opened on first
        use (``log``, ``logs``): a reader of one topic maps that topic's segments only
        (each holds descriptors and mappings), and an error opening a log is raised by
        the call that uses it.

        ``extension`` gives each topic's extension index spec (see ``ExtensionIndexSpec``);
        the engine then keeps that index for every segment of the topic's partitions.

        ``default_format`` is the format (``topic.FORMATS``) of topics found only as
        partition directories, which carry none of their own (a copy of a Kafka
        broker's), and of ``create_topic`` calls that name none. A writable open
        records the found topics with it at once: their position indexes are then kept
        in it, and every later reader or writer (a mount with another default,
        ``verify``) renders them as they were measured.

        Raises:
            LogDirLockedError: another process writes this log directory.
            StorageError: a read-only open of a missing directory, or unreadable
                metadata.
            ConfigError: a topic's stored overrides are invalid, or ``default_format``
                is no format.
        """
        if default_format not in FORMATS:
            raise ConfigError(
                "default_format", default_format, f"must be one of {', '.join(FORMATS)}"
            )
        path = Path(log_dir)
        if broker_config is None:
            broker_config = BrokerConfig(log_dirs=(str(path),))
        if read_only:
            if not path.is_dir():
                raise StorageError(f"log directory {path} does not exist")
        else:
            # 0750: the segments follow the umask (0644 under 022), so a directory the
            # engine makes keeps them from other users; an existing one keeps its mode.
            path.mkdir(mode=LOG_DIR_MODE, parents=True, exist_ok=True)
        manager = cls(
            path,
            broker_config,
            clock=clock,
            read_only=read_only,
            extension=extension,
            default_format=default_format,
        )
        # Process-wide: one bound for every log the process opens (the daemon and each
        # command open one manager; the last one opened sets it).
        OPEN_SEGMENTS.max_open = broker_config.log_segment_open_max
        if not read_only:
            manager._dir_lock.acquire()
        try:
            manager._load()
        except BaseException:
            manager._close_logs()
            manager._dir_lock.release()
            raise
        return manager

    def _load(self) -> None:
        marker = self.log_dir / CLEAN_SHUTDOWN_FILE
        had_clean_shutdown = marker.exists()
        recovery_points = self._read_checkpoint(RECOVERY_POINT_CHECKPOINT)
        start_offsets = self._read_checkpoint(LOG_START_OFFSET_CHECKPOINT)
        document = read_topics_document(self.log_dir / SEGLOG_TOPICS_FILE)
        self._topics = self._with_found_topics(
            document.topics, self._partition_dirs(), document.deleting
        )
        self._deleting = document.deleting
        found = self._topics.keys() - document.topics.keys()
        if not self.read_only and found:
            # Found topics take the default now and keep it (see ``open``): also
            # ``lines``, or a later open with another default would render them
            # otherwise than their position indexes were measured.
            self._commit_topics(self._topics, self._deleting)
        for metadata in self._topics.values():
            config = self.topic_config(metadata.name)
            for partition in range(metadata.partitions):
                tp = (metadata.name, partition)
                directory = self.log_dir / topic_partition_dir_name(*tp)
                if self.read_only:
                    if directory.is_dir():
                        self._unopened.add(tp)
                    continue
                self._logs[tp] = Log.open(
                    directory,
                    config,
                    log_start_offset=start_offsets.get(tp, 0),
                    recovery_point=recovery_points.get(tp, 0),
                    had_clean_shutdown=had_clean_shutdown,
                    clock=self.clock,
                    writable=True,
                    extension=self._extension_for(metadata, partition),
                )
                self._dir_ids[tp] = _directory_identity(directory)
        if not self.read_only:
            if self._deleting:
                try:
                    self._finish_deletions(self._deleting)
                except OSError as exc:
                    logger.warning(
                        "deleted topics %s not removed yet: %s", sorted(self._deleting), exc
                    )
            self._remove_delete_dirs()
            self.checkpoint()
            # Crash safety: the marker goes only after the checkpoints reflect the
            # recovered logs; from here on a crash must trigger recovery next time.
            if had_clean_shutdown:
                marker.unlink()
                fsync_directory(self.log_dir)

    def _with_found_topics(
        self,
        recorded: Mapping[str, TopicMetadata],
        found: Mapping[str, set[int]],
        deleting: frozenset[str],
    ) -> dict[str, TopicMetadata]:
        """The recorded topics plus those found only as partition directories: a topic
        a Kafka broker (or an older copy) made gets the defaults and a partition count
        from its directories. Directories of a deleted topic (``deleting``) are none of
        these, nor those of a topic whose count would exceed ``max.topic.partitions``
        (``t-2000000000`` alone made a topic whose missing partitions a writable open
        created without end): they are left alone, with a warning."""
        topics = dict(recorded)
        limit = self.broker_config.max_topic_partitions
        for topic, partitions in found.items():
            if topic in topics or topic in deleting:
                continue
            count = max(partitions) + 1
            if count <= limit:
                topics[topic] = TopicMetadata(topic, count, self.default_format)
            elif topic not in self._ignored:
                self._ignored.add(topic)
                logger.warning(
                    "ignoring the directories of topic %s: they name partition %d, and "
                    "a topic has at most max.topic.partitions (%d)",
                    topic,
                    count - 1,
                    limit,
                )
        return topics

    def _open_unopened(self, tps: Iterable[TopicPartition]) -> None:
        """Open read-only logs found earlier (the caller holds ``self._lock``).

        The checkpoints and the clean-shutdown marker are read now, as an open of the
        whole directory at this moment would read them. A partition whose directory is
        gone meanwhile stays closed (``log`` then reports it unknown).

        Raises:
            StorageError: a log cannot be opened (it stays unopened: a later call
                tries again).
        """
        had_clean_shutdown = (self.log_dir / CLEAN_SHUTDOWN_FILE).exists()
        recovery_points = self._read_checkpoint(RECOVERY_POINT_CHECKPOINT)
        start_offsets = self._read_checkpoint(LOG_START_OFFSET_CHECKPOINT)
        for tp in tps:
            directory = self.log_dir / topic_partition_dir_name(*tp)
            identity = _directory_identity(directory)
            if identity is None:
                self._unopened.discard(tp)
                continue
            try:
                log = Log.open(
                    directory,
                    self.topic_config(tp[0]),
                    log_start_offset=start_offsets.get(tp, 0),
                    recovery_point=recovery_points.get(tp, 0),
                    had_clean_shutdown=had_clean_shutdown,
                    clock=self.clock,
                    writable=False,
                    extension=self._extension_for(self._topics[tp[0]], tp[1]),
                )
            except FileNotFoundError:
                self._unopened.discard(tp)  # the topic was deleted while we looked
                continue
            self._unopened.discard(tp)
            self._logs[tp] = log
            self._dir_ids[tp] = identity

    def _read_checkpoint(self, name: str) -> dict[TopicPartition, int]:
        """The offsets of checkpoint file ``name`` (``RECOVERY_POINT_CHECKPOINT`` or
        ``LOG_START_OFFSET_CHECKPOINT``); none when it cannot be read or is corrupt.

        As Kafka's ``LogManager.loadLogs``, which logs a warning and goes on without the
        file: without recovery points, a log after an unclean shutdown is recovered
        from offset 0 (every segment re-validated: slower, never less safe); without
        log start offsets, each log starts at its first segment's base offset (records
        a DeleteRecords had moved past are served again until the next one; a writable
        open rewrites both files at once). Loud: one WARNING naming the file and the
        problem, per manager and problem (a read-only manager reads them at each open
        of a log).

        Cost: a read of the file.
        """
        path = self.log_dir / name
        try:
            return read_offset_checkpoint(path)
        except (CorruptCheckpointError, OSError) as exc:
            problem = f"{path}: {exc}"
            if problem not in self._checkpoint_problems:
                self._checkpoint_problems.add(problem)
                fallback = (
                    "recovering every log from offset 0 after an unclean shutdown"
                    if name == RECOVERY_POINT_CHECKPOINT
                    else "each log starts at the base offset of its first segment"
                )
                logger.warning("ignoring %s: %s; %s", name, exc, fallback)
            return {}

    def _extension_for(self, metadata: TopicMetadata, partition: int) -> ExtensionIndexSpec | None:
        # Per partition: a rendering may name the partition in every record (json).
        spec = None if self.extension is None else self.extension(metadata)
        return None if spec is None else spec.for_partition(partition)

    def _partition_dirs(self) -> dict[str, set[int]]:
        found: dict[str, set[int]] = {}
        for name in os.listdir(self.log_dir):
            parsed = parse_topic_partition_name(name)
            if parsed is None or not (self.log_dir / name).is_dir():
                continue
            try:
                validate_topic_name(parsed[0])
            except InvalidTopicError:
                logger.warning("ignoring directory %s: not a topic-partition", name)
                continue
            found.setdefault(parsed[0], set()).add(parsed[1])
        return found

    def _remove_delete_dirs(self) -> None:
        # What a delete renamed away before a crash (or a Kafka broker before its own).
        for name in os.listdir(self.log_dir):
            if is_delete_dir_name(name) and (self.log_dir / name).is_dir():
                logger.info("removing %s, left by a topic deletion", name)
                shutil.rmtree(self.log_dir / name, ignore_errors=True)

    def _finish_deletions(self, names: frozenset[str]) -> None:
        """Remove what is left of the deleted topics ``names`` (the caller holds
        ``self._lock``, and ``names`` are in ``self._deleting``): rename each of their
        partition directories to a ``delete_dir_name``, write both checkpoints (they no
        longer name those partitions), clear the names from ``deleting`` in the
        metadata file, then remove the renamed directories.

        Raises:
            OSError: a step failed. The names stay in ``deleting`` and their remaining
                directories stay hidden; the next open (or a ``create_topic`` of one
                of the names) tries again.
        """
        renamed: list[Path] = []
        failure: OSError | None = None
        try:
            for entry in sorted(os.listdir(self.log_dir)):
                parsed = parse_topic_partition_name(entry)
                if parsed is None or parsed[0] not in names:
                    continue
                if not (self.log_dir / entry).is_dir():
                    continue
                target = self.log_dir / delete_dir_name(*parsed)
                try:
                    os.rename(self.log_dir / entry, target)
                except OSError as exc:
                    failure = failure or exc  # rename the others all the same
                    continue
                renamed.append(target)
            fsync_directory(self.log_dir)
            self.checkpoint()
            if failure is not None:
                raise failure
            self._commit_topics(self._topics, self._deleting - names)
        finally:
            # Renamed directories are garbage from the moment of their rename, whatever
            # failed after it: a crash leaves them to ``_remove_delete_dirs``.
            for path in renamed:
                shutil.rmtree(path, ignore_errors=True)

    # -- topics ----------------------------------------------------------------------

    def topics(self) -> list[str]:
        """Topic names, sorted."""
        return sorted(self._topics)

    def topic(self, name: str) -> TopicMetadata:
        """Raises: UnknownTopicError."""
        try:
            return self._topics[name]
        except KeyError:
            raise UnknownTopicError(name) from None

    def topic_config(self, name: str) -> LogConfig:
        """The effective config of a topic: broker defaults + its overrides."""
        return self.broker_config.topic_log_config(self.topic(name).overrides)

    def create_topic(
        self,
        name: str,
        partitions: int | None = None,
        config: Mapping[str, str] | None = None,
        *,
        format: str | None = None,
        key_separator: str | None = None,
    ) -> TopicMetadata:
        """Create a topic with ``partitions`` (default ``num.partitions``) partitions,
        rendered in ``format`` (default: the manager's ``default_format``).

        Everything is validated before anything is written, the partition count
        against ``max.topic.partitions`` and, with the partitions the directory holds,
        ``max.broker.partitions`` (``BrokerConfig.validated_partition_count``): each
        partition holds descriptors, and a directory with more than a process may open
        would never open again. The metadata file is written first: it is the commit
        point. A crash before it leaves nothing; after it, missing partition
        directories are created on the next open. A partition log that fails to open
        (``EMFILE`` included) undoes the create (as a ``delete_topic``, after closing
        the logs it opened), so a failed create leaves no topic behind. What a deleted
        topic of the same name left on disk (see ``delete_topic``) is removed first,
        never adopted.

        Cost: about four descriptors and three mappings per partition, held while the
        topic exists; a directory and four files created per partition.

        Raises:
            InvalidTopicError: the name breaks Kafka's rules or collides ('.' vs '_').
            TopicExistsError: the topic exists.
            ConfigError: a bad override, format or separator, a partition count that
                is no whole number or is over either maximum, a setting the engine
                does not honour yet, or a partition directory name longer than a file
                name may be.
            ReadOnlyLogError: the manager is read-only.
            OSError: the metadata file cannot be written, a partition log cannot be
                created, or a deleted topic's directory of that name cannot be
                removed; no topic was created.
        """
        with self._lock:
            self._check_writable()
            if partitions is None:
                partitions = self.broker_config.num_partitions
            validate_new_topic_name(name)
            if format is None:
                format = self.default_format
            metadata = TopicMetadata(name, partitions, format, key_separator, dict(config or {}))
            if name in self._topics:
                raise TopicExistsError(name)
            for existing in self._topics:
                if collision_key(existing) == collision_key(name):
                    raise InvalidTopicError(name, f"collides with existing topic {existing!r}")
            self.broker_config.validated_partition_count(
                partitions, sum(topic.partitions for topic in self._topics.values())
            )
            problem = partition_dir_name_problem(name, partitions)
            if problem is not None:
                raise ConfigError("partitions", partitions, problem)
            log_config = self.broker_config.topic_log_config(metadata.overrides)
            log_config.require_supported()
            if name in self._deleting:
                self._finish_deletions(frozenset({name}))
            self._commit_topics({**self._topics, name: metadata}, self._deleting)
            # The directories this create makes (none is there: a deleted topic's went
            # first, and a directory of the name would have made it a topic at open).
            made = [
                path
                for path in (
                    self.log_dir / topic_partition_dir_name(name, partition)
                    for partition in range(partitions)
                )
                if not path.exists()
            ]
            try:
                for partition in range(partitions):
                    self._logs[(name, partition)] = Log.open(
                        self.log_dir / topic_partition_dir_name(name, partition),
                        log_config,
                        clock=self.clock,
                        extension=self._extension_for(metadata, partition),
                    )
                fsync_directory(self.log_dir)
            except BaseException:
                self._undo_create(metadata, made)
                raise
            logger.info("created topic %s with %d partition(s)", name, partitions)
            return metadata

    def _undo_create(self, metadata: TopicMetadata, made: Sequence[Path] = ()) -> None:
        """Delete the topic a failed ``create_topic`` committed (the caller holds
        ``self._lock``); a failure of the undo is logged, the create's error raised.
        ``made``: the partition directories the create made.

        The order is important below. The create may have failed for want of
        descriptors (``EMFILE``: other clients of a daemon hold the rest) or of room
        (``ENOSPC``), and the undo writes the metadata file and both checkpoints, which
        need a few descriptors and blocks: the logs the create opened (four descriptors
        each) are closed first, then the directories it made are removed (their
        preallocated indexes give their blocks back once closed: ``load_log`` closes
        what a failed load opened), before ``_delete`` writes anything. Removing them
        before the commit point of the delete loses nothing: they hold no record (the
        topic is new), and a crash before the metadata write leaves the topic
        committed without them, which the next open completes as after a crash right
        after the create's commit point. The topic goes whole, as in a delete.
        """
        for partition in range(metadata.partitions):
            log = self._logs.pop((metadata.name, partition), None)
            if log is not None:
                try:
                    log.close()
                except (OSError, StorageError) as exc:
                    logger.warning(
                        "topic %s: closing partition %d: %s", metadata.name, partition, exc
                    )
        for path in made:
            shutil.rmtree(path, ignore_errors=True)
        try:
            self._delete(metadata)
        except Exception:
            logger.exception("topic %s: undoing a failed create failed", metadata.name)

    def alter_topic_config(
        self,
        name: str,
        set_configs: Mapping[str, str] | None = None,
        delete_configs: Iterable[str] = (),
    ) -> LogConfig:
        """Set and/or remove topic-level overrides; the new config applies at once.

        Raises:
            UnknownTopicError: no such topic.
            ConfigError: an unknown key or a bad value (nothing is changed).
            ReadOnlyLogError: the manager is read-only.
        """
        with self._lock:
            self._check_writable()
            metadata = self.topic(name)
            overrides = dict(metadata.overrides)
            for key in delete_configs:
                if key not in TOPIC_CONFIG_NAMES:
                    raise unknown_topic_config(key)
                overrides.pop(key, None)
            overrides.update(set_configs or {})
            config = self.broker_config.topic_log_config(overrides)
            self._commit_topics(
                {**self._topics, name: metadata.with_overrides(overrides)}, self._deleting
            )
            for partition in range(metadata.partitions):
                log = self._logs.get((name, partition))
                if log is not None:
                    log.config = config
            return config

    def add_partitions(self, name: str, partitions: int) -> TopicMetadata:
        """Raise a topic's partition count to ``partitions``, as Kafka's
        ``kafka-topics.sh --alter --partitions``: increase only; the existing
        partitions keep their records, the new ones start empty at offset 0. Keyed
        records appended from now on map to ``murmur2(key) % partitions``, so a key's
        later records may go to another partition than its earlier ones (as in Kafka).

        Validated as ``create_topic`` validates a count (``max.topic.partitions``, the
        directory's ``max.broker.partitions``, the directory name length) before
        anything is written. The metadata file is the commit point: a crash after it
        leaves missing partition directories that the next open creates. A new log
        that fails to open (``EMFILE`` included) undoes the change: the logs opened
        are closed, their (empty) directories removed and the old count written back.

        Cost: as ``create_topic`` per new partition.

        Raises:
            UnknownTopicError: no such topic.
            ConfigError: ``partitions`` is not above the current count, or is over a
                maximum (nothing is changed).
            ReadOnlyLogError: the manager is read-only.
            OSError: the metadata file cannot be written or a new partition log
                cannot be created; the count is unchanged.
        """
        with self._lock:
            self._check_writable()
            metadata = self.topic(name)
            current = metadata.partitions
            others = sum(t.partitions for t in self._topics.values()) - current
            self.broker_config.validated_partition_count(partitions, others)
            if partitions <= current:
                raise ConfigError(
                    "partitions",
                    partitions,
                    f"topic {name!r} has {current} partition(s); the count can only be increased",
                )
            problem = partition_dir_name_problem(name, partitions)
            if problem is not None:
                raise ConfigError("partitions", partitions, problem)
            grown = replace(metadata, partitions=partitions)
            self._commit_topics({**self._topics, name: grown}, self._deleting)
            config = self.topic_config(name)
            added = range(current, partitions)
            try:
                for partition in added:
                    self._logs[(name, partition)] = Log.open(
                        self.log_dir / topic_partition_dir_name(name, partition),
                        config,
                        clock=self.clock,
                        extension=self._extension_for(grown, partition),
                    )
                fsync_directory(self.log_dir)
            except BaseException:
                # Undone in reverse: nothing was appended to the new logs yet. A failure
                # of the undo is logged; the error that caused it is the one raised.
                for partition in added:
                    log = self._logs.pop((name, partition), None)
                    try:
                        if log is not None:
                            log.close()
                    except (OSError, StorageError) as exc:
                        logger.warning("topic %s: closing partition %d: %s", name, partition, exc)
                    shutil.rmtree(
                        self.log_dir / topic_partition_dir_name(name, partition),
                        ignore_errors=True,
                    )
                try:
                    self._commit_topics({**self._topics, name: metadata}, self._deleting)
                except OSError:
                    logger.exception("topic %s: undoing a failed partition increase", name)
                raise
            logger.info(
                "topic %s: partitions %d -> %d (keyed records now map to murmur2(key) %% %d)",
                name,
                current,
                partitions,
                partitions,
            )
            return grown

    def set_topic_rendering(
        self, name: str, format: str, key_separator: str | None
    ) -> TopicMetadata:
        """Set how a topic's records render (``format``, ``key.separator``) while no
        record was ever appended to it; positions in its partition files depend on it,
        so it is fixed from the first record on.

        The metadata file is the commit point; the (empty) partition logs are then
        reopened so that their extension index follows the new rendering.

        Raises:
            UnknownTopicError: no such topic.
            TopicNotEmptyError: a partition already holds (or held) a record.
            ConfigError: an unknown format, or a separator the format does not take.
            ReadOnlyLogError: the manager is read-only.
        """
        with self._lock:
            self._check_writable()
            metadata = self.topic(name)
            if (format, key_separator) == (metadata.format, metadata.key_separator):
                return metadata
            logs = [self._logs[(name, p)] for p in range(metadata.partitions)]
            if any(log.log_end_offset > 0 for log in logs):
                raise TopicNotEmptyError(name, "format")
            changed = replace(metadata, format=format, key_separator=key_separator)
            self._commit_topics({**self._topics, name: changed}, self._deleting)
            config = self.topic_config(name)
            for partition, log in enumerate(logs):
                log.close()
                self._logs[(name, partition)] = Log.open(
                    log.dir,
                    config,
                    clock=self.clock,
                    extension=self._extension_for(changed, partition),
                )
            logger.info("topic %s: format %s, key separator %r", name, format, key_separator)
            return changed

    def delete_topic(self, name: str) -> None:
        """Delete a topic and all its data: all of it or, on a failure or a crash
        before the commit point, none of it.

        The metadata file is the commit point: it drops the topic and records its name
        in ``deleting``. Then the partition logs close, each partition directory is
        renamed to a ``delete_dir_name`` (Kafka's ``<topic>-<p>.<uuid>-delete``, the
        topic part cut to fit a file name), both checkpoints are written, the name
        leaves ``deleting``, and the renamed directories are removed. A step after
        the commit that fails only delays the removal of what is left (hidden from
        every view: the topic is deleted) to the next open or to a ``create_topic``
        of the name; it is logged, not raised.

        Cost: one metadata write, two checkpoint writes, a rename and a removal per
        partition, a scan of the log directory.

        Raises:
            UnknownTopicError: no such topic.
            ReadOnlyLogError: the manager is read-only.
            OSError: the metadata file cannot be written: nothing was deleted.
        """
        with self._lock:
            self._check_writable()
            self._delete(self.topic(name))
            logger.info("deleted topic %s", name)

    def _delete(self, metadata: TopicMetadata) -> None:
        # The order is important below. Until the metadata file drops the topic, the
        # topic is whole: nothing else was touched, its logs still serve. That write is
        # the commit point, and it names the topic in ``deleting`` so that from then on
        # its partition directories, wherever a crash or a failed rename leaves them,
        # are never loaded as a topic a Kafka broker made (the loader's rule for
        # directories the metadata does not name) nor adopted by a new topic of the
        # name: the next open and ``create_topic`` rename them away first. Renames
        # come before removal, so that a directory is never half removed under its
        # partition name. The checkpoints are rewritten before ``deleting`` lets go
        # of the name: a topic created again must not inherit the old partitions'
        # log start offsets or recovery points (Kafka's ``asyncDelete`` checkpoints
        # right after its rename for the same reason). Last the removal, which a
        # crash interrupts harmlessly: ``-delete`` directories are removed on open.
        name = metadata.name
        topics = {k: v for k, v in self._topics.items() if k != name}
        self._commit_topics(topics, self._deleting | {name})
        for partition in range(metadata.partitions):
            tp = (name, partition)
            self._unopened.discard(tp)
            self._dir_ids.pop(tp, None)
            log = self._logs.pop(tp, None)
            if log is None:
                continue
            try:
                log.close()
            except (OSError, StorageError) as exc:
                logger.warning("deleting %s-%d: closing its log failed: %s", name, partition, exc)
        try:
            self._finish_deletions(frozenset({name}))
        except OSError as exc:
            logger.warning(
                "deleted topic %s; its directories are removed at the next open: %s", name, exc
            )

    def log(self, topic: str, partition: int) -> Log:
        """The log of one partition.

        Cost: a dictionary lookup; read-only, the first call for a partition opens its
        log (its segments' files and indexes: O(segments)).

        Raises:
            UnknownTopicError: no such topic or partition.
            StorageError: read-only, the log cannot be opened.
        """
        tp = (topic, partition)
        log = self._logs.get(tp)  # no lock: a writer's every log is open already
        if log is None and tp in self._unopened:
            with self._lock:
                if tp in self._unopened:
                    self._open_unopened([tp])
                log = self._logs.get(tp)
        if log is not None:
            return log
        if topic in self._topics:
            raise UnknownTopicError(topic, partition)
        raise UnknownTopicError(topic)

    def logs(self) -> list[Log]:
        """Every log, sorted by topic and partition (a snapshot); read-only, this opens
        the ones not used yet."""
        with self._lock:
            if self._unopened:
                self._open_unopened(sorted(self._unopened))
            return [self._logs[tp] for tp in sorted(self._logs)]

    def describe_partition(self, topic: str, partition: int) -> PartitionDescription:
        log = self.log(topic, partition)
        return PartitionDescription(
            topic=topic,
            partition=partition,
            log_start_offset=log.log_start_offset,
            log_end_offset=log.log_end_offset,
            segment_count=log.number_of_segments,
            size=log.size,
            first_timestamp=log.first_timestamp(),
            last_timestamp=log.last_timestamp(),
        )

    def describe_topic(self, name: str) -> TopicDescription:
        metadata = self.topic(name)
        partitions = tuple(
            self.describe_partition(name, p)
            for p in range(metadata.partitions)
            if (name, p) in self._logs or (name, p) in self._unopened
        )
        return TopicDescription(metadata, self.topic_config(name), partitions)

    # -- maintenance (the daemon schedules these) ------------------------------------

    # Every method here is safe beside appends and reads in other threads: each log
    # takes its own lock, and a log closed meanwhile (its topic deleted) is skipped.
    # The owner asks ``next_maintenance_due_ms`` when to call them and sleeps until then.
    # Blocking: rolls fsync the sealed segment; flushes fsync; retention renames and
    # unlinks files. Run them off any event loop.

    def run_retention(self) -> int:
        """Apply retention to every log, then checkpoint log start offsets.

        Returns the number of segments deleted.
        """
        self._check_writable()
        deleted = sum(log.delete_old_segments() for log in self.logs())
        if deleted:
            self.checkpoint_log_start_offsets()
        return deleted

    def roll_due_segments(self) -> int:
        """Roll every active segment older than its ``segment.ms``; return how many."""
        self._check_writable()
        return sum(1 for log in self.logs() if log.roll_if_due())

    def delete_expired_files(self) -> int:
        """Unlink the ``.deleted`` files whose ``file.delete.delay.ms`` has passed."""
        return sum(log.delete_expired_files() for log in self.logs())

    def flush_dirty_logs(self) -> None:
        """fsync every log with unflushed data, then checkpoint the recovery points."""
        self._check_writable()
        for log in self.logs():
            log.flush()
        self.checkpoint_recovery_points()

    def flush_due_logs(self) -> int:
        """fsync the logs whose ``flush.ms`` has passed since their last flush; when
        any was, checkpoint the recovery points. Returns how many were flushed."""
        self._check_writable()
        now = self.clock.milliseconds()
        flushed = 0
        for log in self.logs():
            due = log.next_flush_due_ms()
            if due is not None and due <= now:
                log.flush()
                flushed += 1
        if flushed:
            self.checkpoint_recovery_points()
        return flushed

    def next_maintenance_due_ms(self) -> int:
        """The earliest time any maintenance is due: a roll by ``segment.ms``, a
        retention check (at the latest every ``log.retention.check.interval.ms``, as
        Kafka; sooner when a segment's ``retention.ms`` runs out), a delayed file
        deletion, a flush by ``flush.ms``.

        Cost: O(partitions); each log reads cached facts.
        """
        now = self.clock.milliseconds()
        due = now + self.broker_config.log_retention_check_interval_ms
        for log in self.logs():
            for when in (
                log.next_roll_due_ms(),
                log.next_retention_due_ms(),
                log.next_file_deletion_due_ms(),
                log.next_flush_due_ms(),
            ):
                if when is not None:
                    due = min(due, when)
        return max(due, now)

    def clean(
        self,
        topics: Iterable[str] | None = None,
        *,
        force: bool = False,
        until_clean: bool = False,
    ) -> CleanSummary:
        """Run a cleaning pass (log compaction) over each compacted log that is due,
        dirtiest first, and checkpoint where each stopped (``cleaner-offset-checkpoint``).

        Due, as Kafka's cleaner decides: a dirty ratio above ``min.cleanable.dirty.ratio``,
        or a sealed dirty record older than ``max.compaction.lag.ms``; ``force`` cleans
        every compacted log with anything cleanable (what ``seglogfs compact`` asks).
        ``topics`` limits the logs (None: all); a named topic whose policy has no
        ``compact`` is skipped, as is a log whose pass failed (damage, or changed under the
        pass: the reason is in ``skipped``). ``until_clean`` repeats passes on a log until
        its dirty section is clean (a log with more keys than the offset map holds needs
        several); otherwise one pass a log.

        Appends and reads go on meanwhile, in other threads; the manager's lock is not
        held while a log is cleaned. The offset map is ``log.cleaner.dedupe.buffer.size``
        over ``log.cleaner.threads`` (see ``OffsetMap``).

        Cost: per pass, see ``storage/log/cleaner.py``.

        Raises:
            UnknownTopicError: a named topic does not exist.
            ReadOnlyLogError: the manager is read-only or closed.
            OSError: a cleaned segment or the checkpoint could not be written (the log
                is whole; the pass is lost).
        """
        self._check_writable()
        with self._lock:
            wanted = None if topics is None else {self.topic(name).name for name in topics}
            logs = [log for log in self.logs() if wanted is None or log.topic in wanted]
        skipped: list[tuple[str, int, str]] = []
        for log in logs:
            if not log.config.compact and wanted is not None:
                skipped.append((log.topic, log.partition, "cleanup.policy has no compact"))
        cleaner = self.broker_config.cleaner
        offset_map = OffsetMap(cleaner.offset_map_memory, cleaner.io_buffer_load_factor)
        now = self.clock.milliseconds()
        results: list[LogCleanResult] = []
        for to_clean in self.cleaner_manager.logs_to_clean(logs, now, force=force):
            log = to_clean.log
            if self._cleaning_abort.is_set():
                skipped.append((log.topic, log.partition, "cleaning aborted (shutting down)"))
                continue
            if not self.cleaner_manager.begin_cleaning(log):
                skipped.append((log.topic, log.partition, "being cleaned"))
                continue
            outcome = self._clean_log(log, to_clean.first_dirty_offset, offset_map, until_clean)
            if isinstance(outcome, str):
                skipped.append((log.topic, log.partition, outcome))
            else:
                results.append(outcome)
        return CleanSummary(tuple(results), tuple(skipped))

    def _clean_log(
        self, log: Log, first_dirty: int, offset_map: OffsetMap, until_clean: bool
    ) -> LogCleanResult | str:
        # Passes over one log marked in progress; the checkpoint moves after each
        # pass (a crash later re-cleans from there at worst: cleaning is idempotent).
        segments_before, bytes_before = log.number_of_segments, log.size
        passes = read = kept = 0
        end = first_dirty
        more = True
        try:
            while more:
                end, stats = log.clean(
                    offset_map, first_dirty_offset=first_dirty, abort=self._cleaning_abort
                )
                passes += 1
                read += stats.records_read
                kept += stats.records_written
                self.cleaner_manager.update_checkpoint(log, end)
                following = cleanable_offsets(log, end, self.clock.milliseconds())
                more = end < following.first_uncleanable_offset and end > first_dirty
                first_dirty = end
                if not until_clean:
                    break
        except (LogCleaningAbortedError, CorruptRecordError) as exc:
            logger.warning("%s-%d: cleaning stopped: %s", log.topic, log.partition, exc)
            return str(exc)
        finally:
            self.cleaner_manager.done_cleaning(log, None)
        return LogCleanResult(
            log.topic,
            log.partition,
            passes,
            segments_before,
            log.number_of_segments,
            bytes_before,
            log.size,
            read,
            kept,
            end,
            more,
        )

    def checkpoint(self) -> None:
        """Write both checkpoint files (and drop deleted partitions' cleaner checkpoints)."""
        self.checkpoint_recovery_points()
        self.checkpoint_log_start_offsets()
        with self._lock:
            self.cleaner_manager.retain_only(self._logs)

    def checkpoint_recovery_points(self) -> None:
        with self._lock:
            offsets = {(log.topic, log.partition): log.recovery_point for log in self.logs()}
            write_offset_checkpoint(self.log_dir / RECOVERY_POINT_CHECKPOINT, offsets)

    def checkpoint_log_start_offsets(self) -> None:
        with self._lock:
            offsets = {(log.topic, log.partition): log.log_start_offset for log in self.logs()}
            write_offset_checkpoint(self.log_dir / LOG_START_OFFSET_CHECKPOINT, offsets)

    def refresh(self) -> None:
        """Read-only managers: follow the writer (new, deleted and re-created topics,
        new partitions, new data).

        A partition directory that is gone, or is another directory than the one its
        log was opened on (the topic was deleted and created again), closes that log;
        a new one is opened on what is there now, on first use.
        """
        with self._lock:
            document = read_topics_document(self.log_dir / SEGLOG_TOPICS_FILE)
            found = self._partition_dirs()
            topics = self._with_found_topics(document.topics, found, document.deleting)
            for tp, log in list(self._logs.items()):
                directory = self.log_dir / topic_partition_dir_name(*tp)
                identity = _directory_identity(directory)
                if identity is None or identity != self._dir_ids.get(tp):
                    log.close()
                    del self._logs[tp]
                    self._dir_ids.pop(tp, None)
            self._topics = topics
            self._deleting = document.deleting
            # New partitions (and those re-created) are opened on first use, like the
            # ones found at open; partitions gone since, and those a deletion in
            # progress leaves, are forgotten.
            on_disk = {
                (topic, p)
                for topic, partitions in found.items()
                if topic in topics
                for p in partitions
            }
            self._unopened = on_disk - self._logs.keys()
            for log in self._logs.values():
                log.refresh()

    # -- lifecycle -------------------------------------------------------------------

    def _check_writable(self) -> None:
        if self.read_only:
            raise ReadOnlyLogError(f"log directory {self.log_dir} is open read-only")
        if self._closed:
            raise ReadOnlyLogError(f"log directory {self.log_dir} is closed")

    def _commit_topics(self, topics: dict[str, TopicMetadata], deleting: frozenset[str]) -> None:
        """Write the metadata file, then make ``topics`` and ``deleting`` the manager's
        (the caller holds ``self._lock``): a failed write changes nothing.

        Raises:
            OSError: the file could not be written.
        """
        write_topics_file(self.log_dir / SEGLOG_TOPICS_FILE, topics, deleting)
        self._topics = topics
        self._deleting = frozenset(n for n in deleting if n not in topics)

    def _close_logs(self) -> None:
        for log in self._logs.values():
            log.close()

    def abort_cleaning(self) -> None:
        """Stop the cleaning passes in progress at their next batch, and any later one
        at its first (Kafka's ``abortCleaning`` on shutdown): what a pass wrote is
        removed, the logs are as they were (``LogCleaningAbortedError`` in the pass's
        thread; its log is named in ``CleanSummary.skipped``). For a shutdown that must
        not wait for a pass over a large log. Cost: O(1)."""
        self._cleaning_abort.set()

    def close(self) -> None:
        """Flush and close every log, checkpoint, mark the shutdown clean, unlock. A
        cleaning pass in another thread is aborted first (``abort_cleaning``)."""
        self._cleaning_abort.set()
        with self._lock:
            if self._closed:
                return
            try:
                self._close_logs()
                if not self.read_only:
                    self.checkpoint()
                    # Crash safety: the marker is written last, after every byte and
                    # checkpoint is durable; its presence promises exactly that.
                    write_atomically(self.log_dir / CLEAN_SHUTDOWN_FILE, b"")
            finally:
                self._closed = True
                self._dir_lock.release()

    def __enter__(self) -> LogManager:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _directory_identity(directory: Path) -> tuple[int, int] | None:
    """(device, inode) of a directory, None when it does not exist."""
    try:
        st = os.stat(directory)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino

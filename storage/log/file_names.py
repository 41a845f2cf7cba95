"""Every file name the storage engine reads or writes, in one place (Kafka's LogFileUtils).

A partition directory ``<topic>-<partition>`` holds segments named by their base offset
in 20 zero-padded digits: ``00000000000000368769.log`` / ``.index`` / ``.timeindex``.
Names the project adds (``SEGLOG_*``) are ones Kafka never uses, so the directory stays
a valid Kafka log directory. Thread-safe: pure functions, but for the random uuid
of ``delete_dir_name``.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path

from ..number import INT_MAX, parse_java_integer

LOG_FILE_SUFFIX = ".log"
INDEX_FILE_SUFFIX = ".index"
TIME_INDEX_FILE_SUFFIX = ".timeindex"
TXN_INDEX_FILE_SUFFIX = ".txnindex"
PRODUCER_SNAPSHOT_FILE_SUFFIX = ".snapshot"
DELETED_FILE_SUFFIX = ".deleted"
CLEANED_FILE_SUFFIX = ".cleaned"
SWAP_FILE_SUFFIX = ".swap"
ENGINE_FILE_SUFFIXES = frozenset(
    {
        LOG_FILE_SUFFIX,
        INDEX_FILE_SUFFIX,
        TIME_INDEX_FILE_SUFFIX,
        TXN_INDEX_FILE_SUFFIX,
        PRODUCER_SNAPSHOT_FILE_SUFFIX,
        DELETED_FILE_SUFFIX,
        CLEANED_FILE_SUFFIX,
        SWAP_FILE_SUFFIX,
    }
)
"""Suffixes Kafka and the engine give meaning to; an extension index may use none."""

RECOVERY_POINT_CHECKPOINT = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"
"""Kafka's marker of a clean shutdown: present = no recovery needed on the next open."""

SEGLOG_LOCK_FILE = ".seglog.lock"
"""The writer lock (a write lock on a 0600 file, see ``lock_file``); a name Kafka does
not use."""
SEGLOG_TOPICS_FILE = "seglog-topics.json"
"""Topic metadata Kafka keeps in its controller: partition count, format, overrides."""

MAX_FILE_NAME_BYTES = 255
"""The longest file name Linux file systems take (``NAME_MAX``); Kafka assumes it too."""
DELETE_DIR_SUFFIX = "-delete"

# Kafka's renamed-away partition directories: <topic>-<partition>.<uuid>-delete/-future/-stray
# (the topic cut short in -delete and -stray names, see ``delete_dir_name``).
_TOPIC_PARTITION = re.compile(r"(?P<topic>.+)-(?P<partition>[0-9]+)")
_IGNORED_DIR = re.compile(r".+-[0-9]+\.[0-9a-f]{32}-(delete|future|stray)")
_DELETE_DIR = re.compile(r".+-[0-9]+\.[0-9a-f]{32}" + DELETE_DIR_SUFFIX)
_SEGMENT_PREFIX = re.compile(r"[0-9]{20}")
METADATA_TOPIC = "__cluster_metadata"
"""KRaft's metadata log: a log directory may hold it, it is not a data topic."""


def filename_prefix_from_offset(offset: int) -> str:
    """The 20-digit zero-padded base offset that names a segment's files."""
    return f"{offset:020d}"


def log_file(directory: Path, offset: int, suffix: str = "") -> Path:
    return directory / f"{filename_prefix_from_offset(offset)}{LOG_FILE_SUFFIX}{suffix}"


def offset_index_file(directory: Path, offset: int, suffix: str = "") -> Path:
    return directory / f"{filename_prefix_from_offset(offset)}{INDEX_FILE_SUFFIX}{suffix}"


def time_index_file(directory: Path, offset: int, suffix: str = "") -> Path:
    return directory / f"{filename_prefix_from_offset(offset)}{TIME_INDEX_FILE_SUFFIX}{suffix}"


def extension_index_file(directory: Path, offset: int, extension: str, suffix: str = "") -> Path:
    """The file of a segment's extension index (``extension`` is its spec's suffix)."""
    return directory / f"{filename_prefix_from_offset(offset)}{extension}{suffix}"


def offset_from_file_name(name: str) -> int | None:
    """The base offset a segment file name starts with, or None if it is not one."""
    prefix = name.split(".", 1)[0]
    if not _SEGMENT_PREFIX.fullmatch(prefix):  # ASCII digits only: int() takes others
        return None
    return int(prefix)


def topic_partition_dir_name(topic: str, partition: int) -> str:
    return f"{topic}-{partition}"


def partition_dir_name_problem(topic: str, partitions: int) -> str | None:
    """Why the directories of a topic's ``partitions`` partitions cannot be created (a
    name over ``MAX_FILE_NAME_BYTES``: a 249-character topic from partition 100000
    on), or None when they can."""
    longest = topic_partition_dir_name(topic, partitions - 1)
    size = len(longest.encode())
    if size <= MAX_FILE_NAME_BYTES:
        return None
    return (
        f"the directory of partition {partitions - 1} would be named with {size} bytes, "
        f"over the {MAX_FILE_NAME_BYTES} a file name may have"
    )


def delete_dir_name(topic: str, partition: int) -> str:
    """A fresh name to rename a deleted partition's directory to before removing it:
    ``<topic>-<partition>.<uuid>-delete`` (Kafka's ``LocalLog.logDeleteDirName``).

    The topic part is cut so that the name fits ``MAX_FILE_NAME_BYTES``: with a
    32-digit uuid the full name of a 249-character topic would be 291 bytes. The cut
    name identifies no topic; nothing needs it to (the directory is only removed).
    Topic names are ASCII, so characters are bytes.
    """
    suffix = f"-{partition}.{uuid.uuid4().hex}{DELETE_DIR_SUFFIX}"
    return topic[: MAX_FILE_NAME_BYTES - len(suffix)] + suffix


def is_delete_dir_name(name: str) -> bool:
    """Whether ``name`` is a renamed-away partition directory waiting for removal (one
    ``delete_dir_name`` or Kafka made), as Kafka's loader recognises them."""
    return _DELETE_DIR.fullmatch(name) is not None


def parse_topic_partition_name(name: str) -> tuple[str, int] | None:
    """``(topic, partition)`` for a partition directory name, else None.

    Kafka's renamed-away directories (``.<uuid>-delete``, ``-future``, ``-stray``) and
    KRaft's ``__cluster_metadata-0`` are not data partitions and give None; nor does a
    partition number over Kafka's INT (``t-99999999999`` would have made a topic of
    10^11 partitions, whose missing directories a writable open creates).
    """
    if _IGNORED_DIR.fullmatch(name):
        return None
    match = _TOPIC_PARTITION.fullmatch(name)
    if match is None:
        return None
    topic = match.group("topic")
    partition = parse_java_integer(match.group("partition"), 0, INT_MAX)
    if topic == METADATA_TOPIC or partition is None:
        return None
    return topic, partition

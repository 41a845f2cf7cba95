"""Every file name the storage engine reads or writes, in one place (Kafka's LogFileUtils).

A partition directory ``<topic>-<partition>`` holds segments named by their base offset
in 20 zero-padded digits: ``00000000000000368769.log`` / ``.index`` / ``.timeindex``.
Names the project adds (``SEGLOG_*``) are ones Kafka never uses, so the directory stays
a valid Kafka log directory. Pure functions: thread-safe.
"""

from __future__ import annotations

import re
from pathlib import Path

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
"""The writer lock (flock); a name Kafka does not use."""
SEGLOG_TOPICS_FILE = "seglog-topics.json"
"""Topic metadata Kafka keeps in its controller: partition count, format, overrides."""

# Kafka's renamed-away partition directories: <topic>-<partition>.<uuid>-delete/-future/-stray
_TOPIC_PARTITION = re.compile(r"(?P<topic>.+)-(?P<partition>[0-9]+)")
_IGNORED_DIR = re.compile(r".+-[0-9]+\.[0-9a-f]{32}-(delete|future|stray)")
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


def parse_topic_partition_name(name: str) -> tuple[str, int] | None:
    """``(topic, partition)`` for a partition directory name, else None.

    Kafka's renamed-away directories (``.<uuid>-delete``, ``-future``, ``-stray``) and
    KRaft's ``__cluster_metadata-0`` are not data partitions and give None.
    """
    if _IGNORED_DIR.fullmatch(name):
        return None
    match = _TOPIC_PARTITION.fullmatch(name)
    if match is None:
        return None
    topic = match.group("topic")
    if topic == METADATA_TOPIC:
        return None
    return topic, int(match.group("partition"))

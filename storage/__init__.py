"""seglog storage: a pure-Python segmented log whose files are Apache Kafka's format.

Two layers, as Kafka groups its code, each a subpackage whose ``__init__`` lists its
modules:

- ``record``, the record format (Kafka's ``common/record``): records and batches
  (``record``, ``record_batch``, ``batch_builder``, ``legacy_record``,
  ``compression``, ``varint``), records as columns and rendered (``record_columns``,
  ``render``), and a segment's ``.log`` file (``file_records``).
- ``log``, built on ``record`` (Kafka's ``storage/internals/log``): index files
  (``offset_index``, ``time_index``, ``extension_index`` over ``index``), a segment
  (``segment``), the sorted segment map (``log_segments``), a partition log with roll
  and retention (``log``) and its recovery (``log_loader``), and the log directory with
  topics, checkpoints and the writer lock (``log_manager``, ``topic``, ``checkpoint``,
  ``lock_file``), settings (``log_config``, ``properties``) and file names
  (``file_names``).
- ``group``, built on ``log`` (Kafka's ``group-coordinator``): consumer groups'
  committed offsets in ``__consumer_offsets`` (``coordinator_record``,
  ``offsets_topic``, ``offset_store``) and their errors (``errors``).

At the top level, beside them: the one exception tree of both (``errors``), the clock
and the atomic file replacement the log uses (``clock``, ``atomic_file``), numbers read
from text as Java reads them, bounded before they are built (``number``), Kafka's key
partitioner (``partitioner``) and the choice of build (``_build``).

The public API is this module's ``__all__``; the subpackages re-export nothing.

This package never imports trio, pyfuse3, pyspark or seglogfs.

``compiled`` tells whether the mypyc-compiled hot modules are in use, ``build_info``
why (see ``_build``).
"""

# First: ``_build`` chooses the compiled or the source modules before any is imported.
from ._build import SELECTION
from .clock import SYSTEM_CLOCK, Clock, SystemClock
from .errors import (
    ConfigError,
    CorruptCheckpointError,
    CorruptIndexError,
    CorruptRecordError,
    IndexFullError,
    InvalidOffsetError,
    InvalidRecordError,
    InvalidTopicError,
    JsonRecordError,
    LogCleaningAbortedError,
    LogDirLockedError,
    OffsetOutOfRangeError,
    ReadOnlyLogError,
    RecordTooLargeError,
    SegmentDeletedError,
    StorageError,
    TopicError,
    TopicExistsError,
    TopicNotEmptyError,
    UnknownTopicError,
)
from .group.coordinator_record import OffsetCommitValue
from .group.errors import (
    GroupError,
    GroupIdNotFoundError,
    InvalidGroupIdError,
    NonEmptyGroupError,
    NoOffsetForPartitionError,
    PartitionAssignedError,
    UnknownMemberIdError,
)
from .group.offset_store import GroupDescription, MemberDescription, OffsetStore
from .group.offsets_topic import OFFSETS_TOPIC, GroupConfig, java_string_hash, partition_for_group
from .log.cleaner import CleanerStats, CleaningStep
from .log.cleaner_manager import CleanSummary, LogCleanResult
from .log.extension_index import ExtensionIndexSpec
from .log.fetch_data import FetchData, FileRegion
from .log.log import AppendInfo, Log
from .log.log_config import BrokerConfig, CleanerConfig, LogConfig
from .log.log_manager import LogManager, PartitionDescription, TopicDescription
from .log.offset_map import OffsetMap
from .log.properties import load_properties, parse_properties
from .log.topic import TopicMetadata, validate_topic_name
from .partitioner import StickyPartitioner, murmur2, partition_for_key, to_positive
from .record.batch_builder import build_record_batch
from .record.json_format import (
    JsonRecord,
    json_rendered_size,
    parse_json_lines,
    parse_json_record,
    render_json_batch,
)
from .record.record import CompressionType, Header, Record, TimestampType
from .record.record_batch import DefaultRecordBatch, LegacyRecordBatch, RecordBatch, iter_batches
from .record.record_columns import RecordColumns
from .record.render import RenderedBatch, render_batch, rendered_size

compiled: bool = SELECTION.compiled
"""True when the mypyc-compiled hot modules run (see ``build_info`` for why or why not)."""
build_info: str = SELECTION.reason
"""Which build runs and why, e.g. ``compiled (mypyc 2.4.1)``."""

__all__ = [
    "OFFSETS_TOPIC",
    "SYSTEM_CLOCK",
    "AppendInfo",
    "BrokerConfig",
    "CleanSummary",
    "CleanerConfig",
    "CleanerStats",
    "CleaningStep",
    "Clock",
    "CompressionType",
    "ConfigError",
    "CorruptCheckpointError",
    "CorruptIndexError",
    "CorruptRecordError",
    "DefaultRecordBatch",
    "ExtensionIndexSpec",
    "FetchData",
    "FileRegion",
    "GroupConfig",
    "GroupDescription",
    "GroupError",
    "GroupIdNotFoundError",
    "Header",
    "IndexFullError",
    "InvalidGroupIdError",
    "InvalidOffsetError",
    "InvalidRecordError",
    "InvalidTopicError",
    "JsonRecord",
    "JsonRecordError",
    "LegacyRecordBatch",
    "Log",
    "LogCleanResult",
    "LogCleaningAbortedError",
    "LogConfig",
    "LogDirLockedError",
    "LogManager",
    "MemberDescription",
    "NoOffsetForPartitionError",
    "NonEmptyGroupError",
    "OffsetCommitValue",
    "OffsetMap",
    "OffsetOutOfRangeError",
    "OffsetStore",
    "PartitionAssignedError",
    "PartitionDescription",
    "ReadOnlyLogError",
    "Record",
    "RecordBatch",
    "RecordColumns",
    "RecordTooLargeError",
    "RenderedBatch",
    "SegmentDeletedError",
    "StickyPartitioner",
    "StorageError",
    "SystemClock",
    "TimestampType",
    "TopicDescription",
    "TopicError",
    "TopicExistsError",
    "TopicMetadata",
    "TopicNotEmptyError",
    "UnknownMemberIdError",
    "UnknownTopicError",
    "build_info",
    "build_record_batch",
    "compiled",
    "iter_batches",
    "java_string_hash",
    "json_rendered_size",
    "load_properties",
    "murmur2",
    "parse_json_lines",
    "parse_json_record",
    "parse_properties",
    "partition_for_group",
    "partition_for_key",
    "render_batch",
    "render_json_batch",
    "rendered_size",
    "to_positive",
    "validate_topic_name",
]

"""seglog storage: a pure-Python segmented log whose files are Apache Kafka's format.

The layers, bottom up: records and batches (``record``, ``record_batch``,
``batch_builder``, ``legacy_record``, ``compression``), index files (``offset_index``,
``time_index``), a segment (``segment``), the sorted segment map (``log_segments``), a
partition log with roll and retention (``log``) and its recovery (``log_loader``), and
the log directory with topics, checkpoints and the writer lock (``log_manager``).

This package never imports trio, pyfuse3, pyspark or seglogfs.

``compiled`` tells whether the mypyc-compiled hot modules are in use, ``build_info``
why (see ``_build``).
"""

# First: ``_build`` chooses the compiled or the source modules before any is imported.
from ._build import SELECTION
from .batch_builder import build_record_batch
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
from .extension_index import ExtensionIndexSpec
from .log import AppendInfo, Log
from .log_config import BrokerConfig, LogConfig
from .log_manager import LogManager, PartitionDescription, TopicDescription
from .partitioner import StickyPartitioner, murmur2, partition_for_key, to_positive
from .properties import load_properties, parse_properties
from .record import CompressionType, Header, Record, TimestampType
from .record_batch import DefaultRecordBatch, LegacyRecordBatch, RecordBatch, iter_batches
from .record_columns import RecordColumns
from .render import RenderedBatch, render_batch, rendered_size
from .topic import TopicMetadata, validate_topic_name

compiled: bool = SELECTION.compiled
"""True when the mypyc-compiled hot modules run (see ``build_info`` for why or why not)."""
build_info: str = SELECTION.reason
"""Which build runs and why, e.g. ``compiled (mypyc 2.4.1)``."""

__all__ = [
    "SYSTEM_CLOCK",
    "AppendInfo",
    "BrokerConfig",
    "Clock",
    "CompressionType",
    "ConfigError",
    "CorruptCheckpointError",
    "CorruptIndexError",
    "CorruptRecordError",
    "DefaultRecordBatch",
    "ExtensionIndexSpec",
    "Header",
    "IndexFullError",
    "InvalidOffsetError",
    "InvalidRecordError",
    "InvalidTopicError",
    "LegacyRecordBatch",
    "Log",
    "LogConfig",
    "LogDirLockedError",
    "LogManager",
    "OffsetOutOfRangeError",
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
    "UnknownTopicError",
    "build_info",
    "build_record_batch",
    "compiled",
    "iter_batches",
    "load_properties",
    "murmur2",
    "parse_properties",
    "partition_for_key",
    "render_batch",
    "rendered_size",
    "to_positive",
    "validate_topic_name",
]

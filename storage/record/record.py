"""The record: the unit a producer writes and a consumer reads.

``Record`` is format-independent: v2 batches and legacy v0/v1 messages decode to it.
It is immutable and thread-safe.
"""

from __future__ import annotations

from enum import IntEnum
from typing import NamedTuple

Header = tuple[str, bytes | None]
"""A record header: a UTF-8 key and a nullable value."""


class TimestampType(IntEnum):
    """How a record's timestamp was set (Kafka's ``TimestampType``)."""

    NO_TIMESTAMP_TYPE = -1  # magic 0 messages carry no timestamp
    CREATE_TIME = 0
    LOG_APPEND_TIME = 1

    @property
    def display_name(self) -> str:
        """Kafka's name for the type, as ``DumpLogSegments`` prints it."""
        return _TIMESTAMP_TYPE_NAMES[self]


_TIMESTAMP_TYPE_NAMES = {
    TimestampType.NO_TIMESTAMP_TYPE: "NoTimestampType",
    TimestampType.CREATE_TIME: "CreateTime",
    TimestampType.LOG_APPEND_TIME: "LogAppendTime",
}


class CompressionType(IntEnum):
    """Codec ids of the attributes' bits 0-2, as Kafka numbers them."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4

    @property
    def config_name(self) -> str:
        """The ``compression.type`` value naming this codec."""
        return "uncompressed" if self is CompressionType.NONE else self.name.lower()


NO_TIMESTAMP = -1


class Record(NamedTuple):
    """One record as a consumer sees it.

    A NamedTuple rather than a dataclass: decoding creates one per record on the
    read path, and tuple construction is the cheapest object Python makes.
    """

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()
    timestamp_type: TimestampType = TimestampType.CREATE_TIME

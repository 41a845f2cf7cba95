"""The storage engine's exceptions: one tree, each error carrying its context.

``StorageError`` is the root; callers that only need "the log said no" catch it.
The branches draw these lines:

- ``CorruptRecordError`` / ``CorruptIndexError`` / ``CorruptCheckpointError``: bytes on
  disk are not what the format promises. Records are never served past such a point;
  indexes are rebuilt; a checkpoint is an operator's problem (Kafka refuses to start).
- ``IndexFullError``, ``InvalidOffsetError``: a caller broke an index or log invariant.
- ``OffsetOutOfRangeError``: a well-formed request for an offset the log does not
  hold (below the log start or past the log end), as Kafka's fetch reports it. Its
  child ``SegmentDeletedError``: a read found its segment closed under it (retention
  deleted it, or the log closed); the caller repositions at the log start offset.
- ``RecordTooLargeError``: a record (batch) over ``max.message.bytes``; nothing appended.
- ``InvalidRecordError``: a client-built batch that is well-formed bytes but breaks a
  rule the log enforces (Kafka's ``LogValidator``); nothing appended.
- ``JsonRecordError``: a line written to a ``json`` topic that is not a record object.
- ``ConfigError``: a configuration key or value that Kafka would reject.
- ``TopicError`` and its children: the topic namespace (names, existence).
- ``LogDirLockedError``: another process already writes this log directory.
- ``ReadOnlyLogError``: a mutation was asked of a log opened read-only.
- ``LogCleaningAbortedError``: a cleaning pass gave up on a log that changed under
  it (Kafka's ``LogCleaningAbortedException``); what it swapped in stays, the rest is
  as it was.
"""

from __future__ import annotations

from pathlib import Path


class StorageError(Exception):
    """Root of every error raised by the ``storage`` package."""


class CorruptRecordError(StorageError):
    """Bytes at ``position`` of ``path`` are not a valid record batch.

    Raised for a bad CRC, an impossible length or magic, a batch that runs past the
    bytes its segment holds (outside the unflushed tail recovery owns), offsets that go
    backwards, or a record that does not parse. ``path`` is ``None`` for in-memory
    buffers; ``offset`` is the first offset a read could not serve there (-1 when the
    error did not come from reading a log).
    """

    def __init__(
        self,
        message: str,
        path: Path | str | None = None,
        position: int = -1,
        *,
        offset: int = -1,
    ) -> None:
        where = f"{path}" if path is not None else "buffer"
        if position >= 0:
            where += f" at byte {position}"
        if offset >= 0:
            where += f", offset {offset}"
        super().__init__(f"corrupt record in {where}: {message}")
        self.reason = message
        self.path = path
        self.position = position
        self.offset = offset


class CorruptIndexError(StorageError):
    """An index file fails its sanity check; it is rebuildable from its log."""

    def __init__(self, path: Path | str, message: str) -> None:
        super().__init__(f"corrupt index {path}: {message}")
        self.path = path


class IndexFullError(StorageError, IndexError):
    """An index append found no free slot: the index holds ``entries`` entries.

    The log never meets it: it rolls the segment when an index ``is_full`` before
    appending (Kafka raises ``IllegalArgumentException`` here).
    """

    def __init__(self, path: Path | str, entries: int) -> None:
        super().__init__(f"attempt to append to a full index {path} ({entries} entries)")
        self.path = path
        self.entries = entries


class CorruptCheckpointError(StorageError):
    """A checkpoint file at ``path`` does not parse (``line`` is 1-based, 0 if unknown)."""

    def __init__(self, path: Path | str, line: int, message: str) -> None:
        where = f"{path}, line {line}" if line else f"{path}"
        super().__init__(f"malformed checkpoint file {where}: {message}")
        self.path = path
        self.line = line


class InvalidOffsetError(StorageError):
    """An append would break the monotonic offsets of a log or index."""


class OffsetOutOfRangeError(StorageError):
    """``offset`` lies outside ``[log_start_offset, log_end_offset]``."""

    def __init__(self, offset: int, log_start_offset: int, log_end_offset: int) -> None:
        super().__init__(
            f"offset {offset} is out of range: the log holds [{log_start_offset}, {log_end_offset})"
        )
        self.offset = offset
        self.log_start_offset = log_start_offset
        self.log_end_offset = log_end_offset


class SegmentDeletedError(OffsetOutOfRangeError):
    """The segment file a read was using is closed: retention deleted it (after
    ``file.delete.delay.ms``) or the log was closed while the read was under way.

    What was already returned is valid; what follows is gone. Readers reposition at the
    log start offset (Kafka's ``auto.offset.reset=earliest``) or report the loss.
    ``offset`` is -1 when the read did not know which offset it wanted next.
    """

    def __init__(self, path: Path | str, offset: int = -1) -> None:
        StorageError.__init__(self, f"segment file {path} was deleted while it was being read")
        self.path = path
        self.offset = offset
        self.log_start_offset = -1
        self.log_end_offset = -1


class RecordTooLargeError(StorageError):
    """A batch of ``size`` bytes exceeds ``max.message.bytes`` (``limit``)."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"record batch of {size} bytes exceeds max.message.bytes={limit}")
        self.size = size
        self.limit = limit


class InvalidRecordError(StorageError, ValueError):
    """A client batch breaks a rule of the log (Kafka's ``InvalidRecordException``):
    inconsistent offsets and count, a control or transactional batch, a bad sequence."""

    def __init__(self, message: str, position: int = -1) -> None:
        where = f" (batch at byte {position} of the request)" if position >= 0 else ""
        super().__init__(f"invalid record batch{where}: {message}")
        self.reason = message
        self.position = position


class JsonRecordError(StorageError, ValueError):
    """A line written to a ``json`` topic is not a record object of that format
    (``storage.record.json_format``); ``reason`` says why. Nothing appended."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"not a json record: {reason}")
        self.reason = reason


class ConfigError(StorageError, ValueError):
    """A configuration ``key`` has an unacceptable ``value``."""

    def __init__(self, key: str, value: object, reason: str) -> None:
        super().__init__(f"invalid value {value!r} for configuration {key}: {reason}")
        self.key = key
        self.value = value
        self.reason = reason


class TopicError(StorageError):
    """Root of errors about the topic namespace."""


class InvalidTopicError(TopicError, ValueError):
    """A topic name breaks Kafka's rules (``[a-zA-Z0-9._-]``, 1-249 chars, not . or ..)."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"invalid topic name {name!r}: {reason}")
        self.name = name


class TopicExistsError(TopicError):
    """A topic of that name already exists."""

    def __init__(self, name: str) -> None:
        super().__init__(f"topic {name!r} already exists")
        self.name = name


class TopicNotEmptyError(TopicError):
    """A change allowed only before a topic's first record (its format) came after it."""

    def __init__(self, name: str, what: str) -> None:
        super().__init__(f"topic {name!r} already holds records: its {what} is fixed")
        self.name = name


class UnknownTopicError(TopicError):
    """No topic (or partition) of that name exists."""

    def __init__(self, name: str, partition: int | None = None) -> None:
        what = f"topic {name!r}" if partition is None else f"partition {name}-{partition}"
        super().__init__(f"{what} does not exist")
        self.name = name
        self.partition = partition


class LogDirLockedError(StorageError):
    """Another process holds the writer lock of this log directory."""

    def __init__(self, path: Path | str) -> None:
        super().__init__(f"log directory {path} is locked by another writer process")
        self.path = path


class ReadOnlyLogError(StorageError):
    """A mutation was requested from a log or log manager opened read-only."""


class LogCleaningAbortedError(StorageError):
    """A cleaning pass stopped: the log changed under it (segments deleted or
    truncated, the log closed) or a cleaned group could not hold its offsets. Groups
    already swapped in stay; the log is whole either way."""

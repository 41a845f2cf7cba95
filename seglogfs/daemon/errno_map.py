"""The one table from engine errors to the errno a file-system call answers.

Every handler of ``seglogfs.daemon`` that catches an engine error turns it into an errno
here and nowhere else, so ``echo``, ``cat`` and ``mkdir`` report the same failure the
same way. The most specific class wins (the table is walked along the exception's
MRO); an ``OSError`` carries its own errno (``ENOSPC`` from a full disk reaches the
writer unchanged).
"""

from __future__ import annotations

import errno

from storage import (
    ConfigError,
    CorruptCheckpointError,
    CorruptIndexError,
    CorruptRecordError,
    IndexFullError,
    InvalidOffsetError,
    InvalidRecordError,
    InvalidTopicError,
    JsonRecordError,
    LogDirLockedError,
    OffsetOutOfRangeError,
    ReadOnlyLogError,
    RecordTooLargeError,
    StorageError,
    TopicExistsError,
    TopicNotEmptyError,
    UnknownTopicError,
)

__all__ = ["ERRNO_BY_ERROR", "errno_for"]

ERRNO_BY_ERROR: dict[type[BaseException], int] = {
    UnknownTopicError: errno.ENOENT,  # a topic or partition that does not exist
    TopicExistsError: errno.EEXIST,  # mkdir of an existing topic
    TopicNotEmptyError: errno.EPERM,  # setfattr of the format once records exist
    InvalidTopicError: errno.EINVAL,  # Kafka's name rules, or a '.'/'_' collision
    ConfigError: errno.EINVAL,  # setfattr of a bad config value
    JsonRecordError: errno.EINVAL,  # a line written to a json topic that is no record
    # A record the log refuses: a keyless line (or raw write) to a compacted topic.
    InvalidRecordError: errno.EINVAL,
    RecordTooLargeError: errno.EFBIG,  # a record over max.message.bytes
    ReadOnlyLogError: errno.EROFS,  # a mutation on a read-only mount (or a closed log)
    OffsetOutOfRangeError: errno.ENOENT,  # a view of an offset the log does not hold
    InvalidOffsetError: errno.EINVAL,
    LogDirLockedError: errno.EBUSY,
    # Bytes on disk that are not what the format promises: never served.
    CorruptRecordError: errno.EIO,
    CorruptIndexError: errno.EIO,
    CorruptCheckpointError: errno.EIO,
    IndexFullError: errno.EIO,
    StorageError: errno.EIO,
}


def errno_for(error: BaseException) -> int | None:
    """The errno that answers ``error``, or ``None`` for an error the table does not
    know (a bug: the caller logs it with its traceback and answers ``EIO``).

    Cost: O(depth of the exception's class hierarchy).
    """
    if isinstance(error, OSError) and not isinstance(error, StorageError):
        return error.errno if error.errno else errno.EIO
    for cls in type(error).__mro__:
        code = ERRNO_BY_ERROR.get(cls)
        if code is not None:
            return code
    return None

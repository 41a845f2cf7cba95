"""What every API handler shares: the engine, the bridge to worker threads, the
listener's identity, the append signal, and engine errors as Kafka's error codes.

Thread-safety: a ``Broker`` lives on the trio thread; only the engine calls it hands
to ``run_sync`` run in worker threads (the engine is thread-safe).
"""

from __future__ import annotations

import base64
import errno
import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import trio

from storage import (
    CorruptRecordError,
    InvalidRecordError,
    InvalidTopicError,
    LogManager,
    OffsetOutOfRangeError,
    OffsetStore,
    ReadOnlyLogError,
    RecordTooLargeError,
    TopicExistsError,
    UnknownTopicError,
)

from .codec import ErrorCode
from .config import KafkaConfig
from .coordinator import Coordinator
from .producers import SequenceTable

__all__ = ["KAFKA_PATH", "AppendSignal", "Broker", "BrokerCounters", "error_code_of"]

KAFKA_PATH = "kafka"
"""The ``path`` label of what comes through this listener in the daemon's metrics."""


class BrokerCounters(Protocol):
    """What the listener counts into when the daemon serves metrics (the daemon's
    ``metrics.MountCounters``, passed in: this package imports no other face)."""

    def kafka_request(self, api: str, seconds: float) -> None: ...

    def appended(self, topic: str, records: int, size: int | None, path: str) -> None: ...

    def fetched(self, topic: str, size: int) -> None: ...


RunSync = Callable[..., Awaitable[Any]]


class AppendSignal:
    """Wakes the Fetch requests waiting for more bytes (``min.bytes``, ``max.wait.ms``)
    when a Produce request appended. Appends made another way (the mount, the control
    socket) are found by the waiters' polling (``POLL_S``): the engine has no append
    callback, and a callback from its worker threads would need the loop's token."""

    POLL_S = 0.05

    def __init__(self) -> None:
        self._event = trio.Event()

    def appended(self) -> None:
        """Wake every waiter (called on the trio thread after an append)."""
        self._event.set()
        self._event = trio.Event()

    async def wait(self, deadline: float) -> None:
        """Return after the next append, ``POLL_S`` or at ``deadline``, whichever is first."""
        event = self._event
        with trio.move_on_at(min(deadline, trio.current_time() + self.POLL_S)):
            await event.wait()


@dataclass
class Broker:
    """The single broker this daemon is: its engine, bridge and identity."""

    manager: LogManager
    run_sync: RunSync
    config: KafkaConfig
    advertised_host: str
    advertised_port: int
    appends: AppendSignal = field(default_factory=AppendSignal)
    sequences: SequenceTable = field(default_factory=SequenceTable)
    counters: BrokerCounters | None = None  # None unless the daemon serves metrics
    groups: Coordinator = field(init=False)
    _partition_locks: dict[tuple[str, int], trio.Lock] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        # The directory's one store (OffsetStore.shared): the mount's P@group= views,
        # the control socket and this listener see the same members and commits.
        self.groups = Coordinator(OffsetStore.shared(self.manager), self.run_sync)

    def partition_lock(self, topic: str, partition: int) -> trio.Lock:
        """The lock a Produce holds on a partition from its sequence check to its
        append's record (one per partition produced to; Kafka's log lock)."""
        lock = self._partition_locks.get((topic, partition))
        if lock is None:
            lock = self._partition_locks[(topic, partition)] = trio.Lock()
        return lock

    @property
    def node_id(self) -> int:
        return self.config.node_id

    @property
    def read_only(self) -> bool:
        return self.manager.read_only

    @property
    def cluster_id(self) -> str:
        """A stable cluster id per log directory (22 characters of base64, as Kafka's)."""
        digest = hashlib.sha256(str(self.manager.log_dir.resolve()).encode()).digest()[:16]
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def error_code_of(exc: BaseException) -> ErrorCode:
    """Kafka's error code for an engine error (``UNKNOWN_SERVER_ERROR`` for others)."""
    if isinstance(exc, UnknownTopicError):
        return ErrorCode.unknown_topic_or_partition
    if isinstance(exc, InvalidTopicError):
        return ErrorCode.invalid_topic_exception
    if isinstance(exc, TopicExistsError):
        return ErrorCode.topic_already_exists
    if isinstance(exc, RecordTooLargeError):
        return ErrorCode.message_too_large
    if isinstance(exc, CorruptRecordError):
        return ErrorCode.corrupt_message
    if isinstance(exc, InvalidRecordError):
        return ErrorCode.invalid_record
    if isinstance(exc, OffsetOutOfRangeError):
        return ErrorCode.offset_out_of_range
    if isinstance(exc, ReadOnlyLogError):
        # A read-only mount: no Kafka error says "read-only"; this one is not retried.
        return ErrorCode.invalid_request
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EIO, errno.EDQUOT):
        return ErrorCode.kafka_storage_error
    return ErrorCode.unknown_server_error

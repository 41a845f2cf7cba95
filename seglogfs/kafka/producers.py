"""InitProducerId (key 22) and the sequence checks of idempotent producers.

kafka-python 3.x (and librdkafka with ``enable.idempotence``) asks for a producer id
first and numbers its batches per partition. As a single Kafka broker does, this one
hands out ids and, per producer and partition, remembers the last five batches'
sequence numbers and offsets: a batch sent again after its response was lost is
answered with the offset it got (no second copy), a gap is
``OUT_OF_ORDER_SEQUENCE_NUMBER``, an older epoch ``INVALID_PRODUCER_EPOCH``.

The table is rebuilt from the log, as Kafka's ``ProducerStateManager`` rebuilds it
from the batches' producer fields (Kafka starts from a ``.snapshot`` file and reads
the log after it; this broker writes no snapshots): before the first Produce to a
partition since the daemon started is checked, ``producer_entries`` reads the
producer id, epoch, sequences and base offset of the partition's last batches, so a
batch retried across a restart is still answered with its first offset. The read is
bounded: the last segments up to ``REBUILD_TAIL_BYTES`` (at least the active one),
and no batch older than ``producer.id.expiration.ms`` (Kafka's default, a day),
after which Kafka forgets a producer too. A producer whose last batch lies before
that is unknown, and its next batch is accepted as it comes.

Transactional ids are refused (``TRANSACTIONAL_ID_AUTHORIZATION_FAILED``): the log
keeps no transaction state.
"""

from __future__ import annotations

import time
import weakref
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from storage import CorruptRecordError, DefaultRecordBatch, Log, StorageError, iter_batches

from .codec import ErrorCode, Request, build, response_class

if TYPE_CHECKING:
    from .broker import Broker

__all__ = [
    "PRODUCER_ID_EXPIRATION_MS",
    "REBUILD_TAIL_BYTES",
    "AppendedBatch",
    "BatchIdentity",
    "SequenceTable",
    "handle_init_producer_id",
    "identify_batches",
    "producer_entries",
]

_RECENT = 5
"""Batches remembered per producer and partition: Kafka's, and the most a producer
keeps in flight (``max.in.flight.requests.per.connection`` <= 5 with idempotence)."""

_INT_MAX = 2**31 - 1

PRODUCER_ID_EXPIRATION_MS: Final = 86_400_000
"""Kafka's ``producer.id.expiration.ms``: batches older than this are not read back
into the table after a restart (Kafka expires such producers)."""

REBUILD_TAIL_BYTES: Final = 64 * 1024 * 1024
"""The most segment bytes read per partition to rebuild its producers (whole
segments from the end; the active segment is always read)."""


@dataclass(frozen=True)
class BatchIdentity:
    """A produce request's batches for one partition as the sequence check sees them:
    producer id and epoch, first and last sequence (-1: not idempotent)."""

    producer_id: int
    producer_epoch: int
    first_sequence: int
    last_sequence: int


def identify_batches(records: bytes) -> BatchIdentity:
    """The identity of ``records`` (v2 batches); not idempotent when they do not parse
    (the append then refuses them with the engine's reason)."""
    batches: list[DefaultRecordBatch] = []
    try:
        for batch in iter_batches(bytes(records)):
            if not isinstance(batch, DefaultRecordBatch):
                return BatchIdentity(-1, -1, -1, -1)
            batches.append(batch)
    except (StorageError, ValueError):
        return BatchIdentity(-1, -1, -1, -1)
    if not batches or batches[0].producer_id < 0:
        return BatchIdentity(-1, -1, -1, -1)
    first, last = batches[0], batches[-1]
    return BatchIdentity(
        first.producer_id, first.producer_epoch, first.base_sequence, last.last_sequence
    )


@dataclass(frozen=True)
class AppendedBatch:
    """An idempotent producer's batch in the log, as the table remembers it."""

    producer_id: int
    producer_epoch: int
    first_sequence: int
    last_sequence: int
    base_offset: int


def producer_entries(
    log: Log,
    now_ms: int,
    expiration_ms: int = PRODUCER_ID_EXPIRATION_MS,
    tail_bytes: int = REBUILD_TAIL_BYTES,
) -> list[AppendedBatch]:
    """The idempotent batches of ``log``'s tail, in log order, for ``SequenceTable.load``.

    Reads from the first of the last segments whose sizes add up to at most
    ``tail_bytes`` (the active segment always), and not before the first
    record at or after ``now_ms - expiration_ms`` (through the time index). Only the
    61-byte batch headers are used; each batch's CRC is checked as every read checks
    it, and damage ends the read (the batches before it count).

    Cost: O(log n) to position, then O(batches) over at most the bytes above.

    Raises:
        StorageError: the log was deleted or closed meanwhile.
    """
    segments = log.segments.values()
    if not segments:
        return []
    start = segments[-1].base_offset
    total = segments[-1].size
    for segment in reversed(segments[:-1]):
        total += segment.size
        if total > tail_bytes:
            break
        start = segment.base_offset
    recent = log.offset_for_timestamp(now_ms - expiration_ms)
    if recent is None:
        return []  # every record is older: every producer has expired
    start = max(start, recent, log.log_start_offset)
    if start >= log.log_end_offset:
        return []
    found: list[AppendedBatch] = []
    try:
        for batch in log.batches(start):
            if isinstance(batch, DefaultRecordBatch) and batch.producer_id >= 0:
                if batch.base_sequence < 0:
                    continue
                found.append(
                    AppendedBatch(
                        batch.producer_id,
                        batch.producer_epoch,
                        batch.base_sequence,
                        batch.last_sequence,
                        batch.base_offset,
                    )
                )
    except CorruptRecordError:
        pass  # damage (logged by whoever reads it next): the batches before it count
    return found


@dataclass(frozen=True)
class _Appended:
    first_sequence: int
    last_sequence: int
    base_offset: int


class SequenceTable:
    """Per (producer id, topic, partition): the epoch and the last batches appended,
    and which partitions have been read back from their logs (``load``).

    Not thread-safe: the trio thread's (the Produce handler holds the partition's
    lock from ``check`` to ``record``). Producers silent for ``expiration_ms`` are
    forgotten (Kafka's ``producer.id.expiration.ms``), so the table is bounded by the
    producers of the last day, as Kafka's is.
    """

    def __init__(self, expiration_ms: int = PRODUCER_ID_EXPIRATION_MS) -> None:
        self._next_id = int(time.time() * 1000) & 0x0FFF_FFFF_FFFF
        self._expiration_s = expiration_ms / 1000
        # (producer id, topic, partition) -> (epoch, recent batches, last append time)
        self._entries: dict[tuple[int, str, int], tuple[int, deque[_Appended], float]] = {}
        # (topic, partition) -> the log its producers were read back from: a topic
        # deleted and made again has another ``Log`` (``loaded_from``).
        self._loaded: dict[tuple[str, int], weakref.ref[Log]] = {}
        self._next_purge = time.monotonic() + self._expiration_s

    def new_producer_id(self) -> int:
        """A producer id not handed out before: above every id read back from the logs
        and time-based at the start, so a restarted daemon does not hand out its
        predecessor's ids again."""
        self._next_id += 1
        return self._next_id

    def loaded(self, topic: str, partition: int) -> bool:
        """Whether the partition's producers were read back from its log (``load``)."""
        return (topic, partition) in self._loaded

    def loaded_from(self, topic: str, partition: int) -> Log | None:
        """The log the partition's producers were read back from (None: not read, or
        that log is gone)."""
        ref = self._loaded.get((topic, partition))
        return None if ref is None else ref()

    def load(self, topic: str, partition: int, log: Log, batches: list[AppendedBatch]) -> None:
        """Take the partition's producers from ``log``'s batches (``producer_entries``,
        in log order), before any batch of it is checked."""
        for b in batches:
            identity = BatchIdentity(
                b.producer_id, b.producer_epoch, b.first_sequence, b.last_sequence
            )
            self._remember(topic, partition, identity, b.base_offset)
            self._next_id = max(self._next_id, b.producer_id)
        self._loaded[(topic, partition)] = weakref.ref(log)

    def forget(self, topic: str) -> None:
        """Drop a deleted topic's producers (a topic created again starts empty)."""
        for key in [k for k in self._entries if k[1] == topic]:
            del self._entries[key]
        self._loaded = {k: v for k, v in self._loaded.items() if k[0] != topic}

    def forget_partition(self, topic: str, partition: int) -> None:
        """Drop one partition's producers (its log was replaced by another)."""
        for key in [k for k in self._entries if k[1:] == (topic, partition)]:
            del self._entries[key]
        self._loaded.pop((topic, partition), None)

    def check(self, topic: str, partition: int, batch: BatchIdentity) -> int | ErrorCode | None:
        """None: append; an offset: a duplicate, answer with it; an error code: refuse."""
        if batch.producer_id < 0:
            return None
        entry = self._entries.get((batch.producer_id, topic, partition))
        if entry is None:
            return None
        epoch, recent, _ = entry
        if batch.producer_epoch < epoch:
            return ErrorCode.invalid_producer_epoch
        if batch.producer_epoch > epoch:
            return None if batch.first_sequence == 0 else ErrorCode.out_of_order_sequence_number
        for appended in recent:
            if (appended.first_sequence, appended.last_sequence) == (
                batch.first_sequence,
                batch.last_sequence,
            ):
                return appended.base_offset
        expected = (recent[-1].last_sequence + 1) % (_INT_MAX + 1)
        if batch.first_sequence != expected:
            return ErrorCode.out_of_order_sequence_number
        return None

    def record(self, topic: str, partition: int, batch: BatchIdentity, base_offset: int) -> None:
        """Remember an appended batch."""
        if batch.producer_id < 0:
            return
        self._remember(topic, partition, batch, base_offset)
        now = time.monotonic()
        if now >= self._next_purge:
            self._next_purge = now + self._expiration_s / 10
            cutoff = now - self._expiration_s
            for key in [k for k, e in self._entries.items() if e[2] < cutoff]:
                del self._entries[key]

    def _remember(self, topic: str, partition: int, batch: BatchIdentity, base_offset: int) -> None:
        key = (batch.producer_id, topic, partition)
        entry = self._entries.get(key)
        if entry is None or entry[0] != batch.producer_epoch:
            recent: deque[_Appended] = deque(maxlen=_RECENT)
        else:
            recent = entry[1]
        recent.append(_Appended(batch.first_sequence, batch.last_sequence, base_offset))
        self._entries[key] = (batch.producer_epoch, recent, time.monotonic())


async def handle_init_producer_id(broker: Broker, request: Request) -> Any:
    """Answer InitProducerId: a new producer id with epoch 0 (or a refusal)."""
    body = request.body
    cls = response_class(22, request.api_version)
    assert cls is not None
    if body.transactional_id is not None:
        return build(
            cls,
            throttle_time=0,
            error_code=ErrorCode.transactional_id_authorization_failed,
            producer_id=-1,
            producer_epoch=-1,
        )
    return build(
        cls,
        throttle_time=0,
        error_code=ErrorCode.none,
        producer_id=broker.sequences.new_producer_id(),
        producer_epoch=0,
    )

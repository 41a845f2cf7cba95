"""InitProducerId (key 22) and the sequence checks of idempotent producers.

kafka-python 3.x (and librdkafka with ``enable.idempotence``) asks for a producer id
first and numbers its batches per partition. As a single Kafka broker does, this one
hands out ids and, per producer and partition, remembers the last five batches'
sequence numbers and offsets: a batch sent again after its response was lost is
answered with the offset it got (no second copy), a gap is
``OUT_OF_ORDER_SEQUENCE_NUMBER``, an older epoch ``INVALID_PRODUCER_EPOCH``. The
table lives in the daemon's memory only (Kafka keeps it in snapshot files): after a
restart the first batch of every producer is accepted as it comes. Transactional ids
are refused (``TRANSACTIONAL_ID_AUTHORIZATION_FAILED``): the log keeps no transaction
state.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from storage import DefaultRecordBatch, StorageError, iter_batches

from .codec import ErrorCode, Request, build, response_class

if TYPE_CHECKING:
    from .broker import Broker

__all__ = ["BatchIdentity", "SequenceTable", "handle_init_producer_id", "identify_batches"]

_RECENT = 5
"""Batches remembered per producer and partition: Kafka's, and the most a producer
keeps in flight (``max.in.flight.requests.per.connection`` <= 5 with idempotence)."""

_INT_MAX = 2**31 - 1


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
class _Appended:
    first_sequence: int
    last_sequence: int
    base_offset: int


class SequenceTable:
    """Per (producer id, topic, partition): the epoch and the last batches appended."""

    def __init__(self) -> None:
        self._next_id = int(time.time() * 1000) & 0x0FFF_FFFF_FFFF
        self._entries: dict[tuple[int, str, int], tuple[int, deque[_Appended]]] = {}

    def new_producer_id(self) -> int:
        """A producer id not handed out before by this daemon (time-based start, so a
        restarted daemon does not hand out its predecessor's ids again)."""
        self._next_id += 1
        return self._next_id

    def check(self, topic: str, partition: int, batch: BatchIdentity) -> int | ErrorCode | None:
        """None: append; an offset: a duplicate, answer with it; an error code: refuse."""
        if batch.producer_id < 0:
            return None
        entry = self._entries.get((batch.producer_id, topic, partition))
        if entry is None:
            return None
        epoch, recent = entry
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
        key = (batch.producer_id, topic, partition)
        entry = self._entries.get(key)
        if entry is None or entry[0] != batch.producer_epoch:
            entry = (batch.producer_epoch, deque(maxlen=_RECENT))
            self._entries[key] = entry
        entry[1].append(_Appended(batch.first_sequence, batch.last_sequence, base_offset))


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

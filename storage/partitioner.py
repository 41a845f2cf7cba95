"""Choosing a partition for a record the way Kafka's Java producer does.

A keyed record goes to ``to_positive(murmur2(key)) % num_partitions``
(``org.apache.kafka.clients.producer.internals.BuiltInPartitioner.partitionForKey``),
so a topic written through seglogfs and read by Kafka tooling, or written by a
Java producer and extended here, keeps every key in the partition Kafka would
pick. ``murmur2`` is Kafka's ``Utils.murmur2``: MurmurHash2, 32-bit, seed
``0x9747b28c``, the input read as little-endian 4-byte blocks, returning the
*signed* 32-bit value a Java ``int`` holds.

Keyless records carry no affinity; like Kafka's producer since KIP-480 they
"stick" to one partition for a whole batch and move to another one when a batch
is complete (``StickyPartitioner``), which keeps batches large while spreading
load over time.

Thread-safety: the functions are pure and thread-safe. ``StickyPartitioner``
holds mutable state and is *not* thread-safe; give each producer thread its own
instance or guard it with a lock.
"""

from __future__ import annotations

import random
import struct

__all__ = ["StickyPartitioner", "murmur2", "partition_for_key", "to_positive"]

_SEED = 0x9747B28C
_M = 0x5BD1E995
_R = 24
_MASK32 = 0xFFFFFFFF
_SIGN32 = 0x80000000
_BLOCKS = struct.Struct("<I")


def murmur2(data: bytes | bytearray | memoryview) -> int:
    """Return Kafka's murmur2 hash of ``data`` as a signed 32-bit integer.

    Bit-for-bit the value of ``org.apache.kafka.common.utils.Utils.murmur2``:
    Python integers do not overflow, so every multiplication is masked to 32
    bits to reproduce Java's wrapping ``int`` arithmetic, and the result is
    mapped back to the range ``[-2**31, 2**31)``.

    Runtime complexity: O(len(data)).

    Raises:
        TypeError: ``data`` is not a bytes-like object.
    """
    view = memoryview(data).cast("B")
    length = len(view)
    h = (_SEED ^ length) & _MASK32
    whole = length & ~3
    for (k,) in _BLOCKS.iter_unpack(view[:whole]):
        k = (k * _M) & _MASK32
        k ^= k >> _R
        k = (k * _M) & _MASK32
        h = ((h * _M) & _MASK32) ^ k

    # The tail (0-3 bytes) is folded in high byte first, matching Java's
    # fall-through switch; a tail only triggers the extra multiplication when
    # there is at least one byte.
    tail = length & 3
    if tail == 3:
        h ^= view[whole + 2] << 16
    if tail >= 2:
        h ^= view[whole + 1] << 8
    if tail >= 1:
        h ^= view[whole]
        h = (h * _M) & _MASK32

    h ^= h >> 13
    h = (h * _M) & _MASK32
    h ^= h >> 15
    return h - (1 << 32) if h & _SIGN32 else h


def to_positive(n: int) -> int:
    """Clear the sign bit of a 32-bit integer, as Kafka's ``Utils.toPositive``.

    Kafka deliberately avoids ``abs()``: ``abs(Integer.MIN_VALUE)`` is negative in
    Java, and the mask maps negative numbers differently from ``abs`` anyway, so
    only the mask gives Kafka's partitions.
    """
    return n & 0x7FFFFFFF


def partition_for_key(key: bytes | bytearray | memoryview, num_partitions: int) -> int:
    """Return the partition Kafka's producer picks for ``key``.

    ``to_positive(murmur2(key)) % num_partitions``. An empty key is a key (it
    hashes like any other); only a *missing* key uses ``StickyPartitioner``.

    Runtime complexity: O(len(key)).

    Raises:
        ValueError: ``num_partitions`` is less than 1.
        TypeError: ``key`` is not a bytes-like object.
    """
    if num_partitions < 1:
        raise ValueError(f"num_partitions must be at least 1, got {num_partitions}")
    return to_positive(murmur2(key)) % num_partitions


class StickyPartitioner:
    """Spreads keyless records by sticking to one partition per batch.

    ``partition()`` returns the current sticky partition, the same value until
    ``next_batch()`` is called when the batch is complete; ``next_batch()`` then
    draws a new partition uniformly among the *other* partitions (so
    consecutive batches never land on the same partition when there are two or
    more), or returns the only partition there is.

    Not thread-safe: ``next_batch`` reads and replaces the current partition
    without a lock. Use one instance per producer thread.
    """

    __slots__ = ("_current", "_num_partitions", "_rng")

    def __init__(self, num_partitions: int, rng: random.Random | None = None) -> None:
        """Start on a uniformly random partition of ``range(num_partitions)``.

        ``rng`` makes the choices reproducible (tests); by default a fresh,
        OS-seeded ``random.Random`` is used so that independent producers do not
        all start on the same partition.

        Raises:
            ValueError: ``num_partitions`` is less than 1.
        """
        if num_partitions < 1:
            raise ValueError(f"num_partitions must be at least 1, got {num_partitions}")
        self._num_partitions = num_partitions
        self._rng = rng if rng is not None else random.Random()
        self._current = self._rng.randrange(num_partitions)

    @property
    def num_partitions(self) -> int:
        """The number of partitions choices are drawn from."""
        return self._num_partitions

    def partition(self) -> int:
        """Return the sticky partition for the batch being filled. O(1)."""
        return self._current

    def next_batch(self) -> int:
        """Move to the partition for the next batch and return it. O(1).

        With two or more partitions the new partition differs from the previous
        one and is uniform over the remaining ``num_partitions - 1``; with one
        partition it is that partition.
        """
        n = self._num_partitions
        if n == 1:
            self._current = 0
        else:
            # Draw among the n - 1 others by offsetting from the current one:
            # uniform, never the same, and no rejection loop.
            self._current = (self._current + 1 + self._rng.randrange(n - 1)) % n
        return self._current

    def __repr__(self) -> str:
        return f"StickyPartitioner(num_partitions={self._num_partitions}, current={self._current})"

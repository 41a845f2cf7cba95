"""The cleaner's key -> latest offset map, bounded like Kafka's ``SkimpyOffsetMap``.

Kafka's map is an open-addressing table in a byte buffer of
``log.cleaner.dedupe.buffer.size / log.cleaner.threads`` bytes: 24 bytes an entry (an
MD5 of the key and an 8-byte offset), filled to ``log.cleaner.io.buffer.load.factor``
of its slots per cleaning pass. What does not fit waits for the next pass: the map
records the last offset it covers (``latest_offset``) and the cleaner cleans only up to
it.

This map keeps Kafka's budget and bound (``slots`` = memory // 24, at most
``slots * load_factor`` keys a pass) but stores its entries in a ``dict``: the
interpreter's hash table is the fastest one Python has, and a table of our own in a
``bytearray`` would cost a Python loop per probe. A key of at most 16 bytes is its own
entry (exact: no collision is possible); a longer one is replaced by a 16-byte BLAKE2b
digest, as Kafka replaces every key by its MD5 (a collision of two keys, at 2^-128,
would make the older one's latest record look superseded). The real memory is the
dict's: about 100-150 bytes an entry on CPython 3.11, so a pass holds 4-6 times the
bytes the budget names (``tests/bench/bench_compaction.py`` measures it).

Compiled with mypyc (``setup.py``), as ``compaction_scan`` that feeds it: ``put_all``
and ``retained`` are the loops every record of a pass goes through.

Thread-safety: none; one cleaner thread owns a map.
"""

from __future__ import annotations

from hashlib import blake2b
from typing import Final

__all__ = ["OFFSET_MAP_BYTES_PER_ENTRY", "OffsetMap", "map_key"]

OFFSET_MAP_BYTES_PER_ENTRY: Final = 24
"""What an entry costs in ``log.cleaner.dedupe.buffer.size``: Kafka's ``SkimpyOffsetMap``
with its default MD5 (a 16-byte hash and an 8-byte offset). Kafka's
``CleanerConfig.HASH_ALGORITHM`` is SHA-256 in its newest sources (40 bytes an entry);
the budget here stays at MD5's, as the seglogfs issue asks."""

_EXACT_KEY_BYTES: Final = 16
"""Keys this long or shorter are stored as themselves (the size of Kafka's MD5)."""


def map_key(key: bytes) -> bytes:
    """What the map stores for ``key``: the key itself up to 16 bytes, else a 16-byte
    BLAKE2b digest. Cost: O(len(key))."""
    if len(key) <= _EXACT_KEY_BYTES:
        return key
    return blake2b(key, digest_size=_EXACT_KEY_BYTES).digest()


class OffsetMap:
    """Key -> the latest offset seen for it, for at most ``max_entries`` keys.

    Args:
        memory: the bytes Kafka's map would take (``CleanerConfig.offset_map_memory``).
        load_factor: the share of ``slots`` a pass may fill
            (``log.cleaner.io.buffer.load.factor``).

    Raises:
        ValueError: (on construction) a map that would hold no entry (Kafka's
            ``Cleaner`` asserts the same).
    """

    __slots__ = ("_entries", "latest_offset", "max_entries", "slots")

    def __init__(self, memory: int, load_factor: float = 0.9) -> None:
        self.slots: Final = memory // OFFSET_MAP_BYTES_PER_ENTRY
        # Kafka's maxDesiredMapSize; never more than the slots (Kafka's put would fail).
        self.max_entries: Final = min(self.slots, int(self.slots * load_factor))
        if self.max_entries < 1:
            raise ValueError(
                f"an offset map of {memory} bytes at load factor {load_factor} holds no "
                "entry: increase log.cleaner.dedupe.buffer.size"
            )
        self._entries: dict[bytes, int] = {}
        self.latest_offset = -1
        """The last offset the map covers (Kafka's ``latestOffset``), -1 when empty."""

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def is_full(self) -> bool:
        """Whether a new key would exceed ``max_entries``."""
        return len(self._entries) >= self.max_entries

    @property
    def utilization(self) -> float:
        """Entries over slots (Kafka's ``OffsetMap.utilization``)."""
        return len(self._entries) / self.slots

    def clear(self) -> None:
        """Forget every key and the latest offset."""
        self._entries.clear()
        self.latest_offset = -1

    def put(self, key: bytes, offset: int) -> None:
        """Map ``key`` to ``offset`` (offsets come in increasing order).

        Raises:
            OverflowError: a new key while the map is full (check ``is_full``).
        """
        entry = map_key(key)
        entries = self._entries
        if entry not in entries and len(entries) >= self.max_entries:
            raise OverflowError(f"offset map full ({self.max_entries} entries)")
        entries[entry] = offset
        self.latest_offset = offset

    def put_all(self, keys: list[bytes | None], offsets: list[int], start: int) -> int:
        """Map each non-null ``keys[i]`` to ``offsets[i]`` for ``offsets[i] >= start``, in
        order, until a new key would not fit. Returns how many records were taken
        (``len(keys)`` when all were); ``latest_offset`` is the last one mapped.

        One call per batch: the loop is the cleaner's hottest (every dirty record).
        Cost: O(records) dictionary operations and, for keys over 16 bytes, a digest.
        """
        entries = self._entries
        room = self.max_entries - len(entries)
        latest = self.latest_offset
        n = len(keys)
        for i in range(n):
            key = keys[i]
            offset = offsets[i]
            if key is None or offset < start:
                continue
            entry = key if len(key) <= _EXACT_KEY_BYTES else map_key(key)
            # One hash lookup, not two (``in``, then the store): a store that grew the
            # dict was a new key, taken back when there was no room for it.
            size = len(entries)
            entries[entry] = offset
            if len(entries) != size:
                if room <= 0:
                    del entries[entry]
                    self.latest_offset = latest
                    return i
                room -= 1
            latest = offset
        self.latest_offset = latest
        return n

    def get(self, key: bytes) -> int:
        """The offset mapped for ``key``, -1 when none. Cost: O(1), plus a digest for a
        key over 16 bytes."""
        return self._entries.get(map_key(key), -1)

    def retained(
        self,
        keys: list[bytes | None],
        offsets: list[int],
        nulls: list[bool] | None,
        tombstones_stay: bool,
    ) -> tuple[list[int], bool]:
        """Which records of a batch a cleaning pass keeps (Kafka's
        ``Cleaner.shouldRetainRecord``, one call per batch): the indexes of the records
        past ``latest_offset`` (the next pass decides), and of those that are the
        latest of their key, a tombstone only if ``tombstones_stay`` (its batch's delete
        horizon is unset or not reached). A keyless record the map covers goes (Kafka
        counts it invalid). ``nulls[i]`` tells whether record ``i`` is a tombstone (a
        null value); None when none is (``compaction_scan.BatchKeys``). Also returns
        whether a kept record is a tombstone.

        The loop every record of a cleaned log goes through: here, with the map, so
        that one module holds the hot code (see the README on compiling).
        Cost: O(records) dictionary lookups, a digest per key over 16 bytes.
        """
        entries = self._entries
        latest = self.latest_offset
        kept: list[int] = []
        has_tombstone = False
        for i in range(len(offsets)):
            offset = offsets[i]
            tombstone = nulls is not None and nulls[i]
            if offset > latest:
                kept.append(i)
                if tombstone:
                    has_tombstone = True
                continue
            key = keys[i]
            if key is None:
                continue
            entry = key if len(key) <= _EXACT_KEY_BYTES else map_key(key)
            if offset < entries.get(entry, -1):
                continue  # superseded
            if not tombstone:
                kept.append(i)
            elif tombstones_stay:
                kept.append(i)
                has_tombstone = True
        return kept, has_tombstone

    def offsets_of(self, keys: list[bytes | None]) -> list[int]:
        """``get`` of each key (-1 for a null key): one call per batch. Cost: as ``get``
        per key."""
        entries = self._entries
        found: list[int] = []
        for key in keys:
            if key is None:
                found.append(-1)
            else:
                entry = key if len(key) <= _EXACT_KEY_BYTES else map_key(key)
                found.append(entries.get(entry, -1))
        return found

    def update_latest_offset(self, offset: int) -> None:
        """Move ``latest_offset`` (Kafka's ``updateLatestOffset``: batches without keys,
        a gap at a segment's end)."""
        self.latest_offset = offset

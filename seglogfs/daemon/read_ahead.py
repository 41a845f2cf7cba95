"""One budget for the bytes all readers of the mount keep rendered (``fetch.max.bytes``).

An open file's reader (``position_reader``) keeps the batches it rendered last and,
once it reads sequentially, ``READ_AHEAD`` (4 MiB) more, in the daemon's heap, for as
long as the file is open. Unbounded, a thousand descriptors that each read 128 KiB of a
partition kept 4 GB. ``ReadAheadBudget`` bounds what they all keep together:

- before a read renders in a worker thread, its read-ahead is granted only if it fits
  beside what the other files keep, after taking it back from files idle for
  ``IDLE_S`` (an open ``less`` does not keep it from a running ``cat``); otherwise the
  read renders only what it returns;
- after every read, what the reader keeps is charged, and whatever does not fit is
  dropped, the farthest bytes first (``PositionReader.shed``);
- a file's charge is given back when it closes.

A reader that finds the budget taken keeps only what fits, nothing when the others
hold it all: its next read finds its batch through the position index and renders it
again. Slower, never an error, and the mount and the other readers go on. The render
process's slots (``renderer``: 96 MiB of shared memory, four files) are a bound of
their own and are not charged.

Memory given back: bytes freed stay in glibc's heap (up to
``malloc_tuning.TRIM_THRESHOLD`` free at its top, and every free page below it), so
once the charged bytes fall ``GIVE_BACK_BYTES`` below their peak (readers that held the
budget closed or went idle) the daemon has glibc return its free pages
(``malloc_tuning.release_free_memory``, in a worker thread).

The setting is Kafka's name for the most a broker returns for one fetch request, over
all its partitions, with Kafka's default and minimum: the mount's readers share it as
if they were one consumer's fetch.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Mapping

from storage import ConfigError
from storage.number import INT_MAX, abbreviated, parse_java_integer

from .nodes import OpenFile

__all__ = [
    "FETCH_MAX_BYTES",
    "FETCH_MAX_BYTES_KEY",
    "GIVE_BACK_BYTES",
    "IDLE_S",
    "MIN_FETCH_MAX_BYTES",
    "ReadAheadBudget",
    "fetch_max_bytes",
]

FETCH_MAX_BYTES_KEY = "fetch.max.bytes"
FETCH_MAX_BYTES = 57671680
"""Kafka's default (55 MiB): the read-ahead of thirteen sequential readers; a ``cat``
streaming through the render process keeps almost none of it."""
MIN_FETCH_MAX_BYTES = 1024
"""Kafka's minimum. Below ``READ_AHEAD`` no read renders ahead."""

IDLE_S = 1.0
"""A file that has not read for this long gives its kept bytes up to a reader that
needs room."""

GIVE_BACK_BYTES = 32 << 20
"""Free pages are returned to the kernel when the charged bytes fall this far below
their peak: after many readers close, never during one ``cat`` (about 5 MiB)."""


def fetch_max_bytes(props: Mapping[str, str]) -> int:
    """``fetch.max.bytes`` from ``server.properties`` (the default when absent).

    Raises:
        ConfigError: not a whole number from ``MIN_FETCH_MAX_BYTES`` to 2^31-1
            (Kafka's ``INT``), naming the key.
    """
    raw = props.get(FETCH_MAX_BYTES_KEY)
    if raw is None:
        return FETCH_MAX_BYTES
    value = parse_java_integer(raw.strip())
    if value is None or not MIN_FETCH_MAX_BYTES <= value <= INT_MAX:
        raise ConfigError(
            FETCH_MAX_BYTES_KEY,
            abbreviated(raw),
            f"must be a whole number from {MIN_FETCH_MAX_BYTES} to {INT_MAX}",
        )
    return value


class _Charge:
    __slots__ = ("bytes", "read_at")

    def __init__(self, read_at: float) -> None:
        self.bytes = 0
        self.read_at = read_at


class ReadAheadBudget:
    """What the open files' readers keep in the daemon's memory, together at most
    ``limit`` bytes once each read is settled (see the module).

    Between ``grant`` and ``settle`` a read in a worker thread may hold more (its reply
    and the batch around it): that is bounded by the worker threads, not here.

    Not thread-safe: the trio thread only (a reader's kept bytes change in a worker
    thread only while its file's lock is held, and such files are never shed here).
    """

    def __init__(self, limit: int = FETCH_MAX_BYTES, clock: Callable[[], float] = time.monotonic):
        if limit < MIN_FETCH_MAX_BYTES:
            raise ConfigError(FETCH_MAX_BYTES_KEY, limit, f"less than {MIN_FETCH_MAX_BYTES}")
        self.limit = limit
        self.used = 0
        self._clock = clock
        # Files keeping bytes, the one that read longest ago first.
        self._charges: OrderedDict[OpenFile, _Charge] = OrderedDict()
        self._peak = 0  # the highest `used` since memory was last given back

    def charged(self, of: OpenFile) -> int:
        """Bytes charged to ``of``. Cost: O(1)."""
        charge = self._charges.get(of)
        return 0 if charge is None else charge.bytes

    def grant(self, of: OpenFile, ahead: int) -> int:
        """Before ``of`` reads in a worker thread: ``ahead`` when that much read-ahead
        fits beside what the other files keep (taking back what idle ones keep), else 0.
        A grant is charged at once, so reads in flight together cannot all take the last
        room.

        Cost: O(1), plus O(files) when idle files give theirs up.
        """
        others = self.used - self.charged(of)
        if others + ahead > self.limit:
            self._take_back_idle(of, others + ahead - self.limit)
            others = self.used - self.charged(of)
            if others + ahead > self.limit:
                return 0
        if ahead > self.charged(of):
            self._charge(of, ahead)
        return ahead

    def settle(self, of: OpenFile) -> bool:
        """After a read of ``of``: charge what its reader keeps, first dropping what
        does not fit beside the others. Returns whether memory is due to be given back
        (``GIVE_BACK_BYTES``).

        Cost: O(1), plus O(batches dropped).
        """
        reader = of.reader
        assert reader is not None
        room = self.limit - (self.used - self.charged(of))
        if reader.held > room:
            reader.shed(room)
        self._charge(of, reader.held)
        return self._give_back_due()

    def release(self, of: OpenFile) -> bool:
        """``of`` closed: drop what its reader keeps and its charge. Returns as
        ``settle``. Cost: O(batches kept)."""
        if of.reader is not None:
            of.reader.shed(0)
        self._charge(of, 0)
        return self._give_back_due()

    def _charge(self, of: OpenFile, size: int) -> None:
        charge = self._charges.get(of)
        if charge is None:
            if size == 0:
                return
            charge = self._charges[of] = _Charge(self._clock())
        else:
            charge.read_at = self._clock()
            self._charges.move_to_end(of)
        self.used += size - charge.bytes
        charge.bytes = size
        if size == 0:
            del self._charges[of]
        self._peak = max(self._peak, self.used)

    def _take_back_idle(self, asking: OpenFile, wanted: int) -> None:
        # The files that read longest ago first; one reading now (its lock held) or
        # being filled keeps its bytes.
        idle_before = self._clock() - IDLE_S
        for of, charge in list(self._charges.items()):
            if wanted <= 0 or charge.read_at > idle_before:
                break
            if of is asking or of.lock.locked() or of.fill is not None or of.reader is None:
                continue
            wanted -= charge.bytes
            of.reader.shed(0)
            self.used -= charge.bytes
            del self._charges[of]

    def _give_back_due(self) -> bool:
        if self._peak - self.used < GIVE_BACK_BYTES:
            return False
        self._peak = self.used
        return True

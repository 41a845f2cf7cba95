"""``queued.max.request.bytes``: the bytes of request frames a listener holds at once.

Kafka bounds the memory its network threads hold for requests being read or served
(``queued.max.request.bytes``); the control socket and the Kafka listener do the same
with one ``ByteBudget`` each: a frame's bytes are held from the moment its length is
known until its answer is sent, and a frame that does not fit waits, unread, in arrival
order, until enough is released. Its reader is then not read from, so a client that
sends faster than it is served is slowed by TCP's own flow control, not by memory.

Shared by the two faces (``seglogfs.control.server``, ``seglogfs.kafka.server``), which
must not import each other; it imports trio and nothing of theirs.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import AsyncIterator
from typing import Final

import trio

__all__ = ["ByteBudget"]

logger = logging.getLogger(__name__)


class ByteBudget:
    """Bytes held by the frames being read or served, at most ``capacity`` (None: no
    bound); frames that do not fit wait in arrival order. A wait is logged as a
    WARNING naming ``listener``, at most once a minute with the count of waits since.

    Not thread-safe: the trio thread's.
    """

    LOG_INTERVAL_S: Final = 60.0

    def __init__(self, capacity: int | None, listener: str) -> None:
        self.capacity = capacity
        self.listener = listener
        self.used = 0
        self._turn = trio.Lock()  # trio's locks are fair: waiters are served in order
        self._freed = trio.Event()
        self._waits = 0  # frames that waited since the last WARNING
        self._logged_at = -math.inf

    def fits(self, size: int) -> bool:
        """Whether ``size`` more bytes fit now. Cost: O(1)."""
        return self.capacity is None or self.used + size <= self.capacity

    @contextlib.asynccontextmanager
    async def hold(self, size: int) -> AsyncIterator[None]:
        """Hold ``size`` bytes for the block, waiting first until they fit (``size``
        is at most the listener's request size bound, which the capacity is not
        below, so every frame fits once the others are released)."""
        if not self.fits(size):
            self._note_wait(size)
            async with self._turn:
                while not self.fits(size):
                    self._freed = trio.Event()
                    await self._freed.wait()
        self.used += size
        try:
            yield
        finally:
            self.used -= size
            self._freed.set()

    def _note_wait(self, size: int) -> None:
        self._waits += 1
        now = trio.current_time()
        if now - self._logged_at >= self.LOG_INTERVAL_S:
            logger.warning(
                "%s: queued.max.request.bytes=%d held by requests being read or served: "
                "%d frame(s) waited, the last of %d bytes",
                self.listener,
                self.capacity,
                self._waits,
                size,
            )
            self._waits, self._logged_at = 0, now

"""Where the engine gets the time: injectable so roll and retention are testable."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """A source of wall-clock milliseconds (what Kafka's ``Time.milliseconds`` gives)."""

    def milliseconds(self) -> int: ...


class SystemClock:
    """The real clock. Thread-safe."""

    def milliseconds(self) -> int:
        return time.time_ns() // 1_000_000


SYSTEM_CLOCK = SystemClock()

"""Fixtures shared by every suite."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


class ManualClock:
    """A clock tests move by hand (Kafka's ``MockTime``)."""

    def __init__(self, now_ms: int = 1_700_000_000_000) -> None:
        self.now_ms = now_ms

    def milliseconds(self) -> int:
        return self.now_ms

    def advance(self, ms: int) -> None:
        self.now_ms += ms


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    path = tmp_path / "logs"
    path.mkdir()
    return path


@pytest.fixture(autouse=True)
def _open_segments_bound() -> Iterator[None]:
    """``log.segment.open.max`` is process-wide (``LogManager.open`` sets it): a test
    that lowers it must not slow the ones after it."""
    from storage.log.segment import OPEN_SEGMENTS

    before = OPEN_SEGMENTS.max_open
    yield
    OPEN_SEGMENTS.max_open = before

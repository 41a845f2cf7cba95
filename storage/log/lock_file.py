"""The one-writer-per-log-directory lock.

An exclusive ``flock`` on ``.seglog.lock``: held by the open file description, so it
dies with the process (no stale lock after a crash) and is not dropped when some other
descriptor of the file is closed, unlike POSIX record locks. Readers never take it.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from ..errors import LogDirLockedError
from .file_names import SEGLOG_LOCK_FILE


class LogDirLock:
    """Holds the writer lock of one log directory until ``release()``. Not thread-safe."""

    def __init__(self, log_dir: Path) -> None:
        self.path = log_dir / SEGLOG_LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock without waiting.

        Raises:
            LogDirLockedError: another process (or another ``LogDirLock``) holds it.
        """
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise LogDirLockedError(self.path.parent) from None
        # The holder's pid helps an operator; the lock itself is the flock, not this text.
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None

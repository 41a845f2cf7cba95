"""Replacing a small file so that a crash leaves either the old or the new content."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def write_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``: write ``path.tmp``, fsync, rename, fsync the dir.

    The order is important: the rename is the commit point and must not reach the
    disk before the bytes it publishes (hence the fsync first); the directory fsync
    makes the rename itself durable. A crash before the rename leaves a stale
    ``.tmp`` that the next write simply overwrites.

    Raises:
        OSError: the write failed; ``path`` still holds its previous content.
    """
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        # The old file is untouched; do not leave our partial temporary file behind.
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_directory(path.parent)


def fsync_directory(directory: Path) -> None:
    """Make renames and unlinks in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

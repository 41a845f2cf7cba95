"""glibc malloc settings for the daemon and its render process.

Both render batches into fresh ``bytes`` of up to a MiB many times a second; with
glibc's defaults, blocks that size are mmapped and unmapped (or the heap top trimmed)
for each, so every buffer first page-faults in again. ``tune_malloc`` keeps them in the
heap. ``release_free_memory`` gives the heaps' free pages back after a peak (the control
server calls it after a large request).
"""

from __future__ import annotations

import ctypes
import os
import platform
from typing import Any

__all__ = [
    "ARENA_MAX",
    "MALLOC_TUNING_ENV",
    "MMAP_THRESHOLD",
    "TRIM_THRESHOLD",
    "release_free_memory",
    "tune_malloc",
]

MALLOC_TUNING_ENV = "SEGLOG_MALLOC_TUNING"
"""Set to ``0`` to keep glibc's malloc defaults (see ``tune_malloc``)."""

# glibc's mallopt parameters (malloc.h) and the values the daemon sets.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
MMAP_THRESHOLD = 32 << 20
"""Blocks up to this size come from the heap, not from mmap (glibc's largest allowed
value on 64-bit)."""
TRIM_THRESHOLD = 128 << 20
"""Free memory at the top of a heap kept for reuse, not given back to the kernel."""
ARENA_MAX = 1
"""Heaps (glibc arenas): one for every thread. glibc's default, one per thread up to 8
per core, kept the top of every worker thread's heap (up to 64 MiB each, under
``TRIM_THRESHOLD``, and out of ``malloc_trim``'s reach) for good: after 1,000 readers
closed, 1.1 to 2 GB stayed. Threads hardly contend for it: they allocate under the GIL."""
_USER_MALLOC_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")


def _glibc_function(name: str) -> Any:
    """glibc's function ``name``, None elsewhere."""
    if platform.libc_ver()[0] != "glibc":
        return None
    try:
        return getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None


def tune_malloc() -> bool:
    """Keep freed read and write buffers in the heap; True when applied.

    Every read renders batches of up to ``max.message.bytes`` (1 MiB) into fresh
    ``bytes`` and joins them into the reply, and every write arrives as a fresh 1 MiB
    buffer. With glibc's defaults, blocks that size are mmapped and unmapped (or the
    heap top trimmed) on every request, so each reply first page-faults its buffer in
    again (page faults and page zeroing led the daemon's profile). Measured A/B on one
    log in two fresh daemons: ``cat`` of 4 KiB records 208 -> 620 MB/s, of 100-byte
    lines 196 -> 313 MB/s. The cost is memory the daemon keeps after a peak: at most
    ``TRIM_THRESHOLD``, in the one heap (``ARENA_MAX``). Not applied when
    ``SEGLOG_MALLOC_TUNING=0``, when the user set glibc's own variables (``MALLOC_*_``,
    ``GLIBC_TUNABLES``), or off glibc.
    """
    if os.environ.get(MALLOC_TUNING_ENV) == "0" or any(
        name in os.environ for name in _USER_MALLOC_SETTINGS
    ):
        return False
    mallopt = _glibc_function("mallopt")
    if mallopt is None:
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    # mallopt returns 1 on success; setting either also ends glibc's dynamic threshold.
    return (
        bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))
        and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
        and bool(mallopt(_M_ARENA_MAX, ARENA_MAX))
    )


def release_free_memory() -> bool:
    """Give the free pages of every malloc heap back to the kernel (glibc's
    ``malloc_trim(0)``); True when glibc did it.

    Needed after a peak of blocks under ``MMAP_THRESHOLD``: each worker thread's heap
    (a glibc arena of 64 MiB heaps) is never trimmed by the thresholds above, so
    memory a thread freed stayed with the daemon (a 95 MB produce through the control
    socket left it 150-215 MB larger; with this, within 30 MB). Blocking: walks every
    arena and ``madvise``s its free pages (3.7 ms for 40 MB of free heap in four
    threads' arenas, 0.05 ms when there is none); the pages fault in again when reused.
    """
    malloc_trim = _glibc_function("malloc_trim")
    if malloc_trim is None:
        return False
    malloc_trim.argtypes = (ctypes.c_size_t,)
    malloc_trim.restype = ctypes.c_int
    malloc_trim(0)
    return True

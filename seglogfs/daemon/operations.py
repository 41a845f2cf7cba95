"""The file system: topics as directories, partitions as append-only files (SPEC §3).

``Operations`` is the pyfuse3 request handler over a ``storage.LogManager``::

    MOUNTPOINT/                 one directory per topic (mkdir creates one)
      <topic>/
        0  1  ...               partition files: append-only, read as rendered records
        produce                 write-only: lines partitioned like Kafka's producer
        0@<where>               unlisted read-only views (``views``)

Every handler raises only ``pyfuse3.FUSEError``: engine errors become an errno through
the one table in ``errno_map``; anything unexpected is logged with its
traceback (once per handler and exception type, a line after that) and answered
``EIO``, and the mount stays up.

Await boundaries and threads. Every call that can block (disk reads and writes, an
fsync on roll, rendering) runs in a worker thread through the one ``run_sync`` bridge
the daemon passes in (``trio.to_thread.run_sync`` under a limiter), so a partition
rolling a large segment never stalls a ``cat`` of another. The event loop itself only
reads in-memory state (topic metadata, ``Log`` counters) and answers reads from bytes
rendered ahead: slices of memory, one copy when they span chunks. A sequential reader
of a large file streams through the render process (``renderer``): the bytes
after the ones it holds are rendered there, on the other core, into shared slots, while
the loop replies (a worker thread cannot: pyfuse3 holds the GIL while libfuse copies a
reply); other reads, and all reads when the process is gone, render ``READ_AHEAD`` in a
worker thread. The requests of one open file
run one at a time, in arrival order (a ``trio.Lock`` per open file, taken before the
first await of ``read``/``write``): a writer's lines keep their order, and a reader's
shift (``position_reader``) is never updated by two reads at once. Namespace changes
(mkdir, a topic's format) hold one admin lock.

Inode numbers are stable for the daemon's life: one per (kind, topic, partition),
allocated on first sight and never reused; a view's inode (one per resolved start)
lives until the kernel forgets it. The namespace itself is read from the ``LogManager``
on every lookup and readdir (topics created or deleted through the control socket
appear and disappear), and entries and attributes are never cached by the kernel
(timeouts of 0; partition files are ``direct_io``), so ``st_size`` is exact at every
``stat``. An open file is bound to the logs it was opened on, not to its name: once its
topic is deleted it answers ``ESTALE``, also when a topic of that name exists again.

Writes (``write_path``): a partial line ends only at the open file's last close
(``release``) or ``fsync``, never at ``flush`` (every close of any descriptor, also a
child's exit); a write that would leave a partial line too large for one record is
refused, so what was accepted is appended; a ``raw`` write too large for one record is
cut into records that fit, appended together; a topic's rendering changes only while
no write to it is in flight and no open file of it holds a partial line.

Thread-safety: the handlers run on the trio thread; the ``_sync_*`` helpers they hand to
worker threads touch the engine (thread-safe), the open file they were given (its lock
is held), and two bookkeeping dicts (last active segment, last refresh) whose single
get/set operations the GIL keeps atomic.
"""

from __future__ import annotations

from .group_view import GroupViews
from .handler import enable_request_logging
from .nodes import BLOCK_SIZE, PRODUCE_FILE, XATTR_PREFIX, Kind, Node
from .state import RunSync

__all__ = [
    "BLOCK_SIZE",
    "PRODUCE_FILE",
    "XATTR_PREFIX",
    "Kind",
    "Node",
    "Operations",
    "RunSync",
    "enable_request_logging",
]


class Operations(GroupViews):
    """The pyfuse3 handlers of one mount: the namespace and attributes
    (``namespace``), the read path (``read_path``) and the write path
    (``write_path``) over one shared ``MountState``, with consumer groups' views
    (``group_view``). See the module docstring."""

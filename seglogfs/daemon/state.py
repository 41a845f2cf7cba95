"""What every part of the daemon's ``Operations`` shares: inodes, open files, the engine.

``MountState`` is the base of the three request handler groups (``namespace``,
``read_path``, ``write_path``), which ``operations.Operations`` joins into one pyfuse3
handler class. It owns the inode table (one inode per node, stable for the daemon's
life; view inodes until the kernel forgets them), the open files by handle and by
the file they hold (a process that holds a file gets its size from that open's
origin), the bridge to worker threads (``run_sync``), the render process's slots, the
one budget of what all readers keep rendered (``read_ahead``), and the read-only
mount's refresh of a live writer's changes.

It also keeps what makes a write do what was asked while the namespace changes under
it: each open file's request checks that the logs it was opened on are still its
topic's (``_opened``: a handle of a deleted topic answers ``ESTALE``, also once a topic
of the same name exists); the write requests in flight per topic and the topics whose
rendering is changing (``_writing``: a format change waits for none and is refused
while any is in flight or pending, writes wait for it); and the releases appending a
final partial line (``_settled``: requests that arrive after a release wait for it).

Thread-safety: the tables change on the trio thread only; ``_sync_refresh``, ``_log``
and ``_opened`` run in worker threads too and touch only the engine (thread-safe), the
open file whose lock the request holds, and a dict whose single get/set operations the
GIL keeps atomic.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pyfuse3
import trio

from storage import Log, LogManager, StorageError, TopicMetadata, UnknownTopicError

from ..positions import Rendering, log_start_anchor
from .handler import fail
from .malloc_tuning import release_free_memory
from .nodes import ROOT_NODE, Node, OpenFile
from .read_ahead import FETCH_MAX_BYTES, ReadAheadBudget
from .renderer import Renderer

__all__ = ["REFRESH_LOG_S", "REFRESH_TOPICS_S", "MountState", "RunSync", "thread_group"]

RunSync = Callable[..., Awaitable[Any]]
"""The daemon's bridge to worker threads: ``await run_sync(fn, *args)``."""

# Read-only mounts follow a live writer: a log is refreshed at most this often (seconds)
# when it is stat'ed or read, the topic list at most every REFRESH_TOPICS_S.
REFRESH_LOG_S = 0.02
REFRESH_TOPICS_S = 1.0


class MountState(pyfuse3.Operations):
    """The state of one mount, shared by its request handlers (see the module)."""

    supports_dot_lookup = True
    enable_writeback_cache = False
    enable_acl = False

    def __init__(
        self,
        manager: LogManager,
        run_sync: RunSync,
        *,
        read_only: bool = False,
        show_internal: bool = False,
        fetch_max_bytes: int = FETCH_MAX_BYTES,
    ) -> None:
        """``fetch_max_bytes``: what all readers keep rendered, together (the setting
        ``fetch.max.bytes``, ``read_ahead.fetch_max_bytes``).

        Raises:
            ConfigError: ``fetch_max_bytes`` below Kafka's minimum.
        """
        super().__init__()
        self.manager = manager
        self._run = run_sync
        self.read_only = read_only or manager.read_only
        self.show_internal = show_internal
        self._inodes: dict[Node, int] = {ROOT_NODE: pyfuse3.ROOT_INODE}
        self._nodes: dict[int, Node] = {pyfuse3.ROOT_INODE: ROOT_NODE}
        self._next_inode = itertools.count(pyfuse3.ROOT_INODE + 1)
        self._lookups: dict[int, int] = {}  # the kernel's lookup count of view inodes
        self._files: dict[int, OpenFile] = {}
        self._next_fh = itertools.count(1)
        # The open files of each partition and view (the sizes their processes see),
        # and each partition's first retained position, by log and log start offset.
        self._holders: dict[Node, set[OpenFile]] = {}
        self._starts: dict[tuple[str, int], tuple[Log, tuple[int, int], int]] = {}
        # Write requests in flight per topic; topics whose rendering is being changed
        # (set when the change ends); releases appending a partial line (likewise).
        self._writes: dict[str, int] = {}
        self._rendering_changes: dict[str, trio.Event] = {}
        self._closing: dict[OpenFile, trio.Event] = {}
        self._renderer: Renderer | None = None
        self._background: trio.Nursery | None = None
        self._read_ahead = ReadAheadBudget(fetch_max_bytes)
        self._admin = trio.Lock()
        self._mounted_ns = time.time_ns()
        self._uid = os.getuid()
        self._gid = os.getgid()
        self._refreshed: dict[tuple[str, int], float] = {}
        self._topics_refreshed = 0.0
        # The active segment each partition appended to last: a change is a roll.
        self._active_base: dict[tuple[str, int], int] = {
            (log.topic, log.partition): log.active_segment.base_offset for log in manager.logs()
        }

    def use_renderer(self, renderer: Renderer | None, nursery: trio.Nursery) -> None:
        """Stream sequential reads through ``renderer`` (None: render in threads); its
        fills, and giving memory back after readers close, run as tasks of ``nursery``,
        which outlives the requests."""
        self._renderer = renderer
        self._background = nursery

    # -- inodes, nodes and open files --------------------------------------------------

    def _inode(self, node: Node) -> int:
        inode = self._inodes.get(node)
        if inode is None:
            inode = next(self._next_inode)
            self._inodes[node] = inode
            self._nodes[inode] = node
        return inode

    def _node(self, inode: int) -> Node:
        node = self._nodes.get(inode)
        if node is None:
            raise fail(errno.ENOENT)
        return node

    def _file(self, fh: int) -> OpenFile:
        of = self._files.get(fh)
        if of is None:
            raise fail(errno.EBADF)
        return of

    def _opened(self, of: OpenFile) -> dict[int, Log]:
        """The logs ``of`` was opened on, by partition, while they are its topic's.

        Cost: a dictionary lookup per partition.

        Raises:
            FUSEError(ESTALE): the topic was deleted since ``of`` was opened (whether or
                not a topic of the same name exists now); the handle never reaches it.
        """
        topic = of.node.topic
        for partition, log in of.logs.items():
            try:
                current = self.manager.log(topic, partition)
            except UnknownTopicError:
                raise fail(errno.ESTALE) from None
            if current is not log:
                raise fail(errno.ESTALE)
        return of.logs

    def _opened_log(self, of: OpenFile) -> Log:
        """The log of a partition file or view ``of``. Raises: as ``_opened``."""
        return self._opened(of)[of.node.partition]

    @contextlib.asynccontextmanager
    async def _writing(self, topic: str) -> AsyncIterator[None]:
        """Count a request that may append to ``topic`` while it runs, after waiting
        for a change of the topic's rendering to end (no checkpoint when none runs)."""
        while (change := self._rendering_changes.get(topic)) is not None:
            await change.wait()
        self._writes[topic] = self._writes.get(topic, 0) + 1
        try:
            yield
        finally:
            left = self._writes[topic] - 1
            if left:
                self._writes[topic] = left
            else:
                del self._writes[topic]

    async def _settled(self, topic: str) -> None:
        """Wait for the releases of ``topic``'s files that are appending a final partial
        line: a request that arrives after a release sees its record."""
        while self._closing:
            waiting = [event for of, event in self._closing.items() if of.node.topic == topic]
            if not waiting:
                return
            await waiting[0].wait()

    def _visible(self, topic: str) -> bool:
        return self.show_internal or not topic.startswith("__")

    def _metadata(self, topic: str) -> TopicMetadata:
        """Raises: UnknownTopicError (ENOENT)."""
        return self.manager.topic(topic)

    def _log(self, node: Node) -> Log:
        """Raises: UnknownTopicError (ENOENT) when the topic or partition is gone."""
        return self.manager.log(node.topic, node.partition)

    async def _refresh_topics(self) -> None:
        # A read-only mount sees topics a live writer creates; at most once a second.
        if self.read_only and time.monotonic() - self._topics_refreshed > REFRESH_TOPICS_S:
            self._topics_refreshed = time.monotonic()
            await self._run(self.manager.refresh)

    def _sync_refresh(self, log: Log) -> None:
        if not self.read_only:
            return
        key = (log.topic, log.partition)
        now = time.monotonic()
        if now - self._refreshed.get(key, 0.0) > REFRESH_LOG_S:
            self._refreshed[key] = now
            log.refresh()

    def _sync_origin(self, node: Node, log: Log) -> int:
        """The global position of byte 0 of partition or view ``node`` opened read-only
        now: the oldest retained record's (retention and cleaning removed the bytes
        below it), or the view's start when that is later. Cost: O(1) while the log
        start stays, else ``log_start_anchor``'s O(log n)."""
        key = (node.topic, node.partition)
        # A cleaning pass moves the start position without the start offset.
        start = (log.log_start_offset, log.layout_epoch)
        cached = self._starts.get(key)
        if cached is None or cached[0] is not log or cached[1] != start:
            rendering = Rendering.of(self._metadata(node.topic), node.partition)
            try:
                position = log_start_anchor(log, rendering)[1]
            except StorageError:
                # A log start inside a segment is measured by rendering batches: one
                # that is damaged (its read reports it), or retention moving the start
                # meanwhile. The first segment's start is below it: not kept.
                return max(log.extension_start, node.view_position)
            cached = self._starts[key] = (log, start, position)
        return max(cached[2], node.view_position)

    def _free_slots(self, of: OpenFile) -> None:
        if self._renderer is not None:
            for slot in of.slots:
                self._renderer.free(slot)
        of.slots = []

    def _release_reads(self, of: OpenFile) -> None:
        """``of`` closed and no fill for it is outstanding: give back what its reads
        hold, its render slots and its kept bytes (``read_ahead``), and its place
        among the holders of its file."""
        holders = self._holders.get(of.node)
        if holders is not None:
            holders.discard(of)
            if not holders:
                del self._holders[of.node]
        self._free_slots(of)
        if self._read_ahead.release(of):
            self._give_back_memory()

    def _give_back_memory(self) -> None:
        # In a worker thread (it walks the heap); without a nursery to work in
        # (use_renderer was not called) the heap keeps it.
        if self._background is not None:
            self._background.start_soon(self._run, release_free_memory)


def thread_group(pid: int) -> int:
    """The process (thread group id) of thread ``pid``, as a FUSE request names its
    caller (the kernel sends the calling thread's id); -1 when it cannot be known (the
    thread is gone, or in another PID namespace: the kernel sends 0).

    Cost: one read of ``/proc/PID/status``.
    """
    if pid <= 0:
        return -1
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"Tgid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return -1

"""The file system: topics as directories, partitions as append-only files (SPEC §3).

``Operations`` is the pyfuse3 request handler over a ``storage.LogManager``::

    MOUNTPOINT/                 one directory per topic (mkdir creates one)
      <topic>/
        0  1  ...               partition files: append-only, read as rendered records
        produce                 write-only: lines partitioned like Kafka's producer
        0@<where>               unlisted read-only views (``seglogfs.views``)

Every handler raises only ``pyfuse3.FUSEError``: engine errors become an errno through
the one table in ``seglogfs.errno_map``; anything unexpected is logged with its
traceback (once per handler and exception type, a line after that) and answered
``EIO``, and the mount stays up.

Await boundaries and threads. Every call that can block (disk reads and writes, an
fsync on roll, rendering) runs in a worker thread through the one ``run_sync`` bridge
the daemon passes in (``trio.to_thread.run_sync`` under a limiter), so a partition
rolling a large segment never stalls a ``cat`` of another. The event loop itself only
reads in-memory state (topic metadata, ``Log`` counters) and answers reads from bytes
rendered ahead: slices of memory, one copy when they span chunks. A sequential reader
of a large file streams through the render process (``seglogfs.renderer``): the bytes
after the ones it holds are rendered there, on the other core, into shared slots, while
the loop replies (a worker thread cannot: pyfuse3 holds the GIL while libfuse copies a
reply); other reads, and all reads when the process is gone, render ``READ_AHEAD`` in a
worker thread. The requests of one open file
run one at a time, in arrival order (a ``trio.Lock`` per open file, taken before the
first await of ``read``/``write``): a writer's lines keep their order, and a reader's
shift (``seglogfs.positions``) is never updated by two reads at once. Namespace changes
(mkdir, a topic's format) hold one admin lock.

Inode numbers are stable for the daemon's life: one per (kind, topic, partition),
allocated on first sight and never reused; a view's inode (one per resolved start)
lives until the kernel forgets it. The namespace itself is read from the ``LogManager``
on every lookup and readdir (topics created or deleted through the control socket
appear and disappear), and entries and attributes are never cached by the kernel
(timeouts of 0; partition files are ``direct_io``), so ``st_size`` is exact at every
``stat``.

Thread-safety: the handlers run on the trio thread; the ``_sync_*`` helpers they hand to
worker threads touch the engine (thread-safe), the open file they were given (its lock
is held), and two bookkeeping dicts (last active segment, last refresh) whose single
get/set operations the GIL keeps atomic.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import functools
import itertools
import logging
import os
import stat
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

import pyfuse3
import trio

from storage import (
    AppendInfo,
    ConfigError,
    Log,
    LogManager,
    StickyPartitioner,
    StorageError,
    TopicMetadata,
    validate_topic_name,
)
from storage.segment import LogSegment

from .errno_map import errno_for
from .positions import PositionReader, Rendered, Rendering, position_of_offset
from .produce import LineBuffer, append_lines, append_raw, produce_lines
from .renderer import SLOT_BYTES, SLOTS_PER_FILE, Renderer
from .views import parse_view_name, resolve_offset

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

logger = logging.getLogger(__name__)

RunSync = Callable[..., Awaitable[Any]]
"""The daemon's bridge to worker threads: ``await run_sync(fn, *args)``."""

PRODUCE_FILE = "produce"
XATTR_PREFIX = "user.seglog."
BLOCK_SIZE = 1 << 20
"""``st_blksize`` of partition files: ``cat``, ``dd`` and ``cp`` size their reads by it,
and one large read costs one request instead of eight."""

READ_AHEAD = 4 << 20
"""Bytes a sequential read renders past its end in its worker thread: the next reads
(``cat`` and ``dd`` ask 1 MiB at a time) are answered on the event loop from memory, so
a sequential reader costs one thread hop per READ_AHEAD, not one per request. Memory:
at most READ_AHEAD plus a request and a batch kept per open file that reads on. A file
that streams through the render process (``seglogfs.renderer``) reads ahead through it
instead: its slots are rendered on the other core while the replies go out."""

# Read-only mounts follow a live writer: a log is refreshed at most this often (seconds)
# when it is stat'ed or read, the topic list at most every REFRESH_TOPICS_S.
REFRESH_LOG_S = 0.02
REFRESH_TOPICS_S = 1.0

_P = ParamSpec("_P")
_T = TypeVar("_T")


class Kind(enum.Enum):
    ROOT = "root"
    TOPIC = "topic"
    PARTITION = "partition"
    PRODUCE = "produce"
    VIEW = "view"


@dataclass(frozen=True, slots=True)
class Node:
    """What an inode denotes. A view also records the offset it starts at and that
    record's global byte position (fixed for ever, see ``seglogfs.positions``)."""

    kind: Kind
    topic: str = ""
    partition: int = -1
    view_offset: int = -1
    view_position: int = 0


ROOT_NODE = Node(Kind.ROOT)


class OpenFile:
    """The state of one open file (one ``open``, shared by its duplicated descriptors)."""

    __slots__ = (
        "append",
        "closed",
        "fill",
        "lines",
        "lock",
        "node",
        "reader",
        "slots",
        "stalled",
        "sticky",
        "writable",
    )

    def __init__(self, node: Node, *, writable: bool, append: bool, readable: bool) -> None:
        self.node = node
        self.writable = writable
        self.append = append
        self.lock = trio.Lock()
        self.lines = LineBuffer()
        base = node.view_position if node.kind is Kind.VIEW else 0
        self.reader = PositionReader(base) if readable else None
        self.sticky: StickyPartitioner | None = None
        # Render slots this file streams through (none until it reads sequentially), the
        # fill outstanding for it (set() when it ends), and whether it was released.
        self.slots: list[int] = []
        self.fill: trio.Event | None = None
        self.closed = False
        # The kept bytes after which a fill brought nothing (a corrupt batch, a batch
        # still being written): not asked for again until the reader moves on.
        self.stalled: Rendered | None = None


_logged_failures: set[tuple[str, str]] = set()
# Per-request DEBUG lines (--debug) cost a check on the hot path only when enabled.
_debug = False


def enable_request_logging(enabled: bool) -> None:
    """Log every read and write at DEBUG (``seglogfs mount --debug``)."""
    global _debug
    _debug = enabled


def _failure(handler: str, exc: Exception) -> pyfuse3.FUSEError:
    code = errno_for(exc)
    if code is None:
        # A bug, not a user's mistake: the traceback once per handler and exception
        # type (a loop of `cat` retries must not flood the log), a line after that.
        key = (handler, type(exc).__qualname__)
        if key in _logged_failures:
            logger.error("%s failed again: %s: %s", handler, type(exc).__name__, exc)
        else:
            _logged_failures.add(key)
            logger.error("%s failed: answered EIO", handler, exc_info=exc)
        code = errno.EIO
    elif code == errno.EIO:
        logger.error("%s: %s", handler, exc)
    return pyfuse3.FUSEError(code)


def _handler(
    fn: Callable[_P, Coroutine[Any, Any, _T]],
) -> Callable[_P, Coroutine[Any, Any, _T]]:
    """Wrap a request handler: only ``FUSEError`` leaves it (an exception escaping to
    pyfuse3 would end the main loop and leave a dead mount)."""
    name = fn.__name__

    @functools.wraps(fn)
    async def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        try:
            return await fn(*args, **kwargs)
        except pyfuse3.FUSEError:
            raise
        except Exception as exc:
            raise _failure(name, exc) from None

    return wrapper


def _fail(code: int) -> pyfuse3.FUSEError:
    return pyfuse3.FUSEError(code)


def _fill_plan(log: Log, tail: Rendered) -> tuple[LogSegment, int, int] | None:
    """``(segment, file position, end)`` of the bytes after ``tail``: the rest of its
    segment, or the next segment once it is read to its end; ``None`` at the log end.
    ``end`` is the segment's size now: bytes the engine has written whole."""
    segment = log.segments.floor_segment(tail.segment)
    if segment is None or segment.base_offset != tail.segment:
        return None  # deleted by retention: the daemon's own read repositions
    position = tail.resume
    if position >= segment.size:
        following = log.segments.higher_segment(segment.base_offset)
        if following is None or tail.skip or following.base_offset < tail.next_offset:
            return None
        segment, position = following, 0
    if position >= segment.size:
        return None
    return segment, position, segment.size


def _partition_number(name: str) -> int | None:
    # "0", "17": a canonical decimal (no sign, no leading zero), as the directory lists it.
    if name.isascii() and name.isdigit() and (name == "0" or name[0] != "0") and len(name) < 11:
        return int(name)
    return None


class Operations(pyfuse3.Operations):
    """The pyfuse3 handlers of one mount. See the module docstring."""

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
    ) -> None:
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
        self._renderer: Renderer | None = None
        self._background: trio.Nursery | None = None
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

    def use_renderer(self, renderer: Renderer, nursery: trio.Nursery) -> None:
        """Stream sequential reads through ``renderer``; its fills run as tasks of
        ``nursery``, which outlives the requests."""
        self._renderer = renderer
        self._background = nursery

    # -- inodes and nodes ------------------------------------------------------------

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
            raise _fail(errno.ENOENT)
        return node

    def _file(self, fh: int) -> OpenFile:
        of = self._files.get(fh)
        if of is None:
            raise _fail(errno.EBADF)
        return of

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

    # -- attributes ------------------------------------------------------------------

    def _sync_attributes(self, inode: int, node: Node) -> pyfuse3.EntryAttributes:
        attr = pyfuse3.EntryAttributes()
        attr.st_ino = inode
        attr.generation = 0
        attr.entry_timeout = 0
        attr.attr_timeout = 0
        attr.st_uid = self._uid
        attr.st_gid = self._gid
        attr.st_blksize = BLOCK_SIZE
        mtime = self._mounted_ns
        size = 0
        kind = node.kind
        if kind is Kind.ROOT or kind is Kind.TOPIC:
            if kind is Kind.TOPIC:
                self._metadata(node.topic)  # deleted through the command line: ENOENT
            attr.st_mode = stat.S_IFDIR | (0o555 if self.read_only else 0o755)
            attr.st_nlink = 2
        elif kind is Kind.PRODUCE:
            self._metadata(node.topic)
            attr.st_mode = stat.S_IFREG | 0o200
            attr.st_nlink = 1
        else:
            log = self._log(node)
            self._sync_refresh(log)
            size = log.extension_end
            if kind is Kind.VIEW:
                size = max(0, size - node.view_position)
                attr.st_mode = stat.S_IFREG | 0o444
            else:
                attr.st_mode = stat.S_IFREG | (0o444 if self.read_only else 0o644)
            attr.st_nlink = 1
            with contextlib.suppress(OSError):
                # The active segment's mtime moves with every append, also the
                # appends of another process a read-only mount follows.
                mtime = os.stat(log.active_segment.path).st_mtime_ns
        attr.st_size = size
        attr.st_blocks = (size + 511) // 512
        attr.st_atime_ns = mtime
        attr.st_mtime_ns = mtime
        attr.st_ctime_ns = mtime
        return attr

    async def _attributes(self, inode: int) -> pyfuse3.EntryAttributes:
        node = self._node(inode)
        if node.kind is Kind.PARTITION or node.kind is Kind.VIEW:
            attr: pyfuse3.EntryAttributes = await self._run(self._sync_attributes, inode, node)
            return attr
        return self._sync_attributes(inode, node)

    # -- namespace -------------------------------------------------------------------

    async def _child(self, parent: Node, name: str) -> Node:
        if parent.kind is Kind.ROOT:
            await self._refresh_topics()
            if not self._visible(name):
                raise _fail(errno.ENOENT)
            self._metadata(name)
            return Node(Kind.TOPIC, name)
        if parent.kind is not Kind.TOPIC:
            raise _fail(errno.ENOTDIR)
        metadata = self._metadata(parent.topic)
        if name == PRODUCE_FILE and not self.read_only:
            return Node(Kind.PRODUCE, parent.topic)
        number = _partition_number(name)
        if number is not None:
            node = Node(Kind.PARTITION, parent.topic, number)
            self._log(node)
            return node
        view = parse_view_name(name)
        if view is None or view.partition >= metadata.partitions:
            raise _fail(errno.ENOENT)
        log = self.manager.log(parent.topic, view.partition)
        rendering = Rendering.of(metadata)

        def resolve() -> Node | None:
            self._sync_refresh(log)
            offset = resolve_offset(log, view)
            if offset is None:
                return None
            position = position_of_offset(log, rendering, offset)
            return Node(Kind.VIEW, parent.topic, view.partition, offset, position)

        node_or_none: Node | None = await self._run(resolve)
        if node_or_none is None:
            raise _fail(errno.ENOENT)
        return node_or_none

    def _entries(self, node: Node) -> list[tuple[str, Node]]:
        if node.kind is Kind.ROOT:
            return [(t, Node(Kind.TOPIC, t)) for t in self.manager.topics() if self._visible(t)]
        if node.kind is not Kind.TOPIC:
            raise _fail(errno.ENOTDIR)
        metadata = self._metadata(node.topic)
        entries = []
        for partition in range(metadata.partitions):
            child = Node(Kind.PARTITION, node.topic, partition)
            try:
                self._log(child)
            except StorageError:
                continue  # a read-only copy may lack a partition directory
            entries.append((str(partition), child))
        if not self.read_only:
            entries.append((PRODUCE_FILE, Node(Kind.PRODUCE, node.topic)))
        return entries

    @_handler
    async def lookup(
        self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        parent = self._node(parent_inode)
        text = os.fsdecode(name)
        if text == ".":
            return await self._attributes(parent_inode)
        if text == "..":
            return await self._attributes(pyfuse3.ROOT_INODE)
        node = await self._child(parent, text)
        inode = self._inode(node)
        attr = await self._attributes(inode)
        if node.kind is Kind.VIEW:
            # Views are made per resolution (0@latest names a new start as the log
            # grows): counted, so `forget` can drop them and the table stays small.
            self._lookups[inode] = self._lookups.get(inode, 0) + 1
        return attr

    async def forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        for inode, count in inode_list:
            left = self._lookups.get(inode)
            if left is None:
                continue  # topics and partitions keep their inode for the daemon's life
            if left > count:
                self._lookups[inode] = left - count
                continue
            del self._lookups[inode]
            node = self._nodes.pop(inode, None)
            if node is not None:
                self._inodes.pop(node, None)

    @_handler
    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        return await self._attributes(inode)

    @_handler
    async def setattr(
        self,
        inode: int,
        attr: pyfuse3.EntryAttributes,
        fields: pyfuse3.SetattrFields,
        fh: int | None,
        ctx: pyfuse3.RequestContext,
    ) -> pyfuse3.EntryAttributes:
        node = self._node(inode)
        refused = fields.update_mode or fields.update_uid or fields.update_gid
        if fields.update_size:
            # Truncating the write-only produce file to 0 (`>` on it) changes nothing;
            # any other size change would rewrite records: refused.
            refused = refused or not (node.kind is Kind.PRODUCE and attr.st_size == 0)
        if refused:
            raise _fail(errno.EROFS if self.read_only else errno.EPERM)
        # Time updates (touch) are accepted and ignored: the times are the data's.
        return await self._attributes(inode)

    @_handler
    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        node = self._node(inode)
        if node.kind is not Kind.ROOT and node.kind is not Kind.TOPIC:
            raise _fail(errno.ENOTDIR)
        if node.kind is Kind.ROOT:
            await self._refresh_topics()
        return inode

    @_handler
    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        entries = self._entries(self._node(fh))[start_id:]
        if not entries:
            return
        inodes = [(self._inode(node), node) for _name, node in entries]

        def attributes() -> list[pyfuse3.EntryAttributes | None]:
            out: list[pyfuse3.EntryAttributes | None] = []
            for inode, node in inodes:
                try:
                    out.append(self._sync_attributes(inode, node))
                except StorageError:
                    out.append(None)  # deleted since the listing: skip it
            return out

        attrs: list[pyfuse3.EntryAttributes | None] = await self._run(attributes)
        for i, ((name, _node), attr) in enumerate(zip(entries, attrs, strict=True)):
            if attr is None:
                continue
            if not pyfuse3.readdir_reply(token, os.fsencode(name), attr, start_id + i + 1):
                break

    @_handler
    async def releasedir(self, fh: int) -> None:
        return None

    @_handler
    async def mkdir(
        self, parent_inode: int, name: bytes, mode: int, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        parent = self._node(parent_inode)
        if self.read_only:
            raise _fail(errno.EROFS)
        if parent.kind is not Kind.ROOT:
            raise _fail(errno.EPERM)  # a topic holds partitions, not directories
        topic = os.fsdecode(name)
        validate_topic_name(topic)
        async with self._admin:
            metadata: TopicMetadata = await self._run(self.manager.create_topic, topic)
        for partition in range(metadata.partitions):
            log = self.manager.log(topic, partition)
            self._active_base[(topic, partition)] = log.active_segment.base_offset
        return await self._attributes(self._inode(Node(Kind.TOPIC, topic)))

    async def _refuse_change(self, parent_inode: int, name: bytes) -> None:
        # The entry must exist (ENOENT otherwise); existing entries are never removed
        # or renamed here (EPERM; EROFS on a read-only mount).
        await self._child(self._node(parent_inode), os.fsdecode(name))
        raise _fail(errno.EROFS if self.read_only else errno.EPERM)

    @_handler
    async def rmdir(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        # Deleting a topic deletes its data: only the command line does it, explicitly.
        await self._refuse_change(parent_inode, name)

    @_handler
    async def unlink(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        await self._refuse_change(parent_inode, name)

    @_handler
    async def rename(
        self,
        parent_inode_old: int,
        name_old: bytes,
        parent_inode_new: int,
        name_new: bytes,
        flags: int,
        ctx: pyfuse3.RequestContext,
    ) -> None:
        await self._refuse_change(parent_inode_old, name_old)

    @_handler
    async def link(
        self,
        inode: int,
        new_parent_inode: int,
        new_name: bytes,
        ctx: pyfuse3.RequestContext,
    ) -> pyfuse3.EntryAttributes:
        raise _fail(errno.EROFS if self.read_only else errno.EPERM)

    @_handler
    async def symlink(
        self,
        parent_inode: int,
        name: bytes,
        target: bytes,
        ctx: pyfuse3.RequestContext,
    ) -> pyfuse3.EntryAttributes:
        raise _fail(errno.EROFS if self.read_only else errno.EPERM)

    def _refuse_create(self, parent_inode: int, name: bytes) -> pyfuse3.FUSEError:
        parent = self._node(parent_inode)
        if self.read_only:
            return _fail(errno.EROFS)
        if parent.kind is not Kind.TOPIC:
            return _fail(errno.EPERM)  # the root holds topics: mkdir creates them
        text = os.fsdecode(name)
        if _partition_number(text) is not None or parse_view_name(text) is not None:
            return _fail(errno.ENOENT)  # names a partition the topic does not have
        return _fail(errno.EINVAL)  # no file of that name can exist in a topic

    @_handler
    async def create(
        self,
        parent_inode: int,
        name: bytes,
        mode: int,
        flags: int,
        ctx: pyfuse3.RequestContext,
    ) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        raise self._refuse_create(parent_inode, name)

    @_handler
    async def mknod(
        self,
        parent_inode: int,
        name: bytes,
        mode: int,
        rdev: int,
        ctx: pyfuse3.RequestContext,
    ) -> pyfuse3.EntryAttributes:
        raise self._refuse_create(parent_inode, name)

    @_handler
    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        st: os.statvfs_result = await self._run(os.statvfs, self.manager.log_dir)
        data = pyfuse3.StatvfsData()
        data.f_bsize = st.f_bsize
        data.f_frsize = st.f_frsize
        data.f_blocks = st.f_blocks
        data.f_bfree = st.f_bfree
        data.f_bavail = st.f_bavail
        data.f_files = st.f_files
        data.f_ffree = st.f_ffree
        data.f_favail = st.f_favail
        data.f_namemax = st.f_namemax
        return data

    # -- open files ------------------------------------------------------------------

    @_handler
    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        node = self._node(inode)
        access = flags & os.O_ACCMODE
        writing = access != os.O_RDONLY
        if node.kind is Kind.ROOT or node.kind is Kind.TOPIC:
            raise _fail(errno.EISDIR)
        if writing and self.read_only:
            raise _fail(errno.EROFS)
        if node.kind is Kind.PARTITION:
            self._log(node)
            if flags & os.O_TRUNC:
                raise _fail(errno.EPERM)  # `>`: the records stay; `>>` appends
        elif node.kind is Kind.PRODUCE:
            self._metadata(node.topic)
            if access != os.O_WRONLY:
                raise _fail(errno.EACCES)  # write-only: it has nothing to read
        elif writing or flags & os.O_TRUNC:
            raise _fail(errno.EPERM)  # a view is read-only
        of = OpenFile(
            node,
            writable=writing,
            append=bool(flags & os.O_APPEND),
            readable=access != os.O_WRONLY,
        )
        if node.kind is Kind.PRODUCE:
            of.sticky = StickyPartitioner(self._metadata(node.topic).partitions)
        fh = next(self._next_fh)
        self._files[fh] = of
        # direct_io: every read and write reaches the daemon (exact sizes, no stale
        # page cache, positions that follow the per-file shift), and a write() is one
        # request (up to max_write), so its lines become one batch.
        return pyfuse3.FileInfo(fh=fh, direct_io=True, keep_cache=False)

    @_handler
    async def read(self, fh: int, off: int, size: int) -> bytes:
        of = self._file(fh)
        reader = of.reader
        if reader is None:
            raise _fail(errno.EBADF)
        async with of.lock:
            # Bytes rendered ahead (here or by the render process) are answered on the
            # event loop (slices of memory, no file touched); the rest in a worker
            # thread. A fill still outstanding may bring the bytes asked for, and must
            # not change the kept bytes under a worker thread: wait for it first.
            log = self._log(of.node)
            data: Any = reader.read_rendered(log, off, size)
            while data is None and of.fill is not None:
                await of.fill.wait()
                data = reader.read_rendered(log, off, size)
            if data is None:
                ahead = 0 if of.slots else READ_AHEAD
                data = await self._run(self._sync_read, of.node, reader, off, size, ahead)
            self._start_fill(of, reader, log)
        if _debug:
            logger.debug("read fh=%d off=%d size=%d: %d bytes", fh, off, size, len(data))
        return data  # type: ignore[no-any-return]

    def _sync_read(
        self, node: Node, reader: PositionReader, off: int, size: int, ahead: int
    ) -> Any:
        log = self._log(node)
        self._sync_refresh(log)
        rendering = Rendering.of(self._metadata(node.topic))
        return reader.read(log, rendering, off, size, ahead)

    def _start_fill(self, of: OpenFile, reader: PositionReader, log: Log) -> None:
        # After a sequential read: have the render process render the bytes after the
        # kept ones into a slot none of them is in, while the replies go on.
        renderer = self._renderer
        if renderer is None or self._background is None or not renderer.alive:
            return
        if of.fill is not None or of.closed:
            return
        tail = reader.fill_tail(log)
        if tail is None or tail is of.stalled:
            return
        plan = _fill_plan(log, tail)
        if plan is None:
            return
        if not of.slots:
            if log.extension_end - tail.end < SLOT_BYTES:
                return  # near the end (tail -f): the daemon's own reads are enough
            for _ in range(SLOTS_PER_FILE):
                slot = renderer.allocate()
                if slot is not None:
                    of.slots.append(slot)
            if len(of.slots) < SLOTS_PER_FILE:
                self._free_slots(of)
                return
        slot = next((s for s in of.slots if s != tail.slot and reader.release_slot(s)), None)
        if slot is None:
            return  # every other slot still holds bytes the reader has not passed
        segment, position, end = plan
        # End the fill where the reader's kernel offset is a multiple of BLOCK_SIZE, so
        # that each 1 MiB read of `cat` or `dd` lies in one fill: a slice, not a copy.
        limit = tail.end + SLOT_BYTES
        cut = limit - (limit - reader.phase) % BLOCK_SIZE
        capacity = (cut if cut > tail.end else limit) - tail.end
        of.fill = trio.Event()
        self._background.start_soon(
            self._fill, renderer, of, reader, tail, slot, segment, position, end, capacity
        )

    async def _fill(
        self,
        renderer: Renderer,
        of: OpenFile,
        reader: PositionReader,
        tail: Rendered,
        slot: int,
        segment: LogSegment,
        position: int,
        end: int,
        capacity: int,
    ) -> None:
        # Opportunistic: a fill that fails only means the daemon renders those bytes
        # itself (and reports any error then). Raises only Cancelled.
        try:
            rendering = Rendering.of(self._metadata(of.node.topic))
            result = await renderer.fill(
                slot,
                segment,
                position,
                end,
                tail.next_offset,
                tail.skip,
                capacity,
                rendering.raw,
                rendering.key_separator,
            )
            if result is not None and result.written > 0:
                filled = Rendered(
                    tail.end,
                    renderer.bytes_of(slot, result.written),
                    result.next_offset,
                    segment.base_offset,
                    result.position,
                    result.skip,
                    slot,
                )
                reader.accept_fill(tail, filled)
            else:
                # Asking again at once would get the same answer, in a loop: the
                # daemon's own read of these bytes says what is wrong, if anything.
                of.stalled = tail
        except Exception as exc:
            of.stalled = tail
            logger.debug("fill for %s failed: %r", of.node, exc)
        finally:
            event, of.fill = of.fill, None
            if event is not None:
                event.set()
            if of.closed:
                self._free_slots(of)
        if not of.closed and not of.lock.locked():
            # Keep the render process busy: the next fill now, not after the next read
            # (a read in progress starts it itself when it ends).
            try:
                self._start_fill(of, reader, self._log(of.node))
            except Exception as exc:  # the topic is gone: its next read says so
                logger.debug("no next fill for %s: %r", of.node, exc)

    def _free_slots(self, of: OpenFile) -> None:
        if self._renderer is not None:
            for slot in of.slots:
                self._renderer.free(slot)
        of.slots = []

    @_handler
    async def write(self, fh: int, off: int, buf: bytes) -> int:
        of = self._file(fh)
        if not of.writable:
            raise _fail(errno.EBADF)
        async with of.lock:
            written: int = await self._run(self._sync_write, of, off, buf)
        if _debug:
            logger.debug("write fh=%d off=%d size=%d: %d written", fh, off, len(buf), written)
        return written

    def _sync_write(self, of: OpenFile, off: int, buf: bytes) -> int:
        node = of.node
        metadata = self._metadata(node.topic)
        if node.kind is Kind.PARTITION:
            log = self._log(node)
            if not of.append and off < log.extension_end:
                # Without O_APPEND the kernel's offset is where the writer believes it
                # writes: below the end that would be the middle of the file.
                raise _fail(errno.EPERM)
            limit = log.config.max_message_bytes
        else:
            # Every partition of a topic has the topic's config: no need to rebuild it.
            limit = self.manager.log(node.topic, 0).config.max_message_bytes
        if metadata.format == "raw":
            if buf:
                self._append_raw(of, buf)
            return len(buf)
        complete, tail = of.lines.split(buf, limit)
        if complete:
            appended = self._append_lines(of, metadata, complete)
            if appended < len(complete):
                # A short write: the lines after `appended` were refused (the pending
                # partial line went out with the first of them); the writer sends the
                # rest again and meets the error then.
                consumed = appended - len(of.lines.pending)
                of.lines.commit(b"")
                return consumed
        of.lines.commit(tail)
        return len(buf)

    def _append_raw(self, of: OpenFile, data: bytes) -> None:
        node = of.node
        if node.kind is Kind.PARTITION:
            partition = node.partition
        else:
            assert of.sticky is not None
            partition = of.sticky.partition()
            of.sticky.next_batch()
        self._note_append(
            node.topic, partition, append_raw(self.manager.log(node.topic, partition), data)
        )

    def _append_lines(self, of: OpenFile, metadata: TopicMetadata, data: bytes) -> int:
        node = of.node
        separator = Rendering.of(metadata).key_separator
        if node.kind is Kind.PARTITION:
            appended, infos = append_lines(self._log(node), data, separator)
            for info in infos:
                self._note_append(node.topic, node.partition, info)
            return appended
        assert of.sticky is not None

        def log_of(partition: int) -> Log:
            return self.manager.log(node.topic, partition)

        appended, produced = produce_lines(log_of, metadata.partitions, data, separator, of.sticky)
        for partition, info in produced:
            self._note_append(node.topic, partition, info)
        return appended

    def _note_append(self, topic: str, partition: int, info: AppendInfo) -> None:
        key = (topic, partition)
        previous = self._active_base.get(key)
        self._active_base[key] = info.segment_base_offset
        if previous is not None and previous != info.segment_base_offset:
            logger.info("%s-%d: rolled to segment %d", topic, partition, info.segment_base_offset)

    def _sync_append_pending(self, of: OpenFile) -> None:
        # Close (and fsync) end a partial line: it becomes a record of its own.
        data = of.lines.completed()
        if data:
            self._append_lines(of, self._metadata(of.node.topic), data)
            of.lines.commit(b"")

    @_handler
    async def flush(self, fh: int) -> None:
        of = self._file(fh)
        if of.lines.pending:
            async with of.lock:
                await self._run(self._sync_append_pending, of)

    @_handler
    async def release(self, fh: int) -> None:
        of = self._files.get(fh)
        if of is None:
            return
        try:
            if of.lines.pending:
                async with of.lock:
                    await self._run(self._sync_append_pending, of)
        finally:
            del self._files[fh]
            of.closed = True
            if of.fill is None:  # else the fill frees the slots when it ends
                self._free_slots(of)

    @_handler
    async def fsync(self, fh: int, datasync: bool) -> None:
        of = self._file(fh)
        if not of.writable:
            return
        async with of.lock:
            await self._run(self._sync_fsync, of)

    def _sync_fsync(self, of: OpenFile) -> None:
        self._sync_append_pending(of)
        node = of.node
        if node.kind is Kind.PARTITION:
            self._log(node).flush()
        else:
            for partition in range(self._metadata(node.topic).partitions):
                self.manager.log(node.topic, partition).flush()

    def finish(self) -> int:
        """Append the partial lines of files still open (the daemon is stopping; their
        close will never come). Blocking: call it after the main loop. Returns how many
        files had one."""
        done = 0
        for of in list(self._files.values()):
            if of.lines.pending:
                try:
                    self._sync_append_pending(of)
                    done += 1
                except (StorageError, OSError) as exc:
                    logger.error("partial line of an open file lost at shutdown: %s", exc)
        self._files.clear()
        return done

    # -- extended attributes ---------------------------------------------------------

    def _sync_xattrs(self, node: Node) -> dict[str, str]:
        if node.kind is Kind.ROOT:
            return {"log_dir": str(self.manager.log_dir)}
        metadata = self._metadata(node.topic)
        if node.kind is Kind.TOPIC or node.kind is Kind.PRODUCE:
            out = {"partitions": str(metadata.partitions), "format": metadata.format}
            if metadata.key_separator is not None:
                out["key.separator"] = metadata.key_separator
            out.update(self.manager.topic_config(node.topic).to_properties())
            return out
        log = self._log(node)
        self._sync_refresh(log)
        description = self.manager.describe_partition(node.topic, node.partition)
        out = {
            "log_start_offset": str(description.log_start_offset),
            "log_end_offset": str(description.log_end_offset),
            "segments": str(description.segment_count),
            "size": str(description.size),
            "first_timestamp": str(description.first_timestamp),
            "last_timestamp": str(description.last_timestamp),
            "start_position": str(log.extension_start),
            "end_position": str(log.extension_end),
        }
        if node.kind is Kind.VIEW:
            out["view_offset"] = str(node.view_offset)
            out["view_position"] = str(node.view_position)
        return out

    @_handler
    async def listxattr(self, inode: int, ctx: pyfuse3.RequestContext) -> Sequence[bytes]:
        values: dict[str, str] = await self._run(self._sync_xattrs, self._node(inode))
        return [(XATTR_PREFIX + key).encode() for key in values]

    @_handler
    async def getxattr(self, inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> bytes:
        text = os.fsdecode(name)
        if not text.startswith(XATTR_PREFIX):
            raise _fail(pyfuse3.ENOATTR)
        values: dict[str, str] = await self._run(self._sync_xattrs, self._node(inode))
        value = values.get(text[len(XATTR_PREFIX) :])
        if value is None:
            raise _fail(pyfuse3.ENOATTR)
        return value.encode()

    def _config_target(self, inode: int, name: bytes) -> tuple[str, str]:
        node = self._node(inode)
        text = os.fsdecode(name)
        if not text.startswith(XATTR_PREFIX):
            raise _fail(errno.ENOTSUP)  # only user.seglog.* means something here
        if self.read_only:
            raise _fail(errno.EROFS)
        if node.kind is not Kind.TOPIC:
            raise _fail(errno.EPERM)  # a partition's attributes are facts, not settings
        return node.topic, text[len(XATTR_PREFIX) :]

    @_handler
    async def setxattr(
        self, inode: int, name: bytes, value: bytes, ctx: pyfuse3.RequestContext
    ) -> None:
        topic, key = self._config_target(inode, name)
        try:
            text = value.decode("utf-8")
        except UnicodeDecodeError:
            logger.warning("setfattr %s on topic %s refused: the value is not UTF-8", key, topic)
            raise _fail(errno.EINVAL) from None
        if key == "partitions":
            raise _fail(errno.EPERM)
        try:
            async with self._admin:
                if key in ("format", "key.separator"):
                    await self._run(self._sync_set_rendering, topic, key, text)
                else:
                    await self._run(self.manager.alter_topic_config, topic, {key: text})
        except ConfigError as exc:
            logger.warning("setfattr %s on topic %s refused: %s", key, topic, exc)
            raise _fail(errno.EINVAL) from None
        logger.info("topic %s: set %s=%s", topic, key, text)

    @_handler
    async def removexattr(self, inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        topic, key = self._config_target(inode, name)
        if key not in self.manager.topic(topic).overrides:
            raise _fail(pyfuse3.ENOATTR)
        async with self._admin:
            await self._run(self.manager.alter_topic_config, topic, None, [key])
        logger.info("topic %s: removed the override of %s", topic, key)

    def _sync_set_rendering(self, topic: str, key: str, value: str) -> None:
        metadata = self._metadata(topic)
        fmt = value if key == "format" else metadata.format
        separator = (value or None) if key == "key.separator" else metadata.key_separator
        # The rendering decides every position, so the engine fixes it once a record
        # exists (TopicNotEmptyError: EPERM) and validates it (ConfigError: EINVAL).
        self.manager.set_topic_rendering(topic, fmt, separator)
        for partition in range(metadata.partitions):
            log = self.manager.log(topic, partition)
            self._active_base[(topic, partition)] = log.active_segment.base_offset

"""Consumer groups in the file system: the views ``P@group=NAME`` and group xattrs.

A view ``P@group=NAME`` (``views``) is partition P read as a member of consumer group
NAME (``storage.OffsetStore``, the daemon's one store, shared with the control socket):

- lookup: it starts at the group's committed offset (within the log), else where its
  reset rule says (``group=``: the log end, as Kafka's ``auto.offset.reset=latest``;
  ``group:earliest=``, ``group:none=``: ``ENOENT`` without an offset). A lookup waits for
  a close of the same group's view of the partition that is still committing, so
  ``cat 0@group=g; cat 0@group=g`` prints only what arrived in between.
- open: the opener joins the group for P (``CLIENT-ID`` its command name, ``CONSUMER-ID``
  ``NAME-view-...``): ``groups describe`` shows it, ``groups reset-offsets`` and
  ``groups delete`` are refused while it is open. One reader per partition and group, as
  Kafka assigns a partition to one member: a second open of the view while one is open
  (another process's ``cat``, a ``tail -f``) is refused with ``EBUSY``; a read-only
  mount opens group views without joining or committing.
- close (``release``, the last close of the open file): the view commits its position,
  the offset after the last record whose bytes the reads returned entirely (a record
  cut by the end of the last read is read again next time), or where it started when
  it read nothing, as a Kafka consumer's auto-commit commits its position; then it
  leaves. What was returned counts, not what the reader printed: ``head -1`` of a view
  commits the whole first read (up to 128 KiB).

Partitions and views show each group's committed offset as
``user.seglog.group.NAME.offset``.

``GroupViews`` adds this to the three handler groups (``Operations`` is it); it changes
none of their code: ``_child`` (lookup), ``open``, ``release`` and ``_sync_xattrs`` handle
group views and hand everything else on.

Thread-safety: as ``MountState``; the store is thread-safe and its calls run in worker
threads.
"""

from __future__ import annotations

import errno
import functools
import logging

import pyfuse3
import trio

from storage import Log, OffsetStore, PartitionAssignedError, StorageError

from ..positions import Rendering, log_start_anchor, position_of_offset
from .handler import fail, handler
from .namespace import Namespace
from .nodes import Kind, Node
from .read_path import ReadPath
from .views import ViewName, parse_view_name
from .write_path import WritePath

__all__ = ["GroupViews", "offset_after"]

logger = logging.getLogger(__name__)

_GROUP_XATTR = "group."
_CLIENT_ID = "seglogfs-mount"


def offset_after(log: Log, rendering: Rendering, position: int) -> int:
    """The offset of the first record not wholly before global ``position`` (the log end
    offset when every record is): what a reader that got the bytes up to ``position``
    reads next.

    Cost: O(log n) through the position index, then at most one index interval of
    batches rendered.
    """
    if position >= log.extension_end:
        return log.log_end_offset
    start_units, start_position = log_start_anchor(log, rendering)
    if position <= start_position:
        return log.log_start_offset
    offset, cursor = log.extension_floor(position)
    if offset < log.log_start_offset:
        offset, cursor = log.log_start_offset, start_units
    for batch in log.batches(offset):
        rendered = rendering.render(batch)
        for record_offset, end in zip(rendered.offsets, rendered.ends, strict=True):
            if cursor + end > position and record_offset >= log.log_start_offset:
                return record_offset
        cursor += len(rendered.data)
    return log.log_end_offset


def _command_of(pid: int) -> str:
    """The command name of process ``pid`` (``cat``, ``tail``), for ``CLIENT-ID``."""
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as handle:
            return handle.read().strip() or _CLIENT_ID
    except OSError:
        return _CLIENT_ID


class GroupViews(Namespace, ReadPath, WritePath):
    """The handlers of the file system, with consumer groups (see the module)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        # Open group views: file handle -> (group, member id; None on a read-only mount).
        self._group_readers: dict[int, tuple[str, str | None]] = {}
        # Closes committing, by (group, topic, partition): lookups of the view wait.
        self._group_commits: dict[tuple[str, str, int], trio.Event] = {}

    def _groups(self) -> OffsetStore:
        return OffsetStore.shared(self.manager)

    # -- lookup ------------------------------------------------------------------------

    async def _child(self, parent: Node, name: str) -> Node:
        if parent.kind is Kind.TOPIC:
            view = parse_view_name(name)
            if view is not None and view.group is not None:
                return await self._group_child(parent, view)
        return await super()._child(parent, name)

    async def _group_child(self, parent: Node, view: ViewName) -> Node:
        metadata = self._metadata(parent.topic)
        if view.partition >= metadata.partitions:
            raise fail(errno.ENOENT)
        assert view.group is not None
        group = view.group
        key = (group, parent.topic, view.partition)
        while (closing := self._group_commits.get(key)) is not None:
            await closing.wait()
        log = self.manager.log(parent.topic, view.partition)
        rendering = Rendering.of(metadata, view.partition)
        store = self._groups()

        def resolve() -> Node | None:
            self._sync_refresh(log)
            committed = store.committed(group, parent.topic).get((parent.topic, view.partition))
            start, end = log.log_start_offset, log.log_end_offset
            if committed is not None and start <= committed.offset <= end:
                offset = committed.offset
            elif view.reset == "none":
                return None
            else:
                offset = start if view.reset == "earliest" else end
            position = position_of_offset(log, rendering, offset)
            return Node(Kind.VIEW, parent.topic, view.partition, offset, position, log, group=group)

        node: Node | None = await self._run(resolve)
        if node is None:
            raise fail(errno.ENOENT)
        return node

    # -- open and close ----------------------------------------------------------------

    @handler
    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        node = self._node(inode)
        if node.kind is not Kind.VIEW or not node.group:
            return await super().open(inode, flags, ctx)
        member_id: str | None = None
        store = self._groups()
        if not self.read_only:
            client = _command_of(ctx.pid)
            join = functools.partial(
                store.join,
                node.group,
                node.topic,
                [node.partition],
                client_id=client,
                host="localhost",
            )
            try:
                member_id, _partitions = await self._run(join)
            except PartitionAssignedError as exc:
                logger.info(
                    "open of %s-%d@group=%s refused (EBUSY): %s",
                    node.topic,
                    node.partition,
                    node.group,
                    exc,
                )
                raise fail(errno.EBUSY) from None
        try:
            info: pyfuse3.FileInfo = await super().open(inode, flags, ctx)
        except BaseException:
            if member_id is not None:
                await self._run(store.leave, node.group, member_id)
            raise
        self._group_readers[info.fh] = (node.group, member_id)
        return info

    @handler
    async def release(self, fh: int) -> None:
        reader = self._group_readers.pop(fh, None)
        of = self._files.get(fh)
        if reader is None or of is None:
            await super().release(fh)
            return
        group, member_id = reader
        node = of.node
        key = (group, node.topic, node.partition)
        # Registered before the first await: a lookup of the view that the kernel sent
        # after this release waits for the commit.
        done = self._group_commits[key] = trio.Event()
        try:
            end = of.reader.end if of.reader is not None else -1
            log = of.logs[node.partition]
            await super().release(fh)
            if member_id is not None:
                await self._run(self._sync_commit, node, log, end, member_id)
        finally:
            del self._group_commits[key]
            done.set()

    def _sync_commit(self, node: Node, log: Log, end: int, member_id: str) -> None:
        # Nobody hears the answer to a release: a failure is a log line.
        store = self._groups()
        try:
            if self.manager.log(node.topic, node.partition) is not log:
                return  # the topic was deleted since the view opened
            if end < 0:
                offset = node.view_offset
            else:
                rendering = Rendering.of(self._metadata(node.topic), node.partition)
                offset = offset_after(log, rendering, end)
            store.commit(node.group, {(node.topic, node.partition): offset}, member_id=member_id)
        except (StorageError, OSError) as exc:
            logger.error(
                "%s-%d@group=%s: commit at close failed: %s",
                node.topic,
                node.partition,
                node.group,
                exc,
            )
        finally:
            store.leave(node.group, member_id)

    # -- extended attributes -----------------------------------------------------------

    def _sync_xattrs(self, node: Node) -> dict[str, str]:
        out = super()._sync_xattrs(node)
        if node.kind is Kind.PARTITION or node.kind is Kind.VIEW:
            offsets = self._groups().offsets_of_partition(node.topic, node.partition)
            for group, offset in offsets.items():
                out[f"{_GROUP_XATTR}{group}.offset"] = str(offset)
        return out

"""The namespace and attributes: lookup, readdir, getattr, mkdir, xattrs (SPEC §3).

Topics are directories (``mkdir`` creates one), partitions and the ``produce`` file
are their entries (``produce`` reads as an empty file, so tree walks copy it as one),
views (``P@<where>``) resolve by name without being listed. The namespace is read from
the ``LogManager`` on every lookup and readdir (topics created or deleted through the
control socket appear and disappear), and entries and attributes are never cached by
the kernel (timeouts of 0), so ``st_size`` is exact at every ``stat``: the end minus
the origin of the file's byte 0 (``nodes.OpenFile``), that of the oldest file the
caller's process holds open on it, else that of a read-only open made now (the
retained bytes), so that ``stat`` then ``read`` agree for ``tar``, ``rsync`` and
``wc -c`` and a holder's size never decreases. Removing, renaming or truncating
anything is refused: records stay.
Extended attributes show a partition's state and a topic's config; ``setfattr`` on a
topic changes its config.

``mkdir`` creates only what can be reached: a name Kafka refuses, or an internal name
(``__...``) on a mount that hides internal topics, is ``EINVAL`` and an INFO line naming
the rule. A topic's rendering (``format``, ``key.separator``) changes only before its
first record and while no write to it is in flight and no open file of it holds a
partial line (``EBUSY``): a pending line was measured in the old rendering, and the
position index counts each record in the rendering it is appended under. Files open on
the topic then follow the new rendering. A ``lines`` topic whose ``cleanup.policy`` has
``compact`` needs a ``key.separator`` (its lines would be keyless records, which a
compacted topic refuses): ``mkdir`` under a broker default of ``compact``, and a
``setfattr`` of ``cleanup.policy``, ``format`` or ``key.separator`` (or a
``removexattr``) that would make one, are ``EINVAL`` (``seglogfs.control.admin``).

Thread-safety: as ``MountState``; namespace changes hold the one admin lock.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import os
import stat
from collections.abc import Sequence

import pyfuse3
import trio

from storage import (
    ConfigError,
    InvalidTopicError,
    Log,
    StorageError,
    TopicMetadata,
    TopicNotEmptyError,
    validate_topic_name,
)
from storage.log.log_config import UNKNOWN_TOPIC_CONFIG, closest_topic_config
from storage.number import INT_MAX, INT_MIN, abbreviated, parse_java_integer

from ..control import admin
from ..positions import Rendering, position_of_offset
from .handler import fail, handler
from .lines import RecordLimit
from .nodes import BLOCK_SIZE, PRODUCE_FILE, XATTR_PREFIX, Kind, Node, OpenFile, partition_number
from .state import MountState, thread_group
from .views import parse_view_name, resolve_offset

__all__ = ["Namespace"]

logger = logging.getLogger(__name__)


class Namespace(MountState):
    """The handlers of names and attributes (see the module)."""

    # -- attributes ------------------------------------------------------------------

    def _sync_attributes(
        self, inode: int, node: Node, holders: tuple[OpenFile, ...] = (), pid: int = 0
    ) -> pyfuse3.EntryAttributes:
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
            # Readable, empty: tree walks (grep -r, cp -r, tar, rsync) read it as such.
            attr.st_mode = stat.S_IFREG | 0o644
            attr.st_nlink = 1
        else:
            log = self._log(node)
            if node.log is not None and node.log is not log:
                raise fail(errno.ESTALE)  # a view of a topic deleted since
            self._sync_refresh(log)
            size = max(0, log.extension_end - self._sync_seen_origin(node, log, holders, pid))
            if kind is Kind.VIEW:
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

    def _sync_seen_origin(
        self, node: Node, log: Log, holders: tuple[OpenFile, ...], pid: int
    ) -> int:
        """The origin from which thread ``pid`` sees the size of ``node``: the oldest of
        the files its process holds open on it (``holders``), so that a holder's size
        never decreases and is counted as its reads are; else a fresh read-only open's,
        so that ``stat`` then ``open`` and ``read`` agree (tar, cp, rsync, wc -c).
        Cost: with holders, one read of ``/proc`` and O(len(holders))."""
        if holders:
            process = thread_group(pid)
            origins = [
                of.origin
                for of in holders
                if process > 0 and of.process == process and of.logs.get(node.partition) is log
            ]
            if origins:
                return min(origins)
        return self._sync_origin(node, log)

    async def _attributes(self, inode: int, pid: int = 0) -> pyfuse3.EntryAttributes:
        """The attributes of ``inode`` as thread ``pid`` sees them (0: a fresh reader)."""
        node = self._node(inode)
        if node.kind is Kind.PARTITION or node.kind is Kind.VIEW:
            if self._closing:
                await self._settled(node.topic)
            # A snapshot on the event loop: the set changes only here.
            holders = tuple(of for of in self._holders.get(node, ()) if not of.closed)
            attr: pyfuse3.EntryAttributes = await self._run(
                self._sync_attributes, inode, node, holders if pid else (), pid
            )
            return attr
        return self._sync_attributes(inode, node)

    # -- namespace -------------------------------------------------------------------

    async def _child(self, parent: Node, name: str) -> Node:
        if parent.kind is Kind.ROOT:
            await self._refresh_topics()
            if not self._visible(name):
                raise fail(errno.ENOENT)
            self._metadata(name)
            return Node(Kind.TOPIC, name)
        if parent.kind is not Kind.TOPIC:
            raise fail(errno.ENOTDIR)
        metadata = self._metadata(parent.topic)
        if name == PRODUCE_FILE and not self.read_only:
            return Node(Kind.PRODUCE, parent.topic)
        number = partition_number(name)
        if number is not None:
            node = Node(Kind.PARTITION, parent.topic, number)
            self._log(node)
            return node
        view = parse_view_name(name)
        if view is None or view.partition >= metadata.partitions:
            raise fail(errno.ENOENT)
        log = self.manager.log(parent.topic, view.partition)
        rendering = Rendering.of(metadata, view.partition)

        def resolve() -> Node | None:
            self._sync_refresh(log)
            offset = resolve_offset(log, view)
            if offset is None:
                return None
            position = position_of_offset(log, rendering, offset)
            return Node(Kind.VIEW, parent.topic, view.partition, offset, position, log)

        node_or_none: Node | None = await self._run(resolve)
        if node_or_none is None:
            raise fail(errno.ENOENT)
        return node_or_none

    def _entries(self, node: Node) -> list[tuple[str, Node]]:
        if node.kind is Kind.ROOT:
            return [(t, Node(Kind.TOPIC, t)) for t in self.manager.topics() if self._visible(t)]
        if node.kind is not Kind.TOPIC:
            raise fail(errno.ENOTDIR)
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

    @handler
    async def lookup(
        self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        parent = self._node(parent_inode)
        text = os.fsdecode(name)
        if text == ".":
            return await self._attributes(parent_inode, ctx.pid)
        if text == "..":
            return await self._attributes(pyfuse3.ROOT_INODE)
        node = await self._child(parent, text)
        inode = self._inode(node)
        if node.kind is Kind.VIEW:
            self._nodes[inode] = node  # the log of this resolution, the one to open
        attr = await self._attributes(inode, ctx.pid)
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

    @handler
    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        # `stat` and `fstat` alike: the kernel sends no file handle with either (only
        # lseek's SEEK_END does, which pyfuse3 drops): the caller's process decides.
        return await self._attributes(inode, ctx.pid)

    @handler
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
            raise fail(errno.EROFS if self.read_only else errno.EPERM)
        # Time updates (touch) are accepted and ignored: the times are the data's.
        return await self._attributes(inode, ctx.pid)

    @handler
    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        node = self._node(inode)
        if node.kind is not Kind.ROOT and node.kind is not Kind.TOPIC:
            raise fail(errno.ENOTDIR)
        if node.kind is Kind.ROOT:
            await self._refresh_topics()
        return inode

    @handler
    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        node = self._node(fh)
        if self._closing and node.kind is Kind.TOPIC:
            await self._settled(node.topic)  # `ls -l` gives sizes, as `stat` does
        entries = self._entries(node)[start_id:]
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

    @handler
    async def releasedir(self, fh: int) -> None:
        return None

    @handler
    async def mkdir(
        self, parent_inode: int, name: bytes, mode: int, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        parent = self._node(parent_inode)
        if self.read_only:
            raise fail(errno.EROFS)
        if parent.kind is not Kind.ROOT:
            raise fail(errno.EPERM)  # a topic holds partitions, not directories
        topic = os.fsdecode(name)
        try:
            validate_topic_name(topic)
            if not self._visible(topic):
                raise InvalidTopicError(
                    topic, "names starting with '__' are internal topics, shown with -o internal"
                )
            async with self._admin:
                metadata: TopicMetadata = await self._run(admin.create_topic, self.manager, topic)
        except (InvalidTopicError, ConfigError) as exc:
            # ConfigError: a partition bound, or a broker default of compact for a
            # lines topic, which has no key.separator at birth (control.admin).
            logger.info("mkdir refused: %s", exc)
            raise
        for partition in range(metadata.partitions):
            log = self.manager.log(topic, partition)
            self._active_base[(topic, partition)] = log.active_segment.base_offset
        return await self._attributes(self._inode(Node(Kind.TOPIC, topic)))

    async def _refuse_change(self, parent_inode: int, name: bytes) -> None:
        # The entry must exist (ENOENT otherwise); existing entries are never removed
        # or renamed here (EPERM; EROFS on a read-only mount).
        await self._child(self._node(parent_inode), os.fsdecode(name))
        raise fail(errno.EROFS if self.read_only else errno.EPERM)

    @handler
    async def rmdir(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        # Deleting a topic deletes its data: only the command line does it, explicitly.
        await self._refuse_change(parent_inode, name)

    @handler
    async def unlink(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        await self._refuse_change(parent_inode, name)

    @handler
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

    @handler
    async def link(
        self,
        inode: int,
        new_parent_inode: int,
        new_name: bytes,
        ctx: pyfuse3.RequestContext,
    ) -> pyfuse3.EntryAttributes:
        raise fail(errno.EROFS if self.read_only else errno.EPERM)

    @handler
    async def symlink(
        self,
        parent_inode: int,
        name: bytes,
        target: bytes,
        ctx: pyfuse3.RequestContext,
    ) -> pyfuse3.EntryAttributes:
        raise fail(errno.EROFS if self.read_only else errno.EPERM)

    def _refuse_create(self, parent_inode: int, name: bytes) -> pyfuse3.FUSEError:
        parent = self._node(parent_inode)
        if self.read_only:
            return fail(errno.EROFS)
        if parent.kind is not Kind.TOPIC:
            return fail(errno.EPERM)  # the root holds topics: mkdir creates them
        text = os.fsdecode(name)
        if partition_number(text) is not None or parse_view_name(text) is not None:
            return fail(errno.ENOENT)  # names a partition the topic does not have
        return fail(errno.EINVAL)  # no file of that name can exist in a topic

    @handler
    async def create(
        self,
        parent_inode: int,
        name: bytes,
        mode: int,
        flags: int,
        ctx: pyfuse3.RequestContext,
    ) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        raise self._refuse_create(parent_inode, name)

    @handler
    async def mknod(
        self,
        parent_inode: int,
        name: bytes,
        mode: int,
        rdev: int,
        ctx: pyfuse3.RequestContext,
    ) -> pyfuse3.EntryAttributes:
        raise self._refuse_create(parent_inode, name)

    @handler
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
            # Where the retained records begin: byte 0 of a read-only open made now.
            "start_position": str(
                self._sync_origin(Node(Kind.PARTITION, node.topic, node.partition), log)
            ),
            "end_position": str(log.extension_end),
        }
        if node.kind is Kind.VIEW:
            out["view_offset"] = str(node.view_offset)
            out["view_position"] = str(node.view_position)
        return out

    @handler
    async def listxattr(self, inode: int, ctx: pyfuse3.RequestContext) -> Sequence[bytes]:
        values: dict[str, str] = await self._run(self._sync_xattrs, self._node(inode))
        return [(XATTR_PREFIX + key).encode() for key in values]

    @handler
    async def getxattr(self, inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> bytes:
        text = os.fsdecode(name)
        if not text.startswith(XATTR_PREFIX):
            raise fail(pyfuse3.ENOATTR)
        values: dict[str, str] = await self._run(self._sync_xattrs, self._node(inode))
        value = values.get(text[len(XATTR_PREFIX) :])
        if value is None:
            raise fail(pyfuse3.ENOATTR)
        return value.encode()

    def _config_target(self, inode: int, name: bytes) -> tuple[str, str]:
        node = self._node(inode)
        text = os.fsdecode(name)
        if not text.startswith(XATTR_PREFIX):
            raise fail(errno.ENOTSUP)  # only user.seglog.* means something here
        if self.read_only:
            raise fail(errno.EROFS)
        if node.kind is not Kind.TOPIC:
            raise fail(errno.EPERM)  # a partition's attributes are facts, not settings
        return node.topic, text[len(XATTR_PREFIX) :]

    @handler
    async def setxattr(
        self, inode: int, name: bytes, value: bytes, ctx: pyfuse3.RequestContext
    ) -> None:
        topic, key = self._config_target(inode, name)
        try:
            text = value.decode("utf-8")
        except UnicodeDecodeError:
            logger.warning("setfattr %s on topic %s refused: the value is not UTF-8", key, topic)
            raise fail(errno.EINVAL) from None
        if key == "partitions":
            await self._add_partitions(topic, text)
            return
        try:
            async with self._admin:
                if key in ("format", "key.separator"):
                    await self._change_rendering(topic, key, text)
                else:
                    overrides = {**self.manager.topic(topic).overrides, key: text}
                    self._refuse_outgrown_lines(topic, key, overrides)
                    await self._run(admin.alter_topic_config, self.manager, topic, {key: text})
        except ConfigError as exc:
            if exc.reason == UNKNOWN_TOPIC_CONFIG:
                # Named as the user typed it: the attribute, not the config key.
                suggestion = closest_topic_config(key)
                hint = f" (did you mean {XATTR_PREFIX}{suggestion}?)" if suggestion else ""
                logger.warning(
                    "setfattr %s%s on topic %s refused: no such topic configuration%s",
                    XATTR_PREFIX,
                    abbreviated(key),
                    topic,
                    hint,
                )
                raise fail(errno.EINVAL) from None
            logger.warning("setfattr %s on topic %s refused: %s", key, topic, exc)
            raise fail(errno.EINVAL) from None
        logger.info("topic %s: set %s=%s", topic, key, text)

    async def _add_partitions(self, topic: str, text: str) -> None:
        """``setfattr -n user.seglog.partitions -v N``: Kafka's ``kafka-topics.sh --alter
        --partitions N`` (increase only). The new partition files exist as soon as it
        returns: every listing and lookup reads the count from the engine. Keyed lines
        written to ``produce`` from then on map to ``murmur2(key) % N``; a ``produce``
        file already open goes on with the partitions it was opened on."""
        count = parse_java_integer(text.strip(), INT_MIN, INT_MAX)
        if count is None:
            logger.warning(
                "setfattr partitions on topic %s refused: %r is not a whole number",
                topic,
                abbreviated(text),
            )
            raise fail(errno.EINVAL)
        try:
            async with self._admin:
                # The engine logs the change (an INFO line), as for the control socket.
                await self._run(self.manager.add_partitions, topic, count)
        except ConfigError as exc:
            logger.warning("setfattr partitions on topic %s refused: %s", topic, exc.reason)
            raise fail(errno.EINVAL) from None

    @handler
    async def removexattr(self, inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        topic, key = self._config_target(inode, name)
        if key not in self.manager.topic(topic).overrides:
            raise fail(pyfuse3.ENOATTR)
        async with self._admin:
            overrides = dict(self.manager.topic(topic).overrides)
            del overrides[key]
            self._refuse_outgrown_lines(topic, key, overrides)
            await self._run(admin.alter_topic_config, self.manager, topic, None, [key])
        logger.info("topic %s: removed the override of %s", topic, key)

    def _refuse_outgrown_lines(self, topic: str, key: str, overrides: dict[str, str]) -> None:
        """``EBUSY`` when the config ``overrides`` would give would make a partial line
        an open file of ``topic`` holds too large for one record (``max.message.bytes``
        lowered, ``compression.type`` changed): a write accepted it, so its release must
        be able to append it. (A change through the control socket is not seen here:
        then that file's close reports ``EFBIG``.)

        Raises:
            ConfigError: the overrides are invalid (the caller answers ``EINVAL``).
        """
        if key not in ("max.message.bytes", "compression.type"):
            return
        metadata = self._metadata(topic)
        limit = RecordLimit.of(self.manager.broker_config.topic_log_config(overrides), metadata)
        logs = [self.manager.log(topic, p) for p in range(metadata.partitions)]
        for of in self._files.values():
            if of.lines.pending and _of_logs(of, logs) and not limit.fits(of.lines.pending):
                logger.warning(
                    "setfattr %s on topic %s refused (EBUSY): a file of the topic holds a "
                    "partial line of %d bytes that would no longer fit one record",
                    key,
                    topic,
                    len(of.lines.pending),
                )
                raise fail(errno.EBUSY)

    async def _change_rendering(self, topic: str, key: str, value: str) -> None:
        """Set ``format`` or ``key.separator``: fixed once a record exists
        (``TopicNotEmptyError``), validated (``ConfigError``), ``EBUSY`` while a write to
        the topic is in flight or a file of it holds a partial line; the engine's order,
        then the daemon's. Writes arriving meanwhile wait. The caller holds the admin
        lock."""
        metadata = self._metadata(topic)
        fmt = value if key == "format" else metadata.format
        separator = (value or None) if key == "key.separator" else metadata.key_separator
        if (fmt, separator) == (metadata.format, metadata.key_separator):
            return
        old = [self.manager.log(topic, p) for p in range(metadata.partitions)]
        # The rendering decides every position, so it is fixed once a record exists.
        if any(log.log_end_offset > 0 for log in old):
            raise TopicNotEmptyError(topic, key)
        dataclasses.replace(metadata, format=fmt, key_separator=separator)  # validates
        admin.require_keys_for_compaction(
            self.manager.topic_config(topic), fmt, separator, key=key, value=value
        )
        pending = [of for of in self._files.values() if of.lines.pending and _of_logs(of, old)]
        if pending or self._writes.get(topic):
            logger.warning(
                "setfattr %s on topic %s refused (EBUSY): %s",
                key,
                topic,
                "a file of the topic holds a partial line: end it with a newline or close it"
                if pending
                else "a write to the topic is in progress",
            )
            raise fail(errno.EBUSY)
        change = self._rendering_changes[topic] = trio.Event()
        try:
            new: list[Log] = await self._run(
                self._sync_set_rendering, topic, fmt, separator, key, value
            )
        finally:
            del self._rendering_changes[topic]
            change.set()
        self._follow_rendering(topic, old, new)

    def _sync_set_rendering(
        self, topic: str, fmt: str, separator: str | None, key: str, value: str
    ) -> list[Log]:
        # The engine validates again (ConfigError: EINVAL), refuses a topic that holds a
        # record (TopicNotEmptyError: EPERM), and reopens the partition logs so that their
        # position index follows the new rendering: new Log objects. The compaction rule
        # is checked again with the change, under its lock: a policy change through the
        # control socket may have come in since the check above.
        metadata = admin.set_topic_rendering(
            self.manager, topic, fmt, separator, key=key, value=value
        )
        logs = [self.manager.log(topic, p) for p in range(metadata.partitions)]
        for partition, log in enumerate(logs):
            self._active_base[(topic, partition)] = log.active_segment.base_offset
        return logs

    def _follow_rendering(self, topic: str, old: list[Log], new: list[Log]) -> None:
        # The open files and views of the topic were opened on the logs the change
        # replaced: they go on with their successors (a deleted topic's files, on other
        # logs, stay dead).

        def successor(log: Log | None) -> Log | None:
            for before, after in zip(old, new, strict=True):
                if log is before:
                    return after
            return None

        for of in self._files.values():
            if of.node.topic == topic:
                for partition, log in list(of.logs.items()):
                    after = successor(log)
                    if after is not None:
                        of.logs[partition] = after
        for inode, node in list(self._nodes.items()):
            if node.kind is Kind.VIEW and node.topic == topic:
                after = successor(node.log)
                if after is not None:
                    self._nodes[inode] = dataclasses.replace(node, log=after)


def _of_logs(of: OpenFile, logs: list[Log]) -> bool:
    """Whether ``of`` was opened on (one of) ``logs``: a file of that topic's life."""
    return any(
        partition < len(logs) and log is logs[partition] for partition, log in of.logs.items()
    )

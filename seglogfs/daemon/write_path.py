"""The write path: write, flush, fsync, release (SPEC §3, Produce).

Bytes written to a partition or ``produce`` file become records through ``lines``:
each complete line of a ``lines`` topic is a record, each ``write()`` to a ``raw``
topic is one. Everything complete in one ``write()`` is one ``Log.append``, done in a
worker thread before the write returns; a partial line waits in its open file's
``LineBuffer``. Writes always append, whatever the offset the kernel passes; a write
below the end without ``O_APPEND`` would be a write into the middle: ``EPERM``.

Thread-safety: as ``MountState``; the requests of one open file run one at a time (its
``lock``), so a writer's lines keep their order.
"""

from __future__ import annotations

import errno
import logging

from storage import AppendInfo, Log, StorageError, TopicMetadata

from ..positions import Rendering
from .handler import REQUEST_LOG, fail, handler
from .lines import append_lines, append_raw, produce_lines
from .nodes import Kind, OpenFile
from .state import MountState

__all__ = ["WritePath"]

logger = logging.getLogger(__name__)


class WritePath(MountState):
    """The handlers that write files and end their partial lines (see the module)."""

    @handler
    async def write(self, fh: int, off: int, buf: bytes) -> int:
        of = self._file(fh)
        if not of.writable:
            raise fail(errno.EBADF)
        async with of.lock:
            written: int = await self._run(self._sync_write, of, off, buf)
        if REQUEST_LOG.enabled:
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
                raise fail(errno.EPERM)
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

    @handler
    async def flush(self, fh: int) -> None:
        of = self._file(fh)
        if of.lines.pending:
            async with of.lock:
                await self._run(self._sync_append_pending, of)

    @handler
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

    @handler
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

"""The write path: write, flush, fsync, release (SPEC §3, Produce).

Bytes written to a partition or ``produce`` file become records through ``lines``:
each complete line of a ``lines`` topic is a record, each ``write()`` to a ``raw``
topic is one (or, over ``max.message.bytes``, the fewest that fit, appended together).
Everything complete in one ``write()`` is one ``Log.append``, done in a worker thread
before the write returns. Writes always append, whatever the offset the kernel passes;
a write below the end without ``O_APPEND`` would be a write into the middle: ``EPERM``.

A partial line waits in its open file's ``LineBuffer``. Only the last close of the open
file (``release``) or ``fsync`` makes it a record of its own: the kernel sends
``flush`` on every ``close()`` of any descriptor of the open file, also when a child
process that inherited one exits, and the writer may go on writing the line after it.
A write whose partial line could not be one record is refused (``EFBIG``), so the
line accepted is the record appended at release. The kernel sends ``release`` after the
last ``close()`` has returned, so that close cannot report the append: ``flush``
reports what would make it fail (``ESTALE`` for a deleted topic, ``EFBIG`` when
``max.message.bytes`` was lowered since), release logs a failure, and a request that
arrives after the release (a lookup of one of the topic's files, as ``stat``, ``cat``
and ``ls -l`` make, or a read) waits for the append (``MountState._settled``).
``fsync`` before ``close`` appends it with the error reported. A compacted topic takes
keyed records only: a keyless line (no ``key.separator`` in it) or a raw write is
``EINVAL`` and nothing of that write is appended; a partial line without the separator
makes ``close()`` fail with ``EINVAL`` (its record is refused at release).

Every request checks that the logs the file was opened on are still its topic's
(``MountState._opened``): a handle of a deleted topic answers ``ESTALE`` and never
writes into a topic created under the same name.

Thread-safety: as ``MountState``; the requests of one open file run one at a time (its
``lock``), so a writer's lines keep their order.
"""

from __future__ import annotations

import contextlib
import errno
import logging
from collections.abc import Iterator

import pyfuse3
import trio

from storage import (
    AppendInfo,
    InvalidRecordError,
    JsonRecordError,
    Log,
    ReadOnlyLogError,
    StorageError,
)

from . import metrics
from .handler import REQUEST_LOG, fail, handler
from .json_lines import append_json
from .lines import RecordLimit, append_lines, append_raw, produce_lines
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
        async with self._writing(of.node.topic), of.lock:
            try:
                written: int = await self._run(self._sync_write, of, off, buf)
            except InvalidRecordError as exc:
                # EINVAL says no more (a keyless line or raw write to a compacted topic;
                # nothing of the write was appended, its partial line stays as it was).
                logger.warning("%s: write of %d bytes refused: %s", of.node.topic, len(buf), exc)
                raise
        if REQUEST_LOG.enabled:
            logger.debug("write fh=%d off=%d size=%d: %d written", fh, off, len(buf), written)
        return written

    def _sync_write(self, of: OpenFile, off: int, buf: bytes) -> int:
        node = of.node
        if node.kind is Kind.PARTITION:
            log = self._opened_log(of)
            if not of.append and off < log.extension_end:
                # Without O_APPEND the kernel's offset is where the writer believes it
                # writes: below the end that would be the middle of the file.
                raise fail(errno.EPERM)
        limit = self._limit(of)
        with _stale_if_closed(of):
            if limit.raw:
                if buf:
                    self._append_raw(of, limit, buf)
                return len(buf)
            complete, tail = of.lines.split(buf, limit)
            if complete:
                appended = self._append_lines(of, limit, complete)
                if appended < len(complete):
                    # A short write: the lines after `appended` were refused (the pending
                    # partial line went out with the first of them); the writer sends the
                    # rest again and meets the error then.
                    consumed = appended - len(of.lines.pending)
                    of.lines.commit(b"")
                    return consumed
            of.lines.commit(tail)
            return len(buf)

    def _append_raw(self, of: OpenFile, limit: RecordLimit, data: bytes) -> None:
        node = of.node
        if node.kind is Kind.PARTITION:
            partition = node.partition
        else:
            assert of.sticky is not None
            partition = of.sticky.partition()
            of.sticky.next_batch()
        self._note_append(node.topic, partition, append_raw(of.logs[partition], data, limit))

    def _append_lines(self, of: OpenFile, limit: RecordLimit, data: bytes) -> int:
        node = of.node
        if self._metadata(node.topic).format == "json":
            return self._append_json(of, limit, data)
        if node.kind is Kind.PARTITION:
            appended, infos = append_lines(of.logs[node.partition], data, limit.separator)
            for info in infos:
                self._note_append(node.topic, node.partition, info)
            return appended
        assert of.sticky is not None
        logs = of.logs

        def log_of(partition: int) -> Log:
            return logs[partition]

        appended, produced = produce_lines(log_of, len(logs), data, limit, of.sticky)
        for partition, info in produced:
            self._note_append(node.topic, partition, info)
        return appended

    def _append_json(self, of: OpenFile, limit: RecordLimit, data: bytes) -> int:
        # All lines of the write or none (json_lines): a refused line is said once here,
        # as the writer only gets EINVAL.
        node = of.node
        logs = of.logs

        def log_of(partition: int) -> Log:
            return logs[partition]

        produce = node.kind is not Kind.PARTITION
        try:
            produced = append_json(
                log_of,
                len(logs),
                data,
                limit,
                partition=None if produce else node.partition,
                sticky=of.sticky if produce else None,
            )
        except JsonRecordError as exc:
            where = node.topic if produce else f"{node.topic}-{node.partition}"
            logger.warning("%s: write of %d bytes refused: %s", where, len(data), exc)
            raise
        for partition, info in produced:
            self._note_append(node.topic, partition, info)
        return len(data)

    def _note_append(self, topic: str, partition: int, info: AppendInfo) -> None:
        counters = metrics.COUNTERS
        if counters is not None:
            counters.appended(topic, info.record_count, info.size)
        key = (topic, partition)
        previous = self._active_base.get(key)
        self._active_base[key] = info.segment_base_offset
        if previous is not None and previous != info.segment_base_offset:
            logger.info("%s-%d: rolled to segment %d", topic, partition, info.segment_base_offset)

    def _limit(self, of: OpenFile) -> RecordLimit:
        # Every partition of a topic has the topic's config: any of its logs will do.
        config = next(iter(self._opened(of).values())).config
        return RecordLimit.of(config, self._metadata(of.node.topic))

    def _sync_append_pending(self, of: OpenFile) -> None:
        # Release and fsync end a partial line: it becomes a record of its own.
        data = of.lines.completed()
        if data:
            limit = self._limit(of)
            with _stale_if_closed(of):
                self._append_lines(of, limit, data)
            of.lines.commit(b"")

    def _sync_check_pending(self, of: OpenFile) -> None:
        # What would make the release's append fail, told to close(): the topic is gone,
        # the line no longer fits (max.message.bytes lowered since it was accepted), or
        # it has no key and the topic is compacted (the writer may still have sent its
        # separator in a later write: only the close can tell).
        pending = of.lines.pending
        if not pending:
            return
        limit = self._limit(of)
        if not limit.fits(pending):
            raise fail(errno.EFBIG)
        compacted = next(iter(self._opened(of).values())).config.compact
        lines = self._metadata(of.node.topic).format == "lines"
        if compacted and lines and (limit.separator is None or limit.separator not in pending):
            raise fail(errno.EINVAL)

    @handler
    async def flush(self, fh: int) -> None:
        # Every close() of a descriptor of the open file, also the exit of a child that
        # inherited one: the open file lives on, and so does its partial line.
        of = self._file(fh)
        if of.lines.pending:
            async with of.lock:
                await self._run(self._sync_check_pending, of)

    @handler
    async def release(self, fh: int) -> None:
        of = self._files.get(fh)
        if of is None:
            return
        try:
            if of.lines.pending:
                # Registered before the first await: the requests the kernel sent after
                # this release wait for its record (MountState._settled).
                done = self._closing[of] = trio.Event()
                try:
                    async with self._writing(of.node.topic), of.lock:
                        await self._run(self._sync_release_pending, of)
                finally:
                    del self._closing[of]
                    done.set()
        finally:
            del self._files[fh]
            of.closed = True
            if of.fill is None:  # else the fill gives them back when it ends
                self._release_reads(of)

    def _sync_release_pending(self, of: OpenFile) -> None:
        # Nobody hears the answer to a release (close() has returned): say it in the log.
        size = len(of.lines.pending)
        try:
            self._sync_append_pending(of)
        except pyfuse3.FUSEError as exc:
            if exc.errno != errno.ESTALE:
                raise
            logger.info(
                "%s: a partial line of %d bytes dropped at close: its topic was deleted",
                of.node.topic,
                size,
            )
        except (StorageError, OSError) as exc:
            logger.error(
                "%s: a partial line of %d bytes lost at close: %s", of.node.topic, size, exc
            )

    @handler
    async def fsync(self, fh: int, datasync: bool) -> None:
        of = self._file(fh)
        if not of.writable:
            return
        async with self._writing(of.node.topic), of.lock:
            await self._run(self._sync_fsync, of)

    def _sync_fsync(self, of: OpenFile) -> None:
        logs = self._opened(of)
        self._sync_append_pending(of)
        for log in logs.values():
            log.flush()

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
                except (StorageError, OSError, pyfuse3.FUSEError) as exc:
                    logger.error("partial line of an open file lost at shutdown: %s", exc)
        self._files.clear()
        return done


@contextlib.contextmanager
def _stale_if_closed(of: OpenFile) -> Iterator[None]:
    # The engine's "log closed" while an append ran: when the open file's log is the
    # one closed, its topic was deleted (or its rendering changed) under the request.
    try:
        yield
    except ReadOnlyLogError:
        if any(log.closed for log in of.logs.values()):
            raise fail(errno.ESTALE) from None
        raise

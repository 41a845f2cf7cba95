"""The read path: open, read, and the render process's fills (SPEC §3, Consume).

Every file is opened ``direct_io``: every read reaches the daemon (exact sizes, no
stale page cache, positions that follow the per-file shift of ``PositionReader``).
A file opened read-only begins at the oldest retained record (its origin, fixed at
open), so it holds exactly the bytes a read returns; a file opened for writing keeps
global positions (origin 0), which the write path's offsets are. ``produce`` reads as
an empty file.
An open file keeps the logs it was opened on (a view: the log it was resolved in at
lookup); a read of a topic deleted since answers ``ESTALE``, also when a topic of the
same name exists, and a read waits for a release appending a final partial line to the
topic (``MountState._settled``).
Bytes rendered ahead are answered on the event loop (slices of memory, no file
touched); the rest in a worker thread, which renders ``READ_AHEAD`` past the read when
the one budget of all readers (``read_ahead``, ``fetch.max.bytes``) has room, and after
every read what the reader keeps is charged to it. A sequential reader of a large file
streams through the render process
(``renderer``): after each read, the bytes after the ones it holds are rendered there,
on the other core, into shared slots, while the loop replies (a worker thread cannot:
pyfuse3 holds the GIL while libfuse copies a reply).

Thread-safety: as ``MountState``; the requests of one open file run one at a time (its
``lock``), so a reader's shift is never updated by two reads at once; a fill runs as a
task of the daemon's nursery and is awaited by the next read that needs its bytes.
"""

from __future__ import annotations

import errno
import logging
import os
from typing import Any

import pyfuse3
import trio

from storage import Log, StickyPartitioner
from storage.log.segment import LogSegment

from ..positions import Rendering
from . import metrics
from .handler import REQUEST_LOG, fail, handler
from .nodes import BLOCK_SIZE, Kind, Node, OpenFile
from .position_reader import PositionReader, Rendered
from .renderer import SLOT_BYTES, SLOTS_PER_FILE, Renderer
from .state import MountState, thread_group

__all__ = ["READ_AHEAD", "ReadPath"]

logger = logging.getLogger(__name__)

READ_AHEAD = 4 << 20
"""Bytes a sequential read renders past its end in its worker thread: the next reads
(``cat`` and ``dd`` ask 1 MiB at a time) are answered on the event loop from memory, so
a sequential reader costs one thread hop per READ_AHEAD, not one per request. Memory:
what all readers keep is at most ``fetch.max.bytes`` (``read_ahead``); a read that finds
no room renders only what it returns. A file that streams through the render process
(``seglogfs.daemon.renderer``) reads ahead through it instead: its slots are rendered on
the other core while the replies go out."""


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
        if (
            following is None
            or tail.skip
            or following.base_offset != tail.next_offset
            or following.extension_start != tail.end
        ):
            # Only where the next segment's bytes are known to come right after these:
            # it starts at the offset after them (not past a hole of offsets: a missing
            # segment, which the daemon's own read reports as damage, or compaction's
            # gap) and its position index starts at their end (not past bytes a damaged
            # batch leaves unmeasured). The fill would lay it at ``tail.end`` whatever
            # its positions: a missing segment's bytes were skipped in silence, and
            # every byte after moved (issue 17). Elsewhere the daemon's own read goes on.
            return None
        segment, position = following, 0
    if position >= segment.size:
        return None
    return segment, position, segment.size


def _check_the_end(log: Log) -> None:
    """At the end of a partition file: raise the ``CorruptRecordError`` of a damaged batch
    the file's size stops before. The size is the positions the position index measured,
    and a damaged batch of the active segment measures nothing: the file ended quietly
    before it, and ``cat`` exited 0 where the engine's read fails (issue 17, seed 23 of
    ``tests/reliability/test_corruption.py``). Only where the active segment's measure
    is not exact (damage, or an append in flight, which ``Log.batches`` leaves alone).

    Cost: nothing usually; else a scan of the batches after the last position-index
    entry of the active segment.
    """
    last = log.segments.last_segment
    if last is None or last.extension_exact:
        return
    offset, _units = log.extension_floor(log.extension_end)
    for _batch in log.batches(max(offset, log.log_start_offset)):
        pass


class ReadPath(MountState):
    """The handlers that open and read files (see the module)."""

    @handler
    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        node = self._node(inode)
        access = flags & os.O_ACCMODE
        writing = access != os.O_RDONLY
        if node.kind is Kind.ROOT or node.kind is Kind.TOPIC:
            raise fail(errno.EISDIR)
        if writing and self.read_only:
            raise fail(errno.EROFS)
        if node.kind is Kind.PARTITION:
            logs = {node.partition: self._log(node)}
            if flags & os.O_TRUNC:
                raise fail(errno.EPERM)  # `>`: the records stay; `>>` appends
        elif node.kind is Kind.PRODUCE:
            partitions = self._metadata(node.topic).partitions
            logs = {p: self.manager.log(node.topic, p) for p in range(partitions)}
        elif writing or flags & os.O_TRUNC:
            raise fail(errno.EPERM)  # a view is read-only
        else:
            # The log the view was resolved in at lookup: its start means nothing in a
            # topic created under the same name since.
            log = self._log(node)
            if node.log is not None and node.log is not log:
                raise fail(errno.ESTALE)
            logs = {node.partition: log}
        origin, process = 0, -1
        if node.kind is not Kind.PRODUCE:
            origin, process = await self._run(
                self._sync_open, node, logs[node.partition], writing, ctx.pid
            )
        of = OpenFile(
            node,
            logs,
            writable=writing,
            append=bool(flags & os.O_APPEND),
            # produce reads as an empty file: reads answer b"" without a reader.
            readable=access != os.O_WRONLY and node.kind is not Kind.PRODUCE,
            origin=origin,
            process=process,
        )
        if node.kind is Kind.PRODUCE:
            of.sticky = StickyPartitioner(len(logs))
        else:
            self._holders.setdefault(node, set()).add(of)
        fh = next(self._next_fh)
        self._files[fh] = of
        # direct_io: every read and write reaches the daemon (exact sizes, no stale
        # page cache, positions that follow the per-file shift), and a write() is one
        # request (up to max_write), so its lines become one batch.
        return pyfuse3.FileInfo(fh=fh, direct_io=True, keep_cache=False)

    def _sync_open(self, node: Node, log: Log, writing: bool, pid: int) -> tuple[int, int]:
        # (origin, process) of a new open file of a partition or view. Read-only, its
        # byte 0 is the oldest retained byte, so its size is what it reads; opened for
        # writing, positions stay global (the write path's offsets are global).
        if writing:
            origin = 0
        else:
            self._sync_refresh(log)
            origin = self._sync_origin(node, log)
        return origin, thread_group(pid)

    @handler
    async def read(self, fh: int, off: int, size: int) -> bytes:
        of = self._file(fh)
        reader = of.reader
        if reader is None:
            if of.node.kind is Kind.PRODUCE:
                return b""  # it holds nothing: tree walks (tar, cp -r) copy it empty
            raise fail(errno.EBADF)
        if self._closing:
            await self._settled(of.node.topic)
        async with of.lock:
            # Bytes rendered ahead (here or by the render process) are answered on the
            # event loop (slices of memory, no file touched); the rest in a worker
            # thread. A fill still outstanding may bring the bytes asked for, and must
            # not change the kept bytes under a worker thread: wait for it first.
            try:
                log = self._opened_log(of)
                data: Any = reader.read_rendered(log, off, size)
                while data is None and of.fill is not None:
                    await of.fill.wait()
                    data = reader.read_rendered(log, off, size)
                if data is None:
                    ahead = 0  # a file streaming through the render process reads ahead there
                    if not of.slots and reader.follows(off):
                        ahead = self._read_ahead.grant(of, READ_AHEAD)
                    data = await self._run(self._sync_read, of, log, off, size, ahead)
            finally:
                # Also after an error: a grant is charged until settled.
                if self._read_ahead.settle(of):
                    self._give_back_memory()
            self._start_fill(of, reader, log)
        counters = metrics.COUNTERS
        if counters is not None:
            counters.read(of.node.topic, len(data))
        if REQUEST_LOG.enabled:
            logger.debug("read fh=%d off=%d size=%d: %d bytes", fh, off, size, len(data))
        return data  # type: ignore[no-any-return]

    def _sync_read(self, of: OpenFile, log: Log, off: int, size: int, ahead: int) -> Any:
        self._sync_refresh(log)
        rendering = Rendering.of(self._metadata(of.node.topic), of.node.partition)
        assert of.reader is not None
        data = of.reader.read(log, rendering, off, size, ahead)
        if size > 0 and not data:
            _check_the_end(log)
        return data

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
            rendering = Rendering.of(self._metadata(of.node.topic), of.node.partition)
            result = await renderer.fill(
                slot,
                segment,
                position,
                end,
                tail.next_offset,
                tail.skip,
                capacity,
                rendering,
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
                self._release_reads(of)
        if not of.closed and not of.lock.locked():
            # Keep the render process busy: the next fill now, not after the next read
            # (a read in progress starts it itself when it ends).
            try:
                self._start_fill(of, reader, self._opened_log(of))
            except Exception as exc:  # the topic is gone: its next read says so
                logger.debug("no next fill for %s: %r", of.node, exc)

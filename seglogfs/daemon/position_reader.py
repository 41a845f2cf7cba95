"""The reads of one open partition file: kernel offsets to global positions, and bytes.

Each open file reads through its own ``PositionReader``: the global position of a read
is the file's *origin* (the global position of its byte 0, fixed at open: the oldest
retained record for a file opened read-only) plus the kernel's file offset plus a
*shift* kept per open file (0 at open). A read that falls in a gap (bytes retention
removed since the file was opened) continues at the oldest retained record and adds
the skipped length to the shift, so the kernel's offset and the reader's view stay
consistent, nothing is returned twice and the file never looks truncated to ``tail -f``.

A cleaning pass (log compaction) moves the positions of the records it kept up against
the first record it did not clean (``Log.replace_segments``): the removed bytes leave
from the front, as retention's do, and no later position moves. A reader in the cleaned
range finds its place again by offset (``_realign``): the record after the bytes it
returned last gets its new position, and the shift takes the difference, so it goes on
with the next record the log still holds, without a repeat, a reorder or a truncation.
Positions themselves are ``seglogfs.positions``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace

from storage import CorruptRecordError, Log, OffsetOutOfRangeError

from ..positions import Rendering, log_start_anchor, position_of_offset

__all__ = ["CHUNK_OVERHEAD", "PositionReader", "Rendered"]

# A read that meets retention under it starts again from the new log start; more than
# this many consecutive retries means the log is being emptied faster than it is read.
_MAX_RETRIES = 8

CHUNK_OVERHEAD = 256
"""Bytes a kept chunk costs beside its data: the ``Rendered`` (88), the ``bytes``
header (33), three ints past the small-int cache, the deque's slot and malloc's rounding
(measured with tracemalloc: 233 for a chunk of 100 bytes). A partition of one-line
batches keeps a chunk per line: 4 MiB of 100-byte lines hold about 14 MiB."""


@dataclass(frozen=True, slots=True)
class Rendered:
    """Bytes a reader rendered and keeps: where they start, the bytes (a batch rendered
    in the daemon, or a render process's fill of a shared slot) and where the bytes after
    them come from: the batch holding ``next_offset``, at file position ``resume`` of
    the segment with base offset ``segment`` (-1: not known), of which the first ``skip``
    rendered bytes are already in ``data``. ``slot`` is the render slot ``data`` lies in
    (-1: the daemon's own memory)."""

    position: int
    data: bytes | memoryview
    next_offset: int
    segment: int = -1
    resume: int = -1
    skip: int = 0
    slot: int = -1

    @property
    def end(self) -> int:
        return self.position + len(self.data)


class PositionReader:
    """The reads of one open file: kernel offsets to global positions, and bytes.

    ``base`` is the global position of the file's byte 0, its origin (for a file opened
    read-only: the oldest retained record's when it was opened, or a ``P@<where>``
    view's start when that is later). The bytes returned for a read are slices of
    ``render_batch`` output (no object per record); a read inside one batch returns a
    ``memoryview`` of it without a copy.

    The reader keeps the batches it rendered last, back to back (at least the last
    one), so a sequential reader renders each batch once and positions without an
    index lookup. A *sequential* read (one that starts where the previous read ended)
    also renders up to ``ahead`` bytes past its end, so the next reads of the same
    sequence are answered by ``read_rendered`` from memory, without touching the log:
    the daemon answers those on its event loop and only the others in a worker thread.
    What it keeps in the daemon's memory (``held``) is the daemon's to bound
    (``shed``): a reader that keeps nothing positions through the index and renders
    again, slower, never different.

    Not thread-safe: the daemon runs one request of an open file at a time.
    """

    __slots__ = (
        "_end",
        "_epoch",
        "_held",
        "_log_id",
        "_mark",
        "_read_start",
        "_realigned_end",
        "_rendered",
        "_sequential",
        "_start",
        "base",
        "shift",
    )

    def __init__(self, base: int = 0) -> None:
        self.base = base
        self.shift = 0
        # Rendered batches, contiguous (each starts at the end and next offset of the
        # one before), of the log whose id() is _log_id.
        self._rendered: deque[Rendered] = deque()
        self._log_id = 0
        # Bytes of the kept batches rendered in the daemon (not those in render slots),
        # with CHUNK_OVERHEAD each.
        self._held = 0
        self._read_start = -1  # the global position the last read began at
        self._end = -1  # the global position after the last read (-1: none yet)
        self._sequential = False  # the last read began where the one before ended
        # ((log identity, log start offset, layout epoch), log_start_anchor(...)) of
        # the last read.
        self._start: tuple[tuple[int, int, int], tuple[int, int]] | None = None
        # (log identity, its layout_epoch) the positions here are in (see _realign).
        self._epoch = (0, 0)
        # (position, offset) of the record start right after the kept bytes that hold
        # _end: where a realign finds this reader's place by offset.
        self._mark: tuple[int, int] | None = None
        # The end of the kept bytes _realign moved (-1: none): they are served even
        # below the log start.
        self._realigned_end = -1

    @property
    def end(self) -> int:
        """The global position after the bytes the last read returned (-1: none yet);
        a ``P@group=`` view commits the record there on close. Cost: O(1)."""
        return self._end

    def position(self, kernel_offset: int) -> int:
        """The global position the kernel's ``kernel_offset`` denotes now."""
        return self.base + kernel_offset + self.shift

    def follows(self, kernel_offset: int) -> bool:
        """Whether a read at ``kernel_offset`` is sequential: it starts where the last
        read ended (or is the file's first read, at 0), so ``read`` renders ahead for
        it. Cost: O(1)."""
        end = self._end
        return self.base + kernel_offset + self.shift == end or (end < 0 and kernel_offset == 0)

    def read(
        self, log: Log, rendering: Rendering, kernel_offset: int, size: int, ahead: int = 0
    ) -> bytes | memoryview:
        """Up to ``size`` bytes at ``kernel_offset``; empty at the end. Never blocks for
        data: a read at the end returns what there is. A sequential read renders up to
        ``ahead`` more bytes for the reads that follow.

        A position below the oldest retained record (a gap) reads from that record on and
        moves the shift by the skipped length.

        Cost: O(log n) to position (none when it continues the previous read), then
        O(bytes) rendering, plus O(ahead) for a sequential read.

        Raises:
            CorruptRecordError: the read needs a byte of a damaged batch first (never
                served; a read that meets one later returns the bytes before it). See
                ``_read_at`` for a read that starts past one.
        """
        for _ in range(_MAX_RETRIES):
            if self._epoch != (id(log), log.layout_epoch):
                self._realign(log, rendering)
            position = self.base + kernel_offset + self.shift
            anchor = self._anchor(log, rendering)
            start = anchor[1]
            rendered = self._rendered
            if rendered and rendered[0].position <= position < self._realigned_end:
                # Kept bytes a cleaning pass left below the start (see _realign): the
                # rest of what the reader had rendered. (Retention's gaps are not
                # served from kept bytes: the reader goes on at the oldest record.)
                start = min(start, rendered[0].position)
            if position < start:
                # Retention removed these bytes: continue at the oldest retained record,
                # as Kafka's auto.offset.reset=earliest, and remember the jump.
                self.shift += start - position
                position = start
            end = log.extension_end
            if position >= end or size <= 0:
                return b""
            want = min(size, end - position)
            self._sequential = self.follows(kernel_offset)  # position: after the shift
            if not self._sequential:
                ahead = 0
            try:
                data = self._read_at(log, rendering, position, want, ahead)
            except OffsetOutOfRangeError:
                # The segment under the read was deleted (or the start moved past the
                # cached batches): forget them and start again from the new log start.
                self._forget()
                continue
            self._read_start = position
            self._end = position + len(data)
            return data
        return b""

    def read_rendered(self, log: Log, kernel_offset: int, size: int) -> bytes | memoryview | None:
        """``size`` bytes at ``kernel_offset`` when batches rendered before hold all of
        them, else ``None`` (then ``read`` answers). Touches no file and renders
        nothing: safe on the daemon's event loop.

        Cost: O(batches kept) to find the bytes, one copy when they span batches.
        """
        rendered = self._rendered
        start = self._start
        if (
            size <= 0
            or not rendered
            or self._log_id != id(log)
            or start is None
            or start[0] != (id(log), log.log_start_offset, log.layout_epoch)
        ):
            return None
        position = self.base + kernel_offset + self.shift
        want = position + size
        # Below the retained records (the shift moves), or past the end (a short read
        # that a read-only mount answers after refreshing): ``read`` decides.
        if position < start[1][1] or want > log.extension_end:
            return None
        if rendered[0].position > position or rendered[-1].end < want:
            return None
        data = self._slice(position, want)
        self._sequential = position == self._end
        self._read_start = position
        self._end = want
        return data

    # -- fills by a render process (``seglogfs.daemon.renderer``) ---------------------------

    def fill_tail(self, log: Log) -> Rendered | None:
        """The kept bytes a fill would continue after: the last ones, when the last read
        was sequential, of ``log``, and it is known where the bytes after them begin.
        Touches no file. Cost: O(1)."""
        rendered = self._rendered
        if (
            not self._sequential
            or not rendered
            or self._log_id != id(log)
            or self._epoch != (id(log), log.layout_epoch)
        ):
            return None
        tail = rendered[-1]
        return tail if tail.resume >= 0 else None

    @property
    def held(self) -> int:
        """Bytes the kept batches hold in the daemon's memory (``CHUNK_OVERHEAD``
        counted per batch; fills in render slots are the arena's). Cost: O(1)."""
        return self._held

    def shed(self, limit: int) -> None:
        """Keep at most ``limit`` bytes of ``held``: drop kept batches from the far end
        (the read-ahead the next reads would use last; with it any fill after them).
        The bytes already returned stay valid: a reply holds its own reference.

        Cost: O(batches dropped).
        """
        rendered = self._rendered
        while self._held > limit and rendered:
            self._held -= _held_by(rendered.pop())

    @property
    def phase(self) -> int:
        """The global position of the kernel's offset 0 for this reader now: fills are
        cut where the kernel offset is a multiple of ``CHUNK``."""
        return self.base + self.shift

    def accept_fill(self, tail: Rendered, filled: Rendered) -> bool:
        """Keep ``filled`` (the bytes after ``tail``) unless the reader moved on since
        ``tail`` was its last kept bytes. Returns whether it was kept. Cost: O(1)."""
        rendered = self._rendered
        if not rendered or rendered[-1] is not tail or filled.position != tail.end:
            return False
        rendered.append(filled)
        return True

    def release_slot(self, slot: int) -> bool:
        """Drop the kept bytes in ``slot`` if none of them can be returned any more (all
        end at or before the start of the last read, whose reply may still be on its
        way; and none is the last kept, which the next fill continues). Returns whether
        the slot now holds nothing kept. Cost: O(chunks kept)."""
        rendered = self._rendered
        mine = [r for r in rendered if r.slot == slot]
        if not mine:
            return True
        if rendered[-1].slot == slot or any(r.end > self._read_start for r in mine):
            return False
        self._rendered = deque(r for r in rendered if r.slot != slot)
        return True

    def _forget(self) -> None:
        self._rendered.clear()
        self._held = 0
        self._realigned_end = -1

    def _realign(self, log: Log, rendering: Rendering) -> None:
        """Find this reader's place again after a cleaning pass moved positions (also
        called at the first read of a log): the record start in ``_mark`` is looked
        up by offset, and every position here moves by the difference (the shift too,
        so the kernel's offsets keep their bytes). The kept bytes that end at the mark
        stay, and are served even where they now lie below the log start (what the
        reader had rendered, a view as of then: a render process's fill may hold many
        batches ahead, records the pass removed among them); the read-ahead after the
        mark goes; and no kept bytes say where in a segment file they continue, as
        those files were replaced.

        A reader whose kept bytes were shed and whose last read ended inside a batch the
        pass rewrote may then get the rest of that batch as the log now renders it.

        Another log (the topic deleted and made again) has positions of its own:
        nothing here is found again in it, the kept bytes go.

        Cost: one ``position_of_offset`` (O(log n) and one batch rendered).
        """
        same_log = self._epoch[0] == id(log)
        self._epoch = (id(log), log.layout_epoch)
        self._start = None
        mark = self._mark
        if not same_log or mark is None or self._end < 0:
            self._forget()
            if not same_log:
                self._mark = None
            return
        position, offset = mark
        try:
            delta = position_of_offset(log, rendering, offset) - position
        except OffsetOutOfRangeError:
            # Retention went past it too: the gap logic of ``read`` continues.
            self._forget()
            self._mark = None
            return
        rendered = self._rendered
        kept = [r for r in rendered if r.end - r.skip <= position]
        self._forget()
        for r in kept:
            moved = replace(r, position=r.position + delta, segment=-1, resume=-1)
            rendered.append(moved)
            self._held += _held_by(moved)
        self.shift += delta
        self._end += delta
        self._read_start += delta
        self._mark = (position + delta, offset)
        if rendered:
            self._realigned_end = position + delta

    def _slice(self, position: int, want: int) -> bytes | memoryview:
        # The kept batches cover [position, want): drop those wholly before it (keeping
        # the last one), then slice the rest.
        rendered = self._rendered
        while len(rendered) > 1 and rendered[0].end <= position:
            self._held -= _held_by(rendered.popleft())
        parts: list[memoryview] = []
        last = None
        for r in rendered:
            if r.position >= want:
                break
            lo = position - r.position if position > r.position else 0
            parts.append(memoryview(r.data)[lo : want - r.position])
            last = r
        if last is not None:
            self._mark = (last.end - last.skip, last.next_offset)
        if len(parts) == 1:
            return parts[0]
        return b"".join(parts)

    def _anchor(self, log: Log, rendering: Rendering) -> tuple[int, int]:
        key = (id(log), log.log_start_offset, log.layout_epoch)
        if self._start is None or self._start[0] != key:
            self._start = (key, log_start_anchor(log, rendering))
        return self._start[1]

    def _read_at(
        self, log: Log, rendering: Rendering, position: int, size: int, ahead: int
    ) -> bytes | memoryview:
        want = position + size
        rendered = self._rendered
        if self._log_id != id(log):
            self._forget()
            self._log_id = id(log)
        last = rendered[-1] if rendered else None
        skip = 0
        if last is not None and rendered[0].position <= position <= last.end:
            # Continue the kept batches: the read starts in them or right after them
            # (a fill may have taken the first bytes of the next batch already).
            cursor, offset, skip = last.end, last.next_offset, last.skip
        else:
            self._forget()
            offset, cursor = log.extension_floor(position)
            if offset < log.log_start_offset:
                # The entry is below a log start inside its segment: scan from the
                # batch holding the log start (the caller keeps positions above it).
                offset = log.log_start_offset
                cursor = self._anchor(log, rendering)[0]
        # Render up to `want` (what the read needs), then on to `target` (read-ahead).
        target = min(want + ahead, log.extension_end)
        if cursor < target:
            try:
                for batch in log.batches(offset):
                    data = rendering.render(batch).data
                    if skip:
                        data, skip = data[skip:], 0
                    # By the last offset: a legacy compressed batch's base offset
                    # would decompress it again.
                    segment = log.segments.floor_segment(batch.last_offset)
                    r = Rendered(
                        cursor,
                        data,
                        batch.next_offset,
                        -1 if segment is None else segment.base_offset,
                        batch.position + batch.size,
                    )
                    cursor = r.end
                    if cursor <= position:
                        continue  # before the read: the scan from the index entry
                    rendered.append(r)
                    self._held += _held_by(r)
                    if cursor >= target:
                        break
            except CorruptRecordError:
                if cursor <= position:
                    # The read starts inside the damaged batch, at its start, or past it
                    # where the scan from the position-index entry below the read has
                    # to go through it: EIO (issue 17). A read past a damaged batch is
                    # served only from a batch the engine reaches without framing its
                    # way through the damage (the next segment, or a batch an
                    # offset-index entry names after it): then its position comes from
                    # the position index's own entry for it, written when it was
                    # appended (the next segment's entry 0, written when it was made),
                    # so it is where an undamaged file has it. Never by measuring on
                    # from before the damage: the damaged batch's rendered size is not
                    # known (its records do not decode, or decode to what was not
                    # written; a damaged length says nothing of where the next batch
                    # is), so every byte after it would be at a guessed position. (A
                    # position index rebuilt from the .log has no entry past a damaged
                    # batch for that reason: ``LogSegment.rebuild_extension``.)
                    raise
                # Serve the valid bytes before the corrupt batch (a short read, as a disk
                # read before a bad sector); the next read starts there and fails.
            except OffsetOutOfRangeError:
                if cursor < want:
                    raise
                # Retention deleted what the read-ahead wanted: the read has its bytes.
        return self._slice(position, min(want, cursor))


def _held_by(chunk: Rendered) -> int:
    # What a kept chunk adds to PositionReader.held.
    return len(chunk.data) + CHUNK_OVERHEAD if chunk.slot < 0 else 0

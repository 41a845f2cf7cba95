"""The ``.log`` file of a segment: record batches back to back (Kafka's ``FileRecords``).

Appends go to the end of the file with ``os.write`` on an ``O_APPEND`` descriptor;
reads use ``os.pread`` so concurrent readers in this process need no shared file
position. ``size`` is the number of bytes this object considers valid: the writer
knows it exactly; a reader in another process refreshes it with ``refresh_size()``
and never trusts a partial batch at the tail (the writer may be mid-``write``).

Thread-safety: one appending thread; any number of threads may read concurrently with
it (each read is a ``pread`` of bytes below a ``size`` that only grows on append).
``close`` may run while readers are mid-scan (retention deleting the segment): each
scan reads through its own duplicate of the descriptor, taken under a lock, so a
close never pulls a descriptor from under a reader, and a descriptor number reused by
another file after the close is never read by mistake. A read that starts after the
close raises ``SegmentDeletedError``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import threading
from collections.abc import Iterator
from itertools import chain
from pathlib import Path
from typing import NamedTuple

from ..errors import CorruptRecordError, SegmentDeletedError
from .record_batch import (
    HEADER_SIZE_UP_TO_MAGIC,
    LOG_OVERHEAD,
    MAGIC_V2,
    RECORD_BATCH_OVERHEAD,
    RecordBatch,
    batch_size_at,
    iter_batches,
    read_batch,
)

logger = logging.getLogger(__name__)

FIRST_READ_BYTES = 16 << 10
"""A batch scan's first ``pread``: a lookup scans about ``index.interval.bytes``."""
_V2_LAST_OFFSET_HEADER = struct.Struct(">qiibIhi")
"""A v2 header up to lastOffsetDelta: base offset, length, epoch, magic, CRC, attributes."""
READ_CHUNK_BYTES = 1 << 20
"""The largest ``pread`` of a scan: sequential reads double up to it to amortise calls."""


class OffsetPosition(NamedTuple):
    """Where the batch holding an offset sits: its last offset, position and size."""

    offset: int
    position: int
    size: int


class TimestampAndOffset(NamedTuple):
    timestamp: int
    offset: int


class FileRecords:
    """A segment's ``.log`` file.

    Args:
        path: the file.
        writable: open for append (creating the file if missing).
    """

    def __init__(self, path: Path, *, writable: bool) -> None:
        self.path = path
        self.writable = writable
        flags = os.O_RDWR | os.O_APPEND | os.O_CREAT if writable else os.O_RDONLY
        self._fd: int = os.open(path, flags | os.O_CLOEXEC, 0o644)
        self.size = os.fstat(self._fd).st_size
        # Guards the descriptor's number between "still open?" and its duplication.
        self._fd_lock = threading.Lock()

    def _reader_fd(self) -> int:
        """A duplicate of the descriptor for one read; the caller closes it.

        Raises:
            SegmentDeletedError: the file was closed (deleted by retention).
        """
        with self._fd_lock:
            if self._fd < 0:
                raise SegmentDeletedError(self.path)
            return os.dup(self._fd)

    # -- writing ---------------------------------------------------------------------

    def append(self, data: bytes) -> int:
        """Append ``data`` (whole batches); return the position it was written at.

        A short write (disk full mid-way) is undone by truncating back, so no partial
        batch is left behind for a reader to see as a torn tail.

        Raises:
            OSError: the write failed (e.g. ``ENOSPC``); the file is as before.
        """
        position = self.size
        try:
            written = os.write(self._fd, data)
            while written < len(data):
                written += os.write(self._fd, memoryview(data)[written:])
        except BaseException:
            # Crash safety: without this, the bytes of a half-written batch would sit
            # past ``size``; recovery would cut them, but a live reader must not see them.
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, position)
            raise
        self.size = position + len(data)
        return position

    def flush(self) -> None:
        """Make appended bytes durable (``fdatasync``)."""
        os.fdatasync(self._fd)

    def truncate_to(self, size: int) -> int:
        """Cut the file to ``size`` bytes; return how many bytes were removed.

        Read-only: the file is untouched and only this object's view shrinks, so a
        reader of a crashed log never sees the invalid tail that recovery would cut.
        """
        if size < 0 or size > self.size:
            raise ValueError(f"cannot truncate {self.path} of {self.size} bytes to {size}")
        removed = self.size - size
        if removed:
            if self.writable:
                os.ftruncate(self._fd, size)
            self.size = size
        return removed

    # -- reading ---------------------------------------------------------------------

    def refresh_size(self) -> int:
        """Re-read the file size (readers of a file another process appends to)."""
        self.size = os.fstat(self._fd).st_size
        return self.size

    def read(self, position: int, size: int) -> bytes:
        """Up to ``size`` bytes at ``position``, never past ``self.size``."""
        size = min(size, self.size - position)
        if size <= 0:
            return b""
        fd = self._reader_fd()
        try:
            return os.pread(fd, size, position)
        finally:
            os.close(fd)

    def batches(
        self, start: int = 0, end: int | None = None, first_read: int = FIRST_READ_BYTES
    ) -> Iterator[RecordBatch]:
        """Every complete batch lying within ``[start, end)``, in file order.

        Stops silently at a partial batch at the tail (a writer mid-append, or a torn
        write before recovery). CRCs are not checked here.

        Cost: one ``pread`` per chunk, chunks doubling from ``FIRST_READ_BYTES`` to
        ``READ_CHUNK_BYTES`` (or one per batch when batches are larger).

        Raises:
            CorruptRecordError: a batch header with an impossible size or magic.
            SegmentDeletedError: the file was closed before the scan began.
        """
        limit = self.size if end is None else min(end, self.size)
        if limit - start < HEADER_SIZE_UP_TO_MAGIC:
            return
        fd = self._reader_fd()
        try:
            yield from self._scan(fd, start, limit, first_read)
        finally:
            os.close(fd)

    def _scan(self, fd: int, start: int, limit: int, first_read: int) -> Iterator[RecordBatch]:
        position = start
        chunk_size = max(first_read, HEADER_SIZE_UP_TO_MAGIC)
        while limit - position >= HEADER_SIZE_UP_TO_MAGIC:
            chunk = os.pread(fd, min(chunk_size, limit - position), position)
            chunk_size = min(chunk_size * 2, READ_CHUNK_BYTES)
            consumed = 0
            try:
                for batch in iter_batches(chunk, position):
                    yield batch
                    consumed = batch.position + batch.size - position
                if consumed == 0 and len(chunk) >= HEADER_SIZE_UP_TO_MAGIC:
                    # A batch larger than the chunk: read exactly it, unless it is a
                    # partial tail.
                    size, _magic = batch_size_at(chunk, 0)
                    data = os.pread(fd, size, position) if position + size <= limit else b""
                    if len(data) == size:
                        yield read_batch(data, 0, position)
                        consumed = size
            except CorruptRecordError as exc:
                raise CorruptRecordError(exc.reason, self.path, exc.position) from None
            if consumed == 0:
                return  # a partial tail, or the file shrank under us
            position += consumed

    def batches_from_entry(
        self,
        target_offset: int,
        entry_position: int,
        entry_last_offset: int,
        fallback_position: int = 0,
    ) -> Iterator[RecordBatch]:
        """The batches from the first with last offset >= ``target_offset`` on, located
        through an offset-index entry: the batch at ``entry_position`` ending at
        ``entry_last_offset``, at or before the wanted one.

        Indexes carry no checksum: the entry's batch must be there and end at that
        offset, else the entry is ignored (with a warning) and the scan starts at
        ``fallback_position``. A v2 header tells both that and where the next batch
        starts, so the entry's batch is not read when the wanted one is after it.
        CRCs are not checked here.

        Cost: one 27-byte ``pread`` of the entry's header, then a scan whose first
        ``pread`` takes the wanted batch whole when it is about the entry's size (a
        lookup: two ``pread`` calls, and one descriptor duplicated).

        Raises:
            CorruptRecordError: a batch header with an impossible size or magic.
            SegmentDeletedError: the file was closed before the scan began.
        """
        fd = self._reader_fd()
        try:
            yield from self._batches_from_entry(
                fd, target_offset, entry_position, entry_last_offset, fallback_position
            )
        finally:
            os.close(fd)

    def _batches_from_entry(
        self,
        fd: int,
        target_offset: int,
        entry_position: int,
        entry_last_offset: int,
        fallback_position: int,
    ) -> Iterator[RecordBatch]:
        limit = self.size
        header = _V2_LAST_OFFSET_HEADER
        data = os.pread(fd, header.size, entry_position) if entry_position < limit else b""
        batches: Iterator[RecordBatch] | None = None
        if len(data) == header.size:
            base, length, _epoch, magic, _crc, _attributes, delta = header.unpack(data)
            size = length + LOG_OVERHEAD
            if (
                magic == MAGIC_V2
                and size >= RECORD_BATCH_OVERHEAD
                and entry_position + size <= limit
                and base + delta == entry_last_offset
            ):
                # Batches of one log tend to be alike in size: read the next one whole
                # in the first ``pread``, with a quarter to spare.
                if entry_last_offset >= target_offset:
                    batches = self._scan(fd, entry_position, limit, max(size, FIRST_READ_BYTES))
                else:
                    first_read = max(size + size // 4, FIRST_READ_BYTES)
                    batches = self._scan(fd, entry_position + size, limit, first_read)
        if batches is None:
            # Not a v2 header (a legacy entry), or not the entry's batch: read the
            # batch there to check its last offset.
            batches = self._scan(fd, entry_position, limit, FIRST_READ_BYTES)
            try:
                first = next(batches, None)
            except CorruptRecordError:
                first = None
            if first is not None and first.last_offset == entry_last_offset:
                batches = chain((first,), batches)
            else:
                logger.warning(
                    "%s: ignoring wrong index entry (%d, %d)",
                    self.path,
                    entry_last_offset,
                    entry_position,
                )
                batches = self._scan(fd, fallback_position, limit, FIRST_READ_BYTES)
        for batch in batches:
            if batch.last_offset >= target_offset:
                yield batch
                break
        yield from batches

    def search_for_offset(self, target_offset: int, start: int = 0) -> OffsetPosition | None:
        """The first batch at or after ``start`` whose last offset is >= ``target_offset``.

        Cost: a forward scan from ``start``; callers start from an index entry, so it
        reads at most about ``index.interval.bytes`` plus one batch.
        """
        for batch in self.batches(start):
            last = batch.last_offset
            if last >= target_offset:
                return OffsetPosition(last, batch.position, batch.size)
        return None

    def search_for_timestamp(
        self, target_timestamp: int, start: int, starting_offset: int
    ) -> TimestampAndOffset | None:
        """The first record at or after ``start`` with offset >= ``starting_offset`` and
        timestamp >= ``target_timestamp`` (Kafka's ``searchForTimestamp``)."""
        for batch in self.batches(start):
            if batch.max_timestamp >= target_timestamp:
                for record in batch.records():
                    if record.offset >= starting_offset and record.timestamp >= target_timestamp:
                        return TimestampAndOffset(record.timestamp, record.offset)
        return None

    def largest_timestamp_after(self, start: int) -> TimestampAndOffset:
        """The largest batch max timestamp from ``start`` on, with that batch's last offset."""
        best = TimestampAndOffset(-1, -1)
        for batch in self.batches(start):
            if batch.max_timestamp > best.timestamp:
                best = TimestampAndOffset(batch.max_timestamp, batch.last_offset)
        return best

    # -- file lifecycle --------------------------------------------------------------

    def rename_to(self, path: Path) -> None:
        """Rename the file; the descriptor (and readers holding one) stay valid."""
        os.rename(self.path, path)
        self.path = path

    def close(self) -> None:
        """Close the descriptor; scans already under way finish on their duplicates."""
        with self._fd_lock:
            fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def delete_if_exists(self) -> bool:
        self.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            return False
        return True

    def __repr__(self) -> str:
        return f"FileRecords({self.path}, size={self.size})"

"""The ``.log`` file of a segment: record batches back to back (Kafka's ``FileRecords``).

Appends go to the end of the file with ``os.write`` on an ``O_APPEND`` descriptor;
reads use ``os.pread`` so concurrent readers in this process need no shared file
position. ``size`` is the number of bytes this object considers valid: the writer
knows it exactly; a reader in another process refreshes it with ``refresh_size()``
and never trusts a partial batch at the tail (the writer may be mid-``write``).

A batch that runs past the bytes a scan may read is the unflushed tail or damage; the
scan's ``tail`` (``Tail``) says which it can be, and a read never passes over damage in
silence: it raises ``CorruptRecordError`` there.

Descriptors: the file is opened when the object is made and may then be *released*
(``release``: its descriptor closed, as a segment the process has not used lately is,
see ``segment.OpenSegments``) and opened again by name on the next use, never created
again (a file deleted meanwhile stays deleted) and only if it is still the same file
(device and inode): otherwise the read raises ``SegmentDeletedError``. (A file
deleted and then made again may get the freed inode number back; a reader process
could then take it for the one it knew: a writer only does that in the recovery of a
crashed log, and the offsets and CRCs of what such a reader reads still hold.) ``close``
is final. A ``HandleOwner`` is told of each reopening, and asked to release other files
when the process is out of descriptors (``EMFILE``), after which the open is tried once
more.

Thread-safety: one appending thread; any number of threads may read concurrently with
it (each read is a ``pread`` of bytes below a ``size`` that only grows on append).
``close`` and ``release`` may run while readers are mid-scan (retention deleting the
segment, the process closing a segment it has not used lately): each scan reads
through its own duplicate of the descriptor, taken under a lock, so neither pulls a
descriptor from under a reader, and a descriptor number reused by another file after
them is never read by mistake. A read that starts after ``close`` raises
``SegmentDeletedError``; one that starts after ``release`` opens the file again.
Writing (``append``, ``truncate_to``, ``flush``) uses the descriptor itself: the owner
must not ``release`` the file meanwhile (``LogSegment`` pins a segment it changes).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import struct
import threading
from collections.abc import Callable, Iterator
from enum import Enum
from itertools import chain
from pathlib import Path
from typing import NamedTuple, Protocol, TypeVar

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


_T = TypeVar("_T")

OUT_OF_DESCRIPTORS = frozenset({errno.EMFILE, errno.ENFILE})
"""The errors of an ``open``, ``dup`` or ``mmap`` that found no descriptor free: this
process's (``RLIMIT_NOFILE``) or the system's."""


def retry_out_of_descriptors(action: Callable[[], _T], shed: Callable[[], bool] | None) -> _T:
    """``action()``; when it finds no descriptor free (``OUT_OF_DESCRIPTORS``),
    ``shed()`` (release other files; False when there was none) and ``action()`` once
    more. ``action`` must leave nothing half done when it raises.

    Raises:
        OSError: as ``action``.
    """
    try:
        return action()
    except OSError as exc:
        if exc.errno not in OUT_OF_DESCRIPTORS or shed is None or not shed():
            raise
    return action()


class HandleOwner(Protocol):
    """What owns a file whose descriptor (or mapping) comes and goes: a ``LogSegment``."""

    def handles_opened(self) -> None:
        """A file of the owner was opened again after a ``release``."""

    def shed_handles(self) -> bool:
        """Release other files, the process being out of descriptors; return whether
        any was released (then the open is tried once more)."""


class Tail(Enum):
    """What a scan makes of a batch that runs past the bytes it may read (or of fewer
    bytes than a batch header there): whether the file may still be growing there.

    - ``UNCHECKED``: the scan ends there, quietly. Recovery's scans use it (recovery
      owns the unflushed tail: it cuts it and says so), and the scans that only measure
      a segment (its next offset, largest timestamp, extension units). Reads never do.
    - ``ACTIVE``: the segment a writer appends to. In the writer's process ``size``
      covers whole batches only, so such a batch is damage. A reader in another process
      may have caught the writer's append half-written: there it is damage only when
      the file now holds all of it and it fails its CRC, or when the offset index names
      a batch after it (the writer finished that one later); otherwise the scan ends
      quietly, and the next ``refresh_size`` sees the batch whole.
    - ``SEALED``: a later segment exists, so every byte of the file is final (a writer
      finishes a segment before it creates the next): such a batch is damage. A reader
      whose ``size`` predates the roll first reads on to the file's size.
    """

    UNCHECKED = "unchecked"
    ACTIVE = "active"
    SEALED = "sealed"


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

    def __init__(self, path: Path, *, writable: bool, owner: HandleOwner | None = None) -> None:
        self.path = path
        self.writable = writable
        self.owner = owner
        flags = os.O_RDWR | os.O_APPEND | os.O_CREAT if writable else os.O_RDONLY
        self._fd: int = os.open(path, flags | os.O_CLOEXEC, 0o644)
        try:
            stat = os.fstat(self._fd)
        except BaseException:
            os.close(self._fd)
            raise
        self.size = stat.st_size
        self._identity = (stat.st_dev, stat.st_ino)
        self._closed = False
        # Guards the descriptor: its number between "still open?" and its duplication,
        # its release and its reopening.
        self._fd_lock = threading.Lock()

    @property
    def is_open(self) -> bool:
        """Whether the descriptor is open now (not released, not closed)."""
        return self._fd >= 0

    @property
    def closed(self) -> bool:
        """Whether ``close`` was called: the file is never opened again."""
        return self._closed

    def _with_fd(self, use: Callable[[int], _T]) -> _T:
        """``use(descriptor)`` under the lock, the file opened again first if released.

        Out of descriptors, the owner is asked to shed others and the call is tried once
        more. Keep ``use`` short: readers wait for the lock to duplicate the descriptor.

        Raises:
            SegmentDeletedError: the file was closed, or is gone or replaced since.
            OSError: as ``use``, or the file cannot be opened again (``EMFILE``).
        """
        reopened = False

        def locked() -> _T:
            nonlocal reopened
            with self._fd_lock:
                fd = self._fd
                if fd < 0:
                    fd = self._reopen()
                    reopened = True
                return use(fd)

        owner = self.owner
        result = retry_out_of_descriptors(locked, None if owner is None else owner.shed_handles)
        if reopened and owner is not None:
            # Outside the lock: the owner may release other files (lock order: the
            # owner's lock, then a file's).
            owner.handles_opened()
        return result

    def _reopen(self) -> int:
        """Open the released file again (the caller holds the lock); return the descriptor.

        Never with ``O_CREAT``: a segment deleted while released is not made again.
        """
        if self._closed:
            raise SegmentDeletedError(self.path)
        flags = os.O_RDWR | os.O_APPEND if self.writable else os.O_RDONLY
        try:
            fd = os.open(self.path, flags | os.O_CLOEXEC)
        except FileNotFoundError:
            raise SegmentDeletedError(self.path) from None
        try:
            stat = os.fstat(fd)
        except BaseException:
            os.close(fd)
            raise
        if (stat.st_dev, stat.st_ino) != self._identity:
            # Another file took the name (a writer's recovery made the segment anew):
            # its bytes are not the ones this object's size and indexes describe.
            os.close(fd)
            raise SegmentDeletedError(self.path)
        self._fd = fd
        return fd

    def _reader_fd(self) -> int:
        """A duplicate of the descriptor for one read; the caller closes it.

        Raises:
            SegmentDeletedError: the file was closed (deleted by retention), or is gone.
            OSError: out of descriptors (``EMFILE``), even after the owner shed some.
        """
        return self._with_fd(os.dup)

    def open_reader(self) -> int:
        """A descriptor of its own on this file, for a read that outlives the call (a
        Kafka Fetch sends the bytes after the engine chose them); the caller closes it.
        It keeps reading these bytes when retention deletes the file or compaction
        replaces it meanwhile (an unlinked file lives while a descriptor is open).

        Raises:
            SegmentDeletedError: the file was closed (deleted by retention), or is gone.
            OSError: out of descriptors (``EMFILE``), even after the owner shed some.
        """
        return self._reader_fd()

    @property
    def identity(self) -> tuple[int, int]:
        """``(st_dev, st_ino)`` of the file opened: another file under the same name
        (a segment compaction replaced) has another."""
        return self._identity

    def _writer_fd(self) -> int:
        """The descriptor itself, for the writer (which keeps it from being released)."""
        fd = self._fd
        return fd if fd >= 0 else self._with_fd(int)

    # -- writing ---------------------------------------------------------------------

    def append(self, data: bytes) -> int:
        """Append ``data`` (whole batches); return the position it was written at.

        A short write (disk full mid-way) is undone by truncating back, so no partial
        batch is left behind for a reader to see as a torn tail.

        Raises:
            OSError: the write failed (e.g. ``ENOSPC``); the file is as before.
        """
        position = self.size
        fd = self._writer_fd()
        try:
            written = os.write(fd, data)
            while written < len(data):
                written += os.write(fd, memoryview(data)[written:])
        except BaseException:
            # Crash safety: without this, the bytes of a half-written batch would sit
            # past ``size``; recovery would cut them, but a live reader must not see them.
            with contextlib.suppress(OSError):
                os.ftruncate(fd, position)
            raise
        self.size = position + len(data)
        return position

    def flush(self) -> None:
        """Make appended bytes durable (``fdatasync``)."""
        os.fdatasync(self._writer_fd())

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
                os.ftruncate(self._writer_fd(), size)
            self.size = size
        return removed

    # -- reading ---------------------------------------------------------------------

    def refresh_size(self) -> int:
        """Re-read the file size (readers of a file another process appends to).

        Raises:
            SegmentDeletedError: the file was closed, or released and gone since.
        """
        self.size = self._with_fd(lambda fd: os.fstat(fd).st_size)
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
        self,
        start: int = 0,
        end: int | None = None,
        first_read: int = FIRST_READ_BYTES,
        *,
        tail: Tail = Tail.UNCHECKED,
        indexed_position: int = 0,
    ) -> Iterator[RecordBatch]:
        """Every complete batch lying within ``[start, end)``, in file order.

        A batch cut off by ``end`` ends the scan; one cut off by the end of the file is
        the tail or damage, as ``tail`` says (``Tail``). ``indexed_position``: the
        position of a batch the offset index names (a reader's, for ``Tail.ACTIVE``):
        the writer completed every batch before it. CRCs are not checked here.

        Cost: one ``pread`` per chunk, chunks doubling from ``FIRST_READ_BYTES`` to
        ``READ_CHUNK_BYTES`` (or one per batch when batches are larger); at a batch cut
        off by the end, one ``fstat`` and a read of that batch.

        Raises:
            CorruptRecordError: a batch header with an impossible size or magic, or a
                batch the file cannot hold that is not the tail (see ``Tail``).
            SegmentDeletedError: the file was closed before the scan began.
        """
        limit = self.size
        if end is not None and end < limit:
            limit, tail = end, Tail.UNCHECKED
        if limit <= start and (tail is not Tail.SEALED or self.writable):
            return
        fd = self._reader_fd()
        try:
            yield from self._scan(fd, start, limit, first_read, tail, indexed_position)
        finally:
            os.close(fd)

    def _scan(
        self,
        fd: int,
        start: int,
        limit: int,
        first_read: int,
        tail: Tail,
        indexed_position: int,
    ) -> Iterator[RecordBatch]:
        position = start
        chunk_size = max(first_read, HEADER_SIZE_UP_TO_MAGIC)
        while True:
            if position >= limit:
                if tail is not Tail.SEALED or self.writable or position > limit:
                    return
                # A reader's view of a sealed segment may predate the writer's last
                # appends to it (a refresh that found the next segment before it read
                # this one's size again): read on to the file's end.
                limit = max(limit, os.fstat(fd).st_size)
                if position >= limit:
                    return
            consumed = 0
            if limit - position >= HEADER_SIZE_UP_TO_MAGIC:
                chunk = os.pread(fd, min(chunk_size, limit - position), position)
                chunk_size = min(chunk_size * 2, READ_CHUNK_BYTES)
                try:
                    for batch in iter_batches(chunk, position):
                        yield batch
                        consumed = batch.position + batch.size - position
                    if consumed == 0 and len(chunk) >= HEADER_SIZE_UP_TO_MAGIC:
                        # A batch larger than the chunk: read exactly it, unless it
                        # runs past the limit.
                        size, _magic = batch_size_at(chunk, 0)
                        data = os.pread(fd, size, position) if position + size <= limit else b""
                        if len(data) == size:
                            yield read_batch(data, 0, position)
                            consumed = size
                except CorruptRecordError as exc:
                    raise CorruptRecordError(exc.reason, self.path, exc.position) from None
            if consumed:
                position += consumed
                continue
            # No whole batch at ``position`` below the limit.
            limit = self._read_on_to(fd, position, limit, tail, indexed_position)
            if limit == position:
                return

    def _read_on_to(
        self, fd: int, position: int, limit: int, tail: Tail, indexed_position: int
    ) -> int:
        """Where a scan that found no whole batch at ``position`` below ``limit`` goes
        on to: a larger limit (a reader whose view of a sealed segment is older than
        its last bytes), or ``position`` to end the scan (the tail, or a file that
        shrank under the scan).

        Raises:
            CorruptRecordError: the bytes at ``position`` are damage (see ``Tail``).
        """
        if tail is Tail.UNCHECKED:
            return position
        file_size = os.fstat(fd).st_size
        if file_size < limit or (self.writable and self.size < limit):
            return position  # truncated under the scan (the writer's truncate_to)
        if self.writable:
            # The writer's ``size`` only ever ends at a batch end.
            size = self._size_at(fd, position, limit)
            raise CorruptRecordError(
                self._cut_off_reason(size, position, limit), self.path, position
            )
        if tail is Tail.SEALED and file_size > limit:
            return file_size  # a view taken before the writer finished the file
        size = self._size_at(fd, position, file_size)
        if tail is Tail.SEALED:
            raise CorruptRecordError(
                self._cut_off_reason(size, position, file_size), self.path, position
            )
        # ``Tail.ACTIVE`` in a reader: maybe the writer's append, caught in flight.
        if size is not None and position + size <= file_size:
            batch = read_batch(os.pread(fd, size, position), 0, position)
            if batch.is_valid():
                return position  # it was in flight: the next refresh shows it whole
            raise CorruptRecordError("CRC mismatch", self.path, position)
        if position < indexed_position < file_size:
            raise CorruptRecordError(
                f"{self._cut_off_reason(size, position, file_size)}, before the batch at "
                f"byte {indexed_position} that the offset index names",
                self.path,
                position,
            )
        return position

    def _size_at(self, fd: int, position: int, file_size: int) -> int | None:
        """The size the batch header at ``position`` claims; None when the file holds
        fewer bytes than a header there.

        Raises:
            CorruptRecordError: the header's size or magic is impossible.
        """
        if file_size - position < HEADER_SIZE_UP_TO_MAGIC:
            return None
        header = os.pread(fd, HEADER_SIZE_UP_TO_MAGIC, position)
        if len(header) < HEADER_SIZE_UP_TO_MAGIC:
            return None
        try:
            return batch_size_at(header, 0)[0]
        except CorruptRecordError as exc:
            raise CorruptRecordError(exc.reason, self.path, position) from None

    @staticmethod
    def _cut_off_reason(size: int | None, position: int, end: int) -> str:
        if size is None:
            return f"{end - position} bytes at the end of the segment, fewer than a batch header"
        return f"a batch of {size} bytes runs past the end of the segment at byte {end}"

    def batches_from_entry(
        self,
        target_offset: int,
        entry_position: int,
        entry_last_offset: int,
        fallback_position: int = 0,
        *,
        tail: Tail = Tail.UNCHECKED,
        indexed_position: int = 0,
    ) -> Iterator[RecordBatch]:
        """The batches from the first with last offset >= ``target_offset`` on, located
        through an offset-index entry: the batch at ``entry_position`` ending at
        ``entry_last_offset``, at or before the wanted one.

        Indexes carry no checksum: the entry's batch must be there and end at that
        offset, else the entry is ignored (with a warning) and the scan starts at
        ``fallback_position``. A v2 header tells both that and where the next batch
        starts, so the entry's batch is not read when the wanted one is after it.
        CRCs are not checked here; ``tail`` and ``indexed_position`` as ``batches``.

        Cost: one 27-byte ``pread`` of the entry's header, then a scan whose first
        ``pread`` takes the wanted batch whole when it is about the entry's size (a
        lookup: two ``pread`` calls, and one descriptor duplicated).

        Raises:
            CorruptRecordError: as ``batches``.
            SegmentDeletedError: the file was closed before the scan began.
        """
        fd = self._reader_fd()
        try:
            yield from self._batches_from_entry(
                fd,
                target_offset,
                entry_position,
                entry_last_offset,
                fallback_position,
                tail,
                indexed_position,
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
        tail: Tail,
        indexed_position: int,
    ) -> Iterator[RecordBatch]:
        limit = self.size
        scan_args = (tail, indexed_position)
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
                    first_read = max(size, FIRST_READ_BYTES)
                    batches = self._scan(fd, entry_position, limit, first_read, *scan_args)
                else:
                    first_read = max(size + size // 4, FIRST_READ_BYTES)
                    batches = self._scan(fd, entry_position + size, limit, first_read, *scan_args)
        if batches is None:
            # Not a v2 header (a legacy entry), or not the entry's batch: read the
            # batch there to check its last offset.
            batches = self._scan(fd, entry_position, limit, FIRST_READ_BYTES, *scan_args)
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
                batches = self._scan(fd, fallback_position, limit, FIRST_READ_BYTES, *scan_args)
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
        self,
        target_timestamp: int,
        start: int,
        starting_offset: int,
        *,
        tail: Tail = Tail.UNCHECKED,
        indexed_position: int = 0,
    ) -> TimestampAndOffset | None:
        """The first record at or after ``start`` with offset >= ``starting_offset`` and
        timestamp >= ``target_timestamp`` (Kafka's ``searchForTimestamp``).

        Each batch scanned must pass its CRC: its max timestamp decides the answer.

        Raises:
            CorruptRecordError: a batch scanned fails its CRC, or as ``batches``.
        """
        for batch in self.batches(start, tail=tail, indexed_position=indexed_position):
            if not batch.is_valid():
                raise CorruptRecordError("CRC mismatch", self.path, batch.position)
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
        """Rename the file; the descriptor (and readers holding one) stay valid, and a
        released file is opened again under its new name."""
        with self._fd_lock:
            os.rename(self.path, path)
            self.path = path

    def release(self) -> None:
        """Close the descriptor until the next use opens the file again (by name).

        Scans already under way finish on their duplicates. Idempotent.
        """
        with self._fd_lock:
            fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def close(self) -> None:
        """Close the descriptor for good; scans already under way finish on their
        duplicates, later reads raise ``SegmentDeletedError``."""
        with self._fd_lock:
            fd, self._fd = self._fd, -1
            self._closed = True
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

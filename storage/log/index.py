"""The memory-mapped, fixed-entry-size index file under ``.index`` and ``.timeindex``.

``AbstractIndex`` holds what Kafka's ``AbstractIndex`` holds: the file, its mapping, the
entry count, preallocation, trimming, resizing and the binary search. ``OffsetIndex``
and ``TimeIndex`` add the entry layout and the operations keyed on it.

Indexes are hints, never truth: no entry is checksummed, and on any doubt (an unclean
shutdown, a failed ``sanity_check``) the log rebuilds them from the ``.log`` file. Every
crash-related choice below only has to keep an index *conservative* (each entry a valid
lower bound into the log), never complete.
"""

from __future__ import annotations

import abc
import errno
import logging
import mmap
import os
import struct
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import ClassVar, Final, Self, TypeVar

from ..errors import (
    ConfigError,
    CorruptIndexError,
    IndexFullError,
    InvalidOffsetError,
    ReadOnlyLogError,
)
from ..record.file_records import HandleOwner, retry_out_of_descriptors

__all__ = ["DEFAULT_MAX_INDEX_SIZE", "INT32_MAX", "AbstractIndex"]

logger = logging.getLogger(__name__)

DEFAULT_MAX_INDEX_SIZE = 10 * 1024 * 1024
"""Kafka's ``segment.index.bytes`` default: 10 MiB."""

_INT32 = struct.Struct(">i")
INT32_MAX = 2**31 - 1
"""The largest relative offset an index entry can hold."""

# Kafka's warm section is the last 8 KiB of entries (two 4 KiB pages at most): in-sync
# lookups land there, so only those pages stay hot in the page cache.
_WARM_SECTION_BYTES = 8192

_T = TypeVar("_T")

_PAGE: Final = mmap.PAGESIZE

_MADV_POPULATE_WRITE: Final = getattr(mmap, "MADV_POPULATE_WRITE", 23)
"""Linux 5.14's ``madvise`` that faults pages in writable (allocating their blocks) and
fails with ``EFAULT`` where a store would have raised ``SIGBUS``; Python 3.11 lacks the
constant."""

_populate_write = sys.platform.startswith("linux")
"""Whether ``_MADV_POPULATE_WRITE`` works here (cleared the first time the kernel says
``EINVAL``: older than 5.14)."""


class AbstractIndex(abc.ABC):
    """A file of fixed-size entries, mapped with ``mmap``, whose keys increase.

    Byte layout: ``entries`` back-to-back entries of ``ENTRY_SIZE`` bytes, big-endian,
    each holding an int32 offset relative to ``base_offset`` at byte ``REL_OFFSET_POS``
    (see the subclasses for the full layout). A writable index file is preallocated to
    ``max_index_size`` rounded down to a multiple of ``ENTRY_SIZE`` and zero-filled;
    ``close`` and ``trim_to_valid_size`` cut it back to its entries, exactly as Kafka does,
    so closed files are byte-identical to Kafka's.

    Entry count of an existing file: the valid prefix. A file left untrimmed by a crash,
    or one a writer is still appending to, ends in zero-filled slots. Relative offsets
    strictly increase, so every valid slot after the first has a non-zero relative
    offset, and the count is the first slot ``n >= 1`` whose relative offset is 0 (found
    by binary search, the predicate being monotone), else every whole slot. A lone
    all-zero first slot counts as empty: it is indistinguishable from preallocation, and
    dropping it loses nothing since ``(base_offset, 0)`` is what an empty index answers.

    Opening: a writable open of a missing file creates and preallocates it; a writable
    open of an existing file maps it at its current size (nothing when it is empty) and
    does *not* grow it: a trimmed (rolled) index is therefore full until the log calls
    ``resize(max_index_size)`` when the segment becomes active again (Kafka does the
    same on load and on truncation back into an old segment). A read-only open
    (``writable=False``) never changes the file, maps only the valid prefix with
    ``mmap.ACCESS_READ`` (nothing when it is empty: Python cannot map 0 bytes), treats
    a missing file as an empty index, and sees a writer's later appends after
    ``refresh()``.

    Crash safety: the writer keeps the file as "valid prefix, then zeros": each
    subclass orders the two stores of an entry so that a half-written entry reads
    either as absent (relative offset still 0) or as a safe lower bound, and
    ``truncate_to`` zeroes the slots it removes, so a reopened file never resurrects
    removed entries. Nothing here is fsynced except by ``flush``; the index is rebuilt
    from the log after an unclean shutdown anyway.

    Descriptors: a writable index keeps none of its own once mapped (as Kafka closes
    the file after mapping it): the mapping holds the one CPython's ``mmap`` duplicates.
    ``resize`` needs no other: it resizes the mapping and the file through that one
    (``mmap.resize``), or, without a mapping, truncates the file by name; only growing
    an index that has no mapping opens it by name, which only this writer changes
    (``rename_to``). So a roll seals its segment (the final entry, the trim) without a
    descriptor to spare. A read-only index keeps its descriptor besides its mapping's,
    to follow the inode through a writer's renames and to map a longer prefix after
    ``refresh``. Per segment a writer thus holds 3 descriptors (the ``.log`` and one per
    index) instead of 5, 4 with the file system's position index instead of 7.

    Released (Kafka's ``LazyIndex``, which maps an index on first use, and more): an
    owner bounding the files a process holds (``segment.OpenSegments``) may
    ``release`` the mapping and descriptors of an index it has not used lately; the
    next use opens and maps the file again, by name, never creating it (a file
    deleted meanwhile reads as an empty index, and a writable one as a full one, so
    the log rolls past it). A writer's entry count survives the release; a reader's
    view does too, up to what the file still holds (``refresh`` takes a new one). The
    owner is told of each reopening (``HandleOwner``) and asked to release other files
    when the process is out of descriptors; the open is then tried once more.

    Full disk: before an entry is written into a page of the mapping no entry used
    before, the page is faulted in writable (``MADV_POPULATE_WRITE``), which allocates
    its blocks: a file system out of space fails that with an ``OSError`` (``ENOSPC``)
    instead of killing the process with ``SIGBUS`` at the store. The page holding the
    last entry of a file opened again counts as such a page (its blocks past the end
    the file was trimmed to are holes where a block is smaller than a page), and
    ``reserve`` does it ahead of an append, before the log writes its bytes.

    Costs: lookups are a binary search over the mapping, O(log n), restricted first to
    Kafka's "warm" section (the last 8 KiB of entries) when the target lies there, so
    in-sync lookups touch only hot pages. Opening and ``refresh`` are O(log n) ``pread``
    calls plus one ``mmap``. Appends are O(1). ``truncate_to`` is O(log n + removed).

    Thread safety: one writer (the process holding the log directory lock, under the
    log's lock) owns the one writable instance, and any number of threads may look it
    up meanwhile: a lookup takes the mapping once and reads only slots below an entry
    count that every trim keeps inside it. The file's handles (opening again,
    ``release``, ``resize``, ``refresh``, ``close``) change under a lock of the
    instance; a dropped mapping stays valid while a lookup holds it. A reader process
    uses its own read-only instance and calls ``refresh`` to see new entries. Readers
    only map what was valid when they looked,
    so the writer's appends never move memory under them; a writer that shrinks a file
    below a reader's view (``truncate_to`` then ``trim_to_valid_size``, during
    recovery) can make that reader's process fault (SIGBUS), so truncation happens
    before readers open the segment. On x86-64 (total store order) a concurrent reader
    sees each entry either absent or with its fields written in order; on weakly ordered
    CPUs a torn entry is possible for nanoseconds, and readers verify against the log.
    """

    ENTRY_SIZE: ClassVar[int]
    """Bytes per entry."""

    REL_OFFSET_POS: ClassVar[int]
    """Byte position of the int32 relative offset inside an entry."""

    def __init__(
        self,
        path: Path,
        base_offset: int,
        max_index_size: int = DEFAULT_MAX_INDEX_SIZE,
        writable: bool = True,
    ) -> None:
        """Open (and, when writable and new or empty, preallocate) the index at ``path``.

        Raises:
            ConfigError: a new writable index would get ``max_index_size`` smaller than
                one entry.
            OSError: the file cannot be opened or mapped (a writable open of a
                directory that does not exist, permissions).
        """
        self._path = Path(path)
        self._base_offset = base_offset
        self._max_index_size = max_index_size
        self._writable = writable
        self._closed = False
        self._fd = -1
        # The mapping; b"" when nothing is mapped, None once released (see the class doc).
        self._buf: mmap.mmap | bytes | None = b""
        self._length = 0
        self._entries = 0
        self._max_entries = 0
        # Bytes of the mapping whose pages are known to have blocks (page-aligned).
        self._populated = 0
        self._warm_entries = _WARM_SECTION_BYTES // self.ENTRY_SIZE
        self._handle_lock = threading.Lock()
        self.owner: HandleOwner | None = None
        if writable:
            self._open_writable()
            self._entries_changed(self._mapped())
        else:
            # A missing file is an empty index: an index is a hint, and a reader of a
            # segment whose index is being rebuilt (or deleted under it) scans the log.
            self._reopen_read_only(fresh=True)

    def _open_writable(self) -> None:
        try:
            fd = os.open(self._path, os.O_RDWR | os.O_CLOEXEC)
            created = False
        except FileNotFoundError:
            fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            created = True
        try:
            length = os.fstat(fd).st_size
            entries = 0
            if created:
                if self._max_index_size < self.ENTRY_SIZE:
                    raise ConfigError(
                        "segment.index.bytes",
                        self._max_index_size,
                        f"an index needs room for one {self.ENTRY_SIZE}-byte entry",
                    )
                # Preallocate, zero-filled, so that appends never grow the file and the
                # trailing zeros mark the end of the valid entries after a crash.
                length = self._round_down(self._max_index_size)
                os.ftruncate(fd, length)
            elif length:
                entries = self._count_valid_entries(fd, length)
            # An existing empty file (a sealed segment's index without entries) stays
            # so, unmapped and full, as Kafka opens it: preallocating (and mapping) it
            # cost a sealed segment 10 MiB for nothing, at every open of every segment.
            self._buf = mmap.mmap(fd, length, access=mmap.ACCESS_WRITE) if length else b""
        finally:
            # The mapping keeps a descriptor of its own (CPython's mmap duplicates it):
            # holding this one too would cost every segment a descriptor per index.
            os.close(fd)
        self._length = length
        self._entries = entries
        self._max_entries = length // self.ENTRY_SIZE
        # Pages filled with entries were written, so they have blocks; past them, the
        # preallocation is a hole. The page holding the last entry may be partly a hole
        # too: a file trimmed to its entries (a clean close) keeps only the blocks up
        # to that end, and ``resize`` regrows it sparse. Where a block is smaller than a
        # page (ext4 makes 1-KiB blocks on a small file system), the next store into
        # that page needs blocks: it is faulted in again first (``_ensure_allocated``).
        self._populated = entries * self.ENTRY_SIZE // _PAGE * _PAGE

    def _map_valid_prefix(self, most: int | None = None) -> None:
        """(Re)read size and entry count of a read-only index; map only the valid prefix
        (of at most ``most`` entries: a view reopened after a release stays the view).

        Counting uses ``pread``, which returns short reads past EOF instead of faulting,
        so a writer trimming the file meanwhile cannot crash the reader.
        """
        length = os.fstat(self._fd).st_size
        entries = self._count_valid_entries(self._fd, length)
        if most is not None:
            entries = min(entries, most)
        if entries != self._entries or not isinstance(self._buf, mmap.mmap):
            # Swap in the new mapping in one store; when entries grow, the buffer is
            # replaced before the count rises, when they shrink, after it falls, so a
            # concurrent lookup never indexes past the buffer it holds.
            new_buf = (
                mmap.mmap(self._fd, entries * self.ENTRY_SIZE, access=mmap.ACCESS_READ)
                if entries
                else b""
            )
            if entries > self._entries:
                self._buf = new_buf
                self._entries = entries
            else:
                self._entries = entries
                self._buf = new_buf
        self._length = length
        self._entries = entries
        self._max_entries = length // self.ENTRY_SIZE

    @classmethod
    def _round_down(cls, size: int) -> int:
        return max(size, 0) // cls.ENTRY_SIZE * cls.ENTRY_SIZE

    @classmethod
    def _count_valid_entries(cls, fd: int, length: int) -> int:
        """Entries in the valid prefix of the file behind ``fd`` (see the class doc).

        Runtime complexity: O(log n) ``pread`` calls.
        """
        size = cls.ENTRY_SIZE
        slots = length // size

        def relative_offset_is_zero(slot: int) -> bool:
            data = os.pread(fd, 4, slot * size + cls.REL_OFFSET_POS)
            # A short read means the file shrank under us: that slot is gone too.
            return len(data) < 4 or _INT32.unpack(data)[0] == 0

        lo, hi = 1, max(slots, 1)
        while lo < hi:
            mid = (lo + hi) // 2
            if relative_offset_is_zero(mid):
                hi = mid
            else:
                lo = mid + 1
        count = min(lo, slots)
        if count == 1 and not any(os.pread(fd, size, 0)):
            count = 0
        return count

    # -- the file's handles --------------------------------------------------------

    @property
    def is_open(self) -> bool:
        """Whether the index holds its handles now (neither released nor closed)."""
        return self._buf is not None and not self._closed

    def release(self) -> None:
        """Unmap the index and close its descriptor until the next use opens it again.

        Nothing is written (the file is not trimmed): an owner releases the indexes of a
        segment it has not used lately, from any thread, while the writer leaves the
        segment alone (``LogSegment`` pins what it changes). Lookups under way finish on
        the mapping they hold. Idempotent; a closed index stays closed.
        """
        with self._handle_lock:
            if self._closed or self._buf is None:
                return
            self._buf = None
            fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def _mapped(self) -> mmap.mmap | bytes:
        """The mapping (b"" when nothing is mapped), the file opened again if released.

        Raises:
            ValueError: the index is closed.
            OSError: it cannot be opened again (out of descriptors, even after the
                owner shed some).
        """
        buf = self._buf
        if buf is not None:
            return buf
        return self._with_handles(self._reopened)

    def _reopened(self) -> mmap.mmap | bytes:
        # Under the lock: another thread may have opened it meanwhile.
        self._require_open()
        if self._buf is None:
            if self._writable:
                self._reopen_writable()
            else:
                self._reopen_read_only(fresh=False)
        buf = self._buf
        assert buf is not None
        return buf

    def _with_handles(self, action: Callable[[], _T]) -> _T:
        """``action()`` under the handle lock, tried once more after the owner shed
        other files if it ran out of descriptors; the owner is told when it opened the
        released file again (outside the lock: the owner's lock comes first)."""
        reopened = False

        def locked() -> _T:
            nonlocal reopened
            with self._handle_lock:
                released = self._buf is None
                result = action()
                reopened = reopened or (released and self._buf is not None and not self._closed)
                return result

        owner = self.owner
        result = retry_out_of_descriptors(locked, None if owner is None else owner.shed_handles)
        if reopened and owner is not None:
            owner.handles_opened()
        return result

    def _reopen_writable(self) -> None:
        """Map a released writable index again: its entry count is the writer's own."""
        try:
            fd = os.open(self._path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            # Deleted by hand while released. The entries went with it (a hint); an
            # index with no room makes the log roll rather than write a file it lost.
            logger.warning("index %s was deleted while released: treating it as full", self._path)
            self._set_handles(b"", 0)
            return
        try:
            length = os.fstat(fd).st_size
            buf = mmap.mmap(fd, length, access=mmap.ACCESS_WRITE) if length else b""
        finally:
            os.close(fd)
        self._set_handles(buf, length)

    def _set_handles(self, buf: mmap.mmap | bytes, length: int) -> None:
        self._length = length
        self._max_entries = length // self.ENTRY_SIZE
        self._entries = min(self._entries, self._max_entries)
        self._populated = min(self._populated, length // _PAGE * _PAGE)
        self._entries_changed(buf)
        self._buf = buf

    def _reopen_read_only(self, *, fresh: bool) -> None:
        """Open a released (or missing) read-only index again; ``fresh``: take the
        file's valid prefix now (``refresh``), else at most the view it had."""
        most = None if fresh else self._entries
        try:
            self._fd = os.open(self._path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            self._entries = 0
            self._entries_changed(b"")
            self._buf = b""
            return
        try:
            self._map_valid_prefix(most)
        except BaseException:
            os.close(self._fd)
            self._fd = -1
            raise
        self._entries_changed(self._mapped())

    def reserve(self, entries: int) -> None:
        """Allocate now the pages the next ``entries`` appends would write (as far as
        the file goes), so that they cannot fail for want of a block.

        The log calls it before it writes an append's bytes: on a full disk the append
        then fails whole with ``ENOSPC``, before anything is written, instead of being
        acknowledged with its index entries left out (a sparse index stays correct,
        but no longer what a rebuild, or Kafka, makes of the same log).

        Raises:
            OSError: ``ENOSPC``: the file system has no block for such a page.
            ReadOnlyLogError: the index is read-only.
            ValueError: the index is closed.

        Runtime complexity: O(1); one ``madvise`` when a new page is needed.
        """
        self._ensure_allocated(min(self._entries + entries, self._max_entries) * self.ENTRY_SIZE)

    def _ensure_allocated(self, end: int) -> None:
        """Fault in writable the pages of the mapping up to byte ``end`` before an entry
        is written there (see "Full disk" in the class doc). Callers take the mapping
        only after this returned.

        The mapping is bound to no name here, nor in the callers when this raises: an
        error's traceback keeps the locals of its frames, and a mapping it kept alive
        would keep the blocks the kernel did reserve for the part of a page it faulted
        in, even once the file is closed and unlinked (a topic create that fails so
        must have them back before its undo writes the metadata file).

        Raises:
            OSError: ``ENOSPC``: the file system has no block for such a page.
            ReadOnlyLogError: the index is read-only.
            ValueError: the index is closed.
        """
        global _populate_write
        start = self._populated
        if end <= start or not _populate_write:
            return
        stop = -(-end // _PAGE) * _PAGE
        try:
            self._writable_map().madvise(_MADV_POPULATE_WRITE, start, stop - start)
        except OSError as exc:
            if exc.errno == errno.EINVAL:
                _populate_write = False  # a kernel before 5.14: stores fault as before
                return
            # The kernel says EFAULT ("Bad address") where a store would have faulted:
            # what the user needs to read is the file system's reason.
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self._path)) from exc
        self._populated = stop

    # -- abstract, entry-format specific -------------------------------------------

    @abc.abstractmethod
    def sanity_check(self) -> None:
        """Detect obvious corruption, as Kafka's ``sanityCheck`` does.

        Raises:
            CorruptIndexError: the file fails the check; rebuild it from the log.
        """

    def _check_sanity(self, last_offset: int) -> None:
        """The checks Kafka's indexes share: whole entries only, and (with entries) a
        last offset at or above the base offset.

        Raises:
            CorruptIndexError: the index fails them; rebuild it from the log.
        """
        if self._length % self.ENTRY_SIZE:
            raise CorruptIndexError(
                self._path,
                f"found {self._length} bytes, which is not a multiple of {self.ENTRY_SIZE}",
            )
        if self._entries and last_offset < self._base_offset:
            raise CorruptIndexError(
                self._path,
                f"non-zero size but the last offset is {last_offset}, "
                f"less than the base offset {self._base_offset}",
            )

    def truncate_to(self, offset: int) -> None:
        """Remove every entry whose offset is >= ``offset`` (zeroing their slots).

        Truncating to an offset above every entry has no effect. Offsets never
        decrease within an index, so this keeps the entries with offset
        <= ``offset - 1``: Kafka's result, and exact even where a time index repeats
        an offset.

        Raises:
            ReadOnlyLogError: the index is read-only.
            ValueError: the index is closed.

        Runtime complexity: O(log n + removed entries).
        """
        self._require_writable()
        relative = offset - 1 - self._base_offset
        keep = self._largest_lower_bound_slot(relative, _INT32, self.REL_OFFSET_POS) + 1
        self._truncate_to_entries(keep)

    @abc.abstractmethod
    def _entries_changed(self, buf: mmap.mmap | bytes) -> None:
        """Reload the cached last entry from ``buf`` (the mapping) after the entry count
        or the mapping changed."""

    @abc.abstractmethod
    def _check(self) -> None:
        """Assert every invariant (tests call it after each mutation)."""

    # -- properties ----------------------------------------------------------------

    @property
    def path(self) -> Path:
        """The file backing this index (follows ``rename_to``)."""
        return self._path

    @property
    def base_offset(self) -> int:
        """The base offset of the segment: relative offsets count from it."""
        return self._base_offset

    @property
    def max_index_size(self) -> int:
        """The preallocation size in bytes (``segment.index.bytes``)."""
        return self._max_index_size

    @property
    def writable(self) -> bool:
        """Whether this instance may change the file."""
        return self._writable

    @property
    def closed(self) -> bool:
        """Whether ``close`` or ``close_handler`` was called."""
        return self._closed

    @property
    def entries(self) -> int:
        """The number of valid entries."""
        return self._entries

    @property
    def max_entries(self) -> int:
        """How many entries the file can hold at its current size."""
        return self._max_entries

    @property
    def is_full(self) -> bool:
        """True iff no slot is free for an append."""
        return self._entries >= self._max_entries

    @property
    def length(self) -> int:
        """The file size in bytes, as last seen (preallocation included)."""
        return self._length

    @property
    def size_in_bytes(self) -> int:
        """The bytes used by entries: ``entries * ENTRY_SIZE``."""
        return self._entries * self.ENTRY_SIZE

    def can_append_offset(self, offset: int) -> bool:
        """True iff ``offset`` fits a relative offset: ``0 <= offset - base <= 2**31 - 1``."""
        return 0 <= offset - self._base_offset <= INT32_MAX

    def _require_relative_offset(self, offset: int) -> int:
        """``offset - base_offset``, checked to fit the int32 every entry stores.

        Raises:
            InvalidOffsetError: it does not fit.
        """
        if not self.can_append_offset(offset):
            raise InvalidOffsetError(
                f"offset {offset} does not fit a relative offset to base offset "
                f"{self._base_offset} in {self._path}"
            )
        return offset - self._base_offset

    def _free_slot(self) -> int:
        """The slot an append writes: the entry count, checked to be below the capacity.

        Raises:
            ReadOnlyLogError: the index is read-only.
            ValueError: the index is closed.
            IndexFullError: every slot is used.
        """
        self._require_writable()
        n = self._entries
        if n >= self._max_entries:
            raise IndexFullError(self._path, n)
        return n

    # -- file life cycle -------------------------------------------------------------

    def resize(self, new_size: int) -> bool:
        """Set the file and mapping to ``new_size`` rounded down to whole entries.

        Used to trim (``trim_to_valid_size``) and to regrow a trimmed index when its
        segment becomes active again. Growing zero-fills, keeping "prefix, then zeros".
        Only growing an index that has no mapping (released, or of 0 bytes) opens a
        descriptor (see "Descriptors" in the class doc).

        Returns:
            Whether the size changed.

        Raises:
            ReadOnlyLogError: the index is read-only.
            ValueError: the new size would cut off entries (use ``truncate_to``).
            OSError: the file cannot be resized or remapped.
        """
        self._require_writable()
        return self._with_handles(lambda: self._resize(new_size))

    def _resize(self, new_size: int) -> bool:
        self._require_open()
        rounded = self._round_down(new_size)
        if rounded == self._length:
            return False
        if rounded < self.size_in_bytes:
            raise ValueError(
                f"resizing {self._path} to {rounded} bytes would drop entries "
                f"({self._entries} entries of {self.ENTRY_SIZE} bytes)"
            )
        buf = self._buf
        if not self._resize_without_descriptor(buf, rounded):
            self._resize_by_name(rounded)
        # The entries are the same (the cached last one too): only the room changed.
        self._length = rounded
        self._max_entries = rounded // self.ENTRY_SIZE
        self._populated = min(self._populated, rounded // _PAGE * _PAGE)
        return True

    def _resize_without_descriptor(self, buf: mmap.mmap | bytes | None, rounded: int) -> bool:
        """Resize through the mapping's own descriptor, or shrink by name; False when
        that cannot be done (no mapping to grow, the file gone, the mapping in use by
        a buffer export): the caller opens the file by name then."""
        if not os.path.exists(self._path):
            return False  # deleted under the writer: ``_open_to_resize`` writes it again
        if isinstance(buf, mmap.mmap) and rounded > 0:
            # ftruncate then mremap, both on the descriptor CPython's mmap keeps: a
            # lookup in another thread holds this same object and reads only slots
            # below the entry count, which every size keeps inside the mapping.
            try:
                buf.resize(rounded)
            except (BufferError, OSError):
                return False
            return True
        if rounded < self._length:
            # To 0 bytes (a mapping cannot be), or released: the file alone shrinks.
            os.truncate(self._path, rounded)
            if rounded == 0 and buf is not None:
                self._buf = b""
            return True
        return False

    def _resize_by_name(self, rounded: int) -> None:
        # The new mapping replaces the old one in a single store, so a concurrent lookup
        # sees one or the other, never a missing buffer (see ``_unmap``). Growing, the
        # file grows before it is mapped; shrinking, it shrinks after: no mapping of
        # this index is ever touched past EOF (a SIGBUS).
        fd = self._open_to_resize(rounded)
        try:
            if rounded > self._length:
                os.ftruncate(fd, rounded)
            self._buf = mmap.mmap(fd, rounded, access=mmap.ACCESS_WRITE) if rounded else b""
            if rounded < self._length:
                os.ftruncate(fd, rounded)
        finally:
            os.close(fd)

    def _open_to_resize(self, size: int) -> int:
        # By name: a writable index keeps no descriptor (see the class docstring), and
        # its name is current, since only this writer renames it.
        try:
            return os.open(self._path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            pass
        # Deleted under the writer (by hand or by a tool). The mapping still holds the
        # entries: write them to a new file of the new size, so that the index on disk
        # stays whole and the remapping below finds the file at least that long. A
        # released index has no mapping left: its entries went with the file.
        logger.warning("index %s was deleted while open: writing it again", self._path)
        buf = self._buf
        if buf is None and self._entries:
            self._entries = 0
            self._entries_changed(b"")
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            if buf is not None:
                os.pwrite(fd, buf[: self.size_in_bytes], 0)
            os.ftruncate(fd, size)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def trim_to_valid_size(self) -> None:
        """Cut the file to its entries, dropping the zero-filled preallocation.

        Raises:
            ReadOnlyLogError: the index is read-only.
            OSError: the file cannot be resized.
        """
        self.resize(self.size_in_bytes)

    def refresh(self) -> bool:
        """Re-read the file size and entry count (read-only indexes).

        A reader calls it to see entries a writer (maybe in another process) appended,
        or to notice a truncation. The descriptor follows the inode, so a rename or an
        unlink by the writer changes nothing here (a released index opens the file
        again by name). A writable index is its own authority: refreshing it is a no-op.

        Returns:
            Whether the entry count or the file size changed.

        Raises:
            OSError: the file cannot be read or mapped.
            ValueError: the index is closed.

        Runtime complexity: O(log n) ``pread`` calls and at most one ``mmap``.
        """
        self._require_open()
        if self._writable:
            return False
        return self._with_handles(self._refresh)

    def _refresh(self) -> bool:
        self._require_open()
        before = (self._entries, self._length)
        if self._fd < 0:
            if self._buf is not None:
                before = (0, 0)  # the file was missing
            self._reopen_read_only(fresh=True)
        else:
            self._map_valid_prefix()
            self._entries_changed(self._mapped())
        return (self._entries, self._length) != before

    def flush(self) -> None:
        """Write dirty pages of the mapping to disk (``msync``); no-op when read-only.

        A released index has no mapping to flush: it was released sealed (trimmed, its
        pages written back by the kernel); the log flushes its ``.log`` first anyway:
        an index is rebuildable, the log is not.
        """
        buf = self._buf
        if self._writable and isinstance(buf, mmap.mmap):
            buf.flush()

    def close(self) -> None:
        """Trim (when writable, as Kafka does on close), then unmap and close the file.

        Idempotent.

        Raises:
            OSError: trimming failed; the handles are released regardless.
        """
        if self._closed:
            return
        try:
            if self._writable:
                self.trim_to_valid_size()
        finally:
            self.close_handler()

    def close_handler(self) -> None:
        """Unmap and close the file without trimming it (e.g. after a rename to .deleted),
        for good: the index never opens the file again. Idempotent.
        """
        with self._handle_lock:
            self._unmap()
            fd, self._fd = self._fd, -1
            self._closed = True
        if fd >= 0:
            os.close(fd)

    def delete_if_exists(self) -> bool:
        """Close the handles, then delete the file.

        Returns:
            True if this call deleted the file, False if it did not exist.

        Raises:
            OSError: the file exists but cannot be deleted.
        """
        self.close_handler()
        try:
            self._path.unlink()
        except FileNotFoundError:
            return False
        return True

    def rename_to(self, path: Path) -> None:
        """Rename the file (atomically, replacing ``path``); the mapping stays valid.

        ``path`` is adopted even if the rename fails, as Kafka does, so that a retried
        deletion looks for the file where it was meant to be. Durability of the rename
        (an fsync of the directory) is the caller's business.

        Raises:
            OSError: the rename failed (``FileNotFoundError`` if the file is gone).
        """
        with self._handle_lock:
            try:
                os.replace(self._path, path)
            finally:
                self._path = Path(path)

    def reset(self) -> None:
        """Remove every entry and regrow the file to ``max_index_size``.

        Raises:
            ReadOnlyLogError: the index is read-only.
            OSError: the file cannot be resized.
        """
        self._truncate_to_entries(0)
        self.resize(self._max_index_size)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        mode = "rw" if self._writable else "r"
        return (
            f"{type(self).__name__}({str(self._path)!r}, base_offset={self._base_offset}, "
            f"entries={self._entries}, max_entries={self._max_entries}, mode={mode!r}"
            f"{', closed' if self._closed else ''})"
        )

    # -- helpers for subclasses ------------------------------------------------------

    def _unmap(self) -> None:
        # Dropped, not closed: a reader thread in the middle of a lookup may hold this
        # mapping; it stays valid until the last reference goes (CPython unmaps then).
        # Readers only touch slots below an entry count they read, which every trim
        # keeps inside the file, so the old mapping never touches a page past EOF.
        self._buf = b""

    def _require_open(self) -> None:
        if self._closed:
            raise ValueError(f"I/O operation on closed index {self._path}")

    def _require_writable(self) -> None:
        self._require_open()
        if not self._writable:
            raise ReadOnlyLogError(f"index {self._path} is open read-only")

    def _writable_map(self) -> mmap.mmap:
        """The mapping, for a write into a slot the caller checked is below ``max_entries``."""
        self._require_writable()
        buf = self._mapped()
        if not isinstance(buf, mmap.mmap):  # only a 0-byte file has no mapping
            raise IndexFullError(self._path, self._entries)
        return buf

    def _floor_entry(
        self, target: int, field: struct.Struct, pos: int, entry: struct.Struct
    ) -> tuple[int, ...] | None:
        """The entry (unpacked with ``entry``) of ``_largest_lower_bound_slot``, or None.

        Slot and entry come from one buffer, so a lookup that races a remap or a close
        in another thread reads one consistent mapping.

        Runtime complexity: O(log n).
        """
        buf = self._mapped()
        slot = self._largest_lower_bound_slot(target, field, pos, buf)
        if slot < 0:
            return None
        found: tuple[int, ...] = entry.unpack_from(buf, slot * self.ENTRY_SIZE)
        return found

    def _largest_lower_bound_slot(
        self, target: int, field: struct.Struct, pos: int, buf: mmap.mmap | bytes | None = None
    ) -> int:
        """The last slot whose field (``field`` at byte ``pos`` of the entry) is <= target.

        Returns -1 when the index is empty or every entry's field is larger. The field
        must be non-decreasing over the entries. ``buf`` is the mapping to search
        (default: the current one).

        Runtime complexity: O(log n).
        """
        if buf is None:
            buf = self._mapped()
        size = self.ENTRY_SIZE
        # Bounded by the buffer taken: a close or remap by another thread between the
        # two reads can only make this lookup answer "no entry" (a safe hint).
        n = min(self._entries, len(buf) // size)
        if n == 0:
            return -1
        unpack = field.unpack_from
        lo, hi = 0, n - 1
        first_hot = max(0, n - 1 - self._warm_entries)
        if unpack(buf, first_hot * size + pos)[0] <= target:
            lo = first_hot
        elif unpack(buf, pos)[0] > target:
            return -1
        else:
            hi = first_hot - 1
        while lo < hi:
            mid = (lo + hi + 1) >> 1
            if unpack(buf, mid * size + pos)[0] <= target:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _truncate_to_entries(self, entries: int) -> None:
        """Drop the entries from slot ``entries`` on, zeroing their bytes.

        Zeroing keeps the file "valid prefix, then zeros", so that a reopen after a
        crash (or a reader's ``refresh``) stops at the new end instead of reviving the
        removed entries. A crash mid-way leaves a shorter, still conservative prefix.

        Runtime complexity: O(removed entries).
        """
        self._require_writable()
        entries = max(0, min(entries, self._entries))
        if entries == self._entries:
            return
        start, end = entries * self.ENTRY_SIZE, self.size_in_bytes
        buf = self._writable_map()
        buf[start:end] = bytes(end - start)
        self._entries = entries
        self._entries_changed(buf)

    def _check_common(self) -> None:
        """The format-independent invariants, for the subclasses' ``_check``."""
        size = self.ENTRY_SIZE
        assert 0 <= self._entries <= self._max_entries, (self._entries, self._max_entries)
        assert self._max_entries == self._length // size
        assert self._populated % _PAGE == 0
        buf = self._buf
        if self._closed:
            assert self._fd == -1
            assert buf == b""
            return
        if buf is None:  # released
            assert self._fd == -1
            if self._writable and os.path.exists(self._path):
                assert os.path.getsize(self._path) == self._length
            return
        assert len(buf) >= self._entries * size
        if self._writable:
            assert self._fd == -1, "a writable index keeps no descriptor of its own"
            assert len(buf) == self._length, (len(buf), self._length)
            assert self._length % size == 0
            # Through the mapping only where its pages have blocks: a page of a full
            # tmpfs that has none cannot even be read through a shared mapping (the
            # fault would allocate it: SIGBUS). Past them, the file's data, not its holes.
            start = self._entries * size
            populated = max(self._populated, start)
            tail = buf[start:populated]
            assert tail.count(0) == len(tail), "bytes after the last entry are not zero"
            if populated < self._length and os.path.exists(self._path):
                assert _zeros_in_file(self._path, populated, self._length), (
                    "bytes after the last entry are not zero"
                )
        else:
            assert len(buf) == self._entries * size
        if self._fd >= 0:
            assert os.fstat(self._fd).st_size >= self._entries * size


def _zeros_in_file(path: Path, start: int, end: int) -> bool:
    """Whether bytes ``start`` to ``end`` of the file are all zero, reading only its
    data (``SEEK_DATA``), never its holes (for ``_check``)."""
    with open(path, "rb") as file:
        fd = file.fileno()
        position = start
        while position < end:
            try:
                data = os.lseek(fd, position, os.SEEK_DATA)
            except OSError as exc:
                if exc.errno == errno.ENXIO:
                    return True  # only a hole to the end of the file
                raise
            if data >= end:
                return True
            hole = min(os.lseek(fd, data, os.SEEK_HOLE), end)
            chunk = os.pread(fd, hole - data, data)
            if chunk.count(0) != len(chunk):
                return False
            position = hole
    return True

"""The proposed fixes of the defects the harness found, applied by monkeypatching.

The defects live in files other engineers are editing (``log.py``, ``log_loader.py``),
so the fixes are described in the report and simulated here, to show that they remove
every violation the strict model finds; once they are in the engine, this is a no-op
in effect (a second directory fsync).

- D1, *segment files whose names never become durable*: on a file system that needs
  an fsync of the directory to make a new name durable (POSIX; ext4 commits it with
  the file's own fsync), a segment created by a roll, by a new partition, or the
  tail recovery deletes or cuts, may vanish with everything a ``flush`` made durable
  in it. Fix: ``Log.roll`` fsyncs the partition directory after fsyncing the sealed
  segment; ``Log.flush`` fsyncs it when a segment it flushed is at or after the
  recovery point it started from (a segment created since, the first one of a new
  partition included: Kafka's ``LocalLog.flush``).
- D2, *retention's renames reaching the disk out of order*: ``Log._delete_segments``
  renames several segments to ``.deleted`` with no directory fsync in between, so a
  power cut may keep a later rename and lose an earlier one: the older segment
  comes back after a hole of missing offsets. Fix: fsync the partition directory
  after each segment's renames, oldest first, so the deleted segments are always a
  prefix.
- D3, *a roll that creates the new segment before the sealed one is durable* (the
  roll being reworked in the working tree creates the new segment's files, then
  fsyncs the active ``.log``): a power cut in between may keep the new, empty segment
  and lose the sealed one's unflushed tail; recovery cuts nothing (the lost batch is
  simply absent), keeps the empty segment, and the log ends past a hole. Fix: fsync
  the active ``.log`` before ``LogSegment.create`` of the new one (a failure of the
  create then leaves the active segment as it was, only fsynced).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from unittest import mock

from storage.atomic_file import fsync_directory
from storage.log.file_names import DELETED_FILE_SUFFIX
from storage.log.log import Log
from storage.log.segment import LogSegment

__all__ = ["proposed_fixes"]


@contextlib.contextmanager
def proposed_fixes(*, d1: bool = True, d2: bool = True, d3: bool = True) -> Iterator[None]:
    """Run the engine with the fixes of D1, D2 and D3 (see the module doc)."""
    original_flush = Log.flush
    original_roll = Log.roll
    original_suffixes = LogSegment.change_file_suffixes

    def flush(self: Log) -> None:
        start = self.recovery_point
        flushed = self.segments.values(start) if self.writable and not self.closed else []
        original_flush(self)
        if any(segment.base_offset >= start for segment in flushed):
            fsync_directory(self.dir)

    def roll(self: Log) -> LogSegment:
        sealed = self.active_segment
        if d3 and self.writable and not self.closed and sealed.base_offset != self.log_end_offset:
            sealed.log.flush()  # before the new segment's files exist
        segment = original_roll(self)
        if d1 and segment is not sealed:
            fsync_directory(self.dir)
        return segment

    def change_file_suffixes(self: LogSegment, old_suffix: str, new_suffix: str) -> None:
        original_suffixes(self, old_suffix, new_suffix)
        if new_suffix == DELETED_FILE_SUFFIX:
            fsync_directory(self.path.parent)

    with contextlib.ExitStack() as stack:
        if d1:
            stack.enter_context(mock.patch.object(Log, "flush", flush))
        if d1 or d3:
            stack.enter_context(mock.patch.object(Log, "roll", roll))
        if d2:
            stack.enter_context(
                mock.patch.object(LogSegment, "change_file_suffixes", change_file_suffixes)
            )
        yield

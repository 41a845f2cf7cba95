"""Opening a partition log from its directory, with crash recovery (Kafka's ``LogLoader``).

Writable open, in order:

1. Remove ``.deleted`` and ``.cleaned`` files (retention and the cleaner only create
   them once the data is unreachable or not yet committed) and index ``.swap`` files;
   complete each ``.log.swap`` (a cleaned segment whose rename to ``.swap`` was the
   cleaner's commit point): drop the segments it replaces, rename it into place.
2. Open every segment; rebuild indexes that are missing or fail the sanity check.
3. After an unclean shutdown, re-validate every segment from the one holding the
   recovery point, batch by batch; truncate at the first partial or invalid batch and
   delete all later segments (their data cannot be trusted to follow on).
4. Make room in the active segment's indexes; derive the log end offset.

A read-only open changes no file: stale temporaries are ignored, indexes that need a
rebuild are rebuilt in a private scratch directory, and an invalid tail is hidden from
readers instead of truncated.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from pathlib import Path

from .clock import Clock
from .errors import CorruptIndexError, StorageError
from .file_names import (
    CLEANED_FILE_SUFFIX,
    DELETED_FILE_SUFFIX,
    INDEX_FILE_SUFFIX,
    LOG_FILE_SUFFIX,
    SWAP_FILE_SUFFIX,
    TIME_INDEX_FILE_SUFFIX,
    log_file,
    offset_from_file_name,
    offset_index_file,
    time_index_file,
)
from .file_records import FileRecords
from .log import Log
from .log_config import LogConfig
from .log_segments import LogSegments
from .offset_index import OffsetIndex
from .segment import LogSegment
from .time_index import TimeIndex

logger = logging.getLogger(__name__)

_LOG_SWAP = LOG_FILE_SUFFIX + SWAP_FILE_SUFFIX


def load_log(
    directory: Path,
    config: LogConfig,
    *,
    log_start_offset: int,
    recovery_point: int,
    had_clean_shutdown: bool,
    clock: Clock,
    writable: bool,
) -> Log:
    """Open the log in ``directory`` (see the module doc for the steps).

    Raises:
        StorageError: a read-only open of a directory that does not exist.
        OSError: the directory cannot be read or written.
    """
    if writable:
        directory.mkdir(parents=True, exist_ok=True)
        _remove_temporary_files(directory)
        _complete_swaps(directory)
        _remove_orphan_indexes(directory)
    elif not directory.is_dir():
        raise StorageError(f"log directory {directory} does not exist")
    now = clock.milliseconds()
    segments = LogSegments()
    scratch: list[Path] = []
    for base_offset in _segment_base_offsets(directory):
        segment = _open_segment(directory, base_offset, config, now, writable, scratch)
        segments.add(segment)

    if not had_clean_shutdown:
        _recover_from(segments, recovery_point, config, writable, scratch)

    if len(segments) == 0:
        start = max(log_start_offset, 0)
        if writable:
            segments.add(LogSegment.open(directory, start, config, now))
        else:
            segments.add(_empty_scratch_segment(start, config, now, scratch))
    active = segments.last_segment
    assert active is not None
    if writable:
        active.offset_index.resize(config.segment_index_bytes)
        active.time_index.resize(config.segment_index_bytes)
    next_offset = active.read_next_offset()
    first = segments.first_segment
    assert first is not None
    log_start_offset = min(max(log_start_offset, first.base_offset), next_offset)
    if had_clean_shutdown:
        recovery_point = min(recovery_point, next_offset)
    else:
        # Everything left was re-validated (or lies below the old recovery point).
        if writable:
            for segment in segments.values(recovery_point):
                segment.flush()
        recovery_point = next_offset
    log = Log(
        directory,
        config,
        segments,
        log_start_offset=log_start_offset,
        recovery_point=recovery_point,
        next_offset=next_offset,
        clock=clock,
        writable=writable,
    )
    log._scratch_dirs = scratch
    return log


def _segment_base_offsets(directory: Path) -> list[int]:
    offsets = []
    for name in os.listdir(directory):
        if name.endswith(LOG_FILE_SUFFIX):
            offset = offset_from_file_name(name)
            if offset is not None:
                offsets.append(offset)
    return sorted(offsets)


def _remove_temporary_files(directory: Path) -> None:
    for name in os.listdir(directory):
        if name.endswith((DELETED_FILE_SUFFIX, CLEANED_FILE_SUFFIX)) or (
            name.endswith(SWAP_FILE_SUFFIX) and not name.endswith(_LOG_SWAP)
        ):
            logger.info("%s: removing leftover %s", directory.name, name)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(directory / name)


def _complete_swaps(directory: Path) -> None:
    for name in sorted(os.listdir(directory)):
        if not name.endswith(_LOG_SWAP):
            continue
        base_offset = offset_from_file_name(name)
        if base_offset is None:
            continue
        swap = directory / name
        records = FileRecords(swap, writable=False)
        try:
            next_offset = base_offset
            for batch in records.batches():
                next_offset = batch.next_offset
        finally:
            records.close()
        # The order is important: the replaced segments go first, then the swap file
        # takes its final name. A crash in between leaves the .swap, and this runs again.
        for replaced in _segment_base_offsets(directory):
            if base_offset <= replaced < next_offset:
                for path in (
                    log_file(directory, replaced),
                    offset_index_file(directory, replaced),
                    time_index_file(directory, replaced),
                ):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)
        os.rename(swap, log_file(directory, base_offset))
        logger.info("%s: completed swap of segment %d", directory.name, base_offset)


def _remove_orphan_indexes(directory: Path) -> None:
    logs = set(_segment_base_offsets(directory))
    for name in os.listdir(directory):
        if name.endswith((INDEX_FILE_SUFFIX, TIME_INDEX_FILE_SUFFIX)):
            offset = offset_from_file_name(name)
            if offset is not None and offset not in logs:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(directory / name)


def _open_segment(
    directory: Path,
    base_offset: int,
    config: LogConfig,
    now: int,
    writable: bool,
    scratch: list[Path],
) -> LogSegment:
    index_missing = not (
        offset_index_file(directory, base_offset).exists()
        and time_index_file(directory, base_offset).exists()
    )
    segment = LogSegment.open(directory, base_offset, config, now, writable=writable)
    rebuild = index_missing and segment.size > 0
    if not rebuild:
        try:
            segment.sanity_check()
            if not segment.indexes_plausible():
                raise CorruptIndexError(segment.offset_index.path, "disagrees with the log")
        except CorruptIndexError as exc:
            logger.warning("%s: %s; rebuilding", directory.name, exc)
            rebuild = True
    if rebuild:
        if not writable:
            _use_scratch_indexes(segment, config, scratch)
        segment.recover()
    return segment


def _recover_from(
    segments: LogSegments,
    recovery_point: int,
    config: LogConfig,
    writable: bool,
    scratch: list[Path],
) -> None:
    for segment in segments.values():
        following = segments.higher_segment(segment.base_offset)
        if following is not None and following.base_offset <= recovery_point:
            continue  # flushed before the crash: trusted, as Kafka trusts it
        # A reader keeps the on-disk indexes (they passed the checks on open, and a
        # writer never indexes a batch it has not written): it only needs to know
        # where the valid data ends.
        truncated = segment.recover(rebuild_indexes=writable)
        if truncated > 0:
            logger.warning(
                "%s: truncated %d invalid bytes at the end of segment %d",
                segment.path.parent.name,
                truncated,
                segment.base_offset,
            )
            for later in segments.values():
                if later.base_offset > segment.base_offset:
                    segments.remove(later.base_offset)
                    if writable:
                        later.delete_if_exists()
                    else:
                        later.close_handlers()
            return


def _scratch_dir(scratch: list[Path]) -> Path:
    if not scratch:
        scratch.append(Path(tempfile.mkdtemp(prefix="seglog-index-")))
    return scratch[0]


def _use_scratch_indexes(segment: LogSegment, config: LogConfig, scratch: list[Path]) -> None:
    # A read-only log never writes its directory: rebuilt indexes live in a private
    # temporary directory, removed when the log closes.
    directory = _scratch_dir(scratch) / segment.path.parent.name
    directory.mkdir(exist_ok=True)
    if segment.offset_index.writable:
        return
    segment.offset_index.close_handler()
    segment.time_index.close_handler()
    base = segment.base_offset
    segment.offset_index = OffsetIndex(
        offset_index_file(directory, base), base, config.segment_index_bytes, writable=True
    )
    segment.time_index = TimeIndex(
        time_index_file(directory, base), base, config.segment_index_bytes, writable=True
    )


def _empty_scratch_segment(
    base_offset: int, config: LogConfig, now: int, scratch: list[Path]
) -> LogSegment:
    return LogSegment.open(_scratch_dir(scratch), base_offset, config, now)


def refresh_read_only_log(log: Log) -> None:
    """Bring a read-only log up to date with the writer's files.

    Segments that appeared are opened, those renamed away by retention are closed, the
    newest segments' indexes and sizes are re-read (indexes first, so no entry ever
    points past the size this reader trusts), and the offsets re-derived.
    """
    directory = log.dir
    now = log.clock.milliseconds()
    try:
        on_disk = set(_segment_base_offsets(directory))
    except FileNotFoundError:
        return  # the topic was deleted; keep serving what we had
    scratch: list[Path] = log._scratch_dirs
    if on_disk:
        # Drop segments retention renamed away, and the stand-in empty segment a
        # reader uses before the writer's first segment exists.
        for segment in log.segments.values():
            if segment.base_offset not in on_disk or segment.path.parent != directory:
                log.segments.remove(segment.base_offset)
                segment.close_handlers()
    known = set(log.segments.base_offsets())
    previous_active = log.segments.last_segment
    for base_offset in sorted(on_disk - known):
        try:
            log.segments.add(_open_segment(directory, base_offset, log.config, now, False, scratch))
        except FileNotFoundError:
            continue  # deleted between listdir and open
    refresh_from = previous_active.base_offset if previous_active is not None else 0
    for segment in log.segments.values(refresh_from):
        if not segment.offset_index.writable:
            segment.offset_index.refresh()
            segment.time_index.refresh()
        segment.log.refresh_size()
        segment._max_timestamp_and_offset = None
    active = log.active_segment
    log._next_offset = active.read_next_offset()
    first = log.segments.first_segment
    if first is not None:
        log.log_start_offset = max(log.log_start_offset, first.base_offset)

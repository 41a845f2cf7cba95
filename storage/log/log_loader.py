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
4. Settle each segment's extension units (see ``_load_extensions``).
5. Make room in the active segment's indexes; derive the log end offset.

A read-only open changes no file: stale temporaries are ignored, indexes that need a
rebuild are rebuilt in a private scratch directory, and an invalid tail is hidden from
readers instead of truncated.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ..clock import Clock
from ..errors import CorruptCheckpointError, CorruptIndexError, StorageError
from ..record.file_records import FileRecords
from .checkpoint import read_extension_start_checkpoint
from .extension_index import ExtensionIndex, ExtensionIndexSpec
from .file_names import (
    CLEANED_FILE_SUFFIX,
    DELETED_FILE_SUFFIX,
    INDEX_FILE_SUFFIX,
    LOG_FILE_SUFFIX,
    SWAP_FILE_SUFFIX,
    TIME_INDEX_FILE_SUFFIX,
    extension_index_file,
    log_file,
    offset_from_file_name,
    offset_index_file,
    time_index_file,
)
from .log_config import LogConfig
from .log_segments import LogSegments
from .offset_index import OffsetIndex
from .segment import LogSegment
from .time_index import TimeIndex

logger = logging.getLogger(__name__)

_LOG_SWAP = LOG_FILE_SUFFIX + SWAP_FILE_SUFFIX


@dataclass
class LoadedLog:
    """What ``load_log`` found: the state a ``Log`` is built from."""

    segments: LogSegments
    log_start_offset: int
    recovery_point: int
    next_offset: int
    scratch_dirs: list[Path] = field(default_factory=list)


def load_log(
    directory: Path,
    config: LogConfig,
    *,
    log_start_offset: int,
    recovery_point: int,
    had_clean_shutdown: bool,
    clock: Clock,
    writable: bool,
    extension: ExtensionIndexSpec | None = None,
) -> LoadedLog:
    """Load the log in ``directory`` (see the module doc for the steps).

    Offsets are never handed out twice: when what survives recovery ends below the
    checkpointed ``log_start_offset`` (the tail that a ``DeleteRecords`` or retention
    had moved past was lost), every segment is deleted and the log restarts at the log
    start offset, as Kafka's loader does.

    Raises:
        StorageError: a read-only open of a directory that does not exist.
        OSError: the directory cannot be read or written.
    """
    if writable:
        directory.mkdir(parents=True, exist_ok=True)
        _remove_temporary_files(directory)
        _complete_swaps(directory)
        _remove_orphan_indexes(directory, extension)
    elif not directory.is_dir():
        raise StorageError(f"log directory {directory} does not exist")
    now = clock.milliseconds()
    segments = LogSegments()
    scratch: list[Path] = []
    # Segments whose extension index file did not exist: their start is unknown (an
    # index created empty now would read as "starts at 0").
    extension_missing: set[int] = set()
    opened: list[LogSegment] = []
    for base_offset in _segment_base_offsets(directory):
        if extension is not None and not (
            extension_index_file(directory, base_offset, extension.suffix).exists()
        ):
            extension_missing.add(base_offset)
        opened.append(
            _open_segment(directory, base_offset, config, now, writable, scratch, extension)
        )
    segments.add_all(opened)

    if not had_clean_shutdown:
        _recover_from(segments, recovery_point, writable)

    last = segments.last_segment
    if writable and last is not None and last.read_next_offset() < log_start_offset:
        logger.warning(
            "%s: the log ends at offset %d, below its log start offset %d: deleting its "
            "segments and restarting it at the log start offset",
            directory.name,
            last.read_next_offset(),
            log_start_offset,
        )
        for segment in segments.remove_all(segments.base_offsets()):
            segment.delete_if_exists()

    if len(segments) == 0:
        start = max(log_start_offset, 0)
        if writable:
            segments.add(LogSegment.open(directory, start, config, now, extension_spec=extension))
        else:
            segments.add(_empty_scratch_segment(start, config, now, scratch, extension))
    if extension is not None:
        checkpoint = _extension_start_checkpoint(directory / extension.start_checkpoint_name)
        _load_extensions(
            segments.values(), config, writable, scratch, extension_missing, checkpoint
        )
    active = segments.last_segment
    assert active is not None
    if writable:
        for index in active.indexes():
            index.resize(config.segment_index_bytes)
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
    return LoadedLog(segments, log_start_offset, recovery_point, next_offset, scratch)


def _extension_start_checkpoint(path: Path) -> tuple[int, int] | None:
    # A hint like the indexes: a corrupt one is ignored (the log still opens), and the
    # next retention or close replaces it.
    try:
        return read_extension_start_checkpoint(path)
    except CorruptCheckpointError as exc:
        logger.warning("%s: ignoring %s", path.parent.name, exc)
        return None


def _load_extensions(
    segments: list[LogSegment],
    config: LogConfig,
    writable: bool,
    scratch: list[Path],
    missing: set[int],
    checkpoint: tuple[int, int] | None,
) -> None:
    # Each segment's extension index must start where the previous one ends; one that
    # is missing, corrupt or out of step is rebuilt from its log (in scratch space for
    # a reader), starting at the previous segment's end. The oldest segment has no
    # previous one: see ``_oldest_extension_start``.
    expected = _oldest_extension_start(segments, missing, checkpoint)
    for segment in segments:
        extension = segment.extension
        if extension is None:
            return
        if not segment.load_extension(expected):
            logger.warning(
                "%s: rebuilding extension index %s", segment.path.parent.name, extension.path
            )
            if not writable:
                _use_scratch_extension(segment, config, scratch)
            start = expected if expected is not None else max(extension.first_units, 0)
            segment.rebuild_extension(start)
        else:
            segment.write_extension_entry0()
        expected = segment.extension_end


def _oldest_extension_start(
    segments: list[LogSegment], missing: set[int], checkpoint: tuple[int, int] | None
) -> int | None:
    """The units at the start of the oldest segment, or None to trust its own index.

    The units before the oldest retained segment went with the segments retention
    deleted, so its log alone cannot say where it starts. In order of trust: the
    extension-start checkpoint when it names this segment (written by retention before
    the segments go, and on close); the segment's own index when its file existed;
    else the first later segment that the checkpoint names or whose index file existed
    with an entry 0, minus the units the segments before it measure (Kafka keeps its
    log start offset the same way: durable state, not a scan). None when nothing is
    left (a log that never lost a segment starts at 0, which is what its index says).

    Cost: ``measure`` of every batch of the segments before that later one (only when
    the oldest segment's index file was missing).
    """
    if not segments:
        return None
    if checkpoint is not None and checkpoint[0] == segments[0].base_offset:
        return checkpoint[1]
    if segments[0].base_offset not in missing:
        return None
    for k, segment in enumerate(segments[1:], start=1):
        if checkpoint is not None and checkpoint[0] == segment.base_offset:
            anchor = checkpoint[1]
        elif segment.extension is not None and segment.base_offset not in missing:
            anchor = segment.extension.first_units
            if anchor < 0:
                continue  # no entry 0 (it reads as none when it is (base, 0))
        else:
            continue
        spec = segment.extension_spec
        assert spec is not None
        before = sum(spec.measure(batch) for older in segments[:k] for batch in older.batches())
        if before > anchor:
            logger.warning(
                "%s: the extension index of segment %d starts at %d, below the %d units "
                "of the segments before it; rebuilding from 0",
                segment.path.parent.name,
                segment.base_offset,
                anchor,
                before,
            )
            return None
        return anchor - before
    return None


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


def _remove_orphan_indexes(directory: Path, extension: ExtensionIndexSpec | None) -> None:
    logs = set(_segment_base_offsets(directory))
    suffixes: tuple[str, ...] = (INDEX_FILE_SUFFIX, TIME_INDEX_FILE_SUFFIX)
    if extension is not None:
        suffixes += (extension.suffix,)
    for name in os.listdir(directory):
        if name.endswith(suffixes):
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
    extension: ExtensionIndexSpec | None,
) -> LogSegment:
    index_missing = not (
        offset_index_file(directory, base_offset).exists()
        and time_index_file(directory, base_offset).exists()
    )
    segment = LogSegment.open(
        directory, base_offset, config, now, writable=writable, extension_spec=extension
    )
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


def _recover_from(segments: LogSegments, recovery_point: int, writable: bool) -> None:
    for segment in segments.values():
        following = segments.higher_segment(segment.base_offset)
        if following is not None and following.base_offset <= recovery_point:
            continue  # flushed before the crash: trusted, as Kafka trusts it
        # A reader keeps the on-disk indexes (they passed the checks on open, and a
        # writer never indexes a batch it has not written): it only needs to know
        # where the valid data ends.
        truncated = segment.recover(rebuild_indexes=writable)
        if truncated > 0:
            if writable:
                logger.warning(
                    "%s: truncated %d invalid bytes at the end of segment %d",
                    segment.path.parent.name,
                    truncated,
                    segment.base_offset,
                )
            else:
                # A reader changes no file: it only reads up to the last valid batch.
                # Past it is usually a live writer's append caught half-written (the
                # reader's next refresh sees it whole), else a crashed writer's tail
                # that the writer's next recovery cuts: nothing to warn about here.
                logger.debug(
                    "%s: reading segment %d up to its last valid batch (%d bytes after it)",
                    segment.path.parent.name,
                    segment.base_offset,
                    truncated,
                )
            later = [s.base_offset for s in segments.values(segment.base_offset + 1)]
            for removed in segments.remove_all(o for o in later if o > segment.base_offset):
                if writable:
                    removed.delete_if_exists()
                else:
                    removed.close_handlers()
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


def _use_scratch_extension(segment: LogSegment, config: LogConfig, scratch: list[Path]) -> None:
    # As ``_use_scratch_indexes``, for the extension index alone.
    extension, spec = segment.extension, segment.extension_spec
    if extension is None or spec is None or extension.writable:
        return
    directory = _scratch_dir(scratch) / segment.path.parent.name
    directory.mkdir(exist_ok=True)
    extension.close_handler()
    base = segment.base_offset
    segment.extension = ExtensionIndex(
        extension_index_file(directory, base, spec.suffix),
        base,
        config.segment_index_bytes,
        writable=True,
    )


def _empty_scratch_segment(
    base_offset: int,
    config: LogConfig,
    now: int,
    scratch: list[Path],
    extension: ExtensionIndexSpec | None,
) -> LogSegment:
    directory = _scratch_dir(scratch)
    return LogSegment.open(directory, base_offset, config, now, extension_spec=extension)


def refresh_segments(
    directory: Path,
    segments: LogSegments,
    config: LogConfig,
    clock: Clock,
    scratch: list[Path],
    extension: ExtensionIndexSpec | None,
) -> int | None:
    """Bring a read-only log's segments up to date with the writer's files.

    Segments that appeared are opened, those renamed away by retention are closed, the
    newest segments' indexes and sizes are re-read (indexes first, so no entry ever
    points past the size this reader trusts). Returns the log end offset, or None when
    the directory is gone (the topic was deleted: the reader keeps what it had).
    """
    now = clock.milliseconds()
    try:
        on_disk = set(_segment_base_offsets(directory))
    except FileNotFoundError:
        return None
    if on_disk:
        # Drop segments retention renamed away, and the stand-in empty segment a
        # reader uses before the writer's first segment exists.
        for segment in segments.values():
            if segment.base_offset not in on_disk or segment.path.parent != directory:
                segments.remove(segment.base_offset)
                segment.close_handlers()
    known = set(segments.base_offsets())
    previous_active = segments.last_segment
    appeared: list[LogSegment] = []
    for base_offset in sorted(on_disk - known):
        try:
            appeared.append(
                _open_segment(directory, base_offset, config, now, False, scratch, extension)
            )
        except FileNotFoundError:
            continue  # deleted between listdir and open
    segments.add_all(appeared)
    refresh_from = previous_active.base_offset if previous_active is not None else 0
    refreshed = segments.values(refresh_from)
    for segment in refreshed:
        for index in segment.indexes():
            if not index.writable:
                index.refresh()
        segment.log.refresh_size()
        segment.forget_max_timestamp()
    if extension is not None:
        before = segments.lower_segment(refreshed[0].base_offset) if refreshed else None
        expected = None if before is None else before.extension_end
        for segment in refreshed:
            if not segment.load_extension(expected):
                _use_scratch_extension(segment, config, scratch)
                # The oldest segment keeps the start it was loaded with (its units
                # before it are not in any log).
                start = expected if expected is not None else segment.extension_start
                segment.rebuild_extension(start)
            expected = segment.extension_end
    active = segments.last_segment
    assert active is not None
    return active.read_next_offset()

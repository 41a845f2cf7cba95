"""One INFO line per partition saying what recovery did when a writable mount opens a
log directory after an unclean shutdown (a crash, ``SIGKILL``, power loss).

The engine recovers inside ``LogManager.open`` (Kafka's ``recoverLog``: every segment
from the one holding the partition's recovery point is re-validated batch by batch,
the log cut at the first partial or invalid batch, missing or implausible indexes
rebuilt) and logs only what went wrong, as WARNINGs naming the segment. An operator
remounting after a crash saw "mounted" and nothing else for the partitions that came
through, and no summary for the others. This module takes what is visible around the
open, without a second pass over the data:

- before it: whether ``.kafka_cleanshutdown`` exists (else the open recovers), the
  recovery-point checkpoint and the size of every segment file;
- during it: the engine loader's own log lines, counted per partition directory (the
  ones that say indexes were rebuilt);
- after it: the segment files left and each log's end offset.

So a line reads ``recovery of orders-0: re-validated 1 segment(s) from the recovery
point 120 (4,096 bytes, offsets 100..183) and rebuilt their indexes; cut 37 bytes at
the first invalid batch; the log ends at offset 184``.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from storage import Log, LogManager, StorageError
from storage.log.checkpoint import read_offset_checkpoint
from storage.log.file_names import (
    CLEAN_SHUTDOWN_FILE,
    RECOVERY_POINT_CHECKPOINT,
    parse_topic_partition_name,
)

__all__ = ["RecoveryReport"]

logger = logging.getLogger(__name__)

_LOG_SUFFIX = ".log"
_ENGINE_LOGGER = "storage"
# Wording of the engine loader's lines (storage/log/log_loader.py) that say it rebuilt
# a segment's indexes: "...; indexes rebuilt", "rebuilding extension index ...".
_REBUILT = ("indexes rebuilt", "rebuilding extension index")


def _segment_sizes(directory: Path) -> dict[int, int]:
    """``{base offset: bytes}`` of the ``.log`` files in a partition directory."""
    sizes: dict[int, int] = {}
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return sizes
    for entry in entries:
        stem, suffix = os.path.splitext(entry.name)
        if suffix != _LOG_SUFFIX or not stem.isdigit():
            continue
        try:
            sizes[int(stem)] = entry.stat().st_size
        except OSError:
            continue
    return sizes


class _Collector(logging.Handler):
    """Counts the engine's "indexes rebuilt" lines per partition directory name while
    the log directory opens (the lines still reach the daemon's log as before)."""

    def __init__(self, names: set[str]) -> None:
        super().__init__(logging.DEBUG)
        self.names = names
        self.rebuilt: dict[str, int] = {}

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record is the engine's to report, not ours
            return
        if not any(phrase in message for phrase in _REBUILT):
            return
        for part in message.replace(":", " ").split():
            name = Path(part).parent.name if part.endswith(_LOG_SUFFIX) else part
            if name in self.names:
                self.rebuilt[name] = self.rebuilt.get(name, 0) + 1
                return


@dataclass
class RecoveryReport:
    """What a writable open of ``log_dir`` will recover; ``log_lines`` after it.

    Use: ``report = RecoveryReport.before_open(log_dir)`` (``None`` after a clean
    shutdown: nothing is recovered), open the manager, ``report.log_lines(manager)``
    (also when the open failed: ``report.stop()``)."""

    log_dir: Path
    recovery_points: dict[tuple[str, int], int]
    sizes_before: dict[str, dict[int, int]]
    collector: _Collector
    _engine_logger: logging.Logger = field(repr=False)

    @classmethod
    def before_open(cls, log_dir: Path) -> RecoveryReport | None:
        """Start a report if opening ``log_dir`` for writing will recover it: it holds
        partitions and no clean-shutdown marker."""
        if (log_dir / CLEAN_SHUTDOWN_FILE).exists():
            return None
        sizes: dict[str, dict[int, int]] = {}
        try:
            names = os.listdir(log_dir)
        except OSError:
            return None  # a new or unreadable directory: the open says what it needs to
        for name in names:
            if parse_topic_partition_name(name) is not None and (log_dir / name).is_dir():
                sizes[name] = _segment_sizes(log_dir / name)
        if not sizes:
            return None
        try:
            points = read_offset_checkpoint(log_dir / RECOVERY_POINT_CHECKPOINT)
        except (OSError, StorageError):
            points = {}  # the engine then recovers every log from 0 and says so
        engine_logger = logging.getLogger(_ENGINE_LOGGER)
        collector = _Collector(set(sizes))
        engine_logger.addHandler(collector)
        return cls(log_dir, points, sizes, collector, engine_logger)

    def stop(self) -> None:
        """Stop collecting the engine's lines."""
        self._engine_logger.removeHandler(self.collector)

    def log_lines(self, manager: LogManager) -> None:
        """Log one INFO line per partition the open recovered, then stop collecting."""
        self.stop()
        logger.info(
            "recovered %s after an unclean shutdown (no %s)", self.log_dir, CLEAN_SHUTDOWN_FILE
        )
        for log in sorted(manager.logs(), key=lambda log: (log.topic, log.partition)):
            name = log.dir.name
            before = self.sizes_before.get(name)
            if before is None:
                continue  # created by this open (a topic's missing partition)
            point = self.recovery_points.get((log.topic, log.partition), 0)
            logger.info("recovery of %s: %s", name, self._summary(log.dir, before, point, log))

    def _summary(self, directory: Path, before: dict[int, int], point: int, log: Log) -> str:
        end = log.log_end_offset
        bases = sorted(before)
        # Kafka's recoverLog: from the segment holding the recovery point to the end,
        # each re-validated batch by batch and its indexes rebuilt on the way.
        checked = [
            base for i, base in enumerate(bases) if i + 1 == len(bases) or bases[i + 1] > point
        ]
        after = _segment_sizes(directory)
        parts = []
        if checked:
            first = checked[0]
            offsets = f"offsets {first}..{end - 1}" if end > first else "no records"
            parts.append(
                f"re-validated {len(checked)} segment(s) from the recovery point {point} "
                f"({sum(before[base] for base in checked):,} bytes, {offsets}) and rebuilt "
                "their indexes"
            )
        else:
            parts.append("no segment to re-validate")
        cut = sum(before.values()) - sum(after.get(base, 0) for base in before)
        gone = [base for base in before if base not in after]
        if cut > 0:
            dropped = f", deleting {len(gone)} later segment(s)" if gone else ""
            parts.append(f"cut {cut:,} bytes at the first invalid batch{dropped}")
        else:
            parts.append("cut nothing")
        more = self.collector.rebuilt.get(directory.name, 0)
        if more:
            parts.append(f"{more} more index rebuild(s) logged above")
        parts.append(f"the log ends at offset {end}")
        return "; ".join(parts)

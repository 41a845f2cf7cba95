"""Open each crash state as the engine would after a power cut, and check its promises.

For a state and the oracle's expectation at its cut, ``check_state``:

1. on the raw state (before anything opens it): every checkpointed recovery point
   lies within the valid batches of its partition (the loader trusts what is below
   it without re-validating: a recovery point past the data is a lie), and a
   clean-shutdown marker, which makes the loader skip recovery, is only present with
   a directory ``seglogfs verify`` finds clean;
2. read-only (on a copy): ``LogManager.open(read_only=True)`` opens, no file changes,
   and every log reads as step 3 requires; reads raise nothing but ``StorageError``s;
3. writable (recovery runs): ``LogManager.open`` succeeds; each topic that must exist
   does, with its partitions, and none that must not; each partition's records from
   its log start are contiguous, each the value appended at that offset by one
   incarnation that may be on disk, and include every durable record at or above
   the highest log start a call asked for; the log start is at least the durable one
   and the log end at least the durable end (no offset a reader saw durable is handed
   out again: an append gets the log end, and a flush and a clean close keep it); the
   checkpoints written by the open do not point past the data; after the close,
   ``seglogfs verify`` finds nothing.

A compacted partition (``cleanup.policy=compact``) may have gaps: its records from the
log start are in offset order below the log end, and an offset in between may be
absent only when a cleaning pass begun before the cut may have removed it
(``PartitionExpectation.removable``: a later record of its key below the pass's bound,
or a tombstone past its horizon), so the latest durable record of every key is there.
A partition with the position index has its durable end at the units it had when it
was appended (positions never move). After the writable open, a compacted log takes a
keyed record, rolls and is cleaned again: the pass must succeed, remove only what a
later record of its key (or an expired tombstone's horizon) allows, and keep the rest.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from seglogfs.cli.verify import verify_log_dir
from storage import CorruptRecordError, Log, LogManager, Record, StorageError, iter_batches
from storage.log.checkpoint import read_offset_checkpoint
from storage.log.file_names import (
    CLEAN_SHUTDOWN_FILE,
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    SEGLOG_TOPICS_FILE,
    parse_topic_partition_name,
)
from storage.log.topic import read_topics_file
from tests.conftest import ManualClock

from .crash_states import CrashState, state_files
from .workloads import Expectation, PartitionExpectation, TopicExpectation, extension_for

__all__ = ["Violation", "check_state"]


@dataclass(frozen=True)
class Violation:
    """A broken promise in one crash state."""

    workload: str
    model: str
    cut: int
    how: str
    what: str

    def __str__(self) -> str:
        return f"{self.workload} [{self.model}] cut {self.cut} ({self.how}): {self.what}"


def check_state(
    state: CrashState,
    expect: Expectation,
    workspace: Path,
    *,
    now_ms: int,
    workload: str = "",
) -> list[Violation]:
    """Check one state (see the module doc); ``workspace`` is a fresh directory."""
    problems: list[str] = []
    raw = workspace / "state"
    state.materialize(raw)
    problems += _check_raw(raw)
    copy = workspace / "read-only"
    shutil.copytree(raw, copy)
    problems += [f"read-only: {p}" for p in _check_read_only(copy, expect, now_ms)]
    problems += [f"writable: {p}" for p in _check_writable(raw, expect, now_ms)]
    return [Violation(workload, state.model.value, state.cut, state.how, p) for p in problems]


# -- the raw state -----------------------------------------------------------------------


def _segment_files(directory: Path) -> dict[int, Path]:
    """A partition directory's segment files by base offset, a committed cleaning swap
    (``.log.swap``) standing for the segments it covers (as the loader completes it)."""
    names = os.listdir(directory)
    files = {
        int(name[:20]): directory / name
        for name in names
        if name.endswith(".log") and len(name) == 24 and name[:20].isdigit()
    }
    for name in sorted(names):
        if name.endswith(".log.swap") and len(name) == 29 and name[:20].isdigit():
            base = int(name[:20])
            data = (directory / name).read_bytes()
            end = base
            with contextlib.suppress(CorruptRecordError):
                for batch in iter_batches(data):
                    end = batch.next_offset
            files = {b: path for b, path in files.items() if not base <= b < end}
            files[base] = directory / name
    return dict(sorted(files.items()))


def valid_end(directory: Path) -> int | None:
    """The offset after the last valid batch of a partition directory's contiguous
    valid prefix (batches with a good CRC, segment after segment); None: no segment."""
    files = _segment_files(directory)
    if not files:
        return None
    end = next(iter(files))
    for base, path in files.items():
        if base > end:
            break  # a gap: what follows is not part of the prefix
        data = path.read_bytes()
        consumed = 0
        try:
            for batch in iter_batches(data):
                if not batch.is_valid() or batch.last_offset < end:
                    return end
                end = batch.next_offset
                consumed = batch.position + batch.size
        except CorruptRecordError:
            return end  # an impossible header: the valid prefix ends before it
        if consumed != len(data):
            return end
    return end


def _check_raw(raw: Path) -> list[str]:
    problems: list[str] = []
    try:
        recovery_points = read_offset_checkpoint(raw / RECOVERY_POINT_CHECKPOINT)
        topics = read_topics_file(raw / SEGLOG_TOPICS_FILE)
    except StorageError as exc:
        return [f"raw: a checkpoint or the topics file does not parse: {exc}"]
    for (topic, partition), point in sorted(recovery_points.items()):
        directory = raw / f"{topic}-{partition}"
        if topic not in topics or not directory.is_dir():
            continue
        end = valid_end(directory)
        if end is not None and point > end:
            problems.append(
                f"raw: recovery-point checkpoint {topic}-{partition} {point} is past the valid "
                f"data (which ends at offset {end})"
            )
    if (raw / CLEAN_SHUTDOWN_FILE).exists():
        found = verify_log_dir(raw)
        problems += [f"raw: clean-shutdown marker present but verify: {p}" for p in found[:3]]
    return problems


# -- reading a recovered log ----------------------------------------------------------


def _check_log(log: Log, topic: TopicExpectation, partition: int) -> list[str]:
    """The records of one partition against the incarnations that may be on disk.

    A recovered log (or a reader's view of a crashed one) reads from its start to its
    end without an error: recovery owns the damaged tail. ``StorageError`` is the
    documented family, anything else is a second violation.
    """
    name = f"{log.topic}-{partition}"
    start, end = log.log_start_offset, log.log_end_offset
    try:
        read = list(log.records(start))
    except StorageError as exc:
        return [f"{name}: reading from the log start {start} raised {exc!r}"]
    except Exception as exc:
        return [f"{name}: reading raised an undocumented {exc!r}"]
    records = [(r.offset, r.value) for r in read]
    offsets = [offset for offset, _ in records]
    if log.config.compact:
        # Gaps may be legal (checked against the expectation below); order is not.
        if any(b <= a for a, b in itertools.pairwise(offsets)) or (
            offsets and (offsets[0] < start or offsets[-1] >= end)
        ):
            return [f"{name}: offsets out of order or outside [{start}, {end}): {offsets[:8]}..."]
    elif offsets != list(range(start, start + len(offsets))):
        return [f"{name}: offsets from the log start {start} are not contiguous: {offsets[:8]}..."]
    elif start + len(offsets) != end:
        return [f"{name}: records end at {start + len(offsets)}, the log end offset is {end}"]
    lookups = _check_lookups(log, name, [(r.offset, r.value, r.timestamp) for r in read])
    if lookups:
        return lookups
    # Which incarnation is this? The one whose values match (any, when empty).
    matches: list[int] = []
    for incarnation in topic.candidates:
        expect = topic.partitions.get((incarnation, partition))
        values = expect.values if expect is not None else {}
        if all(_holds(values, offset, value) for offset, value in records):
            matches.append(incarnation)
    if not matches:
        for offset, value in records:
            if not any(
                (e := topic.partitions.get((i, partition))) is not None
                and _holds(e.values, offset, value)
                for i in topic.candidates
            ):
                return [f"{name}: offset {offset} holds {value!r}, never appended there"]
        return [f"{name}: records of more than one incarnation"]
    problems: list[str] = []
    required = topic.must_exist
    if required is not None:
        if required not in matches:
            return [f"{name}: holds records of a deleted incarnation, not of {required}"]
        expect = topic.partitions.get((required, partition))
        if expect is not None:
            problems += _check_durable(name, start, end, expect)
            if log.config.compact:
                problems += _check_gaps(name, start, end, set(offsets), expect)
            if log.extension is not None:
                problems += _check_units(log, name, expect)
    return problems


def _check_units(log: Log, name: str, expect: PartitionExpectation) -> list[str]:
    """Positions never move: the durable end (an append's end) is at the units the
    position index had there when it was appended. (Past it nothing is promised: a
    power cut may take the records before it too, and their units with them.)"""
    target = expect.durable_end
    units = expect.units.get(target)
    start, end = log.log_start_offset, log.log_end_offset
    if units is None or not start <= target <= end:
        return []
    try:
        if target == end:
            at, got = target, log.extension_end
        else:
            at, got = log.extension_position(target)
    except StorageError as exc:
        return [f"{name}: the position of offset {target} raised {exc!r}"]
    if at == target and got != units:
        return [
            f"{name}: the durable end {target} is at {got} units of the position index, "
            f"not {units}: positions moved"
        ]
    return []


def _holds(values: dict[int, bytes | None], offset: int, value: bytes | None) -> bool:
    return offset in values and values[offset] == value


def _check_gaps(
    name: str, start: int, end: int, present: set[int], expect: PartitionExpectation
) -> list[str]:
    """Every offset of a compacted partition absent from ``[start, end)`` is one a
    cleaning pass may have removed."""
    missing = [o for o in range(start, end) if o not in present and not expect.removable(o)]
    if not missing:
        return []
    return [
        f"{name}: records absent that no cleaning pass may remove: offsets {_ranges(missing)} "
        f"(keys {[expect.keys.get(o) for o in missing[:4]]}; passes cleaned below "
        f"{expect.clean_limit}; durable below {expect.durable_end})"
    ]


def _check_lookups(log: Log, name: str, records: list[tuple[int, bytes | None, int]]) -> list[str]:
    """Reads that go through the (mapped, maybe torn) indexes agree with the scan:
    from offsets spread over the log (offset index), and by timestamp (time index)."""
    if not records:
        return []
    picks = sorted({records[(len(records) - 1) * i // 6] for i in range(7)})
    try:
        for offset, value, timestamp in picks:
            found = next(log.records(offset), None)
            if found is None or (found.offset, found.value) != (offset, value):
                got = None if found is None else found.offset
                return [f"{name}: a read from offset {offset} starts at {got}"]
            first = next(o for o, _v, ts in records if ts >= timestamp)
            answer = log.offset_for_timestamp(timestamp)
            if answer != first:
                return [f"{name}: offset_for_timestamp({timestamp}) is {answer}, not {first}"]
    except StorageError as exc:
        return [f"{name}: a lookup raised {exc!r}"]
    except Exception as exc:
        return [f"{name}: a lookup raised an undocumented {exc!r}"]
    return []


def _check_durable(name: str, start: int, end: int, expect: PartitionExpectation) -> list[str]:
    problems: list[str] = []
    floor = max(expect.start_moved, 0)
    if expect.durable_end > floor and (start > floor or end < expect.durable_end):
        lost = [o for o in range(floor, expect.durable_end) if not start <= o < end]
        problems.append(
            f"{name}: durable records lost: offsets {_ranges(lost)} (durable below "
            f"{expect.durable_end}, log start asked {expect.start_moved}; recovered "
            f"[{start}, {end}))"
        )
    if end < expect.durable_end:
        problems.append(
            f"{name}: log end offset {end} below the durable end {expect.durable_end}: "
            f"offsets a reader saw durable would be handed out again"
        )
    if start < expect.start_durable:
        problems.append(
            f"{name}: log start offset {start} below the checkpointed {expect.start_durable}"
        )
    return problems


def _ranges(offsets: list[int]) -> str:
    if not offsets:
        return "none"
    runs: list[str] = []
    first = last = offsets[0]
    for o in offsets[1:]:
        if o != last + 1:
            runs.append(f"{first}-{last}" if first != last else f"{first}")
            first = o
        last = o
    runs.append(f"{first}-{last}" if first != last else f"{first}")
    return ", ".join(runs)


def _check_topics(manager: LogManager, expect: Expectation) -> list[str]:
    problems: list[str] = []
    present = set(manager.topics())
    for name, topic in sorted(expect.topics.items()):
        if name not in present:
            if topic.must_exist is not None:
                problems.append(f"topic {name} (created, incarnation {topic.must_exist}) is gone")
            continue
        if not topic.candidates:
            problems.append(f"topic {name} was deleted but is back")
            continue
        count = manager.topic(name).partitions
        if topic.must_exist is not None and count != topic.candidates[topic.must_exist]:
            problems.append(f"topic {name} has {count} partitions, not {topic.candidates}")
            continue
        for p in range(count):
            try:
                log = manager.log(name, p)
            except StorageError as exc:
                if topic.must_exist is not None:
                    problems.append(f"{name}-{p}: cannot be opened: {exc!r}")
                continue
            problems += _check_log(log, topic, p)
    for name in sorted(present - set(expect.topics)):
        problems.append(f"topic {name} was never created")
    return problems


# -- opening ----------------------------------------------------------------------------


def _check_read_only(copy: Path, expect: Expectation, now_ms: int) -> list[str]:
    before = state_files(copy)
    try:
        manager = LogManager.open(
            copy, clock=ManualClock(now_ms), read_only=True, extension=extension_for
        )
    except Exception as exc:
        return [f"open raised {exc!r}"]
    try:
        problems = _check_topics(manager, expect)
    finally:
        manager.close()
    if state_files(copy) != before:
        problems.append("a read-only open changed files")
    return problems


def _check_writable(raw: Path, expect: Expectation, now_ms: int) -> list[str]:
    clock = ManualClock(now_ms)
    try:
        manager = LogManager.open(raw, clock=clock, extension=extension_for)
    except Exception as exc:
        return [f"open (recovery) raised {exc!r}"]
    problems: list[str] = []
    try:
        problems += _check_topics(manager, expect)
        ends = {(log.topic, log.partition): log.log_end_offset for log in manager.logs()}
        for name in (RECOVERY_POINT_CHECKPOINT, LOG_START_OFFSET_CHECKPOINT):
            for tp, offset in read_offset_checkpoint(raw / name).items():
                if tp in ends and offset > ends[tp]:
                    problems.append(f"after recovery {name} {tp} {offset} > log end {ends[tp]}")
        # No offset is handed out twice: the next append gets the log end offset, at or
        # past every durable one, and survives a flush and a clean close.
        appended: dict[tuple[str, int], int] = {}
        for log in manager.logs():
            end = log.log_end_offset
            keys = [b"after-recovery"] if log.config.compact else None
            info = log.append([b"after-recovery"], keys=keys)
            if info.first_offset != end:
                problems.append(f"{log.topic}-{log.partition}: append got {info.first_offset}")
            appended[(log.topic, log.partition)] = info.first_offset
            log.flush()
        problems += _clean_again(manager, clock.milliseconds())
    except Exception as exc:
        problems.append(f"raised {exc!r}")
    finally:
        with contextlib.suppress(Exception):
            manager.close()
    if problems:
        return problems
    found = verify_log_dir(raw)
    problems += [f"verify after recovery and a clean close: {p}" for p in found[:5]]
    try:
        with LogManager.open(raw, clock=clock, extension=extension_for) as again:
            for (topic, partition), offset in appended.items():
                last = list(again.log(topic, partition).records(offset))
                if [r.value for r in last] != [b"after-recovery"]:
                    problems.append(f"{topic}-{partition}: the record appended after recovery")
    except Exception as exc:
        problems.append(f"reopen after recovery raised {exc!r}")
    return problems


def _clean_again(manager: LogManager, now: int) -> list[str]:
    """Roll each recovered compacted log and clean it: the pass succeeds, and removes
    only records a later record of their key supersedes (or tombstones whose horizon
    may have passed), never the latest of a key."""
    compacted = [log for log in manager.logs() if log.config.compact]
    if not compacted:
        return []
    before: dict[tuple[str, int], list[Record]] = {}
    for log in compacted:
        before[(log.topic, log.partition)] = list(log.records(log.log_start_offset))
        log.roll()
    summary = manager.clean(sorted({log.topic for log in compacted}), force=True)
    problems = [f"cleaning after recovery skipped {t}-{p}: {why}" for t, p, why in summary.skipped]
    for log in compacted:
        name = f"{log.topic}-{log.partition}"
        old = before[(log.topic, log.partition)]
        try:
            new = {r.offset: r for r in log.records(log.log_start_offset)}
        except StorageError as exc:
            problems.append(f"{name}: reading after cleaning again raised {exc!r}")
            continue
        old_offsets = {r.offset: r for r in old}
        extra = [o for o in new if o not in old_offsets or new[o].value != old_offsets[o].value]
        if extra:
            problems.append(f"{name}: cleaning again made records {extra[:5]} appear or change")
        latest = {r.key: r.offset for r in old}
        expiry = now - log.config.delete_retention_ms
        for r in old:
            if r.offset in new:
                continue
            if latest[r.key] != r.offset:
                continue  # a later record of its key supersedes it
            if r.value is None and r.timestamp <= expiry:
                continue  # a tombstone whose horizon may have passed
            problems.append(f"{name}: cleaning again removed {r.key!r}'s latest, {r.offset}")
            break
    return problems


def partition_dirs(root: Path) -> list[Path]:
    """Partition directories of a log directory (for tests)."""
    return sorted(
        root / name
        for name in os.listdir(root)
        if parse_topic_partition_name(name) is not None and (root / name).is_dir()
    )

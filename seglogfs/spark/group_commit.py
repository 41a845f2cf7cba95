"""A streaming query's progress committed to a consumer group (``commitOffsets``).

Spark's checkpoint stays the truth, as with Spark's Kafka source: a restarted query
resumes from its checkpoint, never from the group. The commit is for people and tools
that watch the group (``seglogfs groups describe`` shows the pipeline's lag, a
``P@group=`` view of the mount resumes where it got to). So it is best effort: a commit
that cannot be made (the writer lock is held by a process without a control socket, a
member of the group is reading the partition, the daemon is busy) logs one WARNING and
the query goes on; the next micro-batch's commit carries the newer offsets anyway.

Where the commit goes: to the daemon owning the log directory, through its control
socket (the daemon's store, which its mount and consumers share); without a daemon, to
the directory itself, taking the writer lock for the moment of the append.

Runs in the driver's planner process (``SeglogStreamReader.commit``), one call per
finished micro-batch.
"""

from __future__ import annotations

import logging
from pathlib import Path

from storage import LogManager, OffsetStore, StorageError

from ..control import ControlError, daemon_socket, request
from .options import PartitionOffsets

__all__ = ["commit_progress"]

logger = logging.getLogger(__name__)


def commit_progress(log_dir: str, group: str, offsets: PartitionOffsets) -> bool:
    """Commit ``offsets`` (the next offset to read, per topic-partition) for ``group``;
    return whether they were committed (see the module: a failure is a WARNING).

    Cost: one control request, or a writable open of the directory (O(partitions)) and
    one append to the group's partition of ``__consumer_offsets``.
    """
    if not offsets:
        return True
    path = Path(log_dir)
    try:
        if daemon_socket(path) is not None:
            entries = [{"topic": t, "partition": p, "offset": o} for (t, p), o in offsets.items()]
            request(path, "commit_offsets", group=group, offsets=entries, member_id=None)
        else:
            with LogManager.open(path) as manager:
                OffsetStore.shared(manager).commit(group, dict(offsets))
    except (ControlError, StorageError, OSError) as exc:
        logger.warning("seglog: progress not committed to consumer group %r: %s", group, exc)
        return False
    return True

"""The soft limit on open descriptors, raised to the hard limit by the daemon and the CLI.

An open log holds descriptors per segment (the daemon 4: the ``.log`` and one mapping
per index; a read-only reader 5, see ``storage.log.index``), so the usual soft limit of a
login shell, 1024, ends a ``seglogfs mount`` or a ``seglogfs consume`` at a few hundred
segments with "Too many open files" (seen: ``consume`` of one topic in a log directory
of 4,000 segments). The hard limit is the administrator's (systemd's default 524288;
the unit sets ``LimitNOFILE``); the soft limit is a process's own to raise up to it,
which the JVM does at start for the same reason and Kafka's brokers rely on. The
engine's partition maximums (``max.topic.partitions``, ``max.broker.partitions``:
4,000 partitions, 16,000 descriptors for their active segments) keep what a directory
holds open at any time to a quarter of the unit's 65,536.

The soft limit of 1024 exists for programs that pass descriptors to ``select()``,
which cannot take numbers from 1024 up: these processes use ``epoll`` (trio) and
``poll`` (``subprocess``), and ``select()`` only on standard input (``seglogfs
produce``).
"""

from __future__ import annotations

import logging
import resource

__all__ = ["raise_open_files_limit"]

logger = logging.getLogger(__name__)


def raise_open_files_limit() -> int:
    """Raise this process's soft ``RLIMIT_NOFILE`` to its hard limit; the soft limit
    now in force.

    Never lowers it, and an unlimited hard limit (which the kernel refuses as a soft
    value above ``fs.nr_open``) leaves the soft limit as it is. A refusal is logged at
    DEBUG and changes nothing: the process runs with the limit it had.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft == resource.RLIM_INFINITY or soft >= hard:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (OSError, ValueError) as exc:
        logger.debug("open files limit stays %d (hard %d): %s", soft, hard, exc)
        return soft
    return hard

"""What the daemon's inodes and file handles denote: nodes, open files, file names.

A ``Node`` is what an inode number stands for (the root, a topic, a partition, a
topic's ``produce`` file, or a view ``P@<where>``); an ``OpenFile`` is the state of one
``open`` (shared by its duplicated descriptors). Topics, partitions and ``produce``
files are nodes by name (a topic created again under a deleted one's name has the same
inodes); what a file was opened on is the ``Log`` objects it keeps (``OpenFile.logs``,
and a view's ``Node.log``), which a deleted topic's successor never shares. Plain data:
thread-safety is the daemon's (each open file's requests run one at a time under its
``lock``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import trio

from storage import Log, StickyPartitioner

from .lines import LineBuffer
from .position_reader import PositionReader, Rendered

__all__ = [
    "BLOCK_SIZE",
    "PRODUCE_FILE",
    "ROOT_NODE",
    "XATTR_PREFIX",
    "Kind",
    "Node",
    "OpenFile",
    "partition_number",
]

PRODUCE_FILE = "produce"
XATTR_PREFIX = "user.seglog."
BLOCK_SIZE = 1 << 20
"""``st_blksize`` of partition files: ``cat``, ``dd`` and ``cp`` size their reads by it,
and one large read costs one request instead of eight."""


class Kind(enum.Enum):
    ROOT = "root"
    TOPIC = "topic"
    PARTITION = "partition"
    PRODUCE = "produce"
    VIEW = "view"


@dataclass(frozen=True, slots=True)
class Node:
    """What an inode denotes. A view also records the offset it starts at, that
    record's global byte position (fixed for ever, see ``seglogfs.positions``) and the
    ``Log`` both were resolved in (not part of the node's identity: the latest lookup
    of the name sets it, and an open of the view is of that log); a ``P@group=NAME``
    view, its group (``group_view``)."""

    kind: Kind
    topic: str = ""
    partition: int = -1
    view_offset: int = -1
    view_position: int = 0
    log: Log | None = field(default=None, compare=False, repr=False)
    group: str = ""  # a P@group=NAME view: the consumer group it reads for


ROOT_NODE = Node(Kind.ROOT)


class OpenFile:
    """The state of one open file (one ``open``, shared by its duplicated descriptors).

    ``logs`` are the partition logs it was opened on, by partition (one for a
    partition file or a view, every partition for ``produce``): each request checks
    they are still the topic's (``MountState._opened``), so a handle of a deleted
    topic never reads or writes a topic created under its name afterwards.
    ``origin`` is the global position of the file's byte 0, fixed at open (a file
    opened read-only starts at the oldest retained record); ``process`` the thread
    group id of the process that opened it (-1: not known), whose ``stat`` gets the
    size from ``origin``.
    """

    __slots__ = (
        "append",
        "closed",
        "fill",
        "lines",
        "lock",
        "logs",
        "node",
        "process",
        "reader",
        "slots",
        "stalled",
        "sticky",
        "writable",
    )

    def __init__(
        self,
        node: Node,
        logs: dict[int, Log],
        *,
        writable: bool,
        append: bool,
        readable: bool,
        origin: int = 0,
        process: int = -1,
    ) -> None:
        self.node = node
        self.logs = logs
        self.writable = writable
        self.append = append
        self.lock = trio.Lock()
        self.lines = LineBuffer()
        self.process = process
        self.reader = PositionReader(origin) if readable else None
        self.sticky: StickyPartitioner | None = None
        # Render slots this file streams through (none until it reads sequentially), the
        # fill outstanding for it (set() when it ends), and whether it was released.
        self.slots: list[int] = []
        self.fill: trio.Event | None = None
        self.closed = False
        # The kept bytes after which a fill brought nothing (a corrupt batch, a batch
        # still being written): not asked for again until the reader moves on.
        self.stalled: Rendered | None = None

    @property
    def origin(self) -> int:
        """The global position of the file's byte 0 (0 for a file opened write-only)."""
        return 0 if self.reader is None else self.reader.base


def partition_number(name: str) -> int | None:
    # "0", "17": a canonical decimal (no sign, no leading zero), as the directory lists it.
    if name.isascii() and name.isdigit() and (name == "0" or name[0] != "0") and len(name) < 11:
        return int(name)
    return None

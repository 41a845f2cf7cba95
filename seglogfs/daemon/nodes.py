"""What the daemon's inodes and file handles denote: nodes, open files, file names.

A ``Node`` is what an inode number stands for (the root, a topic, a partition, a
topic's ``produce`` file, or a view ``P@<where>``); an ``OpenFile`` is the state of one
``open`` (shared by its duplicated descriptors). Plain data: thread-safety is the
daemon's (each open file's requests run one at a time under its ``lock``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import trio

from storage import StickyPartitioner

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
    """What an inode denotes. A view also records the offset it starts at and that
    record's global byte position (fixed for ever, see ``seglogfs.positions``)."""

    kind: Kind
    topic: str = ""
    partition: int = -1
    view_offset: int = -1
    view_position: int = 0


ROOT_NODE = Node(Kind.ROOT)


class OpenFile:
    """The state of one open file (one ``open``, shared by its duplicated descriptors)."""

    __slots__ = (
        "append",
        "closed",
        "fill",
        "lines",
        "lock",
        "node",
        "reader",
        "slots",
        "stalled",
        "sticky",
        "writable",
    )

    def __init__(self, node: Node, *, writable: bool, append: bool, readable: bool) -> None:
        self.node = node
        self.writable = writable
        self.append = append
        self.lock = trio.Lock()
        self.lines = LineBuffer()
        base = node.view_position if node.kind is Kind.VIEW else 0
        self.reader = PositionReader(base) if readable else None
        self.sticky: StickyPartitioner | None = None
        # Render slots this file streams through (none until it reads sequentially), the
        # fill outstanding for it (set() when it ends), and whether it was released.
        self.slots: list[int] = []
        self.fill: trio.Event | None = None
        self.closed = False
        # The kept bytes after which a fill brought nothing (a corrupt batch, a batch
        # still being written): not asked for again until the reader moves on.
        self.stalled: Rendered | None = None


def partition_number(name: str) -> int | None:
    # "0", "17": a canonical decimal (no sign, no leading zero), as the directory lists it.
    if name.isascii() and name.isdigit() and (name == "0" or name[0] != "0") and len(name) < 11:
        return int(name)
    return None

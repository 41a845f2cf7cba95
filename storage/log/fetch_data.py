"""What a fetch read: stored batches to send as they lie in their segment files.

Kafka's ``UnifiedLog.read`` answers a fetch with a ``FileRecords`` slice that the
network layer sends with ``transferTo`` (``sendfile``): the bytes go from the page cache
to the socket without passing through the broker's heap. ``Log.fetch`` does the same:
it checks each batch (CRC, framing, offsets: as ``Log.batches``) and hands back where
the checked bytes lie, as ``FileRegion``s, each with a descriptor of its own so the
bytes stay readable after the call (retention may delete the file, compaction replace
it: an unlinked file lives while a descriptor is open, and its bytes do not change:
a segment's batches are never rewritten in place).

Runs of batches shorter than ``REGION_MIN_BYTES`` are kept as bytes instead: a
descriptor and a ``sendfile`` call cost more than copying a few kilobytes, and a fetch
of many small partitions should not hold a descriptor for each.

Cost: the bytes are read once to check them (``pread``, which also brings them into
the page cache for the send); memory held is bounded by ``REGION_MIN_BYTES`` per run
and the scan's read chunk, not by the fetch size.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

__all__ = ["REGION_MIN_BYTES", "FetchData", "FileRegion"]

REGION_MIN_BYTES: Final = 64 * 1024
"""A run of batches at least this long is sent from its file; a shorter one is copied."""


@dataclass
class FileRegion:
    """``size`` bytes at ``position`` of a segment file, readable through ``fd`` (owned:
    ``close`` it)."""

    fd: int
    position: int
    size: int
    path: Path

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)


@dataclass
class FetchData:
    """Stored batches in log order: ``bytes`` (runs copied) and ``FileRegion``s (runs to
    send from their files), ``size`` bytes in all. Close it once sent (or not sent)."""

    parts: list[bytes | FileRegion] = field(default_factory=list)
    size: int = 0

    def __len__(self) -> int:
        return self.size

    def to_bytes(self) -> bytes:
        """Every byte, read now (tests, and callers that want a copy)."""
        out = bytearray()
        for part in self.parts:
            if isinstance(part, FileRegion):
                out += os.pread(part.fd, part.size, part.position)
            else:
                out += part
        return bytes(out)

    def close(self) -> None:
        """Close every region's descriptor (idempotent)."""
        for part in self.parts:
            if isinstance(part, FileRegion):
                with contextlib.suppress(OSError):
                    part.close()

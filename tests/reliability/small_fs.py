"""A small real file system to fill: ext4 in an image on a loop device, else a tmpfs.

``small_file_system(where, size_mib)`` mounts one at ``where`` for the ``with`` block
and always takes it down again (``umount``, then ``losetup -d`` of the loop device it
attached). Loop devices missing (a container without ``/dev/loop-control``, no
``losetup`` or ``mkfs.ext4``): a tmpfs of the same size instead. Neither possible (not
root): ``pytest.skip`` naming why.

The ext4 is made with 1-KiB blocks, what ``mkfs.ext4`` picks by itself for a file system
this small: a block is then smaller than a page, so a page of a mapped index file can be
partly allocated (its blocks past the end the file had when it was trimmed are holes),
the case a 4-KiB-block file system never shows. ``-m 0``: no blocks reserved for root
(the daemon runs as root here, and the ballast should take every block it can).

``fill()`` grows a ballast file until the file system refuses another byte; ``leave(n)``
gives ``n`` bytes of it back; ``free()`` removes it. Nothing else writes to the file
system, so "the next write needing a block fails" holds until ``leave`` or ``free``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

__all__ = ["SmallFileSystem", "small_file_system"]

BALLAST = ".ballast"


@dataclass
class SmallFileSystem:
    """A mounted small file system (see the module)."""

    path: Path
    kind: str  # "ext4" or "tmpfs"
    block_size: int

    @property
    def ballast(self) -> Path:
        return self.path / BALLAST

    def fill(self) -> None:
        """Grow the ballast until no byte more fits (then every write that needs a new
        block fails with ``ENOSPC``). Its blocks are allocated (``fallocate``), not
        written: filling takes milliseconds, not a write of the whole disk."""
        fd = os.open(self.ballast, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        try:
            chunk = 1 << 24
            while chunk:
                try:
                    os.posix_fallocate(fd, os.fstat(fd).st_size, chunk)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    chunk //= 2
            # Blocks the allocations left (an extent tree's, a delayed allocation's)
            # are taken by writing: nothing may be left for the next write.
            chunk = self.block_size
            while chunk:
                try:
                    os.write(fd, bytes(chunk))
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    chunk //= 2
            os.fsync(fd)
        finally:
            os.close(fd)

    def leave(self, nbytes: int) -> None:
        """Give ``nbytes`` of the ballast back (whole blocks: round up)."""
        size = self.ballast.stat().st_size
        os.truncate(self.ballast, max(0, size - nbytes))
        self.sync()

    def free(self) -> None:
        """Remove the ballast."""
        self.ballast.unlink(missing_ok=True)
        self.sync()

    def sync(self) -> None:
        # ext4 reuses the blocks a transaction freed once it commits (a write that
        # finds none forces the commit itself): fsync of the directory commits now.
        fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def available(self) -> int:
        """Bytes a write may still take (``statvfs``'s ``f_bavail``)."""
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize

    def clear(self) -> None:
        """Remove everything on it (the ballast too)."""
        for entry in os.listdir(self.path):
            target = self.path / entry
            if entry == "lost+found":
                continue
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            else:
                target.unlink()
        self.sync()


def _run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, check=False)


def _loop_devices_missing() -> str | None:
    """Why an ext4 on a loop device cannot be made here, or None."""
    if not os.path.exists("/dev/loop-control"):
        return "/dev/loop-control is missing"
    for tool in ("losetup", "mkfs.ext4"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return None


@contextlib.contextmanager
def _ext4(where: Path, image: Path, size_mib: int) -> Iterator[SmallFileSystem | str]:
    made = _run("truncate", "-s", f"{size_mib}M", str(image))
    if made.returncode:
        yield f"truncate: {made.stderr.strip()}"
        return
    made = _run("mkfs.ext4", "-F", "-q", "-b", "1024", "-m", "0", "-E", "nodiscard", str(image))
    if made.returncode:
        yield f"mkfs.ext4: {made.stderr.strip()}"
        return
    attached = _run("losetup", "--find", "--show", str(image))
    if attached.returncode:
        yield f"losetup: {attached.stderr.strip()}"
        return
    device = attached.stdout.strip()
    try:
        mounted = _run("mount", "-t", "ext4", device, str(where))
        if mounted.returncode:
            yield f"mount {device}: {mounted.stderr.strip()}"
            return
        try:
            yield SmallFileSystem(where, "ext4", 1024)
        finally:
            if _run("umount", str(where)).returncode:
                _run("umount", "-l", str(where))
    finally:
        _run("losetup", "-d", device)


@contextlib.contextmanager
def _tmpfs(where: Path, size_mib: int) -> Iterator[SmallFileSystem | str]:
    mounted = _run("mount", "-t", "tmpfs", "-o", f"size={size_mib}m,mode=0755", "tmpfs", str(where))
    if mounted.returncode:
        yield f"mount -t tmpfs: {mounted.stderr.strip()}"
        return
    try:
        yield SmallFileSystem(where, "tmpfs", os.statvfs(where).f_frsize)
    finally:
        if _run("umount", str(where)).returncode:
            _run("umount", "-l", str(where))


@contextlib.contextmanager
def small_file_system(
    scratch: Path, size_mib: int, *, tmpfs: bool = False
) -> Iterator[SmallFileSystem]:
    """Mount a file system of ``size_mib`` MiB at ``scratch / "fs"`` for the block
    (its image in ``scratch`` too): ext4 on a loop device, else (or with ``tmpfs``) a
    tmpfs; skip the test when none can be made here."""
    if os.geteuid() != 0:
        pytest.skip("making and mounting a small file system needs root")
    where = scratch / "fs"
    where.mkdir()
    why = "a tmpfs was asked for" if tmpfs else _loop_devices_missing()
    with contextlib.ExitStack() as stack:
        if why is None:
            made = stack.enter_context(_ext4(where, scratch / "ext4.img", size_mib))
            if isinstance(made, SmallFileSystem):
                yield made
                return
            why = made
        made = stack.enter_context(_tmpfs(where, size_mib))
        if isinstance(made, SmallFileSystem):
            yield made
            return
        pytest.skip(f"no small file system to fill: no ext4 on a loop device ({why}), {made}")

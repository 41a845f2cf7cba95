"""The one-writer-per-log-directory lock, which only the directory's writers can take.

Kafka locks a log directory with ``FileChannel.tryLock`` on its ``.lock`` file, opened
for reading and writing: an ``fcntl`` write lock, which needs a descriptor open for
writing. The lock here is of that kind, an open-file-description lock (Linux's
``F_OFD_SETLK`` with ``F_WRLCK``) on the whole of ``.seglog.lock``, a file of mode 0600:

- only a process that may write the file can take it, and one at a time (also two
  ``LogDirLock`` in one process);
- it belongs to the open file description, not to the process: unlike Kafka's POSIX
  record lock it is not dropped when some other descriptor of the file is closed in
  the same process, and it dies with the process (no stale lock after a crash; the
  descriptor is close-on-exec, so children started with exec never hold it);
- readers never take a lock.

Older versions took an exclusive ``flock``, which a read-only descriptor can take
too: with the file 0644 under a umask of 022, any local user could keep every writer
out (``flock -x -n LOGDIR/.seglog.lock sleep 20``). Two things follow from them:

- A writer also takes the ``flock``, so that an older seglogfs, which knows only that,
  keeps out while this one writes (and ``seglogfs verify``, which reads
  ``/proc/locks``, sees a writer). A ``flock`` held by someone else stops the writer
  only when its holder could be a writer, that is root or the file's owner (an older
  seglogfs, found in ``/proc/locks``); another user's is ignored.
- A lock file others may read (an older version's 0644, or one a ``chmod`` opened up)
  is replaced once this writer holds it: a fresh 0600 file, locked both ways, is
  renamed over the name, so a descriptor another user opened on the old file locks
  nothing that matters, ever. Such a descriptor can take a *read* lock, which blocks a
  write lock; writers never take one, so when a read lock is what refuses the write
  lock, the ``flock`` (which every writer holds too) decides who replaces the file.
  Only if another user holds both on an old file is the writer refused, with a
  warning naming the file to remove.

Linux only (``F_OFD_SETLK``, ``/proc``), as the rest of seglogfs.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import secrets
import struct
from pathlib import Path

from ..errors import LogDirLockedError
from .file_names import SEGLOG_LOCK_FILE

logger = logging.getLogger(__name__)

_MODE = 0o600
_OTHERS = 0o077
# The lock file may be replaced between a contender's open and its lock: it then opens
# the new one (held by the writer that put it there), so two rounds settle it.
_ATTEMPTS = 3
# struct flock of 64-bit Linux: l_type, l_whence, l_start, l_len, l_pid, padding.
_FLOCK = struct.Struct("@hhqqi4x")
_REFUSED = (errno.EAGAIN, errno.EACCES)


def _ofd_write_lock(fd: int) -> bool:
    """Take an OFD write lock on the whole file: whether it was granted."""
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0))
    except OSError as exc:
        if exc.errno in _REFUSED:
            return False
        raise
    return True


def _ofd_conflict(fd: int) -> int:
    """The type of the lock that keeps a write lock from ``fd`` (``F_RDLCK`` or
    ``F_WRLCK``, of any kind: OFD, POSIX), ``F_UNLCK`` when none does now."""
    query = _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
    answer = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, query)
    lock_type: int = _FLOCK.unpack(answer)[0]
    return lock_type


def _flock(fd: int) -> bool:
    """Take an exclusive ``flock`` without waiting: whether it was granted."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _could_be_a_writer(st: os.stat_result) -> bool:
    """Whether a ``flock`` someone holds on the file ``st`` may be a writer's: any is,
    on a file only its owner can open; else one whose holder (``/proc/locks``) runs as
    root or as the owner, or cannot be identified."""
    if not st.st_mode & _OTHERS:
        return True
    try:
        locks = Path("/proc/locks").read_text()
    except OSError:
        return True
    inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in locks.splitlines():
        # "1: FLOCK  ADVISORY  WRITE 4242 08:01:1234 0 EOF"; waiters have "->" and
        # hold nothing.
        fields = line.split()
        if len(fields) > 5 and fields[1] == "FLOCK" and fields[5] == inode:
            uid = _effective_uid(fields[4])
            if uid is None or uid in (0, st.st_uid):
                return True
    return False


def _effective_uid(pid: str) -> int | None:
    # From status, not from the owner of /proc/PID: a process that made itself
    # undumpable shows as root's there.
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[2])
    return None


class LogDirLock:
    """Holds the writer lock of one log directory until ``release()``. Not thread-safe."""

    def __init__(self, log_dir: Path) -> None:
        self.path = log_dir / SEGLOG_LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock without waiting, creating the lock file (0600) when missing.

        Raises:
            LogDirLockedError: a writer holds it (another process, another
                ``LogDirLock``, an older seglogfs), or other users' locks on a lock
                file an older version left readable keep it (logged as a warning).
            OSError: the lock file cannot be opened for writing or replaced.
        """
        for _ in range(_ATTEMPTS):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, _MODE)
            kept: int | None = None
            try:
                kept = self._locked(fd)
            finally:
                if kept != fd:
                    os.close(fd)
            if kept is None:
                continue  # the name moved to another file meanwhile: lock that one
            try:
                # The holder's pid helps an operator; the lock is not this text.
                os.ftruncate(kept, 0)
                os.write(kept, f"{os.getpid()}\n".encode())
            except BaseException:
                os.close(kept)
                raise
            self._fd = kept
            return
        raise LogDirLockedError(self.path.parent)

    def _locked(self, fd: int) -> int | None:
        """Lock the file ``fd`` has open: the descriptor to keep (``fd`` or one of a
        fresh file now under the name), or None when the name no longer names that
        file (try again). Never closes ``fd``.

        Raises:
            LogDirLockedError: as ``acquire``.
        """
        st = os.fstat(fd)
        written = _ofd_write_lock(fd)
        if not written and _ofd_conflict(fd) == fcntl.F_WRLCK:
            raise LogDirLockedError(self.path.parent)  # a writer of this version
        flocked = _flock(fd)
        if not flocked and _could_be_a_writer(st):
            raise LogDirLockedError(self.path.parent)  # an older seglogfs
        if not (written or flocked):
            logger.warning(
                "%s (mode %o) is locked by another user's process; if no seglogfs "
                "writes %s, remove the file to take the writer lock",
                self.path,
                st.st_mode & 0o7777,
                self.path.parent,
            )
            raise LogDirLockedError(self.path.parent)
        try:
            if not os.path.samestat(st, os.stat(self.path)):
                return None
        except FileNotFoundError:
            return None
        if written and flocked and not st.st_mode & _OTHERS:
            return fd
        return self._replacement()

    def _replacement(self) -> int:
        """A fresh lock file, mode 0600 and locked both ways, renamed over the name.

        The order is important: the caller holds the old file's write lock or its
        ``flock`` until the rename is done, so a contender that locks the old file
        afterwards finds the name moved (``_locked`` returns None) and tries the new
        one, which is held. A crash in between leaves a ``.seglog.lock.<hex>.tmp`` that
        nothing reads.
        """
        temporary = self.path.with_name(f"{self.path.name}.{secrets.token_hex(8)}.tmp")
        fd = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, _MODE)
        try:
            os.fchmod(fd, _MODE)  # exactly 0600: a umask such as 0277 would take more
            if not (_ofd_write_lock(fd) and _flock(fd)):  # nobody else knows the file
                raise LogDirLockedError(self.path.parent)
            os.rename(temporary, self.path)
        except BaseException:
            os.close(fd)
            temporary.unlink(missing_ok=True)
            raise
        logger.info("replaced %s by a file of mode 0600", self.path)
        return fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None

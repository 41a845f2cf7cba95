"""Shared: a mistake in how a log directory, a mount point or a config file was given,
named in one line before anything is opened or mounted.

Left to the first system call that fails, such a mistake is reported as whatever that
call says about some file beneath it: ``seglogfs mount FILE MNT`` said "File exists"
(from ``mkdir``), ``topics create -d MNT`` (the mount point where the log directory
belongs) said "Operation not permitted" about ``MNT/.seglog.lock``, and ``mount LOGDIR
MNT/logs`` mounted over its own log directory. The command line and the daemon run
these checks first; ``log_dir_error`` names what only the open itself can meet (no
permission, a read-only file system).

Every check reads ``/proc/self/mountinfo`` at most once and stats a few paths:
microseconds, once per command. A check is advice, not a lock: what changes between it
and the open is reported by the open's own error.
"""

from __future__ import annotations

import errno
import os
import pwd
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from storage import ConfigError, load_properties

__all__ = [
    "MountInfo",
    "SetupError",
    "check_apart",
    "check_fuse_device",
    "check_log_dir",
    "check_mount_point",
    "check_mount_point_empty",
    "config_file_error",
    "log_dir_error",
    "mount_at",
    "read_config_file",
    "seglogfs_mount_holding",
]

SEGLOGFS_TYPE = "fuse.seglogfs"
FUSE_DEVICE = "/dev/fuse"
_MOUNTINFO = "/proc/self/mountinfo"
_ESCAPE = re.compile(r"\\([0-7]{3})")


class SetupError(Exception):
    """A path or file given to seglogfs is not what it must be; the message names the
    mistake in one line. ``usage``: the command line itself is wrong (exit code 2),
    otherwise the machine's state is (exit code 1)."""

    def __init__(self, message: str, *, usage: bool = False) -> None:
        super().__init__(message)
        self.usage = usage


@dataclass(frozen=True)
class MountInfo:
    """One line of ``/proc/self/mountinfo``: where, what type, from what source."""

    mount_point: str
    fs_type: str
    source: str


def _mounts() -> list[MountInfo]:
    """Every mount this process sees, in mount order (a later one may cover an earlier
    one at the same place); empty without ``/proc``."""
    try:
        with open(_MOUNTINFO, encoding="utf-8", errors="surrogateescape") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        fields = line.split(" ")
        try:
            after = fields.index("-")
            found.append(
                MountInfo(_unescape(fields[4]), fields[after + 1], _unescape(fields[after + 2]))
            )
        except (ValueError, IndexError):
            continue
    return found


def _unescape(field: str) -> str:
    # The kernel writes space, tab, newline and backslash in a path as \040 and so on.
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def _real(path: Path) -> str:
    # Not strict: the path may not exist yet, or lie on a dead FUSE mount.
    return os.path.realpath(path)


def _is_within(path: str, directory: str) -> bool:
    """``path`` is ``directory`` or lies beneath it (both real, absolute paths)."""
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def mount_at(path: Path) -> MountInfo | None:
    """The mount whose mount point ``path`` is (the last one made there), or ``None``."""
    target = _real(path)
    found = None
    for mount in _mounts():
        if mount.mount_point == target:
            found = mount
    return found


def seglogfs_mount_holding(path: Path) -> MountInfo | None:
    """The seglogfs mount that ``path`` is or lies inside, or ``None``: the innermost
    mount holding ``path`` decides, so a log directory on a disk mounted inside a
    seglogfs mount (unlikely as that is) is not one."""
    target = _real(path)
    holding = None
    for mount in _mounts():
        if _is_within(target, mount.mount_point) and (
            holding is None or len(mount.mount_point) >= len(holding.mount_point)
        ):
            holding = mount
    return holding if holding is not None and holding.fs_type == SEGLOGFS_TYPE else None


def _first_non_directory(path: Path) -> Path | None:
    """The first existing component of ``path`` that is not a directory."""
    for part in [*reversed(path.parents), path]:
        try:
            if not stat.S_ISDIR(os.stat(part).st_mode):
                return part
        except OSError:
            return None
    return None


def check_log_dir(path: Path, *, must_exist: bool) -> None:
    """Refuse a log directory that cannot be one: a seglogfs mount point or a path
    inside one (the log directory it mounts is what was meant), something other than
    a directory, or, with ``must_exist``, nothing at all.

    Raises:
        SetupError: naming the mistake.
    """
    mount = seglogfs_mount_holding(path)
    if mount is not None:
        if _real(path) == mount.mount_point:
            where = "is a seglogfs mount point, not a log directory"
        else:
            where = f"is inside the seglogfs mount {mount.mount_point}"
        served = f" ({mount.source})" if mount.source.startswith("/") else ""
        raise SetupError(f"{path} {where}: give the log directory that mount serves{served}")
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        if must_exist:
            raise SetupError(f"log directory {path} does not exist") from None
        return
    except PermissionError:
        raise SetupError(
            f"no permission to reach log directory {path} ({_owner(path)}; running as {_me()})"
        ) from None
    except OSError as exc:
        raise log_dir_error(path, exc, writing=False) from None
    if not stat.S_ISDIR(mode):
        raise SetupError(f"log directory {path} is not a directory")


def check_mount_point(path: Path) -> None:
    """Refuse a mount point that does not exist, is not a directory, or holds a FUSE
    mount already (a live one would be hidden under the new mount, a dead one left by
    a killed daemon answers every call with ``ENOTCONN``). Another kind of mount there
    is fine: mounting over it is what was asked.

    Raises:
        SetupError: naming the mistake and what to do.
    """
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        blocker = _first_non_directory(path)
        if blocker is not None and blocker != path:
            raise SetupError(f"mount point {path}: {blocker} is not a directory") from None
        raise SetupError(f"mount point {path} does not exist") from None
    except OSError as exc:
        if exc.errno == errno.ENOTCONN:
            raise SetupError(
                f"mount point {path} is a dead FUSE mount (its daemon is gone: "
                f"{exc.strerror}); clear it with fusermount3 -u -z {path}"
            ) from None
        if exc.errno == errno.ENOTDIR:
            blocker = _first_non_directory(path)
            raise SetupError(
                f"mount point {path}: {blocker or 'a parent'} is not a directory"
            ) from None
        raise SetupError(f"mount point {path}: {exc.strerror}") from None
    if not stat.S_ISDIR(mode):
        raise SetupError(f"mount point {path} is not a directory")
    mounted = mount_at(path)
    if mounted is not None and mounted.fs_type.startswith("fuse"):
        raise SetupError(
            f"mount point {path} is mounted already ({mounted.fs_type} from "
            f"{mounted.source}): unmount it first with fusermount3 -u {path}"
        )


def check_mount_point_empty(path: Path) -> None:
    """Refuse a mount point that holds files: the mount would hide them, silently,
    until it is unmounted (libfuse 3 dropped its own ``nonempty`` check, and
    ``fusermount3`` as root never made one). ``-o nonempty`` skips this check. A
    directory that cannot be listed is left to the mount to judge.

    Raises:
        SetupError: naming the mount point, one of its entries and the way out.
    """
    try:
        with os.scandir(path) as entries:
            first = next(entries, None)
    except OSError:
        return
    if first is not None:
        raise SetupError(
            f"mount point {path} is not empty (it holds {first.name!r}): the mount would "
            "hide its files; use an empty directory, or pass -o nonempty"
        )


def check_fuse_device(device: str = FUSE_DEVICE) -> None:
    """Refuse to mount when ``/dev/fuse`` is missing or this user cannot open it:
    libfuse opens it before it would run the setuid ``fusermount3``, so an
    unprivileged daemon needs it usable by everyone (mode 0666, Debian's default).

    Raises:
        SetupError: naming the device, its owner and mode, and the user.
    """
    if not os.path.exists(device):
        raise SetupError(
            f"{device} does not exist: load the fuse module (modprobe fuse), or give "
            "the container the device"
        )
    if not os.access(device, os.R_OK | os.W_OK, effective_ids=True):
        raise SetupError(
            f"no permission to open {device} ({_owner(Path(device))}; running as "
            f"{_me()}): run the daemon as root, or make {device} mode 0666"
        )


def check_apart(log_dir: Path, mountpoint: Path) -> None:
    """Refuse a log directory and a mount point that overlap. Inside the mount point
    (or the same directory), the log directory would be hidden by the mount, and
    every file the daemon opens by name would go through the mount to the daemon
    itself. A mount point inside the log directory puts a directory that is no
    topic-partition there (Kafka takes its log directory offline for one) and lets
    ``verify`` and backups walk into the mount.

    Raises:
        SetupError: naming the overlap.
    """
    log, mount = _real(log_dir), _real(mountpoint)
    if log == mount:
        raise SetupError(
            f"log directory {log_dir} is the mount point itself: mount it on another, "
            "empty directory"
        )
    if _is_within(log, mount):
        raise SetupError(
            f"log directory {log_dir} is inside the mount point {mountpoint}: the mount "
            "would hide it; keep it outside"
        )
    if _is_within(mount, log):
        raise SetupError(
            f"mount point {mountpoint} is inside the log directory {log_dir}: use a "
            "directory outside it"
        )


def _owner(path: Path) -> str:
    """``owned by USER, mode 0750`` of ``path`` or of its nearest existing parent."""
    for part in [path, *path.parents]:
        try:
            st = os.stat(part)
        except OSError:
            continue
        try:
            user = pwd.getpwuid(st.st_uid).pw_name
        except KeyError:
            user = str(st.st_uid)
        where = "" if part == path else f"{part} "
        return f"{where}owned by {user}, mode {stat.S_IMODE(st.st_mode):04o}"
    return "no part of it can be seen"


def _me() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


def log_dir_error(
    path: Path, exc: OSError, *, writing: bool, read_only_hint: str = ""
) -> SetupError:
    """One line naming what an ``OSError`` met while opening the log directory
    ``path`` means: no permission (whose directory it is, and who asked), a read-only
    file system (with ``read_only_hint``: what to do instead), a path through a
    non-directory, a dead mount; else the file and the system's own words."""
    name = exc.filename if exc.filename is not None else path
    if exc.errno in (errno.EACCES, errno.EPERM):
        action = "write" if writing else "read"
        if writing and not os.path.lexists(path):
            action = "create"
        wanted = os.W_OK | os.X_OK if writing else os.R_OK | os.X_OK
        if not os.access(path, wanted) or Path(name) == path:
            detail = _owner(path)  # the directory itself (or the parent that hides it)
        else:
            detail = f"{name}: {exc.strerror}; {_owner(Path(name))}"
        return SetupError(
            f"no permission to {action} log directory {path} ({detail}; running as {_me()})"
        )
    if exc.errno == errno.EROFS:
        hint = read_only_hint if os.path.isdir(path) else ""  # nothing to read yet
        return SetupError(f"log directory {path} is on a read-only file system{hint}")
    if exc.errno in (errno.EEXIST, errno.ENOTDIR):
        blocker = _first_non_directory(path)
        if blocker == path:
            return SetupError(f"log directory {path} is not a directory")
        if blocker is not None:
            return SetupError(f"log directory {path}: {blocker} is not a directory")
    if exc.errno == errno.ENOTCONN:
        return SetupError(f"log directory {path} is on a dead FUSE mount ({exc.strerror})")
    return SetupError(f"{name}: {exc.strerror or exc}")


def read_config_file(path: Path, option: str) -> Mapping[str, str]:
    """The properties of the ``server.properties`` given as ``option`` (``--config``).

    Raises:
        SetupError: the file cannot be read (exit 1), or a line of it does not parse
            (``usage``: exit 2); the message names the option and the file.
    """
    try:
        return load_properties(path)
    except IsADirectoryError:
        raise SetupError(f"{option} {path} is a directory, not a properties file") from None
    except FileNotFoundError:
        raise SetupError(f"{option} {path} does not exist") from None
    except OSError as exc:
        raise SetupError(f"{option} {path}: {exc.strerror or exc}") from None
    except ConfigError as exc:
        raise config_file_error(path, option, exc) from None


def config_file_error(path: Path, option: str, exc: ConfigError) -> SetupError:
    """A bad key or value in the file given as ``option``: a usage error naming both."""
    return SetupError(f"{option} {path}: {exc}", usage=True)

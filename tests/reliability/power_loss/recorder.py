"""Record every file operation the engine makes under a directory (ALICE's first half).

``Recorder.recording()`` wraps, for the duration of a workload only, the ``os``-level
calls the engine uses (found by reading ``storage/``): ``os.open`` (``O_CREAT``,
``O_TRUNC``), ``os.write``/``pwrite``/``writev``, ``os.fsync``/``fdatasync``,
``os.ftruncate``/``truncate``, ``os.rename``/``replace``, ``os.unlink``/``remove``,
``os.mkdir`` (``Path.mkdir`` and ``os.makedirs`` go through it), ``os.rmdir``,
``os.link``, ``os.close``/``dup`` (descriptor bookkeeping) and ``shutil.rmtree``; it
refuses, loudly, calls it does not model (``open()`` for writing, ``os.symlink``,
``*_dir_fd`` forms) under the recorded directory, so an engine change that writes
some other way fails the harness instead of escaping it.

Mapped index files (``storage/log/index.py``): a store into a ``MAP_SHARED`` mapping is
no system call, and it is not durable until an ``msync`` (``mmap.flush``) or an
``fsync`` of the file covers it (Kafka's ``AbstractIndex.flush`` is
``MappedByteBuffer.force``, an ``msync``; until then the kernel writes dirty pages back
whenever it likes, page by page). The recorder replaces ``mmap.mmap`` with a subclass
that notes every writable mapping of a recorded file, turns ``flush`` into an
``FSYNC`` of that file and ``resize`` (an ``ftruncate`` through the mapping's own
descriptor) into a ``TRUNCATE``; before each recorded call (and at each workload mark) it
compares the file's bytes, read through a descriptor of its own (never through the
mapping: a trimmed file would fault), with what the recorded calls made of it: the
difference is what the mappings stored since, recorded as ``STORE`` operations (one
per changed byte run) just before that call. The order of stores made between two
calls is lost, which costs nothing: the models let any subset of unsynced stores
reach the disk.

Files are identified by node numbers the recorder hands out when a name is created
(inode identity: a rename moves the name, not the node; a node keeps its bytes while
unlinked and open). ``Recorder.tree`` is the volatile state (page cache) as the
recorded calls left it; ``check_fidelity`` compares it with the real directory.

Not thread-safe: the workload runs in the recording thread; the engine's own
background work is driven by the workload, not by threads.
"""

from __future__ import annotations

import builtins
import contextlib
import mmap
import os
import shutil
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

__all__ = ["Kind", "Op", "Recorder", "RecorderError", "Tree"]


class RecorderError(AssertionError):
    """The engine made a call the recorder does not model, or the model drifted."""


class Kind(Enum):
    CREATE = "create"  # a new name for a new file (O_CREAT) or directory (mkdir)
    LINK = "link"  # a new name for an existing file
    UNLINK = "unlink"
    RMDIR = "rmdir"
    RENAME = "rename"  # also replaces the target name
    WRITE = "write"  # write/pwrite/writev: bytes at an offset
    STORE = "store"  # bytes changed through a writable mapping since the last call
    TRUNCATE = "truncate"  # ftruncate/truncate/O_TRUNC: the new size
    FSYNC = "fsync"  # fsync/fdatasync of a file, msync of its mapping
    DIRSYNC = "dirsync"  # fsync of a directory
    MARK = "mark"  # a workload event; no file-system effect


NAMESPACE_KINDS = frozenset({Kind.CREATE, Kind.LINK, Kind.UNLINK, Kind.RMDIR, Kind.RENAME})
DATA_KINDS = frozenset({Kind.WRITE, Kind.STORE, Kind.TRUNCATE})


@dataclass(frozen=True, slots=True)
class Op:
    """One recorded operation; ``seq`` is its place in the recording."""

    seq: int
    kind: Kind
    node: int = -1  # the file or directory acted on (namespace ops: the one named)
    parent: int = -1  # namespace ops: the directory of ``name``
    name: str = ""
    parent2: int = -1  # rename: the target directory and name
    name2: str = ""
    offset: int = 0  # write/store
    data: bytes = b""  # write/store
    length: int = 0  # truncate: the new size
    is_dir: bool = False  # create: a directory
    in_place: bool = False  # write/store/truncate that leaves the size as it was
    call: str = ""  # what made it: "os.fdatasync", "mmap.flush", ...
    event: object = None  # mark: the workload's event

    def __str__(self) -> str:
        where = f"node {self.node}"
        if self.kind in NAMESPACE_KINDS:
            where += f" {self.parent}/{self.name}"
            if self.kind is Kind.RENAME:
                where += f" -> {self.parent2}/{self.name2}"
        if self.kind in (Kind.WRITE, Kind.STORE):
            where += f" [{self.offset}, {self.offset + len(self.data)})"
        if self.kind is Kind.TRUNCATE:
            where += f" to {self.length}"
        if self.kind is Kind.MARK:
            return f"#{self.seq} mark {self.event}"
        return f"#{self.seq} {self.kind.value} {where} ({self.call})"


@dataclass
class Node:
    is_dir: bool
    content: bytearray = field(default_factory=bytearray)
    entries: dict[str, int] = field(default_factory=dict)


class Tree:
    """Directories and files by node number; the root directory is node 0.

    Applies recorded operations (``apply``); the crash-state builder replays filtered
    sequences on a copy, so an operation whose names are missing there is skipped
    (``apply`` returns False) instead of raising.
    """

    ROOT = 0

    def __init__(self) -> None:
        self.nodes: dict[int, Node] = {self.ROOT: Node(is_dir=True)}

    def copy(self) -> Tree:
        other = Tree()
        other.nodes = {
            n: Node(node.is_dir, bytearray(node.content), dict(node.entries))
            for n, node in self.nodes.items()
        }
        return other

    def lookup(self, parts: tuple[str, ...]) -> int | None:
        current = self.ROOT
        for part in parts:
            node = self.nodes[current]
            if not node.is_dir or part not in node.entries:
                return None
            current = node.entries[part]
        return current

    def apply_namespace(self, op: Op) -> bool:
        kind = op.kind
        directory = self.nodes.get(op.parent)
        if directory is None or not directory.is_dir:
            return False
        if kind is Kind.CREATE:
            if op.name in directory.entries:
                return False
            self.nodes.setdefault(op.node, Node(is_dir=op.is_dir))
            directory.entries[op.name] = op.node
        elif kind is Kind.LINK:
            if op.name in directory.entries or op.node not in self.nodes:
                return False
            directory.entries[op.name] = op.node
        elif kind in (Kind.UNLINK, Kind.RMDIR):
            if directory.entries.get(op.name) != op.node:
                return False
            if kind is Kind.RMDIR and self.nodes[op.node].entries:
                return False
            del directory.entries[op.name]
        elif kind is Kind.RENAME:
            target = self.nodes.get(op.parent2)
            if target is None or directory.entries.get(op.name) != op.node:
                return False
            del directory.entries[op.name]
            target.entries[op.name2] = op.node
        else:
            raise ValueError(op)
        return True

    def apply_data(self, op: Op, *, cut: int | None = None) -> None:
        """Apply a data operation (``cut``: only that many of a write's bytes)."""
        node = self.nodes.setdefault(op.node, Node(is_dir=False))
        apply_data(node.content, op, cut=cut)

    def paths(self) -> Iterator[tuple[str, int]]:
        """(relative path, node) of every name reachable from the root, parents first."""
        stack: list[tuple[str, int]] = [("", self.ROOT)]
        while stack:
            prefix, number = stack.pop()
            for name, child in sorted(self.nodes[number].entries.items(), reverse=True):
                path = f"{prefix}{name}"
                yield path, child
                if self.nodes[child].is_dir:
                    stack.append((path + "/", child))


def apply_data(content: bytearray, op: Op, *, cut: int | None = None, clip: bool = False) -> None:
    """Apply a WRITE, STORE or TRUNCATE to ``content``.

    ``cut`` keeps only the first ``cut`` bytes of a write (a write torn by the power
    cut). ``clip`` drops bytes past the end of ``content`` (an in-place write whose
    size change did not reach the disk cannot extend the file).
    """
    if op.kind is Kind.TRUNCATE:
        if op.length < len(content):
            del content[op.length :]
        else:
            content.extend(bytes(op.length - len(content)))
        return
    data = op.data if cut is None else op.data[:cut]
    end = op.offset + len(data)
    if clip:
        end = min(end, len(content))
        data = data[: max(end - op.offset, 0)]
        if not data:
            return
    if op.offset > len(content):
        content.extend(bytes(op.offset - len(content)))
    content[op.offset : op.offset + len(data)] = data


@dataclass
class _Fd:
    node: int
    is_dir: bool
    append: bool
    position: int = 0


@dataclass
class _Watch:
    fd: int  # the recorder's own descriptor of the mapped file
    live: int = 0  # mappings of it still alive


# The real calls, taken at import (before any recording patches them).
_REAL_OPEN = os.open
_REAL_CLOSE = os.close
_REAL_DUP = os.dup
_REAL_WRITE = os.write
_REAL_PWRITE = os.pwrite
_REAL_WRITEV = os.writev
_REAL_PREAD = os.pread
_REAL_FSYNC = os.fsync
_REAL_FDATASYNC = os.fdatasync
_REAL_FTRUNCATE = os.ftruncate
_REAL_TRUNCATE = os.truncate
_REAL_RENAME = os.rename
_REAL_REPLACE = os.replace
_REAL_UNLINK = os.unlink
_REAL_REMOVE = os.remove
_REAL_RMDIR = os.rmdir
_REAL_MKDIR = os.mkdir
_REAL_LINK = os.link
_REAL_SYMLINK = os.symlink
_REAL_RMTREE = shutil.rmtree
_REAL_BUILTIN_OPEN = builtins.open
_REAL_MMAP = mmap.mmap

_ACTIVE: Recorder | None = None


class RecordingMmap(_REAL_MMAP):
    """``mmap.mmap`` while a recording runs: notes writable mappings and ``msync``."""

    def __new__(cls, fileno: int, length: int, *args: Any, **kwargs: Any) -> RecordingMmap:
        self = super().__new__(cls, fileno, length, *args, **kwargs)
        recorder = _ACTIVE
        if recorder is not None and _writable_mapping(args, kwargs):
            offset = kwargs.get("offset", args[3] if len(args) > 3 else 0)
            recorder._mapped(self, fileno, offset)
        return self

    def flush(self, *args: Any) -> None:
        recorder = _ACTIVE
        if recorder is None or recorder._suspended:
            super().flush(*args)
            return
        recorder._scan_stores()
        super().flush(*args)
        recorder._msync(self)

    def resize(self, newsize: int) -> None:
        # CPython's resize ftruncates the file through the mapping's own descriptor
        # (to offset + newsize), then remaps: a size change no os.* call shows.
        recorder = _ACTIVE
        if recorder is None or recorder._suspended:
            super().resize(newsize)
            return
        recorder._scan_stores()
        super().resize(newsize)
        recorder._mapping_resized(self, newsize)


def _writable_mapping(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    # mmap(fileno, length, flags=MAP_SHARED, prot=PROT_WRITE|PROT_READ,
    #      access=ACCESS_DEFAULT, offset=0)
    access = kwargs.get("access", args[2] if len(args) > 2 else mmap.ACCESS_DEFAULT)
    if access in (mmap.ACCESS_READ, mmap.ACCESS_COPY):
        return False
    if access == mmap.ACCESS_WRITE:
        return True
    flags = kwargs.get("flags", args[0] if args else mmap.MAP_SHARED)
    prot = kwargs.get("prot", args[1] if len(args) > 1 else mmap.PROT_WRITE | mmap.PROT_READ)
    return bool(flags & mmap.MAP_SHARED) and bool(prot & mmap.PROT_WRITE)


class Recorder:
    """Records the file operations made under ``root`` while ``recording()`` runs.

    The directory's content when the recorder is created is the durable starting
    point (``initial``). ``ops`` is the recording; ``mark(event)`` adds a workload
    event at the current point.
    """

    def __init__(self, root: Path) -> None:
        self.root = os.path.realpath(root)
        self.ops: list[Op] = []
        self.tree = Tree()
        self._next_node = 1
        self._fds: dict[int, _Fd] = {}
        self._watched: dict[int, _Watch] = {}
        self._maps: dict[int, int] = {}  # id(mapping) -> node
        self._map_offsets: dict[int, int] = {}  # id(mapping) -> its offset in the file
        self._suspended = 0
        self._scan_initial()
        self.initial = self.tree.copy()

    # -- the recording -----------------------------------------------------------

    @contextlib.contextmanager
    def recording(self) -> Iterator[Recorder]:
        global _ACTIVE
        if _ACTIVE is not None:
            raise RecorderError("a recording is already running")
        patches: list[tuple[object, str, object]] = [
            (os, "open", self._open),
            (os, "close", self._close),
            (os, "dup", self._dup),
            (os, "write", self._write),
            (os, "pwrite", self._pwrite),
            (os, "writev", self._writev),
            (os, "fsync", self._fsync),
            (os, "fdatasync", self._fdatasync),
            (os, "ftruncate", self._ftruncate),
            (os, "truncate", self._truncate),
            (os, "rename", self._rename),
            (os, "replace", self._replace),
            (os, "unlink", self._unlink),
            (os, "remove", self._remove),
            (os, "rmdir", self._rmdir),
            (os, "mkdir", self._mkdir),
            (os, "link", self._link),
            (os, "symlink", self._symlink),
            (shutil, "rmtree", self._rmtree),
            (builtins, "open", self._builtin_open),
            (mmap, "mmap", RecordingMmap),
        ]
        saved = [(target, name, getattr(target, name)) for target, name, _ in patches]
        _ACTIVE = self
        for target, name, replacement in patches:
            setattr(target, name, replacement)
        try:
            yield self
            self._scan_stores()
        finally:
            for target, name, original in saved:
                setattr(target, name, original)
            _ACTIVE = None
            for watch in self._watched.values():
                _REAL_CLOSE(watch.fd)
            self._watched.clear()

    def mark(self, event: object) -> int:
        """Record a workload event here; returns its ``seq``."""
        self._scan_stores()
        return self._add(Op(0, Kind.MARK, event=event))

    @contextlib.contextmanager
    def suspended(self) -> Iterator[None]:
        """Run calls unrecorded (the recorder's own helpers, the checker's reads)."""
        self._suspended += 1
        try:
            yield
        finally:
            self._suspended -= 1

    def check_fidelity(self) -> None:
        """Raise ``RecorderError`` unless the real directory equals the recorded tree."""
        expected = {path: self.tree.nodes[n] for path, n in self.tree.paths()}
        found: dict[str, bool] = {}
        for directory, dirs, files in os.walk(self.root):
            rel = os.path.relpath(directory, self.root)
            prefix = "" if rel == "." else rel + "/"
            for name in dirs:
                found[prefix + name] = True
            for name in files:
                found[prefix + name] = False
        if set(found) != set(expected):
            raise RecorderError(
                f"recorded names differ from the directory: missing "
                f"{sorted(set(found) - set(expected))}, extra {sorted(set(expected) - set(found))}"
            )
        for path, is_dir in found.items():
            node = expected[path]
            if node.is_dir != is_dir:
                kind = "a directory" if node.is_dir else "a file"
                raise RecorderError(f"{path}: recorded as {kind}")
            if not is_dir:
                with _REAL_BUILTIN_OPEN(os.path.join(self.root, path), "rb") as f:
                    if f.read() != bytes(node.content):
                        raise RecorderError(f"{path}: recorded bytes differ from the file's")

    # -- bookkeeping -------------------------------------------------------------

    def _add(self, op: Op) -> int:
        seq = len(self.ops)
        op = Op(
            seq, op.kind, op.node, op.parent, op.name, op.parent2, op.name2, op.offset,
            op.data, op.length, op.is_dir, op.in_place, op.call, op.event,
        )  # fmt: skip
        self.ops.append(op)
        if op.kind in NAMESPACE_KINDS:
            if not self.tree.apply_namespace(op):
                raise RecorderError(f"recorded {op} does not apply to the volatile tree")
        elif op.kind in DATA_KINDS:
            self.tree.apply_data(op)
        return seq

    def _scan_initial(self) -> None:
        for directory, dirs, files in os.walk(self.root):
            rel = os.path.relpath(directory, self.root)
            parts = () if rel == "." else tuple(rel.split(os.sep))
            parent = self.tree.lookup(parts)
            assert parent is not None
            for name in sorted(dirs):
                number = self._new_node()
                self.tree.nodes[number] = Node(is_dir=True)
                self.tree.nodes[parent].entries[name] = number
            for name in sorted(files):
                number = self._new_node()
                with _REAL_BUILTIN_OPEN(os.path.join(directory, name), "rb") as f:
                    self.tree.nodes[number] = Node(is_dir=False, content=bytearray(f.read()))
                self.tree.nodes[parent].entries[name] = number

    def _new_node(self) -> int:
        number = self._next_node
        self._next_node += 1
        return number

    def _parts(self, path: Any, dir_fd: int | None = None) -> tuple[str, ...] | None:
        """The path's components under the root, None when it is elsewhere."""
        if isinstance(path, int):
            return None
        text = os.fsdecode(os.fspath(path))
        if dir_fd is not None and not os.path.isabs(text):
            if dir_fd in self._fds:
                raise RecorderError(f"unmodelled *at() call on {text!r} under the recording")
            return None
        full = os.path.normpath(os.path.abspath(text))
        if full == self.root:
            return ()
        if not full.startswith(self.root + os.sep):
            return None
        return tuple(full[len(self.root) + 1 :].split(os.sep))

    def _parent_and_name(self, parts: tuple[str, ...]) -> tuple[int, str]:
        parent = self.tree.lookup(parts[:-1])
        if parent is None:
            raise RecorderError(f"no recorded directory for {'/'.join(parts)}")
        return parent, parts[-1]

    def _recording(self) -> bool:
        return _ACTIVE is self and not self._suspended

    # -- mappings ----------------------------------------------------------------

    def _mapped(self, mapping: RecordingMmap, fileno: int, offset: int) -> None:
        entry = self._fds.get(fileno)
        if entry is None or self._suspended:
            return
        self._map_offsets[id(mapping)] = offset
        watch = self._watched.get(entry.node)
        if watch is None:
            watch = self._watched[entry.node] = _Watch(_REAL_DUP(fileno))
        watch.live += 1
        self._maps[id(mapping)] = entry.node
        weakref.finalize(mapping, self._unmapped, id(mapping), entry.node)

    def _unmapped(self, key: int, node: int) -> None:
        self._maps.pop(key, None)
        self._map_offsets.pop(key, None)
        watch = self._watched.get(node)
        if watch is not None:
            watch.live -= 1

    def _mapping_resized(self, mapping: RecordingMmap, size: int) -> None:
        node = self._maps.get(id(mapping))
        if node is not None:
            self._record_truncate(node, self._map_offsets.get(id(mapping), 0) + size, "mmap.resize")

    def _msync(self, mapping: RecordingMmap) -> None:
        node = self._maps.get(id(mapping))
        if node is not None:
            self._add(Op(0, Kind.FSYNC, node=node, call="mmap.flush"))

    def _scan_stores(self) -> None:
        """Record what writable mappings changed since the last recorded call."""
        for node, watch in list(self._watched.items()):
            content = self.tree.nodes[node].content
            real = _REAL_PREAD(watch.fd, len(content) + 1, 0)
            if len(real) != len(content):
                raise RecorderError(
                    f"node {node}: the file has {len(real)} bytes, the recording {len(content)}"
                )
            if real != content:
                for start, end in _changed_runs(content, real):
                    self._add(
                        Op(
                            0, Kind.STORE, node=node, offset=start, data=real[start:end],
                            in_place=True, call="mmap store",
                        )
                    )  # fmt: skip
            if watch.live <= 0:
                _REAL_CLOSE(watch.fd)
                del self._watched[node]

    # -- the wrapped calls -------------------------------------------------------

    def _open(self, path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        parts = self._parts(path, dir_fd) if self._recording() else None
        if parts is None:
            fd = _REAL_OPEN(path, flags, mode, dir_fd=dir_fd)
            self._fds.pop(fd, None)  # a number reused after a close we did not see
            return fd
        self._scan_stores()
        existing = self.tree.lookup(parts)
        fd = _REAL_OPEN(path, flags, mode)
        if existing is None:
            parent, name = self._parent_and_name(parts)
            existing = self._new_node()
            self._add(Op(0, Kind.CREATE, node=existing, parent=parent, name=name, call="os.open"))
        node = self.tree.nodes[existing]
        if flags & os.O_TRUNC and not node.is_dir and node.content:
            self._add(Op(0, Kind.TRUNCATE, node=existing, length=0, call="os.open O_TRUNC"))
        self._fds[fd] = _Fd(existing, node.is_dir, bool(flags & os.O_APPEND))
        return fd

    def _close(self, fd: int) -> None:
        self._fds.pop(fd, None)
        _REAL_CLOSE(fd)

    def _dup(self, fd: int) -> int:
        new = _REAL_DUP(fd)
        entry = self._fds.get(fd)
        if entry is None:
            self._fds.pop(new, None)
        else:
            self._fds[new] = _Fd(entry.node, entry.is_dir, entry.append, entry.position)
        return new

    def _record_write(self, entry: _Fd, offset: int, data: bytes, call: str) -> None:
        size = len(self.tree.nodes[entry.node].content)
        in_place = offset + len(data) <= size
        op = Op(0, Kind.WRITE, entry.node, offset=offset, data=data, in_place=in_place, call=call)
        self._add(op)

    def _write(self, fd: int, data: Any) -> int:
        entry = self._fds.get(fd) if self._recording() else None
        if entry is None:
            return _REAL_WRITE(fd, data)
        self._scan_stores()
        written = _REAL_WRITE(fd, data)
        offset = len(self.tree.nodes[entry.node].content) if entry.append else entry.position
        self._record_write(entry, offset, bytes(memoryview(data)[:written]), "os.write")
        if not entry.append:
            entry.position = offset + written
        return written

    def _pwrite(self, fd: int, data: Any, offset: int) -> int:
        entry = self._fds.get(fd) if self._recording() else None
        if entry is None:
            return _REAL_PWRITE(fd, data, offset)
        if entry.append:
            raise RecorderError("pwrite on an O_APPEND descriptor (Linux appends): unmodelled")
        self._scan_stores()
        written = _REAL_PWRITE(fd, data, offset)
        self._record_write(entry, offset, bytes(memoryview(data)[:written]), "os.pwrite")
        return written

    def _writev(self, fd: int, buffers: Any) -> int:
        entry = self._fds.get(fd) if self._recording() else None
        if entry is None:
            return _REAL_WRITEV(fd, buffers)
        self._scan_stores()
        chunks = [bytes(b) for b in buffers]
        written = _REAL_WRITEV(fd, chunks)
        offset = len(self.tree.nodes[entry.node].content) if entry.append else entry.position
        self._record_write(entry, offset, b"".join(chunks)[:written], "os.writev")
        if not entry.append:
            entry.position = offset + written
        return written

    def _sync(self, fd: int, real: Callable[[int], None], call: str) -> None:
        entry = self._fds.get(fd) if self._recording() else None
        if entry is None:
            real(fd)
            return
        self._scan_stores()
        real(fd)
        kind = Kind.DIRSYNC if entry.is_dir else Kind.FSYNC
        self._add(Op(0, kind, node=entry.node, call=call))

    def _fsync(self, fd: Any) -> None:
        fd = fd if isinstance(fd, int) else fd.fileno()
        self._sync(fd, _REAL_FSYNC, "os.fsync")

    def _fdatasync(self, fd: Any) -> None:
        fd = fd if isinstance(fd, int) else fd.fileno()
        self._sync(fd, _REAL_FDATASYNC, "os.fdatasync")

    def _record_truncate(self, node: int, length: int, call: str) -> None:
        size = len(self.tree.nodes[node].content)
        self._add(
            Op(0, Kind.TRUNCATE, node=node, length=length, in_place=length == size, call=call)
        )

    def _ftruncate(self, fd: int, length: int) -> None:
        entry = self._fds.get(fd) if self._recording() else None
        if entry is None:
            _REAL_FTRUNCATE(fd, length)
            return
        self._scan_stores()
        _REAL_FTRUNCATE(fd, length)
        self._record_truncate(entry.node, length, "os.ftruncate")

    def _truncate(self, path: Any, length: int) -> None:
        if isinstance(path, int):
            self._ftruncate(path, length)
            return
        parts = self._parts(path) if self._recording() else None
        if parts is None:
            _REAL_TRUNCATE(path, length)
            return
        self._scan_stores()
        _REAL_TRUNCATE(path, length)
        node = self.tree.lookup(parts)
        assert node is not None
        self._record_truncate(node, length, "os.truncate")

    def _move(
        self,
        real: Callable[..., None],
        src: Any,
        dst: Any,
        call: str,
        src_dir_fd: int | None,
        dst_dir_fd: int | None,
    ) -> None:
        recording = self._recording()
        source = self._parts(src, src_dir_fd) if recording else None
        target = self._parts(dst, dst_dir_fd) if recording else None
        if source is None and target is None:
            real(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)
            return
        if source is None or target is None:
            raise RecorderError(f"{call} across the recorded directory: {src} -> {dst}")
        self._scan_stores()
        real(src, dst)
        node = self.tree.lookup(source)
        assert node is not None
        parent, name = self._parent_and_name(source)
        parent2, name2 = self._parent_and_name(target)
        self._add(
            Op(0, Kind.RENAME, node=node, parent=parent, name=name, parent2=parent2,
               name2=name2, call=call)
        )  # fmt: skip

    def _rename(
        self, src: Any, dst: Any, *, src_dir_fd: int | None = None, dst_dir_fd: int | None = None
    ) -> None:
        self._move(_REAL_RENAME, src, dst, "os.rename", src_dir_fd, dst_dir_fd)

    def _replace(
        self, src: Any, dst: Any, *, src_dir_fd: int | None = None, dst_dir_fd: int | None = None
    ) -> None:
        self._move(_REAL_REPLACE, src, dst, "os.replace", src_dir_fd, dst_dir_fd)

    def _remove_name(
        self, real: Callable[..., None], path: Any, dir_fd: int | None, kind: Kind, call: str
    ) -> None:
        parts = self._parts(path, dir_fd) if self._recording() else None
        if parts is None:
            real(path, dir_fd=dir_fd)
            return
        self._scan_stores()
        real(path)
        node = self.tree.lookup(parts)
        assert node is not None
        parent, name = self._parent_and_name(parts)
        self._add(Op(0, kind, node=node, parent=parent, name=name, call=call))

    def _unlink(self, path: Any, *, dir_fd: int | None = None) -> None:
        self._remove_name(_REAL_UNLINK, path, dir_fd, Kind.UNLINK, "os.unlink")

    def _remove(self, path: Any, *, dir_fd: int | None = None) -> None:
        self._remove_name(_REAL_REMOVE, path, dir_fd, Kind.UNLINK, "os.remove")

    def _rmdir(self, path: Any, *, dir_fd: int | None = None) -> None:
        self._remove_name(_REAL_RMDIR, path, dir_fd, Kind.RMDIR, "os.rmdir")

    def _mkdir(self, path: Any, mode: int = 0o777, *, dir_fd: int | None = None) -> None:
        parts = self._parts(path, dir_fd) if self._recording() else None
        if parts is None:
            _REAL_MKDIR(path, mode, dir_fd=dir_fd)
            return
        self._scan_stores()
        _REAL_MKDIR(path, mode)
        parent, name = self._parent_and_name(parts)
        node = self._new_node()
        self._add(
            Op(0, Kind.CREATE, node=node, parent=parent, name=name, is_dir=True, call="os.mkdir")
        )

    def _link(self, src: Any, dst: Any, **kwargs: Any) -> None:
        recording = self._recording()
        source = self._parts(src) if recording else None
        target = self._parts(dst) if recording else None
        if source is None and target is None:
            _REAL_LINK(src, dst, **kwargs)
            return
        if source is None or target is None or kwargs:
            raise RecorderError(f"os.link across the recorded directory: {src} -> {dst}")
        self._scan_stores()
        _REAL_LINK(src, dst)
        node = self.tree.lookup(source)
        assert node is not None
        parent, name = self._parent_and_name(target)
        self._add(Op(0, Kind.LINK, node=node, parent=parent, name=name, call="os.link"))

    def _symlink(self, src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        if self._recording() and self._parts(dst) is not None:
            raise RecorderError(f"os.symlink under the recorded directory: {dst}")
        _REAL_SYMLINK(src, dst, *args, **kwargs)

    def _rmtree(self, path: Any, ignore_errors: bool = False, *args: Any, **kwargs: Any) -> None:
        parts = self._parts(path) if self._recording() else None
        if parts is None:
            _REAL_RMTREE(path, ignore_errors, *args, **kwargs)
            return
        self._scan_stores()
        top = self.tree.lookup(parts)
        # Bottom-up: the names to remove, as rmtree removes them.
        doomed: list[tuple[str, int, int, str, bool]] = []
        if top is not None:
            parent, name = self._parent_and_name(parts)
            self._collect(os.path.join(self.root, *parts), parent, name, top, doomed)
        with self.suspended():
            _REAL_RMTREE(path, ignore_errors, *args, **kwargs)
        for full, parent, node, name, is_dir in doomed:
            if not os.path.lexists(full):
                kind = Kind.RMDIR if is_dir else Kind.UNLINK
                self._add(Op(0, kind, node=node, parent=parent, name=name, call="shutil.rmtree"))

    def _collect(
        self,
        full: str,
        parent: int,
        name: str,
        node: int,
        out: list[tuple[str, int, int, str, bool]],
    ) -> None:
        entry = self.tree.nodes[node]
        if entry.is_dir:
            for child_name, child in sorted(entry.entries.items()):
                self._collect(os.path.join(full, child_name), node, child_name, child, out)
        out.append((full, parent, node, name, entry.is_dir))

    def _builtin_open(self, file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if (
            self._recording()
            and not isinstance(file, int)
            and any(c in mode for c in "wax+")
            and self._parts(file) is not None
        ):
            raise RecorderError(f"open({file!r}, {mode!r}) writes under the recording: unmodelled")
        return _REAL_BUILTIN_OPEN(file, mode, *args, **kwargs)


def _changed_runs(old: bytearray, new: bytes) -> Iterator[tuple[int, int]]:
    """[start, end) ranges where ``new`` differs from ``old`` (equal lengths)."""
    chunk = 64
    n = len(new)
    start = -1
    for i in range(0, n, chunk):
        if old[i : i + chunk] != new[i : i + chunk]:
            if start < 0:
                start = i
        elif start >= 0:
            yield _trim(old, new, start, i)
            start = -1
    if start >= 0:
        yield _trim(old, new, start, n)


def _trim(old: bytearray, new: bytes, start: int, end: int) -> tuple[int, int]:
    while start < end and old[start] == new[start]:
        start += 1
    while end > start and old[end - 1] == new[end - 1]:
        end -= 1
    return start, end


def read_tree(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root``: its bytes, None for a directory (for tests)."""
    out: dict[str, bytes | None] = {}
    for directory, dirs, files in os.walk(root):
        rel = os.path.relpath(directory, root)
        prefix = "" if rel == "." else rel + "/"
        for name in dirs:
            out[prefix + name] = None
        for name in files:
            out[prefix + name] = Path(directory, name).read_bytes()
    return out

"""The write path against an in-memory model: a hypothesis state machine (issue #16).

Random sequences of what writers and administrators do, driven through the handler
layer (``Operations`` without a kernel, as ``test_operations.py``): opening partition,
``produce`` and view files; writes of partial lines, complete lines and lines too large
for one record (``max.message.bytes`` is small here), into ``lines`` and ``raw``
topics; ``flush`` of a duplicated descriptor without a release; release (the last
close); ``fsync``; format and key-separator changes (``setxattr``); a topic deleted
through the engine, as the control socket does, and created again with ``mkdir``.

The model holds, per topic, the lines (or raw bytes) each partition must hold, and per
open file its partial line and which topic's life it belongs to. Each write's answer
is checked against the rules: a write either appends all its complete lines and keeps
its tail (which fits one record), or is refused with ``EFBIG`` because a line or the
tail cannot be one record (nothing appended, the pending line kept), or is short after
whole lines; ``flush`` appends nothing; release and ``fsync`` append the pending line;
a rendering change is ``EBUSY`` while a live file holds pending bytes; a handle of a
deleted topic answers ``ESTALE``/``ENOENT`` and never appends. After every step the log
is checked: its records, the engine's invariants, and the position index (``st_size``
and the partition file read through the handlers equal the rendered model).
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pyfuse3
import trio
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    precondition,
    rule,
)

from seglogfs.daemon.operations import Operations
from seglogfs.positions import Rendering, position_index_spec
from storage import BrokerConfig, LogConfig, LogManager, build_record_batch
from tests.conftest import ManualClock

CTX = pyfuse3.RequestContext()
ROOT = pyfuse3.ROOT_INODE
APPEND = os.O_WRONLY | os.O_APPEND
TOPICS = ("t", "u")
MAX_MESSAGE_BYTES = 300
DEAD = (errno.ESTALE, errno.ENOENT)
SEPARATOR = b":"

_T = TypeVar("_T")


async def run_inline(fn: Callable[..., Any], *args: Any) -> Any:
    # The daemon's bridge without worker threads: the engine calls run in the loop's
    # thread, so each handler call is one short trio.run.
    return fn(*args)


def call(fn: Callable[[], Awaitable[_T]]) -> _T:
    return trio.run(fn)


def errno_of(fn: Callable[[], Awaitable[object]]) -> int | None:
    try:
        call(fn)
    except pyfuse3.FUSEError as exc:
        return exc.errno
    return None


def fits(line: bytes, separator: bytes | None) -> bool:
    """Whether ``line`` is one record the engine takes: the builder's own size."""
    key: bytes | None = None
    value = line
    if separator is not None and separator in line:
        key, value = line.split(separator, 1)
    return len(build_record_batch([value], keys=[key], timestamps=0)) <= MAX_MESSAGE_BYTES


@dataclass
class TopicModel:
    life: int  # which creation of the name this is
    raw: bool = False
    separator: bytes | None = None
    lines: list[bytes] = field(default_factory=list)  # lines topics: each record's line
    data: bytes = b""  # raw topics: the values back to back

    def rendered(self) -> bytes:
        if self.raw:
            return self.data
        return b"".join(line + b"\n" for line in self.lines)

    @property
    def empty(self) -> bool:
        return not self.lines and not self.data


@dataclass
class FileModel:
    fh: int
    topic: str
    life: int
    pending: bytes = b""
    offset: int = 0  # a reader's kernel offset


# A write: partial and complete lines, sometimes a line too large for one record.
pieces = st.one_of(
    st.binary(min_size=0, max_size=40).map(lambda b: b.replace(b"\n", b"")),
    st.just(b"\n"),
    st.sampled_from([b"k:v", b"key:", b":", b"x" * 150, b"y" * 240, b"z" * 290, b"w" * 400]),
)
writes = st.lists(pieces, min_size=1, max_size=6).map(b"".join).filter(bool)


class WriteMachine(RuleBasedStateMachine):
    files = Bundle("files")
    readers = Bundle("readers")

    def __init__(self) -> None:
        super().__init__()
        # In memory where there is a tmpfs: topic changes fsync the metadata file.
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        self.dir = Path(tempfile.mkdtemp(prefix="seglog-writes-", dir=shm))
        defaults = LogConfig(
            max_message_bytes=MAX_MESSAGE_BYTES, segment_bytes=2000, segment_index_bytes=4096
        )
        broker = BrokerConfig(
            log_dirs=(str(self.dir),), num_partitions=1, default_topic_config=defaults
        )
        self.manager = LogManager.open(
            self.dir, broker, clock=ManualClock(), extension=position_index_spec
        )
        self.ops = Operations(self.manager, run_inline)
        self.topics: dict[str, TopicModel] = {}
        self.open_files: dict[int, FileModel] = {}
        self.lives = 0

    def teardown(self) -> None:
        self.manager.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- helpers ---------------------------------------------------------------------

    def inode(self, path: str) -> int:
        inode = ROOT
        for part in filter(None, path.split("/")):
            name = part.encode()
            inode = call(lambda i=inode, n=name: self.ops.lookup(i, n, CTX)).st_ino  # type: ignore[misc]
        return inode

    def alive(self, f: FileModel) -> bool:
        topic = self.topics.get(f.topic)
        return topic is not None and topic.life == f.life

    def model_of(self, f: FileModel) -> TopicModel:
        return self.topics[f.topic]

    def append_line(self, topic: TopicModel, line: bytes) -> None:
        assert not topic.raw
        topic.lines.append(line)

    # -- the namespace ---------------------------------------------------------------

    @precondition(lambda self: len(self.topics) < len(TOPICS))
    @rule(data=st.data())
    def mkdir(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from([t for t in TOPICS if t not in self.topics]))
        call(lambda: self.ops.mkdir(ROOT, name.encode(), 0o755, CTX))
        self.lives += 1
        self.topics[name] = TopicModel(self.lives)

    @precondition(lambda self: bool(self.topics))
    @rule(data=st.data())
    def delete_topic(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(self.topics)))
        self.manager.delete_topic(name)  # as the control socket does, behind the mount
        del self.topics[name]

    @precondition(lambda self: bool(self.topics))
    @rule(
        data=st.data(),
        change=st.sampled_from(
            [
                (b"format", b"raw"),
                (b"format", b"lines"),
                (b"key.separator", SEPARATOR),
                (b"key.separator", b""),
            ]
        ),
    )
    def set_rendering(self, data: st.DataObject, change: tuple[bytes, bytes]) -> None:
        name = data.draw(st.sampled_from(sorted(self.topics)))
        topic = self.topics[name]
        key, value = change
        inode = self.inode(name)
        code = errno_of(lambda: self.ops.setxattr(inode, b"user.seglog." + key, value, CTX))
        if key == b"format":
            wanted = (value == b"raw", topic.separator)
        else:
            wanted = (topic.raw, value or None)
        busy = any(f.pending for f in self.open_files.values() if self.alive(f) and f.topic == name)
        if wanted == (topic.raw, topic.separator):
            assert code is None
        elif not topic.empty:
            assert code == errno.EPERM  # fixed once a record exists
        elif wanted[0] and wanted[1] is not None:
            assert code == errno.EINVAL  # a separator is only for lines
        elif busy:
            assert code == errno.EBUSY  # a pending line was measured in the old rendering
        else:
            assert code is None
            topic.raw, topic.separator = wanted

    # -- open files ------------------------------------------------------------------

    @precondition(lambda self: bool(self.topics))
    @rule(target=files, data=st.data(), produce=st.booleans())
    def open_writer(self, data: st.DataObject, produce: bool) -> int:
        name = data.draw(st.sampled_from(sorted(self.topics)))
        path = f"/{name}/produce" if produce else f"/{name}/0"
        inode = self.inode(path)
        flags = os.O_WRONLY if produce else APPEND
        fh: int = call(lambda: self.ops.open(inode, flags, CTX)).fh
        self.open_files[fh] = FileModel(fh, name, self.topics[name].life)
        return fh

    @precondition(lambda self: bool(self.topics))
    @rule(target=readers, data=st.data(), view=st.booleans())
    def open_reader(self, data: st.DataObject, view: bool) -> int:
        name = data.draw(st.sampled_from(sorted(self.topics)))
        inode = self.inode(f"/{name}/0@earliest" if view else f"/{name}/0")
        fh: int = call(lambda: self.ops.open(inode, os.O_RDONLY, CTX)).fh
        self.open_files[fh] = FileModel(fh, name, self.topics[name].life)
        return fh

    @rule(fh=files, data=writes)
    def write(self, fh: int, data: bytes) -> None:
        f = self.open_files[fh]
        result: list[int] = []

        async def go() -> None:
            result.append(await self.ops.write(fh, 0, data))

        code = errno_of(go)
        if not self.alive(f):
            assert code in DEAD
            return
        topic = self.model_of(f)
        if topic.raw:
            assert code is None
            assert result == [len(data)]  # any size, byte for byte
            topic.data += data
            return
        whole = f.pending + data
        cut = whole.rfind(b"\n") + 1
        lines, tail = whole[:cut].split(b"\n")[:-1], whole[cut:]
        fitting = [fits(line, topic.separator) for line in lines]
        if code is not None:
            assert code == errno.EFBIG
            assert not all(fitting) or not fits(tail, topic.separator)
            return  # nothing appended, the pending line kept
        (written,) = result
        if written == len(data):
            assert all(fitting)
            assert fits(tail, topic.separator)
            topic.lines.extend(lines)
            f.pending = tail
            return
        # A short write: whole lines appended (the pending line with the first), the
        # rest refused when the writer sends it again.
        assert 0 < written < len(data)
        assert data[written - 1 : written] == b"\n"
        done = f.pending + data[:written]
        topic.lines.extend(done.split(b"\n")[:-1])
        f.pending = b""
        assert not all(fitting)

    @rule(fh=files)
    def flush_a_duplicate(self, fh: int) -> None:
        # A child exits, a dup() is closed: FUSE flush, no release. Appends nothing.
        f = self.open_files[fh]
        code = errno_of(lambda: self.ops.flush(fh))
        if self.alive(f) or not f.pending:
            assert code is None
        else:
            assert code in DEAD  # close() reports that the pending line is lost

    @rule(fh=files)
    def fsync(self, fh: int) -> None:
        f = self.open_files[fh]
        code = errno_of(lambda: self.ops.fsync(fh, False))
        if not self.alive(f):
            assert code in DEAD
            return
        assert code is None
        if f.pending:
            self.append_line(self.model_of(f), f.pending)
            f.pending = b""

    @rule(fh=consumes(files))
    def release(self, fh: int) -> None:
        f = self.open_files.pop(fh)
        assert errno_of(lambda: self.ops.release(fh)) is None
        if self.alive(f) and f.pending:
            self.append_line(self.model_of(f), f.pending)

    @rule(fh=readers, size=st.integers(1, 700))
    def read(self, fh: int, size: int) -> None:
        f = self.open_files[fh]
        got: list[bytes] = []

        async def go() -> None:
            got.append(bytes(await self.ops.read(fh, f.offset, size)))

        code = errno_of(go)
        if not self.alive(f):
            assert code in DEAD
            return
        assert code is None
        expected = self.model_of(f).rendered()[f.offset : f.offset + size]
        assert got == [expected]
        f.offset += len(expected)

    @rule(fh=consumes(readers))
    def release_reader(self, fh: int) -> None:
        del self.open_files[fh]
        assert errno_of(lambda: self.ops.release(fh)) is None

    def read_whole(self, inode: int) -> bytes:
        async def go() -> bytes:
            fh = (await self.ops.open(inode, os.O_RDONLY, CTX)).fh
            try:
                return bytes(await self.ops.read(fh, 0, 1 << 20))
            finally:
                await self.ops.release(fh)

        return call(go)

    # -- the log after every step ----------------------------------------------------

    @invariant()
    def log_matches_the_model(self) -> None:
        assert sorted(self.manager.topics()) == sorted(self.topics)
        for name, topic in self.topics.items():
            log = self.manager.log(name, 0)
            log._check()
            metadata = self.manager.topic(name)
            assert (metadata.format == "raw", metadata.key_separator) == (
                topic.raw,
                None if topic.separator is None else topic.separator.decode(),
            )
            records = list(log.records(0))
            if topic.raw:
                assert b"".join(r.value or b"" for r in records) == topic.data
            else:
                sep = topic.separator
                shown = [
                    (r.value or b"")
                    if r.key is None or sep is None
                    else r.key + sep + (r.value or b"")
                    for r in records
                ]
                assert shown == topic.lines
            rendered = topic.rendered()
            rendering = Rendering.of(metadata, 0)
            assert sum(len(rendering.render(b).data) for b in log.batches(0)) == len(rendered)
            assert log.extension_end == len(rendered)
            inode = self.inode(f"/{name}/0")
            assert call(lambda i=inode: self.ops.getattr(i, CTX)).st_size == len(rendered)  # type: ignore[misc]
            assert self.read_whole(inode) == rendered


TestWrites = WriteMachine.TestCase
TestWrites.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)

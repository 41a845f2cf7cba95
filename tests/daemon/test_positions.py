"""Byte positions against an in-memory model: a hypothesis state machine.

The model is the byte string of every record ever rendered (positions are global and
fixed at append) plus the position where retention left the oldest retained record;
each open reader is a kernel offset and a shift. Appends of lines in random sizes and
key layouts, rolls of tiny segments, retention, reopening the log (the position index is
then read back from disk, or rebuilt when deleted), and reads that continue, seek or
start in a gap are checked against it, with the engine's own invariant check after
every step.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, precondition, rule

from seglogfs.daemon.lines import append_lines
from seglogfs.daemon.position_reader import PositionReader
from seglogfs.positions import (
    POSITION_INDEX_SUFFIX,
    Rendering,
    position_index_spec,
    position_of_offset,
)
from storage import Log, LogManager

lines = st.lists(
    st.tuples(
        st.one_of(
            st.none(),
            st.binary(min_size=0, max_size=6).filter(lambda b: b":" not in b and b"\n" not in b),
        ),
        st.binary(min_size=0, max_size=120).filter(lambda b: b"\n" not in b),
    ),
    min_size=1,
    max_size=40,
)


class PositionMachine(RuleBasedStateMachine):
    readers = Bundle("readers")

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="seglog-positions-"))
        self.manager = self._open()
        self.manager.create_topic(
            "t", 1, {"segment.bytes": "700", "retention.bytes": "-1"}, key_separator=":"
        )
        self.rendering = Rendering.of(self.manager.topic("t"), 0)
        self.model = b""
        self.starts: list[int] = []  # the position of each offset's record
        self.start_position = 0
        self.kernel: dict[int, tuple[PositionReader, int]] = {}  # reader id -> (reader, k)
        self.next_reader = 0

    def _open(self) -> LogManager:
        return LogManager.open(self.dir, extension=position_index_spec)

    @property
    def log(self) -> Log:
        return self.manager.log("t", 0)

    def teardown(self) -> None:
        self.manager.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    @rule(batch=lines)
    def append(self, batch: list[tuple[bytes | None, bytes]]) -> None:
        data = b"".join(
            (value if key is None else key + b":" + value) + b"\n" for key, value in batch
        )
        appended, _infos = append_lines(self.log, data, b":")
        assert appended == len(data)
        for key, value in batch:
            self.starts.append(len(self.model))
            self.model += (value if key is None else key + b":" + value) + b"\n"

    @precondition(lambda self: self.log.number_of_segments > 1)
    @rule(data=st.data())
    def retention(self, data: st.DataObject) -> None:
        log = self.log
        target = data.draw(st.integers(log.log_start_offset, log.log_end_offset))
        log.advance_log_start_offset(target)  # may land inside a segment
        log.delete_old_segments()
        first = log.log_start_offset
        # Records below the log start are gone for readers, even inside a segment.
        self.start_position = self.starts[first] if first < len(self.starts) else len(self.model)

    @rule(delete_index=st.booleans())
    def reopen(self, delete_index: bool) -> None:
        self.manager.close()
        if delete_index:
            for path in (self.dir / "t-0").glob(f"*{POSITION_INDEX_SUFFIX}"):
                path.unlink()  # rebuilt from the .log on open
        self.manager = self._open()
        self.kernel.clear()  # open files do not survive the daemon

    @rule(target=readers)
    def open_reader(self) -> int:
        self.next_reader += 1
        self.kernel[self.next_reader] = (PositionReader(), 0)
        return self.next_reader

    @rule(reader=readers, size=st.integers(1, 3000), ahead=st.sampled_from([0, 1, 500, 5000]))
    def read_on(self, reader: int, size: int, ahead: int) -> None:
        if reader not in self.kernel:
            return
        position_reader, k = self.kernel[reader]
        got = bytes(position_reader.read(self.log, self.rendering, k, size, ahead))
        g = k + position_reader.shift
        # The model of a read: a gap continues at the oldest retained record.
        assert g >= self.start_position
        assert got == self.model[g : g + size]
        self.kernel[reader] = (position_reader, k + len(got))

    @rule(reader=readers, size=st.integers(1, 3000), back=st.integers(0, 200))
    def read_rendered(self, reader: int, size: int, back: int) -> None:
        # What the event loop answers from batches rendered before: the model's bytes,
        # or None (the worker thread then reads); nothing in a gap or past the end.
        if reader not in self.kernel:
            return
        position_reader, k = self.kernel[reader]
        k = max(0, k - back)
        got = position_reader.read_rendered(self.log, k, size)
        if got is None:
            return
        g = k + position_reader.shift
        assert self.start_position <= g
        assert g + size <= len(self.model)
        assert bytes(got) == self.model[g : g + size]
        self.kernel[reader] = (position_reader, k + size)

    @rule(data=st.data())
    def read_anywhere(self, data: st.DataObject) -> None:
        reader = PositionReader()
        position = data.draw(st.integers(0, len(self.model) + 5))
        size = data.draw(st.integers(1, 2000))
        got = bytes(reader.read(self.log, self.rendering, position, size))
        start = max(position, self.start_position)
        assert got == self.model[start : start + size]
        assert reader.shift == start - position

    @precondition(lambda self: len(self.starts) > 0)
    @rule(data=st.data())
    def offset_to_position(self, data: st.DataObject) -> None:
        log = self.log
        offset = data.draw(st.integers(log.log_start_offset, log.log_end_offset))
        expected = self.starts[offset] if offset < len(self.starts) else len(self.model)
        assert position_of_offset(log, self.rendering, offset) == expected

    @invariant()
    def sizes(self) -> None:
        log = self.log
        assert log.extension_end == len(self.model)
        assert log.extension_start <= self.start_position
        reader = PositionReader()
        assert (
            bytes(reader.read(log, self.rendering, 0, 1 << 30)) == self.model[self.start_position :]
        )
        assert reader.shift == self.start_position
        log._check()


def test_positions_survive_a_rebuild_after_retention(tmp_path: Path) -> None:
    # Found by PositionMachine: retention deletes the first segment, the position index
    # files go missing, and the reopened log must still end at the same position.
    with LogManager.open(tmp_path, extension=position_index_spec) as manager:
        manager.create_topic("t", 1, {"segment.bytes": "700"}, key_separator=":")
        for count in (1, 1, 1, 1, 2, 8, 26):
            append_lines(manager.log("t", 0), b"\n" * count, b":")
        log = manager.log("t", 0)
        assert log.number_of_segments == 2
        log.advance_log_start_offset(log.active_segment.base_offset)
        assert log.delete_old_segments() == 1
        assert (log.extension_start, log.extension_end) == (14, 40)
    for path in (tmp_path / "t-0").glob(f"*{POSITION_INDEX_SUFFIX}"):
        path.unlink()
    with LogManager.open(tmp_path, extension=position_index_spec) as manager:
        log = manager.log("t", 0)
        assert (log.extension_start, log.extension_end) == (14, 40)


TestPositions = PositionMachine.TestCase
TestPositions.settings = settings(max_examples=25, stateful_step_count=20, deadline=None)

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
from storage import Log, LogManager, OffsetMap

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


# -- compaction: positions laid again, readers find their place by offset -------------------


class CompactedPositionMachine(RuleBasedStateMachine):
    """Positions of a compacted partition across cleaning passes.

    The model is the lines the log holds, by offset (each line names its offset, so a
    reader's bytes say which records it got), and the end position, which only appends
    move: a pass lays the records it kept end to end up to the first record it did not
    clean, so the log's bytes are the model's lines back to back, ending there. Open
    readers read on across appends, rolls, passes and retention (what ``tail -f``,
    ``less`` and ``dd`` do); everything a reader got must be whole lines in increasing
    offsets, each the record's line, with no record skipped that the log still holds.
    """

    readers = Bundle("readers")

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="seglog-compacted-positions-"))
        self.manager = LogManager.open(self.dir, extension=position_index_spec)
        self.manager.create_topic(
            "t",
            1,
            {"segment.bytes": "400", "cleanup.policy": "compact", "file.delete.delay.ms": "0"},
            key_separator=":",
        )
        self.rendering = Rendering.of(self.manager.topic("t"), 0)
        self.lines: dict[int, bytes] = {}  # offset -> its line, while the log holds it
        self.every: dict[int, bytes] = {}  # offset -> its line, ever
        self.end = 0  # the log end position
        self.got: dict[int, tuple[PositionReader, int, bytearray]] = {}
        self.next_reader = 0

    @property
    def log(self) -> Log:
        return self.manager.log("t", 0)

    def teardown(self) -> None:
        self.manager.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    @rule(keys=st.lists(st.sampled_from([b"a", b"b", b"c", b"dd", b"eee"]), min_size=1, max_size=9))
    def append(self, keys: list[bytes]) -> None:
        first = self.log.log_end_offset
        batch = [
            k + b":" + b"%d-" % (first + i) + k * (first % 7) + b"\n" for i, k in enumerate(keys)
        ]
        data = b"".join(batch)
        appended, _infos = append_lines(self.log, data, b":")
        assert appended == len(data)
        for i, line in enumerate(batch):
            self.lines[first + i] = self.every[first + i] = line
        self.end += len(data)

    @rule()
    def roll(self) -> None:
        self.log.roll()

    @rule()
    def clean(self) -> None:
        log = self.log
        uncleanable = log.active_segment.base_offset
        latest = {
            line.split(b":")[0]: o for o, line in sorted(self.lines.items()) if o < uncleanable
        }
        self.lines = {
            o: line
            for o, line in self.lines.items()
            if o >= uncleanable or latest[line.split(b":")[0]] == o
        }
        log.clean(OffsetMap(24 * 1000))

    @rule(target=readers)
    def open_reader(self) -> int:
        self.next_reader += 1
        self.got[self.next_reader] = (PositionReader(), 0, bytearray())
        return self.next_reader

    @rule(reader=readers, size=st.integers(1, 600), ahead=st.sampled_from([0, 1, 300, 5000]))
    def read_on(self, reader: int, size: int, ahead: int) -> None:
        position_reader, k, got = self.got[reader]
        data = bytes(position_reader.read(self.log, self.rendering, k, size, ahead))
        got += data
        self.got[reader] = (position_reader, k + len(data), got)

    @rule(reader=readers)
    def read_to_the_end(self, reader: int) -> None:
        position_reader, k, got = self.got[reader]
        while data := bytes(position_reader.read(self.log, self.rendering, k, 1000, 300)):
            got += data
            k += len(data)
        self.got[reader] = (position_reader, k, got)
        # At the end it has every record the log holds after the first it got.
        offsets = [int(line.split(b":")[1].split(b"-")[0]) for line in bytes(got).splitlines()]
        assert not offsets or [o for o in sorted(self.lines) if o >= offsets[0]] == [
            o for o in offsets if o in self.lines
        ]

    @invariant()
    def the_file_is_the_lines_laid_up_to_the_end(self) -> None:
        log = self.log
        body = b"".join(line for _o, line in sorted(self.lines.items()))
        assert log.extension_end == self.end
        assert log.extension_start == self.end - len(body)
        assert bytes(PositionReader().read(log, self.rendering, 0, 1 << 30)) == body
        for offset in self.lines:
            assert position_of_offset(log, self.rendering, offset) == self.end - len(
                b"".join(line for o, line in sorted(self.lines.items()) if o >= offset)
            )
        log._check()

    @invariant()
    def readers_got_whole_records_in_order(self) -> None:
        for _reader, _k, got in self.got.values():
            *whole, partial = bytes(got).split(b"\n")
            offsets = [int(line.split(b":")[1].split(b"-")[0]) for line in whole]
            assert offsets == sorted(set(offsets)), offsets  # no repeat, no reorder
            for offset, line in zip(offsets, whole, strict=True):
                assert line + b"\n" == self.every[offset]
            if offsets:
                # Nothing skipped that the log still holds.
                held = [o for o in self.lines if offsets[0] <= o <= offsets[-1]]
                assert set(held) <= set(offsets), (held, offsets)
            assert not partial or any(
                line.startswith(partial)
                for o, line in self.every.items()
                if not offsets or o > offsets[-1]
            )


TestCompactedPositions = CompactedPositionMachine.TestCase
TestCompactedPositions.settings = settings(max_examples=30, stateful_step_count=30, deadline=None)

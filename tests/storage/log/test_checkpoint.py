"""Tests for storage.log.checkpoint: Kafka's offset checkpoint text files."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage.errors import StorageError
from storage.log.checkpoint import read_offset_checkpoint, write_offset_checkpoint

NAME = "recovery-point-offset-checkpoint"


def test_round_trip(tmp_path: Path) -> None:
    path = tmp_path / NAME
    offsets = {("orders", 0): 1234, ("orders", 1): 0, ("__consumer_offsets", 49): 7}
    write_offset_checkpoint(path, offsets)
    assert read_offset_checkpoint(path) == offsets


def test_exact_bytes_are_kafkas_and_sorted(tmp_path: Path) -> None:
    path = tmp_path / NAME
    write_offset_checkpoint(
        path, {("b", 10): 5, ("a", 2): 9223372036854775807, ("b", 9): 0, ("a", 10): -1}
    )
    # Sorted by topic, then partition numerically (9 before 10).
    assert path.read_bytes() == b"0\n4\na 2 9223372036854775807\na 10 -1\nb 9 0\nb 10 5\n"


def test_empty_checkpoint_bytes(tmp_path: Path) -> None:
    path = tmp_path / NAME
    write_offset_checkpoint(path, {})
    assert path.read_bytes() == b"0\n0\n"
    assert read_offset_checkpoint(path) == {}


def test_missing_file_reads_as_empty(tmp_path: Path) -> None:
    assert read_offset_checkpoint(tmp_path / NAME) == {}


@pytest.mark.parametrize("content", [b"", b"0\n", b"0"])
def test_empty_or_version_only_file_reads_as_empty_like_kafka(
    tmp_path: Path, content: bytes
) -> None:
    path = tmp_path / NAME
    path.write_bytes(content)
    assert read_offset_checkpoint(path) == {}


def test_reads_a_kafka_written_file(tmp_path: Path) -> None:
    path = tmp_path / "log-start-offset-checkpoint"
    path.write_bytes(b"0\n3\nmy-topic 0 0\nmy-topic 2 368769\n__consumer_offsets 13 42\n")
    assert read_offset_checkpoint(path) == {
        ("my-topic", 0): 0,
        ("my-topic", 2): 368769,
        ("__consumer_offsets", 13): 42,
    }


def test_tolerates_crlf_tabs_trailing_spaces_and_no_final_newline(tmp_path: Path) -> None:
    path = tmp_path / NAME
    path.write_bytes(b"0\r\n2\r\nt\t0   5  \r\nt 1 6")
    assert read_offset_checkpoint(path) == {("t", 0): 5, ("t", 1): 6}


def test_later_duplicate_entry_wins(tmp_path: Path) -> None:
    path = tmp_path / NAME
    path.write_bytes(b"0\n2\nt 0 5\nt 0 6\n")
    assert read_offset_checkpoint(path) == {("t", 0): 6}


@pytest.mark.parametrize(
    ("content", "line"),
    [
        (b"1\n0\n", 1),
        (b"-1\n0\n", 1),
        (b"v0\n0\n", 1),
        (b" 0\n0\n", 1),
        (b"\n0\n", 1),
        (b"0\nx\n", 2),
        (b"0\n-1\n", 2),
        (b"0\n1.0\n", 2),
        (b"0\n1\nt 0\n", 3),
        (b"0\n1\nt 0 5 extra\n", 3),
        (b"0\n1\n t 0 5\n", 3),
        (b"0\n1\nt x 5\n", 3),
        (b"0\n1\nt 0 five\n", 3),
        (b"0\n1\nt 2147483648 5\n", 3),
        (b"0\n1\nt 0 9223372036854775808\n", 3),
        (b"0\n1\nt 0 1_000\n", 3),
        (b"0\n2\nt 0 5\n\nt 1 6\n", 4),
    ],
)
def test_malformed_lines_raise_with_path_and_line(
    tmp_path: Path, content: bytes, line: int
) -> None:
    path = tmp_path / NAME
    path.write_bytes(content)
    with pytest.raises(StorageError, match=f"line {line}") as info:
        read_offset_checkpoint(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("content", [b"0\n2\nt 0 5\n", b"0\n0\nt 0 5\n", b"0\n3\nt 0 5\nt 1 5\n"])
def test_count_mismatch_raises(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / NAME
    path.write_bytes(content)
    with pytest.raises(StorageError, match=r"expected .* entries but found") as info:
        read_offset_checkpoint(path)
    assert str(path) in str(info.value)


def test_non_utf8_file_raises(tmp_path: Path) -> None:
    path = tmp_path / NAME
    path.write_bytes(b"0\n1\n\xff 0 5\n")
    with pytest.raises(StorageError, match="UTF-8"):
        read_offset_checkpoint(path)


def test_leftover_tmp_is_ignored_by_readers(tmp_path: Path) -> None:
    path = tmp_path / NAME
    write_offset_checkpoint(path, {("t", 0): 1})
    # A crash mid-write leaves a partial temporary file next to the real one.
    (tmp_path / (NAME + ".tmp")).write_bytes(b"0\n5\nt 0 9")
    assert read_offset_checkpoint(path) == {("t", 0): 1}


def test_leftover_tmp_is_overwritten_by_the_next_write(tmp_path: Path) -> None:
    path = tmp_path / NAME
    tmp = tmp_path / (NAME + ".tmp")
    tmp.write_bytes(b"garbage that is much longer than the new checkpoint\n" * 10)
    write_offset_checkpoint(path, {("t", 0): 1})
    assert path.read_bytes() == b"0\n1\nt 0 1\n"
    assert not tmp.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [NAME]


def test_write_replaces_the_previous_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / NAME
    write_offset_checkpoint(path, {("t", 0): 1, ("t", 1): 2})
    write_offset_checkpoint(path, {("u", 0): 3})
    assert read_offset_checkpoint(path) == {("u", 0): 3}


@pytest.mark.parametrize(
    "offsets",
    [
        {("", 0): 1},
        {("has space", 0): 1},
        {("tab\there", 0): 1},
        {("t", 2**31): 1},
        {("t", 0): 2**63},
    ],
)
def test_unwritable_entries_raise_and_keep_the_old_file(
    tmp_path: Path, offsets: dict[tuple[str, int], int]
) -> None:
    path = tmp_path / NAME
    write_offset_checkpoint(path, {("t", 0): 1})
    with pytest.raises(ValueError, match=r"checkpoint|integer"):
        write_offset_checkpoint(path, offsets)
    assert read_offset_checkpoint(path) == {("t", 0): 1}
    assert not (tmp_path / (NAME + ".tmp")).exists()


def test_failed_write_keeps_the_old_file_and_removes_the_tmp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / NAME
    write_offset_checkpoint(path, {("t", 0): 1})

    def failing_fsync(fd: int) -> None:
        raise OSError(5, "simulated I/O error")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="simulated"):
        write_offset_checkpoint(path, {("t", 0): 2})
    monkeypatch.undo()
    assert read_offset_checkpoint(path) == {("t", 0): 1}
    assert not (tmp_path / (NAME + ".tmp")).exists()


def test_write_fsyncs_file_then_directory_after_the_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / NAME
    events: list[str] = []
    real_fsync = os.fsync
    real_replace = os.replace

    def recording_fsync(fd: int) -> None:
        events.append("fsync-dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync-file")
        real_fsync(fd)

    def recording_replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        events.append("rename")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    monkeypatch.setattr(os, "replace", recording_replace)
    write_offset_checkpoint(path, {("t", 0): 1})
    assert events == ["fsync-file", "rename", "fsync-dir"]


def test_non_ascii_topic_round_trips(tmp_path: Path) -> None:
    # Kafka topic names are ASCII, but the file is UTF-8 as Kafka writes it.
    path = tmp_path / NAME
    write_offset_checkpoint(path, {("tópico", 3): 4})
    assert path.read_bytes() == "0\n1\ntópico 3 4\n".encode()
    assert read_offset_checkpoint(path) == {("tópico", 3): 4}


_topics = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCXYZ0123456789._-", min_size=1, max_size=20)


# Each example fsyncs twice; no deadline, so a slow disk cannot fail the test.
@settings(deadline=None, max_examples=50)
@given(
    st.dictionaries(
        st.tuples(_topics, st.integers(0, 2**31 - 1)),
        st.integers(-(2**63), 2**63 - 1),
        max_size=30,
    )
)
def test_any_offsets_round_trip(offsets: dict[tuple[str, int], int]) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / NAME
        write_offset_checkpoint(path, offsets)
        assert read_offset_checkpoint(path) == offsets
        lines = path.read_text().splitlines()
        assert lines[:2] == ["0", str(len(offsets))]
        keys = [(line.split()[0], int(line.split()[1])) for line in lines[2:]]
        assert keys == sorted(keys)

"""Atomic replacement of small files: old or new content, never a mix, no leftovers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from storage.atomic_file import fsync_directory, write_atomically


def tmp_of(path: Path) -> Path:
    return path.with_name(path.name + ".tmp")


def test_creates_a_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint"
    write_atomically(path, b"0\n0\n")
    assert path.read_bytes() == b"0\n0\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]


def test_replaces_content_and_leaves_no_tmp(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint"
    path.write_bytes(b"old content that is longer than the new one")
    write_atomically(path, b"new")
    assert path.read_bytes() == b"new"
    assert not tmp_of(path).exists()
    write_atomically(path, b"")
    assert path.read_bytes() == b""


def test_writes_large_content_completely(tmp_path: Path) -> None:
    path = tmp_path / "big"
    data = bytes(range(256)) * 10_000
    write_atomically(path, data)
    assert path.read_bytes() == data


def test_a_short_os_write_is_continued(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_write = os.write

    def write_three_bytes(fd: int, data: bytes | memoryview) -> int:
        return real_write(fd, bytes(data[:3]))

    monkeypatch.setattr(os, "write", write_three_bytes)
    path = tmp_path / "f"
    write_atomically(path, b"0123456789")
    monkeypatch.undo()
    assert path.read_bytes() == b"0123456789"


def test_a_stale_tmp_is_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint"
    path.write_bytes(b"old")
    tmp_of(path).write_bytes(b"a much longer leftover from a crash before the rename")
    write_atomically(path, b"new")
    assert path.read_bytes() == b"new"
    assert not tmp_of(path).exists()


def test_the_new_file_replaces_by_rename_not_in_place(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint"
    path.write_bytes(b"old")
    old_inode = path.stat().st_ino
    with open(path, "rb") as reader:
        write_atomically(path, b"new")
        # A reader holding the old file still sees the old bytes, whole.
        assert reader.read() == b"old"
    assert path.stat().st_ino != old_inode


@pytest.mark.parametrize("failing", ["write", "fsync"])
def test_a_failing_write_keeps_the_old_content_and_removes_the_tmp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    path = tmp_path / "checkpoint"
    path.write_bytes(b"old")

    def fail(*_args: object) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, failing, fail)
    with pytest.raises(OSError, match="No space left"):
        write_atomically(path, b"new content")
    monkeypatch.undo()
    assert path.read_bytes() == b"old"
    assert not tmp_of(path).exists()


def test_a_failure_after_a_partial_write_keeps_the_old_content(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "checkpoint"
    path.write_bytes(b"old")
    real_write = os.write
    calls = 0

    def write_then_fail(fd: int, data: bytes | memoryview) -> int:
        nonlocal calls
        calls += 1
        if calls > 1:
            raise OSError(5, "Input/output error")
        return real_write(fd, bytes(data[:4]))

    monkeypatch.setattr(os, "write", write_then_fail)
    with pytest.raises(OSError, match="Input/output error"):
        write_atomically(path, b"new content")
    monkeypatch.undo()
    assert calls == 2
    assert path.read_bytes() == b"old"
    assert not tmp_of(path).exists()


def test_a_failing_rename_keeps_the_old_content_and_removes_the_tmp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "checkpoint"
    path.write_bytes(b"old")

    def fail(*_args: object) -> None:
        raise OSError(1, "Operation not permitted")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="not permitted"):
        write_atomically(path, b"new")
    monkeypatch.undo()
    assert path.read_bytes() == b"old"
    assert not tmp_of(path).exists()


def test_a_missing_directory_raises(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        write_atomically(tmp_path / "absent" / "f", b"x")


def test_fsync_directory_accepts_a_directory_and_rejects_a_file(tmp_path: Path) -> None:
    fsync_directory(tmp_path)
    (tmp_path / "f").write_bytes(b"")
    with pytest.raises(NotADirectoryError):
        fsync_directory(tmp_path / "f")

"""Running the command line in-process (fast) or as the installed console script (also
as another user), and checking its one-line errors."""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import pty
import pwd
import shutil
import struct
import subprocess
import sys
import tempfile
import termios
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from seglogfs.cli import main

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(sys.executable).with_name("seglogfs")
BUILD_NOTICE = b"storage: pure Python: "


def strip_build_notice(err: bytes) -> bytes:
    """Drop the engine's notice that it runs from source because a module changed after
    the compiled build (``storage._build``): it depends on the checkout, not on the
    command under test. Any other line stays."""
    return b"".join(
        line for line in err.splitlines(keepends=True) if not line.startswith(BUILD_NOTICE)
    )


@dataclass(frozen=True)
class Result:
    code: int
    out: bytes
    err: str

    @property
    def text(self) -> str:
        return self.out.decode()


Cli = Callable[..., Result]


@pytest.fixture
def cli(
    tmp_path: Path,
    log_dir: Path,
    capsysbinary: pytest.CaptureFixture[bytes],
    monkeypatch: pytest.MonkeyPatch,
) -> Cli:
    """``cli("topics", "list", stdin=b"...")``: ``seglogfs.cli.main`` in this process,
    with ``SEGLOG_LOG_DIR`` set to the test's log directory."""
    monkeypatch.setenv("SEGLOG_LOG_DIR", str(log_dir))
    counter = itertools.count()

    def run(*args: str, stdin: bytes = b"") -> Result:
        capsysbinary.readouterr()
        source = tmp_path / f"stdin-{next(counter)}"
        source.write_bytes(stdin)
        with open(source, "rb") as handle:
            monkeypatch.setattr(sys, "stdin", handle)
            try:
                code = main(list(args))
            except SystemExit as exc:  # argparse's --help, --version and usage errors
                code = exc.code if isinstance(exc.code, int) else 1
        captured = capsysbinary.readouterr()
        return Result(code, captured.out, captured.err.decode())

    return run


def run_script(
    *args: str,
    stdin: bytes = b"",
    env: dict[str, str] | None = None,
    timeout: float = 60,
    runner: tuple[str, ...] = (),
) -> Result:
    """The installed ``seglogfs`` console script in a subprocess (run by ``runner``,
    such as ``setpriv ...``, when given)."""
    environment = {k: v for k, v in os.environ.items() if k != "SEGLOG_LOG_DIR"}
    environment.update(env or {})
    completed = subprocess.run(
        [*runner, str(SCRIPT), *args],
        input=stdin,
        capture_output=True,
        env=environment,
        timeout=timeout,
        check=False,
    )
    return Result(
        completed.returncode, completed.stdout, strip_build_notice(completed.stderr).decode()
    )


def refused(result: Result, code: int, message: str) -> None:
    """``result`` is one error line of the command ending in ``message``, exit
    ``code``, nothing on stdout, no traceback."""
    assert (result.code, result.out) == (code, b""), result.err
    assert result.err.startswith("seglogfs "), result.err
    assert result.err.count("\n") == 1, result.err
    assert "Traceback" not in result.err
    assert result.err.endswith(f": error: {message}\n"), result.err


def tree(root: Path) -> set[str]:
    """Every path under ``root``, relative to it."""
    return {str(path.relative_to(root)) for path in root.rglob("*")}


NOBODY = "nobody"


def _can_switch_user() -> bool:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return False
    try:
        pwd.getpwnam(NOBODY)
    except KeyError:
        return False
    return True


needs_root = pytest.mark.skipif(
    not _can_switch_user(), reason="needs root, setpriv and the user nobody"
)
"""For tests that run a command as another user or mount a tmpfs."""


def as_nobody(*args: str, timeout: float = 60) -> Result:
    """The console script run as the user nobody (setpriv drops every privilege)."""
    runner = (
        "setpriv",
        f"--reuid={NOBODY}",
        "--regid=nogroup",
        "--clear-groups",
        "--inh-caps=-all",
    )
    return run_script(*args, timeout=timeout, runner=runner)


@contextlib.contextmanager
def public_dir() -> Iterator[Path]:
    """A fresh directory every user may enter (pytest's own are 0700)."""
    with tempfile.TemporaryDirectory(prefix="seglog-setup-") as name:
        os.chmod(name, 0o755)
        yield Path(name)


def write(path: Path, text: str) -> Path:
    """``path`` holding ``text``."""
    path.write_text(text)
    return path


@contextlib.contextmanager
def read_only_file_system(where: Path, *, holding: Path) -> Iterator[Path]:
    """A tmpfs at ``where`` holding a copy of ``holding``, remounted read-only."""
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(where)], check=True)
    try:
        shutil.copytree(holding, where / holding.name)
        subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True)
        yield where / holding.name
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def on_terminal(log_dir: Path, *args: str, timeout: float = 120) -> tuple[int, bytes, bytes]:
    """The console script with stderr on a terminal: exit code, stdout, what the
    terminal showed."""
    env = {**os.environ, "SEGLOG_LOG_DIR": str(log_dir)}
    controller, terminal = pty.openpty()
    # An 80-column terminal: a pty starts with 0 columns, where a bar has no room.
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    try:
        process = subprocess.run(
            [str(SCRIPT), *args],
            stdout=subprocess.PIPE,
            stderr=terminal,
            env=env,
            timeout=timeout,
            check=False,
        )
        os.close(terminal)
        shown = b""
        while True:
            try:
                chunk = os.read(controller, 65536)
            except OSError:
                break
            if not chunk:
                break
            shown += chunk
    finally:
        os.close(controller)
    return process.returncode, process.stdout, shown

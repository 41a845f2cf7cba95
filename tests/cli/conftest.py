"""Running the command line in-process (fast) or as the installed console script."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from collections.abc import Callable
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
    *args: str, stdin: bytes = b"", env: dict[str, str] | None = None, timeout: float = 60
) -> Result:
    """The installed ``seglogfs`` console script in a subprocess."""
    environment = {k: v for k, v in os.environ.items() if k != "SEGLOG_LOG_DIR"}
    environment.update(env or {})
    completed = subprocess.run(
        [str(SCRIPT), *args],
        input=stdin,
        capture_output=True,
        env=environment,
        timeout=timeout,
        check=False,
    )
    return Result(
        completed.returncode, completed.stdout, strip_build_notice(completed.stderr).decode()
    )

"""The compiled and pure-Python builds: selection, the debugging switch, stale sources.

Most tests build the compiled engine for real (mypyc and the C compiler, about 20 s)
in a copy of the package under a temporary directory, then import ``storage`` from
that copy in a subprocess; the working tree is never touched.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import pytest

import storage
from storage import _build

ROOT = Path(__file__).resolve().parents[1]


def probe(copy: Path, **env: str) -> tuple[dict[str, Any], str]:
    """Import ``storage`` from ``copy`` in a fresh interpreter; report what ran."""
    code = (
        "import json, sys, importlib.machinery as m, storage\n"
        "from storage.record.batch_builder import build_record_batch\n"
        "from storage.record.record_batch import read_batch\n"
        "from storage.record.render import render_batch\n"
        "batch = read_batch(build_record_batch([b'a', b'bc'], timestamps=0))\n"
        "names = ['storage.record.' + n for n in ('record_columns', 'varint', 'render')]\n"
        "print(json.dumps({\n"
        "  'compiled': storage.compiled,\n"
        "  'reason': storage.build_info,\n"
        "  'extension': {n: isinstance(sys.modules[n].__loader__, m.ExtensionFileLoader)\n"
        "                for n in names},\n"
        "  'package': storage.__file__,\n"
        "  'rendered': render_batch(batch, raw=False, key_separator=None).data.decode(),\n"
        "  'marker': getattr(sys.modules['storage.record.varint'], 'EDITED_MARKER', None),\n"
        "}))\n"
    )
    environment = {k: v for k, v in os.environ.items() if k != _build.PURE_PYTHON_ENV}
    environment.update(env, PYTHONPATH=str(copy))
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=copy, env=environment, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["package"] == str(copy / "storage" / "__init__.py")  # the copy, not main
    assert report["rendered"] == "a\nbc\n"
    return report, result.stderr


def copy_package(dest: Path) -> Path:
    dest.mkdir()
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    shutil.copytree(
        ROOT / "storage",
        dest / "storage",
        ignore=shutil.ignore_patterns("_compiled", "__pycache__"),
    )
    return dest


def build_in_place(copy: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "setup.py", "build_ext", "--inplace"],
        cwd=copy,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=600,
    )


def have_compiler() -> bool:
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    return shutil.which(cc) is not None


@pytest.fixture(scope="module")
def compiled_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the package with the compiled engine built in place (built once)."""
    if not have_compiler():
        pytest.skip(
            "no C compiler: the compiled build cannot be made here (.ci/setup installs one)"
        )
    copy = copy_package(tmp_path_factory.mktemp("build") / "pkg")
    result = build_in_place(copy)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert (copy / "storage" / "_compiled" / "manifest.json").exists(), result.stderr[-2000:]
    return copy


@pytest.fixture
def fresh_copy(compiled_copy: Path, tmp_path: Path) -> Path:
    """A private copy of the compiled copy, for a test that edits sources."""
    dest = tmp_path / "pkg"
    shutil.copytree(compiled_copy, dest, ignore=shutil.ignore_patterns("build", "__pycache__"))
    return dest


def test_compiled_build_loads_the_compiled_modules(compiled_copy: Path) -> None:
    report, stderr = probe(compiled_copy)
    assert report["compiled"] is True
    assert report["reason"].startswith("compiled (mypyc")
    assert report["extension"] == dict.fromkeys(report["extension"], True)
    assert stderr == ""


def test_compiled_files_never_sit_next_to_their_sources(compiled_copy: Path) -> None:
    # Python's own import prefers an extension module over a .py in the same
    # directory; keeping them apart is what lets an edited source win.
    package = compiled_copy / "storage"
    assert [so for so in package.rglob("*.so") if "_compiled" not in so.parts] == []
    manifest = json.loads((package / "_compiled" / "manifest.json").read_text())
    assert manifest["modules"]["storage.record.varint"].startswith("record/varint.")
    assert "record/record_columns.py" in manifest["sources"]
    # imported by compiled modules (from ..errors, from . import legacy_record): in the closure
    assert "errors.py" in manifest["sources"]
    assert "record/legacy_record.py" in manifest["sources"]
    assert "log/log.py" not in manifest["sources"]


def test_environment_variable_forces_pure_python(compiled_copy: Path) -> None:
    report, stderr = probe(compiled_copy, **{_build.PURE_PYTHON_ENV: "1"})
    assert report["compiled"] is False
    assert _build.PURE_PYTHON_ENV in report["reason"]
    assert report["extension"] == dict.fromkeys(report["extension"], False)
    assert stderr == ""
    report, _ = probe(compiled_copy, **{_build.PURE_PYTHON_ENV: "0"})
    assert report["compiled"] is True


@pytest.mark.parametrize("edited", ["record/varint.py", "errors.py"])
def test_edited_source_runs_instead_of_the_stale_compiled_module(
    fresh_copy: Path, edited: str
) -> None:
    source = fresh_copy / "storage" / edited
    source.write_text(source.read_text() + "\nEDITED_MARKER = 1\n")
    report, stderr = probe(fresh_copy)
    assert report["compiled"] is False
    assert report["extension"] == dict.fromkeys(report["extension"], False)  # all or nothing
    assert f"{edited} changed since the compiled build" in stderr
    assert "pip install -e ." in stderr
    if edited == "record/varint.py":
        assert report["marker"] == 1  # the edited source is what runs


def test_touched_but_unchanged_source_keeps_the_compiled_build(fresh_copy: Path) -> None:
    os.utime(fresh_copy / "storage" / "record" / "varint.py")  # git checkout, editors: mtime only
    report, _ = probe(fresh_copy)
    assert report["compiled"] is True


def test_missing_compiled_file_falls_back_with_a_warning(fresh_copy: Path) -> None:
    (next((fresh_copy / "storage" / "_compiled" / "record").glob("render.*.so"))).unlink()
    report, stderr = probe(fresh_copy)
    assert report["compiled"] is False
    assert "compiled files missing for storage.record.render" in stderr


def test_compiled_module_that_fails_to_load_falls_back_with_a_warning(fresh_copy: Path) -> None:
    # e.g. a runtime library older than the one compiled against; here a broken file
    broken = next((fresh_copy / "storage" / "_compiled").glob("_engine__mypyc.*.so"))
    broken.write_bytes(b"not an ELF file")
    report, stderr = probe(fresh_copy)
    assert report["compiled"] is False
    assert report["extension"] == dict.fromkeys(report["extension"], False)
    assert "the compiled modules do not load" in stderr


def test_build_without_a_compiler_installs_pure_python(tmp_path: Path) -> None:
    copy = copy_package(tmp_path / "pkg")
    result = build_in_place(copy, CC=str(tmp_path / "no-such-cc"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "installing the pure-Python modules" in result.stderr
    assert not (copy / "storage" / "_compiled" / "manifest.json").exists()
    report, stderr = probe(copy)
    assert report["compiled"] is False
    assert "not compiled" in report["reason"]
    assert stderr == ""  # nothing stale: no warning


def test_source_saved_during_the_build_leaves_no_manifest(tmp_path: Path) -> None:
    if not have_compiler():
        pytest.skip("no C compiler to build the compiled engine with (.ci/setup installs one)")
    copy = copy_package(tmp_path / "pkg")
    # Runs setup.py with mypycify wrapped: a source is saved right after mypyc read it.
    code = (
        "import runpy, sys, mypyc.build\n"
        "real = mypyc.build.mypycify\n"
        "def mypycify(*args, **kwargs):\n"
        "    extensions = real(*args, **kwargs)\n"
        "    with open('storage/record/varint.py', 'a') as f:\n"
        "        f.write('\\nEDITED_MARKER = 1\\n')\n"
        "    return extensions\n"
        "mypyc.build.mypycify = mypycify\n"
        "sys.argv = ['setup.py', 'build_ext', '--inplace']\n"
        "runpy.run_path('setup.py', run_name='__main__')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=copy, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "sources changed during the build" in result.stderr
    assert not (copy / "storage" / "_compiled" / "manifest.json").exists()
    report, stderr = probe(copy)
    assert report["compiled"] is False
    assert report["marker"] == 1
    assert stderr == ""  # no manifest: nothing stale to warn about


def test_this_process_reports_its_build() -> None:
    selection = _build.SELECTION
    assert storage.compiled is selection.compiled
    loaders = {
        name: type(importlib.import_module(name).__loader__).__name__
        for name in ("storage.record.record_columns", "storage.record.render")
    }
    expected = "ExtensionFileLoader" if selection.compiled else "SourceFileLoader"
    assert set(loaders.values()) == {expected}, (selection.reason, loaders)

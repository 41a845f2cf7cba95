"""Which build of the engine runs: the mypyc-compiled hot modules or their source.

The build (``setup.py``) compiles a few hot modules with mypyc into
``storage/_compiled/``, away from their sources, so Python's own import never picks a
compiled module over its ``.py``; the tree there mirrors the package's
(``_compiled/record/varint.*.so`` is ``storage.record.varint``). ``manifest.json``
there maps each module's dotted name to its compiled file (a path relative to
``_compiled/``) and gives the SHA-256 of every source the build read (the compiled
modules and the storage modules they import), keyed by path relative to ``storage/``
(``record/varint.py``, ``errors.py``). ``select()`` runs once, from
``storage/__init__.py`` before any other storage module is imported, and loads the
compiled modules only when:

- ``SEGLOG_PURE_PYTHON`` is unset, empty or ``0`` (set it to debug in pure Python);
- the manifest exists and was built for this interpreter;
- every source it names is byte-for-byte the one compiled.

Otherwise every module runs from source. It is all or nothing because compiled
modules call each other directly in C: one fresh source among stale compiled
neighbours would still be bypassed. A mismatch after an edit is logged as a warning
(the ``storage`` logger, so a test run does not turn it into an error) naming the
changed files and the command that rebuilds.

Cost: one read and hash of about ten source files at import (about 1 ms measured).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.abc
import importlib.machinery
import json
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType
from typing import Final

PURE_PYTHON_ENV = "SEGLOG_PURE_PYTHON"
"""Set to a non-empty value other than ``0`` to run every module from source."""
PACKAGE_DIR = Path(__file__).resolve().parent
COMPILED_DIR = PACKAGE_DIR / "_compiled"
MANIFEST = COMPILED_DIR / "manifest.json"
REBUILD_HINT = "rebuild with `pip install -e .` (or `bash .ci/setup`)"

_log = logging.getLogger("storage")


@dataclass(frozen=True)
class BuildSelection:
    """The outcome of ``select()``: what runs, and why."""

    compiled: bool
    reason: str
    modules: tuple[str, ...] = ()
    """The compiled modules (shared library included) when ``compiled``."""


class _CompiledModuleFinder(importlib.abc.MetaPathFinder):
    """Finds the compiled file of each module the manifest names, and nothing else."""

    def __init__(self, files: dict[str, Path]) -> None:
        self._files = files

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> ModuleSpec | None:
        file = self._files.get(fullname)
        if file is None:
            return None
        loader = importlib.machinery.ExtensionFileLoader(fullname, str(file))
        return importlib.machinery.ModuleSpec(fullname, loader, origin=str(file))


def _pure_requested() -> bool:
    return os.environ.get(PURE_PYTHON_ENV, "") not in ("", "0")


def _read_manifest() -> dict[str, object] | str:
    """The manifest, or why there is none to use."""
    try:
        manifest = json.loads(MANIFEST.read_bytes())
    except FileNotFoundError:
        return "not compiled (no C compiler or mypyc at install, or a source checkout)"
    except (OSError, ValueError) as exc:
        return f"unreadable build manifest {MANIFEST}: {exc}"
    if not isinstance(manifest, dict) or manifest.get("format") != 1:
        return f"unknown build manifest format in {MANIFEST}"
    if manifest.get("python") != sys.implementation.cache_tag:
        return f"compiled for {manifest.get('python')}, running {sys.implementation.cache_tag}"
    return manifest


def changed_sources(sources: dict[str, str]) -> list[str]:
    """The sources (paths relative to ``storage/``) whose SHA-256 differs from the build's."""
    changed = []
    for name, digest in sorted(sources.items()):
        try:
            actual = hashlib.sha256((PACKAGE_DIR / name).read_bytes()).hexdigest()
        except OSError:
            actual = ""
        if actual != digest:
            changed.append(name)
    return changed


def select() -> BuildSelection:
    """Choose the build and, for the compiled one, install its import finder.

    Runs once, when this module is first imported: ``storage/__init__.py`` imports it
    before any other storage module.
    """
    if _pure_requested():
        return BuildSelection(False, f"pure Python: {PURE_PYTHON_ENV} is set")
    manifest = _read_manifest()
    if isinstance(manifest, str):
        return BuildSelection(False, f"pure Python: {manifest}")
    modules = manifest.get("modules")
    sources = manifest.get("sources")
    if not isinstance(modules, dict) or not isinstance(sources, dict):
        return BuildSelection(False, f"pure Python: incomplete build manifest {MANIFEST}")
    changed = changed_sources(sources)
    if changed:
        reason = (
            f"pure Python: {', '.join(changed)} changed since the compiled build; " + REBUILD_HINT
        )
        _log.warning("storage: %s", reason)
        return BuildSelection(False, reason)
    files = {name: COMPILED_DIR / file for name, file in modules.items()}
    already = sorted(name for name in files if name in sys.modules)
    if already:  # imported from source before us: mixing would bypass them
        return BuildSelection(False, f"pure Python: imported before the build selection: {already}")
    missing = sorted(name for name, file in files.items() if not file.exists())
    if missing:
        reason = f"pure Python: compiled files missing for {', '.join(missing)}; " + REBUILD_HINT
        _log.warning("storage: %s", reason)
        return BuildSelection(False, reason)
    finder = _CompiledModuleFinder(files)
    sys.meta_path.insert(0, finder)
    before = set(sys.modules)
    try:
        # Load them now, while falling back is still possible: a compiled module can
        # fail to initialise (e.g. a runtime library older than the one compiled against).
        for name in sorted(files):
            importlib.import_module(name)
    except Exception as exc:
        sys.meta_path.remove(finder)
        for name in set(sys.modules) - before:
            del sys.modules[name]
        reason = f"pure Python: the compiled modules do not load ({exc}); " + REBUILD_HINT
        _log.warning("storage: %s", reason)
        return BuildSelection(False, reason)
    return BuildSelection(
        True, f"compiled ({manifest.get('compiler', 'mypyc')})", tuple(sorted(files))
    )


SELECTION: Final = select()
"""The build in use in this process."""

"""Build: compile the storage engine's hot modules with mypyc, or install pure Python.

Everything else about the package is in ``pyproject.toml``; this file only adds the
compiled modules. ``pip install .`` and ``pip install -e .`` run mypyc (from mypy, a
build requirement) over ``COMPILED_MODULES`` and a C compiler over its output. When
either is missing or fails, the build says so and installs the pure-Python package:
the same modules run uncompiled.

Where the compiled modules go, and why: not next to their sources, where Python's
import would prefer them over an edited ``.py`` (an editable install would then run
stale code), but in ``storage/_compiled/`` with ``manifest.json``, which records the
SHA-256 of every source the build read. ``storage/_build.py`` loads them only when all
those sources are unchanged; see the README section "Building".
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import sys
from collections.abc import Iterable
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

PACKAGE = "storage"
COMPILED_DIR = "_compiled"
MANIFEST = "manifest.json"
# Chosen by profile (README "Building"): the record decoder, batch headers and
# iteration, the batch builder, varints and the renderer. Not ``file_records``: its scan
# generator closes a descriptor in ``finally``, and a compiled generator dropped before
# its end never runs that block (a descriptor leaked per lookup).
COMPILED_MODULES = (
    "batch_builder",
    "record_batch",
    "record_columns",
    "render",
    "varint",
)
# One mypyc group: the modules call each other natively. Its shared library is
# ``storage._engine__mypyc``.
GROUP = f"{PACKAGE}._engine"

ROOT = Path(__file__).resolve().parent


def storage_imports(module: str) -> set[str]:
    """The ``storage`` modules that ``storage/<module>.py`` imports (names, no package)."""
    tree = ast.parse((ROOT / PACKAGE / f"{module}.py").read_text("utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 and node.module:
                found.add(node.module.split(".")[0])
            elif node.level == 1:
                found.update(alias.name for alias in node.names)
            elif node.module and node.module.startswith(f"{PACKAGE}."):
                found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(f"{PACKAGE}."):
                    found.add(alias.name.split(".")[1])
    return {name for name in found if (ROOT / PACKAGE / f"{name}.py").exists()}


def source_closure(modules: Iterable[str]) -> list[str]:
    """The compiled modules and every storage module they import, transitively.

    mypyc reads all of them (it inlines ``Final`` constants of imported modules, for
    one), so a change to any of them makes the compiled code stale.
    """
    todo = list(modules)
    seen: set[str] = set()
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(storage_imports(module))
    return sorted(seen)


def source_hashes() -> dict[str, str]:
    """SHA-256 of each source the compiled modules are built from, by file name."""
    return {
        f"{name}.py": hashlib.sha256((ROOT / PACKAGE / f"{name}.py").read_bytes()).hexdigest()
        for name in source_closure(COMPILED_MODULES)
    }


COMPILED_SOURCES: dict[str, str] = {}
"""``source_hashes()`` taken just before mypyc reads the sources."""


class BuildCompiledEngine(build_ext):
    """``build_ext`` that writes the manifest, replaces files atomically, and falls back.

    Atomic replacement matters for editable installs: running processes have the
    previous ``.so`` mapped, and overwriting it in place would crash them.
    """

    def run(self) -> None:
        if not self.extensions:
            return
        target = Path(self.get_ext_fullpath(self.extensions[0].name)).parent
        try:
            super().run()
        except Exception as exc:  # no compiler, no headers, a compiler error: go pure
            print(
                f"warning: compiling the storage engine failed ({exc}); "
                "installing the pure-Python modules",
                file=sys.stderr,
            )
            (target / MANIFEST).unlink(missing_ok=True)
            return
        if source_hashes() != COMPILED_SOURCES:
            # Someone saved a source while mypyc read them: which version got compiled
            # is unknown, so the build must not be trusted for any of them.
            print(
                "warning: storage sources changed during the build; the compiled modules "
                "will not be used until the next build",
                file=sys.stderr,
            )
            (target / MANIFEST).unlink(missing_ok=True)
            return
        manifest = {
            "format": 1,
            "compiler": f"mypyc {_mypy_version()}",
            "python": sys.implementation.cache_tag,
            "modules": {
                _loaded_name(ext.name): Path(self.get_ext_fullpath(ext.name)).name
                for ext in self.extensions
            },
            "sources": COMPILED_SOURCES,
        }
        # The manifest goes last: until it names the new files' sources, an
        # interpreter starting now either runs the previous build (same sources) or
        # finds a mismatch and runs pure Python; never a mix.
        _write_atomically(target / MANIFEST, json.dumps(manifest, indent=2).encode() + b"\n")

    def copy_file(  # type: ignore[override]
        self, infile: str, outfile: str, *args: object, **kwargs: object
    ) -> tuple[str, bool]:
        Path(outfile).parent.mkdir(parents=True, exist_ok=True)
        _write_atomically(Path(outfile), Path(infile).read_bytes(), mode=0o755)
        return outfile, True


def _write_atomically(path: Path, data: bytes, mode: int = 0o644) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _loaded_name(extension_name: str) -> str:
    """``storage._compiled.varint`` (where the file goes) -> ``storage.varint`` (its name)."""
    return extension_name.replace(f".{COMPILED_DIR}.", ".")


def _mypy_version() -> str:
    from mypy.version import __version__

    return __version__


def compiled_extensions() -> list[Extension]:
    """mypyc's extensions, renamed so that their files land in ``storage/_compiled/``.

    The file name's last component keeps the module's ``PyInit_`` name; the loader in
    ``storage/_build.py`` imports each under its real name.
    """
    try:
        from mypyc.build import mypycify
    except ImportError as exc:
        print(f"warning: mypyc unavailable ({exc}); pure-Python build", file=sys.stderr)
        return []
    paths = [f"{PACKAGE}/{name}.py" for name in COMPILED_MODULES]
    COMPILED_SOURCES.update(source_hashes())
    # mypyc counts any message as a failure. The project's config warns about
    # sections for modules the build does not read; and in pip's isolated build
    # environment the runtime dependencies are absent, so their values are ``Any``: the
    # strict checks about ``Any`` (and ignores that only apply with their types) are
    # for the project's own mypy run, not for this one.
    relaxed = [
        "--no-warn-unused-configs",
        "--no-warn-return-any",
        "--no-warn-unused-ignores",
        "--allow-subclassing-any",
        "--allow-untyped-calls",
        "--allow-untyped-decorators",
    ]
    try:
        extensions = mypycify([*relaxed, *paths], group_name=GROUP, opt_level="3")
    except SystemExit:  # mypyc reports type errors and exits
        print("warning: mypyc failed (above); pure-Python build", file=sys.stderr)
        return []
    for ext in extensions:
        package, _, name = ext.name.rpartition(".")
        ext.name = f"{package}.{COMPILED_DIR}.{name}"
    return extensions


setup(
    ext_modules=compiled_extensions(),
    cmdclass={"build_ext": BuildCompiledEngine},
)

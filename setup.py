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

Module names here are relative to ``storage`` (``record.varint``), and source files are
paths relative to ``storage/`` (``record/varint.py``), as the manifest keys them.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path, PurePosixPath

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

PACKAGE = "storage"
COMPILED_DIR = "_compiled"
MANIFEST = "manifest.json"
# Chosen by profile (README "Building"): the record decoder, batch headers and
# iteration, the batch builder, varints and the renderer, all in ``record``, the record
# format; and the log cleaner's per-record loops (``log.compaction_scan``, the key scan
# of a batch; ``log.offset_map``, the map's fill and lookups), which import nothing of
# ``log`` but each other. Not ``file_records``: its scan generator closes a descriptor
# in ``finally``, and a compiled generator dropped before its end never runs that block
# (a descriptor leaked per lookup).
COMPILED_MODULES = (
    "log.compaction_scan",
    "log.offset_map",
    "record.batch_builder",
    "record.record_batch",
    "record.record_columns",
    "record.render",
    "record.varint",
)
# One mypyc group: the modules call each other natively. Its shared library is
# ``storage._engine__mypyc``.
GROUP = f"{PACKAGE}._engine"

ROOT = Path(__file__).resolve().parent


def source_file(module: str) -> str:
    """``record.varint`` -> ``record/varint.py``: a module's source, relative to ``storage/``."""
    return f"{module.replace('.', '/')}.py"


def storage_file(parts: Sequence[str]) -> str | None:
    """The source of module or package ``storage.<parts>`` (relative to ``storage/``).

    A package is its ``__init__.py``; ``None`` when no such file is under ``storage/``.
    """
    relative = "/".join(parts)
    candidates = (f"{relative}.py", f"{relative}/__init__.py") if parts else ("__init__.py",)
    for candidate in candidates:
        if (ROOT / PACKAGE / candidate).is_file():
            return candidate
    return None


def storage_imports(source: str) -> set[str]:
    """The storage sources that ``storage/<source>`` imports (paths relative to ``storage/``).

    Resolves relative imports at any level (``from ..errors import X``, ``from . import
    x``, ``from .x import y``) and absolute ones (``import storage.log.segment``). For
    ``from P import n``, ``n`` counts when it is a submodule of ``P``, and ``P`` when some
    ``n`` is not (``from .x import y``), not when ``P`` is only the package of the
    submodules imported (``from . import x``, ``from ..record import record``).
    A parent package's ``__init__.py`` counts only when imported from like that:
    importing a submodule runs it, but the compiled code takes nothing from it.
    """
    package = PurePosixPath(source).parent.parts  # of __init__.py too: it is its package
    tree = ast.parse((ROOT / PACKAGE / source).read_text("utf-8"))
    found: set[str | None] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            named = node.module.split(".") if node.module else []
            if node.level:
                up = node.level - 1
                if up > len(package):  # above storage/: not a storage module
                    continue
                target = [*package[: len(package) - up], *named]
            elif named[0] == PACKAGE:
                target = named[1:]
            else:
                continue
            submodules = {storage_file([*target, alias.name]) for alias in node.names} - {None}
            found |= submodules
            if len(submodules) < len(node.names):  # some name is an attribute of P
                found.add(storage_file(target))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                named = alias.name.split(".")
                if named[0] == PACKAGE:
                    found.add(storage_file(named[1:]))
    return {file for file in found if file is not None}


def source_closure(modules: Iterable[str]) -> list[str]:
    """The compiled modules' sources and every storage source they import, transitively.

    mypyc reads all of them (it inlines ``Final`` constants of imported modules, for
    one), so a change to any of them makes the compiled code stale.
    """
    todo = [source_file(module) for module in modules]
    seen: set[str] = set()
    while todo:
        source = todo.pop()
        if source not in seen:
            seen.add(source)
            todo.extend(storage_imports(source))
    return sorted(seen)


def source_hashes() -> dict[str, str]:
    """SHA-256 of each source the compiled modules are built from, by path in ``storage/``."""
    return {
        source: hashlib.sha256((ROOT / PACKAGE / source).read_bytes()).hexdigest()
        for source in source_closure(COMPILED_MODULES)
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
        # ``storage/_compiled/`` (here or in the build directory): where the file of a
        # module named ``storage._compiled.x`` goes; the manifest is not a module.
        target = Path(self.get_ext_fullpath(f"{PACKAGE}.{COMPILED_DIR}.x")).parent
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
                _loaded_name(ext.name): Path(self.get_ext_fullpath(ext.name))
                .relative_to(target)
                .as_posix()
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
    """``storage._compiled.record.varint`` (where the file goes) -> ``storage.record.varint``."""
    return extension_name.replace(f".{COMPILED_DIR}.", ".", 1)


def _mypy_version() -> str:
    from mypy.version import __version__

    return __version__


def compiled_extensions() -> list[Extension]:
    """mypyc's extensions, renamed so that their files land in ``storage/_compiled/``.

    ``storage.record.varint`` becomes ``storage._compiled.record.varint``: the tree under
    ``_compiled/`` mirrors the package's, so two modules of one name in different
    subpackages cannot collide, and the file name's last component keeps the module's
    ``PyInit_`` name. The loader in ``storage/_build.py`` imports each under its real name.
    """
    try:
        from mypyc.build import mypycify
    except ImportError as exc:
        print(f"warning: mypyc unavailable ({exc}); pure-Python build", file=sys.stderr)
        return []
    paths = [f"{PACKAGE}/{source_file(module)}" for module in COMPILED_MODULES]
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
        # mypyc names every module and the group's library ``storage.<...>``
        ext.name = f"{PACKAGE}.{COMPILED_DIR}.{ext.name.removeprefix(f'{PACKAGE}.')}"
    return extensions


setup(
    ext_modules=compiled_extensions(),
    cmdclass={"build_ext": BuildCompiledEngine},
)

"""The layers of the tree hold: each face imports only what its layer allows.

Two checks per rule. Statically, every import statement of a package's modules (also
the ones inside functions, and ``importlib.import_module("...")`` with a literal name)
is resolved to an absolute module name and matched against the rule. At run time, a
subprocess imports every module of the package and lists ``sys.modules``, which also
catches what the imported modules pull in transitively.

The rules (``seglogfs/__init__.py`` states them for readers):

- ``storage`` imports nothing of ``seglogfs``, trio, pyfuse3 or pyspark;
- the shared modules (``seglogfs.positions``, ``producer``, ``open_files_limit``,
  ``properties``, ``setup_check``) import no face, nor trio; ``seglogfs.byte_budget``
  (the listeners' ``queued.max.request.bytes``) imports trio and no face;
- the command line imports nothing of the daemon but its entry point
  (``seglogfs.daemon.mount``, loaded only by the ``mount`` command) and nothing of the
  control socket's server, Spark, trio or pyfuse3;
- the control socket's protocol, client and admin calls import no trio (the command line
  uses them);
- Spark imports neither the daemon nor the command line nor the control server;
- the daemon imports neither the command line nor Spark;
- the Kafka listener (``seglogfs.kafka``, run in the daemon's nursery) imports the
  engine, trio and kio, and no other face (nor pyfuse3).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Rule:
    """Modules under ``package`` (or the ``modules`` listed) may not import any module
    that starts with one of ``forbidden``, except the names in ``allowed``."""

    name: str
    package: str
    forbidden: tuple[str, ...]
    modules: tuple[str, ...] = ()
    allowed: tuple[str, ...] = ()
    runtime: bool = True


FACES = ("seglogfs.daemon", "seglogfs.cli", "seglogfs.control", "seglogfs.kafka", "seglogfs.spark")
RULES = (
    Rule("storage", "storage", ("seglogfs", "trio", "pyfuse3", "pyspark")),
    Rule(
        "shared",
        "seglogfs",
        (*FACES, "trio", "pyfuse3", "pyspark"),
        modules=(
            "seglogfs.positions",
            "seglogfs.producer",
            "seglogfs.open_files_limit",
            "seglogfs.properties",
            "seglogfs.setup_check",
        ),
    ),
    Rule(
        "shared-async",
        "seglogfs",
        (*FACES, "pyfuse3", "pyspark"),
        modules=("seglogfs.byte_budget",),
    ),
    Rule(
        "cli",
        "seglogfs.cli",
        ("seglogfs.daemon", "seglogfs.control.server", "seglogfs.spark", "trio", "pyfuse3"),
        allowed=("seglogfs.daemon.mount",),
    ),
    Rule(
        "control-client",
        "seglogfs.control",
        ("seglogfs.daemon", "seglogfs.cli", "seglogfs.spark", "trio", "pyfuse3"),
        modules=(
            "seglogfs.control",
            "seglogfs.control.admin",
            "seglogfs.control.protocol",
            "seglogfs.control.client",
        ),
    ),
    Rule(
        "spark",
        "seglogfs.spark",
        ("seglogfs.daemon", "seglogfs.cli", "seglogfs.control.server", "trio", "pyfuse3"),
    ),
    Rule("daemon", "seglogfs.daemon", ("seglogfs.cli", "seglogfs.spark", "pyspark")),
    Rule(
        "kafka",
        "seglogfs.kafka",
        ("seglogfs.daemon", "seglogfs.cli", "seglogfs.control", "seglogfs.spark", "pyfuse3"),
    ),
)


def _module_files(rule: Rule) -> dict[str, Path]:
    """Module name -> file, for the modules a rule covers."""
    base = ROOT / rule.package.replace(".", "/")
    found: dict[str, Path] = {}
    for path in sorted(base.rglob("*.py")):
        if "_compiled" in path.parts:
            continue
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    if rule.modules:
        found = {name: path for name, path in found.items() if name in rule.modules}
        assert sorted(found) == sorted(rule.modules), "a listed module is missing"
    return found


def _imported_names(module: str, path: Path) -> set[str]:
    """Every absolute module name ``path`` imports, wherever the statement stands."""
    is_package = path.name == "__init__.py"
    package_parts = module.split(".") if is_package else module.split(".")[:-1]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package_parts[: len(package_parts) - node.level + 1]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            names.add(prefix)
            # ``from . import x`` and ``from pkg import submodule`` name modules too.
            names.update(f"{prefix}.{alias.name}" for alias in node.names)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names.add(node.args[0].value)
    return names


def _violations(rule: Rule, names: set[str]) -> list[str]:
    def matches(name: str, prefix: str) -> bool:
        return name == prefix or name.startswith(prefix + ".")

    return sorted(
        name
        for name in names
        if any(matches(name, prefix) for prefix in rule.forbidden)
        and not any(matches(name, allowed) for allowed in rule.allowed)
    )


@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.name)
def test_imports_follow_the_layers(rule: Rule) -> None:
    files = _module_files(rule)
    assert files, f"no modules found for {rule.package}"
    bad = {
        module: found
        for module, path in files.items()
        if (found := _violations(rule, _imported_names(module, path)))
    }
    assert bad == {}


@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.name)
def test_importing_a_layer_loads_no_forbidden_module(rule: Rule) -> None:
    modules = sorted(name for name in _module_files(rule) if not name.endswith("__main__"))
    code = (
        "import importlib, json, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    loaded = set(json.loads(result.stdout))
    assert set(modules) <= loaded
    assert _violations(rule, loaded) == []


def test_the_checker_sees_a_violation(tmp_path: Path) -> None:
    # The static check must be able to fail: a relative import of the daemon from a
    # command-line module, and a lazy import_module, are both found.
    source = tmp_path / "topics.py"
    source.write_text(
        "from ..daemon import operations\n"
        "def f():\n"
        "    import importlib\n"
        "    importlib.import_module('seglogfs.control.server')\n"
    )
    names = _imported_names("seglogfs.cli.topics", source)
    cli_rule = next(rule for rule in RULES if rule.name == "cli")
    assert _violations(cli_rule, names) == [
        "seglogfs.control.server",
        "seglogfs.daemon",
        "seglogfs.daemon.operations",
    ]

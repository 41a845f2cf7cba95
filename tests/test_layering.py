"""``storage`` is a pure library: importing it pulls in no daemon, trio, FUSE or Spark."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = ("trio", "pyfuse3", "pyspark", "seglogfs")


def test_storage_imports_no_upper_layer() -> None:
    code = (
        "import json, sys, pkgutil, importlib, storage\n"
        "for m in pkgutil.iter_modules(storage.__path__):\n"
        "    importlib.import_module('storage.' + m.name)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    modules = json.loads(result.stdout)
    assert "storage.log_manager" in modules
    leaked = [m for m in modules if m.split(".")[0] in FORBIDDEN]
    assert leaked == []

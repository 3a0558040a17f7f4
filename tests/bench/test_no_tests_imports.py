"""bench/ does not import from tests/ (issue 39): what both need lives in testkit/, a package
both may import (not shipped in the wheel), which does not import tests/ either. An AST scan of every bench/ module, top-level and
function-local imports alike, and the child scripts bench carries as strings."""
from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CHILD_IMPORT = re.compile(r"^\s*(?:from|import)\s+(tests(?:\.[\w.]+)?)\b", re.M)


def _imports_of_tests(path: Path) -> list[str]:
    """The `tests` modules one file imports, anywhere in it, and in the child scripts it
    carries as strings (bench/write_crossings.py runs one)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found += [m.group(1) for m in CHILD_IMPORT.finditer(node.value)]
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name == "tests" or a.name.startswith("tests.")]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "tests" or node.module.startswith("tests."):
                found.append(node.module)
    return found


def offenders() -> dict[str, list[str]]:
    """bench/ and testkit/ (what bench imports must not pull tests/ in behind it)."""
    out = {}
    for path in sorted([*(REPO / "bench").rglob("*.py"), *(REPO / "testkit").rglob("*.py")]):
        mods = _imports_of_tests(path)
        if mods:
            out[str(path.relative_to(REPO))] = mods
    return out


def test_the_scan_sees_every_import_form(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("import os\nimport tests.kclient as k\nfrom .tests import x\n"
                   "def f():\n    from tests.e2e.nfsrs_support import connect\n"
                   "CHILD = \'\'\'\nimport os\nfrom tests.nfsd import ops_harness\n\'\'\'\n")
    assert sorted(_imports_of_tests(src)) == ["tests.e2e.nfsrs_support", "tests.kclient", "tests.nfsd"]


def test_bench_does_not_import_tests():
    found = offenders()
    assert not found, f"bench/ or testkit/ imports tests/ (move what both need into testkit/): {found}"

"""bench/ does not import from tests/ (issue 39): what both need lives in a package both may
import. An AST scan of every bench/ module, top-level and function-local imports alike.

Not all of it has moved yet: NOT_YET lists the bench modules that still import tests/ (the
harnesses: the kernel client and Ganesha, the crash server, moto and the fault proxy, the NFS
client). The list only shrinks: a bench module not on it that imports tests/ fails, and so
does one on it that no longer does (take it off)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CHILD_IMPORT = re.compile(r"^\s*(?:from|import)\s+(tests(?:\.[\w.]+)?)\b", re.M)

NOT_YET = {
    "bench/cold_read.py", "bench/fattr_encode.py", "bench/instructions.py", "bench/kclient_compare.py",
    "bench/latency.py", "bench/nfs_groupcommit.py", "bench/nfsrs_throughput.py",
    "bench/scenarios/kclient.py", "bench/scenarios/request.py", "bench/scenarios/s3.py",
    "bench/small_file_anatomy.py", "bench/small_files_ab.py", "bench/stack.py", "bench/upload_drain.py",
    "bench/uploader_index.py", "bench/write_crossings.py",
}


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
    out = {}
    for path in sorted((REPO / "bench").rglob("*.py")):
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
    new = {f: m for f, m in found.items() if f not in NOT_YET}
    assert not new, f"bench/ imports tests/ (move what both need into a package both import): {new}"
    moved = NOT_YET - set(found)
    assert not moved, f"no longer import tests/: take them off NOT_YET: {sorted(moved)}"

"""The compiled part of ckptgw: the per-request engine's typed Cython modules (issue 37).

pyproject.toml holds the metadata; this file only lists the extensions, so that `pip install`
of a checkout (or of the sdist) compiles them, the way asyncpg and uvloop build theirs.

- Every `nfsd/native/*.pyx` is one extension module `nfsd.native.NAME`.
- Generated sources: build-time generators (rpcgen's model) write `.pyx` files from the `.x`
  text before cythonize runs; each is listed in GENERATORS and never committed (.gitignore).
- CKPTGW_ASAN=1 builds with AddressSanitizer (the fuzz run of the native parsers; run it with
  LD_PRELOAD of libasan, see tests/fuzz); CKPTGW_NATIVE_DEBUG=1 keeps symbols and drops -O2.
"""
from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

from setuptools import Extension, setup

HERE = Path(__file__).resolve().parent
NATIVE = HERE / "nfsd" / "native"

# (generator script, the .pyx it writes): run before cythonize, in this order.
GENERATORS: list[tuple[str, str]] = [("nfsd/xdr/gen_cython.py", "nfsd/native/xdr_nfs4.pyx")]


def _generate() -> None:
    for script, target in GENERATORS:
        path = HERE / script
        if not path.exists():
            sys.exit(f"setup.py: generator {script} missing")
        runpy.run_path(str(path), run_name="__main__")
        if not (HERE / target).exists():
            sys.exit(f"setup.py: {script} did not write {target}")


def _extensions() -> list[Extension]:
    # -g0 / -s: Python's own build flags carry -g, which made the generated codec's module 15 MB
    # and its compile a third slower; CKPTGW_NATIVE_DEBUG=1 keeps the symbols.
    compile_args = ["-O2", "-fno-strict-aliasing", "-g0"]
    link_args: list[str] = ["-s"]
    if os.environ.get("CKPTGW_NATIVE_DEBUG"):
        compile_args = ["-O0", "-g"]
        link_args = []
    if os.environ.get("CKPTGW_ASAN"):
        compile_args = [a for a in compile_args if a != "-g0"]
        compile_args += ["-fsanitize=address", "-fno-omit-frame-pointer", "-g"]
        link_args = [a for a in link_args if a != "-s"] + ["-fsanitize=address"]
    mods = []
    for pyx in sorted(NATIVE.glob("*.pyx")):
        mods.append(Extension(f"nfsd.native.{pyx.stem}", [str(pyx.relative_to(HERE))],
                              extra_compile_args=compile_args, extra_link_args=link_args))
    return mods


def _cythonized() -> list[Extension]:
    _generate()
    exts = _extensions()
    if not exts:
        return []
    from Cython.Build import cythonize
    return cythonize(exts, language_level=3, annotate=bool(os.environ.get("CKPTGW_CYTHON_ANNOTATE")),
                     compiler_directives={"boundscheck": False, "wraparound": False,
                                          "initializedcheck": False, "cdivision": True,
                                          "embedsignature": True})


setup(ext_modules=_cythonized())

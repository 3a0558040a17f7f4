"""The native (typed Cython) half of the per-request engine (issue 37), compiled by the package's build.

Each module here has a pure-Python reference elsewhere in nfsd/ that stays the specification:
differential tests hold the native module to it, byte for byte and error for error.

`engine()` says which one the server runs: "native" when the extensions are built, unless
CKPTGW_ENGINE=python asks for the reference (A/B benchmarks, bisecting a difference). A
CKPTGW_ENGINE=native on a checkout whose extensions are not built is an error, not a silent
fallback: CI sets it so that a broken build cannot pass as the Python engine.
"""
from __future__ import annotations

import importlib
import os

ENGINES = ("native", "python")


class NativeUnavailable(ImportError):
    """CKPTGW_ENGINE=native, but the compiled modules are missing (not built, or a failed build)."""


def _built(module: str) -> bool:
    try:
        importlib.import_module(f"nfsd.native.{module}")
    except ImportError:
        return False
    return True


def engine(module: str = "rpc") -> str:
    """ "native" or "python" for the native module `module` (see the module docstring)."""
    want = os.environ.get("CKPTGW_ENGINE", "").strip().lower()
    if want and want not in ENGINES:
        raise ValueError(f"CKPTGW_ENGINE={want!r}: expected one of {', '.join(ENGINES)}")
    if want == "python":
        return "python"
    if _built(module):
        return "native"
    if want == "native":
        raise NativeUnavailable(
            f"CKPTGW_ENGINE=native but nfsd.native.{module} is not built: run `pip install -e .` "
            "(scripts/bootstrap.sh does) with Cython and a C compiler present")
    return "python"

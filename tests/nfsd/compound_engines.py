"""Both COMPOUND loops, for the tests that call the loop's pieces directly: nfsd/compound.py (the
reference) and nfsd/native/compound.pyx (the typed one, when built; CKPTGW_ENGINE=native makes
a missing build an error rather than a skip)."""
from __future__ import annotations

import importlib
import os

import pytest

from nfsd import compound


def native_compound():
    """nfsd.native.compound, or None when it is not built (and not demanded)."""
    try:
        return importlib.import_module("nfsd.native.compound")
    except ImportError:
        if os.environ.get("CKPTGW_ENGINE", "").strip().lower() == "native":
            raise
        return None


_NATIVE = native_compound()
_SKIP = pytest.mark.skipif(_NATIVE is None, reason="nfsd.native.compound is not built")


def params(python, native_name: str):
    """pytest params: the reference's `python` and the native module's `native_name`."""
    return [pytest.param(python, id="python"),
            pytest.param(getattr(_NATIVE, native_name, None), id="native", marks=_SKIP)]


DECODERS = params(compound.decode_compound, "decode_compound")
RESULTS = params(compound._Results, "Results")
LOOPS = params(compound.python_run_compound, "run_compound")

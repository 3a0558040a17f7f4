"""Load a .x specification that ships next to this package into a module namespace."""
from __future__ import annotations

import os
import sys
from importlib import resources
from typing import Any, Iterable

from . import core
from .xparser import load_spec


def load_package_spec(filename: str, imports: dict[str, Any] | None = None,
                      zero_copy: Iterable[tuple[str, str]] = (),
                      limits: dict[str, int] | None = None) -> dict[str, Any]:
    pkg = resources.files(__package__)
    text = pkg.joinpath(filename).read_text(encoding="utf-8")
    cache = None
    if isinstance(pkg, os.PathLike):          # a real directory (not a zip): cache beside .pyc
        tag = sys.implementation.cache_tag or "py"
        cache = os.path.join(os.fspath(pkg), "__pycache__", f"{filename}.{tag}.xdrcode")
    with core.code_cache(cache):
        return load_spec(text, imports=imports, zero_copy=zero_copy, limits=limits)

"""Load a .x specification that ships next to this package into a module namespace."""
from __future__ import annotations

from importlib import resources
from typing import Any, Iterable

from .xparser import load_spec


def load_package_spec(filename: str, imports: dict[str, Any] | None = None,
                      zero_copy: Iterable[tuple[str, str]] = ()) -> dict[str, Any]:
    text = resources.files(__package__).joinpath(filename).read_text(encoding="utf-8")
    return load_spec(text, imports=imports, zero_copy=zero_copy)

"""Declared arguments of the admin commands: what a caller may send, nothing more.

A request's `args` are checked against its command's schema before the command runs: an
unknown key, a value of the wrong JSON type or out of bounds is refused (AdminError
"bad_request", exit 2 in the CLI), so no caller can reach a command's internal parameters
(`retention apply`'s clock, prefix or rules) by naming them. Every size a caller controls is
bounded here (string lengths, list lengths, numbers).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .admin import AdminError

MAX_PATH = 4096          # PATH_MAX
MAX_TEXT = 256
MAX_ITEMS = 100_000


@dataclass(frozen=True)
class Arg:
    """One argument: JSON kind ("str", "bool", "int", "number", "str_list"), bounds, help."""
    kind: str
    help: str
    lo: float | None = None
    hi: float | None = None
    max_len: int = MAX_TEXT          # characters of a string / items of a list

    def check(self, name: str, value: Any) -> Any:
        kind = self.kind
        if kind == "bool":
            if not isinstance(value, bool):
                raise _bad(name, "true or false", value)
            return value
        if kind == "str":
            if not isinstance(value, str):
                raise _bad(name, "a string", value)
            if len(value) > self.max_len:
                raise AdminError("bad_request", f"argument {name!r}: expected at most {self.max_len} "
                                 f"characters, got {len(value)}")
            return value
        if kind == "str_list":
            if not isinstance(value, list) or not all(isinstance(v, str) and len(v) <= MAX_TEXT for v in value):
                raise _bad(name, f"an array of strings (each at most {MAX_TEXT} characters)", value)
            if len(value) > self.max_len:
                raise AdminError("bad_request", f"argument {name!r}: expected at most {self.max_len} "
                                 f"items, got {len(value)}")
            return value
        if kind in ("int", "number"):
            ok = isinstance(value, int) if kind == "int" else isinstance(value, (int, float))
            if isinstance(value, bool) or not ok or (isinstance(value, float) and not math.isfinite(value)):
                raise _bad(name, "an integer" if kind == "int" else "a number", value)
            if self.lo is not None and value < self.lo or self.hi is not None and value > self.hi:
                raise AdminError("bad_request", f"argument {name!r}: expected a value in "
                                 f"[{self.lo:g}, {self.hi:g}], got {value!r}")
            return value
        raise AssertionError(kind)


def _bad(name: str, expected: str, value: Any) -> AdminError:
    got = type(value).__name__ if not isinstance(value, (str, int, float)) or isinstance(value, bool) \
        else repr(value)[:40]
    if isinstance(value, bool):
        got = "a boolean"
    return AdminError("bad_request", f"argument {name!r}: expected {expected}, got {got}")


def validate(cmd: str, schema: dict[str, Arg], args: dict) -> dict:
    """The checked arguments (None values count as absent), or AdminError('bad_request')."""
    unknown = sorted(k for k in args if k not in schema)
    if unknown:
        allowed = ", ".join(sorted(schema)) or "none"
        raise AdminError("bad_request", f"{cmd}: unknown argument(s) {', '.join(map(repr, unknown))}; "
                         f"allowed: {allowed}")
    return {k: schema[k].check(k, v) for k, v in args.items() if v is not None}


# shared declarations
PATH = Arg("str", "a path under an export (or export-relative)", max_len=MAX_PATH)

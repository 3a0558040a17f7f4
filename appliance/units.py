"""Human units: parse sizes and durations from config text, format them for tables."""
from __future__ import annotations

import re

_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
    "t": 1000**4, "tb": 1000**4, "p": 1000**5, "pb": 1000**5,
    "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40, "pib": 1 << 50,
}
_DURATION_UNITS = {"": 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0,
                   "d": 86400.0, "w": 7 * 86400.0}
_NUMBER_UNIT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str) -> int:
    """'8MiB' -> 8388608, '10GB' -> 10**10, '4096' -> 4096. ValueError otherwise."""
    m = _NUMBER_UNIT.match(text)
    if not m or m.group(2).lower() not in _SIZE_UNITS:
        raise ValueError(f"not a size: {text!r}")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])


def parse_duration(text: str) -> float:
    """'500ms' -> 0.5, '90s' -> 90, '2h' -> 7200, '30d' -> 2592000, '12' -> 12 (seconds)."""
    m = _NUMBER_UNIT.match(text)
    if not m or m.group(2).lower() not in _DURATION_UNITS:
        raise ValueError(f"not a duration: {text!r}")
    return float(m.group(1)) * _DURATION_UNITS[m.group(2).lower()]


def fmt_bytes(n: float | int | None) -> str:
    """Binary units with one decimal: 0 B, 512 B, 1.5 KiB, 20.0 GiB."""
    if n is None:
        return "-"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{int(n)} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def fmt_rate(bytes_per_s: float | None) -> str:
    return "-" if bytes_per_s is None else fmt_bytes(bytes_per_s) + "/s"


def fmt_seconds(s: float | None) -> str:
    """The one duration style of human output (tables, summaries, retention plans): the largest
    unit and the next when it is not zero, no space: 0.25s, 12s, 1m, 5m03s, 1h, 2h10m, 30d, 3d04h.
    A round value reads as the config file would write it ("1h", "30d").
    uploader.retention.fmt_age follows it (the tests hold the two together)."""
    if s is None:
        return "-"
    if s < 10:
        if s < 1:
            return f"{s:.2g}s" if s else "0s"
        return f"{s:.1f}s".replace(".0s", "s")
    s = int(s)
    for big, n, small, m in (("d", 86400, "h", 3600), ("h", 3600, "m", 60), ("m", 60, "s", 1)):
        if s >= n:
            rest = s % n // m
            return f"{s // n}{big}" + (f"{rest:02d}{small}" if rest else "")
    return f"{s}s"


def table(headers: list[str], rows: list[list], right: set[int] | None = None) -> str:
    """Aligned plain-text table; columns in `right` are right-aligned (numbers)."""
    right = right or set()
    cells = [[str(c) for c in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for r in cells:
        parts = [c.rjust(widths[i]) if i in right else c.ljust(widths[i]) for i, c in enumerate(r)]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)

"""Totals over every simulation of the session (printed by conftest at the end: the long
mode reports how many steps it checked)."""
TOTAL = {"steps": 0, "grants": 0, "drains": 0, "kills": 0, "evictions": 0, "read_throughs": 0, "imports": 0}


def add(stats) -> None:
    for k in TOTAL:
        TOTAL[k] += getattr(stats, k)

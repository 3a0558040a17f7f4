"""Totals over every simulation of the session (printed by conftest at the end: the long
mode reports how many steps it checked)."""
import os
import sys
import time

TOTAL = {"examples": 0, "steps": 0, "grants": 0, "drains": 0, "kills": 0, "evictions": 0, "read_throughs": 0,
         "imports": 0}


PROGRESS_EVERY = 10_000     # the long mode prints a running total (visible with pytest -s)


def add(stats) -> None:
    before = TOTAL["steps"]
    TOTAL["examples"] += 1              # one simulation each: a model example or a scenario
    for k in TOTAL:
        if k != "examples":
            TOTAL[k] += getattr(stats, k)
    if os.environ.get("CKPTGW_LONG") == "1" and before // PROGRESS_EVERY != TOTAL["steps"] // PROGRESS_EVERY:
        print(f"integrity model progress: {time.strftime('%H:%M:%S')} "
              + ", ".join(f"{k}={v}" for k, v in TOTAL.items()), file=sys.stderr, flush=True)

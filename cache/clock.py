"""The store's own clock: what the upload settle window and the backlog age are measured in.

Why not the file's mtime: a client sets it (`touch -d`, `cp -p`, `rsync -t`, a skewed
clock), so a future mtime kept a file from ever being uploaded and an old one skipped the
settle window. Why not the gateway's wall clock either: an NTP step or an operator's
`date -s` would do the same to every file at once (a step back stalls all uploads for
the step's length, a step forward uploads temp names). So the store keeps its own clock:

    now = base + (CLOCK_MONOTONIC now - CLOCK_MONOTONIC at open)

It never goes backwards and ignores wall-clock steps while the process runs. `base` is the
persisted high-water mark: every stamp the index ever recorded is <= the persisted value
(the Writer raises it, by HIGH_WATER_STEP at a time, in the same transaction as a stamp
that would pass it), and a new process starts its clock there. So time also never goes
backwards across a restart, and the time the gateway was down does not count as quiet
time for a file (it was never observed). A new store starts at the wall-clock time of its
creation, so values read like epoch nanoseconds in logs; nothing depends on that.
"""
from __future__ import annotations

import time

#: how far ahead of the newest stamp the persisted high-water mark is set, so the mark is
#: written at most once per step instead of in every write transaction
HIGH_WATER_STEP = 100_000_000      # 100 ms


class StoreClock:
    def __init__(self, base_ns: int, monotonic=time.monotonic_ns):
        self._mono = monotonic
        self._base = base_ns
        self._mono0 = monotonic()

    def now_ns(self) -> int:
        return self._base + (self._mono() - self._mono0)

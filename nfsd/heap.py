"""Give the heap a burst of connections freed back to the OS (glibc's malloc_trim).

A burst of connections (a job's ranks mounting at once, or a hostile churn) frees its
buffers below the top of the heap, where glibc keeps the pages: resident memory stays at the
burst's level though nothing uses it (10-43 MiB after tests/nfsd/test_hostile_clients.py).
malloc_trim(0) hands the free pages of every arena back. The server calls it once a burst
is over (`TrimAfterBursts`), not during one, where the pages would be taken again at once.
One libc call is not worth a dependency: ctypes reaches it on glibc, elsewhere it does nothing.
"""
from __future__ import annotations

import ctypes
import ctypes.util

TRIM_AFTER_CLOSES = 256      # a burst: this many connections ended since the last trim
QUIET_SECONDS = 1.0          # ... and none for this long: the burst is over

_malloc_trim = None


def trim_heap() -> bool:
    """malloc_trim(0): whether the C library has it (and so the call was made)."""
    global _malloc_trim
    if _malloc_trim is None:
        try:
            _malloc_trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
            _malloc_trim.argtypes, _malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
        except (OSError, AttributeError):
            _malloc_trim = False
    if _malloc_trim is False:
        return False
    _malloc_trim(0)
    return True


class TrimAfterBursts:
    """Counts ended connections; `due(now)` once TRIM_AFTER_CLOSES ended since the last trim
    and none for QUIET_SECONDS (the caller then trims). A burst's stragglers get one trim more:
    a burst can pause for a second while some of its connections live on (a hostile client's
    slow records until their timeout), and the buffers those free when they end would stay
    with the allocator, too few closes to count as a burst of their own."""

    def __init__(self) -> None:
        self.closed = 0
        self.last_close = 0.0
        self.trims = 0
        self._stragglers = False     # the last trim ended a burst: the next closes, any, count

    def connection_ended(self, now: float) -> None:
        self.closed += 1
        self.last_close = now

    def due(self, now: float) -> bool:
        if not self.closed or now - self.last_close < QUIET_SECONDS:
            return False
        if self.closed < TRIM_AFTER_CLOSES and not self._stragglers:
            return False
        self._stragglers = self.closed >= TRIM_AFTER_CLOSES
        self.closed = 0
        self.trims += 1
        return True

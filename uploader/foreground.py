"""Foreground first: while NFS clients save or read, the drain keeps few requests in flight.

The uploader shares the gateway's process (its event loop, its GIL) and its CPUs with the
NFS server. Draining a checkpoint at full concurrency while the next one is being saved
costs that save. On the 2-CPU benchmark host (2026-11-26, `ckptgw serve` draining 8 x 64 MiB
to moto, 3 alternated rounds, this ceiling at 2 against none): FILE_SYNC p99 over a local
write+fdatasync 5.2 / 6.2 / 9.5 ms against 18.2 / 10.1 / 11.7 (bench/acklat_drain.py), small-file
saves (4 KiB write+close+rename+unlink) from 1 client 84 / 66 / 87 files/s against 72 / 75 / 73,
from 8 clients 150 / 166 / 162 against 137 / 143 / 134. The save is what stalls the training
job; the upload is background.

So while a client has done a data or namespace op (the NFS server's `last_client_op`) in
the last WINDOW seconds, the request gate admits at most `foreground_concurrency` requests
(at least one: the drain slows down, it never stops). The ceiling is lifted at once
- the drain goes at full concurrency again - when
  * a flush waits (`ckptgw flush`: the operator wants the data in S3 now), or
  * dirty data holds half the store's capacity: the save itself would soon be refused
    (EAGAIN) if the drain fell further behind.
Read-through (restart reads) has a gate of its own and is never held back: it serves the
client. Lease renewals and attribute lookups do not count as client work (a mounted,
idle cluster renews its leases all the time).
"""
from __future__ import annotations

import time
from typing import Callable

WINDOW = 0.5       # seconds after the last client data or namespace op that the ceiling holds


class ForegroundFirst:
    def __init__(self, concurrency: int, *, clock: Callable[[], float] = time.monotonic):
        self.concurrency = concurrency          # 0: never a ceiling
        self.clock = clock
        # set by whoever serves the clients (appliance/daemon.py: the NFS server's stamp);
        # None: nobody does, as in the uploader's own tests and bench/upload_drain.py
        self.last_client_op: Callable[[], float] | None = None
        # set by the uploader: a flush waits, or dirty data is at half the capacity
        self.urgent: Callable[[], bool] = lambda: False

    def ceiling(self, now: float) -> tuple[int | None, float]:
        """(at most this many requests in flight, or None for no ceiling; when to look
        again). The AIMD limiter calls it on every admission decision."""
        if not self.concurrency or self.last_client_op is None:
            return None, float("inf")
        until = self.last_client_op() + WINDOW
        if now >= until or self.urgent():
            return None, float("inf")
        return self.concurrency, until

    def active(self) -> bool:
        """Whether the ceiling holds now (status, metrics)."""
        return self.ceiling(self.clock())[0] is not None

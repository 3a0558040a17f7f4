"""Group commit: one LMDB sync makes every change applied before it started durable.

Every committed write transaction bumps `Index.write_seq`. A caller of `sync()` needs the
sequence number it saw on entry to be covered by a sync that *started* after it. If a sync
is already running, it may have started before the caller's change, so the caller waits
for it and then, if still uncovered, the first waiter runs the next sync for everybody
waiting at that moment. 64 concurrent renames thus cost two or three syncs, not 64.
"""
from __future__ import annotations

import errno
import threading

import lmdb
import structlog

from .api import StoreError

log = structlog.get_logger(__name__)


class GroupCommit:
    def __init__(self, index):
        self.index = index
        self._cond = threading.Condition(threading.Lock())
        self._synced = 0          # every write_seq <= this is durable
        self._running = False
        self.syncs = 0            # number of LMDB syncs performed (for tests/metrics)

    def sync(self) -> None:
        target = self.index.write_seq
        with self._cond:
            while self._synced < target:
                if self._running:
                    self._cond.wait()
                    continue
                self._running = True
                start = self.index.write_seq      # everything applied so far is covered
                self._cond.release()
                try:
                    self._flush()
                except lmdb.Error as e:
                    log.error("commit.sync_failed", error=str(e))
                    raise StoreError(errno.EIO, f"index sync failed: {e}") from None
                finally:
                    self._cond.acquire()
                    self._running = False
                    self._cond.notify_all()
                self.syncs += 1
                self._synced = max(self._synced, start)

    def _flush(self) -> None:
        """One durable LMDB sync (data and meta pages: fdatasync of data.mdb)."""
        self.index.env.sync(True)

"""Group commit: make every index change applied so far durable, with as few syncs as possible.

The index runs LMDB with sync=True, metasync=False (see index.py): each commit that writes
pages fdatasyncs them before writing its meta page, and that fdatasync also flushes the
meta page of every earlier commit. So at any moment every commit but the newest is durable,
and a caller whose change has id T (LMDB's txnid) is covered as soon as either
  * a commit with a larger id has finished (its data sync flushed T's meta page), or
  * an env.sync() that started after T was committed has finished.
Only the second costs a sync, so a waiter first lets an open or queued write txn end (at
most twice): its commit's data sync covers the waiter for free, as under load it nearly
always does, and a group of concurrent namespace ops costs one env.sync, for the last. If one is running it may have started before the caller's
change, so the caller waits for it and then, if still uncovered, the first waiter runs the
next env.sync() for everybody waiting at that moment.
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
        self._synced = 0          # every txnid <= this is durable (an env.sync covered it)
        self._running = False
        self.syncs = 0            # number of env syncs performed (for tests/metrics)
        self.after_sync = None    # called after every sync(): runs file ops made safe by it

    def _covered(self, target: int) -> bool:
        return self._synced >= target or self.index.txnid > target

    def sync(self, upto: int | None = None) -> None:
        """Return once every commit up to txnid `upto` (None: every commit so far) is durable."""
        target = self.index.txnid if upto is None else upto
        waits = 0
        with self._cond:
            while not self._covered(target):
                if self._running:
                    self._cond.wait()
                    continue
                if self.index.busy() and waits < 2:
                    waits += 1
                    self._cond.release()
                    try:
                        self.index.wait_txn_end()
                    finally:
                        self._cond.acquire()
                    continue
                self._running = True
                start = self.index.txnid          # everything committed so far is covered
                self._cond.release()
                try:
                    self._flush()
                except lmdb.Error as e:
                    log.error("commit_sync_failed", error=str(e))
                    raise StoreError(errno.EIO, f"index sync failed: {e}") from None
                finally:
                    self._cond.acquire()
                    self._running = False
                    self._cond.notify_all()
                self.syncs += 1
                self._synced = max(self._synced, start)
        if self.after_sync is not None:
            self.after_sync()

    def covered(self, txnid: int) -> bool:
        """Whether commit `txnid` is durable (see the module docstring)."""
        return self._covered(txnid)

    def _flush(self) -> None:
        """One durable LMDB sync (fdatasync of data.mdb: the newest meta page)."""
        self.index.env.sync(True)

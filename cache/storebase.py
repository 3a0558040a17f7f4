"""What every part of `Store` uses: the store is one object (cache/store.py), its jobs are
mixins in modules of their own (fences.py, writepath.py, ...), all sharing the state that
`Store._open` sets up. Here: the test hook, the regular-file check, whether a file is open,
and a change run as an op of the namespace batch (batch.py) or queued lazily behind it.
"""
from __future__ import annotations

import errno
from concurrent.futures import Future

import structlog

from .api import FileType, StoreError
from .index import Inode

log = structlog.get_logger("cache.store")     # one logger name for every part of the store

MAX_FILE_SIZE = (1 << 63) - 1


class StoreBase:
    """The helpers every mixin of `Store` calls; the state they read is set in `Store._open`."""

    def _is_open(self, ino: int) -> bool:
        """Open state, or a write between its pwrite and its index update: either keeps an
        unlinked inode (and its data file) alive until it ends."""
        return ino in self._opens or ino in self._inflight

    def _hook(self, point: str, ino: int) -> None:
        if self.race_hook is not None:
            self.race_hook(point, ino)

    @staticmethod
    def _regular(rec: Inode) -> None:
        if rec.type == FileType.DIR:
            raise StoreError(errno.EISDIR, f"inode {rec.ino} is a directory")
        if rec.type != FileType.REG:
            raise StoreError(errno.EINVAL, f"inode {rec.ino} is not a regular file")

    def _queue_lazy(self, fn, *args) -> Future | None:
        """fn(writer, *args) as a lazy batch op nobody waits for (bookkeeping: it rides the next
        batch, BatchCommitter.submit); a failure is logged. None once the store began to close."""
        if self.batch.closing:
            return None
        try:
            fut = self.batch.submit(fn, *args, lazy=True)
        except StoreError:                  # the store began to close meanwhile
            return None
        fut.add_done_callback(_log_failure)
        return fut

    def _in_batch(self, fn, *args, durable: bool):
        """fn(writer, *args) as an op of the namespace batch (one index commit with the ops
        queued beside it); while the store closes, in a txn of its own. durable: synced
        before it returns; else readable, and durable with the next sync."""
        if self.batch.closing:
            with self.ix.write() as w:
                result = fn(w, *args)
            if durable:
                self.committer.sync()
            return result
        return self.batch.submit(fn, *args, durable=durable).result()


def _not_local(ino: int, missing: list[tuple[int, int]]) -> StoreError:
    """EAGAIN naming the ABSENT ranges: the caller fetches them (read-through) and retries."""
    err = StoreError(errno.EAGAIN, f"inode {ino}: range not present locally")
    err.missing = missing
    return err


def _log_failure(fut) -> None:
    """Done-callback of a queued op nobody waits for."""
    if fut.exception() is not None:
        log.warning("store_queued_op_failed", error=str(fut.exception()))

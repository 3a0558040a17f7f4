"""Which writes of a file are registered, and the fences of the decisions on "no write of
this file is registered" (invariant I4 at the top of cache/store.py): a part of `Store`.

A write registers (`_inflight`) before its pwrite and unregisters after its index update;
a fill, truncate, evict, reclaim or a commit clearing F_UNCOMMITTED decides under the index
lock with the file fenced (`_fences`), and waits here for its registered writes to end.
"""
from __future__ import annotations

from contextlib import contextmanager

from .index import Writer
from .storebase import StoreBase


class Fences(StoreBase):
    """I4's registrations and fences (state: `_reg`, `_inflight`, `_fences`, `_deferred`,
    `_waiting`, `_writes_done`, set in `Store._open`)."""

    def _writing(self, ino: int, w: Writer) -> int:
        """Registered writes of `ino` (I4) less the lazy records (I5) already applied in
        `w`'s txn or an earlier one: a decision in the same batch sees those records, and
        commits or aborts with them."""
        with self._reg:
            n = self._inflight.get(ino, 0)
            if n:
                txnid = w.txn.id()
                n -= sum(1 for p in self._pending.get(ino, ())
                         if p.landing is not None and p.landing <= txnid)
            return n

    def _hand_to_writer(self, ino: int) -> bool:
        """Under the index lock, for an unlinked `ino`: if a write of it is registered, that
        write reclaims it when it unregisters (True). Checked and handed over under _reg, so
        the write either sees `_deferred` or has already gone."""
        with self._reg:
            if ino in self._inflight:
                self._deferred.add(ino)
                return True
        return False

    def _wait_writes(self, ino: int) -> None:
        """Caller holds the index lock and has fenced `ino`: wait until no write of it is
        between its registration and its index update (I4). New writes cannot register
        while the caller holds the lock (they can while wait() gives it up).
        `_waiting` is raised under _reg with the check, so the write that ends next sees
        it and notifies, and the notify waits for the index lock that wait() gives up."""
        while True:
            with self._reg:
                if not self._inflight.get(ino):
                    return
                self._waiting += 1
                lazy = ino in self._pending
            try:
                self._hook("wait_writes", ino)
                if lazy:
                    self.batch.kick()       # its record is a lazy batch op (I5)
                self._writes_done.wait()
            finally:
                with self._reg:
                    self._waiting -= 1

    def _register(self, inos: tuple[int, ...]) -> None:
        """A write of `inos` begins (I4). Without the index lock, unless one of them is
        fenced: then under it, so after the decision that fenced it is committed."""
        with self._reg:
            if not any(i in self._fences for i in inos):
                _count_up(self._inflight, inos)
                return
        self._hook("register.fenced", inos[0])
        with self.ix.lock, self._reg:
            _count_up(self._inflight, inos)

    def _fence(self, inos) -> None:
        with self._reg:
            _count_up(self._fences, inos)

    def _unfence(self, inos) -> None:
        with self._reg:
            for i in inos:
                _count_down(self._fences, i)

    def _fence_txn(self, w: Writer, ino: int) -> None:
        """Caller holds the index lock in txn `w` and is about to decide on "no write of
        `ino` is registered": fence it until `w` ends (I4)."""
        self._fence((ino,))
        w.on_end.append(lambda: self._unfence((ino,)))

    @contextmanager
    def _fenced(self, inos):
        """Caller holds the index lock: fence `inos` for the block (I4)."""
        self._fence(inos)
        try:
            yield
        finally:
            self._unfence(inos)

    def _unregister(self, inos: tuple[int, ...]) -> None:
        # not under the index lock: a batch commit holds it through its fdatasync, and
        # every write unregisters (see I4 for why _reg is enough)
        ended, unlinked = False, []
        with self._reg:
            for ino in inos:
                if _count_down(self._inflight, ino):
                    ended = True
                    if ino in self._deferred:      # unlinked while we wrote
                        self._deferred.discard(ino)
                        unlinked.append(ino)
            wake = ended and self._waiting > 0
        if wake:
            with self.ix.lock:
                self._writes_done.notify_all()
        for ino in unlinked:
            self._hook("unregister.reclaiming", ino)
            self._reclaim_if_unlinked(ino)


def _count_up(counts: dict[int, int], keys) -> None:
    for key in keys:
        counts[key] = counts.get(key, 0) + 1


def _count_down(counts: dict[int, int], key: int) -> bool:
    """One less of `key`; True when none is left (the key is gone then)."""
    left = counts[key] - 1
    if left:
        counts[key] = left
        return False
    del counts[key]
    return True

"""The write path: a file's bytes change (WRITE, unstable, answered before its index record,
or FILE_SYNC) and its commit (COMMIT, and the uploader's commit of a settled file): a part of
`Store`. Invariants I2 (the flag before the bytes) and I5 (records queued lazily, `_pending`)
at the top of cache/store.py; the registrations of I4 are fences.py's.
"""
from __future__ import annotations

import errno
import time
from concurrent.futures import Future
from contextlib import contextmanager
from typing import TYPE_CHECKING

import structlog

from . import extents
from .api import Attr, DataState, FileType, StoreError
from .batch import HeldFuture
from .fences import _count_down, _count_up
from .index import F_TRUNCATED, F_UNCOMMITTED, Inode, Writer
from .storebase import MAX_FILE_SIZE, StoreBase

if TYPE_CHECKING:
    import asyncio

log = structlog.get_logger("cache.store")     # one logger name for every part of the store

RECORD_RETRIES = 3          # a lazy write record whose batch failed is retried at once so often


class _Pending:
    """An UNSTABLE write (write_nowait) pwritten and answered, its index record queued (I5)."""
    __slots__ = ("offset", "end", "t", "growth", "landing", "landed", "failed", "tries", "queued")

    def __init__(self, offset: int, end: int, t: int, growth: int):
        self.offset, self.end, self.t, self.growth = offset, end, t, growth
        self.landing: int | None = None    # txnid of the txn that applied the record
        self.landed = False                # that txn committed
        self.failed: BaseException | None = None   # the last failure of its batch
        self.tries = 0
        self.queued = False                # its record is in the batch queue (or applied)


class _Held:
    """A write's registration (I4) as _bytes_changing holds it: ended by the block's end,
    or handed on (hand_off) to end when the op carrying the write's record is settled."""
    __slots__ = ("store", "inos", "handed")

    def __init__(self, store, inos: tuple[int, ...]):
        self.store, self.inos, self.handed = store, inos, False

    def hand_off(self):
        self.handed = True
        return lambda: self.store._unregister(self.inos)


class WritePath(StoreBase):
    """Writes and commits (state: `_pending`, `_pending_growth`, `_last_landing`, `_landed`,
    `_flag_unsynced`, `_fresh`, `_wseq`, `_tseq`, `_settled_at`, set in `Store._open`)."""

    def _settle(self, *inos: int) -> None:
        """*Blocking.* Wait until the answered writes of `inos` (I5) have their records in
        the index: for the rarer byte changes (punch, allocate, copy), which read sizes and
        extents from the index alone. Not while holding the index lock (the committer
        needs it): such a caller's writes are its own."""
        if not self.batch.can_wait():
            return
        with self._reg:
            while any(i in self._pending for i in inos):
                self.batch.kick()
                self._landed.wait(1.0)

    def _live_size(self, ino: int, size: int) -> int:
        """`size` (the index's) raised to the end of every pending write of `ino` (no
        truncate is between them and now: a truncate waits for them, I4/I5). Exact only if
        no record can land between the caller's read and this one (the caller holds the
        index write lock, or the store is quiet); else at worst too small: for estimates
        (write_nowait's growth). Exact: _live_size_now."""
        pend = self._pending.get(ino)
        if pend:
            with self._reg:
                for p in self._pending.get(ino, ()):
                    size = max(size, p.end)
        return size

    def write(self, ino: int, offset: int, data: bytes | memoryview) -> Attr:
        """pwrite into the page cache; updates live size/mtime/change; marks the range dirty.
        EAGAIN when dirty data would exceed capacity (caller answers NFS4ERR_DELAY);
        ENOSPC when the disk is full (nothing already stored is damaged). Returns new attrs."""
        return self._write(ino, offset, data, stable=False)

    def write_nowait(self, ino: int, offset: int, data: bytes | memoryview) -> bool:
        """write() for the event loop, in the common case only (I5): the file already holds
        F_UNCOMMITTED durably in this commit cycle, is not fenced, and the room is there.
        Then: register (I4), pwrite (os.pwrite releases the GIL), queue the size/extent
        record as a lazy batch op nobody waits for, and return True; every reader sees the
        write at once (I5). False, with nothing written: the caller runs write() on a worker
        thread (the first write of a cycle, a fenced or new file, no room, an error: it
        answers ENOSPC/EAGAIN/ESTALE there, before the reply)."""
        n = len(data)
        if (n == 0 or offset < 0 or offset + n > MAX_FILE_SIZE or self.batch.closing
                or ino in self._flag_unsynced or self.ix.space_low):
            return False
        fresh = self._fresh.get(ino)
        if fresh is not None and not self.committer.covered(fresh):
            return False
        with self.ix.read() as v:
            rec = v.inode(ino)
            if rec is None or not (rec.is_dirty and rec.flags & F_UNCOMMITTED):
                return False
            size = self._live_size(ino, rec.size)
            growth = n if offset >= size else n - extents.present_bytes(
                v.txn, self.ix.extents, ino, offset, offset + n)
        pending = self._pending_growth
        try:
            if self.space.admit(self.ix.used_bytes + pending, self.ix.dirty_bytes + pending,
                                growth):
                return False                # clean data to evict first: write() does
        except StoreError:
            return False                    # EAGAIN: write() answers it
        with self._reg:
            if ino in self._fences:         # a decision on "no write registered" stands
                return False
            _count_up(self._inflight, (ino,))
        queued = False
        try:
            # registered: a commit or close can clear the flag no more; one that did before
            # has committed (its fence is gone), so this read sees it (as _bytes_changing)
            now = self.ix.read_inode(ino)
            if not (now.is_dirty and now.flags & F_UNCOMMITTED) or ino in self._flag_unsynced:
                return False
            try:
                self.data.pwrite(ino, offset, data)
            except StoreError:
                return False                # write() writes it again, or answers the error
            self._hook("write.pwritten", ino)
            p = _Pending(offset, offset + n, time.time_ns(), growth)
            with self._reg:
                self._pending.setdefault(ino, []).append(p)
                self._pending_growth += growth
                self._wseq[ino] = self._wseq.get(ino, 0) + 1    # after the pwrite (_datasynced)
            queued = True
            self.lazy_writes += 1
            self._queue_record(ino, p, lazy=True)
            p.queued = True                 # a COMMIT from now on is queued after it
            if self._waiting:               # a fill or truncate waits for this file's writes
                self.batch.kick()
            return True
        finally:
            if not queued:
                self._unregister((ino,))

    def _queue_record(self, ino: int, p: _Pending, lazy: bool) -> None:
        try:
            fut = self.batch.submit(self._record_lazy, ino, p, durable=False, lazy=lazy)
        except StoreError:                  # the store began to close: in a txn of its own
            fut = Future()
            try:
                with self.ix.write() as w:
                    fut.set_result(self._record_lazy(w, ino, p))
            except BaseException as e:      # noqa: BLE001 - handed to _record_done
                fut.set_exception(e)
        fut.add_done_callback(lambda f: self._record_done(ino, p, f))

    def _record_lazy(self, w: Writer, ino: int, p: _Pending) -> None:
        """The index record of a write_nowait (I5), as _record_write with the write's time."""
        self._record_write(w, ino, p.offset, p.end - p.offset, t=p.t, counted=True)

        def landed():
            p.landed = True

        def aborted():
            p.landing = None
        w.after_commit.append(landed)
        w.on_abort.append(aborted)         # its nested txn: before the batch commits
        w.on_end.append(lambda: None if p.landed else aborted())
        p.landing = w.txn.id()             # last: snapshots from this commit on hold it

    def _record_done(self, ino: int, p: _Pending, fut: Future) -> None:
        """The record's batch committed (drop the pending write, end its registration) or
        failed (again: a COMMIT fails meanwhile, I5)."""
        exc = fut.exception()
        if exc is None and p.landed:
            with self._reg:
                self._last_landing = max(self._last_landing, p.landing)
                pend = self._pending.get(ino)
                if pend is not None:
                    pend.remove(p)
                    if not pend:
                        del self._pending[ino]
                self._pending_growth -= p.growth
                self._landed.notify_all()
            self._unregister((ino,))
            return
        p.landing = None
        p.failed = exc if exc is not None else StoreError(errno.EIO, "write record not applied")
        p.tries += 1
        if self.batch._abandoned:           # tests: a simulated kill -9, nothing is applied
            return
        log.warning("store_write_record_retry", ino=ino, tries=p.tries, error=str(p.failed))
        self._queue_record(ino, p, lazy=p.tries > RECORD_RETRIES)

    def write_stable(self, ino: int, offset: int, data: bytes | memoryview) -> Attr:
        """*Blocking.* write() and commit() in one: durable when it returns (FILE_SYNC). Its
        index record and its commit are one op of the namespace batch, so a stream of stable
        writes costs one index commit each, not three: the file keeps F_UNCOMMITTED (the
        next write's cycle needs no flag txn), its committed size follows the write, and
        the uploader's commit_settled clears the flag once the file is closed. The same
        steps as write_stable_async, waited for here."""
        fut = HeldFuture()
        self._write_stable_into(ino, offset, data, fut)
        return fut.result()

    def write_stable_async(self, ino: int, offset: int, data: bytes | memoryview, loop, start
                           ) -> "asyncio.Future":
        """write_stable() for a caller on asyncio loop `loop` (called on its thread): an
        asyncio.Future of that loop, set once the bytes and their record are durable.
        start(fn, *args) runs the blocking half (checks, registration, pwrite, the extent
        file's fdatasync) on a worker thread without waiting for it; the worker hands the
        record and the write's registration (I4) to the batch committer and is free again,
        and the committer ends the registration and answers the loop once the record is
        durable: three thread crossings, not four, and no worker blocked on a batch (issue 37
        point 4, as commit_async). `data` must stay valid until the future is done."""
        waiter = self.batch.waiter(loop)
        start(self._write_stable_into, ino, offset, data, waiter)
        return waiter.future

    def _write_stable_into(self, ino: int, offset: int, data, waiter) -> None:
        """The worker's half of a FILE_SYNC write: answered here when it ends here (an
        error, nothing to write, a write that needs two steps), else by the committer."""
        try:
            attr = self._write(ino, offset, data, stable=True, into=waiter)
        except BaseException as e:           # noqa: BLE001 - the caller's answer
            waiter.set_exception(e)
            return
        if attr is not None:
            waiter.set_result(attr)

    def _write(self, ino: int, offset: int, data: bytes | memoryview, stable: bool,
               into=None) -> Attr | None:
        """A write's steps; with `into` (a stable write's future) None when its record was
        handed to the batch committer, which answers `into`."""
        n = len(data)
        if offset < 0 or offset + n > MAX_FILE_SIZE:
            raise StoreError(errno.EFBIG, f"write at {offset}+{n} out of range")
        with self.ix.read() as v:
            rec = v.must_inode(ino)
            self._regular(rec)
            growth = n if offset >= rec.size else n - extents.present_bytes(
                v.txn, self.ix.extents, ino, offset, offset + n)
        if n == 0:
            if stable:
                self.commit(ino)           # FILE_SYNC of nothing still commits what is there
            return rec.attr()
        self._make_room(ino, rec, growth)
        with self._bytes_changing(ino) as held:
            if stable:
                return self._write_stable_applied(ino, offset, data, into, held)
            return self._write_applied(ino, offset, data)

    @contextmanager
    def _bytes_changing(self, ino: int, also: tuple[int, ...] = ()):
        """Around any change of `ino`'s bytes (write, punch, copy): register it (I4) and
        flag the file DIRTY with F_UNCOMMITTED, its data sequence moved, durably, before
        the bytes change (I2). `also`: inodes read meanwhile (a copy's source), registered
        too so no evict, fill or truncate changes them under the copy. The block may hand
        the registration on (`held.hand_off()`: its release, for whoever settles the op
        that ends it); else it ends with the block."""
        flagged = False
        fresh = None
        inos = (ino,) + also
        held = _Held(self, inos)
        self._register(inos)
        try:
            # read again, registered: `rec` may predate a COMMIT that cleared the flag (a
            # commit clears it only while no write is registered, as this one now is, and
            # the decision and its txn are over: the file was fenced meanwhile or not)
            now = self.ix.read_inode(ino)
            if now.is_dirty and now.flags & F_UNCOMMITTED:
                # flagged by a sync'd flag txn, or by its create (new_inode): that txn
                # may not be durable yet if this writer found the file by LOOKUP
                fresh = self._fresh.pop(ino, None)
                if ino in self._flag_unsynced:   # another writer's flag txn, not synced yet
                    flagged = "seen"
            else:
                # the index says "dirty, uncommitted bytes may exist" BEFORE the bytes
                # change, so crash recovery visits this file and cuts what was not
                # committed
                # visible from the flag txn's commit until its sync: write_nowait must not
                # take the flag for durable meanwhile (I2, I5)
                with self._reg:
                    _count_up(self._flag_unsynced, (ino,))
                try:
                    self._flag_txn(ino)
                except BaseException:
                    with self._reg:
                        _count_down(self._flag_unsynced, ino)
                    raise
                flagged = True
        except BaseException:
            self._unregister(inos)
            raise
        try:
            if flagged:
                # durable before the bytes change (once per commit cycle): after a power
                # cut the index must not miss a flag whose bytes did reach the disk
                self.committer.sync()
                if flagged is True:
                    with self._reg:
                        _count_down(self._flag_unsynced, ino)
            elif fresh is not None and not self.committer.covered(fresh):
                try:
                    self.committer.sync(fresh)
                except BaseException:
                    self._fresh.setdefault(ino, fresh)
                    raise
            yield held
        finally:
            if not held.handed:
                self._unregister(inos)

    def _flag_txn(self, ino: int) -> None:
        """The flag txn of a commit cycle's first byte change (I2)."""
        with self.ix.write() as w:
            cur = w.must_inode(ino)
            new = cur.copy()
            if not cur.is_dirty:
                new.state = DataState.DIRTY
            new.flags |= F_UNCOMMITTED
            new.bump_data_seq()      # before the bytes change, as the flag
            w.stamp(new)
            w.put_inode(new, cur)

    def _shrink_to_recorded(self, ino: int) -> None:
        """Cut the extent file back to the size the index records (after a failed pwrite or
        copy that may have grown it), under the write lock so no other change interleaves."""
        with self.ix.write() as w:
            cur = w.inode(ino)
            if cur is not None:
                self.data.shrink_to(ino, self._live_size(ino, cur.size))

    def _pwrite(self, ino: int, offset: int, data) -> None:
        try:
            self.data.pwrite(ino, offset, data)
            self._hook("write.pwritten", ino)
        except StoreError:
            self._shrink_to_recorded(ino)   # a partial write may have grown the file
            raise

    def _write_applied(self, ino: int, offset: int, data) -> Attr:
        self._pwrite(ino, offset, data)
        # in the namespace batch: concurrent WRITEs and namespace ops share one index commit
        # (readable once it returns; not a reason for a sync: unstable until COMMIT)
        return self._in_batch(self._record_write, ino, offset, len(data), durable=False)

    def _write_stable_applied(self, ino: int, offset: int, data, into, held: "_Held"
                              ) -> Attr | None:
        """A registered (I4) FILE_SYNC write: pwrite, fdatasync, then its record and its
        commit in one batch op, durable when `into` is answered. That op and the write's
        registration go to the committer (None returned), which ends the registration once
        the op is settled, before the answer; while the store closes, done here."""
        n = len(data)
        self._pwrite(ino, offset, data)
        # on disk now: every byte below `recorded` (pwritten before its record), and ours
        wseq, tseq, recorded = self._datasynced(ino)
        if offset > recorded:
            # the gap below this write may hold another writer's bytes, pwritten after that
            # datasync: not ours to call committed. Two steps, as WRITE + COMMIT.
            attr = self._in_batch(self._record_write, ino, offset, n, durable=False)
            self.commit(ino)
            return attr
        args = (ino, offset, n, wseq, tseq, max(recorded, offset + n))
        if self.batch.closing:
            return self._in_batch(self._record_stable_write, *args, durable=True)
        # whoever settles `into` releases it: the committer, or our caller if submit raises
        into.release = held.hand_off()
        self.batch.submit(self._record_stable_write, *args, into=into)
        return None

    def _record_stable_write(self, w: Writer, ino: int, offset: int, n: int, wseq: int,
                             tseq: int, size: int) -> Attr:
        attr = self._record_write(w, ino, offset, n)
        # this write is still registered, so the commit half keeps F_UNCOMMITTED
        self._record_commit(w, ino, wseq, tseq, size)
        # whole, as after a COMMIT, if no other write is registered or recorded since the
        # datasync (wseq + 1 is this record) and no truncate: the last close may clear it
        rec = w.inode(ino)
        if (self._writing(ino, w) == 1 and self._wseq.get(ino, 0) == wseq + 1
                and self._tseq.get(ino, 0) == tseq and rec.committed_size == rec.size
                and self.is_open(ino, write=True)):
            self._settled_at[ino] = (wseq + 1, tseq)
        return attr

    def _record_write(self, w: Writer, ino: int, offset: int, n: int, t: int | None = None,
                      counted: bool = False) -> Attr:
        """The index half of a write whose bytes are pwritten: live size, extents, change.
        t: its mtime (default now); counted: its _wseq was bumped at its pwrite."""
        cur = w.inode(ino)
        if cur is None:                    # reclaimed while we wrote
            self.data.remove(ino)
            raise StoreError(errno.ESTALE, f"inode {ino} is gone")
        new = cur.copy()
        if offset + n > new.size:
            new.size = offset + n
        new.local_bytes += extents.set_range(w.txn, self.ix.extents, ino, offset,
                                             offset + n, DataState.DIRTY)
        self._bytes_changed(w, new, cur, t, counted)
        return new.attr()

    def _bytes_changed(self, w: Writer, new: Inode, cur: Inode, t: int | None = None,
                       counted: bool = False) -> None:
        """The index half of a change of a file's bytes (write, punch, copy)."""
        new.mtime_ns = new.ctime_ns = time.time_ns() if t is None else t
        new.change += 1
        new.bump_data_seq()
        if new.state in (DataState.CLEAN, DataState.ABSENT):
            new.state = DataState.DIRTY
        new.flags |= F_UNCOMMITTED
        w.stamp(new)
        w.put_inode(new, cur)
        if not counted:
            self._wseq[new.ino] = self._wseq.get(new.ino, 0) + 1

    # ---- commit ------------------------------------------------------------------
    def commit(self, ino: int) -> None:
        """*Blocking.* fdatasync the file's data and durably record its size/extents. The
        record goes through the batch committer (one txn and one sync with the namespace ops
        and commits queued beside it); while the store closes, in its own txn."""
        todo = self._commit_data(ino)
        if todo is None:
            self.committer.sync()
            return
        record, answered = todo
        # durable on return: its commit covers every txn before it (the writes' too)
        at = self._in_batch(self._record_commit_at, *record, durable=True)
        self._commit_covered(ino, answered, at)

    def commit_async(self, ino: int, loop, start) -> "asyncio.Future":
        """commit() for a caller on asyncio loop `loop` (called on its thread): an
        asyncio.Future of that loop, set once the file's data and record are durable.
        start(fn, *args) runs the blocking half (the data fdatasync) on a worker thread
        without waiting for it; the worker queues the record and is free again, and the
        batch committer answers the loop directly: three thread crossings, not four, and
        no worker blocked on a batch (issue 37 point 4)."""
        answered: list = []
        waiter = self.batch.waiter(loop, lambda at: self._commit_covered(ino, answered, at))
        start(self._commit_into, ino, waiter, answered)
        return waiter.future

    def _commit_into(self, ino: int, waiter, answered: list) -> None:
        """The worker's half of commit_async: everything commit() does up to the record,
        which goes to the batch with `waiter` as its future; every error answers it."""
        try:
            todo = self._commit_data(ino)
            if todo is None:
                self.committer.sync()
                waiter.set_result(None)
                return
            record, answered[:] = todo
            if self.batch.closing:
                waiter.set_result(self._in_batch(self._record_commit_at, *record,
                                                 durable=True))
            else:
                self.batch.submit(self._record_commit_at, *record, into=waiter)
        except BaseException as e:           # noqa: BLE001 - the caller's answer
            waiter.set_exception(e)

    def _commit_data(self, ino: int) -> tuple[tuple, list] | None:
        """commit()'s blocking half: the file's data fdatasynced, and what its index record
        needs: (the _record_commit_at arguments, the answered writes the record must
        cover); None if there is nothing to record (the data was durable already)."""
        with self.ix.read() as v:
            rec = v.must_inode(ino)
        with self._reg:     # answered: their records are queued before this commit's (I5)
            answered = [p for p in self._pending.get(ino, ()) if p.queued]
        if not (self._needs_commit(rec) or answered):
            return None
        return (ino, *self._datasynced(ino)), answered

    @staticmethod
    def _commit_covered(ino: int, answered: list, at: int) -> None:
        """Raise unless commit `at` (the record's txnid) covered every answered write."""
        for p in answered:
            # its batch failed and its record was applied after this commit's (or not
            # yet): the committed size did not cover it; the client retries the COMMIT
            if p.landing is None or p.landing > at:
                raise StoreError(getattr(p.failed, "errno", None) or errno.EIO,
                                 f"write record of inode {ino} was not applied before "
                                 f"its commit: {p.failed}")
        return None

    def _datasynced(self, ino: int) -> tuple[int, int, int]:
        """fdatasync the file's data; returns what _record_commit needs: the write and
        truncate sequences and the recorded size, read before the sync, so every byte
        below that size was pwritten before it. No lock: a write bumps _wseq in its record
        txn, after its pwrite, so whatever a racing txn has made visible here (a newer
        sequence, a larger committed size) describes bytes already pwritten; what it has not
        made visible yet stops _record_commit from clearing the flag."""
        wseq, tseq = self._wseq.get(ino, 0), self._tseq.get(ino, 0)
        # the answered writes (I5) too: pwritten before they were counted in _pending
        size = self._live_size_now(ino)
        self.data.datasync(ino)
        return wseq, tseq, size

    def _live_size_now(self, ino: int) -> int:
        """The file's size with its answered writes (I5), from one consistent view: an
        index snapshot, and the pending writes it does not hold. A record that lands and
        leaves _pending between the two would be in neither (a COMMIT then recorded too
        small a committed size, and a crash cut acknowledged bytes: found by the kill -9
        long run, `test_commit_counts_a_record_that_lands_while_it_reads_the_size`), so
        read again when one left _pending after the snapshot (_last_landing)."""
        while True:
            with self.ix.read() as v:
                snap = v.txn.id()
                size = v.must_inode(ino).size
            self._hook("live_size.read", ino)
            with self._reg:
                if snap < self._last_landing:
                    continue
                for p in self._pending.get(ino, ()):
                    size = max(size, p.end)
                return size

    def _record_commit_at(self, w: Writer, *args) -> int:
        """_record_commit; returns its txnid (commit() compares the answered writes' records)."""
        self._record_commit(w, *args)
        return w.txn.id()

    def _record_commit(self, w: Writer, ino: int, wseq: int, tseq: int, size: int,
                       writers_gone: bool = False) -> None:
        """The index half of commit(): bytes below `size` are on disk (datasync before).
        While a writer has the file open the flag stays (its next write then needs no flag
        txn and two syncs before its bytes: a stream of WRITE+COMMIT cycles costs one index
        commit per cycle fewer); its last close clears it (_writers_gone). writers_gone:
        close() of the store, whose open counts no longer matter."""
        cur = w.inode(ino)
        if cur is not None:
            self._fence_txn(w, ino)
            new = cur.copy()
            if self._tseq.get(ino, 0) == tseq:   # a truncate sets it by itself
                new.committed_size = max(new.committed_size, min(size, new.size))
                new.flags &= ~F_TRUNCATED
                if (self._wseq.get(ino, 0) == wseq and not self._writing(ino, w)
                        and new.committed_size == new.size):
                    if writers_gone or not self.is_open(ino, write=True):
                        new.flags &= ~F_UNCOMMITTED
                    else:
                        self._settled_at[ino] = (wseq, tseq)
            self._hook("flag.decided", ino)
            if new != cur:
                w.stamp(new)
                w.put_inode(new, cur)

    def commit_settled(self, ino: int) -> None:
        """*Blocking.* The uploader takes a closed, settled file's current bytes, committed by
        a client or not (a client that died before COMMIT): commit them first, as a COMMIT
        would, so S3 never holds bytes a restart would cut from the file."""
        with self.ix.read() as v:
            rec = v.must_inode(ino)
        if self._needs_commit(rec):
            self.commit(ino)

    @staticmethod
    def _needs_commit(rec: Inode) -> bool:
        return rec.type == FileType.REG and bool(rec.flags & (F_UNCOMMITTED | F_TRUNCATED)
                                                 or rec.committed_size != rec.size)

"""The narrow store API that nfsd and the uploader call.

Threading: every method is thread-safe. Methods marked *blocking* may wait for disk
sync (fdatasync / LMDB sync) and must be called from a worker thread by asyncio code;
all others are quick (an LMDB txn without sync, page-cache I/O) and may run on the loop.

Durability: namespace mutations (create, mkdir, symlink, link, unlink, rmdir, remove,
rename) are batched (batch.py: every op queued at that moment in one LMDB write txn) and
are durable when the call returns (`submit()`: when its future completes). setattr and the
other quick writes are applied at once and become durable at the next `sync()`
(group-committed: one LMDB sync covers every caller waiting at that moment). Data `write()` goes to the page cache and
is visible at once (read-after-write); `commit(ino)` makes the file's data and its size /
extent index durable. Bytes written past the last committed size are dropped by crash
recovery (they were unstable writes; the new write verifier tells clients to resend).

Names are `bytes` (one path component). Invalid names raise StoreError(EINVAL)
(empty, ".", "..", containing b"/" or NUL) or StoreError(ENAMETOOLONG) (> 255 bytes).

Invariant between the index and the extent files (this module owns it):
  I1. Every byte the index describes as local (DIRTY/CLEAN extents below `size`, holes
      included) is in the inode's extent file, at every instant and after any crash.
  I2. A write's bytes reach the file only after the index says the file may hold
      uncommitted bytes (F_UNCOMMITTED, durable once per commit cycle), so recovery visits
      every file whose bytes may differ from its committed, uploaded state.
  I3. Bytes leave an extent file (evict unlink, reclaim of an unlinked inode, truncate)
      only after the index change that stops describing them is durable; the index keeps
      naming the pending file operation (orphans, drops, F_TRUNCATED/unsettled) until it
      is done, and recovery finishes it after a crash.
  I4. One file's writes, read-through fills, truncates, evictions and commits are
      linearizable: a write registers (`_inflight`) before its pwrite and unregisters
      after its index update; fill, truncate and evict run under the index lock and only
      while no write of that file is registered, so a fill never overwrites bytes a client
      wrote and a truncate never cuts bytes a write is about to describe. Every decision
      on "no write of X is registered" (those, a commit clearing F_UNCOMMITTED, a
      reclaim) is taken under the index lock with X fenced (`_fences`, set under `_reg`
      before the check, kept until that change is committed or abandoned), and a write of
      a fenced file registers under the index lock: so while such a decision stands, the
      registrations of X can only shrink, and a decision on "a write is registered" is at
      worst conservative. Registering an unfenced file and unregistering need only `_reg`,
      so a writer waits for no batch commit's fdatasync to start or end its write.
      Tests: tests/cache/test_races.py.
  I5. An UNSTABLE write may reply before its index record exists (`write_nowait`, on the
      event loop: only when the file is already DIRTY with F_UNCOMMITTED durable, not
      fenced, not in `_flag_unsynced`/uncovered `_fresh`, and the room is there). Its record
      (size, extents, mtime/ctime = the write's time, change, data sequence) is a lazy op of
      the namespace batch; from its pwrite until that record is committed the write is a
      `_Pending` of `_pending[ino]`, and it stays registered (I4) until then: so every
      I4 decision (fill, truncate, evict, reclaim, a commit or close clearing the flag)
      treats it as a write between its pwrite and its index update, which it is, and a
      truncate or fill waits for the record (kicking the batch) before it cuts or fills.
      (Ending the registration at the pwrite would let a truncate cut at an index size
      without the write and the record then grow the file back past the truncate, and a
      fill overwrite a range the record has not marked DIRTY yet.) A decision inside the
      batch that applied the record counts it as ended (`_writing`): it commits or aborts
      with the record.
      Until the record is committed the store answers as if it were: getattr, lookup,
      readdir and READ (size, EOF, which ranges are local), SEEK, COMMIT (the size it makes
      durable), close and the uploader read the index snapshot *plus* every pending write
      that snapshot does not hold (`_overlay`: a record is in a snapshot iff its `landing`
      txnid is set and <= the snapshot's id; `landing` is set in the record's txn and
      cleared at once if that txn aborts, so no other commit can reuse its id meanwhile; a
      reader whose snapshot predates a record already dropped from `_pending` reads again,
      `_last_landing`: every reader that combines a snapshot with `_pending` does, COMMIT's
      size included, `_live_size_now`). The batch queue is FIFO, so a COMMIT, truncate or namespace op
      answered after the WRITE applies after its record; a COMMIT also fails (the client
      retries) while a record it covers has not landed (a failed batch is retried). Crash:
      the flag was durable before the pwrite (I2), so recovery cuts the file to its
      committed size and the new write verifier makes clients resend, as for any unstable
      write. Tests: tests/cache/test_model.py (writes left pending), tests/cache/test_lazy_writes.py.

One process opens a store at a time (an flock on <path>/store.lock; a second open gets
StoreError(EBUSY)). Layout: `Store` is one object with one state, set up here in `_open`;
this module keeps the front (open with recovery, close, reclaim of unlinked inodes, the
namespace, open and close of files, reads, client records) and its other jobs are mixins,
each in a module of its own: writepath.py (writes and commits: I2, I5), fences.py (the
registrations and fences of I4), sparsecopy.py (holes, SEEK, DEALLOCATE, ALLOCATE, COPY),
eviction.py (room for new bytes, eviction, pins, read-through fill), remote.py (object
records, import), uploadqueue.py (files ready for upload, the job queue), storebase.py
(the helpers they share). Below them: index.py (LMDB), data.py (extent files), extents.py
(extent maps), namespace.py (namespace ops), batch.py (namespace batches), commit.py (group
commit), recovery.py, check.py, space.py (capacity and eviction policy).
"""
from __future__ import annotations

import errno
import fcntl
import os
import struct
import threading
import time
from concurrent.futures import Future
from dataclasses import replace as _replace
from typing import Iterator

import structlog

from . import extents
from .api import (Attr, ChangeInfo, DataState, DirEntry, Extent, FileType, SetAttr, StatFS,
                  StoreError, ROOT_INO)
from .batch import BatchCommitter
from .commit import GroupCommit
from .data import DataFiles
from .drops import DurableDrops
from .check import check
from .eviction import Eviction
from .fences import Fences
from .index import (F_TRUNCATED, F_UNCOMMITTED, FIRST_COOKIE, SENT_SINCE, Index, Inode, Writer,
                    client_key, pack_client, unpack_client)
from .keys import U64
from .namespace import Namespace, validate_name
from .queuecache import DecodedJobs
from .readcache import ReadCache
from .recovery import recover
from .remote import RemoteRecords
from .replies import ReplyRecords, drop_replies
from .space import Space
from .sparsecopy import SparseCopy
from .storebase import MAX_FILE_SIZE, _log_failure, _not_local
from .uploadqueue import UploadQueue
from .writepath import WritePath, _Pending

log = structlog.get_logger(__name__)

LRU_GRANULARITY_NS = 30 * 1_000_000_000   # re-stamp a read file's LRU key at most this often
READDIR_BATCH = 256
FILES_TOTAL = 1 << 40


CLOSE_COMMIT_CHUNK = 1024   # files committed per index txn by close()


class Store(Fences, WritePath, SparseCopy, Eviction, RemoteRecords, UploadQueue, ReplyRecords):
    """The store (see the module's docstring); the methods of its bases are its own, on the
    state this class sets up: cache/fences.py, writepath.py, sparsecopy.py, eviction.py,
    remote.py, uploadqueue.py, replies.py."""

    # ---- lifecycle -------------------------------------------------------------
    @classmethod
    def open(cls, path: str, *, capacity: int | None = None, reserve: int = 1 << 30,
             high_watermark: float = 0.90, low_watermark: float = 0.80,
             evict: bool = True) -> "Store":
        """Open (creating if empty) the store in directory `path`, run crash recovery,
        and return it. A store of an unknown/newer format raises StoreError(EINVAL) with a
        clear message and is not modified. capacity=None: the filesystem's size less reserve.
        evict=False: writes never evict clean data to make room (EAGAIN instead)."""
        return cls(path, capacity, reserve, high_watermark, low_watermark, evict)

    def __init__(self, path, capacity, reserve, high_watermark, low_watermark, evict):
        self.path = path
        os.makedirs(path, exist_ok=True)
        self._lockfd = os.open(os.path.join(path, "store.lock"),
                               os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(self._lockfd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lockfd)
            raise StoreError(errno.EBUSY, f"store {path} is open in another process "
                             "or Store instance") from None
        self.ix = None
        try:
            self._open(path, capacity, reserve, high_watermark, low_watermark, evict)
        except BaseException:
            if self.ix is not None:
                self.ix.close()
            os.close(self._lockfd)
            raise
        log.info("store_opened", path=path, capacity=self.space.capacity,
                 used=self.ix.used_bytes, dirty=self.ix.dirty_bytes)

    def _open(self, path, capacity, reserve, high_watermark, low_watermark, evict):
        self.ix = Index(os.path.join(path, "index"))
        self.data = DataFiles(path)
        self.space = Space(path, capacity, reserve, high_watermark, low_watermark)
        self.evict_on_write = evict
        self.committer = GroupCommit(self.ix)
        self.ns = Namespace(self._reclaim)
        self._olock = threading.Lock()
        self._opens: dict[int, list[int]] = {}     # ino -> [readers, writers]
        self._wseq: dict[int, int] = {}            # ino -> writes since open (commit race)
        self._tseq: dict[int, int] = {}            # ino -> truncates since open
        # ino -> (wseq, tseq) of a commit that found every byte committed while a writer
        # still had the file open, so kept F_UNCOMMITTED (_record_commit); its last
        # writer's close clears the flag if no write or truncate came after (_after_close)
        self._settled_at: dict[int, tuple[int, int]] = {}
        self._inflight: dict[int, int] = {}        # ino -> writes between pwrite and index
        # I5: ino -> writes answered whose lazy index record is not dropped yet, FIFO; the
        # growth they may add (admitted by _make_room, not in ix.used_bytes yet); the
        # highest txnid of a record dropped from _pending (a reader of an older snapshot
        # reads again); files whose flag txn is committed but not yet synced (I2)
        self._pending: dict[int, list[_Pending]] = {}
        self._pending_growth = 0
        self._last_landing = 0
        self._flag_unsynced: dict[int, int] = {}
        self.lazy_writes = 0                       # writes answered by write_nowait (tests)
        self._evictions = 0                        # bumped at each evicted data file
        self._deferred: set[int] = set()           # unlinked during a write: reclaim after
        # ino -> txnid of the create that flagged it F_UNCOMMITTED, until a write saw that
        # txn durable: another client may LOOKUP and write a new file before its create is
        # durable, and its first write skips the flag txn's sync (I2: see _bytes_changing)
        self._fresh: dict[int, int] = {}
        self._lru_touching: set[int] = set()       # files whose LRU re-stamp is queued
        self._jobs_leaving: dict[int, Future] = {}  # queue jobs done: their queued delete
        self._decoded_jobs = DecodedJobs()          # queue_list decodes a job once
        # guards _inflight, _fences and _deferred; taken after the index lock, never before it
        self._reg = threading.Lock()
        self._landed = threading.Condition(self._reg)   # a record left _pending (I5)
        # ino -> holders of the index lock deciding on "no write of ino is registered"
        # (I4): a write of a fenced file registers under the index lock, so after them
        self._fences: dict[int, int] = {}
        # fill and truncate wait here, under the index lock, for a file's registered writes
        # to end (invariant I4); the last writer to unregister takes the index lock to
        # notify only when someone waits (_waiting, under _reg)
        self._writes_done = threading.Condition(self.ix.lock)
        self._waiting = 0
        self.drops = DurableDrops(self.committer.covered, self._drop_data_file)
        self.committer.after_sync = self.drops.release
        self.batch = BatchCommitter(self.ix, self.committer, after_durable=self.drops.release)
        self.race_hook = None      # tests: called as race_hook(point, ino) at race windows
        # getattr / lookup answers until the next index commit (readcache.py)
        self._reads = ReadCache(self.ix)
        self._ensure_root()
        self.recovery_stats = recover(self.ix, self.data)
        with self.ix.write() as w:
            opens = w.next_id(b"opens")
            if w.counter(SENT_SINCE) == 0:
                # F_SENT is kept for inodes made from now on; of older ones (a store of a
                # version before it) nobody knows, so their journal jobs look in S3 as before
                w.txn.put(SENT_SINCE, U64.pack(w.counter(b"next_ino") + 1), db=self.ix.meta)
        self.write_verifier = struct.pack(">I", opens & 0xFFFFFFFF) + os.urandom(4)
        self.instance_id = self.ix.instance_id()
        self.committer.sync()
        self._closed = False

    def _ensure_root(self) -> None:
        with self.ix.write() as w:
            if w.inode(ROOT_INO) is not None:
                return
            t = time.time_ns()
            w.txn.put(b"next_ino", U64.pack(ROOT_INO), db=self.ix.meta)
            root = Inode(FileType.DIR, DataState.CLEAN, 0, 0o755, 2, 0, 0, 4096, 0, 0,
                         t, t, t, 1, ROOT_INO, 1, FIRST_COOKIE, 0, ROOT_INO)
            w.put_inode(root, None)

    def close(self) -> None:
        """Make everything durable (all live inodes committed, LMDB synced) and close."""
        if self._closed:
            return
        self.batch.close()
        with self.ix.read() as v:
            live = [ino for ino in v.keys(self.ix.unsettled)
                    if (r := v.inode(ino)) and (r.flags & (F_UNCOMMITTED | F_TRUNCATED)
                                                or r.size != r.committed_size)]
        # every new file is F_UNCOMMITTED until written and committed (new_inode): a commit
        # each would cost a txn and a sync per file; one txn per chunk of files instead
        for i in range(0, len(live), CLOSE_COMMIT_CHUNK):
            synced = []
            for ino in live[i:i + CLOSE_COMMIT_CHUNK]:
                try:
                    synced.append((ino, *self._datasynced(ino)))
                except StoreError as e:
                    log.error("store_close_commit_failed", ino=ino, error=str(e))
            self._record_commits(synced)
        self.committer.sync()
        self.drops.close()
        self._closed = True
        self.data.close()
        self.ix.close()
        os.close(self._lockfd)
        log.info("store_closed", path=self.path)

    def _record_commits(self, synced: list[tuple[int, int, int, int]], tries: int = 3) -> None:
        """close(): the index half of many commits in one txn; again if the map had to grow."""
        for attempt in range(tries):
            try:
                with self.ix.write() as w:
                    for args in synced:
                        self._record_commit(w, *args, writers_gone=True)
                return
            except StoreError as e:
                if e.errno != errno.EAGAIN or attempt == tries - 1:
                    log.error("store_close_commit_failed", files=len(synced), error=str(e))
                    return

    write_verifier: bytes      # 8 bytes, new at every open()
    instance_id: bytes         # 16 bytes, stable for the store's lifetime (server owner/scope)

    # ---- reclaim of unlinked inodes (I3) -------------------------------------------
    def _reclaim_if_unlinked(self, ino: int) -> None:
        with self.ix.write() as w:
            self._reclaim_unlinked(w, ino)

    def _reclaim_unlinked(self, w: Writer, ino: int) -> None:
        self._fence_txn(w, ino)
        rec = w.inode(ino)
        if (rec is not None and rec.nlink == 0 and not self._hand_to_writer(ino)
                and not self._is_open(ino)):
            self._reclaim(w, rec, rec)

    def _drop_data_file(self, ino: int) -> None:
        """The data file of a reclaimed inode whose purge is durable (I3; drops.py's thread)."""
        self._hook("reclaim.unlink", ino)
        self.data.remove(ino)
        self.ix.orphans_done.append(ino)     # the orphan key goes in the next txn
        self._wseq.pop(ino, None)
        self._tseq.pop(ino, None)
        self._settled_at.pop(ino, None)

    def _reclaim(self, w: Writer, rec: Inode, old: Inode) -> None:
        """The last link of `rec` is gone (rec.nlink == 0): free it now, or at last close."""
        w.set_flag_key(self.ix.orphans, rec.ino, True)
        self._fence_txn(w, rec.ino)
        if self._hand_to_writer(rec.ino) or self._is_open(rec.ino):
            w.put_inode(rec, old)            # stays readable through open state
            return
        w.purge_inode(old)
        ino = rec.ino

        def drop_when_durable():        # the orphan key names the file until then (I3)
            self.drops.add(self.ix.txnid, ino)
        w.after_commit.append(drop_when_durable)

    # ---- namespace (nfsd) -------------------------------------------------------
    def getattr(self, ino: int) -> Attr:
        """Attributes including unstable writes (live size/mtime). ESTALE if ino is gone.
        The Attr may be shared with other callers until the next index commit: never mutate it."""
        attr, snap = self._reads.get(ino, self._read_attr, ino)
        if self._pending or snap < self._last_landing:
            attr = self._live_attr(attr, snap, self._read_attr, ino)
        return attr

    def _read_attr(self, ino: int) -> tuple[Attr, int]:
        with self.ix.read() as v:
            return v.must_inode(ino).attr(), v.txn.id()

    def _live_attr(self, attr: Attr | None, snap: int, again, *args) -> Attr | None:
        """`attr` (read in snapshot `snap`) with the writes answered but not in it (I5);
        `again(*args)` reads afresh when a record left _pending after that snapshot. None
        (a name absent) stays None: pending writes never add a name."""
        while True:
            if attr is None:
                return None
            with self._reg:
                fresh = snap >= self._last_landing
                pend = self._overlay(attr.ino, snap) if fresh else None
            if fresh:
                return attr if not pend else _overlaid(attr, pend)
            attr, snap = again(*args)

    def _overlay(self, ino: int, snap: int) -> list[_Pending]:
        """Under _reg: the pending writes of `ino` that snapshot `snap` does not hold."""
        pend = self._pending.get(ino)
        if not pend:
            return []
        return [p for p in pend if p.landing is None or p.landing > snap]

    def lookup(self, parent: int, name: bytes) -> Attr:
        """ENOENT, ENOTDIR (parent not a dir), ESTALE (parent gone). Shared Attr as getattr's."""
        attr = self.find(parent, name)
        if attr is None:
            raise StoreError(errno.ENOENT, f"{bytes(name)!r} not in directory {parent}")
        return attr

    def find(self, parent: int, name: bytes) -> Attr | None:
        """lookup(), None for an absent name (other errors raise): LOOKUP's no-exception path."""
        validate_name(name)
        name = bytes(name)
        attr, snap = self._reads.get((parent, name), self._read_lookup, parent, name)
        if attr is not None and (self._pending or snap < self._last_landing):
            attr = self._live_attr(attr, snap, self._read_lookup, parent, name)
        return attr

    def _read_lookup(self, parent: int, name: bytes) -> tuple[Attr | None, int]:
        """(attr, snapshot), attr None when the name is absent: that answer is kept in the
        read cache as well (a save's exists() and OPEN-create look up missing names; only
        a commit adds a name, and a commit ends the cache's interval)."""
        with self.ix.read() as v:
            v.must_dir(parent)
            ent = v.dirent(parent, name)
            if ent is None:
                return None, v.txn.id()
            return v.must_inode(ent[0]).attr(), v.txn.id()

    def lookup_parent(self, ino: int) -> Attr:
        """Parent directory of a directory (root's parent is root)."""
        with self.ix.read() as v:
            return v.must_inode(v.must_dir(ino).parent).attr()

    def setattr(self, ino: int, sa: SetAttr) -> Attr:
        """Size changes truncate/extend (truncate up reads zeros). Bumps change/ctime.
        Durable on return. Without a size it is applied by the batch committer, in one txn
        with whatever namespace ops are queued at that moment (one sync for them all)."""
        if sa.size is None:
            same = self._setattr_noop(ino, sa)
            if same is not None:
                self.committer.sync()           # what it saw is durable, as promised
                return same.attr()
            return self.setattr_submit(ino, sa).result()
        t = time.time_ns()
        with self.ix.lock, self._fenced((ino,)):
            self._wait_writes(ino)              # I4
            same = self._setattr_noop(ino, sa)
            if same is not None:
                self.committer.sync()           # what it saw is durable, as promised
                return same.attr()
            # SETATTR(size) is durable when it returns, whatever the size was: the bytes
            # below the new size (unstable writes included) reach the disk before the
            # index calls them committed
            if self.ix.read_inode(ino).flags & F_UNCOMMITTED:
                self.data.datasync(ino)
            with self.ix.write() as w:
                rec, new = self._setattr_apply(w, ino, sa, t)
            mine = self.ix.txnid
            if sa.size != rec.size:
                self._hook("truncate.index_done", ino)
                self.committer.sync()           # I3: durable before bytes leave the file
                self._hook("truncate.synced", ino)
                # zero anything a failed write left past the old end, then set the length
                self.data.truncate(ino, min(rec.size, sa.size))
                if sa.size > rec.size:
                    self.data.truncate(ino, sa.size)
        self.committer.sync(mine)               # free when the truncate's sync covered it
        return new.attr()

    def setattr_submit(self, ino: int, sa: SetAttr, loop=None):
        """setattr() without waiting, for a SETATTR without a size (an index change only)
        that changes something (callers ask setattr_unchanged first): a
        concurrent.futures.Future of its Attr, set once it is durable; with `loop`, an
        asyncio.Future of that loop (submit()), awaited with no worker thread in between.
        None for a size change: that one waits for writes and truncates, so it runs as
        setattr() on a worker thread."""
        if sa.size is not None:
            return None
        return self.batch.submit(self._ns_setattr, ino, sa, time.time_ns(), loop=loop)

    def setattr_unchanged(self, ino: int, sa: SetAttr) -> Attr | None:
        """The file's attributes if setattr(ino, sa) would change nothing (see _setattr_noop),
        else None. Non-blocking (one read txn): an asyncio caller answers such a SETATTR
        without a worker thread once `durable()` (or a sync) says what it saw is durable.
        None for a size while a write of the file is registered (I4: setattr waits for it)."""
        if sa.size is not None and ino in self._inflight:
            return None
        same = self._setattr_noop(ino, sa)
        return None if same is None else same.attr()

    def _setattr_noop(self, ino: int, sa: SetAttr) -> Inode | None:
        """The inode if `sa` sets no time and every value it sets is already the file's (a
        client's "open for write, truncate" of the file it just created sends mode and size 0
        again): no write txn then, so no fdatasync and no ctime/change bump, as truncate(2)
        leaves the times alone when the size does not change. None if something changes."""
        if sa.atime_ns is not None or sa.mtime_ns is not None:
            return None
        with self.ix.read() as v:
            rec = v.must_inode(ino)
        if sa.size is not None:
            self._regular(rec)
            if self._needs_commit(rec) and rec.size:
                return None              # a same-size truncate commits the bytes below it
                                         # (size 0: none; a new file is F_UNCOMMITTED)
        mode = None if sa.mode is None else sa.mode & 0o7777
        for want, have in ((mode, rec.mode), (sa.uid, rec.uid), (sa.gid, rec.gid),
                           (sa.size, rec.size)):
            if want is not None and want != have:
                return None
        return rec

    def _ns_setattr(self, w: Writer, ino: int, sa: SetAttr, t: int) -> Attr:
        return self._setattr_apply(w, ino, sa, t)[1].attr()

    def _setattr_apply(self, w: Writer, ino: int, sa: SetAttr, t: int) -> tuple[Inode, Inode]:
        rec = w.must_inode(ino)
        new = rec.copy()
        if sa.mode is not None:
            new.mode = sa.mode & 0o7777
        if sa.uid is not None:
            new.uid = sa.uid
        if sa.gid is not None:
            new.gid = sa.gid
        if sa.atime_ns is not None:
            new.atime_ns = t if sa.atime_ns == "now" else int(sa.atime_ns)
        if sa.mtime_ns is not None:
            new.mtime_ns = t if sa.mtime_ns == "now" else int(sa.mtime_ns)
        if sa.size is not None:
            self._regular(rec)
            if not 0 <= sa.size <= MAX_FILE_SIZE:
                raise StoreError(errno.EFBIG, f"size {sa.size} out of range")
            if sa.size != rec.size:
                if sa.size < rec.size:
                    new.local_bytes += extents.truncate(w.txn, self.ix.extents, ino,
                                                        sa.size)
                new.size = sa.size
                new.committed_size = sa.size
                new.bump_data_seq()
                new.flags |= F_TRUNCATED     # recovery re-cuts the data file
                w.stamp(new)
                if new.state in (DataState.CLEAN, DataState.ABSENT):
                    new.state = DataState.DIRTY
                self._tseq[ino] = self._tseq.get(ino, 0) + 1
            else:                            # same size: the bytes below it are committed
                new.committed_size = sa.size
            if sa.mtime_ns is None:
                new.mtime_ns = t
        new.ctime_ns = t
        new.change += 1
        w.put_inode(new, rec)
        return rec, new

    # Namespace mutations go through the batch committer (batch.py): applied in one write
    # txn with every other op queued at that moment, each in its own nested txn, and durable
    # when the call returns. submit() is the same without waiting (asyncio callers).
    NAMESPACE_OPS = ("create", "mkdir", "symlink", "mknod", "link", "unlink", "rmdir", "remove",
                     "rename")

    def submit(self, op: str, *args, loop=None):
        """Queue namespace op `op` (one of NAMESPACE_OPS, same arguments as the method of
        that name, positional); a concurrent.futures.Future of its result, set once the
        op is durable (or of the StoreError it raised; a failed op changed nothing). With
        `loop` (called on that asyncio loop's thread): an asyncio.Future of it instead,
        answered together with the batch's other ops for that loop."""
        if op not in self.NAMESPACE_OPS:
            raise ValueError(f"not a namespace op: {op!r}")
        return self.batch.submit(getattr(self, "_ns_" + op), *args, loop=loop)

    def create(self, parent: int, name: bytes, mode: int, uid: int, gid: int,
               *, exclusive: bool = False) -> tuple[Attr, ChangeInfo, bool]:
        """Create a regular file. If the name exists: exclusive -> EEXIST; a file -> return
        it unchanged with created=False; a directory -> EISDIR. Returns (attr, cinfo, created)."""
        return self.submit("create", parent, name, mode, uid, gid, exclusive).result()

    def _ns_create(self, w, parent, name, mode, uid, gid, exclusive=False):
        rec, cinfo, created = self.ns.create(w, parent, name, mode, uid, gid, exclusive)
        if created:
            w.after_commit.append(lambda ino=rec.ino: self._note_fresh(ino))
        return rec.attr(), cinfo, created

    def _note_fresh(self, ino: int) -> None:
        """After the commit of the txn that created `ino` (under the index lock, so a writer
        holding that lock sees the entry of every committed create). Bounded: entries whose
        txn is durable are dropped when many pile up (files created and never written)."""
        if len(self._fresh) >= 4096:
            for old, txnid in list(self._fresh.items()):
                if self.committer.covered(txnid):
                    del self._fresh[old]
        self._fresh[ino] = self.ix.txnid

    def mkdir(self, parent: int, name: bytes, mode: int, uid: int, gid: int) -> tuple[Attr, ChangeInfo]:
        return self.submit("mkdir", parent, name, mode, uid, gid).result()

    def _ns_mkdir(self, w, parent, name, mode, uid, gid):
        rec, cinfo = self.ns.mkdir(w, parent, name, mode, uid, gid)
        return rec.attr(), cinfo

    def symlink(self, parent: int, name: bytes, target: bytes, mode: int, uid: int, gid: int
                ) -> tuple[Attr, ChangeInfo]:
        return self.submit("symlink", parent, name, target, mode, uid, gid).result()

    def _ns_symlink(self, w, parent, name, target, mode, uid, gid):
        rec, cinfo = self.ns.symlink(w, parent, name, target, mode, uid, gid)
        return rec.attr(), cinfo

    def mknod(self, parent: int, name: bytes, typ: FileType, mode: int, uid: int, gid: int,
              rdev: tuple[int, int] = (0, 0)) -> tuple[Attr, ChangeInfo]:
        """A block/character device (with rdev), socket or FIFO: never opened for I/O by the
        store (read/write/truncate of it fail like a directory's). EINVAL for other types."""
        return self.submit("mknod", parent, name, typ, mode, uid, gid, rdev).result()

    def _ns_mknod(self, w, parent, name, typ, mode, uid, gid, rdev=(0, 0)):
        rec, cinfo = self.ns.mknod(w, parent, name, typ, mode, uid, gid, rdev)
        return rec.attr(), cinfo

    def readlink(self, ino: int) -> bytes:
        """EINVAL if not a symlink."""
        with self.ix.read() as v:
            rec = v.must_inode(ino)
            if rec.type != FileType.LNK:
                raise StoreError(errno.EINVAL, f"inode {ino} is not a symlink")
            return v.symlink_target(ino) or b""

    def link(self, ino: int, new_parent: int, new_name: bytes) -> tuple[Attr, ChangeInfo]:
        """Hard link (files only: EISDIR for directories). EEXIST if the name exists."""
        return self.submit("link", ino, new_parent, new_name).result()

    def _ns_link(self, w, ino, new_parent, new_name):
        rec, cinfo = self.ns.link(w, ino, new_parent, new_name)
        return rec.attr(), cinfo

    def unlink(self, parent: int, name: bytes) -> ChangeInfo:
        """Remove a non-directory name (EISDIR for a directory: use rmdir). The inode's data is
        reclaimed when nlink reaches 0 and no open remains (see open_file/close_file)."""
        return self.submit("unlink", parent, name).result()

    def rmdir(self, parent: int, name: bytes) -> ChangeInfo:
        """ENOTEMPTY, ENOTDIR."""
        return self.submit("rmdir", parent, name).result()

    def remove(self, parent: int, name: bytes) -> ChangeInfo:
        """unlink or rmdir, whichever the name is (NFS REMOVE)."""
        return self.submit("remove", parent, name).result()

    def rename(self, src_parent: int, src_name: bytes, dst_parent: int, dst_name: bytes
               ) -> tuple[ChangeInfo, ChangeInfo]:
        """Atomic rename in one transaction, replacing an existing target (file over file,
        dir over empty dir; EISDIR/ENOTDIR/ENOTEMPTY as POSIX; EINVAL when moving a dir into
        its own subtree). Same name in the same dir: no-op. O(1) for directories.
        Returns (source dir cinfo, target dir cinfo)."""
        return self.submit("rename", src_parent, src_name, dst_parent, dst_name).result()

    def _ns_unlink(self, w, parent, name):
        return self.ns.unlink(w, parent, name)

    def _ns_rmdir(self, w, parent, name):
        return self.ns.rmdir(w, parent, name)

    def _ns_remove(self, w, parent, name):
        return self.ns.remove(w, parent, name)

    def _ns_rename(self, w, src_parent, src_name, dst_parent, dst_name):
        return self.ns.rename(w, src_parent, src_name, dst_parent, dst_name)

    def readdir(self, ino: int, cookie: int = 0) -> Iterator[DirEntry]:
        """Entries after `cookie` (0 = from the start), in cookie order, without . and ..
        Cookies are stable (a removed entry's cookie keeps its place); an unknown
        cookie past the end yields nothing. ESTALE/ENOTDIR are raised at the call."""
        with self.ix.read() as v:
            v.must_dir(ino)
        return self._readdir(ino, max(cookie, FIRST_COOKIE - 1))

    def _readdir(self, ino: int, cookie: int) -> Iterator[DirEntry]:
        while True:             # short read txns per batch, never one held across yields
            out = []
            with self.ix.read() as v:
                snap = v.txn.id()
                for c, name, child, _ in v.dir_entries_after(ino, cookie, READDIR_BATCH):
                    rec = v.inode(child)
                    if rec is not None:
                        out.append(DirEntry(name, c, rec.attr()))
                    cookie = c
            if self._pending or snap < self._last_landing:
                out = [self._live_entry(e, snap) for e in out]
            yield from out
            if len(out) < READDIR_BATCH:
                return

    def _live_entry(self, e: DirEntry, snap: int) -> DirEntry:
        if e.attr.type != FileType.REG:
            return e
        try:
            return DirEntry(e.name, e.cookie,
                            self._live_attr(e.attr, snap, self._read_attr, e.attr.ino))
        except StoreError:          # removed since the listing's snapshot
            return e

    def walk(self, ino: int, base: str = "") -> Iterator[tuple[str, Attr]]:
        """(path, attr) of everything under directory `ino` (not itself), depth first, a
        directory before its content; paths are `base`-relative, "/"-joined. The one subtree
        walk: a directory removed while it is walked is skipped, not an error."""
        stack = [(base, ino)]
        while stack:
            path, dino = stack.pop()
            try:
                entries = list(self.readdir(dino))
            except StoreError as e:
                if e.errno in (errno.ESTALE, errno.ENOENT, errno.ENOTDIR):
                    continue
                raise
            for ent in entries:
                name = ent.name.decode("utf-8", "surrogateescape")
                p = f"{path}/{name}" if path else name
                yield p, ent.attr
                if ent.attr.type == FileType.DIR:
                    stack.append((p, ent.attr.ino))

    def statfs(self) -> StatFS:
        cap = self.space.capacity
        # answered writes whose records are queued (I5) hold room already
        free = max(0, min(cap - self.ix.used_bytes - self._pending_growth,
                          self.space.disk_free()))
        with self.ix.read() as v:
            files = v.txn.stat(self.ix.inodes)["entries"]
        return StatFS(cap, free, free, FILES_TOTAL, FILES_TOTAL - files, FILES_TOTAL - files)

    def sync(self) -> None:
        """*Blocking.* Make every namespace change applied so far durable (group commit),
        every queue job removed so far (queue_done) removed durably, and the data files of
        the inodes those changes reclaimed removed (I3)."""
        if self.batch.can_wait():
            for fut in list(self._jobs_leaving.values()):
                fut.exception()             # applied (a failure was logged: the job stays)
        self.committer.sync()
        self.drops.settle()

    def durable(self) -> bool:
        """Whether every change applied so far is already durable (sync() would not block):
        lets an asyncio caller skip a worker thread's round trip."""
        return self.committer.covered(self.ix.txnid)

    # ---- data (nfsd) ---------------------------------------------------------------
    def open_file(self, ino: int, write: bool) -> None:
        """Count an open (NFS open state). Open-for-write files are never uploaded or evicted."""
        with self.ix.read() as v:
            rec = v.must_inode(ino)
            if write:
                self._regular(rec)
        with self._olock:
            self._opens.setdefault(ino, [0, 0])[1 if write else 0] += 1

    def is_open(self, ino: int, write: bool | None = None) -> bool:
        """Whether an open (any; or only for write / only for read) counts on the file."""
        counts = self._opens.get(ino)
        if counts is None:
            return False
        return counts != [0, 0] if write is None else counts[1 if write else 0] > 0

    def close_file(self, ino: int, write: bool, *, wait: bool = True):
        """Drop an open; reclaims an unlinked inode at its last close. wait=False (asyncio
        callers): the last writer's settle stamp and the reclaim are queued to the namespace
        batch instead of run here (a commit fdatasyncs, and the index lock may be held by a
        batch across its fdatasync); ops submitted after it still come after it. Returns the
        queued op's future (set at its commit; failures are logged) when it reclaims an
        unlinked file, whose handle goes stale at that commit; else None (a settle stamp is
        nobody's promise, so a CLOSE need not wait for it)."""
        with self._olock:
            counts = self._opens.get(ino)
            if counts is None or counts[1 if write else 0] == 0:
                log.warning("store_close_without_open", ino=ino, write=write)
                return
            counts[1 if write else 0] -= 1
            last = counts == [0, 0]
            if last:
                del self._opens[ino]
            last_writer = write and counts[1] == 0
        if not (last_writer or last):
            return None
        if wait:
            with self.ix.write() as w:
                self._after_close(w, ino, last_writer, last)
            return None
        reclaim = False
        if last:
            with self.ix.read() as v:
                rec = v.inode(ino)
            reclaim = rec is None or rec.nlink == 0
        # only the settle stamp: nobody waits for it, so it need not cost a commit of its own
        fut = self.batch.submit(self._after_close, ino, last_writer, last, durable=False,
                                lazy=not reclaim)
        fut.add_done_callback(_log_failure)
        return fut if reclaim else None     # a reclaim: the file is gone once it is set

    def _after_close(self, w: Writer, ino: int, last_writer: bool, last: bool) -> None:
        if last_writer:
            self._writers_gone(w, ino)
        if last:
            self._reclaim_unlinked(w, ino)

    def _writers_gone(self, w: Writer, ino: int) -> None:
        """The last writer closed. The settle window restarts (a temp file renamed right
        after its close is never uploaded under the temp name). And the F_UNCOMMITTED a
        commit kept for the open writer goes, if nothing changed the bytes since: no write
        or truncate record (same sequences) and none registered now (the file is fenced: a
        write registering from now on does so after this txn, and flags the file itself,
        I4). Neither need be durable: the stamp only schedules (recovery re-stamps every
        file it visits), and a flag left set only makes recovery visit a file that is whole."""
        settled_at = self._settled_at.pop(ino, None)
        rec = w.inode(ino)
        if rec is None or not rec.is_dirty:
            return
        self._fence_txn(w, ino)
        new = rec.copy()
        if (settled_at == (self._wseq.get(ino, 0), self._tseq.get(ino, 0))
                and not self._writing(ino, w) and not rec.flags & F_TRUNCATED
                and rec.committed_size == rec.size):
            new.flags &= ~F_UNCOMMITTED
        self._hook("flag.decided", ino)
        w.stamp(new)
        w.put_inode(new, rec)

    def read(self, ino: int, offset: int, count: int) -> tuple[bytes | memoryview, bool]:
        """Up to `count` bytes at `offset` (holes read as zeros), and eof. Raises
        StoreError(EAGAIN) with `.missing = [(off, len), ...]` when a range is ABSENT locally:
        the caller fetches it (read-through) and retries."""
        seq = self._evictions
        n, size = self._read_check(ino, offset, count)
        if n == 0:
            return b"", True
        data = self.data.pread(ino, offset, n)
        if self._evictions != seq:
            self._read_check(ino, offset, n)    # evicted under us: bytes may be zeros
        return data, offset + n >= size

    def read_into(self, ino: int, offset: int, buf: memoryview) -> tuple[int, bool]:
        """*Blocking* (the disk, when the page cache misses). Like read() but preadv straight
        into `buf`; returns (nbytes, eof)."""
        return self._read_into(ino, offset, buf, cached_only=False)

    def read_into_cached(self, ino: int, offset: int, buf: memoryview) -> tuple[int, bool] | None:
        """read_into() for the event loop: answered from the page cache only, None when a
        byte would have to come from the disk (a cold cache after a restart), and then the
        caller runs read_into() in a worker thread; a disk read on the loop would stall
        every client for its duration, and serialize the readers on one disk request."""
        return self._read_into(ino, offset, buf, cached_only=True)

    def _read_into(self, ino: int, offset: int, buf: memoryview, *, cached_only: bool):
        seq = self._evictions
        n, size = self._read_check(ino, offset, len(buf))
        if n == 0:
            return 0, True
        if not self.data.pread_into(ino, offset, buf[:n], cached_only=cached_only):
            return None
        if self._evictions != seq:
            self._read_check(ino, offset, n)    # evicted under us: bytes may be zeros
        return n, offset + n >= size

    def _read_check(self, ino: int, offset: int, count: int) -> tuple[int, int]:
        if offset < 0 or count < 0:
            raise StoreError(errno.EINVAL, "negative offset or count")
        while True:
            with self.ix.read() as v:
                snap = v.txn.id()
                rec = v.must_inode(ino)
                self._regular(rec)
                size, pend = rec.size, ()
                if self._pending or snap < self._last_landing:     # I5
                    with self._reg:
                        if snap < self._last_landing:
                            continue            # a record left _pending after this snapshot
                        pend = [(p.offset, p.end) for p in self._pending.get(ino, ())]
                    for _, end in pend:
                        size = max(size, end)
                if offset >= size:
                    return 0, size
                n = min(count, size - offset)
                missing = extents.absent_ranges(v.txn, self.ix.extents, ino, offset, offset + n)
            break
        if missing and pend:        # the bytes of an answered write are local
            missing = _subtract(missing, pend)
        if missing:
            raise _not_local(ino, missing)
        if rec.state == DataState.CLEAN and time.time_ns() - rec.lru_ns > LRU_GRANULARITY_NS:
            self._touch_lru(ino)
        return n, size

    def _touch_lru(self, ino: int) -> None:
        """Re-stamp a read file's LRU key, without waiting: a READ runs on the event loop,
        which must not wait for the index write lock (a batch commit holds it through its
        fdatasync) nor for a commit. An eviction-order hint, so a lazy batch op; one
        in flight per file, and none once the store closes."""
        if ino in self._lru_touching or self.batch.closing:
            return
        self._lru_touching.add(ino)
        fut = self._queue_lazy(self._ns_touch_lru, ino)
        if fut is None:
            self._lru_touching.discard(ino)
            return
        fut.add_done_callback(lambda f: self._lru_touching.discard(ino))

    def _ns_touch_lru(self, w: Writer, ino: int) -> None:
        rec = w.inode(ino)
        if rec is not None and rec.state == DataState.CLEAN:
            new = rec.copy()
            new.lru_ns = new.atime_ns = time.time_ns()
            w.put_inode(new, rec)

    # ---- uploader ----------------------------------------------------------------
    def path_of(self, ino: int) -> str | None:
        """Export-relative path ("a/b/c") of a linked inode (first link), or None if unlinked."""
        with self.ix.read() as v:
            v.must_inode(ino)
            return v.path_of(ino)

    def clock_ns(self) -> int:
        """The store's own clock (cache/clock.py): monotonic, survives restarts, ignores
        wall-clock steps and every client-set time. Settle windows are measured in it."""
        return self.ix.clock.now_ns()

    def extents(self, ino: int) -> list[Extent]:
        """The file's extent map in offset order: DIRTY/CLEAN (local) and ABSENT ranges.
        Ranges of [0, size) not listed are local holes (read as zeros)."""
        with self.ix.read() as v:
            v.must_inode(ino)
            return extents.listing(v.txn, self.ix.extents, ino)

    def open_data_fd(self, ino: int) -> int:
        """A read-only fd on the file's local data (caller closes) for os.preadv / sendfile.
        The file may be shorter than the inode's size: bytes past its end are zeros."""
        with self.ix.read() as v:
            self._regular(v.must_inode(ino))
        return self.data.open_readonly(ino)

    # ---- client records (nfsd's stable storage for reclaim after a restart) ---------------
    # Opaque to the store: `record` bytes keyed by a client owner string. Batch ops, durable
    # when their future is set: nfsd writes one at each client's first state and deletes it
    # at its unmount, on the event loop, where a write txn of its own would wait for the
    # index lock a batch commit holds through its fdatasync (a whole cluster mounting at a
    # job's start would queue behind each other's syncs; as batch ops they share them).
    MAX_CLIENT_RECORD = 4096

    def submit_client_record(self, owner: bytes, record: bytes | None) -> Future:
        """Put `record` for `owner` (None: delete it) in the next batch; a
        concurrent.futures.Future set once it is durable (or of the StoreError it raised)."""
        if record is not None and len(owner) + len(record) > self.MAX_CLIENT_RECORD:
            raise StoreError(errno.ENAMETOOLONG, "client record too large")
        return self.batch.submit(self._ns_client_record, bytes(owner),
                                 None if record is None else bytes(record))

    def _ns_client_record(self, w: Writer, owner: bytes, record: bytes | None) -> None:
        if record is None:
            w.txn.delete(client_key(owner), db=self.ix.clients)
            drop_replies(w, self.ix.replies, owner)      # its reply records go with it
        else:
            w.txn.put(client_key(owner), pack_client(owner, record), db=self.ix.clients)

    def client_records(self) -> dict[bytes, bytes]:
        """Every client record: {owner: record}."""
        with self.ix.read() as v:
            return dict(unpack_client(val) for _, val in v.txn.cursor(db=self.ix.clients))

    def put_client_record(self, owner: bytes, record: bytes) -> None:
        """*Blocking.* submit_client_record, waited for."""
        self.submit_client_record(owner, record).result()

    def delete_client_record(self, owner: bytes) -> None:
        """*Blocking.* submit_client_record of a delete, waited for."""
        self.submit_client_record(owner, None).result()

    # ---- consistency check ---------------------------------------------------------------
    def check(self) -> list[str]:
        """Consistency check: LMDB vs extent files; returns problems (empty list = consistent).
        A full scan: for tests and the admin CLI, not the request path."""
        return check(self)


def _overlaid(attr: Attr, pend: list[_Pending]) -> Attr:
    """What `attr` becomes once the records of the pending writes `pend` (in queue order)
    are applied (Store._record_lazy: the same fields, the same values)."""
    k = len(pend)
    t = pend[-1].t
    state = attr.data_state
    if state in (DataState.CLEAN, DataState.ABSENT):
        state = DataState.DIRTY
    return _replace(attr, size=max(attr.size, max(p.end for p in pend)), mtime_ns=t, ctime_ns=t,
                    change=attr.change + k, data_seq=(attr.data_seq + k) & 0xFFFFFFFF,
                    data_state=state)


def _subtract(ranges: list[tuple[int, int]], cut) -> list[tuple[int, int]]:
    """(offset, length) `ranges` less the [start, end) ranges of `cut`."""
    out = []
    for off, length in ranges:
        pieces = [(off, off + length)]
        for a, b in cut:
            nxt = []
            for x, y in pieces:
                if b <= x or a >= y:
                    nxt.append((x, y))
                    continue
                if x < a:
                    nxt.append((x, a))
                if b < y:
                    nxt.append((b, y))
            pieces = nxt
        out.extend((x, y - x) for x, y in pieces)
    return out


"""Room for new bytes, and the local copy of files that are in S3: eviction of clean files
(least recently used first, above the high watermark or when a write needs the room), pins
that keep a file, and the read-through fill that brings evicted bytes back: a part of
`Store`. The capacity and watermark policy is space.py's; I3 and I4 (cache/store.py) say
when bytes may leave or enter an extent file.
"""
from __future__ import annotations

import errno
import time

import structlog

from . import extents
from .api import DataState, FileType, StoreError
from .index import F_PINNED, Inode
from .keys import U64
from .storebase import StoreBase

log = structlog.get_logger("cache.store")     # one logger name for every part of the store


class Eviction(StoreBase):
    """Eviction, pins and fill (state: `_evictions`, `evict_on_write`, `space`, set in
    `Store._open`)."""

    def _make_room(self, ino: int, rec: Inode, growth: int) -> None:
        """Admit `growth` new local bytes for `ino` (evicting clean data if allowed)."""
        if self.ix.space_low and not self.ix.ensure_headroom():
            raise StoreError(errno.ENOSPC, "disk full: index headroom is gone")
        becoming_dirty = 0 if rec.is_dirty else rec.local_bytes
        pending = self._pending_growth      # answered writes whose records are queued (I5)
        need = self.space.admit(self.ix.used_bytes + pending,
                                self.ix.dirty_bytes + becoming_dirty + pending, growth)
        if need and self._free_clean(need, exclude=ino) < need:
            raise StoreError(errno.EAGAIN, "cache full of pinned or open clean data")

    def evict(self, ino: int) -> int:
        """*Blocking.* Drop a CLEAN, unpinned, not-open file's local data (-> ABSENT); bytes
        freed (0 when the file is not evictable at this moment)."""
        with self.ix.read() as v:
            v.must_inode(ino)
        return self._evict([ino])

    def _evict(self, inos: list[int]) -> int:
        """Evict many files with one index txn and one sync. The index lock is held from the
        check to the unlink, so no write registers and no fill runs in between (I4), and
        the files go only once the index saying ABSENT is durable; `drops` names them until
        they are gone, for recovery (I3)."""
        freed = 0
        with self.ix.lock, self._fenced(inos):
            done = []
            with self.ix.write() as w:
                for ino in inos:
                    rec = w.inode(ino)
                    if (rec is None or rec.type != FileType.REG
                            or rec.state != DataState.CLEAN or rec.flags & F_PINNED
                            or self._is_open(ino) or rec.nlink == 0):
                        continue
                    new = rec.copy()
                    extents.replace_all(w.txn, self.ix.extents, ino,
                                        [(0, rec.size, DataState.ABSENT)])
                    new.local_bytes = 0
                    new.state = DataState.ABSENT if rec.size else DataState.CLEAN
                    w.put_inode(new, rec)
                    w.set_flag_key(self.ix.drops, ino, True)
                    done.append((ino, rec.local_bytes))
            if not done:
                return 0
            self._hook("evict.index_done", done[0][0])
            self.committer.sync()
            self._hook("evict.synced", done[0][0])
            for ino, nbytes in done:
                self._drop_evicted(ino)
                freed += nbytes
                log.info("store_evicted", ino=ino, bytes=nbytes)
            with self.ix.write() as w:
                for ino, _ in done:
                    w.set_flag_key(self.ix.drops, ino, False)
        return freed

    def _drop_evicted(self, ino: int) -> None:
        # bumped BEFORE the file goes: a reader that raced with us sees the change and
        # re-checks the extent map instead of returning the zeros of a missing file
        self._evictions += 1
        self.data.remove(ino)

    def eviction_candidates(self, want_bytes: int) -> list[int]:
        """Least-recently-used CLEAN files (not pinned, not open) totalling >= want_bytes
        (fewer if there are not enough)."""
        out, total = [], 0
        with self.ix.read() as v:
            cur = v.txn.cursor(db=self.ix.lru)
            for key in cur.iternext(values=False):
                if total >= want_bytes:
                    break
                ino = U64.unpack(key[8:16])[0]
                rec = v.inode(ino)
                if rec is None or rec.flags & F_PINNED or self._is_open(ino):
                    continue
                out.append(ino)
                total += rec.local_bytes
        return out

    def _free_clean(self, want: int, exclude: int = 0) -> int:
        if not self.evict_on_write:
            return 0
        return self._evict([ino for ino in self.eviction_candidates(want) if ino != exclude])

    def maybe_evict(self) -> int:
        """Evict LRU clean data if usage is above the high watermark, down to the low one.
        Cheap when nothing is to do; the daemon calls it periodically. Returns bytes freed."""
        target = self.space.eviction_target(self.ix.used_bytes)
        return self._free_clean(target) if target else 0

    def set_watermarks(self, high_watermark: float, low_watermark: float) -> None:
        """New eviction watermarks (fractions of capacity), used from the next maybe_evict."""
        self.space.set_watermarks(high_watermark, low_watermark)

    def usage(self) -> dict:
        """Byte accounting for metrics/admin: capacity, used (local), dirty, watermarks."""
        return {"capacity": self.space.capacity, "used": self.ix.used_bytes,
                "dirty": self.ix.dirty_bytes, "high": self.space.high, "low": self.space.low}

    def fill(self, ino: int, offset: int, data: bytes | memoryview) -> None:
        """Store bytes fetched from S3 for an ABSENT range (stays clean). Only the parts
        still ABSENT are written: bytes a client wrote meanwhile always win."""
        view = memoryview(data)
        # no write/evict may interleave between check and store
        with self.ix.lock, self._fenced((ino,)):
            self._wait_writes(ino)     # a registered write's bytes may be in the file (I4)
            with self.ix.read() as v:
                rec = v.must_inode(ino)
                self._regular(rec)
                end = min(offset + len(view), rec.size)
                holes = extents.absent_ranges(v.txn, self.ix.extents, ino, offset, end)
            if not holes:
                return
            for off, length in holes:
                self.data.pwrite(ino, off, view[off - offset:off - offset + length])
            with self.ix.write() as w:
                cur = w.must_inode(ino)
                new = cur.copy()
                for off, length in holes:
                    new.local_bytes += extents.set_range(w.txn, self.ix.extents, ino, off,
                                                         off + length, DataState.CLEAN)
                if new.state == DataState.ABSENT and not extents.absent_ranges(
                        w.txn, self.ix.extents, ino, 0, new.size):
                    new.state = DataState.CLEAN
                    new.lru_ns = time.time_ns()
                w.put_inode(new, cur)

    def set_pinned(self, ino: int, pinned: bool, reason: str = "") -> None:
        """Pinned files are never evicted; `pinned()` lists them with their reasons."""
        with self.ix.write() as w:
            rec = w.must_inode(ino)
            new = rec.copy()
            new.flags = (new.flags | F_PINNED) if pinned else (new.flags & ~F_PINNED)
            w.put_inode(new, rec)
            w.set_flag_key(self.ix.pins, ino, pinned, reason.encode())

    def pinned(self) -> dict[int, str]:
        with self.ix.read() as v:
            return {U64.unpack(k)[0]: bytes(r).decode() for k, r in
                    v.txn.cursor(db=self.ix.pins)}

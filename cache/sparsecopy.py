"""Sparse files and server-side copy (nfsd's NFSv4.2 SEEK, READ_PLUS, DEALLOCATE, ALLOCATE,
COPY and CLONE): a part of `Store`. Each byte change goes through the write path's
`_bytes_changing` (writepath.py: I2, I4) after the writes answered before it have their
records (`_settle`, I5).
"""
from __future__ import annotations

import errno

from . import extents
from .api import Attr, CopySource, DataState, SetAttr, StoreError
from .index import F_UNCOMMITTED, Inode, Writer
from .storebase import MAX_FILE_SIZE, StoreBase, _not_local


class SparseCopy(StoreBase):
    """Holes, SEEK, DEALLOCATE, ALLOCATE and COPY/CLONE."""

    def content_runs(self, ino: int, offset: int, end: int) -> list[tuple[int, int, bool]]:
        """[offset, min(end, size)) as (start, length, is_data) runs in order, neighbours
        of one kind merged. Holes: ranges the index maps as local holes, and holes of the
        extent file inside local extents (SEEK_DATA/SEEK_HOLE); ABSENT (evicted) ranges
        are data. Advisory: a concurrent write may change it at once."""
        while True:
            with self.ix.read() as v:
                snap = v.txn.id()
                rec = v.must_inode(ino)
                self._regular(rec)
                with self._reg:                 # answered writes (I5): local, maybe data
                    if snap < self._last_landing:
                        continue
                    pend = [(p.offset, p.end) for p in self._pending.get(ino, ())]
                end = min(end, max([rec.size] + [b for _, b in pend]))
                pieces = (extents.runs(v.txn, self.ix.extents, ino, offset, end)
                          if offset < end else [])
            break
        if pend:
            pieces = _with_local(pieces, pend, offset, end)
        out: list[list] = []

        def add(a: int, b: int, data: bool) -> None:
            if b <= a:
                return
            if out and out[-1][2] == data and out[-1][0] + out[-1][1] == a:
                out[-1][1] += b - a
            else:
                out.append([a, b - a, data])
        for a, b, st in pieces:
            if st is None or st == DataState.ABSENT:
                add(a, b, st is not None)
                continue
            pos = a
            while pos < b:              # the extent file knows finer holes
                d = self.data.seek(ino, pos, data=True)
                if d is None or d >= b:
                    add(pos, b, False)
                    break
                add(pos, d, False)
                h = self.data.seek(ino, d, data=False)
                h = b if h is None else min(h, b)
                add(d, h, True)
                pos = h
        return [tuple(r) for r in out]

    def seek(self, ino: int, offset: int, data: bool) -> int | None:
        """Where the next data (data=True) or hole starts at or after `offset`: None when
        no data follows; a hole is always found (the virtual one at the end of the file).
        ENXIO when `offset` is at or past the end of the file (lseek's rule)."""
        size = self.getattr(ino).size
        if offset < 0 or offset >= size:
            raise StoreError(errno.ENXIO, f"seek at {offset} past the end ({size})")
        for start, _length, is_data in self.content_runs(ino, offset, size):
            if is_data == data:
                return start
        return None if data else size

    def deallocate(self, ino: int, offset: int, length: int) -> Attr:
        """Punch a hole in [offset, offset+length) below the size: reads return zeros, the
        size stays, the file is DIRTY with a new data sequence (like a write of zeros; the
        caller commits to make it durable). The hole is punched and fdatasynced before the
        index maps the range as a hole (I1: the index never calls a range zeros that the
        file may still hold bytes in); until then the index keeps its old extents with the
        file durably DIRTY and F_UNCOMMITTED (I2), so after a crash at any point recovery
        visits it, moves its data sequence and the uploader sends what the file holds."""
        if offset < 0 or length < 0:
            raise StoreError(errno.EINVAL, "negative offset or length")
        self._settle(ino)
        with self.ix.read() as v:
            rec = v.must_inode(ino)
            self._regular(rec)
        end = min(offset + length, rec.size)
        if end <= offset:
            return rec.attr()
        with self._bytes_changing(ino):
            self.data.punch_hole(ino, offset, end - offset)
            self._hook("punch.punched", ino)
            self.data.datasync(ino)
            with self.ix.write() as w:
                cur = w.must_inode(ino)
                new = cur.copy()
                new.local_bytes += extents.clear_range(w.txn, self.ix.extents, ino,
                                                       offset, min(end, cur.size))
                if new.state == DataState.ABSENT and not extents.absent_ranges(
                        w.txn, self.ix.extents, ino, 0, new.size):
                    new.state = DataState.DIRTY
                self._bytes_changed(w, new, cur)
        return new.attr()

    def allocate(self, ino: int, offset: int, length: int) -> Attr:
        """*Blocking.* Reserve disk blocks for [offset, offset+length) (fallocate, bytes
        unchanged); a range past the end extends the size to offset+length (RFC 7862
        15.1.3), as a truncate up. ENOSPC when the reservation does not fit the store."""
        if offset < 0 or length <= 0 or offset + length > MAX_FILE_SIZE:
            raise StoreError(errno.EINVAL if length <= 0 else errno.EFBIG,
                             f"allocate {offset}+{length} out of range")
        self._settle(ino)
        with self.ix.read() as v:
            rec = v.must_inode(ino)
            self._regular(rec)
            present = extents.present_bytes(v.txn, self.ix.extents, ino, offset,
                                            offset + length)
        if length - present > self.space.capacity - self.ix.used_bytes:
            raise StoreError(errno.ENOSPC, f"allocate of {length} bytes exceeds the cache")
        self.data.allocate(ino, offset, length)
        if offset + length > rec.size:
            return self.setattr(ino, SetAttr(size=offset + length))
        return rec.attr()

    def copy_range(self, src: int, dst: int, src_off: int, dst_off: int, count: int
                   ) -> tuple[Attr, bool]:
        """*Blocking.* dst's [dst_off, +count) becomes src's [src_off, +count), without the
        bytes passing through this process: a reflink where the file system shares blocks,
        else copy_file_range. EINVAL when the source range passes its end (or overlaps the
        destination range in the same file); EAGAIN with `.missing` when part of the
        source is ABSENT (read-through first, as read). The destination is DIRTY with a
        new data sequence, so the uploader sends it; the caller commits.
        Returns (dst attrs, reflinked)."""
        if min(src_off, dst_off, count) < 0 or dst_off + count > MAX_FILE_SIZE:
            raise StoreError(errno.EINVAL, "copy range out of range")
        self._settle(src, dst)
        with self.ix.read() as v:
            srec, drec = v.must_inode(src), v.must_inode(dst)
            self._regular(srec)
            self._regular(drec)
            if src_off + count > srec.size:
                raise StoreError(errno.EINVAL, f"copy source {src_off}+{count} past its end")
            if src == dst and src_off < dst_off + count and dst_off < src_off + count:
                raise StoreError(errno.EINVAL, "copy ranges overlap")
            growth = count - extents.present_bytes(v.txn, self.ix.extents, dst, dst_off,
                                                   dst_off + count)
        if count == 0:
            return drec.attr(), False
        self._require_local(src, src_off, count)    # before the destination is flagged
        self._make_room(dst, drec, growth)
        with self._bytes_changing(dst, also=(src,)):
            self._require_local(src, src_off, count)    # registered: no evict from here
            with self.ix.read() as v:      # data sequences before the bytes move (_note_copy)
                seen = (v.must_inode(src).data_seq, v.must_inode(dst).data_seq)
            try:
                reflinked = self.data.copy_range(src, dst, src_off, dst_off, count)
            except StoreError:
                self._shrink_to_recorded(dst)  # a partial copy may have grown the file
                raise
            self._hook("copy.copied", dst)
            with self.ix.write() as w:
                cur = w.must_inode(dst)
                new = cur.copy()
                new.size = max(new.size, dst_off + count)
                new.local_bytes += extents.set_range(w.txn, self.ix.extents, dst, dst_off,
                                                     dst_off + count, DataState.DIRTY)
                self._bytes_changed(w, new, cur)
                self._note_copy(w, src, src_off, dst_off, count, seen, cur, new)
        return new.attr(), reflinked

    def _note_copy(self, w: Writer, src: int, src_off: int, dst_off: int, count: int,
                   seen: tuple[int, int], cur: Inode, new: Inode) -> None:
        """Record in the destination's object record that its bytes from 0 are a copy of
        the source's (CopySource), so the uploader can copy the source's object in S3 when
        the copy turns out whole; a copy made in pieces (asynchronous COPY's chunks) extends
        the record of the pieces before it. Same transaction as the data sequence bump, so
        a crash leaves both or neither. Nothing is recorded when either file's data sequence
        moved while the bytes moved (a write raced the copy) or the source holds uncommitted
        bytes; a later write or truncate of the destination invalidates it by its sequence."""
        srec = w.must_inode(src)
        if (src_off != dst_off or (srec.data_seq, cur.data_seq) != seen
                or srec.flags & F_UNCOMMITTED):
            return
        remote = w.remote(new.ino)
        prev = remote.copied_from
        if src_off != 0 and (prev is None or (prev.src_ino, prev.src_seq, prev.count, prev.dst_seq)
                             != (src, srec.data_seq, src_off, cur.data_seq)):
            return
        remote.copied_from = CopySource(src, srec.data_seq, src_off + count, new.data_seq)
        w.put_remote(new.ino, remote)

    def _require_local(self, ino: int, offset: int, count: int) -> None:
        """EAGAIN with `.missing` when part of the range is ABSENT (the caller fetches)."""
        with self.ix.read() as v:
            missing = extents.absent_ranges(v.txn, self.ix.extents, ino, offset, offset + count)
        if missing:
            raise _not_local(ino, missing)


def _with_local(pieces, local, offset: int, end: int):
    """`pieces` (extents.runs: (a, b, state) covering [offset, end), state None for a local
    hole) with the ranges of `local` (answered writes, I5) that fall in holes made DIRTY:
    the extent file tells data from holes there."""
    merged: list[list[int]] = []
    for x, y in sorted(local):
        if merged and x <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], y)
        else:
            merged.append([x, y])
    out = []
    for a, b, st in pieces:
        if st is not None:
            out.append((a, b, st))
            continue
        pos = a
        for x, y in merged:
            x, y = max(x, a), min(y, b)
            if x >= y:
                continue
            if x > pos:
                out.append((pos, x, None))
            out.append((x, y, DataState.DIRTY))
            pos = y
        if pos < b:
            out.append((pos, b, None))
    return out

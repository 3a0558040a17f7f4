"""Namespace operations, each run inside ONE index write transaction (`Writer`).

POSIX semantics as NFSv4 needs them (RFC 8881 sections 18.4 CREATE, 18.9 LINK, 18.25
REMOVE, 18.26 RENAME). Each op also appends the change-journal job the uploader mirrors
in S3 (see Store.queue_put) in the same transaction, so nothing is lost between the two.
Reclaiming an inode's data is the store's job: ops call `reclaim(w, rec)` supplied by it.
"""
from __future__ import annotations

import errno
import time

from .api import (DEVICE_TYPES, RDEV_MAX, SPECIAL_TYPES, ChangeInfo, DataState, FileType,
                  NAME_MAX, NUL, ROOT_INO, SLASH, SYMLINK_MAX, StoreError)
from .index import F_SENT, F_UNCOMMITTED, FIRST_COOKIE, SENT_SINCE, Inode, Writer

TYPE_NAMES = {FileType.REG: "reg", FileType.DIR: "dir", FileType.LNK: "lnk",
              FileType.BLK: "blk", FileType.CHR: "chr", FileType.SOCK: "sock",
              FileType.FIFO: "fifo"}


def validate_name(name: bytes) -> None:
    if not isinstance(name, (bytes, bytearray)):
        raise StoreError(errno.EINVAL, f"name must be bytes, not {type(name).__name__}")
    if not name or name in (b".", b"..") or SLASH in name or NUL in name:
        raise StoreError(errno.EINVAL, f"invalid name {bytes(name)!r}")
    if len(name) > NAME_MAX:
        raise StoreError(errno.ENAMETOOLONG, f"name longer than {NAME_MAX} bytes")


def new_inode(w: Writer, typ: int, mode: int, uid: int, gid: int, parent: int,
              t: int) -> Inode:
    ino = w.next_id(b"next_ino")
    dir_ = typ == FileType.DIR
    reg = typ == FileType.REG
    state = DataState.DIRTY if reg else DataState.CLEAN
    # A new regular file carries F_UNCOMMITTED from its creating (durable) txn, as if a
    # write had already flagged it (I2): its first WRITE then needs no flag txn and sync of
    # its own. Recovery cuts such a file to its committed size 0, which it has.
    rec = Inode(typ, state, F_UNCOMMITTED if reg else 0, mode & 0o7777, 2 if dir_ else 1, uid, gid,
                4096 if dir_ else 0, 0, 0, t, t, t, 1, parent if dir_ else 0,
                (t // 1_000_000_000) & 0xFFFFFFFF, FIRST_COOKIE, 0, ino)
    w.stamp(rec)              # a new file's settle window starts at its creation
    return rec


def object_of(w: Writer, ino: int) -> dict:
    """What an unlink job must know of the file's objects after its inode is reclaimed (the
    record goes with it): the object it uploaded [key, etag], those it `replaces`, and
    whether S3 may hold any object written for it (`sent`, see sent_of)."""
    r = w.remote(ino)
    out: dict = sent_of(w, ino)
    if r.etag and r.key:
        out["object"] = [r.key, r.etag]
    if r.replaces:
        out["replaces"] = [list(x) for x in r.replaces]
    return out


def sent_of(w: Writer, ino: int) -> dict:
    """{"sent": False} when no object was ever written for regular file `ino` (F_SENT unset):
    then none can exist at the job's names when it runs either, since an upload sets F_SENT
    (durably) before it reads the file's path and uploads wait for the journal jobs of that
    path. {} (unknown: look) for other types, whose objects the journal itself writes."""
    rec = w.inode(ino)
    if (rec is None or rec.type != FileType.REG or rec.flags & F_SENT
            or ino < w.counter(SENT_SINCE)):       # made before F_SENT was kept: unknown
        return {}
    return {"sent": False}


def with_next_name(w: Writer, job: dict) -> dict:
    """An unlink job of a regular file that keeps other links, queued after the name is gone:
    `new_path` = its first remaining name, where its object moves if it was at the removed
    one (a move, not delete + upload again: the file may be evicted, and then that object is
    the only copy of its bytes). The job's keys include it, so uploads there wait for it."""
    if job["op"] == "unlink" and not job["last_link"] and job["type"] == TYPE_NAMES[FileType.REG]:
        job["new_path"] = w.path_of(job["ino"])
    return job


def entry_path(w: Writer, parent: int, name: bytes) -> str:
    base = w.path_of(parent)
    leaf = name.decode("utf-8", "surrogateescape")
    return leaf if not base else f"{base}/{leaf}"


class Namespace:
    """Namespace ops over a Writer. `reclaim(w, rec)` frees an inode whose last link went
    away (the store decides between orphaning an open inode and freeing it now)."""

    def __init__(self, reclaim):
        self.reclaim = reclaim

    # ---- helpers -------------------------------------------------------------------
    @staticmethod
    def _touch_dir(d: Inode, t: int) -> None:
        d.mtime_ns = d.ctime_ns = t
        d.change += 1

    def _drop_link(self, w: Writer, rec: Inode, t: int) -> None:
        old = rec.copy()
        rec.nlink -= 1
        rec.ctime_ns = t
        rec.change += 1
        if rec.nlink > 0:
            w.put_inode(rec, old)
        else:
            self.reclaim(w, rec, old)

    @staticmethod
    def _lookup(w: Writer, parent: int, name: bytes):
        ent = w.dirent(parent, name)
        if ent is None:
            raise StoreError(errno.ENOENT, f"{bytes(name)!r} not in directory {parent}")
        return ent

    # ---- ops -------------------------------------------------------------------------
    def create(self, w: Writer, parent: int, name: bytes, mode: int, uid: int, gid: int,
               exclusive: bool):
        validate_name(name)
        pd = w.must_dir(parent)
        ent = w.dirent(parent, name)
        if ent is not None:
            child, _, typ = ent
            if exclusive:
                raise StoreError(errno.EEXIST, f"{bytes(name)!r} exists")
            if typ == FileType.DIR:
                raise StoreError(errno.EISDIR, f"{bytes(name)!r} is a directory")
            if typ != FileType.REG:
                raise StoreError(errno.EEXIST, f"{bytes(name)!r} exists and is not a file")
            return w.must_inode(child), ChangeInfo(True, pd.change, pd.change), False
        return (*self._make(w, pd, name, FileType.REG, mode, uid, gid), True)

    def _make(self, w: Writer, pd: Inode, name: bytes, typ: int, mode: int, uid: int,
              gid: int):
        t = time.time_ns()
        old_pd = pd.copy()
        rec = new_inode(w, typ, mode, uid, gid, pd.ino, t)
        w.put_dirent(pd, name, rec.ino, typ)
        w.put_inode(rec, None)
        if typ == FileType.DIR:
            pd.nlink += 1
        self._touch_dir(pd, t)
        w.put_inode(pd, old_pd)
        return rec, ChangeInfo(True, old_pd.change, pd.change)

    def mkdir(self, w: Writer, parent: int, name: bytes, mode: int, uid: int, gid: int):
        validate_name(name)
        pd = w.must_dir(parent)
        if w.dirent(parent, name) is not None:
            raise StoreError(errno.EEXIST, f"{bytes(name)!r} exists")
        rec, cinfo = self._make(w, pd, name, FileType.DIR, mode, uid, gid)
        w.queue_put({"kind": "ns", "op": "mkdir", "ino": rec.ino, "type": "dir",
                     "new_path": entry_path(w, parent, name)})
        return rec, cinfo

    def symlink(self, w: Writer, parent: int, name: bytes, target: bytes, mode: int,
                uid: int, gid: int, *, journal: bool = True):
        """journal=False: no change-journal job (a link imported from S3 needs no upload)."""
        validate_name(name)
        if not target or NUL in target:
            raise StoreError(errno.EINVAL, "symlink target must be non-empty without NUL")
        if len(target) > SYMLINK_MAX:
            raise StoreError(errno.ENAMETOOLONG, f"symlink target over {SYMLINK_MAX} bytes")
        pd = w.must_dir(parent)
        if w.dirent(parent, name) is not None:
            raise StoreError(errno.EEXIST, f"{bytes(name)!r} exists")
        rec, cinfo = self._make(w, pd, name, FileType.LNK, mode or 0o777, uid, gid)
        old = rec.copy()
        rec.size = len(target)
        w.put_inode(rec, old)
        w.set_flag_key(w.ix.symlinks, rec.ino, True, bytes(target))
        if journal:
            w.queue_put({"kind": "ns", "op": "symlink", "ino": rec.ino, "type": "lnk",
                         "new_path": entry_path(w, parent, name),
                         "target": bytes(target).decode("utf-8", "surrogateescape")})
        return rec, cinfo

    def mknod(self, w: Writer, parent: int, name: bytes, typ: int, mode: int, uid: int,
              gid: int, rdev: tuple[int, int] = (0, 0), *, journal: bool = True):
        """A special file (block/character device, socket, FIFO): an inode with no bytes;
        devices keep rdev. journal=False: no change-journal job (imported from S3)."""
        validate_name(name)
        if typ not in SPECIAL_TYPES:
            raise StoreError(errno.EINVAL, f"mknod of type {typ}: not a special file type")
        major, minor = rdev if typ in DEVICE_TYPES else (0, 0)
        if not (0 <= major <= RDEV_MAX and 0 <= minor <= RDEV_MAX):
            raise StoreError(errno.EINVAL, f"rdev {rdev} out of range")
        pd = w.must_dir(parent)
        if w.dirent(parent, name) is not None:
            raise StoreError(errno.EEXIST, f"{bytes(name)!r} exists")
        rec, cinfo = self._make(w, pd, name, typ, mode, uid, gid)
        old = rec.copy()
        rec.rdev_major, rec.rdev_minor = major, minor
        w.put_inode(rec, old)
        if journal:
            w.queue_put({"kind": "ns", "op": "mknod", "ino": rec.ino, "type": TYPE_NAMES[typ],
                         "new_path": entry_path(w, parent, name)})
        return rec, cinfo

    def link(self, w: Writer, ino: int, new_parent: int, new_name: bytes):
        validate_name(new_name)
        rec = w.must_inode(ino)
        if rec.type == FileType.DIR:
            raise StoreError(errno.EISDIR, "cannot hard-link a directory")
        if rec.nlink == 0:
            raise StoreError(errno.ENOENT, f"inode {ino} has been unlinked")
        if rec.nlink >= 0xFFFFFFFF:
            raise StoreError(errno.EMLINK, f"inode {ino} has too many links")
        pd = w.must_dir(new_parent)
        if w.dirent(new_parent, new_name) is not None:
            raise StoreError(errno.EEXIST, f"{bytes(new_name)!r} exists")
        t = time.time_ns()
        old_path = w.path_of(ino)
        old_pd, old = pd.copy(), rec.copy()
        w.put_dirent(pd, new_name, ino, rec.type)
        rec.nlink += 1
        rec.ctime_ns = t
        rec.change += 1
        w.put_inode(rec, old)
        self._touch_dir(pd, t)
        w.put_inode(pd, old_pd)
        w.queue_put({"kind": "ns", "op": "link", "ino": ino, "type": TYPE_NAMES[rec.type],
                     "old_path": old_path, "new_path": entry_path(w, new_parent, new_name)})
        return rec, ChangeInfo(True, old_pd.change, pd.change)

    def unlink(self, w: Writer, parent: int, name: bytes) -> ChangeInfo:
        validate_name(name)
        pd = w.must_dir(parent)
        child, _, typ = self._lookup(w, parent, name)
        if typ == FileType.DIR:
            raise StoreError(errno.EISDIR, f"{bytes(name)!r} is a directory")
        rec = w.must_inode(child)
        t = time.time_ns()
        job = {"kind": "ns", "op": "unlink", "ino": child, "type": TYPE_NAMES[typ],
               "old_path": entry_path(w, parent, name), "last_link": rec.nlink <= 1,
               **object_of(w, child)}
        old_pd = pd.copy()
        w.del_dirent(parent, name)
        self._drop_link(w, rec, t)
        w.queue_put(with_next_name(w, job))
        self._touch_dir(pd, t)
        w.put_inode(pd, old_pd)
        return ChangeInfo(True, old_pd.change, pd.change)

    def rmdir(self, w: Writer, parent: int, name: bytes) -> ChangeInfo:
        validate_name(name)
        pd = w.must_dir(parent)
        child, _, typ = self._lookup(w, parent, name)
        if typ != FileType.DIR:
            raise StoreError(errno.ENOTDIR, f"{bytes(name)!r} is not a directory")
        if w.has_children(child):
            raise StoreError(errno.ENOTEMPTY, f"directory {bytes(name)!r} is not empty")
        rec = w.must_inode(child)
        t = time.time_ns()
        w.queue_put({"kind": "ns", "op": "rmdir", "ino": child, "type": "dir",
                     "old_path": entry_path(w, parent, name)})
        old_pd = pd.copy()
        w.del_dirent(parent, name)
        w.put_inode(None, rec)
        pd.nlink -= 1
        self._touch_dir(pd, t)
        w.put_inode(pd, old_pd)
        return ChangeInfo(True, old_pd.change, pd.change)

    def remove(self, w: Writer, parent: int, name: bytes) -> ChangeInfo:
        validate_name(name)
        w.must_dir(parent)
        _, _, typ = self._lookup(w, parent, name)
        if typ == FileType.DIR:
            return self.rmdir(w, parent, name)
        return self.unlink(w, parent, name)

    def rename(self, w: Writer, sp: int, sn: bytes, dp: int, dn: bytes):
        validate_name(sn)
        validate_name(dn)
        spd = w.must_dir(sp)
        dpd = spd if dp == sp else w.must_dir(dp)
        s_ino, _, s_type = self._lookup(w, sp, sn)
        same = ChangeInfo(True, spd.change, spd.change), ChangeInfo(True, dpd.change, dpd.change)
        if sp == dp and sn == dn:
            return same
        dst = w.dirent(dp, dn)
        drec = None
        if dst is not None:
            if dst[0] == s_ino:          # two links of one file: POSIX says do nothing
                return same
            drec = w.must_inode(dst[0])
            if s_type == FileType.DIR:
                if drec.type != FileType.DIR:
                    raise StoreError(errno.ENOTDIR, f"cannot replace non-directory "
                                     f"{bytes(dn)!r} with a directory")
                if w.has_children(drec.ino):
                    raise StoreError(errno.ENOTEMPTY, f"directory {bytes(dn)!r} is not empty")
            elif drec.type == FileType.DIR:
                raise StoreError(errno.EISDIR, f"cannot replace directory {bytes(dn)!r} "
                                 "with a non-directory")
        if s_type == FileType.DIR and sp != dp:
            x = dp
            while True:                  # O(depth): is the target inside the source?
                if x == s_ino:
                    raise StoreError(errno.EINVAL, "cannot move a directory into itself")
                if x == ROOT_INO:
                    break
                x = w.must_inode(x).parent
        srec = w.must_inode(s_ino)
        t = time.time_ns()
        old_path = entry_path(w, sp, sn)
        new_path = entry_path(w, dp, dn)
        old_spd, old_dpd, old_srec = spd.copy(), dpd.copy(), srec.copy()
        if drec is not None:             # the replaced target goes first (uploader order)
            job = {"kind": "ns", "op": "rmdir" if drec.type == FileType.DIR else "unlink",
                   "ino": drec.ino, "type": TYPE_NAMES[drec.type], "old_path": new_path,
                   "last_link": drec.type == FileType.DIR or drec.nlink <= 1,
                   "replaced_by": s_ino, **object_of(w, drec.ino)}
            w.del_dirent(dp, dn)
            if drec.type == FileType.DIR:
                dpd.nlink -= 1
                w.put_inode(None, drec)
            else:
                self._drop_link(w, drec, t)
            w.queue_put(with_next_name(w, job))
        w.del_dirent(sp, sn)
        w.put_dirent(dpd, dn, s_ino, s_type)
        if s_type == FileType.DIR and sp != dp:
            spd.nlink -= 1
            dpd.nlink += 1
            srec.parent = dp
        srec.ctime_ns = t
        srec.change += 1
        w.put_inode(srec, old_srec)
        self._touch_dir(spd, t)
        w.put_inode(spd, old_spd)
        if dpd is not spd:
            self._touch_dir(dpd, t)
            w.put_inode(dpd, old_dpd)
        w.queue_put({"kind": "ns", "op": "rename", "ino": s_ino, "type": TYPE_NAMES[s_type],
                     "old_path": old_path, "new_path": new_path,
                     "replaced": drec.ino if drec is not None else None, **sent_of(w, s_ino)})
        return (ChangeInfo(True, old_spd.change, spd.change),
                ChangeInfo(True, old_dpd.change, dpd.change))

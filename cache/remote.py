"""The remote side of files: what the uploader records of their objects in S3 (`RemoteInfo`:
sent, uploaded, multipart progress, kept and moved objects, issue 13's identity bookkeeping)
and the import of objects as files: a part of `Store`.
"""
from __future__ import annotations

import errno
import json
import time

from . import extents
from .api import Attr, DataState, FileType, RemoteInfo, StoreError, ROOT_INO
from .index import F_SENT, F_UNCOMMITTED, View, Writer
from .keys import U64
from .namespace import validate_name
from .storebase import StoreBase


class RemoteRecords(StoreBase):
    """Object records and import (the records live in the index's `remote` and `rkeys`)."""

    def mark_sent(self, ino: int) -> None:
        """*Blocking.* Flag regular file `ino` F_SENT (S3 may get an object written for it):
        the uploader calls it before it reads the file's path for an upload, and makes it
        durable (`sync`) before its first S3 write. A journal job queued before it records
        `sent: False` (namespace.sent_of), and its rename or unlink is then already visible
        to that path lookup, so the upload never writes to the job's old name."""
        with self.ix.read() as v:
            rec = v.must_inode(ino)
        if not rec.flags & F_SENT:
            self._in_batch(self._ns_mark_sent, ino, durable=False)

    def _ns_mark_sent(self, w: Writer, ino: int) -> None:
        rec = w.must_inode(ino)
        self._regular(rec)
        if not rec.flags & F_SENT:
            new = rec.copy()
            new.flags |= F_SENT
            w.put_inode(new, rec)

    def mark_uploaded(self, ino: int, remote: RemoteInfo) -> bool:
        """*Blocking.* Record the object; the file becomes CLEAN if its change counter still
        equals remote.uploaded_change and nothing uncommitted may be in it (else stays DIRTY
        and returns False). Durable on return. A file with ABSENT ranges left becomes ABSENT
        instead of CLEAN.

        F_UNCOMMITTED set means bytes the upload read may not be on disk (a client opened
        and wrote the file after the uploader's commit_settled, a commit kept the flag for
        that open writer): CLEAN would be a lie after a power cut, and recovery does not
        visit clean files. It stays DIRTY and goes again once committed."""
        return self._in_batch(self._ns_mark_uploaded, ino, remote, durable=True)

    def _ns_mark_uploaded(self, w: Writer, ino: int, remote: RemoteInfo) -> bool:
        rec = w.must_inode(ino)
        self._regular(rec)
        w.put_remote(ino, _keep_replaces(w.remote(ino), remote, overwritten=remote.key))
        new = rec.copy()
        ok = rec.change == remote.uploaded_change and not rec.flags & F_UNCOMMITTED
        if ok:
            extents.relabel(w.txn, self.ix.extents, ino, DataState.DIRTY, DataState.CLEAN)
            absent = extents.absent_ranges(w.txn, self.ix.extents, ino, 0, rec.size)
            new.state = DataState.ABSENT if absent else DataState.CLEAN
            new.lru_ns = time.time_ns()
        elif new.state in (DataState.QUEUED, DataState.UPLOADING):
            new.state = DataState.DIRTY
        w.put_inode(new, rec)
        return ok

    def remote_info(self, ino: int) -> RemoteInfo:
        with self.ix.read() as v:
            v.must_inode(ino)
            return v.remote(ino)

    def set_remote_info(self, ino: int, remote: RemoteInfo) -> None:
        """*Blocking.* Record progress (upload_id, parts) durably for resume after a crash."""
        self._in_batch(self._ns_set_remote_info, ino, remote, durable=True)

    def _ns_set_remote_info(self, w: Writer, ino: int, remote: RemoteInfo) -> None:
        w.must_inode(ino)
        w.put_remote(ino, _keep_replaces(w.remote(ino), remote))

    def note_parts(self, ino: int, upload_id: str, parts: list) -> None:
        """Record the parts of multipart upload `upload_id` sent so far, without waiting: a
        lazy batch op, neither durable on return nor the reason for a commit (it joins the
        next batch, or forms one LAZY_DELAY later), so the uploader never waits for the
        index lock or an fdatasync per part. A note lost to a crash costs only the re-upload
        of its parts: a resume keeps a part only if the record names it and S3 lists it with
        that ETag, and the upload id itself was recorded durably before the first part
        (set_remote_info). Applied only while the record still names this upload: a note
        that lands after the upload completed, was aborted or started over changes nothing.
        Dropped while the store closes (the uploader has stopped by then)."""
        self._queue_lazy(self._ns_note_parts, ino, upload_id, list(parts))

    def _ns_note_parts(self, w: Writer, ino: int, upload_id: str, parts: list) -> None:
        if w.inode(ino) is None:
            return
        cur = w.remote(ino)
        if cur.upload_id == upload_id:
            cur.parts = parts
            w.put_remote(ino, cur)

    # ---- import ------------------------------------------------------------------
    def import_object(self, path: str, size: int, mode: int, uid: int, gid: int,
                      mtime_ns: int, remote: RemoteInfo) -> Attr | None:
        """Add an object as an ABSENT file (creating parent dirs, journaled as mkdirs). Never
        overrides an existing name (returns None then): local data always wins. The file is
        not journaled (it came from S3)."""
        if size < 0:
            raise StoreError(errno.EINVAL, "negative size")
        parts = _import_parts(path)
        with self.ix.write() as w:
            parent = self._import_parent(w, parts, uid, gid)
            if parent is None:
                return None
            rec, _ = self.ns._make(w, w.must_dir(parent), parts[-1], FileType.REG, mode,
                                   uid, gid)
            old = rec.copy()
            rec.size = rec.committed_size = size
            rec.mtime_ns = mtime_ns
            rec.state = DataState.ABSENT if size else DataState.CLEAN
            rec.flags &= ~F_UNCOMMITTED        # its bytes are the object's, nothing written
            rec.flags |= F_SENT                # an object of it exists
            extents.set_range(w.txn, self.ix.extents, rec.ino, 0, size, DataState.ABSENT)
            w.put_inode(rec, old)
            _own_import(w, rec.ino, remote)
        return rec.attr()

    def import_symlink(self, path: str, target: bytes, mode: int, uid: int, gid: int,
                       mtime_ns: int, remote: RemoteInfo | None = None) -> Attr | None:
        """Add a symbolic link mirrored in S3 (creating parent dirs). Like import_object: never
        overrides an existing name (returns None then), not journaled. `remote`: the object it
        came from, owned like an imported file's (its renames move it, its unlink deletes it)."""
        return self._import_node(path, uid, gid, mtime_ns, remote, lambda w, parent, name: self.ns.symlink(
            w, parent, name, target, mode, uid, gid, journal=False))

    def import_special(self, path: str, typ: FileType, rdev: tuple[int, int], mode: int,
                       uid: int, gid: int, mtime_ns: int, remote: RemoteInfo | None = None) -> Attr | None:
        """Add a special file mirrored in S3 (creating parent dirs). Like import_symlink."""
        return self._import_node(path, uid, gid, mtime_ns, remote, lambda w, parent, name: self.ns.mknod(
            w, parent, name, typ, mode, uid, gid, rdev, journal=False))

    def _import_node(self, path: str, uid: int, gid: int, mtime_ns: int, remote: RemoteInfo | None,
                     make) -> Attr | None:
        """The one transaction of import_symlink/import_special: the parents, `make(w, parent,
        name)` (the namespace op, unjournaled), the object's mtime, and its record."""
        parts = _import_parts(path)
        with self.ix.write() as w:
            parent = self._import_parent(w, parts, uid, gid)
            if parent is None:
                return None
            rec, _ = make(w, parent, parts[-1])
            old = rec.copy()
            rec.mtime_ns = mtime_ns
            w.put_inode(rec, old)
            if remote is not None:
                _own_import(w, rec.ino, remote)
        return rec.attr()

    def _import_parent(self, w, parts: list[bytes], uid: int, gid: int) -> int | None:
        """The directory an imported name goes into (made as needed), or None when a component
        is a local non-directory or the name itself exists: local data always wins."""
        parent = ROOT_INO
        for name in parts[:-1]:
            ent = w.dirent(parent, name)
            if ent is None:              # journaled: S3 gets its marker, as for a mkdir
                parent = self.ns.mkdir(w, parent, name, 0o755, uid, gid)[0].ino
            elif ent[2] != FileType.DIR:
                return None
            else:
                parent = ent[0]
        return None if w.dirent(parent, parts[-1]) is not None else parent

    # ---- object records (uploader identity bookkeeping, issue 13) ------------------------
    def remote_records_under(self, prefix: str) -> list[tuple[int, RemoteInfo]]:
        """(ino, RemoteInfo) of every record whose key, or a key it `replaces`, starts with
        `prefix` (export-relative): the objects a directory rename in S3 moves. A scan of the
        object records, not the tree: records follow S3 keys, which lag the namespace. A range
        scan of their key index (rkeys), then each candidate's record checked."""
        from .index import rkey_inos
        out = []
        with self.ix.read() as v:
            for ino in rkey_inos(v.txn, self.ix.rkeys, prefix):
                r = v.remote(ino)
                if (r.key or "").startswith(prefix) or any(key.startswith(prefix) for key, _ in r.replaces):
                    out.append((ino, r))
        return out

    def owned_keys(self) -> set[str]:
        """Every S3 key (export-relative) the gateway still answers for: the key and the kept
        (`replaces`) objects of every record, and the old and new names and objects of queued
        change-journal jobs (a move or delete not yet done in S3). Import must never bring
        such an object in as a new file: its move or delete would leave that file with no
        object (issue 13: imported objects are owned like uploaded ones). One scan of the
        records and the queue, for a whole import pass."""
        from .index import remote_from_json
        out: set[str] = set()
        with self.ix.read() as v:
            for _, buf in v.txn.cursor(db=self.ix.remote):
                r = remote_from_json(buf)
                if r.key:
                    out.add(r.key)
                out.update(k for k, _ in r.replaces)
            for _, val in v.txn.cursor(db=self.ix.queue):
                job = json.loads(bytes(val))
                if job.get("kind") != "ns":
                    continue
                is_dir = job.get("type") == "dir"
                names = [job.get("old_path")]
                if job.get("op") in ("rename", "unlink"):
                    # the destination too: a queued move copies there, and an unlink's move to
                    # the file's next link (`rm a` of a hard-linked file) copies to that name as
                    # it was, which a later rename may have left free for an import
                    names.append(job.get("new_path"))
                for name in names:
                    if name:
                        out.add(name.rstrip("/") + "/" if is_dir else name)
                if job.get("object"):
                    out.add(job["object"][0])
                out.update(k for k, _ in job.get("replaces", []))
        return out

    def rekey_remote(self, ino: int, old_key: str, old_etag: str | None, new_key: str,
                     new_etag: str, version_id: str | None = None) -> bool:
        """*Blocking, durable.* The object (old_key, old_etag) now lives at new_key with
        new_etag: update the record that points at it (as its key or in `replaces`) if it
        still does. Compare-and-set, so a replayed move never re-keys a newer record."""
        with self.ix.write() as w:
            if w.inode(ino) is None:
                return False
            r = w.remote(ino)
            hit = False
            moved = [(new_key, new_etag) if (k, e) == (old_key, old_etag) else (k, e) for k, e in r.replaces]
            if r.key == old_key and (old_etag is None or r.etag == old_etag):
                r.key, r.etag, r.version_id, hit = new_key, new_etag, version_id, True
                # the copy overwrote whatever was at new_key: nothing left there to replace
                moved = [(k, e) for k, e in moved if k != new_key]
            if moved != list(r.replaces):
                r.replaces, hit = moved, True
            if hit:
                w.put_remote(ino, r)
        if hit:
            self.committer.sync()
        return hit

    def forget_replaced(self, ino: int, key: str, etag: str) -> None:
        """*Blocking, durable.* The kept object (key, etag) was deleted or handed on."""
        with self.ix.write() as w:
            if w.inode(ino) is None:
                return
            r = w.remote(ino)
            if (key, etag) in r.replaces:
                r.replaces = [x for x in r.replaces if x != (key, etag)]
                w.put_remote(ino, r)
        self.committer.sync()

    def adopt_replaced(self, path: str, key: str, etag: str, exclude_ino: int) -> int | None:
        """*Blocking, durable.* A file unlinked (or renamed over) at `path` left its object
        (`key`, `etag`) in S3. If a regular file (not `exclude_ino`) now sits at `path`, its
        upload or move will replace that object atomically, or land its own object under
        another of its names first: record it in that file's `replaces` and return its ino;
        else None (nothing will: the caller deletes). Such a file: a dirty one (its upload
        goes to its first name, path_of; if that is not `path`, the upload drops the adopted
        object once its own has landed, so S3 never lacks both versions of the file at
        `path`), or one a queued rename moves there."""
        try:
            parts = _import_parts(path)
        except StoreError:
            return None
        with self.ix.write() as w:
            ino = ROOT_INO
            for name in parts:
                ent = w.dirent(ino, name)
                if ent is None:
                    return None
                ino = ent[0]
            rec = w.inode(ino)
            if rec is None or rec.type != FileType.REG or ino == exclude_ino:
                return None
            r = w.remote(ino)
            if r.key == path and r.etag:
                # the file here has its own object here: its upload came after the one that
                # left (key, etag), which it replaced. Nothing to delete: an ETag-conditional
                # delete would remove the new object when the bytes are equal (two empty files)
                return ino
            if not rec.is_dirty and not self._move_queued(w, ino, path):
                # neither an upload nor a queued move will put its object at `path` (e.g. a
                # clean file hard-linked there, its object at its first name): nothing will
                # replace it, and the file is in S3 already
                return None
            if (key, etag) not in r.replaces:
                r.replaces = list(r.replaces) + [(key, etag)]
                w.put_remote(ino, r)
        self.committer.sync()
        return ino

    def moves_to(self, ino: int, key: str, path: str) -> bool:
        """*Blocking.* Whether queued jobs will carry file `ino`'s object at `key` (the one an
        upload has just written there) on to `path`."""
        with self.ix.read() as v:
            return self._move_queued(v, ino, path, key)

    def _move_queued(self, w: View, ino: int, path: str, key: str | None = None) -> bool:
        """Whether queued jobs will move `ino`'s object (at `key`, else its record's) to `path`.
        Follows the object's key through the queue in order: a rename of the name it is at (of
        the file, or of a directory above it), or the unlink of that name while another link
        keeps the file (see with_next_name). A rename of another of the file's names moves
        nothing: a hard-linked file's object stays at the name it was uploaded under."""
        r = w.remote(ino)
        if key is None:
            key = r.key if r.etag else None
        for job_id, val in w.txn.cursor(db=self.ix.queue):
            if key is None:
                return False
            job = json.loads(bytes(val))
            if job.get("kind") != "ns":
                continue
            op, old, new = job.get("op"), job.get("old_path"), job.get("new_path")
            if op == "rename" and job.get("type") == "dir":
                old_dir = (old or "").rstrip("/") + "/"
                if key.startswith(old_dir) and U64.unpack(job_id)[0] > r.imported_after_job:
                    key = new.rstrip("/") + "/" + key[len(old_dir):]
            elif job.get("ino") != ino or old != key:
                continue
            elif op in ("rename", "unlink"):
                key = new           # unlink: the next name (None: the last went, the object with it)
            if key == path:
                return True
        return False


def _own_import(w: Writer, ino: int, remote: RemoteInfo) -> None:
    """An imported name owns the object it came from, like an uploaded file. Stamped with the
    last job id: a directory move queued before the import never takes it along (the name was
    never in the moved subtree; uploader.worker._move_dir)."""
    remote.imported_after_job = w.counter(b"next_job")
    w.put_remote(ino, remote)


def _keep_replaces(stored: RemoteInfo, new: RemoteInfo, overwritten: str | None = None) -> RemoteInfo:
    """`replaces` belongs to adopt_replaced / rekey_remote / forget_replaced: a record written
    from a copy read earlier must not drop entries added meanwhile. An object just written
    at `overwritten` replaced the entry there."""
    new.replaces = [x for x in stored.replaces if overwritten is None or x[0] != overwritten]
    return new


def _import_parts(path: str) -> list[bytes]:
    """The checked name components of an export-relative path from S3."""
    parts = [p.encode("utf-8", "surrogateescape") for p in path.split("/") if p]
    if not parts:
        raise StoreError(errno.EINVAL, f"import of an empty path {path!r}")
    for p in parts:
        validate_name(p)
    return parts

"""The narrow store API that nfsd and the uploader call. (CONTRACT SKELETON: bodies to be implemented.)

Threading: every method is thread-safe. Methods marked *blocking* may wait for disk
sync (fdatasync / LMDB sync) and must be called from a worker thread by asyncio code;
all others are quick (an LMDB txn without sync, page-cache I/O) and may run on the loop.

Durability: namespace mutations (create, mkdir, symlink, link, unlink, rmdir, rename,
setattr) are applied at once (visible to every reader) and become durable at the next
`sync()`; callers that must reply "durable" call `sync()` (group-committed: one LMDB sync
covers every caller waiting at that moment). Data `write()` goes to the page cache and
is visible at once (read-after-write); `commit(ino)` makes the file's data and its size /
extent index durable.

Names are `bytes` (one path component). Invalid names raise StoreError(EINVAL)
(empty, ".", "..", containing b"/" or NUL) or StoreError(ENAMETOOLONG) (> 255 bytes).
"""
from __future__ import annotations

from typing import Iterator

from .api import (Attr, ChangeInfo, DirEntry, Extent, RemoteInfo, SetAttr, StatFS,
                  StoreError, ROOT_INO)


class Store:
    # ---- lifecycle -------------------------------------------------------------
    @classmethod
    def open(cls, path: str, *, capacity: int | None = None, reserve: int = 1 << 30,
             high_watermark: float = 0.90, low_watermark: float = 0.80,
             evict: bool = True) -> "Store":
        """Open (creating if empty) the store in directory `path`, run crash recovery,
        and return it. A store of an unknown/newer format raises StoreError(EINVAL) with a
        clear message and is not modified. capacity=None: the filesystem's size less reserve."""
        raise NotImplementedError

    def close(self) -> None:
        """Make everything durable (all live inodes committed, LMDB synced) and close."""
        raise NotImplementedError

    write_verifier: bytes      # 8 bytes, new at every open()
    instance_id: bytes         # 16 bytes, stable for the store's lifetime (server owner/scope)

    # ---- namespace (nfsd) -------------------------------------------------------
    def getattr(self, ino: int) -> Attr:
        """Attributes including unstable writes (live size/mtime). ESTALE if ino is gone."""
        raise NotImplementedError

    def lookup(self, parent: int, name: bytes) -> Attr:
        """ENOENT, ENOTDIR (parent not a dir), ESTALE (parent gone)."""
        raise NotImplementedError

    def lookup_parent(self, ino: int) -> Attr:
        """Parent directory of a directory (root's parent is root)."""
        raise NotImplementedError

    def setattr(self, ino: int, sa: SetAttr) -> Attr:
        """Size changes truncate/extend (truncate up reads zeros). Bumps change/ctime."""
        raise NotImplementedError

    def create(self, parent: int, name: bytes, mode: int, uid: int, gid: int,
               *, exclusive: bool = False) -> tuple[Attr, ChangeInfo, bool]:
        """Create a regular file. If the name exists: exclusive -> EEXIST; a file -> return
        it unchanged with created=False; a directory -> EISDIR. Returns (attr, cinfo, created)."""
        raise NotImplementedError

    def mkdir(self, parent: int, name: bytes, mode: int, uid: int, gid: int) -> tuple[Attr, ChangeInfo]:
        raise NotImplementedError

    def symlink(self, parent: int, name: bytes, target: bytes, mode: int, uid: int, gid: int
                ) -> tuple[Attr, ChangeInfo]:
        raise NotImplementedError

    def readlink(self, ino: int) -> bytes:
        """EINVAL if not a symlink."""
        raise NotImplementedError

    def link(self, ino: int, new_parent: int, new_name: bytes) -> tuple[Attr, ChangeInfo]:
        """Hard link (files only: EISDIR for directories). EEXIST if the name exists."""
        raise NotImplementedError

    def unlink(self, parent: int, name: bytes) -> ChangeInfo:
        """Remove a non-directory name (EISDIR for a directory: use rmdir). The inode's data is
        reclaimed when nlink reaches 0 and no open remains (see open_file/close_file)."""
        raise NotImplementedError

    def rmdir(self, parent: int, name: bytes) -> ChangeInfo:
        """ENOTEMPTY, ENOTDIR."""
        raise NotImplementedError

    def remove(self, parent: int, name: bytes) -> ChangeInfo:
        """unlink or rmdir, whichever the name is (NFS REMOVE)."""
        raise NotImplementedError

    def rename(self, src_parent: int, src_name: bytes, dst_parent: int, dst_name: bytes
               ) -> tuple[ChangeInfo, ChangeInfo]:
        """Atomic rename in one transaction, replacing an existing target (file over file,
        dir over empty dir; EISDIR/ENOTDIR/ENOTEMPTY as POSIX; EINVAL when moving a dir into
        its own subtree). Same name in the same dir: no-op. O(1) for directories.
        Returns (source dir cinfo, target dir cinfo)."""
        raise NotImplementedError

    def readdir(self, ino: int, cookie: int = 0) -> Iterator[DirEntry]:
        """Entries after `cookie` (0 = from the start), in cookie order, without . and ..
        Cookies are stable (a removed entry's cookie keeps its place); an unknown
        cookie past the end yields nothing."""
        raise NotImplementedError

    def statfs(self) -> StatFS:
        raise NotImplementedError

    def sync(self) -> None:
        """*Blocking.* Make every namespace change applied so far durable (group commit)."""
        raise NotImplementedError

    # ---- data (nfsd) ---------------------------------------------------------------
    def open_file(self, ino: int, write: bool) -> None:
        """Count an open (NFS open state). Open-for-write files are never uploaded or evicted."""
        raise NotImplementedError

    def close_file(self, ino: int, write: bool) -> None:
        """Drop an open; reclaims an unlinked inode at its last close."""
        raise NotImplementedError

    def read(self, ino: int, offset: int, count: int) -> tuple[bytes | memoryview, bool]:
        """Up to `count` bytes at `offset` (holes read as zeros), and eof. Raises
        StoreError(EAGAIN) with `.missing = [(off, len), ...]` when a range is ABSENT locally:
        the caller fetches it (read-through) and retries."""
        raise NotImplementedError

    def read_into(self, ino: int, offset: int, buf: memoryview) -> tuple[int, bool]:
        """Like read() but preadv straight into `buf`; returns (nbytes, eof)."""
        raise NotImplementedError

    def write(self, ino: int, offset: int, data: bytes | memoryview) -> Attr:
        """pwrite into the page cache; updates live size/mtime/change; marks the range dirty.
        EAGAIN when dirty data would exceed capacity (caller answers NFS4ERR_DELAY);
        ENOSPC when the disk is full (nothing already stored is damaged). Returns new attrs."""
        raise NotImplementedError

    def commit(self, ino: int) -> None:
        """*Blocking.* fdatasync the file's data and durably record its size/extents."""
        raise NotImplementedError

    # ---- uploader ----------------------------------------------------------------
    def path_of(self, ino: int) -> str | None:
        """Export-relative path ("a/b/c") of a linked inode (first link), or None if unlinked."""
        raise NotImplementedError

    def ready_for_upload(self, now_ns: int, settle_ns: int, limit: int = 100) -> list[int]:
        """Inodes whose data is dirty, committed, not open for write, and quiet for settle_ns
        (settle_ns=0: flush). Uses an index, no full scan."""
        raise NotImplementedError

    def extents(self, ino: int) -> list[Extent]:
        raise NotImplementedError

    def open_data_fd(self, ino: int) -> int:
        """A read-only fd on the file's local data (caller closes) for os.preadv / sendfile."""
        raise NotImplementedError

    def set_data_state(self, ino: int, state, change: int | None = None) -> bool:
        """Move a file to QUEUED/UPLOADING/DIRTY. With `change`, only if the inode's change
        counter still equals it (returns False otherwise)."""
        raise NotImplementedError

    def mark_uploaded(self, ino: int, remote: RemoteInfo) -> bool:
        """Record the object; the file becomes CLEAN if its change counter still equals
        remote.uploaded_change (else stays DIRTY and returns False). Durable on return."""
        raise NotImplementedError

    def remote_info(self, ino: int) -> RemoteInfo:
        raise NotImplementedError

    def set_remote_info(self, ino: int, remote: RemoteInfo) -> None:
        """Record progress (upload_id, parts) durably for resume after a crash."""
        raise NotImplementedError

    def evict(self, ino: int) -> int:
        """Punch out a CLEAN, unpinned, not-open file's local data (-> ABSENT); bytes freed."""
        raise NotImplementedError

    def eviction_candidates(self, want_bytes: int) -> list[int]:
        """Least-recently-used CLEAN files (not pinned, not open) totalling >= want_bytes."""
        raise NotImplementedError

    def fill(self, ino: int, offset: int, data: bytes | memoryview) -> None:
        """Store bytes fetched from S3 for an ABSENT range (stays clean)."""
        raise NotImplementedError

    def import_object(self, path: str, size: int, mode: int, uid: int, gid: int,
                      mtime_ns: int, remote: RemoteInfo) -> Attr | None:
        """Add an object as an ABSENT file (creating parent dirs). Never overrides an existing
        name (returns None then): local data always wins."""
        raise NotImplementedError

    def set_pinned(self, ino: int, pinned: bool, reason: str = "") -> None:
        raise NotImplementedError

    # durable work queue (the uploader's jobs; opaque dicts to the store).
    # The store itself appends a change-journal job in the SAME transaction as each namespace
    # op the uploader must mirror, so nothing is lost between the op and the queue:
    #   {"kind": "ns", "op": "rename", "ino": I, "type": "reg|dir|lnk", "old_path": P, "new_path": Q}
    #   {"kind": "ns", "op": "unlink", "ino": I, "type": ..., "old_path": P, "last_link": bool}
    #   {"kind": "ns", "op": "mkdir"|"rmdir", "ino": I, "old_path"/"new_path": P}
    # (paths export-relative). Whether S3 needs work for it is the uploader's business.
    def queue_put(self, job: dict) -> int:
        raise NotImplementedError

    def queue_list(self, limit: int = 1000) -> list[tuple[int, dict]]:
        raise NotImplementedError

    def queue_update(self, job_id: int, job: dict) -> None:
        raise NotImplementedError

    def queue_done(self, job_id: int) -> None:
        raise NotImplementedError

    def check(self) -> list[str]:
        """Consistency check: LMDB vs extent files; returns problems (empty list = consistent)."""
        raise NotImplementedError

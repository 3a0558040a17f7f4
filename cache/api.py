"""The store's public types: what nfsd and the uploader see of the cache.

This module is the contract between the rooms. `cache.store.Store` implements it;
nothing here knows XDR or S3. Errors are `StoreError` carrying a POSIX errno so
each caller maps them to its own protocol (nfsd -> NFS4ERR_*, admin -> messages).
"""
from __future__ import annotations

import errno
from dataclasses import dataclass, field
from enum import IntEnum
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Iterator
    from concurrent.futures import Future

ROOT_INO = 1
NAME_MAX = 255
# The bytes a name may not hold, as ints: `SLASH in name` is a memchr, while CPython 3.11's
# `b"/" in name` first tries the needle as an int and raises and clears a TypeError (~2,000
# instructions per test, measured with callgrind: 8 of them per nfs-rs exists()).
SLASH, NUL = 0x2F, 0x00
SYMLINK_MAX = 4096          # bytes of a symbolic link's target


class StoreError(OSError):
    """A store operation failed; `.errno` says why (ENOENT, EEXIST, ENOTDIR, EISDIR,
    ENOTEMPTY, ESTALE, ENOSPC, EAGAIN (over capacity: retry later), EINVAL, ENAMETOOLONG,
    EXDEV, EMLINK, EROFS, EIO)."""

    def __init__(self, err: int, msg: str = ""):
        super().__init__(err, msg or errno.errorcode.get(err, str(err)))


class FileType(IntEnum):
    """Values are NFSv4's nfs_ftype4. BLK/CHR/SOCK/FIFO are special files: an inode with a
    type (and, for devices, an rdev) that is never opened for I/O and has no bytes."""
    REG = 1
    DIR = 2
    BLK = 3
    CHR = 4
    LNK = 5
    SOCK = 6
    FIFO = 7


SPECIAL_TYPES = frozenset((FileType.BLK, FileType.CHR, FileType.SOCK, FileType.FIFO))
DEVICE_TYPES = frozenset((FileType.BLK, FileType.CHR))
RDEV_MAX = 0xFFFFFFFF       # major and minor each (NFS specdata4 is two uint32s)


class DataState(IntEnum):
    """State of a file's bytes relative to S3 (per file; the extent map refines it per range)."""
    DIRTY = 1       # written locally, not yet (fully) in S3
    QUEUED = 2      # eligible and waiting for the uploader
    UPLOADING = 3   # the uploader is sending it
    CLEAN = 4       # identical object in S3, local copy present
    ABSENT = 5      # in S3, not (fully) present locally (evicted or imported)


@dataclass(slots=True)
class Attr:
    ino: int                 # fileid; never reused
    gen: int                 # generation; file handles carry (ino, gen)
    type: FileType
    mode: int                # permission bits only (07777)
    nlink: int
    uid: int
    gid: int
    size: int
    space_used: int          # bytes allocated locally
    atime_ns: int
    mtime_ns: int
    ctime_ns: int
    change: int              # monotonic change counter (NFS change attribute)
    parent: int              # for directories: the parent's ino (root: itself); files: 0
    data_state: DataState = DataState.CLEAN
    pinned: bool = False
    data_seq: int = 0        # changes with the file's bytes (write, truncate), not with metadata
    rdev: tuple[int, int] = (0, 0)   # (major, minor) of a block or character device


@dataclass(slots=True)
class SetAttr:
    """Fields left as None are unchanged. `atime_ns`/`mtime_ns` may be the string "now"."""
    mode: int | None = None
    uid: int | None = None
    gid: int | None = None
    size: int | None = None
    atime_ns: int | str | None = None
    mtime_ns: int | str | None = None


@dataclass(slots=True)
class DirEntry:
    name: bytes
    cookie: int              # stable across calls and restarts; never 0, 1 or 2
    attr: Attr


@dataclass(slots=True)
class ChangeInfo:
    """Directory change counters around a namespace op (NFS change_info4)."""
    atomic: bool
    before: int
    after: int


@dataclass(slots=True)
class StatFS:
    bytes_total: int
    bytes_free: int
    bytes_avail: int
    files_total: int
    files_free: int
    files_avail: int


@dataclass(slots=True)
class Extent:
    offset: int
    length: int
    state: DataState


@dataclass(slots=True)
class CopySource:
    """A whole-file copy made this file's bytes (COPY/CLONE of all of `src_ino`): while the
    file's data sequence is still `dst_seq`, it holds exactly `count` bytes equal to the
    source's at `src_seq`, so an object of the source at `src_seq` can be copied in S3
    instead of sending the bytes. Any later write or truncate moves the data sequence,
    which is what invalidates it (nothing on the write path clears it)."""
    src_ino: int
    src_seq: int
    count: int
    dst_seq: int


@dataclass(slots=True)
class RemoteInfo:
    """What the uploader recorded about a file's object (key relative to the bucket prefix)."""
    key: str | None = None
    etag: str | None = None
    checksum: str | None = None      # e.g. "crc32:BASE64" or "sha256:BASE64"
    uploaded_change: int = 0         # the inode's change counter that the object holds
    size: int = 0
    upload_id: str | None = None     # an in-progress multipart upload
    parts: list = field(default_factory=list)   # [(part_number, etag, checksum)]
    # object identity (issue 13): what the object at `key` is, checked before acting on it
    version_id: str | None = None    # on a versioned bucket
    data_seq: int | None = None      # the inode's data sequence the object holds
    # objects of files this one was renamed over, [(key, etag)]: kept in S3 until this
    # file's object replaces them (or deleted once nothing will), so S3 never lacks both
    replaces: list = field(default_factory=list)
    copied_from: CopySource | None = None    # the file is a whole copy of another (COPY/CLONE)
    # an imported file: the last change-journal job id when it was imported. A directory move
    # queued up to it predates the file, so it never takes this object along (the file was
    # never in the moved subtree: `mv imp a; import imp/y` leaves imp/y where it is)
    imported_after_job: int = 0


# ---- the seams: what nfsd and the uploader call on the store ---------------------------------
# `cache.store.Store` implements both; tests/cache/test_api_protocol.py holds it (and the test
# fakes) to these members: same names, same parameter names and kinds. A caller that needs
# something new adds it here first. Docstrings are the first line of `Store`'s (cache/store.py
# and the modules of its mixins).

class NfsStore(Protocol):
    """What nfsd (the ops, open state, grace, file handles) calls on the store."""

    write_verifier: bytes        # 8 bytes, new at every open of the store (WRITE/COMMIT verifier)
    instance_id: bytes           # durable for the store's life: server owner, file-handle MAC key
    path: str                    # the store's directory ("" for a fake without one)

    def getattr(self, ino: int) -> Attr:
        """Attributes including unstable writes (live size/mtime). ESTALE if ino is gone."""
        ...

    def lookup(self, parent: int, name: bytes) -> Attr:
        """ENOENT, ENOTDIR (parent not a dir), ESTALE (parent gone). Shared Attr as getattr's."""
        ...

    def find(self, parent: int, name: bytes) -> Attr | None:
        """lookup(), None for an absent name (other errors raise): LOOKUP's no-exception path."""
        ...

    def lookup_parent(self, ino: int) -> Attr:
        """Parent directory of a directory (root's parent is root)."""
        ...

    def setattr(self, ino: int, sa: SetAttr) -> Attr:
        """*Blocking.* Size changes truncate/extend (truncate up reads zeros). Durable on return."""
        ...

    def setattr_submit(self, ino: int, sa: SetAttr, loop=None):
        """setattr() without waiting, for a SETATTR without a size: a Future of its Attr, set
        once durable (with `loop`: an asyncio.Future of that loop); None for a size."""
        ...

    def setattr_unchanged(self, ino: int, sa: SetAttr) -> Attr | None:
        """The file's attributes if setattr(ino, sa) would change nothing, else None. Non-blocking."""
        ...

    def submit(self, op: str, *args, loop=None):
        """Queue namespace op `op` (one of NAMESPACE_OPS); a Future of its result, set once
        durable (with `loop`: an asyncio.Future of that loop)."""
        ...

    def create(self, parent: int, name: bytes, mode: int, uid: int, gid: int,
               *, exclusive: bool = False) -> tuple[Attr, ChangeInfo, bool]:
        """Create a regular file. Returns (attr, cinfo, created)."""
        ...

    def readlink(self, ino: int) -> bytes:
        """EINVAL if not a symlink."""
        ...

    def readdir(self, ino: int, cookie: int = 0) -> Iterator[DirEntry]:
        """Entries after `cookie` (0 = from the start), in cookie order, without . and .."""
        ...

    def statfs(self) -> StatFS:
        """Space and inode counts of the store (FSSTAT / statvfs)."""
        ...

    # -- upload state, read side (the RFC 8276 xattrs of nfsd/ops/xattr.py)
    def walk(self, ino: int, base: str = "") -> Iterator[tuple[str, Attr]]:
        """(path, attr) of everything under directory `ino` (not itself), depth first."""
        ...

    def remote_info(self, ino: int) -> RemoteInfo:
        """What the uploader recorded about the file's object (key, etag, multipart progress...)."""
        ...

    def sync(self) -> None:
        """*Blocking.* Make every namespace change applied so far durable (group commit)."""
        ...

    def durable(self) -> bool:
        """Whether every change applied so far is already durable (sync() would not block)."""
        ...

    def open_file(self, ino: int, write: bool) -> None:
        """Count an open (NFS open state). Open-for-write files are never uploaded or evicted."""
        ...

    def close_file(self, ino: int, write: bool, *, wait: bool = True):
        """Drop an open; reclaims an unlinked inode at its last close (wait=False: queued, a Future or None)."""
        ...

    def read_into(self, ino: int, offset: int, buf: memoryview) -> tuple[int, bool]:
        """*Blocking* (the disk, when the page cache misses). Like read() but into `buf`: (nbytes, eof)."""
        ...

    def read_into_cached(self, ino: int, offset: int, buf: memoryview) -> tuple[int, bool] | None:
        """read_into() for the event loop: from the page cache only, None when the disk is needed."""
        ...

    def write(self, ino: int, offset: int, data: bytes | memoryview) -> Attr:
        """pwrite into the page cache; updates live size/mtime/change; marks the range dirty."""
        ...

    def write_nowait(self, ino: int, offset: int, data: bytes | memoryview) -> bool:
        """write() on the caller's thread in the common case (I5); False: nothing written, use write()."""
        ...

    def write_stable_async(self, ino: int, offset: int, data: bytes | memoryview, loop, start
                           ) -> asyncio.Future:
        """write() and commit() in one (FILE_SYNC) for a caller on `loop`: start(fn, *args)
        runs its blocking half on a worker without waiting; an asyncio.Future of `loop`, set
        once durable."""
        ...

    def content_runs(self, ino: int, offset: int, end: int) -> list[tuple[int, int, bool]]:
        """[offset, min(end, size)) as (start, length, is_data) runs in order."""
        ...

    def seek(self, ino: int, offset: int, data: bool) -> int | None:
        """Where the next data (data=True) or hole starts at or after `offset`: None when no data follows."""
        ...

    def deallocate(self, ino: int, offset: int, length: int) -> Attr:
        """Punch a hole in [offset, offset+length) below the size: reads return zeros, the size stays."""
        ...

    def allocate(self, ino: int, offset: int, length: int) -> Attr:
        """*Blocking.* Reserve disk blocks for [offset, offset+length) (fallocate, bytes unchanged)."""
        ...

    def copy_range(self, src: int, dst: int, src_off: int, dst_off: int, count: int
                   ) -> tuple[Attr, bool]:
        """*Blocking.* dst's [dst_off, +count) becomes src's [src_off, +count): (dst attr, reflinked)."""
        ...

    def commit(self, ino: int) -> None:
        """*Blocking.* fdatasync the file's data and durably record its size/extents."""
        ...

    def commit_async(self, ino: int, loop, start) -> asyncio.Future:
        """commit() for a caller on `loop`: start(fn, *args) runs its blocking half on a
        worker without waiting; an asyncio.Future of `loop`, set once durable."""
        ...

    def submit_client_record(self, owner: bytes, record: bytes | None) -> Future:
        """Put `record` for `owner` (None: delete it) in the next batch; a Future set once durable."""
        ...

    def client_records(self) -> dict[bytes, bytes]:
        """Every client record: {owner: record}."""
        ...

    # -- reply records of RENAME and REMOVE, for their replay after a restart (cache/replies.py)
    def submit_noted(self, op: str, note, *args, loop=None):
        """submit(op, *args) of a "rename" or "remove" that also records its answer for
        `note`'s client (a cache.replies.ReplyNote), in the op's own txn."""
        ...

    def reply_records(self, owner: bytes) -> list:
        """The records kept for client `owner` (cache.replies.ReplyRecord), oldest first."""
        ...

    def submit_reply_consumed(self, owner: bytes, seq: int, loop=None):
        """Delete one record in the next batch; a Future set at its commit."""
        ...


class UploaderStore(Protocol):
    """What the uploader (worker, service, read-through, import, retention) calls on the store."""

    instance_id: bytes           # durable for the store's life: stamped on every object
    path: str                    # the store's directory (retention keeps its log beside it)

    # -- the namespace, read side
    def getattr(self, ino: int) -> Attr:
        """Attributes including unstable writes (live size/mtime). ESTALE if ino is gone."""
        ...

    def lookup(self, parent: int, name: bytes) -> Attr:
        """ENOENT, ENOTDIR (parent not a dir), ESTALE (parent gone). Shared Attr as getattr's."""
        ...

    def readlink(self, ino: int) -> bytes:
        """EINVAL if not a symlink."""
        ...

    def readdir(self, ino: int, cookie: int = 0) -> Iterator[DirEntry]:
        """Entries after `cookie` (0 = from the start), in cookie order, without . and .."""
        ...

    def walk(self, ino: int, base: str = "") -> Iterator[tuple[str, Attr]]:
        """(path, attr) of everything under directory `ino` (not itself), depth first."""
        ...

    def path_of(self, ino: int) -> str | None:
        """Export-relative path ("a/b/c") of a linked inode (first link), or None if unlinked."""
        ...

    def is_open(self, ino: int, write: bool | None = None) -> bool:
        """Whether an open (any; or only for write / only for read) counts on the file."""
        ...

    # -- the namespace, write side (import, retention)
    def mkdir(self, parent: int, name: bytes, mode: int, uid: int, gid: int) -> tuple[Attr, ChangeInfo]:
        """Create a directory: (attr, cinfo)."""
        ...

    def remove(self, parent: int, name: bytes) -> ChangeInfo:
        """unlink or rmdir, whichever the name is (NFS REMOVE)."""
        ...

    def sync(self) -> None:
        """*Blocking.* Make every namespace change applied so far durable (group commit)."""
        ...

    # -- what to upload, and its bytes
    def clock_ns(self) -> int:
        """The store's own clock (cache/clock.py): monotonic, survives restarts."""
        ...

    def ready_for_upload(self, now_ns: int | None = None, settle_ns: int = 0,
                         limit: int = 100) -> list[int]:
        """Inodes whose data is dirty, not open for write, and quiet for settle_ns, longest quiet first."""
        ...

    def oldest_ready_ns(self) -> int | None:
        """Store-clock time of the last activity of the settled dirty file waiting longest, or None."""
        ...

    def commit_settled(self, ino: int) -> None:
        """*Blocking.* Commit a closed, settled file's current bytes before the uploader takes them."""
        ...

    def extents(self, ino: int) -> list[Extent]:
        """The file's extent map in offset order: DIRTY/CLEAN (local) and ABSENT ranges."""
        ...

    def open_data_fd(self, ino: int) -> int:
        """A read-only fd on the file's local data (caller closes) for os.preadv / sendfile."""
        ...

    def read(self, ino: int, offset: int, count: int) -> tuple[bytes | memoryview, bool]:
        """Up to `count` bytes at `offset` (holes read as zeros), and eof; EAGAIN with `.missing`."""
        ...

    # -- upload states and object records
    def set_data_state(self, ino: int, state: DataState, change: int | None = None) -> bool:
        """Move a file to QUEUED/UPLOADING/DIRTY. With `change`, only if the change counter still equals it."""
        ...

    def mark_sent(self, ino: int) -> None:
        """*Blocking.* Flag regular file `ino` F_SENT (S3 may get an object written for it)."""
        ...

    def mark_uploaded(self, ino: int, remote: RemoteInfo) -> bool:
        """*Blocking.* Record the object; the file becomes CLEAN if its change counter still matches."""
        ...

    def remote_info(self, ino: int) -> RemoteInfo:
        """What the uploader recorded about the file's object (key, etag, multipart progress...)."""
        ...

    def set_remote_info(self, ino: int, remote: RemoteInfo) -> None:
        """*Blocking.* Record progress (upload_id, parts) durably for resume after a crash."""
        ...

    def note_parts(self, ino: int, upload_id: str, parts: list) -> None:
        """Record the parts of multipart upload `upload_id` sent so far, without waiting."""
        ...

    def remote_records_under(self, prefix: str) -> list[tuple[int, RemoteInfo]]:
        """(ino, RemoteInfo) of every record whose key, or a key it `replaces`, starts with `prefix`."""
        ...

    def rekey_remote(self, ino: int, old_key: str, old_etag: str | None, new_key: str,
                     new_etag: str, version_id: str | None = None) -> bool:
        """*Blocking, durable.* The object (old_key, old_etag) now lives at new_key with new_etag."""
        ...

    def forget_replaced(self, ino: int, key: str, etag: str) -> None:
        """*Blocking, durable.* The kept object (key, etag) was deleted or handed on."""
        ...

    def adopt_replaced(self, path: str, key: str, etag: str, exclude_ino: int) -> int | None:
        """*Blocking, durable.* Hand an unlinked file's object to the file now at `path`, if any."""
        ...

    def moves_to(self, ino: int, key: str, path: str) -> bool:
        """*Blocking.* Whether queued jobs will carry the file's object at `key` on to `path`."""
        ...

    def owned_keys(self) -> set[str]:
        """Every S3 key (export-relative) the gateway still answers for."""
        ...

    # -- local space, read-through, import, pins
    def usage(self) -> dict:
        """Byte accounting for metrics/admin: capacity, used (local), dirty, watermarks."""
        ...

    def maybe_evict(self) -> int:
        """Evict LRU clean data if usage is above the high watermark, down to the low one."""
        ...

    def fill(self, ino: int, offset: int, data: bytes | memoryview) -> None:
        """Store bytes fetched from S3 for an ABSENT range (stays clean)."""
        ...

    def import_object(self, path: str, size: int, mode: int, uid: int, gid: int,
                      mtime_ns: int, remote: RemoteInfo) -> Attr | None:
        """Add an object as an ABSENT file (creating parent dirs). Never overrides an existing name."""
        ...

    def import_symlink(self, path: str, target: bytes, mode: int, uid: int, gid: int,
                       mtime_ns: int, remote: RemoteInfo | None = None) -> Attr | None:
        """Add a symbolic link mirrored in S3 (creating parent dirs). Like import_object."""
        ...

    def import_special(self, path: str, typ: FileType, rdev: tuple[int, int], mode: int,
                       uid: int, gid: int, mtime_ns: int, remote: RemoteInfo | None = None
                       ) -> Attr | None:
        """Add a special file mirrored in S3 (creating parent dirs). Like import_symlink."""
        ...

    def set_pinned(self, ino: int, pinned: bool, reason: str = "") -> None:
        """Pinned files are never evicted; `pinned()` lists them with their reasons."""
        ...

    def pinned(self) -> dict[int, str]:
        """Every pinned file: {ino: reason}."""
        ...

    # -- the change journal (upload jobs)
    def queue_put(self, job: dict) -> int:
        """Queue one job; its id."""
        ...

    def queue_uploads(self, jobs: list[dict]) -> list[int]:
        """*Blocking.* Queue upload jobs and move their files to QUEUED, all in one write txn."""
        ...

    def queue_list(self, limit: int = 1000) -> list[tuple[int, dict]]:
        """Up to `limit` queued jobs, (id, job), oldest first."""
        ...

    def queue_update(self, job_id: int, job: dict) -> None:
        """Replace a queued job's content (its progress)."""
        ...

    def queue_done(self, job_id: int) -> None:
        """Remove a finished job, without waiting (a lazy batch op)."""
        ...


class Store(NfsStore, UploaderStore, Protocol):
    """The whole seam: everything nfsd and the uploader call (cache.store.Store implements it)."""

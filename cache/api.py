"""The store's public types: what nfsd and the uploader see of the cache.

This module is the contract between the rooms. `cache.store.Store` implements it;
nothing here knows XDR or S3. Errors are `StoreError` carrying a POSIX errno so
each caller maps them to its own protocol (nfsd -> NFS4ERR_*, admin -> messages).
"""
from __future__ import annotations

import errno
from dataclasses import dataclass, field
from enum import IntEnum

ROOT_INO = 1
NAME_MAX = 255
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

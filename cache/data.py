"""Extent files: one sparse file per inode under <store>/data/xx/<ino>.

A missing file is an empty one (reads as zeros up to the inode's size). File descriptors
are cached (bounded) and reference counted, so a descriptor is never closed while another
thread is doing I/O on it, and a number is never reused under a reader's feet.
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import struct
import threading
from collections import OrderedDict
from contextlib import contextmanager

import structlog

from .api import StoreError

log = structlog.get_logger(__name__)

# fallocate(2) modes (linux/falloc.h); Python's os.posix_fallocate has no mode argument.
FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02
# ioctl FICLONERANGE = _IOW(0x94, 13, struct file_clone_range {s64 src_fd; u64 src_offset,
# src_length, dest_offset}): a reflink of a range, shared blocks instead of copied bytes.
FICLONERANGE = 0x4020940D
_CLONE_RANGE = struct.Struct("=qQQQ")
# errors after which a reflink is not possible here: fall back to copying
_NO_REFLINK = frozenset({errno.EOPNOTSUPP, errno.ENOTTY, errno.EXDEV, errno.EINVAL,
                         errno.ENOSYS, errno.ETXTBSY, errno.EPERM})
_libc = ctypes.CDLL(None, use_errno=True)
_libc.fallocate.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
# preadv2 flag: fail with EAGAIN instead of waiting for the disk (Linux 4.14+)
_RWF_NOWAIT = getattr(os, "RWF_NOWAIT", 0)


def fallocate(fd: int, mode: int, offset: int, length: int) -> None:
    if _libc.fallocate(fd, mode, offset, length) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


class _Handle:
    __slots__ = ("fd", "refs", "doomed")

    def __init__(self, fd: int):
        self.fd = fd
        self.refs = 0
        self.doomed = False


def _io_error(e: OSError, what: str, ino: int) -> StoreError:
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return StoreError(errno.ENOSPC, f"{what} inode {ino}: disk full")
    log.error("data_io_error", op=what, ino=ino, error=str(e))
    return StoreError(errno.EIO, f"{what} inode {ino}: {e}")


class DataFiles:
    def __init__(self, root: str, max_open: int = 2048):
        self.root = os.path.join(root, "data")
        self.max_open = max_open
        self._lock = threading.Lock()
        self._open: OrderedDict[int, _Handle] = OrderedDict()
        self._unsynced_dirs: set[int] = set()   # files created since their dir was synced
        self.nowait_reads = bool(_RWF_NOWAIT)   # pread_into(cached_only=True) can ask the page cache
        for i in range(256):
            os.makedirs(os.path.join(self.root, f"{i:02x}"), exist_ok=True)

    def path(self, ino: int) -> str:
        return os.path.join(self.root, f"{ino & 0xff:02x}", str(ino))

    @contextmanager
    def fd(self, ino: int, create: bool):
        """Yield an O_RDWR descriptor of the inode's file, or None if it has none (and
        not `create`)."""
        h = self._acquire(ino, create)
        if h is None:
            yield None
            return
        try:
            yield h.fd
        finally:
            self._release(h)

    def _acquire(self, ino: int, create: bool) -> _Handle | None:
        with self._lock:
            h = self._open.get(ino)
            if h is None:
                path = self.path(ino)
                try:
                    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
                except FileNotFoundError:
                    if not create:
                        return None
                    try:
                        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_CREAT, 0o600)
                    except OSError as e:
                        raise _io_error(e, "create", ino) from None
                    self._unsynced_dirs.add(ino)
                except OSError as e:
                    raise _io_error(e, "open", ino) from None
                h = self._open[ino] = _Handle(fd)
                self._trim()
            else:
                self._open.move_to_end(ino)
            h.refs += 1
            return h

    def _release(self, h: _Handle) -> None:
        with self._lock:
            h.refs -= 1
            if h.refs == 0 and h.doomed:
                os.close(h.fd)

    def _drop(self, ino: int) -> None:
        # caller holds _lock
        h = self._open.pop(ino, None)
        if h is not None:
            h.doomed = True
            if h.refs == 0:
                os.close(h.fd)

    def _trim(self) -> None:
        while len(self._open) > self.max_open:
            ino = next(iter(self._open))
            self._drop(ino)

    # ---- I/O ------------------------------------------------------------------------
    def pwrite(self, ino: int, offset: int, data) -> None:
        with self.fd(ino, create=True) as fd:
            view = memoryview(data)
            try:
                while view:
                    n = os.pwrite(fd, view, offset)
                    view = view[n:]
                    offset += n
            except OSError as e:
                raise _io_error(e, "write", ino) from None

    def pread(self, ino: int, offset: int, count: int) -> bytes:
        """Exactly `count` bytes; past the file's end (or with no file) zeros."""
        with self.fd(ino, create=False) as fd:
            if fd is None:
                return bytes(count)
            try:
                buf = os.pread(fd, count, offset)
            except OSError as e:
                raise _io_error(e, "read", ino) from None
        if len(buf) < count:
            buf += bytes(count - len(buf))
        return buf

    def pread_into(self, ino: int, offset: int, buf: memoryview, *, cached_only: bool = False) -> bool:
        """Fill all of `buf`; past the file's end (or with no file) zeros. cached_only: only
        from the page cache (preadv RWF_NOWAIT), for a caller that must not wait for the disk
        (the event loop); False, with `buf` partly filled, when a byte would have to come
        from the disk or the kernel cannot tell."""
        if cached_only and not self.nowait_reads:
            return False
        flags = _RWF_NOWAIT if cached_only else 0
        with self.fd(ino, create=False) as fd:
            done = 0
            if fd is not None:
                try:
                    while done < len(buf):
                        n = os.preadv(fd, [buf[done:]], offset + done, flags)
                        if n == 0:
                            break
                        done += n
                except BlockingIOError:         # EAGAIN: only RWF_NOWAIT says it
                    return False
                except OSError as e:
                    if not cached_only or e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                        raise _io_error(e, "read", ino) from None
                    self.nowait_reads = False   # this kernel or file system cannot tell
                    return False
        if done < len(buf):
            buf[done:] = bytes(len(buf) - done)
        return True

    def datasync(self, ino: int) -> None:
        """Make the file's bytes durable; the first time after creating it, also its
        directory entry (fdatasync alone does not promise the name survives a power cut)."""
        with self.fd(ino, create=False) as fd:
            if fd is not None:
                try:
                    os.fdatasync(fd)
                    if ino in self._unsynced_dirs:
                        self._unsynced_dirs.discard(ino)
                        dfd = os.open(os.path.dirname(self.path(ino)), os.O_RDONLY)
                        try:
                            os.fsync(dfd)
                        finally:
                            os.close(dfd)
                except OSError as e:
                    raise _io_error(e, "fdatasync", ino) from None

    def truncate(self, ino: int, size: int) -> None:
        """Set the file's length (no-op without a file and size 0)."""
        with self.fd(ino, create=size > 0) as fd:
            if fd is None:
                return
            try:
                os.ftruncate(fd, size)
            except OSError as e:
                raise _io_error(e, "truncate", ino) from None

    def punch_hole(self, ino: int, offset: int, length: int) -> None:
        """Deallocate [offset, offset+length): reads return zeros, the length stays."""
        with self.fd(ino, create=False) as fd:
            if fd is None or length <= 0:
                return
            try:
                fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, offset, length)
            except OSError as e:
                raise _io_error(e, "punch hole", ino) from None

    def allocate(self, ino: int, offset: int, length: int) -> None:
        """Reserve blocks for [offset, offset+length) without changing the file's length
        (the inode's size is the index's business)."""
        with self.fd(ino, create=True) as fd:
            try:
                fallocate(fd, FALLOC_FL_KEEP_SIZE, offset, length)
            except OSError as e:
                raise _io_error(e, "allocate", ino) from None

    def seek(self, ino: int, offset: int, data: bool) -> int | None:
        """lseek SEEK_DATA (data=True) / SEEK_HOLE from `offset` in the file, None when
        there is none before the file's end (ENXIO) or no file."""
        with self.fd(ino, create=False) as fd:
            if fd is None:
                return None
            try:
                return os.lseek(fd, offset, os.SEEK_DATA if data else os.SEEK_HOLE)
            except OSError as e:
                if e.errno == errno.ENXIO:
                    return None
                raise _io_error(e, "seek", ino) from None

    def copy_range(self, src: int, dst: int, src_off: int, dst_off: int, count: int) -> bool:
        """Make dst's [dst_off, +count) hold src's [src_off, +count): a reflink
        (FICLONERANGE) where the file system shares blocks, else os.copy_file_range
        (in-kernel, no bytes through this process). Bytes past src's file end are zeros.
        Returns True if the range was reflinked."""
        with self.fd(src, create=False) as sfd, self.fd(dst, create=True) as dfd:
            src_len = os.fstat(sfd).st_size if sfd is not None else 0
            have = max(0, min(count, src_len - src_off))
            try:
                reflinked = have > 0 and _reflink(sfd, dfd, src_off, dst_off, have)
                done = have if reflinked else 0
                while done < have:
                    n = os.copy_file_range(sfd, dfd, have - done, src_off + done,
                                           dst_off + done)
                    if n == 0:
                        break
                    done += n
                if done < count:      # the source's tail is a hole: zeros, not old bytes
                    fallocate(dfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                              dst_off + done, count - done)
            except OSError as e:
                raise _io_error(e, "copy", dst) from None
        return reflinked

    def shrink_to(self, ino: int, size: int) -> bool:
        """Cut the file to `size` if longer; True if it was longer."""
        with self.fd(ino, create=False) as fd:
            if fd is None:
                return False
            if os.fstat(fd).st_size > size:
                os.ftruncate(fd, size)
                return True
            return False

    def length(self, ino: int) -> int | None:
        try:
            return os.stat(self.path(ino)).st_size
        except FileNotFoundError:
            return None

    def open_readonly(self, ino: int) -> int:
        try:
            return os.open(self.path(ino), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            # no local bytes yet: an empty file reads as the hole it is
            with self.fd(ino, create=True):
                pass
            return os.open(self.path(ino), os.O_RDONLY | os.O_CLOEXEC)

    def remove(self, ino: int) -> None:
        with self._lock:
            self._drop(ino)
            self._unsynced_dirs.discard(ino)
        try:
            os.unlink(self.path(ino))
        except FileNotFoundError:
            pass

    def all_inos(self) -> list[int]:
        """Every inode with a data file (full scan: for check(), never on the request path)."""
        out = []
        for sub in os.listdir(self.root):
            for name in os.listdir(os.path.join(self.root, sub)):
                out.append(int(name) if name.isdigit() else -1)
        return out

    def close(self) -> None:
        with self._lock:
            for ino in list(self._open):
                self._drop(ino)


def _reflink(sfd: int, dfd: int, src_off: int, dst_off: int, count: int) -> bool:
    try:
        fcntl.ioctl(dfd, FICLONERANGE, _CLONE_RANGE.pack(sfd, src_off, count, dst_off))
        return True
    except OSError as e:
        if e.errno in _NO_REFLINK:
            return False
        raise

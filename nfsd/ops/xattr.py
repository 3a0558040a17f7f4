"""GETXATTR LISTXATTRS SETXATTR REMOVEXATTR (RFC 8276, NFSv4.2 only): upload state as
read-only extended attributes.

A training job learns from its own mount whether its checkpoint is in S3: no admin socket, no
token. The Linux 4.2 client shows these names in the `user.` namespace (it strips the prefix
before sending, RFC 8276 names carry none), so `getfattr -n user.ckptgw.state FILE` works:

  regular file   ckptgw.state            dirty | queued | uploading | in_s3
                 ckptgw.key              the object's key        } only while the object holds
                 ckptgw.etag             its ETag                } the file's current bytes
                 ckptgw.version          its version id (a versioned bucket)   (state in_s3)
                 ckptgw.checksum         its checksum ("crc32:BASE64"...)
  directory      ckptgw.pending_files    regular files below it not in S3 yet
                 ckptgw.pending_bytes    their bytes (`Store.walk`, the one subtree walk)

Fresh reads. The Linux client caches xattr values per inode until the file's change
attribute moves, and an upload does not move it (the bytes did not change). So every name
above also answers as `NAME.SUFFIX` (SUFFIX: 1-32 letters, digits, `_` or `-`), which no
LISTXATTRS shows: a poller (appliance/waiting.py) asks for a new suffix each time and so
always reaches the server.

Writes are refused with NFS4ERR_ACCESS, whatever the name: the Linux client turns it into
EACCES ("Permission denied"), the errno it already gives when its cached ACCESS reply lacks
ACCESS4_XAWRITE, which op_access never grants (nfsd/ops/attrs.py). NFS4ERR_PERM (EPERM)
would make the answer depend on whether the client's ACCESS cache was warm.

Bounds: a name longer than XATTR_NAME_MAX is NFS4ERR_NAMETOOLONG; a value is at most
MAX_VALUE bytes (XATTR2BIG past it; a key is at most 1,024); LISTXATTRS's cookie is an index
into a list of at most seven names (past its end: NFS4ERR_BAD_COOKIE) and its reply fits
lxa_maxcount (not even one name: NFS4ERR_TOOSMALL, which the Linux client makes ERANGE). A
directory's counts cost a subtree walk: one walk at a time per server, shared by the requests
that queue for it (`_Walks`).
"""
from __future__ import annotations

import asyncio
import re
import time
import weakref

import structlog

from cache.api import DataState, FileType
from nfsd.errors import NfsError
from nfsd.exports import MAY_READ
from nfsd.ops._common import Obj, blocking, current, require_perm, store_errors, who
from nfsd.xdr.nfs4 import (
    NFS4_OK, NFS4ERR_ACCESS, NFS4ERR_BAD_COOKIE, NFS4ERR_INVAL, NFS4ERR_NAMETOOLONG,
    NFS4ERR_NOXATTR, NFS4ERR_TOOSMALL, NFS4ERR_XATTR2BIG,
    OP_GETXATTR, OP_LISTXATTRS, OP_REMOVEXATTR, OP_SETXATTR,
    GETXATTR4res, LISTXATTRS4res, LISTXATTRS4resok,
)

log = structlog.get_logger(__name__)

XATTR_NAME_MAX = 255         # Linux's limit, "user." included; RFC 8276 sets none
MAX_VALUE = 64 << 10         # Linux's XATTR_SIZE_MAX
PREFIX = "ckptgw."
FILE_NAMES = ("ckptgw.state", "ckptgw.key", "ckptgw.etag", "ckptgw.version", "ckptgw.checksum")
DIR_NAMES = ("ckptgw.pending_files", "ckptgw.pending_bytes")
STATE_NAMES = {DataState.DIRTY: "dirty", DataState.QUEUED: "queued",
               DataState.UPLOADING: "uploading", DataState.CLEAN: "in_s3",
               DataState.ABSENT: "in_s3"}
IN_S3 = frozenset((DataState.CLEAN, DataState.ABSENT))
_SUFFIX = re.compile(r"[A-Za-z0-9_-]{1,32}")
# LISTXATTRS4resok without names: cookie, array length, eof; a name: length + padded bytes.
_LIST_OVERHEAD = 8 + 4 + 4


def _xattr_object(obj: Obj) -> FileType | None:
    """REG or DIR when the object has our attributes (not the pseudo-fs, not specials)."""
    t = obj.attr.type
    if obj.is_pseudo or t not in (FileType.REG, FileType.DIR):
        return None
    return t


def _canonical(raw: bytes) -> str | None:
    """The served name `raw` asks for (a fresh-read `NAME.SUFFIX` included), else None."""
    if len(raw) > XATTR_NAME_MAX:
        raise NfsError(NFS4ERR_NAMETOOLONG)
    if not raw:
        raise NfsError(NFS4ERR_INVAL, "empty xattr name")
    try:
        name = raw.decode("ascii")
    except UnicodeDecodeError:
        return None
    if not name.startswith(PREFIX):
        return None
    if name in FILE_NAMES or name in DIR_NAMES:
        return name
    base, dot, suffix = name.rpartition(".")
    if dot and (base in FILE_NAMES or base in DIR_NAMES) and _SUFFIX.fullmatch(suffix):
        return base
    return None


def file_values(store, attr) -> dict[str, str]:
    """name -> value of a regular file (what LISTXATTRS lists, in FILE_NAMES order)."""
    state = DataState(attr.data_state)
    out = {"ckptgw.state": STATE_NAMES.get(state, state.name.lower())}
    if state in IN_S3:
        remote = store.remote_info(attr.ino)
        for name, value in (("ckptgw.key", remote.key), ("ckptgw.etag", remote.etag),
                            ("ckptgw.version", remote.version_id),
                            ("ckptgw.checksum", remote.checksum)):
            if value:
                out[name] = str(value)
    return out


def pending_below(store, ino: int) -> tuple[int, int]:
    """*Blocking.* (files, bytes) of the regular files under directory `ino` not in S3 yet."""
    files = size = 0
    for _path, attr in store.walk(ino):
        if attr.type == FileType.REG and attr.data_state not in IN_S3:
            files += 1
            size += attr.size
    return files, size


class _Walks:
    """One server's directory walks. A GETXATTR of a directory is a small request that costs a
    walk of the subtree on a worker thread (the pool that also runs WRITEs), so: at most one
    walk at a time per server (requests queue on a FIFO lock), and a request reuses the answer
    of a walk of the same directory that *started after it arrived*, so it still sees every
    change made before it (a job's own files, written and then asked about, are counted), while
    any number of pollers arriving during one walk share the next."""
    MAX_KEPT = 4096

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.done: dict[int, tuple[float, int, int]] = {}    # ino -> (walk start, files, bytes)

    async def pending(self, ctx, ino: int) -> tuple[int, int]:
        arrived = time.monotonic()
        async with self.lock:
            hit = self.done.get(ino)
            if hit is not None and hit[0] >= arrived:
                return hit[1], hit[2]
            start = time.monotonic()
            files, size = await blocking(ctx, pending_below, ctx.server.store, ino)
            if len(self.done) >= self.MAX_KEPT:
                self.done.clear()
            self.done[ino] = (start, files, size)
            return files, size


_WALKS: "weakref.WeakKeyDictionary[object, _Walks]" = weakref.WeakKeyDictionary()


def _walks(server) -> _Walks:
    walks = _WALKS.get(server)
    if walks is None:
        walks = _WALKS[server] = _Walks()
    return walks


async def _values(ctx, obj: Obj, kind: FileType, wanted: str | None = None) -> dict[str, str]:
    store = ctx.server.store
    with store_errors():
        if kind == FileType.REG:
            return file_values(store, obj.attr)
        if wanted is not None and wanted not in DIR_NAMES:
            return {}
        files, size = await _walks(ctx.server).pending(ctx, obj.ino)
    return {"ckptgw.pending_files": str(files), "ckptgw.pending_bytes": str(size)}


def _readable(ctx, obj: Obj) -> FileType | None:
    kind = _xattr_object(obj)
    if kind is not None:
        require_perm(obj, who(ctx, obj), MAY_READ)      # as Linux's user.* xattrs
    return kind


async def op_getxattr(ctx, args) -> GETXATTR4res:
    obj = current(ctx)
    name = _canonical(bytes(args.gxa_name))
    kind = _readable(ctx, obj)
    if name is None or kind is None:
        raise NfsError(NFS4ERR_NOXATTR)
    value = (await _values(ctx, obj, kind, name)).get(name)
    if value is None:
        raise NfsError(NFS4ERR_NOXATTR)
    data = value.encode("ascii", "backslashreplace")
    if len(data) > MAX_VALUE:
        raise NfsError(NFS4ERR_XATTR2BIG)
    return GETXATTR4res(NFS4_OK, data)


def _padded(n: int) -> int:
    return 4 + ((n + 3) & ~3)


async def op_listxattrs(ctx, args) -> LISTXATTRS4res:
    obj = current(ctx)
    kind = _readable(ctx, obj)
    names = [] if kind is None else list(await _values(ctx, obj, kind))
    cookie = args.lxa_cookie
    if cookie > len(names):
        raise NfsError(NFS4ERR_BAD_COOKIE, f"listxattrs cookie {cookie}")
    room = args.lxa_maxcount - _LIST_OVERHEAD
    out: list[bytes] = []
    for name in names[cookie:]:
        need = _padded(len(name))
        if need > room:
            break
        out.append(name.encode("ascii"))
        room -= need
    if not out and cookie < len(names):
        raise NfsError(NFS4ERR_TOOSMALL, f"listxattrs maxcount {args.lxa_maxcount}")
    nxt = cookie + len(out)
    return LISTXATTRS4res(NFS4_OK, LISTXATTRS4resok(lxr_cookie=nxt, lxr_names=out,
                                                   lxr_eof=nxt == len(names)))


async def _refuse(ctx, raw: bytes, op: str):
    obj = current(ctx)
    _canonical(raw)                            # NAMETOOLONG / INVAL first, as for reads
    log.debug("xattr_write_refused", op=op, ino=obj.ino)
    raise NfsError(NFS4ERR_ACCESS, f"{op}: ckptgw's extended attributes are read-only")


async def op_setxattr(ctx, args):
    await _refuse(ctx, bytes(args.sxa_key), "SETXATTR")


async def op_removexattr(ctx, args):
    await _refuse(ctx, bytes(args.rxa_name), "REMOVEXATTR")


HANDLERS = {
    OP_GETXATTR: op_getxattr,
    OP_LISTXATTRS: op_listxattrs,
    OP_SETXATTR: op_setxattr,
    OP_REMOVEXATTR: op_removexattr,
}

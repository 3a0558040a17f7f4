"""GETATTR SETATTR ACCESS VERIFY NVERIFY (RFC 8881 sections 18.7, 18.30, 18.1, 18.31, 18.15)."""
from __future__ import annotations

import asyncio

import structlog

from cache.api import FileType, SetAttr, StoreError
from nfsd import attrs as fattr
from nfsd.errors import NfsError
from nfsd.openstate import ANONYMOUS, BYPASS, special_kind
from nfsd.exports import MAY_EXEC, MAY_READ, MAY_WRITE, permitted
from nfsd.ops._common import (Obj, blocking, current, io_state, nfs_error, require_perm,
                              require_writable_fs, store_errors, sync_namespace, who)
from nfsd.xdr.nfs4 import (
    ACCESS4_DELETE, ACCESS4_EXECUTE, ACCESS4_EXTEND, ACCESS4_LOOKUP, ACCESS4_MODIFY,
    ACCESS4_READ, ACCESS4_XALIST, ACCESS4_XAREAD, ACCESS4_XAWRITE, NFS4ERR_ACCESS, FATTR4_MODE, FATTR4_OWNER, FATTR4_OWNER_GROUP, FATTR4_RDATTR_ERROR,
    FATTR4_SIZE, FATTR4_TIME_ACCESS_SET, FATTR4_TIME_MODIFY_SET, NFS4ERR_ATTRNOTSUPP,
    NFS4ERR_BADOWNER, NFS4ERR_FBIG, NFS4ERR_INVAL, NFS4ERR_ISDIR, NFS4ERR_NOT_SAME,
    NFS4ERR_PERM, NFS4ERR_SAME, NFS4_OK, OP_ACCESS, OP_GETATTR, OP_NVERIFY, OP_SETATTR,
    OP_VERIFY, SET_TO_CLIENT_TIME4,
    ACCESS4res, ACCESS4resok, GETATTR4res, GETATTR4resok, NVERIFY4res, SETATTR4res,
    VERIFY4res,
)

log = structlog.get_logger(__name__)

# Access bits a client may ask about. The RFC 8276 bits (0x40-0x100) are answered in 4.2
# COMPOUNDs only: XAREAD and XALIST where the object may be read (its upload state,
# nfsd/ops/xattr.py), XAWRITE never (those attributes are read-only).
_ACCESS_KNOWN = 0x1FF
_XATTR_READ = ACCESS4_XAREAD | ACCESS4_XALIST
_XATTR_BITS = _XATTR_READ | ACCESS4_XAWRITE
# ACCESS4 bit -> mode permission needed, per object kind (as Linux knfsd maps them).
_DIR_ACCESS = {ACCESS4_READ: MAY_READ, ACCESS4_LOOKUP: MAY_EXEC,
               ACCESS4_MODIFY: MAY_WRITE | MAY_EXEC, ACCESS4_EXTEND: MAY_WRITE | MAY_EXEC,
               ACCESS4_DELETE: MAY_WRITE | MAY_EXEC}
_FILE_ACCESS = {ACCESS4_READ: MAY_READ, ACCESS4_MODIFY: MAY_WRITE,
                ACCESS4_EXTEND: MAY_WRITE, ACCESS4_EXECUTE: MAY_EXEC}
_WRITE_LIKE = ACCESS4_MODIFY | ACCESS4_EXTEND | ACCESS4_DELETE


def attr_env(ctx, obj: Obj, **kw) -> fattr.AttrEnv:
    return fattr.AttrEnv(ctx.server, obj, ctx.minorversion, **kw)


async def op_getattr(ctx, args) -> GETATTR4res:
    return getattr_of(ctx, current(ctx), args)


def getattr_of(ctx, obj: Obj, args) -> GETATTR4res:
    """GETATTR of `obj` (the current object); its typed twin (nfsd/native/fileops.pyx) shares it."""
    if fattr.names_write_only(args.attr_request, ctx.minorversion):
        raise NfsError(NFS4ERR_INVAL, "write-only attribute requested")
    with store_errors():
        attrs = fattr.encode(attr_env(ctx, obj), args.attr_request)
    return GETATTR4res(NFS4_OK, GETATTR4resok(obj_attributes=attrs))


async def op_setattr(ctx, args) -> SETATTR4res:
    obj = current(ctx)
    values = fattr.decode(args.obj_attributes, ctx.minorversion)
    require_writable_fs(obj)
    if FATTR4_SIZE in values and special_kind(args.stateid) in (ANONYMOUS, BYPASS):
        # A truncate outside any (reclaimed) open could destroy locked data.
        ctx.server.grace.refuse_in_grace("SETATTR of size without an open")
    sa = setattr_request(ctx, obj, values, stateid=args.stateid)
    await apply_setattr(ctx, obj, sa)           # durable on return
    return SETATTR4res(status=NFS4_OK, attrsset=fattr.bitmap_of(sorted(values)))


def setattr_request(ctx, obj: Obj, values: dict, *, stateid=None, creating: bool = False
                    ) -> SetAttr:
    """Check permissions for and translate decoded attributes into a store SetAttr
    (RFC 8881 18.30; POSIX chmod/chown/utimes/truncate rules). `creating`: the caller
    just created the object, so its owner-only rules are already satisfied."""
    cred = who(ctx, obj)
    attr = obj.attr
    idmap = ctx.server.exports.idmap
    is_owner = creating or cred.uid == 0 or cred.uid == attr.uid
    sa = SetAttr()
    if FATTR4_SIZE in values:
        size = values[FATTR4_SIZE]
        if attr.type == FileType.DIR:
            raise NfsError(NFS4ERR_ISDIR)
        if attr.type != FileType.REG:
            raise NfsError(NFS4ERR_INVAL, "size of a non-regular file")
        if size > fattr.MAX_FILESIZE:
            raise NfsError(NFS4ERR_FBIG)
        st = io_state(ctx, stateid, obj, write=True) if stateid is not None else None
        if st is None and not creating:
            require_perm(obj, cred, MAY_WRITE)
        sa.size = size
    if FATTR4_MODE in values:
        mode = values[FATTR4_MODE]
        if mode & ~0o7777:
            raise NfsError(NFS4ERR_INVAL, f"mode {mode:o}")
        if not is_owner:
            raise NfsError(NFS4ERR_PERM, "only the owner may change the mode")
        if cred.uid != 0 and not creating and not cred.in_group(attr.gid):
            mode &= ~0o2000           # as Linux: a non-member cannot set setgid
        sa.mode = mode
    for bit in (FATTR4_OWNER, FATTR4_OWNER_GROUP):
        if bit in values and not values[bit]:
            # no name at all is an invalid argument, not an unknown name (pynfs SATT16/17,
            # as Linux knfsd answers)
            raise NfsError(NFS4ERR_INVAL, "empty owner or owner_group")
    if FATTR4_OWNER in values:
        uid = idmap.uid_of(values[FATTR4_OWNER])
        if uid is None:
            raise NfsError(NFS4ERR_BADOWNER, f"unknown owner {values[FATTR4_OWNER]!r}")
        if uid != attr.uid and cred.uid != 0:
            raise NfsError(NFS4ERR_PERM, "only root may change the owner")
        sa.uid = uid
    if FATTR4_OWNER_GROUP in values:
        gid = idmap.gid_of(values[FATTR4_OWNER_GROUP])
        if gid is None:
            raise NfsError(NFS4ERR_BADOWNER, f"unknown group {values[FATTR4_OWNER_GROUP]!r}")
        if gid != attr.gid and cred.uid != 0 and not (is_owner and cred.in_group(gid)):
            raise NfsError(NFS4ERR_PERM, "may not give the file to that group")
        sa.gid = gid
    for bit, field in ((FATTR4_TIME_ACCESS_SET, "atime_ns"), (FATTR4_TIME_MODIFY_SET, "mtime_ns")):
        if bit not in values:
            continue
        how = values[bit]
        if how.tag == SET_TO_CLIENT_TIME4:
            if not is_owner:
                raise NfsError(NFS4ERR_PERM, "only the owner may set times")
            setattr(sa, field, fattr.time_to_ns(how.value))
        else:
            # "now" is allowed to anyone who may write the file (utimes(NULL)).
            if not is_owner and not permitted(attr, cred, MAY_WRITE):
                raise NfsError(NFS4ERR_ACCESS)
            setattr(sa, field, "now")
    return sa


async def apply_setattr(ctx, obj: Obj, sa: SetAttr):
    """Durable when it returns: without a size, straight to the store's batch committer
    (a group sync, no worker thread); with a size, store.setattr on a worker thread (its
    own txn and sync, I3)."""
    if sa == SetAttr():
        return obj.attr
    try:
        same = ctx.server.store.setattr_unchanged(obj.ino, sa)
        if same is not None:      # nothing to write (nfs-rs's open "wb" resends mode, size 0)
            obj.attr = same
            await sync_namespace(ctx)       # what it saw is durable before the reply
            return obj.attr
        pending = ctx.server.store.setattr_submit(obj.ino, sa,    # None: a size, see there
                                                  loop=asyncio.get_running_loop())
        if pending is not None:
            obj.attr = await pending
        else:
            obj.attr = await blocking(ctx, ctx.server.store.setattr, obj.ino, sa)
    except StoreError as e:
        raise nfs_error(e) from e
    log.debug("setattr", ino=obj.ino, attrs=sa)            # rendered only when debug is on
    return obj.attr


async def op_access(ctx, args) -> ACCESS4res:
    return access_of(ctx, current(ctx), args)


def access_of(ctx, obj: Obj, args) -> ACCESS4res:
    """ACCESS of `obj` (the current object); its typed twin (nfsd/native/fileops.pyx) shares it."""
    req = args.access
    if req & ~_ACCESS_KNOWN:
        raise NfsError(NFS4ERR_INVAL, f"unknown access bits {req:#x}")
    table = _DIR_ACCESS if obj.attr.type == FileType.DIR else _FILE_ACCESS
    cred = who(ctx, obj)
    read_only = obj.is_pseudo or not obj.export.rw
    supported = granted = 0
    for bit, want in table.items():
        if not req & bit:
            continue
        supported |= bit
        if read_only and bit & _WRITE_LIKE:
            continue
        if permitted(obj.attr, cred, want):
            granted |= bit
    if req & _XATTR_BITS and ctx.minorversion >= 2 and not obj.is_pseudo \
            and obj.attr.type in (FileType.REG, FileType.DIR):
        supported |= req & _XATTR_BITS
        if req & _XATTR_READ and permitted(obj.attr, cred, MAY_READ):
            granted |= req & _XATTR_READ
    return ACCESS4res(NFS4_OK, ACCESS4resok(supported=supported, access=granted))


def _matches(ctx, fa) -> bool:
    """Whether the server's values of `fa`'s attributes equal `fa`'s (RFC 8881 18.31.3)."""
    if fattr.unsupported(fa.attrmask, ctx.minorversion):
        raise NfsError(NFS4ERR_ATTRNOTSUPP)
    bits = fattr.bits_of(fa.attrmask)
    for bit in bits:
        if bit == FATTR4_RDATTR_ERROR or bit in fattr.WRITE_ONLY:
            raise NfsError(NFS4ERR_INVAL, f"attribute {bit} cannot be verified")
    fattr.decode_values(fa, bits)          # malformed input: NFS4ERR_BADXDR
    obj = current(ctx)
    with store_errors():
        mine = fattr.encode(attr_env(ctx, obj), fa.attrmask)
    return bytes(mine.attr_vals) == bytes(fa.attr_vals)


async def op_verify(ctx, args) -> VERIFY4res:
    if not _matches(ctx, args.obj_attributes):
        raise NfsError(NFS4ERR_NOT_SAME)
    return VERIFY4res(NFS4_OK)


async def op_nverify(ctx, args) -> NVERIFY4res:
    if _matches(ctx, args.obj_attributes):
        raise NfsError(NFS4ERR_SAME)
    return NVERIFY4res(NFS4_OK)


HANDLERS = {
    OP_GETATTR: op_getattr,
    OP_SETATTR: op_setattr,
    OP_ACCESS: op_access,
    OP_VERIFY: op_verify,
    OP_NVERIFY: op_nverify,
}

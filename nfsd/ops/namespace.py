"""CREATE LINK REMOVE RENAME READLINK (RFC 8881 sections 18.4, 18.9, 18.25, 18.26, 18.24).

CREATE makes directories, symlinks and special files (block and character devices with
their specdata4 rdev, sockets, FIFOs: FileType values are nfs_ftype4's).

Every namespace change is one store op (RENAME included: atomic for files and whole
directory trees), run by the store's batch committer and durable before the reply
(`namespace_op`); createattrs other than the mode are a SETATTR after it (`sync_namespace`).
"""
from __future__ import annotations

import stat

import structlog

from cache.api import DEVICE_TYPES, NUL, SPECIAL_TYPES, FileType, StoreError
from nfsd import attrs as fattr
from nfsd.errors import NfsError
from nfsd.exports import MAY_WRITE, EffectiveCred, sticky_allows_delete
from nfsd.ops._common import (Obj, change_info, check_name, current, export_obj, require_dir,
                              namespace_op, require_dir_modify, require_perm, saved,
                              set_current, store_errors, sync_namespace)
from nfsd.ops import replay
from nfsd.ops.attrs import apply_setattr, setattr_request
from nfsd.xdr.nfs4 import (
    FATTR4_MODE, FATTR4_OWNER, FATTR4_OWNER_GROUP, FATTR4_TIME_ACCESS_SET,
    FATTR4_TIME_MODIFY_SET, NF4DIR, NF4LNK, NFS4ERR_BADTYPE, NFS4ERR_INVAL, NFS4ERR_ISDIR,
    NFS4ERR_NOENT, NFS4ERR_PERM, NFS4ERR_ROFS, NFS4ERR_XDEV, NFS4_OK, OP_CREATE, OP_LINK,
    OP_READLINK, OP_REMOVE, OP_RENAME,
    CREATE4res, CREATE4resok, LINK4res, LINK4resok, READLINK4res, READLINK4resok,
    REMOVE4res, REMOVE4resok, RENAME4res, RENAME4resok,
)

log = structlog.get_logger(__name__)

CREATE_ATTRS = frozenset({FATTR4_MODE, FATTR4_OWNER, FATTR4_OWNER_GROUP,
                          FATTR4_TIME_ACCESS_SET, FATTR4_TIME_MODIFY_SET})


def _text(name: bytes) -> str:
    return name.decode("utf-8", "replace")


def new_owner(cred: EffectiveCred, parent: Obj) -> tuple[int, int]:
    """Owner and group of a new object: the caller, with the parent's group when the
    parent directory is setgid (BSD group semantics, as Linux)."""
    gid = parent.attr.gid if parent.attr.mode & stat.S_ISGID else cred.gid
    return cred.uid, gid


async def finish_create(ctx, obj: Obj, values: dict) -> list[int]:
    """Apply the createattrs other than mode (already given to the store); the set bits."""
    rest = {b: v for b, v in values.items() if b != FATTR4_MODE}
    if rest:
        await apply_setattr(ctx, obj, setattr_request(ctx, obj, rest, creating=True))
    return sorted(values)


async def op_create(ctx, args) -> CREATE4res:
    parent = current(ctx)
    objtype = args.objtype.tag
    name = check_name(args.objname)
    if objtype not in (NF4DIR, NF4LNK, *SPECIAL_TYPES):
        # Regular files are made by OPEN (NF4REG, NF4ATTRDIR, NF4NAMEDATTR: BADTYPE).
        raise NfsError(NFS4ERR_BADTYPE, f"cannot create objects of type {objtype}")
    cred = require_dir_modify(ctx, parent)
    values = fattr.decode(args.createattrs, ctx.minorversion, allowed=CREATE_ATTRS)
    uid, gid = new_owner(cred, parent)
    with store_errors():
        if objtype == NF4DIR:
            mode = values.get(FATTR4_MODE, 0o755) | (parent.attr.mode & stat.S_ISGID)
            attr, ci = await namespace_op(ctx, "mkdir", parent.ino, name, mode, uid, gid)
        elif objtype in SPECIAL_TYPES:
            dev = args.objtype.value if objtype in DEVICE_TYPES else None
            rdev = (dev.specdata1, dev.specdata2) if dev is not None else (0, 0)
            attr, ci = await namespace_op(ctx, "mknod", parent.ino, name, FileType(objtype),
                                          values.get(FATTR4_MODE, 0o644), uid, gid, rdev)
        else:
            target = bytes(args.objtype.value)
            if not target or NUL in target:
                raise NfsError(NFS4ERR_INVAL, "empty symlink target or NUL in it")
            attr, ci = await namespace_op(ctx, "symlink", parent.ino, name, target,
                                          values.get(FATTR4_MODE, 0o777), uid, gid)
        obj = export_obj(ctx, parent.export, attr)
        attrset = await finish_create(ctx, obj, values)
    set_current(ctx, obj)
    if set(values) - {FATTR4_MODE}:          # finish_create wrote a SETATTR
        await sync_namespace(ctx)
    log.info("create", client=ctx.peer[0] if ctx.peer else None, parent=parent.ino,
             name=_text(name), ino=attr.ino, type=int(attr.type))
    return CREATE4res(NFS4_OK, CREATE4resok(cinfo=change_info(ci),
                                            attrset=fattr.bitmap_of(attrset)))


def _same_fs(a: Obj, b: Obj) -> None:
    if a.is_pseudo and b.is_pseudo:
        raise NfsError(NFS4ERR_ROFS)
    if a.is_pseudo or b.is_pseudo or a.export is not b.export:
        raise NfsError(NFS4ERR_XDEV)


async def op_link(ctx, args) -> LINK4res:
    src = saved(ctx)
    dst = current(ctx)
    name = check_name(args.newname)
    require_dir(dst)
    _same_fs(src, dst)
    if src.attr.type == FileType.DIR:
        raise NfsError(NFS4ERR_ISDIR, "hard links to directories")
    require_dir_modify(ctx, dst)
    with store_errors():
        _attr, ci = await namespace_op(ctx, "link", src.ino, dst.ino, name)
    return LINK4res(NFS4_OK, LINK4resok(cinfo=change_info(ci)))


def _check_sticky(ctx, dir_obj: Obj, name: bytes, cred: EffectiveCred):
    """The entry's attributes, after the sticky-directory rule (EPERM in Linux: NFS4ERR_PERM)."""
    with store_errors():
        victim = ctx.server.store.lookup(dir_obj.ino, name)
    if not sticky_allows_delete(dir_obj.attr, victim, cred):
        raise NfsError(NFS4ERR_PERM, "sticky directory")
    return victim


async def _source_or_replay(ctx, op: int, dir_obj: Obj, name: bytes, cred: EffectiveCred,
                            dst_dir: int = 0, new: bytes = b""):
    """(source entry's attributes after the sticky rule, None), or, when the source is
    absent and this is a REMOVE/RENAME whose reply a restart lost, re-sent
    (nfsd/ops/replay.py), (None, the reply record to answer it with). Any other failure,
    and a NOENT with no record, is raised."""
    try:
        return _check_sticky(ctx, dir_obj, name, cred), None
    except NfsError as e:
        if e.status != NFS4ERR_NOENT or (rec := await replay.replayed(
                ctx, op, dir_obj.ino, name, dst_dir, new)) is None:
            raise
        return None, rec


async def op_remove(ctx, args) -> REMOVE4res:
    d = current(ctx)
    ctx.server.grace.refuse_in_grace("REMOVE")   # the file may hold a lock being reclaimed
    name = check_name(args.target)
    cred = require_dir_modify(ctx, d)
    _victim, rec = await _source_or_replay(ctx, replay.REMOVE, d, name, cred)
    if rec is not None:
        return REMOVE4res(NFS4_OK, REMOVE4resok(cinfo=change_info(rec.cinfo[0])))
    with store_errors():
        ci = await replay.noted_op(ctx, "remove", d.ino, name)
    log.info("remove", client=ctx.peer[0] if ctx.peer else None, parent=d.ino, name=_text(name))
    return REMOVE4res(NFS4_OK, REMOVE4resok(cinfo=change_info(ci)))


async def op_rename(ctx, args) -> RENAME4res:
    src_dir = saved(ctx)
    dst_dir = current(ctx)
    ctx.server.grace.refuse_in_grace("RENAME")
    oldname = check_name(args.oldname)
    newname = check_name(args.newname)
    require_dir(src_dir)
    require_dir(dst_dir)
    _same_fs(src_dir, dst_dir)
    cred = require_dir_modify(ctx, src_dir)
    require_dir_modify(ctx, dst_dir)
    victim, rec = await _source_or_replay(ctx, replay.RENAME, src_dir, oldname, cred,
                                          dst_dir.ino, newname)
    if rec is not None:
        return RENAME4res(NFS4_OK, RENAME4resok(source_cinfo=change_info(rec.cinfo[0]),
                                                target_cinfo=change_info(rec.cinfo[1])))
    store = ctx.server.store
    try:
        target = store.lookup(dst_dir.ino, newname)
    except StoreError:      # no target (other failures: the rename itself reports them)
        target = None
    if target is not None and not sticky_allows_delete(dst_dir.attr, target, cred):
        raise NfsError(NFS4ERR_PERM, "sticky directory")
    if victim.type == FileType.DIR and src_dir.ino != dst_dir.ino:
        # Moving a directory rewrites its "..": needs write permission on it (as Linux).
        require_perm(Obj(src_dir.fh, src_dir.export, None, victim), cred, MAY_WRITE)
    with store_errors():
        ci_src, ci_dst = await replay.noted_op(ctx, "rename", src_dir.ino, oldname,
                                               dst_dir.ino, newname)
    log.info("rename", client=ctx.peer[0] if ctx.peer else None, src_dir=src_dir.ino,
             old=_text(oldname), dst_dir=dst_dir.ino, new=_text(newname), ino=victim.ino)
    return RENAME4res(NFS4_OK, RENAME4resok(source_cinfo=change_info(ci_src),
                                            target_cinfo=change_info(ci_dst)))


async def op_readlink(ctx, args) -> READLINK4res:
    obj = current(ctx)
    if obj.attr.type != FileType.LNK:
        raise NfsError(NFS4ERR_INVAL, "not a symbolic link")
    with store_errors():
        target = ctx.server.store.readlink(obj.ino)
    return READLINK4res(NFS4_OK, READLINK4resok(link=bytes(target)))


HANDLERS = {
    OP_CREATE: op_create,
    OP_LINK: op_link,
    OP_REMOVE: op_remove,
    OP_RENAME: op_rename,
    OP_READLINK: op_readlink,
}

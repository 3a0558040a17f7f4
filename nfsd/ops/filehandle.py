"""PUTFH PUTROOTFH PUTPUBFH GETFH SAVEFH RESTOREFH LOOKUP LOOKUPP
(RFC 8881 sections 18.19-18.23, 18.13, 18.14, 18.27, 18.28)."""
from __future__ import annotations

from cache.api import StoreError
from nfsd.errors import NfsError
from nfsd.exports import MAY_EXEC
from nfsd.fh import BadHandle
from nfsd.ops._common import (check_export_access, check_name, codec, current, export_obj,
                              nfs_error, pseudo_obj, require_dir, require_perm, resolve,
                              root_obj, set_current, store_errors, who)
from nfsd.xdr.nfs4 import (
    NFS4ERR_BADHANDLE, NFS4ERR_NOENT, NFS4ERR_NOFILEHANDLE, NFS4ERR_RESTOREFH, NFS4_OK, OP_GETFH, OP_LOOKUP,
    OP_LOOKUPP, OP_PUTFH, OP_PUTPUBFH, OP_PUTROOTFH, OP_RESTOREFH, OP_SAVEFH,
    GETFH4res, GETFH4resok, LOOKUP4res, LOOKUPP4res, PUTFH4res, PUTPUBFH4res,
    PUTROOTFH4res, RESTOREFH4res, SAVEFH4res,
)

async def op_putrootfh(ctx, args) -> PUTROOTFH4res:
    set_current(ctx, root_obj(ctx))
    return PUTROOTFH4res(NFS4_OK)


async def op_putpubfh(ctx, args) -> PUTPUBFH4res:
    # The public filehandle is the root of the pseudo-filesystem (RFC 8881 18.20).
    set_current(ctx, root_obj(ctx))
    return PUTPUBFH4res(NFS4_OK)


async def op_putfh(ctx, args) -> PUTFH4res:
    try:
        fh = codec(ctx).decode(args.object)
    except BadHandle as e:            # the COMPOUND loop logs the status with this detail
        raise NfsError(NFS4ERR_BADHANDLE, str(e)) from None
    set_current(ctx, resolve(ctx, fh))
    return PUTFH4res(NFS4_OK)


async def op_getfh(ctx, args) -> GETFH4res:
    if ctx.current_fh is None:
        raise NfsError(NFS4ERR_NOFILEHANDLE)
    return GETFH4res(NFS4_OK, GETFH4resok(object=ctx.current_fh.raw))


async def op_savefh(ctx, args) -> SAVEFH4res:
    if ctx.current_fh is None:
        raise NfsError(NFS4ERR_NOFILEHANDLE)
    ctx.saved_fh = ctx.current_fh
    ctx.saved_stateid = ctx.current_stateid
    return SAVEFH4res(NFS4_OK)


async def op_restorefh(ctx, args) -> RESTOREFH4res:
    if ctx.saved_fh is None:
        # RFC 7530 16.28.4 has its own error for this; RFC 8881 18.27.4 uses NOFILEHANDLE.
        raise NfsError(NFS4ERR_RESTOREFH if ctx.minorversion == 0 else NFS4ERR_NOFILEHANDLE)
    ctx.current_fh = ctx.saved_fh
    ctx.current_stateid = ctx.saved_stateid
    return RESTOREFH4res(NFS4_OK)


def lookup_child(ctx, parent, name: bytes):
    """The object `name` names in directory `parent`, crossing from the pseudo-filesystem
    into an export's root where one is mounted. Needs search permission on `parent`."""
    require_dir(parent)
    if parent.is_pseudo:
        entry = parent.node.children.get(name)
        if entry is None:
            raise NfsError(NFS4ERR_NOENT)
        kind, target = entry
        if kind == "pseudo":
            return pseudo_obj(ctx, ctx.server.exports.node(target))
        check_export_access(ctx, target)
        with store_errors():
            return export_obj(ctx, target, ctx.server.store.getattr(target.root_ino))
    require_perm(parent, who(ctx, parent), MAY_EXEC)
    with store_errors():
        attr = ctx.server.store.lookup(parent.ino, name)
    return export_obj(ctx, parent.export, attr)


async def op_lookup(ctx, args) -> LOOKUP4res:
    parent = current(ctx)
    name = check_name(args.objname)
    set_current(ctx, lookup_child(ctx, parent, name))
    return LOOKUP4res(NFS4_OK)


async def op_lookupp(ctx, args) -> LOOKUPP4res:
    obj = current(ctx)
    require_dir(obj)
    exports = ctx.server.exports
    if obj.is_pseudo:
        if obj.node.index == 0:
            raise NfsError(NFS4ERR_NOENT, "the root has no parent")
        set_current(ctx, pseudo_obj(ctx, exports.node(obj.node.parent)))
    elif obj.ino == obj.export.root_ino:
        # Leaving the export: its parent is a pseudo directory (RFC 8881 7.4).
        if exports.root_export is not None:
            raise NfsError(NFS4ERR_NOENT, "the root has no parent")
        set_current(ctx, pseudo_obj(ctx, exports.export_parent_node(obj.export)))
    else:
        require_perm(obj, who(ctx, obj), MAY_EXEC)
        try:
            attr = ctx.server.store.lookup_parent(obj.ino)
        except StoreError as e:
            raise nfs_error(e) from e
        set_current(ctx, export_obj(ctx, obj.export, attr))
    return LOOKUPP4res(NFS4_OK)


HANDLERS = {
    OP_PUTROOTFH: op_putrootfh,
    OP_PUTPUBFH: op_putpubfh,
    OP_PUTFH: op_putfh,
    OP_GETFH: op_getfh,
    OP_SAVEFH: op_savefh,
    OP_RESTOREFH: op_restorefh,
    OP_LOOKUP: op_lookup,
    OP_LOOKUPP: op_lookupp,
}

"""SECINFO SECINFO_NO_NAME (RFC 8881 sections 18.29, 18.45).

Every export accepts AUTH_SYS (preferred) and AUTH_NONE (squashed to the anonymous
ids). In 4.1 both ops consume the current filehandle (RFC 8881 2.6.3.1.1.8).
"""
from __future__ import annotations

from nfsd.errors import NfsError
from nfsd.exports import AUTH_NONE, AUTH_SYS
from nfsd.ops._common import check_name, current, require_dir
from nfsd.ops.filehandle import lookup_child, op_lookupp
from nfsd.xdr.nfs4 import (
    NFS4ERR_INVAL, NFS4_OK, OP_SECINFO, OP_SECINFO_NO_NAME, SECINFO_STYLE4_CURRENT_FH,
    SECINFO_STYLE4_PARENT, SECINFO4res, SECINFO_NO_NAME4res, secinfo4,
)

FLAVORS = (AUTH_SYS, AUTH_NONE)


def _flavors():
    return [secinfo4(flavor) for flavor in FLAVORS]


def _consume_fh(ctx) -> None:
    if ctx.minorversion >= 1:
        ctx.current_fh = None
        ctx.current_stateid = None


async def op_secinfo(ctx, args) -> SECINFO4res:
    parent = current(ctx)
    require_dir(parent)
    lookup_child(ctx, parent, check_name(args.name))     # NFS4ERR_NOENT etc.
    _consume_fh(ctx)
    return SECINFO4res(NFS4_OK, _flavors())


async def op_secinfo_no_name(ctx, args) -> SECINFO_NO_NAME4res:
    if args == SECINFO_STYLE4_PARENT:
        await op_lookupp(ctx, None)       # the parent must exist (NFS4ERR_NOENT at the root)
    elif args == SECINFO_STYLE4_CURRENT_FH:
        current(ctx)
    else:
        raise NfsError(NFS4ERR_INVAL, f"secinfo style {args}")
    _consume_fh(ctx)
    return SECINFO_NO_NAME4res(NFS4_OK, _flavors())


HANDLERS = {OP_SECINFO: op_secinfo, OP_SECINFO_NO_NAME: op_secinfo_no_name}

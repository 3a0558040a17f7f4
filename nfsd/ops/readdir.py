"""READDIR (RFC 8881 section 18.23).

Cookies come from the store (stable across calls and restarts, never 0, 1 or 2), so the
cookie verifier is a constant (all zeros): a client may resume anywhere at any time.
The reply honours `maxcount` (the whole READDIR4resok) and `dircount` (cookie + name
bytes), always returning at least one entry or NFS4ERR_TOOSMALL.
"""
from __future__ import annotations

import structlog

from cache.api import StoreError
from nfsd import attrs as fattr
from nfsd.errors import NfsError
from nfsd.exports import MAY_READ
from nfsd.ops._common import (current, export_obj, nfs_error, pseudo_obj, require_dir,
                              require_perm, store_errors, who)
from nfsd.xdr.nfs4 import (
    FATTR4_FILES_AVAIL, FATTR4_FILES_FREE, FATTR4_FILES_TOTAL, FATTR4_RDATTR_ERROR,
    FATTR4_SPACE_AVAIL, FATTR4_SPACE_FREE, FATTR4_SPACE_TOTAL, NFS4ERR_BAD_COOKIE,
    NFS4ERR_INVAL, NFS4ERR_NOT_SAME, NFS4ERR_TOOSMALL, NFS4_OK, OP_READDIR,
    READDIR4res, READDIR4resok, dirlist4, entry4,
)

log = structlog.get_logger(__name__)

COOKIE_VERF = bytes(8)
MAX_REPLY = 1 << 20
# status + cookieverf + the final "no more entries" marker + eof
_FIXED_REPLY_BYTES = 4 + 8 + 4 + 4
_STATFS_ATTRS = frozenset({FATTR4_FILES_AVAIL, FATTR4_FILES_FREE, FATTR4_FILES_TOTAL,
                           FATTR4_SPACE_AVAIL, FATTR4_SPACE_FREE, FATTR4_SPACE_TOTAL})
# cookies of pseudo-filesystem entries
_PSEUDO_COOKIE_BASE = 3


def _pad(n: int) -> int:
    return (n + 3) & ~3


def _pseudo_entries(ctx, node, cookie: int):
    """(cookie, name, obj-or-error) of a pseudo directory's children after `cookie`."""
    exports = ctx.server.exports
    names = sorted(node.children)
    for i, name in enumerate(names):
        c = _PSEUDO_COOKIE_BASE + i
        if c <= cookie:
            continue
        kind, target = node.children[name]
        if kind == "pseudo":
            yield c, name, pseudo_obj(ctx, exports.node(target))
            continue
        if not target.allows(ctx.peer[0] if ctx.peer else ""):
            continue                       # exports a client may not use stay hidden
        try:
            yield c, name, export_obj(ctx, target, ctx.server.store.getattr(target.root_ino))
        except StoreError as e:
            yield c, name, nfs_error(e)


def _store_entries(ctx, d, cookie: int):
    with store_errors():
        for ent in ctx.server.store.readdir(d.ino, cookie):
            yield ent.cookie, ent.name, export_obj(ctx, d.export, ent.attr)


def _entry_attrs(ctx, item, requested, statfs):
    """The entry's fattr4; a failure becomes rdattr_error when the client asked for it."""
    want_error = FATTR4_RDATTR_ERROR in requested
    if isinstance(item, NfsError):
        if want_error:
            return fattr.encode_rdattr_error(item.status)
        raise item
    try:
        return fattr.encode(fattr.AttrEnv(ctx.server, item, ctx.minorversion, statfs=statfs),
                            requested)
    except (NfsError, StoreError) as e:
        status = e.status if isinstance(e, NfsError) else nfs_error(e).status
        if want_error:
            return fattr.encode_rdattr_error(status)
        raise nfs_error(e) if isinstance(e, StoreError) else e


async def op_readdir(ctx, args) -> READDIR4res:
    d = current(ctx)
    require_dir(d)
    cookie = args.cookie
    if cookie in (1, 2):
        raise NfsError(NFS4ERR_BAD_COOKIE, "cookies 1 and 2 are reserved")
    if cookie != 0 and bytes(args.cookieverf) != COOKIE_VERF:
        raise NfsError(NFS4ERR_NOT_SAME, "cookie verifier")
    bits = set(fattr.known_bits(args.attr_request, ctx.minorversion))
    if bits & fattr.WRITE_ONLY:
        raise NfsError(NFS4ERR_INVAL, "write-only attribute requested")
    requested = fattr.bitmap_of(sorted(bits))
    if not d.is_pseudo:
        require_perm(d, who(ctx, d), MAY_READ)
    statfs = None
    if bits & _STATFS_ATTRS:
        with store_errors():
            statfs = ctx.server.store.statfs()

    budget = min(args.maxcount, MAX_REPLY) - _FIXED_REPLY_BYTES
    if args.maxcount < _FIXED_REPLY_BYTES - 4:      # maxcount counts READDIR4resok, not status
        raise NfsError(NFS4ERR_TOOSMALL, f"maxcount {args.maxcount} fits not even an empty reply")
    dir_budget = args.dircount if args.dircount > 0 else None
    source = (_pseudo_entries(ctx, d.node, cookie) if d.is_pseudo
              else _store_entries(ctx, d, cookie))
    entries = []
    used = dir_used = 0
    eof = True
    for c, name, item in source:
        attrs = _entry_attrs(ctx, item, requested, statfs)
        name_bytes = 4 + _pad(len(name))
        size = 4 + 8 + name_bytes + 4 + 4 * len(attrs.attrmask) + 4 + _pad(len(attrs.attr_vals))
        dir_size = 8 + name_bytes
        if used + size > budget or (
                entries and dir_budget is not None and dir_used + dir_size > dir_budget):
            eof = False
            break
        entries.append((c, name, attrs))
        used += size
        dir_used += dir_size
    if not entries and not eof:
        raise NfsError(NFS4ERR_TOOSMALL, f"maxcount {args.maxcount} fits no entry")

    chain = None
    for c, name, attrs in reversed(entries):
        chain = entry4(cookie=c, name=name, attrs=attrs, nextentry=chain)
    return READDIR4res(NFS4_OK, READDIR4resok(cookieverf=COOKIE_VERF,
                                              reply=dirlist4(entries=chain, eof=eof)))


HANDLERS = {OP_READDIR: op_readdir}

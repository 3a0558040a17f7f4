# cython: language_level=3, boundscheck=False, wraparound=False
"""The ops of every COMPOUND, typed (issue 37 point 3): PUTFH GETFH SAVEFH RESTOREFH LOOKUP GETATTR ACCESS.

Plain functions, not coroutines: the native COMPOUND loop (compound.pyx) calls them through the
op table's `native` column (nfsd/optable.py) instead of creating and awaiting a coroutine per op.
nfsd/ops/filehandle.py and nfsd/ops/attrs.py stay the specification: each twin gives the same
result and raises the same NfsError, checks in the same order
(tests/nfsd/test_fileops_native.py runs both on the same states). The common case is typed
here (an export's handle, an ASCII name); the rest calls the reference's own helpers (the pseudo
filesystem, refusals and their log lines, store errors), and GETATTR and ACCESS share their
body with the reference (attrs.getattr_of, access_of): the twin only saves the coroutine and
resolves the current handle typed.

One difference in form: LOOKUP of an absent name returns NFS4ERR_NOENT (an int) instead of
raising it, so a save's exists() costs no exception chain; the loop answers the int as it
answers a raised error. NOENT is a routine error, logged only at debug level, where the twin's
op_error line lacks the reference's detail (the name and directory).
"""
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from libc.string cimport memchr

from cache.api import NAME_MAX, FileType, StoreError
from nfsd.errors import NfsError
from nfsd.exports import AUTH_SYS
from nfsd.fh import KIND_PSEUDO, BadHandle, codec_for
from nfsd.ops import _common, attrs as _attrs_ops, filehandle as _fh_ops
from nfsd.xdr.nfs4 import (
    NFS4ERR_ACCESS, NFS4ERR_BADCHAR, NFS4ERR_BADHANDLE, NFS4ERR_BADNAME, NFS4ERR_INVAL,
    NFS4ERR_NAMETOOLONG, NFS4ERR_NOENT, NFS4ERR_NOFILEHANDLE, NFS4ERR_NOTDIR, NFS4ERR_RESTOREFH,
    NFS4ERR_STALE, NFS4ERR_SYMLINK, NFS4_OK, OP_ACCESS, OP_GETATTR, OP_GETFH, OP_LOOKUP, OP_PUTFH,
    OP_RESTOREFH, OP_SAVEFH, GETFH4res, GETFH4resok, LOOKUP4res, PUTFH4res, RESTOREFH4res, SAVEFH4res,
)

cdef Py_ssize_t _NAME_MAX = NAME_MAX
cdef long long _AUTH_SYS = AUTH_SYS
cdef object _DIR = FileType.DIR
cdef object _LNK = FileType.LNK
cdef object _Obj = _common.Obj
# Results with nothing but NFS4_OK: encoded at once and never kept or changed, so one of each.
cdef object _PUTFH_OK = PUTFH4res(NFS4_OK)
cdef object _LOOKUP_OK = LOOKUP4res(NFS4_OK)
cdef object _SAVEFH_OK = SAVEFH4res(NFS4_OK)
cdef object _RESTOREFH_OK = RESTOREFH4res(NFS4_OK)

# codec_for(store) builds its cache key (the instance id's bytes, the path) at every call; a
# store's codec never changes, so the last one is kept by the store's identity.
cdef object _codec_store = None
cdef object _codec = None


cdef object _codec_of(store):
    global _codec_store, _codec
    if store is not _codec_store:
        _codec = codec_for(store)
        _codec_store = store
    return _codec


cdef tuple _export_attr(ctx, fh):
    """_common.resolve() of an export's handle without the Obj: (export, attr)."""
    server = ctx.server
    exp = server.exports.get(fh.export_id)
    if exp is None:
        raise NfsError(NFS4ERR_STALE, f"export {fh.export_id} gone")
    peer = ctx.peer
    if peer:
        if not exp.allows(peer[0]) or not exp.port_ok(peer[1]):
            _common.check_export_access(ctx, exp)        # raises, with its log line
    else:
        _common.check_export_access(ctx, exp)
    try:
        attr = server.store.getattr(fh.ino)
    except StoreError as e:
        raise _common.nfs_error(e) from e
    if attr.gen != fh.gen:
        raise NfsError(NFS4ERR_STALE, "generation mismatch")
    return exp, attr


cdef tuple _current_export_attr(ctx, fh):
    """_export_attr() of the current handle `fh`, once per run of these ops: a COMPOUND's ops
    resolve the handle the op before them set (PUTFH, LOOKUP, LOOKUP, GETATTR...), and these
    ops run one after the other with nothing awaited in between, so the answer the previous
    one had (ctx.resolved) is as current as a new read (a change landing meanwhile is ordered
    after this op instead of before it). The loop clears it before any other op runs."""
    r = ctx.resolved
    if r is not None and (<tuple>r)[0] is fh:
        return (<tuple>r)[1:]
    exp, attr = _export_attr(ctx, fh)
    ctx.resolved = (fh, exp, attr)
    return exp, attr


cdef object _current_obj(ctx):
    """_common.current()."""
    fh = ctx.current_fh
    if fh is None:
        raise NfsError(NFS4ERR_NOFILEHANDLE)
    if fh.kind == KIND_PSEUDO:
        return _common.resolve(ctx, fh)
    exp, attr = _current_export_attr(ctx, fh)
    return _Obj(fh, exp, None, attr)


cdef bytes _check_name(name):
    """_common.check_name(): the same checks in the same order, the UTF-8 decode only for a
    name with a byte above 0x7F."""
    cdef bytes b = bytes(name)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(b), i
    cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(b)
    if n == 0:
        raise NfsError(NFS4ERR_INVAL, "empty name")
    if n > _NAME_MAX:
        raise NfsError(NFS4ERR_NAMETOOLONG, f"name of {n} bytes")
    for i in range(n):
        if p[i] >= 0x80:
            try:
                b.decode("utf-8")
            except UnicodeDecodeError:
                raise NfsError(NFS4ERR_INVAL, "name is not UTF-8") from None
            break
    if p[0] == 0x2E and (n == 1 or (n == 2 and p[1] == 0x2E)):
        raise NfsError(NFS4ERR_BADNAME, "name is . or ..")
    if memchr(p, 0x2F, n) != NULL or memchr(p, 0x00, n) != NULL:
        raise NfsError(NFS4ERR_BADCHAR, "name contains / or NUL")
    return b


cdef bint _may_search(exp, cred, attr) except -1:
    """exports.permitted(attr, Exports.effective_cred(exp, cred), MAY_EXEC) for a directory's
    `attr`, without building the EffectiveCred (a frozenset and an object per LOOKUP): the
    export's squash rules, then the owner, group or other bits (root may always search a
    directory). Held to the pair by tests/nfsd/test_fileops_native.py."""
    cdef long long uid, gid, anongid, owner_gid
    cdef bint squash_root, in_group
    cdef long long mode = attr.mode
    anongid = exp.anongid
    owner_gid = attr.gid
    if cred.flavor != _AUTH_SYS or exp.all_squash:
        uid = exp.anonuid
        in_group = owner_gid == anongid
    else:
        uid = cred.uid
        gid = cred.gid
        squash_root = exp.root_squash
        if squash_root:
            if uid == 0:
                uid = exp.anonuid
            if gid == 0:
                gid = anongid
        # gids after the squash: a 0 among them became anongid
        in_group = owner_gid == gid or (owner_gid in cred.gids and not (squash_root and owner_gid == 0)) \
            or (squash_root and owner_gid == anongid and 0 in cred.gids)
    if uid == 0:
        return True                     # a directory: root's search needs no exec bit
    if uid == attr.uid:
        return (mode >> 6) & 1
    if in_group:
        return (mode >> 3) & 1
    return mode & 1


def putfh(ctx, args):
    """filehandle.op_putfh."""
    try:
        fh = _codec_of(ctx.server.store).decode(args.object)
    except BadHandle as e:
        raise NfsError(NFS4ERR_BADHANDLE, str(e)) from None
    if fh.kind == KIND_PSEUDO:
        _common.resolve(ctx, fh)
    else:
        exp, attr = _export_attr(ctx, fh)
        ctx.resolved = (fh, exp, attr)
    ctx.current_fh = fh
    ctx.current_stateid = None
    return _PUTFH_OK


def getfh(ctx, args):
    """filehandle.op_getfh."""
    fh = ctx.current_fh
    if fh is None:
        raise NfsError(NFS4ERR_NOFILEHANDLE)
    return GETFH4res(NFS4_OK, GETFH4resok(object=fh.raw))


def savefh(ctx, args):
    """filehandle.op_savefh."""
    if ctx.current_fh is None:
        raise NfsError(NFS4ERR_NOFILEHANDLE)
    ctx.saved_fh = ctx.current_fh
    ctx.saved_stateid = ctx.current_stateid
    return _SAVEFH_OK


def restorefh(ctx, args):
    """filehandle.op_restorefh."""
    if ctx.saved_fh is None:
        raise NfsError(NFS4ERR_RESTOREFH if ctx.minorversion == 0 else NFS4ERR_NOFILEHANDLE)
    ctx.current_fh = ctx.saved_fh
    ctx.current_stateid = ctx.saved_stateid
    return _RESTOREFH_OK


def lookup(ctx, args):
    """filehandle.op_lookup; an absent name returns NFS4ERR_NOENT (see the module's doc)."""
    fh = ctx.current_fh
    if fh is None:
        raise NfsError(NFS4ERR_NOFILEHANDLE)
    if fh.kind == KIND_PSEUDO:           # the pseudo filesystem: the reference's own steps
        parent = _common.resolve(ctx, fh)
        _common.set_current(ctx, _fh_ops.lookup_child(ctx, parent, _check_name(args.objname)))
        return _LOOKUP_OK
    exp, pattr = _current_export_attr(ctx, fh)
    name = _check_name(args.objname)
    t = pattr.type
    if t is not _DIR and t != _DIR:      # _common.require_dir
        raise NfsError(NFS4ERR_SYMLINK if t == _LNK else NFS4ERR_NOTDIR)
    if not _may_search(exp, ctx.cred, pattr):
        raise NfsError(NFS4ERR_ACCESS)
    store = ctx.server.store
    try:
        attr = store.find(pattr.ino, name)
    except StoreError as e:
        raise _common.nfs_error(e) from e
    if attr is None:
        return NFS4ERR_NOENT
    fh = _codec_of(store).export(exp.export_id, attr.ino, attr.gen)
    ctx.current_fh = fh
    ctx.current_stateid = None
    ctx.resolved = (fh, exp, attr)       # what resolving it now would give: same export, live attr
    return _LOOKUP_OK


def getattr_(ctx, args):
    """attrs.op_getattr."""
    return _attrs_ops.getattr_of(ctx, _current_obj(ctx), args)


def access(ctx, args):
    """attrs.op_access."""
    return _attrs_ops.access_of(ctx, _current_obj(ctx), args)


# op number -> (the reference handler, its twin here)
TWINS = {
    OP_PUTFH: (_fh_ops.op_putfh, putfh),
    OP_GETFH: (_fh_ops.op_getfh, getfh),
    OP_SAVEFH: (_fh_ops.op_savefh, savefh),
    OP_RESTOREFH: (_fh_ops.op_restorefh, restorefh),
    OP_LOOKUP: (_fh_ops.op_lookup, lookup),
    OP_GETATTR: (_attrs_ops.op_getattr, getattr_),
    OP_ACCESS: (_attrs_ops.op_access, access),
}

"""Helpers shared by the filesystem op handlers: the current object, store error
mapping, name checks, permission checks and blocking store calls."""
from __future__ import annotations

import asyncio
import errno
import time
from dataclasses import dataclass

import structlog

from cache.api import NAME_MAX, NUL, SLASH, Attr, FileType, StoreError
from nfsd.errors import NfsError
from nfsd.exports import (EffectiveCred, Export, PseudoNode, MAY_EXEC, MAY_WRITE,
                          permitted)
from nfsd.fh import FileHandle, codec_for
from nfsd.owners import sequenced
from nfsd.openstate import (ANONYMOUS, BYPASS, CURRENT, INVALID, SHARE_ACCESS_READ,
                            SHARE_ACCESS_WRITE, special_kind)
from nfsd.xdr.nfs4 import (
    NFS4ERR_ACCESS, NFS4ERR_BAD_STATEID, NFS4ERR_BADCHAR, NFS4ERR_BADNAME, NFS4ERR_DELAY,
    NFS4ERR_DQUOT, NFS4ERR_EXIST, NFS4ERR_EXPIRED, NFS4ERR_FBIG, NFS4ERR_INVAL, NFS4ERR_IO,
    NFS4ERR_ISDIR, NFS4ERR_STALE_CLIENTID,
    NFS4ERR_LOCKED, NFS4ERR_MLINK, NFS4ERR_NAMETOOLONG, NFS4ERR_NOENT, NFS4ERR_NOFILEHANDLE,
    NFS4ERR_NOSPC, NFS4ERR_NOTDIR, NFS4ERR_NOTEMPTY, NFS4ERR_NXIO, NFS4ERR_OPENMODE, NFS4ERR_PERM,
    NFS4ERR_ROFS, NFS4ERR_STALE, NFS4ERR_SYMLINK, NFS4ERR_WRONG_TYPE, NFS4ERR_XDEV,
    SEQ4_STATUS_EXPIRED_ALL_STATE_REVOKED, change_info4,
)

log = structlog.get_logger(__name__)

# StoreError.errno -> nfsstat4: the one place the store's errors meet the protocol.
STORE_ERRNO_TO_NFS4 = {
    errno.ENOENT: NFS4ERR_NOENT,
    errno.EEXIST: NFS4ERR_EXIST,
    errno.ENOTDIR: NFS4ERR_NOTDIR,
    errno.EISDIR: NFS4ERR_ISDIR,
    errno.ENOTEMPTY: NFS4ERR_NOTEMPTY,
    errno.ESTALE: NFS4ERR_STALE,
    errno.ENOSPC: NFS4ERR_NOSPC,
    errno.EAGAIN: NFS4ERR_DELAY,          # over capacity: the client retries later
    errno.EINVAL: NFS4ERR_INVAL,
    errno.ENAMETOOLONG: NFS4ERR_NAMETOOLONG,
    errno.EXDEV: NFS4ERR_XDEV,
    errno.EMLINK: NFS4ERR_MLINK,
    errno.EROFS: NFS4ERR_ROFS,
    errno.EIO: NFS4ERR_IO,
    errno.EACCES: NFS4ERR_ACCESS,
    errno.EPERM: NFS4ERR_PERM,
    errno.EFBIG: NFS4ERR_FBIG,
    errno.EDQUOT: NFS4ERR_DQUOT,
    errno.ENXIO: NFS4ERR_NXIO,            # SEEK at or past the end of the file
}


def nfs_error(e: StoreError) -> NfsError:
    status = STORE_ERRNO_TO_NFS4.get(e.errno)
    if status is None:
        log.error("store_error_unmapped", errno=e.errno, error=str(e))
        status = NFS4ERR_IO
    return NfsError(status, str(e))


class store_errors:
    """`with store_errors(): ...` turns a StoreError into the matching NfsError."""

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None and issubclass(exc_type, StoreError):
            raise nfs_error(exc) from exc
        return False


# ---- names (RFC 8881 section 14.2) ------------------------------------------------------
def check_name(name: bytes) -> bytes:
    name = bytes(name)
    if not name:
        raise NfsError(NFS4ERR_INVAL, "empty name")
    if len(name) > NAME_MAX:
        raise NfsError(NFS4ERR_NAMETOOLONG, f"name of {len(name)} bytes")
    try:
        name.decode("utf-8")
    except UnicodeDecodeError:
        raise NfsError(NFS4ERR_INVAL, "name is not UTF-8") from None
    if name in (b".", b".."):
        raise NfsError(NFS4ERR_BADNAME, "name is . or ..")
    if SLASH in name or NUL in name:
        raise NfsError(NFS4ERR_BADCHAR, "name contains / or NUL")
    return name


# ---- the object a file handle names ---------------------------------------------------------
_PSEUDO_TIME_NS = time.time_ns()


@dataclass(slots=True)
class Obj:
    fh: FileHandle
    export: Export | None        # None for pseudo-filesystem directories
    node: PseudoNode | None      # set for pseudo directories
    attr: Attr

    @property
    def is_pseudo(self) -> bool:
        return self.node is not None

    @property
    def ino(self) -> int:
        return self.attr.ino


def pseudo_attr(node: PseudoNode) -> Attr:
    return Attr(ino=node.fileid, gen=0, type=FileType.DIR, mode=0o555,
                nlink=2 + len(node.children), uid=0, gid=0, size=4096, space_used=0,
                atime_ns=_PSEUDO_TIME_NS, mtime_ns=_PSEUDO_TIME_NS, ctime_ns=_PSEUDO_TIME_NS,
                change=1, parent=node.parent)


def codec(ctx):
    return codec_for(ctx.server.store)


def export_obj(ctx, exp: Export, attr: Attr) -> Obj:
    return Obj(codec(ctx).export(exp.export_id, attr.ino, attr.gen), exp, None, attr)


def pseudo_obj(ctx, node: PseudoNode) -> Obj:
    return Obj(codec(ctx).pseudo(node.index), None, node, pseudo_attr(node))


def root_obj(ctx) -> Obj:
    exports = ctx.server.exports
    if exports.root_export is not None:
        exp = exports.root_export
        check_export_access(ctx, exp)
        with store_errors():
            return export_obj(ctx, exp, ctx.server.store.getattr(exp.root_ino))
    return pseudo_obj(ctx, exports.node(0))


def check_export_access(ctx, exp: Export) -> None:
    ip = ctx.peer[0] if ctx.peer else ""
    # both refusals repeat with every op of a misconfigured client: rate-limited, never one line per op
    if not exp.allows(ip):
        ctx.server.ratelog.warning("export_access_refused", ip, export=exp.path)
        raise NfsError(NFS4ERR_ACCESS, f"client {ip} may not use export {exp.path}")
    if ctx.peer and not exp.port_ok(ctx.peer[1]):       # `secure` export, port >= 1024
        ctx.server.ratelog.warning("insecure_port_refused", ip, port=ctx.peer[1], export=exp.path)
        raise NfsError(NFS4ERR_PERM, f"export {exp.path} is secure: source port {ctx.peer[1]} >= 1024")


def resolve(ctx, fh: FileHandle) -> Obj:
    """The live object behind a handle; NFS4ERR_STALE when it is gone."""
    exports = ctx.server.exports
    if fh.is_pseudo:
        node = exports.node(fh.ino)
        if node is None or exports.root_export is not None:
            raise NfsError(NFS4ERR_STALE, "pseudo node gone")
        return Obj(fh, None, node, pseudo_attr(node))
    exp = exports.get(fh.export_id)
    if exp is None:
        raise NfsError(NFS4ERR_STALE, f"export {fh.export_id} gone")
    check_export_access(ctx, exp)
    try:
        attr = ctx.server.store.getattr(fh.ino)
    except StoreError as e:
        raise nfs_error(e) from e
    if attr.gen != fh.gen:
        raise NfsError(NFS4ERR_STALE, "generation mismatch")
    return Obj(fh, exp, None, attr)


def current(ctx) -> Obj:
    if ctx.current_fh is None:
        raise NfsError(NFS4ERR_NOFILEHANDLE)
    return resolve(ctx, ctx.current_fh)


def saved(ctx) -> Obj:
    if ctx.saved_fh is None:
        raise NfsError(NFS4ERR_NOFILEHANDLE)
    return resolve(ctx, ctx.saved_fh)


def set_current(ctx, obj: Obj) -> None:
    """Change the current filehandle; that clears the 4.1 current stateid (RFC 8881 16.2.3.1.2)."""
    ctx.current_fh = obj.fh
    ctx.current_stateid = None


def require_dir(obj: Obj) -> None:
    t = obj.attr.type
    if t == FileType.DIR:
        return
    raise NfsError(NFS4ERR_SYMLINK if t == FileType.LNK else NFS4ERR_NOTDIR)


def require_regular(ctx, obj: Obj, *, v40_other: int = NFS4ERR_INVAL) -> None:
    """An op that needs a regular file (OPEN, READ, WRITE, COMMIT, LOCK*): a directory
    gets ISDIR and a symlink SYMLINK in both minor versions; any other type (device,
    socket, FIFO) WRONG_TYPE in 4.1 (RFC 8881 18.16.3, 18.22.3, 18.32.3), an error 4.0
    lacks: there RFC 7530 says INVAL for I/O (16.23.5, 16.36.5) and SYMLINK for OPEN
    (16.16.5), chosen by `v40_other`."""
    t = obj.attr.type
    if obj.is_pseudo or t == FileType.DIR:
        raise NfsError(NFS4ERR_ISDIR)
    if t == FileType.LNK:
        raise NfsError(NFS4ERR_SYMLINK)
    if t != FileType.REG:
        raise NfsError(NFS4ERR_WRONG_TYPE if ctx.minorversion >= 1 else v40_other,
                       f"{t.name} file: not opened for I/O")


def who(ctx, obj_or_export) -> EffectiveCred:
    exp = obj_or_export.export if isinstance(obj_or_export, Obj) else obj_or_export
    return ctx.server.exports.effective_cred(exp, ctx.cred)


def require_writable_fs(obj: Obj) -> None:
    if obj.is_pseudo or not obj.export.rw:
        raise NfsError(NFS4ERR_ROFS)


def require_perm(obj: Obj, cred: EffectiveCred, want: int) -> None:
    if not permitted(obj.attr, cred, want):
        raise NfsError(NFS4ERR_ACCESS)


def require_dir_modify(ctx, dir_obj: Obj) -> EffectiveCred:
    """Checks for adding or removing names in a directory: rw export, write+search permission."""
    require_dir(dir_obj)
    require_writable_fs(dir_obj)
    cred = who(ctx, dir_obj)
    require_perm(dir_obj, cred, MAY_WRITE | MAY_EXEC)
    return cred


def same_export(a: Obj, b: Obj) -> None:
    if a.is_pseudo or b.is_pseudo or a.export is not b.export:
        raise NfsError(NFS4ERR_XDEV)


# ---- blocking store calls (sync, commit) ------------------------------------------------------
async def blocking(ctx, fn, *args):
    """Run a blocking store call off the event loop, on the server's pool."""
    return await ctx.server.run_blocking(fn, *args)


async def namespace_op(ctx, op: str, *args):
    """A store namespace op (Store.NAMESPACE_OPS) through the store's batch committer:
    returns once it is durable, and the loop never waits on a sync meanwhile. StoreErrors
    propagate (callers map them with store_errors())."""
    return await ctx.server.store.submit(op, *args, loop=asyncio.get_running_loop())


async def sync_namespace(ctx) -> None:
    """Namespace ops reply only once their change is durable (group commit in the store).
    Already durable (a batched op's commit, an unchanged SETATTR): no worker round trip."""
    if ctx.server.store.durable():
        return
    with store_errors():
        await blocking(ctx, ctx.server.store.sync)


def change_info(ci):
    return change_info4(atomic=bool(ci.atomic), before=ci.before, after=ci.after)


# ---- stateids of READ / WRITE / SETATTR ---------------------------------------------------------
def resolve_stateid_arg(ctx, sid):
    """Replace the 4.1 current-stateid special value by the COMPOUND's current stateid."""
    if special_kind(sid) == CURRENT:
        if ctx.minorversion == 0 or ctx.current_stateid is None:
            raise NfsError(NFS4ERR_BAD_STATEID, "no current stateid")
        return ctx.current_stateid
    return sid


def clientid_of(ctx) -> int:
    if ctx.client is None:
        raise NfsError(NFS4ERR_BAD_STATEID, "no client")
    return ctx.client.clientid


def v40_client(ctx, clientid: int):
    """The confirmed NFSv4.0 client an op names by clientid; the op renews its lease
    (RFC 7530 9.5). Unknown, unconfirmed, expired or earlier-instance ids are stale."""
    mgr = ctx.server.sessions
    client = mgr.clients.get(clientid)
    if client is None or client.expired or not client.confirmed or client.minorversion != 0:
        if clientid in mgr.expired_ids:
            raise NfsError(NFS4ERR_EXPIRED, f"clientid {clientid:#x}: lease expired")
        raise NfsError(NFS4ERR_STALE_CLIENTID, f"clientid {clientid:#x}")
    client.renew()
    ctx.client = client
    return client


def expire_lapsed_holders(ctx, ino: int) -> None:
    """Other clients holding opens or locks on `ino` whose lease has run out lose them
    now, rather than at the reaper's next round, so the state they block is granted
    (RFC 7530 9.6, RFC 8881 8.3: past its lease a client's state may be released)."""
    mgr = ctx.server.sessions
    now = time.monotonic()
    for clientid in {st.clientid for st in ctx.server.opens.opens_of(ino)}:
        client = mgr.clients.get(clientid)
        if client is not None and client is not ctx.client and mgr.lapsed(client, now):
            if client.sessions:
                # 4.1: keep the record and sessions so the client's next SEQUENCE is told
                # (RFC 8881 18.46.3); the reaper still removes it if it stays silent.
                mgr.revoke_state(client, SEQ4_STATUS_EXPIRED_ALL_STATE_REVOKED,
                                 "lease expired; its state is wanted by another client")
            else:
                mgr.expire(client, "lease expired; its state is wanted by another client")


async def seqid_op(ctx, kind: str, sid, seqid: int, run):
    """Run a 4.0 op that names an owner by a stateid under that owner's seqid rules
    (nfsd/owners.py); the owner is found from the stateid whatever its seqid, so a
    retransmission is answered before the stateid's seqid is judged."""
    opens = ctx.server.opens
    other = bytes(sid.other)
    st = opens.peek(other)
    if st is not None:
        o = opens.owners.get(kind, st.clientid, st.owner, create=True,
                             in_use=opens.owner_in_use)
    else:
        o = opens.owners.closed_owner(other)
    if o is None:
        return await run()          # unknown stateid: run() says why
    return await sequenced(ctx, o, seqid, run)


def find_state(ctx, sid, *, confirmed: bool = True):
    """The open or lock state a stateid argument names. In NFSv4.0 the stateid itself
    names the client, whose lease this use renews (RFC 7530 9.5); an open not yet
    confirmed by OPEN_CONFIRM is not usable (`confirmed=False` for OPEN_CONFIRM)."""
    sid = resolve_stateid_arg(ctx, sid)
    opens = ctx.server.opens
    if ctx.minorversion >= 1:
        return opens.find(clientid_of(ctx), sid)
    st = opens.find(None, sid, v40=True)
    client = ctx.server.sessions.clients.get(st.clientid)
    if client is None or client.expired:
        raise NfsError(NFS4ERR_EXPIRED, "the stateid's client lease expired")
    client.renew()
    ctx.client = client
    open_st = getattr(st, "open", st)
    if confirmed and not open_st.confirmed:
        raise NfsError(NFS4ERR_BAD_STATEID, "open not confirmed")
    return st


def io_state(ctx, sid, obj: Obj, *, write: bool):
    """The open or lock state a READ/WRITE/SETATTR(size) stateid names, or None for the
    anonymous / READ-bypass stateids (the caller then checks mode bits). Enforces the
    open's mode (NFS4ERR_OPENMODE) and other owners' deny reservations for anonymous I/O."""
    sid = resolve_stateid_arg(ctx, sid)
    kind = special_kind(sid)
    opens = ctx.server.opens
    if kind == INVALID:
        raise NfsError(NFS4ERR_BAD_STATEID, "the invalid special stateid")
    if kind == BYPASS and write:
        kind = ANONYMOUS        # RFC 8881 8.2.3: for WRITE/SETATTR it is the anonymous one
    if kind in (ANONYMOUS, BYPASS):
        if kind == ANONYMOUS:
            deny_bit = SHARE_ACCESS_WRITE if write else SHARE_ACCESS_READ
            if any(st.deny & deny_bit for st in opens.opens_of(obj.ino)):
                raise NfsError(NFS4ERR_LOCKED, "denied by a share reservation")
        return None
    st = find_state(ctx, sid)
    if st.ino != obj.ino or st.export_id != (obj.export.export_id if obj.export else 0):
        raise NfsError(NFS4ERR_BAD_STATEID, "stateid is for another file")
    if write and not st.access & SHARE_ACCESS_WRITE:
        raise NfsError(NFS4ERR_OPENMODE, "not open for write")
    return st

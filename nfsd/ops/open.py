"""OPEN OPEN_DOWNGRADE CLOSE DELEGRETURN (RFC 8881 sections 18.16, 18.18, 18.2, 18.6).

We never grant delegations, so delegation claims are refused. Open state is lost at a
restart; clients with a record (nfsd/grace.py) reclaim it with CLAIM_PREVIOUS during the
grace period, when every other OPEN gets NFS4ERR_GRACE.
Exclusive creates keep the client's verifier in the new file's mtime/atime seconds
(as Linux knfsd does) so a retransmitted create finds "its" file and succeeds
(RFC 8881 18.16.3); the reply's attrset names those times so the client resets them.
"""
from __future__ import annotations

import asyncio
import errno
import struct

import structlog

from cache.api import FileType, SetAttr, StoreError
from nfsd import attrs as fattr
from nfsd.errors import NfsError
from nfsd.exports import MAY_EXEC, MAY_READ, MAY_WRITE
from nfsd.openstate import SHARE_ACCESS_READ, SHARE_ACCESS_WRITE, OpenState, invalid_stateid
from nfsd.ops._common import (Obj, change_info, check_name, clientid_of, current, export_obj,
                              expire_lapsed_holders, find_state, nfs_error, require_dir, require_dir_modify,
                              namespace_op, require_perm, require_regular, resolve_stateid_arg, seqid_op,
                              set_current, store_errors, sync_namespace, v40_client, who)
from nfsd.owners import OPEN_OWNER, sequenced
from nfsd.ops.attrs import apply_setattr, setattr_request
from nfsd.ops.filehandle import lookup_child
from nfsd.ops.namespace import new_owner
from nfsd.xdr.nfs4 import (
    NFS4ERR_GRACE, CLAIM_DELEG_CUR_FH, CLAIM_DELEG_PREV_FH, CLAIM_DELEGATE_CUR, CLAIM_DELEGATE_PREV,
    CLAIM_FH, CLAIM_NULL, CLAIM_PREVIOUS, EXCLUSIVE4, EXCLUSIVE4_1, FATTR4_MODE,
    FATTR4_SIZE, FATTR4_TIME_ACCESS_SET, FATTR4_TIME_MODIFY_SET, GUARDED4,
    NFS4ERR_BAD_STATEID, NFS4ERR_EXIST, NFS4ERR_INVAL, NFS4ERR_ISDIR,
    NFS4ERR_NOTSUPP, NFS4ERR_ROFS, NFS4ERR_SYMLINK, NFS4_OK,
    OPEN4_CREATE, OPEN4_RESULT_CONFIRM, OPEN4_RESULT_LOCKTYPE_POSIX, OPEN4_SHARE_ACCESS_WANT_CANCEL,
    OPEN4_SHARE_ACCESS_WANT_DELEG_MASK, OPEN4_SHARE_ACCESS_WANT_NO_DELEG,
    OPEN_DELEGATE_NONE, OPEN_DELEGATE_NONE_EXT, OP_CLOSE, OP_DELEGRETURN, OP_OPEN,
    OP_OPEN_DOWNGRADE, UNCHECKED4, WND4_CANCELLED, WND4_NOT_WANTED, WND4_RESOURCE,
    CLOSE4res, DELEGRETURN4res, OPEN4res, OPEN4resok, OPEN_DOWNGRADE4res,
    OPEN_DOWNGRADE4resok, OP_OPEN_CONFIRM, OPEN_CONFIRM4res, OPEN_CONFIRM4resok, change_info4, open_delegation4, open_none_delegation4,
)

log = structlog.get_logger(__name__)

_ACCESS_MASK = 0xFF            # OPEN4_SHARE_ACCESS_READ/WRITE/BOTH
_DEFAULT_FILE_MODE = 0o644
_NS = 1_000_000_000


def _share_args(share_access: int, share_deny: int) -> tuple[int, int]:
    access = share_access & _ACCESS_MASK
    if access not in (1, 2, 3) or share_deny & ~3:
        raise NfsError(NFS4ERR_INVAL, f"share_access {share_access:#x} share_deny {share_deny:#x}")
    return access, share_deny


def _verifier_times(verf: bytes) -> tuple[int, int]:
    """(mtime_ns, atime_ns) holding an exclusive-create verifier."""
    hi, lo = struct.unpack(">II", bytes(verf))
    return hi * _NS, lo * _NS


def _holds_verifier(attr, verf: bytes) -> bool:
    mtime, atime = _verifier_times(verf)
    return attr.mtime_ns == mtime and attr.atime_ns == atime


def _check_open_access(ctx, obj: Obj, access: int) -> None:
    """Permission to open an existing file, by mode bits for everyone (the owner too):
    the Linux client skips its own check and counts on OPEN, CLAIM_FH included (see
    knfsd's do_open_fhandle). Only the creator of a new file is not checked."""
    if access & SHARE_ACCESS_WRITE and not obj.export.rw:
        raise NfsError(NFS4ERR_ROFS)
    cred = who(ctx, obj)
    want = (MAY_READ if access & SHARE_ACCESS_READ else 0) | \
           (MAY_WRITE if access & SHARE_ACCESS_WRITE else 0)
    require_perm(obj, cred, want)


class _Created:
    """What the create part of OPEN did. `wrote`: a SETATTR after the (durable) create
    changed the file, so the reply waits for a sync."""
    def __init__(self, obj: Obj, cinfo, created: bool, attrset: list[int], wrote: bool):
        self.obj, self.cinfo, self.created, self.attrset = obj, cinfo, created, attrset
        self.wrote = wrote


async def _create(ctx, parent: Obj, name: bytes, how) -> _Created:
    """OPEN4_CREATE in a directory (RFC 8881 18.16.3 createmode4 semantics)."""
    mode = how.tag
    verf = None
    if mode in (UNCHECKED4, GUARDED4):
        values = fattr.decode(how.value, ctx.minorversion)
    elif mode == EXCLUSIVE4:
        verf, values = bytes(how.value), {}
    elif mode == EXCLUSIVE4_1:
        if ctx.minorversion < 1:
            raise NfsError(NFS4ERR_INVAL, "EXCLUSIVE4_1 needs NFSv4.1")
        verf = bytes(how.value.cva_verf)
        values = fattr.decode(how.value.cva_attrs, ctx.minorversion, allowed=fattr.EXCLCREAT)
    else:
        raise NfsError(NFS4ERR_INVAL, f"createmode {mode}")
    if parent.is_pseudo or not parent.export.rw:
        raise NfsError(NFS4ERR_ROFS)
    require_perm(parent, who(ctx, parent), MAY_EXEC)       # search permission, as LOOKUP
    store = ctx.server.store
    before = parent.attr.change
    try:
        existing = store.lookup(parent.ino, name)
    except StoreError as e:
        if e.errno != errno.ENOENT:
            raise nfs_error(e) from e
        existing = None
    if existing is None:
        cred = require_dir_modify(ctx, parent)
        uid, gid = new_owner(cred, parent)
        try:
            attr, ci, created = await namespace_op(
                ctx, "create", parent.ino, name, values.get(FATTR4_MODE, _DEFAULT_FILE_MODE),
                uid, gid, mode != UNCHECKED4)
        except StoreError as e:
            if e.errno != errno.EEXIST:       # lost a race: judge the winner below
                raise nfs_error(e) from e
            with store_errors():
                existing = store.lookup(parent.ino, name)
        else:
            if created:
                obj = export_obj(ctx, parent.export, attr)
                with store_errors():
                    attrset, wrote = await _initialise(ctx, obj, values, verf)
                return _Created(obj, ci, True, attrset, wrote)
            existing = attr               # UNCHECKED4 lost a race: open the winner's file
    # The name exists.
    obj = export_obj(ctx, parent.export, existing)
    cinfo = change_info4(atomic=True, before=before, after=before)
    if existing.type == FileType.DIR:
        raise NfsError(NFS4ERR_ISDIR)
    if mode == GUARDED4:
        raise NfsError(NFS4ERR_EXIST)
    if verf is not None:
        if existing.type != FileType.REG or not _holds_verifier(existing, verf):
            raise NfsError(NFS4ERR_EXIST)
        # A retransmission of our own exclusive create: succeed as before.
        return _Created(obj, cinfo, False, sorted(set(values) | _VERIFIER_BITS), True)
    # UNCHECKED4 on an existing file opens it; createattrs are ignored except that a
    # size of zero truncates it (O_TRUNC; RFC 8881 18.16.3).
    require_regular(ctx, obj, v40_other=NFS4ERR_SYMLINK)
    attrset = []
    if values.get(FATTR4_SIZE) == 0:
        with store_errors():
            await apply_setattr(ctx, obj,
                                setattr_request(ctx, obj, {FATTR4_SIZE: values[FATTR4_SIZE]}))
        attrset = [FATTR4_SIZE]
    return _Created(obj, cinfo, False, attrset, bool(attrset))


_VERIFIER_BITS = frozenset({FATTR4_TIME_ACCESS_SET, FATTR4_TIME_MODIFY_SET})


async def _initialise(ctx, obj: Obj, values: dict, verf: bytes | None) -> tuple[list[int], bool]:
    """Apply createattrs (mode went to store.create) and the exclusive verifier; the set
    bits, and whether a SETATTR was written."""
    rest = {b: v for b, v in values.items() if b != FATTR4_MODE}
    sa = setattr_request(ctx, obj, rest, creating=True) if rest else SetAttr()
    bits = set(values)
    if verf is not None:
        sa.mtime_ns, sa.atime_ns = _verifier_times(verf)
        bits |= _VERIFIER_BITS
    await apply_setattr(ctx, obj, sa)
    return sorted(bits), sa != SetAttr()


def _delegation(ctx, share_access: int):
    """We never delegate (RFC 8881 10.4); 4.1 clients that asked get the reason."""
    want = share_access & OPEN4_SHARE_ACCESS_WANT_DELEG_MASK
    if ctx.minorversion < 1 or not want:
        return open_delegation4(OPEN_DELEGATE_NONE)
    if want == OPEN4_SHARE_ACCESS_WANT_NO_DELEG:
        why = open_none_delegation4(WND4_NOT_WANTED)
    elif want == OPEN4_SHARE_ACCESS_WANT_CANCEL:
        why = open_none_delegation4(WND4_CANCELLED)
    else:
        why = open_none_delegation4(WND4_RESOURCE, False)
    return open_delegation4(OPEN_DELEGATE_NONE_EXT, why)


async def op_open(ctx, args) -> OPEN4res:
    if ctx.minorversion >= 1:
        return await _open(ctx, args, None)
    # NFSv4.0: the open-owner's seqid orders and replays its OPENs (RFC 7530 9.1.7).
    client = v40_client(ctx, args.owner.clientid)
    opens = ctx.server.opens
    o = opens.owners.get(OPEN_OWNER, client.clientid, bytes(args.owner.owner), create=True,
                         in_use=opens.owner_in_use)
    if not o.confirmed and o.seqid is not None and args.seqid != o.seqid:
        # An unconfirmed owner that OPENs again starts over (RFC 7530 16.18.5).
        opens.close_unconfirmed(client.clientid, o.owner)
        o.restart()
    return await sequenced(ctx, o, args.seqid, lambda: _open(ctx, args, o))


async def _open(ctx, args, owner) -> OPEN4res:
    access, deny = _share_args(args.share_access, args.share_deny)
    clientid = clientid_of(ctx)
    claim = args.claim.tag
    creating = args.openhow.tag == OPEN4_CREATE
    grace = ctx.server.grace
    if claim == CLAIM_PREVIOUS:
        if ctx.client is None:
            raise NfsError(NFS4ERR_BAD_STATEID, "no client")
        grace.check_reclaim(ctx.client)
    else:
        grace.refuse_in_grace("OPEN")
    if claim != CLAIM_PREVIOUS and ctx.minorversion >= 1 \
            and not getattr(ctx.client, "reclaim_complete", True):
        # RFC 8881 18.51.3: non-reclaim OPENs wait for the client's RECLAIM_COMPLETE.
        raise NfsError(NFS4ERR_GRACE, "OPEN before RECLAIM_COMPLETE")
    if claim in (CLAIM_DELEGATE_CUR, CLAIM_DELEG_CUR_FH):
        raise NfsError(NFS4ERR_BAD_STATEID, "no delegations are granted")
    if claim in (CLAIM_DELEGATE_PREV, CLAIM_DELEG_PREV_FH):
        raise NfsError(NFS4ERR_NOTSUPP, "delegation reclaim")
    base = current(ctx)
    created = wrote = False
    if claim == CLAIM_NULL:
        require_dir(base)
        name = check_name(args.claim.value)
        if creating:
            res = await _create(ctx, base, name, args.openhow.value)
            obj, cinfo, created, attrset = res.obj, res.cinfo, res.created, res.attrset
            wrote = res.wrote
        else:
            obj = lookup_child(ctx, base, name)
            cinfo = change_info4(atomic=True, before=base.attr.change, after=base.attr.change)
            attrset = []
    elif claim == CLAIM_PREVIOUS:
        # The file is the current filehandle; nothing is created (RFC 8881 18.16.3), and
        # the delegation type asked for is moot since we never delegated.
        obj = base
        cinfo = change_info4(atomic=True, before=0, after=0)
        attrset = []
    elif claim == CLAIM_FH:
        if creating or ctx.minorversion < 1:
            raise NfsError(NFS4ERR_INVAL, "CLAIM_FH cannot create (and needs 4.1)")
        obj = base
        cinfo = change_info4(atomic=True, before=0, after=0)
        attrset = []
    else:
        raise NfsError(NFS4ERR_INVAL, f"open claim {claim}")
    require_regular(ctx, obj, v40_other=NFS4ERR_SYMLINK)
    if not created:
        _check_open_access(ctx, obj, access)
    expire_lapsed_holders(ctx, obj.ino)
    with store_errors():
        if claim != CLAIM_PREVIOUS:
            await grace.record(ctx.client)      # durable before the client gets state
        st = ctx.server.opens.open(clientid, args.owner.owner, obj.ino,
                                   obj.export.export_id, access, deny)
    if claim == CLAIM_PREVIOUS:
        await grace.reclaimed(ctx.client)
        if owner is not None:
            owner.confirmed = True     # a reclaim needs no OPEN_CONFIRM (as knfsd)
    rflags = OPEN4_RESULT_LOCKTYPE_POSIX
    if owner is not None and not owner.confirmed:
        st.confirmed = False
        rflags |= OPEN4_RESULT_CONFIRM
    set_current(ctx, obj)
    ctx.current_stateid = st.stateid()
    if wrote:                 # the create itself was durable when namespace_op returned
        await sync_namespace(ctx)
    log.debug("open", client=ctx.peer[0] if ctx.peer else None, ino=obj.ino,
              access=access, deny=deny, created=created)
    if not isinstance(cinfo, change_info4):
        cinfo = change_info(cinfo)
    return OPEN4res(NFS4_OK, OPEN4resok(
        stateid=st.stateid(), cinfo=cinfo, rflags=rflags,
        attrset=fattr.bitmap_of(attrset), delegation=_delegation(ctx, args.share_access)))


def _state_for(ctx, sid, *, confirmed: bool = True):
    """The open state named by a CLOSE/OPEN_DOWNGRADE stateid, for the current file."""
    obj = current(ctx)
    st = find_state(ctx, sid, confirmed=confirmed)
    if not isinstance(st, OpenState) or st.ino != obj.ino:
        raise NfsError(NFS4ERR_BAD_STATEID, "not an open stateid of this file")
    return st


async def op_open_downgrade(ctx, args) -> OPEN_DOWNGRADE4res:
    if ctx.minorversion == 0:
        return await seqid_op(ctx, OPEN_OWNER, args.open_stateid, args.seqid,
                              lambda: _open_downgrade(ctx, args))
    return await _open_downgrade(ctx, args)


async def _open_downgrade(ctx, args) -> OPEN_DOWNGRADE4res:
    st = _state_for(ctx, args.open_stateid)
    access, deny = _share_args(args.share_access, args.share_deny)
    with store_errors():
        ctx.server.opens.downgrade(st, access, deny)
    ctx.current_stateid = st.stateid()
    return OPEN_DOWNGRADE4res(NFS4_OK, OPEN_DOWNGRADE4resok(open_stateid=st.stateid()))


async def op_close(ctx, args) -> CLOSE4res:
    if ctx.minorversion == 0:
        return await seqid_op(ctx, OPEN_OWNER, args.open_stateid, args.seqid,
                              lambda: _close(ctx, args))
    return await _close(ctx, args)


async def _close(ctx, args) -> CLOSE4res:
    st = _state_for(ctx, args.open_stateid)
    opens = ctx.server.opens
    queued = opens.close(st)
    if queued is not None:
        try:
            await asyncio.wrap_future(queued)
        except StoreError:
            pass                    # logged by the store; the open is gone either way
    if ctx.minorversion >= 1:
        # The returned stateid is useless: RFC 8881 18.2.4 says send the invalid one.
        result = invalid_stateid()
    else:
        st.bump()
        result = st.stateid()
        o = opens.owners.get(OPEN_OWNER, st.clientid, st.owner)
        if o is not None:
            opens.owners.note_closed(o, st.other)
    ctx.current_stateid = result
    return CLOSE4res(NFS4_OK, result)


async def op_open_confirm(ctx, args) -> OPEN_CONFIRM4res:
    """OPEN_CONFIRM (RFC 7530 16.18): the first OPEN of a new 4.0 open-owner is usable
    once confirmed; that confirms the owner for all its later OPENs."""
    return await seqid_op(ctx, OPEN_OWNER, args.open_stateid, args.seqid,
                          lambda: _open_confirm(ctx, args))


async def _open_confirm(ctx, args) -> OPEN_CONFIRM4res:
    st = _state_for(ctx, args.open_stateid, confirmed=False)
    o = ctx.server.opens.owners.get(OPEN_OWNER, st.clientid, st.owner)
    if st.confirmed or o is None or o.confirmed:
        raise NfsError(NFS4ERR_BAD_STATEID, "open-owner already confirmed")
    st.confirmed = True
    o.confirmed = True
    st.bump()
    ctx.current_stateid = st.stateid()
    return OPEN_CONFIRM4res(NFS4_OK, OPEN_CONFIRM4resok(open_stateid=st.stateid()))


async def op_delegreturn(ctx, args) -> DELEGRETURN4res:
    current(ctx)
    resolve_stateid_arg(ctx, args.deleg_stateid)
    # No delegation was ever granted, so no stateid can name one.
    raise NfsError(NFS4ERR_BAD_STATEID, "no delegations are granted")


HANDLERS = {
    OP_OPEN: op_open,
    OP_OPEN_DOWNGRADE: op_open_downgrade,
    OP_CLOSE: op_close,
    OP_DELEGRETURN: op_delegreturn,
    OP_OPEN_CONFIRM: op_open_confirm,
}

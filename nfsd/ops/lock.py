"""LOCK LOCKT LOCKU (RFC 8881 sections 18.10-18.12): advisory POSIX byte-range locks.

Locks live in memory with the open state (nfsd/openstate.py): a server restart loses
them; clients reclaim them during the grace period (nfsd/grace.py), when LOCK without
`reclaim` and LOCKT get NFS4ERR_GRACE. Blocking lock types
(READW_LT/WRITEW_LT) are answered like the plain ones; the client polls.
"""
from __future__ import annotations

from nfsd.errors import NfsError
from nfsd.openstate import (LOCK_READ, LOCK_WRITE, RANGE_END, SHARE_ACCESS_READ,
                            SHARE_ACCESS_WRITE, LockConflict, LockState, OpenState)
from nfsd.ops._common import (clientid_of, current, expire_lapsed_holders, find_state,
                              require_regular, seqid_op, v40_client)
from nfsd.owners import LOCK_OWNER, OPEN_OWNER
from nfsd.xdr.nfs4 import (
    NFS4ERR_BAD_STATEID, NFS4ERR_DENIED, NFS4ERR_INVAL, NFS4ERR_OPENMODE, NFS4_OK, NFS4_UINT64_MAX,
    OP_LOCK, OP_LOCKT, OP_LOCKU, READ_LT,
    READW_LT, WRITE_LT, WRITEW_LT,
    LOCK4denied, LOCK4res, LOCK4resok, LOCKT4res, LOCKU4res, lock_owner4,
)

_KIND = {READ_LT: LOCK_READ, READW_LT: LOCK_READ, WRITE_LT: LOCK_WRITE, WRITEW_LT: LOCK_WRITE}
_LOCKTYPE = {LOCK_READ: READ_LT, LOCK_WRITE: WRITE_LT}


def _range(offset: int, length: int) -> tuple[int, int]:
    """[start, end) of a lock request (RFC 8881 18.10.3: length 0 and ranges past 2**64
    are invalid; a length of all ones means "to the end")."""
    if length == 0:
        raise NfsError(NFS4ERR_INVAL, "zero-length lock")
    if length == NFS4_UINT64_MAX:
        return offset, RANGE_END
    if offset + length > NFS4_UINT64_MAX:
        raise NfsError(NFS4ERR_INVAL, "lock range beyond 2**64")
    return offset, offset + length


def _kind(locktype: int) -> int:
    kind = _KIND.get(locktype)
    if kind is None:
        raise NfsError(NFS4ERR_INVAL, f"locktype {locktype}")
    return kind


def _regular_file(ctx):
    obj = current(ctx)
    require_regular(ctx, obj)
    return obj


def _denied(c: LockConflict) -> LOCK4denied:
    length = NFS4_UINT64_MAX if c.end == RANGE_END else c.end - c.start
    return LOCK4denied(offset=c.start, length=length, locktype=_LOCKTYPE[c.kind],
                       owner=lock_owner4(clientid=c.holder.clientid, owner=c.holder.owner))


def _state(ctx, sid, kind_wanted, obj):
    st = find_state(ctx, sid)
    if not isinstance(st, kind_wanted) or st.ino != obj.ino:
        raise NfsError(NFS4ERR_BAD_STATEID, "not a stateid of that kind for this file")
    return st


async def op_lock(ctx, args) -> LOCK4res:
    if ctx.minorversion >= 1:
        return await _lock(ctx, args)
    # NFSv4.0 (RFC 7530 16.10.5): a new lock-owner's first LOCK is sequenced by its
    # open-owner (open_seqid) and starts the lock-owner at lock_seqid; later LOCKs are
    # sequenced by the lock-owner.
    locker = args.locker
    if locker.tag:
        oto = locker.value

        async def first_lock():
            res = await _lock(ctx, args)
            if res.tag == NFS4_OK:
                opens = ctx.server.opens
                lo = opens.owners.get(LOCK_OWNER, ctx.client.clientid,
                                      bytes(oto.lock_owner.owner), create=True,
                                      in_use=opens.owner_in_use)
                lo.seqid, lo.reply, lo.reply_fh = oto.lock_seqid, res, ctx.current_fh
            return res
        return await seqid_op(ctx, OPEN_OWNER, oto.open_stateid, oto.open_seqid, first_lock)
    elo = locker.value
    return await seqid_op(ctx, LOCK_OWNER, elo.lock_stateid, elo.lock_seqid,
                          lambda: _lock(ctx, args))


async def _lock(ctx, args) -> LOCK4res:
    obj = _regular_file(ctx)
    kind = _kind(args.locktype)
    start, end = _range(args.offset, args.length)
    opens = ctx.server.opens
    locker = args.locker
    if locker.tag:      # new lock-owner: derived from an open stateid
        open_st = _state(ctx, locker.value.open_stateid, OpenState, obj)
        if ctx.minorversion == 0 and locker.value.lock_owner.clientid != open_st.clientid:
            raise NfsError(NFS4ERR_BAD_STATEID, "lock-owner of another client")
    else:
        lk = _state(ctx, locker.value.lock_stateid, LockState, obj)
    # After the stateid (in 4.0 it names the client, ctx.client), before any new state.
    grace = ctx.server.grace
    if args.reclaim:
        grace.check_reclaim(ctx.client)
    else:
        grace.refuse_in_grace("LOCK")
    if locker.tag:
        lk = opens.lock_state(open_st, locker.value.lock_owner.owner)
    # The open must allow the lock's kind (as Linux knfsd: NFS4ERR_OPENMODE).
    need = SHARE_ACCESS_WRITE if kind == LOCK_WRITE else SHARE_ACCESS_READ
    if not lk.access & need:
        raise NfsError(NFS4ERR_OPENMODE, "open does not allow this lock type")
    expire_lapsed_holders(ctx, obj.ino)
    try:
        opens.lock(lk, start, end, kind)
    except LockConflict as c:
        return LOCK4res(NFS4ERR_DENIED, _denied(c))
    if args.reclaim:
        await grace.reclaimed(ctx.client)
    ctx.current_stateid = lk.stateid()
    return LOCK4res(NFS4_OK, LOCK4resok(lock_stateid=lk.stateid()))


async def op_lockt(ctx, args) -> LOCKT4res:
    obj = _regular_file(ctx)
    ctx.server.grace.refuse_in_grace("LOCKT")     # reclaimed locks may still be missing
    kind = _kind(args.locktype)
    start, end = _range(args.offset, args.length)
    if ctx.minorversion == 0:
        v40_client(ctx, args.owner.clientid)     # renews the lease (RFC 7530 16.11)
    clientid = clientid_of(ctx)
    c = ctx.server.opens.conflict(obj.ino, clientid, bytes(args.owner.owner), start, end, kind)
    if c is not None:
        return LOCKT4res(NFS4ERR_DENIED, _denied(c))
    return LOCKT4res(NFS4_OK)


async def op_locku(ctx, args) -> LOCKU4res:
    if ctx.minorversion == 0:
        return await seqid_op(ctx, LOCK_OWNER, args.lock_stateid, args.seqid,
                              lambda: _locku(ctx, args))
    return await _locku(ctx, args)


async def _locku(ctx, args) -> LOCKU4res:
    obj = _regular_file(ctx)
    _kind(args.locktype)
    start, end = _range(args.offset, args.length)
    lk = _state(ctx, args.lock_stateid, LockState, obj)
    ctx.server.opens.unlock(lk, start, end)
    ctx.current_stateid = lk.stateid()
    return LOCKU4res(NFS4_OK, lk.stateid())


HANDLERS = {OP_LOCK: op_lock, OP_LOCKT: op_lockt, OP_LOCKU: op_locku}

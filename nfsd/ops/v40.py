"""The NFSv4.0-only client ops: SETCLIENTID, SETCLIENTID_CONFIRM, RENEW, RELEASE_LOCKOWNER
(RFC 7530 sections 16.33, 16.34, 16.29, 16.37). OPEN_CONFIRM is with OPEN (ops/open.py).

A 4.0 client record is a `nfsd.state.Client` with minorversion 0 and no sessions; its
lease is renewed by RENEW and by every op that names it by clientid or stateid
(`_common.v40_client`, `_common.find_state`). The client-id cases of RFC 7530 16.33.5:

1. no record for the id string: a new unconfirmed record;
2. a confirmed record, same verifier and principal: a callback update, kept on the
   confirmed record until SETCLIENTID_CONFIRM (same clientid, new confirm verifier);
3. a confirmed record, another verifier: the client rebooted; a new unconfirmed record
   with a new clientid; confirming it drops the old record and all its state;
4. only an unconfirmed record: it is replaced by a new one;
and a confirmed record of another principal whose lease is alive: NFS4ERR_CLID_INUSE.
"""
from __future__ import annotations

import os

import structlog

from nfsd.errors import NfsError
from nfsd.ops._common import v40_client
from nfsd.ops.session import ensure_room_for_client, principal_of
from nfsd.xdr.nfs4 import (
    NFS4_OK, NFS4ERR_CLID_INUSE, NFS4ERR_STALE_CLIENTID, OP_RELEASE_LOCKOWNER, OP_RENEW,
    OP_SETCLIENTID, OP_SETCLIENTID_CONFIRM, RELEASE_LOCKOWNER4res, RENEW4res, SETCLIENTID4res,
    SETCLIENTID4resok, SETCLIENTID_CONFIRM4res, netaddr4,
)

log = structlog.get_logger(__name__)


def _v40_records(mgr, owner: bytes):
    records = [c for c in mgr.records_of(owner) if c.minorversion == 0]
    conf = next((c for c in records if c.confirmed), None)
    unconf = next((c for c in records if not c.confirmed), None)
    return conf, unconf


async def op_setclientid(ctx, args) -> SETCLIENTID4res:
    mgr = ctx.server.sessions
    owner = bytes(args.client.id)
    verifier = bytes(args.client.verifier)
    principal = principal_of(ctx.cred)
    conf, unconf = _v40_records(mgr, owner)
    if conf is not None and conf.principal != principal:
        if ctx.server.opens.has_state(conf):
            log.info("setclientid_in_use", client=conf.name, principal=principal)
            return SETCLIENTID4res(NFS4ERR_CLID_INUSE,
                                   netaddr4(na_r_netid=b"tcp", na_r_addr=b""))
        # Without state nothing is at stake: as a reboot, confirming drops the old record.
        conf.pending_update = None
        conf = None if conf.verifier == verifier else conf
    if unconf is not None:                                                    # case 4
        mgr.remove_client(unconf, "replaced by a new SETCLIENTID")
    confirm = os.urandom(8)
    if conf is not None and conf.verifier == verifier:                        # case 2
        conf.pending_update = (confirm, args.callback)
        conf.renew()
        return SETCLIENTID4res(NFS4_OK, SETCLIENTID4resok(conf.clientid, confirm))
    if conf is not None:                                                      # case 3
        conf.pending_update = None
    ensure_room_for_client(mgr)                                               # case 1
    client = mgr.new_client(owner, verifier, principal, 0, ctx.peer)
    client.confirm_verifier = confirm
    client.callback = args.callback
    log.info("client_new", client=client.name, minorversion=0,
             peer=ctx.peer[0] if ctx.peer else None, owner=owner[:64].decode("utf-8", "replace"))
    return SETCLIENTID4res(NFS4_OK, SETCLIENTID4resok(client.clientid, confirm))


async def op_setclientid_confirm(ctx, args) -> SETCLIENTID_CONFIRM4res:
    mgr = ctx.server.sessions
    confirm = bytes(args.setclientid_confirm)
    client = mgr.clients.get(args.clientid)
    if client is None or client.expired or client.minorversion != 0:
        raise NfsError(NFS4ERR_STALE_CLIENTID, f"clientid {args.clientid:#x}")
    if client.principal != principal_of(ctx.cred):
        raise NfsError(NFS4ERR_CLID_INUSE, "confirmed by another principal")
    if client.confirmed:
        pending = client.pending_update
        if pending is not None and pending[0] == confirm:                     # case 2
            client.confirm_verifier, client.callback = pending
            client.pending_update = None
        elif client.confirm_verifier != confirm:
            raise NfsError(NFS4ERR_STALE_CLIENTID, "wrong confirm verifier")
        # else: a retransmission of the confirm that succeeded
    else:
        if client.confirm_verifier != confirm:
            raise NfsError(NFS4ERR_STALE_CLIENTID, "wrong confirm verifier")
        old, _ = _v40_records(mgr, client.owner)
        if old is not None:                                                   # case 3
            mgr.remove_client(old, "client rebooted")
        client.confirmed = True
        log.info("client_confirmed", client=client.name, minorversion=0)
    client.renew()
    return SETCLIENTID_CONFIRM4res(NFS4_OK)


async def op_renew(ctx, args) -> RENEW4res:
    v40_client(ctx, args.clientid)
    return RENEW4res(NFS4_OK)


async def op_release_lockowner(ctx, args) -> RELEASE_LOCKOWNER4res:
    lo = args.lock_owner
    client = v40_client(ctx, lo.clientid)
    opens = ctx.server.opens
    owner = bytes(lo.owner)
    opens.release_lock_owner(client.clientid, owner)
    record = opens.owners.get("lock", client.clientid, owner)
    if record is not None:
        opens.owners.remove(record)
    return RELEASE_LOCKOWNER4res(NFS4_OK)


HANDLERS = {
    OP_SETCLIENTID: op_setclientid,
    OP_SETCLIENTID_CONFIRM: op_setclientid_confirm,
    OP_RENEW: op_renew,
    OP_RELEASE_LOCKOWNER: op_release_lockowner,
}

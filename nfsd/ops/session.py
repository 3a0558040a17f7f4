"""NFSv4.1 client and session operations (RFC 8881 sections 18.34-18.37, 18.46, 18.50, 18.51).

EXCHANGE_ID, CREATE_SESSION, DESTROY_SESSION, DESTROY_CLIENTID, SEQUENCE,
BIND_CONN_TO_SESSION, BACKCHANNEL_CTL, RECLAIM_COMPLETE. The bookkeeping objects live in
nfsd/state.py; SEQUENCE's slot/replay logic is driven by the COMPOUND loop
(nfsd/compound.py), which calls `sequence()` here. We offer SP4_NONE only and no pNFS.
A back channel the client asks for (CREATE_SESSION's CONN_BACK_CHAN flag, a back
direction in BIND_CONN_TO_SESSION) is probed with CB_NULL (nfsd/callback.py) and its
state reported in every SEQUENCE reply's sr_status_flags; no delegation is granted.
"""
from __future__ import annotations

from dataclasses import dataclass

import structlog

from nfsd.callback import BackChannel
from nfsd.errors import NfsError
from nfsd.ops._common import store_errors
from nfsd.state import ChannelAttrs, Client, Session, Slot, next_seqid
from nfsd.xdr.nfs4 import (
    AUTH_NONE, AUTH_SYS,
    BACKCHANNEL_CTL4res, BIND_CONN_TO_SESSION4res, BIND_CONN_TO_SESSION4resok, CDFC4_BACK, CDFC4_BACK_OR_BOTH,
    CDFC4_FORE, CDFC4_FORE_OR_BOTH, CDFS4_BACK, CDFS4_BOTH, CDFS4_FORE,
    CREATE_SESSION4_FLAG_CONN_BACK_CHAN, CREATE_SESSION4_FLAG_CONN_RDMA,
    CREATE_SESSION4_FLAG_PERSIST, NFS4ERR_NOSPC, CREATE_SESSION4res, CREATE_SESSION4resok,
    DESTROY_CLIENTID4res, DESTROY_SESSION4res, EXCHANGE_ID4res, EXCHANGE_ID4resok,
    EXCHGID4_FLAG_BIND_PRINC_STATEID, EXCHGID4_FLAG_CONFIRMED_R, EXCHGID4_FLAG_SUPP_MOVED_MIGR,
    EXCHGID4_FLAG_SUPP_MOVED_REFER,
    EXCHGID4_FLAG_UPD_CONFIRMED_REC_A,
    EXCHGID4_FLAG_USE_NON_PNFS, EXCHGID4_FLAG_USE_PNFS_DS, EXCHGID4_FLAG_USE_PNFS_MDS,
    NFS4_OK, NFS4ERR_BADSESSION, NFS4ERR_BADSLOT, NFS4ERR_CLID_INUSE,
    NFS4ERR_CLIENTID_BUSY, NFS4ERR_COMPLETE_ALREADY, NFS4ERR_DELAY, NFS4ERR_INVAL,
    NFS4ERR_NOENT, NFS4ERR_NOT_ONLY_OP, NFS4ERR_NOT_SAME, NFS4ERR_NOTSUPP, NFS4ERR_PERM,
    NFS4ERR_RESOURCE, NFS4ERR_SEQ_FALSE_RETRY, NFS4ERR_SEQ_MISORDERED, NFS4ERR_STALE_CLIENTID,
    NFS4ERR_TOOSMALL,
    NFS4ERR_TOO_MANY_OPS, NFS4ERR_REQ_TOO_BIG,
    NFS4ERR_ENCR_ALG_UNSUPP, OP_BACKCHANNEL_CTL, OP_BIND_CONN_TO_SESSION, OP_CREATE_SESSION, OP_DESTROY_CLIENTID, OP_DESTROY_SESSION,
    OP_EXCHANGE_ID, OP_RECLAIM_COMPLETE, RECLAIM_COMPLETE4res, SEQ4_STATUS_CB_PATH_DOWN,
    SEQ4_STATUS_CB_PATH_DOWN_SESSION, SEQ4_STATUS_EXPIRED_ALL_STATE_REVOKED,
    SEQ4_STATUS_RESTART_RECLAIM_NEEDED, SEQUENCE4res,
    SEQUENCE4resok, SP4_NONE, channel_attrs4, nfs_impl_id4, nfstime4, server_owner4,
    state_protect4_r,
)

log = structlog.get_logger(__name__)

# Flags a client may send in eia_flags (RFC 5661 18.35.3); anything else is NFS4ERR_INVAL.
# SUPP_FENCE_OPS (0x4, added by RFC 8881 for migration, which we do not offer) is left
# out as Linux knfsd does, so it is refused in every minor version (pynfs EID4 sends it
# as "an undefined bit"; no Linux client sets it).
EXCHGID4_FLAG_MASK_A = (EXCHGID4_FLAG_SUPP_MOVED_REFER | EXCHGID4_FLAG_SUPP_MOVED_MIGR
                        | EXCHGID4_FLAG_BIND_PRINC_STATEID | EXCHGID4_FLAG_USE_NON_PNFS
                        | EXCHGID4_FLAG_USE_PNFS_MDS | EXCHGID4_FLAG_USE_PNFS_DS
                        | EXCHGID4_FLAG_UPD_CONFIRMED_REC_A)

# Our fore channel limits: a 1 MiB READ/WRITE plus generous room for the other ops of
# the COMPOUND and its headers. The RPC record limit (nfsd/rpc.py) is above this.
MAX_IO_SIZE = 1024 * 1024
MAX_REQUEST_SIZE = MAX_IO_SIZE + 64 * 1024
MAX_RESPONSE_SIZE = MAX_IO_SIZE + 64 * 1024
MAX_OPERATIONS = 256
MAX_SLOTS = 64
# Replies up to this size are kept in the slot whatever sa_cachethis says, so a
# retransmission is answered exactly (READ data and big READDIRs are usually bigger;
# their retries get NFS4ERR_RETRY_UNCACHED_REP and are simply sent again): up to the
# slot's reservation (slot_bytes) always, above it while the shared extra pool lasts
# (nfsd/state.py DRC_EXTRA_BUDGET).
REPLY_CACHE_LIMIT = 16 * 1024
# A slot's reservation is at least this (Linux knfsd's NFSD_SLOT_CACHE_SIZE): the
# replies of the common ops (WRITE, COMMIT, GETATTR, OPEN, CLOSE) are smaller.
MIN_SLOT_BYTES = 2048
# The most ca_maxresponsesize_cached we grant, so the most a slot reserves: what
# sa_cachethis can make a slot hold. The Linux client asks 7584 (the biggest OPEN reply it
# can decode; seen in the kclient guest), nfs-rs 4096; knfsd grants at most 2128, and
# cachethis replies above the grant get NFS4ERR_REP_TOO_BIG_TO_CACHE. OPEN replies are
# well under 1 KiB here.
MAX_CACHED_REPLY = 4096
# Below this no COMPOUND with a SEQUENCE (or CB_SEQUENCE), RPC header and credential
# included, fits: NFS4ERR_TOOSMALL (RFC 8881 18.36.3).
MIN_REQUEST_SIZE = 256
CREATE_SESSION4_FLAG_MASK = (CREATE_SESSION4_FLAG_PERSIST | CREATE_SESSION4_FLAG_CONN_BACK_CHAN
                             | CREATE_SESSION4_FLAG_CONN_RDMA)
# One client needs one session (two while it replaces one); more is a client in a loop.
MAX_SESSIONS_PER_CLIENT = 16
# A new session gets at most this fraction (1/N) of the reply-cache slots still free, so
# the first clients to mount cannot take them all (Linux knfsd takes 1/8 too).
SLOT_SHARE = 8

SERVER_IMPL = nfs_impl_id4(nii_domain=b"ckptgw.invalid", nii_name=b"ckptgw nfsd",
                           nii_date=nfstime4(seconds=0, nseconds=0))


def principal_of(cred) -> tuple:
    """Who is asking, for the client-record rules of EXCHANGE_ID (RFC 8881 2.4.3)."""
    return (cred.flavor, cred.uid)


# ---- EXCHANGE_ID (RFC 8881 18.35) -------------------------------------------------

async def op_exchange_id(ctx, args) -> EXCHANGE_ID4res:
    mgr = ctx.server.sessions
    flags = args.eia_flags
    if flags & ~EXCHGID4_FLAG_MASK_A:
        raise NfsError(NFS4ERR_INVAL, f"eia_flags {flags:#x}")
    if args.eia_state_protect.tag != SP4_NONE:
        # SP4_MACH_CRED / SP4_SSV need RPCSEC_GSS, which we do not offer.
        raise NfsError(NFS4ERR_NOTSUPP, "state protection other than SP4_NONE")
    owner = bytes(args.eia_clientowner.co_ownerid)
    verifier = bytes(args.eia_clientowner.co_verifier)
    principal = principal_of(ctx.cred)
    update = bool(flags & EXCHGID4_FLAG_UPD_CONFIRMED_REC_A)

    conf = mgr.find_by_owner(owner, confirmed=True)
    client: Client | None = None
    if conf is not None:
        same_principal = conf.principal == principal
        same_verifier = conf.verifier == verifier
        if update:
            if not same_verifier:
                raise NfsError(NFS4ERR_NOT_SAME, "update with another verifier")   # case 8
            if not same_principal:
                raise NfsError(NFS4ERR_PERM, "update by another principal")          # case 9
            client = conf                                                           # case 6
        elif not same_principal:                                                    # case 3
            if conf.sessions:
                raise NfsError(NFS4ERR_CLID_INUSE, "owner in use by another principal")
            mgr.remove_client(conf, "owner taken over by another principal")
        elif same_verifier:
            client = conf                                                           # case 2
        # else case 5: the client rebooted; the old record goes when the new one is
        # confirmed by CREATE_SESSION.
    elif update:
        raise NfsError(NFS4ERR_NOENT, "update of an unknown client")                # case 7
    if client is None:
        unconf = mgr.find_by_owner(owner, confirmed=False)
        if unconf is not None:                                                      # case 4
            mgr.remove_client(unconf, "replaced by a new EXCHANGE_ID")
        ensure_room_for_client(mgr)
        client = mgr.new_client(owner, verifier, principal, ctx.minorversion, ctx.peer)
        log.info("client_new", client=client.name, peer=ctx.peer[0] if ctx.peer else None,
                 owner=owner[:64].decode("utf-8", "replace"))
    client.renew()
    out_flags = EXCHGID4_FLAG_USE_NON_PNFS
    if client.confirmed:
        out_flags |= EXCHGID4_FLAG_CONFIRMED_R
    server = ctx.server
    return EXCHANGE_ID4res(NFS4_OK, EXCHANGE_ID4resok(
        eir_clientid=client.clientid,
        eir_sequenceid=next_seqid(client.cs_seqid),
        eir_flags=out_flags,
        eir_state_protect=state_protect4_r(SP4_NONE),
        eir_server_owner=server4_owner(server),
        eir_server_scope=server.server_scope,
        eir_server_impl_id=[SERVER_IMPL],
    ))


def ensure_room_for_client(mgr) -> None:
    """Client records are bounded: expire idle ones, else NFS4ERR_RESOURCE."""
    if len(mgr.clients) >= mgr.max_clients:
        mgr.expire_idle()
        if len(mgr.clients) >= mgr.max_clients:
            raise NfsError(NFS4ERR_RESOURCE, "too many clients")


def server4_owner(server) -> server_owner4:
    # One server instance = one owner: trunking detection (RFC 8881 2.10.5) sees all
    # our addresses as the same server with the same state.
    return server_owner4(so_minor_id=0, so_major_id=server.server_owner)


# ---- CREATE_SESSION (RFC 8881 18.36) -----------------------------------------------

def slot_bytes(attrs) -> int:
    """The reply-cache bytes reserved per slot of a session asking for fore channel `attrs`:
    the cached-reply size it is granted (what sa_cachethis can make a slot hold), at least
    MIN_SLOT_BYTES."""
    return max(MIN_SLOT_BYTES, min(attrs.ca_maxresponsesize_cached, MAX_CACHED_REPLY))


def slots_offered(mgr, client, nbytes: int) -> int:
    """Reply-cache slots of `nbytes` a new session of `client` may have. Up to 1/SLOT_SHARE
    of the free budget; once it is spent, still one for a client's only session (as Linux
    knfsd), so mount number N+1 works, with one request in flight, instead of failing. That
    overdraft is bounded by the client records: one slot each, at most max_clients."""
    free = mgr.slots_free(nbytes)
    if free >= 1:
        return max(1, free // SLOT_SHARE)
    return 0 if client.sessions else 1


def negotiate_fore(attrs, slots_free: int) -> ChannelAttrs:
    if attrs.ca_maxrequestsize < MIN_REQUEST_SIZE or attrs.ca_maxresponsesize < MIN_REQUEST_SIZE:
        raise NfsError(NFS4ERR_TOOSMALL, "fore channel sizes too small")
    if attrs.ca_maxrequests == 0:
        raise NfsError(NFS4ERR_INVAL, "zero slots")
    if slots_free < 1:
        raise NfsError(NFS4ERR_NOSPC, "reply cache memory spent")
    return ChannelAttrs(
        headerpadsize=0,
        maxrequestsize=min(attrs.ca_maxrequestsize, MAX_REQUEST_SIZE),
        maxresponsesize=min(attrs.ca_maxresponsesize, MAX_RESPONSE_SIZE),
        maxresponsesize_cached=min(attrs.ca_maxresponsesize_cached, MAX_CACHED_REPLY),
        # The Linux client refuses fewer operations than it asked for.
        maxoperations=min(attrs.ca_maxoperations, MAX_OPERATIONS) or MAX_OPERATIONS,
        maxrequests=min(attrs.ca_maxrequests, MAX_SLOTS, slots_free),
    )


def accept_back(attrs) -> ChannelAttrs:
    # We never call back, so whatever the client can take is fine as long as a
    # CB_SEQUENCE could fit: echo it (the Linux client checks the reply against what it sent).
    if attrs.ca_maxrequestsize < MIN_REQUEST_SIZE or attrs.ca_maxresponsesize < MIN_REQUEST_SIZE:
        raise NfsError(NFS4ERR_TOOSMALL, "back channel sizes too small")
    if attrs.ca_maxrequests == 0:
        raise NfsError(NFS4ERR_TOOSMALL, "back channel without slots")
    return ChannelAttrs(0, attrs.ca_maxrequestsize, attrs.ca_maxresponsesize,
                        attrs.ca_maxresponsesize_cached, attrs.ca_maxoperations,
                        attrs.ca_maxrequests)


def channel_attrs_xdr(ca: ChannelAttrs) -> channel_attrs4:
    return channel_attrs4(
        ca_headerpadsize=ca.headerpadsize, ca_maxrequestsize=ca.maxrequestsize,
        ca_maxresponsesize=ca.maxresponsesize, ca_maxresponsesize_cached=ca.maxresponsesize_cached,
        ca_maxoperations=ca.maxoperations, ca_maxrequests=ca.maxrequests, ca_rdma_ird=[])


async def op_create_session(ctx, args) -> CREATE_SESSION4res:
    mgr = ctx.server.sessions
    client = mgr.clients.get(args.csa_clientid)
    if client is None or client.expired:
        raise NfsError(NFS4ERR_STALE_CLIENTID, f"clientid {args.csa_clientid:#x}")
    if not client.confirmed and mgr.lapsed(client):
        # An unconfirmed record past its lease is gone now, not at the reaper's next round
        # (up to 10 s later): RFC 8881 18.35.4 lets the server drop it after a lease.
        mgr.expire(client, "unconfirmed record past its lease")
        raise NfsError(NFS4ERR_STALE_CLIENTID,
                       f"clientid {args.csa_clientid:#x}: unconfirmed past its lease")
    # CREATE_SESSION has its own one-slot replay cache per client (18.36.4).
    if args.csa_sequence == client.cs_seqid and client.cs_reply is not None:
        log.info("create_session_replay", client=client.name)
        return client.cs_reply
    if args.csa_sequence != next_seqid(client.cs_seqid):
        raise NfsError(NFS4ERR_SEQ_MISORDERED,
                       f"csa_sequence {args.csa_sequence}, expected {next_seqid(client.cs_seqid)}")
    # Errors past the sequence check leave it where it was and are not cached (as Linux
    # knfsd): the client corrects its arguments and sends the same csa_sequence again.
    if not client.confirmed and client.principal != principal_of(ctx.cred):
        # RFC 8881 18.36.4: only the principal that made the record may confirm it.
        raise NfsError(NFS4ERR_CLID_INUSE, "CREATE_SESSION by another principal")
    if args.csa_flags & ~CREATE_SESSION4_FLAG_MASK:
        raise NfsError(NFS4ERR_INVAL, f"csa_flags {args.csa_flags:#x}")
    if len(client.sessions) >= MAX_SESSIONS_PER_CLIENT:
        raise NfsError(NFS4ERR_NOSPC, f"client has {len(client.sessions)} sessions")
    nbytes = slot_bytes(args.csa_fore_chan_attrs)
    fore = negotiate_fore(args.csa_fore_chan_attrs, slots_offered(mgr, client, nbytes))
    back = accept_back(args.csa_back_chan_attrs)
    if not client.confirmed:
        # Confirming a rebooted client's new record releases the old one (18.35.4 case 5).
        old = mgr.find_by_owner(client.owner, confirmed=True)
        if old is not None and old is not client:
            mgr.remove_client(old, "client rebooted")
        client.confirmed = True
    flags = args.csa_flags & CREATE_SESSION4_FLAG_CONN_BACK_CHAN   # no persistence, no RDMA
    session = mgr.new_session(client, flags, fore, back, args.csa_cb_program, slot_bytes=nbytes)
    mgr.bind_connection(session, ctx.conn)
    session.backchannel = BackChannel(session, args.csa_cb_program, args.csa_sec_parms,
                                      back.maxrequests)
    if flags & CREATE_SESSION4_FLAG_CONN_BACK_CHAN:
        want_backchannel(session, ctx.conn)
    client.renew()
    res = CREATE_SESSION4res(NFS4_OK, CREATE_SESSION4resok(
        csr_sessionid=session.sessionid, csr_sequence=args.csa_sequence, csr_flags=flags,
        csr_fore_chan_attrs=channel_attrs_xdr(fore), csr_back_chan_attrs=channel_attrs_xdr(back)))
    client.cs_seqid = args.csa_sequence
    client.cs_reply = res
    log.info("session_created", client=client.name, session=session.sessionid.hex(),
             slots=fore.maxrequests, slot_bytes=nbytes, maxrequestsize=fore.maxrequestsize,
             back_channel=bool(flags))
    return res


# ---- DESTROY_SESSION / DESTROY_CLIENTID (18.37, 18.50) --------------------------

async def op_destroy_session(ctx, args) -> DESTROY_SESSION4res:
    mgr = ctx.server.sessions
    session = mgr.sessions.get(bytes(args.dsa_sessionid))
    if session is None:
        raise NfsError(NFS4ERR_BADSESSION)
    if ctx.session is session and not ctx.extra.get("last_op", False):
        # Destroying the session this COMPOUND runs in must be its last op.
        raise NfsError(NFS4ERR_NOT_ONLY_OP, "DESTROY_SESSION of the current session not last")
    if session is not ctx.session and session.in_flight():
        raise NfsError(NFS4ERR_DELAY, "session has requests in progress")
    mgr.destroy_session(session)
    session.client.renew()
    return DESTROY_SESSION4res(NFS4_OK)


async def op_destroy_clientid(ctx, args) -> DESTROY_CLIENTID4res:
    mgr = ctx.server.sessions
    client = mgr.clients.get(args.dca_clientid)
    if client is None or client.expired:
        raise NfsError(NFS4ERR_STALE_CLIENTID)
    if client.sessions:
        raise NfsError(NFS4ERR_CLIENTID_BUSY, "client still has sessions")
    # RFC 8881 18.50.3: opens and locks keep the client busy too.
    if ctx.server.opens.has_state(client):
        raise NfsError(NFS4ERR_CLIENTID_BUSY, "client still holds opens or locks")
    mgr.remove_client(client, "DESTROY_CLIENTID")
    return DESTROY_CLIENTID4res(NFS4_OK)


# ---- BIND_CONN_TO_SESSION (18.34) -----------------------------------------------

_BIND_DIRECTION = {CDFC4_FORE: CDFS4_FORE, CDFC4_BACK: CDFS4_BACK,
                   CDFC4_FORE_OR_BOTH: CDFS4_BOTH, CDFC4_BACK_OR_BOTH: CDFS4_BOTH}


async def op_bind_conn_to_session(ctx, args) -> BIND_CONN_TO_SESSION4res:
    mgr = ctx.server.sessions
    session = mgr.sessions.get(bytes(args.bctsa_sessid))
    if session is None:
        raise NfsError(NFS4ERR_BADSESSION)
    direction = _BIND_DIRECTION.get(args.bctsa_dir)
    if direction is None:
        raise NfsError(NFS4ERR_INVAL, f"bctsa_dir {args.bctsa_dir}")
    mgr.bind_connection(session, ctx.conn)
    if direction != CDFS4_FORE:
        want_backchannel(session, ctx.conn)
    session.client.renew()
    return BIND_CONN_TO_SESSION4res(NFS4_OK, BIND_CONN_TO_SESSION4resok(
        bctsr_sessid=session.sessionid, bctsr_dir=direction, bctsr_use_conn_in_rdma_mode=False))


def want_backchannel(session: Session, conn) -> None:
    """`conn` carries the session's back channel from now on: check it with CB_NULL."""
    bc = session.backchannel
    bc.wanted = True
    if conn is not None:
        bc.add_connection(conn)
        bc.probe()


# ---- BACKCHANNEL_CTL (18.33) -----------------------------------------------------

async def op_backchannel_ctl(ctx, args) -> BACKCHANNEL_CTL4res:
    bc = ctx.session.backchannel
    if not any(p.tag in (AUTH_NONE, AUTH_SYS) for p in args.bca_sec_parms):
        # As Linux knfsd: RPCSEC_GSS alone cannot be honoured, and RFC 8881 has no
        # better error for it.
        raise NfsError(NFS4ERR_ENCR_ALG_UNSUPP, "no callback flavour but RPCSEC_GSS")
    bc.set_security(args.bca_cb_program, args.bca_sec_parms)
    if bc.wanted:
        bc.probe()                  # the new program or credential may work, or not
    return BACKCHANNEL_CTL4res(NFS4_OK)


# ---- RECLAIM_COMPLETE (18.51) ----------------------------------------------------

async def op_reclaim_complete(ctx, args) -> RECLAIM_COMPLETE4res:
    # The first global RECLAIM_COMPLETE records the client (it may get state from now
    # on, nfsd/grace.py) and may end the grace period; a second is an error.
    if args.rca_one_fs:
        return RECLAIM_COMPLETE4res(NFS4_OK)
    client = ctx.client
    if client.reclaim_complete:
        raise NfsError(NFS4ERR_COMPLETE_ALREADY)
    with store_errors():
        await ctx.server.grace.reclaim_complete(client)
    client.reclaim_complete = True
    return RECLAIM_COMPLETE4res(NFS4_OK)


# ---- SEQUENCE (18.46, slot semantics 2.10.6) -------------------------------------

@dataclass(slots=True)
class SequenceOutcome:
    """What the COMPOUND loop must do after SEQUENCE."""
    result: SEQUENCE4res
    slot: Slot | None = None          # a new request on this slot: cache its reply
    replay: bytes | None = None       # a retransmission: send these cached bytes
    uncached_retry: bool = False      # a retransmission whose reply was not kept


def sequence(ctx, args, request_size: int, nops: int, signature: tuple = ()) -> SequenceOutcome:
    mgr = ctx.server.sessions
    session: Session | None = mgr.sessions.get(bytes(args.sa_sessionid))
    if session is None:
        raise NfsError(NFS4ERR_BADSESSION)
    if args.sa_slotid >= len(session.slots):
        raise NfsError(NFS4ERR_BADSLOT, f"slot {args.sa_slotid} of {len(session.slots)}")
    slot = session.slots[args.sa_slotid]
    client = session.client
    if args.sa_sequenceid == slot.seqid and slot.used:
        # A retransmission (2.10.6.1.3); the original may still be running.
        if slot.in_progress:
            raise NfsError(NFS4ERR_DELAY, "retry while the original is in progress")
        if signature != slot.signature and slot.cached:
            # Same slot and seqid but another request: a client bug (2.10.6.1.3.1). Only a
            # cached reply can tell: an uncached one is answered RETRY_UNCACHED_REP below,
            # as Linux knfsd does ("if we didn't cache the reply we can't check the args").
            raise NfsError(NFS4ERR_SEQ_FALSE_RETRY,
                           f"slot {args.sa_slotid} seqid {args.sa_sequenceid}")
        ctx.session, ctx.client = session, client
        client.renew()
        result = _sequence_ok(mgr, session, args)
        if slot.cached and slot.reply is not None:
            return SequenceOutcome(result, replay=slot.reply)
        return SequenceOutcome(result, uncached_retry=True)
    if args.sa_sequenceid != next_seqid(slot.seqid):
        raise NfsError(NFS4ERR_SEQ_MISORDERED,
                       f"slot {args.sa_slotid} seqid {args.sa_sequenceid}, last {slot.seqid}")
    if nops > session.fore.maxoperations:
        raise NfsError(NFS4ERR_TOO_MANY_OPS, f"{nops} ops")
    if request_size > session.fore.maxrequestsize:
        raise NfsError(NFS4ERR_REQ_TOO_BIG, f"{request_size} bytes")
    slot.seqid = args.sa_sequenceid
    slot.used = True
    slot.signature = signature
    mgr.forget_reply(slot)
    slot.in_progress = True
    # A SEQUENCE on an unbound connection binds it (SP4_NONE, 2.10.3.1).
    if ctx.conn is not None and ctx.conn not in session.connections:
        mgr.bind_connection(session, ctx.conn)
    ctx.session, ctx.client = session, client
    client.renew()
    result = _sequence_ok(mgr, session, args)
    # EXPIRED_ALL_STATE_REVOKED is told once: the client re-establishes its state (the
    # revoked stateids are gone, so no FREE_STATEID could acknowledge them).
    client.revoked_flags &= ~SEQ4_STATUS_EXPIRED_ALL_STATE_REVOKED
    return SequenceOutcome(result, slot=slot)


def _sequence_ok(mgr, session: Session, args) -> SEQUENCE4res:
    return SEQUENCE4res(NFS4_OK, SEQUENCE4resok(
        sr_sessionid=session.sessionid, sr_sequenceid=args.sa_sequenceid,
        sr_slotid=args.sa_slotid, sr_highest_slotid=session.highest_slotid,
        sr_target_highest_slotid=session.highest_slotid,
        sr_status_flags=status_flags(mgr, session)))


def status_flags(mgr, session: Session) -> int:
    """sr_status_flags (RFC 8881 18.46.3). Never set here: CB_GSS_CONTEXTS_EXPIRING/
    EXPIRED (no RPCSEC_GSS), LEASE_MOVED (no migration), BACKCHANNEL_FAULT, DEVID_*
    (no pNFS). The lease needs no flag: this very request renewed it."""
    client = session.client
    flags = client.revoked_flags       # *_STATE_REVOKED: state taken from this client
    if _back_down(session):
        flags |= SEQ4_STATUS_CB_PATH_DOWN_SESSION
        if all(_back_down(s) for s in client.sessions.values()
               if s.backchannel is not None and s.backchannel.wanted):
            flags |= SEQ4_STATUS_CB_PATH_DOWN
    if not client.reclaim_complete and mgr.reclaim_needed(client):
        flags |= SEQ4_STATUS_RESTART_RECLAIM_NEEDED
    return flags


def _back_down(session: Session) -> bool:
    bc = session.backchannel
    return bc is not None and bc.wanted and bc.path_down


def store_reply(mgr, session, slot: Slot, out: bytearray, start: int, cachethis: bool,
                out_of_line: bool = False) -> None:
    """Keep a finished request's reply (out[start:], the encoded COMPOUND4res) in its
    slot (2.10.6.1): within the slot's reservation always, up to REPLY_CACHE_LIMIT while
    the shared extra pool lasts. Others (READ data) are not copied, only remembered as
    uncached: a retry of one gets NFS4ERR_RETRY_UNCACHED_REP. out_of_line: READ data
    follows `out` (compound.OUT_OF_LINE_MIN, over REPLY_CACHE_LIMIT): never kept."""
    size = len(out) - start
    if (out_of_line or size > REPLY_CACHE_LIMIT
            or not mgr.keep_reply(session, slot, bytes(out[start:]))):
        mgr.forget_reply(slot)
        if cachethis:       # cannot happen: such a reply is held to the session's cached size
            log.warning("reply_too_big_to_cache", size=size)
    slot.in_progress = False


HANDLERS = {
    OP_EXCHANGE_ID: op_exchange_id,
    OP_CREATE_SESSION: op_create_session,
    OP_DESTROY_SESSION: op_destroy_session,
    OP_DESTROY_CLIENTID: op_destroy_clientid,
    OP_BIND_CONN_TO_SESSION: op_bind_conn_to_session,
    OP_BACKCHANNEL_CTL: op_backchannel_ctl,
    OP_RECLAIM_COMPLETE: op_reclaim_complete,
}

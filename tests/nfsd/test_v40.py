"""NFSv4.0 (RFC 7530) through the project's client: client ids (SETCLIENTID and
SETCLIENTID_CONFIRM, every case of 16.33.5), RENEW and leases, open-owner and
lock-owner seqids with replay, OPEN_CONFIRM, RELEASE_LOCKOWNER, and the 4.0 stateid
rules of READ/WRITE/LOCK."""
from __future__ import annotations

import dataclasses
import os

import pytest

from nfsd.xdr.nfs4 import *  # noqa: F403
from testkit.nfsclient import DEFAULT_CRED, NfsClient, check, op, status_of

pytestmark = pytest.mark.timeout(60)

V40 = dict(minorversion=0)


def put(fh):
    return op(OP_PUTFH, PUTFH4args(fh))


def open_args(c, name, seqid, *, owner=None, create=True, access=OPEN4_SHARE_ACCESS_BOTH):
    how = (openflag4(OPEN4_CREATE, createhow4(UNCHECKED4, fattr4([], b""))) if create
           else openflag4(OPEN4_NOCREATE))
    return OPEN4args(seqid=seqid, share_access=access, share_deny=OPEN4_SHARE_DENY_NONE,
                     owner=open_owner4(c.clientid, owner or b"oo-" + os.urandom(4)),
                     openhow=how, claim=open_claim4(CLAIM_NULL, name))


async def renew(c, clientid=None) -> int:
    res = await c.compound([op(OP_RENEW, RENEW4args(c.clientid if clientid is None else clientid))])
    return res.status


# ---- client ids ------------------------------------------------------------------------

def test_new_client_is_confirmed_and_renews(nfs_client):
    async def body(c):
        assert await renew(c) == NFS4_OK
        assert await renew(c, c.clientid ^ 0xFFFF) == NFS4ERR_STALE_CLIENTID
        assert await renew(c, c.clientid ^ (1 << 40)) == NFS4ERR_STALE_CLIENTID
    nfs_client(body, **V40)


def test_unconfirmed_client_is_stale_until_confirmed(nfs_client):
    async def body(c):
        sc = await c.setclientid()
        assert sc.tag == NFS4_OK
        clientid, confirm = sc.value.clientid, sc.value.setclientid_confirm
        assert await renew(c, clientid) == NFS4ERR_STALE_CLIENTID
        assert await c.setclientid_confirm(clientid, b"wrongvrf") == NFS4ERR_STALE_CLIENTID
        assert await c.setclientid_confirm(clientid, confirm) == NFS4_OK
        # A retransmitted confirm succeeds again.
        assert await c.setclientid_confirm(clientid, confirm) == NFS4_OK
        assert await renew(c, clientid) == NFS4_OK
    nfs_client(body, setup=False, **V40)


def test_callback_update_keeps_clientid_and_state(nfs_client):
    async def body(c):
        root = await c.lookup_path("/checkpoints")
        fh, sid = await c.open_create(root, "cb-update")
        sc = await c.setclientid()                       # same verifier: case 2
        assert sc.value.clientid == c.clientid
        assert await c.setclientid_confirm(c.clientid, sc.value.setclientid_confirm) == NFS4_OK
        await c.write(fh, sid, 0, b"still open")
        assert await renew(c) == NFS4_OK
    nfs_client(body, **V40)


def test_reboot_with_new_verifier_replaces_client_on_confirm(nfs_client):
    async def body(c):
        root = await c.lookup_path("/checkpoints")
        fh, sid = await c.open_create(root, "rebooted")
        old = c.clientid
        sc = await c.setclientid(verifier=b"newverf!")   # case 3
        new = sc.value.clientid
        assert new != old
        assert await renew(c, old) == NFS4_OK            # the old record lives until confirm
        assert await c.setclientid_confirm(new, sc.value.setclientid_confirm) == NFS4_OK
        assert await renew(c, old) == NFS4ERR_STALE_CLIENTID
        res = await c.compound([put(fh), op(OP_WRITE, WRITE4args(sid, 0, UNSTABLE4, b"x"))])
        assert res.status == NFS4ERR_EXPIRED            # its opens went with it
    nfs_client(body, **V40)


def test_second_unconfirmed_setclientid_replaces_first(nfs_client):
    async def body(c):
        first = (await c.setclientid()).value
        second = (await c.setclientid()).value            # case 4
        assert await c.setclientid_confirm(first.clientid, first.setclientid_confirm) \
            == NFS4ERR_STALE_CLIENTID
        assert await c.setclientid_confirm(second.clientid, second.setclientid_confirm) == NFS4_OK
    nfs_client(body, setup=False, **V40)


def test_owner_of_another_principal_is_in_use_while_it_holds_state(nfs_client):
    async def body(c):
        other = dataclasses.replace(DEFAULT_CRED, uid=4242)
        # No state yet: another principal may take the id over (pynfs CID2) ...
        idle = (await c.setclientid(owner=b"idle-" + c.owner)).value
        assert await c.setclientid_confirm(idle.clientid, idle.setclientid_confirm) == NFS4_OK
        taken = await c.setclientid(owner=b"idle-" + c.owner, cred=other)
        assert taken.tag == NFS4_OK
        assert await c.setclientid_confirm(taken.value.clientid, taken.value.setclientid_confirm,
                                           cred=other) == NFS4_OK
        assert await renew(c, idle.clientid) == NFS4ERR_STALE_CLIENTID    # replaced
        # ... but not while the record holds opens (CID3 / 16.33.5).
        root = await c.lookup_path("/checkpoints")
        await c.open_create(root, "held")
        sc = await c.setclientid(verifier=b"otherone", cred=other)
        assert sc.tag == NFS4ERR_CLID_INUSE
        # ... and confirming someone else's record is refused too.
        mine = (await c.setclientid(owner=b"fresh-" + c.owner)).value
        assert await c.setclientid_confirm(mine.clientid, mine.setclientid_confirm, cred=other) \
            == NFS4ERR_CLID_INUSE
    nfs_client(body, **V40)


def test_lease_expiry_makes_clientid_stale_and_stateids_unusable(nfs_client, nfs_server):
    async def body(c):
        root = await c.lookup_path("/checkpoints")
        fh, sid = await c.open_create(root, "expiring")
        mgr = nfs_server.server.sessions
        expired = nfs_server.call(lambda: mgr.expire_idle(now=10**9))
        assert [x.clientid for x in expired] == [c.clientid]
        assert await renew(c) == NFS4ERR_EXPIRED
        res = await c.compound([put(fh), op(OP_READ, READ4args(sid, 0, 10))])
        assert res.status == NFS4ERR_EXPIRED
        res = await c.compound([put(root), op(OP_OPEN, open_args(c, b"again", 1))])
        assert res.status == NFS4ERR_EXPIRED
    nfs_client(body, **V40)


def test_any_op_with_a_stateid_renews_the_lease(nfs_client, nfs_server):
    async def body(c):
        root = await c.lookup_path("/checkpoints")
        fh, sid = await c.open_create(root, "renewed")
        client = nfs_server.server.sessions.clients[c.clientid]
        nfs_server.call(lambda: setattr(client, "last_renew", client.last_renew - 1000))
        before = client.last_renew
        await c.read(fh, sid, 0, 1)
        assert client.last_renew > before + 999
    nfs_client(body, **V40)


# ---- COMPOUND rules --------------------------------------------------------------------

def test_unknown_minor_version_mismatch(nfs_client):
    async def body(c):
        res = await c.compound_raw([op(OP_PUTROOTFH)], minorversion=3)
        assert res.status == NFS4ERR_MINOR_VERS_MISMATCH and res.resarray == []
    nfs_client(body, **V40)


def test_41_ops_are_illegal_in_40_and_40_ops_notsupp_in_41(nfs_server):
    from tests.nfsd.conftest import run_client

    async def v40(c):
        res = await c.compound_raw([op(OP_RECLAIM_COMPLETE, RECLAIM_COMPLETE4args(False))])
        assert res.status == NFS4ERR_OP_ILLEGAL
    run_client(nfs_server.port, v40, minorversion=0)

    async def v41(c):
        res = await c.compound([op(OP_RENEW, RENEW4args(c.clientid))])
        assert res.status == NFS4ERR_NOTSUPP
    run_client(nfs_server.port, v41, minorversion=1)


# ---- open-owner seqids, OPEN_CONFIRM ---------------------------------------------------

def test_open_confirm_and_seqid_replay(nfs_client):
    async def body(c):
        root = await c.lookup_path("/checkpoints")
        args = open_args(c, b"seq", 7, owner=b"owner-A")
        ops = [put(root), op(OP_OPEN, args), op(OP_GETFH)]
        res = check(await c.compound(ops))
        ok = res.resarray[1].value.value
        fh = res.resarray[2].value.value.object
        assert ok.rflags & OPEN4_RESULT_CONFIRM
        # Unconfirmed: the stateid cannot be used for I/O.
        r = await c.compound([put(fh), op(OP_READ, READ4args(ok.stateid, 0, 1))])
        assert r.status == NFS4ERR_BAD_STATEID
        # A retransmission gets the same reply (same stateid seqid: nothing ran again).
        again = check(await c.compound(ops))
        assert again.resarray[1].value.value.stateid == ok.stateid
        # Out of order: BAD_SEQID.
        bad = await c.compound([put(fh), op(OP_OPEN_CONFIRM, OPEN_CONFIRM4args(ok.stateid, 9))])
        assert bad.status == NFS4ERR_BAD_SEQID
        conf = check(await c.compound([put(fh),
                                       op(OP_OPEN_CONFIRM, OPEN_CONFIRM4args(ok.stateid, 8))]))
        sid = conf.resarray[1].value.value.open_stateid
        assert sid.seqid == ok.stateid.seqid + 1
        # Confirming twice: the owner is confirmed already.
        twice = await c.compound([put(fh), op(OP_OPEN_CONFIRM, OPEN_CONFIRM4args(sid, 9))])
        assert twice.status == NFS4ERR_BAD_STATEID            # does not consume seqid 9
        # A confirmed owner's next OPEN needs no confirm; the old stateid seqid is OLD.
        res2 = check(await c.compound([put(root), op(OP_OPEN, open_args(
            c, b"seq2", 9, owner=b"owner-A")), op(OP_GETFH)]))
        assert not res2.resarray[1].value.value.rflags & OPEN4_RESULT_CONFIRM
        r = await c.compound([put(fh), op(OP_READ, READ4args(ok.stateid, 0, 1))])
        assert r.status == NFS4ERR_OLD_STATEID
        # CLOSE, then its retransmission is answered from the owner's last reply.
        close = [put(fh), op(OP_CLOSE, CLOSE4args(10, sid))]
        first = check(await c.compound(close))
        replay = check(await c.compound(close))
        assert replay.resarray[1].value.value == first.resarray[1].value.value
        late = await c.compound([put(fh), op(OP_CLOSE, CLOSE4args(11, sid))])
        assert late.status == NFS4ERR_BAD_STATEID
    nfs_client(body, **V40)


def test_failed_op_advances_seqid_but_bad_stateid_does_not(nfs_client):
    async def body(c):
        root = await c.lookup_path("/checkpoints")
        fh, sid = await c.open_create(root, "adv")
        owner = c._owner().owner
        seqid = c.owner_seqids[owner]
        # A downgrade that is not a subset fails with INVAL, which consumes the seqid.
        args = OPEN_DOWNGRADE4args(sid, seqid, OPEN4_SHARE_ACCESS_BOTH, OPEN4_SHARE_DENY_BOTH)
        r = await c.compound([put(fh), op(OP_OPEN_DOWNGRADE, args)])
        assert r.status == NFS4ERR_INVAL
        r = await c.compound([put(fh), op(OP_OPEN_DOWNGRADE, args)])
        assert r.status == NFS4ERR_INVAL                      # replayed, not re-judged
        bogus = stateid4(sid.seqid, b"\0\0\0\0" + bytes(sid.other)[4:])
        r = await c.compound([put(fh), op(OP_CLOSE, CLOSE4args(seqid + 1, bogus))])
        assert r.status == NFS4ERR_STALE_STATEID               # earlier server instance
        r = await c.compound([put(fh), op(OP_CLOSE, CLOSE4args(seqid + 1, sid))])
        assert r.status == NFS4_OK
    nfs_client(body, **V40)


def test_unconfirmed_owner_opening_again_starts_over(nfs_client):
    async def body(c):
        root = await c.lookup_path("/checkpoints")
        first = check(await c.compound([put(root), op(OP_OPEN, open_args(c, b"u1", 5, owner=b"U"))]))
        res = check(await c.compound([put(root), op(OP_OPEN, open_args(c, b"u2", 100, owner=b"U")),
                                      op(OP_GETFH)]))
        assert res.resarray[1].value.value.rflags & OPEN4_RESULT_CONFIRM
        old = first.resarray[1].value.value.stateid
        r = await c.compound([put(root), op(OP_LOOKUP, LOOKUP4args(b"u1")),
                              op(OP_OPEN_CONFIRM, OPEN_CONFIRM4args(old, 101))])
        assert r.status == NFS4ERR_BAD_STATEID                 # the first open is gone
    nfs_client(body, **V40)


# ---- READ/WRITE stateid rules of 4.0 ---------------------------------------------------

def test_v40_pynfs_cheap_rules(nfs_client):
    """Own deny reservations, downgrade only to opened modes, zero-count READ eof,
    RESTOREFH without a saved handle, a too small READDIR maxcount, the anonymous
    stateid where an open one is needed."""
    async def body(c):
        root = await c.lookup_path("/checkpoints")
        fh, sid = await c.open_create(root, "rules")
        await c.write(fh, sid, 0, b"0123456789")
        owner = c._owner().owner
        seq = c.take_seqid(owner)
        r = await c.compound([put(fh), op(OP_OPEN_DOWNGRADE, OPEN_DOWNGRADE4args(
            sid, seq, OPEN4_SHARE_ACCESS_READ, OPEN4_SHARE_DENY_NONE))])
        assert r.status == NFS4ERR_INVAL                   # only BOTH was ever opened
        r = await c.compound([put(fh), op(OP_CLOSE, CLOSE4args(c.take_seqid(owner),
                                                               stateid4(0, bytes(12))))])
        assert r.status == NFS4ERR_BAD_STATEID
        r = await c.compound([put(fh), op(OP_READ, READ4args(sid, 5, 0))])
        assert r.resarray[1].value.value.eof is False
        r = await c.compound([op(OP_PUTROOTFH), op(OP_RESTOREFH)])
        assert r.status == NFS4ERR_RESTOREFH
        r = await c.compound([put(root), op(OP_READDIR, READDIR4args(0, bytes(8), 15, 15, []))])
        assert r.status == NFS4ERR_TOOSMALL
        r = check(await c.compound([put(root), op(OP_CREATE, CREATE4args(
            createtype4(NF4DIR), b"empty", fattr4([], b""))), op(OP_READDIR,
            READDIR4args(0, bytes(8), 16, 16, []))]))          # 16 bytes hold an empty reply
        oa = open_args(c, b"denied", 1, owner=b"deny-owner")
        oa.share_deny = OPEN4_SHARE_DENY_READ
        res = check(await c.compound([put(root), op(OP_OPEN, oa), op(OP_GETFH)]))
        dfh = res.resarray[2].value.value.object
        dsid = res.resarray[1].value.value.stateid
        check(await c.compound([put(dfh), op(OP_OPEN_CONFIRM, OPEN_CONFIRM4args(dsid, 2))]))
        again = open_args(c, b"denied", 3, owner=b"deny-owner", create=False,
                          access=OPEN4_SHARE_ACCESS_READ)
        r = await c.compound([put(root), op(OP_OPEN, again)])
        assert r.status == NFS4ERR_SHARE_DENIED            # its own deny counts too
    nfs_client(body, **V40)


def test_lapsed_lock_holder_loses_its_lock_to_a_conflict(nfs_server):
    from tests.nfsd.conftest import run_client

    async def holder(c):
        root = await c.lookup_path("/checkpoints")
        fh, sid = await c.open_create(root, "lapsed")
        oseq = c.take_seqid(c._owner().owner)
        check(await c.compound([put(fh), _lock_new(c, sid, oseq, b"L1", 0)]))
        mgr = nfs_server.server.sessions
        client = mgr.clients[c.clientid]
        nfs_server.call(lambda: setattr(client, "last_renew", client.last_renew - 1000))
        return fh
    fh = run_client(nfs_server.port, holder, minorversion=0)

    async def taker(c):
        root = await c.lookup_path("/checkpoints")
        fh2, sid = await c.open_existing(root, "lapsed", access=OPEN4_SHARE_ACCESS_BOTH)
        oseq = c.take_seqid(c._owner().owner)
        r = await c.compound([put(fh2), _lock_new(c, sid, oseq, b"L2", 0)])
        assert r.status == NFS4_OK
    run_client(nfs_server.port, taker, minorversion=0)


def test_v40_stateid_rules_for_io(nfs_client):
    async def body(c):
        root = await c.lookup_path("/checkpoints")
        fh, sid = await c.open_create(root, "io40")
        await c.write(fh, sid, 0, b"hello")
        zero = stateid4(0, sid.other)          # seqid 0 is not "the latest" in 4.0
        r = await c.compound([put(fh), op(OP_READ, READ4args(zero, 0, 5))])
        assert r.status == NFS4ERR_OLD_STATEID
        current = stateid4(1, bytes(12))        # the 4.1 current-stateid value is not special
        r = await c.compound([put(fh), op(OP_WRITE, WRITE4args(current, 0, UNSTABLE4, b"x"))])
        assert r.status == NFS4ERR_BAD_STATEID
        assert await c.read(fh, stateid4(0, bytes(12)), 0, 5) == (b"hello", True)  # anonymous
        assert len(await c.commit(fh)) == 8
    nfs_client(body, **V40)


# ---- locks -----------------------------------------------------------------------------

def _lock_new(c, open_sid, open_seqid, lock_owner, lock_seqid, offset=0, length=10):
    return op(OP_LOCK, LOCK4args(WRITE_LT, False, offset, length, locker4(True, open_to_lock_owner4(
        open_seqid, open_sid, lock_seqid, lock_owner4(c.clientid, lock_owner)))))


def _lock_more(lock_sid, lock_seqid, offset, length=10):
    return op(OP_LOCK, LOCK4args(WRITE_LT, False, offset, length,
                                 locker4(False, exist_lock_owner4(lock_sid, lock_seqid))))


def test_lock_seqids_replay_and_release_lockowner(nfs_client):
    async def body(c):
        root = await c.lookup_path("/checkpoints")
        fh, sid = await c.open_create(root, "locked")
        owner = c._owner().owner
        oseq = c.owner_seqids[owner]
        first = [put(fh), _lock_new(c, sid, oseq, b"LO", 0)]
        res = check(await c.compound(first))
        lsid = res.resarray[1].value.value.lock_stateid
        again = check(await c.compound(first))                # replay via the open-owner
        assert again.resarray[1].value.value.lock_stateid == lsid
        more = [put(fh), _lock_more(lsid, 1, 100)]
        lsid2 = check(await c.compound(more)).resarray[1].value.value.lock_stateid
        assert check(await c.compound(more)).resarray[1].value.value.lock_stateid == lsid2
        bad = await c.compound([put(fh), _lock_more(lsid2, 5, 200)])
        assert bad.status == NFS4ERR_BAD_SEQID
        rel = op(OP_RELEASE_LOCKOWNER, RELEASE_LOCKOWNER4args(lock_owner4(c.clientid, b"LO")))
        assert (await c.compound([rel])).status == NFS4ERR_LOCKS_HELD
        lt = op(OP_LOCKT, LOCKT4args(WRITE_LT, 0, 10, lock_owner4(c.clientid ^ 0xFF, b"x")))
        assert (await c.compound([put(fh), lt])).status == NFS4ERR_STALE_CLIENTID
        lt = op(OP_LOCKT, LOCKT4args(WRITE_LT, 0, 10, lock_owner4(c.clientid, b"other")))
        assert (await c.compound([put(fh), lt])).status == NFS4ERR_DENIED
        sid_now = lsid2
        for seq, off in ((2, 0), (3, 100)):
            u = check(await c.compound([put(fh), op(OP_LOCKU, LOCKU4args(
                WRITE_LT, seq, sid_now, off, 10))]))
            sid_now = u.resarray[1].value.value
        assert (await c.compound([rel])).status == NFS4_OK
        r = await c.compound([put(fh), _lock_more(sid_now, 4, 0)])
        assert r.status == NFS4ERR_BAD_STATEID                 # released with its owner
    nfs_client(body, **V40)

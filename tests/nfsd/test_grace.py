"""Grace period and reclaim across a server restart (RFC 8881 8.4, RFC 7530 9.6.2,
nfsd/grace.py) through the project's client, in 4.1 and 4.0: a client's open and lock
survive a restart by reclaim, other clients wait for the grace period, and the
stable-storage rules decide who may reclaim."""
from __future__ import annotations

import asyncio
import os
import time

import pytest

from cache.store import Store
from nfsd.exports import Exports
from nfsd.server import NfsServer
from nfsd.xdr.nfs4 import *  # noqa: F403
from testkit.nfsclient import NfsClient, check, op, status_of
from tests.nfsd.conftest import EXPORT, ServerThread
from tests.nfsd.test_backchannel import sequence_flags

pytestmark = pytest.mark.timeout(60)

DATA = b"checkpoint bytes held across a restart"


class Gateway:
    """An NfsServer over one store that can be restarted (the store kept open, or closed
    and opened again to prove the records are on disk)."""

    def __init__(self, path):
        self.path = str(path)
        self.store = Store.open(self.path)
        self.st: ServerThread | None = None

    def start(self, grace_time: float = 30.0) -> "Gateway":
        store = self.store
        exports = Exports.single(EXPORT, root_squash=False, secure=False)
        self.st = ServerThread(lambda: NfsServer(store, exports, grace_time=grace_time)).start()
        return self

    def restart(self, grace_time: float = 30.0, *, reopen_store: bool = False) -> "Gateway":
        self.st.stop()
        if reopen_store:
            self.store.close()
            self.store = Store.open(self.path)
        return self.start(grace_time)

    @property
    def port(self) -> int:
        return self.st.port

    def in_grace(self) -> bool:
        return self.st.call(lambda: self.st.server.grace.in_grace)

    def wait_grace_over(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while self.in_grace():
            assert time.monotonic() < deadline, "grace period did not end"
            time.sleep(0.05)

    def close(self) -> None:
        if self.st is not None:
            self.st.stop()
        self.store.close()


@pytest.fixture
def gateway(tmp_path):
    gw = Gateway(tmp_path / "cache").start()
    yield gw
    gw.close()


def run(coro):
    return asyncio.run(coro)


async def connect(gw, minorversion=1, *, owner=None, verifier=None, reclaim_complete=True):
    c = await NfsClient.connect("127.0.0.1", gw.port, minorversion=minorversion)
    if owner is not None:
        c.owner, c.verifier = owner, verifier
    await c.setup_session(reclaim_complete=reclaim_complete)
    return c


def put(fh):
    return op(OP_PUTFH, PUTFH4args(fh))


def lock_new(c, open_sid, offset=0, length=10, *, reclaim=False, open_seqid=0):
    return op(OP_LOCK, LOCK4args(WRITE_LT, reclaim, offset, length, locker4(True, open_to_lock_owner4(
        open_seqid, open_sid, 0, lock_owner4(c.clientid, b"lock-" + c.owner)))))


async def open_lock_write(c, dir_fh, name="held"):
    """Open (create) a file, write and commit DATA, lock bytes 0-9: (fh, open stateid)."""
    fh, sid = await c.open_create(dir_fh, name)
    await c.write(fh, sid, 0, DATA, stable=FILE_SYNC4)
    seqid = c.take_seqid(c._owner().owner)
    res = check(await c.compound([put(fh), lock_new(c, sid, open_seqid=seqid)]))
    assert res.resarray[1].value.tag == NFS4_OK
    return fh, sid


async def reclaim_open(c, fh):
    """OPEN CLAIM_PREVIOUS of `fh`: the status and, if OK, the new open stateid."""
    owner = c._owner()
    args = OPEN4args(seqid=c.take_seqid(owner.owner), share_access=OPEN4_SHARE_ACCESS_BOTH,
                     share_deny=OPEN4_SHARE_DENY_NONE, owner=owner,
                     openhow=openflag4(OPEN4_NOCREATE),
                     claim=open_claim4(CLAIM_PREVIOUS, OPEN_DELEGATE_NONE))
    res = await c.compound([put(fh), op(OP_OPEN, args)])
    if res.status != NFS4_OK:
        return res.status, None
    ok = res.resarray[1].value.value
    assert not ok.rflags & OPEN4_RESULT_CONFIRM        # a reclaim needs no OPEN_CONFIRM
    return NFS4_OK, ok.stateid


async def lock_status(c, fh, sid, *, reclaim=False, offset=0):
    seqid = c.take_seqid(c._owner().owner)
    res = await c.compound([put(fh), lock_new(c, sid, offset, reclaim=reclaim, open_seqid=seqid)])
    return res.status


async def open_status(c, dir_fh, name) -> int:
    owner = c._owner()
    args = OPEN4args(seqid=c.take_seqid(owner.owner), share_access=OPEN4_SHARE_ACCESS_BOTH,
                     share_deny=OPEN4_SHARE_DENY_NONE, owner=owner,
                     openhow=openflag4(OPEN4_CREATE, createhow4(UNCHECKED4, fattr4([], b""))),
                     claim=open_claim4(CLAIM_NULL, name.encode()))
    res = await c.compound([put(dir_fh), op(OP_OPEN, args)])
    return res.status


def _identity():
    return b"grace-client-" + os.urandom(6).hex().encode(), os.urandom(8)


# ---- the restart a client survives ------------------------------------------------------

@pytest.mark.parametrize("minorversion", [1, 0])
def test_open_and_lock_are_reclaimed_and_others_wait_for_grace(gateway, minorversion):
    owner, verifier = _identity()

    async def before():
        c = await connect(gateway, minorversion, owner=owner, verifier=verifier)
        d = await c.lookup_path(EXPORT)
        fh, _ = await open_lock_write(c, d)
        await c.close()
        return d, fh
    d, fh = run(before())
    assert owner in gateway.store.client_records()
    # 4.1 ends grace at RECLAIM_COMPLETE; 4.0 has none, so its grace period is short here.
    gateway.restart(grace_time=30.0 if minorversion else 6.0)
    assert gateway.in_grace()

    async def during():
        c = await connect(gateway, minorversion, owner=owner, verifier=verifier,
                          reclaim_complete=False)
        other = await connect(gateway, minorversion)
        # Nothing new that could conflict with a reclaim is granted to anyone.
        assert await open_status(other, d, "new") == NFS4ERR_GRACE
        assert (await other.compound([put(d), op(OP_REMOVE, REMOVE4args(b"held"))])).status \
            == NFS4ERR_GRACE
        assert (await other.compound([put(d), op(OP_SAVEFH), put(d),
                                      op(OP_RENAME, RENAME4args(b"held", b"moved"))])).status \
            == NFS4ERR_GRACE
        assert (await other.compound([put(fh), op(OP_SETATTR, SETATTR4args(
            stateid4(0, bytes(12)), fattr4([1 << FATTR4_SIZE, 0],
                                           (0).to_bytes(8, "big"))))])).status == NFS4ERR_GRACE
        # The client that held state gets it back, and its I/O works with it.
        status, sid = await reclaim_open(c, fh)
        assert status == NFS4_OK
        assert await lock_status(c, fh, sid, reclaim=True) == NFS4_OK
        assert await c.read(fh, sid, 0, len(DATA)) == (DATA, True)
        await c.write(fh, sid, 0, b"C", stable=FILE_SYNC4)
        if minorversion:
            # Its own non-reclaim OPEN waits too (grace is global) ...
            assert await open_status(c, d, "mine") == NFS4ERR_GRACE
            # SEQUENCE tells the client that held state, not the new one, to reclaim
            assert await sequence_flags(c) & SEQ4_STATUS_RESTART_RECLAIM_NEEDED
            assert not await sequence_flags(other) & SEQ4_STATUS_RESTART_RECLAIM_NEEDED
            check(await c.compound([op(OP_RECLAIM_COMPLETE, RECLAIM_COMPLETE4args(False))]))
            assert not await sequence_flags(c) & SEQ4_STATUS_RESTART_RECLAIM_NEEDED
        # ... until every known client sent RECLAIM_COMPLETE (4.1) or the period ran
        # out (4.0).
        await asyncio.to_thread(gateway.wait_grace_over)
        assert await open_status(other, d, "new") == NFS4_OK
        ofh, osid = await other.open_existing(d, "held", access=OPEN4_SHARE_ACCESS_BOTH)
        # The reclaimed lock still stands against the other client.
        assert await lock_status(other, ofh, osid) == NFS4ERR_DENIED
        assert await lock_status(other, ofh, osid, offset=100) == NFS4_OK
        assert await c.read(fh, sid, 0, len(DATA)) == (b"C" + DATA[1:], True)
        # After grace a reclaim is refused.
        status, _ = await reclaim_open(c, fh)
        assert status == NFS4ERR_NO_GRACE
        await c.close()
        await other.close()
    run(during())


# ---- who may reclaim ----------------------------------------------------------------------

def test_no_records_means_no_grace_and_reclaims_get_no_grace(gateway):
    assert not gateway.in_grace()

    async def body():
        c = await connect(gateway)
        d = await c.lookup_path(EXPORT)
        fh, sid = await c.open_create(d, "f")
        status, _ = await reclaim_open(c, fh)
        assert status == NFS4ERR_NO_GRACE
        assert await lock_status(c, fh, sid, reclaim=True) == NFS4ERR_NO_GRACE
        await c.close()
    run(body())


def test_reclaims_of_unknown_clients_and_after_reclaim_complete(gateway):
    owner, verifier = _identity()
    second = _identity()

    async def before():
        c = await connect(gateway, owner=owner, verifier=verifier)
        d = await c.lookup_path(EXPORT)
        fh, _ = await open_lock_write(c, d)
        await c.close()
        # A second known client, which will not come back: grace lasts past the first's
        # RECLAIM_COMPLETE.
        await (await connect(gateway, owner=second[0], verifier=second[1])).close()
        return fh
    fh = run(before())
    gateway.restart()

    async def during():
        stranger = await connect(gateway, reclaim_complete=False)
        status, _ = await reclaim_open(stranger, fh)
        assert status == NFS4ERR_RECLAIM_BAD        # it held nothing before the restart
        v40 = await connect(gateway, 0)
        status, _ = await reclaim_open(v40, fh)
        assert status == NFS4ERR_RECLAIM_BAD
        c = await connect(gateway, owner=owner, verifier=verifier, reclaim_complete=False)
        check(await c.compound([op(OP_RECLAIM_COMPLETE, RECLAIM_COMPLETE4args(False))]))
        assert gateway.in_grace()
        status, _ = await reclaim_open(c, fh)
        assert status == NFS4ERR_NO_GRACE           # reclaims end with its RECLAIM_COMPLETE
        for x in (stranger, v40, c):
            await x.close()
    run(during())


def test_destroyed_client_loses_its_record(gateway):
    async def body():
        c = await connect(gateway)
        assert c.owner in gateway.store.client_records()
        await c.destroy_session()
        res = await c.compound_raw([op(OP_DESTROY_CLIENTID, DESTROY_CLIENTID4args(c.clientid))])
        assert res.status == NFS4_OK
        # the delete is a batch op nobody waits for (nfsd/grace.py forget): applied soon
        await asyncio.to_thread(gateway.store.batch.applied)
        assert c.owner not in gateway.store.client_records()
        await c.close()
    run(body())


def test_a_client_record_never_blocks_the_event_loop_on_the_index_lock(gateway):
    """A client's record is written at its RECLAIM_COMPLETE. On the event loop that write
    waited for the index lock, which a batch commit holds through its fdatasync: every other
    client stood still meanwhile (a whole cluster mounting at a job's start, behind each
    other's syncs). Here another thread holds the lock while a client mounts; a client
    already mounted is served meanwhile, and the new one is answered once its record is
    durable."""
    from tests.cache.storehelp import index_lock_held

    async def body():
        a = await connect(gateway)
        d = await a.lookup_path(EXPORT)
        with index_lock_held(gateway.store):
            mounting = asyncio.ensure_future(connect(gateway))
            await asyncio.sleep(0.3)                 # its RECLAIM_COMPLETE waits for the lock
            await asyncio.wait_for(a.getattr(d), 5)  # before: the loop stood still here
            assert not mounting.done()               # not answered before its record
        b = await asyncio.wait_for(mounting, 10)
        assert b.owner in gateway.store.client_records()
        for c in (a, b):
            await c.close()
    run(body())


def test_expired_client_loses_its_record(gateway):
    async def body():
        c = await connect(gateway, 0)
        d = await c.lookup_path(EXPORT)
        await c.open_create(d, "f")
        assert c.owner in gateway.store.client_records()

        def expire():
            mgr = gateway.st.server.sessions
            mgr.expire(mgr.clients[c.clientid], "test: lease expired")
        gateway.st.call(expire)
        await asyncio.to_thread(gateway.store.batch.applied)    # the delete: a batch op
        assert c.owner not in gateway.store.client_records()
        await c.close()
    run(body())


# ---- RFC 8881 8.4.3: a client that missed one grace period cannot reclaim after the next

def test_client_that_did_not_reclaim_cannot_after_a_second_restart(gateway):
    absent_owner, absent_verifier = _identity()
    present_owner, present_verifier = _identity()

    async def before():
        a = await connect(gateway, owner=absent_owner, verifier=absent_verifier)
        p = await connect(gateway, owner=present_owner, verifier=present_verifier)
        d = await a.lookup_path(EXPORT)
        afh, _ = await open_lock_write(a, d, "absent")
        pfh, _ = await open_lock_write(p, d, "present")
        await a.close()
        await p.close()
        return afh, pfh
    afh, pfh = run(before())
    # A restart during grace keeps every record: nobody could take new state meanwhile.
    gateway.restart()
    gateway.restart(grace_time=4.0, reopen_store=True)
    assert set(gateway.store.client_records()) >= {absent_owner, present_owner}

    async def first_grace():
        p = await connect(gateway, owner=present_owner, verifier=present_verifier,
                          reclaim_complete=False)
        status, _ = await reclaim_open(p, pfh)
        assert status == NFS4_OK
        await p.close()
    run(first_grace())
    gateway.wait_grace_over()          # the absent client never came back
    records = gateway.store.client_records()
    assert absent_owner not in records and present_owner in records
    gateway.restart(reopen_store=True)
    assert gateway.in_grace()          # the present client's record starts one

    async def second_grace():
        a = await connect(gateway, owner=absent_owner, verifier=absent_verifier,
                          reclaim_complete=False)
        status, _ = await reclaim_open(a, afh)
        assert status == NFS4ERR_RECLAIM_BAD
        await a.close()
    run(second_grace())


def test_grace_ends_early_when_every_known_client_completed(gateway):
    owners = [_identity() for _ in range(2)]

    async def before():
        for owner, verifier in owners:
            c = await connect(gateway, owner=owner, verifier=verifier)
            await c.close()
    run(before())
    gateway.restart(grace_time=30.0)

    async def back():
        clients = []
        for owner, verifier in owners:
            assert gateway.in_grace()
            clients.append(await connect(gateway, owner=owner, verifier=verifier))
        assert not gateway.in_grace()
        for c in clients:
            await c.close()
    run(back())


def test_grace_is_extended_while_a_client_keeps_reclaiming(gateway):
    """A client still reclaiming when the period is up is not cut off (up to twice the period).
    The step is widened so that a loaded machine's slow replies do not count as a pause."""
    owner, verifier = _identity()
    grace_time = 2.0

    async def before():
        c = await connect(gateway, owner=owner, verifier=verifier)
        d = await c.lookup_path(EXPORT)
        fhs = [(await c.open_create(d, f"f{i}"))[0] for i in range(40)]
        await c.close()
        return fhs
    fhs = run(before())
    gateway.restart(grace_time=grace_time)
    started = time.monotonic()        # grace began a little before: elapsed times are low bounds
    gateway.st.call(lambda: setattr(gateway.st.server.grace, "extend_step", 2 * grace_time))

    async def late():
        c = await connect(gateway, owner=owner, verifier=verifier, reclaim_complete=False)
        reclaimed = 0
        while time.monotonic() - started < grace_time + 0.5:
            status, _ = await reclaim_open(c, fhs[reclaimed])
            assert status == NFS4_OK, f"reclaim {time.monotonic() - started:.1f} s into a {grace_time} s grace"
            reclaimed += 1
            await asyncio.sleep(0.1)
        await asyncio.to_thread(gateway.wait_grace_over)   # then it ends without RECLAIM_COMPLETE
        status, _ = await reclaim_open(c, fhs[-1])
        assert status == NFS4ERR_NO_GRACE
        await c.close()
    run(late())


def test_clients_completing_their_reclaim_also_keep_grace_going(gateway):
    """RECLAIM_COMPLETEs of known clients count as reclaiming: a late reclaim after a stream of
    them, past the period, still succeeds (one known client never returns, so grace does not
    end early)."""
    grace_time = 2.0
    late, gone = _identity(), _identity()
    returning = [_identity() for _ in range(40)]

    async def before():
        c = await connect(gateway, owner=late[0], verifier=late[1])
        fh, _ = await c.open_create(await c.lookup_path(EXPORT), "late")
        await c.close()
        for owner, verifier in returning + [gone]:
            await (await connect(gateway, owner=owner, verifier=verifier)).close()
        return fh
    fh = run(before())
    gateway.restart(grace_time=grace_time)
    started = time.monotonic()
    gateway.st.call(lambda: setattr(gateway.st.server.grace, "extend_step", 2 * grace_time))

    async def back():
        for owner, verifier in returning:           # each comes back with nothing to reclaim
            await (await connect(gateway, owner=owner, verifier=verifier)).close()
            if time.monotonic() - started > grace_time + 0.5:
                break
            await asyncio.sleep(0.1)
        assert time.monotonic() - started > grace_time, "the clients came back too fast to tell"
        c = await connect(gateway, owner=late[0], verifier=late[1], reclaim_complete=False)
        status, _ = await reclaim_open(c, fh)
        assert status == NFS4_OK
        await c.close()
    run(back())

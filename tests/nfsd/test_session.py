"""NFSv4.1 client records and sessions (RFC 8881 2.10, 18.35-18.37, 18.46, 18.50, 18.51)
and the COMPOUND rules around them, against a server with a fake filesystem table."""
from __future__ import annotations

import asyncio
import itertools
import time

import pytest

from nfsd.errors import NfsError
from nfsd.ops import session as session_ops
from nfsd.xdr.core import encode
from nfsd.xdr.nfs4 import *  # noqa: F403
from testkit.nfsclient import NfsClient, check, op, sequence_op, status_of

pytestmark = pytest.mark.timeout(60)

_counter = itertools.count(1)


async def fake_putrootfh(ctx, args):
    ctx.current_fh = b"root"
    return PUTROOTFH4res(NFS4_OK)


async def fake_getfh(ctx, args):
    if ctx.current_fh is None:
        raise NfsError(NFS4ERR_NOFILEHANDLE)
    return GETFH4res(NFS4_OK, GETFH4resok(object=ctx.current_fh + b"-%d" % next(_counter)))


async def broken_savefh(ctx, args):
    raise RuntimeError("a bug in a handler")


async def fake_read(ctx, args):
    return READ4res(NFS4_OK, READ4resok(eof=True, data=b"r" * args.count))


FAKE_FS = {OP_PUTROOTFH: fake_putrootfh, OP_GETFH: fake_getfh, OP_SAVEFH: broken_savefh,
           OP_READ: fake_read}


@pytest.fixture
def server(fake_server_factory):
    return fake_server_factory({**session_ops.HANDLERS, **FAKE_FS})


def run(port, body, setup=True, **kw):
    async def main():
        c = await NfsClient.connect("127.0.0.1", port, **kw)
        try:
            if setup:
                await c.setup_session()
            return await body(c)
        finally:
            await c.close()
    return asyncio.run(main())


def compound_bytes(ops, minorversion=1):
    return encode(COMPOUND4args, COMPOUND4args(tag=b"t", minorversion=minorversion, argarray=ops))


# ---- EXCHANGE_ID / CREATE_SESSION ----------------------------------------------------

def test_exchange_id_and_create_session(server):
    async def body(c):
        eid = await c.exchange_id()
        assert eid.tag == NFS4_OK
        ok = eid.value
        assert ok.eir_flags & EXCHGID4_FLAG_USE_NON_PNFS
        assert not ok.eir_flags & EXCHGID4_FLAG_CONFIRMED_R
        # A stable one-way derivation of the store's instance id, never the id itself.
        assert ok.eir_server_owner.so_major_id == server.server.server_owner != b"fake-instance-id"
        assert ok.eir_server_scope == server.server.server_scope
        assert ok.eir_state_protect.tag == SP4_NONE
        cs = await c.create_session(ok.eir_clientid, ok.eir_sequenceid, slots=200)
        assert cs.tag == NFS4_OK
        attrs = cs.value.csr_fore_chan_attrs
        assert attrs.ca_maxrequests == 64                     # capped at our slot count
        assert attrs.ca_maxrequestsize >= 1024 * 1024
        assert attrs.ca_maxoperations >= 16                   # never below what was asked
        assert cs.value.csr_flags == CREATE_SESSION4_FLAG_CONN_BACK_CHAN
        back = cs.value.csr_back_chan_attrs                   # accepted as sent
        assert (back.ca_maxrequests, back.ca_maxrequestsize) == (1, 4096)
        eid2 = await c.exchange_id()                          # same owner + verifier: case 2
        assert eid2.value.eir_clientid == ok.eir_clientid
        assert eid2.value.eir_flags & EXCHGID4_FLAG_CONFIRMED_R
    run(server.port, body, setup=False)


def test_exchange_id_rejects_bad_flags_and_state_protection(server):
    async def body(c):
        eid = await c.exchange_id(flags=EXCHGID4_FLAG_CONFIRMED_R)
        assert eid.tag == NFS4ERR_INVAL
        mach = state_protect4_a(SP4_MACH_CRED, state_protect_ops4(spo_must_enforce=[],
                                                                  spo_must_allow=[]))
        args = EXCHANGE_ID4args(client_owner4(b"12345678", b"x"), 0, mach, [])
        res = await c.compound_raw([op(OP_EXCHANGE_ID, args)])
        assert res.status == NFS4ERR_NOTSUPP
        eid = await c.exchange_id(flags=EXCHGID4_FLAG_UPD_CONFIRMED_REC_A)
        assert eid.tag == NFS4ERR_NOENT                       # update of nothing: case 7
    run(server.port, body, setup=False)


def test_create_session_sequence_rules(server):
    async def body(c):
        ok = (await c.exchange_id()).value
        assert (await c.create_session(0x1234, 1)).tag == NFS4ERR_STALE_CLIENTID
        bad = await c.create_session(ok.eir_clientid, ok.eir_sequenceid + 5)
        assert bad.tag == NFS4ERR_SEQ_MISORDERED
        c.channel_attrs = lambda slots: channel_attrs4(0, 100, 100, 0, 8, slots, [])
        small = await c.create_session(ok.eir_clientid, ok.eir_sequenceid)
        assert small.tag == NFS4ERR_TOOSMALL                  # does not consume the seqid ...
        del c.channel_attrs
        first = await c.create_session(ok.eir_clientid, ok.eir_sequenceid)
        replay = await c.create_session(ok.eir_clientid, ok.eir_sequenceid)
        assert first.tag == NFS4_OK and replay == first       # ... the corrected one is cached
        second = await c.create_session(ok.eir_clientid, ok.eir_sequenceid + 1)
        assert second.tag == NFS4_OK
        assert second.value.csr_sessionid != first.value.csr_sessionid
    run(server.port, body, setup=False)


def test_client_reboot_replaces_the_old_record(server):
    dropped = []
    server.call(lambda: server.server.sessions.on_client_expired.append(dropped.append))

    async def body(c):
        old = c.clientid
        c.verifier = b"rebooted"                               # same owner, new verifier
        ok = (await c.exchange_id()).value
        assert ok.eir_clientid != old
        assert not ok.eir_flags & EXCHGID4_FLAG_CONFIRMED_R
        assert [cl.clientid for cl in dropped] == []          # not before CREATE_SESSION
        cs = await c.create_session(ok.eir_clientid, ok.eir_sequenceid)
        assert cs.tag == NFS4_OK
        assert [cl.clientid for cl in dropped] == [old]
        c.use_session(cs.value.csr_sessionid, 4)
        check(await c.compound([op(OP_PUTROOTFH)]))
    run(server.port, body)


# ---- SEQUENCE ---------------------------------------------------------------------------

def test_sequence_replay_returns_the_cached_reply_byte_for_byte(server):
    async def body(c):
        sid = c.sessionid
        args = compound_bytes([sequence_op(sid, 1, 3, cachethis=True), op(OP_PUTROOTFH),
                               op(OP_GETFH)])
        first = await c.call(1, args)
        again = await c.call(1, args)                        # a retransmission (new xid)
        assert bytes(again.body) == bytes(first.body)
        # The same slot and seqid with other ops is not a retry.
        res = await c.compound_raw([sequence_op(sid, 1, 3, cachethis=True), op(OP_PUTROOTFH)])
        assert res.status == NFS4ERR_SEQ_FALSE_RETRY
        # The GETFH result counts up per execution, so equal bytes mean not re-executed.
        nxt = await c.call(1, compound_bytes([sequence_op(sid, 2, 3), op(OP_PUTROOTFH),
                                              op(OP_GETFH)]))
        assert bytes(nxt.body) != bytes(first.body)
    run(server.port, body)


def test_sequence_misordered_and_bad_slot(server):
    async def body(c):
        sid = c.sessionid
        res = await c.compound_raw([sequence_op(sid, 5, 0)])
        assert res.status == NFS4ERR_SEQ_MISORDERED
        res = await c.compound_raw([sequence_op(sid, 0, 4)])   # no request 0 to retry
        assert res.status == NFS4ERR_SEQ_MISORDERED
        res = await c.compound_raw([sequence_op(sid, 1, 9999)])
        assert res.status == NFS4ERR_BADSLOT
        res = await c.compound_raw([sequence_op(b"\0" * 16, 1, 0)])
        assert res.status == NFS4ERR_BADSESSION
        res = await c.compound_raw([sequence_op(sid, 1, 1)])
        ok = res.resarray[0].value.value
        assert res.status == NFS4_OK
        assert (ok.sr_slotid, ok.sr_sequenceid, ok.sr_status_flags) == (1, 1, 0)
        assert ok.sr_highest_slotid == ok.sr_target_highest_slotid == 15
    run(server.port, body)


def test_retry_of_a_large_uncached_reply(server):
    async def body(c):
        read = op(OP_READ, READ4args(stateid4(0, bytes(12)), 0, 200_000))
        args = compound_bytes([sequence_op(c.sessionid, 1, 11), op(OP_PUTROOTFH), read])
        first = await c.call(1, args)
        assert len(bytes(first.body)) > 200_000
        from nfsd.xdr.core import decode
        res = decode(COMPOUND4res, (await c.call(1, args)).body)
        assert res.resarray[0].value.tag == NFS4_OK
        assert res.status == NFS4ERR_RETRY_UNCACHED_REP and len(res.resarray) == 2
        # Without the original reply the server cannot tell a false retry (other ops on the
        # same slot and seqid) from a real one: RETRY_UNCACHED_REP, as Linux knfsd answers.
        res = await c.compound_raw([sequence_op(c.sessionid, 1, 11), op(OP_PUTROOTFH)])
        assert res.status == NFS4ERR_RETRY_UNCACHED_REP
    run(server.port, body)


def test_session_limits_on_ops_and_reply_size(server):
    async def body(c):
        res = await c.compound_raw([sequence_op(c.sessionid, 1, 12)] + [op(OP_PUTROOTFH)] * 20)
        assert res.status == NFS4ERR_TOO_MANY_OPS              # we asked for 16 operations
        huge = op(OP_READ, READ4args(stateid4(0, bytes(12)), 0, 2 * 1024 * 1024))
        res = await c.compound_raw([sequence_op(c.sessionid, 1, 12), op(OP_PUTROOTFH), huge])
        assert res.status == NFS4ERR_REP_TOO_BIG and len(res.resarray) == 3
    run(server.port, body)


def test_observer_sees_every_op_but_sequence(server):
    seen = []
    server.call(setattr, server.server, "observer", lambda *a: seen.append(a))

    async def body(c):
        read = op(OP_READ, READ4args(stateid4(0, bytes(12)), 0, 1000))
        await c.compound([op(OP_PUTROOTFH), read])
        await c.compound([op(OP_GETFH)])                      # fails: no current fh
    run(server.port, body)
    assert [(a[0], a[1], a[3]) for a in seen] == [
        ("EXCHANGE_ID", "NFS4_OK", 0), ("CREATE_SESSION", "NFS4_OK", 0),
        ("RECLAIM_COMPLETE", "NFS4_OK", 0), ("PUTROOTFH", "NFS4_OK", 0), ("READ", "NFS4_OK", 1000),
        ("GETFH", "NFS4ERR_NOFILEHANDLE", 0)]
    assert all(a[2] >= 0 for a in seen)


def test_seqid_wraps_around(server):
    def set_seqid():
        session = next(iter(server.server.sessions.sessions.values()))
        session.slots[2].seqid = 0xFFFFFFFF
        session.slots[2].used = True
    async def body(c):
        server.call(set_seqid)
        res = await c.compound_raw([sequence_op(c.sessionid, 0, 2)])
        assert res.status == NFS4_OK
    run(server.port, body)


def test_ops_outside_a_session(server):
    async def body(c):
        res = await c.compound_raw([op(OP_PUTROOTFH), op(OP_GETFH)])
        assert res.status == NFS4ERR_OP_NOT_IN_SESSION and len(res.resarray) == 1
        res = await c.compound_raw([sequence_op(c.sessionid, 1, 7), op(OP_PUTROOTFH),
                                    sequence_op(c.sessionid, 1, 1)])
        assert res.status == NFS4ERR_SEQUENCE_POS and len(res.resarray) == 3
        eid = EXCHANGE_ID4args(client_owner4(b"12345678", b"x"), 0, state_protect4_a(SP4_NONE), [])
        res = await c.compound_raw([op(OP_EXCHANGE_ID, eid), op(OP_PUTROOTFH)])
        assert res.status == NFS4ERR_NOT_ONLY_OP
        res = await c.compound_raw([])
        assert (res.status, res.resarray) == (NFS4_OK, [])
        seek = op(OP_SEEK, SEEK4args(stateid4(0, bytes(12)), 0, NFS4_CONTENT_DATA))
        res = await c.compound_raw([seek])                    # not a 4.1 op at all
        assert res.status == NFS4ERR_OP_ILLEGAL and res.resarray[0].tag == OP_ILLEGAL
        res = await c.compound_raw([op(OP_RENEW, RENEW4args(c.clientid))])
        assert res.status == NFS4ERR_NOTSUPP                  # 4.0 only
    run(server.port, body)


def test_minor_versions(server):
    async def body(c):
        res = await c.compound_raw([op(OP_PUTROOTFH)], minorversion=3)
        assert (res.status, res.resarray) == (NFS4ERR_MINOR_VERS_MISMATCH, [])
        # A 4.2-only op: NOTSUPP in 4.2, not an op at all in 4.1.
        seek = op(OP_SEEK, SEEK4args(stateid4(0, bytes(12)), 0, NFS4_CONTENT_DATA))
        res = await c.compound_raw([sequence_op(c.sessionid, 1, 8), op(OP_PUTROOTFH), seek],
                                   minorversion=2)
        assert res.status == NFS4ERR_NOTSUPP
        res = await c.compound_raw([sequence_op(c.sessionid, 2, 8), op(OP_PUTROOTFH), seek])
        assert res.status == NFS4ERR_OP_ILLEGAL and res.resarray[-1].tag == OP_ILLEGAL
        # 4.0-only ops are not implemented by a 4.1 server.
        res = await c.compound_raw([sequence_op(c.sessionid, 3, 8), op(OP_RENEW, RENEW4args(1))])
        assert res.status == NFS4ERR_NOTSUPP
    run(server.port, body)


def test_unknown_op_number_is_op_illegal(server):
    async def body(c):
        good = compound_bytes([sequence_op(c.sessionid, 1, 9), op(OP_PUTROOTFH)])
        # Rewrite the op count to 3 and append op number 9999 with no arguments.
        raw = bytearray(good)
        count_at = 4 + 4 + 4                               # tag "t" padded, minorversion
        raw[count_at:count_at + 4] = (3).to_bytes(4, "big")
        raw += (9999).to_bytes(4, "big")
        r = await c.call(1, bytes(raw))
        from nfsd.xdr.core import decode
        res = decode(COMPOUND4res, r.body)
        assert res.status == NFS4ERR_OP_ILLEGAL
        assert [x.tag for x in res.resarray] == [OP_SEQUENCE, OP_PUTROOTFH, OP_ILLEGAL]
    run(server.port, body)


def test_handler_crash_is_serverfault_and_nothing_else(server):
    async def body(c):
        res = await c.compound([op(OP_PUTROOTFH), op(OP_SAVEFH), op(OP_GETFH)])
        assert res.status == NFS4ERR_SERVERFAULT and len(res.resarray) == 2
        check(await c.compound([op(OP_PUTROOTFH), op(OP_GETFH)]))
    run(server.port, body)


def test_not_implemented_op_is_notsupp(server):
    async def body(c):
        res = await c.compound([op(OP_PUTROOTFH), op(OP_READLINK)])   # no handler in the table
        assert res.status == NFS4ERR_NOTSUPP
    run(server.port, body)


def test_requests_on_one_connection_run_concurrently(fake_server_factory):
    gate = {}

    async def wait_for_partner(ctx, args):
        # The first call can only finish once the second one has started.
        ev = gate.setdefault("ev", asyncio.Event())
        gate["n"] = gate.get("n", 0) + 1
        if gate["n"] == 2:
            ev.set()
        await asyncio.wait_for(ev.wait(), 10)
        return PUTROOTFH4res(NFS4_OK)
    server = fake_server_factory({**session_ops.HANDLERS, OP_PUTROOTFH: wait_for_partner})

    async def body(c):
        a, b = await asyncio.gather(c.compound([op(OP_PUTROOTFH)]), c.compound([op(OP_PUTROOTFH)]))
        assert a.status == b.status == NFS4_OK
    run(server.port, body)


# ---- RECLAIM_COMPLETE / DESTROY_* / BIND_CONN_TO_SESSION ----------------------------------

def test_reclaim_complete_twice(server):
    async def body(c):
        res = await c.compound([op(OP_RECLAIM_COMPLETE, RECLAIM_COMPLETE4args(False))])
        assert res.status == NFS4ERR_COMPLETE_ALREADY
        check(await c.compound([op(OP_RECLAIM_COMPLETE, RECLAIM_COMPLETE4args(True))]))
    run(server.port, body)


def test_destroy_session_and_clientid(server):
    async def body(c):
        sid, clientid = c.sessionid, c.clientid
        res = await c.compound_raw([op(OP_DESTROY_CLIENTID, DESTROY_CLIENTID4args(clientid))])
        assert res.status == NFS4ERR_CLIENTID_BUSY
        res = await c.compound_raw([sequence_op(sid, 1, 10),
                                    op(OP_DESTROY_SESSION, DESTROY_SESSION4args(sid)),
                                    op(OP_PUTROOTFH)])
        assert res.status == NFS4ERR_NOT_ONLY_OP
        assert await c.destroy_session() == NFS4_OK
        res = await c.compound_raw([sequence_op(sid, 2, 10), op(OP_PUTROOTFH)])
        assert res.status == NFS4ERR_BADSESSION
        res = await c.compound_raw([op(OP_DESTROY_SESSION, DESTROY_SESSION4args(sid))])
        assert res.status == NFS4ERR_BADSESSION
        res = await c.compound_raw([op(OP_DESTROY_CLIENTID, DESTROY_CLIENTID4args(clientid))])
        assert res.status == NFS4_OK
        res = await c.compound_raw([op(OP_DESTROY_CLIENTID, DESTROY_CLIENTID4args(clientid))])
        assert res.status == NFS4ERR_STALE_CLIENTID
    run(server.port, body)


def test_bind_conn_to_session_from_a_second_connection(server):
    async def body(c):
        c2 = await NfsClient.connect("127.0.0.1", server.port)
        try:
            args = BIND_CONN_TO_SESSION4args(c.sessionid, CDFC4_FORE_OR_BOTH, False)
            res = await c2.compound_raw([op(OP_BIND_CONN_TO_SESSION, args)])
            assert res.status == NFS4_OK
            ok = res.resarray[0].value.value
            assert (ok.bctsr_sessid, ok.bctsr_dir) == (c.sessionid, CDFS4_BOTH)
            c2.use_session(c.sessionid, 16)
            c2.slot_seqids = c.slot_seqids                   # share the slot table
            c2._free_slots = c._free_slots
            check(await c2.compound([op(OP_PUTROOTFH)]))
            bad = BIND_CONN_TO_SESSION4args(b"\1" * 16, CDFC4_FORE, False)
            res = await c2.compound_raw([op(OP_BIND_CONN_TO_SESSION, bad)])
            assert res.status == NFS4ERR_BADSESSION
        finally:
            await c2.close()
    run(server.port, body)


# ---- leases --------------------------------------------------------------------------

def test_idle_client_expires_and_its_state_is_dropped(fake_server_factory):
    server = fake_server_factory({**session_ops.HANDLERS, **FAKE_FS}, lease_time=0.4)
    dropped = []
    server.call(lambda: server.server.sessions.on_client_expired.append(dropped.append))

    async def body(c):
        check(await c.compound([op(OP_PUTROOTFH)]))
        # Keep renewing for a while: never expires while the client is active.
        for _ in range(6):
            await asyncio.sleep(0.1)
            check(await c.compound([op(OP_PUTROOTFH)]))
        assert dropped == []
        deadline = time.monotonic() + 10
        while not dropped and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert [cl.clientid for cl in dropped] == [c.clientid]
        res = await c.compound_raw([sequence_op(c.sessionid, 99, 0)])
        assert res.status == NFS4ERR_BADSESSION
        cs = await c.create_session(c.clientid, 2)
        assert cs.tag == NFS4ERR_STALE_CLIENTID
    run(server.port, body)


def test_session_state_is_released_when_a_compound_is_cancelled_midway(fake_server_factory):
    """A client that disconnects while its request runs: the slot is completed, the
    server and other clients carry on."""
    async def slow(ctx, args):
        await asyncio.sleep(0.3)
        return PUTROOTFH4res(NFS4_OK)
    server = fake_server_factory({**session_ops.HANDLERS, OP_PUTROOTFH: slow})

    async def body(c):
        c2 = await NfsClient.connect("127.0.0.1", server.port)
        xid = c2.next_xid()
        from nfsd.rpc import encode_call
        c2.writer.write(encode_call(xid, 100003, 4, 1, c2.cred, compound_bytes(
            [sequence_op(c.sessionid, 1, 5), op(OP_PUTROOTFH)])))
        await c2.writer.drain()
        await c2.close()                                     # gone before the reply
        await asyncio.sleep(0.5)
        # The slot finished normally: its reply is cached, the next seqid is accepted.
        res = await c.compound_raw([sequence_op(c.sessionid, 2, 5)])
        assert res.status == NFS4_OK
        check(await c.compound([op(OP_PUTROOTFH)]))
    run(server.port, body)

"""The NFSv4.1 back channel (RFC 8881 2.10.3.1, 18.33, 18.34, 18.36, 20.9) and the
SEQ4_STATUS flags of SEQUENCE (18.46.3), through testkit/nfsclient.py, which answers the
server's CB_NULL/CB_COMPOUND on its own connection."""
from __future__ import annotations

import asyncio
import struct

import pytest

from nfsd.callback import CallbackError
from nfsd.limits import Limits
from nfsd.rpc import finish_reply, frame, start_success_reply
from nfsd.transport import CallbackFailed
from nfsd.xdr.core import encode
from nfsd.xdr.nfs4 import *  # noqa: F401,F403 - the protocol's names, as in the RFC
from testkit.nfsclient import NfsClient, check, op
from tests.nfsd.conftest import run_client

CB_PROGRAM = 0x40000000
PATH_DOWN = SEQ4_STATUS_CB_PATH_DOWN | SEQ4_STATUS_CB_PATH_DOWN_SESSION


def flags_of(c) -> int:
    return c.last_sequence.value.value.sr_status_flags


async def sequence_flags(c) -> int:
    await c.compound([])
    return flags_of(c)


async def eventually_flags(c, want: int, mask: int, tries: int = 200) -> int:
    """SEQUENCE until (flags & mask) == want; the probe runs in the background."""
    for _ in range(tries):
        flags = await sequence_flags(c)
        if flags & mask == want:
            return flags
        await asyncio.sleep(0.05)
    raise AssertionError(f"flags {flags:#x}, wanted {want:#x} under {mask:#x}")


def session_of(st, c):
    return st.server.sessions.sessions[c.sessionid]


def backchannel_state(st, c) -> str:
    return st.call(lambda: session_of(st, c).backchannel.state)


@pytest.fixture
def quick_server(fake_server_factory):
    """Callbacks time out fast; few may be pending per connection."""
    return fake_server_factory(limits=Limits(callback_timeout=0.5, max_callbacks=2))


def test_cb_null_follows_create_session_with_a_back_channel(fake_server):
    async def body(c):
        prog, proc, args = await c.wait_callback()
        assert (prog, proc, args) == (CB_PROGRAM, 0, None)
        for _ in range(200):
            if backchannel_state(fake_server, c) == "up":
                break
            await asyncio.sleep(0.02)
        assert backchannel_state(fake_server, c) == "up"
        assert await sequence_flags(c) & PATH_DOWN == 0
    run_client(fake_server.port, body)


def test_a_session_without_back_channel_is_not_probed_nor_path_down(fake_server):
    async def body(c):
        eid = await c.exchange_id()
        cs = await c.create_session(eid.value.eir_clientid, eid.value.eir_sequenceid, flags=0)
        assert cs.tag == NFS4_OK and cs.value.csr_flags == 0
        c.use_session(cs.value.csr_sessionid, 4)
        assert await sequence_flags(c) == 0
        assert c.callbacks == []
    run_client(fake_server.port, body, setup=False)


def test_a_client_that_does_not_answer_gets_cb_path_down(quick_server):
    async def body(c):
        await c.wait_callback()                 # CB_NULL, never answered
        flags = await eventually_flags(c, PATH_DOWN, PATH_DOWN)
        assert flags & PATH_DOWN == PATH_DOWN
        # The client repairs it as Linux does: BIND_CONN_TO_SESSION for the back channel.
        c.answer_callback = type(c).answer_callback.__get__(c)
        res = await c.compound_raw([op(OP_BIND_CONN_TO_SESSION, BIND_CONN_TO_SESSION4args(
            c.sessionid, CDFC4_BACK_OR_BOTH, False))])
        assert res.status == NFS4_OK and res.resarray[0].value.value.bctsr_dir == CDFS4_BOTH
        await c.wait_callback()
        await eventually_flags(c, 0, PATH_DOWN)

    async def silent_client(c):
        c.answer_callback = lambda xid, proc, args: None
        await c.setup_session()
        await body(c)
    run_client(quick_server.port, silent_client, setup=False)


def test_back_channel_connection_lost_is_path_down_on_the_other_connection(fake_server):
    async def main():
        a = await NfsClient.connect("127.0.0.1", fake_server.port)
        await a.setup_session()
        await a.wait_callback()
        b = await NfsClient.connect("127.0.0.1", fake_server.port)
        b.use_session(a.sessionid, len(a.slot_seqids))
        b.slot_seqids = a.slot_seqids
        await a.close()
        try:
            await eventually_flags(b, PATH_DOWN, PATH_DOWN)
        finally:
            await b.close()
    asyncio.run(main())


def test_backchannel_ctl_sets_program_and_credential_and_probes_again(fake_server):
    async def body(c):
        await c.wait_callback()
        sys_parms = authsys_parms(stamp=0, machinename=b"cbhost", uid=7, gid=8, gids=[9])
        res = check(await c.compound([op(OP_BACKCHANNEL_CTL, BACKCHANNEL_CTL4args(
            0x40000123, [callback_sec_parms4(AUTH_SYS, sys_parms)]))]))
        assert res.resarray[0].value.bcr_status == NFS4_OK
        prog, proc, _ = await c.wait_callback()
        assert (prog, proc) == (0x40000123, 0)
        cred = fake_server.call(lambda: session_of(fake_server, c).backchannel.cred)
        assert (cred.flavor, cred.uid, cred.gid, cred.gids, cred.machinename) == \
            (AUTH_SYS, 7, 8, (9,), b"cbhost")
        # Only RPCSEC_GSS offered: refused as Linux knfsd does; nothing changes.
        gss = callback_sec_parms4(RPCSEC_GSS, gss_cb_handles4(1, b"", b""))
        res = await c.compound([op(OP_BACKCHANNEL_CTL, BACKCHANNEL_CTL4args(1, [gss]))])
        assert res.status == NFS4ERR_ENCR_ALG_UNSUPP
        assert fake_server.call(lambda: session_of(fake_server, c).backchannel.program) == 0x40000123
    run_client(fake_server.port, body)


def test_backchannel_ctl_needs_a_session(fake_server):
    async def body(c):
        res = await c.compound_raw([op(OP_BACKCHANNEL_CTL, BACKCHANNEL_CTL4args(
            CB_PROGRAM, [callback_sec_parms4(AUTH_NONE)]))])
        assert res.status == NFS4ERR_OP_NOT_IN_SESSION
    run_client(fake_server.port, body, setup=False)


def test_cb_compound_carries_cb_sequence_on_the_back_channel_slots(fake_server):
    async def body(c):
        await c.wait_callback()
        bc = fake_server.call(lambda: session_of(fake_server, c).backchannel)
        for expected_seqid in (1, 2):
            res = await asyncio.to_thread(fake_server.run, bc.cb_compound([], tag=b"t"))
            assert res.status == NFS4_OK and res.resarray[0].tag == OP_CB_SEQUENCE
            prog, proc, args = await c.wait_callback()
            assert (prog, proc, args.minorversion) == (CB_PROGRAM, 1, 1)
            seq = args.argarray[0].value
            assert args.argarray[0].tag == OP_CB_SEQUENCE
            assert (bytes(seq.csa_sessionid), seq.csa_slotid, seq.csa_sequenceid) == \
                (c.sessionid, 0, expected_seqid)
    run_client(fake_server.port, body)


def _garbage_replies(xid: int, proc: int, args):
    ok = start_success_reply(xid)
    yield frame(struct.pack(">I", xid))                                     # record of 4 bytes
    yield frame(struct.pack(">3I", xid, 1, 0))                             # truncated ACCEPTED
    yield frame(struct.pack(">5I", xid, 1, 1, 1, 1))                       # MSG_DENIED
    yield frame(struct.pack(">3I", xid, 1, 7))                             # bad reply_stat
    yield bytes(finish_reply(ok + b"\xff" * 9))                            # body not XDR
    yield bytes(finish_reply(bytearray(ok) + struct.pack(">III", 0, 0, 1 << 30)))  # huge array
    # CB_SEQUENCE answered for another slot: the sequence is lost.
    if args is not None:
        a = args.argarray[0].value
        res = CB_COMPOUND4res(NFS4_OK, b"", [nfs_cb_resop4(OP_CB_SEQUENCE, CB_SEQUENCE4res(
            NFS4_OK, CB_SEQUENCE4resok(a.csa_sessionid, a.csa_sequenceid, 3, 0, 0)))])
        yield bytes(finish_reply(bytearray(ok) + encode(CB_COMPOUND4res, res)))
        # a valid CB_SEQUENCE result, then more results than any CB_COMPOUND of ours has ops
        # (capped at decode, nfsd/xdr/nfs4.py MAX_CB_RESULTS)
        seq = nfs_cb_resop4(OP_CB_SEQUENCE, CB_SEQUENCE4res(NFS4_OK, CB_SEQUENCE4resok(
            a.csa_sessionid, a.csa_sequenceid, a.csa_slotid, a.csa_highest_slotid, 0)))
        body = encode(CB_COMPOUND4res, CB_COMPOUND4res(NFS4_OK, b"", [seq]))
        yield bytes(finish_reply(bytearray(ok) + body[:-len(encode(nfs_cb_resop4, seq)) - 4]
                                 + struct.pack(">I", 17) + encode(nfs_cb_resop4, seq) * 17))
    yield frame(struct.pack(">6I", xid ^ 0x5A5A, 1, 0, 0, 0, 0))           # another xid


def test_malformed_callback_replies_cannot_crash_or_hang_the_server(quick_server):
    async def main():
        c = await NfsClient.connect("127.0.0.1", quick_server.port)
        try:
            await c.setup_session()
            await c.wait_callback()
            bc = quick_server.call(lambda: session_of(quick_server, c).backchannel)
            n_bad = len(list(_garbage_replies(1, 1, None))) + 1
            for i in range(n_bad):
                def answer(xid, proc, args, i=i):
                    return list(_garbage_replies(xid, proc, args))[i]
                c.answer_callback = answer
                with pytest.raises(CallbackError):
                    await asyncio.to_thread(quick_server.run, bc.cb_compound([]))
                await c.wait_callback()
                assert await sequence_flags(c) & PATH_DOWN == PATH_DOWN
                conn = quick_server.call(lambda: next(iter(session_of(quick_server, c).connections)))
                assert quick_server.call(lambda: conn.callbacks_pending) == 0
            # Unsolicited replies (no callback pending) are dropped; the server still serves.
            for j in range(50):
                c.writer.write(frame(struct.pack(">6I", j, 1, 0, 0, 0, 0)))
            await c.null()
            assert quick_server.call(lambda: conn.closed) is False
        finally:
            await c.close()
    asyncio.run(main())


def test_pending_callbacks_are_bounded_per_connection(quick_server):
    async def main():
        c = await NfsClient.connect("127.0.0.1", quick_server.port)
        c.answer_callback = lambda xid, proc, args: None      # never answers
        try:
            await c.setup_session()
            session = quick_server.call(lambda: session_of(quick_server, c))
            conn = quick_server.call(lambda: next(iter(session.connections)))

            async def many():
                from nfsd.rpc import encode_call
                calls = [asyncio.ensure_future(conn.call_back(
                    lambda xid: encode_call(xid, CB_PROGRAM, 1, 0, None))) for _ in range(20)]
                await asyncio.sleep(0)
                pending = conn.callbacks_pending
                results = await asyncio.gather(*calls, return_exceptions=True)
                return pending, results, conn.callbacks_pending
            pending, results, after = quick_server.run(many())
            assert pending <= 2 and after == 0
            assert all(isinstance(r, CallbackFailed) for r in results)
            assert sum("max_callbacks" in str(r) for r in results) >= 18
        finally:
            await c.close()
    asyncio.run(main())


def test_restart_reclaim_needed_while_in_grace_until_reclaim_complete(fake_server):
    async def body(c):
        fake_server.call(lambda: setattr(fake_server.server.sessions, "reclaim_needed", lambda client: True))
        try:
            assert await sequence_flags(c) & SEQ4_STATUS_RESTART_RECLAIM_NEEDED
            check(await c.compound([op(OP_RECLAIM_COMPLETE, RECLAIM_COMPLETE4args(False))]))
            assert not await sequence_flags(c) & SEQ4_STATUS_RESTART_RECLAIM_NEEDED
        finally:
            fake_server.call(lambda: setattr(fake_server.server.sessions, "reclaim_needed", lambda client: False))

    async def not_reclaimed(c):
        await c.setup_session(reclaim_complete=False)
        await body(c)
    run_client(fake_server.port, not_reclaimed, setup=False)


def test_lapsed_client_whose_state_is_taken_is_told_expired_all_state_revoked(nfs_server):
    async def main():
        a = await NfsClient.connect("127.0.0.1", nfs_server.port)
        b = await NfsClient.connect("127.0.0.1", nfs_server.port)
        try:
            await a.setup_session()
            await b.setup_session()
            root = await a.lookup_path("/checkpoints")
            fh, sid = await a.open_create(root, "revoked")
            mgr = nfs_server.server.sessions
            client = mgr.clients[a.clientid]
            nfs_server.call(lambda: setattr(client, "last_renew", client.last_renew - 1000))
            await b.open_existing(await b.lookup_path("/checkpoints"), "revoked")
            assert nfs_server.call(lambda: nfs_server.server.opens.has_state(client)) is False
            flags = await sequence_flags(a)
            assert flags & SEQ4_STATUS_EXPIRED_ALL_STATE_REVOKED
            assert not flags & (SEQ4_STATUS_EXPIRED_SOME_STATE_REVOKED | SEQ4_STATUS_LEASE_MOVED
                                | SEQ4_STATUS_CB_GSS_CONTEXTS_EXPIRED)
            assert not await sequence_flags(a) & SEQ4_STATUS_EXPIRED_ALL_STATE_REVOKED
            r = await a.compound([op(OP_PUTFH, PUTFH4args(fh)),
                                  op(OP_READ, READ4args(sid, 0, 1))])
            assert r.status != NFS4_OK                 # the revoked open is gone
        finally:
            await a.close()
            await b.close()
    asyncio.run(main())


def test_cb_compound_respects_the_clients_back_channel_limits(fake_server):
    async def body(c):
        await c.wait_callback()
        bc = fake_server.call(lambda: session_of(fake_server, c).backchannel)
        # nfsclient offers ca_maxrequestsize 4096 and ca_maxoperations 2.
        big = nfs_cb_argop4(OP_CB_ILLEGAL, None)
        with pytest.raises(CallbackError, match="ops above"):
            await asyncio.to_thread(fake_server.run, bc.cb_compound([big, big]))
        with pytest.raises(CallbackError, match="ca_maxrequestsize"):
            await asyncio.to_thread(fake_server.run, bc.cb_compound([], tag=b"x" * 5000))
        assert c.callbacks == []                       # nothing was sent
        res = await asyncio.to_thread(fake_server.run, bc.cb_compound([], tag=b"x" * 100))
        assert res.status == NFS4_OK and bytes(res.tag) == b"x" * 100
    run_client(fake_server.port, body)


def test_back_slot_sequence_advances_only_on_an_answered_cb_sequence(quick_server):
    async def main():
        c = await NfsClient.connect("127.0.0.1", quick_server.port)
        try:
            await c.setup_session()
            await c.wait_callback()
            bc = quick_server.call(lambda: session_of(quick_server, c).backchannel)
            answer = c.answer_callback
            c.answer_callback = lambda xid, proc, args: None        # this one is "lost"
            with pytest.raises(CallbackError):
                await asyncio.to_thread(quick_server.run, bc.cb_compound([]))
            c.answer_callback = answer
            await asyncio.to_thread(quick_server.run, bc.cb_compound([]))
            await asyncio.to_thread(quick_server.run, bc.cb_compound([]))
            seqids = [args.argarray[0].value.csa_sequenceid for _, _, args in c.callbacks]
            assert seqids == [1, 1, 2]                 # the retry reuses the unanswered seqid
        finally:
            await c.close()
    asyncio.run(main())

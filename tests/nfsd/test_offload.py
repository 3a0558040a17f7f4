"""Asynchronous COPY (RFC 7862 15.2.3, 15.8 OFFLOAD_CANCEL, 15.9 OFFLOAD_STATUS, 16.1
CB_OFFLOAD) through testkit/nfsclient.py in minor version 2 against a live server whose
offload table is made to treat small copies as large (`async_min`) and to copy in small
chunks, so a few hundred KiB exercise the chunked background copy. The store's race
hook holds a chunk to look at a copy mid-way."""
from __future__ import annotations

import asyncio
import threading

from nfsd.xdr.nfs4 import *  # noqa: F401,F403
from testkit.nfsclient import check, op
from tests.nfsd.test_ops_v42 import on, run42, setup

KiB = 1024
CHUNK = 64 * KiB
DATA = bytes(range(251)) * (1024 + 1)            # 257 KiB + 3 bytes: 5 chunks, a short tail


def small_offloads(nfs_server, **kw):
    def tune():
        t = nfs_server.server.offloads
        t.async_min, t.chunk = CHUNK, CHUNK
        for k, v in kw.items():
            setattr(t, k, v)
    nfs_server.call(tune)


def copy_async(ssid, dsid, count=0):
    return op(OP_COPY, COPY4args(ssid, dsid, 0, 0, count, False, False, []))


async def start_copy(c, src, ssid, dst, dsid):
    """COPY asked asynchronous; returns the copy stateid of the reply (which must be one)."""
    res, (r,) = await on(c, dst, copy_async(ssid, dsid), saved_fh=src)
    check(res)
    ok = r.value.value
    assert ok.cr_requirements.cr_synchronous is False
    assert ok.cr_response.wr_count == 0 and len(ok.cr_response.wr_callback_id) == 1
    return ok.cr_response.wr_callback_id[0]


async def offload_status(c, fh, sid):
    res, results = await on(c, fh, op(OP_OFFLOAD_STATUS, OFFLOAD_STATUS4args(sid)))
    if res.status != NFS4_OK:
        return res.status, None
    ok = results[0].value.value
    return NFS4_OK, (ok.osr_count, list(ok.osr_complete))


async def next_cb_offload(c, timeout=10.0):
    """The next CB_COMPOUND carrying CB_OFFLOAD (CB_NULL probes are skipped)."""
    while True:
        prog, proc, args = await c.wait_callback(timeout)
        if proc == 1 and any(a.tag == OP_CB_OFFLOAD for a in args.argarray):
            return args


def cb_offloads(c):
    return [args for _, proc, args in c.callbacks
            if proc == 1 and any(a.tag == OP_CB_OFFLOAD for a in args.argarray)]


class ChunkGate:
    """Race hook: lets `free` copied chunks of file `ino` through, then holds the next
    one (on its worker thread) until `release`."""

    def __init__(self, ino: int, free: int = 1):
        self.ino, self.free = ino, free
        self.held = threading.Event()
        self.go = threading.Event()

    def __call__(self, point: str, ino: int) -> None:
        if point != "copy.copied" or ino != self.ino:
            return
        if self.free:
            self.free -= 1
            return
        self.held.set()
        self.go.wait(20)

    def release(self) -> None:
        self.go.set()


async def fileid(c, fh):
    return (await c.getattr(fh, attrs=(FATTR4_FILEID,)))["fileid"]


def test_async_copy_completes_and_cb_offload_reports_it(nfs_client, nfs_server):
    small_offloads(nfs_server)
    store = nfs_server.store
    committed = []
    real_commit = store.commit

    def commit(ino):                     # what was made durable before CB_OFFLOAD
        result = real_commit(ino)
        committed.append(ino)
        return result

    async def body(c):
        _, src, ssid = await setup(c, "src", DATA)
        _, dst, dsid = await setup(c, "dst")
        dino = await fileid(c, dst)
        store.commit = commit
        try:
            sid = await start_copy(c, src, ssid, dst, dsid)
            args = await next_cb_offload(c)
        finally:
            del store.commit
        assert dino in committed
        seq, cb = args.argarray
        assert seq.tag == OP_CB_SEQUENCE and bytes(seq.value.csa_sessionid) == c.sessionid
        cb = cb.value
        assert bytes(cb.coa_fh) == dst
        assert (cb.coa_stateid.seqid, bytes(cb.coa_stateid.other)) == (sid.seqid, bytes(sid.other))
        assert cb.coa_offload_info.tag == NFS4_OK
        wr = cb.coa_offload_info.value
        assert (wr.wr_count, wr.wr_committed, bytes(wr.wr_writeverf)) == \
            (len(DATA), FILE_SYNC4, store.write_verifier)
        assert (await c.read(dst, dsid, 0, len(DATA) + 10))[0] == DATA
        # Delivered: the copy state is gone (the server forgets it once the client answered).
        for _ in range(200):
            if nfs_server.call(lambda: len(nfs_server.server.offloads)) == 0:
                break
            await asyncio.sleep(0.02)
        assert await offload_status(c, dst, sid) == (NFS4ERR_BAD_STATEID, None)
    run42(nfs_client, body)


def test_offload_status_mid_copy_then_cancel_stops_it(nfs_client, nfs_server):
    small_offloads(nfs_server, max_per_client=1)

    async def body(c):
        _, src, ssid = await setup(c, "src", DATA)
        _, dst, dsid = await setup(c, "dst")
        _, dst2, dsid2 = await setup(c, "dst2")
        gate = ChunkGate(await fileid(c, dst), free=1)
        nfs_server.store.race_hook = gate
        try:
            sid = await start_copy(c, src, ssid, dst, dsid)
            assert await asyncio.to_thread(gate.held.wait, 10)       # second chunk held
            assert await offload_status(c, dst, sid) == (NFS4_OK, (CHUNK, []))
            # The client's one copy slot is taken: another asynchronous COPY runs synchronously.
            res, (r,) = await on(c, dst2, copy_async(ssid, dsid2), saved_fh=src)
            check(res)
            ok = r.value.value
            assert ok.cr_response.wr_callback_id == [] and ok.cr_response.wr_count == len(DATA)
            assert ok.cr_requirements.cr_synchronous is True
            copy = nfs_server.call(lambda: nfs_server.server.offloads.find(c.clientid, sid))
            res, _ = await on(c, dst, op(OP_OFFLOAD_CANCEL, OFFLOAD_CANCEL4args(sid)))
            check(res)
            assert await offload_status(c, dst, sid) == (NFS4ERR_BAD_STATEID, None)
            res, _ = await on(c, dst, op(OP_OFFLOAD_CANCEL, OFFLOAD_CANCEL4args(sid)))
            assert res.status == NFS4ERR_BAD_STATEID
        finally:
            gate.release()
        for _ in range(500):
            if nfs_server.call(lambda: copy.task.done()):
                break
            await asyncio.sleep(0.02)
        assert nfs_server.call(lambda: copy.cancelled and copy.status is None)
        # The held chunk finished on its thread; nothing after it was copied, no CB_OFFLOAD.
        assert (await c.getattr(dst, attrs=(FATTR4_SIZE,)))["size"] == 2 * CHUNK
        assert cb_offloads(c) == []
    run42(nfs_client, body)


def test_undelivered_cb_offload_leaves_the_outcome_to_offload_status(nfs_client, nfs_server):
    small_offloads(nfs_server, retry_seconds=0.01)

    async def body(c):
        answer = c.answer_callback

        def only_cb_sequence(xid, proc, args):     # a client that drops CB_OFFLOAD
            if proc == 1:
                args = CB_COMPOUND4args(args.tag, args.minorversion, args.callback_ident,
                                        args.argarray[:1])
            return answer(xid, proc, args)
        c.answer_callback = only_cb_sequence
        _, src, ssid = await setup(c, "src", DATA)
        _, dst, dsid = await setup(c, "dst")
        sid = await start_copy(c, src, ssid, dst, dsid)
        for _ in range(500):
            status = await offload_status(c, dst, sid)
            if status[1][1]:
                break
            await asyncio.sleep(0.02)
        assert status == (NFS4_OK, (len(DATA), [NFS4_OK]))
        assert len(cb_offloads(c)) >= 1
        assert (await c.read(dst, dsid, 0, len(DATA)))[0] == DATA
        # The copy stateid is this client's only: another client, or an open stateid, or
        # one never handed out, names no copy.
        for bad in (dsid, stateid4(1, b"not-a-copy!!")):
            assert await offload_status(c, dst, bad) == (NFS4ERR_BAD_STATEID, None)
            res, _ = await on(c, dst, op(OP_OFFLOAD_CANCEL, OFFLOAD_CANCEL4args(bad)))
            assert res.status == NFS4ERR_BAD_STATEID
        other = await type(c).connect("127.0.0.1", nfs_server.port, minorversion=2)
        try:
            await other.setup_session()
            assert await offload_status(other, dst, sid) == (NFS4ERR_BAD_STATEID, None)
        finally:
            await other.close()
        # The client's expiry drops its copies.
        nfs_server.call(lambda: nfs_server.server.sessions.expire(
            nfs_server.server.sessions.clients[c.clientid], "test"))
        assert nfs_server.call(lambda: len(nfs_server.server.offloads)) == 0
    run42(nfs_client, body)


def test_without_a_back_channel_a_large_copy_is_synchronous(nfs_client, nfs_server):
    small_offloads(nfs_server)

    async def body(c):
        eid = await c.exchange_id()
        c.clientid = eid.value.eir_clientid
        cs = await c.create_session(c.clientid, eid.value.eir_sequenceid, flags=0)
        assert cs.tag == NFS4_OK
        c.use_session(cs.value.csr_sessionid, 4)
        check(await c.compound([op(OP_RECLAIM_COMPLETE, RECLAIM_COMPLETE4args(False))]))
        _, src, ssid = await setup(c, "src", DATA)
        _, dst, dsid = await setup(c, "dst")
        res, (r,) = await on(c, dst, copy_async(ssid, dsid), saved_fh=src)
        check(res)
        ok = r.value.value
        assert ok.cr_response.wr_callback_id == [] and ok.cr_response.wr_count == len(DATA)
        assert ok.cr_response.wr_committed == FILE_SYNC4
        assert ok.cr_requirements.cr_synchronous is True
        assert (await c.read(dst, dsid, 0, len(DATA)))[0] == DATA
        assert nfs_server.call(lambda: len(nfs_server.server.offloads)) == 0
    nfs_client(body, minorversion=2, setup=False)


def test_background_chunks_share_a_bounded_number_of_threads(nfs_client, nfs_server):
    small_offloads(nfs_server, chunk_slot=asyncio.Semaphore(1))

    async def body(c):
        _, src, ssid = await setup(c, "src", DATA)
        _, a, asid = await setup(c, "a")
        _, b, bsid = await setup(c, "b")
        gate = ChunkGate(await fileid(c, a), free=0)
        nfs_server.store.race_hook = gate
        try:
            sid_a = await start_copy(c, src, ssid, a, asid)
            assert await asyncio.to_thread(gate.held.wait, 10)       # a's first chunk holds the slot
            sid_b = await start_copy(c, src, ssid, b, bsid)
            for _ in range(10):
                await asyncio.sleep(0.05)
                assert await offload_status(c, b, sid_b) == (NFS4_OK, (0, []))
        finally:
            gate.release()
        done = set()
        while len(done) < 2:
            args = await next_cb_offload(c)
            cb = args.argarray[1].value
            assert cb.coa_offload_info.value.wr_count == len(DATA)
            done.add(bytes(cb.coa_stateid.other))
        assert done == {bytes(sid_a.other), bytes(sid_b.other)}
        assert (await c.read(b, bsid, 0, len(DATA)))[0] == DATA
    run42(nfs_client, body)

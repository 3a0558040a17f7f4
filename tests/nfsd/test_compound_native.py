"""The typed COMPOUND loop (nfsd/native/compound.pyx) against the reference (nfsd/compound.py).

Both loops get the same COMPOUND bytes, in the same order, against servers in the same state
(a real SessionManager with one session, deterministic fake handlers that succeed, fail, crash,
suspend or return what cannot be encoded), and must give the same reply bytes, the same outcome,
the same error (GarbageArgs and its message), the same observer calls and the same slot state.
"""
from __future__ import annotations

import asyncio

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from nfsd import compound
from nfsd.compound import GarbageArgs
from nfsd.context import Cred
from nfsd.errors import NfsError
from nfsd.optable import OpTable
from nfsd.state import ChannelAttrs, SessionManager
from nfsd.xdr.core import encode
from nfsd.xdr.nfs4 import (
    COMPOUND4args, DESTROY_CLIENTID4args, DESTROY_CLIENTID4res, GETFH4res, GETFH4resok, LOOKUP4args,
    LOOKUP4res, NFS4_OK, NFS4ERR_NOENT, NFS4ERR_RETRY_UNCACHED_REP, NFS4ERR_STALE,
    OP_DESTROY_CLIENTID, OP_GETFH, OP_LOOKUP, OP_PUTFH, OP_PUTROOTFH, OP_READ, OP_RENEW,
    OP_RESTOREFH, OP_SAVEFH, OP_SEEK, OP_SEQUENCE, OP_SETATTR, OP_WRITE, PUTFH4args, PUTFH4res,
    PUTROOTFH4res, READ4args, READ4res, READ4resok, RENEW4args, RESTOREFH4res, SAVEFH4res,
    SEEK4args, SEQ4_STATUS_ADMIN_STATE_REVOKED, SEQ4_STATUS_EXPIRED_ALL_STATE_REVOKED, SEQUENCE4args,
    SETATTR4args, SETATTR4res, UNSTABLE4, WRITE4args, WRITE4res, WRITE4resok, fattr4, nfs_argop4,
    stateid4,
)
from tests.nfsd.compound_engines import native_compound

NATIVE = native_compound()
pytestmark = pytest.mark.skipif(NATIVE is None, reason="nfsd.native.compound is not built")

SID0 = stateid4(0, bytes(12))
BEHAVIOURS = ("ok", "ok", "ok", "suspend", "noent", "stale", "crash", "unencodable", "bad_status")
SCRIPTED = (OP_PUTROOTFH, OP_PUTFH, OP_SAVEFH, OP_RESTOREFH, OP_LOOKUP, OP_GETFH, OP_READ, OP_WRITE,
            OP_SETATTR, OP_DESTROY_CLIENTID)


def _ok_result(opnum, args):
    if opnum == OP_GETFH:
        return GETFH4res(NFS4_OK, GETFH4resok(object=b"f" * 40))
    if opnum == OP_READ:
        return READ4res(NFS4_OK, READ4resok(eof=args.offset == 0, data=b"r" * args.count))
    if opnum == OP_WRITE:
        return WRITE4res(NFS4_OK, WRITE4resok(count=len(args.data), committed=UNSTABLE4,
                                               writeverf=b"v" * 8))
    if opnum == OP_SETATTR:
        return SETATTR4res(NFS4_OK, [])
    if opnum == OP_DESTROY_CLIENTID:
        return DESTROY_CLIENTID4res(NFS4_OK)
    return {OP_PUTROOTFH: PUTROOTFH4res, OP_PUTFH: PUTFH4res, OP_SAVEFH: SAVEFH4res,
            OP_RESTOREFH: RESTOREFH4res, OP_LOOKUP: LOOKUP4res}[opnum](NFS4_OK)


def _handler(opnum, script):
    async def handle(ctx, args):
        how = script[opnum]
        if how == "suspend":
            await asyncio.sleep(0)
        elif how == "noent":
            raise NfsError(NFS4ERR_NOENT)
        elif how == "stale":
            raise NfsError(NFS4ERR_STALE, "detail")
        elif how == "crash":
            raise RuntimeError("handler bug")
        elif how == "unencodable":
            return object()
        elif how == "bad_status":
            raise NfsError(123456789)          # no nfsstat4: the result cannot be encoded
        return _ok_result(opnum, args)
    return handle


class FakeServer:
    """What the COMPOUND loop uses of a server, deterministic: the same for both loops."""

    def __init__(self, script, maxresponse, maxcached, maxops, observe=True, reclaimed=True,
                 revoked=0):
        self.sessions = SessionManager(lease_time=90, boot_time=7)
        self.sessions._session_salt = b"salt"
        self.client = self.sessions.new_client(b"owner", b"verifier", (1, 0), 1)
        self.client.reclaim_complete = reclaimed
        self.client.revoked_flags = revoked
        fore = ChannelAttrs(0, 1 << 20, maxresponse, maxcached, maxops, 3)
        self.session = self.sessions.new_session(self.client, 0, fore, fore, 0, slot_bytes=2048)
        self.ops = OpTable({num: _handler(num, script) for num in SCRIPTED})
        self.observed = []
        if not observe:
            self.observer = None

    def observer(self, op, status, seconds, nbytes):
        assert seconds >= 0
        self.observed.append((op, status, nbytes))

    def slots(self):
        return ([(s.seqid, s.used, s.cached, s.in_progress, s.reply, s.signature, s.extra)
                 for s in self.session.slots], self.sessions.drc_extra)


async def _run(loop_fn, server, raw: bytes):
    out = bytearray(b"HEAD")
    try:
        outcome = await loop_fn(server, Cred(flavor=1, uid=0, gid=0), ("127.0.0.1", 700), None,
                                memoryview(bytearray(raw)), out)
    except GarbageArgs as exc:
        return ("garbage", str(exc), bytes(out))
    except Exception as exc:          # the server answers SYSTEM_ERR; both must fail alike
        return ("error", type(exc).__name__, bytes(out))
    tail = outcome.tail
    if tail is not None:
        tail = (bytes(tail[0]), tail[1])
    return ("ok", bytes(out), outcome.status, list(outcome.opnums), bool(outcome.replayed), tail)


def run_both(script, config, requests):
    """Each engine's answers to `requests` on a fresh server, plus what it left behind."""
    got = []
    for loop_fn in (compound.python_run_compound, NATIVE.run_compound):
        server = FakeServer(script, *config)
        answers = [asyncio.run(_run(loop_fn, server, raw)) for raw in requests]
        got.append((answers, server.observed, server.slots(), server.client.revoked_flags))
    return got


# ---- the COMPOUNDs ------------------------------------------------------------------

SESSIONID = (7 << 32 | 1).to_bytes(8, "big") + (2).to_bytes(4, "big") + b"salt"


@st.composite
def sequence_ops(draw):
    return nfs_argop4(OP_SEQUENCE, SEQUENCE4args(
        sa_sessionid=draw(st.sampled_from([SESSIONID, SESSIONID, b"x" * 16])),
        sa_sequenceid=draw(st.sampled_from([1, 1, 1, 2, 0, 3])), sa_slotid=draw(st.integers(0, 3)),
        sa_highest_slotid=2, sa_cachethis=draw(st.booleans())))


def _plain_ops():
    return st.one_of(
        st.sampled_from([nfs_argop4(n, None) for n in (OP_PUTROOTFH, OP_SAVEFH, OP_RESTOREFH, OP_GETFH)]),
        st.builds(lambda fh: nfs_argop4(OP_PUTFH, PUTFH4args(fh)), st.binary(max_size=12)),
        st.builds(lambda name: nfs_argop4(OP_LOOKUP, LOOKUP4args(name)), st.binary(max_size=8)),
        st.builds(lambda off, n: nfs_argop4(OP_READ, READ4args(SID0, off, n)), st.integers(0, 1),
                  st.sampled_from([0, 5, 1000, 3000, 65_535, 65_536, 70_001, 200_000])),
        st.builds(lambda d: nfs_argop4(OP_WRITE, WRITE4args(SID0, 0, UNSTABLE4, d)),
                  st.binary(max_size=40)),
        st.just(nfs_argop4(OP_SETATTR, SETATTR4args(SID0, fattr4([], b"")))),
        st.just(nfs_argop4(OP_RENEW, RENEW4args(5))),                     # 4.0 only
        st.just(nfs_argop4(OP_DESTROY_CLIENTID, DESTROY_CLIENTID4args(5))),   # sessionless
        st.just(nfs_argop4(OP_SEEK, SEEK4args(SID0, 0, 0))),              # 4.2 on, not offered
        sequence_ops(),
    )


@st.composite
def compounds(draw):
    minor = draw(st.sampled_from([0, 1, 1, 1, 2, 3]))
    ops = draw(st.lists(_plain_ops(), max_size=5))
    if minor >= 1 and draw(st.integers(0, 3)):
        ops.insert(0, draw(sequence_ops()))
    raw = bytearray(encode(COMPOUND4args, COMPOUND4args(
        tag=draw(st.binary(max_size=6)), minorversion=minor, argarray=ops)))
    taglen = int.from_bytes(raw[:4], "big")
    count_at = 4 + taglen + (-taglen % 4) + 4
    edit = draw(st.sampled_from(["none"] * 6 + ["illegal", "too_many", "flip", "cut", "extra"]))
    if edit == "illegal":          # an undeclared op number after the ops, then anything
        raw[count_at:count_at + 4] = (len(ops) + 1).to_bytes(4, "big")
        raw += draw(st.sampled_from([10044, 2, 76, 1 << 31])).to_bytes(4, "big")
        raw += draw(st.binary(max_size=8))
    elif edit == "too_many":
        raw[count_at:count_at + 4] = draw(st.sampled_from([4097, (1 << 32) - 1])).to_bytes(4, "big")
    elif edit == "flip":
        for pos, val in draw(st.lists(st.tuples(st.integers(0, len(raw) - 1), st.integers(0, 255)),
                                      min_size=1, max_size=4)):
            raw[pos] = val
    elif edit == "cut":
        raw = raw[:draw(st.integers(0, len(raw) - 1))]
    elif edit == "extra":
        raw += draw(st.binary(min_size=1, max_size=8))
    return bytes(raw)


@st.composite
def sessions_of_requests(draw):
    script = {num: draw(st.sampled_from(BEHAVIOURS)) for num in SCRIPTED}
    config = (draw(st.sampled_from([300, 2_000, 70_000, 1 << 20])),       # maxresponsesize
              draw(st.sampled_from([0, 200, 600, 4096])),                 # maxresponsesize_cached
              draw(st.integers(1, 8)),                                    # maxoperations
              draw(st.booleans()),                                        # with metrics
              draw(st.booleans()),                                        # reclaim complete
              draw(st.sampled_from([0, SEQ4_STATUS_EXPIRED_ALL_STATE_REVOKED,
                                    SEQ4_STATUS_ADMIN_STATE_REVOKED])))   # revoked state
    requests = []
    for _ in range(draw(st.integers(1, 4))):
        if requests and draw(st.integers(0, 3)) == 0:
            requests.append(requests[-1])           # a retransmission: replay or retry
        else:
            requests.append(draw(compounds()))
    return script, config, requests


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sessions_of_requests())
def test_both_loops_answer_every_compound_alike(case):
    script, config, requests = case
    python, native = run_both(script, config, requests)
    assert native == python


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_both_loops_answer_random_bytes_alike(raw):
    script = {num: "ok" for num in SCRIPTED}
    python, native = run_both(script, (1 << 20, 4096, 8), [raw])
    assert native == python


def _counted(snapshot: dict) -> dict:
    """An op-accounting snapshot without where in the histogram each op's latency fell (the
    two runs take different times): counts, bytes, and each op's number of observations."""
    return {"counts": snapshot["counts"], "bytes": (snapshot["bytes_read"], snapshot["bytes_written"]),
            "observed": {op: sum(h[:-1]) for op, h in snapshot["hist"].items()}}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sessions_of_requests())
def test_the_native_loop_counts_ops_in_c_as_the_reference_counts_them(case):
    """The appliance's op accounting: the native loop adds to OpCounters' C arrays without a
    Python call; the reference loop calls OpStats by names. Same counts per (op, status), same
    bytes, same observations per op."""
    from appliance.metrics import BUCKETS, OpStats
    script, config, requests = case
    snapshots = []
    for loop_fn, stats in ((compound.python_run_compound, OpStats()),
                           (NATIVE.run_compound, NATIVE.OpCounters(BUCKETS))):
        server = FakeServer(script, *config[:3])
        server.observer = stats
        for raw in requests:
            asyncio.run(_run(loop_fn, server, raw))
        snapshots.append(_counted(stats.snapshot()))
    assert snapshots[1] == snapshots[0]


def _seq(slot, seqid, cachethis=False):
    return nfs_argop4(OP_SEQUENCE, SEQUENCE4args(SESSIONID, seqid, slot, 2, cachethis))


def _raw(ops, minor=1, tag=b"t"):
    return encode(COMPOUND4args, COMPOUND4args(tag=tag, minorversion=minor, argarray=ops))


EDGES = {
    "empty 4.1": _raw([]),
    "empty 4.0": _raw([], 0),
    "minor 3": _raw([nfs_argop4(OP_PUTROOTFH, None)], 3),
    "too many ops": _raw([])[:-4] + (4097).to_bytes(4, "big"),
    "too many ops 4.0": _raw([], 0)[:-4] + (4097).to_bytes(4, "big"),
    "no SEQUENCE first": _raw([nfs_argop4(OP_PUTROOTFH, None)]),
    "4.0-only first": _raw([nfs_argop4(OP_RENEW, RENEW4args(5))]),
    "4.2 op first in 4.1": _raw([nfs_argop4(OP_SEEK, SEEK4args(SID0, 0, 0))]),
    "sessionless alone": _raw([nfs_argop4(OP_DESTROY_CLIENTID, DESTROY_CLIENTID4args(5))]),
    "sessionless not alone": _raw([nfs_argop4(OP_DESTROY_CLIENTID, DESTROY_CLIENTID4args(5)),
                                   nfs_argop4(OP_PUTROOTFH, None)]),
    "SEQUENCE not first": _raw([_seq(0, 1), _seq(0, 2)]),
    "4.0-only after SEQUENCE": _raw([_seq(0, 1), nfs_argop4(OP_RENEW, RENEW4args(5))]),
    "4.2 op in 4.1": _raw([_seq(0, 1), nfs_argop4(OP_SEEK, SEEK4args(SID0, 0, 0))]),
    "4.2 op in 4.2": _raw([_seq(0, 1), nfs_argop4(OP_SEEK, SEEK4args(SID0, 0, 0))], 2),
    "bad slot": _raw([_seq(3, 1)]),
    "misordered": _raw([_seq(0, 3)]),
    "4.0 COMPOUND": _raw([nfs_argop4(OP_PUTROOTFH, None), nfs_argop4(OP_GETFH, None)], 0),
    "SEQUENCE in 4.0": _raw([_seq(0, 1)], 0),
    "garbage": b"\xff\xff\xff\xff",
    "trailing bytes": _raw([_seq(0, 1)]) + b"\0\0\0\0",
}


@pytest.mark.parametrize("raw", EDGES.values(), ids=EDGES.keys())
def test_edges_alike(raw):
    script = {num: "ok" for num in SCRIPTED}
    python, native = run_both(script, (1 << 20, 4096, 8), [raw, raw])
    assert native == python


@pytest.mark.parametrize("cachethis", [False, True])
@pytest.mark.parametrize("maxcached", [0, 200, 4096])
def test_replay_retry_and_too_big_alike(cachethis, maxcached):
    script = {num: "ok" for num in SCRIPTED}
    read = nfs_argop4(OP_READ, READ4args(SID0, 0, 1000))
    first = _raw([_seq(0, 1, cachethis), nfs_argop4(OP_PUTROOTFH, None), read])
    big = _raw([_seq(1, 1, cachethis), nfs_argop4(OP_PUTROOTFH, None),
                nfs_argop4(OP_READ, READ4args(SID0, 0, 100_000))])
    other = _raw([_seq(0, 1, cachethis), nfs_argop4(OP_GETFH, None)])      # a false retry
    python, native = run_both(script, (1 << 20, maxcached, 8), [first, first, big, big, other])
    assert native == python


@pytest.mark.parametrize("budget", [0, 5000, 1 << 20])
def test_replies_kept_beyond_the_slot_reservation_alike(budget):
    """Replies above the slot's reservation (2,048 bytes here) are kept from the shared extra
    pool while it lasts (SessionManager.keep_reply, written out in the native loop): the same
    slots, extra bytes and pool total. A pool of 5,000 bytes keeps the first 3,000-byte READ
    reply and not the second; a new request in the first slot gives its bytes back."""
    script = {num: "ok" for num in SCRIPTED}
    reads = [_raw([_seq(slot, seqid), nfs_argop4(OP_PUTROOTFH, None), nfs_argop4(OP_READ, READ4args(SID0, 0, n))])
             for slot, seqid, n in ((0, 1, 3000), (1, 1, 3000), (2, 1, 1500), (0, 2, 0))]
    results = []
    for loop_fn in (compound.python_run_compound, NATIVE.run_compound):
        server = FakeServer(script, 1 << 20, 4096, 8)
        server.sessions.drc_extra_budget = budget
        states = []
        for raw in reads:
            asyncio.run(_run(loop_fn, server, raw))
            states.append(server.slots())
        results.append(states)
    assert results[1] == results[0]
    extras = [total for _, total in results[0]]
    assert extras == {0: [0, 0, 0, 0], 5000: [3084, 3084, 3084, 0], 1 << 20: [3084, 6168, 6168, 3084]}[budget]


@pytest.mark.parametrize("loop_fn", ["python", "native"])
def test_a_cancelled_compound_frees_its_slot(loop_fn):
    """Cancelled while a handler waits: the slot is free again, the reply not kept, and a
    retransmission is told its reply is gone (RETRY_UNCACHED_REP), by both loops alike."""
    run = compound.python_run_compound if loop_fn == "python" else NATIVE.run_compound
    server = FakeServer({num: "ok" for num in SCRIPTED}, 1 << 20, 4096, 8, observe=False)
    gate = None

    async def wait_forever(ctx, args):
        await gate.wait()

    server.ops.set_handler(OP_PUTROOTFH, wait_forever)
    raw = _raw([_seq(0, 1), nfs_argop4(OP_PUTROOTFH, None)])

    async def go():
        nonlocal gate
        gate = asyncio.Event()
        task = asyncio.ensure_future(run(server, Cred(flavor=0), ("127.0.0.1", 1), None,
                                         memoryview(bytearray(raw)), bytearray()))
        for _ in range(5):
            await asyncio.sleep(0)
        assert server.session.slots[0].in_progress
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        slot = server.session.slots[0]
        assert not slot.in_progress and not slot.cached and slot.seqid == 1
        out = bytearray()
        outcome = await run(server, Cred(flavor=0), ("127.0.0.1", 1), None,
                            memoryview(bytearray(raw)), out)
        assert outcome.status == NFS4ERR_RETRY_UNCACHED_REP
        return bytes(out)

    got = asyncio.run(go())
    assert got == asyncio.run(_retry_reply_of_reference(raw))


async def _retry_reply_of_reference(raw):
    """The reference's reply to a retry of a request whose reply was never kept."""
    server = FakeServer({num: "ok" for num in SCRIPTED}, 1 << 20, 4096, 8, observe=False)
    slot = server.session.slots[0]
    slot.seqid, slot.used = 1, True
    out = bytearray()
    await compound.python_run_compound(server, Cred(flavor=0), ("127.0.0.1", 1), None,
                                       memoryview(bytearray(raw)), out)
    return bytes(out)


def test_the_server_runs_the_native_loop_unless_told_otherwise():
    import os
    if os.environ.get("CKPTGW_ENGINE", "").strip().lower() == "python":
        assert compound.run_compound is compound.python_run_compound
    else:
        assert compound.COMPOUND_ENGINE == "native" and compound.run_compound is NATIVE.run_compound



def test_a_new_request_takes_the_typed_sequence_path(monkeypatch):
    """The native loop answers a new request's SEQUENCE itself (nfsd/ops/session.py's
    sequence() only for the rest), and the bytes are the reference's."""
    from nfsd.ops import session as session_ops
    raw = _raw([_seq(0, 1), nfs_argop4(OP_PUTROOTFH, None)])
    python, native = run_both({num: "ok" for num in SCRIPTED}, (1 << 20, 4096, 8), [raw])
    assert native == python
    monkeypatch.setattr(session_ops, "sequence", None)
    server = FakeServer({num: "ok" for num in SCRIPTED}, 1 << 20, 4096, 8)
    assert asyncio.run(_run(NATIVE.run_compound, server, raw)) == python[0][0]


# ---- handle_call: the RPC call around the loop ----------------------------------------------

def _call(xid, args: bytes, proc=1):
    from nfsd.rpc import CallReceived
    record = bytearray(args)
    return CallReceived(xid, 100003, 4, proc, Cred(flavor=1, uid=0, gid=0, gids=(0,)), memoryview(record), record)


def _masked(reply):
    """A reply's bytes with its xid (after the record mark) zeroed; None stays None."""
    if reply is None:
        return None
    raw = bytearray(bytes(reply))
    raw[4:8] = bytes(4)
    return bytes(raw)


def test_handle_call_twin_answers_as_the_reference():
    """nfsd/native/compound.pyx handle_call against NfsServer.python_handle_call (and its
    _run_compound) on one server: NULL, a connection no export admits, a `secure` export's
    refused port, garbage arguments, too short to hold a minor version, a 4.1 COMPOUND without
    SEQUENCE, 4.0 COMPOUNDs (an idempotent one and a REMOVE the duplicate-request cache keeps:
    its retransmission answered from the cache, and dropped while the first still runs), the
    client-work stamp (REMOVE is client work, GETFH is not)."""
    from types import SimpleNamespace

    from nfsd.drc import IN_PROGRESS, request_key
    from nfsd.server import NfsServer
    from nfsd.xdr.nfs4 import OP_PUTROOTFH, OP_REMOVE, REMOVE4args
    from tests.nfsd.conftest import FakeStore, open_exports

    server = NfsServer(FakeStore(), open_exports())
    getfh = [nfs_argop4(OP_PUTROOTFH, None), nfs_argop4(OP_GETFH, None)]
    remove = [nfs_argop4(OP_PUTROOTFH, None), nfs_argop4(OP_REMOVE, REMOVE4args(b"x"))]
    cases = [
        ("null", 0, b"", {}),
        ("not admitted", 1, _compound_bytes(getfh, minor=0), {"allowed": False}),
        ("port refused", 1, _compound_bytes(getfh, minor=0), {"port_ok": False}),
        ("garbage", 1, b"\0\0\0\0\0\0\0\1\0\0", {}),
        ("too short", 1, b"\0\0", {}),
        ("4.1 without SEQUENCE", 1, _compound_bytes(getfh, minor=1), {}),
        ("4.0 getfh", 1, _compound_bytes(getfh, minor=0), {}),
        ("4.0 remove", 1, _compound_bytes(remove, minor=0), {}),
    ]
    xids = iter(range(1000, 2000))
    for name, proc, args, conn_kw in cases:
        seen = []
        for handle in (server.python_handle_call, server.handle_call):
            conn = SimpleNamespace(allowed=True, port_ok=True, peer=("127.0.0.1", 800 + len(seen)), closed=False)
            for key, value in conn_kw.items():
                setattr(conn, key, value)
            server.last_client_op = 0.0
            call = _call(next(xids), args, proc)
            reply = asyncio.run(handle(call, conn))
            stamped = server.last_client_op != 0.0
            again = asyncio.run(handle(call, conn))          # the same call once more: a retransmission
            seen.append((_masked(reply), stamped, _masked(again)))
        assert seen[0] == seen[1], name
        if name == "4.0 remove":
            assert seen[0][1] and seen[0][2] == seen[0][0]           # stamped; replayed from the cache
        if name == "4.0 getfh":
            assert not seen[0][1]
    # a retransmission while the first still runs is dropped
    for handle in (server.python_handle_call, server.handle_call):
        conn = SimpleNamespace(allowed=True, port_ok=True, peer=("127.0.0.1", 900), closed=False)
        call = _call(next(xids), _compound_bytes(remove, minor=0))
        server.replies_v40.begin(request_key(conn.peer, call.xid, call.proc, call.args))
        assert asyncio.run(handle(call, conn)) is None
        assert server.replies_v40.begin(request_key(conn.peer, call.xid, call.proc, call.args)) is IN_PROGRESS


def _compound_bytes(ops, minor):
    return encode(COMPOUND4args, COMPOUND4args(tag=b"t", minorversion=minor, argarray=ops))


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=40),
                 st.builds(lambda taglen, rest: taglen.to_bytes(4, "big") + rest,
                           st.sampled_from([0, 1, 3, 4, 5, 8, 0xFFFFFFFC, 0xFFFFFFFF]), st.binary(max_size=24))))
def test_handle_call_twin_answers_any_arguments_as_the_reference(args):
    """Whatever the arguments' bytes (a tag length past the end, no room for the minor version,
    garbage after it): the same reply from both, the typed minor-version read included."""
    from types import SimpleNamespace

    from nfsd.server import NfsServer
    from tests.nfsd.conftest import FakeStore, open_exports

    server = NfsServer(FakeStore(), open_exports())
    replies = []
    for xid, handle in ((1, server.python_handle_call), (2, server.handle_call)):
        conn = SimpleNamespace(allowed=True, port_ok=True, peer=("127.0.0.1", 800 + xid), closed=False)
        replies.append(_masked(asyncio.run(handle(_call(xid, args), conn))))
    assert replies[0] == replies[1]

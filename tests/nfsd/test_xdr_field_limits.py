"""Decode limits on unbounded array members ("Owner.field" keys of nfsd/xdr/nfs4.py
DECODE_LIMITS): cap entries decode, cap+1 is refused before anything is allocated, by the
reference codec and the native one alike (same XdrError), by both COMPOUND decoders
(GarbageArgs) and by a live server (GARBAGE_ARGS)."""
from __future__ import annotations

import asyncio
import struct
import tracemalloc

import pytest

from nfsd import native
from nfsd.compound import GarbageArgs
from nfsd.xdr import nfs4 as n
from nfsd.xdr.core import XdrError, encode
from nfsd.xdr.rpc import GARBAGE_ARGS, SUCCESS
from nfsd.xdr.xparser import XdrSyntaxError, load_spec
from testkit.nfsclient import NfsClient
from tests.nfsd.compound_engines import DECODERS

pytestmark = pytest.mark.timeout(60)


def u32(*ws: int) -> bytes:
    return b"".join(struct.pack(">I", w) for w in ws)


SID = n.stateid4(seqid=1, other=b"s" * 12)


def create_session(count: int) -> bytes:
    """CREATE_SESSION4args with `count` AUTH_NONE sec parms (csa_sec_parms is its last field)."""
    attrs = n.channel_attrs4(0, 8192, 8192, 8192, 16, 8, [])
    one = encode(n.CREATE_SESSION4args, n.CREATE_SESSION4args(
        csa_clientid=1, csa_sequence=1, csa_flags=0, csa_fore_chan_attrs=attrs,
        csa_back_chan_attrs=attrs, csa_cb_program=0x40000000,
        csa_sec_parms=[n.callback_sec_parms4(n.AUTH_NONE)]))
    return one[:-8] + u32(count) + u32(n.AUTH_NONE) * count


def test_stateid(count: int) -> bytes:
    sid = encode(n.stateid4, SID)
    return u32(count) + sid * count


test_stateid.__test__ = False      # a builder, not a test

CASES = [
    pytest.param(n.CREATE_SESSION4args, n.OP_CREATE_SESSION, create_session, n.MAX_CB_SEC_PARMS,
                 "CREATE_SESSION4args.csa_sec_parms", id="csa_sec_parms"),
    pytest.param(n.TEST_STATEID4args, n.OP_TEST_STATEID, test_stateid, n.MAX_TEST_STATEIDS,
                 "TEST_STATEID4args.ts_stateids", id="ts_stateids"),
]


def test_limit_values():
    assert n.DECODE_LIMITS["CREATE_SESSION4args.csa_sec_parms"] == n.MAX_CB_SEC_PARMS == 16
    assert n.DECODE_LIMITS["BACKCHANNEL_CTL4args.bca_sec_parms"] == 16
    assert n.DECODE_LIMITS["TEST_STATEID4args.ts_stateids"] == n.MAX_TEST_STATEIDS == 1024
    for key, cap in n.DECODE_LIMITS.items():
        if "." in key:
            owner, field = key.split(".")
            i = getattr(n, owner).xdr_field_names.index(field)
            assert getattr(n, owner).xdr_fields[i][1].maxlen == cap, key


SPEC = """
struct pt { int x; int y; };
struct shape { pt points<>; opaque tag<>; int fixed[2]; pt few<4>; };
union u switch (int k) { case 1: pt arm<>; default: void; };
"""


def test_member_limits_in_the_parser():
    ns = load_spec(SPEC, limits={"shape.points": 3, "shape.tag": 5, "u.arm": 2})
    pts = [ns["pt"](1, 2)] * 3
    v = ns["shape"](points=pts, tag=b"abcde", fixed=[1, 2], few=[])
    assert ns["shape"].unpack(memoryview(encode(ns["shape"], v)), 0)[0].points == pts
    with pytest.raises(XdrError, match="shape.points: length 6 exceeds the declared maximum 3"):
        encode(ns["shape"], ns["shape"](points=pts * 2, tag=b"", fixed=[1, 2], few=[]))
    with pytest.raises(XdrError, match="shape.tag: length 6 exceeds"):
        ns["shape"].unpack(memoryview(u32(0, 6) + b"abcdef\0\0" + u32(1, 2, 0)), 0)
    with pytest.raises(XdrError, match="u.arm: length 3 exceeds the declared maximum 2"):
        ns["u"].unpack(memoryview(u32(1, 3) + u32(0) * 6), 0)
    for bad in ("shape.fixed", "shape.few", "shape.nothere", "nostruct.points"):
        with pytest.raises(XdrSyntaxError, match="limits"):
            load_spec(SPEC, limits={bad: 2})


def _decoders():
    ref = [("python", lambda t, data: t.unpack(memoryview(data), 0))]
    if native.engine("xdr_nfs4") == "native":       # CKPTGW_ENGINE=native: a missing build fails
        from nfsd.native import xdr_nfs4 as xn
        ref.append(("native", lambda t, data: xn.decode(t, data, 0)))
    return ref


def _outcome(dec, t, data):
    try:
        v, end = dec(t, data)
    except XdrError as e:
        return ("XdrError", e.type_name, e.pos, str(e))
    return ("ok", end)


@pytest.mark.parametrize("t, opnum, build, cap, field", CASES)
def test_cap_decodes_and_cap_plus_one_is_refused_identically(t, opnum, build, cap, field):
    _check_cap(t, build, cap, field)


def cb_results(count: int) -> bytes:
    """A CB_COMPOUND4res (a client's answer to our callback) with `count` CB_GETATTR errors
    (op and status: 8 bytes a result, ~100 decoded; resarray is its last field)."""
    return u32(n.NFS4_OK, 0, count) + u32(n.OP_CB_GETATTR, n.NFS4ERR_BADHANDLE) * count


def test_a_callback_reply_is_capped_like_a_request():
    """The back channel's replies come from the client too: CB_COMPOUND4res.resarray."""
    assert n.DECODE_LIMITS["CB_COMPOUND4res.resarray"] == n.MAX_CB_RESULTS == 16
    _check_cap(n.CB_COMPOUND4res, cb_results, n.MAX_CB_RESULTS, "CB_COMPOUND4res.resarray")


def _check_cap(t, build, cap: int, field: str) -> None:
    ok, over = build(cap), build(cap + 1)
    decs = _decoders()
    assert {_outcome(d, t, ok) for _, d in decs} == {("ok", len(ok))}
    refused = {_outcome(d, t, over) for _, d in decs}
    assert len(refused) == 1, refused
    kind, name, _, msg = refused.pop()
    assert (kind, name) == ("XdrError", field)
    assert msg.endswith(f"length {cap + 1} exceeds the declared maximum {cap}")
    # refused on the count, before the entries: a count of 2**31 behind it costs nothing
    huge = build(0)[:-4] + u32(1 << 31) + b"\0" * 64
    for _, d in decs:
        tracemalloc.start()
        try:
            with pytest.raises(XdrError, match="exceeds the declared maximum"):
                d(t, huge)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 64 * 1024


def compound(opnum: int, body: bytes) -> bytes:
    return u32(0, 1, 1, opnum) + body       # tag "", minor version 1, one op


@pytest.mark.parametrize("t, opnum, build, cap, field", CASES)
@pytest.mark.parametrize("decode_compound", DECODERS)
def test_compound_decoders(decode_compound, t, opnum, build, cap, field):
    args = decode_compound(memoryview(compound(opnum, build(cap))))
    assert len(args.ops) == 1 and args.ops[0].tag == opnum
    with pytest.raises(GarbageArgs, match=f"{field}: length {cap + 1} exceeds"):
        decode_compound(memoryview(compound(opnum, build(cap + 1))))


def test_server_answers_garbage_args(fake_server):
    async def body(c):
        for _, opnum, build, cap, _ in (p.values for p in CASES):
            r = await c.call(1, compound(opnum, build(cap + 1)))
            assert (r.accepted, r.stat) == (True, GARBAGE_ARGS)
            r = await c.call(1, compound(opnum, build(cap)))       # decoded, then answered
            assert (r.accepted, r.stat) == (True, SUCCESS)
        await c.null()                                             # the connection still works

    async def main():
        c = await NfsClient.connect("127.0.0.1", fake_server.port)
        try:
            await body(c)
        finally:
            await c.close()
    asyncio.run(main())

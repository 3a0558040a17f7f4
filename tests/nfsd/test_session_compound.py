"""The COMPOUND engine's pieces without a network: decoding, error results, state objects."""
from __future__ import annotations

import pytest

from nfsd.compound import (
    GarbageArgs, OP_NAMES, error_result, result_status, status_name,
)
from nfsd.state import SessionManager, next_seqid
from nfsd.xdr.core import decode, encode
from nfsd.xdr.nfs4 import (
    COMPOUND4args, NFS4ERR_IO, NFS4ERR_OP_ILLEGAL, OP_ACCESS, OP_ILLEGAL, OP_PUTROOTFH,
    OP_SETATTR, OP_WRITE, UNSTABLE4, WRITE4args, nfs_argop4, nfs_resop4, stateid4,
)
from tests.nfsd.compound_engines import DECODERS, LOOPS


@pytest.mark.parametrize("opnum", sorted(OP_NAMES))
def test_every_op_has_an_encodable_error_result(opnum):
    res = error_result(opnum, NFS4ERR_IO)
    assert res.tag == (opnum if opnum != OP_ILLEGAL else OP_ILLEGAL)
    assert decode(nfs_resop4, encode(nfs_resop4, res)) == res
    assert result_status(res.value) == NFS4ERR_IO


def test_callback_op_numbers_do_not_shadow_fore_channel_ops():
    assert OP_NAMES[OP_ACCESS] == "ACCESS"
    assert OP_NAMES[OP_ILLEGAL] == "ILLEGAL"
    assert status_name(NFS4ERR_OP_ILLEGAL) == "NFS4ERR_OP_ILLEGAL"
    assert error_result(OP_SETATTR, NFS4ERR_IO).value.attrsset == []


def _args(ops, minorversion=1):
    return encode(COMPOUND4args, COMPOUND4args(tag=b"tag", minorversion=minorversion,
                                               argarray=ops))


@pytest.mark.parametrize("decode_compound", DECODERS)
def test_write_data_is_a_view_of_the_record(decode_compound):
    record = bytearray(_args([nfs_argop4(OP_WRITE, WRITE4args(stateid4(0, bytes(12)), 0,
                                                              UNSTABLE4, b"D" * 4096))]))
    args = decode_compound(memoryview(record))
    data = args.ops[0].value.data
    assert isinstance(data, memoryview) and data.obj is record and bytes(data) == b"D" * 4096


@pytest.mark.parametrize("decode_compound", DECODERS)
def test_decode_stops_at_an_unknown_op(decode_compound):
    raw = bytearray(_args([nfs_argop4(OP_PUTROOTFH, None)]))
    raw[12:16] = (2).to_bytes(4, "big")               # two ops; the second is op 77777
    raw += (77777).to_bytes(4, "big") + b"junk"
    args = decode_compound(memoryview(raw))
    assert [o.tag for o in args.ops] == [OP_PUTROOTFH] and args.illegal_opnum == 77777


@pytest.mark.parametrize("cut", [0, 3, 7, 12, 15, 17])
@pytest.mark.parametrize("decode_compound", DECODERS)
def test_truncated_compound_is_garbage(cut, decode_compound):
    raw = _args([nfs_argop4(OP_PUTROOTFH, None), nfs_argop4(OP_PUTROOTFH, None)])
    with pytest.raises(GarbageArgs):
        decode_compound(memoryview(raw[:len(raw) - 1 - cut]))


@pytest.mark.parametrize("decode_compound", DECODERS)
def test_trailing_bytes_are_garbage(decode_compound):
    with pytest.raises(GarbageArgs):
        decode_compound(memoryview(_args([nfs_argop4(OP_PUTROOTFH, None)]) + b"\0\0\0\0"))


@pytest.mark.parametrize("decode_compound", DECODERS)
def test_unknown_minor_version_is_not_decoded_further(decode_compound):
    args = decode_compound(memoryview(_args([nfs_argop4(OP_PUTROOTFH, None)], 7) + b"whatever"))
    assert args.minorversion == 7 and args.ops == []


@pytest.mark.parametrize("decode_compound", DECODERS)
def test_huge_op_count_is_refused_without_decoding(decode_compound):
    raw = bytearray(_args([]))
    raw[12:16] = (1 << 30).to_bytes(4, "big")
    assert decode_compound(memoryview(raw)).illegal_opnum == -1


def test_seqids_wrap():
    assert next_seqid(0xFFFFFFFF) == 0 and next_seqid(5) == 6


def test_clientids_carry_the_boot_epoch():
    mgr = SessionManager(boot_time=0x12345678)
    c = mgr.new_client(b"owner", b"verifier", (1, 0), 1)
    assert c.clientid >> 32 == 0x12345678
    assert not mgr.is_stale_clientid(c.clientid)
    assert mgr.is_stale_clientid(0x1111111100000001)


def test_expiry_calls_hooks_and_spares_busy_clients():
    mgr = SessionManager(lease_time=10)
    seen = []
    mgr.on_client_expired.append(seen.append)
    mgr.on_client_expired.append(lambda c: 1 / 0)        # a broken hook harms no one else
    idle = mgr.new_client(b"a", b"v" * 8, (1, 0), 1)
    busy = mgr.new_client(b"b", b"v" * 8, (1, 0), 1)
    from nfsd.state import ChannelAttrs
    attrs = ChannelAttrs(0, 4096, 4096, 0, 8, 2)
    session = mgr.new_session(busy, 0, attrs, attrs, 0)
    session.slots[1].in_progress = True
    now = idle.last_renew + 1000
    assert mgr.expire_idle(now) == [idle]
    assert seen == [idle] and idle.expired and busy.clientid in mgr.clients
    session.slots[1].in_progress = False
    assert mgr.expire_idle(now) == [busy]
    assert session.sessionid not in mgr.sessions


# ---- fuzzing the engine without sockets ------------------------------------------------

from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402


@pytest.mark.parametrize("decode_compound", DECODERS)
@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_random_bytes_decode_or_are_garbage(decode_compound, data):
    try:
        decode_compound(memoryview(data))
    except GarbageArgs:
        pass


def _engine_server():
    from nfsd.ops import session as session_ops
    from nfsd.server import NfsServer
    from tests.nfsd.conftest import FakeStore, open_exports
    return NfsServer(FakeStore(), open_exports(), handlers=dict(session_ops.HANDLERS))


_SEED_COMPOUNDS = [
    _args([nfs_argop4(OP_PUTROOTFH, None)]),
    _args([nfs_argop4(OP_WRITE, WRITE4args(stateid4(0, bytes(12)), 0, UNSTABLE4, b"abc"))], 2),
]


@pytest.mark.parametrize("run_compound", LOOPS)
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(_SEED_COMPOUNDS), st.lists(st.tuples(st.integers(0, 200), st.integers(0, 255)),
                                                  max_size=8),
       st.integers(0, 120))
def test_mutated_compounds_never_crash_the_engine(run_compound, seed, flips, cut):
    import asyncio
    from nfsd.context import Cred
    raw = bytearray(seed)
    for pos, val in flips:
        if pos < len(raw):
            raw[pos] = val
    raw = raw[:max(0, len(raw) - cut)] if cut < len(raw) else raw
    server = _engine_server()

    async def go():
        out = bytearray()
        try:
            outcome = await run_compound(server, Cred(flavor=0), ("127.0.0.1", 1), None,
                                         memoryview(raw), out)
        except GarbageArgs:
            return
        assert outcome.status == int.from_bytes(out[:4], "big")
    try:
        asyncio.run(go())
    finally:
        server._executor.shutdown(wait=False)


def test_handler_tables_merge(monkeypatch):
    import sys
    import types
    from nfsd.ops import load_handlers

    async def a(ctx, args):
        pass

    async def b(ctx, args):
        pass
    for name, table in (("fake_ops_one", {1: a}), ("fake_ops_two", {1: a, 2: b}),
                        ("fake_ops_bad", {1: b})):
        mod = types.ModuleType(name)
        mod.HANDLERS = table
        monkeypatch.setitem(sys.modules, name, mod)
    assert load_handlers(("fake_ops_one", "fake_ops_two", "fake_ops_missing")) == {1: a, 2: b}
    with pytest.raises(RuntimeError):
        load_handlers(("fake_ops_one", "fake_ops_bad"))

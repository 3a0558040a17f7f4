"""nfsd.native.rpc (typed Cython, issue 37) held to nfsd/rpc.py, its specification.

1. Every test of tests/nfsd/test_rpc.py runs again here against the native RpcConnection
   (its `conn()` factory is swapped for this module's tests, nothing else changes).
2. A differential test: hypothesis streams of valid, truncated and malformed calls, REPLY
   records, random fragmentation, garbage, oversized marks and runs of empty fragments, fed
   to both implementations in the same random chunks, through receive_data or through
   get_buffer/buffer_updated with partial fills; the events must be equal field by field and
   broken/partial/records/buffered equal after every feed.
3. The build gate: unless CKPTGW_ENGINE=python, the extension must import (a CI whose build
   broke must not pass as the Python engine), and engine("rpc") must say "native".

The helpers `feed_both`, `Mismatch` are shared with tests/fuzz/test_rpc_native_fuzz.py.
"""
from __future__ import annotations

import importlib
import os
import struct

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import nfsd.rpc as ref
import tests.nfsd.test_rpc as ref_tests
from nfsd.context import Cred
from nfsd.native import engine
from nfsd.rpc import (
    CallReceived, ConnectionError as RpcConnectionError, Program, RecordPool, ReplyReceived,
    SendReply, encode_call,
)
from nfsd.xdr.rpc import AUTH_NONE, AUTH_SYS

try:
    native = importlib.import_module("nfsd.native.rpc")
except ImportError:             # test_the_extension_is_built says whether that is allowed
    native = None

needs_native = pytest.mark.skipif(native is None, reason="nfsd.native.rpc is not built")
NFS = 100003
PROGRAMS = {NFS: Program(NFS, 4, 4, frozenset({0, 1})), 100005: Program(100005, 1, 3, frozenset({0, 5}))}


# ---- 3. the build gate ----------------------------------------------------------

def test_the_extension_is_built_unless_the_python_engine_is_asked_for():
    if os.environ.get("CKPTGW_ENGINE", "").strip().lower() == "python":
        assert engine("rpc") == "python"
        return
    assert native is not None, ("nfsd.native.rpc does not import: build it (scripts/bootstrap.sh, "
                                "or `setup.py build_ext --inplace`), or set CKPTGW_ENGINE=python")
    assert engine("rpc") == "native"
    assert native.RpcConnection is not ref.RpcConnection


# ---- 1. tests/nfsd/test_rpc.py against the native implementation ----------------

@pytest.fixture(scope="module", autouse=True)
def _native_conn_factory():
    """test_rpc's tests call its module-level conn(); for this module's run, conn() makes a
    native connection (module scope: hypothesis tests see no function-scoped fixture)."""
    if native is None:
        yield
        return
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ref_tests, "conn", lambda **kw: native.RpcConnection(ref_tests.PROGRAMS, **kw))
        yield


for _name, _test in list(vars(ref_tests).items()):
    if _name.startswith("test_") and callable(_test):
        globals()[f"{_name}__native"] = needs_native(_test)
del _name, _test


@needs_native
def test_the_swapped_factory_makes_native_connections():
    assert type(ref_tests.conn()) is native.RpcConnection


# ---- 2. differential ----------------------------------------------------------------

class Mismatch(AssertionError):
    pass


def event_fields(ev) -> tuple:
    """An event as comparable values (args as bytes, the record by its content)."""
    if isinstance(ev, CallReceived):
        assert ev.args.obj is ev.record, "args must view the record"
        c = ev.cred
        return ("call", ev.xid, ev.prog, ev.vers, ev.proc,
                (type(c), c.flavor, c.uid, c.gid, c.gids, c.machinename),
                bytes(ev.args), type(ev.record), len(ev.record), bytes(ev.record))
    if isinstance(ev, SendReply):
        return ("reply", type(ev.data), ev.data, ev.xid, ev.reason)
    if isinstance(ev, ReplyReceived):
        return ("backchannel", ev.xid, type(ev.record), ev.record)
    if isinstance(ev, RpcConnectionError):
        return ("error", ev.reason)
    raise Mismatch(f"unknown event {ev!r}")


def state(c) -> tuple:
    return (c.broken, c.partial, c.records, c.buffered)


def make_pair(max_record=ref.DEFAULT_MAX_RECORD, max_fragments=ref.DEFAULT_MAX_FRAGMENTS,
              direct_threshold=ref.DIRECT_RECEIVE_THRESHOLD, scratch_size=ref.SCRATCH_SIZE,
              pooled=False, programs=PROGRAMS):
    kw = dict(max_record=max_record, max_fragments=max_fragments, direct_threshold=direct_threshold,
              scratch_size=scratch_size)
    return (ref.RpcConnection(programs, pool=RecordPool() if pooled else None, **kw),
            native.RpcConnection(programs, pool=RecordPool() if pooled else None, **kw))


def _give_back(conn, events) -> None:
    """The transport's part: a call's pooled buffer goes back once its reply is sent."""
    if conn.pool is None:
        return
    records = [ev.record for ev in events if isinstance(ev, CallReceived)]
    events.clear()
    for record in records:
        conn.pool.give_back(record)


def feed_both(a, b, data: bytes, plan, peek: bool = False) -> None:
    """Feed `data` to a (reference) and b (native) in the same steps and compare.

    plan: an iterator of steps, each ("recv", n) for receive_data of n bytes or
    ("buf", sizehint, fill) for get_buffer(sizehint) and buffer_updated of at most `fill`
    bytes (a partial recv). peek: after every step, also compare the length of the buffer
    get_buffer would hand out (where the next bytes go: scratch or the record's own tail),
    as a transport whose recv found nothing does. Raises Mismatch at the first difference."""
    pos = 0
    steps = iter(plan)
    while pos < len(data):
        step = next(steps, ("recv", len(data) - pos))
        if step[0] == "recv":
            n = max(1, step[1])
            chunk = data[pos:pos + n]
            ea, eb = a.receive_data(chunk), b.receive_data(chunk)
            pos += len(chunk)
            what = f"receive_data({len(chunk)}) at {pos - len(chunk)}"
        else:
            _, hint, fill = step
            if a.broken != b.broken:
                raise Mismatch("broken differs before get_buffer")
            if a.broken:
                return
            ba, bb = a.get_buffer(hint), b.get_buffer(hint)
            if len(ba) != len(bb):
                raise Mismatch(f"get_buffer({hint}) at {pos}: {len(ba)} vs {len(bb)} bytes")
            n = min(len(ba), max(1, fill), len(data) - pos)
            ba[:n] = data[pos:pos + n]
            bb[:n] = data[pos:pos + n]
            ba.release()
            bb.release()
            ea, eb = a.buffer_updated(n), b.buffer_updated(n)
            pos += n
            what = f"buffer_updated({n}) at {pos - n}"
        fa, fb = [event_fields(e) for e in ea], [event_fields(e) for e in eb]
        if fa != fb:
            raise Mismatch(f"{what}: events differ\n reference {fa!r:.2000}\n native    {fb!r:.2000}")
        if state(a) != state(b):
            raise Mismatch(f"{what}: state (broken, partial, records, buffered) "
                           f"{state(a)} vs {state(b)}")
        _give_back(a, ea)
        _give_back(b, eb)
        if peek and not a.broken:
            ba, bb = a.get_buffer(-1), b.get_buffer(-1)
            la, lb = len(ba), len(bb)
            ba.release()
            bb.release()
            if la != lb or state(a) != state(b):
                raise Mismatch(f"after {what}: get_buffer hands out {la} vs {lb} bytes, "
                               f"state {state(a)} vs {state(b)}")


# -- stream pieces --

def frame(body: bytes, last: bool = True) -> bytes:
    return struct.pack(">I", (0x80000000 if last else 0) | len(body)) + body


def fragmented(body: bytes, cuts: list[int], empties: int) -> bytes:
    """body as fragments cut at `cuts` (sorted offsets), `empties` empty fragments first."""
    out = bytearray(frame(b"", last=False) * empties)
    bounds = sorted({c % (len(body) + 1) for c in cuts}) if body else []
    start = 0
    for c in bounds:
        out += frame(body[start:c], last=False)
        start = c
    out += frame(body[start:])
    return bytes(out)


SYS = Cred(AUTH_SYS, uid=1000, gid=100, gids=(100, 27), machinename=b"host-a")
creds = st.one_of(
    st.none(), st.just(SYS), st.just(Cred(AUTH_NONE)),
    st.builds(lambda u, g, gids, name: Cred(AUTH_SYS, uid=u, gid=g, gids=tuple(gids), machinename=name),
              st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1),
              st.lists(st.integers(0, 2**32 - 1), max_size=18), st.binary(max_size=260)))


def _args():
    return st.one_of(st.binary(max_size=300),
                     st.builds(lambda b, n: bytes([b]) * n, st.integers(0, 255),
                               st.sampled_from([1000, 5000, 17000, 70000, 140000])))


@st.composite
def call_body(draw) -> bytes:
    """One call or reply record body (no mark), valid or damaged in one way."""
    xid = draw(st.integers(0, 2**32 - 1))
    prog = draw(st.sampled_from([NFS, NFS, NFS, 100005, 100021]))
    vers = draw(st.sampled_from([4, 4, 1, 3, 5]))
    proc = draw(st.sampled_from([0, 1, 1, 2, 5]))
    args = draw(_args())
    body = bytearray(encode_call(xid, prog, vers, proc, draw(creds), args)[4:])
    how = draw(st.sampled_from(["ok"] * 6 + ["truncate", "rpcvers", "reply", "mtype", "flavor",
                                              "credlen", "verflen", "word", "short_reply"]))
    if how == "truncate":
        del body[draw(st.integers(0, len(body))):]
    elif how == "rpcvers":
        struct.pack_into(">I", body, 8, draw(st.sampled_from([0, 1, 3, 2**32 - 1])))
    elif how == "reply":
        struct.pack_into(">I", body, 4, 1)
    elif how == "short_reply":
        body = bytearray(struct.pack(">5I", xid, 1, 1, 1, 1)[:draw(st.integers(0, 20))])
    elif how == "mtype":
        struct.pack_into(">I", body, 4, draw(st.integers(2, 2**32 - 1)))
    elif how == "flavor":
        struct.pack_into(">I", body, 24, draw(st.sampled_from([2, 3, 6, 390003, 2**32 - 1])))
    elif how == "credlen":
        struct.pack_into(">I", body, 28, draw(st.sampled_from([0, 1, 3, 401, 2**31, 2**32 - 1]))
                         if draw(st.booleans()) else draw(st.integers(0, 2**32 - 1)))
    elif how == "verflen" and len(body) >= 40:
        (n,) = struct.unpack_from(">I", body, 28)
        at = 32 + ((n + 3) & ~3) + 4
        if at + 4 <= len(body):
            struct.pack_into(">I", body, at, draw(st.sampled_from([1, 2, 400, 401, 2**32 - 1])))
    elif how == "word" and len(body) >= 4:
        at = draw(st.integers(0, len(body) // 4 - 1)) * 4
        struct.pack_into(">I", body, at, draw(st.integers(0, 2**32 - 1)))
    return bytes(body)


@st.composite
def same_length_creds(draw) -> bytes:
    """Calls whose AUTH_SYS bodies have one length but differ (the credential cache's memcmp)."""
    name = draw(st.binary(max_size=12))
    ngids = draw(st.integers(0, 16))
    out = b""
    for xid in range(draw(st.integers(2, 5))):
        cred = Cred(AUTH_SYS, uid=draw(st.sampled_from([0, 1000, 1001])), gid=draw(st.sampled_from([0, 100])),
                    gids=tuple(draw(st.lists(st.sampled_from([0, 27, 100]), min_size=ngids, max_size=ngids))),
                    machinename=draw(st.sampled_from([name, name[::-1]])))
        out += encode_call(xid, NFS, 4, 1, cred, b"")
    return out


def _opaque(flavor: int, body: bytes, pad: bool = True) -> bytes:
    return struct.pack(">II", flavor, len(body)) + body + (b"\0" * (-len(body) % 4) if pad else b"")


@st.composite
def raw_auth_call(draw) -> bytes:
    """A call whose cred and verifier are written by hand: bodies at the 400-byte limit and
    just past it, AUTH_SYS bodies with bytes after the gids or cut short, missing pads."""
    head = struct.pack(">6I", draw(st.integers(0, 2**32 - 1)), 0, 2, NFS, 4, draw(st.sampled_from([0, 1])))
    sizes = st.sampled_from([0, 1, 3, 4, 8, 396, 399, 400, 401, 404])
    if draw(st.booleans()):
        sys_body = bytearray(encode_call(0, NFS, 4, 0, draw(creds.filter(lambda c: c is not None)), b"")[36:-8])
        how = draw(st.sampled_from(["tail", "cut", "same"]))
        if how == "tail":
            sys_body += draw(st.binary(min_size=1, max_size=8))
        elif how == "cut" and sys_body:
            del sys_body[draw(st.integers(0, len(sys_body) - 1)):]
        cred = _opaque(AUTH_SYS, bytes(sys_body), draw(st.booleans()))
    else:
        cred = _opaque(draw(st.sampled_from([AUTH_NONE, AUTH_SYS, 6])), bytes(draw(sizes)), draw(st.booleans()))
    verf = _opaque(draw(st.sampled_from([AUTH_NONE, 1, 6])), b"v" * draw(sizes), draw(st.booleans()))
    return frame(head + cred + verf + draw(st.binary(max_size=16)))


@st.composite
def piece(draw) -> bytes:
    kind = draw(st.sampled_from(["record"] * 6 + ["fragmented", "garbage", "oversized", "empties",
                                                   "repeat", "creds", "rawauth", "rawauth"]))
    if kind == "rawauth":
        return draw(raw_auth_call())
    if kind == "creds":
        return draw(same_length_creds())
    if kind == "record":
        return frame(draw(call_body()))
    if kind == "repeat":                       # the same credential bytes again: the cache
        body = draw(call_body())
        return frame(body) * draw(st.integers(2, 4))
    if kind == "fragmented":
        body = draw(call_body())
        return fragmented(body, draw(st.lists(st.integers(0, 2**20), max_size=6)),
                          draw(st.integers(0, 3)))
    if kind == "garbage":
        return draw(st.binary(max_size=64))
    if kind == "oversized":
        mark = draw(st.sampled_from([0x7FFFFFFF, 0xFFFFFFFF, 0x80000000 | 4 << 20, 0x80100000,
                                     0x00100000, 0x80004000, 0x80004001]))
        return struct.pack(">I", mark) + draw(st.binary(max_size=200))
    # many empty non-last fragments, then maybe a record
    n = draw(st.integers(1, 3000))
    return frame(b"", last=False) * n + (frame(draw(call_body())) if draw(st.booleans()) else b"")


plans = st.lists(st.one_of(
    st.tuples(st.just("recv"), st.integers(1, 9000)),
    st.tuples(st.just("recv"), st.integers(1, 8)),
    st.tuples(st.just("buf"), st.sampled_from([-1, 0, 1, 65536]), st.integers(1, 70000)),
    st.tuples(st.just("buf"), st.sampled_from([-1, 4096]), st.integers(1, 9))), max_size=40)

limits = st.fixed_dictionaries({
    "max_record": st.sampled_from([ref.DEFAULT_MAX_RECORD, ref.DEFAULT_MAX_RECORD, 0, 3, 28, 64, 200, 4096,
                                   20000, 150000, 2**40]),
    "max_fragments": st.sampled_from([ref.DEFAULT_MAX_FRAGMENTS, ref.DEFAULT_MAX_FRAGMENTS, 0, 1, 2, 3, 10,
                                      1000]),
    "direct_threshold": st.sampled_from([ref.DIRECT_RECEIVE_THRESHOLD, ref.DIRECT_RECEIVE_THRESHOLD, 0, 1,
                                         2, 3, 8, 64, 1024]),
    "scratch_size": st.sampled_from([ref.SCRATCH_SIZE, ref.SCRATCH_SIZE, 4, 5, 64, 1000]),
    "pooled": st.booleans(),
})


@needs_native
@settings(max_examples=int(os.environ.get("CKPTGW_RPC_DIFF_EXAMPLES", 400)), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(piece(), min_size=1, max_size=8), plans, limits, st.booleans())
def test_native_and_reference_agree_on_any_stream(pieces, plan, lim, peek):
    a, b = make_pair(**lim)
    feed_both(a, b, b"".join(pieces), plan, peek)


@needs_native
@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=1, max_size=3000), plans, limits, st.booleans())
def test_native_and_reference_agree_on_random_bytes(data, plan, lim, peek):
    a, b = make_pair(**lim)
    feed_both(a, b, data, plan, peek)


def _sweep_streams() -> list[bytes]:
    call = encode_call(7, NFS, 4, 1, SYS, b"0123456789ab")
    body = call[4:]
    reply = bytearray(body)
    struct.pack_into(">I", reply, 4, 1)
    return [call,
            fragmented(body, [5, 5, 30, 31], 2),                          # empty fragments too
            frame(bytes(reply)) + frame(body[:13]) + call,                  # back channel, truncated
            encode_call(8, NFS, 4, 0, None, b"") * 2 + frame(b"\xff" * 3),
            struct.pack(">I", 0x80000000 | 40) + body[:20]]                 # a mark claiming more


@needs_native
@pytest.mark.parametrize("stream", _sweep_streams(), ids=["call", "fragments", "mixed", "nulls", "claim"])
def test_every_split_point_and_boundary_agrees(stream):
    """Exhaustive where random plans rarely land: every cut of the stream, direct_threshold
    and scratch sizes near the fragment sizes, max_record and max_fragments at each boundary,
    with a peek at get_buffer after each feed (scratch or the record's own tail)."""
    n = len(stream)
    configs = [dict(direct_threshold=t, scratch_size=s, pooled=p)
               for t in (0, 1, 2, 3, 4, 5, 8, 13, 16, 10**9) for s in (4, 5, 7, 16, 64) for p in (False, True)]
    configs += [dict(max_record=m) for m in range(0, n + 2)]
    configs += [dict(max_fragments=f, max_record=m) for f in range(0, 8) for m in (n, 10**6)]
    for cfg in configs:
        for cut in range(1, n):
            a, b = make_pair(**cfg)
            feed_both(a, b, stream, [("recv", cut), ("recv", 1), ("recv", n)], peek=True)
        a, b = make_pair(**cfg)
        feed_both(a, b, stream, [("buf", -1, 1)] * n, peek=True)


@needs_native
def test_every_auth_length_at_the_limits_agrees():
    sizes = (0, 1, 3, 4, 5, 8, 396, 397, 399, 400, 401, 403, 404, 405)
    head = struct.pack(">6I", 1, 0, 2, NFS, 4, 1)
    sys_body = encode_call(0, NFS, 4, 0, SYS, b"")[36:-8]
    bodies = [(f, bytes(range(256)) * 2, n) for f in (AUTH_NONE, AUTH_SYS, 6) for n in sizes]
    bodies += [(AUTH_SYS, sys_body + b"\0" * k, len(sys_body) + k) for k in range(0, 9)]
    bodies += [(AUTH_SYS, sys_body, k) for k in range(len(sys_body))]
    for flavor, body, n in bodies:
        for verf_len in sizes:
            for cred_pad, verf_pad in ((True, True), (False, True), (True, False)):
                record = frame(head + _opaque(flavor, body[:n], cred_pad)
                               + _opaque(AUTH_NONE, b"v" * verf_len, verf_pad) + b"args")
                for cut in (len(record), len(record) - 4, len(record) - 5):
                    a, b = make_pair()
                    data = record if cut == len(record) else frame(record[4:cut])
                    feed_both(a, b, data, [])


# ---- targeted checks of what the differential test cannot see ----------------------

@needs_native
def test_the_credential_of_a_connection_is_parsed_once_and_shared():
    c = native.RpcConnection(PROGRAMS)
    calls = c.receive_data(encode_call(1, NFS, 4, 1, SYS, b"") * 3 + encode_call(4, NFS, 4, 0, None, b"") * 2)
    assert [e.cred for e in calls] == [SYS] * 3 + [Cred(AUTH_NONE)] * 2
    assert calls[0].cred is calls[1].cred is calls[2].cred and calls[3].cred is calls[4].cred
    other = Cred(AUTH_SYS, uid=1001, gid=100, gids=(100, 27), machinename=b"host-a")   # one byte differs
    e1, e2 = c.receive_data(encode_call(5, NFS, 4, 1, other, b"") + encode_call(6, NFS, 4, 1, SYS, b""))
    assert e1.cred == other and e2.cred == SYS and e2.cred is not calls[0].cred


@needs_native
def test_a_malformed_credential_of_the_cached_length_is_not_taken_from_the_cache():
    c = native.RpcConnection(PROGRAMS)
    good = bytearray(encode_call(1, NFS, 4, 1, SYS, b""))
    assert isinstance(c.receive_data(bytes(good))[0], CallReceived)
    struct.pack_into(">I", good, 4 + 24 + 8 + 8 + 8 + 8, 17)  # ngids 2 -> 17, same body length
    (ev,) = c.receive_data(bytes(good))
    assert isinstance(ev, SendReply) and ev.reason == "malformed AUTH_SYS"


@needs_native
def test_receive_data_takes_bytes_bytearray_and_memoryview():
    data = encode_call(3, NFS, 4, 1, SYS, b"abcd")
    for feed in (data, bytearray(data), memoryview(data), memoryview(bytearray(data))[0:]):
        (ev,) = native.RpcConnection(PROGRAMS).receive_data(feed)
        assert ev.xid == 3 and bytes(ev.args) == b"abcd"


@needs_native
def test_buffer_updated_beyond_the_buffer_handed_out_is_refused():
    c = native.RpcConnection(PROGRAMS, scratch_size=64)
    buf = c.get_buffer(-1)
    assert len(buf) == 64
    buf.release()
    with pytest.raises(ValueError):
        c.buffer_updated(65)
    with pytest.raises(ValueError):
        c.buffer_updated(-1)
    assert c.receive_data(encode_call(9, NFS, 4, 0, None, b""))[0].xid == 9


@needs_native
def test_a_scratch_smaller_than_a_record_mark_does_not_hang():
    assert native.RpcConnection(PROGRAMS, scratch_size=3).receive_data(b"\x80\0\0\0") == []

"""Differential tests of the generated Cython XDR codecs (nfsd.native.xdr_nfs4, issue 37 point 2)
against the reference codec (nfsd.xdr.core + nfs4_prot.x), which is the specification.

For every type the native module has a codec for (every type object nfs4 exports: all of
COMPOUND4args/res and CB_COMPOUND4args/res and the rest), hypothesis draws values from the
declared types (tests/fuzz/xdr_strategies.py) and checks:

  (a) both codecs encode the value to the same bytes, and decode those bytes to the same
      value (strictly: same classes, bool is not int, memoryview where the reference has one)
      and the same end position;
  (b) random bytes and damaged encodings (truncated, a word rewritten to a length-like
      value, bits flipped) decode to the same value or fail with XdrError of the same
      type_name, position and message in both; so do the recorded client traffic of
      tests/fuzz/corpus (COMPOUND4args after the RPC call header, COMPOUND4res after the
      reply header) and mutations of it (tests/fuzz/mutate.py);
  (c) a value with one leaf made wrong (out-of-range int, bad enum or bool, over-long opaque
      or array, bad union tag, wrong Python type) is refused by both with the same error
      (XdrError with the same type_name and message; or the same other exception where the
      reference lets one through), or accepted by both with the same bytes.

CKPTGW_LONG=1 runs many more examples.
"""
from __future__ import annotations

import os
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nfsd import native
from nfsd.xdr import nfs4, rpc
from nfsd.xdr.core import XdrError
from tests.fuzz.mutate import mutate, split_records
from tests.fuzz.xdr_strategies import XdrStrategies

if native.engine("xdr_nfs4") != "native":      # CKPTGW_ENGINE=native makes a missing build fail
    pytest.skip("nfsd.native.xdr_nfs4 is not built (pip install -e . / setup.py build_ext)",
                allow_module_level=True)

from nfsd.native import xdr_nfs4 as xn  # noqa: E402

LONG = os.environ.get("CKPTGW_LONG") == "1"
EXAMPLES = 150 if LONG else 4
TYPES = xn.types()
strategy_for = XdrStrategies(max_bytes=24, max_items=3, max_depth=6).for_type
CORPUS_DIR = os.path.join(os.path.dirname(__file__), "..", "fuzz", "corpus")


# --- comparison ----------------------------------------------------------------------------------

def same(a, b) -> bool:
    """Strict equality: same classes all the way down (True is not 1, bytes not memoryview)."""
    while True:
        if type(a) is not type(b):
            return False
        if isinstance(a, memoryview):
            return a.format == b.format == "B" and a.tobytes() == b.tobytes()
        if isinstance(a, list):
            return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
        kind = getattr(type(a), "xdr_kind", None)
        if kind == "union":
            return same(a.tag, b.tag) and same(a.value, b.value)
        if kind != "struct":
            return a == b
        link = type(a).xdr_linked
        for name in type(a).__slots__:
            if name != link and not same(getattr(a, name), getattr(b, name)):
                return False
        if not link:
            return True
        a, b = getattr(a, link), getattr(b, link)      # linked lists: iterate


def _dec(fn, t, data, pos=0):
    try:
        v, p = fn(t, data, pos)
    except XdrError as e:
        return ("XdrError", e.type_name, e.pos, str(e))
    return ("ok", v, p)


def ref_decode(t, data, pos=0):
    return _dec(lambda t, d, p: t.unpack(memoryview(d), p), t, data, pos)


def nat_decode(t, data, pos=0):
    return _dec(xn.decode, t, data, pos)


def check_decode(t, data, pos=0):
    r, n = ref_decode(t, data, pos), nat_decode(t, data, pos)
    if r[0] == "ok" and n[0] == "ok":
        assert same(r[1], n[1]), (t, data, r[1], n[1])
        assert r[2] == n[2]
    else:
        assert r == n, (t, bytes(data))
    return r


def _enc(fn, t, v):
    out = bytearray(b"\xee\xee\xee\xee")       # encoders append
    try:
        fn(t, v, out)
    except XdrError as e:
        return ("XdrError", e.type_name, str(e))
    except Exception as e:                     # the reference lets a few through: so must we
        return (type(e).__name__, str(e))
    return ("ok", bytes(out))


def check_encode(t, v):
    r = _enc(lambda t, v, out: t.pack(v, out), t, v)
    n = _enc(xn.encode, t, v)
    assert r == n, (t, v)
    return r


# --- (c) one wrong leaf --------------------------------------------------------------------------

_BAD_OBJECTS = (None, "x", 1.5, b"", [], object())


def _bad_int(t, rnd):
    return rnd.choice([t.lo - 1, t.hi + 1, 2 ** 70, -(2 ** 70), 1.0, True, rnd.choice(_BAD_OBJECTS)])


def corrupt(t, v, rnd, depth=0):
    """v (a valid value of t) with one part made wrong, or odd but acceptable (True for 1)."""
    kind = t.xdr_kind
    if depth > 8 or rnd.random() < 0.08:
        return rnd.choice(_BAD_OBJECTS)
    if kind == "int":
        return _bad_int(t, rnd)
    if kind == "bool":
        return rnd.choice([2, -1, 1.0, 0, "x", None, [1]])
    if kind == "enum":
        out = [x for x in (max(t.values) + 1, min(t.values) - 1, 2 ** 31, 2 ** 40) if x not in t.values]
        return rnd.choice(out + [True, float(min(t.values)), None, [1], "x"])
    if kind == "fopaque":
        return rnd.choice([b"\1" * (t.size + 1), b"\1" * max(0, t.size - 1), bytearray(t.size),
                           memoryview(bytes(t.size)), "x" * t.size, None, [0] * t.size])
    if kind in ("vopaque", "string"):
        cands = [None, 7, bytearray(b"ab"), memoryview(b"abc"), "h\xe9llo", "\ud800", [1, 2]]
        if t.maxlen <= 4096:
            cands += [b"z" * (t.maxlen + 1)] * 3
        return rnd.choice(cands)
    if kind == "varray":
        cands = [None, 3, "abc", tuple(v)]
        if t.maxlen <= 1024:
            cands += [list(v) + [v[0] if v else None] * (t.maxlen + 1 - len(v))] * 2
        if v:
            i = rnd.randrange(len(v))
            w = list(v)
            w[i] = corrupt(t.elem, v[i], rnd, depth + 1)
            cands += [w] * 4
        return rnd.choice(cands)
    if kind == "optional":
        if v is None:
            return rnd.choice([5, "x", []])
        return corrupt(t.elem, v, rnd, depth + 1)
    if kind == "struct":
        names = t.__slots__
        vals = [getattr(v, n) for n in names]
        i = rnd.randrange(len(names))
        vals[i] = corrupt(t.xdr_fields[i][1], vals[i], rnd, depth + 1)
        return t(*vals)
    if kind == "union":
        disc = t.xdr_disc
        if v.value is not None and rnd.random() < 0.6:
            arm = t.xdr_arms.get(v.tag, t.xdr_default)
            return t(v.tag, corrupt(arm[1], v.value, rnd, depth + 1))
        if disc.xdr_kind == "enum":
            tags = [x for x in (max(disc.values) + 1, -1, 2 ** 31, 2 ** 33) if x not in disc.values]
        elif disc.xdr_kind == "bool":
            tags = [2, -1]
        else:
            tags = [disc.lo - 1, disc.hi + 1, 10 ** 6]
        tags += [True, 1.0, "x", [1], None]
        if rnd.random() < 0.3:
            return t(v.tag, rnd.choice([None, 3, "x", b"", [1]]))     # wrong arm value
        return t(rnd.choice(tags), v.value)
    raise AssertionError(kind)


# --- (b) damaged bytes ---------------------------------------------------------------------------

_WORDS = (0xFFFFFFFF, 0x7FFFFFFF, 0x80000000, 0x10000, 1025, 257, 65, 64, 17, 5, 3, 2, 1, 0)


def damage(data: bytes, rnd) -> bytes:
    b = bytearray(data)
    how = rnd.randrange(4)
    if how == 0 or len(b) < 4:
        del b[rnd.randrange(len(b) + 1):]
    elif how == 1:
        i = rnd.randrange(0, len(b) - 3, 4)
        b[i:i + 4] = rnd.choice(_WORDS).to_bytes(4, "big")
    elif how == 2:
        for _ in range(rnd.randint(1, 4)):
            i = rnd.randrange(len(b))
            b[i] ^= 1 << rnd.randrange(8)
    else:
        i = rnd.randrange(0, len(b) - 3, 4)
        b[i:i + 4] = (int.from_bytes(b[i:i + 4], "big") + rnd.randint(-3, 3) & 0xFFFFFFFF).to_bytes(4, "big")
    return bytes(b)


# --- the tests -----------------------------------------------------------------------------------

def test_inventory():
    # every type nfs4 exports has a native codec; the four hot roots have fast entry points
    exported = {id(getattr(nfs4, n)) for n in nfs4.__all__ if hasattr(getattr(nfs4, n), "xdr_kind")}
    assert exported <= {id(t) for t in TYPES}
    assert len(TYPES) > 400
    for name in ("COMPOUND4args", "COMPOUND4res", "CB_COMPOUND4args", "CB_COMPOUND4res"):
        assert callable(getattr(xn, f"decode_{name}")) and callable(getattr(xn, f"encode_{name}"))
    assert xn.decode("utf8string", b"\0\0\0\1a\0\0\0") == (b"a", 8)


@pytest.mark.parametrize("t", TYPES, ids=[t.xdr_name for t in TYPES])
@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.filter_too_much])
@given(data=st.data())
def test_type_differential(t, data):
    value = data.draw(strategy_for(t), label="value")
    rnd = data.draw(st.randoms(use_true_random=False), label="rnd")
    # (a) same bytes, same decoded value
    r = check_encode(t, value)
    assert r[0] == "ok", r
    wire = r[1][4:]
    got = check_decode(t, wire)
    assert got[0] == "ok" and got[2] == len(wire)
    check_decode(t, b"\xff\xff\xff\xff" + wire, 4)              # at an offset, in a bytearray
    check_decode(t, bytearray(wire))
    # (b) damaged encodings and random bytes
    for _ in range(3):
        check_decode(t, damage(wire, rnd))
    check_decode(t, data.draw(st.binary(max_size=48), label="noise"))
    # (c) a wrong leaf is refused alike
    for _ in range(3):
        check_encode(t, corrupt(t, value, rnd))


def _corpus_bodies():
    """(type, body, offset of the COMPOUND) of every recorded call and reply."""
    out = []
    for name in sorted(os.listdir(CORPUS_DIR)):
        t = nfs4.COMPOUND4args if name.endswith(".bin") else nfs4.COMPOUND4res
        for body in split_records(open(os.path.join(CORPUS_DIR, name), "rb").read()):
            _msg, pos = rpc.rpc_msg.unpack(memoryview(body), 0)
            out.append((t, body, pos))
    return out


def test_corpus_and_mutations():
    bodies = _corpus_bodies()
    assert len(bodies) > 100
    ok = 0
    for t, body, pos in bodies:
        ok += check_decode(t, body, pos)[0] == "ok"
    assert ok > 100                                   # the recorded traffic decodes
    rnd = random.Random(37)
    pool = [b for _t, b, _p in bodies]
    for _ in range(20000 if LONG else 1500):
        t, body, pos = rnd.choice(bodies)
        framed = mutate(rnd, body, pool)
        check_decode(t, framed[4:], pos)
        check_decode(t, damage(body, rnd), pos)


def test_hot_entry_points():
    for t, body, pos in _corpus_bodies():
        dec = xn.decode_COMPOUND4args if t is nfs4.COMPOUND4args else xn.decode_COMPOUND4res
        enc = xn.encode_COMPOUND4args if t is nfs4.COMPOUND4args else xn.encode_COMPOUND4res
        try:
            v, end = t.unpack(memoryview(body), pos)
        except XdrError:
            continue
        v2, end2 = dec(body, pos)
        assert same(v, v2) and end == end2
        out = bytearray()
        enc(v2, out)
        assert bytes(out) == bytes(body[pos:end])
    with pytest.raises(XdrError) as e:
        xn.decode_COMPOUND4args(b"\0\0\0\5abc")
    with pytest.raises(XdrError) as r:
        nfs4.COMPOUND4args.unpack(memoryview(b"\0\0\0\5abc"), 0)
    assert (e.value.type_name, str(e.value)) == (r.value.type_name, str(r.value)) == (
        "utf8string", "utf8string: truncated input at offset 0 (buffer has 7 bytes)")


def test_zero_copy_write_data():
    w = nfs4.WRITE4args(nfs4.stateid4(1, b"o" * 12), 0, nfs4.UNSTABLE4, b"\xab" * 5000)
    c = nfs4.COMPOUND4args(b"", 1, [nfs4.nfs_argop4(nfs4.OP_WRITE, w)])
    out = bytearray()
    xn.encode_COMPOUND4args(c, out)
    v, _ = xn.decode_COMPOUND4args(out)
    data = v.argarray[0].value.data
    assert isinstance(data, memoryview) and data.obj is out and data.tobytes() == b"\xab" * 5000


def test_long_linked_list():
    # entry4 chains are decoded and encoded iteratively, like the reference's
    e = None
    for i in range(50000):
        e = nfs4.entry4(i, b"n%d" % i, nfs4.fattr4([], b""), e)
    wire = bytearray()
    nfs4.entry4.pack(e, wire)
    out = bytearray()
    xn.encode(nfs4.entry4, e, out)
    assert out == wire
    v, end = xn.decode(nfs4.entry4, bytes(wire))
    assert end == len(wire) and v == e


def test_bounds_checked_before_allocating():
    # a count of 2**32-1 array elements in a few bytes is refused, not allocated
    for name in ("nfs_argop4", "COMPOUND4args"):
        t = getattr(nfs4, name)
        for data in (b"\0\0\0\0\0\0\0\1\xff\xff\xff\xff", b"\0\0\0\0\0\0\0\1\0\0\0\x09\xff\xff\xff\xff"):
            check_decode(t, data)
    r = check_decode(nfs4.bitmap4, b"\0\0\0\x41" + b"\0" * 260)       # DECODE_LIMITS: 64 words
    assert r[0] == "XdrError" and r[1] == "bitmap4"


def test_entry_points_and_inputs():
    # the per-op entry points (what compound.py decodes and encodes op by op) and codec()
    seq = nfs4.nfs_argop4(nfs4.OP_SEQUENCE, nfs4.SEQUENCE4args(b"s" * 16, 1, 0, 0, True))
    wire = bytearray()
    nfs4.nfs_argop4.pack(seq, wire)
    blob = b"\0" * 8 + bytes(wire) + b"\0" * 4
    for dec in (xn.decode_nfs_argop4, xn.codec(nfs4.nfs_argop4).decode,
                lambda b, p: xn.decode("nfs_argop4", b, p)):
        v, end = dec(blob, 8)
        assert same(v, seq) and end == 8 + len(wire)
        v, end = dec(memoryview(blob)[4:], 4)              # a memoryview slice as input
        assert same(v, seq) and end == 4 + len(wire)
    res = nfs4.nfs_resop4(nfs4.OP_PUTFH, nfs4.PUTFH4res(nfs4.NFS4_OK))
    ref = bytearray(b"xy")
    nfs4.nfs_resop4.pack(res, ref)
    for enc in (xn.encode_nfs_resop4, xn.codec("nfs_resop4").encode):
        out = bytearray(b"xy")
        enc(res, out)
        assert out == ref
    # past the end of the buffer: both say truncated, alike
    for t in (nfs4.COMPOUND4args, nfs4.utf8string, nfs4.stateid4, nfs4.nfs_argop4, nfs4.bitmap4):
        r = check_decode(t, bytes(wire), len(wire) + 4)
        assert r[0] == "XdrError"
    with pytest.raises(KeyError):
        xn.codec("no_such_type")

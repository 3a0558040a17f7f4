"""Bad input never escapes as anything but XdrError, and the message names the type."""
from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nfsd.xdr import XdrError, decode, encode
from nfsd.xdr import nfs4 as n
from nfsd.xdr import rpc as r
try:                                    # rootdir-less test dirs (pytest's default)
    from test_xdr_roundtrip import strategy_for
except ImportError:                     # if tests/ becomes a package
    from tests.nfsd.test_xdr_roundtrip import strategy_for


def words(*ws: int) -> bytes:
    return struct.pack(f">{len(ws)}I", *ws)


def _sample_compound() -> bytes:
    sid = n.stateid4(7, b"s" * 12)
    args = n.COMPOUND4args(tag=b"tg", minorversion=1, argarray=[
        n.nfs_argop4(n.OP_SEQUENCE, n.SEQUENCE4args(b"q" * 16, 1, 0, 0, False)),
        n.nfs_argop4(n.OP_PUTFH, n.PUTFH4args(b"\x01\x02\x03")),
        n.nfs_argop4(n.OP_OPEN, n.OPEN4args(1, n.OPEN4_SHARE_ACCESS_WRITE, 0,
                                            n.open_owner4(9, b"owner"),
                                            n.openflag4(n.OPEN4_CREATE, n.createhow4(
                                                n.UNCHECKED4, n.fattr4([1 << 4], b"\0" * 8))),
                                            n.open_claim4(n.CLAIM_NULL, b"file.bin"))),
        n.nfs_argop4(n.OP_WRITE, n.WRITE4args(sid, 4096, n.UNSTABLE4, b"payload!x")),
        n.nfs_argop4(n.OP_GETATTR, n.GETATTR4args([0x10, 0x2])),
    ])
    return encode(n.COMPOUND4args, args)


def test_truncation_at_every_offset_raises_xdr_error():
    wire = _sample_compound()
    decode(n.COMPOUND4args, wire)
    for cut in range(len(wire)):
        with pytest.raises(XdrError):
            decode(n.COMPOUND4args, wire[:cut])


def test_truncated_rpc_header_raises_xdr_error():
    wire = words(1, 0, 2, 100003, 4, 1, 1, 12) + words(0, 0, 0) + words(0, 0)
    decode(r.rpc_msg, wire)
    for cut in range(len(wire)):
        with pytest.raises(XdrError):
            decode(r.rpc_msg, wire[:cut])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pos=st.integers(0, 10_000), byte=st.integers(0, 255), extra=st.binary(max_size=8))
def test_corrupted_bytes_only_raise_xdr_error(pos, byte, extra):
    wire = bytearray(_sample_compound())
    wire[pos % len(wire)] = byte
    for data in (bytes(wire), bytes(wire) + extra):
        try:
            decode(n.COMPOUND4args, data)
        except XdrError:
            pass


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_only_raise_xdr_error(data):
    for t in (n.COMPOUND4args, n.COMPOUND4res, r.rpc_msg, n.fattr4, n.entry4):
        try:
            decode(t, data)
        except XdrError:
            pass


def test_unknown_op_is_a_bad_discriminant():
    wire = words(0, 1, 1, 9999)
    with pytest.raises(XdrError, match="nfs_argop4"):
        decode(n.COMPOUND4args, wire)


def test_union_without_default_rejects_unlisted_enum_member():
    # netloc4 has arms for all three netloc_type4 values; 4 is not a member.
    with pytest.raises(XdrError, match="netloc4"):
        decode(n.netloc4, words(4, 0))
    # createhow4: EXCLUSIVE4_1 is valid; 7 is not a createmode4 at all.
    with pytest.raises(XdrError, match="createhow4"):
        decode(n.createhow4, words(7))


def test_unknown_enum_value():
    with pytest.raises(XdrError, match="nfs_ftype4"):
        decode(n.nfs_ftype4, words(0))
    with pytest.raises(XdrError, match="stable_how4"):
        decode(n.WRITE4args, words(0) + b"\0" * 12 + b"\0" * 8 + words(3, 0))


def test_oversize_lengths():
    with pytest.raises(XdrError, match="nfs_fh4.*129.*128"):
        decode(n.nfs_fh4, words(129) + b"\0" * 132)
    with pytest.raises(XdrError, match="exceeds"):
        decode(r.opaque_auth, words(0, 401) + b"\0" * 404)
    with pytest.raises(XdrError, match="exceeds"):
        decode(r.authsys_parms, words(0, 0, 0, 0, 17) + b"\0" * 68)
    # An absurd count with no data behind it fails fast instead of allocating.
    with pytest.raises(XdrError):
        decode(n.COMPOUND4args, words(0, 1, 0xFFFFFFFF))
    with pytest.raises(XdrError):
        decode(n.bitmap4, words(0xFFFFFFFF))
    with pytest.raises(XdrError):
        decode(n.attrlist4, words(0xFFFFFFF0))


def test_bad_bools():
    seq = words(n.OP_SEQUENCE) + b"\0" * 16 + words(1, 0, 0, 2)
    with pytest.raises(XdrError, match="bool"):
        decode(n.nfs_argop4, seq)
    with pytest.raises(XdrError, match="bool"):
        decode(n.fattr4_hidden, words(2))
    with pytest.raises(XdrError, match="newtime4"):
        decode(n.newtime4, words(2))
    with pytest.raises(XdrError, match="bool"):      # optional flag other than 0/1
        decode(n.dirlist4, words(2, 0))
    e = encode(n.entry4, n.entry4(1, b"a", n.fattr4([], b""), None))
    with pytest.raises(XdrError, match="nextentry"):
        decode(n.entry4, e[:-4] + words(5))


def test_fixed_opaque_truncated():
    with pytest.raises(XdrError, match="verifier4"):
        decode(n.verifier4, b"1234567")


def test_pack_errors_are_xdr_errors_naming_the_type():
    sid = n.stateid4(1, b"x" * 12)
    cases = [
        (n.stateid4, n.stateid4(-1, b"x" * 12), "stateid4"),          # uint32 range
        (n.stateid4, n.stateid4(1, b"x" * 11), "stateid4"),           # fixed opaque length
        (n.stateid4, n.stateid4(1, "not bytes!!!"), "stateid4"),
        (n.offset4, 1 << 64, "unsigned hyper"),
        (n.nfs_fh4, b"f" * 129, "nfs_fh4"),
        (n.nfs_fh4, 12, "nfs_fh4"),
        (n.stable_how4, 9, "stable_how4"),
        (n.WRITE4args, n.WRITE4args(sid, 0, 9, b""), "stable_how4"),
        (n.SEQUENCE4args, n.SEQUENCE4args(b"s" * 16, 1, 0, 0, 2), "SEQUENCE4args"),
        (n.fattr4_hidden, None, "bool"),
        (n.nfs_argop4, n.nfs_argop4(9999), "nfs_argop4"),
        (n.netloc4, n.netloc4(4, b""), "netloc4"),
        (n.COMPOUND4args, "nope", "COMPOUND4args"),
        (n.bitmap4, [1, -1], "bitmap4"),
        (n.bitmap4, 5, "bitmap4"),
        (n.verifier4, b"short", "verifier4"),
        (r.authsys_parms, r.authsys_parms(0, b"h", 0, 0, list(range(17))), "gids"),
    ]
    for t, v, name in cases:
        with pytest.raises(XdrError, match=name):
            encode(t, v)


def test_xdr_error_is_value_error_with_details():
    try:
        decode(n.nfs_fh4, words(200))
    except XdrError as e:
        assert isinstance(e, ValueError)
        assert e.type_name == "nfs_fh4" and e.pos == 0
    else:
        raise AssertionError("accepted")


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_truncated_random_compounds_raise_xdr_error(data):
    wire = encode(n.COMPOUND4args, data.draw(strategy_for(n.COMPOUND4args)))
    cut = data.draw(st.integers(0, len(wire) - 1))
    with pytest.raises(XdrError):
        decode(n.COMPOUND4args, wire[:cut])

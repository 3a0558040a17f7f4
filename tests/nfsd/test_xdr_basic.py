"""Smoke tests of the XDR layer: the generated modules import and round-trip real messages."""
from nfsd.xdr import XdrError, decode, encode
from nfsd.xdr import nfs4, rpc
from nfsd.xdr.nfs4 import (COMPOUND4args, COMPOUND4res, GETATTR4args, GETFH4res, GETFH4resok,
                           NFS4_OK, NFS4ERR_IO, OP_GETATTR, OP_GETFH, OP_PUTROOTFH, OP_READ,
                           OP_SEQUENCE, READ4res, SEQUENCE4args, nfs_argop4, nfs_resop4, stateid4)


def test_modules_export_contract_names():
    for name in ("COMPOUND4args", "COMPOUND4res", "nfs_argop4", "nfs_resop4", "READ4args",
                 "READ4res", "READ4resok", "stateid4", "fattr4", "bitmap4", "change_info4",
                 "fattr4_size", "fattr4_mode", "nfstime4", "NFS4_OK", "NFS4ERR_STALE", "OP_READ",
                 "FATTR4_SIZE", "OPEN4_CREATE", "UNSTABLE4", "SEQ4_STATUS_CB_PATH_DOWN",
                 "NFS4_FHSIZE", "entry4", "nfs_fh4", "verifier4"):
        assert name in nfs4.__all__, name
    for name in ("rpc_msg", "call_body", "reply_body", "accepted_reply", "rejected_reply",
                 "opaque_auth", "authsys_parms", "MSG_ACCEPTED", "SUCCESS", "PROG_UNAVAIL",
                 "PROG_MISMATCH", "PROC_UNAVAIL", "GARBAGE_ARGS", "SYSTEM_ERR", "RPC_MISMATCH",
                 "AUTH_ERROR", "AUTH_BADCRED", "AUTH_TOOWEAK", "AUTH_NONE", "AUTH_SYS"):
        assert name in rpc.__all__, name
    assert nfs4.NFS4_FHSIZE == 128 and nfs4.OP_READ == 25 and nfs4.NFS4ERR_STALE == 70
    assert nfs4.utf8str_cs is nfs4.utf8string          # typedef = alias of the same object


def test_compound_round_trip():
    args = COMPOUND4args(tag=b"t", minorversion=1, argarray=[
        nfs_argop4(OP_SEQUENCE, SEQUENCE4args(b"s" * 16, 7, 0, 3, True)),
        nfs_argop4(OP_PUTROOTFH),
        nfs_argop4(OP_GETATTR, GETATTR4args([0x10, 0x2])),
    ])
    assert decode(COMPOUND4args, encode(COMPOUND4args, args)) == args
    res = COMPOUND4res(NFS4_OK, b"", [
        nfs_resop4(OP_GETFH, GETFH4res(NFS4_OK, GETFH4resok(object=b"\x01" * 20))),
        nfs_resop4(OP_READ, READ4res(NFS4ERR_IO)),
    ])
    assert decode(COMPOUND4res, encode(COMPOUND4res, res)) == res


def test_struct_keyword_and_positional_construction():
    a = stateid4(seqid=1, other=b"x" * 12)
    b = stateid4(1, b"x" * 12)
    assert a == b and a.other == b"x" * 12
    assert repr(a) == "stateid4(seqid=1, other=b'xxxxxxxxxxxx')"
    assert encode(stateid4, a) == b"\0\0\0\1" + b"x" * 12


def test_leftover_bytes_rejected():
    data = encode(stateid4, stateid4(1, b"y" * 12)) + b"\0\0\0\0"
    try:
        decode(stateid4, data)
    except XdrError as e:
        assert "stateid4" in str(e)
    else:
        raise AssertionError("trailing bytes accepted")

"""Known-answer byte vectors, written by hand from the RFC layouts (RFC 4506, 5531, 7863)."""
from __future__ import annotations

import struct

from nfsd.xdr import decode, encode
from nfsd.xdr import nfs4 as n
from nfsd.xdr import rpc as r


def words(*ws: int) -> bytes:
    return struct.pack(f">{len(ws)}I", *ws)


def test_rpc_null_call():
    # RFC 5531 section 9: xid, CALL, rpcvers=2, prog, vers, proc, cred{flavor,len}, verf{..}
    wire = words(0x12345678, 0, 2, 100003, 4, 0, 0, 0, 0, 0)
    msg = r.rpc_msg(0x12345678, r.rpc_msg_body(r.CALL, r.call_body(
        rpcvers=2, prog=n.NFS4_PROGRAM, vers=n.NFS_V4, proc=n.NFSPROC4_NULL,
        cred=r.opaque_auth(r.AUTH_NONE, b""), verf=r.opaque_auth(r.AUTH_NONE, b""))))
    assert encode(r.rpc_msg, msg) == wire
    assert decode(r.rpc_msg, wire) == msg


def test_rpc_call_with_auth_sys_credential():
    # RFC 5531 appendix A: stamp, machinename<255>, uid, gid, gids<16>
    body = words(0x01020304, 5) + b"host1\0\0\0" + words(1000, 100, 2, 100, 10)
    parms = r.authsys_parms(stamp=0x01020304, machinename=b"host1", uid=1000, gid=100,
                            gids=[100, 10])
    assert encode(r.authsys_parms, parms) == body
    wire = words(7, 0, 2, 100003, 4, 1, r.AUTH_SYS, len(body)) + body + words(0, 0)
    msg, pos = r.rpc_msg.unpack(memoryview(wire + b"ARGS"), 0)
    assert pos == len(wire)                       # procedure arguments start here
    cb = msg.body.value
    assert msg.body.tag == r.CALL and cb.proc == 1 and cb.cred.flavor == r.AUTH_SYS
    assert decode(r.authsys_parms, cb.cred.body) == parms


def test_rpc_accepted_success_reply_header():
    wire = words(9, 1, 0, 0, 0, 0)   # xid, REPLY, MSG_ACCEPTED, verf{AUTH_NONE, 0}, SUCCESS
    msg = r.rpc_msg(9, r.rpc_msg_body(r.REPLY, r.reply_body(r.MSG_ACCEPTED, r.accepted_reply(
        r.opaque_auth(r.AUTH_NONE, b""), r.accepted_reply_reply_data(r.SUCCESS, b"")))))
    assert encode(r.rpc_msg, msg) == wire
    assert decode(r.rpc_msg, wire) == msg


def test_rpc_prog_mismatch_and_rpc_mismatch_replies():
    acc = words(3, 1, 0, 0, 0, 2, 4, 4)   # PROG_MISMATCH low=4 high=4
    msg = decode(r.rpc_msg, acc)
    data = msg.body.value.value.reply_data
    assert data.tag == r.PROG_MISMATCH and (data.value.low, data.value.high) == (4, 4)
    assert encode(r.rpc_msg, msg) == acc
    rej = words(4, 1, 1, 0, 2, 2)         # MSG_DENIED, RPC_MISMATCH low=2 high=2
    msg = r.rpc_msg(4, r.rpc_msg_body(r.REPLY, r.reply_body(r.MSG_DENIED, r.rejected_reply(
        r.RPC_MISMATCH, r.rejected_reply_mismatch_info(low=2, high=2)))))
    assert encode(r.rpc_msg, msg) == rej
    auth = words(5, 1, 1, 1, r.AUTH_TOOWEAK)
    assert decode(r.rpc_msg, auth).body.value.value == r.rejected_reply(r.AUTH_ERROR,
                                                                       r.AUTH_TOOWEAK)


SESSION = bytes(range(16))


def test_compound_sequence_putrootfh_getattr():
    # RFC 7863: COMPOUND4args = tag<>, minorversion, argarray<> of nfs_argop4
    wire = (words(0, 1, 3)                                   # tag "", minorversion 1, 3 ops
            + words(n.OP_SEQUENCE) + SESSION + words(5, 2, 7, 1)   # seqid, slot, highest, cachethis
            + words(n.OP_PUTROOTFH)
            + words(n.OP_GETATTR, 2, 1 << n.FATTR4_SIZE, 1 << (n.FATTR4_MODE - 32)))
    args = n.COMPOUND4args(tag=b"", minorversion=1, argarray=[
        n.nfs_argop4(n.OP_SEQUENCE, n.SEQUENCE4args(SESSION, 5, 2, 7, True)),
        n.nfs_argop4(n.OP_PUTROOTFH),
        n.nfs_argop4(n.OP_GETATTR, n.GETATTR4args(attr_request=[0x10, 0x2])),
    ])
    assert wire[:12] == bytes.fromhex("00000000 00000001 00000003")
    assert encode(n.COMPOUND4args, args) == wire
    got = decode(n.COMPOUND4args, wire)
    assert got == args and got.argarray[0].value.sa_cachethis is True


def test_compound_reply_with_getattr_size_and_error_tail():
    size_attr = encode(n.fattr4_size, 4096)
    assert size_attr == bytes.fromhex("0000000000001000")
    wire = (words(n.NFS4_OK, 4) + b"tag1" + words(3)
            + words(n.OP_SEQUENCE, n.NFS4_OK) + SESSION + words(5, 2, 7, 7, 0)
            + words(n.OP_PUTROOTFH, n.NFS4_OK)
            + words(n.OP_GETATTR, n.NFS4_OK, 1, 0x10, 8) + size_attr)
    res = n.COMPOUND4res(n.NFS4_OK, b"tag1", [
        n.nfs_resop4(n.OP_SEQUENCE, n.SEQUENCE4res(n.NFS4_OK, n.SEQUENCE4resok(
            SESSION, 5, 2, 7, 7, 0))),
        n.nfs_resop4(n.OP_PUTROOTFH, n.PUTROOTFH4res(n.NFS4_OK)),
        n.nfs_resop4(n.OP_GETATTR, n.GETATTR4res(n.NFS4_OK, n.GETATTR4resok(
            n.fattr4([0x10], size_attr)))),
    ])
    assert encode(n.COMPOUND4res, res) == wire
    assert decode(n.COMPOUND4res, wire) == res
    err = words(n.NFS4ERR_STALE, 0, 1, n.OP_READ, n.NFS4ERR_STALE)
    assert encode(n.COMPOUND4res, n.COMPOUND4res(n.NFS4ERR_STALE, b"", [
        n.nfs_resop4(n.OP_READ, n.READ4res(n.NFS4ERR_STALE))])) == err


def test_write_args_layout_and_padding():
    sid = n.stateid4(seqid=1, other=b"ABCDEFGHIJKL")
    wire = (words(n.OP_WRITE, 1) + b"ABCDEFGHIJKL" + struct.pack(">Q", 1 << 33)
            + words(n.FILE_SYNC4, 5) + b"hello\0\0\0")
    op = n.nfs_argop4(n.OP_WRITE, n.WRITE4args(sid, 1 << 33, n.FILE_SYNC4, b"hello"))
    assert encode(n.nfs_argop4, op) == wire
    assert bytes(decode(n.nfs_argop4, wire).value.data) == b"hello"


def test_bool_discriminated_union_and_optional():
    assert encode(n.newtime4, n.newtime4(False)) == words(0)
    t = n.newtime4(True, n.nfstime4(seconds=-1, nseconds=5))
    assert encode(n.newtime4, t) == words(1) + b"\xff" * 8 + words(5)
    assert decode(n.newtime4, encode(n.newtime4, t)).tag is True
    e = n.entry4(cookie=3, name=b"a", attrs=n.fattr4([], b""), nextentry=None)
    dl = n.dirlist4(entries=e, eof=True)
    assert encode(n.dirlist4, dl) == (words(1) + struct.pack(">Q", 3) + words(1) + b"a\0\0\0"
                                      + words(0, 0) + words(0) + words(1))
    assert encode(n.dirlist4, n.dirlist4(None, False)) == words(0, 0)

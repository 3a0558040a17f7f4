"""The test client's WRITE with its data sent after the encoded call (testkit/nfsclient.py
`data_out_of_line`, used by the ack-latency probe so its own copies are not what it measures):
the bytes on the wire are exactly the in-line encoding's, and the server stores them."""
import os

import pytest

from nfsd.rpc import encode_call
from nfsd.xdr.core import encode
from nfsd.xdr.nfs4 import *  # noqa: F401,F403
from testkit.nfsclient import DEFAULT_CRED, NFS_PROGRAM, NFS_V4, _with_data_tail, op


def write_call(data: bytes) -> bytes:
    ops = [op(OP_PUTFH, PUTFH4args(b"\1" * 16)),
           op(OP_WRITE, WRITE4args(stateid4(seqid=1, other=b"\2" * 12), 12345, FILE_SYNC4, data))]
    args = encode(COMPOUND4args, COMPOUND4args(tag=b"t", minorversion=1, argarray=ops))
    return encode_call(77, NFS_PROGRAM, NFS_V4, 1, DEFAULT_CRED, args)


@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 5, 256 * 1024, 256 * 1024 + 3])
def test_data_tail_is_the_in_line_call_on_the_wire(n):
    data = os.urandom(n)
    parts = _with_data_tail(write_call(b""), data)
    assert parts[1] is data                                   # not copied
    assert b"".join(bytes(p) for p in parts) == write_call(data)


def test_a_call_not_ending_in_an_empty_opaque_is_refused():
    with pytest.raises(ValueError):
        _with_data_tail(write_call(b"x"), b"data")


def test_a_write_sent_out_of_line_is_stored(nfs_client):
    data = os.urandom(256 * 1024 + 1)

    async def body(c):
        root = await c.lookup_path("/checkpoints")
        fh, sid = await c.open_create(root, "tail")
        res = await c.write(fh, sid, 0, data, stable=FILE_SYNC4, data_out_of_line=True)
        assert res.count == len(data) and res.committed == FILE_SYNC4
        back = b""
        while len(back) < len(data):
            got, _eof = await c.read(fh, sid, len(back), len(data) - len(back))
            back += got
        assert back == data
    nfs_client(body)

"""A large READ's data is sent after the encoded reply (rpc.Reply), never copied into it:
the bytes on the wire are exactly the in-line encoding's, whatever follows the READ."""
import os

import pytest

from nfsd import compound
from nfsd.compound import OUT_OF_LINE_MIN, error_result
from nfsd.rpc import Reply, finish_reply, start_success_reply
from nfsd.xdr.core import decode
from nfsd.xdr.nfs4 import *  # noqa: F401,F403
from testkit.nfsclient import check, op, sequence_op
from tests.nfsd.compound_engines import RESULTS


@pytest.fixture(params=RESULTS)
def results_cls(request):
    """The reference's _Results and the native loop's Results."""
    return request.param


def read_result(data, eof=False):
    return nfs_resop4(OP_READ, READ4res(NFS4_OK, READ4resok(eof=eof, data=data)))


def encode(results_cls, results, limit=1 << 22):
    out = start_success_reply(7)
    r = results_cls(out, b"tag", limit)
    for res in results:
        r.add(res)
    r.finish()
    return finish_reply(out, r.tail)


def in_line(results_cls, results, monkeypatch, limit=1 << 22):
    with monkeypatch.context() as m:
        m.setattr(compound, "OUT_OF_LINE_MIN", 1 << 40)
        reply = encode(results_cls, results, limit)
    assert not isinstance(reply, Reply)
    return bytes(reply)


def body_of(reply) -> COMPOUND4res:
    raw = bytes(reply)
    assert int.from_bytes(raw[:4], "big") == 0x80000000 | (len(raw) - 4)     # the record mark
    return decode(COMPOUND4res, raw[4 + 24:])          # mark, then the accepted reply header


@pytest.mark.parametrize("n", [OUT_OF_LINE_MIN, 100_001, 100_002, 100_003, 1 << 20])
def test_large_read_data_follows_the_reply_unchanged_on_the_wire(n, monkeypatch, results_cls):
    data = bytearray(os.urandom(n))
    results = [error_result(OP_PUTFH, NFS4_OK), read_result(data, eof=True)]
    reply = encode(results_cls, results)
    assert isinstance(reply, Reply) and reply.data is data          # not copied
    assert len(reply.head) < 200 and reply.pad == -n % 4
    assert bytes(reply) == in_line(results_cls, results, monkeypatch) and len(reply) == len(bytes(reply))
    ok = body_of(reply).resarray[1].value.value
    assert bytes(ok.data) == data and ok.eof


def test_a_short_read_of_a_larger_buffer_sends_only_its_bytes(monkeypatch, results_cls):
    buf = bytearray(os.urandom(200_000))
    data = memoryview(buf)[:150_003]               # op_read's view when the file was short
    reply = encode(results_cls, [read_result(data)])
    assert isinstance(reply, Reply)
    assert bytes(reply) == in_line(results_cls, [read_result(data)], monkeypatch)


def test_a_result_after_the_read_puts_its_data_in_line(monkeypatch, results_cls):
    data = os.urandom(100_001)
    results = [read_result(data), error_result(OP_GETATTR, NFS4ERR_NOFILEHANDLE)]
    reply = encode(results_cls, results)
    assert not isinstance(reply, Reply)
    assert bytes(reply) == in_line(results_cls, results, monkeypatch)
    res = body_of(reply)
    assert bytes(res.resarray[0].value.value.data) == data and len(res.resarray) == 2


def test_small_reads_and_failed_reads_stay_in_line(results_cls):
    assert not isinstance(encode(results_cls, [read_result(os.urandom(OUT_OF_LINE_MIN - 1))]), Reply)
    assert not isinstance(encode(results_cls, [error_result(OP_READ, NFS4ERR_ISDIR)]), Reply)


def test_a_read_the_session_cannot_carry_is_rep_too_big_with_no_data(results_cls):
    reply = encode(results_cls, [read_result(os.urandom(100_000))], limit=80_000)
    assert not isinstance(reply, Reply)
    res = body_of(reply)
    assert res.status == NFS4ERR_REP_TOO_BIG and res.resarray[0].value.tag == NFS4ERR_REP_TOO_BIG


def test_large_reads_over_the_wire_and_their_retry_is_never_answered_from_the_slot_cache(nfs_client):
    content = os.urandom(300_003)

    async def body(c):
        root = await c.lookup_path("/checkpoints")
        fh, sid = await c.open_create(root, "big")
        await c.write(fh, sid, 0, content, FILE_SYNC4)
        for offset, count in ((0, 300_003), (1, 100_001), (5, 65_536), (299_000, 70_000)):
            data, eof = await c.read(fh, sid, offset, count)
            assert data == content[offset:offset + count]
            assert eof == (offset + count >= len(content))
        # the same slot and seqid again: a large reply was not kept, so no stale bytes
        read = op(OP_READ, READ4args(sid, 0, 200_000))
        args = [sequence_op(c.sessionid, 1, 15), op(OP_PUTFH, PUTFH4args(fh)), read]
        res = check(await c.compound_raw(args))
        assert bytes(res.resarray[2].value.value.data) == content[:200_000]
        assert (await c.compound_raw(args)).status == NFS4ERR_RETRY_UNCACHED_REP

    nfs_client(body)

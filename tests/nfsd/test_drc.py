"""The NFSv4.0 duplicate-request cache (nfsd/drc.py): a retransmitted non-seqid op gets
its first run's reply instead of running again; bounded in entries, bytes and age."""
from __future__ import annotations

import os

import pytest

from nfsd.drc import IN_PROGRESS, ReplyCache, request_key
from nfsd.xdr.nfs4 import *  # noqa: F403
from testkit.nfsclient import check, op

pytestmark = pytest.mark.timeout(60)

PEER = ("192.0.2.1", 700)


def mkdir_ops(c, exp: bytes, name: bytes):
    return [op(OP_PUTFH, PUTFH4args(exp)),
            op(OP_CREATE, CREATE4args(createtype4(NF4DIR), name, fattr4([], b"")))]


def test_retransmitted_mkdir_gets_the_first_reply(nfs_client):
    """pynfs RPLY14: the same CREATE with the same XID twice answers NFS4_OK twice (it
    ran once: a new XID then finds the directory there)."""
    async def body(c):
        exp = await c.lookup_path("/checkpoints")
        name = b"d-" + os.urandom(4).hex().encode()
        xid = c.next_xid()
        first = await c.compound_raw(mkdir_ops(c, exp, name), xid=xid)
        again = await c.compound_raw(mkdir_ops(c, exp, name), xid=xid)
        assert first.status == again.status == NFS4_OK
        assert again.resarray[1].value.value.cinfo == first.resarray[1].value.value.cinfo
        fresh = await c.compound_raw(mkdir_ops(c, exp, name))
        assert fresh.status == NFS4ERR_EXIST
        # Same XID, different request: not a retransmission.
        other = await c.compound_raw(mkdir_ops(c, exp, name + b"x"), xid=xid)
        assert other.status == NFS4_OK
    nfs_client(body, minorversion=0)


def test_idempotent_and_v41_compounds_are_not_cached(nfs_client):
    async def body(c):
        exp = await c.lookup_path("/checkpoints")
        xid = c.next_xid()
        get = [op(OP_PUTFH, PUTFH4args(exp)), op(OP_GETFH)]
        check(await c.compound_raw(get, xid=xid))
        check(await c.compound_raw(get, xid=xid))
    nfs_client(body, minorversion=0)


def test_a_running_call_s_duplicate_is_dropped():
    cache = ReplyCache()
    key = request_key(PEER, 5, 1, memoryview(b"args"))
    assert cache.begin(key) is None
    assert cache.begin(key) is IN_PROGRESS
    cache.finish(key, b"reply", [OP_PUTFH, OP_CREATE])
    assert cache.begin(key) == b"reply" and cache.hits == 1


def test_only_non_idempotent_replies_are_kept():
    cache = ReplyCache()
    key = request_key(PEER, 6, 1, memoryview(b"args"))
    cache.begin(key)
    cache.finish(key, b"reply", [OP_PUTFH, OP_GETATTR])
    assert len(cache) == 0 and cache.bytes == 0
    assert cache.begin(key) is None


def test_key_tells_retransmissions_apart():
    args = memoryview(b"a" * 1000)
    key = request_key(PEER, 7, 1, args)
    assert key == request_key(PEER, 7, 1, memoryview(b"a" * 1000))
    assert key != request_key(PEER, 8, 1, args)                       # xid
    assert key != request_key((PEER[0], 701), 7, 1, args)             # port
    assert key != request_key(PEER, 7, 1, memoryview(b"b" + b"a" * 999))   # checksum
    assert key != request_key(PEER, 7, 1, memoryview(b"a" * 1001))    # length


def test_bounded_in_entries_bytes_reply_size_and_age():
    now = [0.0]
    cache = ReplyCache(max_entries=3, max_bytes=250, max_reply=100, max_age=120,
                       clock=lambda: now[0])

    def run(xid, reply):
        key = request_key(PEER, xid, 1, memoryview(b"x"))
        assert cache.begin(key) is None
        cache.finish(key, reply, [OP_REMOVE])
        return key

    keys = [run(xid, b"r" * 80) for xid in range(4)]
    assert len(cache) == 3 and cache.bytes == 240          # the oldest went (entries)
    assert cache.begin(keys[0]) is None
    assert cache.begin(keys[3]) == b"r" * 80
    run(10, b"r" * 90)
    assert cache.bytes <= 250                              # evicted by bytes
    big = run(11, b"r" * 101)                              # above max_reply: not kept
    assert cache.begin(big) is None
    now[0] = 121.0
    assert cache.begin(keys[3]) is None                    # too old

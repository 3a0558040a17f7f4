"""A RENAME or REMOVE whose reply a restart lost, re-sent by the client in a new session
(issue 38, nfsd/ops/replay.py): the next server instance answers it as the first one did,
once, for that client only; everything else gets the normal answer (NFS4ERR_NOENT)."""
from __future__ import annotations

import os
import time

import pytest

from cache.replies import ReplyRecord, RENAME
from nfsd.ops.replay import find_match
from nfsd.xdr.nfs4 import *  # noqa: F403
from testkit.nfsclient import op
from tests.nfsd.conftest import EXPORT
from tests.nfsd.test_grace import Gateway, connect, put, run

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def gateway(tmp_path):
    gw = Gateway(tmp_path / "cache").start()
    yield gw
    gw.close()


def identity(name: bytes):
    return b"replay-" + name + b"-" + os.urandom(4).hex().encode(), os.urandom(8)


def rename_ops(d, old: bytes, new: bytes):
    return [put(d), op(OP_SAVEFH), put(d), op(OP_RENAME, RENAME4args(old, new))]


def remove_ops(d, name: bytes):
    return [put(d), op(OP_REMOVE, REMOVE4args(name))]


async def save(c, d, name: bytes, data: bytes = b"checkpoint") -> None:
    fh, sid = await c.open_create(d, name)
    await c.write(fh, sid, 0, data, stable=FILE_SYNC4)
    await c.close_file(fh, sid)


async def renamed(gateway, owner: bytes, verifier: bytes, name: bytes):
    """A client that saved `name`.tmp and renamed it to `name`: (client, export's fh)."""
    c = await connect(gateway, owner=owner, verifier=verifier)
    d = await c.lookup_path(EXPORT)
    await save(c, d, name + b".tmp")
    assert (await c.compound(rename_ops(d, name + b".tmp", name))).status == NFS4_OK
    return c, d


def test_a_rename_and_a_remove_resent_after_a_restart_are_answered_as_before(gateway):
    owner, verifier = identity(b"a")

    async def before():
        c = await connect(gateway, owner=owner, verifier=verifier)
        d = await c.lookup_path(EXPORT)
        await save(c, d, b"ckpt.tmp")
        await save(c, d, b"old")
        await save(c, d, b"moved.tmp")
        first = await c.compound(rename_ops(d, b"ckpt.tmp", b"ckpt"))
        assert first.status == NFS4_OK
        assert (await c.compound(remove_ops(d, b"old"))).status == NFS4_OK
        # moved.tmp -> moved, then moved removed: its RENAME record names a file gone
        assert (await c.compound(rename_ops(d, b"moved.tmp", b"moved"))).status == NFS4_OK
        assert (await c.compound(remove_ops(d, b"moved"))).status == NFS4_OK
        # Within one instance nothing is replayed: sent again after its reply, NOENT.
        again = await c.compound(rename_ops(d, b"ckpt.tmp", b"ckpt"))
        assert again.status == NFS4ERR_NOENT
        assert (await c.compound(remove_ops(d, b"old"))).status == NFS4ERR_NOENT
        await c.close()         # the connection goes, the client's record stays
        return d, first.resarray[3].value.value
    d, answered = run(before())
    # The gateway dies (the store closed and opened again: a new instance, its session
    # reply caches empty); the client comes back with the same owner and verifier.
    gateway.restart(reopen_store=True)

    async def after():
        c = await connect(gateway, owner=owner, verifier=verifier)      # RECLAIM_COMPLETE
        other = await connect(gateway)
        # Another client sending the same ops gets the normal answer.
        assert (await other.compound(rename_ops(d, b"ckpt.tmp", b"ckpt"))).status \
            == NFS4ERR_NOENT
        assert (await other.compound(remove_ops(d, b"old"))).status == NFS4ERR_NOENT
        # The target no longer holds the file the RENAME moved: the normal answer.
        assert (await c.compound(rename_ops(d, b"moved.tmp", b"moved"))).status \
            == NFS4ERR_NOENT
        # The client's re-sent RENAME: answered as the first time, change_info included.
        res = await c.compound(rename_ops(d, b"ckpt.tmp", b"ckpt"))
        assert res.status == NFS4_OK
        assert res.resarray[3].value.value == answered
        assert (await c.compound(remove_ops(d, b"old"))).status == NFS4_OK
        # Consumed: the same ops once more get the normal answer.
        assert (await c.compound(rename_ops(d, b"ckpt.tmp", b"ckpt"))).status \
            == NFS4ERR_NOENT
        assert (await c.compound(remove_ops(d, b"old"))).status == NFS4ERR_NOENT
        names = {n for n, _, _ in await c.readdir(d)}
        assert names == {b"ckpt"}
        for x in (c, other):
            await x.close()
    run(after())
    assert gateway.store.check() == []


def test_a_different_client_verifier_is_a_different_client(gateway):
    owner, verifier = identity(b"b")

    async def before():
        c, d = await renamed(gateway, owner, verifier, b"x")
        await c.close()
        return d
    d = run(before())
    gateway.restart(reopen_store=True)

    async def after():
        # the same owner, rebooted (a new verifier): it cannot be re-sending the old RENAME
        c = await connect(gateway, owner=owner, verifier=os.urandom(8))
        gateway.wait_grace_over()
        assert (await c.compound(rename_ops(d, b"x.tmp", b"x"))).status == NFS4ERR_NOENT
        await c.close()
    run(after())


def test_records_go_when_the_client_is_destroyed(gateway):
    owner, verifier = identity(b"c")

    async def before():
        c, _ = await renamed(gateway, owner, verifier, b"y")
        assert len(gateway.store.reply_records(owner)) == 1
        await c.destroy_session()
        res = await c.compound_raw([op(OP_DESTROY_CLIENTID, DESTROY_CLIENTID4args(c.clientid))])
        assert res.status == NFS4_OK
        await c.close()
    run(before())
    deadline = time.monotonic() + 10       # the client record's delete is not waited for
    while owner in gateway.store.client_records() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert gateway.store.reply_records(owner) == []
    assert owner not in gateway.store.client_records()


def _rec(seq, boot, verifier=b"v", old=b"a"):
    return ReplyRecord(seq, RENAME, 1, old, 1, b"b", 7, boot, verifier, (None, None))


def test_only_an_earlier_instance_of_the_same_client_incarnation_matches():
    recs = [_rec(0, b"boot1"), _rec(1, b"boot2"), _rec(2, b"boot1", old=b"z")]
    args = dict(op=RENAME, src_dir=1, old=b"a", dst_dir=1, new=b"b")
    assert find_match(recs, boot=b"boot3", verifier=b"v", **args).seq == 1     # newest
    assert find_match(recs, boot=b"boot2", verifier=b"v", **args).seq == 0     # not its own
    assert find_match(recs[1:2], boot=b"boot2", verifier=b"v", **args) is None
    assert find_match(recs, boot=b"boot3", verifier=b"w", **args) is None
    assert find_match(recs, boot=b"boot3", verifier=b"v", **{**args, "new": b"c"}) is None
    assert find_match(recs, boot=b"boot3", verifier=b"v", **{**args, "dst_dir": 2}) is None

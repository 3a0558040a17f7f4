"""A RENAME whose reply a kill -9 lost, re-sent to the restarted server (issue 38).

`python -m nfsd` runs as a child process; a client saves a checkpoint (tmp, FILE_SYNC write,
RENAME over the final name) and the server is killed as soon as it has logged the RENAME
(logged once the RENAME is durable, just before its reply goes out: the reply may never
reach the client). The restarted server, with a grace period so the client's record keeps,
answers the same client's re-sent RENAME (and an earlier REMOVE) NFS4_OK, once, and another
client's NFS4ERR_NOENT (nfsd/ops/replay.py).
"""
from __future__ import annotations

import asyncio
import os
import re
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from nfsd.xdr.nfs4 import (FILE_SYNC4, NFS4ERR_NOENT, NFS4_OK, OP_REMOVE, OP_RENAME,  # noqa: E402
                           OP_PUTFH, OP_SAVEFH, PUTFH4args, REMOVE4args, RENAME4args)
from testkit.crash_server import ServerProcess, store_check  # noqa: E402
from testkit.nfsclient import NfsClient, op  # noqa: E402

_RENAME_LOGGED = re.compile(rb"\] rename\s.*\bnew=ckpt\b")


class GraceServer(ServerProcess):
    """The crash server with a grace period: the client records (and so the reply records)
    of clients that come back are kept across the restart, as in production."""

    def command(self, port: int = 0) -> list[str]:
        cmd = super().command(port)
        cmd[cmd.index("--grace-time") + 1] = "30"
        return cmd


def rename_ops(d, old: bytes, new: bytes):
    return [op(OP_PUTFH, PUTFH4args(d)), op(OP_SAVEFH), op(OP_PUTFH, PUTFH4args(d)),
            op(OP_RENAME, RENAME4args(old, new))]


def remove_ops(d, name: bytes):
    return [op(OP_PUTFH, PUTFH4args(d)), op(OP_REMOVE, REMOVE4args(name))]


async def client(port: int, owner: bytes | None = None, verifier: bytes | None = None):
    c = await NfsClient.connect("127.0.0.1", port)
    if owner is not None:
        c.owner, c.verifier = owner, verifier
    await c.setup_session()               # RECLAIM_COMPLETE: the client's record, durable
    return c, await c.lookup_path("/checkpoints")


@pytest.mark.timeout(120)
def test_a_rename_whose_reply_a_kill_lost_is_answered_after_the_restart(tmp_path):
    srv = GraceServer(tmp_path / "cache", tmp_path / "server.log")
    srv.start()
    owner, verifier = b"replay-kill-" + os.urandom(4).hex().encode(), os.urandom(8)

    async def before_crash():
        c, d = await client(srv.port, owner, verifier)
        for name in (b"ckpt.tmp", b"old"):
            fh, sid = await c.open_create(d, name)
            await c.write(fh, sid, 0, b"checkpoint " + name, stable=FILE_SYNC4)
            await c.close_file(fh, sid)
        assert (await c.compound(remove_ops(d, b"old"))).status == NFS4_OK
        offset = srv.log_path.stat().st_size
        pending = asyncio.create_task(c.compound(rename_ops(d, b"ckpt.tmp", b"ckpt")))
        deadline = time.monotonic() + 20
        while True:             # kill -9 the moment the RENAME is durable
            with open(srv.log_path, "rb") as log:
                log.seek(offset)
                if _RENAME_LOGGED.search(log.read()):
                    break
            assert time.monotonic() < deadline, "the server never logged the RENAME"
            await asyncio.sleep(0.001)
        srv.send_kill()
        try:
            await asyncio.wait_for(pending, 5)     # the reply, if it got out in time
        except Exception:                          # noqa: BLE001 - lost with the connection
            pass
        return d

    async def after_restart(d):
        c, _ = await client(srv.port, owner, verifier)
        other, _ = await client(srv.port)
        assert (await other.compound(rename_ops(d, b"ckpt.tmp", b"ckpt"))).status \
            == NFS4ERR_NOENT
        assert (await other.compound(remove_ops(d, b"old"))).status == NFS4ERR_NOENT
        assert (await c.compound(rename_ops(d, b"ckpt.tmp", b"ckpt"))).status == NFS4_OK
        assert (await c.compound(remove_ops(d, b"old"))).status == NFS4_OK
        assert (await c.compound(rename_ops(d, b"ckpt.tmp", b"ckpt"))).status \
            == NFS4ERR_NOENT
        names = {n for n, _, _ in await c.readdir(d)}
        data = await c.open_existing(d, "ckpt")
        got, _ = await c.read(data[0], data[1], 0, 100)
        for x in (c, other):
            await x.close()
        return names, got

    try:
        d = asyncio.run(before_crash())
        srv.kill9()
        srv.start()
        names, got = asyncio.run(after_restart(d))
    finally:
        srv.stop()
    assert names == {b"ckpt"}
    assert got == b"checkpoint ckpt.tmp"
    log = srv.log_path.read_bytes()
    assert b"rename_replayed" in log and b"remove_replayed" in log
    assert store_check(srv.cache_dir) == []

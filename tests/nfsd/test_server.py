"""The whole server over loopback: real store, every op handler, our test client;
the dev entry point as a process (SIGTERM)."""
from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys

import pytest

from nfsd.xdr.nfs4 import FILE_SYNC4, NF4DIR, NF4REG, UNSTABLE4
from testkit.nfsclient import NfsClient
from testkit.loopback import free_port, wait_listening

pytestmark = pytest.mark.timeout(120)

MiB = 1024 * 1024


def test_write_commit_read_back(nfs_client, nfs_server):
    payload = os.urandom(MiB)

    async def body(c):
        root = await c.lookup_path("/checkpoints")
        assert (await c.getattr(root))["type"] == NF4DIR
        fh, sid = await c.open_create(root, "rank0.pt")
        # A full 1 MiB WRITE (what the Linux client sends) fits the negotiated size.
        w = await c.write(fh, sid, 0, payload, UNSTABLE4)
        assert w.count == MiB and w.writeverf == nfs_server.store.write_verifier
        await c.commit(fh)
        data, eof = await c.read(fh, sid, 0, MiB)
        assert data == payload and eof
        await c.close_file(fh, sid)
        attrs = await c.getattr(fh)
        assert (attrs["type"], attrs["size"]) == (NF4REG, MiB)
    nfs_client(body)


def test_client_work_is_stamped_for_the_uploader_and_lookups_are_not(nfs_client, nfs_server):
    """`last_client_op` (the uploader's drain yields to it: uploader/foreground.py) moves on a
    save's ops and not on what an idle mount sends (SEQUENCE, LOOKUP, GETATTR)."""
    def stamp():
        return nfs_server.server.last_client_op

    async def body(c):
        root = await c.lookup_path("/checkpoints")
        await c.getattr(root)
        idle = stamp()
        fh, sid = await c.open_create(root, "shard.pt")
        opened = stamp()
        await c.getattr(fh)
        await c.lookup_path("/checkpoints/shard.pt")
        looked = stamp()
        await c.write(fh, sid, 0, b"x" * 4096, UNSTABLE4)
        written = stamp()
        await c.close_file(fh, sid)
        return idle, opened, looked, written

    idle, opened, looked, written = nfs_client(body)
    assert idle == float("-inf") and opened > idle and looked == opened and written > looked


def test_pipelined_writes_from_many_clients(nfs_server):
    chunk = 256 * 1024

    async def one_client(i):
        c = await NfsClient.connect("127.0.0.1", nfs_server.port)
        try:
            await c.setup_session()
            root = await c.lookup_path("/checkpoints")
            fh, sid = await c.open_create(root, f"rank{i}")
            blocks = [bytes([i]) * chunk for _ in range(8)]
            # Eight WRITEs in flight at once on one connection, answered in any order.
            await asyncio.gather(*(c.write(fh, sid, k * chunk, b, UNSTABLE4)
                                   for k, b in enumerate(blocks)))
            await c.commit(fh)
            got = await asyncio.gather(*(c.read(fh, sid, k * chunk, chunk) for k in range(8)))
            assert [data for data, _eof in got] == blocks
            await c.close_file(fh, sid)
        finally:
            await c.close()

    async def main():
        await asyncio.gather(*(one_client(i) for i in range(6)))
    asyncio.run(main())


def test_client_vanishing_mid_write_loses_nothing_for_others(nfs_server, nfs_client):
    async def body(c):
        root = await c.lookup_path("/checkpoints")
        fh, sid = await c.open_create(root, "keep")
        await c.write(fh, sid, 0, b"safe" * 1000, FILE_SYNC4)
        # Another client sends half of a large WRITE record and disappears.
        with socket.create_connection(("127.0.0.1", nfs_server.port)) as s:
            s.sendall((0x80000000 | MiB).to_bytes(4, "big") + b"\0" * 300_000)
        data, _ = await c.read(fh, sid, 0, 4000)
        assert data == b"safe" * 1000
        await c.close_file(fh, sid)
    nfs_client(body)


def test_stop_waits_for_in_flight_calls(nfs_server):
    """stop(): no new calls are read, the running ones finish and are answered."""
    from nfsd.xdr.nfs4 import OP_WRITE
    ops = nfs_server.server.ops
    real_write = ops.handler(OP_WRITE)
    entered = []
    release = asyncio.Event()          # created here, only used on the server's loop

    async def held_write(ctx, args):
        entered.append(1)
        await release.wait()
        return await real_write(ctx, args)

    async def main():
        c = await NfsClient.connect("127.0.0.1", nfs_server.port)
        await c.setup_session()
        root = await c.lookup_path("/checkpoints")
        fh, sid = await c.open_create(root, "last-words")
        nfs_server.call(ops.set_handler, OP_WRITE, held_write)
        writes = [asyncio.ensure_future(c.write(fh, sid, k * 65536, b"x" * 65536, FILE_SYNC4))
                  for k in range(8)]
        while len(entered) < 8:
            await asyncio.sleep(0.02)
        loop = asyncio.get_running_loop()
        stopping = loop.run_in_executor(None, lambda: nfs_server.run(nfs_server.server.stop()))
        await asyncio.sleep(0.3)
        assert not stopping.done()         # still waiting for the eight calls
        nfs_server.loop.call_soon_threadsafe(release.set)
        done = await asyncio.gather(*writes)
        assert [w.count for w in done] == [65536] * 8
        await stopping
        await c.close()
    try:
        asyncio.run(main())
    finally:
        nfs_server.loop.call_soon_threadsafe(release.set)
    nfs_server.server = None               # already stopped


def test_dev_entry_point_stops_cleanly_on_sigterm(tmp_path):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "nfsd", "--listen", f"127.0.0.1:{port}", "--cache-dir",
         str(tmp_path / "cache"), "--export", "/checkpoints"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_listening(port, proc, why=proc.stdout.read)

        async def main():
            c = await NfsClient.connect("127.0.0.1", port)
            await c.setup_session()
            root = await c.lookup_path("/checkpoints")
            fh, sid = await c.open_create(root, "f")
            await c.write(fh, sid, 0, b"durable", FILE_SYNC4)
            await c.close()
        asyncio.run(main())
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, out
        assert "nfsd_stopped" in out and "store_closed" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_destroy_clientid_is_busy_while_the_client_holds_opens(nfs_server, nfs_client):
    """RFC 8881 18.50.3: state (not only sessions) keeps DESTROY_CLIENTID from succeeding."""
    from nfsd.xdr.nfs4 import (DESTROY_CLIENTID4args, NFS4_OK, NFS4ERR_CLIENTID_BUSY,
                               OP_DESTROY_CLIENTID, nfs_argop4)

    async def body(c):
        export = await c.lookup_path("/checkpoints")
        fh, stateid = await c.open_create(export, "held-open")
        clientid = c.clientid
        await c.close_file(fh, stateid)
        fh, stateid = await c.open_create(export, "held-open")
        assert await c.destroy_session() == NFS4_OK
        res = await c.compound_raw([nfs_argop4(OP_DESTROY_CLIENTID, DESTROY_CLIENTID4args(clientid))])
        assert res.status == NFS4ERR_CLIENTID_BUSY
    nfs_client(body)


def test_a_call_that_outlives_the_drain_gets_delay_not_serverfault(nfs_server):
    """Seen in the kill -9 long run's clean stop: a WRITE still running when stop() shut the
    blocking pool down scheduled its commit there, got RuntimeError('cannot schedule new
    futures after shutdown') and was logged as op_failed (SERVERFAULT). It gets DELAY: its
    connection is closed anyway, and the client sends it again to the next server."""
    from nfsd.errors import NfsError
    from nfsd.xdr.nfs4 import NFS4ERR_DELAY
    server = nfs_server.server
    nfs_server.run(server.stop())

    async def late_call():
        return await server.run_blocking(os.getpid)
    with pytest.raises(NfsError) as e:
        asyncio.run(late_call())
    assert e.value.status == NFS4ERR_DELAY
    nfs_server.server = None               # already stopped

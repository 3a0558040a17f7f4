"""The RPC layer over real loopback TCP: framing, RPC errors, auth, bad clients."""
from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time

import pytest

from nfsd.context import Cred
from nfsd.rpc import encode_call, parse_reply
from nfsd.xdr.rpc import (
    AUTH_BADCRED, AUTH_ERROR, AUTH_TOOWEAK, GARBAGE_ARGS, PROC_UNAVAIL, PROG_MISMATCH,
    PROG_UNAVAIL, SUCCESS,
)
from testkit.nfsclient import NfsClient

pytestmark = pytest.mark.timeout(60)


def run(port, body):
    async def main():
        c = await NfsClient.connect("127.0.0.1", port)
        try:
            return await body(c)
        finally:
            await c.close()
    return asyncio.run(main())


def test_null_procedure(fake_server):
    async def body(c):
        await c.null()
        r = await c.call(0, cred=None)                 # AUTH_NONE works too
        assert (r.accepted, r.stat, bytes(r.body)) == (True, SUCCESS, b"")
    run(fake_server.port, body)


def test_prog_vers_proc_errors(fake_server):
    async def body(c):
        r = await c.call(0, prog=100005)
        assert (r.accepted, r.stat) == (True, PROG_UNAVAIL)
        r = await c.call(0, vers=3)
        assert (r.accepted, r.stat, r.detail) == (True, PROG_MISMATCH, (4, 4))
        r = await c.call(2)
        assert (r.accepted, r.stat) == (True, PROC_UNAVAIL)
        await c.null()                                  # the connection still works
    run(fake_server.port, body)


def test_unsupported_auth_flavour(fake_server):
    async def body(c):
        xid = c.next_xid()
        raw = bytearray(encode_call(xid, 100003, 4, 0, None))
        struct.pack_into(">I", raw, 4 + 24, 6)          # RPCSEC_GSS credentials
        r = await c.send_raw(bytes(raw), xid)
        assert (r.accepted, r.stat, r.detail) == (False, AUTH_ERROR, (AUTH_BADCRED,))
        await c.null()
    run(fake_server.port, body)


def test_garbage_compound_args(fake_server):
    async def body(c):
        r = await c.call(1, b"\xff\xff\xff\xf0")        # a tag length far beyond the record
        assert (r.accepted, r.stat) == (True, GARBAGE_ARGS)
        r = await c.call(1, b"")
        assert (r.accepted, r.stat) == (True, GARBAGE_ARGS)
        await c.null()
    run(fake_server.port, body)


def test_multi_fragment_call_over_tcp(fake_server):
    async def body(c):
        xid = c.next_xid()
        payload = encode_call(xid, 100003, 4, 0, c.cred)[4:]
        data = b""
        for i in range(0, len(payload), 7):
            chunk = payload[i:i + 7]
            last = i + 7 >= len(payload)
            data += struct.pack(">I", (0x80000000 if last else 0) | len(chunk)) + chunk
        r = await c.send_raw(data, xid)
        assert (r.accepted, r.stat) == (True, SUCCESS)
    run(fake_server.port, body)


def test_oversized_record_closes_only_that_connection(fake_server_factory):
    server = fake_server_factory(max_record=64 * 1024)

    async def main():
        good = await NfsClient.connect("127.0.0.1", server.port)
        bad = await NfsClient.connect("127.0.0.1", server.port)
        try:
            await good.null()
            bad.writer.write(struct.pack(">I", 0x80000000 | (1 << 20)) + b"\0" * 4096)
            await asyncio.wait_for(bad.closed, 10)      # the server hung up on it
            await good.null()                            # the other client never noticed
            again = await NfsClient.connect("127.0.0.1", server.port)
            await again.null()                           # and the server still accepts
            await again.close()
        finally:
            await good.close()
            await bad.close()
    asyncio.run(main())


def test_client_disconnecting_mid_record_and_mid_call(fake_server):
    port = fake_server.port
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(struct.pack(">I", 0x80000000 | 1000) + b"\0" * 10)   # half a record
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(encode_call(1, 100003, 4, 0, None))                  # leave before the reply

    async def body(c):
        await c.null()
    run(port, body)


def test_many_connections_at_once(fake_server):
    async def one():
        c = await NfsClient.connect("127.0.0.1", fake_server.port)
        try:
            await asyncio.gather(*(c.null() for _ in range(20)))
        finally:
            await c.close()

    async def main():
        await asyncio.gather(*(one() for _ in range(20)))
    asyncio.run(main())


def test_refused_network_is_closed_at_accept(fake_server_factory):
    class NoOne:
        def client_allowed(self, ip):
            return False

        def port_allowed(self, ip, port):
            return True
    server = fake_server_factory()
    server.server.exports = NoOne()                    # connections made from now on

    async def body(c):
        with pytest.raises((ConnectionError, OSError)):
            await c.call(0)
    run(server.port, body)
    assert not server.server.connections


def test_set_exports_rechecks_open_connections(fake_server):
    class NoOne:
        def client_allowed(self, ip):
            return False

        def port_allowed(self, ip, port):
            return True

    async def body(c):
        await c.null()
        fake_server.call(fake_server.server.set_exports, NoOne())
        r = await c.call(0)
        assert (r.accepted, r.stat, r.detail) == (False, AUTH_ERROR, (AUTH_TOOWEAK,))
    run(fake_server.port, body)


def test_auth_sys_credentials_reach_the_handlers(fake_server_factory):
    from nfsd.ops import session as session_ops
    from nfsd.xdr.nfs4 import NFS4_OK, OP_PUTROOTFH, PUTROOTFH4res, nfs_argop4
    seen = []

    async def putrootfh(ctx, args):
        seen.append(ctx.cred)
        return PUTROOTFH4res(NFS4_OK)
    server = fake_server_factory({**session_ops.HANDLERS, OP_PUTROOTFH: putrootfh})
    cred = Cred(flavor=1, uid=1234, gid=567, gids=(567, 10), machinename=b"trainer-7")

    async def main():
        c = await NfsClient.connect("127.0.0.1", server.port, cred=cred)
        try:
            await c.setup_session()
            res = await c.compound([nfs_argop4(OP_PUTROOTFH, None)])
            assert res.status == NFS4_OK
        finally:
            await c.close()
    asyncio.run(main())
    assert seen == [cred]


def test_reply_parser_rejects_truncation():
    with pytest.raises(ValueError):
        parse_reply(b"\0\0\0\1\0\0\0\1")


def test_at_most_max_inflight_calls_run_per_connection(fake_server_factory):
    from nfsd.ops import session as session_ops
    from nfsd.xdr.nfs4 import NFS4_OK, OP_PUTROOTFH, PUTROOTFH4res, nfs_argop4
    running = []
    gate = {}

    async def held(ctx, args):
        running.append(1)
        await gate["ev"].wait()
        return PUTROOTFH4res(NFS4_OK)
    server = fake_server_factory({**session_ops.HANDLERS, OP_PUTROOTFH: held}, max_inflight=3)
    server.call(gate.__setitem__, "ev", asyncio.Event())     # made on the server's loop

    async def body(c):
        await c.setup_session()
        calls = [asyncio.ensure_future(c.compound([nfs_argop4(OP_PUTROOTFH, None)]))
                 for _ in range(10)]
        try:
            await asyncio.sleep(0.5)
            assert len(running) == 3           # the others wait their turn
        finally:
            server.loop.call_soon_threadsafe(gate["ev"].set)
        results = await asyncio.gather(*calls)
        assert [r.status for r in results] == [NFS4_OK] * 10 and len(running) == 10
    run(server.port, body)


def test_large_multi_fragment_call_over_tcp(fake_server):
    async def body(c):
        from nfsd.xdr.core import encode
        from nfsd.xdr.nfs4 import (COMPOUND4args, OP_WRITE, UNSTABLE4, WRITE4args, nfs_argop4,
                                   stateid4)
        xid = c.next_xid()
        args = encode(COMPOUND4args, COMPOUND4args(b"", 1, [nfs_argop4(OP_WRITE, WRITE4args(
            stateid4(0, bytes(12)), 0, UNSTABLE4, b"w" * 300_000))]))
        payload = encode_call(xid, 100003, 4, 1, c.cred, args)[4:]
        data, step = b"", 100_000
        for i in range(0, len(payload), step):
            chunk = payload[i:i + step]
            last = i + step >= len(payload)
            data += struct.pack(">I", (0x80000000 if last else 0) | len(chunk)) + chunk
        r = await c.send_raw(data, xid)
        from nfsd.xdr.core import decode
        from nfsd.xdr.nfs4 import COMPOUND4res, NFS4ERR_OP_NOT_IN_SESSION
        assert (r.accepted, r.stat) == (True, SUCCESS)     # decoded whole: a COMPOUND reply
        assert decode(COMPOUND4res, r.body).status == NFS4ERR_OP_NOT_IN_SESSION
    run(fake_server.port, body)


def test_a_client_that_does_not_read_is_paused_and_loses_nothing(fake_server):
    n = 30_000
    # Empty COMPOUNDs whose reply echoes a 500-byte tag: 15 MB of replies, more than the
    # kernel's socket buffers hold. (Calls that need no waiting are answered on the spot, so
    # small replies would all fit those buffers before anything piled up in the server.)
    tag = b"t" * 500
    args = len(tag).to_bytes(4, "big") + tag + b"\0" * 8
    calls = b"".join(encode_call(i, 100003, 4, 1, None, args) for i in range(n))
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", fake_server.port))
        s.setblocking(False)
        sent = 0
        deadline = time.monotonic() + 20
        paused = False
        while sent < len(calls) and time.monotonic() < deadline:
            try:
                sent += s.send(calls[sent:sent + 65536])
            except BlockingIOError:
                time.sleep(0.05)
            paused = paused or fake_server.call(
                lambda: any(c._reading_paused for c in fake_server.server.connections))
            if paused:
                break
        assert paused                        # replies piled up: the server stopped reading
        s.setblocking(True)
        s.settimeout(20)
        # The rest goes while we read: the server reads again only as its replies drain.
        sender = threading.Thread(target=s.sendall, args=(calls[sent:],), daemon=True)
        sender.start()
        got, buf, xids = 0, b"", set()
        while got < n:
            chunk = s.recv(1 << 20)
            assert chunk, "connection closed early"
            buf += chunk
            while len(buf) >= 4:
                size = int.from_bytes(buf[:4], "big") & 0x7FFFFFFF
                if len(buf) < 4 + size:
                    break
                xids.add(parse_reply(buf[4:4 + size]).xid)
                buf = buf[4 + size:]
                got += 1
        sender.join(timeout=20)
        assert xids == set(range(n))         # every call answered once, after resuming

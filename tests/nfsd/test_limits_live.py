"""Connection limits against a live server on loopback (issue 16 point 2), one test per
limit with its value; the hostile-client scenario with RSS measurement is in
tests/nfsd/test_hostile_clients.py."""
from __future__ import annotations

import asyncio
import os
import socket
import struct

import pytest

from nfsd.exports import Export, Exports
from nfsd.limits import Limits, RateLimitedLog
from nfsd.rpc import LAST_FRAGMENT, encode_call, parse_reply
from nfsd.xdr.rpc import AUTH_ERROR, AUTH_TOOWEAK
from testkit.loopback import closed_by_server

NULL_CALL = encode_call(1, 100003, 4, 0, None)


async def open_conn(port: int, local_port: int | None = None):
    if local_port is None:
        return await asyncio.open_connection("127.0.0.1", port)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", local_port))
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    return await asyncio.open_connection(sock=sock)


async def read_reply(reader, timeout: float = 10.0):
    mark = await asyncio.wait_for(reader.readexactly(4), timeout)
    (n,) = struct.unpack(">I", mark)
    return parse_reply(await asyncio.wait_for(reader.readexactly(n & 0x7FFFFFFF), timeout))


async def until(pred, what: str, timeout: float = 20.0) -> None:
    """Poll pred() (cheap, no I/O) every 10 ms until it is true; fail naming `what` after timeout."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not pred():
        assert asyncio.get_running_loop().time() < deadline, f"not within {timeout}s: {what}"
        await asyncio.sleep(0.01)


def open_count(st) -> int:
    """The connections the server counts, read on its own loop."""
    return st.call(lambda: len(st.server.connections))


async def null_ok(reader, writer) -> bool:
    writer.write(NULL_CALL)
    await writer.drain()
    r = await read_reply(reader)
    return r.accepted and r.stat == 0


def test_default_limit_values():
    lim = Limits()
    assert (lim.max_inflight, lim.max_connections, lim.max_per_address) == (128, 4096, 256)
    assert (lim.idle_timeout, lim.record_timeout, lim.log_interval) == (360.0, 60.0, 60.0)
    assert (lim.max_record, lim.max_fragments) == (2 * 1024 * 1024 + 64 * 1024, 2112)


def test_connections_per_address_limit(fake_server_factory):
    st = fake_server_factory(limits=Limits(max_per_address=3))

    async def body():
        conns = [await open_conn(st.port) for _ in range(3)]
        assert all([await null_ok(r, w) for r, w in conns])
        r4, w4 = await open_conn(st.port)
        assert await closed_by_server(r4, 10)             # the 4th from 127.0.0.1: closed at accept
        conns[0][1].close()
        await until(lambda: open_count(st) == 2, "the server saw the first connection close")
        r5, w5 = await open_conn(st.port)                  # a place is free again
        assert await null_ok(r5, w5)
        for _r, w in conns[1:] + [(r5, w5)]:
            w.close()
    asyncio.run(body())


def test_total_connections_limit(fake_server_factory):
    st = fake_server_factory(limits=Limits(max_connections=2))

    async def body():
        conns = [await open_conn(st.port) for _ in range(2)]
        assert all([await null_ok(r, w) for r, w in conns])
        r3, _w3 = await open_conn(st.port)
        assert await closed_by_server(r3, 10)
        for _r, w in conns:
            w.close()
    asyncio.run(body())
    assert len(st.server.connections) <= 2


def test_idle_connection_is_closed(fake_server_factory):
    st = fake_server_factory(limits=Limits(idle_timeout=0.5))

    async def body():
        idle_r, _idle_w = await open_conn(st.port)
        busy_r, busy_w = await open_conn(st.port)
        idle_task = asyncio.ensure_future(closed_by_server(idle_r, 20))
        deadline = asyncio.get_running_loop().time() + 20
        while not idle_task.done():                           # traffic every 0.1 s until the idle one goes
            assert asyncio.get_running_loop().time() < deadline, "the idle connection was never closed"
            assert await null_ok(busy_r, busy_w)
            await asyncio.sleep(0.1)                          # pacing: the busy client's think time (< idle_timeout)
        assert await idle_task
        assert await null_ok(busy_r, busy_w)                  # the busy one was never idle
        busy_w.close()
    asyncio.run(body())


def test_client_not_reading_its_replies_is_dropped(fake_server_factory):
    """Pipelined calls whose replies are never read: once the server's write buffer is
    full it stops reading, and after idle_timeout (0.5 s here) it drops the connection
    instead of holding the replies forever."""
    st = fake_server_factory(limits=Limits(idle_timeout=0.5))

    async def body():
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", st.port))
        sock.setblocking(False)
        _r, w = await asyncio.open_connection(sock=sock)
        await until(lambda: open_count(st) == 1, "the server admitted the connection")

        def small_send_buffer():                             # so replies back up quickly
            for conn in st.server.connections:
                conn.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        st.call(small_send_buffer)
        w.write(NULL_CALL * 20_000)                           # 800 KB of calls, no reads
        await until(lambda: open_count(st) == 0, "the server dropped the client that reads nothing", 30)
        w.transport.abort()
    asyncio.run(body())


def test_slow_record_is_dropped_and_others_are_served(fake_server_factory):
    """slowloris: a record mark, then one byte every 0.1 s, with record_timeout 0.5 s."""
    st = fake_server_factory(limits=Limits(record_timeout=0.5))

    async def body():
        good_r, good_w = await open_conn(st.port)
        slow_r, slow_w = await open_conn(st.port)
        slow_w.write(struct.pack(">I", LAST_FRAGMENT | 1000))
        closed = asyncio.ensure_future(closed_by_server(slow_r, 30))
        for _ in range(100):
            if closed.done():
                break
            try:
                slow_w.write(b"x")
                await slow_w.drain()
            except (ConnectionError, OSError):
                break
            assert await null_ok(good_r, good_w)
            await asyncio.sleep(0.1)                          # the scenario: one byte every 0.1 s
        assert await closed
        assert await null_ok(good_r, good_w)
        good_w.close()
    asyncio.run(body())


def test_inflight_calls_per_connection_limit(fake_server_factory):
    st = fake_server_factory(limits=Limits(max_inflight=3))
    server = st.server
    state = {"running": 0, "peak": 0}
    gate = asyncio.Event()
    real = server.handle_call

    async def slow_handle_call(call, conn):
        state["running"] += 1
        state["peak"] = max(state["peak"], state["running"])
        await gate.wait()
        state["running"] -= 1
        return await real(call, conn)

    st.call(setattr, server, "handle_call", slow_handle_call)

    async def body():
        r, w = await open_conn(st.port)
        # COMPOUNDs (empty arguments: GARBAGE_ARGS once let through): NULLs are answered
        # by the transport at once, without a task, and never wait for a place
        w.write(b"".join(encode_call(x, 100003, 4, 1, None) for x in range(10)))
        await w.drain()
        await until(lambda: state["running"] == 3, "three calls running")
        # a fourth must NOT start: time for the server to read the other seven and queue them
        # (or pause reading); nothing signals "not started", so this one waits on time
        await asyncio.sleep(0.3)
        assert state["peak"] == 3 and state["running"] == 3    # the other 7 wait
        st.loop.call_soon_threadsafe(gate.set)
        xids = sorted([(await read_reply(r)).xid for _ in range(10)])
        assert xids == list(range(10))
        w.close()
    asyncio.run(body())


# ---- `secure` exports ---------------------------------------------------------------------------

def test_secure_export_refuses_unprivileged_ports_with_auth_tooweak(fake_server_factory):
    st = fake_server_factory()
    st.server.exports = Exports([Export(1, "/checkpoints")])     # secure by default, as knfsd
    assert Export(1, "/x").secure is True

    async def body():
        r, w = await open_conn(st.port)                          # an ephemeral port >= 1024
        assert await null_ok(r, w)                               # NULL is always answered
        w.write(encode_call(2, 100003, 4, 1, None, b"\0" * 12))
        rep = await read_reply(r)
        assert (rep.accepted, rep.stat, rep.detail) == (False, AUTH_ERROR, (AUTH_TOOWEAK,))
        w.close()
        if os.geteuid() == 0:                                    # a privileged source port passes
            for port in range(700, 1000, 7):
                try:
                    r, w = await open_conn(st.port, local_port=port)
                    break
                except OSError:
                    continue
            w.write(encode_call(3, 100003, 4, 1, None, b"\0" * 12))
            rep = await read_reply(r)
            assert rep.accepted                                  # past the port check
            w.close()
    asyncio.run(body())


def test_insecure_export_admits_unprivileged_ports(fake_server_factory):
    st = fake_server_factory()
    st.server.exports = Exports([Export(1, "/checkpoints", secure=False)])

    async def body():
        r, w = await open_conn(st.port)
        w.write(encode_call(2, 100003, 4, 1, None, b"\0" * 12))
        assert (await read_reply(r)).accepted
        w.close()
    asyncio.run(body())


def test_secure_export_answers_nfs4err_perm_per_op(tmp_path):
    """With another (insecure) export admitting the client, the secure one gets NFS4ERR_PERM."""
    from testkit.ops_harness import FakeServer, Fs
    from nfsd.xdr.nfs4 import NFS4ERR_PERM, OP_PUTROOTFH
    from nfsd.ops import HANDLERS
    from cache.store import Store

    store = Store.open(str(tmp_path / "store"))
    try:
        fs = Fs(FakeServer(store, Exports([Export(1, "/", root_squash=False, secure=True)])))
        ctx = fs.ctx()
        asyncio.run(HANDLERS[OP_PUTROOTFH](ctx, None))          # port 900: fine
        ctx.peer = ("127.0.0.1", 40000)
        with pytest.raises(Exception) as e:
            asyncio.run(HANDLERS[OP_PUTROOTFH](ctx, None))
        assert getattr(e.value, "status", None) == NFS4ERR_PERM
    finally:
        store.close()


# ---- rate-limited log of rejected input -----------------------------------------------------------

class _Capture:
    def __init__(self):
        self.events = []

    def warning(self, event, **kw):
        self.events.append((event, kw))


def test_rejections_are_logged_once_per_client_and_interval_with_a_suppressed_count():
    now = [0.0]
    cap = _Capture()
    rl = RateLimitedLog(cap, 60.0, clock=lambda: now[0])
    for _ in range(1000):
        rl.warning("rpc_rejected", "10.0.0.1", reason="bad")
    rl.warning("rpc_rejected", "10.0.0.2", reason="bad")
    assert [(e, kw["client"], kw["suppressed"]) for e, kw in cap.events] == [
        ("rpc_rejected", "10.0.0.1", 0), ("rpc_rejected", "10.0.0.2", 0)]
    now[0] = 61.0
    rl.warning("rpc_rejected", "10.0.0.1", reason="bad")
    assert cap.events[-1][1]["suppressed"] == 999
    rl2 = RateLimitedLog(cap, 60.0, max_keys=100, clock=lambda: now[0])
    for i in range(10_000):                                        # many addresses: memory bounded
        rl2.warning("connection_refused", f"10.1.{i // 256}.{i % 256}")
    assert len(rl2._seen) <= 100


def test_export_access_refusals_are_rate_limited_not_one_line_per_op(tmp_path):
    """A client outside an export's networks retries op after op: one log event per interval,
    the rest counted (before, every refused op logged a warning)."""
    from testkit.ops_harness import FakeServer, Fs
    from nfsd.xdr.nfs4 import NFS4ERR_ACCESS, OP_PUTROOTFH
    from nfsd.ops import HANDLERS
    from cache.store import Store

    store = Store.open(str(tmp_path / "store"))
    try:
        server = FakeServer(store, Exports([Export(1, "/", root_squash=False, networks=("10.0.0.0/8",))]))
        cap = _Capture()
        server.ratelog = RateLimitedLog(cap, 60.0, clock=lambda: 0.0)
        ctx = Fs(server).ctx()
        for _ in range(50):
            with pytest.raises(Exception) as e:
                asyncio.run(HANDLERS[OP_PUTROOTFH](ctx, None))
            assert getattr(e.value, "status", None) == NFS4ERR_ACCESS
        assert [ev for ev, _ in cap.events] == ["export_access_refused"]
        assert server.ratelog._seen[("export_access_refused", "127.0.0.1")][1] == 49
    finally:
        store.close()

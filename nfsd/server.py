"""The NFSv4 server: wires the store, exports, session state and the transport.

    server = NfsServer(store, exports)
    await server.start("0.0.0.0", 2049)
    ...
    await server.stop()          # stop accepting, finish in-flight calls, close connections

The store is the caller's: `stop()` does not close it.
"""
from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
import time
from concurrent.futures import ThreadPoolExecutor

import structlog

from nfsd.compound import COMPOUND_ENGINE, GarbageArgs, minorversion_of, run_compound
from nfsd.drc import IN_PROGRESS, ReplyCache, request_key
from nfsd.errors import NfsError
from nfsd.grace import Grace
from nfsd.heap import TrimAfterBursts, trim_heap
from nfsd.limits import Limits, RateLimitedLog
from nfsd.rpc import (
    Program, RecordPool, Reply, auth_error_reply, finish_reply, garbage_args_reply,
    start_success_reply, system_err_reply,
)
from nfsd.offload import OffloadTable
from nfsd.optable import OpTable, any_client_work
from nfsd.state import DEFAULT_LEASE_TIME, SessionManager
from nfsd.transport import RPC_ENGINE, NfsConnection
from nfsd.xdr.nfs4 import NFS4ERR_DELAY
from nfsd.xdr.rpc import AUTH_TOOWEAK

log = structlog.get_logger(__name__)

NFS_PROGRAM = 100003
NFS_V4 = 4
PROC_NULL = 0
PROC_COMPOUND = 1
SHUTDOWN_DRAIN_SECONDS = 30.0


class NfsServer:
    # Per-op hook for metrics, set by the appliance: observer(op_name, status_name, seconds, nbytes).
    observer = None
    # Read-through hooks, set by the appliance (nfsd/ops/io.py): fetch_missing(ino, ranges)
    # brings ABSENT ranges in from S3; note_read(ino, offset, nbytes) hears of every READ of
    # a file with ABSENT ranges, so readahead moves with a sequential reader.
    fetch_missing = None
    note_read = None

    def __init__(self, store, exports, lease_time: float = DEFAULT_LEASE_TIME, *,
                 handlers: dict | None = None, opens=None, limits: Limits | None = None,
                 max_record: int | None = None, max_inflight: int | None = None,
                 blocking_threads: int = 4, grace_time: float | None = None):
        self.store = store
        self.exports = exports
        self.lease_time = lease_time
        self.write_verifier = store.write_verifier
        # RFC 8881 2.10.5: owner and scope identify this server's state; the store's
        # instance id is stable for the store's lifetime, as the state's meaning is. Clients
        # get a one-way derivation of it: the raw id also keys the file-handle MAC.
        identity = hashlib.blake2b(bytes(store.instance_id), digest_size=16, person=b"ckptgw-owner").digest()
        self.server_owner = identity
        self.server_scope = identity
        self.sessions = SessionManager(lease_time)
        self.replies_v40 = ReplyCache()        # 4.0 retransmissions (4.1: session slots)
        # Reclaim after a restart (nfsd/grace.py): as long as a lease by default, so every
        # client that held state has renewed (and so noticed the restart) before it ends.
        self.grace = Grace(store, lease_time if grace_time is None else grace_time)
        self.sessions.on_client_expired.append(self.grace.forget)
        self.sessions.reclaim_needed = self.grace.reclaim_needed
        if handlers is None:
            from nfsd.ops import HANDLERS as handlers
        from nfsd.ops import native_forms
        # nfsd/optable.py: every op's row, with its handler and the handler's typed twin
        self.ops = OpTable(handlers, native=native_forms(handlers))
        if opens is None:
            from nfsd.openstate import OpenStateTable
            opens = OpenStateTable(store)
        self.opens = opens
        opens.attach(self.sessions)
        # Asynchronous COPYs (nfsd/offload.py); an undelivered outcome is kept a lease.
        self.offloads = OffloadTable(write_verifier=store.write_verifier,
                                     keep_seconds=lease_time)
        self.offloads.attach(self.sessions)
        limits = limits or Limits()
        if max_record is not None:
            limits = dataclasses.replace(limits, max_record=max_record)
        if max_inflight is not None:
            limits = dataclasses.replace(limits, max_inflight=max_inflight)
        self.limits = limits
        self.max_record = limits.max_record
        self.max_inflight = limits.max_inflight    # calls running at once per connection
        # Rejected input and refused connections: one line per client and kind per interval.
        self.ratelog = RateLimitedLog(log, limits.log_interval)
        self._per_address: dict[str, int] = {}
        self._sweeper: asyncio.Task | None = None
        self.programs = {NFS_PROGRAM: Program(NFS_PROGRAM, NFS_V4, NFS_V4,
                                              frozenset({PROC_NULL, PROC_COMPOUND}))}
        self.record_pool = RecordPool()       # large WRITE records, received without allocating
        self.heap_trim = TrimAfterBursts()    # freed heap back to the OS once a burst is over
        self.log = log
        self.connections: set[NfsConnection] = set()
        self._executor = ThreadPoolExecutor(blocking_threads, thread_name_prefix="nfsd-blocking")
        self._pool_closed = False
        self._listener: asyncio.base_events.Server | None = None
        self.address: tuple | None = None
        self.last_client_op = float("-inf")    # monotonic time of the last client_work COMPOUND (optable)

    # ---- lifecycle --------------------------------------------------------------
    async def start(self, host: str = "127.0.0.1", port: int = 2049) -> None:
        loop = asyncio.get_running_loop()
        self.grace.start()      # before the first call can arrive
        self._listener = await loop.create_server(
            lambda: NfsConnection(self, self.limits), host, port, reuse_address=True, backlog=256)
        self.address = self._listener.sockets[0].getsockname()[:2]
        self.sessions.start_reaper()
        self._sweeper = loop.create_task(self._sweep())
        log.info("nfsd_listening", host=self.address[0], port=self.address[1],
                 lease_time=self.lease_time, rpc_engine=RPC_ENGINE,
                 event_loop=type(loop).__module__.split(".")[0])

    @property
    def port(self) -> int:
        return self.address[1] if self.address else 0

    async def stop(self, drain_seconds: float = SHUTDOWN_DRAIN_SECONDS) -> None:
        """Stop accepting, let in-flight calls finish (bounded), close connections."""
        if self._listener is not None:
            self._listener.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        conns = list(self.connections)
        for conn in conns:
            conn.stop_reading()
        pending = [c.drain_calls() for c in conns]
        if pending:
            try:
                await asyncio.wait_for(asyncio.gather(*pending), drain_seconds)
            except asyncio.TimeoutError:
                log.warning("nfsd_stop_calls_unfinished",
                            calls=sum(c.inflight for c in conns))
        for conn in conns:
            conn.close()
        if self._listener is not None:
            await self._listener.wait_closed()
            self._listener = None
        await self.sessions.stop_reaper()
        await self.offloads.stop()          # before the pool: a copy's chunk may be in it
        await self.grace.stop()
        self._pool_closed = True            # a call still running past the drain gets DELAY
        await asyncio.get_running_loop().run_in_executor(
            None, functools.partial(self._executor.shutdown, wait=True))
        log.info("nfsd_stopped")

    # ---- blocking work ---------------------------------------------------------
    def run_blocking(self, fn, *args):
        """Run a blocking call (fsync, LMDB sync) on the server's own thread pool;
        returns an awaitable. Keeps the event loop free while disks are slow."""
        if self._pool_closed:
            # stopping: a call that outlived the drain is not run; its connection is closed,
            # so the client sends it again to the next server (was SERVERFAULT, seen in the
            # kill -9 long run's clean stop)
            raise NfsError(NFS4ERR_DELAY, "server stopping")
        loop = asyncio.get_running_loop()
        return loop.run_in_executor(self._executor, functools.partial(fn, *args))

    def start_blocking(self, fn, *args) -> None:
        """Start a blocking call on the server's pool without waiting for it: for a call that
        answers its caller another way (Store.commit_async: the batch committer sets the
        caller's future), so its thread is free once it has queued that answer's work.
        fn must catch its own errors (an exception here would be nobody's)."""
        if self._pool_closed:
            raise NfsError(NFS4ERR_DELAY, "server stopping")
        self._executor.submit(fn, *args)

    # ---- connections -----------------------------------------------------------
    def client_allowed(self, ip: str) -> bool:
        return bool(self.exports.client_allowed(ip))

    def port_allowed(self, ip: str, port: int) -> bool:
        """`secure` exports: a source port >= 1024 is accepted only when an export that
        admits this client is `insecure` (knfsd's rule)."""
        return bool(self.exports.port_allowed(ip, port))

    def set_exports(self, exports) -> None:
        """Swap the exports (config reload); the network check is redone for every open
        connection, so a client no longer admitted gets AUTH_ERROR from its next call."""
        self.exports = exports
        for conn in list(self.connections):
            conn.allowed = self.client_allowed(conn.peer[0])
            conn.port_ok = self.port_allowed(*conn.peer[:2])

    def connection_made(self, conn: NfsConnection) -> str | None:
        """Admit a new connection, or say why it is closed at once (logged rate-limited)."""
        ip = conn.peer[0]
        limits = self.limits
        if not self.client_allowed(ip):
            reason = "no export admits this address"
        elif len(self.connections) >= limits.max_connections:
            reason = f"{limits.max_connections} connections open (max_connections)"
        elif self._per_address.get(ip, 0) >= limits.max_per_address:
            reason = f"{limits.max_per_address} connections from this address (max_per_address)"
        else:
            conn.port_ok = self.port_allowed(ip, conn.peer[1])
            self.connections.add(conn)
            self._per_address[ip] = self._per_address.get(ip, 0) + 1
            return None
        self.ratelog.warning("connection_refused", ip, reason=reason)
        return reason

    def connection_lost(self, conn: NfsConnection) -> None:
        if conn not in self.connections:
            return                                     # refused at accept
        self.connections.discard(conn)
        self.heap_trim.connection_ended(time.monotonic())
        ip = conn.peer[0]
        left = self._per_address.get(ip, 1) - 1
        if left > 0:
            self._per_address[ip] = left
        else:
            self._per_address.pop(ip, None)
        self.sessions.connection_lost(conn)

    async def _sweep(self) -> None:
        """End idle connections and records that take too long (nfsd/limits.py); once a
        burst of connections is over, give the heap it freed back (nfsd/heap.py)."""
        limits = self.limits
        while True:
            await asyncio.sleep(limits.sweep_interval)
            now = time.monotonic()
            for conn in list(self.connections):
                conn.check_timeouts(now, limits)
            if self.heap_trim.due(now):
                trim_heap()
                log.info("heap_trimmed", connections=len(self.connections))

    # ---- RPC dispatch ------------------------------------------------------------
    def immediate_reply(self, call, conn) -> bytes | bytearray | None:
        """The reply of a call that needs no waiting (NULL, or any call of a connection no
        export admits), answered by the transport without a task; None for the others."""
        if not conn.allowed:
            return auth_error_reply(call.xid, AUTH_TOOWEAK)
        if call.proc == PROC_NULL:
            return finish_reply(start_success_reply(call.xid))
        return None

    async def handle_call(self, call, conn) -> bytes | bytearray | Reply | None:
        """Answer one well-formed RPC call to NFSv4 (NULL or COMPOUND): the framed
        reply. Never raises: an unexpected failure is SYSTEM_ERR for this call only."""
        reply = self.immediate_reply(call, conn)
        if reply is not None:
            return reply
        xid = call.xid
        if not conn.port_ok:
            self.ratelog.warning("insecure_port_refused", conn.peer[0], port=conn.peer[1],
                                 reason="every export admitting this client is `secure` "
                                        "(source port must be < 1024)")
            return auth_error_reply(xid, AUTH_TOOWEAK)
        if minorversion_of(call.args) != 0:
            return (await self._run_compound(call, conn))[0]
        # NFSv4.0: a retransmission gets the first run's reply (nfsd/drc.py).
        key = request_key(conn.peer, xid, call.proc, call.args)
        cached = self.replies_v40.begin(key)
        if cached is IN_PROGRESS:
            return None                  # the original still runs: drop, as knfsd does
        if cached is not None:
            return cached
        reply, opnums = None, ()
        try:
            reply, opnums = await self._run_compound(call, conn)
            return reply
        finally:
            self.replies_v40.finish(key, reply, opnums)

    async def _run_compound(self, call, conn) -> tuple[bytes | bytearray, list]:
        """The framed reply and the ops that ran."""
        xid = call.xid
        out = start_success_reply(xid)
        try:
            outcome = await run_compound(self, call.cred, conn.peer, conn, call.args, out)
        except GarbageArgs as exc:
            self.ratelog.warning("rpc_garbage_args", conn.peer[0], xid=xid, error=str(exc))
            return garbage_args_reply(xid), []
        except Exception:
            log.exception("compound_failed", peer=conn.peer[0], xid=xid)
            return system_err_reply(xid), []
        if any_client_work(outcome.opnums):
            self.last_client_op = time.monotonic()
        return finish_reply(out, outcome.tail), outcome.opnums

    python_handle_call = handle_call          # the reference, whichever engine runs


if COMPOUND_ENGINE == "native":
    # handle_call's typed twin, _run_compound in it (nfsd/native/compound.pyx; held to the two
    # by tests/nfsd/test_compound_native.py)
    from nfsd.native.compound import handle_call as _native_handle_call
    NfsServer.handle_call = _native_handle_call


async def serve(store, exports, host: str, port: int, *, stop_event: asyncio.Event | None = None,
                lease_time: float = DEFAULT_LEASE_TIME, grace_time: float | None = None,
                started=None) -> None:
    """Run an NFS server until `stop_event` is set (or the task is cancelled), then
    stop it cleanly. `started(server)` is called once it listens."""
    server = NfsServer(store, exports, lease_time, grace_time=grace_time)
    await server.start(host, port)
    if started is not None:
        started(server)
    try:
        if stop_event is None:
            await asyncio.Event().wait()
        else:
            await stop_event.wait()
    finally:
        t0 = time.monotonic()
        await asyncio.shield(server.stop())
        log.debug("nfsd_serve_done", stop_s=round(time.monotonic() - t0, 3))

"""asyncio TCP transport for the NFS server: the only module that touches sockets.

One `NfsConnection` (an asyncio.BufferedProtocol) per client connection. The
kernel receives straight into the buffer `nfsd.rpc.RpcConnection.get_buffer` hands
out (a large WRITE lands in its own record buffer, no further copy). Every complete
call runs at once, and one that has to wait (the disk, a commit) becomes a task
(nfsd/eager.py), so the many requests the Linux client pipelines on one connection
run concurrently; each reply is written as soon as it is ready (RFC 5531 allows
replies in any order, matched by xid).

Backpressure: at most `max_inflight` calls per connection run at once, and a
client that does not read its replies (the transport's write buffer is full)
stops being read; both resume on their own.

Limits (nfsd/limits.py): the server may refuse a connection at accept (network no
export admits, too many connections); the connection records when it last received a
byte (`last_activity`) and since when a record has been incomplete (`record_started`,
reset whenever a record completes), which the server's sweeper compares with the idle
and record timeouts. While reading is paused by backpressure, the clock of an
incomplete record does not run against the client.

Back channel (RFC 8881 2.10.3.1): the server may send its own RPC calls to the client on
the client's connection (`call_back`, used by nfsd/callback.py). Incoming records are
demultiplexed by msg_type in nfsd/rpc.py: a REPLY is matched by xid to a pending
callback; one matching none is dropped (logged rate-limited). Callbacks are bounded per
connection (`max_callbacks`) and in time (`callback_timeout`); a lost connection fails
the ones pending.
"""
from __future__ import annotations

import asyncio
import itertools
import os
import socket
import time
from collections import deque

import structlog

from nfsd import eager, native
from nfsd.limits import Limits
from nfsd.rpc import (
    POOL_BUFFER, CallReceived, ConnectionError as RpcConnectionError, Reply, ReplyReceived, SendReply,
)

# The RPC layer: the typed Cython one when built (nfsd/native/rpc.pyx), else the reference.
RPC_ENGINE = native.engine("rpc")
if RPC_ENGINE == "native":
    from nfsd.native.rpc import RpcConnection
else:
    from nfsd.rpc import RpcConnection

log = structlog.get_logger(__name__)


class CallbackFailed(Exception):
    """A callback got no reply: connection closed or lost, too many pending, timeout."""


class NfsConnection(asyncio.BufferedProtocol):
    def __init__(self, server, limits: Limits | None = None):
        limits = limits or Limits()
        self.server = server
        self.rpc = RpcConnection(server.programs, limits.max_record, max_fragments=limits.max_fragments,
                                 pool=server.record_pool)
        self.max_inflight = limits.max_inflight
        self.transport: asyncio.Transport | None = None
        self.peer: tuple = ()
        self.sessions: set = set()          # NFSv4.1 sessions this connection is bound to
        self.allowed = True                 # export network check, once per connection
        self.port_ok = True                 # `secure` exports: source port check
        self.closed = False
        self.last_activity = time.monotonic()
        self.record_started: float | None = None   # an incomplete record pending since
        self._records_seen = 0
        self._inflight: set[asyncio.Task] = set()
        self._queued: deque[CallReceived] = deque()   # parsed, waiting for an in-flight place
        self._reading_paused = False
        self._writing_paused = False
        # Pool buffers of calls answered inside buffer_updated: the event loop still holds the
        # receive view it got from get_buffer until buffer_updated returns, so they go back to
        # the pool at the next get_buffer (before: refused, and every 1 MiB WRITE answered on
        # the spot made the next one allocate and zero a new buffer).
        self._in_read = False
        self._returning: list[bytearray] = []
        self._write_paused_at = 0.0
        # Back channel: callbacks sent on this connection, awaiting their reply by xid.
        self.max_callbacks = limits.max_callbacks
        self.callback_timeout = limits.callback_timeout
        self._callbacks: dict[int, asyncio.Future] = {}
        self._callback_xids = itertools.count(int.from_bytes(os.urandom(4), "big"))

    # ---- asyncio callbacks ----------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = tuple(peer[:2]) if peer else ("?", 0)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        refusal = self.server.connection_made(self)
        if refusal is not None:             # closed at accept; the server logged why
            self.closed = True
            transport.abort()
            return
        log.debug("connection_open", peer=self.peer[0], port=self.peer[1])

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._returning:
            returning, self._returning = self._returning, []
            for record in returning:
                self.rpc.pool.give_back(record)
        return self.rpc.get_buffer(sizehint)

    def _give_back(self, record: bytearray) -> None:
        """The call that `record` holds is over: its buffer back to the pool, now or, while
        the loop's receive view may still be on it, at the next get_buffer."""
        pool = self.rpc.pool
        if pool is not None and not pool.give_back(record) and self._in_read and len(record) == POOL_BUFFER:
            self._returning.append(record)

    def buffer_updated(self, nbytes: int) -> None:
        if self.closed:
            return
        rpc = self.rpc
        self._in_read = True                # one frame: this runs for every read (NULL's floor)
        try:
            for event in rpc.buffer_updated(nbytes):
                if isinstance(event, CallReceived):
                    reply = self.server.immediate_reply(event, self)
                    if reply is not None:      # NULL: answered here, no task (issue 37)
                        self.transport.write(reply)
                        if len(event.record) == POOL_BUFFER:
                            self._give_back(event.record)
                    elif len(self._inflight) < self.max_inflight:
                        self._start(event)
                    else:                      # parsed in the same read: waits its turn
                        self._queued.append(event)
                elif isinstance(event, SendReply):
                    if event.data:
                        self.transport.write(event.data)
                    self.server.ratelog.warning("rpc_rejected", self.peer[0], xid=event.xid,
                                                reason=event.reason)
                elif isinstance(event, ReplyReceived):
                    self._reply_received(event)
                elif isinstance(event, RpcConnectionError):
                    self.abort("rpc_stream_error", event.reason)
                    return
        finally:
            self._in_read = False
        now = self.last_activity = time.monotonic()
        if not rpc.partial:
            self.record_started = None
        elif self.record_started is None or rpc.records != self._records_seen:
            self.record_started = now
        self._records_seen = rpc.records
        if self._queued or len(self._inflight) >= self.max_inflight:
            self._pause_reading()

    def abort(self, event: str, reason: str) -> None:
        """Drop this connection for a limit or broken stream; logged rate-limited."""
        self.server.ratelog.warning(event, self.peer[0], reason=reason)
        if self.transport is not None and not self.closed:
            self.transport.abort()
        self.closed = True

    def check_timeouts(self, now: float, limits: Limits) -> None:
        """Called by the server's sweeper: end an idle or too slow connection."""
        if self.closed:
            return
        if self._writing_paused:
            # It does not read its replies: after the idle timeout, stop holding them.
            if now - self._write_paused_at > limits.idle_timeout:
                self.abort("connection_not_reading",
                           f"replies unread for {limits.idle_timeout:g} s (idle_timeout)")
            return
        if self._reading_paused:
            return
        if self.record_started is not None and now - self.record_started > limits.record_timeout:
            self.abort("connection_slow_record",
                       f"record incomplete after {limits.record_timeout:g} s (record_timeout)")
        elif (self.record_started is None and not self._inflight and not self._queued
              and not self._callbacks
              and now - self.last_activity > limits.idle_timeout):
            log.info("connection_idle_closed", client=self.peer[0], idle_timeout=limits.idle_timeout)
            self.transport.close()
            self.closed = True

    def eof_received(self) -> bool:
        return False                      # close our side; in-flight replies are dropped

    def connection_lost(self, exc) -> None:
        self.closed = True
        for fut in self._callbacks.values():
            if not fut.done():
                fut.set_exception(CallbackFailed("connection lost"))
        self._callbacks.clear()
        self.server.connection_lost(self)
        log.debug("connection_closed", peer=self.peer[0], inflight=len(self._inflight),
                  error=str(exc) if exc else None)

    def pause_writing(self) -> None:
        self._writing_paused = True
        self._write_paused_at = time.monotonic()
        self._pause_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._maybe_resume_reading()

    # ---- calls --------------------------------------------------------------------
    async def _serve(self, call: CallReceived) -> None:
        record = call.record
        try:
            reply = await self.server.handle_call(call, self)
            if reply and not self.closed:
                if isinstance(reply, Reply):     # a READ's data after the rest, not copied in
                    for part in reply.parts():
                        self.transport.write(part)
                else:
                    self.transport.write(reply)
        finally:
            del call                           # its args view the record
            self._give_back(record)

    def _start(self, call: CallReceived) -> None:
        # Run on the spot; only a call that waits becomes a task (nfsd/eager.py).
        try:
            task = eager.start(self._serve(call), asyncio.get_running_loop())
        except Exception as exc:             # handle_call never raises: a bug, this call only
            log.error("call_task_failed", peer=self.peer[0], error=repr(exc))
            return
        if task is not None:
            self._inflight.add(task)
            task.add_done_callback(self._call_done)

    def _call_done(self, task: asyncio.Task) -> None:
        self._inflight.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("call_task_failed", peer=self.peer[0], error=repr(task.exception()))
        while self._queued and len(self._inflight) < self.max_inflight:
            self._start(self._queued.popleft())
        self._maybe_resume_reading()

    def _pause_reading(self) -> None:
        if not self._reading_paused and not self.closed:
            self._reading_paused = True
            self.transport.pause_reading()

    def _maybe_resume_reading(self) -> None:
        if (self._reading_paused and not self._writing_paused and not self.closed
                and not self._queued and len(self._inflight) < self.max_inflight):
            self._reading_paused = False
            if self.record_started is not None:   # the pause was ours, not the client's
                self.record_started = time.monotonic()
            self.transport.resume_reading()

    # ---- back channel (callbacks from server to client) ------------------------------
    async def call_back(self, build) -> bytearray:
        """Send the framed CALL `build(xid)` returns on this connection and wait for the
        client's reply record (undecoded; nfsd.rpc.parse_reply reads it). Raises
        CallbackFailed when it cannot be sent or gets no reply in `callback_timeout`."""
        if self.closed or self.transport is None:
            raise CallbackFailed("connection closed")
        if len(self._callbacks) >= self.max_callbacks:
            raise CallbackFailed(f"{self.max_callbacks} callbacks pending (max_callbacks)")
        xid = next(self._callback_xids) & 0xFFFFFFFF
        while xid in self._callbacks:
            xid = next(self._callback_xids) & 0xFFFFFFFF
        fut = asyncio.get_running_loop().create_future()
        self._callbacks[xid] = fut
        try:
            self.transport.write(build(xid))
            return await asyncio.wait_for(fut, self.callback_timeout)
        except asyncio.TimeoutError:
            raise CallbackFailed(f"no reply in {self.callback_timeout:g} s (callback_timeout)") from None
        finally:
            if self._callbacks.get(xid) is fut:
                del self._callbacks[xid]

    @property
    def callbacks_pending(self) -> int:
        return len(self._callbacks)

    def _reply_received(self, event: ReplyReceived) -> None:
        fut = self._callbacks.pop(event.xid, None)
        if fut is None:
            self.server.ratelog.warning("callback_reply_unmatched", self.peer[0], xid=event.xid)
        elif not fut.done():
            fut.set_result(event.record)

    # ---- server side --------------------------------------------------------------
    @property
    def inflight(self) -> int:
        return len(self._inflight) + len(self._queued)

    async def drain_calls(self) -> None:
        """Wait for this connection's calls, the received ones included, to finish
        (server shutdown)."""
        while self._inflight or self._queued:
            await asyncio.gather(*list(self._inflight), return_exceptions=True)

    def stop_reading(self) -> None:
        """Take no new calls (server shutdown); replies still go out."""
        self._pause_reading()

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.close()

"""Fuzz targets and the properties every input must keep.

Targets:
- `Engine`: the sans-I/O server, a fresh nfsd.rpc.RpcConnection per input feeding
  NfsServer.handle_call (COMPOUND with a real Store in a temporary directory);
- `LiveTarget`: a running NfsServer on loopback, one TCP connection reused while the
  server keeps it open.

Properties (`check_reply`, `Engine.feed`, `LiveTarget.send`): no exception escapes the
codec or the server; no call hangs (a bound per call, and on the live server a sentinel
NULL call after each input is answered or the connection is closed, within a bound);
every reply is a well-formed framed RPC reply whose COMPOUND4res, when there is one,
decodes exactly; and no reply reports an internal failure (RPC SYSTEM_ERR, or
NFS4ERR_SERVERFAULT, which the compound loop answers for a handler that raised).

`SessionFixup` lets a captured session be replayed against a fresh server: the client id
and session id the capture used are rewritten to the ones this server handed out.
"""
from __future__ import annotations

import asyncio
import struct
import time
from pathlib import Path

from nfsd.rpc import (
    CallReceived, ConnectionError as RpcConnectionError, ReplyReceived, RpcConnection, SendReply,
    parse_reply,
)
from nfsd.transport import CallbackFailed
from nfsd.xdr import XdrError, decode
import nfsd.xdr.nfs4 as n
from nfsd.xdr.rpc import SUCCESS, SYSTEM_ERR

CALL_TIMEOUT = 20.0
SENTINEL_XID = 0x5E471E1
PROC_COMPOUND = 1


class FuzzFailure(AssertionError):
    """A property broke; `data` is the input that broke it."""

    def __init__(self, message: str, data: bytes = b""):
        super().__init__(message)
        self.data = data


def check_reply(framed, proc: int | None, data: bytes = b"") -> None:
    """A framed reply is well-formed and reports no internal failure."""
    framed = bytes(framed)
    if len(framed) < 4:
        raise FuzzFailure(f"reply of {len(framed)} bytes", data)
    (mark,) = struct.unpack_from(">I", framed)
    if mark != 0x80000000 | (len(framed) - 4):
        raise FuzzFailure(f"reply record mark {mark:#x} for {len(framed) - 4} bytes", data)
    try:
        r = parse_reply(framed[4:])
    except Exception as exc:                      # RpcDecodeError, struct errors
        raise FuzzFailure(f"malformed RPC reply: {exc!r}", data) from None
    if r.accepted and r.stat == SYSTEM_ERR:
        raise FuzzFailure("SYSTEM_ERR: the server failed internally", data)
    if r.accepted and r.stat == SUCCESS and len(r.body) and proc in (PROC_COMPOUND, None):
        try:
            res = decode(n.COMPOUND4res, r.body)
        except XdrError as exc:
            raise FuzzFailure(f"COMPOUND4res does not decode: {exc}", data) from None
        for resop in res.resarray:
            if op_status(resop) == n.NFS4ERR_SERVERFAULT:
                raise FuzzFailure(f"NFS4ERR_SERVERFAULT from op {resop.tag}", data)


def op_status(resop) -> int:
    """The nfsstat4 of one nfs_resop4: a union's discriminant or a struct's first field."""
    value = resop.value
    if getattr(value, "xdr_kind", None) == "union":
        return value.tag
    return getattr(value, value.__slots__[0])


class SessionFixup:
    """Rewrites what the capture's server handed out (client id, session id, file handles,
    stateids) to what this server handed out for the same request: the captured reply and
    the new reply to each request are walked side by side."""

    def __init__(self, captured_replies: dict[bytes, bytes]):
        self.captured = captured_replies           # xid -> reply body (no mark)
        self.map: dict[bytes, bytes] = {}

    @staticmethod
    def _results(body):
        try:
            r = parse_reply(body)
            return decode(n.COMPOUND4res, r.body).resarray if r.accepted and r.stat == SUCCESS else []
        except Exception:
            return []

    def learn(self, request: bytes, new_framed) -> None:
        old_body = self.captured.get(bytes(request[:4]))
        if old_body is None:
            return
        for old, new in zip(self._results(old_body), self._results(bytes(new_framed)[4:])):
            if (old.tag != new.tag or op_status(old) != n.NFS4_OK or op_status(new) != n.NFS4_OK
                    or old.tag not in (n.OP_EXCHANGE_ID, n.OP_CREATE_SESSION, n.OP_GETFH,
                                       n.OP_OPEN, n.OP_LOCK)):
                continue
            a, b = old.value.value, new.value.value
            if old.tag == n.OP_EXCHANGE_ID:
                self.map[struct.pack(">Q", a.eir_clientid)] = struct.pack(">Q", b.eir_clientid)
            elif old.tag == n.OP_CREATE_SESSION:
                self.map[bytes(a.csr_sessionid)] = bytes(b.csr_sessionid)
            elif old.tag == n.OP_GETFH:
                self.map[bytes(a.object)] = bytes(b.object)
            elif old.tag in (n.OP_OPEN, n.OP_LOCK):
                sa = a.stateid if old.tag == n.OP_OPEN else a.lock_stateid
                sb = b.stateid if old.tag == n.OP_OPEN else b.lock_stateid
                self.map[bytes(sa.other)] = bytes(sb.other)

    def apply(self, body: bytes) -> bytes:
        for old in sorted(self.map, key=len, reverse=True):   # a session id holds the client id
            body = body.replace(old, self.map[old])
        return body


class FakeConn:
    """What handle_call and the session ops need of a transport connection."""

    def __init__(self) -> None:
        self.peer = ("127.0.0.1", 40000)
        self.allowed = True
        self.port_ok = True
        self.sessions: set = set()
        self.closed = False

    async def call_back(self, build):
        # No client listens here: a back channel the input asks for is probed and is down.
        raise CallbackFailed("no back channel in the sans-I/O engine")


class Engine:
    """The sans-I/O server with a real store in `root` (see module doc)."""

    def __init__(self, root: Path):
        from cache.store import Store
        from nfsd.exports import Export, Exports
        from nfsd.server import NfsServer
        self.store = Store.open(str(root / "store"))
        self.server = NfsServer(self.store, Exports([Export(1, "/checkpoints", root_squash=False,
                                                            secure=False)]))
        self.loop = asyncio.new_event_loop()
        self.conn = FakeConn()

    def close(self) -> None:
        self.loop.run_until_complete(self.server.stop(drain_seconds=1))
        self.loop.close()
        self.store.close()

    def send(self, data: bytes) -> list:
        """Framed replies to one input (records); raises FuzzFailure."""
        rpc = RpcConnection(self.server.programs, self.server.max_record, max_fragments=64)
        try:
            events = rpc.receive_data(data)
        except Exception as exc:
            raise FuzzFailure(f"RpcConnection raised {exc!r}", data) from exc
        replies = []
        for ev in events:
            if isinstance(ev, CallReceived):
                try:
                    reply = self.loop.run_until_complete(
                        asyncio.wait_for(self.server.handle_call(ev, self.conn), CALL_TIMEOUT))
                except asyncio.TimeoutError:
                    raise FuzzFailure(f"call hung for {CALL_TIMEOUT} s", data) from None
                except Exception as exc:
                    raise FuzzFailure(f"handle_call raised {exc!r}", data) from exc
                if reply:
                    reply = bytes(reply)         # an rpc.Reply (READ data out of line) too
                    check_reply(reply, ev.proc, data)
                    replies.append(reply)
            elif isinstance(ev, SendReply):
                if ev.data:
                    check_reply(ev.data, None, data)
                    replies.append(ev.data)
            elif not isinstance(ev, (RpcConnectionError, ReplyReceived)):
                # ReplyReceived: a reply to a callback, which a live connection matches by xid.
                raise FuzzFailure(f"unknown event {ev!r}", data)
        return replies


class LiveTarget:
    """A live NfsServer on 127.0.0.1:port; inputs go down one connection, followed by a
    sentinel NULL call: its answer (or the server closing the connection) ends the input."""

    def __init__(self, port: int, bound: float = 15.0):
        self.port = port
        self.bound = bound
        self.loop = asyncio.new_event_loop()
        self.reader = self.writer = None
        self.reconnects = 0
        self.callbacks = 0

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.loop.close()

    def send(self, data: bytes) -> list:
        return self.loop.run_until_complete(self._send(data))

    async def _send(self, data: bytes) -> list:
        from nfsd.rpc import encode_call
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
            self.reconnects += 1
        replies = []
        try:
            self.writer.write(data + encode_call(SENTINEL_XID, 100003, 4, 0, None))
            await self.writer.drain()
            deadline = time.monotonic() + self.bound
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise FuzzFailure(f"no answer and no close within {self.bound} s: hung", data)
                mark = await asyncio.wait_for(self.reader.readexactly(4), left)
                (m,) = struct.unpack(">I", mark)
                body = await asyncio.wait_for(self.reader.readexactly(m & 0x7FFFFFFF), left)
                framed = mark + body
                if len(body) >= 8 and struct.unpack_from(">I", body, 4)[0] == 0:
                    # A CALL: the server's callback (CB_NULL) on a back channel the input
                    # asked for; left unanswered, it times out on the server.
                    self.callbacks += 1
                    continue
                check_reply(framed, None, data)
                if struct.unpack_from(">I", body)[0] == SENTINEL_XID:
                    return replies
                replies.append(framed)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            self.writer.close()                   # the server dropped us: allowed, reconnect
            self.reader = self.writer = None
            return replies
        except asyncio.TimeoutError:
            raise FuzzFailure(f"no answer and no close within {self.bound} s: hung", data) from None


class EngineSession:
    """A 4.1 client and session on an Engine, so generated ops run after a SEQUENCE that
    succeeds (otherwise nearly every generated COMPOUND stops at OP_NOT_IN_SESSION).
    A session a generated op destroyed, or a SEQUENCE that failed, opens a new one."""

    def __init__(self, engine: Engine, cred):
        self.engine, self.cred = engine, cred
        self.clients = 0
        self.sessionid = b""
        self.seq = 0
        self._xid = 0x10000
        self.open()

    def _compound(self, ops):
        from nfsd.rpc import encode_call
        from nfsd.xdr import encode
        self._xid += 1
        data = encode_call(self._xid, 100003, 4, PROC_COMPOUND, self.cred,
                           encode(n.COMPOUND4args, n.COMPOUND4args(tag=b"", minorversion=1, argarray=ops)))
        (reply,) = self.engine.send(data)
        return decode(n.COMPOUND4res, parse_reply(bytes(reply)[4:]).body)

    def open(self) -> None:
        """A new client and session; the one before is abandoned, as a crashed client's."""
        try:
            self._open()
        except AttributeError:
            # No reply cache or client slot left: the abandoned clients (the fuzzer's own
            # and the ones generated EXCHANGE_IDs made) hold them until their leases run
            # out, which takes minutes a fuzzing run does not wait. Let the leases run out.
            sessions = self.engine.server.sessions
            sessions.expire_idle(now=time.monotonic() + 2 * sessions.lease_time + sessions.expiry_grace)
            self._open()

    def _open(self) -> None:
        self.clients += 1
        owner = n.client_owner4(co_verifier=b"fuzzverf", co_ownerid=b"fuzz-%d" % self.clients)
        res = self._compound([n.nfs_argop4(n.OP_EXCHANGE_ID, n.EXCHANGE_ID4args(
            eia_clientowner=owner, eia_flags=0, eia_state_protect=n.state_protect4_a(n.SP4_NONE),
            eia_client_impl_id=[]))])
        eid = res.resarray[0].value.value
        fore = n.channel_attrs4(0, 1 << 20, 1 << 20, 8192, 16, 4, [])
        back = n.channel_attrs4(0, 4096, 4096, 0, 2, 1, [])
        res = self._compound([n.nfs_argop4(n.OP_CREATE_SESSION, n.CREATE_SESSION4args(
            csa_clientid=eid.eir_clientid, csa_sequence=eid.eir_sequenceid, csa_flags=0,
            csa_fore_chan_attrs=fore, csa_back_chan_attrs=back, csa_cb_program=0x40000000,
            csa_sec_parms=[n.callback_sec_parms4(n.AUTH_NONE)]))])
        self.sessionid = bytes(res.resarray[0].value.value.csr_sessionid)
        self.seq = 0
        self._compound(self.prefix()[:1] + [n.nfs_argop4(n.OP_RECLAIM_COMPLETE, n.RECLAIM_COMPLETE4args(False))])
        self.seq += 1

    def prefix(self) -> list:
        """SEQUENCE on slot 0 and PUTROOTFH, to put in front of generated ops."""
        return [n.nfs_argop4(n.OP_SEQUENCE, n.SEQUENCE4args(
                    sa_sessionid=self.sessionid, sa_sequenceid=self.seq + 1, sa_slotid=0,
                    sa_highest_slotid=0, sa_cachethis=False)),
                n.nfs_argop4(n.OP_PUTROOTFH)]

    def after(self, replies: list) -> None:
        """Advance the slot's sequence id if SEQUENCE worked, else start over."""
        for reply in replies:
            try:
                r = parse_reply(bytes(reply)[4:])
                res = decode(n.COMPOUND4res, r.body)
            except Exception:
                continue
            if res.resarray and res.resarray[0].tag == n.OP_SEQUENCE:
                if op_status(res.resarray[0]) == n.NFS4_OK:
                    self.seq += 1
                    return
        self.open()

"""Runs the filesystem op handlers directly (no RPC, no sessions) over a real Store.

`Fs.run(ops)` plays a COMPOUND: each (opnum, args) in order on one CompoundContext,
stopping at the first error like the real COMPOUND loop. Tests build arguments with
the protocol's own types, so what they check is what goes on the wire.
"""
from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass

import structlog

from cache.store import Store
from nfsd.context import CompoundContext, Cred
from nfsd.errors import NfsError
from nfsd.exports import AUTH_SYS, Export, Exports
from nfsd.grace import Grace
from nfsd.limits import Limits, RateLimitedLog
from nfsd.offload import OffloadTable
from nfsd.openstate import OpenStateTable
from nfsd.ops import HANDLERS as _ALL_HANDLERS
from nfsd.optable import OpTable
from nfsd.state import SessionManager
from nfsd.xdr.nfs4 import *  # noqa: F401,F403

# The server's own op table (nfsd/optable.py): the harness runs the handlers the server would.
OPS = OpTable(_ALL_HANDLERS)

ROOT = Cred(AUTH_SYS, uid=0, gid=0, gids=(0,))


class FakeServer:
    """The NfsServer a handler sees (nfsd.context.ServerContext, every member: held to it by
    tests/nfsd/test_server_context.py), wired as NfsServer wires it, without the transport,
    the reply caches or a thread pool of its own. The hooks are unset, as on a server no
    appliance has set up: a test sets fetch_missing / note_read / observer when it wants them."""
    observer = None
    fetch_missing = None
    note_read = None

    def __init__(self, store, exports, lease_time: float = 90):
        self.store = store
        self.exports = exports
        self.lease_time = lease_time
        self.write_verifier = store.write_verifier
        self.server_owner = self.server_scope = b"ops-harness-server"
        self.sessions = SessionManager(lease_time)
        self.grace = Grace(store, 0)    # never started: no grace period
        self.sessions.on_client_expired.append(self.grace.forget)
        self.sessions.reclaim_needed = self.grace.reclaim_needed
        self.ops = OPS
        self.opens = OpenStateTable(store)
        self.opens.attach(self.sessions)
        self.offloads = OffloadTable(write_verifier=store.write_verifier, keep_seconds=lease_time)
        self.offloads.attach(self.sessions)
        self.ratelog = RateLimitedLog(structlog.get_logger("nfsd.server"), Limits().log_interval)
        self.blocking_calls = []

    async def run_blocking(self, fn, *args):
        self.blocking_calls.append(getattr(fn, "__name__", repr(fn)))
        return await asyncio.to_thread(fn, *args)

    def start_blocking(self, fn, *args):
        self.blocking_calls.append(getattr(fn, "__name__", repr(fn)))
        threading.Thread(target=fn, args=args, daemon=True).start()


@dataclass
class FakeClient:
    clientid: int
    minorversion: int = 1
    reclaim_complete: bool = True
    recorded: bool = False
    verifier: bytes = b"harness1"     # EXCHANGE_ID's client verifier (nfsd/ops/replay.py)

    @property
    def owner(self) -> bytes:
        return b"harness-client-%d" % self.clientid

    @property
    def name(self) -> str:
        return f"{self.clientid:016x}"


class Failed(Exception):
    def __init__(self, status, index, results):
        super().__init__(f"op #{index} failed with status {status}")
        self.status, self.index, self.results = status, index, results


class Fs:
    def __init__(self, server, cred=ROOT, ip="127.0.0.1", minorversion=1, clientid=7):
        self.server = server
        self.cred = cred
        self.ip = ip
        self.minorversion = minorversion
        self.client = FakeClient(clientid)

    def ctx(self):
        return CompoundContext(server=self.server, cred=self.cred, peer=(self.ip, 900),
                               conn=None, minorversion=self.minorversion, client=self.client)

    def as_user(self, uid, gid=None, gids=(), ip=None, clientid=None):
        cred = Cred(AUTH_SYS, uid=uid, gid=uid if gid is None else gid, gids=tuple(gids))
        return Fs(self.server, cred, ip or self.ip, self.minorversion,
                  self.client.clientid if clientid is None else clientid)

    async def run(self, ops, ctx=None):
        """Results of every op; raises Failed(status) at the first error."""
        ctx = ctx or self.ctx()
        results = []
        for i, (opnum, args) in enumerate(ops):
            try:
                results.append(await OPS.handler(opnum)(ctx, args))
            except NfsError as e:
                raise Failed(e.status, i, results) from e
        return results

    async def status(self, ops) -> int:
        try:
            await self.run(ops)
        except Failed as f:
            return f.status
        return NFS4_OK

    # ---- conveniences ------------------------------------------------------------------------
    async def root_fh(self, path=("checkpoints",)) -> bytes:
        ops = [(OP_PUTROOTFH, None)] + [(OP_LOOKUP, LOOKUP4args(p.encode())) for p in path]
        res = await self.run(ops + [(OP_GETFH, None)])
        return res[-1].value.object

    async def fh(self, dir_fh, *names) -> bytes:
        ops = [(OP_PUTFH, PUTFH4args(dir_fh))]
        ops += [(OP_LOOKUP, LOOKUP4args(n if isinstance(n, bytes) else n.encode())) for n in names]
        res = await self.run(ops + [(OP_GETFH, None)])
        return res[-1].value.object

    def owner(self, name=b"o1"):
        return open_owner4(clientid=self.client.clientid, owner=name)

    async def open(self, dir_fh, name, *, create=True, how=None, access=OPEN4_SHARE_ACCESS_BOTH,
                   deny=OPEN4_SHARE_DENY_NONE, owner=b"o1", mode=0o644):
        name = name if isinstance(name, bytes) else name.encode()
        if create:
            how = how or createhow4(UNCHECKED4, attrs_of({FATTR4_MODE: mode}))
            openhow = openflag4(OPEN4_CREATE, how)
        else:
            openhow = openflag4(OPEN4_NOCREATE)
        args = OPEN4args(seqid=0, share_access=access, share_deny=deny, owner=self.owner(owner),
                         openhow=openhow, claim=open_claim4(CLAIM_NULL, name))
        res = await self.run([(OP_PUTFH, PUTFH4args(dir_fh)), (OP_OPEN, args), (OP_GETFH, None)])
        return res[2].value.object, res[1].value.stateid, res[1].value

    async def write(self, fh, sid, offset, data, stable=UNSTABLE4):
        res = await self.run([(OP_PUTFH, PUTFH4args(fh)),
                              (OP_WRITE, WRITE4args(sid, offset, stable, data))])
        return res[1].value

    async def read(self, fh, sid, offset, count):
        res = await self.run([(OP_PUTFH, PUTFH4args(fh)), (OP_READ, READ4args(sid, offset, count))])
        return bytes(res[1].value.data), res[1].value.eof

    async def close(self, fh, sid):
        res = await self.run([(OP_PUTFH, PUTFH4args(fh)), (OP_CLOSE, CLOSE4args(0, sid))])
        return res[1].value

    async def mkdir(self, dir_fh, name, mode=0o755):
        name = name if isinstance(name, bytes) else name.encode()
        res = await self.run([(OP_PUTFH, PUTFH4args(dir_fh)),
                              (OP_CREATE, CREATE4args(createtype4(NF4DIR), name,
                                                      attrs_of({FATTR4_MODE: mode}))),
                              (OP_GETFH, None)])
        return res[2].value.object

    async def getattr(self, fh, *bits):
        res = await self.run([(OP_PUTFH, PUTFH4args(fh)),
                              (OP_GETATTR, GETATTR4args(bitmap_of(bits)))])
        return parse_attrs(res[1].value.obj_attributes)


def bitmap_of(bits):
    from nfsd.attrs import bitmap_of as bm
    return bm(sorted(bits))


def attrs_of(values: dict):
    from nfsd.attrs import ATTRS
    out = bytearray()
    for bit in sorted(values):
        ATTRS[bit].xdr.pack(values[bit], out)
    return fattr4(attrmask=bitmap_of(values), attr_vals=bytes(out))


def parse_attrs(fa) -> dict:
    from nfsd.attrs import ATTRS, bits_of
    buf, pos, out = memoryview(bytes(fa.attr_vals)), 0, {}
    for bit in bits_of(fa.attrmask):
        out[bit], pos = ATTRS[bit].xdr.unpack(buf, pos)
    assert pos == len(buf)
    return out


def make_fs(tmp_path, **export_kw) -> tuple[Fs, Store]:
    store = Store.open(str(tmp_path / "store"))
    export_kw.setdefault("root_squash", False)
    exports = Exports([Export(1, "/checkpoints", **export_kw)])
    return Fs(FakeServer(store, exports)), store

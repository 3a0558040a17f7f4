"""A small async NFSv4.1 (and 4.0) client built on our own codec, for tests.

    c = await NfsClient.connect("127.0.0.1", port, minorversion=1)
    await c.setup_session()                       # EXCHANGE_ID, CREATE_SESSION, RECLAIM_COMPLETE
    res = await c.compound([nfs_argop4(OP_PUTROOTFH, None), nfs_argop4(OP_GETFH, None)])
    # res: COMPOUND4res; res.resarray[i] answers ops[i] (the SEQUENCE result that
    # compound() prepends is kept in c.last_sequence, not in resarray)

With minorversion=0, setup_session() does SETCLIENTID + SETCLIENTID_CONFIRM instead,
compound() sends the ops as they are, and the open/close helpers keep each open-owner's
seqid and confirm a new owner's first OPEN (RFC 7530).

Calls are pipelined: any number may be in flight on one connection; replies are
matched by xid. The server's callbacks (NFSv4.1 back channel: CALLs arriving on this
connection) are recorded in `c.callbacks` as (prog, proc, CB_COMPOUND4args or None) and
answered by `c.answer_callback` (CB_NULL: success; CB_COMPOUND: CB_SEQUENCE echoed,
CB_OFFLOAD NFS4_OK);
a test replaces it to answer late, wrongly or never. Low-level pieces (`call`, `compound_raw`, `send_raw`) let tests
build exactly the bytes they want (retransmissions, bad slots, garbage).
"""
from __future__ import annotations

import asyncio
import itertools
import os
import struct

from nfsd.context import Cred
from nfsd.rpc import finish_reply, parse_reply, start_success_reply, encode_call
from nfsd.xdr.core import decode, encode
from nfsd.xdr.nfs4 import *  # noqa: F401,F403 - the protocol's names, as in the RFC
from nfsd.xdr.rpc import AUTH_NONE, AUTH_SYS, SUCCESS

NFS_PROGRAM = 100003
NFS_V4 = 4

DEFAULT_CRED = Cred(flavor=AUTH_SYS, uid=0, gid=0, gids=(0,), machinename=b"nfsclient-test")


class RpcReplyError(Exception):
    """The server answered the RPC call with something other than SUCCESS."""

    def __init__(self, reply):
        super().__init__(f"rpc reply accepted={reply.accepted} stat={reply.stat} {reply.detail}")
        self.reply = reply


class NfsStatusError(Exception):
    def __init__(self, status: int, op: int | None = None, res=None):
        super().__init__(f"NFS status {status} at op {op}")
        self.status = status
        self.op = op
        self.res = res


def status_of(resop) -> int:
    v = resop.value
    return getattr(v, v.__slots__[0]) if v.xdr_kind == "struct" else v.tag


def check(res):
    """Raise NfsStatusError unless the COMPOUND succeeded; returns res."""
    if res.status != NFS4_OK:
        failed = next((r for r in res.resarray if status_of(r) != NFS4_OK), None)
        raise NfsStatusError(res.status, failed.tag if failed else None, res)
    return res


def op(opnum: int, args=None):
    return nfs_argop4(opnum, args)


# ---- attributes: a fixed, small set the tests need ------------------------------------
ATTR_TYPES = {
    FATTR4_TYPE: fattr4_type, FATTR4_CHANGE: fattr4_change, FATTR4_SIZE: fattr4_size,
    FATTR4_FILEID: fattr4_fileid, FATTR4_MODE: fattr4_mode, FATTR4_NUMLINKS: fattr4_numlinks,
    FATTR4_TIME_MODIFY: fattr4_time_modify, FATTR4_RAWDEV: fattr4_rawdev,
}
ATTR_NAMES = {FATTR4_TYPE: "type", FATTR4_CHANGE: "change", FATTR4_SIZE: "size",
              FATTR4_FILEID: "fileid", FATTR4_MODE: "mode", FATTR4_NUMLINKS: "numlinks",
              FATTR4_TIME_MODIFY: "mtime", FATTR4_RAWDEV: "rawdev"}
BASIC_ATTRS = (FATTR4_TYPE, FATTR4_CHANGE, FATTR4_SIZE, FATTR4_FILEID, FATTR4_MODE,
               FATTR4_NUMLINKS, FATTR4_TIME_MODIFY)


def bitmap(*attrs: int) -> list[int]:
    words = [0] * (max(attrs) // 32 + 1 if attrs else 0)
    for a in attrs:
        words[a // 32] |= 1 << (a % 32)
    return words


def bits(mask: list[int]) -> list[int]:
    return [w * 32 + b for w, word in enumerate(mask) for b in range(32) if word >> b & 1]


def encode_attrs(values: dict[int, object]) -> fattr4:
    out = bytearray()
    for a in sorted(values):
        ATTR_TYPES[a].pack(values[a], out)
    return fattr4(attrmask=bitmap(*values), attr_vals=bytes(out))


def decode_attrs(fa) -> dict[str, object]:
    buf = memoryview(bytes(fa.attr_vals))
    pos = 0
    out: dict[str, object] = {}
    for a in bits(fa.attrmask):
        t = ATTR_TYPES.get(a)
        if t is None:
            break                           # cannot skip an attribute we do not know
        out[ATTR_NAMES[a]], pos = t.unpack(buf, pos)
    return out


def _with_data_tail(framed: bytes, tail) -> list:
    """A framed call whose arguments end with an empty opaque, as the parts of the same call
    with `tail` as that opaque's bytes: the opaque's length patched here, the record mark by
    the server's own framing of a record with trailing data (nfsd.rpc.finish_reply)."""
    head = bytearray(framed)
    if head[-4:] != b"\0\0\0\0":
        raise ValueError("the call's arguments must end with an empty opaque")
    struct.pack_into(">I", head, len(head) - 4, len(tail))
    return list(finish_reply(head, (tail, -len(tail) % 4)).parts())


class NfsClient:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 minorversion: int, cred: Cred | None):
        self.reader = reader
        self.writer = writer
        self.minorversion = minorversion
        self.cred = cred
        self._xids = itertools.count(int.from_bytes(os.urandom(3), "big") << 4)
        self._pending: dict[int, asyncio.Future] = {}
        self._reader_task = asyncio.get_running_loop().create_task(self._read_loop())
        self.clientid: int | None = None
        self.sessionid: bytes | None = None
        self.slot_seqids: list[int] = []
        self._free_slots: asyncio.Queue | None = None
        self.last_sequence = None
        self.owner = b"nfsclient-" + os.urandom(8).hex().encode()
        self.verifier = os.urandom(8)
        self.session_attrs = None
        self.closed = asyncio.get_running_loop().create_future()
        self.owner_seqids: dict[bytes, int] = {}   # 4.0: open-owner -> next seqid
        self.confirmed_owners: set[bytes] = set()
        self.callbacks: list[tuple] = []     # (prog, proc, CB_COMPOUND4args | None)
        self.callback_arrived = asyncio.Event()

    @classmethod
    async def connect(cls, host: str, port: int, minorversion: int = 1,
                      cred: Cred | None = DEFAULT_CRED) -> "NfsClient":
        reader, writer = await asyncio.open_connection(host, port)
        return cls(reader, writer, minorversion, cred)

    async def close(self) -> None:
        self._reader_task.cancel()
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (ConnectionError, OSError):
            pass

    # ---- RPC -----------------------------------------------------------------------
    async def _read_loop(self) -> None:
        try:
            while True:
                record = bytearray()
                while True:
                    (mark,) = struct.unpack(">I", await self.reader.readexactly(4))
                    record += await self.reader.readexactly(mark & 0x7FFFFFFF)
                    if mark & 0x80000000:
                        break
                if struct.unpack_from(">I", record, 4)[0] == 0:     # msg_type CALL
                    self._callback_received(record)
                    continue
                reply = parse_reply(record)
                fut = self._pending.pop(reply.xid, None)
                if fut is not None and not fut.done():
                    fut.set_result(reply)
        except (asyncio.IncompleteReadError, ConnectionError, OSError) as exc:
            self._fail_all(exc)
        except asyncio.CancelledError:
            self._fail_all(ConnectionError("client closed"))
            raise
        finally:
            if not self.closed.done():
                self.closed.set_result(None)

    # ---- back channel: the server's calls to us -----------------------------------------
    def _callback_received(self, record: bytearray) -> None:
        xid, _mtype, _rpcvers, prog, _vers, proc = struct.unpack_from(">6I", record, 0)
        pos = 24
        for _ in range(2):                                  # credential, verifier
            (n,) = struct.unpack_from(">I", record, pos + 4)
            pos += 8 + (n + 3) // 4 * 4
        args = decode(CB_COMPOUND4args, memoryview(record)[pos:]) if proc == 1 else None
        self.callbacks.append((prog, proc, args))
        self.callback_arrived.set()
        reply = self.answer_callback(xid, proc, args)
        if reply:
            self.writer.write(reply)

    def answer_callback(self, xid: int, proc: int, args) -> bytes | None:
        """The framed reply to one callback (None: do not answer)."""
        out = start_success_reply(xid)
        if proc == 1:
            results = []
            for argop in args.argarray:
                if argop.tag == OP_CB_SEQUENCE and args.minorversion != self.minorversion:
                    # as the Linux client: a callback of another minor version than the
                    # client's finds no client for its session
                    results.append(nfs_cb_resop4(OP_CB_SEQUENCE, CB_SEQUENCE4res(NFS4ERR_BADSESSION)))
                    break
                if argop.tag == OP_CB_SEQUENCE:
                    a = argop.value
                    results.append(nfs_cb_resop4(OP_CB_SEQUENCE, CB_SEQUENCE4res(
                        NFS4_OK, CB_SEQUENCE4resok(a.csa_sessionid, a.csa_sequenceid,
                                                   a.csa_slotid, a.csa_highest_slotid,
                                                   a.csa_highest_slotid))))
                elif argop.tag == OP_CB_OFFLOAD:          # noted: the test reads `callbacks`
                    results.append(nfs_cb_resop4(OP_CB_OFFLOAD, CB_OFFLOAD4res(NFS4_OK)))
                else:
                    results.append(nfs_cb_resop4(OP_CB_ILLEGAL, CB_ILLEGAL4res(NFS4ERR_OP_ILLEGAL)))
                    break
            out += encode(CB_COMPOUND4res, CB_COMPOUND4res(NFS4_OK, args.tag, results))
        return bytes(finish_reply(out))

    async def wait_callback(self, timeout: float = 10.0) -> tuple:
        """The next callback not yet taken from `callbacks`."""
        while not self.callbacks:
            self.callback_arrived.clear()
            await asyncio.wait_for(self.callback_arrived.wait(), timeout)
        return self.callbacks.pop(0)

    def _fail_all(self, exc: BaseException) -> None:
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(ConnectionError(f"connection lost: {exc!r}"))
        self._pending.clear()

    def next_xid(self) -> int:
        return next(self._xids) & 0xFFFFFFFF

    async def send_raw(self, data: bytes | list, xid: int | None = None):
        """Send bytes as they are (a list: its parts one after the other, none copied into
        another); if `xid` is given, wait for the reply to it."""
        fut = None
        if self.closed.done():
            # The read loop has ended: a reply could never be matched to this call.
            raise ConnectionError("connection lost: the server closed it")
        if xid is not None:
            fut = asyncio.get_running_loop().create_future()
            self._pending[xid] = fut
        for part in (data if isinstance(data, list) else (data,)):
            self.writer.write(part)
        await self.writer.drain()
        return await fut if fut is not None else None

    async def call(self, proc: int, args: bytes = b"", *, prog: int = NFS_PROGRAM,
                   vers: int = NFS_V4, cred: Cred | None | str = "default", xid: int | None = None,
                   data_tail=None):
        """One RPC call; returns nfsd.rpc.ParsedReply (whatever the accept status).
        data_tail: `args` ends with an empty opaque (a WRITE's data, encoded as b""), and these
        are its bytes: sent after the rest, never copied into it (the bytes on the wire are
        the same as with the data in line)."""
        xid = self.next_xid() if xid is None else xid
        cred = self.cred if cred == "default" else cred
        message = encode_call(xid, prog, vers, proc, cred, args)
        if data_tail is not None:
            message = _with_data_tail(message, data_tail)
        return await self.send_raw(message, xid)

    async def null(self) -> None:
        reply = await self.call(0)
        if not reply.accepted or reply.stat != SUCCESS:
            raise RpcReplyError(reply)

    # ---- COMPOUND ------------------------------------------------------------------
    async def compound_raw(self, ops: list, *, minorversion: int | None = None, tag: bytes = b"",
                           xid: int | None = None, cred: Cred | None | str = "default", data_tail=None):
        """COMPOUND exactly as given (no SEQUENCE added); returns COMPOUND4res. data_tail:
        see call()."""
        mv = self.minorversion if minorversion is None else minorversion
        args = encode(COMPOUND4args, COMPOUND4args(tag=tag, minorversion=mv, argarray=ops))
        reply = await self.call(1, args, xid=xid, cred=cred, data_tail=data_tail)
        if not reply.accepted or reply.stat != SUCCESS:
            raise RpcReplyError(reply)
        return decode(COMPOUND4res, reply.body)

    async def compound(self, ops: list, *, cachethis: bool = False, data_tail=None):
        """COMPOUND on the session (SEQUENCE prepended, slot taken and released). data_tail:
        see call()."""
        if self.sessionid is None:
            return await self.compound_raw(ops, data_tail=data_tail)
        slot = await self._free_slots.get()
        try:
            self.slot_seqids[slot] = (self.slot_seqids[slot] + 1) & 0xFFFFFFFF
            seq = op(OP_SEQUENCE, SEQUENCE4args(
                sa_sessionid=self.sessionid, sa_sequenceid=self.slot_seqids[slot],
                sa_slotid=slot, sa_highest_slotid=len(self.slot_seqids) - 1,
                sa_cachethis=cachethis))
            res = await self.compound_raw([seq] + list(ops), data_tail=data_tail)
        finally:
            self._free_slots.put_nowait(slot)
        self.last_sequence = res.resarray[0] if res.resarray else None
        if not res.resarray or status_of(res.resarray[0]) != NFS4_OK:
            raise NfsStatusError(res.status, OP_SEQUENCE, res)
        res.resarray = res.resarray[1:]
        return res

    # ---- session setup ---------------------------------------------------------------
    async def exchange_id(self, *, owner: bytes | None = None, verifier: bytes | None = None,
                          flags: int = 0):
        args = EXCHANGE_ID4args(
            eia_clientowner=client_owner4(co_verifier=verifier or self.verifier,
                                          co_ownerid=owner or self.owner),
            eia_flags=flags, eia_state_protect=state_protect4_a(SP4_NONE),
            eia_client_impl_id=[])
        res = await self.compound_raw([op(OP_EXCHANGE_ID, args)])
        return res.resarray[0].value

    @staticmethod
    def channel_attrs(maxrequests: int = 16, size: int = 1024 * 1024 + 8192) -> channel_attrs4:
        return channel_attrs4(ca_headerpadsize=0, ca_maxrequestsize=size,
                              ca_maxresponsesize=size, ca_maxresponsesize_cached=8192,
                              ca_maxoperations=16, ca_maxrequests=maxrequests, ca_rdma_ird=[])

    async def create_session(self, clientid: int, sequence: int, *, slots: int = 16,
                             flags: int = CREATE_SESSION4_FLAG_CONN_BACK_CHAN,
                             fore: channel_attrs4 | None = None,
                             back: channel_attrs4 | None = None,
                             cred: Cred | None | str = "default"):
        args = CREATE_SESSION4args(
            csa_clientid=clientid, csa_sequence=sequence, csa_flags=flags,
            csa_fore_chan_attrs=fore or self.channel_attrs(slots),
            csa_back_chan_attrs=back or channel_attrs4(0, 4096, 4096, 0, 2, 1, []),
            csa_cb_program=0x40000000, csa_sec_parms=[callback_sec_parms4(AUTH_NONE)])
        res = await self.compound_raw([op(OP_CREATE_SESSION, args)], cred=cred)
        return res.resarray[0].value

    def use_session(self, sessionid: bytes, nslots: int) -> None:
        self.sessionid = sessionid
        self.slot_seqids = [0] * nslots
        self._free_slots = asyncio.Queue()
        for i in range(nslots):
            self._free_slots.put_nowait(i)

    # ---- NFSv4.0 client id (RFC 7530 16.33, 16.34) -----------------------------------
    async def setclientid(self, *, owner: bytes | None = None, verifier: bytes | None = None,
                          cred: Cred | None | str = "default"):
        args = SETCLIENTID4args(
            client=nfs_client_id4(verifier=verifier or self.verifier, id=owner or self.owner),
            callback=cb_client4(cb_program=0x40000000,
                                cb_location=netaddr4(na_r_netid=b"tcp", na_r_addr=b"127.0.0.1.0.0")),
            callback_ident=1)
        res = await self.compound_raw([op(OP_SETCLIENTID, args)], minorversion=0, cred=cred)
        return res.resarray[0].value

    async def setclientid_confirm(self, clientid: int, confirm: bytes,
                                  cred: Cred | None | str = "default") -> int:
        res = await self.compound_raw(
            [op(OP_SETCLIENTID_CONFIRM, SETCLIENTID_CONFIRM4args(clientid, confirm))],
            minorversion=0, cred=cred)
        return res.status

    async def setup_v40(self) -> None:
        sc = await self.setclientid()
        if sc.tag != NFS4_OK:
            raise NfsStatusError(sc.tag, OP_SETCLIENTID)
        status = await self.setclientid_confirm(sc.value.clientid, sc.value.setclientid_confirm)
        if status != NFS4_OK:
            raise NfsStatusError(status, OP_SETCLIENTID_CONFIRM)
        self.clientid = sc.value.clientid

    def take_seqid(self, owner: bytes) -> int:
        """The open-owner's next seqid (4.0); 0 in 4.1, where seqids are ignored."""
        if self.minorversion >= 1:
            return 0
        seqid = self.owner_seqids.get(owner, 1)
        self.owner_seqids[owner] = seqid + 1
        return seqid

    async def _opened(self, res, owner: bytes):
        """(fh, stateid) of an OPEN; a 4.0 owner's first OPEN is confirmed here."""
        ok = res.resarray[1].value.value
        fh, stateid = res.resarray[2].value.value.object, ok.stateid
        if ok.rflags & OPEN4_RESULT_CONFIRM:
            cres = check(await self.compound([
                op(OP_PUTFH, PUTFH4args(fh)),
                op(OP_OPEN_CONFIRM, OPEN_CONFIRM4args(stateid, self.take_seqid(owner)))]))
            stateid = cres.resarray[1].value.value.open_stateid
            self.confirmed_owners.add(owner)
        return fh, stateid

    async def setup_session(self, *, slots: int = 16, reclaim_complete: bool = True) -> None:
        if self.minorversion == 0:
            return await self.setup_v40()
        eid = await self.exchange_id()
        if eid.tag != NFS4_OK:
            raise NfsStatusError(eid.tag, OP_EXCHANGE_ID)
        self.clientid = eid.value.eir_clientid
        cs = await self.create_session(self.clientid, eid.value.eir_sequenceid, slots=slots)
        if cs.tag != NFS4_OK:
            raise NfsStatusError(cs.tag, OP_CREATE_SESSION)
        self.session_attrs = cs.value
        self.use_session(cs.value.csr_sessionid, cs.value.csr_fore_chan_attrs.ca_maxrequests)
        if reclaim_complete:
            check(await self.compound([op(OP_RECLAIM_COMPLETE, RECLAIM_COMPLETE4args(False))]))

    async def destroy_session(self) -> int:
        res = await self.compound_raw([op(OP_DESTROY_SESSION, DESTROY_SESSION4args(self.sessionid))])
        self.sessionid = None
        return res.status

    # ---- conveniences (need the filesystem ops) -----------------------------------------
    async def lookup_path(self, path: str) -> bytes:
        ops = [op(OP_PUTROOTFH)]
        ops += [op(OP_LOOKUP, LOOKUP4args(p.encode())) for p in path.strip("/").split("/") if p]
        ops.append(op(OP_GETFH))
        res = check(await self.compound(ops))
        return res.resarray[-1].value.value.object

    def _owner(self) -> open_owner4:
        return open_owner4(clientid=self.clientid, owner=b"owner-" + self.owner)

    async def open_create(self, dir_fh: bytes, name: str | bytes, mode: int = 0o644,
                          *, access: int = OPEN4_SHARE_ACCESS_BOTH):
        """OPEN (create if missing, UNCHECKED4); returns (fh, stateid)."""
        name = name.encode() if isinstance(name, str) else name
        owner = self._owner()
        args = OPEN4args(
            seqid=self.take_seqid(owner.owner), share_access=access,
            share_deny=OPEN4_SHARE_DENY_NONE, owner=owner,
            openhow=openflag4(OPEN4_CREATE, createhow4(UNCHECKED4, encode_attrs({FATTR4_MODE: mode}))),
            claim=open_claim4(CLAIM_NULL, name))
        res = check(await self.compound([op(OP_PUTFH, PUTFH4args(dir_fh)), op(OP_OPEN, args),
                                         op(OP_GETFH)]))
        return await self._opened(res, owner.owner)

    async def open_existing(self, dir_fh: bytes, name: str | bytes, *,
                            access: int = OPEN4_SHARE_ACCESS_READ):
        name = name.encode() if isinstance(name, str) else name
        owner = self._owner()
        args = OPEN4args(seqid=self.take_seqid(owner.owner), share_access=access,
                         share_deny=OPEN4_SHARE_DENY_NONE, owner=owner,
                         openhow=openflag4(OPEN4_NOCREATE), claim=open_claim4(CLAIM_NULL, name))
        res = check(await self.compound([op(OP_PUTFH, PUTFH4args(dir_fh)), op(OP_OPEN, args),
                                         op(OP_GETFH)]))
        return await self._opened(res, owner.owner)

    async def write(self, fh: bytes, stateid, offset: int, data: bytes, stable: int = UNSTABLE4,
                    *, data_out_of_line: bool = False):
        """data_out_of_line: the data is sent after the encoded call, not copied into it (a
        latency probe's own encoding is then not part of what it measures); same wire bytes."""
        tail = data if data_out_of_line else None
        wargs = WRITE4args(stateid, offset, stable, b"" if data_out_of_line else data)
        res = check(await self.compound([op(OP_PUTFH, PUTFH4args(fh)), op(OP_WRITE, wargs)],
                                        data_tail=tail))
        return res.resarray[1].value.value

    async def read(self, fh: bytes, stateid, offset: int, count: int) -> tuple[bytes, bool]:
        res = check(await self.compound([op(OP_PUTFH, PUTFH4args(fh)),
                                         op(OP_READ, READ4args(stateid, offset, count))]))
        ok = res.resarray[1].value.value
        return bytes(ok.data), ok.eof

    async def commit(self, fh: bytes, offset: int = 0, count: int = 0) -> bytes:
        res = check(await self.compound([op(OP_PUTFH, PUTFH4args(fh)),
                                         op(OP_COMMIT, COMMIT4args(offset, count))]))
        return res.resarray[1].value.value.writeverf

    async def close_file(self, fh: bytes, stateid):
        seqid = self.take_seqid(self._owner().owner)
        res = check(await self.compound([op(OP_PUTFH, PUTFH4args(fh)),
                                         op(OP_CLOSE, CLOSE4args(seqid, stateid))]))
        return res.resarray[1].value.value

    close_stateid = close_file

    async def remove(self, dir_fh: bytes, name: str | bytes):
        name = name.encode() if isinstance(name, str) else name
        return check(await self.compound([op(OP_PUTFH, PUTFH4args(dir_fh)),
                                          op(OP_REMOVE, REMOVE4args(name))]))

    async def rename(self, src_dir: bytes, old: str | bytes, dst_dir: bytes, new: str | bytes):
        old = old.encode() if isinstance(old, str) else old
        new = new.encode() if isinstance(new, str) else new
        return check(await self.compound([
            op(OP_PUTFH, PUTFH4args(src_dir)), op(OP_SAVEFH),
            op(OP_PUTFH, PUTFH4args(dst_dir)), op(OP_RENAME, RENAME4args(old, new))]))

    async def readdir(self, dir_fh: bytes, attrs=(FATTR4_TYPE, FATTR4_FILEID)) -> list[tuple]:
        """All entries: [(name, attrs dict, cookie)], following cookies to the end."""
        entries: list[tuple] = []
        cookie, verf = 0, bytes(8)
        while True:
            res = check(await self.compound([
                op(OP_PUTFH, PUTFH4args(dir_fh)),
                op(OP_READDIR, READDIR4args(cookie=cookie, cookieverf=verf, dircount=8192,
                                            maxcount=32768, attr_request=bitmap(*attrs)))]))
            ok = res.resarray[1].value.value
            verf = ok.cookieverf
            entry = ok.reply.entries
            while entry is not None:
                entries.append((bytes(entry.name), decode_attrs(entry.attrs), entry.cookie))
                cookie = entry.cookie
                entry = entry.nextentry
            if ok.reply.eof:
                return entries

    async def getattr(self, fh: bytes, attrs=BASIC_ATTRS) -> dict:
        res = check(await self.compound([op(OP_PUTFH, PUTFH4args(fh)),
                                         op(OP_GETATTR, GETATTR4args(bitmap(*attrs)))]))
        return decode_attrs(res.resarray[1].value.value.obj_attributes)


def sequence_op(sessionid: bytes, seqid: int, slot: int, highest: int = 0, cachethis: bool = False):
    return op(OP_SEQUENCE, SEQUENCE4args(sa_sessionid=sessionid, sa_sequenceid=seqid,
                                         sa_slotid=slot, sa_highest_slotid=highest,
                                         sa_cachethis=cachethis))


__all__ = ["NfsClient", "NfsStatusError", "RpcReplyError", "check", "op", "bitmap", "bits",
           "encode_attrs", "decode_attrs", "sequence_op", "status_of", "DEFAULT_CRED",
           "NFS_PROGRAM", "NFS_V4", "AUTH_NONE", "AUTH_SYS"]

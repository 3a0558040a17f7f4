"""The NFSv4.1 back channel of a session (RFC 8881 2.10.3.1, 18.33, 18.36, 20.9).

A session asks for a back channel at CREATE_SESSION (CREATE_SESSION4_FLAG_CONN_BACK_CHAN)
or later by BIND_CONN_TO_SESSION with a back direction; BACKCHANNEL_CTL changes its
program number and security. The server then calls the client on the client's own
connection: CB_NULL to learn whether the path works (`probe`), and CB_COMPOUND, whose
first op is always CB_SEQUENCE on a slot of the back channel's own slot table
(`cb_compound`). Nothing grants delegations, so no CB_RECALL is ever sent; CB_OFFLOAD
(the end of an asynchronous COPY, nfsd/offload.py) goes through `cb_compound`.

The state SEQUENCE reports (SEQ4_STATUS_CB_PATH_DOWN[_SESSION]) is `path_down`: the
session wants a back channel and has no live connection for it, or its last callback
failed (no reply in time, a connection gone, a reply that does not decode).

Codec only through the declared types (CB_COMPOUND4args/res in nfsd/xdr/nfs4_prot.x)
and nfsd/rpc.py (`encode_call`, `parse_reply`); the bytes go through the transport's
`call_back`, so a malformed or missing reply costs one failed callback, never the server.
"""
from __future__ import annotations

import asyncio

import structlog

from nfsd.context import Cred
from nfsd.rpc import RpcDecodeError, encode_call, parse_reply
from nfsd.transport import CallbackFailed
from nfsd.xdr.core import XdrError, decode, encode
from nfsd.xdr.nfs4 import (
    AUTH_NONE, AUTH_SYS, CB_COMPOUND4args, CB_COMPOUND4res, CB_SEQUENCE4args, NFS4_OK,
    OP_CB_SEQUENCE, nfs_cb_argop4,
)
from nfsd.xdr.rpc import SUCCESS

log = structlog.get_logger(__name__)

NFS_CB = 1                 # the callback program's version (RFC 8881 20, "NFS_CB")
CB_NULL = 0
CB_COMPOUND = 1
# Back channel slots we use at most: one callback at a time is all the server needs
# today; the client's ca_maxrequests may be larger (Linux offers 16).
MAX_BACK_SLOTS = 4

UNKNOWN, UP, DOWN = "unknown", "up", "down"


class CallbackError(Exception):
    """A CB_COMPOUND failed: no reply, a reply that does not decode, or an RPC error."""


def callback_cred(sec_parms) -> Cred | None:
    """The first of the client's callback_sec_parms4 we can speak (AUTH_NONE, AUTH_SYS);
    None when it offers only RPCSEC_GSS, which we do not."""
    for parm in sec_parms:
        if parm.tag == AUTH_NONE:
            return Cred(flavor=AUTH_NONE)
        if parm.tag == AUTH_SYS:
            sys = parm.value
            return Cred(flavor=AUTH_SYS, uid=sys.uid, gid=sys.gid, gids=tuple(sys.gids),
                        machinename=bytes(sys.machinename))
    return None


class BackChannel:
    """One session's back channel: its program and credential, the connections that may
    carry it, its slot table and whether the path is up."""

    def __init__(self, session, program: int, sec_parms, maxrequests: int):
        self.session = session
        self.program = program
        self.cred = callback_cred(sec_parms)
        self.conns: list = []                   # bound for the back channel, newest last
        self.wanted = False                     # asked for (else never "down")
        self.state = UNKNOWN                    # of the last probe or callback
        self.slot_seqids = [0] * max(1, min(maxrequests, MAX_BACK_SLOTS))
        self._free_slots = list(range(len(self.slot_seqids)))
        self._probe: asyncio.Task | None = None
        self._reprobe = False

    # ---- configuration (CREATE_SESSION, BIND_CONN_TO_SESSION, BACKCHANNEL_CTL) ------
    def set_security(self, program: int, sec_parms) -> None:
        self.program = program
        self.cred = callback_cred(sec_parms)

    def add_connection(self, conn) -> None:
        if conn is None:
            return
        self._forget_gone()
        if conn in self.conns:
            self.conns.remove(conn)
        self.conns.append(conn)

    def connection(self):
        """The newest live connection bound for callbacks (closed ones are forgotten).
        Asked by every SEQUENCE (its status flags): the newest is checked first, and the
        list rebuilt only when that one is gone."""
        conns = self.conns
        if conns:
            newest = conns[-1]
            if not newest.closed and newest in self.session.connections:
                return newest
        self._forget_gone()
        return self.conns[-1] if self.conns else None

    def _forget_gone(self) -> None:
        self.conns = [c for c in self.conns
                      if not c.closed and c in self.session.connections]

    @property
    def path_down(self) -> bool:
        if self.session.destroyed:
            return False
        return self.cred is None or self.state == DOWN or self.connection() is None

    # ---- CB_NULL ------------------------------------------------------------------
    def probe(self) -> None:
        """Check the path with CB_NULL, in the background (after the reply of the op that
        asked for it). A probe asked for while one runs is run again after it. A probe
        outlives its session's destruction (bounded by callback_timeout), so the client's
        answer still finds its call."""
        if self._probe is not None and not self._probe.done():
            self._reprobe = True
            return
        self._probe = asyncio.get_running_loop().create_task(
            self._probe_loop(), name=f"cb-probe-{self.session.sessionid.hex()[:16]}")

    async def _probe_loop(self) -> None:
        while True:
            self._reprobe = False
            await self.cb_null()
            if not self._reprobe or self.session.destroyed:
                return

    async def cb_null(self) -> bool:
        conn = self.connection()
        if conn is None or self.cred is None:
            self._set_state(DOWN, "no connection for the back channel" if conn is None
                            else "no callback security flavour we speak")
            return False
        try:
            reply = parse_reply(await conn.call_back(
                lambda xid: encode_call(xid, self.program, NFS_CB, CB_NULL, self.cred)))
        except (CallbackFailed, RpcDecodeError) as exc:
            self._set_state(DOWN, f"CB_NULL: {exc}")
            return False
        if not reply.accepted or reply.stat != SUCCESS:
            self._set_state(DOWN, f"CB_NULL answered accepted={reply.accepted} stat={reply.stat}")
            return False
        self._set_state(UP, "CB_NULL answered")
        return True

    # ---- CB_COMPOUND --------------------------------------------------------------
    async def cb_compound(self, ops: list, tag: bytes = b"") -> CB_COMPOUND4res:
        """Send CB_COMPOUND with CB_SEQUENCE first and `ops` after it; returns the
        decoded CB_COMPOUND4res (resarray[0] is CB_SEQUENCE's). Raises CallbackError."""
        conn = self.connection()
        if conn is None or self.cred is None:
            self._set_state(DOWN, "no connection for the back channel")
            raise CallbackError("back channel down")
        back = self.session.back
        if len(ops) + 1 > back.maxoperations:
            raise CallbackError(f"{len(ops) + 1} ops above the back channel's {back.maxoperations}")
        if not self._free_slots:
            raise CallbackError("every back channel slot is busy")
        slot = self._free_slots.pop()
        try:
            # The slot's sequence advances only when the client answered this CB_SEQUENCE
            # (as knfsd): after a lost reply or an error the next call is a retry with the
            # same seqid, which the client answers from its slot (RFC 8881 2.10.6.1).
            seqid = (self.slot_seqids[slot] + 1) & 0xFFFFFFFF
            seq = nfs_cb_argop4(OP_CB_SEQUENCE, CB_SEQUENCE4args(
                csa_sessionid=self.session.sessionid, csa_sequenceid=seqid, csa_slotid=slot,
                csa_highest_slotid=len(self.slot_seqids) - 1, csa_cachethis=False,
                csa_referring_call_lists=[]))
            args = encode(CB_COMPOUND4args, CB_COMPOUND4args(
                # the client's own minor version: the Linux client finds the session of a
                # CB_SEQUENCE only among its clients of that minor version (else BADSESSION)
                tag=tag, minorversion=self.session.client.minorversion, callback_ident=0,
                argarray=[seq] + list(ops)))
            call = bytearray(encode_call(0, self.program, NFS_CB, CB_COMPOUND, self.cred, args))
            if len(call) - 4 > back.maxrequestsize:       # the client's limit (18.36.3)
                raise CallbackError(f"CB_COMPOUND of {len(call) - 4} bytes above the back "
                                    f"channel's ca_maxrequestsize {back.maxrequestsize}")

            def with_xid(xid: int) -> bytearray:
                call[4:8] = xid.to_bytes(4, "big")        # the xid follows the record mark
                return call
            try:
                record = await conn.call_back(with_xid)
                reply = parse_reply(record)
                if not reply.accepted or reply.stat != SUCCESS:
                    raise CallbackError(f"RPC accepted={reply.accepted} stat={reply.stat}")
                res = decode(CB_COMPOUND4res, reply.body)
            except (CallbackFailed, RpcDecodeError, XdrError, CallbackError) as exc:
                self._set_state(DOWN, f"CB_COMPOUND: {exc}")
                raise CallbackError(str(exc)) from None
            self._check_sequence(res, slot, seqid)
            self.slot_seqids[slot] = seqid
            self._set_state(UP, "CB_COMPOUND answered")
            return res
        finally:
            self._free_slots.append(slot)

    def _check_sequence(self, res, slot: int, seqid: int) -> None:
        """The reply must answer our CB_SEQUENCE (RFC 8881 20.9.3); a client that answers
        another slot or session has lost the back channel's sequence."""
        first = res.resarray[0] if res.resarray else None
        if first is None or first.tag != OP_CB_SEQUENCE:
            self._set_state(DOWN, "CB_COMPOUND reply without CB_SEQUENCE")
            raise CallbackError("reply without CB_SEQUENCE")
        if first.value.tag != NFS4_OK:
            raise CallbackError(f"CB_SEQUENCE status {first.value.tag}")
        ok = first.value.value
        if (bytes(ok.csr_sessionid) != self.session.sessionid or ok.csr_slotid != slot
                or ok.csr_sequenceid != seqid):
            self._set_state(DOWN, "CB_SEQUENCE reply for another slot or sequence")
            raise CallbackError("CB_SEQUENCE reply does not match the call")

    def _set_state(self, state: str, why: str) -> None:
        if state != self.state:
            log.info("backchannel_" + state, client=self.session.client.name,
                     session=self.session.sessionid.hex(), reason=why)
        self.state = state

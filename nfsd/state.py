"""Client records, sessions, slot tables with their reply cache, and leases (RFC 8881).

Protocol-free bookkeeping: the ops in nfsd/ops/session.py implement the RFC rules
on top of these objects. The shape also fits NFSv4.0 (RFC 7530), which adds
SETCLIENTID/SETCLIENTID_CONFIRM and RENEW: a Client without sessions whose lease is
renewed by any stateful op; `Client.minorversion` tells them apart.
"""
from __future__ import annotations

import asyncio
import itertools
from collections import OrderedDict
import os
import struct
import time
from dataclasses import dataclass, field
from typing import Callable

import structlog

log = structlog.get_logger(__name__)

DEFAULT_LEASE_TIME = 90
SEQID_MOD = 1 << 32
# The reply caches of all sessions together (bytes), reserved per slot at the size a slot
# must be able to keep: the cached-reply size its session was granted (what sa_cachethis can
# make it hold), 2 to 4 KiB (nfsd/ops/session.py slot_bytes). A new session gets at most an
# eighth of what is free, and a client's only session one slot when nothing is (as Linux
# knfsd's DRC limit). Linux and nfs-rs clients get 4 KiB slots, so 128 MiB is about 500
# clients at 64 slots, then fewer each; the one-slot overdraft adds at most max_clients x 4 KiB.
DRC_BUDGET = 128 * 1024 * 1024
# Replies bigger than their slot's reservation (a READDIR, say) that no sa_cachethis asked
# for are kept too while this shared pool lasts, so a retransmission is answered exactly;
# past it they go uncached (a retry gets NFS4ERR_RETRY_UNCACHED_REP, RFC 8881 2.10.6.1.3).
DRC_EXTRA_BUDGET = 32 * 1024 * 1024


def next_seqid(seqid: int) -> int:
    """Sequence ids wrap at 2**32 (RFC 8881 section 2.10.6.1)."""
    return (seqid + 1) % SEQID_MOD


async def cancel_and_wait(task: asyncio.Task | None) -> None:
    """Cancel a background task (the lease reaper, the end of a grace period) and wait
    until it has ended."""
    if task is None:
        return
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass


@dataclass(slots=True)
class ChannelAttrs:
    """channel_attrs4 as negotiated (RFC 8881 section 18.36)."""
    headerpadsize: int
    maxrequestsize: int
    maxresponsesize: int
    maxresponsesize_cached: int
    maxoperations: int
    maxrequests: int


class Slot:
    """One slot of a session's fore channel with its reply cache (RFC 8881 2.10.6)."""
    __slots__ = ("seqid", "reply", "cached", "in_progress", "used", "signature", "extra")

    def __init__(self) -> None:
        self.seqid = 0             # the last sequence id seen; the first request uses 1
        self.used = False          # a request was ever accepted here (else no "retry" exists)
        self.signature: tuple = ()  # size and op numbers of that request, to spot false retries
        self.reply: bytes | None = None   # the encoded COMPOUND4res of the last request
        self.cached = False        # False: the last reply was not kept (sa_cachethis unset)
        self.in_progress = False
        self.extra = 0             # bytes of `reply` charged to the shared extra pool


class Session:
    def __init__(self, sessionid: bytes, client: "Client", flags: int, fore: ChannelAttrs,
                 back: ChannelAttrs, cb_program: int, slot_bytes: int = 0):
        self.sessionid = sessionid
        self.client = client
        self.flags = flags
        self.fore = fore
        self.back = back
        self.cb_program = cb_program
        self.slots = [Slot() for _ in range(fore.maxrequests)]
        self.connections: set = set()      # transport connections bound to this session
        self.destroyed = False
        self.slot_bytes = slot_bytes       # reply bytes reserved per slot (always kept)
        self.drc_bytes = slot_bytes * len(self.slots)   # reserved for all its slots
        self.backchannel = None            # nfsd.callback.BackChannel once one is asked for

    @property
    def highest_slotid(self) -> int:
        return len(self.slots) - 1

    def in_flight(self) -> bool:
        return any(slot.in_progress for slot in self.slots)


@dataclass(eq=False)
class Client:
    """A client record (RFC 8881 section 2.4): identified by its owner, versioned by
    its verifier; `clientid` is ours. `principal` is who created it (flavor, uid)."""
    clientid: int
    owner: bytes
    verifier: bytes
    principal: tuple
    minorversion: int
    confirmed: bool = False
    # CREATE_SESSION's own single-slot sequence (RFC 8881 18.36.4): last seqid + reply
    cs_seqid: int = 0
    cs_reply: object = None
    reclaim_complete: bool = False
    recorded: bool = False          # its record is on stable storage (nfsd/grace.py)
    last_renew: float = field(default_factory=time.monotonic)
    expired: bool = False
    sessions: dict = field(default_factory=dict)    # sessionid -> Session
    peer: tuple = ()
    # NFSv4.0 (RFC 7530 16.33): SETCLIENTID's confirm verifier, and a callback update
    # waiting for SETCLIENTID_CONFIRM on a confirmed record (its verifier and callback).
    confirm_verifier: bytes = b""
    callback: object = None
    pending_update: tuple | None = None
    # SEQ4_STATUS_*_REVOKED bits SEQUENCE reports: state the server took from this client
    # while keeping the record (`SessionManager.revoke_state`).
    revoked_flags: int = 0

    def renew(self) -> None:
        self.last_renew = time.monotonic()

    def busy(self) -> bool:
        return any(s.in_flight() for s in self.sessions.values())

    @property
    def name(self) -> str:
        return f"{self.clientid:016x}"


class SessionManager:
    """All client records and sessions of one server instance."""

    def __init__(self, lease_time: float = DEFAULT_LEASE_TIME, *, boot_time: int | None = None,
                 max_clients: int = 4096, drc_budget: int = DRC_BUDGET):
        self.lease_time = lease_time
        # Confirmed clients idle longer than lease_time + grace are expired; the grace
        # absorbs a client's renewal arriving late on a loaded network. An unconfirmed
        # record gets no grace: it holds no state and goes after one lease (expiry_limit).
        self.expiry_grace = min(lease_time / 2, 15.0)
        self.max_clients = max_clients
        self.drc_budget = drc_budget
        self.drc_reserved = 0
        self.drc_extra_budget = DRC_EXTRA_BUDGET
        self.drc_extra = 0                 # bytes kept beyond their slots' reservations
        # clientids (RFC 8881 2.4): boot epoch in the high half, so ids from an earlier
        # server instance are recognisably stale (NFS4ERR_STALE_CLIENTID).
        self.boot_epoch = (boot_time if boot_time is not None else int(time.time())) & 0xFFFFFFFF
        self._counter = itertools.count(1)
        self._session_salt = os.urandom(4)
        self.clients: dict[int, Client] = {}
        self.sessions: dict[bytes, Session] = {}
        self.on_client_expired: list[Callable[[Client], None]] = []
        # Clientids whose lease ran out, so a 4.0 client is told NFS4ERR_EXPIRED rather
        # than STALE_CLIENTID (bounded: oldest forgotten first).
        self.expired_ids: OrderedDict = OrderedDict()
        self._reaper: asyncio.Task | None = None
        # Grace period hook (RFC 8881 8.4.2, set by the server to nfsd/grace.py): whether a
        # client must still reclaim, reported by SEQUENCE as SEQ4_STATUS_RESTART_RECLAIM_NEEDED.
        self.reclaim_needed: Callable[[Client], bool] = lambda client: False

    # ---- clients ----------------------------------------------------------------
    def new_client(self, owner: bytes, verifier: bytes, principal: tuple, minorversion: int,
                   peer: tuple = ()) -> Client:
        clientid = (self.boot_epoch << 32) | (next(self._counter) & 0xFFFFFFFF)
        client = Client(clientid, owner, verifier, principal, minorversion, peer=peer)
        self.clients[clientid] = client
        return client

    def records_of(self, owner: bytes) -> list[Client]:
        """Every live record (confirmed or not) of one client owner string."""
        return [c for c in self.clients.values() if c.owner == owner and not c.expired]

    def is_stale_clientid(self, clientid: int) -> bool:
        return (clientid >> 32) != self.boot_epoch

    def find_by_owner(self, owner: bytes, confirmed: bool) -> Client | None:
        for client in self.clients.values():
            if client.owner == owner and client.confirmed == confirmed and not client.expired:
                return client
        return None

    def remove_client(self, client: Client, reason: str) -> None:
        """Forget a client and everything it holds; other rooms drop their state
        through `on_client_expired` (N2's open state closes its files there)."""
        if client.expired:
            return
        client.expired = True
        for session in list(client.sessions.values()):
            self._drop_session(session)
        self.clients.pop(client.clientid, None)
        self._drop_state(client)
        log.info("client_removed", client=client.name, reason=reason,
                 owner=client.owner[:64].hex())

    def revoke_state(self, client: Client, flag: int, reason: str) -> None:
        """Take a client's state (opens, locks) but keep its record and sessions, so its
        next SEQUENCE can tell it why: `flag` is the SEQ4_STATUS_*_REVOKED bit to report."""
        client.revoked_flags |= flag
        self._drop_state(client)
        log.info("client_state_revoked", client=client.name, reason=reason)

    def _drop_state(self, client: Client) -> None:
        for hook in list(self.on_client_expired):
            try:
                hook(client)
            except Exception:       # one room's bug must not keep others' state alive
                log.exception("client_expiry_hook_failed", client=client.name, hook=repr(hook))

    # ---- sessions ---------------------------------------------------------------
    def slots_free(self, slot_bytes: int) -> int:
        """How many more reply-cache slots of `slot_bytes` fit in the budget."""
        return max(0, self.drc_budget - self.drc_reserved) // slot_bytes

    def new_session(self, client: Client, flags: int, fore: ChannelAttrs, back: ChannelAttrs,
                    cb_program: int, slot_bytes: int = 0) -> Session:
        sessionid = struct.pack(">QI", client.clientid, next(self._counter) & 0xFFFFFFFF) \
            + self._session_salt
        session = Session(sessionid, client, flags, fore, back, cb_program, slot_bytes)
        self.drc_reserved += session.drc_bytes
        self.sessions[sessionid] = session
        client.sessions[sessionid] = session
        return session

    def destroy_session(self, session: Session) -> None:
        self._drop_session(session)
        log.info("session_destroyed", client=session.client.name, session=session.sessionid.hex())

    def keep_reply(self, session: Session, slot: Slot, reply: bytes) -> bool:
        """Keep a finished request's reply in its slot if it fits the slot's reservation,
        or else the shared extra pool (never for a session already destroyed)."""
        self.forget_reply(slot)
        size = len(reply)
        if size > session.slot_bytes:
            if session.destroyed or self.drc_extra + size > self.drc_extra_budget:
                return False
            slot.extra = size
            self.drc_extra += size
        slot.reply, slot.cached = reply, True
        return True

    def forget_reply(self, slot: Slot) -> None:
        """Drop a slot's kept reply (a new request in the slot, or its session gone)."""
        self.drc_extra -= slot.extra
        slot.extra = 0
        slot.reply, slot.cached = None, False

    def _drop_session(self, session: Session) -> None:
        if not session.destroyed:
            self.drc_reserved -= session.drc_bytes
            for slot in session.slots:
                self.forget_reply(slot)
        session.destroyed = True
        self.sessions.pop(session.sessionid, None)
        session.client.sessions.pop(session.sessionid, None)
        for conn in list(session.connections):
            unbind = getattr(conn, "sessions", None)
            if unbind is not None:
                unbind.discard(session)
        session.connections.clear()

    def bind_connection(self, session: Session, conn) -> None:
        if conn is None:
            return
        session.connections.add(conn)
        bound = getattr(conn, "sessions", None)
        if bound is not None:
            bound.add(session)

    def connection_lost(self, conn) -> None:
        for session in list(getattr(conn, "sessions", ())):
            session.connections.discard(conn)

    # ---- leases -----------------------------------------------------------------
    def expiry_limit(self, client: Client) -> float:
        """How long a client may stay silent before the reaper removes it. A confirmed
        client: its lease and the expiry grace (a late renewal still finds its state). An
        unconfirmed record (EXCHANGE_ID or SETCLIENTID not yet confirmed): its lease alone,
        as it holds no state and the server may drop it any time after a lease (RFC 8881
        18.35.4, RFC 7530 16.33.5; pynfs EID9 expects it gone by lease + 10 s)."""
        return self.lease_time + (self.expiry_grace if client.confirmed else 0.0)

    def expire_idle(self, now: float | None = None) -> list[Client]:
        """Expire clients whose lease ran out (RFC 8881 section 8.3). A client with a
        request in progress is never expired under it."""
        now = time.monotonic() if now is None else now
        expired = [c for c in self.clients.values()
                   if now - c.last_renew > self.expiry_limit(c) and not c.busy()]
        for client in expired:
            self.expire(client, "lease expired")
        return expired

    def lapsed(self, client: Client, now: float | None = None) -> bool:
        """Past its lease (the reaper waits a little longer; a conflict need not)."""
        now = time.monotonic() if now is None else now
        return now - client.last_renew > self.lease_time and not client.busy()

    def expire(self, client: Client, reason: str) -> None:
        self.expired_ids[client.clientid] = None
        if len(self.expired_ids) > self.max_clients:
            self.expired_ids.popitem(last=False)
        self.remove_client(client, reason)

    def start_reaper(self) -> None:
        if self._reaper is None:
            self._reaper = asyncio.get_running_loop().create_task(self._reap_forever(),
                                                                 name="nfsd-lease-reaper")

    async def stop_reaper(self) -> None:
        task, self._reaper = self._reaper, None
        await cancel_and_wait(task)

    async def _reap_forever(self) -> None:
        interval = max(0.05, min(self.lease_time / 4, 10.0))
        while True:
            await asyncio.sleep(interval)
            try:
                self.expire_idle()
            except Exception:
                log.exception("lease_reaper_failed")

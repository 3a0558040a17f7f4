"""Open state: open stateids, open owners, share reservations and byte-range locks
(RFC 8881 sections 8.2, 9.1-9.7, 18.16).

One OpenState per (client, open-owner, file), as RFC 8881 9.10 asks: a second OPEN by
the same owner upgrades it and bumps its seqid. Each OpenState holds exactly one
store open (`store.open_file(ino, write)`), re-taken when WRITE access is gained or
dropped, so the store always knows which files are open for write.

Byte-range locks (LOCK/LOCKT/LOCKU) hang off the opens: one LockState per (lock-owner,
file), derived from an open, released with it at CLOSE or when the client expires.

Stateid `other` (12 bytes) = this table's random 4-byte epoch + an 8-byte counter:
stateids of an earlier server instance never match and get NFS4ERR_BAD_STATEID.
"""
from __future__ import annotations

import os
import struct
from collections import OrderedDict, defaultdict
from dataclasses import dataclass, field

import structlog

from cache.api import StoreError
from nfsd.errors import NfsError
from nfsd.owners import OwnerTable
from nfsd.xdr.nfs4 import (
    NFS4ERR_BAD_STATEID, NFS4ERR_LOCKS_HELD, NFS4ERR_OLD_STATEID, NFS4ERR_SHARE_DENIED,
    NFS4ERR_EXPIRED, NFS4ERR_INVAL, NFS4ERR_STALE_STATEID,
    NFS4_OK, stateid4,
)

log = structlog.get_logger(__name__)

SHARE_ACCESS_READ = 1
SHARE_ACCESS_WRITE = 2
SHARE_ACCESS_BOTH = 3
SEQID_MAX = 0xFFFFFFFF
MAX_EXPIRED_REMEMBERED = 65536

ZERO_OTHER = bytes(12)
ONES_OTHER = b"\xff" * 12

# Special stateids (RFC 8881 section 8.2.3).
ANONYMOUS = "anonymous"      # seqid 0, other 0: no open state, full permission checks
BYPASS = "bypass"            # seqid all ones, other all ones: READ bypassing share deny
CURRENT = "current"          # seqid 1, other 0: the COMPOUND's current stateid
INVALID = "invalid"          # seqid all ones, other 0


def special_kind(sid) -> str | None:
    other = bytes(sid.other)
    if other == ZERO_OTHER:
        if sid.seqid == 0:
            return ANONYMOUS
        if sid.seqid == 1:
            return CURRENT
        return INVALID
    if other == ONES_OTHER:
        return BYPASS if sid.seqid == SEQID_MAX else INVALID
    return None


def invalid_stateid():
    return stateid4(seqid=SEQID_MAX, other=ZERO_OTHER)


@dataclass(slots=True, eq=False)
class OpenState:
    other: bytes
    seqid: int
    clientid: int
    owner: bytes
    ino: int
    export_id: int
    access: int
    deny: int
    write_open: bool            # the flag of the store open this state holds
    confirmed: bool = True      # 4.0: False until OPEN_CONFIRM (RFC 7530 16.18.5)
    # Every share_access / share_deny value an OPEN of this state asked for: a downgrade
    # may only go back to one of them (RFC 7530 16.19.4, RFC 8881 18.18.3).
    opened: set = field(default_factory=set)
    denied: set = field(default_factory=set)

    def stateid(self):
        return stateid4(seqid=self.seqid, other=self.other)

    def bump(self) -> None:
        # seqid wraps from 0xffffffff to 1: 0 means "current" in 4.1 (RFC 8881 8.2.2).
        self.seqid = 1 if self.seqid == SEQID_MAX else self.seqid + 1


LOCK_READ = 1            # READ_LT / READW_LT
LOCK_WRITE = 2           # WRITE_LT / WRITEW_LT
RANGE_END = 1 << 64      # a length of all ones locks to the end of any file


@dataclass(slots=True, eq=False)
class LockState:
    """Byte-range locks of one lock-owner on one file (RFC 8881 section 9.1): a
    stateid derived from an open, and the owner's ranges [start, end) with their type."""
    other: bytes
    seqid: int
    clientid: int
    owner: bytes
    open: OpenState
    ranges: list            # [(start, end, LOCK_READ | LOCK_WRITE)], sorted, disjoint

    @property
    def ino(self) -> int:
        return self.open.ino

    @property
    def export_id(self) -> int:
        return self.open.export_id

    @property
    def access(self) -> int:
        return self.open.access

    def stateid(self):
        return stateid4(seqid=self.seqid, other=self.other)

    bump = OpenState.bump


def _cut(ranges: list, start: int, end: int) -> list:
    """The ranges with [start, end) removed (POSIX: unlocking splits a lock)."""
    out = []
    for s, e, t in ranges:
        if e <= start or s >= end:
            out.append((s, e, t))
            continue
        if s < start:
            out.append((s, start, t))
        if e > end:
            out.append((end, e, t))
    return out


class LockConflict(Exception):
    """A lock request overlaps another owner's lock (the caller answers NFS4ERR_DENIED)."""

    def __init__(self, holder: LockState, start: int, end: int, kind: int):
        super().__init__("lock conflict")
        self.holder, self.start, self.end, self.kind = holder, start, end, kind


class OpenStateTable:
    def __init__(self, store):
        self.store = store
        self._epoch = os.urandom(4)
        self._counter = 0
        self._by_other: dict[bytes, OpenState] = {}
        self._by_owner_file: dict[tuple, OpenState] = {}
        self._by_ino: dict[int, set[OpenState]] = defaultdict(set)
        self._by_client: dict[int, set[OpenState]] = defaultdict(set)
        self._locks: dict[bytes, LockState] = {}             # by stateid other
        self._lock_by_owner_file: dict[tuple, LockState] = {}
        self._locks_of_open: dict[bytes, set[LockState]] = defaultdict(set)
        self._locks_by_ino: dict[int, set[LockState]] = defaultdict(set)
        self.owners = OwnerTable()          # NFSv4.0 owner seqids (nfsd/owners.py)
        # `other`s of states dropped with their client: a 4.0 client using one later is
        # told NFS4ERR_EXPIRED rather than BAD_STATEID (bounded, oldest forgotten first).
        self._expired: OrderedDict = OrderedDict()

    def attach(self, sessions) -> None:
        """Drop a client's opens when the session layer expires or destroys it."""
        sessions.on_client_expired.append(self.drop_client)

    def __len__(self) -> int:
        return len(self._by_other)

    def _new_other(self) -> bytes:
        self._counter += 1
        return self._epoch + struct.pack(">Q", self._counter)

    # ---- OPEN / OPEN_DOWNGRADE / CLOSE ------------------------------------------------------
    def open(self, clientid: int, owner: bytes, ino: int, export_id: int,
             access: int, deny: int) -> OpenState:
        """Open (or upgrade the owner's open of) a file; NFS4ERR_SHARE_DENIED on a conflict
        with another owner's share reservation (RFC 8881 9.7)."""
        key = (clientid, bytes(owner), ino)
        existing = self._by_owner_file.get(key)
        # The owner's own earlier deny counts too (RFC 7530 9.9, 16.16.5).
        for other in self._by_ino.get(ino, ()):
            if access & other.deny or deny & other.access:
                raise NfsError(NFS4ERR_SHARE_DENIED)
        if existing is not None:
            self._reopen_store(existing, existing.access | access)
            existing.access |= access
            existing.deny |= deny
            existing.opened.add(access)
            existing.denied.add(deny)
            existing.bump()
            return existing
        write = bool(access & SHARE_ACCESS_WRITE)
        self.store.open_file(ino, write)
        st = OpenState(self._new_other(), 1, clientid, bytes(owner), ino, export_id,
                       access, deny, write, opened={access}, denied={deny})
        self._by_other[st.other] = st
        self._by_owner_file[key] = st
        self._by_ino[ino].add(st)
        self._by_client[clientid].add(st)
        return st

    def downgrade(self, st: OpenState, access: int, deny: int) -> None:
        if access not in st.opened or deny not in st.denied:
            raise NfsError(NFS4ERR_INVAL, "downgrade to a mode never opened")
        self._reopen_store(st, access)
        st.opened = {a for a in st.opened if not a & ~access} | {access}
        st.denied = {d for d in st.denied if not d & ~deny} | {deny}
        st.access = access
        st.deny = deny
        st.bump()

    def close(self, st: OpenState):
        """Forget the open; the store's queued reclaim of an unlinked file (a Future, or None:
        a settle stamp is not waited for), which CLOSE awaits so that the reply follows it
        (a removed file is gone by then)."""
        # The client unlocks before CLOSE; whatever remains goes with the open.
        for lk in list(self._locks_of_open.get(st.other, ())):
            self._forget_lock(lk)
        self._forget(st)
        try:
            # the event loop's call: the settle stamp and reclaim are queued, never run here
            return self.store.close_file(st.ino, st.write_open, wait=False)
        except StoreError as e:
            log.warning("close_file_failed", ino=st.ino, error=str(e))
            return None

    def _reopen_store(self, st: OpenState, new_access: int) -> None:
        write = bool(new_access & SHARE_ACCESS_WRITE)
        if write == st.write_open:
            return
        self.store.open_file(st.ino, write)
        try:
            # the open stays, so at most a last writer's settle stamp: queued (an event-loop call)
            self.store.close_file(st.ino, st.write_open, wait=False)
        finally:
            st.write_open = write

    def _forget(self, st: OpenState) -> None:
        self._by_other.pop(st.other, None)
        self._by_owner_file.pop((st.clientid, st.owner, st.ino), None)
        for index, k in ((self._by_ino, st.ino), (self._by_client, st.clientid)):
            group = index.get(k)
            if group is not None:
                group.discard(st)
                if not group:
                    del index[k]

    def _remember_expired(self, other: bytes) -> None:
        self._expired[other] = None
        if len(self._expired) > MAX_EXPIRED_REMEMBERED:
            self._expired.popitem(last=False)

    def has_state(self, client) -> bool:
        """Whether the client holds opens (DESTROY_CLIENTID then answers
        NFS4ERR_CLIENTID_BUSY, RFC 8881 18.50.3)."""
        clientid = client if isinstance(client, int) else client.clientid
        return bool(self._by_client.get(clientid))

    def drop_client(self, client) -> None:
        """Release every open of an expired or destroyed client."""
        clientid = client if isinstance(client, int) else client.clientid
        states = list(self._by_client.get(clientid, ()))
        for st in states:
            for lk in self._locks_of_open.get(st.other, ()):
                self._remember_expired(lk.other)
            self._remember_expired(st.other)
            self.close(st)
        self.owners.drop_client(clientid)
        if states:
            log.info("client_opens_dropped", clientid=clientid, opens=len(states))

    # ---- byte-range locks (RFC 8881 sections 9.1-9.5; POSIX semantics per lock-owner) ----

    def lock_state(self, open_st: OpenState, owner: bytes) -> LockState:
        """The lock-owner's state for the open's file, created on first use."""
        key = (open_st.clientid, bytes(owner), open_st.ino)
        lk = self._lock_by_owner_file.get(key)
        if lk is None:
            lk = LockState(self._new_other(), 0, open_st.clientid, bytes(owner), open_st, [])
            self._locks[lk.other] = lk
            self._lock_by_owner_file[key] = lk
            self._locks_of_open[open_st.other].add(lk)
            self._locks_by_ino[open_st.ino].add(lk)
        return lk

    def conflict(self, ino: int, clientid: int, owner: bytes,
                 start: int, end: int, kind: int):
        """Another owner's lock overlapping [start, end) incompatibly, or None."""
        for lk in self._locks_by_ino.get(ino, ()):
            if lk.clientid == clientid and lk.owner == owner:
                continue
            for s, e, t in lk.ranges:
                if s < end and start < e and (kind == LOCK_WRITE or t == LOCK_WRITE):
                    return LockConflict(lk, s, e, t)
        return None

    def lock(self, lk: LockState, start: int, end: int, kind: int) -> None:
        c = self.conflict(lk.ino, lk.clientid, lk.owner, start, end, kind)
        if c is not None:
            raise c
        ranges = _cut(lk.ranges, start, end)
        ranges.append((start, end, kind))
        lk.ranges = _merge(ranges)
        lk.bump()

    def unlock(self, lk: LockState, start: int, end: int) -> None:
        lk.ranges = _cut(lk.ranges, start, end)
        lk.bump()

    def _forget_lock(self, lk: LockState) -> None:
        self._locks.pop(lk.other, None)
        self._lock_by_owner_file.pop((lk.clientid, lk.owner, lk.ino), None)
        for index, k in ((self._locks_of_open, lk.open.other), (self._locks_by_ino, lk.ino)):
            group = index.get(k)
            if group is not None:
                group.discard(lk)
                if not group:
                    del index[k]

    # ---- stateid lookup --------------------------------------------------------------------------
    def find(self, clientid: int | None, sid, *, v40: bool = False):
        """The open or lock state a (non-special) stateid names, checking its seqid (RFC 8881 8.2.2):
        0 means the latest; older -> NFS4ERR_OLD_STATEID; newer or unknown ->
        NFS4ERR_BAD_STATEID. Another client's stateid is unknown to this one.
        NFSv4.0 (`v40`, clientid None: the stateid names its client): seqid 0 is not
        special, and a stateid of an earlier server instance is NFS4ERR_STALE_STATEID
        (RFC 7530 9.1.4)."""
        other = bytes(sid.other)
        st = self._by_other.get(other) or self._locks.get(other)
        if st is None and v40:
            if special_kind(sid) is not None:
                raise NfsError(NFS4ERR_BAD_STATEID, "a special stateid names no state")
            if other in self._expired:
                raise NfsError(NFS4ERR_EXPIRED, "the stateid's client is gone")
            if other[:4] != self._epoch:
                raise NfsError(NFS4ERR_STALE_STATEID, "stateid of an earlier server instance")
        if st is None or (clientid is not None and st.clientid != clientid):
            raise NfsError(NFS4ERR_BAD_STATEID, "unknown stateid")
        if (sid.seqid != 0 or v40) and sid.seqid != st.seqid:
            if _seqid_older(sid.seqid, st.seqid):
                raise NfsError(NFS4ERR_OLD_STATEID)
            raise NfsError(NFS4ERR_BAD_STATEID, "stateid seqid from the future")
        return st

    def test(self, clientid: int, sid) -> int:
        """TEST_STATEID's per-stateid status (special stateids are never valid there)."""
        if special_kind(sid) is not None:
            return NFS4ERR_BAD_STATEID
        try:
            self.find(clientid, sid)
        except NfsError as e:
            return e.status
        return NFS4_OK

    def free(self, clientid: int, sid) -> int:
        """FREE_STATEID (RFC 8881 18.38.3): a lock stateid without locks is freed; an
        open stateid, or a lock stateid still locking, holds locks; anything else is
        unknown to us (opens are forgotten at CLOSE)."""
        status = self.test(clientid, sid)
        if status != NFS4_OK:
            return status
        lk = self._locks.get(bytes(sid.other))
        if lk is not None and not lk.ranges:
            self._forget_lock(lk)
            return NFS4_OK
        return NFS4ERR_LOCKS_HELD

    def peek(self, other: bytes):
        """The open or lock state with this `other`, whatever its seqid (or None)."""
        return self._by_other.get(other) or self._locks.get(other)

    def close_unconfirmed(self, clientid: int, owner: bytes) -> None:
        """An unconfirmed 4.0 open-owner starts over: its unconfirmed opens go."""
        for st in list(self._by_client.get(clientid, ())):
            if st.owner == owner and not st.confirmed:
                self.close(st)

    def lock_owner_states(self, clientid: int, owner: bytes) -> list:
        """The LockStates of one lock-owner (one per file it locked)."""
        return [lk for lk in self._locks.values()
                if lk.clientid == clientid and lk.owner == owner]

    def release_lock_owner(self, clientid: int, owner: bytes) -> None:
        """RELEASE_LOCKOWNER (RFC 7530 16.37): forget an owner that holds no locks."""
        states = self.lock_owner_states(clientid, owner)
        if any(lk.ranges for lk in states):
            raise NfsError(NFS4ERR_LOCKS_HELD, "the lock-owner still holds locks")
        for lk in states:
            self._forget_lock(lk)

    def owner_in_use(self, o) -> bool:
        """Whether a 4.0 owner record still names live state (then it is kept)."""
        if o.kind == "open":
            return any(st.owner == o.owner for st in self._by_client.get(o.clientid, ()))
        return bool(self.lock_owner_states(o.clientid, o.owner))

    def opens_of(self, ino: int) -> set:
        return set(self._by_ino.get(ino, ()))


def _merge(ranges: list) -> list:
    """Sorted, with touching ranges of the same type joined."""
    out: list = []
    for s, e, t in sorted(ranges):
        if out and out[-1][2] == t and out[-1][1] >= s:
            ps, pe, _ = out[-1]
            out[-1] = (ps, max(pe, e), t)
        else:
            out.append((s, e, t))
    return out


def _seqid_older(a: int, b: int) -> bool:
    """Whether seqid a precedes b, allowing for wrap-around."""
    return 0 < ((b - a) & SEQID_MAX) < 0x80000000

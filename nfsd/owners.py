"""NFSv4.0 open-owners and lock-owners with their seqids and last reply (RFC 7530 9.1.7).

In NFSv4.0 there are no sessions: exactly-once semantics for the state-changing ops
(OPEN, OPEN_CONFIRM, OPEN_DOWNGRADE, CLOSE, LOCK, LOCKU) come from a per-owner
sequence id. Each request carries the owner's next seqid:

- seqid == last + 1 (or any seqid for an owner's first request): run the op; the
  owner moves to that seqid and keeps the reply, success or error, except for the
  errors of RFC 7530 9.1.7 that say the request never reached the owner
  (NO_ADVANCE below), which leave the seqid where it was;
- seqid == last: a retransmission; the kept reply is sent again without running the op;
- anything else: NFS4ERR_BAD_SEQID.

Invariant: an owner's `seqid` and `reply` always belong to the same request, so a
retransmission never gets another request's answer. Memory is bounded per client:
at most MAX_OWNERS_PER_CLIENT owners; past that the least recently used owner that
holds no state is forgotten (a client that reuses it starts a fresh sequence).
"""
from __future__ import annotations

from collections import OrderedDict

from nfsd.errors import NfsError
from nfsd.xdr.nfs4 import (
    NFS4ERR_BAD_SEQID, NFS4ERR_BAD_STATEID, NFS4ERR_BADXDR, NFS4ERR_MOVED, NFS4ERR_NOFILEHANDLE,
    NFS4ERR_RESOURCE, NFS4ERR_STALE_CLIENTID, NFS4ERR_STALE_STATEID,
)

OPEN_OWNER = "open"
LOCK_OWNER = "lock"
MAX_OWNERS_PER_CLIENT = 4096
SEQID_MASK = 0xFFFFFFFF
# Errors that do not advance the seqid (RFC 7530 9.1.7).
NO_ADVANCE = frozenset({NFS4ERR_STALE_CLIENTID, NFS4ERR_STALE_STATEID, NFS4ERR_BAD_STATEID,
                        NFS4ERR_BAD_SEQID, NFS4ERR_BADXDR, NFS4ERR_RESOURCE,
                        NFS4ERR_NOFILEHANDLE, NFS4ERR_MOVED})


class Owner:
    """One open-owner or lock-owner of a 4.0 client."""
    __slots__ = ("kind", "clientid", "owner", "seqid", "confirmed", "reply", "reply_fh",
                 "closed_other")

    def __init__(self, kind: str, clientid: int, owner: bytes):
        self.kind = kind
        self.clientid = clientid
        self.owner = owner
        self.seqid: int | None = None   # None: no request seen yet, any seqid starts it
        self.confirmed = kind == LOCK_OWNER   # open-owners need OPEN_CONFIRM (RFC 7530 16.18.5)
        self.reply = None               # the last result object, or the NfsError it raised
        self.reply_fh = None            # the current filehandle after it (OPEN changes it)
        self.closed_other: bytes | None = None   # stateid its last CLOSE ended, for a replay

    def restart(self) -> None:
        """An unconfirmed open-owner that OPENs again starts over (RFC 7530 16.18.5)."""
        self.seqid = None
        self.reply = self.reply_fh = None


class OwnerTable:
    def __init__(self, max_per_client: int = MAX_OWNERS_PER_CLIENT):
        self.max_per_client = max_per_client
        self._by_client: dict[int, OrderedDict] = {}
        # A CLOSE's stateid is gone, yet its retransmission must find the owner to be
        # replayed: one entry per owner, its last CLOSE (so bounded by the owners).
        self._closed: dict[bytes, Owner] = {}

    def get(self, kind: str, clientid: int, owner: bytes, *, create: bool = False,
            in_use=lambda o: False) -> Owner | None:
        table = self._by_client.get(clientid)
        key = (kind, bytes(owner))
        if table is not None and key in table:
            table.move_to_end(key)
            return table[key]
        if not create:
            return None
        if table is None:
            table = self._by_client[clientid] = OrderedDict()
        if len(table) >= self.max_per_client:
            for k, o in list(table.items()):
                if not in_use(o):
                    del table[k]
                    self._forget_closed(o)
                    break
            else:
                raise NfsError(NFS4ERR_RESOURCE, "too many owners for one client")
        o = table[key] = Owner(kind, clientid, bytes(owner))
        return o

    def note_closed(self, o: Owner, other: bytes) -> None:
        if o.closed_other is not None:
            self._closed.pop(o.closed_other, None)
        o.closed_other = other
        self._closed[other] = o

    def closed_owner(self, other: bytes) -> Owner | None:
        return self._closed.get(other)

    def _forget_closed(self, o: Owner) -> None:
        if o.closed_other is not None:
            self._closed.pop(o.closed_other, None)
            o.closed_other = None

    def remove(self, o: Owner) -> None:
        self._forget_closed(o)
        table = self._by_client.get(o.clientid)
        if table is not None:
            table.pop((o.kind, o.owner), None)
            if not table:
                del self._by_client[o.clientid]

    def drop_client(self, client) -> None:
        clientid = client if isinstance(client, int) else client.clientid
        for o in self._by_client.pop(clientid, {}).values():
            self._forget_closed(o)

    def count(self, clientid: int) -> int:
        return len(self._by_client.get(clientid, ()))


def check_seqid(o: Owner, seqid: int) -> bool:
    """True when the request is a retransmission of the owner's last one; raises
    NFS4ERR_BAD_SEQID when it is neither that nor the next."""
    if o.seqid is None:
        return False
    if seqid == o.seqid and o.reply is not None:
        return True
    if seqid != (o.seqid + 1) & SEQID_MASK:
        raise NfsError(NFS4ERR_BAD_SEQID, f"seqid {seqid}, last {o.seqid}")
    return False


async def sequenced(ctx, o: Owner, seqid: int, run):
    """Run `run()` (an awaitable op body) under the owner's seqid rules."""
    if check_seqid(o, seqid):
        if o.reply_fh is not None:
            ctx.current_fh = o.reply_fh
        if isinstance(o.reply, NfsError):
            raise NfsError(o.reply.status, "replay of the last reply")
        return o.reply
    try:
        res = await run()
    except NfsError as err:
        if err.status not in NO_ADVANCE:
            o.seqid, o.reply, o.reply_fh = seqid, err, ctx.current_fh
        raise
    o.seqid, o.reply, o.reply_fh = seqid, res, ctx.current_fh
    return res

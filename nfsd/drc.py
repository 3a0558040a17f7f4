"""Duplicate-request cache for NFSv4.0 COMPOUNDs (as Linux knfsd's nfscache.c).

NFSv4.0 has no sessions: a client that lost a reply retransmits the call with the same
XID, and an op without a seqid (CREATE, REMOVE, RENAME, LINK, SETATTR) would run twice
and answer, say, NFS4ERR_EXIST for the directory its first run made (RFC 7530 3.1.1
leaves replay protection of those ops to the server's reply cache). This cache keeps the
reply of each recent 4.0 COMPOUND that ran such an op, keyed by what identifies a
retransmission: client address and port, XID, procedure, request length and a checksum
of the request's first bytes (knfsd checksums RC_CSUMLEN = 256 bytes). A duplicate of a
call still running is dropped (no reply: the client retransmits again later), as knfsd
does. NFSv4.1+ replays through its session slots instead (nfsd/state.py) and never
comes here.

Bounded: at most `max_entries` entries and `max_bytes` of cached replies (oldest
evicted first), replies above `max_reply` are not kept, and an entry is forgotten after
`max_age` seconds (knfsd's RC_EXPIRE is 120 s).
"""
from __future__ import annotations

import time
import zlib
from collections import OrderedDict

# Ops whose second run differs from the first and that have no seqid replay of their
# own: the op table's `non_idempotent` rows (nfsd/optable.py).
from nfsd.optable import NON_IDEMPOTENT
CHECKSUM_BYTES = 256
DEFAULT_MAX_ENTRIES = 4096
DEFAULT_MAX_BYTES = 8 * 1024 * 1024
DEFAULT_MAX_REPLY = 64 * 1024
DEFAULT_MAX_AGE = 120.0

IN_PROGRESS = object()          # lookup(): a call with this key is running


def request_key(peer: tuple, xid: int, proc: int, args) -> tuple:
    """What a retransmission of this call has in common with it (cheap: the checksum
    covers the first CHECKSUM_BYTES bytes, the length the rest)."""
    return (peer[0], peer[1], xid, proc, len(args), zlib.crc32(args[:CHECKSUM_BYTES]))


class ReplyCache:
    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES,
                 max_bytes: int = DEFAULT_MAX_BYTES, max_reply: int = DEFAULT_MAX_REPLY,
                 max_age: float = DEFAULT_MAX_AGE, clock=time.monotonic):
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.max_reply = max_reply
        self.max_age = max_age
        self.clock = clock
        # key -> (time, reply bytes or IN_PROGRESS), oldest first
        self._entries: OrderedDict[tuple, tuple[float, object]] = OrderedDict()
        self.bytes = 0
        self.hits = 0

    def __len__(self) -> int:
        return len(self._entries)

    def begin(self, key: tuple):
        """The cached reply (bytes) of a retransmission, IN_PROGRESS if the original is
        still running, or None: a new call, now recorded as running."""
        entry = self._entries.get(key)
        if entry is not None:
            stamp, reply = entry
            if self.clock() - stamp <= self.max_age:
                if reply is not IN_PROGRESS:
                    self.hits += 1
                return reply
            self._drop(key)
        self._entries[key] = (self.clock(), IN_PROGRESS)
        self._evict()
        return None

    def finish(self, key: tuple, reply, opnums) -> None:
        """The call ran: keep its reply if it ran a non-idempotent op, else forget it."""
        self._drop(key)
        if reply is None or len(reply) > self.max_reply or NON_IDEMPOTENT.isdisjoint(opnums):
            return
        reply = bytes(reply)
        self._entries[key] = (self.clock(), reply)
        self.bytes += len(reply)
        self._evict()

    def _drop(self, key: tuple) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None and entry[1] is not IN_PROGRESS:
            self.bytes -= len(entry[1])

    def _evict(self) -> None:
        while len(self._entries) > self.max_entries or self.bytes > self.max_bytes:
            self._drop(next(iter(self._entries)))

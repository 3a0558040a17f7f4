"""Connection limits of the NFS server and the rate-limited log of rejected input.

Every size or count a client controls is bounded somewhere; this module holds the ones
the transport enforces (the codec's are in nfsd/xdr/nfs4.py DECODE_LIMITS and the
declared maxima of the .x, the RPC layer's in nfsd/rpc.py). Defaults, and why:

    max_inflight      128     calls of one connection running at once (more are not read)
    max_connections   4096    connections in total; more are closed at accept
    max_per_address   256     connections from one client address (Linux nconnect <= 16)
    idle_timeout      360 s   no byte and no call running: closed (knfsd ages idle
                              connections out after 6 minutes; a client reconnects)
    record_timeout    60 s    a record whose first bytes arrived must be complete by
                              then (slowloris, endless half records): 2 MiB at 35 KB/s
    max_record        2 MiB + 64 KiB   one record (nfsd/rpc.py DEFAULT_MAX_RECORD)
    max_fragments     2112    fragments of one record: a largest record in 1 KiB
                              fragments (pynfs sends 2 KiB ones; nfsd/rpc.py)
    log_interval      60 s    rejected input is logged once per client and kind per
                              interval, with the count of what was suppressed
    callback_timeout  10 s    a callback (CB_NULL, CB_COMPOUND) the client has not answered
                              by then failed: the back channel is down (knfsd waits
                              about as long before it marks the callback path down)
    max_callbacks     16      callbacks awaiting their reply on one connection; more
                              fail at once (each pending one holds an xid and a future)

Log events (structlog, warning unless said, `client=` and `suppressed=` on each):
connection_refused (network no export admits, max_connections, max_per_address; closed
at accept), connection_slow_record (record_timeout), connection_not_reading (replies
unread for idle_timeout), connection_idle_closed (info, not rate-limited: one per
connection), rpc_stream_error (max_record, max_fragments), rpc_rejected (RPC-level
errors), rpc_garbage_args (undecodable COMPOUND, e.g. a bitmap4 above 64 words),
insecure_port_refused (`secure` export, source port >= 1024), callback_reply_unmatched
(a REPLY whose xid names no callback of ours), callback_failed (info).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from nfsd.rpc import DEFAULT_MAX_FRAGMENTS, DEFAULT_MAX_RECORD


@dataclass(frozen=True, slots=True)
class Limits:
    max_inflight: int = 128
    max_connections: int = 4096
    max_per_address: int = 256
    idle_timeout: float = 360.0
    record_timeout: float = 60.0
    max_record: int = DEFAULT_MAX_RECORD
    max_fragments: int = DEFAULT_MAX_FRAGMENTS
    log_interval: float = 60.0
    callback_timeout: float = 10.0
    max_callbacks: int = 16

    @property
    def sweep_interval(self) -> float:
        """How often connections are checked against the timeouts."""
        return min(5.0, max(0.05, min(self.idle_timeout, self.record_timeout) / 4))


class RateLimitedLog:
    """At most one event per (client, event name) per `interval`; the events in between
    are counted and the count goes out with the next one (`suppressed=`). Memory is
    bounded: at most `max_keys` clients x kinds are remembered."""

    def __init__(self, logger, interval: float = 60.0, *, max_keys: int = 4096, clock=time.monotonic):
        self.logger = logger
        self.interval = interval
        self.max_keys = max_keys
        self.clock = clock
        self._seen: dict[tuple, list] = {}       # (event, client) -> [last logged at, suppressed]

    def warning(self, event: str, client: str, **fields) -> bool:
        """Log (True) or count (False) one rejection."""
        now = self.clock()
        key = (event, client)
        entry = self._seen.get(key)
        if entry is not None and now - entry[0] < self.interval:
            entry[1] += 1
            return False
        suppressed = entry[1] if entry is not None else 0
        if entry is None and len(self._seen) >= self.max_keys:
            self._forget(now)
        self._seen[key] = [now, 0]
        self.logger.warning(event, client=client, suppressed=suppressed, **fields)
        return True

    def _forget(self, now: float) -> None:
        stale = [k for k, (t, _) in self._seen.items() if now - t >= self.interval]
        for k in stale:
            del self._seen[k]
        if len(self._seen) >= self.max_keys:     # a flood from many addresses at once
            self._seen.clear()

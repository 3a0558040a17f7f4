"""Grace period and reclaim after a restart (RFC 8881 sections 8.4.2-8.4.3, RFC 7530 9.6.2).

Open and lock state lives in memory, so a restart loses it; clients get it back by
reclaiming (CLAIM_PREVIOUS OPENs, LOCKs with `reclaim` set) during a grace period in
which nobody else may take new state that could conflict. Which clients may reclaim
is kept on stable storage, as knfsd's nfsdcld does (one record per client owner in the
store, `store.submit_client_record`):

- a record is written, durably, before a client first gets state: at a 4.1 client's
  RECLAIM_COMPLETE (it may OPEN only after that) or a 4.0 client's first OPEN;
- it is removed when the client is destroyed or its lease expires;
- at start the records name the clients that may reclaim; with none there is no grace
  period at all. During grace, only those clients' reclaims are served; any other OPEN,
  LOCK, LOCKT, REMOVE, RENAME or truncating SETATTR gets NFS4ERR_GRACE;
- grace ends after `grace_time`, or early once every such client has sent
  RECLAIM_COMPLETE (4.0 clients have none, so a 4.0 record keeps the full period); while
  known clients are still reclaiming (a reclaim or RECLAIM_COMPLETE in the last second)
  when the time is up, it goes on a second at a time, up to twice the period (as knfsd
  does), so a late but busy reclaim is not cut off halfway;
- at its end the records of clients that neither reclaimed nor completed are deleted
  (durably) before any new state is granted: a client that did not reclaim in one grace
  period cannot reclaim after a second restart, when another client may meanwhile have
  taken its locks (RFC 8881 8.4.3's edge conditions). A restart during grace keeps them.
"""
from __future__ import annotations

import asyncio
import struct
import time

import structlog

from nfsd.errors import NfsError
from nfsd.state import cancel_and_wait
from nfsd.xdr.nfs4 import NFS4ERR_GRACE, NFS4ERR_NO_GRACE, NFS4ERR_RECLAIM_BAD

log = structlog.get_logger(__name__)

# The record's own bytes: a format byte and the client's minor version.
_RECORD = struct.Struct(">BB")
_RECORD_FORMAT = 1
# A reclaim this recent when the period is up keeps it going this much longer.
EXTEND_STEP = 1.0


def encode_record(minorversion: int) -> bytes:
    return _RECORD.pack(_RECORD_FORMAT, minorversion)


def decode_record(buf: bytes) -> int:
    """The minor version a record was written for (unknown formats count as 4.0: they
    cannot end grace early, the safe side)."""
    if len(buf) >= _RECORD.size:
        fmt, minorversion = _RECORD.unpack_from(buf)
        if fmt == _RECORD_FORMAT:
            return minorversion
    return 0


def _log_failed_delete(done, client: str) -> None:
    if not done.cancelled() and done.exception() is not None:
        log.warning("client_record_remove_failed", client=client, error=str(done.exception()))


class Grace:
    """Client records on stable storage and the grace period they imply."""

    def __init__(self, store, grace_time: float):
        self.store = store
        self.grace_time = grace_time
        self.in_grace = False
        self.reclaimable: dict[bytes, int] = {}   # owner -> minor version, from the last instance
        self.kept: set[bytes] = set()             # reclaimable owners that reclaimed or completed
        self.completed: set[bytes] = set()        # reclaimable owners that sent RECLAIM_COMPLETE
        self.on_disk: set[bytes] = set()          # owners whose record is in the store
        self._end_timer: asyncio.TimerHandle | None = None
        self._ending: asyncio.Task | None = None
        self._started = 0.0
        self.extend_step = EXTEND_STEP
        self._last_reclaim = float("-inf")

    # ---- lifecycle --------------------------------------------------------------------
    def start(self) -> None:
        """Load the records; start a grace period if there are any."""
        records = self.store.client_records()
        self.on_disk = set(records)
        self.reclaimable = {owner: decode_record(rec) for owner, rec in records.items()}
        if not self.reclaimable or self.grace_time <= 0:
            if self.reclaimable:
                self._ending = asyncio.get_running_loop().create_task(self._end("no grace time"))
            return
        self.in_grace = True
        self._started = time.monotonic()
        self._end_timer = asyncio.get_running_loop().call_later(self.grace_time, self._time_up)
        log.info("grace_started", clients=len(self.reclaimable), seconds=self.grace_time)

    async def stop(self) -> None:
        if self._end_timer is not None:
            self._end_timer.cancel()
            self._end_timer = None
        task, self._ending = self._ending, None
        await cancel_and_wait(task)

    def _time_up(self) -> None:
        now = time.monotonic()
        if now - self._last_reclaim < self.extend_step and now < self._started + 2 * self.grace_time:
            self._end_timer = asyncio.get_running_loop().call_later(self.extend_step, self._time_up)
            return
        self._end_soon("grace time over")

    def _end_soon(self, reason: str) -> None:
        if self._ending is None and self.in_grace:
            self._ending = asyncio.get_running_loop().create_task(self._end(reason))

    async def _end(self, reason: str) -> None:
        """Forget the clients that did not come back, durably, then leave grace."""
        gone = [o for o in self.reclaimable if o not in self.kept and o in self.on_disk]
        deletes = [self.store.submit_client_record(owner, None) for owner in gone]
        for owner in gone:
            self.on_disk.discard(owner)
        for done in deletes:        # durable before new state is granted
            await asyncio.wrap_future(done)
        if self._end_timer is not None:
            self._end_timer.cancel()
            self._end_timer = None
        self.in_grace = False
        log.info("grace_ended", reason=reason, reclaimed=len(self.kept), forgotten=len(gone))

    # ---- what ops ask -------------------------------------------------------------------
    def refuse_in_grace(self, what: str) -> None:
        """Non-reclaim state (and changes that could conflict with reclaims) must wait."""
        if self.in_grace:
            raise NfsError(NFS4ERR_GRACE, f"{what} during the grace period")

    def reclaim_needed(self, client) -> bool:
        """In grace, a client that held state before the restart and has not finished
        reclaiming it (SEQ4_STATUS_RESTART_RECLAIM_NEEDED)."""
        return self.in_grace and client.owner in self.reclaimable and client.owner not in self.completed

    def check_reclaim(self, client) -> None:
        """May this client reclaim now? NO_GRACE outside grace or after its own
        RECLAIM_COMPLETE; RECLAIM_BAD if it held no state before the restart."""
        if not self.in_grace:
            raise NfsError(NFS4ERR_NO_GRACE, "not in the grace period")
        if client.minorversion >= 1 and client.reclaim_complete:
            raise NfsError(NFS4ERR_NO_GRACE, "reclaim after RECLAIM_COMPLETE")
        if client.owner not in self.reclaimable:
            raise NfsError(NFS4ERR_RECLAIM_BAD, "no record of this client's earlier state")

    async def reclaimed(self, client) -> None:
        """A reclaim succeeded: the client's record stays beyond this grace period."""
        self._last_reclaim = time.monotonic()
        self.kept.add(client.owner)
        await self.record(client)

    async def record(self, client) -> None:
        """Before a client first gets state: its record, durable."""
        if client.recorded:
            return
        if client.owner not in self.on_disk:
            await asyncio.wrap_future(
                self.store.submit_client_record(client.owner, encode_record(client.minorversion)))
            self.on_disk.add(client.owner)
            log.info("client_recorded", client=client.name)
        client.recorded = True

    async def reclaim_complete(self, client) -> None:
        """RECLAIM_COMPLETE (4.1): recorded; grace ends once every known client sent it."""
        await self.record(client)
        if client.owner in self.reclaimable:
            self._last_reclaim = time.monotonic()     # clients are still coming back
            self.kept.add(client.owner)
            self.completed.add(client.owner)
            if self.in_grace and all(o in self.completed for o in self.reclaimable):
                self._end_soon("every client sent RECLAIM_COMPLETE")
                await asyncio.shield(self._ending)

    def forget(self, client) -> None:
        """The client is destroyed or its lease expired: its record goes."""
        if not client.recorded:
            return
        client.recorded = False
        if client.owner in self.on_disk:
            # not waited for: a record left by a crash before its commit only lets this
            # client reclaim once more after the restart (grace ends by time anyway)
            done = self.store.submit_client_record(client.owner, None)
            done.add_done_callback(lambda f, name=client.name: _log_failed_delete(f, name))
            self.on_disk.discard(client.owner)
            log.info("client_record_removed", client=client.name)

"""Asynchronous (offloaded) COPY: its copy stateids, the background copy, CB_OFFLOAD
(RFC 7862 sections 4.7, 15.2.3, 15.8, 15.9, 16.1).

A COPY with ca_synchronous = false and at least `async_min` bytes is answered at once
with a copy stateid in wr_callback_id; the copy then runs as a task on the server's
loop, the bytes moving chunk by chunk on worker threads (the `run` coroutine the COPY
handler supplies), and ends with CB_OFFLOAD on the client's back channel: the
destination's file handle, the copy stateid, and either the write_response4 (count,
committed, verifier) or the error with the bytes copied before it.

Copy stateids are their own type: `other` = this table's random epoch + a counter, so
no open or lock stateid table knows them (READ with one is NFS4ERR_BAD_STATEID), and a
copy stateid of an earlier server instance is unknown here. Each client holds at most
`max_per_client` (a COPY beyond that runs synchronously, which 15.2.3 allows).

A copy's state lives while it runs, then until CB_OFFLOAD was answered, or for
`keep_seconds` when the callback could not be delivered (OFFLOAD_STATUS then still
reports the outcome, as knfsd does for a client that polls); OFFLOAD_CANCEL stops it
and forgets it at once (no CB_OFFLOAD follows, as with knfsd); the client's expiry or
destruction cancels and forgets all of its copies; `stop` cancels everything.
"""
from __future__ import annotations

import asyncio
import os
import struct
import time
from dataclasses import dataclass
from typing import Awaitable, Callable

import structlog

from nfsd.callback import CallbackError
from nfsd.errors import NfsError
from nfsd.xdr.nfs4 import (
    FILE_SYNC4, NFS4_OK, NFS4ERR_BAD_STATEID, NFS4ERR_SERVERFAULT, OP_CB_OFFLOAD,
    CB_OFFLOAD4args, nfs_cb_argop4, offload_info4, stateid4, write_response4,
)

log = structlog.get_logger(__name__)

# A COPY of at least this many bytes may run asynchronously when the client lets it;
# smaller ones are quicker done than announced (one reflink or copy_file_range call).
ASYNC_COPY_MIN = 64 << 20
# Bytes one worker-thread call copies: bounds how long a cancel or a server stop waits
# for the chunk in flight, and how stale OFFLOAD_STATUS's count may be.
ASYNC_COPY_CHUNK = 64 << 20
# Asynchronous copies (running or awaiting their CB_OFFLOAD) one client may hold.
MAX_COPIES_PER_CLIENT = 8
# Chunks copying at once, server-wide: background copies never take more than this many
# of the server's blocking threads (nfsd/server.py, 4 by default), so COMMITs, SETATTRs
# and synchronous COPYs of every client keep the rest.
MAX_CHUNKS_AT_ONCE = 2
# CB_OFFLOAD attempts, `retry_seconds` apart, before the outcome is only kept for
# OFFLOAD_STATUS (a back channel being repaired by BIND_CONN_TO_SESSION gets a chance).
CB_OFFLOAD_ATTEMPTS = 3


@dataclass(slots=True, eq=False)
class AsyncCopy:
    other: bytes
    clientid: int
    session: object                 # nfsd.state.Session the COPY came on
    dst_fh: bytes                   # the destination's file handle, for CB_OFFLOAD
    count: int                      # bytes asked to copy
    copied: int = 0                 # bytes copied so far (advances per chunk)
    status: int | None = None       # None while running; the outcome after
    committed: int = FILE_SYNC4     # the stable_how the bytes reached
    task: asyncio.Task | None = None
    done_at: float | None = None
    delivered: bool = False         # CB_OFFLOAD answered by the client
    cancelled: bool = False         # OFFLOAD_CANCEL, client gone, server stopping

    def stateid(self):
        return stateid4(seqid=1, other=self.other)


# run(copy) copies the bytes, advancing copy.copied and stopping between chunks once
# copy.cancelled is set; raises NfsError on failure.
CopyRunner = Callable[[AsyncCopy], Awaitable[None]]


class OffloadTable:
    """The asynchronous copies of one server instance."""

    def __init__(self, *, write_verifier: bytes, keep_seconds: float,
                 async_min: int = ASYNC_COPY_MIN, chunk: int = ASYNC_COPY_CHUNK,
                 max_per_client: int = MAX_COPIES_PER_CLIENT, retry_seconds: float = 1.0):
        self.write_verifier = write_verifier
        self.keep_seconds = keep_seconds
        self.async_min = async_min
        self.chunk = chunk
        self.max_per_client = max_per_client
        self.retry_seconds = retry_seconds
        self._epoch = os.urandom(4)
        self._counter = 0
        self._copies: dict[bytes, AsyncCopy] = {}
        # Held by a runner around each chunk (`chunk_slot`).
        self.chunk_slot = asyncio.Semaphore(MAX_CHUNKS_AT_ONCE)

    def attach(self, sessions) -> None:
        """Cancel and forget a client's copies when it expires or is destroyed."""
        sessions.on_client_expired.append(self.drop_client)

    def __len__(self) -> int:
        return len(self._copies)

    def of_client(self, clientid: int) -> list[AsyncCopy]:
        return [c for c in self._copies.values() if c.clientid == clientid]

    # ---- start ------------------------------------------------------------------------
    def start(self, session, dst_fh: bytes, count: int, run: CopyRunner) -> AsyncCopy | None:
        """Start a background copy for the session's client; None when the client
        already holds `max_per_client` (the caller then copies synchronously)."""
        clientid = session.client.clientid
        if len(self.of_client(clientid)) >= self.max_per_client:
            return None
        self._counter += 1
        copy = AsyncCopy(self._epoch + struct.pack(">Q", self._counter), clientid, session,
                         bytes(dst_fh), count)
        self._copies[copy.other] = copy
        copy.task = asyncio.get_running_loop().create_task(
            self._run(copy, run), name=f"nfsd-copy-{copy.other.hex()}")
        return copy

    async def _run(self, copy: AsyncCopy, run: CopyRunner) -> None:
        try:
            await run(copy)
            status = NFS4_OK
        except NfsError as e:
            status = e.status
        except asyncio.CancelledError:
            self._forget(copy)
            raise
        except Exception:
            log.exception("async_copy_failed", copy=copy.other.hex())
            status = NFS4ERR_SERVERFAULT
        if copy.cancelled:
            return                              # forgotten already; no CB_OFFLOAD
        copy.status = status
        copy.done_at = time.monotonic()
        log.info("async_copy_done", copy=copy.other.hex(), status=copy.status,
                 copied=copy.copied, count=copy.count)
        try:
            await self._deliver(copy)
            if not copy.delivered:
                # Kept for OFFLOAD_STATUS only so long (bounded in time and, per client,
                # in number), then forgotten.
                await asyncio.sleep(max(0.0, copy.done_at + self.keep_seconds - time.monotonic()))
        finally:
            self._forget(copy)

    async def _deliver(self, copy: AsyncCopy) -> None:
        """CB_OFFLOAD (RFC 7862 16.1) on a back channel of the copy's client: the COPY's
        own session first, else any other session of the client with a working path."""
        if copy.status == NFS4_OK:
            info = offload_info4(NFS4_OK, write_response4(
                wr_callback_id=[], wr_count=copy.copied, wr_committed=copy.committed,
                wr_writeverf=self.write_verifier))
        else:
            info = offload_info4(copy.status, copy.copied)
        arg = nfs_cb_argop4(OP_CB_OFFLOAD, CB_OFFLOAD4args(
            coa_fh=copy.dst_fh, coa_stateid=copy.stateid(), coa_offload_info=info))
        for attempt in range(CB_OFFLOAD_ATTEMPTS):
            if attempt:
                await asyncio.sleep(self.retry_seconds)
            bc = self._back_channel(copy)
            if bc is None:
                continue
            try:
                res = await bc.cb_compound([arg], tag=b"offload")
            except CallbackError as exc:
                log.info("cb_offload_failed", copy=copy.other.hex(), attempt=attempt,
                         error=str(exc))
                continue
            # CB_SEQUENCE succeeded (cb_compound checks it); a result for CB_OFFLOAD,
            # whatever its status, means the client heard the outcome: a retry would
            # tell it nothing new.
            copy.delivered = len(res.resarray) > 1
            if copy.delivered:
                return

    @staticmethod
    def _back_channel(copy: AsyncCopy):
        sessions = [copy.session] + [s for s in copy.session.client.sessions.values()
                                     if s is not copy.session]
        for s in sessions:
            bc = getattr(s, "backchannel", None)
            if not s.destroyed and bc is not None and not bc.path_down:
                return bc
        return None

    # ---- OFFLOAD_STATUS, OFFLOAD_CANCEL --------------------------------------------------
    def find(self, clientid: int, sid) -> AsyncCopy:
        """The copy a stateid names for this client; NFS4ERR_BAD_STATEID otherwise (an
        unknown, finished-and-forgotten, cancelled or other client's copy)."""
        copy = self._copies.get(bytes(sid.other))
        if copy is None or copy.clientid != clientid or sid.seqid not in (0, 1):
            raise NfsError(NFS4ERR_BAD_STATEID, "no such copy")
        return copy

    def cancel(self, copy: AsyncCopy) -> None:
        """Forget the copy and stop it: the chunk in flight on a worker thread finishes,
        then the task ends (so once it is done no byte moves any more); no CB_OFFLOAD is
        sent for it. A copy done and awaiting delivery stops waiting."""
        self._forget(copy)
        copy.cancelled = True
        if copy.task is not None and copy.status is not None:
            copy.task.cancel()
        log.info("async_copy_cancelled", copy=copy.other.hex(), copied=copy.copied)

    def _forget(self, copy: AsyncCopy) -> None:
        self._copies.pop(copy.other, None)

    def drop_client(self, client) -> None:
        for copy in self.of_client(client.clientid):
            self.cancel(copy)

    async def stop(self, wait_seconds: float = 30.0) -> None:
        """Cancel every copy and wait for their tasks (server shutdown): each ends after
        its chunk in flight; one still waiting (a read-through fetch) after
        `wait_seconds` is cancelled outright."""
        tasks = [c.task for c in self._copies.values() if c.task is not None]
        for copy in list(self._copies.values()):
            self.cancel(copy)
        if tasks:
            _done, pending = await asyncio.wait(tasks, timeout=wait_seconds)
            for task in pending:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

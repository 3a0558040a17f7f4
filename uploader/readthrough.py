"""Read-through: fetch ABSENT ranges of a file from S3 into the store as clean cache.

The NFS server calls `fetch_missing(ino, ranges)` when store.read raised EAGAIN with
`.missing`, then retries the read. Fetches are ranged GETs aligned to `readahead_chunk`
(8 MiB by default) so neighbouring small reads share one request; readers of the same
chunk share one in-flight fetch. A sequential reader (one that goes on where its last read
of the file ended, or starts at 0) keeps `readahead_chunks` chunks past its position fetched
or in flight: the NFS server reports every READ of a file that still has ABSENT ranges
(`note_read`), the ones answered from local bytes too, so the window moves with the reader
instead of only when it hits a missing chunk (then it stalled for a whole GET at every
window's end). store.fill writes only what is still ABSENT, so bytes a client wrote
meanwhile always win.

Reads have their own RequestGate (own concurrency, retries), so a reader never queues
behind a checkpoint's worth of upload parts.
"""
from __future__ import annotations

import asyncio
import errno
from collections import OrderedDict
from dataclasses import replace

import structlog

from cache.api import ROOT_INO, DataState, FileType, StoreError

from .gate import RequestGate
from .keys import KeyMap
from .objectclient import NotFoundError, ObjectClient, PreconditionFailedError
from .settings import UploadSettings
from .stats import Counters

log = structlog.get_logger(__name__)

# Files whose read position is remembered for readahead (least recently read dropped first):
# a reader forgotten this way only loses its readahead until its next miss.
MAX_STREAMS = 1024


class ReadThrough:
    def __init__(self, store, client: ObjectClient, keys: KeyMap, settings: UploadSettings, counters: Counters):
        self.store = store
        self.client = client
        self.keys = keys
        self.chunk = settings.readahead_chunk
        self.ahead = settings.readahead_chunks
        self.counters = counters
        self.gate = RequestGate(replace(settings, bytes_per_second=0.0), counters,
                                pool_size=settings.max_concurrency + 2)
        self._inflight: dict[tuple[int, int], asyncio.Task] = {}
        # ino -> (where its last read ended, highest chunk fetched or scheduled ahead)
        self._streams: OrderedDict[int, tuple[int, int]] = OrderedDict()
        self._background: set[asyncio.Task] = set()

    async def close(self) -> None:
        for t in list(self._background) + list(self._inflight.values()):
            t.cancel()
        await asyncio.gather(*self._background, *self._inflight.values(), return_exceptions=True)
        self.gate.close()

    # ---- demand fetches ------------------------------------------------------------
    async def fetch_missing(self, ino: int, ranges) -> None:
        """Make every byte of `ranges` [(offset, length)] local. Raises StoreError(EIO) when
        the object cannot be found in S3 (reported, not retried forever). Transient S3 errors
        are retried without limit, so a caller that must answer in bounded time (an NFS READ:
        NFS4ERR_DELAY) wraps this in asyncio.wait_for; the fetch itself carries on."""
        attr = self.store.getattr(ino)
        chunks: set[int] = set()
        first, last_end = None, 0
        for off, length in ranges:
            end = min(off + length, attr.size)
            if end <= off:
                continue
            chunks.update(range(off // self.chunk, (end - 1) // self.chunk + 1))
            first = off if first is None else min(first, off)
            last_end = max(last_end, end)
        if not chunks:
            return
        # shield: a reader that gives up (asyncio.wait_for around us) must not cancel the
        # fetch other readers of the same chunk are waiting for
        await asyncio.gather(*(asyncio.shield(self._chunk_task(ino, c)) for c in sorted(chunks)))
        self._advance(ino, first, last_end, attr.size)

    # ---- readahead -----------------------------------------------------------------------
    def note_read(self, ino: int, offset: int, length: int) -> None:
        """The NFS server answered a READ of `ino`, a file with ABSENT ranges, from local
        bytes: a sequential reader's window moves on (see the module docstring)."""
        if length > 0 and self.ahead:
            self._advance(ino, offset, offset + length, None)

    def _advance(self, ino: int, start: int, end: int, size: int | None) -> None:
        """A read of [start, end) happened: if it continues the file's last read (within a
        chunk of where that ended) or starts the file, fetch the chunks up to
        `readahead_chunks` past `end` that are not fetched or on their way yet."""
        pos, top = self._streams.pop(ino, (None, -1))
        sequential = start < self.chunk or (pos is not None and pos - self.chunk <= start <= pos + self.chunk)
        here = (end - 1) // self.chunk
        want = here + self.ahead
        if not sequential:
            top = here                               # a new position: its window starts here
        elif want > top:
            if size is None:
                try:
                    size = self.store.getattr(ino).size
                except StoreError:               # removed meanwhile: nothing to read ahead
                    return
            for c in range(max(top, here) + 1, want + 1):
                if c * self.chunk >= size:
                    break
                if (ino, c) not in self._inflight:
                    t = self._chunk_task(ino, c)
                    self._background.add(t)
                    t.add_done_callback(self._background_done)
            top = want
        self._streams[ino] = (end, top)
        if len(self._streams) > MAX_STREAMS:
            self._streams.popitem(last=False)

    def _background_done(self, t: asyncio.Task) -> None:
        self._background.discard(t)
        if not t.cancelled() and t.exception() is not None:
            log.warning("readahead_failed", error=str(t.exception()))

    def _chunk_task(self, ino: int, index: int) -> asyncio.Task:
        key = (ino, index)
        task = self._inflight.get(key)
        if task is None:
            task = asyncio.create_task(self._fetch_chunk(ino, index))
            self._inflight[key] = task
            task.add_done_callback(lambda _t, key=key: self._inflight.pop(key, None))
        return task

    async def _fetch_chunk(self, ino: int, index: int) -> int:
        attr = self.store.getattr(ino)
        start = index * self.chunk
        end = min(start + self.chunk, attr.size)
        holes = [e for e in self.store.extents(ino)
                 if e.state == DataState.ABSENT and e.offset < end and e.offset + e.length > start]
        if not holes:
            return 0
        lo = max(start, min(e.offset for e in holes))
        hi = min(end, max(e.offset + e.length for e in holes))
        data = await self._get(ino, lo, hi - lo)
        # counted as it arrives, before the fill makes it readable: a reader that sees the
        # bytes (or a stop that cancels this task in its fill) never sees them uncounted
        self.counters.bytes_fetched += len(data)
        if len(data) != hi - lo:
            raise StoreError(errno.EIO, f"short read from S3 for ino {ino}: {len(data)} of {hi - lo} bytes")
        await asyncio.to_thread(self.store.fill, ino, lo, data)
        return len(data)

    async def _get(self, ino: int, offset: int, length: int) -> bytes:
        """GET the range of exactly the object recorded for the file: pinned to its ETag
        (and version id), tried at RemoteInfo.key, else at the current path (a move may be
        on its way). A key that holds another object now answers 412 and counts as not
        found, so bytes of another file or version are never spliced into this one; when
        no key holds ours after a re-resolve, EIO."""
        tried = []
        for _ in range(2):
            remote = self.store.remote_info(ino)
            for path in (remote.key, self.store.path_of(ino)):
                if path is None or path in tried:
                    continue
                tried.append(path)
                key = self.keys.file_key(path)
                version = remote.version_id if path == remote.key else None
                try:
                    return await self.gate.call(
                        "GetObject", lambda: self.client.get_range(key, offset, length, if_match=remote.etag,
                                                                   version_id=version),
                        nbytes=0, what=key)
                except (NotFoundError, PreconditionFailedError) as e:
                    log.info("readthrough_object_mismatch", ino=ino, key=key, etag=remote.etag, code=e.code)
                    continue
            await asyncio.sleep(0.5)
            tried.clear()
        log.error("readthrough_missing_object", ino=ino, etag=remote.etag)
        raise StoreError(errno.EIO, f"object of ino {ino} (ETag {remote.etag}) not found in S3")

    # ---- warmup --------------------------------------------------------------------------
    def resolve(self, path: str):
        """Attr of an export-relative path (ENOENT if a component is missing)."""
        attr = self.store.getattr(ROOT_INO)
        for part in [p for p in path.split("/") if p]:
            attr = self.store.lookup(attr.ino, part.encode("utf-8", "surrogateescape"))
        return attr

    async def warmup(self, path: str) -> int:
        """Fetch every ABSENT byte of the file, or of every file below the directory."""
        root = self.resolve(path)
        files = [root.ino] if root.type == FileType.REG else []
        if root.type == FileType.DIR:
            files = [a.ino for _, a in self.store.walk(root.ino) if a.type == FileType.REG]
        before = self.counters.bytes_fetched
        for ino in files:
            holes = [(e.offset, e.length) for e in self.store.extents(ino) if e.state == DataState.ABSENT]
            if holes:
                await self.fetch_missing(ino, holes)
        return self.counters.bytes_fetched - before

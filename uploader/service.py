"""The uploader: drains committed files to S3 and mirrors the namespace, in the background.

    up = Uploader(store, Boto3ObjectClient(s3_settings), UploadSettings(), s3=s3_settings)
    await up.start(); ...; await up.flush("run1"); up.status(); await up.stop()

One scheduler task does all bookkeeping on the event loop:
  1. enqueue: files the store reports ready (closed, committed, quiet for the settle window,
     or at once under a flush) get a durable upload job (store queue) and state QUEUED;
  2. dispatch: jobs of the store's durable queue (uploads and the store's namespace
     journal) start in the order rules of uploader.jobs; each runs as its own task and its
     S3 requests pass the RequestGate (rate buckets, AIMD concurrency, endless retries);
  3. a finished job leaves the queue; a failed one stays (permanent errors are logged
     loudly, shown in status() and retried after `permanent_retry_seconds`).
A crash loses nothing: the queue and multipart progress (RemoteInfo) are in the store;
start() aborts multipart uploads under our prefix that no job knows, and resumes the rest.
"""
from __future__ import annotations

import asyncio
import errno
import time

import structlog

from cache.api import DataState, FileType, StoreError

from .foreground import ForegroundFirst
from .gate import RequestGate
from .importer import import_prefix
from .jobs import MOVES_OBJECT, NS, UPLOAD, KeyRef, KeysAhead, ns_keys
from .manifest import Manifests
from .keys import KeyMap
from .objectclient import ObjectClient, ObjectClientError, PermanentError, TransientError
from .readthrough import ReadThrough
from .settings import UploadSettings
from .stats import Counters
from .worker import Restart, UploadProgress, Worker

log = structlog.get_logger(__name__)

QUEUE_WINDOW = 1000          # jobs considered per scheduling pass (the oldest ones)
PERMANENT_RETRY_SECONDS = 60.0
MANIFEST_IDLE_SECONDS = 30.0     # a manifest pass at least this often while jobs finish
FLUSH_RECHECK_SECONDS = 0.5      # a waiting flush looks again this often when no job moved


def _under(path: str, prefix: str | None) -> bool:
    if not prefix:
        return True
    return path == prefix or path.startswith(prefix + "/")


class Uploader:
    def __init__(self, store, object_client: ObjectClient, settings: UploadSettings | None = None, *,
                 prefix: str | None = None, s3=None, series=()):
        """Keys start with `prefix`, else `s3.prefix` (an S3Settings), else the client's
        `.prefix` (Boto3ObjectClient carries its S3Settings.prefix). `series`: the
        [[retention.series]] rules whose complete checkpoints get a manifest (uploader.manifest)."""
        self.store = store
        self.client = object_client
        self.settings = settings or UploadSettings()
        if prefix is None:
            prefix = s3.prefix if s3 is not None else getattr(object_client, "prefix", "")
        self.keys = KeyMap(prefix)
        self.counters = Counters()
        self.gate = RequestGate(self.settings, self.counters)
        # the drain yields to client saves (foreground.py); the daemon sets last_client_op
        self.foreground = ForegroundFirst(self.settings.foreground_concurrency)
        self.foreground.urgent = self._urgent
        self.gate.limiter.ceiling = self.foreground.ceiling
        self.worker = Worker(store, object_client, self.gate, self.keys, self.settings, self.counters)
        self.readthrough = ReadThrough(store, object_client, self.keys, self.settings, self.counters)
        self.worker.fetch_missing = self.readthrough.fetch_missing
        self.manifests = Manifests(self, series)
        self.worker.manifests_on = bool(self.manifests.rules)
        self._manifest_due = asyncio.Event()
        self.permanent_retry_seconds = PERMANENT_RETRY_SECONDS
        self._running: dict[int, asyncio.Task] = {}
        self._running_jobs: dict[int, dict] = {}
        self._progress: dict[int, UploadProgress] = {}
        self._upload_inos: set[int] = set()
        self._not_before: dict[int, float] = {}
        self._notified: set[int] = set()
        self._first_seen: dict[int, float] = {}    # mkdir job id -> monotonic time first seen
        self._flush_prefixes: list[str | None] = []
        self._last_jobs: list[tuple[int, dict]] = []
        self._kick = asyncio.Event()
        self._pass_done = asyncio.Event()
        # set (and replaced) when a job ends or a pass queues jobs: what a waiting flush
        # needs to look again, so it never spins the scheduler (see flush)
        self._jobs_moved = asyncio.Event()
        self.passes = 0                  # scheduler passes so far (tests)
        self._tasks: list[asyncio.Task] = []
        self._started = False
        self.permanent_error: str | None = None
        # other job kinds in the durable queue: kind -> (async run(job) -> outcome, keys(job) ->
        # [KeyRef]); ordered like namespace jobs. uploader.retention adds its own here.
        self.job_handlers: dict = {}
        from .retention import install_job_handlers
        install_job_handlers(self)

    # ---- lifecycle -------------------------------------------------------------------
    async def start(self) -> None:
        jobs = await asyncio.to_thread(self.store.queue_list, 1 << 30)
        self._upload_inos = {j["ino"] for _, j in jobs if j.get("kind") == UPLOAD}
        self._started = True
        self._tasks = [asyncio.create_task(self._scheduler(), name="uploader-scheduler"),
                       asyncio.create_task(self._evictor(), name="uploader-evictor")]
        if self.manifests.rules:
            self._manifest_due.set()             # a first pass: manifests missed while down
            self._tasks.append(asyncio.create_task(self._manifester(), name="uploader-manifests"))
        if self.settings.abort_orphan_uploads:
            # in the background: start() must not wait for S3 (it may be down or misconfigured);
            # new multipart uploads wait for it (worker.orphans_swept), single PUTs do not
            self._tasks.append(asyncio.create_task(self._orphan_sweeper(jobs), name="uploader-orphans"))
        else:
            self.worker.orphans_swept.set()
        log.info("uploader_started", queued=len(jobs), prefix=self.keys.prefix)

    async def stop(self, grace: float = 0.0) -> None:
        """Stop; unfinished work stays queued (multipart progress is durable). No job starts
        after the call; the jobs in flight get up to `grace` seconds to finish and be recorded
        (a planned stop or switchover: a PUT that S3 took but the gateway never recorded is
        PUT again by the next start), then are cancelled."""
        self._started = False
        self._kick.set()
        self._pass_done.set()            # a flush waiting for a pass returns (not flushed)
        self._jobs_moved.set()
        for t in self._tasks:            # the scheduler first: nothing new is dispatched
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        running = list(self._running.values())
        if running and grace > 0:
            done, pending = await asyncio.wait(running, timeout=grace)
            log.info("uploader_stop_grace", finished=len(done), cancelled=len(pending), grace=grace)
        tasks = list(self._running.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()
        await self.readthrough.close()
        self.gate.close()
        log.info("uploader_stopped")

    async def _orphan_sweeper(self, jobs) -> None:
        try:
            await self._abort_orphans(jobs)
        except PermanentError as e:
            # e.g. a policy without s3:ListBucketMultipartUploads, or no bucket yet: say so and
            # go on without the sweep (a bucket lifecycle rule AbortIncompleteMultipartUpload
            # cleans up instead)
            self.counters.permanent_errors += 1
            self.counters.last_error = self.permanent_error = f"{e.code}: {e}"
            log.error("s3_permanent_error", op="abort_orphans", code=e.code, error=str(e),
                      detail="orphan multipart uploads under the prefix are not aborted")
        finally:
            self.worker.orphans_swept.set()

    async def _abort_orphans(self, jobs) -> None:
        """Abort multipart uploads under our prefix that neither a queued job (at start) nor
        this run created."""
        known = set()
        for _, job in jobs:
            if job.get("upload_id"):
                known.add(job["upload_id"])
            if job.get("kind") == UPLOAD:
                try:
                    rid = self.store.remote_info(job["ino"]).upload_id
                except StoreError:
                    rid = None
                if rid:
                    known.add(rid)
        uploads = await self.gate.call("ListMultipartUploads",
                                       lambda: self.client.list_multipart_uploads(self.keys.prefix),
                                       what=self.keys.prefix)
        for u in uploads:
            if u.upload_id in known:
                continue
            try:
                await self.gate.call("AbortMultipartUpload",
                                     lambda u=u: self.client.abort_multipart_upload(u.key, u.upload_id), what=u.key)
            except ObjectClientError as e:
                log.warning("orphan_abort_failed", key=u.key, upload_id=u.upload_id, error=str(e))
                continue
            self.counters.orphans_aborted += 1
            log.info("orphan_upload_aborted", key=u.key, upload_id=u.upload_id)

    # ---- scheduling ------------------------------------------------------------------
    def kick(self) -> None:
        self._kick.set()

    async def _scheduler(self) -> None:
        # the flag, not only cancellation, ends the loop: Python 3.11's wait_for can swallow
        # a cancel that lands as the awaited event fires (gh-86296)
        while self._started:
            self.passes += 1
            try:
                await self._enqueue_ready()
                await self._dispatch()
            except asyncio.CancelledError:
                raise
            except Exception:            # noqa: BLE001 - a bad pass must not stop the uploader
                log.exception("uploader_pass_failed")
            self._pass_done.set()
            self._pass_done = asyncio.Event()
            try:
                async with asyncio.timeout(self.settings.poll_interval):
                    await self._kick.wait()
            except TimeoutError:
                pass
            self._kick.clear()

    async def _enqueue_ready(self) -> None:
        # the settle window runs on the store's own clock (never a client-set mtime).
        # Files with a job already (e.g. waiting out a permanent error, state DIRTY) come back
        # too: ask for that many more so they never crowd out new ones
        ready = self.store.ready_for_upload(None, int(self.settings.settle_seconds * 1e9),
                                            1000 + len(self._upload_inos))
        if self._flush_prefixes:
            # a flush skips the settle window for the files under its path
            for ino in self.store.ready_for_upload(None, 0, 1 << 30):
                try:
                    path = self.store.path_of(ino)
                except StoreError:
                    continue
                if path is not None and any(_under(path, p) for p in self._flush_prefixes):
                    ready.append(ino)
        todo = list(dict.fromkeys(ino for ino in ready if ino not in self._upload_inos))
        if todo:
            self._upload_inos.update(await asyncio.to_thread(self._queue_uploads, todo))
            self._note_jobs_moved()

    def _queue_uploads(self, inos: list[int]) -> list[int]:
        """*Blocking* (a worker thread: fdatasyncs and index commits stay off the event loop).
        Commit the bytes a client never COMMITted, then queue the files' jobs in one txn."""
        jobs = []
        for ino in inos:
            try:
                self.store.commit_settled(ino)
                attr = self.store.getattr(ino)
            except StoreError:
                continue
            jobs.append({"kind": UPLOAD, "ino": ino, "change": attr.change, "data_seq": attr.data_seq,
                         "t": time.time()})
        return self.store.queue_uploads(jobs) if jobs else []

    def _upload_path(self, ino: int) -> str | None:
        try:
            return self.store.path_of(ino)
        except StoreError:
            return None

    async def _dispatch(self) -> None:
        jobs = self.store.queue_list(QUEUE_WINDOW)
        self._last_jobs = jobs
        now = time.monotonic()
        all_ns = KeysAhead()              # every pending namespace job (blocks uploads)
        for _, job in jobs:
            if job.get("kind") == NS:
                all_ns.add(ns_keys(job))
            elif job.get("kind") in self.job_handlers:     # e.g. a copy onto itself: no upload meanwhile
                all_ns.add(self.job_handlers[job["kind"]][1](job))
        # files whose object a pending rename/unlink job moves or deletes (at any of their
        # names: a hard-linked file's object may sit at a name other than its upload's path).
        # Their uploads wait, and such jobs wait for their file's running upload: an upload
        # drops the file's older object by the record it read, which a move racing it changes
        moving = {job["ino"] for _, job in jobs if job.get("kind") == NS and job.get("op") in MOVES_OBJECT}
        uploading = KeysAhead()           # paths of running uploads
        uploading_inos: set[int] = set()
        for jid, job in self._running_jobs.items():
            if job.get("kind") == UPLOAD and job.get("_path"):
                uploading.add([KeyRef(job["_path"])])
                uploading_inos.add(job["ino"])
        ahead = KeysAhead()               # earlier namespace jobs in this pass
        max_jobs = self.settings.max_concurrency * 4
        for job_id, job in jobs:
            kind = job.get("kind")
            if kind == NS:
                keys = ns_keys(job)
                if job_id not in self._running:
                    blocked = (ahead.blocks(keys) or uploading.blocks(keys)
                               or (job.get("op") in MOVES_OBJECT and job.get("ino") in uploading_inos)
                               or self._marker_settling(job_id, job, now))
                    if uploading.blocks(keys):
                        self._notify_running_upload(job_id, job)
                    if (not blocked and len(self._running) < max_jobs
                            and self._not_before.get(job_id, 0) <= now):
                        self._start(job_id, job)
                ahead.add(keys)
            elif kind == UPLOAD:
                if job_id in self._running or len(self._running) >= max_jobs:
                    continue
                if self._not_before.get(job_id, 0) > now:
                    continue
                path = self._upload_path(job["ino"])
                keys = [KeyRef(path)] if path is not None else []
                if all_ns.blocks(keys) or uploading.blocks(keys) or job["ino"] in moving:
                    continue
                job["_path"] = path
                uploading.add(keys)
                self._start(job_id, job)
            elif kind in self.job_handlers:
                keys = self.job_handlers[kind][1](job)
                if (job_id not in self._running and not ahead.blocks(keys) and not uploading.blocks(keys)
                        and len(self._running) < max_jobs and self._not_before.get(job_id, 0) <= now):
                    self._start(job_id, job)
                ahead.add(keys)
            else:
                log.warning("unknown_queue_job", job_id=job_id, job=job)
                self.store.queue_done(job_id)

    def _marker_settling(self, job_id: int, job: dict, now: float) -> bool:
        """A directory marker waits out the settle window like a file (from when this run
        first saw its job), so a directory renamed soon after its mkdir is marked once, under
        its final name; a flush covering it lets it go at once."""
        if job.get("op") != "mkdir":
            return False
        first = self._first_seen.setdefault(job_id, now)
        if not self._flush_prefixes:
            return now - first < self.settings.settle_seconds
        # a flush of the directory (under the name it was made with, or its name now), above
        # it or inside it: the held job blocks uploads there
        paths = [(job.get("new_path") or job.get("old_path") or "").rstrip("/"), self._upload_path(job["ino"])]
        if any(p is None or _under(d, p) or _under(p, d)
               for p in self._flush_prefixes for d in paths if d is not None):
            return False
        return now - first < self.settings.settle_seconds

    def _notify_running_upload(self, job_id: int, job: dict) -> None:
        if job_id in self._notified or job.get("op") not in ("rename", "unlink"):
            return
        prog = self._progress.get(job.get("ino"))
        if prog is None:
            return
        self._notified.add(job_id)
        decision = prog.on_namespace_change(job["op"])
        log.info("upload_namespace_change", ino=prog.ino, op=job["op"], decision=decision,
                 bytes_done=prog.bytes_done, size=prog.size)

    def _start(self, job_id: int, job: dict) -> None:
        self._running_jobs[job_id] = job
        self._running[job_id] = asyncio.create_task(self._run(job_id, job), name=f"uploader-job-{job_id}")

    async def _run(self, job_id: int, job: dict) -> None:
        kind = job.get("kind")
        ino = job.get("ino")
        try:
            if kind == UPLOAD:
                outcome = await self.worker.upload(job_id, {k: v for k, v in job.items() if k != "_path"},
                                                   lambda p: self._progress.__setitem__(ino, p),
                                                   expected_path=job.get("_path"))
            elif kind in self.job_handlers:
                outcome = await self.job_handlers[kind][0](job)
            else:
                outcome = await self.worker.namespace(job, job_id)
        except Restart as e:
            log.info("job_restart", job_id=job_id, ino=ino, reason=str(e))
        except PermanentError as e:
            self.counters.permanent_errors += 1
            self.counters.last_error = self.permanent_error = f"{e.code}: {e}"
            self._not_before[job_id] = time.monotonic() + self.permanent_retry_seconds
            log.error("s3_permanent_error", job_id=job_id, kind=kind, op=job.get("op"), ino=ino,
                      code=e.code, error=str(e), retry_in=self.permanent_retry_seconds)
            if kind == UPLOAD:
                await asyncio.to_thread(self._set_dirty, ino)
        except TransientError as e:
            # S3 unreachable past a bounded retry (an upload's read-through of an imported or
            # evicted file's old bytes gives up as a client's read does): expected, retried
            self.counters.last_error = f"{type(e).__name__}: {e}"
            self._not_before[job_id] = time.monotonic() + self.settings.backoff_max
            log.warning("job_transient_error", job_id=job_id, kind=kind, op=job.get("op"), ino=ino, error=str(e))
        except asyncio.CancelledError:
            raise
        except Exception as e:           # noqa: BLE001 - keep the job, say why loudly
            self.counters.last_error = f"{type(e).__name__}: {e}"
            self._not_before[job_id] = time.monotonic() + self.settings.backoff_max
            log.exception("job_failed", job_id=job_id, kind=kind, op=job.get("op"), ino=ino)
        else:
            self.store.queue_done(job_id)
            self._not_before.pop(job_id, None)
            self._notified.discard(job_id)
            self._first_seen.pop(job_id, None)
            self._manifest_due.set()
            if kind == UPLOAD:
                self._upload_inos.discard(ino)
            if self.permanent_error and outcome not in ("gone", "unlinked"):
                self.permanent_error = None      # S3 accepts our work again
            log.debug("job_done", job_id=job_id, kind=kind, op=job.get("op"), ino=ino, outcome=outcome)
        finally:
            self._running.pop(job_id, None)
            self._running_jobs.pop(job_id, None)
            if kind == UPLOAD:
                self._progress.pop(ino, None)
            self._kick.set()
            self._note_jobs_moved()

    def _note_jobs_moved(self) -> None:
        self._jobs_moved.set()
        self._jobs_moved = asyncio.Event()

    def _set_dirty(self, ino: int) -> None:
        try:
            self.store.set_data_state(ino, DataState.DIRTY)
        except StoreError:
            pass

    async def _manifester(self) -> None:
        """Manifest passes after jobs finish (debounced), bounded to one at a time."""
        while self._started:
            try:
                async with asyncio.timeout(MANIFEST_IDLE_SECONDS):
                    await self._manifest_due.wait()
            except TimeoutError:
                continue
            self._manifest_due.clear()
            await asyncio.sleep(min(1.0, self.settings.settle_seconds))
            await self.manifests.run_quietly()

    async def _evictor(self) -> None:
        while self._started:
            await asyncio.sleep(self.settings.evict_interval)
            try:
                freed = await asyncio.to_thread(self.store.maybe_evict)
            except asyncio.CancelledError:
                raise
            except Exception:            # noqa: BLE001
                log.exception("evict_failed")
                continue
            if freed:
                self.counters.evicted_bytes += freed
                log.info("evicted", bytes=freed)

    # ---- API -----------------------------------------------------------------------------
    async def fetch_missing(self, ino: int, ranges) -> None:
        """Read-through hook for the NFS server (store.read raised EAGAIN with .missing)."""
        await self.readthrough.fetch_missing(ino, ranges)

    def note_read(self, ino: int, offset: int, nbytes: int) -> None:
        """Readahead hook for the NFS server: a READ of a file with ABSENT ranges."""
        self.readthrough.note_read(ino, offset, nbytes)

    async def import_bucket(self):
        """Add objects under the prefix that the namespace lacks as ABSENT files (local data
        always wins: see uploader.importer). Returns an ImportReport."""
        report = await import_prefix(self.store, self.client, self.keys, self.gate)
        self.counters.imported += report.imported
        return report

    async def warmup(self, path: str) -> int:
        """Fetch every absent byte of the file or tree at `path`; returns bytes fetched."""
        return await self.readthrough.warmup(path)

    async def flush(self, path_prefix: str | None = None, wait: bool = True,
                    timeout: float | None = None) -> bool:
        """Upload the files under `path_prefix` (export-relative; None: all) without waiting
        for their settle window. With wait: return True once every file there is clean and
        no queued job touches the path, False on timeout. Files still open for write are
        not eligible, so a flush waits for their close."""
        if not self._started:
            raise RuntimeError("flush() needs a started Uploader")
        prefix = path_prefix.strip("/") if path_prefix else None
        self._flush_prefixes.append(prefix)
        try:
            self.gate.limiter.reconsider()      # a waiting flush lifts the foreground ceiling
            self.kick()
            await self._pass_done.wait()        # at least one enqueue pass saw the flush
            if not wait:
                return self._flushed(prefix)
            deadline = None if timeout is None else time.monotonic() + timeout
            while self._started:
                moved = self._jobs_moved        # before the look: a job ending during it counts
                if await asyncio.to_thread(self._flushed, prefix):
                    await self.manifests.run_quietly()     # written last, once all is in
                    return True
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    return False
                # Look again when a job ends or a pass queues more, not after every pass: a
                # look walks the queue and the tree, and kicking a pass after each one kept
                # the scheduler spinning (thousands of passes a second) beside the uploads.
                # Nothing moved for a while (a file still open for write, say): a pass looks.
                wait = FLUSH_RECHECK_SECONDS if deadline is None else min(FLUSH_RECHECK_SECONDS, deadline - now)
                try:
                    async with asyncio.timeout(wait):
                        await moved.wait()
                except TimeoutError:
                    self.kick()
            return False
        finally:
            self._flush_prefixes.remove(prefix)

    def _flushed(self, prefix: str | None) -> bool:
        for _, job in self.store.queue_list(1 << 30):
            if job.get("kind") == UPLOAD:
                path = self._upload_path(job["ino"])
                if path is not None and _under(path, prefix):
                    return False
            elif any(_under(k.path.rstrip("/"), prefix) or (k.is_prefix and prefix and prefix.startswith(k.path))
                     for k in ns_keys(job)):
                return False
        return all(st in (DataState.CLEAN, DataState.ABSENT) for _, st in self._walk(prefix))

    def _walk(self, prefix: str | None):
        """(ino, data_state) of every regular file under prefix (a file or a directory)."""
        try:
            attr = self.readthrough.resolve(prefix or "")
        except StoreError as e:
            if e.errno == errno.ENOENT:
                return
            raise
        if attr.type == FileType.REG:
            yield attr.ino, attr.data_state
            return
        for _, a in self.store.walk(attr.ino):
            if a.type == FileType.REG:
                yield a.ino, a.data_state

    def file_state(self, ino: int) -> dict:
        """State of one file: dirty | queued | uploading (bytes_done) | clean (etag) | absent."""
        attr = self.store.getattr(ino)
        remote = self.store.remote_info(ino)
        out = {"ino": ino, "path": self.store.path_of(ino), "state": attr.data_state.name.lower(),
               "size": attr.size, "etag": remote.etag, "checksum": remote.checksum, "key": remote.key}
        prog = self._progress.get(ino)
        if prog is not None:
            out.update(state="uploading", bytes_done=prog.bytes_done, bytes_in_flight=prog.bytes_in_flight,
                       multipart=prog.multipart)
        return out

    def _usage(self) -> dict:
        """The store's byte accounting; {} for a store without it (tests' stand-ins)."""
        return self.store.usage()

    def _urgent(self) -> bool:
        """The drain must not yield to clients (foreground.py): a flush waits, or dirty data
        holds half the capacity."""
        if self._flush_prefixes:
            return True
        usage = self._usage()
        return bool(usage) and usage["dirty"] * 2 >= usage["capacity"]

    def status(self) -> dict:
        """Everything an operator or the metrics exporter wants, as plain data."""
        jobs = self._last_jobs
        now = time.time()
        upload_ts = [j.get("t", now) for _, j in jobs if j.get("kind") == UPLOAD]
        # Settled dirty files not yet picked up count too: they have waited since their last
        # write/commit/close, measured on the store's clock (like the settle window), then
        # put on the jobs' time line as that many seconds ago.
        ready_ns = self.store.oldest_ready_ns()
        if ready_ns is not None:
            upload_ts.append(now - max(0, self.store.clock_ns() - ready_ns) / 1e9)
        usage = self._usage()
        return {
            "running": self._started,
            "queue_depth": len(jobs),
            "queued_uploads": sum(1 for _, j in jobs if j.get("kind") == UPLOAD),
            "queued_namespace_ops": sum(1 for _, j in jobs if j.get("kind") == NS),
            "jobs_running": len(self._running),
            "oldest_dirty_age_seconds": round(now - min(upload_ts), 3) if upload_ts else 0.0,
            "dirty_bytes": usage.get("dirty"),
            "uploading": [{"ino": p.ino, "path": p.path, "size": p.size, "bytes_done": p.bytes_done}
                          for p in self._progress.values()],
            "concurrency_limit": round(self.gate.limiter.limit, 2),
            "foreground_ceiling": self.foreground.active(),
            "requests_in_flight": self.gate.limiter.in_flight,
            "requests_waiting_retry": self.gate.waiting_retry,
            "permanent_error": self.permanent_error,
            **self.counters.as_dict(),
        }

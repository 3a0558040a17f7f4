"""What one job does in S3: upload a file (PUT or multipart with resume), mirror a rename
(server-side copy + delete), delete, and keep directory markers.

Every S3 request goes through the RequestGate; every store call that syncs runs in a
thread. Object locations come from the store's RemoteInfo (key relative to the prefix).
A move first makes sure the source is our object (RemoteInfo.key, else the object's
ckptgw-ino metadata), so replaying an old rename never moves somebody else's object.
"""
from __future__ import annotations

import asyncio
import errno
import os
import time
from dataclasses import dataclass, field

import structlog

from cache.api import DataState, FileType, RemoteInfo, StoreError

from .gate import RequestGate
from .keys import (DIR_CONTENT_TYPE, GEN_META, INO_META, NODE_JOB_TYPES, SEQ_META, STORE_META, KeyMap,
                   object_metadata, part_ranges, part_size_for)
from .objectclient import (NotFoundError, ObjectClient, PartInfo, PermanentError, PreconditionFailedError,
                           PutResult, TransientError, checksum_b64)
from .manifest import is_manifest_key, manifest_path
from .series import has_tmp_component
from .settings import S3_MAX_COPY, UploadSettings
from .stats import Counters
from .verify import COMPOSITE, FULL_OBJECT, checksum_form, local_checksums, split_checksum

log = structlog.get_logger(__name__)

COPY_PART = 1 << 30          # UploadPartCopy piece size for objects above 5 GiB
PART_ATTEMPTS_BEFORE_PROBE = 8
NOTES_PER_UPLOAD = 64        # a large multipart upload notes its parts about this many times
NOTE_INTERVAL = 10.0         # ... and at least this often (seconds) while parts go out


class DataChanged(Exception):
    """The file's bytes changed (data sequence moved) while its upload ran: the upload is
    dropped (a multipart one aborted), never completed over the object S3 holds."""


class Restart(Exception):
    """The upload stopped (aborted for a rename, or its multipart upload vanished):
    run the same job again from the start."""


@dataclass
class UploadProgress:
    """A running upload, visible in status() and told about renames/unlinks of its file."""
    ino: int
    path: str
    size: int
    multipart: bool
    started: float = field(default_factory=time.time)
    bytes_done: int = 0           # confirmed by S3
    bytes_in_flight: int = 0
    abort_requested: bool = False
    finish_after_rename: bool = False

    def on_namespace_change(self, op: str) -> str:
        """A rename or unlink of this file arrived while it is uploading.

        unlink: abort (the object is not wanted). rename: finishing costs the remaining
        bytes (then a server-side copy, which crosses no network link of ours); aborting
        and starting again under the new name costs all of them. So finish once any byte
        is on the wire or confirmed, abort while nothing has left yet (parts still waiting
        for a slot or rate tokens do not count: aborting then wastes nothing, and saves
        the copy)."""
        if op == "unlink" or (self.bytes_done + self.bytes_in_flight == 0):
            self.abort_requested = True
            return "abort"
        self.finish_after_rename = True
        return "finish"


# what a job records of a multipart upload in progress (older versions: mtime/size instead of
# the data sequence; dropped with the rest)
_UPLOAD_JOB_FIELDS = ("key", "upload_id", "upload_change", "part_size", "upload_data_seq", "upload_mtime_ns",
                      "upload_size")
# an upload job's durable note "an attempt of mine may have written this data sequence's object"
# (set before the attempt's first S3 write; kept when the fields above go)
SENT_SEQ = "sent_seq"
# a move's (file, or an unlinked name's object to the next link) durable note "an attempt of mine
# may have copied [old, etag] to new": [old, etag, new], synced before its CopyObject
COPY_SENT = "copy_sent"


def _same_data(attr, data_seq) -> bool:
    """The store bumps `change` for metadata too (rename, chmod: NFS change attribute), so
    "same bytes" is judged by the store's data sequence, which every write and truncate (and
    nothing else) moves. A job without one (queued by an older version) counts as changed."""
    return data_seq is not None and attr.data_seq == data_seq


def note_due(unnoted: int, total: int, since_note_s: float) -> bool:
    """Whether a multipart upload notes its parts now, with `unnoted` parts sent since its last
    note: a small upload after every part; a large one about NOTES_PER_UPLOAD times, or
    NOTE_INTERVAL after its last note. A note rewrites the file's record, O(parts), so one
    per part made an upload O(parts^2) (20 ms of index lock per part at 10k parts); a crash
    costs at most the parts sent since the last note, sent again on resume."""
    return unnoted >= max(1, total // NOTES_PER_UPLOAD) or since_note_s >= NOTE_INTERVAL


def _pread_exact(fd: int, offset: int, length: int) -> bytes:
    """`length` bytes at `offset`, fewer only if the file ends first (truncated meanwhile).
    os.pread allocates without zero-filling and faults the pages in inside the kernel's
    copy, with the GIL released: a zeroed bytearray (memset of an 8 MiB part, then its
    page faults) held the GIL about 2 ms per part beside the NFS event loop."""
    data = os.pread(fd, length, offset)
    if len(data) == length or not data:
        return data
    chunks, got = [data], len(data)
    while got < length:
        more = os.pread(fd, length - got, offset + got)
        if not more:
            break
        chunks.append(more)
        got += len(more)
    return b"".join(chunks)


class Worker:
    def __init__(self, store, client: ObjectClient, gate: RequestGate, keys: KeyMap,
                 settings: UploadSettings, counters: Counters):
        self.store = store
        self.client = client
        self.gate = gate
        self.keys = keys
        self.settings = settings
        self.counters = counters
        self.store_id = store.instance_id.hex()
        self.algorithm = client.checksum_algorithm
        self.fetch_missing = None    # async (ino, ranges): read-through, set by the service
        self.manifests_on = False    # series configured: a removed directory's manifest goes too
        self.orphans_swept = asyncio.Event()          # set by the service once the start sweep is over

    async def _store(self, fn, *args):
        return await asyncio.to_thread(fn, *args)

    def _begin_upload(self, ino: int, change: int, data_seq: int | None = None, job_id: int | None = None,
                      job: dict | None = None) -> bool:
        """*Blocking* (a worker thread: an index write txn waits for the lock a batch commit
        holds through its fdatasync). The file UPLOADING if its change counter is still
        `change`, else DIRTY (written again since: eligible after its next settle) and False;
        then F_SENT (mark_sent) and the job's SENT_SEQ = `data_seq` durable before the first
        S3 write (one sync for both: the job's note costs an index write, no request, no
        fdatasync of its own). A later attempt of the job at the same data sequence may be
        repeating one whose object reached S3 unrecorded (a crash before mark_uploaded):
        that attempt looks first (`_adopt`)."""
        if not self.store.set_data_state(ino, DataState.UPLOADING, change):
            self.store.set_data_state(ino, DataState.DIRTY)
            return False
        if job is not None and job_id is not None and job.get(SENT_SEQ) != data_seq:
            job[SENT_SEQ] = data_seq
            try:
                self.store.queue_update(job_id, job)
            except StoreError as e:
                if e.errno != errno.ENOENT:
                    raise        # (ENOENT: the job is gone; nothing will repeat it)
        self.store.sync()
        return True

    def _remote(self, ino: int) -> RemoteInfo | None:
        try:
            return self.store.remote_info(ino)
        except StoreError as e:
            if e.errno in (errno.ESTALE, errno.ENOENT):
                return None
            raise

    def _job_remote(self, job: dict) -> RemoteInfo | None:
        """What the store recorded of the file's object; for a symlink or special file only
        an imported one's (the object it came from), else None: the object its symlink/mknod
        job put is found by its inode metadata instead."""
        remote = self._remote(job["ino"])
        if job.get("type") in NODE_JOB_TYPES and (remote is None or not remote.etag):
            return None
        return remote

    # ---- upload ------------------------------------------------------------------------
    async def upload(self, job_id: int, job: dict, progress_cb, expected_path: str | None = None) -> str:
        """Upload the file of an upload job. Returns what happened (for logs/tests).
        `expected_path`: the path the scheduler ordered the job by; if the file moved since,
        Restart, so the move's job runs first (else the old object would be left behind)."""
        try:
            return await self._upload(job_id, job, progress_cb, expected_path)
        except StoreError as e:
            if e.errno not in (errno.ESTALE, errno.ENOENT):
                raise
            # removed (and reclaimed) while uploading: the object is not wanted
            await self._abort_recorded_upload(job, None)
            return "gone"

    async def _upload(self, job_id: int, job: dict, progress_cb, expected_path: str | None) -> str:
        ino = job["ino"]
        try:
            attr = self.store.getattr(ino)
        except StoreError as e:
            if e.errno in (errno.ESTALE, errno.ENOENT):
                await self._abort_recorded_upload(job, None)
                return "gone"
            raise
        if attr.type == FileType.REG:
            # before the path is read: journal jobs queued before this say no object of the
            # file exists (store.mark_sent), and their renames are visible to path_of below
            await self._store(self.store.mark_sent, ino)
        path = self.store.path_of(ino)
        if path is None:                       # unlinked since it was queued
            await self._abort_recorded_upload(job, self._remote(ino))
            return "unlinked"
        if expected_path is not None and path != expected_path:
            raise Restart(f"moved from {expected_path!r} to {path!r} before the upload began")
        if attr.type != FileType.REG:
            return "not-a-file"
        remote = self._remote(ino) or RemoteInfo()
        if attr.data_state in (DataState.CLEAN, DataState.ABSENT) and remote.uploaded_change == attr.change:
            return "already-clean"
        change = attr.change
        if change != job.get("change", change) and not _same_data(attr, job.get("data_seq")):
            await self._store(self.store.set_data_state, ino, DataState.DIRTY)
            return "changed"
        # an earlier attempt of this job may have written exactly these bytes' object: a crash
        # (or a stop) came between its PUT/CompleteMultipartUpload and mark_uploaded
        repeat = job.get(SENT_SEQ) is not None and job.get(SENT_SEQ) == attr.data_seq
        if not await self._store(self._begin_upload, ino, change, attr.data_seq, job_id, job):
            return "changed"
        multipart = attr.size >= self.settings.multipart_threshold
        # an imported (or evicted) file written in part: the object is the old bytes where
        # nothing was written, so fetch those before sending (fill never overwrites writes)
        await self._fetch_absent(ino, self._absent_ranges(ino))
        prog = UploadProgress(ino, path, attr.size, multipart)
        progress_cb(prog)
        key = self.keys.file_key(path)
        meta = object_metadata(attr, is_dir=False, store_id=self.store_id)
        try:
            result = await self._adopt(attr, key, meta, prog, "repeated attempt") if repeat else None
            if result is None:
                result = await self._copy_from_source(attr, remote, key, meta, prog)
            if result is None and multipart:
                result = await self._multipart(job_id, job, attr, key, path, remote, meta, prog)
            elif result is None:
                result = await self._put(attr, key, meta, prog)
        except DataChanged:
            self.counters.uploads_aborted += 1
            log.info("upload_dropped_data_changed", ino=ino, path=path, data_seq=attr.data_seq)
            await self._store(self.store.set_data_state, ino, DataState.DIRTY)
            return "changed"
        except GeneratorExit:
            raise                        # the coroutine is being closed: it may not await now
        except BaseException:
            # leave it eligible again (the job stays queued and will retry or restart); in a
            # worker thread, as every index write of the uploader: a write txn waits for the
            # index lock, which a batch commit holds through its fdatasync
            try:
                await self._store(self.store.set_data_state, ino, DataState.QUEUED, change)
            except StoreError:
                pass                     # gone meanwhile: the job finds out when it runs again
            raise
        now = self.store.getattr(ino)
        if now.change != change and _same_data(now, attr.data_seq) and now.data_state == DataState.UPLOADING:
            change = now.change              # renamed or chmod-ed meanwhile, same bytes
        # objects this file was renamed over: the one at `path` is replaced now, the one at
        # its current name will be by its pending move's copy, if a queued job carries the new
        # object there; one at another name (the file moved on before its upload) is handed on
        # or deleted. (Not every name change moves the object: a hard-linked file's first name
        # can change by a rename of its other name, whose job moves the object elsewhere.)
        now_path = self.store.path_of(ino)
        recorded = self._remote(ino) or RemoteInfo()     # now: a directory move may have re-keyed it
        replaced = list(recorded.replaces)
        if recorded.key and recorded.etag and recorded.key != path:
            # the file's own older object under another of its names (a hard link became its
            # first name, where uploads go): a file has one object. Dropped before the record
            # forgets it, so a crash in between re-runs this upload and the drop.
            replaced.append((recorded.key, recorded.etag))
        for k, e in replaced:
            if k == path or (k == now_path and await self._store(self.store.moves_to, ino, path, k)):
                continue
            await self._drop_replaced(k, e, ino)
        info = RemoteInfo(key=path, etag=result.etag, checksum=result.checksum, uploaded_change=change,
                          size=attr.size, upload_id=None, parts=[], version_id=result.version_id,
                          data_seq=attr.data_seq)
        clean = await self._store(self.store.mark_uploaded, ino, info)
        self.counters.uploads_done += 1
        log.info("uploaded", ino=ino, path=path, size=attr.size, etag=result.etag,
                 checksum=result.checksum, clean=clean, multipart=multipart)
        return "uploaded" if clean else "uploaded-stale"

    async def _put(self, attr, key: str, meta: dict, prog: UploadProgress) -> PutResult:
        ino, size = attr.ino, attr.size
        sent_checksum: str | None = None       # "crc32:..." of the bytes the last attempt sent

        def send() -> PutResult:
            nonlocal sent_checksum
            fd = self.store.open_data_fd(ino)
            try:
                data = _pread_exact(fd, 0, size)
            finally:
                os.close(fd)
            if not _same_data(self.store.getattr(ino), attr.data_seq):
                raise DataChanged()
            checksum = checksum_b64(self.algorithm, data)
            sent_checksum = f"{self.algorithm.lower()}:{checksum}"
            return self.client.put_object(key, data, metadata=meta, checksum=checksum)

        def recheck() -> PutResult | None:
            # the gate runs this (a HEAD, a request of its own, with its own token) only before
            # retrying an attempt that may have been stored with its reply lost (a timeout, a
            # reset after sending, a 500; not a throttle): then that object is this one
            info = self.client.head_object(key)
            if (sent_checksum is None or not self._is_this_upload(info, attr, meta)
                    or info.checksum not in (None, sent_checksum)):
                return None
            log.info("upload_adopted", ino=ino, key=key, etag=info.etag, version_id=info.version_id,
                     data_seq=attr.data_seq, why="retry after a lost reply")
            return PutResult(info.etag, sent_checksum, info.version_id)

        def sending() -> None:
            prog.bytes_in_flight = size

        def sent() -> None:
            prog.bytes_in_flight = 0

        result = await self.gate.call("PutObject", send, nbytes=size, what=key, on_send=sending, on_done=sent,
                                      recheck=recheck)
        prog.bytes_done = size
        self.counters.bytes_uploaded += size
        return result

    def _is_this_upload(self, info, attr, meta: dict) -> bool:
        """Whether object `info` (a HEAD's) was written by this store for this inode,
        generation and data sequence (the identity metadata: the store's data sequence names
        the file's bytes, durable before any upload of them), with this size and the very
        metadata this upload sends (a chmod or touch since: not adopted, sent again)."""
        if info is None or info.size != attr.size or not self.store_id:
            return False
        m = info.metadata
        if (m.get(STORE_META) != self.store_id or m.get(INO_META) != str(attr.ino)
                or m.get(SEQ_META) != str(attr.data_seq)):
            return False
        return all(m.get(k) == v for k, v in meta.items())

    def _adoptable_checksum(self, info, attr, meta: dict) -> str | None:
        """*Blocking* (reads the file). The checksum to record if object `info` is the one this
        upload would write (`_is_this_upload`, and its checksum, as S3 reports it, that of the
        local bytes: full-object, or composite in our part layout for a multipart upload),
        else None. A server that reports no checksum: the identity decides."""
        if not self._is_this_upload(info, attr, meta):
            return None
        algo = self.algorithm.lower()
        part_size = nparts = None
        if attr.size and attr.size >= self.settings.multipart_threshold:
            part_size = part_size_for(attr.size, self.settings.part_size_min)
            nparts = len(part_ranges(attr.size, part_size))
        full, composite = local_checksums(self.store, attr.ino, attr.size, algo, part_size)
        ours = f"{algo}:{composite}-{nparts}" if composite is not None else f"{algo}:{full}"
        reported, _, value = (info.checksum or "").partition(":")
        if not value:
            return ours
        if reported != algo:
            return None
        try:
            digest, parts = split_checksum(value)
        except ValueError:
            return None
        form = checksum_form(info.checksum_type, parts)
        if form != COMPOSITE and parts is None and digest == full:
            return f"{algo}:{full}"            # a PUT's, or a server-side copy's
        if form != FULL_OBJECT and composite is not None and digest == composite and parts in (None, nparts):
            return ours
        return None

    async def _adopt(self, attr, key: str, meta: dict, prog: UploadProgress, why: str) -> PutResult | None:
        """Exactly once in S3 (issue 38): HEAD the key, and if the object there is the one this
        upload would write (`_adoptable_checksum`), that object is its result: an earlier
        attempt's PUT, CompleteMultipartUpload or copy that reached S3 but not the store's
        record. None: send as usual."""
        info = await self.gate.call("HeadObject", lambda: self.client.head_object(key), what=key)
        checksum = await self._store(self._adoptable_checksum, info, attr, meta)
        if checksum is None:
            log.info("upload_not_adopted", ino=attr.ino, key=key, why=why, found=info is not None,
                     data_seq=attr.data_seq,
                     found_seq=info.metadata.get(SEQ_META) if info is not None else None)
            return None
        prog.bytes_done = attr.size
        log.info("upload_adopted", ino=attr.ino, key=key, etag=info.etag, version_id=info.version_id,
                 data_seq=attr.data_seq, why=why)
        return PutResult(info.etag, checksum, info.version_id)

    async def _copy_from_source(self, attr, remote: RemoteInfo, key: str, meta: dict,
                                prog: UploadProgress) -> PutResult | None:
        """A file whose bytes are still a whole copy of another file's (a COPY/CLONE the store
        recorded as RemoteInfo.copied_from), whose object holds exactly those bytes (its
        record's data sequence is the one copied): copy that object in S3, pinned to its
        ETag, under this file's key and identity, instead of sending the bytes. None when it
        is no such copy (written since, partial, a multipart upload of its own recorded) or
        the source's object was replaced or removed meanwhile: the caller sends the bytes."""
        c = remote.copied_from
        if c is None or c.dst_seq != attr.data_seq or c.count != attr.size or remote.upload_id:
            return None
        src = self._remote(c.src_ino)
        if src is None or not (src.key and src.etag) or src.data_seq != c.src_seq or src.size != c.count:
            return None
        try:
            result = await self._copy(self.keys.file_key(src.key), key, c.count, src.etag, metadata=meta)
        except (NotFoundError, PreconditionFailedError):
            log.info("copy_source_replaced", ino=attr.ino, src_ino=c.src_ino, src_key=src.key)
            return None
        prog.bytes_done = c.count
        self.counters.uploads_copied += 1
        log.info("uploaded_by_copy", ino=attr.ino, key=key, src_ino=c.src_ino, src_key=src.key)
        return result

    async def _multipart(self, job_id: int, job: dict, attr, key: str, path: str, remote: RemoteInfo,
                         meta: dict, prog: UploadProgress) -> PutResult:
        ino, size, change = attr.ino, attr.size, attr.change
        part_size = part_size_for(size, self.settings.part_size_min)
        ranges = part_ranges(size, part_size)
        done: dict[int, PartInfo] = {}
        upload_id = None
        if remote.upload_id:
            same = (job.get("upload_id") == remote.upload_id and job.get("key") == key
                    and job.get("part_size") == part_size
                    and (job.get("upload_change") == change
                         or _same_data(attr, job.get("upload_data_seq"))))
            if same:
                done = await self._resumable_parts(key, remote, ranges)
                if done is None:
                    # unknown to S3: aborted, expired, or completed by an attempt whose record
                    # a crash lost; then the object it made is this upload's result
                    adopted = await self._adopt(attr, key, meta, prog, "recorded multipart upload gone")
                    if adopted is not None:
                        return adopted
                if done is not None:
                    upload_id = remote.upload_id
                    self.counters.parts_resumed += len(done)
                    log.info("multipart_resume", ino=ino, key=key, upload_id=upload_id,
                             parts_kept=len(done), parts_total=len(ranges))
                else:
                    done = {}
            if upload_id is None:
                await self._abort_recorded_upload(job, remote)
        if upload_id is None:
            await self.orphans_swept.wait()     # the sweep must never see (and abort) a new upload
            upload_id = await self.gate.call(
                "CreateMultipartUpload", lambda: self.client.create_multipart_upload(key, metadata=meta), what=key)
            job.update(key=key, upload_id=upload_id, upload_change=change, part_size=part_size,
                       upload_data_seq=attr.data_seq)
            await self._store(self.store.queue_update, job_id, job)
            remote.upload_id, remote.parts = upload_id, []
            await self._store(self.store.set_remote_info, ino, remote)
            log.info("multipart_start", ino=ino, key=key, upload_id=upload_id, size=size,
                     part_size=part_size, parts=len(ranges))
        prog.bytes_done = sum(p.size for p in done.values())
        pending = [r for r in ranges if r[0] not in done]
        noted, noted_at = len(done), time.monotonic()
        fd = self.store.open_data_fd(ino)

        async def send_part(number: int, offset: int, length: int) -> None:
            nonlocal noted, noted_at

            def send() -> PartInfo:
                data = _pread_exact(fd, offset, length)
                return self.client.upload_part(key, upload_id, number, data,
                                               checksum=checksum_b64(self.algorithm, data))
            def sending() -> None:
                prog.bytes_in_flight += length

            def sent() -> None:
                prog.bytes_in_flight -= length

            while True:
                try:
                    part = await self.gate.call("UploadPart", send, nbytes=length, what=f"{key}#{number}",
                                                priority=job_id, on_send=sending, on_done=sent,
                                                max_attempts=PART_ATTEMPTS_BEFORE_PROBE)
                    break
                except TransientError:
                    # a long run of failures: is the upload still there? (some servers answer
                    # 5xx, not NoSuchUpload, for an aborted upload; NotFoundError -> restart)
                    await self.gate.call("ListParts", lambda: self.client.list_parts(key, upload_id), what=key)
            prog.bytes_done += part.size
            self.counters.bytes_uploaded += part.size
            done[number] = part
            if note_due(len(done) - noted, len(ranges), time.monotonic() - noted_at):
                noted, noted_at = len(done), time.monotonic()
                remote.parts = [(p.part_number, p.etag, p.checksum) for p in done.values()]
                self.store.note_parts(ino, upload_id, remote.parts)    # lazy: a hint for a resume

        async def part_worker() -> None:
            while pending and not prog.abort_requested:
                await send_part(*pending.pop(0))

        workers = [asyncio.create_task(part_worker())
                   for _ in range(min(len(pending), self.settings.max_concurrency))]
        try:
            while workers:
                finished, running = await asyncio.wait(workers, timeout=0.2, return_when=asyncio.FIRST_EXCEPTION)
                for t in finished:
                    t.result()           # re-raise a part's error
                workers = list(running)
                if prog.abort_requested:
                    for t in workers:
                        t.cancel()
                    await asyncio.gather(*workers, return_exceptions=True)
                    workers = []
        except NotFoundError:
            # the upload id is gone (aborted elsewhere, or expired by a lifecycle rule)
            await self._forget_upload(job_id, job, ino, remote)
            raise Restart("multipart upload vanished")
        finally:
            for t in workers:
                t.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            os.close(fd)
        if prog.abort_requested:
            await self._abort_recorded_upload(job, remote)
            self.counters.uploads_aborted += 1
            raise Restart("aborted for a namespace change")
        parts = [done[n] for n, _, _ in ranges]
        if not _same_data(self.store.getattr(ino), attr.data_seq):
            # written while the parts went out: they may mix two versions
            await self._abort_recorded_upload(job, remote)
            await self._store(self.store.queue_update, job_id, job)
            raise DataChanged()
        try:
            return await self.gate.call(
                "CompleteMultipartUpload",
                lambda: self.client.complete_multipart_upload(key, upload_id, parts), what=key)
        except NotFoundError:
            # a retried CompleteMultipartUpload whose first try completed it (reply lost)
            adopted = await self._adopt(attr, key, meta, prog, "multipart upload gone at completion")
            if adopted is not None:
                return adopted
            await self._forget_upload(job_id, job, ino, remote)
            raise Restart("multipart upload vanished before completion")
        except PermanentError as e:
            if e.code not in ("InvalidPart", "InvalidPartOrder", "EntityTooSmall"):
                raise
            # S3 does not accept the parts we hold (lost or replaced meanwhile): start over
            log.warning("multipart_parts_rejected", key=key, upload_id=upload_id, code=e.code)
            await self._abort_recorded_upload(job, remote)
            await self._store(self.store.queue_update, job_id, job)
            raise Restart(f"parts rejected: {e.code}")

    async def _resumable_parts(self, key: str, remote: RemoteInfo, ranges) -> dict[int, PartInfo] | None:
        """Parts S3 holds that match what we recorded after verifying them (ETag, size,
        checksum); None if the upload id is unknown to S3."""
        try:
            listed = await self.gate.call("ListParts", lambda: self.client.list_parts(key, remote.upload_id),
                                          what=key)
        except NotFoundError:
            return None
        recorded = {int(n): (etag, ck) for n, etag, ck in remote.parts}
        lengths = {n: length for n, _, length in ranges}
        keep: dict[int, PartInfo] = {}
        for p in listed:
            rec = recorded.get(p.part_number)
            if (rec and rec[0] == p.etag and p.size == lengths.get(p.part_number)
                    and (p.checksum is None or p.checksum == rec[1])):
                keep[p.part_number] = PartInfo(p.part_number, p.etag, p.size, rec[1])
        return keep

    async def _forget_upload(self, job_id: int, job: dict, ino: int, remote: RemoteInfo) -> None:
        for k in _UPLOAD_JOB_FIELDS:
            job.pop(k, None)
        await self._store(self.store.queue_update, job_id, job)
        remote.upload_id, remote.parts = None, []
        try:
            await self._store(self.store.set_remote_info, ino, remote)
        except StoreError:
            pass

    async def _abort_recorded_upload(self, job: dict, remote: RemoteInfo | None) -> None:
        upload_id = job.get("upload_id") or (remote.upload_id if remote else None)
        key = job.get("key")
        if not upload_id or not key:
            return
        try:
            await self.gate.call("AbortMultipartUpload",
                                 lambda: self.client.abort_multipart_upload(key, upload_id), what=key)
        except NotFoundError:
            pass
        log.info("multipart_abort", key=key, upload_id=upload_id)
        for k in _UPLOAD_JOB_FIELDS:
            job.pop(k, None)
        if remote is not None:
            remote.upload_id, remote.parts = None, []
            try:
                await self._store(self.store.set_remote_info, job["ino"], remote)
            except StoreError:
                pass

    # ---- namespace mirroring -------------------------------------------------------
    async def namespace(self, job: dict, job_id: int) -> str:
        op = job.get("op")
        if op == "rename":
            if job.get("type") == "dir":
                return await self._move_dir(job, job_id)
            return await self._move_file(job, job_id)
        if op == "unlink":
            return await self._delete_file(job, job_id)
        if op == "link":
            return "nothing-to-do"        # a hard link shares the object of its first name
        if op in ("symlink", "mknod"):
            return await self._put_node(job)
        if op == "mkdir":
            return await self._put_dir_marker(job, job_id)
        if op == "rmdir":
            path = job.get("old_path") or job["new_path"]
            if self.manifests_on:
                mkey = self.keys.file_key(manifest_path(path))
                await self.gate.call("DeleteObject", lambda: self.client.delete_object(mkey), what=mkey)
            key = self.keys.dir_key(path)
            await self.gate.call("DeleteObject", lambda: self.client.delete_object(key), what=key)
            self.counters.deletes_done += 1
            return "marker-deleted"
        log.warning("unknown_job", job=job)
        return "ignored"

    async def _is_ours(self, path: str, ino: int, etag: str | None = None):
        """The object at `path` if it is the one we mean, else None: with a recorded ETag,
        exactly that object; without one (a symlink, a stale name), one written for this
        inode by this store (ckptgw-ino / ckptgw-store metadata)."""
        key = self.keys.file_key(path)
        info = await self.gate.call("HeadObject", lambda: self.client.head_object(key), what=key)
        if info is None:
            return None
        if etag is not None:
            return info if info.etag == etag else None
        return info if self._written_here(info, ino) else None

    def _written_here(self, info, ino: int | None = None) -> bool:
        """Whether an object's identity metadata says this store wrote it (for `ino`)."""
        written, store = info.metadata.get(INO_META), info.metadata.get(STORE_META)
        return (written is not None and (ino is None or written == str(ino))
                and (not store or not self.store_id or store == self.store_id))

    async def _delete_if(self, path: str, etag: str) -> bool:
        """Delete the object at `path` only if it is still `etag` (S3's conditional delete):
        a replayed or late delete never removes an object that replaced ours."""
        key = self.keys.file_key(path)
        try:
            await self.gate.call("DeleteObject", lambda: self.client.delete_object(key, if_match=etag), what=key)
        except PreconditionFailedError:
            log.info("delete_skipped_replaced", key=key, etag=etag)
            return False
        except NotFoundError:
            return False
        self.counters.deletes_done += 1
        return True

    async def _drop_replaced(self, path: str, etag: str, ino: int) -> str:
        """An object (`path`, `etag`) that file `ino` was going to replace, and no longer will:
        hand it to the file now at `path` if there is one (its upload replaces it), else
        delete it."""
        if await self._store(self.store.adopt_replaced, path, path, etag, ino) is not None:
            outcome = "kept-until-replaced"
        else:
            outcome = "deleted" if await self._delete_if(path, etag) else "already-gone"
        await self._store(self.store.forget_replaced, ino, path, etag)
        return outcome

    async def _copy(self, src: str, dst: str, size: int, etag: str, metadata: dict | None = None, *,
                    look: bool = False, there=None, ready=None) -> PutResult:
        """Server-side copy of exactly the object `etag` at `src` (NotFoundError if none,
        PreconditionFailedError if another object is there now). The HEAD covers endpoints
        that ignore x-amz-copy-source-if-match (moto 5.2.5 does). `metadata`: the copy's
        own (another file's identity), else the source's is kept.
        Exactly once (issue 38): an object at `dst` that is this copy already (`_is_copy`:
        one an earlier attempt sent before a crash, `look` HEADs it, or `there`, the caller's
        HEAD) is the result, nothing is sent; a CopyObject whose reply was lost is checked the
        same way (the gate's recheck, a HEAD of `dst`) before it is retried. `ready`: awaited
        after the source's HEAD, before the copy is sent (a durable note, made meanwhile)."""
        try:
            info = await self.gate.call("HeadObject", lambda: self.client.head_object(src), what=src)
        finally:
            if ready is not None:
                await ready
        if info is None:
            raise NotFoundError("NoSuchKey", src)
        if info.etag != etag:
            raise PreconditionFailedError("PreconditionFailed", f"{src} is {info.etag}, not {etag}")
        want = info.metadata if metadata is None else metadata
        if look:
            there = await self.gate.call("HeadObject", lambda: self.client.head_object(dst), what=dst)
        if there is not None and self._is_copy(there, want, size, etag):
            log.info("copy_adopted", src=src, dst=dst, etag=there.etag, version_id=there.version_id)
            return PutResult(there.etag, there.checksum, there.version_id)

        def recheck() -> PutResult | None:
            found = self.client.head_object(dst)
            if found is None or not self._is_copy(found, want, size, etag):
                return None
            log.info("copy_adopted", src=src, dst=dst, etag=found.etag, version_id=found.version_id,
                     why="retry after a lost reply")
            return PutResult(found.etag, found.checksum, found.version_id)

        if size <= S3_MAX_COPY:
            res = await self.gate.call(
                "CopyObject", lambda: self.client.copy_object(src, dst, if_match=etag, metadata=metadata), what=dst,
                recheck=recheck)
        else:
            res = await self._copy_multipart(src, dst, size, info.metadata if metadata is None else metadata)
        self.counters.bytes_copied += size
        return res

    def _is_copy(self, there, want: dict, size: int, etag: str) -> bool:
        """Whether object `there` (a HEAD's) is a copy of the source object (`etag`, `size`)
        with metadata `want`: that size and metadata, and either the source's ETag (a copy of
        a single-part object keeps it) or identity metadata of this store (store, inode,
        generation, data sequence: the same bytes; a copy of a multipart upload gets an
        ETag of its own)."""
        if there.size != size or there.metadata != want:
            return False
        if there.etag == etag:
            return True
        m = there.metadata
        return (bool(self.store_id) and m.get(STORE_META) == self.store_id
                and all(m.get(k) is not None for k in (INO_META, GEN_META, SEQ_META)))

    async def _copy_multipart(self, src: str, dst: str, size: int, meta: dict) -> PutResult:
        """UploadPartCopy for objects above CopyObject's 5 GiB limit (`meta` given, since
        multipart copies do not copy the source's: the caller has it from its HEAD)."""
        await self.orphans_swept.wait()
        upload_id = await self.gate.call(
            "CreateMultipartUpload", lambda: self.client.create_multipart_upload(dst, metadata=meta), what=dst)
        piece = max(COPY_PART, part_size_for(size, COPY_PART))
        try:
            parts = await asyncio.gather(*(
                self.gate.call("UploadPartCopy", lambda n=n, o=o, ln=ln: self.client.upload_part_copy(
                    src, dst, upload_id, n, o, o + ln - 1), what=f"{dst}#{n}")
                for n, o, ln in part_ranges(size, piece)))
            return await self.gate.call(
                "CompleteMultipartUpload",
                lambda: self.client.complete_multipart_upload(dst, upload_id, list(parts)), what=dst)
        except BaseException:
            await self.gate.call("AbortMultipartUpload",
                                 lambda: self.client.abort_multipart_upload(dst, upload_id), what=dst)
            raise

    async def _move_file(self, job: dict, job_id: int) -> str:
        """Copy, re-key the record (durable), then delete the source only if it is still the
        object we copied. A crash anywhere replays to the same end: before the re-key the
        source is still there, and the replay re-keys to the copy an earlier attempt left at
        the new key, else copies (`_copy_rekey`: the job's durable COPY_SENT note); after it,
        the record names the new key and the replay only removes the old object: one written
        here by its identity, an imported one (no identity of ours) by the ETag the job
        recorded before the copy."""
        ino, old, new = job["ino"], job["old_path"], job["new_path"]
        remote = self._job_remote(job)
        if remote is not None and not remote.etag:
            if job.get("sent") is False:
                return "nothing-to-move"  # never uploaded
            # an upload had begun (F_SENT): one that S3 took but a crash kept from its record
            # left an object of ours at `old` that nothing names (issue 38)
            return await self._move_unrecorded(ino, old, new)
        if remote is None and job.get("sent") is False:
            return "nothing-to-move"      # gone, and no object was ever written for it
        recorded = job.get("object")
        if remote is None and recorded and recorded[0] == old:
            # a replay of a move whose file went (unlinked, reclaimed) after it began, its object
            # imported: no record names the copy it may have made at `new`, and the source may
            # outlive an unlink that recorded the copy; with no identity of ours on them, no later
            # job would find either: they go, by the ETag the job recorded. (An object written
            # here carries its identity: later jobs find it, as below.)
            gone = False
            for path in (new, old):
                info = await self._is_ours(path, ino, etag=recorded[1])
                if info is not None and not self._written_here(info):
                    await self._delete_if(path, recorded[1])
                    gone = True
            if gone:
                return "file-gone"
        if remote is not None and remote.key == new:
            # already moved (a replay) or uploaded under the new name; an older object of
            # ours may still sit at the old name: remove exactly that one
            info = await self._is_ours(old, ino)
            if info is None and recorded and recorded[0] == old:
                info = await self._is_ours(old, ino, etag=recorded[1])
            if info is not None and await self._delete_if(old, info.etag):
                return "stale-deleted"
            return "nothing-to-move"
        if remote is not None and remote.key == old:
            if self._object_is_stale(ino, remote):
                # the file was written again after its object was: a copy would put its old bytes
                # under the new name, where a reader of the bucket takes them for the file's (a
                # failover's reclaimed tmp file, renamed over a shard's name, was once an empty
                # object there). Its pending upload writes the new name and drops this object
                # (_upload: the record's key is not the path); an object the rename replaced
                # stays until then (RemoteInfo.replaces). A replay decides the same way.
                await self._fetch_before_leaving(ino)
                log.info("move_not_copied_stale", ino=ino, src=old, dst=new, data_seq=remote.data_seq)
                # unless an upload of the new bytes replaced it there and a crash kept that from
                # the record (issue 38): the upload's drop of the recorded ETag would miss it
                info = await self._is_ours(old, ino)
                if info is not None and info.etag != remote.etag:
                    return await self._move_unrecorded(ino, old, new, info)
                return "stale-not-copied"
            etag, size = remote.etag, remote.size
        else:
            info = await self._is_ours(old, ino)
            if info is None:
                return "not-ours"
            if remote is None and job.get("type") not in NODE_JOB_TYPES:
                # the file went (unlinked and reclaimed) after the rename: a copy would put under
                # the new name bytes it may never have had there (written again after the upload),
                # which the unlink's job would only remove. Its object goes now.
                await self._delete_if(old, info.etag)
                log.info("move_file_gone", ino=ino, src=old, dst=new)
                return "file-gone"
            etag, size = info.etag, info.size
        # what the replay removes if a crash comes between the re-key and the removal: durable
        # with the copy's note (_copy_rekey), before the copy
        job["object"] = [old, etag]
        copied = await self._copy_rekey(ino, old, new, etag, size, rekey=remote is not None, job=job,
                                        job_id=job_id)
        if copied != "copied":
            return copied
        await self._delete_if(old, etag)
        log.info("moved", ino=ino, src=old, dst=new, size=size)
        return "moved"

    async def _move_unrecorded(self, ino: int, old: str, new: str, info=None) -> str:
        """The object an upload of file `ino` put at `old` before a crash lost its record: it
        holding the file's current bytes (its data sequence), copied to `new`, where the file's
        upload then adopts it instead of sending the bytes; the old one goes either way (no
        record names it, and the file's bytes are local: a file with no object is never
        evicted). Nothing of ours there (the usual case: the upload was cut before S3 took
        it): nothing to move. `info`: that object, HEADed already."""
        info = info or await self._is_ours(old, ino)
        if info is None:
            return "nothing-to-move"
        try:
            seq = int(info.metadata.get(SEQ_META, ""))
        except ValueError:
            seq = None
        outcome = "unrecorded-deleted"
        if seq is not None and not self._unrecorded_is_stale(info):
            try:
                # (a replay of this after a crash finds the copy at `new`: look first, this is
                # a path after a crash already)
                await self._copy(self.keys.file_key(old), self.keys.file_key(new), info.size, info.etag,
                                 look=True)
                outcome = "unrecorded-moved"
            except (NotFoundError, PreconditionFailedError):
                return "nothing-to-move"        # gone or replaced since the HEAD: not ours to move
        await self._delete_if(old, info.etag)
        log.info("move_unrecorded_object", ino=ino, src=old, dst=new, etag=info.etag, outcome=outcome)
        return outcome

    def _unrecorded_is_stale(self, info) -> bool:
        """Whether an object of ours that no record names holds bytes its regular file has
        written over since (its ckptgw-seq is not the file's data sequence). Unknown (no
        sequence, a file gone, not a regular file): False, the callers' older rules decide."""
        try:
            ino, seq = int(info.metadata[INO_META]), int(info.metadata[SEQ_META])
            attr = self.store.getattr(ino)
        except (KeyError, ValueError, StoreError):
            return False
        return attr.type == FileType.REG and attr.data_seq != seq

    def _file_gone(self, info) -> bool:
        """Whether the inode an object of ours names (its ckptgw-ino) no longer exists in the
        store (unlinked and reclaimed). Unknown (no inode metadata): False."""
        try:
            self.store.getattr(int(info.metadata[INO_META]))
        except (KeyError, ValueError):
            return False
        except StoreError as e:
            if e.errno in (errno.ESTALE, errno.ENOENT):
                return True
            raise
        return False

    async def _fetch_before_leaving(self, ino: int) -> None:
        """Bring a file's absent ranges (evicted, or an import's never read) in from its stale
        object before a job leaves that object at a name the file no longer has: once the job
        is done, a new file may take the name and its upload replace the object, and the only
        copy of those bytes with it. Idempotent (a fill never overwrites writes); a failure
        leaves the job queued, which keeps uploads off that name until it runs again."""
        try:
            absent = self._absent_ranges(ino)
        except StoreError as e:
            if e.errno in (errno.ESTALE, errno.ENOENT):
                return
            raise
        if absent:
            await self._fetch_absent(ino, absent)
            log.info("stale_object_bytes_fetched", ino=ino, ranges=len(absent))

    def _absent_ranges(self, ino: int) -> list[tuple[int, int]]:
        """The file's ranges that are not local (evicted, or an import's never read)."""
        return [(e.offset, e.length) for e in self.store.extents(ino) if e.state == DataState.ABSENT]

    async def _fetch_absent(self, ino: int, absent: list[tuple[int, int]]) -> None:
        """Fill those ranges from the file's object through the read-through hook."""
        if absent:
            if self.fetch_missing is None:
                raise RuntimeError(f"ino {ino} has absent ranges and no read-through is wired")
            await self.fetch_missing(ino, absent)

    def _object_is_stale(self, ino: int, remote: RemoteInfo) -> bool:
        """Whether the file's bytes moved on since its object was written (its data sequence;
        unknown for records of older versions: not stale)."""
        if remote.data_seq is None:
            return False
        try:
            return not _same_data(self.store.getattr(ino), remote.data_seq)
        except StoreError as e:
            if e.errno in (errno.ESTALE, errno.ENOENT):
                return False             # gone: the other branches of the move decide
            raise

    async def _copy_rekey(self, ino: int, old: str, new: str, etag: str, size: int, rekey: bool,
                          job: dict | None = None, job_id: int | None = None) -> str:
        """The first half of a move: copy exactly the object `etag` from `old` to `new`, then
        (rekey) durably point the file's record at the copy. The caller removes the source
        after, so a crash in between replays the copy or, once re-keyed, only the removal.
        Exactly once (issue 38): the job notes COPY_SENT = [old, etag, new] durably before
        the copy is sent (its sync runs beside the source's HEAD); an attempt that finds the
        note HEADs `new` first and re-keys to the copy found there (`_copy`'s `look`) instead
        of copying again. A first attempt sends no extra request."""
        note = [old, etag, new]
        look = job is not None and job.get(COPY_SENT) == note
        ready = None
        if job is not None and job_id is not None and not look:
            job[COPY_SENT] = note
            ready = asyncio.ensure_future(self._store(self._note_job, job_id, job))
        try:
            res = await self._copy(self.keys.file_key(old), self.keys.file_key(new), size, etag, look=look,
                                   ready=ready)
        except NotFoundError:
            return "source-missing"
        except PreconditionFailedError:
            return "source-replaced"
        self.counters.moves_done += 1
        if rekey and not await self._store(self.store.rekey_remote, ino, old, etag, new, res.etag,
                                           res.version_id) and self._remote(ino) is None:
            # the file went (unlinked and reclaimed) while its object was copied: no record
            # names the copy, and an imported object carries no identity of ours, so no later
            # job would find it: it goes now. The unlink's job removes the source it recorded.
            await self._delete_if(new, res.etag)
            return "file-gone"
        return "copied"

    def _note_job(self, job_id: int, job: dict) -> None:
        """*Blocking.* The job's notes durable (one index write and one sync); a job gone
        meanwhile (ENOENT) has nothing to note."""
        try:
            self.store.queue_update(job_id, job)
        except StoreError as e:
            if e.errno != errno.ENOENT:
                raise
            return
        self.store.sync()

    async def _move_dir(self, job: dict, job_id: int) -> str:
        """Move every object under the old prefix, each one copy -> re-key -> delete. The
        records to re-key are found by their S3 key (store.remote_records_under), not by
        walking today's tree: after `mv d e; mkdir d; mv e/f d/f` the file is back under d
        while its object and record are still at d/f and must go to e/f first. Only the
        object of a file imported after this job was queued stays (`imported_after_job`):
        that file was never in the moved subtree. So does an object nothing of ours owns (no
        record, not our marker, manifest, symlink or special file, no re-keyed copy of it):
        somebody else's, no file of the namespace until an import brings it in."""
        old, new = job["old_path"].rstrip("/"), job["new_path"].rstrip("/")
        old_rel, new_rel = old + "/", new + "/"
        old_prefix = self.keys.dir_prefix(old)
        objects = await self.gate.call("ListObjectsV2", lambda: list(self.client.list_objects(old_prefix)),
                                       what=old_prefix)
        owners: dict[tuple[str, str], int] = {}
        own: dict[tuple[str, str], tuple[int, RemoteInfo]] = {}     # each file's own object
        newer: set[tuple[str, str]] = set()      # objects of files imported since the rename
        for ino, r in await self._store(self.store.remote_records_under, old_rel):
            if r.key and r.etag:
                owners[(r.key, r.etag)] = ino
                own[(r.key, r.etag)] = (ino, r)
                if job_id <= r.imported_after_job:
                    newer.add((r.key, r.etag))
            for k, e in r.replaces:
                owners[(k, e)] = ino
        rekeyed = {x for _, r in await self._store(self.store.remote_records_under, new_rel)
                   for x in [(r.key, r.etag), *r.replaces]}
        moved = 0

        stale: set[tuple[str, str]] = set()     # unrecorded objects of ours whose file moved on

        async def ours(rel: str, etag: str, dst_rel: str) -> bool:
            if (rel, etag) in owners or rel.endswith("/") or is_manifest_key(rel) or (dst_rel, etag) in rekeyed:
                return True      # a record's, a marker, a manifest, or copied and re-keyed before a crash
            key = self.keys.file_key(rel)
            info = await self.gate.call("HeadObject", lambda: self.client.head_object(key), what=key)
            if info is None or info.etag != etag or not self._written_here(info):
                return False
            if self._unrecorded_is_stale(info) or self._file_gone(info):
                stale.add((rel, etag))
            return True

        async def move_one(obj) -> None:
            nonlocal moved
            rel = obj.key[len(self.keys.prefix):]
            if (rel, obj.etag) in newer:
                return
            dst_rel = new_rel + rel[len(old_rel):]
            if rel.endswith("/") and has_tmp_component(dst_rel.rstrip("/")):
                # a marker never goes under a temporary name (as _put_dir_marker): only the old goes
                await self._delete_if(rel, obj.etag)
                return
            if not await ours(rel, obj.etag, dst_rel):
                log.info("move_left_foreign_object", key=obj.key, etag=obj.etag)
                return
            if (rel, obj.etag) in stale:
                # an upload's object no record names (a crash before mark_uploaded, issue 38, or
                # a file removed after the rename, its record reclaimed before this move ran), of
                # bytes its file has written over since or of a file that is gone: copied, it
                # would put them under a name the file never held them at (or no file holds); the
                # file's upload sends its bytes there, a gone file's unlink finds nothing left
                await self._delete_if(rel, obj.etag)
                log.info("move_dropped_stale_unrecorded", key=obj.key, etag=obj.etag)
                return
            mine = own.get((rel, obj.etag))
            if mine is not None and self._object_is_stale(*mine):
                # as in _move_file: the file was written again since; its upload writes the new
                # name and drops this object (an object it replaced is not its own: moved)
                await self._fetch_before_leaving(mine[0])
                log.info("move_not_copied_stale", ino=mine[0], src=rel, dst=dst_rel, data_seq=mine[1].data_seq)
                return
            dst = self.keys.file_key(dst_rel)
            there = await self.gate.call("HeadObject", lambda: self.client.head_object(dst), what=dst)
            if there is not None and there.etag == obj.etag:
                res = PutResult(there.etag, there.checksum, there.version_id)   # copied before a crash
            else:
                try:
                    # (a copy of a multipart upload, before a crash, has its own ETag: _copy
                    # recognises it by its identity)
                    res = await self._copy(obj.key, dst, obj.size, obj.etag, there=there)
                except (NotFoundError, PreconditionFailedError):
                    return                 # gone or replaced since the listing: not ours to move
            ino = owners.get((rel, obj.etag))
            if ino is not None:
                await self._store(self.store.rekey_remote, ino, rel, obj.etag, dst_rel, res.etag, res.version_id)
            await self._delete_if(rel, obj.etag)
            self.counters.moves_done += 1
            moved += 1

        await asyncio.gather(*(move_one(o) for o in objects))
        if not has_tmp_component(new) and job.get("ino") is not None:
            # markers that never went under a temporary name are put now: this directory's if
            # it has none to move, and, leaving a temporary name (`mv step.tmp step`), those of
            # the directories now under it (S3 never got them)
            dirs = [job["ino"]] if not any(o.key == old_prefix for o in objects) else []
            if has_tmp_component(old):
                dirs += [a.ino for _, a in await self._store(lambda: list(self.store.walk(job["ino"])))
                         if a.type == FileType.DIR]
            for ino in dirs:
                if await self._put_dir_marker({"ino": ino}) == "marker-put":
                    moved += 1
        log.info("moved_dir", src=old_prefix, dst=self.keys.dir_prefix(new), objects=moved)
        return "moved-dir"

    async def _delete_file(self, job: dict, job_id: int | None = None) -> str:
        """Remove a file's object, unless a file now at its name will replace it (a rename
        over it, `rm a; mv b a`): then S3 keeps it until that upload or move lands, so it
        never lacks both versions. Acts on the object the journal names (ETag recorded at
        unlink time: the inode's own record may be reclaimed by now)."""
        ino, old = job["ino"], job["old_path"]
        last_link = job.get("last_link", True)
        remote = self._job_remote(job)
        if last_link:
            for k, e in job.get("replaces", []):
                await self._drop_replaced(k, e, ino)
        recorded = tuple(job["object"]) if job.get("object") else None
        cur = (remote.key, remote.etag) if remote is not None and remote.etag and remote.key else recorded
        if cur is not None and cur[0] == old:
            etag = cur[1]
        elif recorded is not None and recorded[0] == old:
            # the object the journal recorded at the removed name, moved on since (a replay
            # after the move to the next name re-keyed the record): only it is left to remove;
            # by its ETag, since an imported object carries no identity of ours
            etag = recorded[1]
        elif cur is None and job.get("type") not in NODE_JOB_TYPES and job.get("sent") is False:
            return "never-uploaded"       # (gone now, but no object was ever written for it)
        # (no object recorded but an upload had begun, F_SENT: one S3 took before a crash kept it
        # from the record is found below by its identity, issue 38)
        else:
            if last_link and cur is not None and cur[0] != old:
                # removed before its move ran (a move finds an imported object, which carries
                # no identity of ours, only through the record that is gone now): the object
                # is still at the name the journal recorded; conditional, so a done move is a no-op
                await self._drop_replaced(cur[0], cur[1], ino)
            info = await self._is_ours(old, ino)
            if info is None and recorded is not None:
                # the journal's object, brought here by a directory move that ran after the
                # unlink (a server-side copy keeps the ETag; an imported object has no identity
                # of ours). Nothing else lands at `old` before this job: uploads, imports and
                # moves to it wait for it
                info = await self._is_ours(old, ino, etag=recorded[1])
            if info is None:
                return "not-ours"
            etag = info.etag
        if (remote is not None and remote.key == old and not last_link and job.get("new_path")
                and self._object_is_stale(ino, remote)):
            # as a move: the file was written again since its object was, so its old bytes go to
            # no other name. The object stays where its record says until the file's upload,
            # which then drops it; the absent ranges of an evicted file come in first, as
            # the name is free for a new file's object now.
            await self._fetch_before_leaving(ino)
            log.info("unlinked_object_left_stale", ino=ino, path=old, etag=etag, data_seq=remote.data_seq)
            return "stale-left-for-upload"
        if remote is not None and remote.key == old and not last_link and job.get("new_path"):
            # another name still links the file, and its object was at the name removed: move
            # it to the file's next name (copy, re-key, then the old one goes), never delete
            # first - the file may be evicted, and that object is then the only copy of its bytes
            moved = await self._copy_rekey(ino, old, job["new_path"], etag, remote.size, rekey=True, job=job,
                                           job_id=job_id)
            if moved == "copied":
                outcome = await self._drop_replaced(old, etag, ino)
                log.info("unlinked_object_moved", ino=ino, path=old, to=job["new_path"], etag=etag,
                         outcome=outcome)
                return "moved-to-link"
        outcome = await self._drop_replaced(old, etag, ino)
        if remote is not None and remote.key == old and not last_link and job.get("type") not in NODE_JOB_TYPES:
            # another name still links the file and there was no object to move (or the job
            # predates new_path): upload it again under that name
            remote.key, remote.etag = None, None
            try:
                await self._store(self.store.set_remote_info, ino, remote)
                await self._store(self.store.set_data_state, ino, DataState.DIRTY)
            except StoreError:
                pass
        log.info("unlinked_object", ino=ino, path=old, etag=etag, outcome=outcome)
        return outcome

    async def _put_node(self, job: dict) -> str:
        """A symbolic link or special file as s3fs stores one: a link's body is its target,
        a device's, socket's or FIFO's is empty; the mode's type bits say which (devices add
        rdev). Sent under the name it was made with; later renames and unlinks are jobs of
        their own that find it there by its inode metadata."""
        path, ino = job["new_path"], job["ino"]
        try:
            attr = self.store.getattr(ino)
            body = self.store.readlink(ino) if attr.type == FileType.LNK else b""
        except StoreError as e:
            if e.errno in (errno.ESTALE, errno.ENOENT, errno.EINVAL):
                return "gone"
            raise
        if attr.type == FileType.DIR or attr.type == FileType.REG:
            return "gone"                 # the inode number cannot have been reused: defensive
        key = self.keys.file_key(path)
        meta = object_metadata(attr, is_dir=False, store_id=self.store_id)
        await self.gate.call("PutObject", lambda: self.client.put_object(
            key, body, metadata=meta, checksum=checksum_b64(self.algorithm, body)), what=key)
        kind = "symlink" if attr.type == FileType.LNK else "special"
        log.info(f"{kind}_put", ino=ino, key=key, type=attr.type.name)
        return f"{kind}-put"

    def _renamed_again_after(self, path: str, job_id: int) -> bool:
        """Whether a directory rename queued after job `job_id` moves `path` (or what holds it)."""
        for jid, j in self.store.queue_list(1 << 30):
            if jid > job_id and j.get("op") == "rename" and j.get("type") == "dir":
                old = j["old_path"].rstrip("/")
                if path == old or path.startswith(old + "/"):
                    return True
        return False

    async def _put_dir_marker(self, job: dict, job_id: int | None = None) -> str:
        """The marker "path/" of a directory, under its CURRENT path (like an upload), and
        never under a temporary name (uploader.series.is_tmp_name, the rule retention uses):
        `mkdir step.tmp; ...; mv step.tmp step` puts only "step/", by the rename's job; a
        directory renamed while its mkdir waits is marked once, under its final name. Except
        where a rename queued after this mkdir job would move the current path again: then under
        the path the job names (where the directory was when it was queued), and the renames
        carry it on in order. `mv d imp/latest.pt; mv imp d` with d's mkdir queued put its marker
        at d/latest.pt/, the first rename's job took it for part of the old d/ and the second
        left it at d/latest.pt/latest.pt/ (found by the model test, 2026-11-29)."""
        try:
            attr = self.store.getattr(job["ino"])
            path = self.store.path_of(job["ino"])
        except StoreError as e:
            if e.errno in (errno.ESTALE, errno.ENOENT):
                return "gone"
            raise
        if path is None:
            return "gone"
        queued = job.get("new_path")
        if queued and queued != path and job_id is not None and await self._store(
                self._renamed_again_after, path, job_id):
            path = queued
        if has_tmp_component(path):
            return "temporary-name"
        key = self.keys.dir_key(path)
        meta = object_metadata(attr, is_dir=True, store_id=self.store_id)
        await self.gate.call("PutObject", lambda: self.client.put_object(
            key, b"", metadata=meta, checksum=checksum_b64(self.algorithm, b""),
            content_type=DIR_CONTENT_TYPE), what=key)
        return "marker-put"

"""What the uploader has to do: the dirty files settled long enough to upload (the index's
`ready`), their states on the way (QUEUED, UPLOADING), and the durable job queue: a part of
`Store`.
"""
from __future__ import annotations

import errno
import json

from .api import DataState, FileType, StoreError
from .index import Writer
from .keys import U64, U64x2
from .storebase import StoreBase


class UploadQueue(StoreBase):
    """Upload scheduling and the job queue (state: `_opens`, `_jobs_leaving`, `_decoded_jobs`,
    set in `Store._open`)."""

    def ready_for_upload(self, now_ns: int | None = None, settle_ns: int = 0,
                         limit: int = 100) -> list[int]:
        """Inodes whose data is dirty, not open for write, and quiet for settle_ns
        (settle_ns=0: flush, whatever any clock says), longest quiet first. Quiet means no
        write, truncate, commit or writer's close since, on the store clock (`now_ns`: a
        `clock_ns()` value, None: now); the client-settable mtime plays no part. Walks
        the `ready` index from its oldest entry and stops at the first one not quiet long
        enough: O(result), no scan. Only files in state DIRTY are returned
        (QUEUED/UPLOADING ones are the uploader's); committed or not: the uploader calls
        commit_settled before it takes one."""
        out = []
        if now_ns is None:
            now_ns = self.clock_ns()
        with self.ix.read() as v:
            for key in v.txn.cursor(db=self.ix.ready).iternext(values=False):
                stamp, ino = U64x2.unpack(key)
                if len(out) >= limit or (settle_ns > 0 and now_ns - stamp < settle_ns):
                    break
                counts = self._opens.get(ino)
                if counts is None or counts[1] == 0:
                    out.append(ino)
        return out

    def oldest_ready_ns(self) -> int | None:
        """Store-clock time (see clock_ns) of the last activity of the settled dirty file
        waiting longest to be picked up, or None: the first key of the `ready` index, so
        the age of the upload backlog (clock_ns() - this) costs one cursor step."""
        with self.ix.read() as v:
            for key in v.txn.cursor(db=self.ix.ready).iternext(values=False):
                return U64x2.unpack(key)[0]
        return None

    def set_data_state(self, ino: int, state, change: int | None = None) -> bool:
        """Move a file to QUEUED/UPLOADING/DIRTY. With `change`, only if the inode's change
        counter still equals it (returns False otherwise)."""
        state = DataState(state)
        if state not in (DataState.QUEUED, DataState.UPLOADING, DataState.DIRTY):
            raise StoreError(errno.EINVAL, f"set_data_state cannot set {state.name}")
        return self._in_batch(self._ns_set_data_state, ino, state, change, durable=False)

    def _ns_set_data_state(self, w: Writer, ino: int, state: DataState, change: int | None) -> bool:
        rec = w.must_inode(ino)
        self._regular(rec)
        if change is not None and rec.change != change:
            return False
        if rec.state != state:
            new = rec.copy()
            new.state = state
            w.put_inode(new, rec)
        return True

    # durable work queue (the uploader's jobs; opaque dicts to the store).
    # The store itself appends a change-journal job in the SAME transaction as each namespace
    # op the uploader must mirror, so nothing is lost between the op and the queue:
    #   {"kind": "ns", "op": "rename", "ino": I, "type": "reg|dir|lnk|blk|chr|sock|fifo", "old_path": P,
    #    "new_path": Q, "replaced": T or None}
    #   {"kind": "ns", "op": "unlink"|"rmdir", "ino": I, "type": ..., "old_path": P,
    #    "last_link": bool[, "replaced_by": S][, "new_path": Q]}  (a rename's replaced target:
    #    queued BEFORE the rename job, so deleting it never deletes the renamed file's new
    #    object; Q: a regular file's first remaining name when other links keep it)
    #   {"kind": "ns", "op": "mkdir", "ino": I, "type": "dir", "new_path": P}
    #   {"kind": "ns", "op": "link", "ino": I, "type": ..., "old_path": P, "new_path": Q}
    #   {"kind": "ns", "op": "symlink", "ino": I, "type": "lnk", "new_path": P, "target": T}
    #   {"kind": "ns", "op": "mknod", "ino": I, "type": "blk|chr|sock|fifo", "new_path": P}
    # (paths export-relative). Whether S3 needs work for it is the uploader's business.
    # Queue calls are not synced by themselves: call sync() when the job must be durable.
    def queue_put(self, job: dict) -> int:
        with self.ix.write() as w:
            return w.queue_put(job)

    def queue_uploads(self, jobs: list[dict]) -> list[int]:
        """*Blocking.* Queue upload jobs (opaque dicts with the file's "ino" and its "change"
        when the job was made) and move their files to QUEUED, all in one write txn: a
        checkpoint's shards settle together, and one commit for all of them holds the index
        write lock (which the namespace batches need) for one fdatasync, not two per file.
        A file gone, not regular, or written since (its change moved) is skipped: it settles
        anew. Returns the inos queued; not synced, as no queue call is."""
        queued = []
        with self.ix.write() as w:
            for job in jobs:
                rec = w.inode(job["ino"])
                if rec is None or rec.type != FileType.REG or rec.change != job["change"]:
                    continue
                w.queue_put(job)
                if rec.state != DataState.QUEUED:
                    new = rec.copy()
                    new.state = DataState.QUEUED
                    w.put_inode(new, rec)
                queued.append(rec.ino)
        return queued

    def queue_list(self, limit: int = 1000) -> list[tuple[int, dict]]:
        # copied before the read txn: a job leaves the set only after its delete committed,
        # so a job missing from the copy is missing from the txn too (see queue_done)
        leaving = set(self._jobs_leaving)
        stored = []
        with self.ix.read() as v:
            for key, val in v.txn.cursor(db=self.ix.queue):
                if len(stored) >= limit:
                    break
                job_id = U64.unpack(key)[0]
                if job_id not in leaving:
                    stored.append((job_id, bytes(val)))
        return self._decoded_jobs.decode(stored)      # outside the txn: it holds a reader slot

    def queue_update(self, job_id: int, job: dict) -> None:
        self._in_batch(self._ns_queue_update, job_id, json.dumps(job).encode(), durable=False)

    def _ns_queue_update(self, w: Writer, job_id: int, encoded: bytes) -> None:
        key = U64.pack(job_id)
        if job_id in self._jobs_leaving or w.txn.get(key, db=self.ix.queue) is None:
            raise StoreError(errno.ENOENT, f"no queue job {job_id}")
        w.txn.put(key, encoded, db=self.ix.queue)

    def queue_done(self, job_id: int) -> None:
        """Remove a finished job, without waiting: the uploader calls this on the event loop,
        where a write txn of its own would wait for the index lock a batch commit holds
        through its fdatasync (every client waiting with it). A lazy batch op: not synced,
        like every queue call, nor committed by itself (a crash before a commit covers it
        runs the job again); queue_list hides the job from the moment this returns."""
        fut = self._queue_lazy(self._ns_queue_done, job_id)
        if fut is not None:
            self._jobs_leaving[job_id] = fut
            fut.add_done_callback(lambda f: self._jobs_leaving.pop(job_id, None))
            return
        with self.ix.write() as w:          # closing: its own txn, synced by close()
            self._ns_queue_done(w, job_id)

    def _ns_queue_done(self, w: Writer, job_id: int) -> None:
        w.txn.delete(U64.pack(job_id), db=self.ix.queue)

"""Crash recovery at open: bring the index and the extent files into agreement.

Visits only the two small indexes that can be out of step after a crash, never every inode,
so start-up time is independent of the number of files:

* orphans: inodes unlinked while open (the opens died with the process) and inodes whose
  data file removal may not have happened: delete the records and the data file.
* drops: evicted files whose data file's unlink may not have happened: remove the file
  (the index already says ABSENT; see the invariant in store.py).
* unsettled (a subset of the dirty files, those S3 lacks): files that may hold
  uncommitted bytes, had a truncate in flight, or were QUEUED/UPLOADING. Bytes past the last committed size were never promised to anyone
  (unstable writes, RFC 8881 section 18.32): cut the data file and the extent map back to
  `committed_size`, so no uncommitted garbage appears past it. Files that were QUEUED or
  UPLOADING go back to DIRTY: the uploader will pick them up again.
"""
from __future__ import annotations

import structlog

from . import extents
from .api import DataState
from .index import F_TRUNCATED, F_UNCOMMITTED, Index
from .data import DataFiles

log = structlog.get_logger(__name__)


def recover(ix: Index, data: DataFiles) -> dict:
    stats = {"orphans": 0, "dirty": 0, "unsettled": 0, "truncated": 0, "requeued": 0}
    with ix.read() as v:
        orphans = v.keys(ix.orphans)
        gone = set(orphans)
        # only files that may hold uncommitted bytes (or were being uploaded) need a visit
        todo = [rec for rec in map(v.inode, v.keys(ix.unsettled))
                if rec is not None and rec.ino not in gone]
        stats["dirty"] = v.txn.stat(ix.dirty)["entries"]
        drops = v.keys(ix.drops)
    stats["unsettled"] = len(todo)
    # data first: the index keeps naming the work until the files are really gone
    for ino in orphans + drops:
        data.remove(ino)
    cut = set()
    for rec in todo:
        if data.shrink_to(rec.ino, min(rec.size, rec.committed_size)):
            cut.add(rec.ino)
    with ix.write() as w:
        for ino in drops:                    # an eviction's unlink the crash interrupted
            w.set_flag_key(ix.drops, ino, False)
        for ino in orphans:
            rec = w.inode(ino)
            if rec is not None:
                w.purge_inode(rec)
            w.set_flag_key(ix.orphans, ino, False)
            stats["orphans"] += 1
        for rec in todo:
            new = rec.copy()
            if new.size > new.committed_size:
                new.local_bytes += extents.truncate(w.txn, ix.extents, rec.ino,
                                                    new.committed_size)
                new.size = new.committed_size
                cut.add(rec.ino)
            elif new.size < new.committed_size:
                new.committed_size = new.size
            if rec.ino in cut or rec.flags & (F_UNCOMMITTED | F_TRUNCATED):
                new.bump_data_seq()          # its bytes may differ from any object sent before
            new.flags &= ~(F_UNCOMMITTED | F_TRUNCATED)
            w.stamp(new)                     # a full settle window after the restart
            if new.state in (DataState.QUEUED, DataState.UPLOADING):
                new.state = DataState.DIRTY
                stats["requeued"] += 1
            w.put_inode(new, rec)
    stats["truncated"] = len(cut)
    log.info("store_recovered", **stats)
    return stats

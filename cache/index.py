"""LMDB layout of the store index, and the typed accessors every other module uses.

One environment under <store>/index, opened with sync=True, metasync=False (LMDB's
MDB_NOMETASYNC): every commit fdatasyncs its data pages BEFORE it writes its meta page, so
a power cut can never leave a meta page on disk that points at unwritten pages (with
sync=False it could: the kernel writes dirty pages back in any order, and LMDB's docs say
the database can then be corrupted). Only the newest commit's meta page may be unsynced:
the next commit's fdatasync, or `commit.GroupCommit`'s env.sync(), makes it durable; a
power cut before that rolls the index back to the commit before (ACI kept, D for the
last commit only). See ARCHITECTURE.md, Durability rules.
Keys are big-endian so cursor order is numeric order. Named databases:

  meta      b"format" -> FORMAT; counters (next_ino, next_job, used, dirty, opens) u64;
            b"instance" -> 16 random bytes; b"clock" -> u64 high-water of the store clock;
            b"sent_since" -> u64 first ino whose F_SENT flag is kept (set at the first open)
  inodes    ino -> Inode record (struct, see INODE; devices carry rdev major/minor in it)
  dirents   parent+name -> child ino, cookie, type      (LOOKUP = one get)
  cookies   parent+cookie -> name                        (READDIR = one cursor walk)
  links     ino+parent+name -> b""                       (reverse map: path_of, checks)
  extents   ino+offset -> length, state                  (see extents.py)
  symlinks  ino -> target
  dirty     ino -> b""     regular files whose bytes S3 lacks (the upload set)
  unsettled ino -> b""     files crash recovery must visit: maybe uncommitted bytes, a
                           truncate in flight, or an upload in progress (a subset of dirty)
  ready     activity+ino -> b"" dirty files in state DIRTY, linked (committed or not: the
                                uploader commits them): upload candidates, quiet longest first. Keyed by
                                the inode's activity_ns on the store's own clock (clock.py),
                                never by the client-settable mtime (format 2; format 1
                                keyed by mtime and is upgraded at open)
Format 3 added special files (inode types BLK/CHR/SOCK/FIFO, rdev appended to the inode
record); a format 2 store opens unchanged (its records read as rdev 0) and is marked 3, so
an older ckptgw, which cannot read those types, refuses it instead of misreading it.
Format 4 added `rkeys`, built from `remote` at open; an older ckptgw would not keep it up to
date, so the new mark makes it refuse the store.
  lru       lru_ns+ino -> b""   CLEAN files with local bytes (eviction order)
  orphans   ino -> b""     inodes to reclaim: unlinked while open, or data file not yet removed
  drops     ino -> b""     evicted files whose data file may still exist: recovery removes it
  remote    ino -> JSON RemoteInfo
  rkeys     key[:RKEY_MAX] + ino -> b""   every S3 key a remote record names (its key and the
                           keys it `replaces`), UTF-8, cut to RKEY_MAX bytes (LMDB keys stop at
                           511): a directory move finds the records under a prefix by a range
                           scan, not by decoding every record (format 4; upgraded at open)
  pins      ino -> reason
  queue     job id -> JSON job
  clients   blake2b(owner) -> u32 len + owner + record: opaque records of NFS clients that
            hold state, for reclaim after a restart (the store does not interpret them;
            the key is a digest because an owner may be longer than LMDB's 511-byte keys)
  replies   blake2b(owner) + u64 seq -> reply record (cache/replies.py): a RENAME's or REMOVE's
            answer to a recorded client, written in the op's own txn, the client's newest
            few, deleted with its client record; an older ckptgw ignores the database
Every index that depends on an inode's fields (dirty, lru, the used/dirty byte counters) is
maintained in one place, `Writer.put_inode`, so they cannot drift apart.
"""
from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import os
import struct
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass

import lmdb
import structlog

from . import extents
from .api import ROOT_INO, Attr, CopySource, DataState, FileType, RemoteInfo, StoreError
from .clock import HIGH_WATER_STEP, StoreClock
from .keys import U64, U64x2

log = structlog.get_logger(__name__)

FORMAT = b"ckptgw-store/4"
FORMAT_V1 = b"ckptgw-store/1"     # inode records without activity_ns, ready keyed by mtime
FORMAT_V2 = b"ckptgw-store/2"     # no special files, inode records without rdev
FORMAT_V3 = b"ckptgw-store/3"     # no rkeys index
UPGRADABLE = (FORMAT_V1, FORMAT_V2, FORMAT_V3)
MAP_SIZE = 64 << 30           # sparse; LMDB only uses what it writes
# The initial map for instruction counting under valgrind (bench/instructions.py), whose address
# space cannot hold a 64 GiB mapping; a full map grows as always (_grow_map).
MAP_SIZE_ENV = "CKPTGW_INDEX_MAP_BYTES"
DB_NAMES = (b"meta", b"inodes", b"dirents", b"cookies", b"links", b"extents", b"symlinks",
            b"dirty", b"unsettled", b"ready", b"lru", b"orphans", b"remote", b"pins",
            b"queue", b"drops", b"clients", b"rkeys", b"replies")
RKEY_MAX = 480                # bytes of an S3 key an rkeys entry keeps (+ 8 of ino <= 511)

DIRENT = struct.Struct("<QQB")        # child ino, cookie, type

F_PINNED = 1
F_UNCOMMITTED = 2                    # may hold bytes written since the last commit()
F_TRUNCATED = 4                      # size set by truncate; data file length not yet synced
# S3 may hold an object written for this inode (Store.mark_sent: set by the uploader before it
# reads the file's path for an upload, durable before its first S3 write; set by an import):
# never cleared. A journal job records it (namespace.sent_of), so a job of a file whose inode is
# gone by the time it runs knows when no object of it can exist.
F_SENT = 8
SENT_SINCE = b"sent_since"           # meta: the first ino whose F_SENT is kept (older: unknown)
FIRST_COOKIE = 3                     # 0, 1, 2 are reserved by NFS (RFC 8881 section 18.23.3)
DIRTY_STATES = (DataState.DIRTY, DataState.QUEUED, DataState.UPLOADING)
_DIRTY_VALUES = frozenset(map(int, DIRTY_STATES))

#: type, state, flags, mode, nlink, uid, gid, size, committed_size, local_bytes,
#: atime, mtime, ctime, change, parent, gen, data_seq, next_cookie, lru_ns
#: (data_seq took 4 bytes that were padding: records written before it read as 0)
INODE_V1 = struct.Struct("<BBBxIIIIQQQqqqQQIIQQ")
#: format 2 appends activity_ns; a V1 record (format 1, until rewritten) reads as 0
INODE_V2 = struct.Struct(INODE_V1.format + "Q")
#: format 3 appends rdev major, minor; shorter records (until rewritten) read as 0, 0
INODE = struct.Struct(INODE_V2.format + "II")
_DATA_SEQ_FIELD = 16
# the enum members by value: a dict lookup, not an Enum call, per Inode.attr()
_FILE_TYPES = {int(t): t for t in FileType}
_DATA_STATES = {int(s): s for s in DataState}
_REG, _DIRTY, _CLEAN = int(FileType.REG), int(DataState.DIRTY), int(DataState.CLEAN)


@dataclass(slots=True)
class Inode:
    type: int
    state: int
    flags: int
    mode: int
    nlink: int
    uid: int
    gid: int
    size: int
    committed_size: int      # size that a commit() made durable; recovery truncates to it
    local_bytes: int         # bytes in DIRTY/CLEAN extents (what the file holds on local disk)
    atime_ns: int
    mtime_ns: int
    ctime_ns: int
    change: int
    parent: int              # directories: parent ino (root: itself); others 0
    gen: int
    next_cookie: int         # directories: next readdir cookie
    lru_ns: int              # CLEAN files: key in the lru index
    ino: int = 0
    # Bumped (mod 2**32) by every change to the file's bytes (write, truncate), never by
    # metadata: the uploader's proof that an object it sent still holds the file's data.
    data_seq: int = 0
    # The store clock (clock.py) at the file's last write, truncate, commit or last
    # writer's close: the settle window runs from here. Never the client-settable mtime.
    activity_ns: int = 0
    rdev_major: int = 0
    rdev_minor: int = 0

    def pack(self) -> bytes:
        return INODE.pack(self.type, self.state, self.flags, self.mode, self.nlink, self.uid,
                          self.gid, self.size, self.committed_size, self.local_bytes,
                          self.atime_ns, self.mtime_ns, self.ctime_ns, self.change,
                          self.parent, self.gen, self.data_seq, self.next_cookie, self.lru_ns,
                          self.activity_ns, self.rdev_major, self.rdev_minor)

    @classmethod
    def unpack(cls, ino: int, buf) -> "Inode":
        # every store read decodes one of these (34 per small-file save): the current
        # format positionally, in the field order above; shorter, older records padded
        if len(buf) == INODE.size:
            t = INODE.unpack(buf)
        elif len(buf) == INODE_V2.size:
            t = INODE_V2.unpack(buf) + (0, 0)
        else:
            t = INODE_V1.unpack(buf) + (0, 0, 0)
        return cls(*t[:_DATA_SEQ_FIELD], t[17], t[18], ino, t[_DATA_SEQ_FIELD], t[19], t[20], t[21])

    def copy(self) -> "Inode":
        return Inode(self.type, self.state, self.flags, self.mode, self.nlink, self.uid,
                     self.gid, self.size, self.committed_size, self.local_bytes, self.atime_ns,
                     self.mtime_ns, self.ctime_ns, self.change, self.parent, self.gen,
                     self.next_cookie, self.lru_ns, self.ino, self.data_seq, self.activity_ns,
                     self.rdev_major, self.rdev_minor)

    def bump_data_seq(self) -> None:
        self.data_seq = (self.data_seq + 1) & 0xFFFFFFFF

    # the predicates below run several times per index write (put_inode): plain ints,
    # not IntEnum members, on both sides of each comparison
    @property
    def is_dirty(self) -> bool:
        return self.type == _REG and self.state in _DIRTY_VALUES

    @property
    def unsettled(self) -> bool:
        return self.is_dirty and bool(
            self.flags & (F_UNCOMMITTED | F_TRUNCATED) or self.size != self.committed_size
            or self.state != _DIRTY)

    @property
    def ready(self) -> bool:
        # committed or not: a closed, quiet file's current bytes are uploaded (the uploader
        # commits them first: Store.commit_settled)
        return self.is_dirty and self.nlink > 0 and self.state == _DIRTY

    @property
    def in_lru(self) -> bool:
        return (self.type == _REG and self.state == _CLEAN
                and self.local_bytes > 0 and self.nlink > 0)

    def attr(self) -> Attr:
        return Attr(self.ino, self.gen, _FILE_TYPES.get(self.type) or FileType(self.type),
                    self.mode, self.nlink, self.uid, self.gid, self.size, self.local_bytes,
                    self.atime_ns, self.mtime_ns, self.ctime_ns, self.change, self.parent,
                    _DATA_STATES.get(self.state) or DataState(self.state),
                    bool(self.flags & F_PINNED), self.data_seq,
                    (self.rdev_major, self.rdev_minor))


def ready_key(rec: Inode) -> bytes:
    return U64x2.pack(rec.activity_ns, rec.ino)


def dirent_key(parent: int, name: bytes) -> bytes:
    return U64.pack(parent) + name


def link_key(ino: int, parent: int, name: bytes) -> bytes:
    return U64x2.pack(ino, parent) + name


_CLIENT_OWNER_LEN = struct.Struct(">I")


def client_key(owner: bytes) -> bytes:
    return hashlib.blake2b(owner, digest_size=32, person=b"ckptgw-client").digest()


def pack_client(owner: bytes, record: bytes) -> bytes:
    return _CLIENT_OWNER_LEN.pack(len(owner)) + owner + record


def unpack_client(buf) -> tuple[bytes, bytes]:
    buf = bytes(buf)
    (n,) = _CLIENT_OWNER_LEN.unpack_from(buf)
    return buf[4:4 + n], buf[4 + n:]


def remote_to_json(r: RemoteInfo) -> bytes:
    d = {f.name: getattr(r, f.name) for f in dataclasses.fields(RemoteInfo)}
    d["parts"] = [list(p) for p in r.parts]
    d["replaces"] = [list(p) for p in r.replaces]
    d["copied_from"] = dataclasses.asdict(r.copied_from) if r.copied_from else None
    return json.dumps(d).encode()


def remote_from_json(buf) -> RemoteInfo:
    d = json.loads(bytes(buf))
    d["parts"] = [tuple(p) for p in d.get("parts", [])]
    d["replaces"] = [tuple(p) for p in d.get("replaces", [])]
    c = d.get("copied_from")            # absent in records of older versions
    d["copied_from"] = CopySource(**c) if c else None
    return RemoteInfo(**d)


def rkey_entries(ino: int, r: RemoteInfo) -> set[bytes]:
    """The rkeys entries of one object record: each key it names, cut to RKEY_MAX bytes, then
    the ino. A cut key may match a prefix it does not start with: readers check the record."""
    tail = U64.pack(ino)
    return {k.encode()[:RKEY_MAX] + tail for k in (r.key, *(k for k, _ in r.replaces)) if k}


def rkey_inos(txn, db, prefix: str) -> list[int]:
    """The inos of every rkeys entry whose key may start with `prefix` (a superset: cut keys,
    and a key shorter than the prefix whose ino bytes happen to continue it), ascending."""
    start = prefix.encode()[:RKEY_MAX]
    inos = set()
    cur = txn.cursor(db=db)
    if cur.set_range(start):
        for k in cur.iternext(values=False):
            k = bytes(k)
            if not k.startswith(start):
                break
            inos.add(U64.unpack(k[-8:])[0])
    return sorted(inos)


class View:
    """Read accessors over one LMDB transaction (read-only or write)."""

    def __init__(self, index: "Index", txn: lmdb.Transaction):
        self.ix = index
        self.txn = txn

    def inode(self, ino: int) -> Inode | None:
        buf = self.txn.get(U64.pack(ino), db=self.ix.inodes)
        return None if buf is None else Inode.unpack(ino, buf)

    def must_inode(self, ino: int) -> Inode:
        rec = self.inode(ino)
        if rec is None:
            raise StoreError(errno.ESTALE, f"inode {ino} is gone")
        return rec

    def must_dir(self, ino: int) -> Inode:
        rec = self.must_inode(ino)
        if rec.type != FileType.DIR:
            raise StoreError(errno.ENOTDIR, f"inode {ino} is not a directory")
        return rec

    def dirent(self, parent: int, name: bytes) -> tuple[int, int, int] | None:
        """(child ino, cookie, type) or None."""
        buf = self.txn.get(dirent_key(parent, name), db=self.ix.dirents)
        return None if buf is None else DIRENT.unpack(buf)

    def has_children(self, parent: int) -> bool:
        cur = self.txn.cursor(db=self.ix.dirents)
        prefix = U64.pack(parent)
        return cur.set_range(prefix) and cur.key()[:8] == prefix

    def dir_entries_after(self, parent: int, cookie: int, limit: int):
        """[(cookie, name, child ino, type)] in cookie order after `cookie`."""
        cur = self.txn.cursor(db=self.ix.cookies)
        out = []
        if not cur.set_range(U64x2.pack(parent, cookie + 1)):
            return out
        for key, name in cur:
            p, c = U64x2.unpack(key)
            if p != parent or len(out) >= limit:
                break
            name = bytes(name)
            child, _, typ = self.dirent(parent, name)
            out.append((c, name, child, typ))
        return out

    def first_link(self, ino: int) -> tuple[int, bytes] | None:
        cur = self.txn.cursor(db=self.ix.links)
        prefix = U64.pack(ino)
        if cur.set_range(prefix):
            key = cur.key()
            if key[:8] == prefix:
                return U64.unpack(key[8:16])[0], bytes(key[16:])
        return None

    def links_of(self, ino: int) -> list[tuple[int, bytes]]:
        cur = self.txn.cursor(db=self.ix.links)
        prefix = U64.pack(ino)
        out = []
        if cur.set_range(prefix):
            for key in cur.iternext(values=False):
                if key[:8] != prefix:
                    break
                out.append((U64.unpack(key[8:16])[0], bytes(key[16:])))
        return out

    def path_of(self, ino: int) -> str | None:
        """Export-relative path through first links, or None if unlinked."""
        parts = []
        cur_ino = ino
        for _ in range(4096):
            if cur_ino == ROOT_INO:
                return "/".join(reversed(parts))
            link = self.first_link(cur_ino)
            if link is None:
                return None
            parent, name = link
            parts.append(name.decode("utf-8", "surrogateescape"))
            cur_ino = parent
        raise StoreError(errno.ELOOP, f"path of {ino} is too deep or loops")

    def symlink_target(self, ino: int) -> bytes | None:
        buf = self.txn.get(U64.pack(ino), db=self.ix.symlinks)
        return None if buf is None else bytes(buf)

    def remote(self, ino: int) -> RemoteInfo:
        buf = self.txn.get(U64.pack(ino), db=self.ix.remote)
        return RemoteInfo() if buf is None else remote_from_json(buf)

    def counter(self, name: bytes) -> int:
        buf = self.txn.get(name, db=self.ix.meta)
        return 0 if buf is None else U64.unpack(buf)[0]

    def keys(self, db) -> list[int]:
        """All u64 keys of a small index (dirty, orphans, pins)."""
        cur = self.txn.cursor(db=db)
        return [U64.unpack(k[:8])[0] for k in cur.iternext(values=False)]


class Writer(View):
    """A write transaction: accessors that keep the derived indexes and counters exact."""

    def __init__(self, index: "Index", txn: lmdb.Transaction):
        super().__init__(index, txn)
        self.d_used = 0
        self.d_dirty = 0
        self.after_commit: list = []     # callables run once the txn committed
        self.on_end: list = []           # callables run when it ends, committed or not
        self.on_abort: list = []         # a nested txn: run at once if it aborts (Index.nested)
        self.max_stamp = 0               # newest activity_ns stored by this txn
        self.map_full = False            # a nested txn hit MapFullError: grow after commit
        # ino -> rkey_entries of its stored object record, as read or written in this txn:
        # put_remote's callers read the record just before (and may change that object),
        # so the entries are taken at the read; a 10k-part record is not decoded twice.
        self._stored_rkeys: dict[int, set[bytes]] = {}

    def absorb(self, child: "Writer") -> None:
        """A nested txn of this one committed (into this one): take over what the outer
        commit must account for and run."""
        self.d_used += child.d_used
        self.d_dirty += child.d_dirty
        self.max_stamp = max(self.max_stamp, child.max_stamp)
        self.after_commit.extend(child.after_commit)
        self._stored_rkeys.update(child._stored_rkeys)

    def stamp(self, rec: Inode) -> None:
        """Record activity on `rec` now, on the store's clock (restarts its settle window)."""
        rec.activity_ns = self.ix.clock.now_ns()

    def put_inode(self, new: Inode | None, old: Inode | None) -> None:
        """Store `new` (None: delete `old`), maintaining dirty, lru and byte counters."""
        ix = self.ix
        ino = (new or old).ino
        key = U64.pack(ino)
        old_dirty = old is not None and old.is_dirty
        new_dirty = new is not None and new.is_dirty
        if old is not None and old.type == FileType.REG:
            self.d_used -= old.local_bytes
            if old_dirty:
                self.d_dirty -= old.local_bytes
        if new is not None and new.type == FileType.REG:
            self.d_used += new.local_bytes
            if new_dirty:
                self.d_dirty += new.local_bytes
        if old_dirty != new_dirty:
            if new_dirty:
                self.txn.put(key, b"", db=ix.dirty)
            else:
                self.txn.delete(key, db=ix.dirty)
        old_uns = old is not None and old.unsettled
        new_uns = new is not None and new.unsettled
        if old_uns != new_uns:
            if new_uns:
                self.txn.put(key, b"", db=ix.unsettled)
            else:
                self.txn.delete(key, db=ix.unsettled)
        old_ready = old is not None and old.ready
        new_ready = new is not None and new.ready
        if old_ready and (not new_ready or old.activity_ns != new.activity_ns):
            self.txn.delete(ready_key(old), db=ix.ready)
        if new_ready and (not old_ready or old.activity_ns != new.activity_ns):
            self.txn.put(ready_key(new), b"", db=ix.ready)
        if new is not None and new.activity_ns > self.max_stamp:
            self.max_stamp = new.activity_ns
        old_lru = old is not None and old.in_lru
        new_lru = new is not None and new.in_lru
        if old_lru and (not new_lru or old.lru_ns != new.lru_ns):
            self.txn.delete(U64x2.pack(old.lru_ns, ino), db=ix.lru)
        if new_lru and (not old_lru or old.lru_ns != new.lru_ns):
            self.txn.put(U64x2.pack(new.lru_ns, ino), b"", db=ix.lru)
        if new is None:
            self.txn.delete(key, db=ix.inodes)
        else:
            self.txn.put(key, new.pack(), db=ix.inodes)

    def purge_inode(self, rec: Inode) -> None:
        """Delete an inode and everything keyed by it (not its data file)."""
        key = U64.pack(rec.ino)
        self.put_inode(None, rec)
        extents.delete_all(self.txn, self.ix.extents, rec.ino)
        self.drop_remote(rec.ino)
        for db in (self.ix.symlinks, self.ix.pins):
            self.txn.delete(key, db=db)

    def next_id(self, name: bytes) -> int:
        value = self.counter(name) + 1
        self.txn.put(name, U64.pack(value), db=self.ix.meta)
        return value

    def put_dirent(self, parent: Inode, name: bytes, child: int, typ: int) -> int:
        """Add parent/name -> child with a fresh cookie (mutates parent.next_cookie)."""
        cookie = parent.next_cookie
        parent.next_cookie += 1
        self.txn.put(dirent_key(parent.ino, name), DIRENT.pack(child, cookie, typ),
                     db=self.ix.dirents)
        self.txn.put(U64x2.pack(parent.ino, cookie), name, db=self.ix.cookies)
        self.txn.put(link_key(child, parent.ino, name), b"", db=self.ix.links)
        return cookie

    def del_dirent(self, parent: int, name: bytes) -> None:
        child, cookie, _ = self.dirent(parent, name)
        self.txn.delete(dirent_key(parent, name), db=self.ix.dirents)
        self.txn.delete(U64x2.pack(parent, cookie), db=self.ix.cookies)
        self.txn.delete(link_key(child, parent, name), db=self.ix.links)

    def set_flag_key(self, db, ino: int, on: bool, value: bytes = b"") -> None:
        if on:
            self.txn.put(U64.pack(ino), value, db=db)
        else:
            self.txn.delete(U64.pack(ino), db=db)

    def remote(self, ino: int) -> RemoteInfo:
        r = super().remote(ino)
        self._stored_rkeys[ino] = rkey_entries(ino, r)     # before the caller may change r
        return r

    def put_remote(self, ino: int, remote: RemoteInfo) -> None:
        """The one writer of object records: rkeys follows every change (as put_inode's
        indexes follow the inode)."""
        self._rekey(ino, rkey_entries(ino, remote))
        self.txn.put(U64.pack(ino), remote_to_json(remote), db=self.ix.remote)

    def drop_remote(self, ino: int) -> None:
        self._rekey(ino, set())
        self.txn.delete(U64.pack(ino), db=self.ix.remote)

    def _rekey(self, ino: int, after: set[bytes]) -> None:
        before = self._stored_rkeys.get(ino)
        if before is None:
            before = rkey_entries(ino, super().remote(ino))
        for entry in before - after:
            self.txn.delete(entry, db=self.ix.rkeys)
        for entry in after - before:
            self.txn.put(entry, b"", db=self.ix.rkeys)
        self._stored_rkeys[ino] = after

    def queue_put(self, job: dict) -> int:
        job_id = self.next_id(b"next_job")
        self.txn.put(U64.pack(job_id), json.dumps(job).encode(), db=self.ix.queue)
        return job_id


class Index:
    """The LMDB environment: format check at open, read/write transactions, counters."""

    def __init__(self, path: str):
        self.path = path
        self._wlock = threading.RLock()
        self.lock = self._wlock              # serializes writers; callers may hold it around
                                             # a check and the txn that depends on it
        self.write_seq = 0               # bumped by every committed write txn
        self.txnid = 0                   # LMDB's id of the newest commit that wrote pages
        self.writing = False             # a write txn is open (its commit will sync)
        self.wanting = 0                 # threads waiting to open one
        self.txns_ended = 0
        # writing/wanting/txns_ended under _txn_state (C-level `with`: twice per write txn);
        # the Condition on it only for wait_txn_end, notified only when someone waits
        self._txn_state = threading.Lock()
        self._txn_ended = threading.Condition(self._txn_state)
        self._end_waiters = 0
        os.makedirs(path, exist_ok=True)
        existing = os.path.exists(os.path.join(path, "data.mdb"))
        map_size = int(os.environ.get(MAP_SIZE_ENV) or MAP_SIZE)
        if existing:
            map_size = max(map_size, 2 * os.path.getsize(os.path.join(path, "data.mdb")))
        try:
            self.env = lmdb.open(path, map_size=map_size, max_dbs=len(DB_NAMES) + 2,
                                 sync=True, metasync=False, readahead=False,
                                 max_readers=1024, subdir=True)
        except lmdb.Error as e:
            raise StoreError(errno.EINVAL, f"{path}: not a ckptgw store index ({e}); "
                             "refusing to touch it") from None
        try:
            self._check_format(existing)
        except BaseException:
            self.env.close()
            raise
        for name in DB_NAMES:
            setattr(self, name.decode(), self.env.open_db(name))
        self.orphans_done: list[int] = []   # orphans whose data file is gone: drop the key
        self._mdb_fd = os.open(os.path.join(path, "data.mdb"), os.O_RDWR | os.O_CLOEXEC)
        st = os.statvfs(path)
        self.headroom = min(max(st.f_blocks * st.f_frsize // 64, 1 << 20), 16 << 20)
        self._allocated = 0
        self._since_check = 0
        self.space_low = False
        self.ensure_headroom()
        with self.env.begin(db=self.meta) as txn:
            v = View(self, txn)
            self.used_bytes = v.counter(b"used")
            self.dirty_bytes = v.counter(b"dirty")
            # a new (or format 1) store starts its clock at the wall-clock time: see clock.py
            self.clock_high_water = v.counter(b"clock") or time.time_ns()
        self.txnid = self.env.info()["last_txnid"]
        self.clock = StoreClock(self.clock_high_water)
        if self._upgrade_from is not None:
            self._upgrade(self._upgrade_from)

    def _upgrade(self, frm: bytes) -> None:
        """An older format -> FORMAT in one transaction (a crash leaves the old format, and
        the upgrade runs again). Format 2 -> 3 rewrites nothing (short inode records read as
        rdev 0): its mark keeps an older ckptgw from opening a store that may hold special
        files."""
        with self.write() as w:
            restamped = self._restamp_dirty(w) if frm == FORMAT_V1 else 0
            keyed = self._build_rkeys(w)
            w.txn.put(b"format", FORMAT, db=self.meta)
        self.env.sync(True)
        log.info("store_upgraded", path=self.path, frm=frm.decode(), to=FORMAT.decode(),
                 restamped_dirty_files=restamped, keyed_records=keyed)

    def _restamp_dirty(self, w: "Writer") -> int:
        """Format 1 -> 2: the ready index was keyed by mtime; every dirty file (ready or
        unsettled) gets activity = now, so it waits one full settle window and no file is
        lost or skipped. Clean files keep their short records (activity 0) until next written."""
        todo = {U64x2.unpack(k)[1] for k in w.txn.cursor(db=self.ready).iternext(values=False)}
        todo.update(w.keys(self.unsettled))
        w.txn.drop(self.ready, delete=False)      # mtime keys
        for ino in sorted(todo):
            rec = w.inode(ino)
            if rec is not None:
                new = rec.copy()
                w.stamp(new)                      # put_inode re-keys it (and writes V2)
                w.put_inode(new, rec)
        return len(todo)

    def _build_rkeys(self, w: "Writer") -> int:
        """Format 3 -> 4: the rkeys entries of every object record."""
        w.txn.drop(self.rkeys, delete=False)
        n = 0
        for k, buf in w.txn.cursor(db=self.remote):
            for entry in rkey_entries(U64.unpack(k)[0], remote_from_json(buf)):
                w.txn.put(entry, b"", db=self.rkeys)
            n += 1
        return n

    def _check_format(self, existing: bool) -> None:
        self._upgrade_from = None
        with self.env.begin() as txn:
            names = [bytes(k) for k in txn.cursor().iternext(values=False)]
        if not names:
            with self.env.begin(write=True) as txn:
                meta = self.env.open_db(b"meta", txn=txn)
                txn.put(b"format", FORMAT, db=meta)
                txn.put(b"instance", os.urandom(16), db=meta)
            self.env.sync(True)
            log.info("store_created", path=self.path)
            return
        if b"meta" not in names:
            raise StoreError(errno.EINVAL, f"{self.path}: LMDB without a ckptgw meta record "
                             "(unknown format); refusing to touch it")
        with self.env.begin() as txn:
            meta = self.env.open_db(b"meta", txn=txn, create=False)
            fmt = txn.get(b"format", db=meta)
        if fmt is not None and bytes(fmt) in UPGRADABLE:
            self._upgrade_from = bytes(fmt)      # done once the databases are open
            return
        if fmt is None or bytes(fmt) != FORMAT:
            found = None if fmt is None else bytes(fmt).decode("ascii", "replace")
            raise StoreError(errno.EINVAL, f"{self.path}: store format {found!r} is not "
                             f"{FORMAT.decode()!r} (newer or unknown); refusing to open or "
                             "rewrite it")

    def read_inode(self, ino: int) -> Inode:
        with self.read() as v:
            return v.must_inode(ino)

    def read(self) -> View:
        """A short read-only view; use as `with ix.read() as v:`."""
        return _ReadCtx(self)

    @contextmanager
    def write(self):
        """One write transaction; counters and write_seq are updated only if it commits."""
        with self._txn_state:
            self.wanting += 1
        try:
            self._wlock.acquire()
        finally:
            with self._txn_state:
                self.wanting -= 1
        w = None
        try:
            txn = self.env.begin(write=True)
            self.writing = True
            w = Writer(self, txn)
            cleared = self.orphans_done[:]
            try:
                for ino in cleared:
                    txn.delete(U64.pack(ino), db=self.orphans)
                yield w
                hw = 0
                if w.max_stamp > self.clock_high_water:   # see clock.py
                    hw = w.max_stamp + HIGH_WATER_STEP
                    txn.put(b"clock", U64.pack(hw), db=self.meta)
                if w.d_used or w.d_dirty:
                    txn.put(b"used", U64.pack(self.used_bytes + w.d_used), db=self.meta)
                    txn.put(b"dirty", U64.pack(self.dirty_bytes + w.d_dirty), db=self.meta)
                txn.commit()
                self.txnid = self.env.info()["last_txnid"]    # unchanged if nothing written
            except lmdb.MapFullError:
                txn.abort()
                if self._grow_map():      # transient: the caller's client retries
                    raise StoreError(errno.EAGAIN, "store index map grown; retry") from None
                raise StoreError(errno.ENOSPC, "store index map is full") from None
            except lmdb.Error as e:
                txn.abort()
                if "No space left" in str(e) or self._disk_nearly_full():
                    log.error("index_nospace", path=self.path)
                    raise StoreError(errno.ENOSPC, f"store index: {e}") from None
                log.error("index_error", path=self.path, error=str(e))
                raise StoreError(errno.EIO, f"store index: {e}") from None
            except BaseException:
                txn.abort()
                raise
            self.used_bytes += w.d_used
            self.dirty_bytes += w.d_dirty
            if hw:
                self.clock_high_water = hw
            self.write_seq += 1
            del self.orphans_done[:len(cleared)]
            if w.map_full:
                self._grow_map()
            self._since_check += 1
            if self._since_check >= 16:
                self.ensure_headroom()
            for fn in w.after_commit:
                fn()
        finally:
            try:
                for fn in (w.on_end if w is not None else ()):
                    fn()
            finally:
                self._end_txn()
                self._wlock.release()

    @contextmanager
    def nested(self, outer: Writer):
        """A child txn of `outer` (LMDB nested transaction): its changes join `outer` if the
        body returns, and vanish - outer untouched - if it raises. Used by the namespace
        batch (batch.py): one op's error aborts only its own changes."""
        txn = self.env.begin(write=True, parent=outer.txn)
        w = Writer(self, txn)
        outer.on_end.append(lambda: [fn() for fn in w.on_end])   # even if it aborts
        try:
            try:
                yield w
                txn.commit()
            except BaseException:
                for fn in w.on_abort:      # before the outer txn can commit without it
                    fn()
                raise
        except lmdb.MapFullError:
            txn.abort()
            outer.map_full = True
            raise StoreError(errno.EAGAIN, "store index map full; grown after this batch, retry") from None
        except lmdb.Error as e:
            txn.abort()
            log.error("index_error", path=self.path, error=str(e))
            raise StoreError(errno.EIO, f"store index: {e}") from None
        except BaseException:
            txn.abort()
            raise
        outer.absorb(w)

    def _end_txn(self) -> None:
        with self._txn_state:
            self.writing = False
            self.txns_ended += 1
            if self._end_waiters:
                self._txn_ended.notify_all()

    def busy(self) -> bool:
        """A write txn is open or about to be (and not by the calling thread, which could
        not let it end): its commit will sync for us."""
        return (self.writing or self.wanting > 0) and not self._wlock._is_owned()

    def wait_txn_end(self) -> None:
        """While a write txn is open or wanted, wait until one has ended (committed, and so
        synced its data pages and every earlier meta page, or aborted)."""
        with self._txn_ended:
            seen = self.txns_ended
            self._end_waiters += 1
            try:
                # the timeout is only a safety net: after it the caller syncs by itself
                self._txn_ended.wait_for(lambda: self.txns_ended != seen or not self.busy(),
                                         timeout=1.0)
            finally:
                self._end_waiters -= 1

    def _grow_map(self) -> bool:
        """Double the map after MapFullError (LMDB allows it only with no txn active in
        this process; if a reader is active the next MapFullError tries again)."""
        size = self.env.info()["map_size"]
        try:
            self.env.set_mapsize(size * 2)
        except lmdb.Error as e:
            log.error("index_map_full", path=self.path, map_size=size, error=str(e))
            return False
        log.warning("index_map_grown", path=self.path, map_size=size * 2)
        return True

    def ensure_headroom(self) -> bool:
        """Keep `headroom` bytes allocated past LMDB's last page, so index commits do not
        meet a full disk: data writes hit ENOSPC first (they check `space_low`) while
        namespace ops, uploads and evictions - which free space - keep working."""
        self._since_check = 0
        end = (self.env.info()["last_pgno"] + 1) * self.env.stat()["psize"]
        if end + self.headroom // 2 <= self._allocated:
            return True
        try:
            os.posix_fallocate(self._mdb_fd, 0, end + self.headroom)
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                # the filesystem cannot preallocate: manage without headroom
                log.warning("index_no_preallocation", path=self.path, error=str(e))
                self._allocated = 1 << 62
                return True
            if not self.space_low:
                log.error("index_headroom_low", path=self.path, error=str(e))
            self.space_low = True
            return False
        if self.space_low:
            log.info("index_headroom_restored", path=self.path)
        self._allocated = end + self.headroom
        self.space_low = False
        return True

    def _disk_nearly_full(self) -> bool:
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize < self.headroom

    def instance_id(self) -> bytes:
        with self.env.begin(db=self.meta) as txn:
            return bytes(txn.get(b"instance"))

    def close(self) -> None:
        self.env.close()
        os.close(self._mdb_fd)


class _ReadCtx:
    __slots__ = ("ix", "txn")

    def __init__(self, ix: Index):
        self.ix = ix

    def __enter__(self) -> View:
        self.txn = self.ix.env.begin()
        return View(self.ix, self.txn)

    def __exit__(self, *exc):
        self.txn.abort()

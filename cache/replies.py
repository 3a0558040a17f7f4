"""Reply records: what a RENAME or REMOVE answered, kept on disk for the client that sent it
(issue 38), so that the op re-sent to a later server instance (its reply lost with the
session reply cache of the process that died) is recognised (nfsd/ops/replay.py).

A record is written by the op's own nested txn of the namespace batch (`submit_noted`): it
is durable exactly when the namespace change is, and never without it. Records are keyed
by the client's owner digest (the key of its client record, index.client_key) and a
per-client sequence; only a client with a client record gets them, it keeps only its newest
`keep` (nfsd passes its slot bound), and they go with its client record (`drop_replies`,
called by the client record's delete in the same txn): a record never outlives its
client's (check.py holds the store to that). The store does not interpret them beyond
that: which instance wrote one (`boot`), and whether it matches a re-sent op, is nfsd's.
"""
from __future__ import annotations

import errno
import struct
from dataclasses import dataclass

from .api import ChangeInfo, StoreError
from .index import Writer, client_key
from .keys import U64

RENAME = 1
REMOVE = 2
OPS = {"rename": RENAME, "remove": REMOVE}

_FORMAT = 1
# format, op, src dir, dst dir (0 for REMOVE), ino, 8-byte boot (server instance), 8-byte client
# verifier, two change_info4 (atomic, before, after; REMOVE's second is its first), name lengths
_HEAD = struct.Struct(">BBQQQ8s8sBQQBQQHH")
_KEY_LEN = 32 + U64.size


@dataclass(frozen=True, slots=True)
class ReplyNote:
    """Who asks for a record (nfsd's side): the client owner and verifier, the instance that
    answers (8 bytes), and how many records this client keeps."""
    owner: bytes
    verifier: bytes
    boot: bytes
    keep: int


@dataclass(frozen=True, slots=True)
class ReplyRecord:
    """One answered op: RENAME (src_dir, old) -> (dst_dir, new), or REMOVE of (src_dir, old)
    (dst_dir 0, new b""); `ino` the file it moved or removed; its answer `cinfo` (REMOVE's in
    both places); `seq` its place among the client's records."""
    seq: int
    op: int
    src_dir: int
    old: bytes
    dst_dir: int
    new: bytes
    ino: int
    boot: bytes
    verifier: bytes
    cinfo: tuple[ChangeInfo, ChangeInfo]

    def pack(self) -> bytes:
        a, b = self.cinfo
        return _HEAD.pack(_FORMAT, self.op, self.src_dir, self.dst_dir, self.ino,
                          _fixed(self.boot), _fixed(self.verifier),
                          a.atomic, a.before, a.after, b.atomic, b.before, b.after,
                          len(self.old), len(self.new)) + self.old + self.new

    @classmethod
    def unpack(cls, seq: int, buf) -> "ReplyRecord | None":
        """None for a record of an unknown format (ignored: never replayed)."""
        buf = bytes(buf)
        if len(buf) < _HEAD.size or buf[0] != _FORMAT:
            return None
        (_, op, sd, dd, ino, boot, verf, a1, b1, f1, a2, b2, f2, lo, ln) = _HEAD.unpack_from(buf)
        old = buf[_HEAD.size:_HEAD.size + lo]
        new = buf[_HEAD.size + lo:_HEAD.size + lo + ln]
        return cls(seq, op, sd, old, dd, new, ino, boot, verf,
                   (ChangeInfo(bool(a1), b1, f1), ChangeInfo(bool(a2), b2, f2)))


def _fixed(b: bytes) -> bytes:
    return bytes(b)[:8].ljust(8, b"\0")


def _records(txn, db, prefix: bytes):
    """(key, seq, value) of one client's records, oldest first."""
    cur = txn.cursor(db=db)
    if not cur.set_range(prefix):
        return
    for key, val in cur:
        if not key.startswith(prefix):
            return
        yield bytes(key), U64.unpack_from(key, 32)[0], val


def put_reply(w: Writer, db, note: ReplyNote, op: int, src_dir: int, old: bytes, dst_dir: int,
              new: bytes, ino: int, cinfo: tuple[ChangeInfo, ChangeInfo]) -> None:
    """Record one answer in `w`'s txn, if the client has a client record (records never
    outlive it: check.py holds the store to that); records older than the newest
    `note.keep` sequence numbers go (a consumed one leaves a gap: then fewer are kept).
    Two cursor steps, not a walk of the client's records: this runs in every RENAME's and
    REMOVE's commit, on the small-file save's path."""
    prefix = client_key(note.owner)
    if w.txn.get(prefix, db=w.ix.clients) is None:
        return
    cur = w.txn.cursor(db=db)
    # the client's newest key: one step back from the first key past its prefix (no seq
    # reaches 2**64 - 1), or the database's last key when none follows
    if cur.set_range(prefix + b"\xff" * U64.size):
        found = cur.prev()
    else:
        found = cur.last()
    key = bytes(cur.key()) if found else b""
    seq = U64.unpack_from(key, 32)[0] + 1 if key.startswith(prefix) else 0
    rec = ReplyRecord(seq, op, src_dir, bytes(old), dst_dir, bytes(new), ino, note.boot,
                      note.verifier, cinfo)
    w.txn.put(prefix + U64.pack(seq), rec.pack(), db=db)
    keep_from = seq + 1 - max(1, note.keep)
    while keep_from > 0 and cur.set_range(prefix):
        key = bytes(cur.key())
        if not key.startswith(prefix) or U64.unpack_from(key, 32)[0] >= keep_from:
            break
        cur.delete()


def drop_replies(w: Writer, db, owner: bytes) -> None:
    """Every record of `owner` goes (its client record is deleted in the same txn)."""
    for key in [k for k, _, _ in _records(w.txn, db, client_key(owner))]:
        w.txn.delete(key, db=db)


class ReplyRecords:
    """The Store's methods for reply records (state: `ix`, `batch`, `ns`, set in Store._open)."""

    def submit_noted(self, op: str, note: ReplyNote, *args, loop=None):
        """submit(op, *args) of a "rename" or "remove" that also records its answer for
        `note`'s client, in the op's own txn: durable with it, absent if it failed."""
        if op not in OPS:
            raise ValueError(f"no reply record for {op!r}")
        return self.batch.submit(self._ns_noted, op, note, args, loop=loop)

    def _ns_noted(self, w: Writer, op: str, note: ReplyNote, args: tuple):
        sp, sn, dp, dn = args if op == "rename" else (*args, 0, b"")
        # The file the op moves or removes, for its record, looked up before the op (a
        # REMOVE's entry is gone after it). The op looks the name up again, one more get in
        # the same txn on the same pages: cheaper than widening cache/namespace.py's
        # rename, remove, unlink and rmdir to take the entry or return its inode.
        found = w.dirent(sp, sn)
        if op == "rename":
            result = cinfo = self._ns_rename(w, sp, sn, dp, dn)
        else:
            result = self._ns_remove(w, sp, sn)
            cinfo = (result, result)
        if found is None:       # the op succeeded, so it cannot be absent
            raise StoreError(errno.EIO, "reply record of an absent name")
        put_reply(w, self.ix.replies, note, OPS[op], sp, sn, dp, dn, found[0], cinfo)
        return result

    def reply_records(self, owner: bytes) -> list[ReplyRecord]:
        """The records kept for client `owner`, oldest first."""
        with self.ix.read() as v:
            out = [ReplyRecord.unpack(seq, val)
                   for _, seq, val in _records(v.txn, self.ix.replies, client_key(owner))]
        return [r for r in out if r is not None]

    def submit_reply_consumed(self, owner: bytes, seq: int, loop=None):
        """Delete one record in the next batch; a Future set at its commit (not waited to be
        durable: a record that comes back after a crash is replayed once more, harmlessly)."""
        key = client_key(owner) + U64.pack(seq)
        return self.batch.submit(_delete, self.ix.replies, key, durable=False, loop=loop)


def _delete(w: Writer, db, key: bytes) -> None:
    w.txn.delete(key, db=db)

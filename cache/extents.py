"""Per-file extent map in the `extents` DB: key ino+offset -> (length, state).

Extents of one file never overlap and adjacent extents of the same state are merged.
States stored: DIRTY (written locally since the last upload), CLEAN (local and in S3),
ABSENT (in S3, not local). Any range of [0, size) without an extent is a local hole
(reads as zeros; part of the file's local content). "Local bytes" = DIRTY + CLEAN.
"""
from __future__ import annotations

import struct

from .api import DataState, Extent
from .keys import U64, U64x2

EXT = struct.Struct("<QB")        # length, state
ABSENT = DataState.ABSENT


def _key(ino: int, off: int) -> bytes:
    return U64x2.pack(ino, off)


def _overlapping(cur, ino: int, a: int, b: int, adjacent: bool):
    """Extents (start, end, state) of `ino` overlapping [a, b) (or touching it if adjacent)."""
    prefix = U64.pack(ino)
    out = []
    found = cur.set_range(_key(ino, a))
    moved = cur.prev() if found else cur.last()
    if moved and cur.key()[:8] == prefix:
        s = U64x2.unpack(cur.key())[1]
        length, st = EXT.unpack(cur.value())
        if s + length > a or (adjacent and s + length == a):
            out.append((s, s + length, st))
    if cur.set_range(_key(ino, a)):
        while True:
            key = cur.key()
            if key[:8] != prefix:
                break
            s = U64x2.unpack(key)[1]
            if s > b or (s == b and not adjacent):
                break
            length, st = EXT.unpack(cur.value())
            out.append((s, s + length, st))
            if not cur.next():
                break
    return out


def set_range(txn, db, ino: int, a: int, b: int, state: int) -> int:
    """Give [a, b) `state`; returns the change in local bytes (DIRTY/CLEAN)."""
    if b <= a:
        return 0
    cur = txn.cursor(db=db)
    items = _overlapping(cur, ino, a, b, adjacent=True)
    new_s, new_e = a, b
    removed_local = 0
    pieces = []
    for s, e, st in items:
        ov = min(e, b) - max(s, a)
        if ov > 0 and st != ABSENT:
            removed_local += ov
        if st == state:
            new_s, new_e = min(new_s, s), max(new_e, e)
        else:
            if s < a:
                pieces.append((s, a, st))
            if e > b:
                pieces.append((b, e, st))
        txn.delete(_key(ino, s), db=db)
    txn.put(_key(ino, new_s), EXT.pack(new_e - new_s, state), db=db)
    for s, e, st in pieces:
        txn.put(_key(ino, s), EXT.pack(e - s, st), db=db)
    return (0 if state == ABSENT else b - a) - removed_local


def clear_range(txn, db, ino: int, a: int, b: int) -> int:
    """Make [a, b) a local hole (no extent: reads as zeros); returns the change in local
    bytes (<= 0)."""
    if b <= a:
        return 0
    removed = 0
    for s, e, st in _overlapping(txn.cursor(db=db), ino, a, b, adjacent=False):
        txn.delete(_key(ino, s), db=db)
        if s < a:
            txn.put(_key(ino, s), EXT.pack(a - s, st), db=db)
        if e > b:
            txn.put(_key(ino, b), EXT.pack(e - b, st), db=db)
        if st != ABSENT:
            removed += min(e, b) - max(s, a)
    return -removed


def runs(txn, db, ino: int, a: int, b: int) -> list[tuple[int, int, int | None]]:
    """[a, b) cut into (start, end, state) pieces in order; state None = a local hole."""
    out = []
    pos = a
    for s, e, st in _overlapping(txn.cursor(db=db), ino, a, b, adjacent=False):
        s, e = max(s, a), min(e, b)
        if s > pos:
            out.append((pos, s, None))
        out.append((s, e, st))
        pos = e
    if pos < b:
        out.append((pos, b, None))
    return out


def present_bytes(txn, db, ino: int, a: int, b: int) -> int:
    """Local bytes (DIRTY/CLEAN) already stored inside [a, b)."""
    total = 0
    for s, e, st in _overlapping(txn.cursor(db=db), ino, a, b, adjacent=False):
        if st != ABSENT:
            total += min(e, b) - max(s, a)
    return total


def absent_ranges(txn, db, ino: int, a: int, b: int) -> list[tuple[int, int]]:
    """[(offset, length)] of ABSENT bytes inside [a, b)."""
    out = []
    for s, e, st in _overlapping(txn.cursor(db=db), ino, a, b, adjacent=False):
        if st == ABSENT:
            lo, hi = max(s, a), min(e, b)
            out.append((lo, hi - lo))
    return out


def truncate(txn, db, ino: int, size: int) -> int:
    """Drop everything at or past `size`; returns the change in local bytes (<= 0)."""
    cur = txn.cursor(db=db)
    removed = 0
    for s, e, st in _overlapping(cur, ino, size, 1 << 64, adjacent=False):
        txn.delete(_key(ino, s), db=db)
        if s < size:
            txn.put(_key(ino, s), EXT.pack(size - s, st), db=db)
        if st != ABSENT:
            removed += e - max(s, size)
    return -removed


def listing(txn, db, ino: int) -> list[Extent]:
    cur = txn.cursor(db=db)
    prefix = U64.pack(ino)
    out = []
    if cur.set_range(prefix):
        for key, val in cur:
            if key[:8] != prefix:
                break
            length, st = EXT.unpack(val)
            out.append(Extent(U64x2.unpack(key)[1], length, DataState(st)))
    return out


def replace_all(txn, db, ino: int, extents: list[tuple[int, int, int]]) -> None:
    """Rewrite the map as `extents` [(offset, length, state)], merging neighbours."""
    delete_all(txn, db, ino)
    merged: list[list[int]] = []
    for off, length, st in sorted(extents):
        if length <= 0:
            continue
        if merged and merged[-1][2] == st and merged[-1][0] + merged[-1][1] == off:
            merged[-1][1] += length
        else:
            merged.append([off, length, st])
    for off, length, st in merged:
        txn.put(_key(ino, off), EXT.pack(length, st), db=db)


def relabel(txn, db, ino: int, frm: int, to: int) -> None:
    """Change every `frm` extent to `to` (e.g. DIRTY -> CLEAN once uploaded)."""
    exts = listing(txn, db, ino)
    if any(e.state == frm for e in exts):
        replace_all(txn, db, ino, [(e.offset, e.length, to if e.state == frm else e.state)
                                   for e in exts])


def delete_all(txn, db, ino: int) -> None:
    cur = txn.cursor(db=db)
    prefix = U64.pack(ino)
    if cur.set_range(prefix):
        while cur.key()[:8] == prefix:
            if not cur.delete():
                break

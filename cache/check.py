"""Consistency checker: every index against the others and against the extent files.

A full scan (admin CLI and tests only). Returns human-readable problems; [] = consistent.
"""
from __future__ import annotations

from . import extents
from .api import DEVICE_TYPES, DataState, FileType, ROOT_INO
from .index import DIRENT, F_PINNED, F_UNCOMMITTED, Inode, remote_from_json, rkey_entries
from .keys import U64, U64x2


# A live store can show a data file longer than its size for an instant: a write answered
# before its index record (store.py I5) is pwritten before it joins _pending, and its record
# can land (and leave _pending) after this scan's snapshot. And a data file with no inode: the
# files are listed after the snapshot is taken, so a file created in between has an ino that
# snapshot had not given out yet; the next scan's snapshot has it. A real one is there in
# every scan.
IN_FLIGHT_SCANS = 3


def check(store) -> list[str]:
    unborn: set[int] = set()
    for _ in range(IN_FLIGHT_SCANS):
        problems, in_flight, unborn = _scan(store, unborn)
        if not in_flight:
            break
    return problems


def _scan(store, unborn_before: set[int]) -> tuple[list[str], bool, set[int]]:
    """(problems, whether one of them may be a write in flight: scan again to tell, the data
    files without an inode whose ino this snapshot had not given out). `unborn_before`: the
    previous scan's: one still unborn now is a stray, not a create in flight."""
    ix, data = store.ix, store.data
    problems: list[str] = []
    p = problems.append
    in_flight = False
    with ix.read() as v:
        txn = v.txn
        inodes = {U64.unpack(k)[0]: Inode.unpack(U64.unpack(k)[0], val)
                  for k, val in txn.cursor(db=ix.inodes)}
        orphans = set(v.keys(ix.orphans))
        dirty = set(v.keys(ix.dirty))
        unsettled = set(v.keys(ix.unsettled))
        ready = {U64x2.unpack(k)[1]: U64x2.unpack(k)[0]
                 for k in txn.cursor(db=ix.ready).iternext(values=False)}
        pins = set(v.keys(ix.pins))
        lru = {U64x2.unpack(k)[1]: U64x2.unpack(k)[0]
               for k in txn.cursor(db=ix.lru).iternext(values=False)}
        links: dict[int, list[tuple[int, bytes]]] = {}
        for k in txn.cursor(db=ix.links).iternext(values=False):
            ino, parent = U64x2.unpack(k[:16])
            links.setdefault(ino, []).append((parent, bytes(k[16:])))
        children: dict[int, int] = {}
        subdirs: dict[int, int] = {}
        seen_links = set()
        for k, val in txn.cursor(db=ix.dirents):
            parent, name = U64.unpack(k[:8])[0], bytes(k[8:])
            child, cookie, typ = DIRENT.unpack(val)
            seen_links.add((child, parent, name))
            children[parent] = children.get(parent, 0) + 1
            if parent not in inodes or inodes[parent].type != FileType.DIR:
                p(f"dirent {parent}/{name!r}: parent is not a live directory")
            rec = inodes.get(child)
            if rec is None:
                p(f"dirent {parent}/{name!r} -> {child}: no such inode")
                continue
            if rec.type != typ:
                p(f"dirent {parent}/{name!r}: type {typ} != inode type {rec.type}")
            if typ == FileType.DIR:
                subdirs[parent] = subdirs.get(parent, 0) + 1
                if rec.parent != parent:
                    p(f"directory {child} has parent {rec.parent}, listed in {parent}")
            got = txn.get(U64x2.pack(parent, cookie), db=ix.cookies)
            if got is None or bytes(got) != name:
                p(f"dirent {parent}/{name!r}: cookie {cookie} does not map back")
            if parent in inodes and cookie >= inodes[parent].next_cookie:
                p(f"dirent {parent}/{name!r}: cookie {cookie} >= next_cookie")
        ncookies = txn.stat(ix.cookies)["entries"]
        if ncookies != sum(children.values()):
            p(f"{ncookies} cookies for {sum(children.values())} dirents")
        for ino, lst in links.items():
            for parent, name in lst:
                if (ino, parent, name) not in seen_links:
                    p(f"link {ino} <- {parent}/{name!r} without a dirent")
        if ROOT_INO not in inodes:
            p("root inode missing")
        used = dirty_bytes = 0
        # the data files now, the index as of the snapshot: a file created since (a live
        # gateway's `ckptgw check` while clients save) has an ino the snapshot never gave out
        newest_ino = v.counter(b"next_ino")
        unborn: set[int] = set()
        data_inos = set(data.all_inos())
        types = {int(t) for t in FileType}
        for ino, rec in inodes.items():
            nl = len(links.get(ino, ()))
            if rec.type not in types:
                p(f"inode {ino}: unknown type {rec.type}")
            elif (rec.rdev_major or rec.rdev_minor) and rec.type not in DEVICE_TYPES:
                p(f"inode {ino}: rdev {rec.rdev_major},{rec.rdev_minor} on a non-device")
            if rec.type == FileType.DIR:
                want = 2 + subdirs.get(ino, 0)
                if rec.nlink != want:
                    p(f"directory {ino}: nlink {rec.nlink}, expected {want}")
                if ino != ROOT_INO and nl != 1:
                    p(f"directory {ino}: {nl} links")
            elif rec.nlink != nl:
                p(f"inode {ino}: nlink {rec.nlink} but {nl} directory entries")
            if rec.nlink == 0 and ino not in orphans:
                p(f"inode {ino}: unlinked but not in the orphan list")
            if rec.is_dirty != (ino in dirty):
                p(f"inode {ino}: dirty index disagrees with state {rec.state}")
            if rec.unsettled != (ino in unsettled):
                p(f"inode {ino}: unsettled index disagrees")
            if rec.ready != (ino in ready) or (ino in ready and ready[ino] != rec.activity_ns):
                p(f"inode {ino}: ready index disagrees")
            if rec.in_lru != (ino in lru) or (ino in lru and lru[ino] != rec.lru_ns):
                p(f"inode {ino}: lru index disagrees")
            if bool(rec.flags & F_PINNED) != (ino in pins):
                p(f"inode {ino}: pin flag disagrees with the pins index")
            if rec.type != FileType.REG:
                if ino in data_inos:
                    p(f"inode {ino}: non-file with a data file")
                continue
            exts = extents.listing(txn, ix.extents, ino)
            pos, local = 0, 0
            for e in exts:
                if e.offset < pos:
                    p(f"inode {ino}: overlapping extents at {e.offset}")
                if e.length <= 0:
                    p(f"inode {ino}: empty extent at {e.offset}")
                pos = e.offset + e.length
                if e.state != DataState.ABSENT:
                    local += e.length
            if pos > rec.size:
                p(f"inode {ino}: extents reach {pos} past size {rec.size}")
            if local != rec.local_bytes:
                p(f"inode {ino}: local_bytes {rec.local_bytes} != extents {local}")
            used += rec.local_bytes
            if rec.is_dirty:
                dirty_bytes += rec.local_bytes
            if rec.committed_size > rec.size:
                p(f"inode {ino}: committed size {rec.committed_size} > size {rec.size}")
            length = data.length(ino)
            if rec.state == DataState.ABSENT and rec.local_bytes == 0 and length:
                p(f"inode {ino}: evicted but its data file still holds {length} bytes")
            # a write answered before its index record (store.py I5) is in the file already
            if length is not None and length > rec.size:
                store._hook("check.live_size", ino)
                if length > store._live_size(ino, rec.size):
                    p(f"inode {ino}: data file {length} bytes, longer than size {rec.size}")
                    in_flight = True
            if (rec.state == DataState.CLEAN and not store._is_open(ino)
                    and rec.flags & F_UNCOMMITTED):
                p(f"inode {ino}: clean but flagged uncommitted")
        for ino in data_inos - set(inodes):
            if ino in orphans:
                continue
            if ino > newest_ino and ino not in unborn_before:
                unborn.add(ino)            # created after the snapshot, or a stray: scan again
                in_flight = True
                continue
            p(f"data file {ino} has no inode" if ino >= 0 else "stray data file name")
        # the counters of this snapshot, not the live ones: a running gateway (`ckptgw
        # check` over the admin socket) commits while the walk above runs
        used_counter, dirty_counter = v.counter(b"used"), v.counter(b"dirty")
        if used != used_counter:
            p(f"used counter {used_counter} != sum of local bytes {used}")
        if dirty_bytes != dirty_counter:
            p(f"dirty counter {dirty_counter} != sum of dirty bytes {dirty_bytes}")
        want_rkeys = set()
        for k, buf in txn.cursor(db=ix.remote):
            want_rkeys |= rkey_entries(U64.unpack(k)[0], remote_from_json(buf))
        have_rkeys = {bytes(k) for k in txn.cursor(db=ix.rkeys).iternext(values=False)}
        for entry in sorted(want_rkeys - have_rkeys)[:10]:
            p(f"object record of inode {U64.unpack(entry[-8:])[0]}: key {entry[:-8]!r} missing from rkeys")
        for entry in sorted(have_rkeys - want_rkeys)[:10]:
            p(f"rkeys entry {entry[:-8]!r} -> {U64.unpack(entry[-8:])[0]}: no object record names it")
        for k in txn.cursor(db=ix.extents).iternext(values=False):
            ino = U64x2.unpack(k)[0]
            if ino not in inodes:
                p(f"extents of missing inode {ino}")
                break
        # reply records (replies.py) live only beside their client's record
        for k in txn.cursor(db=ix.replies).iternext(values=False):
            if txn.get(bytes(k[:32]), db=ix.clients) is None:
                p(f"reply record {bytes(k[:32]).hex()[:16]}/{U64.unpack_from(k, 32)[0]} "
                  "of a client without a client record")
                break
    return problems, in_flight, unborn

"""Stateful property test: the store against a plain in-memory model.

Random sequences of create, mkdir, write at random offsets, truncate, punch hole
(deallocate), allocate, copy_range (COPY/CLONE), rename (files and
directories, over existing targets), link, unlink/rmdir, open/close, commit, upload
(mark_uploaded), evict, orderly reopen and crash-reopen; reads fill evicted ranges from
the model's "S3" copy (read-through); after every step the whole tree is compared (readdir order and
cookies, attributes, every byte) and check() must find nothing.

Writes answered before their index record (cache/store.py I5, `Store.write_nowait`, what an
UNSTABLE WRITE does on the event loop): the model holds lazy batch ops back (LAZY_DELAY of an
hour), so such a write's record stays queued until an op that is waited for (a namespace op,
a commit, an upload's record), a truncate or read-through fill (which kick the batch), a
reopen, or is lost by a crash (recovery cuts to the committed size: the model drops the
same bytes). Meanwhile every step's view must already show it (sizes, bytes, readdir
attributes), `settle` checks that the attributes shown while pending are exactly those the
records write, and the change attribute never goes back except across a crash.
Set CKPTGW_LONG=1 for many more examples.
"""
from __future__ import annotations

import errno
import os
import shutil
import tempfile

from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from cache import batch as batch_module
from cache.api import DataState, FileType, RemoteInfo, ROOT_INO, SetAttr, StoreError
from cache.index import F_UNCOMMITTED
from cache.store import Store

from tests.cache.storehelp import crash

LONG = os.environ.get("CKPTGW_LONG") == "1"
# fsync on tmpfs is free: the model checks semantics, not the disk
SCRATCH = "/dev/shm" if os.path.isdir("/dev/shm") else None
NAMES = st.sampled_from([b"a", b"b", b"c", b"d"])
OFFSETS = st.one_of(st.integers(0, 9000), st.sampled_from([4095, 4096, 65536, 200_000]))


class MFile:
    def __init__(self, ino):
        self.ino = ino
        self.data = bytearray()
        self.nlink = 1
        self.committed = 0        # size a commit/truncate made durable
        self.opens = 0
        self.remote = None        # the bytes "in S3" after an upload


class MDir:
    def __init__(self, ino, parent):
        self.ino = ino
        self.parent = parent      # MDir (root: None)
        self.entries: dict[bytes, object] = {}   # insertion order == cookie order


class StoreModel(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="ckptgw-model-", dir=SCRATCH)
        self.lazy_delay = batch_module.LAZY_DELAY
        batch_module.LAZY_DELAY = 3600.0    # lazy records wait for an op that is waited for
        self.store = Store.open(self.dir)
        self.root = MDir(ROOT_INO, None)
        self.orphans: list[MFile] = []      # unlinked but open
        self.changes: dict[int, int] = {}   # ino -> the highest change attribute seen

    def teardown(self):
        try:
            if not self.store._closed:
                self.store.close()
        finally:
            batch_module.LAZY_DELAY = self.lazy_delay
            shutil.rmtree(self.dir, ignore_errors=True)

    # ---- model helpers -------------------------------------------------------------
    def dirs(self):
        out, todo = [], [self.root]
        while todo:
            d = todo.pop()
            out.append(d)
            todo.extend(e for e in d.entries.values() if isinstance(e, MDir))
        return out

    def files(self):
        seen = {}
        for d in self.dirs():
            for e in d.entries.values():
                if isinstance(e, MFile):
                    seen[id(e)] = e
        return list(seen.values())

    def expect_error(self, code, fn, *args):
        try:
            fn(*args)
        except StoreError as e:
            assert e.errno == code, (fn.__name__, args, e)
        else:
            raise AssertionError(f"{fn.__name__}{args} did not fail with {code}")

    def drop_link(self, f: MFile):
        f.nlink -= 1
        if f.nlink == 0 and f.opens:
            self.orphans.append(f)

    # ---- rules ------------------------------------------------------------------------
    @rule(data=st.data(), name=NAMES)
    def create(self, data, name):
        d = data.draw(st.sampled_from(self.dirs()))
        cur = d.entries.get(name)
        if isinstance(cur, MDir):
            self.expect_error(errno.EISDIR, self.store.create, d.ino, name, 0o644, 0, 0)
            return
        a, _, created = self.store.create(d.ino, name, 0o644, 0, 0)
        assert created == (cur is None)
        if cur is None:
            d.entries[name] = MFile(a.ino)
        else:
            assert a.ino == cur.ino

    @rule(data=st.data(), name=NAMES)
    def mkdir(self, data, name):
        d = data.draw(st.sampled_from(self.dirs()))
        if name in d.entries:
            self.expect_error(errno.EEXIST, self.store.mkdir, d.ino, name, 0o755, 0, 0)
            return
        a, _ = self.store.mkdir(d.ino, name, 0o755, 0, 0)
        d.entries[name] = MDir(a.ino, d)

    @precondition(lambda self: self.files())
    @rule(data=st.data(), offset=OFFSETS, payload=st.binary(min_size=1, max_size=5000),
          how=st.sampled_from(["nowait", "nowait", "unstable", "stable"]))
    def write(self, data, offset, payload, how):
        """UNSTABLE (nowait: as nfsd's WRITE does, on the event loop with its record left
        queued when it can, else write()), or FILE_SYNC (stable): durable on return with
        every byte before it."""
        stable = how == "stable"
        f = data.draw(st.sampled_from(self.files() + self.orphans))
        if how != "nowait" or not self.store.write_nowait(f.ino, offset, payload):
            (self.store.write_stable if stable else self.store.write)(f.ino, offset, payload)
        if len(f.data) < offset:
            f.data.extend(bytes(offset - len(f.data)))
        f.data[offset:offset + len(payload)] = payload
        if stable:
            f.committed = len(f.data)

    @precondition(lambda self: self.files())
    @rule(data=st.data(), size=st.integers(0, 12000))
    def truncate(self, data, size):
        f = data.draw(st.sampled_from(self.files()))
        self.store.setattr(f.ino, SetAttr(size=size))
        if size < len(f.data):
            del f.data[size:]
        else:
            f.data.extend(bytes(size - len(f.data)))
        f.committed = size

    @precondition(lambda self: self.files())
    @rule(data=st.data(), offset=OFFSETS, length=st.integers(1, 12000))
    def deallocate(self, data, offset, length):
        """Punch a hole (NFSv4.2 DEALLOCATE): zeros below the size, the size stays."""
        f = data.draw(st.sampled_from(self.files()))
        self.store.deallocate(f.ino, offset, length)
        end = min(offset + length, len(f.data))
        if end > offset:
            f.data[offset:end] = bytes(end - offset)

    @precondition(lambda self: self.files())
    @rule(data=st.data(), offset=OFFSETS, length=st.integers(1, 12000))
    def allocate(self, data, offset, length):
        """NFSv4.2 ALLOCATE: bytes unchanged; past the end, a truncate up."""
        f = data.draw(st.sampled_from(self.files()))
        self.store.allocate(f.ino, offset, length)
        if offset + length > len(f.data):
            f.data.extend(bytes(offset + length - len(f.data)))
            f.committed = len(f.data)

    @precondition(lambda self: self.files())
    @rule(data=st.data(), dst_off=OFFSETS)
    def copy_range(self, data, dst_off):
        """NFSv4.2 COPY/CLONE: like a write of the source's bytes (read-through first)."""
        src = data.draw(st.sampled_from(self.files()))
        dst = data.draw(st.sampled_from(self.files()))
        src_off = data.draw(st.integers(0, len(src.data)))
        count = data.draw(st.integers(0, len(src.data) - src_off))
        if src is dst and src_off < dst_off + count and dst_off < src_off + count:
            self.expect_error(errno.EINVAL, self.store.copy_range, src.ino, dst.ino, src_off,
                              dst_off, count)
            return
        for _ in range(100):
            try:
                self.store.copy_range(src.ino, dst.ino, src_off, dst_off, count)
                break
            except StoreError as e:
                assert e.errno == errno.EAGAIN and e.missing and src.remote is not None
                for off, length in e.missing:
                    self.store.fill(src.ino, off, src.remote[off:off + length])
        if count == 0:
            return
        piece = bytes(src.data[src_off:src_off + count])
        if len(dst.data) < dst_off:
            dst.data.extend(bytes(dst_off - len(dst.data)))
        dst.data[dst_off:dst_off + count] = piece

    @precondition(lambda self: self.files())
    @rule(data=st.data())
    def commit(self, data):
        f = data.draw(st.sampled_from(self.files()))
        self.store.commit(f.ino)
        f.committed = len(f.data)

    @rule(data=st.data(), sname=NAMES, dname=NAMES)
    def rename(self, data, sname, dname):
        sd = data.draw(st.sampled_from(self.dirs()))
        dd = data.draw(st.sampled_from(self.dirs()))
        src, dst = sd.entries.get(sname), dd.entries.get(dname)
        code = None
        if src is None:
            code = errno.ENOENT
        elif (sd is dd and sname == dname) or src is dst:
            self.store.rename(sd.ino, sname, dd.ino, dname)
            return
        elif dst is not None and isinstance(src, MDir) and not isinstance(dst, MDir):
            code = errno.ENOTDIR
        elif dst is not None and isinstance(src, MDir) and dst.entries:
            code = errno.ENOTEMPTY
        elif dst is not None and not isinstance(src, MDir) and isinstance(dst, MDir):
            code = errno.EISDIR
        elif isinstance(src, MDir) and sd is not dd:
            x = dd
            while x is not None:
                if x is src:
                    code = errno.EINVAL
                x = x.parent
        if code is not None:
            self.expect_error(code, self.store.rename, sd.ino, sname, dd.ino, dname)
            return
        self.store.rename(sd.ino, sname, dd.ino, dname)
        if dst is not None:
            del dd.entries[dname]
            if isinstance(dst, MFile):
                self.drop_link(dst)
        del sd.entries[sname]
        dd.entries[dname] = src
        if isinstance(src, MDir):
            src.parent = dd

    @precondition(lambda self: self.files())
    @rule(data=st.data(), name=NAMES)
    def link(self, data, name):
        f = data.draw(st.sampled_from(self.files()))
        d = data.draw(st.sampled_from(self.dirs()))
        if name in d.entries:
            self.expect_error(errno.EEXIST, self.store.link, f.ino, d.ino, name)
            return
        self.store.link(f.ino, d.ino, name)
        d.entries[name] = f
        f.nlink += 1

    @rule(data=st.data(), name=NAMES)
    def remove(self, data, name):
        d = data.draw(st.sampled_from(self.dirs()))
        e = d.entries.get(name)
        if e is None:
            self.expect_error(errno.ENOENT, self.store.remove, d.ino, name)
        elif isinstance(e, MDir) and e.entries:
            self.expect_error(errno.ENOTEMPTY, self.store.remove, d.ino, name)
        else:
            self.store.remove(d.ino, name)
            del d.entries[name]
            if isinstance(e, MFile):
                self.drop_link(e)

    @precondition(lambda self: self.files())
    @rule(data=st.data())
    def open_file(self, data):
        f = data.draw(st.sampled_from(self.files()))
        self.store.open_file(f.ino, write=True)
        f.opens += 1

    @precondition(lambda self: any(f.opens for f in self.files() + self.orphans))
    @rule(data=st.data())
    def close_file(self, data):
        f = data.draw(st.sampled_from([f for f in self.files() + self.orphans if f.opens]))
        self.store.close_file(f.ino, write=True)
        f.opens -= 1
        if f.opens == 0 and f in self.orphans:
            self.orphans.remove(f)
            self.expect_error(errno.ESTALE, self.store.getattr, f.ino)

    @precondition(lambda self: self.files())
    @rule(data=st.data())
    def upload(self, data):
        """What the uploader does: commit, read the local bytes, mark uploaded."""
        f = data.draw(st.sampled_from(self.files()))
        s = self.store
        s.commit(f.ino)
        f.committed = len(f.data)
        # a commit keeps F_UNCOMMITTED only while a writer has the file open (the real
        # uploader takes only files no writer has open)
        flagged = bool(s.ix.read_inode(f.ino).flags & F_UNCOMMITTED)
        assert f.opens or not flagged
        change = s.getattr(f.ino).change
        assert s.set_data_state(f.ino, DataState.UPLOADING, change)
        body = self.read_through(f)
        clean = s.mark_uploaded(f.ino, RemoteInfo(key="k", uploaded_change=change))
        f.remote = body
        assert clean == (not flagged)       # maybe-uncommitted bytes are never CLEAN
        assert s.getattr(f.ino).data_state == (DataState.CLEAN if clean else DataState.DIRTY)

    @precondition(lambda self: self.files())
    @rule(data=st.data())
    def evict(self, data):
        f = data.draw(st.sampled_from(self.files()))
        a = self.store.getattr(f.ino)
        freed = self.store.evict(f.ino)
        if a.data_state == DataState.CLEAN and not f.opens:
            assert freed == a.space_used
            assert self.store.getattr(f.ino).space_used == 0
        else:
            assert freed == 0

    def read_through(self, f: MFile) -> bytes:
        """Read the whole file, filling ABSENT ranges from the model's S3 copy."""
        for _ in range(100):
            try:
                got, eof = self.store.read(f.ino, 0, len(f.data) + 10)
                assert eof
                return bytes(got)
            except StoreError as e:
                assert e.errno == errno.EAGAIN and e.missing and f.remote is not None
                for off, length in e.missing:
                    self.store.fill(f.ino, off, f.remote[off:off + length])
        raise AssertionError("read-through never completed")

    @rule()
    def reopen(self):
        self.store.close()
        self.store = Store.open(self.dir)
        self.forget_opens()
        for f in self.files():
            f.committed = len(f.data)

    @rule()
    def settle(self):
        """Let every queued lazy op land: the attributes shown while the writes' records
        were queued are exactly what the records write (atime aside: an LRU stamp)."""
        s = self.store
        files = self.files() + self.orphans
        before = {f.ino: s.getattr(f.ino) for f in files}
        s.batch.applied()
        assert not s._pending and not s._pending_growth
        assert not s._inflight, s._inflight
        for f in files:
            a, b = before[f.ino], s.getattr(f.ino)
            assert (a.size, a.mtime_ns, a.ctime_ns, a.change, a.data_seq, a.data_state) == \
                (b.size, b.mtime_ns, b.ctime_ns, b.change, b.data_seq, b.data_state), (a, b)

    @rule()
    def crash_and_reopen(self):
        self.changes.clear()                  # unstable writes' changes are lost with them
        crash(self.store)
        self.store = Store.open(self.dir)
        self.forget_opens()
        for f in self.files():                # uncommitted bytes past the committed size go
            if len(f.data) > f.committed:
                del f.data[f.committed:]
            f.committed = len(f.data)

    def forget_opens(self):
        for f in self.orphans:
            self.expect_error(errno.ESTALE, self.store.getattr, f.ino)
        self.orphans = []
        for f in self.files():
            f.opens = 0

    # ---- the whole view after every step -------------------------------------------------
    @invariant()
    def matches_model(self):
        s = self.store
        for d in self.dirs():
            listing = list(s.readdir(d.ino))
            assert [e.name for e in listing] == list(d.entries), (d.ino, listing)
            cookies = [e.cookie for e in listing]
            assert cookies == sorted(cookies) and all(c >= 3 for c in cookies)
            subdirs = sum(isinstance(e, MDir) for e in d.entries.values())
            assert s.getattr(d.ino).nlink == 2 + subdirs
            if d.parent is not None:
                assert s.lookup_parent(d.ino).ino == d.parent.ino
            for e, (name, m) in zip(listing, d.entries.items()):
                assert e.attr.ino == m.ino
                assert e.attr.type == (FileType.DIR if isinstance(m, MDir) else FileType.REG)
            for e, m in zip(listing, d.entries.values()):
                if isinstance(m, MFile):      # readdir's attributes include queued records
                    assert e.attr.size == len(m.data), (e, len(m.data))
        for f in self.files() + self.orphans:
            a = s.getattr(f.ino)
            assert a.size == len(f.data) and a.nlink == f.nlink, (f.ino, a)
            assert a.change >= self.changes.get(f.ino, 0), (f.ino, a, self.changes[f.ino])
            self.changes[f.ino] = a.change
            assert self.read_through(f) == bytes(f.data), f.ino
        assert s.check() == []


StoreModel.TestCase.settings = settings(
    max_examples=500 if LONG else 50, stateful_step_count=40 if LONG else 25,
    deadline=None, suppress_health_check=list(HealthCheck))
TestStoreModel = StoreModel.TestCase

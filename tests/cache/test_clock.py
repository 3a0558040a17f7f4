"""The upload settle window runs on the store's own clock, never on a client-set mtime
(issue 13, point 3): `touch -d` into the future must not keep a file from S3 for ever, and
`cp -p` / `rsync -t` with an old mtime must not skip the settle window."""
from __future__ import annotations

import os
import time

import lmdb
import pytest

from cache import index as index_mod
from cache.api import ROOT_INO, SetAttr
from cache.clock import StoreClock
from cache.index import FORMAT, FORMAT_V1, INODE_V1, Inode
from cache.keys import U64, U64x2
from cache.store import Store

from tests.cache.test_uploader_api import upload

SETTLE = 2_000_000_000
HOUR = 3600 * 1_000_000_000


class FakeMono:
    def __init__(self):
        self.t = 10**12

    def __call__(self):
        return self.t


@pytest.fixture
def clocked(store):
    """The store with a hand-driven monotonic source under its clock."""
    mono = FakeMono()
    store.ix.clock = StoreClock(store.clock_ns(), monotonic=mono)
    return store, mono


def saved(s, name, data=b"x" * 100, mtime_ns=None):
    """A checkpoint file as a client saves it: create, write, (set mtime), commit."""
    ino = s.create(ROOT_INO, name, 0o644, 0, 0)[0].ino
    s.write(ino, 0, data)
    if mtime_ns is not None:
        s.setattr(ino, SetAttr(mtime_ns=mtime_ns))
    s.commit(ino)
    return ino


def test_future_mtime_is_ready_after_the_settle_window(clocked):
    s, mono = clocked
    f = saved(s, b"skewed", mtime_ns=time.time_ns() + HOUR)      # touch -d '+1 hour'
    assert s.ready_for_upload(None, SETTLE) == []
    mono.t += SETTLE
    assert s.ready_for_upload(None, SETTLE) == [f]
    assert s.clock_ns() - s.oldest_ready_ns() == SETTLE           # the backlog age, same clock


def test_old_mtime_is_not_ready_before_the_settle_window(clocked):
    s, mono = clocked
    f = saved(s, b"copied.tmp", mtime_ns=1)                      # cp -p of a 1970 file
    s.setattr(f, SetAttr(mtime_ns=-HOUR))                        # and pre-1970 after it
    assert s.ready_for_upload(None, SETTLE) == []
    mono.t += SETTLE - 1
    assert s.ready_for_upload(None, SETTLE) == []
    mono.t += 1
    assert s.ready_for_upload(None, SETTLE) == [f]


def test_flush_takes_files_whatever_their_mtime(clocked):
    s, _ = clocked
    files = [saved(s, b"future", mtime_ns=(1 << 63) - 1), saved(s, b"past", mtime_ns=-(1 << 62)),
             saved(s, b"zero", mtime_ns=0), saved(s, b"now")]
    assert sorted(s.ready_for_upload(None, 0)) == sorted(files)
    assert sorted(s.ready_for_upload(0, 0)) == sorted(files)     # settle 0 reads no clock


def test_last_writers_close_restarts_the_settle_window(clocked):
    s, mono = clocked
    f = s.create(ROOT_INO, b"f.tmp", 0o644, 0, 0)[0].ino
    s.open_file(f, write=True)
    s.write(f, 0, b"data")
    s.commit(f)
    mono.t += 10 * SETTLE                      # held open long after its last write
    s.close_file(f, write=True)
    assert s.ready_for_upload(None, SETTLE) == []
    mono.t += SETTLE
    assert s.ready_for_upload(None, SETTLE) == [f]


def test_clock_survives_reopen_and_ignores_wall_clock_steps(store_dir, monkeypatch):
    s = Store.open(store_dir)
    f = saved(s, b"f", mtime_ns=time.time_ns() + HOUR)
    stamp = s.oldest_ready_ns()
    before = s.clock_ns()
    s.close()
    # the wall clock stepped back a day while the gateway was down: no effect on the store clock
    monkeypatch.setattr(index_mod.time, "time_ns", lambda: time.monotonic_ns() - 24 * HOUR)
    s = Store.open(store_dir)
    try:
        assert s.clock_ns() >= before                   # never backwards across a restart
        assert s.oldest_ready_ns() == stamp             # persisted
        assert s.ready_for_upload(None, 10 * SETTLE) == []   # quiet time is not invented
        assert s.ready_for_upload(None, 0) == [f]
        assert s.check() == []
    finally:
        s.close()


def test_format_1_store_is_upgraded_without_losing_a_file(store_dir):
    """A store written by format 1 (inode records without activity_ns, `ready` keyed by
    mtime) opens: format 2, dirty files re-keyed on the store clock, data intact."""
    s = Store.open(store_dir)
    f = saved(s, b"ready", b"abc", mtime_ns=time.time_ns() + HOUR)
    g = saved(s, b"old", b"def", mtime_ns=5)
    clean = saved(s, b"clean", b"zz")
    assert upload(s, clean)[0]
    mtimes = {ino: s.getattr(ino).mtime_ns for ino in (f, g)}
    s.close()
    env = lmdb.open(os.path.join(store_dir, "index"), max_dbs=20)
    with env.begin(write=True) as txn:
        meta = env.open_db(b"meta", txn=txn)
        inodes = env.open_db(b"inodes", txn=txn)
        ready = env.open_db(b"ready", txn=txn)
        txn.put(b"format", FORMAT_V1, db=meta)
        txn.delete(b"clock", db=meta)
        for ino in (f, g, clean):
            buf = txn.get(U64.pack(ino), db=inodes)
            txn.put(U64.pack(ino), bytes(buf)[:INODE_V1.size], db=inodes)
        txn.drop(ready, delete=False)
        for ino, mtime in mtimes.items():                            # the old mtime keys
            txn.put(U64x2.pack(mtime, ino), b"", db=ready)
    env.close()
    s = Store.open(store_dir)
    try:
        with s.ix.read() as v:
            assert bytes(v.txn.get(b"format", db=s.ix.meta)) == FORMAT
            keys = [U64x2.unpack(k) for k in v.txn.cursor(db=s.ix.ready).iternext(values=False)]
            assert sorted(ino for _, ino in keys) == [f, g]
            assert all(5 < stamp <= s.clock_ns() < mtimes[f] for stamp, _ in keys)
            assert len(v.txn.get(U64.pack(clean), db=s.ix.inodes)) == INODE_V1.size
        assert sorted(s.ready_for_upload(None, 0)) == [f, g]
        assert s.ready_for_upload(None, SETTLE) == []      # a full settle window from now
        assert s.read(f, 0, 3)[0] == b"abc" and s.read(g, 0, 3)[0] == b"def"
        assert s.read(clean, 0, 2)[0] == b"zz"
        assert s.check() == []
    finally:
        s.close()
    assert isinstance(Inode.unpack(1, bytes(INODE_V1.size)), Inode)

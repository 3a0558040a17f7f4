"""Format-version refusal, group commit, and that check() really finds problems."""
from __future__ import annotations

import errno
import hashlib
import os
import threading

import lmdb
import pytest

from cache.api import ROOT_INO, StoreError
from cache.keys import U64, U64x2
from cache.store import Store


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def test_newer_format_refused_and_untouched(store_dir):
    s = Store.open(store_dir)
    s.create(ROOT_INO, b"f", 0o644, 0, 0)
    s.close()
    env = lmdb.open(os.path.join(store_dir, "index"), max_dbs=20)
    with env.begin(write=True) as txn:
        txn.put(b"format", b"ckptgw-store/99", db=env.open_db(b"meta", txn=txn))
    env.close()
    mdb = os.path.join(store_dir, "index", "data.mdb")
    before = digest(mdb)
    with pytest.raises(StoreError) as e:
        Store.open(store_dir)
    assert e.value.errno == errno.EINVAL
    assert "ckptgw-store/99" in str(e.value) and "refusing" in str(e.value)
    assert digest(mdb) == before
    env = lmdb.open(os.path.join(store_dir, "index"), max_dbs=20)
    with env.begin(write=True) as txn:
        txn.put(b"format", b"ckptgw-store/1", db=env.open_db(b"meta", txn=txn))
    env.close()
    Store.open(store_dir).close()


def test_foreign_lmdb_refused(store_dir):
    os.makedirs(os.path.join(store_dir, "index"))
    env = lmdb.open(os.path.join(store_dir, "index"), max_dbs=4)
    with env.begin(write=True) as txn:
        txn.put(b"something", b"else")
    env.close()
    with pytest.raises(StoreError) as e:
        Store.open(store_dir)
    assert e.value.errno == errno.EINVAL and "unknown format" in str(e.value)


def test_garbage_index_refused(store_dir):
    os.makedirs(os.path.join(store_dir, "index"))
    with open(os.path.join(store_dir, "index", "data.mdb"), "wb") as f:
        f.write(b"not an lmdb file" * 1000)
    with pytest.raises(StoreError) as e:
        Store.open(store_dir)
    assert e.value.errno == errno.EINVAL


def test_group_commit_one_sync_covers_all_waiters(store):
    """While one sync is in progress, 16 threads make changes and call sync(): they are
    all covered by ONE following sync, not 16."""
    gate = threading.Event()
    entered = threading.Event()
    real = store.committer._flush
    calls = []

    def slow_flush():
        calls.append(1)
        if len(calls) == 1:
            entered.set()
            gate.wait(10)
        real()

    store.committer._flush = slow_flush
    # quick writes that do not sync by themselves (namespace ops sync in batch.py)
    store.queue_put({"kind": "test", "name": "first"})
    t0 = threading.Thread(target=store.sync)
    t0.start()
    assert entered.wait(10)
    started = []

    def worker(i):
        store.queue_put({"kind": "test", "name": i})
        started.append(i)
        store.sync()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    while len(started) < 16:
        threading.Event().wait(0.01)
    gate.set()
    for t in threads + [t0]:
        t.join(10)
    assert len(calls) == 2
    store.sync()                       # nothing new: returns without syncing
    assert len(calls) == 2


def test_check_finds_injected_problems(store):
    f = store.create(ROOT_INO, b"f", 0o644, 0, 0)[0].ino
    store.write(f, 0, b"abc")
    d = store.mkdir(ROOT_INO, b"d", 0o755, 0, 0)[0].ino
    assert store.check() == []
    with store.ix.write() as w:           # a cookie that points nowhere
        w.txn.delete(U64x2.pack(ROOT_INO, 3), db=store.ix.cookies)
        w.txn.delete(U64.pack(f), db=store.ix.dirty)
    with open(store.data.path(987654), "wb") as fh:
        fh.write(b"stray")
    problems = store.check()
    assert any("cookie" in p for p in problems)
    assert any("dirty index" in p for p in problems)
    assert any("data file 987654 has no inode" in p for p in problems)
    store._closed = True                   # do not run the teardown check on this one
    store.data.close()
    store.ix.close()
    os.close(store._lockfd)


def test_check_compares_counters_of_its_own_snapshot(store, monkeypatch):
    """Found by the power-cut long run (seed 4242, cut 19): `ckptgw check` over the admin
    socket walks one read snapshot while the gateway commits, and compared the walk with
    the live in-memory counters ("dirty counter 0 != sum of dirty bytes 4223692" once the
    uploader had cleaned the files after the snapshot). A commit landing mid-check is not
    a problem; counters that disagree inside one snapshot still are."""
    f = store.create(ROOT_INO, b"f", 0o644, 0, 0)[0].ino
    store.write(f, 0, b"x" * 5000)
    store.commit(f)
    real_read = store.ix.read

    def read_then_commit_elsewhere():
        ctx = real_read()
        store.ix.dirty_bytes += 5000          # what a commit after the snapshot does live
        store.ix.used_bytes += 5000
        return ctx
    monkeypatch.setattr(store.ix, "read", read_then_commit_elsewhere)
    assert store.check() == []
    monkeypatch.undo()
    store.ix.dirty_bytes -= 5000
    store.ix.used_bytes -= 5000
    with store.ix.write() as w:           # a counter that disagrees inside the snapshot
        w.txn.put(b"dirty", U64.pack(1), db=store.ix.meta)
    assert any("dirty counter 1 != sum of dirty bytes 5000" in p for p in store.check())
    with store.ix.write() as w:
        w.txn.put(b"dirty", U64.pack(store.ix.dirty_bytes), db=store.ix.meta)


def test_index_map_grows_when_full(store_dir, monkeypatch):
    import cache.index
    monkeypatch.setattr(cache.index, "MAP_SIZE", 1 << 20)
    s = Store.open(store_dir)
    codes = []
    created = 0
    for i in range(5000):
        try:
            s.create(ROOT_INO, b"file-%05d" % i, 0o644, 0, 0)
            created += 1
        except StoreError as e:
            codes.append(e.errno)
    assert codes and set(codes) == {errno.EAGAIN}       # transient, never a broken index
    assert s.ix.env.info()["map_size"] > 1 << 20
    assert len(list(s.readdir(ROOT_INO))) == created
    assert s.check() == []
    s.close()


def test_index_is_opened_in_a_mode_a_power_cut_cannot_corrupt(store):
    """sync=True, metasync=False (MDB_NOMETASYNC): each commit's data pages are synced
    before its meta page is written. sync=False let the kernel write a meta page before the
    pages it points at, and LMDB's documentation says a system crash can then corrupt it."""
    flags = store.ix.env.flags()
    assert flags["sync"] is True and flags["metasync"] is False


def test_a_later_commit_makes_the_earlier_one_durable_without_a_sync(store):
    """Every commit's data sync also flushes the meta page of the commit before, so only
    the newest commit ever needs the group commit's env.sync()."""
    calls = []
    real = store.committer._flush
    store.committer._flush = lambda: (calls.append(1), real())
    # quick writes that do not sync by themselves (namespace ops do: batch.py)
    store.queue_put({"kind": "test", "n": 1})
    first = store.ix.txnid
    store.queue_put({"kind": "test", "n": 2})
    assert store.ix.txnid > first
    store.committer.sync(upto=first)
    assert calls == []
    store.sync()
    assert len(calls) == 1
    store.getattr(ROOT_INO)
    with store.ix.write():                 # a transaction that writes nothing
        pass
    store.sync()                           # covers nothing new: no sync
    assert len(calls) == 1


def test_a_group_of_concurrent_namespace_ops_costs_one_sync(store):
    """16 threads create a file and wait for durability at the same moment. Each commit's
    data sync covers the meta page of the commit before it, and a waiter lets the next
    queued commit do that rather than syncing by itself: one env.sync for the group (the
    last commit's meta page), where the old code needed a sync round per batch of waiters."""
    calls = []
    real = store.committer._flush
    store.committer._flush = lambda: (calls.append(1), real())
    threads = [threading.Thread(target=lambda i=i: (
        store.create(ROOT_INO, b"g%d" % i, 0o644, 0, 0), store.sync())) for i in range(16)]
    with store.ix.lock:                    # every op queued before any commits
        for t in threads:
            t.start()
        for _ in range(1000):
            if getattr(store.ix, "wanting", 16) >= 16:
                break
            threading.Event().wait(0.01)
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)
    assert len(calls) == 1
    assert sorted(e.name for e in store.readdir(ROOT_INO)) == sorted(b"g%d" % i for i in range(16))


def test_format_3_store_gets_its_key_index_at_open(store_dir):
    """Format 3 had no rkeys: the upgrade builds it from the object records in the txn that
    marks format 4 (a crash before leaves format 3, and the upgrade runs again)."""
    from cache.api import RemoteInfo
    from cache.index import FORMAT, FORMAT_V3
    s = Store.open(store_dir)
    f = s.create(ROOT_INO, b"f", 0o644, 0, 0)[0].ino
    s.set_remote_info(f, RemoteInfo(key="d/f", etag='"e"', replaces=[("d/old", '"o"')]))
    s.close()
    env = lmdb.open(os.path.join(store_dir, "index"), max_dbs=20)
    with env.begin(write=True) as txn:
        txn.put(b"format", FORMAT_V3, db=env.open_db(b"meta", txn=txn))
        txn.drop(env.open_db(b"rkeys", txn=txn), delete=True)        # as format 3 had it
    env.close()
    s = Store.open(store_dir)
    try:
        with s.ix.read() as v:
            assert bytes(v.txn.get(b"format", db=s.ix.meta)) == FORMAT
        assert [i for i, _ in s.remote_records_under("d/")] == [f]
        assert s.check() == []
    finally:
        s.close()

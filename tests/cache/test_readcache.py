"""getattr / lookup answers kept until the next index commit (cache/readcache.py): hits
between commits, never an answer older than a commit whose caller has returned."""
from __future__ import annotations

import errno
import threading
from types import SimpleNamespace

import pytest

from cache.api import ROOT_INO, SetAttr, StoreError
from cache.readcache import MAX_ENTRIES, ReadCache


def count_index_reads(store, monkeypatch) -> list[int]:
    calls = [0]
    real = store.ix.read

    def counted():
        calls[0] += 1
        return real()
    monkeypatch.setattr(store.ix, "read", counted)
    return calls


def test_reads_between_commits_do_not_open_the_index_again(store, monkeypatch):
    ino = store.create(ROOT_INO, b"f", 0o644, 0, 0)[0].ino
    reads = count_index_reads(store, monkeypatch)
    first = store.getattr(ino)
    assert store.getattr(ino) is first
    assert store.lookup(ROOT_INO, b"f").ino == ino
    assert store.lookup(ROOT_INO, bytearray(b"f")).ino == ino     # a buffer key: same answer
    assert reads[0] == 2
    store.setattr(ino, SetAttr(mode=0o600))                         # a commit: answers renewed
    before = reads[0]
    for _ in range(2):
        assert store.getattr(ino).mode == 0o600
        assert store.lookup(ROOT_INO, b"f").mode == 0o600
    assert reads[0] - before <= 2


def test_an_absent_name_is_kept_until_the_next_commit(store, monkeypatch):
    """exists() and OPEN-create look up names that are not there: that answer is cached
    too, and the commit that adds the name ends it."""
    reads = count_index_reads(store, monkeypatch)
    for _ in range(3):
        with pytest.raises(StoreError) as e:
            store.lookup(ROOT_INO, b"ckpt.pt")
        assert e.value.errno == errno.ENOENT
    assert reads[0] == 1
    ino = store.create(ROOT_INO, b"ckpt.pt", 0o644, 0, 0)[0].ino
    assert store.lookup(ROOT_INO, b"ckpt.pt").ino == ino
    store.rename(ROOT_INO, b"ckpt.pt", ROOT_INO, b"final.pt")
    with pytest.raises(StoreError) as e:
        store.lookup(ROOT_INO, b"ckpt.pt")
    assert e.value.errno == errno.ENOENT
    assert store.lookup(ROOT_INO, b"final.pt").ino == ino


def test_errors_are_not_kept(store):
    with pytest.raises(StoreError) as e:
        store.lookup(ROOT_INO, b"late")
    assert e.value.errno == errno.ENOENT
    ino = store.create(ROOT_INO, b"late", 0o644, 0, 0)[0].ino
    assert store.lookup(ROOT_INO, b"late").ino == ino
    store.remove(ROOT_INO, b"late")
    with pytest.raises(StoreError) as e:
        store.lookup(ROOT_INO, b"late")
    assert e.value.errno == errno.ENOENT
    with pytest.raises(StoreError) as e:
        store.getattr(ino)
    assert e.value.errno == errno.ESTALE


def test_regression_an_answer_read_before_a_commit_is_never_kept_for_after_it():
    """The tag is the txnid seen before the read: a read that races a commit keeps its answer
    under the older id, so the first lookup after the commit reads again (tagging after the
    read would serve the old answer for the whole of the new commit's interval)."""
    index = SimpleNamespace(txnid=5)
    data = {"x": "old"}
    cache = ReadCache(index)

    def read_then_a_commit_lands():
        value = data["x"]
        data["x"], index.txnid = "new", 6
        return value
    assert cache.get("x", read_then_a_commit_lands) == "old"
    assert cache.get("x", data.get, "x") == "new"


def test_the_cache_is_bounded_per_commit_interval():
    index = SimpleNamespace(txnid=1)
    cache = ReadCache(index)
    reads = [0]

    def read(key):
        reads[0] += 1
        return key
    for key in range(MAX_ENTRIES + 10):
        cache.get(key, read, key)
    for key in range(MAX_ENTRIES + 10):
        cache.get(key, read, key)
    assert reads[0] == MAX_ENTRIES + 10 + 10        # only the ten past the bound read twice
    index.txnid = 2
    cache.get(0, read, 0)
    assert reads[0] == MAX_ENTRIES + 21             # a new interval starts empty


def test_readers_racing_commits_never_see_an_answer_older_than_a_returned_commit(store):
    ino = store.create(ROOT_INO, b"f", 0o644, 0, 0)[0].ino
    stop = threading.Event()
    errors: list[BaseException] = []

    def reader():                       # keeps filling the cache while commits land
        try:
            while not stop.is_set():
                store.getattr(ino)
                try:
                    store.lookup(ROOT_INO, b"f")
                except StoreError:
                    pass
        except BaseException as e:      # surfaced below
            errors.append(e)
    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        for i in range(60):
            mode = 0o600 | (i % 64)
            store.setattr(ino, SetAttr(mode=mode))
            assert store.getattr(ino).mode == mode
            assert store.lookup(ROOT_INO, b"f").mode == mode
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert errors == []

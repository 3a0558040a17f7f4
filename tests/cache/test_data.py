"""Data API: write/read/commit, holes, big sparse files, truncation, recovery of data."""
from __future__ import annotations

import errno
import os

import pytest

from cache.api import DataState, ROOT_INO, SetAttr, StoreError
from cache.store import Store

from tests.cache.storehelp import crash

GiB = 1 << 30


def mkfile(s, name=b"f"):
    return s.create(ROOT_INO, name, 0o644, 0, 0)[0].ino


def test_write_read_holes(store):
    f = mkfile(store)
    a = store.write(f, 100, b"abc")
    assert a.size == 103 and a.space_used == 3 and a.data_state == DataState.DIRTY
    data, eof = store.read(f, 0, 200)
    assert data == bytes(100) + b"abc" and eof
    assert store.read(f, 50, 10) == (bytes(10), False)
    assert store.read(f, 103, 10) == (b"", True)
    assert store.read(f, 10 ** 6, 10) == (b"", True)
    buf = bytearray(b"\xff" * 200)
    n, eof = store.read_into(f, 98, memoryview(buf))
    assert n == 5 and eof and buf[:5] == b"\0\0abc"
    with pytest.raises(StoreError) as e:
        store.read(ROOT_INO, 0, 1)
    assert e.value.errno == errno.EISDIR
    with pytest.raises(StoreError) as e:
        store.write(f, -1, b"x")
    assert e.value.errno == errno.EFBIG
    with pytest.raises(StoreError) as e:
        store.read(999, 0, 1)
    assert e.value.errno == errno.ESTALE


def test_overwrite_merges_extents(store):
    f = mkfile(store)
    for i in range(10):
        store.write(f, i * 1000, bytes([65 + i]) * 1000)
    store.write(f, 500, b"z" * 2000)
    exts = store.extents(f)
    assert [(e.offset, e.length, e.state) for e in exts] == [(0, 10000, DataState.DIRTY)]
    assert store.getattr(f).space_used == 10000
    data, _ = store.read(f, 0, 10000)
    assert data[:500] == b"A" * 500 and data[500:2500] == b"z" * 2000
    assert data[2500:3000] == b"C" * 500


def test_file_larger_than_4GiB_sparse(store):
    f = mkfile(store)
    off = 5 * GiB + 123
    store.write(f, off, b"tail")
    store.write(f, 0, b"head")
    a = store.getattr(f)
    assert a.size == off + 4 and a.space_used == 8
    assert store.read(f, off - 2, 10) == (b"\0\0tail", True)
    assert store.read(f, 4 * GiB, 16) == (bytes(16), False)
    store.commit(f)
    assert os.stat(store.data.path(f)).st_blocks * 512 < 1 << 20     # still sparse
    store.setattr(f, SetAttr(size=4 * GiB + 1))
    assert store.getattr(f).space_used == 4
    assert store.read(f, 4 * GiB - 2, 10) == (bytes(3), True)
    assert [(e.offset, e.length) for e in store.extents(f)] == [(0, 4)]


def test_truncate_down_and_up(store):
    f = mkfile(store)
    store.write(f, 0, b"x" * 100)
    store.setattr(f, SetAttr(size=10))
    store.write(f, 20, b"y")
    assert store.read(f, 0, 100)[0] == b"x" * 10 + bytes(10) + b"y"
    assert [(e.offset, e.length) for e in store.extents(f)] == [(0, 10), (20, 1)]
    store.setattr(f, SetAttr(size=0))
    assert store.read(f, 0, 10) == (b"", True) and store.extents(f) == []
    assert store.getattr(f).space_used == 0


def test_commit_survives_crash_and_uncommitted_tail_is_cut(store_dir):
    s = Store.open(store_dir)
    f = mkfile(s)
    s.write(f, 0, b"A" * 4096)
    s.commit(f)
    s.write(f, 4096, b"B" * 4096)           # never committed
    s.write(f, 100, b"C")                   # uncommitted, inside the committed size
    crash(s)
    s = Store.open(store_dir)
    assert s.recovery_stats["truncated"] == 1
    a = s.getattr(f)
    assert a.size == 4096 and a.data_state == DataState.DIRTY
    assert os.path.getsize(s.data.path(f)) == 4096
    assert s.read(f, 0, 10000)[0][:100] == b"A" * 100
    assert s.check() == []
    assert s.ready_for_upload(1 << 62, 0) == [f]
    s.close()


def test_close_commits_everything(store_dir):
    s = Store.open(store_dir)
    f = mkfile(s)
    s.write(f, 0, b"live")
    s.close()
    s = Store.open(store_dir)
    assert s.read(f, 0, 10) == (b"live", True)
    s.close()


def test_write_verifier_new_each_open_instance_stable(store_dir):
    s = Store.open(store_dir)
    v1, i1 = s.write_verifier, s.instance_id
    s.close()
    s = Store.open(store_dir)
    assert len(s.write_verifier) == 8 and s.write_verifier != v1
    assert len(s.instance_id) == 16 and s.instance_id == i1
    s.close()


def test_second_open_refused(store_dir):
    s = Store.open(store_dir)
    with pytest.raises(StoreError) as e:
        Store.open(store_dir)
    assert e.value.errno == errno.EBUSY
    s.close()


def test_open_counts_and_errors(store):
    f = mkfile(store)
    with pytest.raises(StoreError) as e:
        store.open_file(999, write=False)
    assert e.value.errno == errno.ESTALE
    with pytest.raises(StoreError) as e:
        store.open_file(ROOT_INO, write=True)
    assert e.value.errno == errno.EISDIR
    store.open_file(f, write=True)
    store.open_file(f, write=False)
    store.unlink(ROOT_INO, b"f")
    store.close_file(f, write=True)
    assert store.getattr(f).nlink == 0       # a reader remains
    store.close_file(f, write=False)
    with pytest.raises(StoreError):
        store.getattr(f)
    store.close_file(f, write=False)         # unbalanced close: logged, harmless

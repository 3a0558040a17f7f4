"""The data sequence: moved by every change to a file's bytes (write, truncate, recovery's cut),
never by metadata (rename, chmod, explicit times, commit, eviction and fill); persistent."""
from __future__ import annotations

from cache.api import ROOT_INO, RemoteInfo, SetAttr
from cache.store import Store

from tests.cache.storehelp import crash


def seq(store, ino) -> int:
    return store.getattr(ino).data_seq


def test_bytes_move_it_metadata_does_not(store):
    ino = store.create(ROOT_INO, b"f", 0o644, 0, 0)[0].ino
    s0 = seq(store, ino)
    store.write(ino, 0, b"x" * 1000)
    s1 = seq(store, ino)
    assert s1 != s0
    store.commit(ino)
    store.rename(ROOT_INO, b"f", ROOT_INO, b"g")
    store.setattr(ino, SetAttr(mode=0o600, uid=5, gid=6))
    before = store.getattr(ino)
    store.setattr(ino, SetAttr(mtime_ns=before.mtime_ns - 10**9, atime_ns="now"))
    store.setattr(ino, SetAttr(size=1000))                     # same size: no byte changes
    after = store.getattr(ino)
    assert after.change != before.change                        # the NFS change attribute moved...
    assert after.data_seq == s1                                 # ...the data sequence did not
    store.setattr(ino, SetAttr(size=10))
    s2 = seq(store, ino)
    assert s2 != s1
    store.write(ino, 0, b"y")
    assert seq(store, ino) != s2


def test_eviction_and_fill_keep_it(store):
    ino = store.create(ROOT_INO, b"f", 0o644, 0, 0)[0].ino
    data = bytes(range(256)) * 4
    store.write(ino, 0, data)
    store.commit(ino)
    change = store.getattr(ino).change
    assert store.mark_uploaded(ino, RemoteInfo(key="f", etag="e", size=len(data), uploaded_change=change))
    s = seq(store, ino)
    assert store.evict(ino) > 0
    store.fill(ino, 0, data)
    assert seq(store, ino) == s


def test_it_survives_a_restart_and_recovery_moves_it_when_it_cuts_bytes(store_dir):
    store = Store.open(store_dir)
    ino = store.create(ROOT_INO, b"f", 0o644, 0, 0)[0].ino
    store.write(ino, 0, b"a" * 100)
    store.commit(ino)
    committed = seq(store, ino)
    store.close()
    store = Store.open(store_dir)
    assert seq(store, ino) == committed                         # persistent, untouched by a clean open
    store.write(ino, 100, b"b" * 50)                            # never committed
    written = seq(store, ino)
    crash(store)
    store = Store.open(store_dir)                               # recovery cuts back to 100 bytes
    try:
        attr = store.getattr(ino)
        assert attr.size == 100
        assert attr.data_seq not in (committed, written)
    finally:
        store.close()

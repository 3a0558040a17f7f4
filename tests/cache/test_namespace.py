"""Namespace API: lookup, create, mkdir, symlink, link, unlink, rmdir, rename, readdir."""
from __future__ import annotations

import errno
import os

import pytest

from cache.api import FileType, ROOT_INO, SetAttr, StoreError
from cache.store import Store

from tests.cache.storehelp import crash


def err(excinfo) -> int:
    return excinfo.value.errno


def mkfile(s, parent, name, data=b""):
    a, _, _ = s.create(parent, name, 0o644, 1000, 1000)
    if data:
        s.write(a.ino, 0, data)
    return a.ino


def names(s, ino):
    return [e.name for e in s.readdir(ino)]


def test_root_and_getattr(store):
    a = store.getattr(ROOT_INO)
    assert a.type == FileType.DIR and a.nlink == 2 and a.parent == ROOT_INO
    assert store.lookup_parent(ROOT_INO).ino == ROOT_INO
    with pytest.raises(StoreError) as e:
        store.getattr(999)
    assert err(e) == errno.ESTALE


@pytest.mark.parametrize("name,code", [
    (b"", errno.EINVAL), (b".", errno.EINVAL), (b"..", errno.EINVAL),
    (b"a/b", errno.EINVAL), (b"a\0b", errno.EINVAL), (b"x" * 256, errno.ENAMETOOLONG)])
def test_bad_names(store, name, code):
    for op in (lambda: store.create(ROOT_INO, name, 0o644, 0, 0),
               lambda: store.mkdir(ROOT_INO, name, 0o755, 0, 0),
               lambda: store.lookup(ROOT_INO, name),
               lambda: store.rename(ROOT_INO, name, ROOT_INO, b"ok"),
               lambda: store.unlink(ROOT_INO, name)):
        with pytest.raises(StoreError) as e:
            op()
        assert err(e) == code
    assert names(store, ROOT_INO) == []
    assert store.create(ROOT_INO, b"x" * 255, 0o644, 0, 0)[2]


def test_lookup_errors(store):
    f = mkfile(store, ROOT_INO, b"f")
    with pytest.raises(StoreError) as e:
        store.lookup(ROOT_INO, b"nope")
    assert err(e) == errno.ENOENT
    with pytest.raises(StoreError) as e:
        store.lookup(f, b"x")
    assert err(e) == errno.ENOTDIR
    with pytest.raises(StoreError) as e:
        store.lookup(12345, b"x")
    assert err(e) == errno.ESTALE
    with pytest.raises(StoreError) as e:
        store.lookup_parent(f)
    assert err(e) == errno.ENOTDIR


def test_create_semantics(store):
    a, ci, created = store.create(ROOT_INO, b"f", 0o640, 7, 8)
    assert created and a.mode == 0o640 and (a.uid, a.gid) == (7, 8) and a.nlink == 1
    assert ci.atomic and ci.after > ci.before
    b, ci2, created2 = store.create(ROOT_INO, b"f", 0o600, 0, 0)
    assert not created2 and b.ino == a.ino and b.mode == 0o640 and ci2.before == ci2.after
    with pytest.raises(StoreError) as e:
        store.create(ROOT_INO, b"f", 0o600, 0, 0, exclusive=True)
    assert err(e) == errno.EEXIST
    store.mkdir(ROOT_INO, b"d", 0o755, 0, 0)
    with pytest.raises(StoreError) as e:
        store.create(ROOT_INO, b"d", 0o600, 0, 0)
    assert err(e) == errno.EISDIR
    with pytest.raises(StoreError) as e:
        store.create(a.ino, b"x", 0o600, 0, 0)
    assert err(e) == errno.ENOTDIR
    with pytest.raises(StoreError) as e:
        store.create(4242, b"x", 0o600, 0, 0)
    assert err(e) == errno.ESTALE


def test_mkdir_rmdir(store):
    d, _ = store.mkdir(ROOT_INO, b"d", 0o755, 0, 0)
    assert store.getattr(ROOT_INO).nlink == 3 and d.nlink == 2 and d.parent == ROOT_INO
    with pytest.raises(StoreError) as e:
        store.mkdir(ROOT_INO, b"d", 0o755, 0, 0)
    assert err(e) == errno.EEXIST
    mkfile(store, d.ino, b"f")
    with pytest.raises(StoreError) as e:
        store.rmdir(ROOT_INO, b"d")
    assert err(e) == errno.ENOTEMPTY
    with pytest.raises(StoreError) as e:
        store.rmdir(d.ino, b"f")
    assert err(e) == errno.ENOTDIR
    with pytest.raises(StoreError) as e:
        store.unlink(ROOT_INO, b"d")
    assert err(e) == errno.EISDIR
    store.remove(d.ino, b"f")
    store.remove(ROOT_INO, b"d")
    assert store.getattr(ROOT_INO).nlink == 2 and names(store, ROOT_INO) == []
    with pytest.raises(StoreError) as e:
        store.getattr(d.ino)
    assert err(e) == errno.ESTALE
    with pytest.raises(StoreError) as e:
        store.rmdir(ROOT_INO, b"d")
    assert err(e) == errno.ENOENT


def test_symlink_readlink(store):
    a, _ = store.symlink(ROOT_INO, b"l", b"../target", 0o777, 0, 0)
    assert a.type == FileType.LNK and a.size == 9
    assert store.readlink(a.ino) == b"../target"
    f = mkfile(store, ROOT_INO, b"f")
    with pytest.raises(StoreError) as e:
        store.readlink(f)
    assert err(e) == errno.EINVAL
    with pytest.raises(StoreError) as e:
        store.symlink(ROOT_INO, b"l", b"x", 0o777, 0, 0)
    assert err(e) == errno.EEXIST
    with pytest.raises(StoreError) as e:
        store.write(a.ino, 0, b"x")
    assert err(e) == errno.EINVAL


def test_hard_links(store):
    f = mkfile(store, ROOT_INO, b"f", b"data")
    d, _ = store.mkdir(ROOT_INO, b"d", 0o755, 0, 0)
    a, ci = store.link(f, d.ino, b"g")
    assert a.nlink == 2 and ci.after > ci.before
    assert store.lookup(d.ino, b"g").ino == f
    with pytest.raises(StoreError) as e:
        store.link(f, d.ino, b"g")
    assert err(e) == errno.EEXIST
    with pytest.raises(StoreError) as e:
        store.link(d.ino, ROOT_INO, b"dd")
    assert err(e) == errno.EISDIR
    store.unlink(ROOT_INO, b"f")
    assert store.getattr(f).nlink == 1
    assert store.read(f, 0, 10) == (b"data", True)
    assert store.path_of(f) == "d/g"
    store.unlink(d.ino, b"g")
    with pytest.raises(StoreError) as e:
        store.getattr(f)
    assert err(e) == errno.ESTALE
    store.sync()          # the data file goes once the unlink is durable
    assert not os.path.exists(store.data.path(f))


def test_rename_file_over_file_reclaims_target(store):
    a = mkfile(store, ROOT_INO, b"a", b"AAAA")
    b = mkfile(store, ROOT_INO, b"b", b"BBBBBBBB")
    store.commit(b)
    src, dst = store.rename(ROOT_INO, b"a", ROOT_INO, b"b")
    assert dst.after > dst.before
    assert store.lookup(ROOT_INO, b"b").ino == a
    assert names(store, ROOT_INO) == [b"b"]
    with pytest.raises(StoreError) as e:
        store.getattr(b)
    assert err(e) == errno.ESTALE
    store.sync()          # the data file goes once the unlink is durable
    assert not os.path.exists(store.data.path(b))
    jobs = [j for _, j in store.queue_list()]
    # the replaced target's unlink job comes BEFORE the rename job
    assert [j["op"] for j in jobs] == ["unlink", "rename"]
    assert jobs[0] == {"kind": "ns", "op": "unlink", "ino": b, "type": "reg", "old_path": "b",
                       "last_link": True, "replaced_by": a, "sent": False}   # never uploaded
    assert jobs[1]["old_path"] == "a" and jobs[1]["new_path"] == "b" and jobs[1]["replaced"] == b


def test_rename_over_open_file_keeps_it_readable_until_close(store):
    a = mkfile(store, ROOT_INO, b"a", b"new")
    b = mkfile(store, ROOT_INO, b"b", b"old")
    store.open_file(b, write=False)
    store.rename(ROOT_INO, b"a", ROOT_INO, b"b")
    assert store.getattr(b).nlink == 0
    assert store.read(b, 0, 10) == (b"old", True)
    assert store.check() == []
    store.close_file(b, write=False)
    with pytest.raises(StoreError) as e:
        store.getattr(b)
    assert err(e) == errno.ESTALE
    store.sync()          # the data file goes once the unlink is durable
    assert not os.path.exists(store.data.path(b))


def test_rename_errors(store):
    d1, _ = store.mkdir(ROOT_INO, b"d1", 0o755, 0, 0)
    d2, _ = store.mkdir(ROOT_INO, b"d2", 0o755, 0, 0)
    sub, _ = store.mkdir(d1.ino, b"sub", 0o755, 0, 0)
    mkfile(store, d2.ino, b"f")
    mkfile(store, ROOT_INO, b"g")
    cases = [
        ((ROOT_INO, b"nope", ROOT_INO, b"x"), errno.ENOENT),
        ((ROOT_INO, b"d1", ROOT_INO, b"d2"), errno.ENOTEMPTY),
        ((ROOT_INO, b"d1", ROOT_INO, b"g"), errno.ENOTDIR),
        ((ROOT_INO, b"g", ROOT_INO, b"d1"), errno.EISDIR),
        ((ROOT_INO, b"d1", sub.ino, b"x"), errno.EINVAL),
        ((ROOT_INO, b"d1", d1.ino, b"x"), errno.EINVAL),
        ((ROOT_INO, b"g", d2.ino + 100, b"x"), errno.ESTALE),
    ]
    for args, code in cases:
        with pytest.raises(StoreError) as e:
            store.rename(*args)
        assert err(e) == code, args
    assert names(store, ROOT_INO) == [b"d1", b"d2", b"g"]


def test_rename_noops(store):
    f = mkfile(store, ROOT_INO, b"f")
    store.link(f, ROOT_INO, b"h")
    before = store.getattr(ROOT_INO).change
    store.rename(ROOT_INO, b"f", ROOT_INO, b"f")
    store.rename(ROOT_INO, b"f", ROOT_INO, b"h")     # same inode: POSIX does nothing
    assert names(store, ROOT_INO) == [b"f", b"h"] and store.getattr(ROOT_INO).change == before


def test_rename_directory_moves_subtree(store):
    a, _ = store.mkdir(ROOT_INO, b"a", 0o755, 0, 0)
    b, _ = store.mkdir(a.ino, b"b", 0o755, 0, 0)
    f = mkfile(store, b.ino, b"f", b"x")
    z, _ = store.mkdir(ROOT_INO, b"z", 0o755, 0, 0)
    empty, _ = store.mkdir(z.ino, b"empty", 0o755, 0, 0)
    store.rename(ROOT_INO, b"a", z.ino, b"empty")     # dir over empty dir
    assert store.path_of(f) == "z/empty/b/f"
    assert store.lookup_parent(a.ino).ino == z.ino
    assert store.getattr(ROOT_INO).nlink == 3 and store.getattr(z.ino).nlink == 3
    with pytest.raises(StoreError):
        store.getattr(empty.ino)
    job = store.queue_list()[-1][1]
    assert (job["op"], job["type"], job["old_path"], job["new_path"]) == \
        ("rename", "dir", "a", "z/empty")


def test_readdir_cookies_stable(store_dir):
    s = Store.open(store_dir)
    for n in (b"a", b"b", b"c", b"d"):
        mkfile(s, ROOT_INO, n)
    first = {e.name: e.cookie for e in s.readdir(ROOT_INO)}
    assert min(first.values()) >= 3 and list(first) == [b"a", b"b", b"c", b"d"]
    s.unlink(ROOT_INO, b"b")
    mkfile(s, ROOT_INO, b"e")
    after = {e.name: e.cookie for e in s.readdir(ROOT_INO)}
    assert after == {b"a": first[b"a"], b"c": first[b"c"], b"d": first[b"d"],
                     b"e": max(first.values()) + 1}
    # resuming after a removed entry's cookie continues in place
    assert [e.name for e in s.readdir(ROOT_INO, first[b"b"])] == [b"c", b"d", b"e"]
    assert list(s.readdir(ROOT_INO, 10 ** 9)) == []
    s.close()
    s = Store.open(store_dir)
    assert {e.name: e.cookie for e in s.readdir(ROOT_INO)} == after
    s.close()


def test_readdir_many_entries_batches(store):
    d, _ = store.mkdir(ROOT_INO, b"d", 0o755, 0, 0)
    for i in range(600):
        mkfile(store, d.ino, b"f%04d" % i)
    got = list(store.readdir(d.ino))
    assert [e.name for e in got] == [b"f%04d" % i for i in range(600)]
    cookies = [e.cookie for e in got]
    assert cookies == sorted(cookies) and len(set(cookies)) == 600
    assert [e.name for e in store.readdir(d.ino, cookies[299])][:1] == [b"f0300"]
    with pytest.raises(StoreError) as e:
        store.readdir(got[0].attr.ino)
    assert err(e) == errno.ENOTDIR


def test_setattr(store):
    f = mkfile(store, ROOT_INO, b"f", b"0123456789")
    before = store.getattr(f)
    a = store.setattr(f, SetAttr(mode=0o600, uid=5, gid=6, mtime_ns=123, atime_ns="now"))
    assert (a.mode, a.uid, a.gid, a.mtime_ns) == (0o600, 5, 6, 123)
    assert a.change > before.change and a.ctime_ns >= before.ctime_ns
    a = store.setattr(f, SetAttr(size=4))
    assert a.size == 4 and store.read(f, 0, 100) == (b"0123", True)
    a = store.setattr(f, SetAttr(size=8))
    assert store.read(f, 0, 100) == (b"0123\0\0\0\0", True)
    with pytest.raises(StoreError) as e:
        store.setattr(ROOT_INO, SetAttr(size=0))
    assert err(e) == errno.EISDIR


def test_statfs(store, monkeypatch):
    # The host's free space moves with everything else it runs (a shared machine: another
    # process freeing a file between the two calls failed this once): hold it still, so
    # what is compared is the store's own accounting.
    monkeypatch.setattr(store.space, "disk_free", lambda: 1 << 50)
    st = store.statfs()
    assert st.bytes_total == store.space.capacity
    f = mkfile(store, ROOT_INO, b"f", b"x" * 10000)
    st2 = store.statfs()
    assert st2.files_free == st.files_free - 1
    assert st2.bytes_free == st.bytes_free - 10000 == store.space.capacity - store.ix.used_bytes


def test_unlinked_open_file_reclaimed_after_crash(store_dir):
    s = Store.open(store_dir)
    f = mkfile(s, ROOT_INO, b"f", b"data")
    s.commit(f)
    s.open_file(f, write=True)
    s.write(f, 4, b"uncommitted")
    s.unlink(ROOT_INO, b"f")
    s.sync()
    assert os.path.exists(s.data.path(f))
    crash(s)
    s = Store.open(store_dir)
    assert s.recovery_stats["orphans"] == 1
    with pytest.raises(StoreError):
        s.getattr(f)
    s.sync()          # the data file goes once the unlink is durable
    assert not os.path.exists(s.data.path(f))
    assert s.check() == []
    s.close()


def test_journal_for_every_namespace_op(store):
    d, _ = store.mkdir(ROOT_INO, b"d", 0o755, 0, 0)
    f = mkfile(store, d.ino, b"f")
    store.link(f, ROOT_INO, b"h")
    store.symlink(d.ino, b"l", b"f", 0o777, 0, 0)
    store.unlink(ROOT_INO, b"h")
    store.remove(d.ino, b"l")
    store.unlink(d.ino, b"f")
    store.rmdir(ROOT_INO, b"d")
    ops = [(j["op"], j.get("old_path"), j.get("new_path")) for _, j in store.queue_list()]
    assert ops == [("mkdir", None, "d"), ("link", "d/f", "h"), ("symlink", None, "d/l"),
                   ("unlink", "h", "d/f"),           # another link keeps it: its next name
                   ("unlink", "d/l", None), ("unlink", "d/f", None),
                   ("rmdir", "d", None)]


def test_unlink_during_a_write_defers_reclaim(store, monkeypatch):
    f = mkfile(store, ROOT_INO, b"f", b"x")
    real = store.data.pwrite

    def pwrite_with_unlink(ino, off, data):     # the name goes away mid-write
        store.unlink(ROOT_INO, b"f")
        assert store.getattr(ino).nlink == 0    # kept alive by the write in flight
        real(ino, off, data)

    monkeypatch.setattr(store.data, "pwrite", pwrite_with_unlink)
    store.write(f, 0, b"late bytes")
    with pytest.raises(StoreError) as e:
        store.getattr(f)
    assert err(e) == errno.ESTALE
    store.sync()          # the data file goes once the unlink is durable
    assert not os.path.exists(store.data.path(f))


def test_unlinked_open_inode_edges(store):
    f = mkfile(store, ROOT_INO, b"f", b"abc")
    store.open_file(f, write=False)
    store.unlink(ROOT_INO, b"f")
    assert store.path_of(f) is None
    with pytest.raises(StoreError) as e:
        store.link(f, ROOT_INO, b"again")
    assert err(e) == errno.ENOENT
    assert store.is_open(f) and store.is_open(f, write=False) and not store.is_open(f, write=True)
    store.close_file(f, write=False)
    assert not store.is_open(f)
    for op in (lambda: store.set_pinned(f, True), lambda: store.path_of(f),
               lambda: store.extents(f), lambda: store.commit(f)):
        with pytest.raises(StoreError) as e:
            op()
        assert err(e) == errno.ESTALE


def test_journal_jobs_say_sent_false_only_for_files_known_never_uploaded(store_dir):
    """`sent: False` (no object was ever written for the file) is given only for inodes made
    since F_SENT is kept: a store of an older version has uploaded files without the flag,
    whose jobs must still look in S3."""
    from cache.index import SENT_SINCE
    s = Store.open(store_dir)
    old = mkfile(s, ROOT_INO, b"old", b"1")
    with s.ix.write() as w:                      # as a store of the version before F_SENT
        w.txn.delete(SENT_SINCE, db=s.ix.meta)
    s.close()
    s = Store.open(store_dir)
    try:
        new = mkfile(s, ROOT_INO, b"new", b"2")
        sent = mkfile(s, ROOT_INO, b"sent", b"3")
        s.mark_sent(sent)
        for name in (b"old", b"new", b"sent"):
            s.remove(ROOT_INO, name)
        jobs = {j["ino"]: j for _, j in s.queue_list() if j.get("op") == "unlink"}
        assert "sent" not in jobs[old] and "sent" not in jobs[sent]
        assert jobs[new]["sent"] is False
    finally:
        s.close()

"""Special files (issue 14, every file type): block and character devices, sockets and
FIFOs are inodes with a type and (devices) an rdev, never opened for I/O; the format 2 ->
3 upgrade keeps a store written before them readable."""
from __future__ import annotations

import errno
import os

import lmdb
import pytest

from cache.api import ROOT_INO, FileType, SetAttr, StoreError
from cache.index import FORMAT, FORMAT_V2, INODE_V2
from cache.keys import U64
from cache.store import Store

SPECIAL = [(FileType.BLK, (8, 1)), (FileType.CHR, (1, 3)), (FileType.SOCK, (0, 0)),
           (FileType.FIFO, (0, 0))]


@pytest.mark.parametrize("typ,rdev", SPECIAL)
def test_mknod_keeps_type_mode_and_rdev_across_reopen(store_dir, typ, rdev):
    s = Store.open(store_dir)
    a, cinfo = s.mknod(ROOT_INO, b"node", typ, 0o640, 7, 8, rdev)
    assert a.type == typ and a.mode == 0o640 and a.rdev == rdev and a.size == 0
    assert a.nlink == 1 and (a.uid, a.gid) == (7, 8) and cinfo.after > cinfo.before
    s.sync()
    s.close()
    s = Store.open(store_dir)
    try:
        b = s.getattr(a.ino)
        assert (b.type, b.mode, b.rdev) == (typ, 0o640, rdev)
        assert s.lookup(ROOT_INO, b"node").ino == a.ino
        assert [(e.name, e.attr.type, e.attr.rdev) for e in s.readdir(ROOT_INO)] == [
            (b"node", typ, rdev)]
        assert s.check() == []
    finally:
        s.close()


def test_rdev_of_a_fifo_or_socket_is_ignored(store):
    a, _ = store.mknod(ROOT_INO, b"f", FileType.FIFO, 0o644, 0, 0, (5, 6))
    assert a.rdev == (0, 0)


@pytest.mark.parametrize("typ", [FileType.REG, FileType.DIR, FileType.LNK, 9])
def test_mknod_refuses_non_special_types(store, typ):
    with pytest.raises(StoreError) as e:
        store.mknod(ROOT_INO, b"x", typ, 0o644, 0, 0)
    assert e.value.errno == errno.EINVAL
    assert list(store.readdir(ROOT_INO)) == []


def test_mknod_refuses_an_existing_name_and_an_rdev_out_of_range(store):
    store.mknod(ROOT_INO, b"x", FileType.FIFO, 0o644, 0, 0)
    with pytest.raises(StoreError) as e:
        store.mknod(ROOT_INO, b"x", FileType.SOCK, 0o644, 0, 0)
    assert e.value.errno == errno.EEXIST
    with pytest.raises(StoreError) as e:
        store.mknod(ROOT_INO, b"y", FileType.CHR, 0o644, 0, 0, (1 << 32, 0))
    assert e.value.errno == errno.EINVAL


@pytest.mark.parametrize("typ,rdev", SPECIAL)
def test_special_files_are_never_opened_for_io(store, typ, rdev):
    a, _ = store.mknod(ROOT_INO, b"n", typ, 0o666, 0, 0, rdev)
    for call in (lambda: store.open_file(a.ino, True), lambda: store.read(a.ino, 0, 10),
                 lambda: store.write(a.ino, 0, b"x"),
                 lambda: store.setattr(a.ino, SetAttr(size=0))):
        with pytest.raises(StoreError) as e:
            call()
        assert e.value.errno == errno.EINVAL
    assert store.ready_for_upload(None, 0) == []


def test_link_rename_unlink_of_a_device(store):
    a, _ = store.mknod(ROOT_INO, b"dev", FileType.CHR, 0o600, 0, 0, (4, 64))
    d, _ = store.mkdir(ROOT_INO, b"d", 0o755, 0, 0)
    store.link(a.ino, d.ino, b"hard")
    assert store.getattr(a.ino).nlink == 2
    store.rename(ROOT_INO, b"dev", d.ino, b"moved")
    assert store.lookup(d.ino, b"moved").rdev == (4, 64)
    store.unlink(d.ino, b"moved")
    store.unlink(d.ino, b"hard")
    with pytest.raises(StoreError) as e:
        store.getattr(a.ino)
    assert e.value.errno == errno.ESTALE
    jobs = [(j["op"], j["type"]) for _, j in store.queue_list() if j.get("kind") == "ns"]
    assert jobs[0] == ("mknod", "chr")
    assert ("rename", "chr") in jobs and jobs.count(("unlink", "chr")) == 2


def test_import_special_never_overrides_and_is_not_journaled(store):
    a = store.import_special("dir/pipe", FileType.FIFO, (0, 0), 0o600, 1, 2, 123)
    assert a.type == FileType.FIFO and a.mtime_ns == 123 and a.mode == 0o600
    assert store.import_special("dir/pipe", FileType.SOCK, (0, 0), 0o600, 1, 2, 5) is None
    assert [j for _, j in store.queue_list() if j.get("op") == "mknod"] == []


def test_check_reports_rdev_on_a_non_device(store):
    a, _ = store.mknod(ROOT_INO, b"f", FileType.FIFO, 0o644, 0, 0)
    with store.ix.write() as w:
        rec = w.must_inode(a.ino)
        new = rec.copy()
        new.rdev_major = 3
        w.put_inode(new, rec)
    assert any("rdev" in p for p in store.check())
    with store.ix.write() as w:
        w.put_inode(rec, new)


def test_format_2_store_opens_as_format_3(store_dir):
    s = Store.open(store_dir)
    f, _, _ = s.create(ROOT_INO, b"f", 0o644, 0, 0)
    s.write(f.ino, 0, b"abc")
    s.commit(f.ino)
    s.close()
    env = lmdb.open(os.path.join(store_dir, "index"), max_dbs=20)
    with env.begin(write=True) as txn:
        meta = env.open_db(b"meta", txn=txn)
        inodes = env.open_db(b"inodes", txn=txn)
        txn.put(b"format", FORMAT_V2, db=meta)
        for key, buf in list(txn.cursor(db=inodes)):
            txn.put(key, bytes(buf)[:INODE_V2.size], db=inodes)   # records as format 2 wrote them
    env.close()
    s = Store.open(store_dir)
    try:
        with s.ix.read() as v:
            assert bytes(v.txn.get(b"format", db=s.ix.meta)) == FORMAT
            assert len(v.txn.get(U64.pack(f.ino), db=s.ix.inodes)) == INODE_V2.size
        a = s.getattr(f.ino)
        assert a.rdev == (0, 0) and a.type == FileType.REG
        assert s.read(f.ino, 0, 3)[0] == b"abc"
        assert s.check() == []
    finally:
        s.close()

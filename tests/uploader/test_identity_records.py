"""The store's object-identity records (cache side of issue 13), as the uploader uses them:
re-key is a compare-and-set, kept objects are handed to the file at their name and survive
record writes made from an older copy."""
from cache.api import RemoteInfo
from tests.uploader.conftest import remove
from testkit.storefiles import mkdirs, write_file


def test_rekey_is_compare_and_set_and_follows_kept_objects(store):
    a = write_file(store, "d/a", b"a")
    b = write_file(store, "d/b", b"b")
    store.set_remote_info(a, RemoteInfo(key="d/a", etag='"ea"', size=1))
    store.set_remote_info(b, RemoteInfo(key="x/b", etag='"eb"', size=1))
    assert store.adopt_replaced("d/b", "d/old", '"eo"', exclude_ino=0) == b
    under = dict(store.remote_records_under("d/"))
    assert set(under) == {a, b}                      # b by its kept object, not its own key
    assert not store.rekey_remote(a, "d/a", '"stale"', "e/a", '"ea2"')     # another object: no
    assert store.rekey_remote(a, "d/a", '"ea"', "e/a", '"ea2"', "v1")
    r = store.remote_info(a)
    assert (r.key, r.etag, r.version_id) == ("e/a", '"ea2"', "v1")
    assert store.rekey_remote(b, "d/old", '"eo"', "e/old", '"eo2"')
    assert store.remote_info(b).replaces == [("e/old", '"eo2"')]


def test_kept_objects_survive_older_record_writes_and_go_with_the_put_over_them(store):
    f = write_file(store, "latest.pt", b"new")
    older = store.remote_info(f)                     # read before the adoption
    assert store.adopt_replaced("latest.pt", "latest.pt", '"old"', exclude_ino=0) == f
    older.upload_id = "u1"
    store.set_remote_info(f, older)                  # e.g. multipart progress
    assert store.remote_info(f).replaces == [("latest.pt", '"old"')]
    store.mark_uploaded(f, RemoteInfo(key="latest.pt", etag='"new"', size=3,
                                      uploaded_change=store.getattr(f).change))
    assert store.remote_info(f).replaces == []       # the PUT at latest.pt replaced it


def test_adopt_only_by_a_regular_file_other_than_the_unlinked_one(store):
    f = write_file(store, "a", b"x")
    mkdirs(store, "dir")
    assert store.adopt_replaced("a", "a", '"e"', exclude_ino=f) is None
    assert store.adopt_replaced("dir", "dir", '"e"', exclude_ino=0) is None
    assert store.adopt_replaced("missing", "missing", '"e"', exclude_ino=0) is None
    remove(store, "a")
    assert store.adopt_replaced("a", "a", '"e"', exclude_ino=0) is None


def test_records_under_a_prefix_come_from_the_key_index_and_follow_every_change(store):
    """remote_records_under scans rkeys (cache/index.py), not every record: the index follows
    each record's key and kept objects through re-keys and purges, keys longer than an LMDB
    key are cut and still found, and a candidate the cut or an ino's bytes let in is checked
    against its record. store.check() compares the index with the records."""
    from cache.index import RKEY_MAX
    from cache.keys import U64
    a = write_file(store, "d/a", b"a")
    b = write_file(store, "e/b", b"b")
    long_dir = "L" * (RKEY_MAX + 20)
    store.set_remote_info(a, RemoteInfo(key="d/a", etag='"ea"', size=1))
    tricky = 0x2F00000000000000 + 7          # its U64 bytes begin with "/"
    with store.ix.write() as w:                  # (set_remote_info keeps `replaces` as stored)
        w.put_remote(b, RemoteInfo(key=long_dir + "/x", etag='"eb"', size=1,
                                   replaces=[(long_dir + "/y", '"ey"')]))
        w.put_remote(tricky, RemoteInfo(key="d", etag='"ed"'))
        assert w.txn.get(b"d" + U64.pack(tricky), db=store.ix.rkeys) is not None
    assert [i for i, _ in store.remote_records_under("d/")] == [a]       # not the key "d"
    assert [i for i, _ in store.remote_records_under(long_dir + "/")] == [b]
    assert store.remote_records_under("L" * (RKEY_MAX + 20) + "/z") == []   # cut alike, checked
    assert store.remote_records_under(long_dir[:-1] + "M") == []
    assert store.check() == []
    assert store.rekey_remote(a, "d/a", '"ea"', "f/a", '"ea2"')
    assert store.remote_records_under("d/") == []
    assert [i for i, _ in store.remote_records_under("f/")] == [a]
    store.set_remote_info(b, RemoteInfo(key="e/b", etag='"eb2"', size=1))   # kept objects stay
    assert [i for i, _ in store.remote_records_under(long_dir)] == [b]
    with store.ix.write() as w:
        w.drop_remote(tricky)
    remove(store, "d/a")                             # the inode and its record go
    store.sync()
    assert store.remote_records_under("f/") == []
    assert store.check() == []
    with store.ix.write() as w:                      # drift is found
        w.txn.delete(b"e/b" + U64.pack(b), db=store.ix.rkeys)
        w.txn.put(b"zz" + U64.pack(a), b"", db=store.ix.rkeys)
    problems = store.check()
    assert any("missing from rkeys" in x and "'e/b'" in x for x in problems), problems
    assert any("no object record names it" in x for x in problems), problems
    with store.ix.write() as w:
        w.txn.put(b"e/b" + U64.pack(b), b"", db=store.ix.rkeys)
        w.txn.delete(b"zz" + U64.pack(a), db=store.ix.rkeys)
    assert store.check() == []


def test_rkeys_follow_records_changed_in_place_and_in_nested_txns(store):
    """put_remote takes the stored record's rkeys entries from this txn's read of it (not a
    second decode of a record that grows with its parts). Callers change the object they
    read before putting it back, a record may be written twice in one txn, and a nested txn
    (one batch op) may change it and commit into its parent or abort: the index follows."""
    a = write_file(store, "d/a", b"a")
    b = write_file(store, "d/b", b"b")
    store.set_remote_info(a, RemoteInfo(key="d/a", etag='"ea"', size=1))
    store.set_remote_info(b, RemoteInfo(key="d/b", etag='"eb"', size=1))
    with store.ix.write() as w:
        r = w.remote(a)
        r.key, r.replaces = "e/a", [("e/kept", '"ek"')]          # changed in place, then put
        w.put_remote(a, r)
        r.key = "f/a"                                            # twice in one txn
        w.put_remote(a, r)
        w.remote(b)                                              # read by the parent first
        with store.ix.nested(w) as child:                        # commits into the parent
            rb = child.remote(b)
            rb.key = "g/b"
            child.put_remote(b, rb)
        try:
            with store.ix.nested(w) as child:                    # aborts: the parent is untouched
                rb = child.remote(b)
                rb.key = "h/b"
                child.put_remote(b, rb)
                raise KeyError("abort")
        except KeyError:
            pass
        w.put_remote(b, RemoteInfo(key="i/b", etag='"eb2"', size=1))   # after both children
    assert store.check() == []
    assert store.remote_records_under("d/") == store.remote_records_under("g/") == []
    assert store.remote_records_under("h/") == []
    assert [i for i, _ in store.remote_records_under("e/")] == [a]       # its kept object
    assert [i for i, _ in store.remote_records_under("f/")] == [a]
    assert [i for i, _ in store.remote_records_under("i/")] == [b]

"""The store's object-identity records (cache side of issue 13), as the uploader uses them:
re-key is a compare-and-set, kept objects are handed to the file at their name and survive
record writes made from an older copy."""
from cache.api import RemoteInfo
from tests.uploader.conftest import mkdirs, remove, write_file


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

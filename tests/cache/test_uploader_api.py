"""Uploader-facing API: upload set, states, remote info, evict/fill, import, pins, queue."""
from __future__ import annotations

import errno
import os
import threading

import pytest

from cache.api import DataState, RemoteInfo, ROOT_INO, SetAttr, StoreError
from cache.store import Store

from tests.cache.storehelp import crash, index_lock_held

FAR = 1 << 62


def mkfile(s, name=b"f", data=b""):
    ino = s.create(ROOT_INO, name, 0o644, 0, 0)[0].ino
    if data:
        s.write(ino, 0, data)
    return ino


def upload(s, ino):
    """What the uploader does, minus S3."""
    change = s.getattr(ino).change
    assert s.set_data_state(ino, DataState.UPLOADING, change)
    fd = s.open_data_fd(ino)
    try:
        body = os.pread(fd, s.getattr(ino).size, 0)
    finally:
        os.close(fd)
    return s.mark_uploaded(ino, RemoteInfo(key=s.path_of(ino), etag="e", size=len(body),
                                           uploaded_change=change)), body


def test_ready_for_upload_rules(store):
    f = mkfile(store, b"f", b"x" * 10)
    assert store.ready_for_upload(FAR, 0) == [f]         # uncommitted: the uploader commits it
    store.commit_settled(f)
    assert store.getattr(f).size == 10
    assert store.ready_for_upload(FAR, 0) == [f]
    now = store.clock_ns()
    assert store.ready_for_upload(now, 10**12) == []     # not quiet long enough
    store.open_file(f, write=True)
    assert store.ready_for_upload(FAR, 0) == []          # open for write
    store.close_file(f, write=True)
    store.set_data_state(f, DataState.QUEUED)
    assert store.ready_for_upload(FAR, 0) == []          # the uploader has it
    empty = mkfile(store, b"empty")
    assert store.ready_for_upload(FAR, 0) == [empty]     # an empty new file is uploadable
    old = mkfile(store, b"old")
    store.setattr(old, SetAttr(mtime_ns=-5))             # a client's mtime changes no order
    store.set_data_state(f, DataState.DIRTY)
    assert store.ready_for_upload(FAR, 0) == [f, empty, old]
    assert store.ready_for_upload(FAR, 0, limit=2) == [f, empty]


def test_oldest_ready_is_the_oldest_settled_dirty_file(store):
    assert store.oldest_ready_ns() is None
    older = mkfile(store, b"older", b"a")
    store.commit(older)
    newer = mkfile(store, b"newer", b"b")
    store.commit(newer)
    first = store.oldest_ready_ns()
    assert first is not None and first <= store.clock_ns()
    store.setattr(older, SetAttr(mtime_ns=1))            # client times are not the clock
    store.setattr(newer, SetAttr(mtime_ns=1 << 62))
    assert store.oldest_ready_ns() == first
    upload(store, older)
    assert first < store.oldest_ready_ns() <= store.clock_ns()

def test_upload_cycle_and_change_race(store):
    f = mkfile(store, b"f", b"hello")
    store.commit(f)
    ok, body = upload(store, f)
    assert ok and body == b"hello"
    a = store.getattr(f)
    assert a.data_state == DataState.CLEAN
    assert [(e.offset, e.length, e.state) for e in store.extents(f)] == [(0, 5, DataState.CLEAN)]
    assert store.remote_info(f).etag == "e" and store.ready_for_upload(FAR, 0) == []
    # a write during an upload: mark_uploaded refuses, the file stays dirty
    change = store.getattr(f).change
    store.set_data_state(f, DataState.UPLOADING, change)
    store.write(f, 0, b"J")
    assert not store.set_data_state(f, DataState.QUEUED, change)
    assert not store.mark_uploaded(f, RemoteInfo(uploaded_change=change))
    assert store.getattr(f).data_state == DataState.DIRTY
    with pytest.raises(StoreError) as e:
        store.set_data_state(f, DataState.CLEAN)
    assert e.value.errno == errno.EINVAL


def test_evict_fill_and_read_through(store):
    f = mkfile(store, b"f", b"0123456789" * 100)
    store.commit(f)
    assert upload(store, f)[0]
    assert store.usage()["used"] == 1000 and store.usage()["dirty"] == 0
    store.open_file(f, write=False)
    assert store.evict(f) == 0                           # open: not evictable
    store.close_file(f, write=False)
    assert store.eviction_candidates(1) == [f]
    assert store.evict(f) == 1000
    assert store.getattr(f).data_state == DataState.ABSENT and store.usage()["used"] == 0
    assert not os.path.exists(store.data.path(f))
    with pytest.raises(StoreError) as e:
        store.read(f, 10, 20)
    assert e.value.errno == errno.EAGAIN and e.value.missing == [(10, 20)]
    store.fill(f, 0, (b"0123456789" * 100)[:500])
    assert store.read(f, 10, 20)[0] == b"0123456789" * 2
    with pytest.raises(StoreError) as e:
        store.read(f, 490, 20)
    assert e.value.missing == [(500, 10)]
    store.write(f, 990, b"WRITTEN!!!")                   # a local write wins over a fill
    store.fill(f, 500, (b"0123456789" * 100)[500:])
    data, eof = store.read(f, 0, 2000)
    assert eof and data == (b"0123456789" * 99) + b"WRITTEN!!!"
    assert store.getattr(f).data_state == DataState.DIRTY


def test_import_object(store):
    r = RemoteInfo(key="a/b/c.bin", etag="x", size=100, uploaded_change=1)
    a = store.import_object("a/b/c.bin", 100, 0o644, 1, 2, 12345, r)
    assert a.size == 100 and a.data_state == DataState.ABSENT and a.mtime_ns == 12345
    assert store.path_of(a.ino) == "a/b/c.bin"
    assert store.remote_info(a.ino).etag == "x"
    assert store.import_object("a/b/c.bin", 5, 0o644, 1, 2, 0, r) is None
    assert store.import_object("a/b/c.bin/d", 5, 0o644, 1, 2, 0, r) is None
    with pytest.raises(StoreError) as e:
        store.read(a.ino, 0, 100)
    assert e.value.missing == [(0, 100)]
    store.fill(a.ino, 0, b"z" * 100)
    assert store.getattr(a.ino).data_state == DataState.CLEAN
    assert store.read(a.ino, 0, 200) == (b"z" * 100, True)
    # the imported file is not journaled; the parents import made are (their markers)
    assert [(j["op"], j["new_path"]) for _, j in store.queue_list()] == [("mkdir", "a"), ("mkdir", "a/b")]
    with pytest.raises(StoreError):
        store.import_object("a/../x", 1, 0o644, 0, 0, 0, r)


def test_pins_block_eviction(store):
    f = mkfile(store, b"f", b"x" * 100)
    store.commit(f)
    upload(store, f)
    store.set_pinned(f, True, "release-1")
    assert store.getattr(f).pinned and store.pinned() == {f: "release-1"}
    assert store.evict(f) == 0 and store.eviction_candidates(1) == []
    store.set_pinned(f, False)
    assert store.eviction_candidates(1) == [f]


def test_lru_order_and_maybe_evict(store_dir):
    s = Store.open(store_dir, capacity=10_000, high_watermark=0.5, low_watermark=0.2)
    inos = []
    for i in range(4):
        f = mkfile(s, b"f%d" % i, b"x" * 1500)
        s.commit(f)
        upload(s, f)
        inos.append(f)
    assert s.eviction_candidates(2000) == inos[:2]
    assert s.maybe_evict() == 4500                      # 6000 used > 5000: down to <= 2000
    assert [s.getattr(i).data_state for i in inos] == [DataState.ABSENT] * 3 + [DataState.CLEAN]
    assert s.maybe_evict() == 0
    assert s.check() == []
    s.close()


def test_queue(store_dir):
    s = Store.open(store_dir)
    a = s.queue_put({"kind": "put", "ino": 5})
    b = s.queue_put({"kind": "copy", "n": [1, 2]})
    assert b > a and s.queue_list() == [(a, {"kind": "put", "ino": 5}),
                                        (b, {"kind": "copy", "n": [1, 2]})]
    s.queue_update(a, {"kind": "put", "ino": 5, "upload_id": "u"})
    s.queue_done(b)
    with pytest.raises(StoreError) as e:
        s.queue_update(b, {})
    assert e.value.errno == errno.ENOENT
    s.sync()
    crash(s)
    s = Store.open(store_dir)
    assert s.queue_list() == [(a, {"kind": "put", "ino": 5, "upload_id": "u"})]
    assert s.queue_put({}) > b                           # ids never reused
    s.close()


def test_listed_jobs_are_decoded_once_and_never_stale_or_shared(store_dir, monkeypatch):
    """queue_list keeps decoded jobs between listings (cache/queuecache.py): a job is decoded
    again only when its stored bytes change, a caller's changes to what it was handed never
    reach another listing, and a job holding a list is decoded each time."""
    import cache.queuecache as queuecache
    decoded = []
    real_loads = queuecache.json.loads
    monkeypatch.setattr(queuecache.json, "loads", lambda raw: decoded.append(raw) or real_loads(raw))
    s = Store.open(store_dir)
    a = s.queue_put({"kind": "put", "ino": 5})
    b = s.queue_put({"kind": "ns", "object": ["k", "etag"]})
    first = s.queue_list()
    assert len(decoded) == 2
    first[0][1]["_path"] = "mine"                          # the scheduler's own key
    first[1][1]["object"].append("mine")
    assert s.queue_list() == [(a, {"kind": "put", "ino": 5}), (b, {"kind": "ns", "object": ["k", "etag"]})]
    assert len(decoded) == 3                               # only the job with a list again
    s.queue_update(a, {"kind": "put", "ino": 5, "upload_id": "u"})
    assert s.queue_list()[0] == (a, {"kind": "put", "ino": 5, "upload_id": "u"})
    s.queue_done(a)
    assert [j for j, _ in s.queue_list()] == [b]
    s.batch.applied()
    assert [j for j, _ in s.queue_list(limit=1)] == [b]
    s.close()


def test_remote_info_and_requeue_after_crash(store_dir):
    s = Store.open(store_dir)
    f = mkfile(s, b"f", b"data")
    s.commit(f)
    s.set_data_state(f, DataState.UPLOADING)
    s.set_remote_info(f, RemoteInfo(key="f", upload_id="U1", parts=[(1, "e1", "c1")]))
    crash(s)
    s = Store.open(store_dir)
    assert s.getattr(f).data_state == DataState.DIRTY
    assert s.ready_for_upload(FAR, 0) == [f]
    r = s.remote_info(f)
    assert r.upload_id == "U1" and r.parts == [(1, "e1", "c1")]
    s.close()


def test_noted_parts_never_wait_for_the_index_and_land_only_on_their_upload(store_dir):
    # the uploader notes each part on the event loop: the note is queued (lazy), not a write
    # txn of its own, so neither the index lock a batch commit holds nor an fdatasync per
    # part delays it; it lands with the next batch, and only while the record still names
    # its upload (a late note after completion or abort must not resurrect the upload)
    s = Store.open(store_dir)
    f = mkfile(s, b"f", b"data")
    s.set_remote_info(f, RemoteInfo(key="f", upload_id="U1", version_id="v0", data_seq=7))
    with index_lock_held(s):
        returned = _returns_within(lambda: s.note_parts(f, "U1", [(1, "e1", "c1")]))
    assert returned
    s.note_parts(f, "U1", [(1, "e1", "c1"), (2, "e2", "c2")])
    s.batch.applied()
    r = s.remote_info(f)
    assert (r.upload_id, r.parts) == ("U1", [(1, "e1", "c1"), (2, "e2", "c2")])
    assert (r.key, r.version_id, r.data_seq) == ("f", "v0", 7)  # only the parts changed
    s.note_parts(f, "U0", [(9, "e9", "c9")])                   # an older upload's late note
    s.set_remote_info(f, RemoteInfo(key="f", etag="E", upload_id=None, parts=[]))  # completed
    s.note_parts(f, "U1", [(3, "e3", "c3")])                   # this upload's late note
    s.batch.applied()
    r = s.remote_info(f)
    assert (r.etag, r.upload_id, r.parts) == ("E", None, [])
    s.note_parts(12345, "U1", [(1, "e1", "c1")])               # a file that is gone: ignored
    s.sync()
    crash(s)
    s = Store.open(store_dir)
    assert (s.remote_info(f).etag, s.remote_info(f).upload_id) == ("E", None)
    s.close()
    s.note_parts(f, "U1", [(1, "e1", "c1")])                   # once closed: dropped, no error


def test_read_racing_an_eviction_never_returns_zeros(store, monkeypatch):
    f = mkfile(store, b"f", b"precious" * 100)
    store.commit(f)
    upload(store, f)
    real = store.data.pread

    def pread_after_evict(ino, offset, n):     # the eviction lands between check and pread
        monkeypatch.setattr(store.data, "pread", real)
        assert store.evict(ino) == 800
        return real(ino, offset, n)

    monkeypatch.setattr(store.data, "pread", pread_after_evict)
    with pytest.raises(StoreError) as e:
        store.read(f, 0, 100)
    assert e.value.errno == errno.EAGAIN and e.value.missing == [(0, 100)]


def test_uncommitted_bytes_of_a_settled_file_are_committed_before_upload(store, tmp_path):
    """A client that died before COMMIT: the uploader takes the closed, settled file's
    current bytes and commits them first, so a restart never cuts bytes S3 already holds."""
    f = mkfile(store, b"f", b"x" * 10)
    store.commit(f)
    store.write(f, 10, b"y" * 5)                          # never COMMITted
    store.commit_settled(f)
    path = store.path
    crash(store)
    s = Store.open(path)
    try:
        assert s.read(f, 0, 100) == (b"x" * 10 + b"y" * 5, True)
    finally:
        s.close()


@pytest.mark.parametrize("grow", [0, 7, -3])
def test_setattr_size_is_durable_over_uncommitted_writes(store, grow):
    """SETATTR(size) is durable when it returns, also when the size does not change (a
    same-size truncate over an unstable write): a kill -9 after it keeps every byte below
    the size (before: recovery cut the file to its last COMMIT)."""
    f = mkfile(store, b"f", b"x" * 10)
    store.commit(f)
    store.write(f, 10, b"y" * 5)                          # unstable, never COMMITted
    size = 15 + grow
    store.setattr(f, SetAttr(size=size))
    want = (b"x" * 10 + b"y" * 5 + bytes(max(grow, 0)))[:size]
    path = store.path
    crash(store)
    s = Store.open(path)
    try:
        assert s.getattr(f).size == size
        assert s.read(f, 0, 100) == (want, True)
    finally:
        s.close()


def _returns_within(fn, seconds: float = 10) -> bool:
    """Whether fn() returns within `seconds` (run in a thread, which is left to finish)."""
    done = threading.Event()
    threading.Thread(target=lambda: (fn(), done.set()), daemon=True).start()
    return done.wait(seconds)


def test_reading_a_clean_file_never_waits_for_the_index_write_lock(store_dir, monkeypatch):
    # READ runs on the event loop: re-stamping the file's LRU key must not wait for the
    # index write lock, which a batch commit holds through its fdatasync (here: held by
    # another thread until the read has returned or failed to within the limit)
    import time
    import cache.store as store_mod
    s = Store.open(store_dir)
    f = mkfile(s, b"f", b"x" * 100)
    s.commit(f)
    upload(s, f)
    monkeypatch.setattr(store_mod, "LRU_GRANULARITY_NS", 0)        # every read re-stamps
    before = s.getattr(f)
    result = []
    with index_lock_held(s):
        returned = _returns_within(lambda: result.append(s.read(f, 0, 100)))
    assert returned and result[0][0] == b"x" * 100
    s.sync()
    for _ in range(100):            # the re-stamp lands with the next batch
        if s.getattr(f).atime_ns > before.atime_ns:
            break
        time.sleep(0.05)
    assert s.getattr(f).atime_ns > before.atime_ns and s.check() == []
    s.close()


def test_queue_done_never_waits_for_the_index_write_lock(store_dir):
    # the uploader marks a job done on the event loop: a write txn of its own would wait for
    # the index write lock, which a batch commit holds through its fdatasync (here: held by
    # another thread until queue_done has returned or failed to within the limit)
    s = Store.open(store_dir)
    a = s.queue_put({"kind": "put", "ino": 5})
    b = s.queue_put({"kind": "put", "ino": 6})
    with index_lock_held(s):
        returned = _returns_within(lambda: s.queue_done(a))
        listed = s.queue_list()     # gone from the list at once, its delete still queued
    assert returned and listed == [(b, {"kind": "put", "ino": 6})]
    with pytest.raises(StoreError) as e:
        s.queue_update(a, {})
    assert e.value.errno == errno.ENOENT
    s.sync()                        # waits for the queued delete, then makes it durable
    crash(s)
    s = Store.open(store_dir)
    assert s.queue_list() == [(b, {"kind": "put", "ino": 6})]
    s.close()


def _evict_page_cache(s, ino):
    fd = os.open(s.data.path(ino), os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def test_read_into_cached_answers_from_the_page_cache_only(store_dir):
    # READ runs read_into_cached on the event loop and read_into in a worker only when the
    # bytes must come from the disk (a cold page cache after a restart)
    s = Store.open(store_dir)
    data = os.urandom(256 << 10)
    f = mkfile(s, b"f", data)
    s.commit(f)
    buf = memoryview(bytearray(len(data) + 10))
    assert s.read_into_cached(f, 0, buf) == (len(data), True) and buf[:len(data)] == data
    if s.data.nowait_reads:         # a kernel with preadv2 RWF_NOWAIT (Linux 4.14+)
        _evict_page_cache(s, f)
        assert s.read_into_cached(f, 0, buf) is None
        assert s.read_into(f, 0, buf) == (len(data), True) and buf[:len(data)] == data
        assert s.read_into_cached(f, 100, buf[:50]) == (50, False) and buf[:50] == data[100:150]
    s.data.nowait_reads = False     # a file system that cannot tell: always the worker
    assert s.read_into_cached(f, 0, buf) is None
    assert s.read_into_cached(f, len(data), buf) == (0, True)     # nothing to read: no I/O
    s.close()


def test_queue_uploads_queues_settled_files_in_one_commit(store_dir):
    # a checkpoint's shards settle together: one index commit for all their jobs and states,
    # not two per file (each holds the index write lock the namespace batches need)
    s = Store.open(store_dir)
    a, b, c = (mkfile(s, n, b"x" * 10) for n in (b"a", b"b", b"c"))
    d = s.mkdir(ROOT_INO, b"d", 0o755, 0, 0)[0].ino
    for f in (a, b, c):
        s.commit(f)
    jobs = [{"kind": "upload", "ino": f, "change": s.getattr(f).change} for f in (a, b, c, d)]
    s.write(b, 0, b"y")                         # written since its job was made: settles anew
    s.remove(ROOT_INO, b"c")                    # gone
    before = s.ix.txnid
    assert s.queue_uploads(jobs + [{"kind": "upload", "ino": 999, "change": 1}]) == [a]
    assert s.ix.txnid == before + 1
    uploads = lambda: [j for _, j in s.queue_list() if j["kind"] == "upload"]    # noqa: E731
    assert uploads() == [jobs[0]]
    assert s.getattr(a).data_state == DataState.QUEUED and s.getattr(b).data_state == DataState.DIRTY
    s.sync()
    crash(s)
    s = Store.open(store_dir)
    assert uploads() == [jobs[0]] and s.check() == []
    s.close()

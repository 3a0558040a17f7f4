"""Writes answered before their index record (cache/store.py I5, `Store.write_nowait`).

nfsd's UNSTABLE WRITE pwrites on the event loop and replies while its size/extent record is
still a queued lazy batch op. Each test holds that record back (LAZY_DELAY of an hour: only
an op that is waited for, a kick or a close lets it land) and checks what another client,
a COMMIT, a truncate, a fill, an unlink, the uploader or a crash sees meanwhile.
"""
from __future__ import annotations

import errno
import threading

import pytest

from cache import batch as batch_module
from cache.api import DataState, RemoteInfo, ROOT_INO, SetAttr, StoreError
from cache.index import F_UNCOMMITTED
from cache.store import Store

from tests.cache.storehelp import crash

MiB = 1 << 20


@pytest.fixture(autouse=True)
def records_held_back(monkeypatch):
    monkeypatch.setattr(batch_module, "LAZY_DELAY", 3600.0)


def new_file(s, name=b"f", data=b"", opened=False):
    """A file in its commit cycle (created with F_UNCOMMITTED, durable), `data` written;
    opened: open for write (a COMMIT then keeps the flag for the writer's next cycle)."""
    a, _, _ = s.create(ROOT_INO, name, 0o644, 0, 0)
    if opened:
        s.open_file(a.ino, True)
    if data:
        s.write(a.ino, 0, data)
    return a.ino


def pending(s, ino):
    return len(s._pending.get(ino, ()))


def test_a_reader_sees_an_answered_write_before_its_record(store):
    ino = new_file(store, data=b"a" * 100)
    before = store.getattr(ino)
    assert store.write_nowait(ino, 100, b"b" * 50)
    assert pending(store, ino) == 1
    a = store.getattr(ino)
    assert a.size == 150 and a.change == before.change + 1
    assert a.data_seq == (before.data_seq + 1) & 0xFFFFFFFF
    got, eof = store.read(ino, 0, 1000)
    assert bytes(got) == b"a" * 100 + b"b" * 50 and eof
    assert store.lookup(ROOT_INO, b"f").size == 150
    assert [e.attr.size for e in store.readdir(ROOT_INO)] == [150]
    assert store.content_runs(ino, 0, 1000) == [(0, 150, True)]
    store.batch.applied()
    assert pending(store, ino) == 0 and not store._inflight
    b = store.getattr(ino)
    assert (b.size, b.change, b.mtime_ns, b.data_seq) == (a.size, a.change, a.mtime_ns, a.data_seq)


def test_commit_makes_queued_records_durable(store_dir):
    s = Store.open(store_dir)
    ino = new_file(s, data=b"a" * 10)
    assert s.write_nowait(ino, 10, b"b" * 10)
    s.commit(ino)
    assert pending(s, ino) == 0
    crash(s)
    s = Store.open(store_dir)
    got, _ = s.read(ino, 0, 100)
    assert bytes(got) == b"a" * 10 + b"b" * 10
    assert s.check() == []
    s.close()


def test_a_crash_loses_an_uncommitted_answered_write_as_any_unstable_write(store_dir):
    s = Store.open(store_dir)
    ino = new_file(s, data=b"a" * 10, opened=True)
    s.commit(ino)
    assert s.write_nowait(ino, 10, b"b" * 10)
    assert s.write_nowait(ino, 0, b"c" * 5)      # within the committed size: stays (page cache)
    crash(s)                                        # the records never land
    s = Store.open(store_dir)
    assert s.getattr(ino).size == 10               # cut to the committed size (I2: flag durable)
    got, _ = s.read(ino, 0, 100)
    assert bytes(got) == b"c" * 5 + b"a" * 5
    assert s.check() == []
    s.close()


def test_truncate_after_an_answered_write_applies_after_its_record(store):
    ino = new_file(store, data=b"a" * 10)
    assert store.write_nowait(ino, 10, b"b" * 100)
    store.setattr(ino, SetAttr(size=20))          # waits for the record (kicks the batch)
    assert pending(store, ino) == 0
    assert store.getattr(ino).size == 20
    got, _ = store.read(ino, 0, 1000)
    assert bytes(got) == b"a" * 10 + b"b" * 10
    assert store.data.length(ino) <= 20


def test_a_fill_never_overwrites_an_answered_write(store):
    ino = new_file(store, data=b"a" * 8192)
    store.commit(ino)
    store.close_file  # noqa: B018 - (not opened)
    assert store.set_data_state(ino, DataState.UPLOADING, store.getattr(ino).change)
    assert store.mark_uploaded(ino, RemoteInfo(key="f", uploaded_change=store.getattr(ino).change))
    assert store.evict(ino) == 8192
    # the first write of the cycle flags the file (pool path), the next is answered at once
    store.write(ino, 0, b"x")
    assert store.write_nowait(ino, 4096, b"y" * 10)
    got = None
    try:
        store.read(ino, 0, 8192)
    except StoreError as e:
        assert e.errno == errno.EAGAIN
        # the answered write's range is local, not missing
        assert all(not (off < 4106 and 4096 < off + n) for off, n in e.missing), e.missing
        for off, n in e.missing:
            store.fill(ino, off, b"a" * n)
        got, _ = store.read(ino, 0, 8192)
    assert bytes(got) == b"x" + b"a" * 4095 + b"y" * 10 + b"a" * (8192 - 4106)


def test_unlink_while_a_record_is_queued_reclaims_after_it(store):
    ino = new_file(store, data=b"a")
    assert store.write_nowait(ino, 1, b"b" * 10)
    store.remove(ROOT_INO, b"f")
    store.batch.applied()
    with pytest.raises(StoreError) as e:
        store.getattr(ino)
    assert e.value.errno == errno.ESTALE
    store.sync()
    store.batch.applied()
    assert store.data.length(ino) is None
    assert not store._inflight and not store._pending


def test_a_commit_fails_while_a_record_it_covers_has_not_landed(store, monkeypatch):
    ino = new_file(store, data=b"a")
    real = store._record_write
    fails = [StoreError(errno.EAGAIN, "store index map grown; retry")]

    def flaky(w, *args, **kw):
        if kw.get("counted") and fails:
            raise fails.pop()
        return real(w, *args, **kw)
    monkeypatch.setattr(store, "_record_write", flaky)
    assert store.write_nowait(ino, 1, b"b" * 10)
    with pytest.raises(StoreError) as e:
        store.commit(ino)            # in the batch of the failed record: not durable with it
    assert e.value.errno == errno.EAGAIN
    store.commit(ino)                # the retried record landed before this one
    assert store.getattr(ino).size == 11
    assert store.ix.read_inode(ino).committed_size == 11


def test_the_uploader_commits_queued_records_before_it_reads(store):
    ino = new_file(store, data=b"a")
    assert store.write_nowait(ino, 1, b"b" * 10)
    store.commit_settled(ino)
    rec = store.ix.read_inode(ino)
    assert rec.committed_size == rec.size == 11 and not rec.flags & F_UNCOMMITTED
    assert pending(store, ino) == 0


def test_no_room_and_a_new_cycle_take_the_worker_path(store_dir):
    s = Store.open(store_dir, capacity=MiB, evict=False)
    ino = new_file(s, data=b"a")
    assert not s.write_nowait(ino, 0, b"b" * (2 * MiB))      # no room: write() says EAGAIN
    with pytest.raises(StoreError) as e:
        s.write(ino, 0, b"b" * (2 * MiB))
    assert e.value.errno == errno.EAGAIN
    s.commit(ino)
    s.close_file  # noqa: B018
    # committed and no writer open: the flag is gone, the next cycle's first write flags it
    assert not s.ix.read_inode(ino).flags & F_UNCOMMITTED
    assert not s.write_nowait(ino, 0, b"c")
    s.write(ino, 0, b"c")
    assert s.write_nowait(ino, 1, b"d")
    assert s.check() == []
    s.close()


def test_a_flag_txn_not_synced_yet_is_not_taken_for_durable(store):
    """I2: between another writer's flag txn commit and its sync, write_nowait stays off."""
    ino = new_file(store, data=b"a")
    store.commit(ino)
    assert not store.ix.read_inode(ino).flags & F_UNCOMMITTED
    seen = []
    real_sync = store.committer.sync

    def sync(upto=None):
        if store._flag_unsynced and not seen:
            seen.append(store.write_nowait(ino, 0, b"z"))
        return real_sync(upto)
    store.committer.sync = sync
    try:
        store.write(ino, 0, b"b")
    finally:
        store.committer.sync = real_sync
    assert seen == [False]
    assert store.write_nowait(ino, 1, b"c")


def test_answered_writes_from_many_threads_and_a_commit(store):
    ino = new_file(store, data=b"a")
    errors = []

    def writer(k):
        try:
            for i in range(50):
                off = (k * 50 + i) * 10
                if not store.write_nowait(ino, off, bytes([65 + k]) * 10):
                    store.write(ino, off, bytes([65 + k]) * 10)
        except BaseException as e:   # noqa: BLE001
            errors.append(e)
    threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert store.getattr(ino).size == 2000
    store.commit(ino)
    got, _ = store.read(ino, 0, 2000)
    assert bytes(got) == b"".join(bytes([65 + k]) * 500 for k in range(4))
    assert store.ix.read_inode(ino).committed_size == 2000


def land_record_at(s, at: str, ino: int) -> list:
    """Set s.race_hook so that the first time the store reaches hook point `at` for `ino`,
    the batch lands ino's queued write record (and it leaves _pending) right there. Returns
    a list that is non-empty once that happened."""
    landed = []

    def hook(point, i):
        if point == at and i == ino and not landed:
            landed.append(True)
            done = threading.Thread(target=s.batch.applied)   # the record lands now
            done.start()
            done.join()
            assert pending(s, ino) == 0
    s.race_hook = hook
    return landed


def test_commit_counts_a_record_that_lands_while_it_reads_the_size(store_dir):
    """Found by the kill -9 long run (tests/cache/test_crash.py, CKPTGW_LONG=1, seed 31: a
    1-byte checkpoint renamed into place after an acknowledged COMMIT was empty after the
    kill). COMMIT read the index size (0, the record still queued), then the record landed
    and left _pending, then COMMIT added the pending writes (none left): it recorded a
    committed size of 0, and recovery cut the acknowledged byte."""
    s = Store.open(store_dir)
    ino = new_file(s)
    assert s.write_nowait(ino, 0, b"x")
    landed = land_record_at(s, "live_size.read", ino)
    s.commit(ino)
    s.race_hook = None
    assert landed
    assert s.ix.read_inode(ino).committed_size == 1
    crash(s)
    s = Store.open(store_dir)
    got, _ = s.read(ino, 0, 10)
    assert bytes(got) == b"x"
    s.close()


def test_check_counts_a_record_that_lands_after_its_snapshot(store_dir):
    """Found by the integrity model's long run (seed 20261128, 7fce2e7): `store check:
    inode 4: data file 3882 bytes, longer than size 0`. check() read the index snapshot (size
    0, the write's record still queued), the record landed and left _pending, then check
    compared the data file with the snapshot's size plus the pending writes (none left): a
    consistent store reported as broken. It scans again when that may be a write in flight."""
    from cache.check import check
    s = Store.open(store_dir)
    ino = new_file(s)
    assert s.write_nowait(ino, 0, b"y" * 3882)
    landed = land_record_at(s, "check.live_size", ino)
    try:
        assert check(s) == []
    finally:
        s.race_hook = None
    assert landed
    s.close()


def test_check_ignores_a_file_created_after_its_snapshot(store_dir):
    """Seen by the HA failover test (session 20): `ckptgw check` on a gateway whose client was
    saving reported "data file 187 has no inode". check() lists the data files after it took
    its index snapshot, so a file created in between had a data file and no inode in that
    snapshot. An ino the snapshot had not given out yet is not a stray; one it had still is."""
    from cache.check import check
    s = Store.open(store_dir)
    real = s.data.all_inos
    late = []

    def create_then_list():
        def save():                          # another client, on its own thread
            late.append(new_file(s))
            s.write(late[0], 0, b"late")
        t = threading.Thread(target=save)
        t.start()
        t.join()
        return real()
    s.data.all_inos = create_then_list
    try:
        assert check(s) == []
    finally:
        del s.data.all_inos
    assert late and s.data.length(late[0]) == 4 and check(s) == []
    # a data file of an ino given out before the snapshot, with no inode: still reported
    s.unlink(ROOT_INO, b"f")
    s.sync()
    new_file(s, b"g")                                  # its txn clears f's orphan key
    s.data.pwrite(late[0], 0, b"stray")                # behind the store's back
    assert check(s) == [f"data file {late[0]} has no inode"]
    s.close()


def test_check_still_reports_a_data_file_longer_than_its_size(store_dir):
    """The scan again is for a write in flight only: bytes past the size that stay are reported."""
    from cache.check import check
    s = Store.open(store_dir)
    ino = new_file(s)
    s.data.pwrite(ino, 0, b"z" * 100)                 # behind the store's back
    assert check(s) == [f"inode {ino}: data file 100 bytes, longer than size 0"]
    s.close()

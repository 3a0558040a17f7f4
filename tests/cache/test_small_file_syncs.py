"""Fewer index txns and syncs per small-file save (issue 15), none less durable.

nfs-rs's open(path, "wb") of a file it has just created sends the mode and size 0 again, two
SETATTRs per small-file save; a SETATTR that changes nothing writes nothing. SETATTRs without a
size and COMMIT's index record go through the batch committer."""
from __future__ import annotations

import errno

import pytest

from cache.api import ROOT_INO, SetAttr, StoreError
from cache.index import F_UNCOMMITTED
from tests.cache.storehelp import hold_next_group_sync


def _fresh(store):
    attr, _, _ = store.create(ROOT_INO, b"f", 0o666, 7, 8)
    return attr


@pytest.mark.parametrize("sa", [SetAttr(mode=0o666), SetAttr(size=0),
                                SetAttr(mode=0o100666, uid=7, gid=8, size=0)])
def test_unchanged_values_write_no_txn(store, sa):
    before = _fresh(store)
    txnid, syncs = store.ix.txnid, store.committer.syncs
    after = store.setattr(before.ino, sa)
    assert (store.ix.txnid, store.committer.syncs) == (txnid, syncs)
    assert after == before                     # change and ctime untouched too
    assert store.durable()


@pytest.mark.parametrize("sa", [SetAttr(mode=0o640), SetAttr(size=0)])
def test_an_unchanged_setattr_returns_only_once_what_it_saw_is_durable(store, sa):
    """Regression: the attributes an unchanged SETATTR reports may come from a commit not yet
    synced (LMDB's newest meta page); it wrote nothing itself, but "durable on return" holds
    for what it answers. Without a size it returned before any sync."""
    f = _fresh(store).ino
    with store.ix.write() as w:                # a committed change nobody has synced yet
        rec = w.must_inode(f)
        new = rec.copy()
        new.mode = 0o640
        w.put_inode(new, rec)
    assert not store.durable()
    assert store.setattr(f, sa).mode == 0o640
    assert store.durable()


@pytest.mark.parametrize("sa", [SetAttr(mode=0o600), SetAttr(size=1), SetAttr(uid=9),
                                SetAttr(gid=9), SetAttr(mode=0o666, mtime_ns="now"),
                                SetAttr(atime_ns=5)])
def test_any_change_or_time_still_commits(store, sa):
    before = _fresh(store)
    txnid = store.ix.txnid
    after = store.setattr(before.ino, sa)
    assert store.ix.txnid > txnid
    assert after.change > before.change


def test_unchanged_size_of_a_directory_is_still_refused(store):
    with pytest.raises(StoreError) as e:
        store.setattr(ROOT_INO, SetAttr(size=4096))
    assert e.value.errno == errno.EISDIR


def test_setattr_without_size_is_batched_and_durable_on_return(store):
    """Mode/owner/times go through the batch committer (one txn and one sync with the
    namespace ops queued beside them, issue 15's 8-client loop) and are durable on return."""
    f = _fresh(store).ino
    ops = store.batch.ops
    a = store.setattr(f, SetAttr(mode=0o600, uid=3))
    assert store.batch.ops == ops + 1
    assert (a.mode, a.uid) == (0o600, 3) and store.getattr(f).mode == 0o600
    assert store.durable()


def test_setattr_with_size_is_durable_on_return(store):
    f = _fresh(store).ino
    store.setattr(f, SetAttr(size=0, mode=0o640))     # size unchanged, mode changed: a txn
    assert store.getattr(f).mode == 0o640
    assert store.durable()


def test_commit_is_recorded_by_the_batch_committer(store):
    """COMMIT's index record (committed size, flags) shares a batch with the namespace ops
    queued beside it instead of a serialized txn of its own, and is durable on return."""
    f = _fresh(store).ino
    store.write(f, 0, b"x" * 4096)
    ops = store.batch.ops
    store.commit(f)
    assert store.batch.ops == ops + 1
    rec = store.ix.read_inode(f)
    assert rec.committed_size == 4096 and not rec.unsettled
    assert store.durable()


def test_a_new_file_is_flagged_uncommitted_by_its_create_and_its_first_write_syncs_nothing(store):
    """A new regular file carries F_UNCOMMITTED from its (durable) create, so its first WRITE
    writes no flag txn and waits for no sync; its index update joins the batch."""
    f = _fresh(store).ino
    rec = store.ix.read_inode(f)
    assert rec.unsettled and rec.committed_size == 0
    syncs, ops = store.committer.syncs, store.batch.ops
    store.write(f, 0, b"y" * 4096)
    assert store.committer.syncs == syncs          # no flag txn + sync before the bytes
    assert store.batch.ops == ops + 1              # the index update: one batched op
    assert store.getattr(f).size == 4096           # readable at once
    store.commit(f)
    assert not store.ix.read_inode(f).unsettled


def test_first_write_to_a_file_whose_create_is_not_yet_durable_waits_for_it(store):
    """Regression (found in review of the change above): another client can LOOKUP a new file
    once its create is committed, before that commit is durable. Its first WRITE, which skips
    the flag txn, must still not change bytes before the create (and its flag) is durable:
    after a power cut the ino would be reused with those bytes in its extent file."""
    import threading
    import time

    flushing, gate = hold_next_group_sync(store)
    fut = store.submit("create", ROOT_INO, b"g", 0o644, 0, 0, False)
    assert flushing.wait(30)                       # committed, its sync held
    ino = store.lookup(ROOT_INO, b"g").ino         # visible to another client
    create_txn = store.ix.txnid
    seen = []

    def hook(point, i):
        if point == "write.pwritten" and i == ino:
            seen.append(store.committer.covered(create_txn))
    store.race_hook = hook
    store.open_file(ino, True)
    writer = threading.Thread(target=store.write, args=(ino, 0, b"z" * 100))
    writer.start()
    time.sleep(0.3)
    assert seen == []                              # no byte before the create is durable
    gate.set()
    writer.join(30)
    fut.result(30)
    assert seen == [True]
    store.race_hook = None
    store.close_file(ino, True)


def test_a_stable_write_is_one_index_commit_and_durable_on_return(store):
    """A FILE_SYNC WRITE (write_stable) records its size/extents and its commit in one batch
    op: one index commit per write of a stream, none for a flag txn, since the file keeps
    F_UNCOMMITTED between them; durable on return, committed size = size."""
    f = _fresh(store).ino
    store.open_file(f, True)
    for i in range(3):
        txnid, ops = store.ix.txnid, store.batch.ops
        a = store.write_stable(f, i * 4096, b"s" * 4096)
        assert (store.ix.txnid, store.batch.ops) == (txnid + 1, ops + 1)
        assert store.durable()
        rec = store.ix.read_inode(f)
        assert a.size == rec.size == rec.committed_size == (i + 1) * 4096
        assert rec.flags & F_UNCOMMITTED            # kept: the next write needs no flag txn
    store.close_file(f, True)
    assert not store.ix.read_inode(f).unsettled     # nothing written since: the close clears it


def test_a_stable_write_past_the_end_commits_the_gap_in_two_steps(store):
    """A stable write that leaves a gap past the recorded end cannot call the gap committed
    on its own datasync (another writer's bytes there may not be pwritten yet): it records,
    then commits as COMMIT does; still durable on return with committed size = size."""
    f = _fresh(store).ino
    ops = store.batch.ops
    store.write_stable(f, 10000, b"g" * 100)
    assert store.batch.ops == ops + 2
    rec = store.ix.read_inode(f)
    assert rec.size == rec.committed_size == 10100
    assert store.durable()
    assert bytes(store.read(f, 0, 10100)[0]) == bytes(10000) + b"g" * 100


def test_a_stable_write_survives_a_crash_with_the_unstable_bytes_before_it(store_dir):
    """kill -9 after a stable write: its bytes, and every byte written before it, stay."""
    from cache.store import Store
    from tests.cache.storehelp import crash
    s = Store.open(store_dir)
    f = _fresh(s).ino
    s.write(f, 0, b"u" * 5000)                     # unstable
    s.write_stable(f, 5000, b"s" * 3000)
    s.write(f, 8000, b"x" * 10)                    # unstable, after: may be cut
    crash(s)
    s = Store.open(store_dir)
    rec = s.getattr(f)
    assert rec.size == 8000
    assert bytes(s.read(f, 0, 8000)[0]) == b"u" * 5000 + b"s" * 3000
    s.close()


def test_close_commits_many_new_files_in_a_few_txns(store_dir):
    """Every new file is F_UNCOMMITTED until written and committed, so close() finds them
    all live: one txn and one sync each made closing a store of 1M new files (issue 15's
    scale bench) take half an hour. It commits them a chunk per txn."""
    from cache.store import CLOSE_COMMIT_CHUNK, Store
    s = Store.open(store_dir)
    n = 2 * CLOSE_COMMIT_CHUNK + 10
    futs = [s.submit("create", ROOT_INO, b"f%d" % i, 0o644, 0, 0, False) for i in range(n)]
    inos = [f.result(60)[0].ino for f in futs]
    s.write(inos[0], 0, b"w" * 100)                 # unstable: close commits it
    txnid, syncs = s.ix.txnid, s.committer.syncs
    s.close()
    assert s.ix.txnid - txnid <= 3
    assert s.committer.syncs - syncs <= 1
    s = Store.open(store_dir)
    assert not s.ix.read_inode(inos[1]).unsettled
    rec = s.ix.read_inode(inos[0])
    assert (rec.committed_size, rec.unsettled) == (100, False)
    assert s.check() == []
    s.close()


def test_write_commit_cycles_of_an_open_file_write_no_flag_txn(store):
    """nfs-rs (and the Linux client) save a big file as UNSTABLE WRITEs then a COMMIT, again
    and again. A COMMIT used to clear F_UNCOMMITTED, so the next cycle's first WRITE wrote a
    flag txn and waited for two syncs before its bytes. While a writer has the file open,
    a COMMIT keeps the flag; the last writer's close clears it if nothing changed since."""
    f = _fresh(store).ino
    store.open_file(f, True)
    for i in range(3):
        txnid, syncs, ops = store.ix.txnid, store.committer.syncs, store.batch.ops
        store.write(f, i * 4096, b"c" * 4096)
        assert store.committer.syncs == syncs          # no flag txn, no sync before the bytes
        assert (store.ix.txnid, store.batch.ops) == (txnid + 1, ops + 1)   # its record only
        store.commit(f)
        rec = store.ix.read_inode(f)
        assert rec.committed_size == rec.size == (i + 1) * 4096 and store.durable()
        assert rec.flags & F_UNCOMMITTED            # kept for the writer's next cycle
    store.close_file(f, True)
    rec = store.ix.read_inode(f)
    assert not rec.unsettled and rec.is_dirty       # whole, and still to upload
    assert store.ready_for_upload() == [f]
    assert store.check() == []


def test_a_write_after_the_last_commit_keeps_the_flag_through_the_close(store):
    """The close clears the flag only if no write came after the commit that kept it; an
    uncommitted write leaves it for the uploader's commit_settled (which fdatasyncs)."""
    f = _fresh(store).ino
    store.open_file(f, True)
    store.write(f, 0, b"a" * 100)
    store.commit(f)
    store.write(f, 0, b"b" * 100)                    # same size, never committed
    store.close_file(f, True)
    assert store.ix.read_inode(f).flags & F_UNCOMMITTED
    store.commit_settled(f)
    assert not store.ix.read_inode(f).unsettled


def test_a_truncate_after_the_last_commit_keeps_the_flag_through_the_close(store):
    f = _fresh(store).ino
    store.open_file(f, True)
    store.write(f, 0, b"a" * 100)
    store.commit(f)
    store.setattr(f, SetAttr(size=10))
    store.close_file(f, True)
    rec = store.ix.read_inode(f)
    assert rec.size == rec.committed_size == 10      # SETATTR(size) commits too...
    store.commit_settled(f)                          # ...and whatever is left, this ends
    assert not store.ix.read_inode(f).unsettled


def test_an_unstable_write_after_a_commit_kept_the_flag_is_cut_by_a_crash(store_dir):
    """The flag a commit kept is what sends recovery to the file: bytes written after the
    commit without a flag txn are cut back to the committed size after kill -9."""
    from cache.store import Store
    from tests.cache.storehelp import crash
    s = Store.open(store_dir)
    f = _fresh(s).ino
    s.open_file(f, True)
    s.write(f, 0, b"k" * 4096)
    s.commit(f)
    s.write(f, 4096, b"u" * 4096)                    # no flag txn: the flag was kept
    crash(s)
    s = Store.open(store_dir)
    rec = s.getattr(f)
    assert rec.size == 4096
    assert bytes(s.read(f, 0, 4096)[0]) == b"k" * 4096
    assert s.check() == []
    s.close()


def test_an_upload_of_bytes_that_may_be_uncommitted_does_not_make_the_file_clean(store):
    """Regression: the uploader commits a settled file (commit_settled), then reads its
    change counter for the job. A client that opened and wrote the file in between left
    bytes not yet on disk that the upload then sent; marking the file CLEAN made a power
    cut leave torn local bytes that recovery never visits (it visits dirty files only).
    mark_uploaded refuses CLEAN while F_UNCOMMITTED is set; the file goes again."""
    from cache.api import DataState, RemoteInfo
    f = _fresh(store).ino
    store.write(f, 0, b"old" * 100)
    store.commit_settled(f)                          # the uploader's commit: flag cleared
    store.open_file(f, True)
    store.write(f, 0, b"new" * 100)                  # flag txn, bytes in the page cache
    change = store.getattr(f).change                 # the job's change: includes the write
    assert store.set_data_state(f, DataState.UPLOADING, change)
    assert not store.mark_uploaded(f, RemoteInfo(key="f", uploaded_change=change))
    assert store.getattr(f).data_state == DataState.DIRTY
    assert store.ix.read_inode(f).unsettled          # recovery still visits it
    store.close_file(f, True)
    store.commit_settled(f)
    assert store.set_data_state(f, DataState.UPLOADING, change)
    assert store.mark_uploaded(f, RemoteInfo(key="f", uploaded_change=change))
    assert store.getattr(f).data_state == DataState.CLEAN

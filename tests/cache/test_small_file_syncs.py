"""Fewer index txns and syncs per small-file save (issue 15), none less durable.

nfs-rs's open(path, "wb") of a file it has just created sends the mode and size 0 again, two
SETATTRs per small-file save; a SETATTR that changes nothing writes nothing. SETATTRs without a
size and COMMIT's index record go through the batch committer."""
from __future__ import annotations

import errno

import pytest

from cache.api import ROOT_INO, SetAttr, StoreError


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

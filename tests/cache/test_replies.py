"""Reply records (cache/replies.py, issue 38): a RENAME's or REMOVE's answer kept for the
client that sent it, in the op's own txn, bounded per client, deleted with the client's
record, and on disk across a close and reopen of the store."""
from __future__ import annotations

import errno

import pytest

from cache.api import ROOT_INO, StoreError
from cache.index import client_key
from cache.replies import REMOVE, RENAME, ReplyNote
from cache.store import Store


def note(owner=b"client-a", keep=4, boot=b"boot0001"):
    return ReplyNote(owner=owner, verifier=b"verf0001", boot=boot, keep=keep)


@pytest.fixture
def store(store):
    """The store with client records for client-a and client-b (records live only beside one)."""
    for owner in (b"client-a", b"client-b"):
        store.put_client_record(owner, b"\x01\x01")
    return store


def mkfile(s, name: bytes) -> int:
    attr, _, _ = s.create(ROOT_INO, name, 0o644, 0, 0)
    return attr.ino


def test_a_rename_records_its_answer_in_its_own_txn(store):
    ino = mkfile(store, b"x.tmp")
    cinfo = store.submit_noted("rename", note(), ROOT_INO, b"x.tmp", ROOT_INO, b"x").result()
    assert store.lookup(ROOT_INO, b"x").ino == ino
    [rec] = store.reply_records(b"client-a")
    assert (rec.op, rec.src_dir, rec.old, rec.dst_dir, rec.new, rec.ino) == \
        (RENAME, ROOT_INO, b"x.tmp", ROOT_INO, b"x", ino)
    assert (rec.boot, rec.verifier) == (b"boot0001", b"verf0001")
    assert rec.cinfo == tuple(cinfo)
    assert store.reply_records(b"client-b") == []


def test_a_failed_op_records_nothing(store):
    with pytest.raises(StoreError) as e:
        store.submit_noted("rename", note(), ROOT_INO, b"absent", ROOT_INO, b"x").result()
    assert e.value.errno == errno.ENOENT
    with pytest.raises(StoreError):
        store.submit_noted("remove", note(), ROOT_INO, b"absent").result()
    assert store.reply_records(b"client-a") == []


def test_a_remove_records_the_file_it_removed(store):
    ino = mkfile(store, b"old")
    ci = store.submit_noted("remove", note(), ROOT_INO, b"old").result()
    [rec] = store.reply_records(b"client-a")
    assert (rec.op, rec.src_dir, rec.old, rec.dst_dir, rec.new, rec.ino) == \
        (REMOVE, ROOT_INO, b"old", 0, b"", ino)
    assert rec.cinfo == (ci, ci)


def test_only_the_newest_are_kept_per_client(store):
    for i in range(7):
        mkfile(store, b"f%d" % i)
        store.submit_noted("rename", note(keep=3), ROOT_INO, b"f%d" % i, ROOT_INO, b"g%d" % i
                           ).result()
    mkfile(store, b"other")
    store.submit_noted("remove", note(owner=b"client-b", keep=3), ROOT_INO, b"other").result()
    assert [r.old for r in store.reply_records(b"client-a")] == [b"f4", b"f5", b"f6"]
    assert [r.seq for r in store.reply_records(b"client-a")] == [4, 5, 6]
    assert [r.old for r in store.reply_records(b"client-b")] == [b"other"]


def test_interleaved_clients_and_gaps_keep_each_clients_newest(store):
    """The newest key of a client is found next to other clients' keys on both sides (the
    store sorts them by digest), and a consumed record's gap never lets one beyond the bound."""
    owners = [b"client-a", b"client-b", b"client-c"]
    store.put_client_record(b"client-c", b"\x01\x01")
    assert len({client_key(o) < client_key(p) for o in owners for p in owners if o != p}) == 2
    removed = {o: [] for o in owners}
    for i in range(15):
        owner = owners[i % 3]
        mkfile(store, b"f%d" % i)
        store.submit_noted("remove", note(owner=owner, keep=3), ROOT_INO, b"f%d" % i).result()
        removed[owner].append(b"f%d" % i)
        if i == 7:          # client-b holds 3: its middle one consumed, a gap
            middle = store.reply_records(b"client-b")[1]
            store.submit_reply_consumed(b"client-b", middle.seq).result()
    for owner in owners:
        recs = store.reply_records(owner)
        assert [r.seq for r in recs] == sorted(r.seq for r in recs)
        assert 1 <= len(recs) <= 3 and recs[-1].old == removed[owner][-1], (owner, recs)
        assert {r.old for r in recs} <= set(removed[owner][-3:]), (owner, recs)


def test_a_record_is_consumed_once(store):
    for name in (b"a", b"b"):
        mkfile(store, name)
        store.submit_noted("remove", note(), ROOT_INO, name).result()
    first, second = store.reply_records(b"client-a")
    store.submit_reply_consumed(b"client-a", first.seq).result()
    assert store.reply_records(b"client-a") == [second]
    store.submit_reply_consumed(b"client-a", first.seq).result()     # gone already: nothing
    assert store.reply_records(b"client-a") == [second]


def test_a_client_without_a_client_record_gets_none(store):
    mkfile(store, b"x")
    store.submit_noted("remove", note(owner=b"client-c"), ROOT_INO, b"x").result()
    assert store.reply_records(b"client-c") == []
    with pytest.raises(StoreError):
        store.lookup(ROOT_INO, b"x")                 # the op itself was done


def test_records_go_with_the_client_record(store):
    for owner in (b"client-a", b"client-b"):
        mkfile(store, owner)
        store.submit_noted("remove", note(owner=owner), ROOT_INO, owner).result()
    store.delete_client_record(b"client-a")
    assert store.reply_records(b"client-a") == []
    assert [r.old for r in store.reply_records(b"client-b")] == [b"client-b"]


def test_records_survive_close_and_reopen(store_dir):
    s = Store.open(store_dir)
    try:
        s.put_client_record(b"client-a", b"\x01\x01")
        ino = mkfile(s, b"x.tmp")
        s.submit_noted("rename", note(boot=s.write_verifier), ROOT_INO, b"x.tmp", ROOT_INO,
                       b"x").result()
        boot = s.write_verifier
    finally:
        s.close()
    s = Store.open(store_dir)
    try:
        assert s.write_verifier != boot           # another instance reads them
        [rec] = s.reply_records(b"client-a")
        assert (rec.old, rec.new, rec.ino, rec.boot) == (b"x.tmp", b"x", ino, boot)
        assert s.check() == []
    finally:
        s.close()


def test_only_rename_and_remove_are_recorded(store):
    with pytest.raises(ValueError):
        store.submit_noted("link", note(), 5, ROOT_INO, b"x")


def test_check_flags_a_record_without_its_client(store):
    mkfile(store, b"x")
    store.submit_noted("remove", note(), ROOT_INO, b"x").result()
    assert store.check() == []
    with store.ix.write() as w:          # what no store op does: the client record alone goes
        w.txn.delete(client_key(b"client-a"), db=store.ix.clients)
    problems = store.check()
    assert len(problems) == 1 and "without a client record" in problems[0]
    store.put_client_record(b"client-a", b"\x01\x01")

"""One file's writes, fills, truncates, evictions and reclaims are linearizable, and bytes
leave an extent file only after the index change that stops describing them is durable
(issue 13 point 4; invariants I1-I4 at the top of cache/store.py).

Each race is forced deterministically: the writer is held right after its pwrite (before
its index update) by wrapping DataFiles.pwrite, and the racing operation runs until it
either finishes (the old, racy code) or reports through `store.race_hook` that it waits
for the write; only then is the writer let go. The crash points kill a child process with
SIGKILL between the durable index change and the file operation."""
from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from cache.api import DataState, ROOT_INO, SetAttr, StoreError
from cache.store import Store

from tests.cache.test_uploader_api import mkfile, upload

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WAIT = 10


class HeldWrite:
    """Run store.write in a thread and hold it between its pwrite and its index update."""

    def __init__(self, store, ino, offset, data):
        self.store, self.pwritten, self.go = store, threading.Event(), threading.Event()
        self.thread = threading.Thread(target=store.write, args=(ino, offset, data))
        real = store.data.pwrite

        def pwrite(i, off, buf):
            real(i, off, buf)
            if threading.current_thread() is self.thread:
                self.pwritten.set()
                assert self.go.wait(WAIT)
        store.data.pwrite = pwrite
        self.thread.start()
        assert self.pwritten.wait(WAIT)

    def race(self, fn, *args):
        """Run fn(*args) against the held write; release the write once fn has finished
        or waits for it; return when both are done."""
        settled = threading.Event()
        self.store.race_hook = lambda point, ino: point == "wait_writes" and settled.set()

        def run():
            try:
                fn(*args)
            finally:
                settled.set()
        other = threading.Thread(target=run)
        other.start()
        assert settled.wait(WAIT)
        self.go.set()
        self.thread.join(WAIT)
        other.join(WAIT)
        assert not self.thread.is_alive() and not other.is_alive()


def evicted_file(store, body):
    f = mkfile(store, b"f", body)
    store.commit(f)
    assert upload(store, f)[0]
    assert store.evict(f) == len(body)
    return f


def test_a_fill_never_overwrites_a_racing_client_write(store):
    s3 = b"S" * 100
    f = evicted_file(store, s3)
    held = HeldWrite(store, f, 0, b"client")
    held.race(store.fill, f, 0, s3)                     # the read-through GET came back
    assert store.read(f, 0, 100)[0] == b"client" + s3[6:]
    assert [(e.offset, e.length, e.state) for e in store.extents(f)] == [
        (0, 6, DataState.DIRTY), (6, 94, DataState.CLEAN)]


def test_a_truncate_never_cuts_bytes_a_racing_write_describes(store):
    f = mkfile(store, b"f", b"A" * 300)
    store.commit(f)
    held = HeldWrite(store, f, 100, b"B" * 100)
    held.race(store.setattr, f, SetAttr(size=0))
    size = store.getattr(f).size
    data = store.read(f, 0, size)[0] if size else b""
    assert data in (b"", bytes(100) + b"B" * 100)        # truncate after, or before, the write
    assert store.check() == []


def assert_reclaimed(store, f):
    """Once durable, nothing of inode f is left: not in the index, not on disk."""
    store.sync()
    with pytest.raises(StoreError) as e:
        store.getattr(f)
    assert e.value.errno == errno.ESTALE
    assert not os.path.exists(store.data.path(f))
    assert store.check() == []


def test_a_file_unlinked_during_a_write_is_reclaimed_when_the_write_ends(store):
    """The unlink keeps the inode (a write is registered) and hands it to that write, which
    reclaims it when it unregisters: nothing of the file is left, in the index or on disk."""
    f = mkfile(store, b"f", b"A" * 100)
    store.commit(f)
    held = HeldWrite(store, f, 0, b"B" * 10)
    store.unlink(ROOT_INO, b"f")
    assert store.getattr(f).nlink == 0                  # kept: its write is still registered
    held.go.set()
    held.thread.join(WAIT)
    assert not held.thread.is_alive()
    assert_reclaimed(store, f)


def test_a_write_registering_as_the_last_one_ends_takes_over_the_reclaim(store):
    """Regression (found in review of unregistering without the index lock): the write
    that ends last on an unlinked file reclaims it in a txn of its own, and another write
    may register before that txn. The reclaim must hand the file on to that write, not
    skip it as still open and leak the inode and its extent file."""
    f = mkfile(store, b"f", b"A" * 100)
    store.commit(f)
    first = HeldWrite(store, f, 0, b"B" * 10)
    store.unlink(ROOT_INO, b"f")
    late = []

    def hook(point, ino):
        if point == "unregister.reclaiming" and not late:
            late.append(HeldWrite(store, f, 50, b"C" * 10))    # registers in the gap
    store.race_hook = hook
    first.go.set()
    first.thread.join(WAIT)
    assert late and store.getattr(f).nlink == 0          # kept for the late write
    late[0].go.set()
    late[0].thread.join(WAIT)
    assert_reclaimed(store, f)


@pytest.mark.parametrize("decider", ["commit", "last close"])
def test_a_write_starting_while_the_flag_is_cleared_waits_for_that_txn(store, decider):
    """Regression (found in review of registering without the index lock): a COMMIT (of a
    file no writer has open) or a last writer's close decides "no write registered" and
    clears F_UNCOMMITTED in a txn not yet committed. A write that registered then, without
    the lock, read the committed inode (flag still set), skipped its flag txn and pwrote;
    the txn then made the flag's clearing durable with those bytes in the file and not
    yet recorded (I2: a power cut there leaves bytes recovery never cuts). The decider
    fences the file, so the write registers under the index lock, after that txn, and
    flags the file itself before its bytes change."""
    from cache.index import F_UNCOMMITTED
    f = mkfile(store, b"f", b"A" * 100)
    if decider == "commit":
        store.write(f, 0, b"B" * 10)                     # flagged, no writer has it open
        decide = lambda: store.commit(f)                 # noqa: E731
    else:
        store.open_file(f, True)
        store.write(f, 0, b"B" * 10)
        store.commit(f)                                  # flag kept for the open writer
        decide = lambda: store.close_file(f, True)       # noqa: E731
    assert store.ix.read_inode(f).flags & F_UNCOMMITTED
    decided, fenced, release = threading.Event(), threading.Event(), threading.Event()

    def hook(point, ino):
        if point == "flag.decided" and not decided.is_set():
            decided.set()
            assert release.wait(WAIT)                     # the decider's txn stays open
        elif point == "register.fenced":
            fenced.set()
    store.race_hook = hook
    decider_thread = threading.Thread(target=decide)
    decider_thread.start()
    assert decided.wait(WAIT)
    pwritten, go, flag_at_pwrite = threading.Event(), threading.Event(), []
    real = store.data.pwrite

    def pwrite(i, off, buf):
        real(i, off, buf)
        if threading.current_thread() is writer:
            flag_at_pwrite.append(bool(store.ix.read_inode(f).flags & F_UNCOMMITTED)
                                  and store.durable())
            pwritten.set()
            assert go.wait(WAIT)
    store.data.pwrite = pwrite
    writer = threading.Thread(target=store.write, args=(f, 50, b"C" * 10))
    writer.start()
    # the fix: the write waits for the index lock; the old code: it reaches its pwrite
    deadline = time.monotonic() + WAIT
    while not (fenced.is_set() or pwritten.is_set()) and time.monotonic() < deadline:
        time.sleep(0.005)
    assert fenced.is_set() and not pwritten.is_set()
    release.set()
    decider_thread.join(WAIT)
    assert pwritten.wait(WAIT)
    assert flag_at_pwrite == [True]                       # flagged durably before its bytes
    go.set()
    writer.join(WAIT)
    store.race_hook = None
    assert not decider_thread.is_alive() and not writer.is_alive()
    assert store.ix.read_inode(f).flags & F_UNCOMMITTED
    assert store.check() == []


def counting_syncs(store, monkeypatch, name):
    """Record how many env syncs had happened each time DataFiles.<name> ran."""
    seen = []
    real = getattr(store.data, name)

    def op(ino, *args):
        seen.append(store.committer.syncs)
        return real(ino, *args)
    monkeypatch.setattr(store.data, name, op)
    return seen


def test_evict_unlinks_only_after_the_index_change_is_durable(store, monkeypatch):
    f = mkfile(store, b"f", b"x" * 100)
    store.commit(f)
    upload(store, f)
    before = store.committer.syncs
    seen = counting_syncs(store, monkeypatch, "remove")
    assert store.evict(f) == 100
    assert seen and seen[0] > before


def test_reclaim_unlinks_only_after_the_unlink_is_durable(store, monkeypatch):
    f = mkfile(store, b"f", b"x" * 100)
    store.commit(f)
    before = store.committer.syncs
    seen = counting_syncs(store, monkeypatch, "remove")
    store.unlink(ROOT_INO, b"f")
    store.sync()
    assert seen and seen[0] > before
    assert not os.path.exists(store.data.path(f))


def test_truncate_cuts_only_after_the_index_change_is_durable(store, monkeypatch):
    f = mkfile(store, b"f", b"x" * 100)
    store.commit(f)
    before = store.committer.syncs
    seen = counting_syncs(store, monkeypatch, "truncate")
    store.setattr(f, SetAttr(size=10))
    assert seen and seen[0] > before
    assert os.path.getsize(store.data.path(f)) == 10


CHILD = textwrap.dedent("""
    import os, signal, sys
    from cache.api import ROOT_INO, RemoteInfo, SetAttr
    from cache.store import Store
    path, point = sys.argv[1], sys.argv[2]
    s = Store.open(path)
    f = s.create(ROOT_INO, b"f", 0o644, 0, 0)[0].ino
    s.write(f, 0, b"precious" * 100)
    s.commit(f)
    change = s.getattr(f).change
    s.mark_uploaded(f, RemoteInfo(key="f", etag="e", size=800, uploaded_change=change))
    print("INO", f, flush=True)

    def die(p, ino):
        if p == point:
            os.kill(os.getpid(), signal.SIGKILL)
    s.race_hook = die
    if point.startswith("evict"):
        s.evict(f)
    elif point.startswith("truncate"):
        s.setattr(f, SetAttr(size=10))
    else:
        s.unlink(ROOT_INO, b"f")
        s.sync()
    sys.exit(3)            # the crash point was never reached
""")


@pytest.mark.parametrize("point", ["evict.index_done", "evict.synced", "truncate.index_done",
                                   "truncate.synced", "reclaim.unlink"])
def test_kill_9_between_index_change_and_file_op(store_dir, point):
    proc = subprocess.run([sys.executable, "-c", CHILD, store_dir, point], cwd=REPO,
                          capture_output=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    f = int(proc.stdout.split(b"INO ")[1].split()[0])
    s = Store.open(store_dir)
    try:
        assert s.check() == []
        if point.startswith("evict"):
            attr = s.getattr(f)
            assert attr.data_state == DataState.ABSENT and attr.size == 800
            assert not os.path.exists(s.data.path(f))          # recovery did the unlink
            with pytest.raises(StoreError) as e:
                s.read(f, 0, 8)
            assert e.value.errno == errno.EAGAIN
        elif point.startswith("truncate"):
            assert s.getattr(f).size == 10 and s.read(f, 0, 10)[0] == b"preciouspr"
            assert os.path.getsize(s.data.path(f)) <= 10
        else:
            with pytest.raises(StoreError):
                s.getattr(f)
            assert not os.path.exists(s.data.path(f))
    finally:
        s.close()

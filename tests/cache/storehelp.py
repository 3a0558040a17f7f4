"""Helpers shared by the store tests."""
from __future__ import annotations

import os
import threading
from contextlib import contextmanager


def crash(store) -> None:
    """Drop a store the way kill -9 would: no commit of live files, no final sync, no
    orderly close. The page cache (and so everything written) survives, as after kill -9.
    The batch committer stops first (its queued ops dropped, a commit under way finished: the
    kill lands just after it), so no thread is inside LMDB when the environment closes; then
    the data-file remover (the files it was given and had not taken stay, as after a kill)."""
    store.batch.abandon()
    store.drops.abandon()
    store.data.close()
    store.ix.close()
    os.close(store._lockfd)
    store._closed = True


@contextmanager
def index_lock_held(store):
    """The index write lock held by another thread for the block (as a batch commit holds
    it through its fdatasync): what an event-loop caller must never wait for."""
    held, release = threading.Event(), threading.Event()

    def hold_the_lock():
        with store.ix.write():
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold_the_lock)
    holder.start()
    assert held.wait(10)
    try:
        yield
    finally:
        release.set()
        holder.join(10)


def hold_next_group_sync(store, timeout: float = 30):
    """Hold the store's next group sync (GroupCommit._flush, outside the index lock) until
    released: what was committed before it stays not durable, and ops queued meanwhile stay
    queued. Returns (in_sync, go): in_sync is set once the sync is held, go.set() lets it run.
    Only that one sync is held; the ones after it run as usual."""
    in_sync, go = threading.Event(), threading.Event()
    flush = store.committer._flush

    def held_flush():
        store.committer._flush = flush
        in_sync.set()
        assert go.wait(timeout)
        flush()
    store.committer._flush = held_flush
    return in_sync, go

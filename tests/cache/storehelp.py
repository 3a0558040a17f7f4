"""Helpers shared by the store tests."""
from __future__ import annotations

import os
import threading
from contextlib import contextmanager


def crash(store) -> None:
    """Drop a store the way kill -9 would: no commit of live files, no final sync, no
    orderly close. The page cache (and so everything written) survives, as after kill -9.
    The batch committer stops first (its queued ops dropped, a commit under way finished: the
    kill lands just after it), so no thread is inside LMDB when the environment closes."""
    store.batch.abandon()
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

"""Helpers shared by the store tests."""
from __future__ import annotations

import os


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

"""Helpers shared by the store tests."""
from __future__ import annotations

import os


def crash(store) -> None:
    """Drop a store the way kill -9 would: no commit of live files, no final sync, no
    orderly close. The page cache (and so everything written) survives, as after kill -9."""
    store.data.close()
    store.ix.close()
    os.close(store._lockfd)
    store._closed = True

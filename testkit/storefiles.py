"""Directories and files made straight through a Store's API, as a client's save would leave
them (the uploader tests, bench/uploader_index.py)."""
from __future__ import annotations

from cache.api import ROOT_INO, SetAttr, StoreError


def mkdirs(store, path: str) -> int:
    ino = ROOT_INO
    for part in [p for p in path.split("/") if p]:
        try:
            ino = store.lookup(ino, part.encode()).ino
        except StoreError:
            ino = store.mkdir(ino, part.encode(), 0o755, 1000, 1000)[0].ino
    return ino


def write_file(store, path: str, data: bytes, *, chunk: int = 1 << 20) -> int:
    """Create (or truncate) a file, write, commit, close: one save as a client does it."""
    head, _, name = path.rpartition("/")
    parent = mkdirs(store, head)
    attr, _, _ = store.create(parent, name.encode(), 0o640, 1000, 1000)
    store.open_file(attr.ino, True)
    store.setattr(attr.ino, SetAttr(size=0))
    for off in range(0, len(data), chunk):
        store.write(attr.ino, off, data[off:off + chunk])
    store.commit(attr.ino)
    store.close_file(attr.ino, True)
    store.sync()
    return attr.ino

"""Paths as operators type them, resolved in the store; walks over a subtree.

An operator names a path either as clients see it ("/checkpoints/run1/step10.pt") or relative
to the store root ("run1/step10.pt"). With one export the store root IS the export, so the
export path is stripped; with several, each export is the store directory of the same name.
These functions block (LMDB reads): call them from a worker thread in asyncio code.
"""
from __future__ import annotations

import errno
from typing import Iterator

from cache.api import ROOT_INO, Attr, FileType, StoreError


def store_path(path: str, export_paths: list[str]) -> str:
    """Normalise an operator's path to a store-relative one ("" = the root)."""
    p = "/" + "/".join(part for part in path.split("/") if part and part != ".")
    if ".." in p.split("/"):
        raise ValueError(f"path {path!r} must not contain '..'")
    if len(export_paths) == 1 and export_paths[0] != "/":
        exp = export_paths[0]
        if p == exp or p.startswith(exp + "/"):
            p = p[len(exp):]
    return p.strip("/")


def resolve(store, rel: str) -> Attr:
    """Attr of a store-relative path; StoreError(ENOENT/ENOTDIR) when it is not there."""
    attr = store.getattr(ROOT_INO)
    for name in [p for p in rel.split("/") if p]:
        if attr.type != FileType.DIR:
            raise StoreError(errno.ENOTDIR, f"{name!r}: a parent is not a directory")
        attr = store.lookup(attr.ino, name.encode())
    return attr


def walk(store, rel: str, attr: Attr | None = None) -> Iterator[tuple[str, Attr]]:
    """(path, attr) of `rel` and everything under it, depth first, directories before content."""
    attr = attr if attr is not None else resolve(store, rel)
    yield rel, attr
    if attr.type == FileType.DIR:
        yield from store.walk(attr.ino, rel)


def files(store, rel: str) -> Iterator[tuple[str, Attr]]:
    """Regular files at or under `rel`."""
    for path, attr in walk(store, rel):
        if attr.type == FileType.REG:
            yield path, attr


def children(store, rel: str) -> list[tuple[str, Attr]]:
    """The entries of a directory (or the file itself), one level."""
    attr = resolve(store, rel)
    if attr.type != FileType.DIR:
        return [(rel, attr)]
    out = []
    for ent in store.readdir(attr.ino):
        name = ent.name.decode(errors="surrogateescape")
        out.append((f"{rel}/{name}" if rel else name, ent.attr))
    return out

"""`ckptgw ls` lists by name, `-R` a directory's content right after it, whatever order the
files were created in (the store's readdir gives creation order) (issue 39, CLI)."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from appliance import commands
from cache.api import ROOT_INO
from cache.store import Store


@pytest.fixture
def store(tmp_path):
    s = Store.open(str(tmp_path / "cache"), capacity=1 << 30, reserve=0)
    yield s
    s.close()


def ls(store, path, recursive):
    daemon = SimpleNamespace(store=store, uploader=None,
                             config=SimpleNamespace(exports=[SimpleNamespace(path="/checkpoints")]))
    res = asyncio.run(commands.Commands(daemon).dispatch("ls", {"path": path, "recursive": recursive}, None))
    return [e["path"] for e in res["entries"]]


def test_ls_and_ls_recursive_are_sorted(store):
    zeta, _, _ = store.create(ROOT_INO, b"zeta.pt", 0o644, 0, 0)
    b, _ = store.mkdir(ROOT_INO, b"b", 0o755, 0, 0)
    store.create(b.ino, b"z", 0o644, 0, 0)
    store.create(b.ino, b"a", 0o644, 0, 0)
    a, _ = store.mkdir(ROOT_INO, b"a", 0o755, 0, 0)
    store.create(a.ino, b"step_2", 0o644, 0, 0)
    store.create(a.ino, b"step_10", 0o644, 0, 0)
    store.create(ROOT_INO, b"a.txt", 0o644, 0, 0)
    assert ls(store, "/checkpoints", False) == ["a", "a.txt", "b", "zeta.pt"]
    assert ls(store, "/checkpoints", True) == ["", "a", "a/step_10", "a/step_2", "a.txt", "b", "b/a", "b/z",
                                               "zeta.pt"]
    assert ls(store, "b", True) == ["b", "b/a", "b/z"]

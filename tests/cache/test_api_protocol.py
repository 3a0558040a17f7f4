"""The declared seams (issue 37 point 5): cache/api.py's `NfsStore` and `UploaderStore`
list what nfsd and the uploader call on the store. The real `cache.store.Store` and every
store fake of the tests have each member, methods with the same parameter names, kinds and
defaulted-ness as the Protocol; nothing in cache/ imports nfsd or the uploader."""
from __future__ import annotations

import ast
import inspect
import os
import re
from typing import Protocol

import pytest

from cache import api
from cache.store import Store

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROTOCOLS = (api.NfsStore, api.UploaderStore, api.Store)


def protocol_members(proto) -> dict[str, inspect.Signature | None]:
    """name -> signature of every method, None for every data attribute, that `proto` and
    its Protocol bases declare."""
    out: dict[str, inspect.Signature | None] = {}
    for klass in reversed(proto.__mro__):
        if klass is Protocol or not getattr(klass, "_is_protocol", False):
            continue
        for name in vars(klass).get("__annotations__", {}):
            out[name] = None
        for name, value in vars(klass).items():
            if inspect.isfunction(value) and not name.startswith("_"):
                out[name] = inspect.signature(value)
    return out


def shape(sig: inspect.Signature) -> list[tuple]:
    """What a caller relies on: parameter names, kinds and whether each has a default."""
    return [(p.name, p.kind, p.default is not p.empty) for p in sig.parameters.values()]


def mismatches(proto, cls, instance) -> list[str]:
    """How `cls` (with `instance` for the data attributes set in __init__) falls short of `proto`."""
    bad = []
    for name, sig in protocol_members(proto).items():
        if sig is None:
            if not hasattr(instance, name):
                bad.append(f"{cls.__name__} has no attribute {name}")
            continue
        impl = getattr(cls, name, None)
        if not callable(impl):
            bad.append(f"{cls.__name__} has no method {name}")
        elif shape(inspect.signature(impl)) != shape(sig):
            bad.append(f"{cls.__name__}.{name}{inspect.signature(impl)} is not {name}{sig}")
    return bad


def test_protocols_are_not_empty_and_store_is_both():
    nfs, up, both = (protocol_members(p) for p in PROTOCOLS)
    assert len(nfs) >= 25 and len(up) >= 40
    assert both.keys() == nfs.keys() | up.keys()
    for name in nfs.keys() & up.keys():       # a member both declare is declared alike
        assert (nfs[name] is None) == (up[name] is None), name
        if nfs[name] is not None:
            assert shape(nfs[name]) == shape(up[name]), name


@pytest.mark.parametrize("proto", PROTOCOLS, ids=lambda p: p.__name__)
def test_the_store_implements_the_protocols(proto, store):
    assert mismatches(proto, Store, store) == []


def test_the_nfsd_fake_store_implements_nfs_store():
    from tests.nfsd.conftest import FakeStore
    assert mismatches(api.NfsStore, FakeStore, FakeStore()) == []


def test_every_member_is_used():
    """The Protocols list exactly what the callers use: each member is named in the code
    of its room (nfsd/ or uploader/, its Cython included), as a store attribute (or one probed
    with getattr)."""
    def used_in(room: str) -> set[str]:
        names = set()
        for dirpath, _, files in os.walk(os.path.join(ROOT, room)):
            for f in files:
                if f.endswith((".py", ".pyx")):
                    with open(os.path.join(dirpath, f)) as fh:
                        text = fh.read()
                    for attr, probed in re.findall(r'store\.([a-z_]+)\b|store, "([a-z_]+)"', text):
                        names.add(attr or probed)
        return names
    assert set(protocol_members(api.NfsStore)) <= used_in("nfsd")
    assert set(protocol_members(api.UploaderStore)) <= used_in("uploader")


def test_cache_imports_neither_nfsd_nor_the_uploader():
    cache_dir = os.path.join(ROOT, "cache")
    for f in sorted(os.listdir(cache_dir)):
        if not f.endswith(".py"):
            continue
        with open(os.path.join(cache_dir, f)) as fh:
            tree = ast.parse(fh.read(), f)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                mods = [node.module or ""]
            else:
                continue
            for m in mods:
                assert m.split(".")[0] not in ("nfsd", "uploader", "appliance"), f"cache/{f} imports {m}"

"""sync_namespace hands the group sync to a worker thread only when something is not yet
durable: after a batched namespace op or an unchanged SETATTR it replies without the round
trip (two thread wake-ups per op on a loaded host, issue 15)."""
from __future__ import annotations

import asyncio

from cache.api import ROOT_INO
from cache.store import Store
from nfsd.context import CompoundContext
from nfsd.ops._common import sync_namespace
from testkit.ops_harness import ROOT, FakeServer


def test_no_worker_round_trip_when_already_durable(tmp_path):
    store = Store.open(str(tmp_path / "s"))
    try:
        attr, _, _ = store.create(ROOT_INO, b"f", 0o644, 0, 0)   # durable on return
        server = FakeServer(store, None)
        ctx = CompoundContext(server=server, cred=ROOT, peer=None, conn=None, minorversion=1)
        asyncio.run(sync_namespace(ctx))
        assert server.blocking_calls == []
        store.write(attr.ino, 0, b"x")          # its txn is committed, not yet group-synced
        assert not store.durable()
        asyncio.run(sync_namespace(ctx))
        assert server.blocking_calls == ["sync"]
        assert store.durable()
    finally:
        store.close()

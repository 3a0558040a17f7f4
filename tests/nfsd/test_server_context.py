"""The declared server context (issue 37 point 5): nfsd.context.ServerContext lists what the
ops use of `ctx.server`; NfsServer and the ops harness's FakeServer have every member (no
handler falls back on a missing one), run_blocking called alike, and the handlers use
nothing of the server that the Protocol does not list."""
from __future__ import annotations

import inspect
import os
import re

from nfsd.context import ServerContext
from nfsd.exports import Export, Exports
from nfsd.server import NfsServer
from tests.cache.test_api_protocol import protocol_members, shape
from tests.nfsd.conftest import FakeStore, open_exports
from testkit.ops_harness import FakeServer

NFSD = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "nfsd")


def missing(server) -> list[str]:
    bad = []
    for name, sig in protocol_members(ServerContext).items():
        if not hasattr(server, name):
            bad.append(f"{type(server).__name__} has no {name}")
        elif sig is not None and shape(inspect.signature(getattr(type(server), name))) != shape(sig):
            bad.append(f"{type(server).__name__}.{name} is not called as {name}{sig}")
    return bad


def test_nfs_server_and_fake_server_are_server_contexts():
    members = protocol_members(ServerContext)
    assert {"store", "exports", "sessions", "opens", "grace", "run_blocking"} <= members.keys()
    assert missing(NfsServer(FakeStore(), open_exports())) == []
    assert missing(FakeServer(FakeStore(), Exports([Export(1, "/checkpoints")]))) == []


def test_the_ops_use_only_what_the_context_declares():
    used = set()
    files = [os.path.join(NFSD, "ops", f) for f in os.listdir(os.path.join(NFSD, "ops")) if f.endswith(".py")]
    files += [os.path.join(NFSD, f) for f in ("compound.py", "callback.py", "offload.py", "attrs.py")]
    for path in files:
        with open(path) as fh:
            text = fh.read()
        used |= set(re.findall(r"\bctx\.server\.([a-z_]+)", text))
        used |= set(re.findall(r'getattr\(ctx\.server, "([a-z_]+)"', text))
    assert used and used <= protocol_members(ServerContext).keys()

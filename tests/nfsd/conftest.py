"""Fixtures for the nfsd tests.

pytest-asyncio is not used: the server runs on its own event loop in a thread
(as in production, where the client is another machine), and each test drives its
client with `asyncio.run` — usually through the `nfs_client` fixture:

    def test_something(nfs_client):
        async def body(c):                     # c: testkit.nfsclient.NfsClient, session ready
            fh = await c.lookup_path("/checkpoints")
            ...
        nfs_client(body)

`nfs_server.call(fn, *args)` runs fn on the server's loop (to inspect or change
server state safely) and returns its result.
"""
from __future__ import annotations

import asyncio
import errno
import os
import sys
import threading
from concurrent.futures import Future

import pytest

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from cache.api import StatFS, StoreError  # noqa: E402
from testkit.nfsclient import NfsClient  # noqa: E402

EXPORT = "/checkpoints"


class FakeStore:
    """A store with no files, for the RPC/session layer's tests: the whole `cache.api.NfsStore`
    (tests/cache/test_api_protocol.py holds it to it), client records kept in memory and
    every call about a file failing with EIO (NFS4ERR_IO), as nothing can name one."""
    write_verifier = b"wverf001"
    instance_id = b"fake-instance-id"

    def __init__(self, path: str = "") -> None:
        self.path = path                          # "" : file handles keyed by instance_id alone
        self.records: dict[bytes, bytes] = {}     # client records (nfsd/grace.py)

    # ---- client records, durability --------------------------------------------------------
    def client_records(self) -> dict[bytes, bytes]:
        return dict(self.records)

    def submit_client_record(self, owner: bytes, record: bytes | None) -> Future:
        if record is None:
            self.records.pop(owner, None)
        else:
            self.records[owner] = record
        return _done(None)

    def sync(self) -> None:
        pass

    def durable(self) -> bool:
        return True

    def close(self) -> None:
        pass

    def statfs(self) -> StatFS:
        return StatFS(0, 0, 0, 0, 0, 0)

    # ---- files: there are none ---------------------------------------------------------------
    def getattr(self, ino): raise _no_files()
    def lookup(self, parent, name): raise _no_files()
    def find(self, parent, name): raise _no_files()
    def lookup_parent(self, ino): raise _no_files()
    def setattr(self, ino, sa): raise _no_files()
    def setattr_submit(self, ino, sa, loop=None): raise _no_files()
    def setattr_unchanged(self, ino, sa): raise _no_files()
    def submit(self, op, *args, loop=None): return _failed(_no_files(), loop)
    def submit_noted(self, op, note, *args, loop=None): return _failed(_no_files(), loop)
    def reply_records(self, owner): return []
    def submit_reply_consumed(self, owner, seq, loop=None): return _failed(_no_files(), loop)
    def create(self, parent, name, mode, uid, gid, *, exclusive=False): raise _no_files()
    def readlink(self, ino): raise _no_files()
    def readdir(self, ino, cookie=0): raise _no_files()
    def walk(self, ino, base=""): raise _no_files()
    def remote_info(self, ino): raise _no_files()
    def open_file(self, ino, write): raise _no_files()
    def close_file(self, ino, write, *, wait=True): raise _no_files()
    def read_into(self, ino, offset, buf): raise _no_files()
    def read_into_cached(self, ino, offset, buf): raise _no_files()
    def write(self, ino, offset, data): raise _no_files()
    def write_nowait(self, ino, offset, data): raise _no_files()
    def write_stable_async(self, ino, offset, data, loop, start): raise _no_files()
    def content_runs(self, ino, offset, end): raise _no_files()
    def seek(self, ino, offset, data): raise _no_files()
    def deallocate(self, ino, offset, length): raise _no_files()
    def allocate(self, ino, offset, length): raise _no_files()
    def copy_range(self, src, dst, src_off, dst_off, count): raise _no_files()
    def commit(self, ino): raise _no_files()
    def commit_async(self, ino, loop, start): raise _no_files()


def _no_files() -> StoreError:
    return StoreError(errno.EIO, "FakeStore has no files")


def _done(value) -> Future:
    done: Future = Future()
    done.set_result(value)
    return done


def _failed(exc: BaseException, loop=None):
    """A failed Future: concurrent, or with `loop` an asyncio.Future of it (Store.submit)."""
    failed = Future() if loop is None else loop.create_future()
    failed.set_exception(exc)
    return failed


class ServerThread:
    """An NfsServer on 127.0.0.1:<ephemeral> served by an event loop in a thread."""

    def __init__(self, make_server):
        self._make_server = make_server
        self.loop = asyncio.new_event_loop()
        self.server = None
        self.port = 0
        self._thread = threading.Thread(target=self.loop.run_forever, name="nfsd-test-loop",
                                        daemon=True)

    def start(self) -> "ServerThread":
        self._thread.start()

        async def boot():
            self.server = self._make_server()
            await self.server.start("127.0.0.1", 0)
            self.port = self.server.port
        self.run(boot())
        return self

    def run(self, coro, timeout: float = 30):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, fn, *args):
        async def invoke():
            return fn(*args)
        return self.run(invoke())

    def stop(self) -> None:
        if self.server is not None:
            self.run(self.server.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


def run_client(port: int, body, *, minorversion: int = 1, setup: bool = True, **kw):
    async def main():
        c = await NfsClient.connect("127.0.0.1", port, minorversion=minorversion, **kw)
        try:
            if setup:
                await c.setup_session()
            return await body(c)
        finally:
            await c.close()
    return asyncio.run(main())


def open_exports():
    """Exports that admit every client from any port (the fake servers' RPC tests)."""
    from nfsd.exports import Export, Exports
    return Exports([Export(1, "/checkpoints", root_squash=False, secure=False)])


@pytest.fixture
def fake_server_factory():
    """Start NfsServer(FakeStore(), OPEN_EXPORTS, ...) with any handler table (RPC and
    session tests that need no filesystem). Returns a ServerThread."""
    started: list[ServerThread] = []

    def start(handlers: dict | None = None, **kw) -> ServerThread:
        from nfsd.ops import session as session_ops
        from nfsd.server import NfsServer

        table = dict(session_ops.HANDLERS) if handlers is None else handlers

        def make():
            return NfsServer(FakeStore(), open_exports(), handlers=table, **kw)
        st = ServerThread(make).start()
        started.append(st)
        return st
    yield start
    for st in started:
        st.stop()


@pytest.fixture
def fake_server(fake_server_factory):
    return fake_server_factory()


@pytest.fixture
def nfs_server(tmp_path):
    """The real thing: a Store in tmp_path, the /checkpoints export, every op handler."""
    from cache.store import Store
    from nfsd.exports import Exports
    from nfsd.server import NfsServer

    store = Store.open(str(tmp_path / "cache"))
    # No root squash: the test client's default credential is uid 0. `insecure`: the test
    # client connects from an unprivileged port.
    st = ServerThread(lambda: NfsServer(store, Exports.single(EXPORT, root_squash=False,
                                                              secure=False))).start()
    st.store = store
    yield st
    st.stop()
    store.close()


@pytest.fixture
def nfs_client(nfs_server):
    """`nfs_client(async_body, minorversion=1, setup=True)`: runs body(client) with a
    connected client (and a ready session unless setup=False); returns its result."""
    def run(body, **kw):
        return run_client(nfs_server.port, body, **kw)
    return run

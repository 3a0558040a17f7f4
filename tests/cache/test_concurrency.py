"""Threads hammering one store: writers, committers, renamers, an uploader and an evictor.
Afterwards every byte is right, the byte counters are exact and check() finds nothing."""
from __future__ import annotations

import errno
import os
import random
import threading
import time

from cache.api import DataState, RemoteInfo, ROOT_INO, StoreError

from tests.cache.test_races import assert_reclaimed


def test_threads_keep_the_index_consistent(store):
    stop = threading.Event()
    errors: list[BaseException] = []
    expected: dict[int, bytes] = {}
    lock = threading.Lock()

    def guard(fn):
        def run(*args):
            try:
                fn(*args)
            except BaseException as e:          # surfaced by the assertion below
                errors.append(e)
                stop.set()
        return run

    @guard
    def writer(t):
        rnd = random.Random(t)
        d = store.mkdir(ROOT_INO, b"w%d" % t, 0o755, 0, 0)[0].ino
        for i in range(40):
            ino = store.create(d, b"tmp", 0o644, 0, 0)[0].ino
            store.open_file(ino, write=True)
            body = bytearray()
            for _ in range(rnd.randint(1, 5)):
                chunk = os.urandom(rnd.randint(1, 20000))
                store.write(ino, len(body), chunk)
                body += chunk
            store.commit(ino)
            store.close_file(ino, write=True)
            store.rename(d, b"tmp", d, b"f%d" % (i % 4))
            store.sync()
            with lock:
                expected[(t, i % 4)] = (ino, bytes(body))

    @guard
    def uploader():
        while not stop.is_set():
            for ino in store.ready_for_upload(1 << 62, 0, limit=10):
                try:
                    change = store.getattr(ino).change
                    if store.set_data_state(ino, DataState.UPLOADING, change):
                        store.mark_uploaded(ino, RemoteInfo(uploaded_change=change))
                except StoreError:
                    pass                         # replaced meanwhile: gone is fine

    @guard
    def evictor():
        while not stop.is_set():
            for ino in store.eviction_candidates(1 << 20):
                try:
                    store.evict(ino)
                except StoreError:
                    pass

    writers = [threading.Thread(target=writer, args=(t,)) for t in range(4)]
    helpers = [threading.Thread(target=uploader), threading.Thread(target=evictor)]
    for th in writers + helpers:
        th.start()
    for th in writers:
        th.join(120)
    stop.set()
    for th in helpers:
        th.join(30)
    assert not errors, errors
    for (t, k), (ino, body) in expected.items():
        d = store.lookup(ROOT_INO, b"w%d" % t).ino
        assert store.lookup(d, b"f%d" % k).ino == ino
        try:
            got = store.read(ino, 0, len(body) + 1)[0]
        except StoreError as e:                  # evicted: the "S3" copy is the body
            for off, n in e.missing:
                store.fill(ino, off, body[off:off + n])
            got = store.read(ino, 0, len(body) + 1)[0]
        assert got == body
    assert store.check() == []


def test_threads_on_one_file_then_its_unlink_leave_nothing_behind(store):
    """Writers, a committer and a truncator on one file; it is unlinked while they run, and
    they stop after the call they are in.
    Writers unregister without the index lock (cache/store.py I4), so this is the race of
    the last write's end with the unlink's hand-off, of truncates waiting for writes, and of
    commits reading the write sequence. Nobody deadlocks, and once all have stopped the
    inode and its extent file are gone and check() finds nothing."""
    from cache.api import SetAttr
    ino = store.create(ROOT_INO, b"shared", 0o644, 0, 0)[0].ino
    gone = threading.Event()
    errors: list[BaseException] = []

    def run(fn, seed):
        rnd = random.Random(seed)
        try:
            while not gone.is_set():
                try:
                    fn(rnd)
                except StoreError as e:
                    if e.errno not in (errno.ESTALE, errno.ENOENT):
                        raise
                    gone.set()
        except BaseException as e:              # surfaced by the assertion below
            errors.append(e)
            gone.set()

    def write(rnd):
        store.write(ino, rnd.randrange(1 << 16), os.urandom(rnd.randint(1, 8192)))

    def commit(rnd):
        store.commit(ino)

    def truncate(rnd):
        store.setattr(ino, SetAttr(size=rnd.randrange(1 << 16)))

    threads = [threading.Thread(target=run, args=(fn, i))
               for i, fn in enumerate([write] * 4 + [commit, truncate])]
    for th in threads:
        th.start()
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline and not errors:
        time.sleep(0.01)
    store.unlink(ROOT_INO, b"shared")           # writes may go on: the inode lives while
    gone.set()                                  # one is registered, so stop them here
    for th in threads:
        th.join(30)
    assert not any(th.is_alive() for th in threads), "deadlock"
    assert not errors, errors
    assert_reclaimed(store, ino)

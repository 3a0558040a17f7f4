"""The namespace batch committer (cache/batch.py): many ops, one LMDB write transaction, each
op in its own nested txn; futures complete only once the batch is durable."""
from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from cache.api import ROOT_INO, StoreError
from cache.store import Store
from tests.cache.storehelp import hold_next_group_sync

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _names(store: Store, parent: int = ROOT_INO) -> set[bytes]:
    return {e.name for e in store.readdir(parent)}


def _hold_writer(store: Store):
    """Queue an op that blocks the committer thread inside its batch until released, so
    ops submitted meanwhile all land in the NEXT batch."""
    started, go = threading.Event(), threading.Event()

    def blocker(w):
        started.set()
        assert go.wait(10)
        return "blocker"

    fut = store.batch.submit(blocker)
    assert started.wait(10)
    return fut, go


def _starter(workers: list):
    """A `start(fn, *args)` as NfsServer.start_blocking: fn on a thread of its own, not waited
    for; the threads go in `workers`."""
    def start(fn, *args):
        t = threading.Thread(target=fn, args=args, daemon=True)
        workers.append(t)
        t.start()
    return start


def test_a_failing_op_in_a_batch_leaves_the_others_applied_and_itself_absent(store):
    d = store.mkdir(ROOT_INO, b"d", 0o755, 0, 0)[0].ino
    store.create(d, b"victim", 0o644, 0, 0)
    batches0 = store.batch.batches
    held, go = _hold_writer(store)

    def half_then_fail(w):
        # changes made before the error must vanish with it (its nested txn aborts)
        store.ns.create(w, ROOT_INO, b"half", 0o644, 0, 0, False)
        store.ns.rename(w, d, b"victim", ROOT_INO, b"moved")
        raise StoreError(errno.EIO, "injected")

    a = store.submit("create", ROOT_INO, b"a", 0o644, 0, 0, False)
    bad = store.batch.submit(half_then_fail)
    clash = store.submit("mkdir", ROOT_INO, b"d", 0o755, 0, 0)     # EEXIST
    b = store.submit("rename", ROOT_INO, b"a", d, b"b")             # sees a's change
    go.set()
    assert held.result(10) == "blocker"
    assert a.result(10)[2] is True
    b.result(10)
    with pytest.raises(StoreError) as e:
        bad.result(10)
    assert e.value.errno == errno.EIO
    with pytest.raises(StoreError) as e:
        clash.result(10)
    assert e.value.errno == errno.EEXIST
    assert store.batch.batches - batches0 == 2      # the blocker's, then all four in one
    assert _names(store) == {b"d"}
    assert _names(store, d) == {b"victim", b"b"}
    # the store's counters and derived indexes agree with what was kept
    assert store.check() == []
    store.close()
    reopened = Store.open(store.path)
    try:
        assert _names(reopened) == {b"d"}
        assert _names(reopened, d) == {b"victim", b"b"}
        assert reopened.check() == []
    finally:
        reopened.close()


def test_an_op_returns_only_once_its_batch_is_durable(store):
    """The future is set after a later commit or an env.sync covered the batch's commit."""
    store.create(ROOT_INO, b"f", 0o644, 0, 0)
    # the op's commit is the newest one; returning means it is covered (synced)
    assert store.committer.covered(store.ix.txnid)


def test_concurrent_ops_share_batches(store):
    held, go = _hold_writer(store)
    futs = [store.submit("mkdir", ROOT_INO, b"m%d" % i, 0o755, 0, 0) for i in range(20)]
    go.set()
    held.result(10)
    for f in futs:
        f.result(10)
    assert store.batch.batches <= 3 and store.batch.ops >= 21
    assert _names(store) == {b"m%d" % i for i in range(20)}


CHILD = textwrap.dedent("""
    import os, sys, threading, time
    from cache.api import ROOT_INO
    from cache.store import Store

    path, replied = sys.argv[1], sys.argv[2]
    s = Store.open(path)
    d = s.mkdir(ROOT_INO, b"d", 0o755, 0, 0)[0].ino
    s.create(d, b"old", 0o644, 0, 0)
    started, go = threading.Event(), threading.Event()

    def blocker(w):
        started.set()
        go.wait(10)
    s.batch.submit(blocker)
    started.wait(10)

    def on_applied(point):
        # every op of the batch is applied in the write txn, none committed: die here
        with open(replied + ".hook", "w") as f:
            f.write(point)
            f.flush()
            os.fsync(f.fileno())
        os._exit(9)

    def client(i):
        s.submit("create", ROOT_INO, b"new%d" % i, 0o644, 0, 0, False).result()
        with open(replied, "a") as f:       # the "reply": never reached
            f.write("new%d\\n" % i)
    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    rename = s.submit("rename", d, b"old", ROOT_INO, b"renamed")
    while len(s.batch._queue) < 9:
        time.sleep(0.001)
    calls = []          # the first "applied" is the blocker's own batch: the next one dies
    s.batch.hook = lambda point: calls.append(point) or (len(calls) > 1 and on_applied(point))
    go.set()
    rename.result()
    open(replied, "a").write("rename\\n")
""")


def test_kill_between_apply_and_commit_leaves_nothing_of_the_batch_and_replies_nothing(tmp_path):
    path, replied = str(tmp_path / "store"), str(tmp_path / "replied")
    proc = subprocess.run([sys.executable, "-c", CHILD, path, replied], cwd=REPO,
                          env={**os.environ, "PYTHONPATH": REPO}, timeout=60,
                          capture_output=True)
    assert proc.returncode == 9, proc.stderr.decode()[-2000:]
    assert open(replied + ".hook").read() == "batch.applied"
    assert not os.path.exists(replied)              # no op was answered
    s = Store.open(path)
    try:
        assert _names(s) == {b"d"}                  # nothing of the batch is visible
        d = s.lookup(ROOT_INO, b"d").ino
        assert _names(s, d) == {b"old"}
        assert s.check() == []
    finally:
        s.close()


def test_a_queued_close_stamp_lands_before_ops_submitted_after_it(store):
    """close_file(wait=False) (nfsd's CLOSE, on the event loop) queues the last writer's
    settle stamp to the batch instead of committing it; a RENAME sent after the CLOSE is
    applied after it, so a temp file's settle window still restarts at its close."""
    f = store.create(ROOT_INO, b"t.tmp", 0o644, 0, 0)[0].ino
    store.open_file(f, True)
    store.write(f, 0, b"x" * 10)
    store.commit(f)
    before = store.ix.read_inode(f).activity_ns
    store.close_file(f, True, wait=False)
    store.rename(ROOT_INO, b"t.tmp", ROOT_INO, b"t")
    assert store.ix.read_inode(f).activity_ns > before


def test_bookkeeping_nobody_waits_for_never_costs_a_sync(store):
    """durable=False (the queued close stamp): set at its commit, no env.sync for it."""
    store.mkdir(ROOT_INO, b"d", 0o755, 0, 0)
    syncs = store.committer.syncs
    fut = store.batch.submit(lambda w: w.queue_put({"kind": "test"}),
                             durable=False)
    assert fut.result(10) > 0
    assert store.committer.syncs == syncs


def test_lazy_bookkeeping_rides_the_next_batch_or_forms_one_after_its_delay(store, monkeypatch):
    """lazy=True (a settle stamp, a finished job's removal, an LRU stamp): no commit of its
    own while other ops come; it joins the next batch, before the ops submitted after it,
    and alone it is applied LAZY_DELAY after it was queued."""
    import cache.batch as batchmod
    store.batch.applied()                            # the committer thread is up and idle
    ran = []
    monkeypatch.setattr(batchmod, "LAZY_DELAY", 3600.0)
    lazy = store.batch.submit(lambda w: ran.append("lazy"), lazy=True)
    batches = store.batch.batches
    time.sleep(0.2)                                  # the thing under test: nothing happens meanwhile
    assert not lazy.done() and store.batch.batches == batches
    monkeypatch.setattr(batchmod, "LAZY_DELAY", 0.01)  # before the batch: the thread lingers that long after it
    eager = store.batch.submit(lambda w: ran.append("eager"), durable=False)
    eager.result(10)
    assert lazy.done() and ran == ["lazy", "eager"]
    assert store.batch.batches == batches + 1        # one commit for both
    alone = store.batch.submit(lambda w: ran.append("alone"), lazy=True)
    alone.result(10)                                 # nobody else came: formed after the delay
    assert ran[-1] == "alone"


def test_a_lazy_op_right_after_a_batch_wakes_nobody(store, monkeypatch):
    """An UNSTABLE WRITE's index record (lazy) right after a batch, as in a write stream: the
    committer lingers after a batch in a timed sleep and forms it in time by itself, so a write
    costs no wake-up of that thread (a context switch per WRITE before)."""
    import cache.batch as batchmod
    monkeypatch.setattr(batchmod, "LAZY_DELAY", 0.5)
    store.batch.submit(lambda w: None, durable=False).result(10)       # a batch: the thread lingers
    time.sleep(0.1)                                  # asleep by now, the linger not over
    notified = []
    real = store.batch._cv.notify
    monkeypatch.setattr(store.batch._cv, "notify", lambda *a: (notified.append(a), real(*a)))
    futs = [store.batch.submit(lambda w: None, lazy=True) for _ in range(3)]
    for fut in futs:
        fut.result(10)                               # formed when the linger ends
    assert notified == []


def test_a_close_that_reclaims_is_not_lazy(store, monkeypatch):
    """CLOSE awaits the reclaim of a file removed while open (its handle is stale after),
    so that op is never held back; the settle stamp of a linked file is."""
    import cache.batch as batchmod
    monkeypatch.setattr(batchmod, "LAZY_DELAY", 3600.0)
    f = store.create(ROOT_INO, b"f", 0o644, 0, 0)[0].ino
    store.open_file(f, True)
    store.write(f, 0, b"x")
    assert store.close_file(f, True, wait=False) is None          # a stamp: lazy, not awaited
    store.open_file(f, True)
    store.unlink(ROOT_INO, b"f")
    fut = store.close_file(f, True, wait=False)
    assert fut is not None
    fut.result(10)                                   # not held for an hour
    with store.ix.read() as v:
        assert v.inode(f) is None


def _until(cond, timeout: float = 10.0) -> None:
    """Wait for a state the committer thread reaches (a future marked running), not for a time."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"{cond} never became true"
        time.sleep(0.001)


def test_a_cancelled_op_is_skipped_and_the_committer_lives_on(store):
    """Regression (found 2026-11-26): an asyncio task awaiting a batch op through wrap_future
    and cancelled (the daemon's shutdown, grace.stop) cancels the concurrent future; the
    committer's set_result on it raised InvalidStateError and ended the thread, and every
    namespace op after it hung. Ops are marked running when taken: one cancelled while
    queued is dropped unapplied, one cancelled later is applied and answered to nobody."""
    import asyncio
    store.batch.applied()
    held, release = threading.Event(), threading.Event()

    def hold():                                      # the committer cannot open its txn
        with store.ix.lock:
            held.set()
            release.wait()
    threading.Thread(target=hold, daemon=True).start()
    held.wait()
    ran = []

    async def cancel_the_waiter(fut):
        task = asyncio.ensure_future(asyncio.wrap_future(fut))
        await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    try:
        taken = store.batch.submit(lambda w: ran.append("taken"))
        _until(taken.running)                        # the committer took it, waits for the lock
        queued = store.batch.submit(lambda w: ran.append("cancelled while queued"))
        asyncio.run(cancel_the_waiter(taken))        # too late: it runs, answered to nobody
        asyncio.run(cancel_the_waiter(queued))
        assert not taken.cancelled() and queued.cancelled()
    finally:
        release.set()
    assert taken.result(10) is None
    assert ran == ["taken"]
    d = store.mkdir(ROOT_INO, b"after", 0o755, 0, 0)[0]    # the committer is alive
    assert store.lookup(ROOT_INO, b"after").ino == d.ino
    done = store.batch.submit(lambda w: 7)
    assert done.result(10) == 7 and done.cancel() is False    # answered: too late to cancel
    store.batch.applied()
    assert store.batch._thread.is_alive()


# ---- answers to an asyncio loop (issue 37 point 4) ------------------------------------------

class _CountingLoop:
    """What the committer sees of an asyncio loop: futures of the real one, and a count of
    the committer's calls into it (each one a wake-up of the loop's thread)."""

    def __init__(self, loop):
        self.loop, self.calls = loop, 0

    def create_future(self):
        return self.loop.create_future()

    def call_soon_threadsafe(self, callback, *args):
        self.calls += 1
        return self.loop.call_soon_threadsafe(callback, *args)


def test_the_ops_of_one_batch_answer_their_loop_in_one_call(store):
    """Completions come back to the loop once per batch, not once per op: 20 namespace ops
    queued from one loop while the committer is busy land in one batch, and their 20
    asyncio futures are set by ONE call into the loop, after the batch is durable."""
    import asyncio

    async def main():
        loop = _CountingLoop(asyncio.get_running_loop())
        held, go = _hold_writer(store)
        futs = [store.submit("mkdir", ROOT_INO, b"m%d" % i, 0o755, 0, 0, loop=loop)
                for i in range(20)]
        assert all(isinstance(f, asyncio.Future) for f in futs)
        batches = store.batch.batches
        go.set()
        attrs = [r[0] for r in await asyncio.gather(*futs)]
        assert held.result(10) == "blocker"
        assert store.batch.batches - batches == 2           # the blocker's, then the 20's
        assert loop.calls == 1
        assert store.committer.covered(store.ix.txnid)       # answered once durable
        return attrs
    attrs = asyncio.run(main())
    assert {store.lookup(ROOT_INO, b"m%d" % i).ino for i in range(20)} == {a.ino for a in attrs}


def test_a_loop_future_cancelled_while_queued_is_dropped_unapplied(store):
    import asyncio
    ran = []

    async def main():
        loop = asyncio.get_running_loop()
        held, go = _hold_writer(store)
        dropped = store.batch.submit(lambda w: ran.append("cancelled"), loop=loop)
        kept = store.batch.submit(lambda w: ran.append("kept") or 5, loop=loop)
        dropped.cancel()
        go.set()
        assert await kept == 5
        held.result(10)
        assert dropped.cancelled()
    asyncio.run(main())
    assert ran == ["kept"]


def test_then_turns_an_answer_into_an_error_on_the_committer_thread(store):
    import asyncio

    async def main():
        loop = asyncio.get_running_loop()
        threads = []

        def then(value):
            threads.append(threading.current_thread())
            raise StoreError(errno.EIO, f"not covered: {value}")
        waiter = store.batch.waiter(loop, then)
        assert store.batch.submit(lambda w: "applied", into=waiter) is waiter.future
        with pytest.raises(StoreError, match="not covered: applied"):
            await waiter.future
        assert threads and threads[0] is not threading.current_thread()
    asyncio.run(main())


def test_a_closed_loop_does_not_stop_the_committer(store):
    """A server stopped with an op in flight: its loop is closed when the answer comes;
    the answer is dropped and the committer serves everyone else."""
    import asyncio
    gone = asyncio.new_event_loop()
    held, go = _hold_writer(store)
    orphan = store.submit("mkdir", ROOT_INO, b"orphan", 0o755, 0, 0, loop=gone)
    gone.close()
    go.set()
    held.result(10)
    assert store.mkdir(ROOT_INO, b"after", 0o755, 0, 0)[0].ino      # the committer lives
    assert store.lookup(ROOT_INO, b"orphan")                        # applied, answered to nobody
    assert not orphan.done()


def test_commit_async_answers_from_the_committer_and_errors_reach_the_loop(store):
    """COMMIT's three crossings: the blocking half on a worker that leaves once it queued the
    record; the committer answers the loop. Every error of either half answers the future."""
    import asyncio
    ino = store.create(ROOT_INO, b"f", 0o644, 0, 0)[0].ino
    store.open_file(ino, write=True)
    store.write(ino, 0, b"x" * 5000)
    workers = []
    start = _starter(workers)

    async def main():
        loop = asyncio.get_running_loop()
        assert await store.commit_async(ino, loop, start) is None
        rec = store.ix.read_inode(ino)
        assert rec.committed_size == rec.size == 5000
        assert store.committer.covered(store.ix.txnid)
        assert await store.commit_async(ino, loop, start) is None       # nothing to record
        with pytest.raises(StoreError):
            await store.commit_async(10_000_000, loop, start)           # no such inode
    asyncio.run(main())
    for t in workers:
        t.join(10)
        assert not t.is_alive()                      # no worker waits on the committer
    store.close_file(ino, write=True)


def test_a_held_future_releases_once_on_every_way_its_op_ends(store):
    """HeldFuture / LoopFuture.release: what an op holds (a FILE_SYNC write's registration,
    I4) ends when the op is settled, once, before its answer, whether it succeeded, raised,
    its batch's commit failed, or the store was abandoned with it queued; an op whose loop
    gave up waiting is still applied, so its release still runs."""
    import asyncio
    from cache.batch import HeldFuture
    released = []

    def held(name):
        fut = HeldFuture()
        fut.release = lambda: released.append((name, fut.done()))
        return fut

    ok = held("ok")
    store.batch.submit(lambda w: "value", into=ok)
    assert ok.result(10) == "value" and not ok.cancel()

    def boom(w):
        raise StoreError(errno.EIO, "injected")
    failed = held("raised")
    store.batch.submit(boom, into=failed)
    with pytest.raises(StoreError):
        failed.result(10)

    async def main():
        loop = asyncio.get_running_loop()
        hold, go = _hold_writer(store)
        waiter = store.batch.waiter(loop)
        waiter.release = lambda: released.append(("cancelled loop op", waiter.future.cancelled()))
        fut = store.batch.submit(lambda w: store.ns.mkdir(w, ROOT_INO, b"kept", 0o755, 0, 0),
                                 into=waiter)
        fut.cancel()                                 # its caller gave up while it was queued
        go.set()
        await asyncio.wrap_future(hold)
        store.batch.applied()
    asyncio.run(main())
    assert store.lookup(ROOT_INO, b"kept")          # applied all the same

    hold, go = _hold_writer(store)
    queued = held("abandoned")
    store.batch.submit(lambda w: "never", into=queued)
    abandoning = threading.Thread(target=store.batch.abandon)   # waits for the held batch
    abandoning.start()
    while not store.batch.closing:
        time.sleep(0.001)
    go.set()
    abandoning.join(10)
    hold.result(10)
    with pytest.raises(StoreError) as e:
        queued.result(10)
    assert e.value.errno == errno.ESHUTDOWN
    # each once, before its answer was set
    assert released == [("ok", False), ("raised", False), ("cancelled loop op", True),
                        ("abandoned", False)]


def test_a_file_sync_write_hands_its_registration_to_the_committer(store):
    """write_stable_async (FILE_SYNC WRITE, issue 37 point 4): the worker pwrites, syncs the
    extent file, queues the record and leaves; the write stays registered (I4: no truncate,
    evict or fill decides on the file meanwhile) until the committer has made the record
    durable, then the committer ends the registration and answers the loop."""
    import asyncio
    ino = store.create(ROOT_INO, b"f", 0o644, 0, 0)[0].ino
    store.open_file(ino, write=True)
    store.write_stable(ino, 0, b"a" * 4096)         # the cycle's flag is in place
    workers = []
    start = _starter(workers)

    async def main():
        loop = asyncio.get_running_loop()
        hold, go = _hold_writer(store)
        fut = store.write_stable_async(ino, 4096, b"b" * 4096, loop, start)
        workers[0].join(10)
        assert not workers[0].is_alive()             # the worker did not wait for the batch
        assert store._inflight.get(ino) == 1          # registered until the record is durable
        assert not fut.done()
        go.set()
        attr = await fut
        assert attr.size == 8192
        assert not store._inflight.get(ino)          # ended by the committer, before the answer
        rec = store.ix.read_inode(ino)
        assert rec.committed_size == rec.size == 8192
        assert store.committer.covered(store.ix.txnid)
        with pytest.raises(StoreError):               # an error of the worker's half answers it
            await store.write_stable_async(10_000_000, 0, b"x", loop, start)
    asyncio.run(main())
    assert store.read(ino, 0, 8192) == (b"a" * 4096 + b"b" * 4096, True)
    store.close_file(ino, write=True)


def test_a_truncate_waits_for_a_file_sync_write_the_committer_holds(store):
    """I4 across the hand-off: a truncate decided while a FILE_SYNC write's record waits in the
    committer's queue waits for that write (still registered), then cuts after it: the write is
    answered durable and the file ends truncated, its index and extent file in agreement."""
    import asyncio
    from cache.api import SetAttr
    ino = store.create(ROOT_INO, b"f", 0o644, 0, 0)[0].ino
    store.open_file(ino, write=True)
    store.write_stable(ino, 0, b"a" * 4096)
    waiting = threading.Event()
    store._hook = lambda point, *a: waiting.set() if point == "wait_writes" else None
    start = _starter([])

    async def main():
        loop = asyncio.get_running_loop()
        # the committer held in a group sync, outside the index lock: queued ops stay queued
        in_sync, go = hold_next_group_sync(store, timeout=10)
        other = store.submit("mkdir", ROOT_INO, b"d", 0o755, 0, 0, loop=loop)
        assert in_sync.wait(10)
        fut = store.write_stable_async(ino, 4096, b"b" * 4096, loop, start)
        while not store.batch._queue:                 # handed over (registered) and queued
            await asyncio.sleep(0.001)
        assert store._inflight.get(ino) == 1
        truncating = loop.run_in_executor(None, store.setattr, ino, SetAttr(size=100))
        assert await loop.run_in_executor(None, waiting.wait, 10)   # found the write registered
        go.set()
        await other
        assert (await fut).size == 8192
        assert (await truncating).size == 100
    asyncio.run(main())
    rec = store.ix.read_inode(ino)
    assert rec.size == rec.committed_size == 100
    assert store.read(ino, 0, 8192) == (b"a" * 100, True)
    assert os.path.getsize(store.data.path(ino)) == 100
    store.close_file(ino, write=True)

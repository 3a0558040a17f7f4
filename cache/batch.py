"""Namespace batch committer: many concurrent namespace ops, one LMDB write transaction.

Every index commit fdatasyncs data.mdb (sync=True, see index.py) and the single LMDB writer
serializes them, so one transaction per op caps namespace ops at one fdatasync each. Here
one thread takes every queued op, applies each in its own nested txn of ONE write txn (an
op that raises aborts only its own changes; the others stay), commits once, and completes
the ops' futures only when that commit is durable:
  * if more ops are queued, the next batch's commit covers it for free (its data sync also
    flushes this commit's meta page: commit.py), so under load a batch costs one fdatasync;
  * if nothing is queued, one GroupCommit.sync() (env.sync) makes it durable.
So a future's result means "applied and durable"; nobody learns of an op before its commit,
and readers (other threads' read txns) only ever see committed batches. A caller on an asyncio
loop gets an asyncio.Future (submit(loop=...), LoopFuture): the answers of every op a group
commit covered reach each loop in one call_soon_threadsafe, one wake-up of the loop's thread
per group commit, not one per op (issue 37 point 4).

A caller already inside the index lock (a race hook, this thread itself) cannot wait for
this thread, which needs that lock: its op runs inline in its own txn and is synced.
"""
from __future__ import annotations

import collections
import errno
import threading
import time
from concurrent.futures import Future

import structlog

from .api import StoreError

log = structlog.get_logger(__name__)

MAX_BATCH = 512          # ops in one write txn (bounds the txn's dirty pages and latency)
LAZY_DELAY = 0.05        # seconds a lazy op waits for a batch formed for another op


class BatchCommitter:
    def __init__(self, index, committer, after_durable=None):
        self.ix = index
        self.committer = committer
        self.after_durable = after_durable  # run after each durable group (drops of I3)
        # the queue's state under _lock (a C-level context manager, as every submit takes
        # it); _cv, on the same lock, only for the thread's sleeps and their wake-ups
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        self._sleeping = False              # the thread waits in _cv: only then notify
        self._timed = False                 # ... and will wake by itself within LAZY_DELAY
        self._queue: collections.deque = collections.deque()   # (future, fn, args, lazy, queued at)
        self._eager = 0                     # queued ops that are not lazy
        self._kicked = False                # kick(): the queued lazy ops are wanted now
        self._thread: threading.Thread | None = None
        self._closing = False
        self._abandoned = False
        self.batches = 0                    # write txns committed (metrics/tests)
        self.ops = 0                        # ops applied through them
        self.hook = None                    # tests: hook(point) at "batch.applied"

    # ---- callers ------------------------------------------------------------------
    def submit(self, fn, *args, durable: bool = True, lazy: bool = False, loop=None,
               into: LoopFuture | None = None):
        """Run fn(writer, *args) in the next batch; the future holds its result (or the
        StoreError it raised) once the batch is durable. durable=False: set at the commit,
        and never the reason for a sync. lazy (implies durable=False; bookkeeping nobody
        waits for: a settle stamp, a finished job's removal): not the reason for a commit
        either: it joins the next batch formed for another op, in submission order, or
        forms one LAZY_DELAY after it was queued, so a lone one costs no fdatasync.
        The future is a concurrent.futures.Future; with `loop` (a caller on that asyncio
        loop's thread) an asyncio.Future of it, and with `into` (a LoopFuture from
        waiter(), made on its loop's thread) that one's: the ops of one batch answer a
        loop in one call into it (issue 37 point 4), not one wake-up of the loop per op."""
        if into is not None:
            fut = into
        elif loop is not None:
            fut = LoopFuture(loop)
        else:
            fut = Future()
        fut.durable = durable and not lazy
        if not self.can_wait():
            self._inline(fut, fn, args)
        else:
            self._queue_op(fut, fn, args, lazy)
        return fut.future if type(fut) is LoopFuture else fut

    def _queue_op(self, fut, fn, args, lazy: bool) -> None:
        with self._lock:
            if self._closing:
                raise StoreError(errno.ESHUTDOWN, "store is closing")
            # a lazy op waits LAZY_DELAY anyway: a thread that wakes by itself by then (it
            # lingers after a batch, or sleeps until an older op is due) forms it in time
            wake = not lazy or (not self._queue and not self._timed)
            self._queue.append((fut, fn, args, lazy, time.monotonic()))
            if not lazy:
                self._eager += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="ckptgw-nsbatch",
                                                daemon=True)
                self._thread.start()
            # waking the thread for each lazy op (an UNSTABLE WRITE's record, store.py I5)
            # would cost a context switch per op
            if wake and self._sleeping:
                self._cv.notify()

    @staticmethod
    def waiter(loop, then=None) -> "LoopFuture":
        """A LoopFuture for submit(into=...) by another thread (a worker that does the blocking
        half of an op, then queues its index half and leaves: the committer answers the loop
        directly). Made on `loop`'s thread. then(value) runs on the committer thread before
        the answer goes to the loop: its result is the answer, what it raises the error."""
        return LoopFuture(loop, then)

    def kick(self) -> None:
        """Form the next batch now, lazy ops only or not: someone waits for the effect of a
        lazy op (a fill or truncate for a WRITE's lazy index record, Store._wait_writes).
        Never blocks on the index lock, so a caller holding it may kick."""
        with self._cv:
            if self._queue:
                self._kicked = True
                self._cv.notify()

    def can_wait(self) -> bool:
        """Whether this thread may wait for a queued op: not the committer thread itself,
        nor a caller holding the index lock (the committer needs it)."""
        return not (self.ix.lock._is_owned() or threading.current_thread() is self._thread)

    @property
    def closing(self) -> bool:
        """close() has begun: submit() refuses new ops."""
        return self._closing

    def _inline(self, fut, fn, args) -> None:
        try:
            with self.ix.write() as w:
                result = fn(w, *args)
            self.committer.sync()
        except BaseException as e:            # noqa: BLE001 - handed to the caller
            fut.set_exception(e)
        else:
            fut.set_result(result)

    def applied(self) -> None:
        """Wait until every op submitted so far has been applied (its batch committed, not
        necessarily synced), and their done-callbacks have run: a model test's step must not
        depend on when this thread gets to ops nobody waits for (queue_done, LRU stamps)."""
        self.submit(_nothing, durable=False).result()

    def abandon(self) -> None:
        """Tests (a simulated kill -9 in one process): stop the thread once the batch it is
        applying, if any, has committed, and drop every queued op unapplied (its future gets
        ESHUTDOWN, as a killed process's callers get nothing). The environment may then be
        closed: no thread of this store is inside LMDB any more."""
        with self._cv:
            self._closing = self._abandoned = True
            self._cv.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def close(self) -> None:
        """Finish every queued op (durably) and stop the thread."""
        with self._cv:
            self._closing = True
            self._cv.notify()
            thread = self._thread
        if thread is not None:
            thread.join()

    # ---- the committer thread -----------------------------------------------------
    def _run(self) -> None:
        pending: list[tuple[int, list]] = []     # (txnid, outcomes): committed, not yet durable
        linger = False                  # a batch was just formed: more ops may follow soon
        while True:
            with self._lock:
                while not pending and not self._closing:
                    if self._eager or self._kicked:
                        break
                    if not self._queue:
                        # after a batch, a timed sleep first: a lazy op queued meanwhile (the
                        # next UNSTABLE WRITE's record) needs no wake-up of its own
                        self._sleep(LAZY_DELAY if linger else None)
                        linger = False
                        continue
                    due = self._queue[0][4] + LAZY_DELAY - time.monotonic()   # the oldest
                    if due <= 0:
                        break
                    self._sleep(due)
                if self._abandoned:
                    dropped = [entry[0] for entry in self._queue
                               if entry[0].set_running_or_notify_cancel()]
                    self._queue.clear()
                    dropped += [out[0] for _, outs in pending for out in outs]
                    for fut in dropped:
                        fut.set_exception(StoreError(errno.ESHUTDOWN, "store killed"))
                    return
                taken = [self._queue.popleft() for _ in range(min(len(self._queue), MAX_BATCH))]
                self._eager -= sum(1 for entry in taken if not entry[3])
                self._kicked = self._kicked and bool(self._queue)
                # running from here on, so a caller's cancel (an asyncio task awaiting it through
                # wrap_future, cancelled at shutdown) can no longer void a future this thread
                # sets (set_result on a cancelled future raised here and ended the thread: every
                # namespace op after it hung); an op cancelled while queued is dropped unapplied
                batch = [entry for entry in taken if entry[0].set_running_or_notify_cancel()]
                if not taken and not pending:
                    return                           # closing, all done
            if batch:
                linger = True
                outcomes = self._apply(batch)
                if outcomes is not None:
                    _complete([o for o in outcomes if not o[0].durable])
                    waiting = [o for o in outcomes if o[0].durable]
                    if waiting:
                        pending.append((self.ix.txnid, waiting))
            with self._lock:
                more = bool(self._queue)
            if pending and not more:
                try:
                    self.committer.sync()            # nobody else will cover the newest
                except BaseException as e:           # noqa: BLE001 - EIO for every op waiting
                    for _, outs in pending:
                        for fut, _ok, _value in outs:
                            fut.set_exception(e)
                    pending = []
                    continue
            covered, left = [], []               # one test per batch: coverage only grows
            for p in pending:
                (covered if self.committer.covered(p[0]) else left).append(p)
            pending = left
            # one answer per loop for every batch this sync covered (LoopFuture)
            _complete([out for _, outs in covered for out in outs])
            if covered and self.after_durable is not None:
                self.after_durable()        # file removals nobody waits for: after the replies

    def _sleep(self, timeout: float | None) -> None:
        """Wait in _cv (its lock held) until notified or timeout."""
        self._sleeping, self._timed = True, timeout is not None
        try:
            self._cv.wait(timeout)
        finally:
            self._sleeping = self._timed = False

    def _apply(self, batch: list) -> list | None:
        """One write txn, one nested txn per op; commit. Returns (future, ok, value) per op,
        or None when the commit itself failed (every op then gets that error: nothing of
        the batch was applied)."""
        outcomes = []
        try:
            with self.ix.write() as w:
                for fut, fn, args, _lazy, _queued in batch:
                    try:
                        with self.ix.nested(w) as child:
                            value = fn(child, *args)
                    except BaseException as e:       # noqa: BLE001 - this op's answer
                        outcomes.append((fut, False, e))
                    else:
                        outcomes.append((fut, True, value))
                if self.hook is not None:
                    self.hook("batch.applied")
        except BaseException as e:                   # noqa: BLE001 - the batch's answer
            log.error("batch_commit_failed", ops=len(batch), error=str(e))
            for entry in batch:
                entry[0].set_exception(e)
            return None
        self.batches += 1
        self.ops += len(batch)
        return outcomes


def _nothing(_writer) -> None:
    return None


class LoopFuture:
    """A batch op's answer for a caller on an asyncio loop: `future`, an asyncio.Future of
    that loop, settled from the committer thread with a call_soon_threadsafe shared by every
    op of the batch answering that loop (_complete). Stands where a concurrent.futures.Future
    stands in the queue (set_running_or_notify_cancel, set_result, set_exception).
    `release`, when set (see HeldFuture), runs once the op is settled, however it ends."""

    __slots__ = ("loop", "future", "then", "durable", "release")

    def __init__(self, loop, then=None):
        self.loop = loop
        self.future = loop.create_future()
        self.then = then
        self.durable = True
        self.release = None

    def set_running_or_notify_cancel(self) -> bool:
        """False if the caller cancelled it while queued (dropped unapplied, as a cancelled
        concurrent future). Read on the committer thread: a cancel after this is a cancel of
        a running op, which is applied and whose answer _settle drops. An op that holds
        something (`release`) is applied even so: what it holds ends with it."""
        return self.release is not None or not self.future.cancelled()

    def set_result(self, value) -> None:
        _answer_loops([(self, True, value)])

    def set_exception(self, exc: BaseException) -> None:
        _answer_loops([(self, False, exc)])


class HeldFuture(Future):
    """A batch op's concurrent future for an op that holds something until it is settled
    (a FILE_SYNC write's registration, I4: handed over by the worker that pwrote the bytes,
    ended by whoever settles the op: the committer once the record is durable or failed).
    `release` is set when the hold is handed over; it runs once, before the answer, on
    every way an op ends (result, its error, the batch's or the sync's error, abandon).
    LoopFuture does the same in _answer_loops."""

    def __init__(self):
        super().__init__()
        self.release = None

    def cancel(self) -> bool:
        return False                # its op runs whoever waits: what it holds ends with it

    def set_result(self, result) -> None:
        _run_release(self)
        super().set_result(result)

    def set_exception(self, exception) -> None:
        _run_release(self)
        super().set_exception(exception)


def _run_release(fut) -> None:
    release, fut.release = fut.release, None
    if release is not None:
        try:
            release()
        except BaseException as e:               # noqa: BLE001 - the answer must still go
            log.error("batch_release_failed", error=repr(e))


def _complete(outcomes: list) -> None:
    by_loop = []
    for fut, ok, value in outcomes:
        if type(fut) is LoopFuture:
            by_loop.append((fut, ok, value))
        elif ok:
            fut.set_result(value)
        else:
            fut.set_exception(value)
    if by_loop:
        _answer_loops(by_loop)


def _answer_loops(answers: list) -> None:
    """One call into each loop for its answers (then() applied here, off the loop)."""
    calls: dict = {}
    for fut, ok, value in answers:
        if ok and fut.then is not None:
            try:
                value = fut.then(value)
            except BaseException as e:           # noqa: BLE001 - the caller's answer
                ok, value = False, e
        _run_release(fut)
        calls.setdefault(fut.loop, []).append((fut.future, ok, value))
    for loop, settled in calls.items():
        try:
            loop.call_soon_threadsafe(_settle, settled)
        except RuntimeError:            # the loop is closed: nobody waits for these any more
            pass


def _settle(settled: list) -> None:
    """On the loop: set each answer, unless its caller gave up waiting (cancelled)."""
    for future, ok, value in settled:
        if future.done():
            continue
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)

"""The data files of reclaimed inodes, removed once their purge is durable (I3), on a thread
of their own.

A purged inode's file may go only when the txn that purged it is durable: until then a crash
brings the inode back, and its bytes with it; the orphan key names the file meanwhile, so
recovery removes what a crash left. Removing it costs an unlink (~0.25 ms on ext4 for a small
file). The one batch committer found the purge durable, but unlinking there would make every
namespace op queued behind it wait (8-client small-file saves are bounded by that thread,
bench/README.md, 2026-11-29): so it hands the files to this remover and goes on. A caller
that promised the files are gone (Store.sync, close) waits for the remover (settle).
"""
from __future__ import annotations

import collections
import threading
from typing import Callable

import structlog

log = structlog.get_logger(__name__)


class DurableDrops:
    def __init__(self, covered: Callable[[int], bool], remove: Callable[[int], None]):
        self._covered = covered             # txnid -> whether that commit is durable
        self._remove = remove               # ino -> removes its data file (raises on failure)
        self._cv = threading.Condition(threading.Lock())
        self._pending: list[tuple[int, int]] = []      # (txnid of the purge, ino)
        self._ready: collections.deque[int] = collections.deque()   # durable: to remove
        self._busy = False                  # the remover holds files taken from _ready
        self._stopping = False
        self._thread: threading.Thread | None = None

    def add(self, txnid: int, ino: int) -> None:
        """ino's purge was committed in txn `txnid`: remove its file once that is durable."""
        with self._cv:
            self._pending.append((txnid, ino))

    def release(self) -> None:
        """Hand every file whose purge is durable now to the remover; never blocks on it."""
        with self._cv:
            if not self._pending:
                return
            # one test per entry: a commit may become durable between two tests, and an
            # entry in neither list would keep its file until the next start's recovery
            ready, still = [], []
            for entry in self._pending:
                if self._covered(entry[0]):
                    ready.append(entry[1])
                else:
                    still.append(entry)
            if not ready:
                return
            self._pending = still
            self._ready.extend(ready)
            if self._stopping:
                return
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="ckptgw-drops",
                                                daemon=True)
                self._thread.start()
            self._cv.notify()

    def settle(self) -> None:
        """release(), then return once every file handed over so far is removed: this
        thread removes what the remover has not taken yet, and waits for what it has."""
        self.release()
        with self._cv:
            mine = list(self._ready)
            self._ready.clear()
        self._remove_each(mine)
        with self._cv:
            while self._busy:
                self._cv.wait()

    def close(self) -> None:
        """Remove what is durable, then stop the remover (what is not durable yet stays
        named by its orphan key: recovery removes it)."""
        self.settle()
        self._stop()

    def abandon(self) -> None:
        """Tests (a simulated kill -9): stop the remover once the files it holds are removed,
        and forget the rest, as a killed process does (their orphan keys stay)."""
        with self._cv:
            self._ready.clear()
            self._pending.clear()
        self._stop()

    def _stop(self) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._ready and not self._stopping:
                    self._cv.wait()
                if self._stopping:
                    return
                taken = list(self._ready)
                self._ready.clear()
                self._busy = True
            try:
                self._remove_each(taken)
            finally:
                with self._cv:
                    self._busy = False
                    self._cv.notify_all()

    def _remove_each(self, inos: list[int]) -> None:
        for ino in inos:
            try:
                self._remove(ino)
            except Exception as e:          # noqa: BLE001 - the remover must live on
                # the orphan key stays (remove raised before dropping it): recovery retries
                log.error("reclaim_unlink_failed", ino=ino, error=str(e))

"""The remover of reclaimed inodes' data files (cache/drops.py): a file goes only once its purge
is durable (I3), off the thread that found it durable, and a caller that promised the files are
gone (Store.sync) finds them gone (through a real store: test_races.py's
test_reclaim_unlinks_only_after_the_unlink_is_durable and test_namespace.py's unlinks)."""
from __future__ import annotations

import threading

from cache.drops import DurableDrops

WAIT = 10


class Durability:
    """covered(txnid) of a GroupCommit: every txnid <= upto is durable."""

    def __init__(self):
        self.upto = 0

    def covered(self, txnid: int) -> bool:
        return txnid <= self.upto


def test_a_file_goes_only_once_its_purge_is_durable_and_on_the_remover_thread():
    d, removed, threads = Durability(), [], []
    gone = threading.Event()

    def remove(ino):
        removed.append(ino)
        threads.append(threading.current_thread().name)
        gone.set()

    drops = DurableDrops(d.covered, remove)
    drops.add(5, 100)
    drops.release()
    assert removed == []                    # txn 5 is not durable yet
    d.upto = 5
    drops.release()                         # never waits for the remover
    assert gone.wait(WAIT)
    assert removed == [100] and threads == ["ckptgw-drops"]
    drops.close()


def test_an_entry_that_becomes_durable_during_release_is_not_forgotten():
    """Regression (found in review of the remover, 2026-11-29): release() tested each entry
    twice, once to pick the ready ones and once to keep the others; a commit that became
    durable between the two tests left its entry in neither list, and its file stayed until
    the next start's recovery."""
    d, removed = Durability(), []
    calls = []

    def covered(txnid):
        calls.append(txnid)
        if len(calls) == 2:
            d.upto = 10                     # the sync finished while release() was testing
        return d.covered(txnid)

    drops = DurableDrops(covered, removed.append)
    drops.add(3, 1)
    drops.add(4, 2)
    drops.release()                         # txn 3 not durable at its test, txn 4 durable at its
    drops.settle()                          # ... so txn 3's file goes at the next release
    assert sorted(removed) == [1, 2]
    drops.close()


def test_settle_returns_once_the_files_the_remover_holds_are_removed():
    d = Durability()
    held, release_it, removed = threading.Event(), threading.Event(), []

    def slow_remove(ino):
        if ino == 1:
            held.set()
            release_it.wait(WAIT)
        removed.append(ino)

    drops = DurableDrops(d.covered, slow_remove)
    drops.add(1, 1)
    d.upto = 1
    drops.release()
    assert held.wait(WAIT)                  # the remover is inside ino 1's removal
    drops.add(2, 2)
    d.upto = 2
    settled = threading.Event()
    waiter = threading.Thread(target=lambda: (drops.settle(), settled.set()))
    waiter.start()
    assert not settled.wait(0.2)            # ino 1 is still being removed
    release_it.set()
    assert settled.wait(WAIT)
    waiter.join(WAIT)
    assert sorted(removed) == [1, 2]
    drops.close()


def test_a_failed_removal_is_logged_and_the_remover_goes_on():
    d, removed = Durability(), []

    def remove(ino):
        if ino == 1:
            raise OSError(5, "Input/output error")
        removed.append(ino)

    drops = DurableDrops(d.covered, remove)
    drops.add(1, 1)
    d.upto = 1
    drops.release()
    drops.settle()
    drops.add(2, 2)
    d.upto = 2
    drops.settle()
    assert removed == [2]
    drops.close()


def test_abandon_forgets_what_the_remover_has_not_taken():
    d, removed = Durability(), []
    drops = DurableDrops(d.covered, removed.append)
    drops.add(1, 1)
    drops.abandon()                         # as a kill: the orphan key stays for recovery
    d.upto = 1
    drops.release()
    assert removed == []


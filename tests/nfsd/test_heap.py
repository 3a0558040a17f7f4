"""nfsd/heap.py: the heap a burst of connections freed goes back once the burst is over."""
from nfsd.heap import QUIET_SECONDS, TRIM_AFTER_CLOSES, TrimAfterBursts, trim_heap


def test_a_trim_is_due_once_a_burst_of_closes_is_over_and_not_during_it():
    t = TrimAfterBursts()
    for i in range(TRIM_AFTER_CLOSES - 1):
        t.connection_ended(100.0 + i * 0.001)
    assert not t.due(200.0)                          # too few closes: no burst
    t.connection_ended(300.0)
    assert not t.due(300.0 + QUIET_SECONDS / 2)      # still closing: during the burst
    assert t.due(300.0 + QUIET_SECONDS)              # over: once
    assert not t.due(400.0) and t.trims == 1         # and not again until the next burst


def test_regression_a_bursts_stragglers_get_one_trim_more():
    """Seen on a fast host: the churn of 10,000 connections paused for a second while 30 slow
    attackers were still connected, the trim came then, and the buffers the 30 freed when
    their timeouts ended them stayed (RSS settled 18-21 MiB above its start, bound 8)."""
    t = TrimAfterBursts()
    for i in range(TRIM_AFTER_CLOSES):
        t.connection_ended(100.0 + i * 0.001)
    assert t.due(100.0 + 1 + QUIET_SECONDS)          # the burst's pause: trimmed
    for i in range(30):
        t.connection_ended(110.0 + i * 0.01)          # its stragglers end
    assert not t.due(110.3 + QUIET_SECONDS / 2)
    assert t.due(110.3 + QUIET_SECONDS) and t.trims == 2
    t.connection_ended(200.0)                         # an ordinary close later: no trim
    assert not t.due(300.0) and t.trims == 2


def test_trim_heap_calls_malloc_trim_on_glibc():
    assert trim_heap() is True                       # Debian: glibc

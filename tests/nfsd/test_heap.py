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


def test_trim_heap_calls_malloc_trim_on_glibc():
    assert trim_heap() is True                       # Debian: glibc

import asyncio

import pytest

from uploader.ratelimit import AimdLimiter, Backoff, TokenBucket


class FakeClock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_token_bucket_reserves_in_order_and_goes_into_debt():
    clock = FakeClock()
    b = TokenBucket(rate=10, burst=10, clock=clock)
    assert b.reserve(10) == 0.0                 # the burst is free
    assert b.reserve(1) == pytest.approx(0.1)   # then one token per 0.1 s
    assert b.reserve(1) == pytest.approx(0.2)
    clock.t += 0.2                              # refill pays the debt back exactly
    assert b.reserve(0) == 0.0
    assert b.reserve(25) == pytest.approx(2.5)  # larger than the bucket: debt, no deadlock


def test_token_bucket_unlimited():
    b = TokenBucket(rate=0)
    assert b.unlimited and b.reserve(1e12) == 0.0


def test_aimd_halves_once_per_window_and_grows_additively():
    clock = FakeClock()
    lim = AimdLimiter(initial=8, minimum=1, maximum=16, clock=clock)
    started = clock()
    clock.t += 1
    lim.on_throttle(started)
    assert lim.limit == 4
    lim.on_throttle(started)                    # same window: no second halving
    assert lim.limit == 4
    clock.t += 1
    lim.on_throttle(clock())
    assert lim.limit == 2
    for _ in range(2):                          # +1 after `limit` successes
        lim.on_success()
    assert 2.8 < lim.limit < 3.1                 # about +1 per window
    for _ in range(1000):
        lim.on_success()
    assert lim.limit == 16
    for _ in range(20):
        clock.t += 1
        lim.on_throttle(clock())
    assert lim.limit == 1


def test_aimd_limits_concurrency():
    async def main():
        lim = AimdLimiter(initial=3, maximum=3)
        peak = 0

        async def worker():
            nonlocal peak
            await lim.acquire()
            peak = max(peak, lim.in_flight)
            await asyncio.sleep(0.01)
            lim.release()

        await asyncio.gather(*(worker() for _ in range(20)))
        return peak

    assert asyncio.run(main()) == 3


def test_aimd_cancelled_waiter_does_not_leak_a_slot():
    async def main():
        lim = AimdLimiter(initial=1, maximum=1)
        await lim.acquire()
        waiter = asyncio.create_task(lim.acquire())
        await asyncio.sleep(0)
        waiter.cancel()
        lim.release()
        await asyncio.gather(waiter, return_exceptions=True)
        await asyncio.wait_for(lim.acquire(), 1)   # the slot is free again
        return lim.in_flight

    assert asyncio.run(main()) == 1


def test_backoff_full_jitter_bounds():
    import random
    b = Backoff(0.5, 4.0, rng=random.Random(1))
    for attempt in range(12):
        d = b.delay(attempt)
        assert 0.0 <= d <= min(4.0, 0.5 * 2 ** attempt)


def test_aimd_serves_lower_priority_first_fifo_within():
    async def main():
        lim = AimdLimiter(initial=1, maximum=1)
        await lim.acquire()
        order = []

        async def waiter(prio, tag):
            await lim.acquire(prio)
            order.append(tag)
            lim.release()

        tasks = [asyncio.create_task(waiter(p, t)) for p, t in ((5, "a"), (1, "b"), (5, "c"), (1, "d"))]
        await asyncio.sleep(0)
        lim.release()
        await asyncio.gather(*tasks)
        return order

    assert asyncio.run(main()) == ["b", "d", "a", "c"]


# ---- the foreground ceiling (uploader/foreground.py) --------------------------------------
from uploader.foreground import WINDOW, ForegroundFirst  # noqa: E402


def test_foreground_ceiling_holds_while_clients_work_and_lifts_after_the_window():
    fg = ForegroundFirst(2)
    assert fg.ceiling(100.0) == (None, float("inf"))          # nobody stamps: never a ceiling
    last = [99.9]
    fg.last_client_op = lambda: last[0]
    assert fg.ceiling(100.0) == (2, 99.9 + WINDOW)
    assert fg.ceiling(99.9 + WINDOW)[0] is None               # quiet for the window
    fg.urgent = lambda: True                                  # a flush waits, dirty at half
    assert fg.ceiling(100.0)[0] is None
    fg.urgent = lambda: False
    off = ForegroundFirst(0)
    off.last_client_op = lambda: 100.0
    assert off.ceiling(100.0)[0] is None                      # 0: switched off


def test_aimd_ceiling_admits_fewer_while_it_holds_and_wakes_waiters_when_it_lifts():
    """The limiter keeps at most the ceiling in flight while clients work; when they stop,
    the waiters it held back go at once, though no request ended to wake them."""
    async def main():
        loop = asyncio.get_running_loop()
        lim = AimdLimiter(initial=8, maximum=8)
        busy_until = loop.time() + 0.5
        lim.ceiling = lambda now: (2, busy_until) if now < busy_until else (None, float("inf"))
        for _ in range(2):
            await lim.acquire()
        waiters = [asyncio.create_task(lim.acquire()) for _ in range(5)]
        for _ in range(5):                       # the waiters queue up: loop turns, not a time
            await asyncio.sleep(0)               # (a 50 ms sleep once overslept busy_until on
        assert loop.time() < busy_until          # a loaded host and saw the ceiling lifted)
        held = lim.in_flight                     # the ceiling: 2, nobody released
        await asyncio.wait_for(asyncio.gather(*waiters), 2)   # lifted at busy_until
        return held, lim.in_flight, loop.time() >= busy_until

    assert asyncio.run(main()) == (2, 7, True)


def test_aimd_reconsider_admits_at_once_when_the_ceiling_lifts_early():
    async def main():
        lim = AimdLimiter(initial=4, maximum=4)
        urgent = [False]
        lim.ceiling = lambda now: (None, float("inf")) if urgent[0] else (1, now + 60.0)
        await lim.acquire()
        waiter = asyncio.create_task(lim.acquire())
        await asyncio.sleep(0.02)
        assert not waiter.done()
        urgent[0] = True                          # a flush begins
        lim.reconsider()
        await asyncio.wait_for(waiter, 1)
        return lim.in_flight

    assert asyncio.run(main()) == 2

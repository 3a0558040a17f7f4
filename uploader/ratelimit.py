"""Rate control for S3 requests: token buckets, an AIMD concurrency limit, backoff.

A synchronized burst (64 ranks closing their shards in the same second) must leave as a
smooth stream: every request takes a token from the requests/s bucket and its payload
from the bytes/s bucket before it may start, and at most `limit` requests are in flight.
The limit follows AIMD like TCP congestion control: +1 per `limit` successes (about one
per round trip of the whole window), halved on a throttle (503 SlowDown), at most once
per window so one burst of 503s halves it once. Retries sleep with exponential backoff
and full jitter (AWS Architecture Blog, "Exponential Backoff And Jitter", 2015).
"""
from __future__ import annotations

import asyncio
import heapq
import itertools
import random
import time


class TokenBucket:
    """`rate` tokens per second, holding at most `burst`. rate <= 0: unlimited.

    A request larger than the bucket goes into debt and later takers wait it off, so one
    big part neither deadlocks nor bypasses the rate. Takers are served in arrival order."""

    def __init__(self, rate: float, burst: float | None = None, *, clock=time.monotonic):
        self.rate = float(rate)
        self.burst = float(burst if burst is not None else max(rate, 1.0))
        self._clock = clock
        self._tokens = self.burst
        self._stamp = clock()
        self._lock = asyncio.Lock()

    @property
    def unlimited(self) -> bool:
        return self.rate <= 0

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now

    def reserve(self, n: float) -> float:
        """Take n tokens now; return how long the caller must wait before using them."""
        if self.unlimited:
            return 0.0
        self._refill()
        self._tokens -= n
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate

    async def take(self, n: float = 1.0) -> None:
        if self.unlimited or n <= 0:
            return
        async with self._lock:           # FIFO: a waiter holds its place in line
            delay = self.reserve(n)
            if delay > 0:
                await asyncio.sleep(delay)


class AimdLimiter:
    """A concurrency limit that grows additively on success and halves on throttling."""

    def __init__(self, initial: int, minimum: int = 1, maximum: int = 64, *, clock=time.monotonic):
        self.minimum = max(1, minimum)
        self.maximum = max(self.minimum, maximum)
        self.limit = float(min(max(initial, self.minimum), self.maximum))
        self.in_flight = 0
        self.decreases = 0
        self._clock = clock
        self._last_decrease = float("-inf")
        self._waiters: list[tuple[int, int, asyncio.Future]] = []     # heap: (priority, seq, fut)
        self._seq = itertools.count()
        # ceiling(now) -> (at most this many in flight, or None; until when): a temporary
        # ceiling below the limit (uploader/foreground.py), looked at on every decision
        self.ceiling = None
        self._recheck: asyncio.TimerHandle | None = None

    def slots(self) -> int:
        """Requests that may be in flight now: the limit, or the ceiling while it is lower."""
        n = int(self.limit)
        if self.ceiling is not None:
            cap, until = self.ceiling(self._clock())
            if cap is not None and cap < n:
                if self._waiters:
                    self._wake_at(until)
                return cap
        return n

    def _wake_at(self, until: float) -> None:
        # a waiter held back by the ceiling must be woken when it lifts, even if no request
        # ends meanwhile (none may be in flight at all)
        if self._recheck is None:           # one timer at a time; _lifted clears it
            delay = max(0.0, until - self._clock())
            self._recheck = asyncio.get_running_loop().call_later(delay, self._lifted)

    def _lifted(self) -> None:
        self._recheck = None
        self._wake()

    def reconsider(self) -> None:
        """The ceiling may have lifted early (a flush began): admit whoever may go now."""
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self.in_flight < self.slots():
            fut = heapq.heappop(self._waiters)[2]
            if not fut.done():
                self.in_flight += 1
                fut.set_result(None)

    async def acquire(self, priority: int = 0) -> float:
        """Wait for a slot, lowest `priority` first, FIFO within one priority (the uploader
        passes the job id, so an older file's parts go first and files finish in queue
        order instead of all at the end). Returns the start time for on_throttle."""
        if not self._waiters and self.in_flight < self.slots():
            self.in_flight += 1
            return self._clock()
        fut = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (priority, next(self._seq), fut))
        self._wake()                     # a slot may be free (FIFO), else arm the ceiling's timer
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()           # got the slot just as we were cancelled
            raise
        return self._clock()

    def release(self) -> None:
        self.in_flight -= 1
        self._wake()

    def on_success(self) -> None:
        if self.limit < self.maximum:
            self.limit = min(self.maximum, self.limit + 1.0 / self.limit)
            self._wake()

    def on_throttle(self, started: float) -> None:
        """Halve, unless the request started before the last decrease (same congestion event)."""
        if started <= self._last_decrease:
            return
        self.limit = max(float(self.minimum), self.limit / 2)
        self._last_decrease = self._clock()
        self.decreases += 1


class Backoff:
    """Exponential backoff with full jitter: sleep uniform(0, min(cap, base * 2**attempt))."""

    def __init__(self, base: float, cap: float, *, rng: random.Random | None = None):
        self.base = base
        self.cap = cap
        self._rng = rng or random.Random()

    def delay(self, attempt: int) -> float:
        return self._rng.uniform(0.0, min(self.cap, self.base * (2 ** min(attempt, 30))))

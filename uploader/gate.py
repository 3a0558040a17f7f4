"""Every S3 request of the uploader passes this gate: rate buckets, AIMD slots, retries.

`await gate.call(op, fn, nbytes=...)` runs the blocking ObjectClient call `fn` in the thread
pool once a concurrency slot and the tokens are available. Transient errors are retried
with backoff for as long as it takes (an outage only delays the queue); throttles also
halve the concurrency; NotFound and Permanent errors go back to the caller.
"""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

import structlog

from .objectclient import NotFoundError, ThrottledError, TransientError, classify, may_have_applied
from .ratelimit import AimdLimiter, Backoff, TokenBucket
from .settings import UploadSettings
from .stats import Counters

log = structlog.get_logger(__name__)
T = TypeVar("T")


class RequestGate:
    def __init__(self, settings: UploadSettings, counters: Counters, *, pool_size: int | None = None):
        self.settings = settings
        self.counters = counters
        self.requests = TokenBucket(settings.requests_per_second,
                                    max(1.0, settings.requests_per_second * settings.burst_seconds))
        self.bytes = TokenBucket(settings.bytes_per_second,
                                 max(1.0, settings.bytes_per_second * settings.burst_seconds))
        self.limiter = AimdLimiter(settings.max_concurrency, settings.min_concurrency, settings.max_concurrency)
        self.backoff = Backoff(settings.backoff_base, settings.backoff_max)
        self.pool = ThreadPoolExecutor(pool_size or settings.max_concurrency + 4, thread_name_prefix="s3")
        self.waiting_retry = 0

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    async def call(self, op: str, fn: Callable[[], T], *, nbytes: int = 0, what: str = "",
                   retry_not_found: bool = False, priority: int = 0, max_attempts: int = 0,
                   on_send: Callable[[], None] | None = None, on_done: Callable[[], None] | None = None,
                   recheck: Callable[[], T | None] | None = None, recheck_op: str = "HeadObject") -> T:
        """on_send/on_done bracket every attempt that actually goes out (after the slot and
        the tokens), so callers can tell bytes on the wire from bytes still waiting.
        max_attempts > 0: give the last TransientError back after that many attempts, so the
        caller can check whether retrying still makes sense (0: retry for ever).
        recheck: a blocking ObjectClient call (a HEAD) run before the attempt that follows a
        failure S3 may have applied with its reply lost (`may_have_applied`: a timeout, a reset
        after sending, a 500; never after a throttle or another refusal). It is a request of
        its own: through this gate (slot, request token, retries), counted as `recheck_op`.
        A non-None result is this call's result (the failed attempt did take effect); None:
        the next attempt goes out. `fn` itself must make exactly one S3 request."""
        loop = asyncio.get_running_loop()
        attempt = 0
        unsure = False           # the last failed attempt may have been applied
        while True:
            if unsure and recheck is not None:
                found = await self.call(recheck_op, recheck, what=what, priority=priority,
                                        max_attempts=max_attempts)
                if found is not None:
                    return found
            unsure = False
            started = await self.limiter.acquire(priority)
            try:
                await self.requests.take(1)
                await self.bytes.take(nbytes)
                self.counters.bytes_sent += nbytes
                if on_send:
                    on_send()
                try:
                    result = await loop.run_in_executor(self.pool, fn)
                finally:
                    if on_done:
                        on_done()
            except Exception as exc:     # noqa: BLE001 - classified below
                err = classify(exc)
            else:
                self.limiter.on_success()
                self.counters.requests[op] += 1
                return result
            finally:
                self.limiter.release()
            self.counters.failures[err.code] += 1
            if isinstance(err, ThrottledError):
                self.counters.throttles += 1
                self.limiter.on_throttle(started)
            elif isinstance(err, NotFoundError):
                if not retry_not_found:
                    raise err
            elif not isinstance(err, TransientError):
                raise err                # PermanentError: the caller surfaces it
            unsure = may_have_applied(err)
            attempt += 1
            if max_attempts and attempt >= max_attempts:
                raise err
            self.counters.retries += 1
            delay = self.backoff.delay(attempt - 1)
            log.info("s3_retry", op=op, key=what, code=err.code, attempt=attempt, delay=round(delay, 3),
                     limit=round(self.limiter.limit, 2))
            self.waiting_retry += 1
            try:
                await asyncio.sleep(delay)
            finally:
                self.waiting_retry -= 1

"""Run a coroutine on the spot until it first waits; only then give it a task.

Most NFS calls (a LOOKUP, a GETATTR, a SEQUENCE-only COMPOUND, an UNSTABLE WRITE on the fast
path) finish without ever waiting. Wrapping each in an asyncio Task costs the task, a trip
through the loop's ready queue and its done callback: 8.3k of the 171k instructions of an
exists() COMPOUND on uvloop (callgrind, bench/README.md (19)). `start` steps the coroutine right away, in the caller (the transport's
`buffer_updated`), and makes a task only of the rest of one that waits for something.

This is Python 3.12's `asyncio.eager_task_factory`, which 3.11 lacks: one step of
`coro.send(None)`; a coroutine that returns is done with no task; one that yields hands the
task the exact thing it yielded (a future with its blocking flag set, or None for a bare
yield), and the task drives the coroutine from there, cancellation included.

Differences from a plain task, which callers accept: the first step runs in the caller's
context (not a copy), and `asyncio.current_task()` is None during it.
"""
from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


class _Rest:
    """Awaitable that drives a coroutine already stepped once, from what it first yielded."""
    __slots__ = ("coro", "first")

    def __init__(self, coro: Coroutine, first: Any):
        self.coro = coro
        self.first = first

    def __await__(self):
        coro = self.coro
        yielded = self.first
        self.first = None
        while True:
            try:
                sent = yield yielded
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:       # CancelledError from Task.cancel() included
                try:
                    yielded = coro.throw(exc)
                except StopIteration as done:
                    return done.value
            else:
                try:
                    yielded = coro.send(sent)
                except StopIteration as done:
                    return done.value


async def _finish(coro: Coroutine, first: Any) -> Any:
    return await _Rest(coro, first)


def start(coro: Coroutine, loop: asyncio.AbstractEventLoop) -> asyncio.Task | None:
    """Step `coro` now. None when it finished (its result is dropped; an exception it raised
    propagates to the caller); else a task on `loop` that runs the rest."""
    try:
        first = coro.send(None)
    except StopIteration:
        return None
    return loop.create_task(_finish(coro, first))

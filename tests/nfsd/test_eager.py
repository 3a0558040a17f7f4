"""nfsd/eager.py: a coroutine runs on the spot, and only one that waits becomes a task."""
from __future__ import annotations

import asyncio

import pytest

from nfsd import eager


def run(body):
    return asyncio.run(body())


def test_a_coroutine_that_never_waits_finishes_without_a_task():
    steps = []

    async def call():
        steps.append("ran")

    async def body():
        task = eager.start(call(), asyncio.get_running_loop())
        assert task is None
        assert steps == ["ran"]                # before start() returned, not on a later turn
    run(body)


def test_a_coroutine_that_waits_on_a_future_continues_in_a_task():
    async def body():
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        steps = []

        async def call():
            steps.append("before")
            value = await fut
            steps.append(value)
            return value * 2

        task = eager.start(call(), loop)
        assert steps == ["before"] and isinstance(task, asyncio.Task)
        loop.call_soon(fut.set_result, 21)
        assert await task == 42
        assert steps == ["before", 21]
    run(body)


def test_bare_yields_and_several_waits_are_driven_to_the_end():
    async def body():
        loop = asyncio.get_running_loop()

        async def call():
            total = 0
            for i in range(5):
                await asyncio.sleep(0)           # a bare yield (None) to the task
                total += await loop.run_in_executor(None, lambda i=i: i)
            return total

        task = eager.start(call(), loop)
        assert await task == 10
    run(body)


def test_cancelling_the_task_cancels_the_coroutine_where_it_waits():
    async def body():
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        cleaned = []

        async def call():
            try:
                await fut
            finally:
                cleaned.append(True)

        task = eager.start(call(), loop)
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert cleaned == [True] and fut.cancelled()
    run(body)


def test_an_exception_before_the_first_wait_reaches_the_caller():
    async def call():
        raise ValueError("boom")

    async def body():
        with pytest.raises(ValueError, match="boom"):
            eager.start(call(), asyncio.get_running_loop())
    run(body)


def test_an_exception_after_a_wait_is_the_tasks():
    async def body():
        loop = asyncio.get_running_loop()

        async def call():
            await asyncio.sleep(0)
            raise KeyError("late")

        task = eager.start(call(), loop)
        with pytest.raises(KeyError):
            await task
    run(body)


def test_an_exception_thrown_into_a_wait_can_be_handled_by_the_coroutine():
    async def body():
        loop = asyncio.get_running_loop()
        fut = loop.create_future()

        async def call():
            try:
                await fut
            except RuntimeError as exc:
                return f"handled {exc}"

        task = eager.start(call(), loop)
        loop.call_soon(fut.set_exception, RuntimeError("disk"))
        assert await task == "handled disk"
    run(body)

"""``services.tasks.cancel_and_wait``: a task that lost a cancel (Python 3.11's ``wait_for``,
which redis-py wraps every command's write in) is still stopped."""

from __future__ import annotations

import asyncio
import sys

import pytest

from services.tasks import cancel_and_wait


class _Looping:
    """A renewer's shape: waits on an operation under ``wait_for``, then sleeps, for ever."""

    def __init__(self) -> None:
        self.operation: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting = asyncio.Event()
        self.rounds = 0

    async def run(self) -> None:
        while True:
            self.waiting.set()
            await asyncio.wait_for(self.operation, 5)
            self.rounds += 1
            self.operation = asyncio.get_running_loop().create_future()
            await asyncio.sleep(0.01)


async def _lose_a_cancel(looping: _Looping) -> asyncio.Task[None]:
    task = asyncio.create_task(looping.run())
    await looping.waiting.wait()
    looping.operation.set_result(None)  # the operation completes as the cancel lands
    return task


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="wait_for keeps the cancel from 3.12 on")
async def test_a_cancel_landing_as_wait_for_completes_is_lost() -> None:
    """The premise: one cancel does not stop such a task (what hung the slot's release)."""
    looping = _Looping()
    task = await _lose_a_cancel(looping)
    looping.waiting.clear()
    task.cancel()
    # Either the task ends (the cancel kept) or it waits on its next operation (the cancel lost).
    next_wait = asyncio.ensure_future(looping.waiting.wait())
    await asyncio.wait({task, next_wait}, return_when=asyncio.FIRST_COMPLETED)
    assert next_wait.done() and not task.done() and looping.rounds == 1
    await cancel_and_wait(task)


async def test_a_task_that_lost_its_cancel_is_stopped() -> None:
    looping = _Looping()
    task = await _lose_a_cancel(looping)
    await cancel_and_wait(task)
    assert task.cancelled()


async def test_the_tasks_own_failure_is_raised() -> None:
    async def fails() -> None:
        try:
            await asyncio.sleep(10)
        finally:
            raise ValueError("it failed while stopping")

    task = asyncio.create_task(fails())
    await asyncio.sleep(0)
    with pytest.raises(ValueError, match="while stopping"):
        await cancel_and_wait(task)


async def test_a_cancel_of_the_caller_is_not_swallowed() -> None:
    async def slow_to_stop() -> None:
        try:
            await asyncio.sleep(10)
        finally:
            await asyncio.shield(asyncio.sleep(0.2))

    task = asyncio.create_task(slow_to_stop())
    await asyncio.sleep(0)
    stopper = asyncio.create_task(cancel_and_wait(task))
    await asyncio.sleep(0.05)
    stopper.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopper
    await cancel_and_wait(task)

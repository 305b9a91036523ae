"""Stopping a background task so that it has stopped.

Python 3.11's ``asyncio.wait_for`` loses a cancel that lands as the operation it waits on
completes (gh-86296, fixed in 3.12): the operation's result is returned and the task goes on.
redis-py wraps every command's write in it, so a task cancelled while it talks to Redis may
ignore the cancel: a slot's lease renewer did, and its execution waited on it for ever (the
execution stayed ``running``, its lease renewed, until the worker stopped).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Final

#: How long a cancelled task gets to end before it is cancelled again.
_AGAIN_AFTER: Final = 0.05


async def cancel_and_wait(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` and wait until it has ended, cancelling again while it goes on (a cancel
    it lost, above). An exception it ended with, other than the cancel, is raised here."""
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=_AGAIN_AFTER)
    with contextlib.suppress(asyncio.CancelledError):
        await task  # done: never suspends, so a cancel of the caller is not swallowed here

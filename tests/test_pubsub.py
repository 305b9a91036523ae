"""The API's one pub/sub loop (services.pubsub) on the real Redis: a message its hub cannot
handle is that message's failure, never the loop's."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from services import pubsub
from services.runtime import Runtime
from tests.waiting import until


async def test_a_message_that_cannot_be_handled_leaves_the_others_flowing(runtime: Runtime) -> None:
    """A hub's failure on one message (a Bot whose key cannot be unwrapped, a statement that fails
    for it) was taken for a lost connection: the loop reconnected, the messages published
    meanwhile were gone, and a failure that repeats stopped every Bot's feed of the process."""
    handled: list[int] = []

    async def handle(message: dict[str, Any]) -> None:
        if message["n"] == 1:
            raise ValueError("this one cannot be handled")
        handled.append(int(message["n"]))

    ready = asyncio.Event()
    listening = asyncio.create_task(
        pubsub.listen(runtime.redis, "botmemory:test-pubsub:*", handle, ready, silence=5.0)
    )
    try:
        await asyncio.wait_for(ready.wait(), 10)
        for n in (1, 2, 3):
            await runtime.redis.publish("botmemory:test-pubsub:x", json.dumps({"n": n}))

        async def both() -> bool:
            return handled == [2, 3]

        await until(both, lambda: f"handled {handled}, not [2, 3]", within=10)
    finally:
        listening.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listening

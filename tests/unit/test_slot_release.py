"""``services.slots``: a slot is given back even when the task releasing it is cancelled."""

from __future__ import annotations

import asyncio
import time
from typing import Any, cast

from services import slots


class _Redis:
    """What ``take_key`` and its release call: a take that always succeeds, and ``zrem``."""

    def __init__(self) -> None:
        self.given_back: list[str] = []
        self.gave_back = asyncio.Event()

    async def eval(self, script: str, keys: int, *args: Any) -> int:
        return 1

    async def zrem(self, key: str, lease: str) -> int:
        self.given_back.append(lease)
        self.gave_back.set()
        return 1


async def test_a_release_cancelled_midway_still_gives_the_slot_back() -> None:
    """The release waits for the lease's renewer to end before it gives the lease back. A caller
    cancelled meanwhile (a job's timeout, a closed socket) left the lease unreturned — held until
    it expired, and for good when the renewer had also lost its cancel."""
    redis = _Redis()
    release = await slots.take_key(cast(Any, redis), "slots:test", 1, time.monotonic() + 1, 30.0)
    releasing = asyncio.ensure_future(release())
    await asyncio.sleep(0)  # the release has begun: it waits for the renewer
    releasing.cancel()
    await asyncio.wait({releasing})
    assert releasing.cancelled()  # the caller's cancel is its own
    await redis.gave_back.wait()  # before the fix it never came (the suite's timeout fails it)
    assert len(redis.given_back) == 1
    assert not [t for t in asyncio.all_tasks() if t.get_name() == "slot-lease"]

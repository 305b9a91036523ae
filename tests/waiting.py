"""Waiting for what another process does: the suite's one poll loop. A test never sleeps to
prove an absence; it waits until an event shows the work was considered, and fails with what it
waited for when that never comes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def until(
    probe: Callable[[], Awaitable[T | None]],
    what: str | Callable[[], str],
    *,
    within: float = 30,
    every: float = 0.05,
) -> T:
    """``probe``'s first truthy answer, asked every ``every`` seconds; after ``within`` seconds
    without one, an AssertionError saying ``what`` (a callable: said as it stands then)."""
    deadline = time.monotonic() + within
    while True:
        found = await probe()
        if found:
            return found
        assert time.monotonic() < deadline, what if isinstance(what, str) else what()
        await asyncio.sleep(every)

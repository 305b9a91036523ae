"""The one Redis pub/sub listening loop of an API process's hubs (change events, turn events)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, cast

from arq.connections import ArqRedis

log = logging.getLogger("botmemory.pubsub")


async def listen(
    redis: ArqRedis,
    pattern: str,
    handle: Callable[[dict[str, Any]], Awaitable[None]],
    ready: asyncio.Event,
) -> None:
    """Hand every JSON message on channels matching ``pattern`` to ``handle``, for ever; a lost
    Redis connection is re-established (events published meanwhile are missed, never replayed)."""
    while True:
        pubsub = redis.pubsub()
        try:
            await pubsub.psubscribe(pattern)
            ready.set()
            async for message in cast(AsyncIterator[dict[str, Any]], pubsub.listen()):
                if message.get("type") == "pmessage":
                    await handle(json.loads(message["data"]))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # keep listening: a lost Redis connection must not end the feed
            log.warning("%s interrupted: %s; reconnecting", pattern, type(exc).__name__)
            await asyncio.sleep(0.5)
        finally:
            with contextlib.suppress(Exception):
                await pubsub.aclose()

"""The one Redis pub/sub listening loop of an API process's hubs (change events, turn events)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final, Protocol, TypeVar, cast

from arq.connections import ArqRedis

from services import metrics

log = logging.getLogger("services.pubsub")

#: The pause after a listener's connection fails, doubling with each failure in a row up to the
#: longest (a Redis that refuses connections is tried a few times a minute, not twice a second).
FIRST_PAUSE: Final = 0.5
LONGEST_PAUSE: Final = 8.0


class Silent(Exception):
    """The listening connection did not answer a ping in time (a Redis paused, or an address that
    a failover moved: the socket stays open and nothing ever arrives)."""


async def listen(
    redis: ArqRedis,
    pattern: str,
    handle: Callable[[dict[str, Any]], Awaitable[None]],
    ready: asyncio.Event,
    subscribed: Callable[[], Awaitable[None]] | None = None,
    *,
    silence: float,
) -> None:
    """Hand every JSON message on channels matching ``pattern`` to ``handle``, for ever; a lost
    Redis connection is re-established. Messages published meanwhile are missed: ``subscribed``,
    called after every (re)subscription before the next message, is where a hub catches up.

    After ``silence`` seconds without a message the connection is pinged; no answer within
    ``silence`` more and it counts as lost (waiting for the next message alone, a connection that
    had silently died kept every subscription of the process silent until it restarted).

    A lost connection is logged once, with the line that says it listens again; the failures in
    between are counted (``botmemory_feed_interruptions_total``) and tried again after a pause
    that grows with each (:data:`FIRST_PAUSE` to :data:`LONGEST_PAUSE`)."""
    loop = asyncio.get_running_loop()
    pause, failed = FIRST_PAUSE, 0
    while True:
        pubsub = redis.pubsub()
        try:
            await pubsub.psubscribe(pattern)
            if subscribed is not None:
                await subscribed()
            ready.set()
            if failed:
                log.info("%s listening again (after %d failed attempts)", pattern, failed)
            pause, failed = FIRST_PAUSE, 0
            heard, pinged = loop.time(), None
            while True:
                message = cast(dict[str, Any] | None, await pubsub.get_message(timeout=min(1.0, silence)))
                now = loop.time()
                if message is None:
                    if pinged is None and now - heard >= silence:
                        await pubsub.ping()
                        pinged = now
                    elif pinged is not None and now - pinged >= silence:
                        raise Silent
                    continue
                heard, pinged = now, None
                if message.get("type") == "pmessage":
                    try:
                        await handle(json.loads(message["data"]))
                    except Exception as exc:
                        # One message that cannot be handled (its Bot's key, a store that failed
                        # for it) is that message's: taken for a lost connection, it was handled
                        # again after every reconnect, and no other message of the process was.
                        log.warning("%s: a message was not handled (%s)", pattern, type(exc).__name__)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # keep listening: a lost Redis connection must not end the feed
            metrics.FEED_INTERRUPTIONS.labels(pattern).inc()
            if not failed:
                log.warning("%s interrupted: %s; reconnecting until it is back", pattern, type(exc).__name__)
            else:
                log.debug("%s still not back (%s)", pattern, type(exc).__name__)
            failed += 1
            await asyncio.sleep(pause)
            pause = min(pause * 2, LONGEST_PAUSE)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(pubsub.aclose(), silence)


E = TypeVar("E")


class Stream(Protocol[E]):
    """A local subscriber of a hub: its bounded queue (None ends the stream) and whether it was
    ended for falling behind."""

    queue: asyncio.Queue[E | None]
    too_slow: bool


def offer(stream: Stream[E], event: E | None) -> None:
    """Queue ``event`` (None: end the stream). A full queue never skips an event silently: the
    stream ends (``too_slow``; the client subscribes again and re-reads) and gets nothing more."""
    if stream.too_slow:
        return
    try:
        stream.queue.put_nowait(event)
    except asyncio.QueueFull:
        log.warning("a subscriber is too slow for its events; ending its stream")
        stream.too_slow = True
        while not stream.queue.empty():
            stream.queue.get_nowait()
        stream.queue.put_nowait(None)

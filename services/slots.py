"""Memory-Bot task slots per Bot, shared by every process of a deployment (``concurrency``, D9.25).

A slot is a lease in one Redis sorted set per Bot (member: the lease id, score: when it expires,
in Redis server time, so process clocks do not matter). Taking one drops the expired leases and
adds ours only while fewer than the limit are held, in one script (atomic). The holder renews its
lease every third of its length; a process that dies (kill -9) stops renewing, and its slots come
back when their leases expire. The limit is passed on every take, so a settings change applies to
the next task; lowering it lets the running ones finish.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Final

from redis.asyncio import Redis

from services.tasks import cancel_and_wait

log = logging.getLogger("services.slots")

#: KEYS[1] the Bot's set; ARGV: lease id, limit, lease length (ms). 1 = taken, 0 = all taken.
_TAKE: Final = """
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[2]) then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
  redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]) * 2)
  return 1
end
return 0
"""

#: Extends a lease still held; 0 when it had expired (and may have been taken by someone else).
_RENEW: Final = """
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[2]), ARGV[1])
  redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]) * 2)
  return 1
end
return 0
"""

#: Waiting for a slot polls Redis, from this pause doubling to the longest.
_FIRST_PAUSE, _LONGEST_PAUSE = 0.01, 0.2


#: Slots being given back (their tasks, kept until done: the loop holds tasks only weakly).
_giving_back: set[asyncio.Task[None]] = set()


class Busy(Exception):
    """No slot came free before the deadline."""


def key_of(bot_id: str) -> str:
    return f"botmemory:slots:{bot_id}"


async def nothing_held() -> None:
    """The release of a slot not taken (no limit set, or Redis away): nothing to give back."""
    return None


def step_key_of(bot_id: str, chat_id: str) -> str:
    """The one slot of a Chat's learning steps (``learning.executions``)."""
    return f"botmemory:learning-step:{bot_id}:{chat_id}"


async def take(
    redis: Redis, bot_id: str, limit: int, deadline: float, lease_seconds: float
) -> Callable[[], Awaitable[None]]:
    """Wait until ``deadline`` (``time.monotonic``) for one of the Bot's ``limit`` slots; returns
    the release (call it once). Raises Busy at the deadline, or a Redis error."""
    return await take_key(redis, key_of(bot_id), limit, deadline, lease_seconds)


async def take_key(
    redis: Redis, key: str, limit: int, deadline: float, lease_seconds: float
) -> Callable[[], Awaitable[None]]:
    """:func:`take` of one of ``limit`` slots held in the set ``key``."""
    lease = secrets.token_hex(8)
    lease_ms = max(int(lease_seconds * 1000), 1)
    pause = _FIRST_PAUSE
    asking = False  # a take on its way (in a pause, the last one answered that all are held)
    try:
        while True:
            asking = True
            taken = await redis.eval(_TAKE, 1, key, lease, limit, lease_ms)  # type: ignore[misc]
            asking = False
            if taken:
                break
            left = deadline - time.monotonic()
            if left <= 0:
                raise Busy
            await asyncio.sleep(min(pause, left))
            pause = min(pause * 2, _LONGEST_PAUSE)
    except asyncio.CancelledError:
        if asking:
            # A cancel (a job's timeout, a closed socket) while a take's reply was on its way: the
            # script may have taken the slot. Our lease is given back, in a task of its own; else
            # the slot stayed held, by nobody, until its lease ran out.
            _give_back(redis, key, lease, None, warn=True)
        raise
    except Exception:
        if asking:  # a lost connection may have taken it too (most often Redis is away and
            _give_back(redis, key, lease, None, warn=False)  # nothing was: no warning then)
        raise

    async def renew() -> None:
        while True:
            await asyncio.sleep(lease_seconds / 3)
            try:
                held = await redis.eval(_RENEW, 1, key, lease, lease_ms)  # type: ignore[misc]
            except Exception as exc:  # Redis away: try again; the lease may lapse meanwhile
                log.warning("could not renew a task slot (%s)", type(exc).__name__)
                continue
            if not held:
                log.warning(
                    "a task slot lapsed while its task ran; the Bot may briefly exceed its concurrency"
                )
                return

    renewing = asyncio.create_task(renew(), name="slot-lease")

    async def release() -> None:
        # Its own task, shielded: a caller cancelled meanwhile (a job's timeout, a closed socket)
        # still gets its cancel, and the slot is given back all the same.
        await asyncio.shield(_give_back(redis, key, lease, renewing, warn=True))

    return release


def _give_back(
    redis: Redis, key: str, lease: str, renewing: asyncio.Task[None] | None, *, warn: bool
) -> asyncio.Task[None]:
    """Gives the lease back in a task of its own (kept in ``_giving_back`` until done), after
    stopping its renewer (None: a take that did not return); ``warn``: log a failure to give it
    back as a warning (else at debug level)."""

    async def give_back() -> None:
        if renewing is not None:
            await cancel_and_wait(renewing)
        try:
            await redis.zrem(key, lease)
        except Exception as exc:  # its lease expires on its own
            log.log(
                logging.WARNING if warn else logging.DEBUG,
                "could not give a task slot back (%s); it frees when its lease ends",
                type(exc).__name__,
            )

    giving = asyncio.create_task(give_back(), name="slot-give-back")
    _giving_back.add(giving)
    giving.add_done_callback(_giving_back.discard)
    return giving


async def given_back() -> None:
    """Waits for the slots being given back now (``open_runtime`` as it closes Redis, tests)."""
    while _giving_back:
        await asyncio.gather(*_giving_back, return_exceptions=True)


async def held(redis: Redis, bot_id: str) -> int:
    """How many of the Bot's slots are held now (expired leases not counted)."""
    server = await redis.time()  # type: ignore[misc]
    now_ms = int(server[0]) * 1000 + int(server[1]) // 1000
    return int(await redis.zcount(key_of(bot_id), now_ms, "+inf"))

"""Best-effort Redis calls of a process while Redis does not answer.

Announcements (memory changes, turn events), job enqueues and task slots are best effort: one
that fails is logged and its loss borne as designed — other processes catch memory changes up
from the log, the sweeper queues learning, a model call without a slot gets the calm answer,
and a turn event is live-only (the Items stay in the chat). Each would wait out
``redis_timeout_seconds`` on its own, so a request making several against a Redis that does not
answer waits for every one in turn (a ``sendMessage`` over a minute, which clients give up on
and send again). After one times out or cannot connect, the process skips the next ones,
bearing their loss the same way, until a ``PING`` of its own, sent in the background until one
is answered, finds Redis answering again: a Redis down for a minute is waited out by one call,
and one that missed a single answer is used again as soon as it answers.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from services import metrics

log = logging.getLogger(__name__)

#: Failures that say Redis is not answering (not those of a command it answered).
_UNANSWERED = (TimeoutError, RedisTimeoutError, RedisConnectionError, ConnectionError)
#: Seconds between a probe that failed at once (connection refused) and the next.
PROBE_PAUSE: Final = 0.5


class QuietRedis:
    """Whether this process found Redis not answering and has not heard it since."""

    def __init__(self, redis: Redis, timeout_seconds: float) -> None:
        self._redis = redis
        self._timeout = timeout_seconds
        self._probe: asyncio.Task[None] | None = None

    @property
    def silent(self) -> bool:
        return self._probe is not None

    def skips(self, what: str) -> bool:
        """Whether a best-effort call of kind ``what`` skips Redis now (counted when it does)."""
        if self._probe is not None:
            metrics.REDIS_SKIPPED.labels(what).inc()
            return True
        return False

    def failed(self, exc: BaseException) -> None:
        """A best-effort call failed with ``exc``: if Redis did not answer, skip the next ones
        until it answers a probe."""
        if isinstance(exc, _UNANSWERED) and self._probe is None:
            metrics.REDIS_UNANSWERED.set(1)
            self._probe = asyncio.get_running_loop().create_task(self._listen(), name="botmemory-redis-probe")

    async def _listen(self) -> None:
        """PING Redis until it answers (each within the timeout), then let calls through again."""
        try:
            while True:
                try:
                    async with asyncio.timeout(self._timeout):
                        await self._redis.ping()
                    break
                except Exception as exc:  # not answering yet, whatever the failure
                    log.debug("Redis still not answering (%s)", type(exc).__name__)
                    await asyncio.sleep(PROBE_PAUSE)
            log.info("Redis answers again; best-effort calls use it")
        finally:
            self._probe = None
            metrics.REDIS_UNANSWERED.set(0)

    async def close(self) -> None:
        """Stop probing (the process ends)."""
        probe, self._probe = self._probe, None
        if probe is not None:
            probe.cancel()
            await asyncio.gather(probe, return_exceptions=True)

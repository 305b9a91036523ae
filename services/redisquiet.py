"""Best-effort Redis calls of a process while Redis does not answer.

Announcements (memory changes, turn events), job enqueues and task slots are best effort: one
that fails is logged and its loss borne as designed — other processes catch memory changes up
from the log, the sweeper queues learning, a model call without a slot gets the calm answer,
and a turn event is live-only (the Items stay in the chat). Each would wait out
``redis_timeout_seconds`` on its own, so a request making several against a Redis that does not
answer waits for every one in turn (a ``sendMessage`` over a minute, which clients give up on
and send again). After one times out or cannot connect, the process skips the next ones for
that long, bearing their loss the same way; the first one after it tries Redis again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from services import metrics

#: Failures that say Redis is not answering (not those of a command it answered).
_UNANSWERED = (TimeoutError, RedisTimeoutError, RedisConnectionError, ConnectionError)


@dataclass(slots=True)
class QuietRedis:
    """When this process last found Redis not answering, as a monotonic deadline."""

    _until: float = 0.0

    def skips(self, what: str) -> bool:
        """Whether a best-effort call of kind ``what`` skips Redis now (counted when it does)."""
        if time.monotonic() < self._until:
            metrics.REDIS_SKIPPED.labels(what).inc()
            return True
        return False

    def failed(self, exc: BaseException, seconds: float) -> None:
        """A best-effort call failed with ``exc``: if Redis did not answer, skip for ``seconds``."""
        if isinstance(exc, _UNANSWERED):
            self._until = time.monotonic() + seconds

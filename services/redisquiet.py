"""Best-effort Redis calls of a process while Redis does not answer.

Announcements (turn events, memory changes), job enqueues and task slots are best effort: each
that fails is logged, and what it carried is made up for (the change log, the sweeper, the calm
answer). Each waited out ``redis_timeout_seconds`` on its own, though, so a request making several
of them waited for every one in turn: ``sendMessage`` took ~70 s against a paused Redis, and
clients that gave up and sent it again wrote it twice. After one times out or cannot connect,
the process skips the next ones for that long; the first one after it tries Redis again.
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

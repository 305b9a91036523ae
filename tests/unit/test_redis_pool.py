"""``services.redisconn.Pool``: callers that need new connections to a Redis that does not answer
each wait for their own (redis-py's pool connected under its one lock: they waited out the
timeout one after another). The Redis is the far end of socket pairs, never read — no server, no
port."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import Any, ClassVar

from redis.asyncio import Redis

from services.redisconn import Pool, TCPConnection
from tests.waiting import until


class _Unanswered(TCPConnection):
    """A connection to a Redis that accepts it and never answers (its far ends in ``made``)."""

    made: ClassVar[list[socket.socket]] = []

    async def _connect(self: Any) -> None:
        ours, theirs = socket.socketpair()
        _Unanswered.made.append(theirs)
        self._reader, self._writer = await asyncio.open_connection(sock=ours)


async def test_callers_connect_at_once_and_a_cut_connect_is_not_reused() -> None:
    """Five calls, each needing a new connection (its handshake unanswered): all five connect at
    once. Cancelled mid-handshake, each connection goes back to the pool closed, not half-made
    (its handshake's answer, arriving later, would be read as the next command's): no deadline
    of a caller's leaves a connection that answers the wrong command."""
    pool = Pool(connection_class=_Unanswered, socket_timeout=300, socket_connect_timeout=300)
    redis = Redis(connection_pool=pool)

    async def ping() -> None:
        await redis.ping()  # type: ignore[misc]

    calls = [asyncio.create_task(ping()) for _ in range(5)]
    try:

        async def all_connecting() -> bool:
            return len(_Unanswered.made) == len(calls)

        await until(all_connecting, lambda: f"{len(_Unanswered.made)} of {len(calls)} calls connecting")
        assert not any(call.done() for call in calls)
    finally:
        for call in calls:
            call.cancel()
        for call in calls:
            with contextlib.suppress(asyncio.CancelledError):
                await call
        left = [*pool._available_connections, *pool._in_use_connections]  # pyright: ignore[reportPrivateUsage]
        await redis.aclose()
        for far in _Unanswered.made:
            far.close()
        _Unanswered.made.clear()
    assert len(left) == len(calls) and not any(c.is_connected for c in left)

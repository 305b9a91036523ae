"""Redis connections whose writes keep a cancel, from a pool that connects outside its lock.

redis-py 5 bounds each command's write with ``asyncio.wait_for`` when ``socket_timeout`` is set,
and Python 3.11's ``wait_for`` loses a cancel that lands as the write completes (gh-86296, fixed
in 3.12): the cancelled task goes on as if nothing happened. Every task that talks to Redis could
ignore its cancel that way: a slot's lease renewer its release (the execution waiting on it stayed
``running`` for good), arq's main loop, which polls the queue every 50 ms, its SIGTERM (the worker
would take jobs until it was killed). These connections bound the write with ``asyncio.timeout``
instead, which keeps the cancel; reads already use it. A silent Redis still fails the write after
``socket_timeout`` (``redis.exceptions.TimeoutError``).

redis-py 5's asyncio ``ConnectionPool.get_connection`` makes a new connection (the TCP connect and
the handshake's first command) while it holds the pool's one lock. Against a Redis that accepts
connections and never answers, each caller that needs a new connection waits out
``socket_timeout`` and only then lets the next one start: the process's Redis calls queue one
behind another, each waiting the whole timeout, and the feeds' listeners, reconnecting, hold the
lock most of the time. :class:`Pool` takes a connection from its lists without waiting (nothing
there awaits: one event loop needs no lock for it) and connects it outside, so every caller waits
for its own connection alone (as redis-py's ``BlockingConnectionPool`` and later releases do).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Final

from redis.asyncio.connection import (
    AbstractConnection,
    Connection,
    ConnectionPool,
    SSLConnection,
    UnixDomainSocketConnection,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError


class Pool(ConnectionPool):
    """redis-py's pool, connecting outside its lock (above)."""

    async def get_connection(
        self, command_name: str | None = None, *keys: object, **options: object
    ) -> AbstractConnection:
        connection = self.get_available_connection()
        try:
            await self.ensure_connection(connection)
        except BaseException:  # a connect cut short closes its connection (its read or write does)
            await self.release(connection)
            raise
        return connection


class _KeepsCancels(AbstractConnection):
    """redis-py's ``send_packed_command`` with ``asyncio.timeout`` in place of ``wait_for``."""

    async def send_packed_command(
        self, command: bytes | str | Iterable[bytes], check_health: bool = True
    ) -> None:
        if not self.is_connected:
            await self.connect()
        elif check_health:
            await self.check_health()
        parts: Iterable[bytes] = (
            [command.encode()]
            if isinstance(command, str)
            else ([command] if isinstance(command, bytes) else command)
        )
        try:
            async with asyncio.timeout(self.socket_timeout):
                await self._send_packed_command(parts)
        except TimeoutError:
            await self.disconnect(nowait=True)
            raise RedisTimeoutError("Timeout writing to socket") from None
        except OSError as exc:
            await self.disconnect(nowait=True)
            raise RedisConnectionError(f"Error while writing to socket: {exc.args}") from exc
        except BaseException:  # a write cut short (a cancel): the connection is not reusable
            await self.disconnect(nowait=True)
            raise


class TCPConnection(_KeepsCancels, Connection):
    pass


class TLSConnection(_KeepsCancels, SSLConnection):
    pass


class UnixConnection(_KeepsCancels, UnixDomainSocketConnection):
    pass


#: redis-py's connection class (as ``ConnectionPool.from_url`` picks it by scheme) → ours.
_KEEPING: Final[dict[type[AbstractConnection], type[AbstractConnection]]] = {
    Connection: TCPConnection,
    SSLConnection: TLSConnection,
    UnixDomainSocketConnection: UnixConnection,
}


def keeping_cancels(pool: ConnectionPool) -> ConnectionPool:
    """``pool`` making its connections with the class above for its scheme (before any is made)."""
    pool.connection_class = _KEEPING[pool.connection_class]
    return pool

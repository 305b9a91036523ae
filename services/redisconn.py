"""Redis connections whose writes keep a cancel.

redis-py 5 bounds each command's write with ``asyncio.wait_for`` when ``socket_timeout`` is set,
and Python 3.11's ``wait_for`` loses a cancel that lands as the write completes (gh-86296, fixed
in 3.12): the cancelled task goes on as if nothing happened. Every task that talks to Redis could
ignore its cancel that way: a slot's lease renewer its release (the execution waiting on it stayed
``running`` for good), arq's main loop, which polls the queue every 50 ms, its SIGTERM (the worker
would take jobs until it was killed). These connections bound the write with ``asyncio.timeout``
instead, which keeps the cancel; reads already use it. A silent Redis still fails the write after
``socket_timeout`` (``redis.exceptions.TimeoutError``).
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

"""``services.redisconn``: a task cancelled as its Redis command's write completes ends (Python
3.11's ``wait_for``, around redis-py's writes, lost that cancel: the task went on). The Redis is
a coroutine answering ``+OK`` over a socket pair — no server, no port."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

import pytest
from redis.asyncio import ConnectionPool, Redis
from redis.asyncio.connection import Connection

from services.redisconn import TCPConnection, keeping_cancels


async def _answer_ok(sock: socket.socket) -> None:
    reader, writer = await asyncio.open_connection(sock=sock)
    try:
        while data := await reader.read(65536):
            writer.write(b"+OK\r\n" * data.count(b"*"))  # one reply per command (an array)
            await writer.drain()
    finally:
        writer.close()


#: Run once as the next write completes.
_after_write: list[Callable[[], object]] = []


class _Paired:
    """A connection to ``_answer_ok`` (its tasks in ``answering``)."""

    answering: ClassVar[set[asyncio.Task[None]]] = set()

    async def _connect(self: Any) -> None:
        ours, theirs = socket.socketpair()
        _Paired.answering.add(asyncio.create_task(_answer_ok(theirs)))
        self._reader, self._writer = await asyncio.open_connection(sock=ours)

    async def _send_packed_command(self: Any, command: Iterable[bytes]) -> None:
        await super()._send_packed_command(command)  # type: ignore[misc]
        if _after_write:
            _after_write.pop()()


class _RedisPy(_Paired, Connection):
    pass


class _Ours(_Paired, TCPConnection):
    pass


async def _cancel_as_a_write_completes(connection_class: type[Connection]) -> bool:
    """Whether a task setting a key in a loop ends when cancelled right as a write completes."""
    pool = ConnectionPool(connection_class=connection_class, socket_timeout=5)
    redis = Redis(connection_pool=pool)
    try:
        await redis.set("k", "v")

        cancelled, went_on = asyncio.Event(), asyncio.Event()

        def cancel() -> None:
            task.cancel()
            cancelled.set()

        async def loop() -> None:
            while True:
                await redis.set("k", "v")
                if cancelled.is_set():
                    went_on.set()  # a command completed after the cancel: it was lost
                await asyncio.sleep(0.005)

        task = asyncio.create_task(loop())
        _after_write.append(cancel)
        # Either the task ends (the cancel kept) or its command returns after it (the cancel lost).
        went_on_seen = asyncio.ensure_future(went_on.wait())
        await asyncio.wait({task, went_on_seen}, return_when=asyncio.FIRST_COMPLETED)
        kept = task.done() and not went_on.is_set()
        went_on_seen.cancel()
        while not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=0.05)
        return kept
    finally:
        _after_write.clear()
        await redis.aclose()
        await pool.disconnect()
        for answering in _Paired.answering:
            answering.cancel()
        await asyncio.wait(_Paired.answering)
        _Paired.answering.clear()


async def test_redis_py_loses_a_cancel_that_lands_as_its_write_completes() -> None:
    """The premise, on this Python (3.11; 3.12's wait_for keeps the cancel)."""
    import sys

    if sys.version_info >= (3, 12):
        pytest.skip("wait_for keeps the cancel from 3.12 on")
    assert not await _cancel_as_a_write_completes(_RedisPy)


async def test_our_connection_keeps_that_cancel() -> None:
    assert await _cancel_as_a_write_completes(_Ours)


def test_the_pool_of_each_scheme_makes_our_connections() -> None:
    for url in ("redis://127.0.0.1:6379/0", "rediss://127.0.0.1:6380/0", "unix:///tmp/redis.sock"):
        pool = keeping_cancels(ConnectionPool.from_url(url, socket_timeout=5))
        assert pool.connection_class.__module__ == "services.redisconn", url
        assert issubclass(pool.connection_class, ConnectionPool.from_url(url).connection_class)

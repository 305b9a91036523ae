"""Driver construction and transaction helpers."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from neo4j import AsyncDriver, AsyncGraphDatabase, AsyncManagedTransaction
from neo4j.exceptions import TransientError

T = TypeVar("T")

Work = Callable[[AsyncManagedTransaction], Awaitable[T]]


def make_driver(uri: str, user: str, password: str) -> AsyncDriver:
    """An async driver with pool and timeouts sized for one API or worker process."""
    return AsyncGraphDatabase.driver(
        uri,
        auth=(user, password),
        max_connection_pool_size=50,
        connection_acquisition_timeout=30.0,
        max_transaction_retry_time=15.0,
        notifications_min_severity="OFF",
    )


async def read(driver: AsyncDriver, work: Callable[[AsyncManagedTransaction], Awaitable[T]]) -> T:
    """Run ``work`` in one managed read transaction (retried by the driver on transient errors)."""
    async with driver.session() as session:
        return await session.execute_read(work)


async def write(driver: AsyncDriver, work: Callable[[AsyncManagedTransaction], Awaitable[T]]) -> T:
    """Run ``work`` in one managed write transaction (retried by the driver on transient errors)."""
    async with driver.session() as session:
        return await session.execute_write(work)


#: Attempts of an auto-commit transaction that Neo4j rolled back with a transient error.
AUTOCOMMIT_ATTEMPTS = 5


async def autocommit(driver: AsyncDriver, query: Any, **params: Any) -> dict[str, Any] | None:
    """Run one statement as an auto-commit transaction and return its only record (or None).

    BEGIN, the statement and COMMIT are one round trip, where a managed transaction needs three.
    Neo4j rolls the statement back on any error; a transient one (a lock timeout, a deadlock) is
    retried with a growing pause, like a managed transaction, every other error raised.
    """
    attempt = 1
    while True:
        try:
            async with driver.session() as session:
                result = await session.run(query, params)
                record = await result.single()
                return None if record is None else dict(record)
        except TransientError:
            if attempt == AUTOCOMMIT_ATTEMPTS:
                raise
            await asyncio.sleep(0.05 * 2**attempt)
            attempt += 1


async def single(tx: AsyncManagedTransaction, query: Any, **params: Any) -> dict[str, Any] | None:
    """The only record of ``query`` as a dict, or None; the result is consumed inside the transaction."""
    result = await tx.run(query, params)
    record = await result.single()
    return None if record is None else dict(record)


async def rows(tx: AsyncManagedTransaction, query: Any, **params: Any) -> list[dict[str, Any]]:
    """All records of ``query`` as dicts, consumed inside the transaction."""
    result = await tx.run(query, params)
    return [dict(r) async for r in result]

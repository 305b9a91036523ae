"""Driver construction and transaction helpers."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from neo4j import (
    READ_ACCESS,
    WRITE_ACCESS,
    AsyncDriver,
    AsyncGraphDatabase,
    AsyncManagedTransaction,
    AsyncSession,
)
from neo4j.exceptions import TransientError

T = TypeVar("T")

Work = Callable[[AsyncManagedTransaction], Awaitable[T]]

#: Where a statement runs: a managed transaction, or a session for an auto-commit transaction
#: (see :func:`autocommit`).
QueryTarget = AsyncManagedTransaction | AsyncSession


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


async def autocommit(
    driver: AsyncDriver, work: Callable[[AsyncSession], Awaitable[T]], *, write: bool = True
) -> T:
    """Run ``work``, which runs exactly one statement, as an auto-commit transaction.

    BEGIN, the statement and COMMIT take one round trip, where a managed transaction takes three;
    the transaction (and any lock its statement takes) lasts until the result is consumed. A
    statement that fails is rolled back by Neo4j: a transient failure (a lock timeout, a
    deadlock) is retried after a growing pause, like a managed transaction; any other is raised.
    """
    mode = WRITE_ACCESS if write else READ_ACCESS
    attempt = 1
    while True:
        try:
            async with driver.session(default_access_mode=mode) as session:
                return await work(session)
        except TransientError:
            if attempt == AUTOCOMMIT_ATTEMPTS:
                raise
            await asyncio.sleep(0.05 * 2**attempt)
            attempt += 1


async def single(tx: QueryTarget, query: Any, **params: Any) -> dict[str, Any] | None:
    """The only record of ``query`` as a dict, or None; the result is consumed inside the transaction."""
    result = await tx.run(query, params)
    record = await result.single()
    return None if record is None else dict(record)


async def rows(tx: QueryTarget, query: Any, **params: Any) -> list[dict[str, Any]]:
    """All records of ``query`` as dicts, consumed inside the transaction."""
    result = await tx.run(query, params)
    return [dict(r) async for r in result]

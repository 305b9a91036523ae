"""Driver construction and transaction helpers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, LiteralString, TypeAlias, TypedDict, TypeVar, cast

from neo4j import (
    WRITE_ACCESS,
    AsyncDriver,
    AsyncGraphDatabase,
    AsyncManagedTransaction,
    AsyncSession,
    unit_of_work,
)
from neo4j.exceptions import (
    ClientError,
    ConstraintError,
    IncompleteCommit,
    ServiceUnavailable,
    SessionExpired,
    TransientError,
)

T = TypeVar("T")

#: The shape of one record: the ``TypedDict`` of a statement's RETURN clause, defined next to it.
R = TypeVar("R", bound=Mapping[str, object])

#: A ciphertext as a record holds it (E1): base64 text, or raw bytes in a record stored before
#: ciphertexts were stored as text.
Ciphertext: TypeAlias = str | bytes

Work = Callable[[AsyncManagedTransaction], Awaitable[T]]

#: Where a statement runs: a managed transaction, or a session for an auto-commit transaction
#: (see :func:`autocommit`).
QueryTarget = AsyncManagedTransaction | AsyncSession


#: Seconds a connection is given to open (TCP, the Bolt handshake and the login, none of which a
#: Neo4j that stopped answering ever completes), and a request to find a free one in a full pool.
#: An open connection is given up after the silence Neo4j's keep-alive hint allows (DESIGN §5:
#: ``server.bolt.connection_keep_alive`` times ``_probes``; Neo4j sends a NOOP that often while it
#: works on a request, so a long transaction is never taken for a silent Neo4j).
CONNECT_SECONDS: Final = 5.0


def make_driver(uri: str, user: str, password: str, retry_seconds: float = 15.0) -> AsyncDriver:
    """An async driver with pool and timeouts sized for one API or worker process; a transaction
    is retried for ``retry_seconds`` while Neo4j does not answer."""
    return AsyncGraphDatabase.driver(
        uri,
        auth=(user, password),
        max_connection_pool_size=50,
        connection_timeout=CONNECT_SECONDS,
        connection_acquisition_timeout=CONNECT_SECONDS,
        max_transaction_retry_time=retry_seconds,
        notifications_min_severity="OFF",
    )


async def read(driver: AsyncDriver, work: Callable[[AsyncManagedTransaction], Awaitable[T]]) -> T:
    """Run ``work``, which only reads, in one managed transaction (retried by the driver on
    transient errors) — on the leader, in write access mode: every read takes the Bot's shared
    lock first (C1), and a lock taken on a cluster follower would not exclude the writers on the
    leader (D9.27). Reading on the leader also sees every committed write, so reads need no
    bookmarks across processes. On one server both modes are the same."""
    async with driver.session(default_access_mode=WRITE_ACCESS) as session:
        try:
            return await session.execute_write(work)
        except IncompleteCommit as exc:  # a read commits nothing: it may simply be sent again
            raise ServiceUnavailable("the connection was lost during a read's commit") from exc


async def write(driver: AsyncDriver, work: Callable[[AsyncManagedTransaction], Awaitable[T]]) -> T:
    """Run ``work`` in one managed write transaction (retried by the driver on transient errors)."""
    async with driver.session() as session:
        return await session.execute_write(work)


#: The least time a bounded save is given, however late it starts.
SAVE_FLOOR_SECONDS = 0.2
#: What Neo4j says of a transaction that ran past its timeout (while waiting for a lock: the lock
#: client is stopped).
_TIMED_OUT = frozenset(
    {
        "Neo.ClientError.Transaction.TransactionTimedOut",
        "Neo.ClientError.Transaction.TransactionTimedOutClientConfiguration",
        "Neo.ClientError.Transaction.LockClientStopped",
    }
)


async def save_within(
    driver: AsyncDriver,
    seconds: float | None,
    work: Callable[[bool], Callable[[AsyncManagedTransaction], Awaitable[None]]],
) -> None:
    """Write ``work(True)`` within ``seconds`` (at least SAVE_FLOOR_SECONDS; None: unbounded); past
    them, ``work(False)``: the same record keeping less (a save that waits for a lock someone
    holds long — its texts, whose check needs that lock — past a deadline a person waits on).

    The bound is the transaction's own timeout, kept by Neo4j: the write is never cancelled half
    way from here, so whether it committed is never in doubt. (A transaction cancelled here while
    it waited for a lock is rolled back and its place in the queue given up at once, measured:
    the bound is a matter of clarity, not of a lock left held.) One whose first write committed as
    the time ran out is not written twice."""
    if seconds is None:
        return await write(driver, work(True))
    try:
        return await write(driver, unit_of_work(timeout=max(seconds, SAVE_FLOOR_SECONDS))(work(True)))
    except ClientError as exc:
        if exc.code not in _TIMED_OUT:
            raise
    try:
        await write(driver, work(False))
    except ConstraintError:
        return  # the first write committed after all


#: Attempts of an auto-commit transaction that Neo4j rolled back with a transient error (or, for
#: one that only reads, that lost its connection).
AUTOCOMMIT_ATTEMPTS = 5


async def autocommit(
    driver: AsyncDriver,
    work: Callable[[AsyncSession], Awaitable[T]],
    *,
    fetch_size: int | None = None,
    writes: bool = False,
) -> T:
    """Run ``work`` as an auto-commit transaction: one statement (its records fetched
    ``fetch_size`` at a time when given: ``work`` may take them as they come), or, each in a
    transaction of its own, statements that need not read one state (an error's cause, a Bot's
    data key, which never changes).

    BEGIN, the statement and COMMIT take one round trip, where a managed transaction takes three
    (~0.6 against ~0.9 ms for ``RETURN 1`` here); the transaction (and any lock its statement
    takes) lasts until the result is consumed. A statement that fails is rolled back by Neo4j: a
    transient failure (a lock timeout, a deadlock) is retried after a growing pause, like a
    managed transaction; so is a lost connection (a pooled connection that Neo4j closed, a
    restart; not a connection given up after a silence, see CONNECT_SECONDS), unless the
    statement ``writes``: it may have committed, and is raised as
    ``IncompleteCommit`` (the caller must not be told to send it again blindly; a managed
    transaction's driver says so itself). Any other error is raised.
    Reads too run in write access mode, on the leader (see :func:`read`, D9.27).
    """
    fetching = {} if fetch_size is None else {"fetch_size": fetch_size}
    began = time.monotonic()
    attempt = 1
    while True:
        try:
            async with driver.session(default_access_mode=WRITE_ACCESS, **fetching) as session:
                return await work(session)
        except (ServiceUnavailable, SessionExpired) as exc:
            if writes and not isinstance(exc, IncompleteCommit):
                # One statement commits as it ends: lost on the way, it may have committed.
                raise IncompleteCommit("the connection was lost during an auto-commit write") from exc
            # The attempts are for a loss found at once (a pooled connection Neo4j closed, a
            # restart): one that waited out a silent Neo4j is not made again.
            if writes or attempt == AUTOCOMMIT_ATTEMPTS or time.monotonic() - began >= CONNECT_SECONDS:
                raise
            await asyncio.sleep(0.05 * 2**attempt)
            attempt += 1
        except TransientError:
            if attempt == AUTOCOMMIT_ATTEMPTS:
                raise
            await asyncio.sleep(0.05 * 2**attempt)
            attempt += 1


async def single(tx: QueryTarget, query: LiteralString, row: type[R], /, **params: Any) -> R | None:
    """The only record of ``query`` as a ``row``, or None; the result is consumed inside the
    transaction. ``row`` is the TypedDict of the statement's RETURN clause: the driver's records
    are untyped, and this is the one place they are taken to have that shape."""
    result = await tx.run(query, params)
    record = await result.single()
    return None if record is None else cast(R, dict(record))


async def rows(tx: QueryTarget, query: LiteralString, row: type[R], /, **params: Any) -> list[R]:
    """All records of ``query`` as ``row``s (see :func:`single`), consumed inside the transaction."""
    result = await tx.run(query, params)
    return [cast(R, dict(r)) async for r in result]


class _Answer(TypedDict):
    ok: int


#: Whether Neo4j answers a statement (no data read, no lock taken).
_PING: Final[LiteralString] = "RETURN 1 AS ok"


async def ping(driver: AsyncDriver) -> None:
    """Return once Neo4j answers a statement (an auto-commit read: a few attempts); raise the
    driver's error when it does not — refused, silent, or its database still starting."""
    await autocommit(driver, lambda session: single(session, _PING, _Answer))

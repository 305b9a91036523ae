"""Idempotency records: which request a caller's key was first sent with and what it created,
claimed in the transaction that creates it (``services.idempotency``). A record holds ids and
keyed digests only, never words."""

from __future__ import annotations

from typing import Any, Final, LiteralString, TypedDict

from neo4j import AsyncManagedTransaction

from graph.driver import QueryTarget, single
from graph.entries import count

#: The record of ``$id``: created with ``$fields``, or the one there (one past ``expiresAt`` is
#: taken over, as a new one). The key's uniqueness constraint makes a second claim of the same key
#: wait for the first transaction's end, then read what it committed.
CLAIM: Final[LiteralString] = """
MERGE (k:Idempotency {id: $id})
ON CREATE SET k += $fields
ON MATCH SET k += CASE WHEN k.expiresAt <= $now THEN $fields ELSE {} END
RETURN k {.operation, .request, .master, .resourceId, .itemId, .version} AS claim
"""

#: The record of ``$id`` while it is kept.
FIND: Final[LiteralString] = """
MATCH (k:Idempotency {id: $id}) WHERE k.expiresAt > $now
RETURN k {.operation, .request, .master, .resourceId, .itemId, .version} AS claim
"""

#: Records past their time, a batch at a time (the worker's sweep).
SWEEP_EXPIRED: Final[LiteralString] = """
MATCH (k:Idempotency) WHERE k.expiresAt <= $now
WITH k LIMIT $limit
DELETE k
RETURN count(*) AS n
"""


class ClaimMap(TypedDict):
    operation: str
    #: The keyed digest of the request; None once its Chat's history was deleted (D9.23).
    request: str | None
    #: The master key the digest was made under (``services.crypto.Keyring.digest``).
    master: str
    resourceId: str
    itemId: str | None
    version: int | None


class ClaimRow(TypedDict):
    claim: ClaimMap


async def claim(tx: AsyncManagedTransaction, *, id: str, now: int, fields: dict[str, Any]) -> ClaimMap:
    record = await single(tx, CLAIM, ClaimRow, id=id, now=now, fields=fields)
    assert record is not None  # MERGE returns its node
    return record["claim"]


async def find(tx: QueryTarget, *, id: str, now: int) -> ClaimMap | None:
    record = await single(tx, FIND, ClaimRow, id=id, now=now)
    return None if record is None else record["claim"]


async def sweep_expired(tx: AsyncManagedTransaction, *, now: int, limit: int) -> int:
    return await count(tx, SWEEP_EXPIRED, now=now, limit=limit)

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
#: wait for the first transaction's end; the record is then locked and read again, so of two
#: claims taking over an expired record the second reads the first's (``claimId``: which request
#: holds it).
CLAIM: Final[LiteralString] = """
MERGE (held:Idempotency {id: $id})
ON CREATE SET held += $fields
WITH held
CALL apoc.lock.nodes([held])
WITH held
MATCH (k:Idempotency) WHERE elementId(k) = elementId(held)
SET k += CASE WHEN k.claimId <> $fields.claimId AND k.expiresAt <= $now THEN $fields ELSE {} END
RETURN k {.claimId, .operation, .request, .scoped, .master, .resourceId, .itemId, .version} AS claim
"""

#: The hold on the record of ``$id`` of a request that answers past its transaction (``heldBy``:
#: its ``$holder``; ``heldUntil``: when its lease ends, in ms): set to ``$until`` when it is
#: ``$holder``'s, or, with ``$takeOver``, when its lease ended (its holder was cut off, or let it
#: go); a ``$until`` of null lets it go. Locked and read again first, so of two requests taking
#: over one lease the second reads the first's. ``ours``: whether ``$holder`` holds it now
#: (none when there is no record).
HOLD: Final[LiteralString] = """
MATCH (held:Idempotency {id: $id})
CALL apoc.lock.nodes([held])
WITH held
MATCH (k:Idempotency) WHERE elementId(k) = elementId(held)
WITH k, coalesce(k.heldBy = $holder, false) OR ($takeOver AND coalesce(k.heldUntil, 0) <= $now) AS ours
SET k.heldBy = CASE WHEN ours THEN $holder ELSE k.heldBy END,
    k.heldUntil = CASE WHEN ours THEN $until ELSE k.heldUntil END
RETURN ours, k.heldUntil AS heldUntil
"""

#: The first Item a claim's request added (known once its Items are numbered).
SET_ITEM: Final[LiteralString] = "MATCH (k:Idempotency {id: $id}) SET k.itemId = $itemId\n"

#: The record of ``$id`` while it is kept.
FIND: Final[LiteralString] = """
MATCH (k:Idempotency {id: $id}) WHERE k.expiresAt > $now
RETURN k {.claimId, .operation, .request, .scoped, .master, .resourceId, .itemId, .version} AS claim
"""

#: Records past their time, a batch at a time (the worker's sweep), each locked and read again
#: first: one a claim took over meanwhile is kept.
SWEEP_EXPIRED: Final[LiteralString] = """
MATCH (held:Idempotency) WHERE held.expiresAt <= $now
WITH held LIMIT $limit
CALL apoc.lock.nodes([held])
WITH held
MATCH (k:Idempotency) WHERE elementId(k) = elementId(held) AND k.expiresAt <= $now
DELETE k
RETURN count(*) AS n
"""


class ClaimMap(TypedDict):
    #: Which request holds the record (one id per request, kept across its transaction's retries).
    claimId: str
    operation: str
    #: The keyed digest of the request; None once its Chat's history was deleted (D9.23).
    request: str | None
    #: Whether the digest covers whose key it is (``services.idempotency.Key.request``); None for
    #: an older record, whose digest covers the arguments alone.
    scoped: bool | None
    #: The master key the digest was made under (``services.crypto.Keyring.digest``).
    master: str
    resourceId: str
    itemId: str | None
    version: int | None


class ClaimRow(TypedDict):
    claim: ClaimMap


class HoldRow(TypedDict):
    ours: bool
    #: When the lease of whoever holds the record ends (ms); None when nobody does.
    heldUntil: int | None


async def claim(tx: AsyncManagedTransaction, *, id: str, now: int, fields: dict[str, Any]) -> ClaimMap:
    record = await single(tx, CLAIM, ClaimRow, id=id, now=now, fields=fields)
    assert record is not None  # MERGE returns its node
    return record["claim"]


async def hold(
    tx: AsyncManagedTransaction, *, id: str, holder: str, now: int, until: int | None, take_over: bool
) -> HoldRow | None:
    return await single(tx, HOLD, HoldRow, id=id, holder=holder, now=now, until=until, takeOver=take_over)


async def set_item(tx: AsyncManagedTransaction, *, id: str, item_id: str) -> None:
    await (await tx.run(SET_ITEM, id=id, itemId=item_id)).consume()


async def find(tx: QueryTarget, *, id: str, now: int) -> ClaimMap | None:
    record = await single(tx, FIND, ClaimRow, id=id, now=now)
    return None if record is None else record["claim"]


async def sweep_expired(tx: AsyncManagedTransaction, *, now: int, limit: int) -> int:
    return await count(tx, SWEEP_EXPIRED, now=now, limit=limit)

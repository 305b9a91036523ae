"""The batched visibility check of change events for the subscribers of one API process."""

from __future__ import annotations

from typing import Any, Final

from neo4j import AsyncManagedTransaction

from graph.access import VISIBLE
from graph.driver import rows
from graph.memory import ENTRY_ROW, READ_LOCK

#: For each local subscriber (``$subs``: ``{key, person, org, token}``) the ids among the changed
#: entries (``$ids``) it may see now: current membership, a live token, read on the Bot (V10).
#: One query per event per API process; subscribers that lost access are absent.
DELIVERY: Final = (
    """
MATCH (b:Bot {id: $botId})
UNWIND $subs AS sub
MATCH (t:Token {id: sub.token})-[:FOR]->(p:Person {id: sub.person})-[:MEMBER_OF]->(o:Organization {id: sub.org})
WHERE t.revokedAt IS NULL AND (t.expiresAt IS NULL OR t.expiresAt > $now)
OPTIONAL MATCH (p)-[:MEMBER]->(c:Channel)-[:IN]->(o)
WITH sub, o, b, p, collect(c.id) AS channels
WITH sub, o.id AS org, [{id: p.id, channels: channels,
      usesBot: EXISTS { (p)-[:GRANT]->(b) } AND ((b)-[:OWNED_BY]->(o) OR (b)-[:LINKED]->(o))}] AS readers
WHERE readers[0].usesBot
CALL (org, readers) {
  UNWIND $ids AS entryId
  MATCH (e:Entry {id: entryId})
  WHERE e.botId = $botId AND e.status <> 'retracted' AND """
    + VISIBLE
    + """
  RETURN collect(e.id) AS visible
}
RETURN sub.key AS key, visible
"""
)

#: The changed entries themselves, read once for all subscribers (content as ciphertext).
CHANGED_ENTRIES: Final = (
    """
UNWIND $ids AS entryId
MATCH (e:Entry {id: entryId})
WHERE e.botId = $botId
"""
    + ENTRY_ROW
)


#: DELIVERY under the shared lock, taken in the same statement (the first of the read, C1).
LOCKED_DELIVERY: Final = READ_LOCK + "WITH m\n" + DELIVERY


async def deliveries(
    tx: AsyncManagedTransaction, *, bot_id: str, ids: list[str], subs: list[dict[str, str]], now: int
) -> dict[str, list[str]]:
    """Visible changed entry ids per subscriber key; subscribers that lost access are absent.
    The shared lock of the Bot's memory heads the statement (the first of the read, C1)."""
    found = await rows(tx, LOCKED_DELIVERY, botId=bot_id, ids=ids, subs=subs, now=now)
    return {r["key"]: list(r["visible"]) for r in found}


async def changed_entries(
    tx: AsyncManagedTransaction, *, bot_id: str, ids: list[str]
) -> list[dict[str, Any]]:
    return [r["entry"] for r in await rows(tx, CHANGED_ENTRIES, botId=bot_id, ids=ids)]

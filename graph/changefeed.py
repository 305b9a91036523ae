"""The batched visibility check of change events for the subscribers of one API process."""

from __future__ import annotations

from typing import Any, Final

from neo4j import AsyncManagedTransaction

from graph.access import VISIBLE
from graph.driver import rows

#: For each local subscriber (``$subs``: ``{key, person, org, token}``) the changed entries
#: (``$ids``) it may see now: current membership, a live token, read on the Bot (V10). One
#: query per event per API process; returns ciphertexts for decryption after commit.
DELIVERY: Final = (
    """
UNWIND $subs AS sub
MATCH (t:Token {id: sub.token})-[:FOR]->(p:Person {id: sub.person})-[:MEMBER_OF]->(o:Organization {id: sub.org})
WHERE t.revokedAt IS NULL AND (t.expiresAt IS NULL OR t.expiresAt > $now)
MATCH (b:Bot {id: $botId})
OPTIONAL MATCH (p)-[:MEMBER]->(c:Channel)-[:IN]->(o)
WITH sub, o, b, p, collect(c.id) AS channels
WITH sub, o.id AS org, [{id: p.id, channels: channels,
      usesBot: EXISTS { (p)-[:GRANT]->(b) } AND ((b)-[:OWNED_BY]->(o) OR (b)-[:LINKED]->(o))}] AS readers
WHERE readers[0].usesBot
OPTIONAL MATCH (e:Entry {botId: $botId})
WHERE e.id IN $ids AND e.status <> 'retracted' AND """
    + VISIBLE
    + """
OPTIONAL MATCH (e)-[:SOURCE]->(src)
WITH sub, e, collect(CASE WHEN src:Item THEN {chat: src.chatId, item: src.id} ELSE {entry: src.id} END) AS sources
WITH sub, collect(CASE WHEN e IS NULL THEN null ELSE e {.id, .layer, .tags, .status, .confidence, .createdAt,
                  .updatedAt, .invalidatedAt, .content, .orderKey, sources: sources} END) AS entries
RETURN sub.key AS key, entries
"""
)


async def deliveries(
    tx: AsyncManagedTransaction, *, bot_id: str, ids: list[str], subs: list[dict[str, str]], now: int
) -> dict[str, list[dict[str, Any]]]:
    """Visible changed entries per subscriber key; subscribers that lost access are absent."""
    return {
        r["key"]: r["entries"] for r in await rows(tx, DELIVERY, botId=bot_id, ids=ids, subs=subs, now=now)
    }

"""The source graph around one entry for analysts (D9.7): its sources and dependents to a depth."""

from __future__ import annotations

from typing import Final, LiteralString, TypedDict

from neo4j import AsyncManagedTransaction

from graph.access import VISIBLE, ReaderMap
from graph.driver import rows
from graph.memory import ENTRY_ROW, EntryMap, EntryRow

#: Entries and Items around one entry, each with its nearest distance (D9.7 filters them after).
#: Hop bound: 8, the source-chain bound (D9.2).
SOURCES_OF: Final[LiteralString] = """
MATCH p = (e:Entry {id: $id, botId: $botId})-[:SOURCE*1..8]->(n)
WITH n, min(length(p)) AS depth
RETURN CASE WHEN n:Item THEN 'item' ELSE 'entry' END AS kind, n.id AS id, n.chatId AS chat, depth
"""


DEPENDENTS_OF: Final[LiteralString] = """
MATCH p = (d:Entry {botId: $botId})-[:SOURCE*1..8]->(e:Entry {id: $id, botId: $botId})
WITH d, min(length(p)) AS depth
RETURN 'entry' AS kind, d.id AS id, null AS chat, depth
"""


class NeighbourRow(TypedDict):
    """SOURCES_OF, DEPENDENTS_OF: ``chat`` is an Item's Chat (None for an entry)."""

    kind: str
    id: str
    chat: str | None
    depth: int


#: Visible entries by id with everything the API returns (content as ciphertext).
ENTRIES_BY_ID: Final[LiteralString] = (
    """
WITH $readers AS readers, $org AS org
UNWIND $ids AS entryId
MATCH (e:Entry {id: entryId, botId: $botId})
WHERE e.status IN $statuses AND """
    + VISIBLE
    + ENTRY_ROW
    + """
ORDER BY e.memoryRank DESC, e.id
"""
)


async def neighbours(
    tx: AsyncManagedTransaction, *, bot_id: str, id: str, direction: str
) -> list[NeighbourRow]:
    """Sources (``direction='sources'``) or dependents of an entry with their distance."""
    query = SOURCES_OF if direction == "sources" else DEPENDENTS_OF
    return await rows(tx, query, NeighbourRow, botId=bot_id, id=id)


async def entries_by_id(
    tx: AsyncManagedTransaction,
    *,
    bot_id: str,
    org: str,
    readers: list[ReaderMap],
    ids: list[str],
    statuses: list[str],
) -> list[EntryMap]:
    result = await rows(
        tx, ENTRIES_BY_ID, EntryRow, botId=bot_id, org=org, readers=readers, ids=ids, statuses=statuses
    )
    return [r["entry"] for r in result]

"""A Bot's memory: the lock (C1, D9.8), the version and change log (C2), and Entry reads.

Reads run in one transaction whose first statement takes the shared lock on the Memory node;
changes start by writing the Memory node (the exclusive lock), so a read never mixes old access
rules with new content, across API processes too. Content is returned as ciphertext and
decrypted by the caller after commit.
"""

from __future__ import annotations

from typing import Any, Final

from neo4j import AsyncManagedTransaction

from graph.access import VISIBLE
from graph.driver import rows, single

SHARED_LOCK: Final = """
MATCH (m:Memory {id: $botId})
CALL apoc.lock.read.nodes([m])
RETURN m.version AS version
"""

#: The first statement of every change: writing the Memory node takes its exclusive lock.
BUMP_VERSION: Final = """
MATCH (m:Memory {id: $botId})
SET m.version = m.version + 1
RETURN m.version AS version
"""

WRITE_CHANGE: Final = """
MATCH (m:Memory {id: $botId})
CREATE (c:Change {id: $id, botId: $botId, version: $version, at: $at, actor: $actor,
                  entryIds: $entryIds, payload: $payload})-[:OF]->(m)
"""

#: The entries of a Bot a set of readers may see, in memory order (pinned first, then
#: ``orderKey`` descending, then ``id``). ``$statuses`` picks active only or history too;
#: ``$tags`` (all-of) narrows the list. Returns ciphertext for decryption after commit.
LIST_VISIBLE: Final = (
    """
WITH $readers AS readers, $org AS org
MATCH (e:Entry {botId: $botId})
WHERE e.status IN $statuses AND all(t IN $tags WHERE t IN e.tags) AND """
    + VISIBLE
    + """
OPTIONAL MATCH (e)-[:SOURCE]->(src)
WITH e, collect(CASE WHEN src:Item THEN {chat: src.chatId, item: src.id} ELSE {entry: src.id} END) AS sources
RETURN e {.id, .layer, .tags, .status, .confidence, .createdAt, .updatedAt, .invalidatedAt, .content,
          .contentLength, .orderKey, sources: sources} AS entry
ORDER BY e.pinned DESC, e.orderKey DESC, e.id
SKIP $skip LIMIT $limit
"""
)

#: Ids, lengths and ciphertexts in memory order for ``context`` (N3); the caller stops at the
#: first entry that does not fit and decrypts only what it returns.
CONTEXT_CANDIDATES: Final = (
    """
WITH $readers AS readers, $org AS org
MATCH (e:Entry {botId: $botId})
WHERE e.status = 'active' AND """
    + VISIBLE
    + """
RETURN e.id AS id, e.contentLength AS length, e.content AS content
ORDER BY e.pinned DESC, e.orderKey DESC, e.id
LIMIT $limit
"""
)

HAS_VISIBLE: Final = (
    """
WITH $readers AS readers, $org AS org
MATCH (e:Entry {botId: $botId})
WHERE e.status = 'active' AND """
    + VISIBLE
    + """
RETURN e.id AS id LIMIT 1
"""
)

#: Which of ``$ids`` are visible (and active when ``$activeOnly``) — no content read (N4, E2).
VISIBLE_IDS: Final = (
    """
WITH $readers AS readers, $org AS org
UNWIND $ids AS entryId
MATCH (e:Entry {id: entryId, botId: $botId})
WHERE (NOT $activeOnly OR e.status = 'active') AND e.status <> 'retracted' AND """
    + VISIBLE
    + """
RETURN collect(e.id) AS ids
"""
)

LOG_ROWS: Final = """
MATCH (c:Change {botId: $botId})
WHERE size(c.entryIds) > 0
RETURN c.version AS version, c.at AS at, c.actor AS actor, c.entryIds AS ids
ORDER BY c.version DESC
LIMIT $limit
"""

ENTRY_FOR_EDIT: Final = """
MATCH (e:Entry {id: $id, botId: $botId})
RETURN e {.id, .layer, .tags, .status, .author, .excluded, .orderKey} AS entry
"""


async def shared_lock(tx: AsyncManagedTransaction, *, bot_id: str) -> int | None:
    """Take the shared lock of a Bot's memory (the first statement of every read); its version."""
    record = await single(tx, SHARED_LOCK, botId=bot_id)
    return None if record is None else int(record["version"])


async def bump_version(tx: AsyncManagedTransaction, *, bot_id: str) -> int | None:
    """Take the exclusive lock of a Bot's memory (the first statement of every change) and bump its version."""
    record = await single(tx, BUMP_VERSION, botId=bot_id)
    return None if record is None else int(record["version"])


async def write_change(
    tx: AsyncManagedTransaction,
    *,
    id: str,
    bot_id: str,
    version: int,
    at: int,
    actor: str,
    entry_ids: list[str],
    payload: bytes | None,
) -> None:
    """The change-log row of one change (C2); the payload is encrypted by the caller (E1)."""
    await tx.run(
        WRITE_CHANGE,
        id=id,
        botId=bot_id,
        version=version,
        at=at,
        actor=actor,
        entryIds=entry_ids,
        payload=payload,
    )


async def list_visible(
    tx: AsyncManagedTransaction,
    *,
    bot_id: str,
    org: str,
    readers: list[dict[str, Any]],
    statuses: list[str],
    tags: list[str],
    skip: int = 0,
    limit: int = 100_000,
) -> list[dict[str, Any]]:
    result = await rows(
        tx,
        LIST_VISIBLE,
        botId=bot_id,
        org=org,
        readers=readers,
        statuses=statuses,
        tags=tags,
        skip=skip,
        limit=limit,
    )
    return [r["entry"] for r in result]


async def context_candidates(
    tx: AsyncManagedTransaction, *, bot_id: str, org: str, readers: list[dict[str, Any]], limit: int
) -> list[dict[str, Any]]:
    return await rows(tx, CONTEXT_CANDIDATES, botId=bot_id, org=org, readers=readers, limit=limit)


async def has_visible(
    tx: AsyncManagedTransaction, *, bot_id: str, org: str, readers: list[dict[str, Any]]
) -> bool:
    return await single(tx, HAS_VISIBLE, botId=bot_id, org=org, readers=readers) is not None


async def visible_ids(
    tx: AsyncManagedTransaction,
    *,
    bot_id: str,
    org: str,
    readers: list[dict[str, Any]],
    ids: list[str],
    active_only: bool,
) -> set[str]:
    record = await single(
        tx, VISIBLE_IDS, botId=bot_id, org=org, readers=readers, ids=ids, activeOnly=active_only
    )
    return set() if record is None else set(record["ids"])


async def log_rows(tx: AsyncManagedTransaction, *, bot_id: str, limit: int) -> list[dict[str, Any]]:
    return await rows(tx, LOG_ROWS, botId=bot_id, limit=limit)


async def entry_for_edit(tx: AsyncManagedTransaction, *, bot_id: str, id: str) -> dict[str, Any] | None:
    record = await single(tx, ENTRY_FOR_EDIT, botId=bot_id, id=id)
    return None if record is None else record["entry"]


#: Entries and Items around one entry, each with its nearest distance (D9.7 filters them after).
#: Hop bound: 8, the source-chain bound (D9.2).
SOURCES_OF: Final = """
MATCH p = (e:Entry {id: $id, botId: $botId})-[:SOURCE*1..8]->(n)
WITH n, min(length(p)) AS depth
RETURN CASE WHEN n:Item THEN 'item' ELSE 'entry' END AS kind, n.id AS id, n.chatId AS chat, depth
"""

DEPENDENTS_OF: Final = """
MATCH p = (d:Entry {botId: $botId})-[:SOURCE*1..8]->(e:Entry {id: $id, botId: $botId})
WITH d, min(length(p)) AS depth
RETURN 'entry' AS kind, d.id AS id, null AS chat, depth
"""

#: Visible entries by id with everything the API returns (content as ciphertext).
ENTRIES_BY_ID: Final = (
    """
WITH $readers AS readers, $org AS org
UNWIND $ids AS entryId
MATCH (e:Entry {id: entryId, botId: $botId})
WHERE e.status IN $statuses AND """
    + VISIBLE
    + """
OPTIONAL MATCH (e)-[:SOURCE]->(src)
WITH e, collect(CASE WHEN src:Item THEN {chat: src.chatId, item: src.id} ELSE {entry: src.id} END) AS sources
RETURN e {.id, .layer, .tags, .status, .confidence, .createdAt, .updatedAt, .invalidatedAt, .content,
          .contentLength, .orderKey, sources: sources} AS entry
ORDER BY e.pinned DESC, e.orderKey DESC, e.id
"""
)


async def neighbours(
    tx: AsyncManagedTransaction, *, bot_id: str, id: str, direction: str
) -> list[dict[str, Any]]:
    """Sources (``direction='sources'``) or dependents of an entry with their distance."""
    query = SOURCES_OF if direction == "sources" else DEPENDENTS_OF
    return await rows(tx, query, botId=bot_id, id=id)


async def entries_by_id(
    tx: AsyncManagedTransaction,
    *,
    bot_id: str,
    org: str,
    readers: list[dict[str, Any]],
    ids: list[str],
    statuses: list[str],
) -> list[dict[str, Any]]:
    result = await rows(tx, ENTRIES_BY_ID, botId=bot_id, org=org, readers=readers, ids=ids, statuses=statuses)
    return [r["entry"] for r in result]

"""Entry writes: create with SOURCE edges, tag and status changes, Forget, purge.

All of them run inside a change transaction that already holds the exclusive Memory lock
(:func:`graph.memory.bump_version`). Tag and status changes never touch ``content`` (E3).
"""

from __future__ import annotations

from typing import Any, Final

from neo4j import AsyncManagedTransaction

from graph import access
from graph.driver import rows, single

#: Source entries of an observation as they are now (C7), with their provenance tags (V12).
#: What an observation needs to know of an entry ``s`` it rests on (a map expression).
SOURCE_ENTRY_MAP: Final = (
    "{id: s.id, status: s.status, legacy: coalesce(s.legacy, false), tags: s.tags, layer: s.layer}"
)

SOURCE_ENTRIES: Final = (
    """
UNWIND $ids AS entryId
MATCH (s:Entry {id: entryId, botId: $botId})
RETURN """
    + SOURCE_ENTRY_MAP
    + " AS entry\n"
)

#: Many new entries at once with their SOURCE edges, one round trip for a whole step
#: (``$rows``: id, layer, content, contentLength, tags, confidence, orderKey, sourceCount,
#: author, legacy, ``itemSources`` and ``entrySources``). Item edges keep the Item's rule (V3).
CREATE_ENTRIES: Final = """
MATCH (m:Memory {id: $botId})
UNWIND $rows AS row
CREATE (e:Entry {id: row.id, botId: $botId, layer: row.layer, content: row.content,
                 contentLength: row.contentLength, tags: row.tags, status: 'active', confidence: row.confidence,
                 createdAt: $now, updatedAt: $now, invalidatedAt: null, orderKey: row.orderKey,
                 pinned: row.layer = 'pinned', sourceCount: row.sourceCount, author: row.author, excluded: [],
                 legacy: row.legacy})-[:IN_MEMORY]->(m)
WITH e, row
CALL (e, row) {
  UNWIND row.itemSources AS src
  MATCH (i:Item {uid: src.uid})
  CREATE (e)-[:SOURCE {rule: src.rule, org: src.org}]->(i)
}
CALL (e, row) {
  UNWIND row.entrySources AS sourceId
  MATCH (s:Entry {id: sourceId, botId: $botId})
  CREATE (e)-[:SOURCE]->(s)
}
"""

SET_STATUS: Final = """
MATCH (e:Entry {id: $id, botId: $botId})
SET e.status = $status, e.updatedAt = $now,
    e.invalidatedAt = CASE WHEN $status = 'invalidated' THEN coalesce(e.invalidatedAt, $now) ELSE e.invalidatedAt END
"""

#: New content (already encrypted) and a new place in memory order (D9.14).
SET_CONTENT: Final = """
MATCH (e:Entry {id: $id, botId: $botId})
SET e.content = $content, e.contentLength = $contentLength, e.orderKey = $orderKey, e.updatedAt = $now
"""

SET_TAGS: Final = """
MATCH (e:Entry {id: $id, botId: $botId})
SET e.tags = $tags, e.updatedAt = $now
"""

#: Every entry of the Bot carrying topic ``$from`` — all of them, not the first 300 (L4).
RENAME_TOPIC: Final = """
MATCH (e:Entry {botId: $botId})
WHERE $from IN e.tags
SET e.tags = [t IN e.tags WHERE t <> $from AND t <> $to] + [$to], e.updatedAt = $now
RETURN e.id AS id
"""

FORGET_FOR: Final = """
MATCH (e:Entry {id: $id, botId: $botId})
SET e.tags = [t IN e.tags WHERE t <> 'from:' + $personId],
    e.excluded = [p IN coalesce(e.excluded, []) WHERE p <> $personId] + [$personId],
    e.updatedAt = $now
"""

TAGGED_IDS: Final = """
MATCH (e:Entry {botId: $botId})
WHERE $tag IN e.tags
RETURN collect(e.id) AS ids
"""

#: Entries carrying the purge tag (observations carry their sources' provenance, V12).
PURGE_ENTRIES: Final = """
MATCH (e:Entry {botId: $botId})
WHERE $tag IN e.tags
WITH collect(e) AS doomed, collect(e.id) AS ids
FOREACH (e IN doomed | DETACH DELETE e)
RETURN ids
"""

#: Change-log rows that embed purged entries lose their payload and those ids (D9.20).
PURGE_CHANGES: Final = """
MATCH (c:Change {botId: $botId})
WHERE any(i IN c.entryIds WHERE i IN $ids)
SET c.payload = null, c.entryIds = [i IN c.entryIds WHERE NOT i IN $ids]
RETURN count(c) AS n
"""

#: Saved model calls, confession answers and input rewrites that embed purged entries lose their
#: texts (D9.20); usage and cost stay for the budget, the person's original words stay.
PURGE_EMBEDDINGS: Final = """
CALL (){
  MATCH (c:ModelCall {botId: $botId})
  WHERE any(i IN coalesce(c.entryIds, []) + coalesce(c.producedIds, []) WHERE i IN $ids)
  SET c.request = null, c.result = null, c.purgedAt = timestamp()
  RETURN count(c) AS calls
}
CALL (){
  MATCH (f:Confession {botId: $botId})
  WHERE any(i IN f.usedEntryIds WHERE i IN $ids)
  SET f.answer = null, f.answerPurged = true
  RETURN count(f) AS answers
}
CALL (){
  MATCH (n:Enrichment {botId: $botId})
  WHERE any(i IN n.usedEntryIds WHERE i IN $ids)
  SET n.text = null, n.rewritePurged = true
  RETURN count(n) AS rewrites
}
RETURN calls, answers, rewrites
"""

#: Current members of channels (index seeks by channel id).
CHANNEL_MEMBERS: Final = """
UNWIND $channelIds AS channelId
MATCH (c:Channel {id: channelId})
OPTIONAL MATCH (p:Person)-[:MEMBER]->(c)
RETURN channelId, collect(p.id) AS people
"""

#: People holding a grant on the Bot in the given organizations (``for:bot``, D9.1).
BOT_USERS: Final = """
MATCH (p:Person)-[:GRANT]->(:Bot {id: $botId})
MATCH (p)-[:MEMBER_OF]->(o:Organization)
WHERE o.id IN $orgs
RETURN collect(p.id) AS people
"""

ALL_IDS: Final = "MATCH (e:Entry {botId: $botId}) RETURN collect(e.id) AS ids"

DELETE_CHAT_HISTORY: Final = """
MATCH (i:Item {chatId: $chatId})
SET i.text = null
RETURN count(i) AS n
"""


async def source_entries(tx: AsyncManagedTransaction, *, bot_id: str, ids: list[str]) -> list[dict[str, Any]]:
    return [r["entry"] for r in await rows(tx, SOURCE_ENTRIES, botId=bot_id, ids=ids)]


async def create_entries(
    tx: AsyncManagedTransaction, *, bot_id: str, rows: list[dict[str, Any]], now: int
) -> None:
    """Create entries with their SOURCE edges in one statement; each Item edge keeps its rule (V3)."""
    await tx.run(CREATE_ENTRIES, botId=bot_id, rows=rows, now=now)


async def set_status(tx: AsyncManagedTransaction, *, bot_id: str, id: str, status: str, now: int) -> None:
    await tx.run(SET_STATUS, botId=bot_id, id=id, status=status, now=now)


async def set_content(
    tx: AsyncManagedTransaction,
    *,
    bot_id: str,
    id: str,
    content: bytes,
    content_length: int,
    order_key: int,
    now: int,
) -> None:
    await tx.run(
        SET_CONTENT,
        botId=bot_id,
        id=id,
        content=content,
        contentLength=content_length,
        orderKey=order_key,
        now=now,
    )


async def set_tags(tx: AsyncManagedTransaction, *, bot_id: str, id: str, tags: list[str], now: int) -> None:
    await tx.run(SET_TAGS, botId=bot_id, id=id, tags=tags, now=now)


async def rename_topic(
    tx: AsyncManagedTransaction, *, bot_id: str, old: str, new: str, now: int
) -> list[str]:
    return [r["id"] for r in await rows(tx, RENAME_TOPIC, botId=bot_id, **{"from": old, "to": new}, now=now)]


async def forget_for(tx: AsyncManagedTransaction, *, bot_id: str, id: str, person_id: str, now: int) -> None:
    """Remove the person's ``from:`` and exclude the entry (and so its dependents) for them (V11)."""
    await tx.run(FORGET_FOR, botId=bot_id, id=id, personId=person_id, now=now)


async def purge(tx: AsyncManagedTransaction, *, bot_id: str, tag: str) -> list[str]:
    """Delete the entries carrying ``tag`` and strip what embeds them from the change log (D9.20).

    Entries resting on removed ones (without the tag, e.g. narrowed by a later edit) lose a
    source, so their labels are recomputed: a missing source hides them (V4).
    """
    doomed = await single(tx, TAGGED_IDS, botId=bot_id, tag=tag)
    doomed_ids: list[str] = [] if doomed is None else list(doomed["ids"])
    if not doomed_ids:
        return []
    above = [
        i for i in await access.dependents_of(tx, bot_id=bot_id, ids=doomed_ids) if i not in set(doomed_ids)
    ]
    record = await single(tx, PURGE_ENTRIES, botId=bot_id, tag=tag)
    ids: list[str] = [] if record is None else list(record["ids"])
    await tx.run(PURGE_CHANGES, botId=bot_id, ids=ids)
    if ids:
        await tx.run(PURGE_EMBEDDINGS, botId=bot_id, ids=ids)
    await access.compute_labels(tx, bot_id=bot_id, ids=above)
    return ids


async def _channel_members(tx: AsyncManagedTransaction, channel_ids: list[str]) -> dict[str, set[str]]:
    found = await rows(tx, CHANNEL_MEMBERS, channelIds=channel_ids)
    return {r["channelId"]: set(r["people"]) for r in found}


async def audience_people(
    tx: AsyncManagedTransaction, *, bot_id: str, for_tags: list[str], orgs: list[str]
) -> set[str] | None:
    """The people admitted now by all of ``for_tags`` (conjunctive); None when there are none."""
    if not for_tags:
        return None
    members = await _channel_members(tx, [t[12:] for t in for_tags if t.startswith("for:channel:")])
    result: set[str] | None = None
    for tag in for_tags:
        people: set[str]
        if tag.startswith("for:person:"):
            people = {tag[11:]}
        elif tag.startswith("for:channel:"):
            people = members.get(tag[12:], set())
        else:
            record = await single(tx, BOT_USERS, botId=bot_id, orgs=orgs)
            people = set() if record is None else {str(p) for p in record["people"]}
        result = people if result is None else result & people
    return result


async def rule_people(tx: AsyncManagedTransaction, *, rules: list[str]) -> list[set[str]]:
    """For each rule (``person:<id>`` or ``channel:<id>``), the people it admits now."""
    members = await _channel_members(tx, [r[8:] for r in rules if r.startswith("channel:")])
    return [{r[7:]} if r.startswith("person:") else members.get(r[8:], set()) for r in rules]


async def all_ids(tx: AsyncManagedTransaction, *, bot_id: str) -> list[str]:
    record = await single(tx, ALL_IDS, botId=bot_id)
    return [] if record is None else list(record["ids"])


async def delete_chat_history(tx: AsyncManagedTransaction, *, chat_id: str) -> int:
    """Remove the content of a Chat's Items; ids and the rules saved on SOURCE edges stay (V13)."""
    record = await single(tx, DELETE_CHAT_HISTORY, chatId=chat_id)
    return 0 if record is None else int(record["n"])

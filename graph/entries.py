"""Entry writes: create with SOURCE edges, tag and status changes, Forget, purge.

All of them run inside a change transaction that already holds the exclusive Memory lock
(:func:`graph.memory.bump_version`). Tag and status changes never touch ``content`` (E3).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, LiteralString, TypedDict

from neo4j import AsyncManagedTransaction

from graph import access
from graph.access import IdsRow
from graph.driver import rows, single

#: The properties of a new Entry ``e`` in memory ``m``, from ``row`` and the bound ``tags``,
#: ``orderKey``, ``sourceCount`` and ``legacy`` (shared by ADD_ENTRIES and CREATE_LEGACY); what is
#: derived from its content to find it (design §10) comes in the row, and a vector is stamped with
#: the Memory's next ``vecSeq`` (ADD_ENTRIES then counts it), so each process's index catches up.
_NEW_ENTRY: Final[LiteralString] = (
    "(e:Entry {id: row.id, botId: $botId, layer: row.layer, content: row.content,\n"
    """  contentLength: row.contentLength, tags: tags, status: 'active', confidence: row.confidence,
  createdAt: $now, updatedAt: $now, invalidatedAt: null, orderKey: orderKey, pinned: row.layer = 'pinned',
  sourceCount: sourceCount, author: row.author, excluded: [], legacy: legacy,
  kwBlind: row.kwBlind, vec: row.vec, vecModel: row.vecModel,
  vecSeq: CASE WHEN row.vec IS NULL THEN null ELSE coalesce(m.vecSeq, 0) + 1 END})-[:IN_MEMORY]->(m)
"""
)

#: Entries of a legacy import: the tags they came with, no SOURCE edges, and a declared source
#: count they cannot meet (V9). ``$rows``: id, layer, content, contentLength, tags, orderKey.
CREATE_LEGACY: Final[LiteralString] = (
    """
MATCH (m:Memory {id: $botId})
UNWIND $rows AS row
WITH m, row, row.tags AS tags, row.orderKey AS orderKey, 1 AS sourceCount, true AS legacy
CREATE """
    + _NEW_ENTRY
)

#: Why ADD_ENTRIES refused a change (its first refused new entry), by the code it returns.
REFUSALS: Final = {
    "item_missing": "a source item does not exist in this Bot's chats",
    "review_chat": "review chats are not evidence",
    "history_deleted": "a source item's history was deleted",
    "not_evidence": "facts rest only on people's messages, supported by App results (L3)",
    "app_only": "an App result never becomes memory by itself (L3)",
    "entry_missing": "a source entry does not exist",
    "entry_inactive": "observations rest only on active entries with access proof (V5, V9)",
}

#: The new entries of a change, checked against the latest state of their sources and created
#: with tags derived from them, under the exclusive lock already held (C7). Binds ``problem``:
#: null when every entry was created, else the code (REFUSALS) of the first refused one, and
#: then nothing is written. Needs ``m`` (the Memory) and ``version`` bound (``orderKey`` =
#: version * 10**6 + position).
#:
#: ``$adds``, in the change's order: id, layer, content (ciphertext), contentLength, topics,
#: tags (a pinned entry's own; facts and observations derive theirs), confidence, author,
#: position, ``items`` ([{chat, item}] a fact rests on), ``entries`` (ids an observation rests
#: on) and ``earlier`` (those of ``entries`` that an earlier row of ``$adds`` creates).
#:
#: A fact rests on Items of this Bot's chats that still have their text, none of a review chat
#: (D9.16): people's messages, and App results only beside a message (L3). It gets ``from:``
#: (``app:``), ``for:`` the Item's rule, ``org:``, ``chat:`` and ``channel:`` of each, and its
#: Item edges keep the rule (V3). An observation rests on active entries with access proof
#: (V5, V9) and carries their ``for:`` and provenance tags (V12). The rows are created in
#: order, so an observation sees the entries of earlier rows.
ADD_ENTRIES: Final[LiteralString] = (
    """
CALL (version) {
  UNWIND $adds AS row
  CALL (row) {
    UNWIND row.items AS ref
    OPTIONAL MATCH (i:Item {uid: ref.chat + '/' + ref.item})-[:IN_TURN]->(t:Turn)-[:IN_CHAT]->(ch:Chat)
    WHERE ch.botId = $botId
    RETURN collect(CASE WHEN ch IS NOT NULL THEN {item: i, chat: ref.chat, kind: i.kind, app: i.app,
        hasText: i.text IS NOT NULL, review: coalesce(ch.review, false), org: ch.organizationId,
        channel: ch.channelId, actorId: t.actorId,
        rule: CASE WHEN ch.channelId IS NOT NULL THEN 'channel:' + ch.channelId
                   WHEN t.actorKind = 'person' THEN 'person:' + t.actorId
                   ELSE 'person:' + ch.ownerId END} END) AS items
  }
  CALL (row) {
    UNWIND row.entries AS sourceId
    OPTIONAL MATCH (s:Entry {id: sourceId, botId: $botId})
    RETURN collect(CASE WHEN sourceId IN row.earlier THEN 'ok' WHEN s IS NULL THEN 'entry_missing'
                        WHEN s.status = 'active' AND NOT coalesce(s.legacy, false) THEN 'ok'
                        ELSE 'entry_inactive' END) AS cited
  }
  WITH row, items,
       CASE row.layer
         WHEN 'fact' THEN CASE
           WHEN size(items) < size(row.items) THEN 'item_missing'
           ELSE coalesce(
             head([i IN items WHERE i.review OR NOT i.hasText OR NOT i.kind IN ['PERSON_MESSAGE', 'TOOL_RESULT']
                   | CASE WHEN i.review THEN 'review_chat' WHEN NOT i.hasText THEN 'history_deleted'
                          ELSE 'not_evidence' END]),
             CASE WHEN none(i IN items WHERE i.kind = 'PERSON_MESSAGE') THEN 'app_only' END)
         END
         WHEN 'observation' THEN CASE WHEN 'entry_missing' IN cited THEN 'entry_missing'
                                      WHEN 'entry_inactive' IN cited THEN 'entry_inactive' END
       END AS problem
  RETURN collect(problem)[0] AS problem, collect({row: row, items: items}) AS checked
}
CALL (m, version, problem, checked) {
  WITH m, version, checked WHERE problem IS NULL
  UNWIND checked AS c
  CALL (m, c, version) {
    WITH m, c.row AS row, c.items AS items, version
    CALL (row) {
      UNWIND row.entries AS sourceId
      MATCH (s:Entry {id: sourceId, botId: $botId})
      RETURN collect(s) AS sources
    }
    WITH m, row, items, sources, version * 1000000 + row.position AS orderKey,
         size(items) + size(sources) AS sourceCount, false AS legacy,
         CASE row.layer
           WHEN 'fact' THEN reduce(acc = [], i IN items | acc
             + [CASE WHEN i.kind = 'PERSON_MESSAGE' THEN 'from:' + i.actorId ELSE 'app:' + i.app END,
                'for:' + i.rule, 'org:' + i.org, 'chat:' + i.chat]
             + CASE WHEN i.channel IS NULL THEN [] ELSE ['channel:' + i.channel] END)
           WHEN 'observation' THEN reduce(acc = [], s IN sources | acc
             + [t IN s.tags WHERE t STARTS WITH 'for:' OR t STARTS WITH 'from:' OR t STARTS WITH 'chat:'
                                  OR t STARTS WITH 'channel:' OR t STARTS WITH 'org:'])
           ELSE row.tags
         END + row.topics AS tags
    WITH m, row, items, sources, orderKey, sourceCount, legacy,
         reduce(acc = [], t IN tags | CASE WHEN t IN acc THEN acc ELSE acc + t END) AS tags
    CREATE """
    + _NEW_ENTRY
    + """    WITH e, items, sources
    CALL (e, items) {
      UNWIND items AS source
      WITH e, source, source.item AS i
      CREATE (e)-[:SOURCE {rule: source.rule, org: source.org}]->(i)
    }
    CALL (e, sources) {
      UNWIND sources AS s
      CREATE (e)-[:SOURCE]->(s)
    }
  }
}
CALL (m, problem) {
  WITH m WHERE problem IS NULL AND any(r IN $adds WHERE r.vec IS NOT NULL)
  SET m.vecSeq = coalesce(m.vecSeq, 0) + 1
}
"""
)

#: ADD_ENTRIES on its own, inside a change that holds the lock (version ``$version``).
ADD: Final[LiteralString] = (
    "MATCH (m:Memory {id: $botId})\nWITH m, $version AS version\n" + ADD_ENTRIES + "RETURN problem\n"
)


class ProblemRow(TypedDict):
    """ADD: a code of REFUSALS, or None once every entry was created."""

    problem: str | None


SET_STATUS: Final[LiteralString] = """
MATCH (e:Entry {id: $id, botId: $botId})
SET e.status = $status, e.updatedAt = $now,
    e.invalidatedAt = CASE WHEN $status = 'invalidated' THEN coalesce(e.invalidatedAt, $now) ELSE e.invalidatedAt END
"""

#: New content (already encrypted) and a new place in memory order (D9.14).
SET_CONTENT: Final[LiteralString] = """
MATCH (m:Memory {id: $botId})
SET m.vecSeq = coalesce(m.vecSeq, 0) + CASE WHEN $derived.vec IS NULL THEN 0 ELSE 1 END
WITH m
MATCH (e:Entry {id: $id, botId: $botId})
SET e.content = $content, e.contentLength = $contentLength, e.orderKey = $orderKey, e.updatedAt = $now,
    e.kwBlind = $derived.kwBlind, e.vec = $derived.vec, e.vecModel = $derived.vecModel,
    e.vecSeq = CASE WHEN $derived.vec IS NULL THEN null ELSE m.vecSeq END
"""

SET_TAGS: Final[LiteralString] = """
MATCH (e:Entry {id: $id, botId: $botId})
SET e.tags = $tags, e.updatedAt = $now
"""

#: Every entry of the Bot carrying topic ``$from`` — all of them, not the first 300 (L4).
RENAME_TOPIC: Final[LiteralString] = """
MATCH (e:Entry {botId: $botId})
WHERE $from IN e.tags
SET e.tags = [t IN e.tags WHERE t <> $from AND t <> $to] + [$to], e.updatedAt = $now
RETURN e.id AS id
"""


class IdRow(TypedDict):
    id: str


FORGET_FOR: Final[LiteralString] = """
MATCH (e:Entry {id: $id, botId: $botId})
SET e.tags = [t IN e.tags WHERE t <> 'from:' + $personId],
    e.excluded = [p IN coalesce(e.excluded, []) WHERE p <> $personId] + [$personId],
    e.updatedAt = $now
"""

#: The entries carrying the purge tag, and the label of those someone may see now (``gone``, the
#: removals of the purge, D9.24: after it, no one sees them).
TAGGED_IDS: Final[LiteralString] = """
MATCH (e:Entry {botId: $botId})
WHERE $tag IN e.tags
RETURN collect(e.id) AS ids,
       collect(CASE WHEN e.status <> 'retracted' AND e.lblRequires IS NOT NULL
         THEN {id: e.id, requires: e.lblRequires, excluded: coalesce(e.lblExcluded, []),
               afterRequires: ['#unproved'], afterExcluded: []} END) AS gone
"""


class GoneLabel(TypedDict):
    """One of TAGGED_IDS's ``gone``: a deleted entry with its label before and after (the
    ``$gone`` of RELABEL_RECORDING_REMOVALS)."""

    id: str
    requires: list[str]
    excluded: list[str]
    afterRequires: list[str]
    afterExcluded: list[str]


class TaggedRow(TypedDict):
    ids: list[str]
    gone: list[GoneLabel]


#: Entries carrying the purge tag (observations carry their sources' provenance, V12).
PURGE_ENTRIES: Final[LiteralString] = """
MATCH (e:Entry {botId: $botId})
WHERE $tag IN e.tags
WITH collect(e) AS doomed, collect(e.id) AS ids
FOREACH (e IN doomed | DETACH DELETE e)
RETURN ids
"""

#: Change-log rows that embed purged entries lose their payload and those ids (D9.20), and
#: earlier removals of them (D9.24) go: the purge's own row names them for who saw them.
PURGE_CHANGES: Final[LiteralString] = """
CALL () {
  MATCH (c:Change {botId: $botId})
  WHERE any(i IN c.entryIds WHERE i IN $ids)
  SET c.payload = null, c.entryIds = [i IN c.entryIds WHERE NOT i IN $ids]
  RETURN count(c) AS rows
}
CALL () {
  MATCH (c:Change)-[:REMOVED]->(r:Removal {botId: $botId})
  WHERE r.entryId IN $ids
  SET c.removedIds = [i IN c.removedIds WHERE NOT i IN $ids]
  DETACH DELETE r
  RETURN count(r) AS removals
}
RETURN rows, removals
"""

#: Saved model calls, confession answers and input rewrites that embed purged entries lose their
#: texts (D9.20); usage and cost stay for the budget, the person's original words stay.
PURGE_EMBEDDINGS: Final[LiteralString] = """
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
CHANNEL_MEMBERS: Final[LiteralString] = """
UNWIND $channelIds AS channelId
MATCH (c:Channel {id: channelId})
OPTIONAL MATCH (p:Person)-[:MEMBER]->(c)
RETURN channelId, collect(p.id) AS people
"""


class ChannelMembersRow(TypedDict):
    channelId: str
    people: list[str]


#: People holding a grant on the Bot in the given organizations (``for:bot``, D9.1).
BOT_USERS: Final[LiteralString] = """
MATCH (p:Person)-[:GRANT]->(:Bot {id: $botId})
MATCH (p)-[:MEMBER_OF]->(o:Organization)
WHERE o.id IN $orgs
RETURN collect(p.id) AS people
"""


class PeopleRow(TypedDict):
    people: list[str]


ALL_IDS: Final[LiteralString] = "MATCH (e:Entry {botId: $botId}) RETURN collect(e.id) AS ids"

#: A Chat's history deleted (V13, D9.23): the words of its people wherever they are kept — the
#: Items' text, the input rewrites (rewrite, original words and the digest the rewrite cache finds
#: them by), the confessions with their answers, and the requests and results of the model calls
#: made for the Chat (learning steps found by their execution, calls saved before model calls
#: recorded their Chat included). Ids, rules, usage and cost stay; what was learned stays.
DELETE_CHAT_HISTORY: Final[LiteralString] = """
CALL () {
  MATCH (i:Item {chatId: $chatId})
  SET i.text = null
  RETURN count(i) AS n
}
CALL () {
  MATCH (n:Enrichment {chatId: $chatId})
  SET n.text = null, n.original = null, n.inputDigest = null
  RETURN count(n) AS enrichments
}
CALL () {
  MATCH (f:Confession {chatId: $chatId})
  SET f.text = null, f.answer = null
  RETURN count(f) AS confessions
}
CALL () {
  CALL () {
    MATCH (c:ModelCall {chatId: $chatId})
    RETURN c
    UNION
    MATCH (x:LearningExecution {chatId: $chatId})
    MATCH (c:ModelCall {executionId: x.id})
    RETURN c
  }
  SET c.request = null, c.result = null, c.historyDeletedAt = timestamp()
  RETURN count(c) AS calls
}
RETURN n
"""


class CountRow(TypedDict):
    """How many (DELETE_CHAT_HISTORY: Items)."""

    n: int


async def add(
    tx: AsyncManagedTransaction, *, bot_id: str, version: int, adds: list[dict[str, Any]], now: int
) -> str | None:
    """ADD_ENTRIES: None once all are created, else the code of the first refused (nothing written)."""
    record = await single(tx, ADD, ProblemRow, botId=bot_id, version=version, adds=adds, now=now)
    return None if record is None else record["problem"]


async def create_legacy(
    tx: AsyncManagedTransaction, *, bot_id: str, rows: list[dict[str, Any]], now: int
) -> None:
    await tx.run(CREATE_LEGACY, botId=bot_id, rows=rows, now=now)


async def set_status(tx: AsyncManagedTransaction, *, bot_id: str, id: str, status: str, now: int) -> None:
    await tx.run(SET_STATUS, botId=bot_id, id=id, status=status, now=now)


async def set_content(
    tx: AsyncManagedTransaction,
    *,
    bot_id: str,
    id: str,
    content: str,
    content_length: int,
    order_key: int,
    now: int,
    derived: dict[str, Any],
) -> None:
    """New content with what is derived from it (blind keywords, the sealed vector, design §10)."""
    await tx.run(
        SET_CONTENT,
        derived=derived,
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
    return [
        r["id"]
        for r in await rows(tx, RENAME_TOPIC, IdRow, botId=bot_id, **{"from": old, "to": new}, now=now)
    ]


async def forget_for(tx: AsyncManagedTransaction, *, bot_id: str, id: str, person_id: str, now: int) -> None:
    """Remove the person's ``from:`` and exclude the entry (and so its dependents) for them (V11)."""
    await tx.run(FORGET_FOR, botId=bot_id, id=id, personId=person_id, now=now)


@dataclass(frozen=True, slots=True)
class Purged:
    """What :func:`purge` deleted (``ids``), the entries resting on them whose labels the purge's
    log row recomputes (``above``: a missing source hides them, V4), and the labels of the deleted
    ones someone could see (``gone``, for the log row's removals, D9.24)."""

    ids: list[str]
    above: list[str]
    gone: list[GoneLabel]


async def purge(tx: AsyncManagedTransaction, *, bot_id: str, tag: str) -> Purged:
    """Delete the entries carrying ``tag`` and strip what embeds them from the change log (D9.20).
    The caller writes the purge's log row with ``above`` and ``gone`` (``graph.memory.log_change``)."""
    doomed = await single(tx, TAGGED_IDS, TaggedRow, botId=bot_id, tag=tag)
    if doomed is None or not doomed["ids"]:
        return Purged([], [], [])
    doomed_ids: list[str] = list(doomed["ids"])
    above = [
        i for i in await access.dependents_of(tx, bot_id=bot_id, ids=doomed_ids) if i not in set(doomed_ids)
    ]
    record = await single(tx, PURGE_ENTRIES, IdsRow, botId=bot_id, tag=tag)
    ids: list[str] = [] if record is None else list(record["ids"])
    await tx.run(PURGE_CHANGES, botId=bot_id, ids=ids)
    if ids:
        await tx.run(PURGE_EMBEDDINGS, botId=bot_id, ids=ids)
    return Purged(ids, above, list(doomed["gone"]))


async def _channel_members(tx: AsyncManagedTransaction, channel_ids: list[str]) -> dict[str, set[str]]:
    found = await rows(tx, CHANNEL_MEMBERS, ChannelMembersRow, channelIds=channel_ids)
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
            record = await single(tx, BOT_USERS, PeopleRow, botId=bot_id, orgs=orgs)
            people = set() if record is None else set(record["people"])
        result = people if result is None else result & people
    return result


async def rule_people(tx: AsyncManagedTransaction, *, rules: list[str]) -> list[set[str]]:
    """For each rule (``person:<id>`` or ``channel:<id>``), the people it admits now."""
    members = await _channel_members(tx, [r[8:] for r in rules if r.startswith("channel:")])
    return [{r[7:]} if r.startswith("person:") else members.get(r[8:], set()) for r in rules]


async def all_ids(tx: AsyncManagedTransaction, *, bot_id: str) -> list[str]:
    record = await single(tx, ALL_IDS, IdsRow, botId=bot_id)
    return [] if record is None else list(record["ids"])


async def delete_chat_history(tx: AsyncManagedTransaction, *, chat_id: str) -> int:
    """Remove the content of a Chat's Items; ids and the rules saved on SOURCE edges stay (V13)."""
    record = await single(tx, DELETE_CHAT_HISTORY, CountRow, chatId=chat_id)
    return 0 if record is None else record["n"]

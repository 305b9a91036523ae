"""Entry writes: create with SOURCE edges, tag and status changes, Forget (purge: ``graph.purge``).

All of them run inside a change transaction that already holds the exclusive Memory lock
(:func:`graph.memory.bump_version`). Tag and status changes never touch ``content`` (E3).
"""

from __future__ import annotations

from typing import Any, Final, LiteralString, TypedDict

from neo4j import AsyncManagedTransaction

from graph.access import IdsRow
from graph.driver import Ciphertext, QueryTarget, rows, single
from graph.topics import TOPICS_OF_E, link_topics, retag

#: The properties of a new Entry ``e`` in memory ``m``, from ``row`` and the bound ``tags``,
#: ``orderKey``, ``sourceCount``, ``legacy`` and ``saidAt`` (when its newest source was said, D9.31;
#: null: now) (shared by ADD_ENTRIES and CREATE_LEGACY); what is
#: derived from its content to find it (design §10) comes in the row, and an entry with keywords or
#: a vector is stamped with the Memory's next derived-data sequence ``vecSeq`` (ADD_ENTRIES then
#: counts it), so each process's index catches up.
_NEW_ENTRY: Final[LiteralString] = (
    "(e:Entry {id: row.id, botId: $botId, layer: row.layer, content: row.content,\n"
    """  contentLength: row.contentLength, tags: tags, status: 'active', confidence: row.confidence,
  createdAt: $now, updatedAt: $now, saidAt: coalesce(saidAt, $now), invalidatedAt: null, orderKey: orderKey,
  pinned: row.layer = 'pinned',
  sourceCount: sourceCount, author: row.author, excluded: [], legacy: legacy,
  kwBlind: row.kwBlind, kwScheme: row.kwScheme, vec: row.vec, vecModel: row.vecModel,
  vecSeq: CASE WHEN row.kwBlind IS NULL AND row.vec IS NULL THEN null ELSE coalesce(m.vecSeq, 0) + 1 END})-[:IN_MEMORY]->(m)
"""
)

#: The label an entry carries while its tags hold the topic ``preferences`` (``contextPack``'s,
#: D9.17): ``entry_preference_audience`` finds a Bot's preferences without reading its other
#: entries. Set where an entry is created, kept where its topics change.
_LABEL_PREFERENCE: Final[LiteralString] = (
    "FOREACH (_ IN CASE WHEN 'preferences' IN e.tags THEN [1] ELSE [] END | SET e:Preference)\n"
)
_RELABEL_PREFERENCE: Final[LiteralString] = (
    _LABEL_PREFERENCE
    + "FOREACH (_ IN CASE WHEN 'preferences' IN e.tags THEN [] ELSE [1] END | REMOVE e:Preference)\n"
)

#: A write that leaves an entry without keywords or without a vector (an embedder down or absent,
#: a legacy import) records it on the Memory, for the worker's sweep (``graph.backfill.BOTS_DUE``);
#: so does one whose vector is of another embedder than the one the Memory's last backfill
#: recorded (a process not yet swapped, writing after the worker re-embedded everything: its
#: entries were found by keywords alone for good).
_VEC_DUE: Final[LiteralString] = "r.vec IS NULL OR r.vecModel <> coalesce(m.vecModel, r.vecModel)"
_DUE_ADDS: Final[LiteralString] = (
    "m.kwDue = coalesce(m.kwDue, false) OR any(r IN $adds WHERE r.kwBlind IS NULL),\n"
    "      m.vecDue = coalesce(m.vecDue, false) OR any(r IN $adds WHERE " + _VEC_DUE + ")"
)

#: Entries of a legacy import: the tags they came with, no SOURCE edges, and a declared source
#: count they cannot meet (V9) — but an old private pinned entry made with Remember, which keeps
#: its own rule (source count 0, its author) and comes with its keywords (searchable from this
#: commit). ``$rows``: id, layer, content, contentLength, tags, orderKey, author, sourceCount,
#: legacy, and kwBlind/kwScheme/vec/vecModel. Vectors come later: the Memory is due for the
#: backfill.
CREATE_LEGACY: Final[LiteralString] = (
    """
MATCH (m:Memory {id: $botId})
UNWIND $rows AS row
WITH m, row, row.tags AS tags, row.orderKey AS orderKey, row.sourceCount AS sourceCount,
     row.legacy AS legacy, null AS saidAt
CREATE """
    + _NEW_ENTRY
    + _LABEL_PREFERENCE
    + link_topics(TOPICS_OF_E)
    + """WITH DISTINCT m
SET m.kwDue = true, m.vecDue = true,
    m.vecSeq = CASE WHEN any(r IN $rows WHERE r.kwBlind IS NOT NULL) THEN coalesce(m.vecSeq, 0) + 1
               ELSE m.vecSeq END
"""
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
#: The access rule an Item ``i`` of Turn ``t`` in Chat ``ch`` gives what rests on it (V3): its
#: channel's, else the person whose Turn it is, else the Chat's owner.
_ITEM_RULE: Final[LiteralString] = """CASE WHEN ch.channelId IS NOT NULL THEN 'channel:' + ch.channelId
                   WHEN t.actorKind = 'person' THEN 'person:' + t.actorId
                   ELSE 'person:' + ch.ownerId END"""

#: A fact rests on Items of this Bot's chats that still have their text, none of a review chat
#: (D9.16): people's messages, and App results only beside a message (L3). It gets ``from:``
#: (``app:``), ``for:`` the Item's rule, ``org:``, ``chat:`` and ``channel:`` of each, and its
#: Item edges keep the rule (V3). An observation rests on active entries with access proof
#: (V5, V9) and carries their ``for:`` and provenance tags (V12). Either is dated by its newest
#: source (``saidAt``, D9.31); a pinned entry when it is written. The rows are created in order,
#: so an observation sees the entries of earlier rows.
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
        channel: ch.channelId, actorId: t.actorId, rule: """
    + _ITEM_RULE
    + """} END) AS items
  }
  CALL (row) {
    UNWIND row.entries AS sourceId
    OPTIONAL MATCH (s:Entry {id: sourceId, botId: $botId}) USING INDEX s:Entry(id)
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
      MATCH (s:Entry {id: sourceId, botId: $botId}) USING INDEX s:Entry(id)
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
         reduce(acc = [], t IN tags | CASE WHEN t IN acc THEN acc ELSE acc + t END) AS tags,
         reduce(newest = null, said IN [i IN items | coalesce(i.item.saidAt, i.item.createdAt)]
                                      + [s IN sources | coalesce(s.saidAt, s.createdAt)]
                | CASE WHEN newest IS NULL OR said > newest THEN said ELSE newest END) AS saidAt
    CREATE """
    + _NEW_ENTRY
    + "    "
    + _LABEL_PREFERENCE
    + link_topics(TOPICS_OF_E)
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
  WITH m WHERE problem IS NULL AND any(r IN $adds WHERE r.kwBlind IS NOT NULL OR r.vec IS NOT NULL)
  SET m.vecSeq = coalesce(m.vecSeq, 0) + 1
}
CALL (m, problem) {
  WITH m WHERE problem IS NULL AND any(r IN $adds WHERE r.kwBlind IS NULL OR """
    + _VEC_DUE
    + """)
  SET """
    + _DUE_ADDS
    + """
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

#: New content (already encrypted) and a new place in memory order (D9.14), with what is derived
#: from it, stamped with the next derived-data sequence (and, lacking a vector, the Memory due for
#: the backfill).
SET_CONTENT: Final[LiteralString] = (
    """
MATCH (m:Memory {id: $botId})
WITH m, $derived AS r
SET m.vecSeq = coalesce(m.vecSeq, 0) + 1,
    m.kwDue = coalesce(m.kwDue, false) OR r.kwBlind IS NULL,
    m.vecDue = coalesce(m.vecDue, false) OR """
    + _VEC_DUE
    + """
WITH m
MATCH (e:Entry {id: $id, botId: $botId})
SET e.content = $content, e.contentLength = $contentLength, e.orderKey = $orderKey, e.updatedAt = $now,
    e.kwBlind = $derived.kwBlind, e.kwScheme = $derived.kwScheme, e.vec = $derived.vec, e.vecModel = $derived.vecModel,
    e.vecSeq = m.vecSeq
"""
)

SET_TAGS: Final[LiteralString] = (
    "MATCH (e:Entry {id: $id, botId: $botId})\n"
    + retag("SET e.tags = $tags, e.updatedAt = $now\n")
    + _RELABEL_PREFERENCE
)

#: Every entry of the Bot carrying topic ``$from`` that the learning of organization ``$org`` is
#: shown — valid in it (``validOrg``), all of them, not the first 300 (L4); never an entry of
#: another organization the Bot is linked into, nor one no longer valid (its history keeps its
#: topics) — found from its Topics, one per audience key (``graph.topics``, index
#: ``topic_bot_topic``), not by reading the Bot's entries.
RENAME_TOPIC: Final[LiteralString] = (
    "MATCH (:Topic {botId: $botId, topic: $from})<-[:HAS_TOPIC]-(e:Entry)\n"
    "WHERE e.validOrg = $org\n"
    + retag("SET e.tags = [t IN e.tags WHERE t <> $from AND t <> $to] + [$to], e.updatedAt = $now\n")
    + _RELABEL_PREFERENCE
    + "RETURN e.id AS id\n"
)


class IdRow(TypedDict):
    id: str


FORGET_FOR: Final[LiteralString] = """
MATCH (e:Entry {id: $id, botId: $botId})
SET e.tags = [t IN e.tags WHERE t <> 'from:' + $personId],
    e.excluded = [p IN coalesce(e.excluded, []) WHERE p <> $personId] + [$personId],
    e.updatedAt = $now
"""


ALL_IDS: Final[LiteralString] = "MATCH (e:Entry {botId: $botId}) RETURN collect(e.id) AS ids"


class CountRow(TypedDict):
    """How many (DELETE_CHAT_HISTORY: Items)."""

    n: int


async def count(tx: QueryTarget, query: LiteralString, /, **params: Any) -> int:
    """The ``n`` a counting statement returns (0 without a row)."""
    record = await single(tx, query, CountRow, **params)
    return 0 if record is None else record["n"]


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
    tx: AsyncManagedTransaction, *, bot_id: str, old: str, new: str, org: str, now: int
) -> list[str]:
    params = {"from": old, "to": new}
    return [r["id"] for r in await rows(tx, RENAME_TOPIC, IdRow, botId=bot_id, org=org, **params, now=now)]


#: A person's Forget is counted with the Memory's purges (``graph.purge.COUNT_PURGE``; under the
#: exclusive lock the change holds): a learning step whose learningContext held the entry is
#: stale at its commit (COMMIT_STEP, D9.20) — its answer could restate what was taken back as a
#: new fact of another Chat — and reads its inputs again.
COUNT_TAKE_BACK: Final[LiteralString] = """
MATCH (m:Memory {id: $botId})
SET m.purges = coalesce(m.purges, 0) + 1
"""


async def count_take_back(tx: AsyncManagedTransaction, *, bot_id: str) -> None:
    await tx.run(COUNT_TAKE_BACK, botId=bot_id)


async def forget_for(tx: AsyncManagedTransaction, *, bot_id: str, id: str, person_id: str, now: int) -> None:
    """Remove the person's ``from:`` and exclude the entry (and so its dependents) for them (V11)."""
    await tx.run(FORGET_FOR, botId=bot_id, id=id, personId=person_id, now=now)


async def all_ids(tx: AsyncManagedTransaction, *, bot_id: str) -> list[str]:
    record = await single(tx, ALL_IDS, IdsRow, botId=bot_id)
    return [] if record is None else list(record["ids"])


ENTRY_FOR_EDIT: Final[LiteralString] = """
MATCH (e:Entry {id: $id, botId: $botId})
RETURN e {.id, .layer, .tags, .status, .author, .excluded, .orderKey,
          changedVersion: coalesce(e.changedVersion, 0)} AS entry
"""


class EditedEntry(TypedDict):
    """ENTRY_FOR_EDIT's ``entry``: ``author`` only on pinned entries."""

    id: str
    layer: str
    tags: list[str]
    status: str
    author: str | None
    excluded: list[str]
    orderKey: int
    changedVersion: int


class EditedEntryRow(TypedDict):
    entry: EditedEntry


#: The ``for:`` tags an entry resting on these sources gets (as ADD_ENTRIES gives them): each Item's
#: rule (``$refs``, ``chat``/``item``; one not of this Bot's chats gives none) and each entry's
#: own ``for:`` tags (``$entryIds``).
SOURCE_AUDIENCE: Final[LiteralString] = (
    """
CALL () {
  UNWIND $refs AS ref
  MATCH (i:Item {uid: ref.chat + '/' + ref.item})-[:IN_TURN]->(t:Turn)-[:IN_CHAT]->(ch:Chat)
  WHERE ch.botId = $botId
  RETURN collect('for:' + """
    + _ITEM_RULE
    + """) AS rules
}
CALL () {
  UNWIND $entryIds AS sourceId
  MATCH (s:Entry {id: sourceId, botId: $botId}) USING INDEX s:Entry(id)
  UNWIND [x IN s.tags WHERE x STARTS WITH 'for:'] AS tag
  RETURN collect(tag) AS tags
}
RETURN rules + tags AS tags
"""
)


class TagsRow(TypedDict):
    tags: list[str]


async def source_audience(
    tx: QueryTarget, *, bot_id: str, refs: list[dict[str, str]], entry_ids: list[str]
) -> set[str]:
    """SOURCE_AUDIENCE."""
    record = await single(tx, SOURCE_AUDIENCE, TagsRow, botId=bot_id, refs=refs, entryIds=entry_ids)
    return set() if record is None else set(record["tags"])


#: Legacy entries by id, for their rebuild (V9): whether each is of the Bot, legacy and active, and
#: its layer, tags and content (ciphertext).
LEGACY_ENTRIES: Final[LiteralString] = """
UNWIND $ids AS id
OPTIONAL MATCH (e:Entry {id: id, botId: $botId}) USING INDEX e:Entry(id)
RETURN collect({id: id, found: e IS NOT NULL, legacy: coalesce(e.legacy, false), status: e.status,
                layer: e.layer, tags: e.tags, content: e.content}) AS entries
"""


class LegacyEntryMap(TypedDict):
    """One of LEGACY_ENTRIES' ``entries`` (``found`` False: the rest is null)."""

    id: str
    found: bool
    legacy: bool
    status: str | None
    layer: str | None
    tags: list[str] | None
    content: Ciphertext | None


class LegacyEntriesRow(TypedDict):
    entries: list[LegacyEntryMap]


async def legacy_entries(tx: QueryTarget, *, bot_id: str, ids: list[str]) -> list[LegacyEntryMap]:
    """LEGACY_ENTRIES, in the order of ``ids``."""
    record = await single(tx, LEGACY_ENTRIES, LegacyEntriesRow, botId=bot_id, ids=ids)
    return [] if record is None else record["entries"]


async def entry_for_edit(tx: AsyncManagedTransaction, *, bot_id: str, id: str) -> EditedEntry | None:
    record = await single(tx, ENTRY_FOR_EDIT, EditedEntryRow, botId=bot_id, id=id)
    return None if record is None else record["entry"]

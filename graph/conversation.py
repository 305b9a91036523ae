"""A Chat's rolling summary (DESIGN §6, D9.17): history, not memory — it creates no entries.

The summary text is encrypted (E1) and covers the Chat's Items up to ``coversThroughSeq``; Items
store their text length so "is it due" needs no decryption.
"""

from __future__ import annotations

from typing import Any, Final, LiteralString, NotRequired, TypedDict

from neo4j import AsyncManagedTransaction

from graph.access import CHAT_READERS, ReaderMap
from graph.chats import ChatKeyRow
from graph.driver import Ciphertext, QueryTarget, rows, single
from graph.memorybot import CHAT_ROUTE, RouteRow

SUMMARY: Final[LiteralString] = "MATCH (s:ChatSummary {chatId: $chatId}) RETURN s {.*} AS summary"


class SummaryNode(TypedDict):
    """A ChatSummary's properties (``s {.*}``): ``text`` (ciphertext) and ``updatedAt`` once one
    was saved."""

    chatId: str
    botId: str
    coversThroughSeq: int
    version: int
    chars: int
    text: NotRequired[Ciphertext]
    updatedAt: NotRequired[int]
    #: "map" when a caller set it as seed 004's summary map (its text is that map as JSON, D9.30);
    #: absent for the worker's plain text.
    form: NotRequired[str]


class SummaryRow(TypedDict):
    summary: SummaryNode


#: Characters the summary would hold: the summary itself plus every Item after it that still has
#: its text (a deleted history counts for nothing: it made summaries of nothing, D9.23), kept on
#: the Chat as ``summaryInputChars``, and those of the Items alone as ``unsummarizedChars`` (both
#: added to by each new Item, ``graph.chats``; set again by a summary, a meta and a history
#: deletion). Summed over the Items at every completeTurn, it read the whole history of a Chat
#: whose summaries never came (no model, the budget spent).
UNSUMMARIZED: Final[LiteralString] = """
OPTIONAL MATCH (ch:Chat {id: $chatId})
OPTIONAL MATCH (s:ChatSummary {chatId: $chatId})
RETURN coalesce(s.coversThroughSeq, 0) AS after, coalesce(ch.summaryInputChars, 0) AS total
"""


class UnsummarizedRow(TypedDict):
    after: int
    total: int


#: Up to ``$limit`` Chats whose summary is due (UNSUMMARIZED's total past ``$threshold``, with
#: Items after the summary) that no sweep queued since ``$sweptBefore`` and whose organization has
#: a memory-Bot model, the most behind first (``chat_summary_input``: a seek of the due Chats
#: alone), marked as queued now (``summarySweptAt``): the worker's sweep queues them, so a summary
#: whose queueing was lost (the API killed after its commit, Redis away or restarted) is made
#: without waiting for the Chat's next Turn. A Chat whose summary is not made (a spent budget, a
#: model that fails) is swept once an hour, not every ten minutes. Every condition is checked
#: before the limit: the sweep scanned the thousand Chats with the most characters after their
#: summary and only then added each summary's own, so long Chats not due (no summary yet), of
#: organizations without a model or swept in the last hour filled the scan, ahead of a due Chat
#: whose summary was long and whose backlog was short: the sweep queued no other Chat.
SUMMARIES_DUE: Final[LiteralString] = """
MATCH (ch:Chat)
WHERE ch.summaryInputChars > $threshold AND ch.unsummarizedChars > 0
  AND coalesce(ch.summarySweptAt, 0) < $sweptBefore
  AND EXISTS { MATCH (ch)-[:IN_ORG]->(o:Organization) WHERE o.botMemoryModel IS NOT NULL }
WITH ch ORDER BY ch.summaryInputChars DESC LIMIT $limit
SET ch.summarySweptAt = $now
RETURN collect(ch.id) AS chats
"""


class ChatIdsRow(TypedDict):
    chats: list[str]


#: The Chats of $chatIds that SUMMARIES_DUE marked swept at $at and that were not queued after all
#: (Redis away): due to the next sweep, not to one an hour later.
UNMARK_SWEPT: Final[LiteralString] = """
UNWIND $chatIds AS chatId
MATCH (ch:Chat {id: chatId})
WHERE ch.summarySweptAt = $at
SET ch.summarySweptAt = null
"""


#: Items after the summary, oldest first (ciphertext), at most ``$limit``.
ITEMS_AFTER: Final[LiteralString] = """
MATCH (i:Item)
WHERE i.chatId = $chatId AND i.seq > $after AND i.text IS NOT NULL
WITH i ORDER BY i.chatId, i.seq LIMIT $limit
RETURN collect(i {.uid, .id, .seq, .kind, .text, .app, .speakerId, textLength: coalesce(i.textLength, 0)}) AS items
"""


class ItemMap(TypedDict):
    """An Item as ITEMS_AFTER reads it (only Items that still have their text, V13), ``app``
    None but on App results, ``speakerId`` None where no person spoke."""

    uid: str
    id: str
    seq: int
    kind: str
    text: Ciphertext | None
    app: str | None
    speakerId: str | None
    #: Characters of its text as said (``learning.protocol.within_chars``).
    textLength: int


class ItemsRow(TypedDict):
    items: list[ItemMap]


#: A new summary as a compare-and-set on what the old one covered (two compressions never mix),
#: only while the Chat's history is the one it was made from (``$historyEpoch``, D9.23: deleted
#: meanwhile, nothing is saved — the summary would bring the deleted words back).
SAVE_SUMMARY: Final[LiteralString] = """
MATCH (heldC:Chat {id: $chatId})
CALL apoc.lock.nodes([heldC])
MATCH (ch:Chat) WHERE elementId(ch) = elementId(heldC)
WITH ch WHERE coalesce(ch.historyEpoch, 0) = $historyEpoch
MERGE (s:ChatSummary {chatId: $chatId})
  ON CREATE SET s.coversThroughSeq = 0, s.version = 0, s.chars = 0, s.botId = $botId
WITH ch, s AS held
CALL apoc.lock.nodes([held])
WITH ch, held
MATCH (s:ChatSummary) WHERE elementId(s) = elementId(held)
WITH ch, s, s.coversThroughSeq = $after AS fresh
FOREACH (_ IN CASE WHEN fresh THEN [1] ELSE [] END |
  SET ch.metaVersion = coalesce(ch.metaVersion, s.version) + 1
  SET s.text = $text, s.form = null, s.coversThroughSeq = $through, s.chars = $chars,
      s.version = s.version + 1, s.updatedAt = $now)
WITH ch, s, fresh
CALL (ch, fresh) {
  OPTIONAL MATCH (i:Item) WHERE fresh AND i.chatId = ch.id AND i.seq > $through AND i.text IS NOT NULL
  RETURN coalesce(sum(i.textLength), 0) AS later
}
FOREACH (_ IN CASE WHEN fresh THEN [1] ELSE [] END |
  SET ch.unsummarizedChars = later, ch.summaryInputChars = $chars + later)
RETURN fresh, s.version AS version
"""


class SavedSummaryRow(TypedDict):
    fresh: bool
    version: int


#: The Chat's summary deleted with its history (D9.23); the meta's version moves on, never back,
#: so an editor who read the meta before cannot set it over what follows (D9.30), and its next
#: summary takes in the Items that still have their text alone.
DELETE_SUMMARY: Final[LiteralString] = """
MATCH (ch:Chat {id: $chatId})
OPTIONAL MATCH (s:ChatSummary {chatId: $chatId})
SET ch.metaVersion = coalesce(ch.metaVersion, s.version, 0) + 1,
    ch.summaryInputChars = coalesce(ch.unsummarizedChars, 0)
DETACH DELETE s
"""

#: Of the Items ``i`` (newest first), those until past $chars characters of text (null: all), as
#: ``recent``: only theirs is read (the end of a subquery of META and ROUTE_AND_META).
_NEWEST_WITHIN: Final[LiteralString] = """
  WITH collect(i) AS items
  WITH items, reduce(cut = [0, 0], i IN items |
    CASE WHEN $chars IS NOT NULL AND cut[1] > $chars THEN cut
         ELSE [cut[0] + 1, cut[1] + coalesce(i.textLength, 0)] END)[0] AS n
  RETURN [i IN items[0..n] | i {.uid, .id, .seq, .kind, .text, .textLength}] AS recent
"""

#: For each Chat of $chatIds: the Chat with its Bot's wrapped key, its summary (None before the
#: first) and its latest Items of the kinds $kinds after what the summary covers, newest first, at
#: most $limit and only until past $chars characters of text (the meta shows the newest within
#: them), leaving out those whose text was deleted (V13): what its meta shows (D9.30).
META: Final[LiteralString] = (
    """
UNWIND $chatIds AS chatId
MATCH (ch:Chat {id: chatId})-[:WITH_BOT]->(b:Bot)
OPTIONAL MATCH (s:ChatSummary {chatId: chatId})
CALL (ch, s) {
  MATCH (i:Item)
  WHERE i.chatId = ch.id AND i.seq > coalesce(s.coversThroughSeq, 0) AND i.kind IN $kinds
    AND i.text IS NOT NULL
  WITH i ORDER BY i.chatId DESC, i.seq DESC LIMIT $limit"""
    + _NEWEST_WITHIN
    + """}
RETURN ch {.*} AS chat, b.keyMaster AS keyMaster, b.keyWrapped AS keyWrapped, s {.*} AS summary, recent
"""
)


class RecentItem(TypedDict):
    uid: str
    id: str
    seq: int
    kind: str
    text: Ciphertext
    textLength: int


class MetaRow(ChatKeyRow):
    summary: SummaryNode | None
    recent: list[RecentItem]


#: The Chats $personId may read (D9.6: its private chats, and the group chats of its channels)
#: that have meta — a summary, or an Item of the kinds $kinds with its text — newest first: how
#: many, and the ids of one page.
METAS_OF: Final[LiteralString] = """
MATCH (p:Person {id: $personId})
CALL (p) {
  MATCH (ch:Chat {ownerId: p.id}) WHERE NOT EXISTS { (ch)-[:IN_CHANNEL]->(:Channel) } RETURN ch
  UNION
  MATCH (p)-[:MEMBER]->(:Channel)<-[:IN_CHANNEL]-(ch:Chat) RETURN ch
}
WITH ch
WHERE EXISTS { MATCH (s:ChatSummary {chatId: ch.id}) WHERE s.text IS NOT NULL }
   OR EXISTS { MATCH (i:Item) WHERE i.chatId = ch.id AND i.seq > 0 AND i.kind IN $kinds AND i.text IS NOT NULL }
WITH ch ORDER BY ch.createdAt DESC, ch.id
WITH collect(ch.id) AS ids
RETURN size(ids) AS total, ids[$skip..$skip + $limit] AS page
"""


class MetasRow(TypedDict):
    total: int
    page: list[str]


#: Of the Chats ``$chatIds``, those $personId may read (as METAS_OF reads them): a page of metas
#: is checked again once read.
READABLE_OF: Final[LiteralString] = """
MATCH (p:Person {id: $personId})
UNWIND $chatIds AS chatId
MATCH (ch:Chat {id: chatId})
WHERE (ch.ownerId = p.id AND NOT EXISTS { (ch)-[:IN_CHANNEL]->(:Channel) })
   OR EXISTS { (p)-[:MEMBER]->(:Channel)<-[:IN_CHANNEL]-(ch) }
RETURN collect(ch.id) AS chats
"""


#: A caller's summary map (D9.30), saved as the Chat's summary covering every Item so far —
#: ``$create``: only when the Chat has no meta yet (``held``), else only when it has; and, with
#: ``$expected``, only when the meta's version is still that one (``current``: a replacement by
#: another client, the worker's compression or a history deletion moves it; kept on the Chat, it
#: never goes back). The Chat is locked before the checks and read again after the lock (C1), so
#: a second creation waits for one in flight and then finds it, whatever plan Neo4j picks for the
#: lookup; a compression in flight finds its compare-and-set stale. ``version``: the version saved
#: (null when nothing was); no row for a Chat that does not exist.
SET_META: Final[LiteralString] = """
MATCH (heldC:Chat {id: $chatId})
CALL apoc.lock.nodes([heldC])
MATCH (ch:Chat) WHERE elementId(ch) = elementId(heldC)
OPTIONAL MATCH (old:ChatSummary {chatId: $chatId})
WITH ch, coalesce(ch.metaVersion, old.version, 0) AS current,
     (old IS NOT NULL AND old.text IS NOT NULL)
     OR EXISTS { MATCH (i:Item) WHERE i.chatId = ch.id AND i.seq > 0 AND i.kind IN $kinds AND i.text IS NOT NULL }
     AS held
WITH ch, current, held, held <> $create AND ($expected IS NULL OR current = $expected) AS saving
CALL (ch, current, saving) {
  WITH ch WHERE saving
  MERGE (s:ChatSummary {chatId: $chatId})
    ON CREATE SET s.coversThroughSeq = 0, s.version = 0, s.chars = 0, s.botId = ch.botId
  SET s.text = $text, s.form = 'map', s.coversThroughSeq = ch.nextItemSeq, s.chars = $chars,
      s.version = s.version + 1, s.updatedAt = $now, ch.unsummarizedChars = 0,
      ch.summaryInputChars = $chars, ch.metaVersion = current + 1
}
RETURN held, current, CASE WHEN saving THEN current + 1 END AS version
"""


class SetMetaRow(TypedDict):
    held: bool
    current: int
    version: int | None


#: The Chat's route (CHAT_ROUTE) and the readers of an answer in it (CHAT_READERS; null when it
#: has none) in one statement: what a rewrite, a confide answer and a server caller's read need
#: before they search, where two statements in two transactions read them.
ROUTE_READERS: Final[LiteralString] = (
    "CALL () {"
    + CHAT_ROUTE
    + "}\nOPTIONAL CALL () {"
    + CHAT_READERS
    + """}
RETURN chat, botMemory, model, settings, keyMaster, keyWrapped, readers, org
"""
)


class RouteReadersRow(RouteRow):
    """ROUTE_READERS: CHAT_ROUTE's row and the readers (with their organization)."""

    readers: list[ReaderMap] | None
    org: str | None


async def route_readers(tx: QueryTarget, *, chat_id: str) -> RouteReadersRow | None:
    """ROUTE_READERS; None when the Chat (or its Bot's memory) does not exist."""
    return await single(tx, ROUTE_READERS, RouteReadersRow, chatId=chat_id)


#: The Chat's route (CHAT_ROUTE), its summary (SUMMARY, null before the first) and its meta's
#: latest Items after the summary (as META's ``recent``: the kinds $kinds, at most $limit, newest
#: first), in one statement: what the built-in runner shows the Bot of the Chat's history.
_ROUTE_AND_META: Final[LiteralString] = (
    "CALL () {"
    + CHAT_ROUTE
    + "}\nOPTIONAL CALL () {"
    + SUMMARY
    + """}
CALL (summary) {
  MATCH (i:Item)
  WHERE i.chatId = $chatId AND i.seq > coalesce(summary.coversThroughSeq, 0) AND i.kind IN $kinds
    AND i.text IS NOT NULL
  WITH i ORDER BY i.chatId DESC, i.seq DESC LIMIT $limit"""
    + _NEWEST_WITHIN
    + "}\n"
)
ROUTE_AND_META: Final[LiteralString] = (
    _ROUTE_AND_META + "RETURN chat, botMemory, model, settings, keyMaster, keyWrapped, summary, recent\n"
)

#: contextPack's head in one statement: ROUTE_AND_META and the readers of an answer in the Chat
#: (CHAT_READERS; null when it has none), where four statements in three transactions read them.
PACK_HEAD: Final[LiteralString] = (
    _ROUTE_AND_META
    + "OPTIONAL CALL () {"
    + CHAT_READERS
    + """}
RETURN chat, botMemory, model, settings, keyMaster, keyWrapped, summary, recent, readers, org
"""
)


class RouteAndMetaRow(RouteRow):
    """ROUTE_AND_META: CHAT_ROUTE's row, the summary and the meta's latest Items."""

    summary: SummaryNode | None
    recent: list[RecentItem]


class PackHeadRow(RouteAndMetaRow):
    """PACK_HEAD: ROUTE_AND_META's row and the readers (with their organization)."""

    readers: list[ReaderMap] | None
    org: str | None


async def route_and_meta(
    tx: QueryTarget, *, chat_id: str, kinds: list[str], limit: int, chars: int
) -> RouteAndMetaRow | None:
    """ROUTE_AND_META: the newest ``limit`` messages after the summary, read until past ``chars``
    characters of text; None when the Chat (or its Bot's memory) does not exist."""
    return await single(
        tx, ROUTE_AND_META, RouteAndMetaRow, chatId=chat_id, kinds=kinds, limit=limit, chars=chars
    )


async def pack_head(
    tx: QueryTarget, *, chat_id: str, kinds: list[str], limit: int, chars: int
) -> PackHeadRow | None:
    """PACK_HEAD (the newest ``limit`` messages after the summary, read until past ``chars``
    characters of text); None when the Chat (or its Bot's memory) does not exist."""
    return await single(tx, PACK_HEAD, PackHeadRow, chatId=chat_id, kinds=kinds, limit=limit, chars=chars)


async def summary(tx: AsyncManagedTransaction, *, chat_id: str) -> SummaryNode | None:
    record = await single(tx, SUMMARY, SummaryRow, chatId=chat_id)
    return None if record is None else record["summary"]


async def unsummarized(tx: AsyncManagedTransaction, *, chat_id: str) -> tuple[int, int]:
    """(the last Item the summary covers, characters of summary + later Items)."""
    record = await single(tx, UNSUMMARIZED, UnsummarizedRow, chatId=chat_id)
    assert record is not None
    return int(record["after"]), int(record["total"])


async def items_after(tx: AsyncManagedTransaction, *, chat_id: str, after: int, limit: int) -> list[ItemMap]:
    record = await single(tx, ITEMS_AFTER, ItemsRow, chatId=chat_id, after=after, limit=limit)
    return [] if record is None else record["items"]


async def save_summary(tx: AsyncManagedTransaction, **fields: Any) -> bool:
    record = await single(tx, SAVE_SUMMARY, SavedSummaryRow, **fields)
    return bool(record and record["fresh"])


async def delete_summary(tx: AsyncManagedTransaction, *, chat_id: str) -> None:
    await tx.run(DELETE_SUMMARY, chatId=chat_id)


async def meta(
    tx: AsyncManagedTransaction, *, chat_ids: list[str], kinds: list[str], limit: int, chars: int
) -> list[MetaRow]:
    return await rows(tx, META, MetaRow, chatIds=chat_ids, kinds=kinds, limit=limit, chars=chars)


async def metas_of(
    tx: AsyncManagedTransaction, *, person_id: str, kinds: list[str], skip: int, limit: int
) -> tuple[int, list[str]]:
    """(how many Chats ``person_id`` may read have meta, the ids of one page of them)."""
    record = await single(tx, METAS_OF, MetasRow, personId=person_id, kinds=kinds, skip=skip, limit=limit)
    return (0, []) if record is None else (record["total"], record["page"])


async def readable_of(tx: AsyncManagedTransaction, *, person_id: str, chat_ids: list[str]) -> set[str]:
    """The Chats of ``chat_ids`` that ``person_id`` may read (READABLE_OF)."""
    record = await single(tx, READABLE_OF, ChatIdsRow, personId=person_id, chatIds=chat_ids)
    return set() if record is None else set(record["chats"])


async def set_meta(tx: AsyncManagedTransaction, **fields: Any) -> SetMetaRow | None:
    """Whether the Chat held meta, its summary's version before, and the version saved (None:
    not saved); None for a Chat that does not exist."""
    return await single(tx, SET_META, SetMetaRow, **fields)


async def summaries_due(tx: AsyncManagedTransaction, **params: Any) -> list[str]:
    """The Chats whose summary is due, marked as swept now (SUMMARIES_DUE)."""
    record = await single(tx, SUMMARIES_DUE, ChatIdsRow, **params)
    return [] if record is None else record["chats"]


async def unmark_swept(tx: AsyncManagedTransaction, *, chat_ids: list[str], at: int) -> None:
    await tx.run(UNMARK_SWEPT, chatIds=chat_ids, at=at)

"""A Chat's rolling summary (DESIGN §6, D9.17): history, not memory — it creates no entries.

The summary text is encrypted (E1) and covers the Chat's Items up to ``coversThroughSeq``; Items
store their text length so "is it due" needs no decryption.
"""

from __future__ import annotations

from typing import Any, Final, LiteralString, NotRequired, TypedDict

from neo4j import AsyncManagedTransaction

from graph.driver import Ciphertext, single

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


class SummaryRow(TypedDict):
    summary: SummaryNode


#: Characters the summary would hold: the summary itself plus every Item after it.
UNSUMMARIZED: Final[LiteralString] = """
OPTIONAL MATCH (s:ChatSummary {chatId: $chatId})
WITH coalesce(s.coversThroughSeq, 0) AS after, coalesce(s.chars, 0) AS chars
OPTIONAL MATCH (i:Item) WHERE i.chatId = $chatId AND i.seq > after
WITH after, chars, coalesce(sum(i.textLength), 0) AS later
RETURN after, chars + later AS total
"""


class UnsummarizedRow(TypedDict):
    after: int
    total: int


#: Items after the summary, oldest first (ciphertext), at most ``$limit``.
ITEMS_AFTER: Final[LiteralString] = """
MATCH (i:Item)
WHERE i.chatId = $chatId AND i.seq > $after
WITH i ORDER BY i.seq LIMIT $limit
RETURN collect(i {.uid, .id, .seq, .kind, .text, .app, .speakerId}) AS items
"""


class ItemMap(TypedDict):
    """An Item as ITEMS_AFTER reads it: ``text`` None once the history was deleted (V13), ``app``
    None but on App results, ``speakerId`` None where no person spoke."""

    uid: str
    id: str
    seq: int
    kind: str
    text: Ciphertext | None
    app: str | None
    speakerId: str | None


class ItemsRow(TypedDict):
    items: list[ItemMap]


#: A new summary as a compare-and-set on what the old one covered (two compressions never mix).
SAVE_SUMMARY: Final[LiteralString] = """
MERGE (s:ChatSummary {chatId: $chatId})
  ON CREATE SET s.coversThroughSeq = 0, s.version = 0, s.chars = 0, s.botId = $botId
WITH s AS held
CALL apoc.lock.nodes([held])
WITH held
MATCH (s:ChatSummary) WHERE elementId(s) = elementId(held)
WITH s, s.coversThroughSeq = $after AS fresh
FOREACH (_ IN CASE WHEN fresh THEN [1] ELSE [] END |
  SET s.text = $text, s.coversThroughSeq = $through, s.chars = $chars, s.version = s.version + 1,
      s.updatedAt = $now)
RETURN fresh, s.version AS version
"""


class SavedSummaryRow(TypedDict):
    fresh: bool
    version: int


DELETE_SUMMARY: Final[LiteralString] = "MATCH (s:ChatSummary {chatId: $chatId}) DETACH DELETE s"


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

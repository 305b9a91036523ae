"""The backfill of what retrieval derives from entries (design §10): blind keywords and vectors
for entries written before retrieval existed, or while the embedder was down, or by another
embedder. Pages through a Bot's entries in id order (``entry_bot_id``), so a killed run resumes
by starting again: what was written stays written.
"""

from __future__ import annotations

from typing import Any, Final, LiteralString, TypedDict

from neo4j import AsyncManagedTransaction

from graph.driver import Ciphertext, QueryTarget, rows, single

#: Entries after ``$after`` in id order that lack keywords (``$model`` null) or a vector of
#: ``$model``: id, ciphertext and what identifies the content read (length and order key).
#: Retracted entries are never shown again (D9.4), so they get nothing. Up to ``$limit``.
MISSING: Final[LiteralString] = """
MATCH (e:Entry)
WHERE e.botId = $botId AND e.id > $after AND e.status <> 'retracted'
  AND (e.kwBlind IS NULL OR ($model IS NOT NULL AND coalesce(e.vecModel, '') <> $model))
RETURN e.id AS id, e.content AS content, e.contentLength AS contentLength, e.orderKey AS orderKey
ORDER BY e.id
LIMIT $limit
"""


class MissingRow(TypedDict):
    id: str
    content: Ciphertext
    contentLength: int
    orderKey: int


#: How many of a Bot's entries (not retracted) there are, and how many have a vector of ``$model``.
PROGRESS: Final[LiteralString] = """
MATCH (e:Entry {botId: $botId})
WHERE e.status <> 'retracted'
RETURN count(e) AS total, count(CASE WHEN e.vecModel = $model THEN 1 END) AS embedded,
       count(CASE WHEN e.kwBlind IS NOT NULL THEN 1 END) AS keyworded
"""


class ProgressRow(TypedDict):
    total: int
    embedded: int
    keyworded: int


#: Bots with entries that lack keywords or a vector of ``$model`` (the worker's sweep).
BOTS_MISSING: Final[LiteralString] = """
MATCH (e:Entry)
WHERE e.status <> 'retracted' AND (e.kwBlind IS NULL OR coalesce(e.vecModel, '') <> $model)
RETURN DISTINCT e.botId AS botId
"""


class BotIdRow(TypedDict):
    botId: str


#: One batch under the exclusive lock (C1): keywords and sealed vectors of the entries whose
#: content is still the one read (an entry revised since keeps its own), each written entry
#: stamped with the Memory's next derived-data sequence ``vecSeq`` so every process's index
#: catches up. Nothing a reader sees changes, so the memory version and the log stay as they are
#: (C2 counts changes of entries).
WRITE: Final[LiteralString] = """
MATCH (m:Memory {id: $botId})
CALL apoc.lock.nodes([m])
WITH m
SET m.vecSeq = coalesce(m.vecSeq, 0) + 1
WITH m, m.vecSeq AS seq
CALL (seq) {
  UNWIND $rows AS row
  MATCH (e:Entry {id: row.id, botId: $botId})
  WHERE e.contentLength = row.contentLength AND e.orderKey = row.orderKey
  SET e.kwBlind = coalesce(row.kwBlind, e.kwBlind), e.vecSeq = seq
  FOREACH (_ IN CASE WHEN row.vec IS NULL THEN [] ELSE [1] END |
    SET e.vec = row.vec, e.vecModel = row.vecModel)
  RETURN count(e) AS written
}
RETURN seq, written
"""


class WrittenRow(TypedDict):
    seq: int
    written: int


async def missing(
    tx: QueryTarget, *, bot_id: str, model: str | None, after: str, limit: int
) -> list[MissingRow]:
    """MISSING: up to ``limit`` entries after ``after`` lacking keywords (or a vector of ``model``)."""
    return await rows(tx, MISSING, MissingRow, botId=bot_id, model=model, after=after, limit=limit)


async def progress(tx: QueryTarget, *, bot_id: str, model: str) -> ProgressRow:
    """PROGRESS: ``total``, ``embedded`` and ``keyworded`` entries of the Bot."""
    found = await single(tx, PROGRESS, ProgressRow, botId=bot_id, model=model)
    assert found is not None
    return found


async def bots_missing(tx: QueryTarget, *, model: str) -> list[str]:
    """BOTS_MISSING: the Bots whose entries need the backfill."""
    return [r["botId"] for r in await rows(tx, BOTS_MISSING, BotIdRow, model=model)]


async def write(tx: AsyncManagedTransaction, *, bot_id: str, batch: list[dict[str, Any]]) -> int | None:
    """WRITE: how many entries were written, or None when the Bot is gone."""
    found = await single(tx, WRITE, WrittenRow, botId=bot_id, rows=batch)
    return None if found is None else found["written"]

"""The backfill of what retrieval derives from entries (design §10): blind keywords and vectors
for entries written before retrieval existed, or while the embedder was down, or by another
embedder, and keywords again for entries keyworded by an older tokenisation (``kwScheme`` below
``$scheme``: ``services.keywords.SCHEME``). Pages through a Bot's entries in id order
(``entry_bot_id``), so a killed run resumes by starting again: what was written stays written.
"""

from __future__ import annotations

from typing import Any, Final, LiteralString, TypedDict

from neo4j import AsyncManagedTransaction

from graph.driver import Ciphertext, QueryTarget, rows, single

#: An entry's keywords are missing or were made by an older tokenisation than ``$scheme``.
_KEYWORDS_DUE: Final[LiteralString] = "(e.kwBlind IS NULL OR coalesce(e.kwScheme, 1) < $scheme)"

#: Entries after ``$after`` in id order whose keywords are due (``$model`` null) or that lack a
#: vector of ``$model``: id, ciphertext, what identifies the content read (length and order key)
#: and the keywords held. Retracted entries are never shown again (D9.4), so they get nothing.
#: Up to ``$limit``.
MISSING: Final[LiteralString] = (
    """
MATCH (e:Entry)
WHERE e.botId = $botId AND e.id > $after AND e.status <> 'retracted'
  AND ("""
    + _KEYWORDS_DUE
    + """ OR ($model IS NOT NULL AND coalesce(e.vecModel, '') <> $model))
RETURN e.id AS id, e.content AS content, e.contentLength AS contentLength, e.orderKey AS orderKey,
       e.kwBlind AS kwBlind
ORDER BY e.id
LIMIT $limit
"""
)


class MissingRow(TypedDict):
    id: str
    content: Ciphertext
    contentLength: int
    orderKey: int
    kwBlind: str | None


#: How many of a Bot's entries (not retracted) there are, how many have a vector of ``$model``
#: and how many keywords of the current tokenisation.
PROGRESS: Final[LiteralString] = (
    """
MATCH (e:Entry {botId: $botId})
WHERE e.status <> 'retracted'
RETURN count(e) AS total, count(CASE WHEN e.vecModel = $model THEN 1 END) AS embedded,
       count(CASE WHEN NOT """
    + _KEYWORDS_DUE
    + """ THEN 1 END) AS keyworded
"""
)


class ProgressRow(TypedDict):
    total: int
    embedded: int
    keyworded: int


#: Bots with entries whose keywords are due or that lack a vector of ``$model`` (the worker's
#: sweep).
BOTS_MISSING: Final[LiteralString] = (
    """
MATCH (e:Entry)
WHERE e.status <> 'retracted' AND ("""
    + _KEYWORDS_DUE
    + """ OR coalesce(e.vecModel, '') <> $model)
RETURN DISTINCT e.botId AS botId
"""
)


class BotIdRow(TypedDict):
    botId: str


#: One batch under the exclusive lock (C1): keywords (with the tokenisation that made them) and
#: sealed vectors of the entries whose content is still the one read (an entry revised since keeps
#: its own), each entry whose vector or keywords changed (``kwChanged``: other tokens, or other
#: counts of them; not merely their order) stamped with the Memory's next derived-data sequence
#: ``vecSeq`` so every process's index catches up. Keywords made again by a newer tokenisation are
#: mostly the same tokens (text of ASCII alone tokenises as before): such an entry is written (in
#: the new scheme's sorted order) but not stamped, so the indexes do not read it again. Nothing a
#: reader sees changes, so the memory version and the log stay as they are (C2 counts changes of
#: entries).
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
  SET e.kwBlind = coalesce(row.kwBlind, e.kwBlind), e.kwScheme = coalesce(row.kwScheme, e.kwScheme),
      e.vecSeq = CASE WHEN row.vec IS NOT NULL OR row.kwChanged THEN seq ELSE e.vecSeq END
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
    tx: QueryTarget, *, bot_id: str, model: str | None, scheme: int, after: str, limit: int
) -> list[MissingRow]:
    """MISSING: up to ``limit`` entries after ``after`` whose keywords are older than ``scheme``
    or missing (or that lack a vector of ``model``)."""
    return await rows(
        tx, MISSING, MissingRow, botId=bot_id, model=model, scheme=scheme, after=after, limit=limit
    )


async def progress(tx: QueryTarget, *, bot_id: str, model: str, scheme: int) -> ProgressRow:
    """PROGRESS: ``total``, ``embedded`` and ``keyworded`` (by ``scheme``) entries of the Bot."""
    found = await single(tx, PROGRESS, ProgressRow, botId=bot_id, model=model, scheme=scheme)
    assert found is not None
    return found


async def bots_missing(tx: QueryTarget, *, model: str, scheme: int) -> list[str]:
    """BOTS_MISSING: the Bots whose entries need the backfill."""
    return [r["botId"] for r in await rows(tx, BOTS_MISSING, BotIdRow, model=model, scheme=scheme)]


async def write(tx: AsyncManagedTransaction, *, bot_id: str, batch: list[dict[str, Any]]) -> int | None:
    """WRITE: how many entries were written, or None when the Bot is gone."""
    found = await single(tx, WRITE, WrittenRow, botId=bot_id, rows=batch)
    return None if found is None else found["written"]

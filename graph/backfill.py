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
from graph.entries import CountRow

#: An entry's keywords are missing or were made by an older tokenisation than ``$scheme``.
_KEYWORDS_DUE: Final[LiteralString] = "(e.kwBlind IS NULL OR coalesce(e.kwScheme, 1) < $scheme)"

#: Entries after ``$after`` in id order whose keywords are due (``$model`` null) or that lack a
#: vector of ``$model``: id, ciphertext, what identifies the content read (length and order key)
#: and the keywords held. Retracted entries are never shown again (D9.4), so they get nothing.
#: Up to ``$limit``, in id order: a range seek on ``entry_bot_id``, pinned (on a store whose
#: statistics had changed — the bench's pools built and deleted — the planner read every entry of
#: the Bot through ``entry_bot`` and sorted them, for each page of the walk).
MISSING: Final[LiteralString] = (
    """
MATCH (e:Entry)
USING INDEX e:Entry(botId, id)
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


#: What a Memory records of its entries' derived data, so that the worker's sweep reads one node
#: per Bot and never the entries: ``kwScheme`` and ``vecModel``, the tokenisation and the embedder
#: every entry had keywords and a vector of when a backfill last went through them all with no
#: change in between (MARK_DONE); ``kwDue`` and ``vecDue``, set by every write since that left an
#: entry without keywords or without a vector (``graph.entries``: the embedder down or absent, a
#: legacy import). A Memory never marked is due.
#:
#: The Bots that need the backfill: those due for keywords, and with an embedder (``$model``, null
#: for none) those due for vectors. One record (a record per Bot: 4,346 Bots read in ~140 ms; one
#: list, ~5 ms).
BOTS_DUE: Final[LiteralString] = """
MATCH (m:Memory)
WHERE coalesce(m.kwDue, true) OR coalesce(m.kwScheme, 0) < $scheme
   OR ($model IS NOT NULL AND (coalesce(m.vecDue, true) OR coalesce(m.vecModel, '') <> $model))
RETURN collect(m.id) AS botIds
"""

#: The backfill of ``$model`` (null: keywords alone) records it as the Memory's ``vecWriter``,
#: counting each change of it in ``vecWriterChanges`` (START, WRITE; MARK_DONE compares them).
_CLAIM_WRITER: Final[LiteralString] = """
WITH m, $model IS NOT NULL AND coalesce(m.vecWriter, $model) <> $model AS switched
SET m.vecWriterChanges = coalesce(m.vecWriterChanges, 0) + CASE WHEN switched THEN 1 ELSE 0 END,
    m.vecWriter = coalesce($model, m.vecWriter)
"""

#: Where a backfill begins, under the exclusive lock: the memory version, and how many times the
#: embedder of the backfills' vectors changed (``vecWriter``, ``vecWriterChanges``) once this
#: backfill's (``$model``; null for keywords alone) claims it — so its own first write is no
#: change, and only another embedder's write since moves the count (MARK_DONE, WRITE).
START: Final[LiteralString] = (
    """
MATCH (held:Memory {id: $botId})
CALL apoc.lock.nodes([held])
WITH held
MATCH (m:Memory) WHERE elementId(m) = elementId(held)"""
    + _CLAIM_WRITER
    + "RETURN m.version AS version, m.vecWriterChanges AS writerChanges\n"
)


class StartRow(TypedDict):
    version: int
    writerChanges: int


#: A backfill that began at memory version ``$version`` went through every entry: unless a change
#: came since (the version moved on), every entry now has keywords of ``$scheme`` (and a vector of
#: ``$model``, when not null), and the Memory records it, under the exclusive lock (a change that
#: leaves an entry without them sets ``kwDue`` / ``vecDue`` after this, never before it unseen).
#: A backfill's writes move no version: with ``$model``, the vectors must also all have been
#: written by this embedder since it began (``$writerChanges`` unchanged, the last writer this
#: one). During an embedder swap a worker not yet swapped may re-embed, with the old embedder,
#: entries the new one already did: marked done over them, the Bot would never be due again and
#: they would stay keyword-only for the new embedder's processes.
MARK_DONE: Final[LiteralString] = """
MATCH (held:Memory {id: $botId})
CALL apoc.lock.nodes([held])
MATCH (m:Memory) WHERE elementId(m) = elementId(held)
  AND m.version = $version
  AND ($model IS NULL
       OR (coalesce(m.vecWriterChanges, 0) = $writerChanges AND coalesce(m.vecWriter, $model) = $model))
SET m.kwScheme = $scheme, m.kwDue = false
FOREACH (_ IN CASE WHEN $model IS NULL THEN [] ELSE [1] END | SET m.vecModel = $model, m.vecDue = false)
RETURN count(m) AS n
"""


class BotIdsRow(TypedDict):
    botIds: list[str]


#: One batch under the exclusive lock (C1): keywords (with the tokenisation that made them) and
#: sealed vectors of the entries whose content is still the one read (an entry revised since keeps
#: its own), each entry whose vector or keywords changed (``kwChanged``: other tokens, or other
#: counts of them; not merely their order) stamped with the Memory's next derived-data sequence
#: ``vecSeq`` so every process's index catches up. Keywords made again by a newer tokenisation are
#: mostly the same tokens (text of ASCII alone tokenises as before): such an entry is written (in
#: the new scheme's sorted order) but not stamped, so the indexes do not read it again. Nothing a
#: reader sees changes, so the memory version and the log stay as they are (C2 counts changes of
#: entries). A batch of vectors (``$model``: their embedder; null for keywords alone) records its
#: embedder as the Memory's ``vecWriter``, counting each change of it (MARK_DONE).
WRITE: Final[LiteralString] = (
    """
MATCH (m:Memory {id: $botId})
CALL apoc.lock.nodes([m])
SET m.vecSeq = coalesce(m.vecSeq, 0) + 1"""
    + _CLAIM_WRITER
    + """WITH m, m.vecSeq AS seq
CALL (seq) {
  UNWIND $rows AS row
  MATCH (e:Entry {id: row.id, botId: $botId}) USING INDEX e:Entry(id)
  WHERE e.contentLength = row.contentLength AND e.orderKey = row.orderKey
  SET e.kwBlind = coalesce(row.kwBlind, e.kwBlind), e.kwScheme = coalesce(row.kwScheme, e.kwScheme),
      e.vecSeq = CASE WHEN row.vec IS NOT NULL OR row.kwChanged THEN seq ELSE e.vecSeq END
  FOREACH (_ IN CASE WHEN row.vec IS NULL THEN [] ELSE [1] END |
    SET e.vec = row.vec, e.vecModel = row.vecModel)
  RETURN count(e) AS written
}
RETURN seq, written
"""
)


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


async def bots_due(tx: QueryTarget, *, model: str | None, scheme: int) -> list[str]:
    """BOTS_DUE: the Bots whose entries need the backfill (``model``: the embedder's, None for none)."""
    found = await single(tx, BOTS_DUE, BotIdsRow, model=model, scheme=scheme)
    return [] if found is None else found["botIds"]


async def start(tx: AsyncManagedTransaction, *, bot_id: str, model: str | None) -> StartRow | None:
    """START: the version and writer changes a backfill of ``model`` begins at (None: the Bot is
    gone)."""
    return await single(tx, START, StartRow, botId=bot_id, model=model)


async def mark_done(
    tx: AsyncManagedTransaction, *, bot_id: str, began: StartRow, model: str | None, scheme: int
) -> bool:
    """MARK_DONE: whether the Memory now records its entries' derived data as complete."""
    params = {"version": began["version"], "writerChanges": began["writerChanges"]}
    found = await single(tx, MARK_DONE, CountRow, botId=bot_id, **params, model=model, scheme=scheme)
    return found is not None and found["n"] == 1


async def write(
    tx: AsyncManagedTransaction, *, bot_id: str, batch: list[dict[str, Any]], model: str | None
) -> int | None:
    """WRITE: how many entries were written, or None when the Bot is gone (``model``: the
    batch's embedder, None for keywords alone)."""
    found = await single(tx, WRITE, WrittenRow, botId=bot_id, rows=batch, model=model)
    return None if found is None else found["written"]

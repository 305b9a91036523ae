"""Retrieval by meaning (design §10): the statements behind ``search`` and ``context(query)``.

Similarity proposes, the one visibility check decides: the dense candidates come from the
per-process vector index as ids, the keyword candidates from the ``entry_keywords`` full-text
index over blind tokens (keyed hashes, never words, E1); every candidate passes VISIBLE for every
reader under the shared lock (C1, V10) before it is ranked or returned. The vectors themselves
are stored encrypted (``Entry.vec``, E1) with the embedder that made them (``vecModel``) and a
stamp of the Memory's vector sequence (``vecSeq``, counted by every write of vectors under the
exclusive lock), so each process's index catches up from its last stamp.
"""

from __future__ import annotations

from typing import Final, Generic, Literal, LiteralString, TypedDict, TypeVar, overload

from neo4j import AsyncManagedTransaction

from graph.access import VISIBLE, ReaderMap
from graph.context import ACTIVE_SEEK
from graph.driver import Ciphertext, QueryTarget, single
from graph.memory import ENTRY_MAP, READ_LOCK, SOURCES_OF_E, TOP_RANK, EntryMap, reader_keys

#: The full-text index of the blind keyword tokens (whitespace analyzer: a token is one keyed hash).
KEYWORD_INDEX: Final[LiteralString] = "entry_keywords"

#: Vectors of one embedder stamped after ``$after`` (an index seek on ``entry_vec_seq``): what a
#: process's index lacks. Runs after VECTOR_SEQ, the shared lock, in the same read.
VECTORS_SINCE: Final[LiteralString] = """
MATCH (e:Entry)
WHERE e.botId = $botId AND e.vecSeq > $after AND e.vecModel = $model
RETURN collect(e.id) AS ids, collect(e.vec) AS vecs
"""


class VectorsRow(TypedDict):
    ids: list[str]
    vecs: list[Ciphertext]


#: The shared lock, then the Memory's vector sequence (no row: no such Bot).
VECTOR_SEQ: Final[LiteralString] = READ_LOCK + "RETURN coalesce(m.vecSeq, 0) AS seq\n"


class SeqRow(TypedDict):
    seq: int


#: The vectors a process's index lacks, as the head of the search statement (empty when current).
_FRESH: Final[LiteralString] = """
CALL (m) {
  MATCH (f:Entry)
  WHERE f.botId = $botId AND f.vecSeq > $after AND f.vecModel = $model
  RETURN collect([f.id, f.vec]) AS fresh
}
"""

#: The visible active entries among ``$dense`` (ids in order of similarity), in that order.
_DENSE: Final[LiteralString] = (
    """
CALL (readers, org) {
  UNWIND range(0, size($dense) - 1) AS i
  MATCH (e:Entry {id: $dense[i]})
  WHERE e.botId = $botId AND e.activeKey IS NOT NULL AND """
    + VISIBLE
    + """
  WITH e, i ORDER BY i
  RETURN collect(e) AS dense
}
"""
)

#: The visible active entries matching the blind query ``$keywords`` in BM25 order (none when the
#: query has no keyword). Another Bot's entries never match: its tokens are hashed with its key.
_KEYWORD: Final[LiteralString] = (
    """
CALL (readers, org) {
  WITH readers, org WHERE $keywords <> ''
  CALL db.index.fulltext.queryNodes('"""
    + KEYWORD_INDEX
    + """', $keywords, {limit: $keywordLimit}) YIELD node AS e, score
  WHERE e.botId = $botId AND e.activeKey IS NOT NULL AND """
    + VISIBLE
    + """
  RETURN collect(e) AS keyword
}
"""
)

#: Up to ``$fill`` visible active entries per key in memory order, only when the relevant ones are
#: fewer than ``$fill`` (never when it is 0): what fills a context that relevance leaves room in
#: (entries without a vector yet, a small memory).
_RECENT: Final[LiteralString] = (
    """
CALL (readers, org, dense, keyword) {
  WITH readers, org WHERE $fill > size(dense) + size([e IN keyword WHERE NOT e IN dense])
  UNWIND $keys AS key
  CALL (key, readers, org) {
    MATCH (e:Entry)
    USING INDEX e:Entry(botId, activeKey, memoryRank, contentLength, id)
    WHERE """
    + ACTIVE_SEEK
    + "$top AND "
    + VISIBLE
    + """
    RETURN e ORDER BY e.botId DESC, e.activeKey DESC, e.memoryRank DESC LIMIT $fill
  }
  RETURN collect(e) AS recent
}
"""
)

#: Reciprocal-rank fusion of the two lists (``$k``; the memory-order fill adds nothing but its
#: place after every relevant entry), plus the prior: ``$pinned`` for a pinned
#: entry and at most ``$recency`` for the newest, fading with the versions since it was written.
#: The ``$limit`` best, ``ranked`` as ``{score, entry}``; the entry map follows.
_FUSED_HEAD: Final[LiteralString] = """
WITH m, fresh, dense, keyword, recent,
     [i IN range(0, size(dense) - 1) | [dense[i], 1.0 / ($k + i + 1)]]
     + [i IN range(0, size(keyword) - 1) | [keyword[i], 1.0 / ($k + i + 1)]]
     + [e IN recent | [e, 0.0]] AS parts
CALL (m, parts) {
  UNWIND parts AS part
  WITH m, part[0] AS e, sum(part[1]) AS relevance
  WITH e, relevance
       + CASE WHEN e.layer = 'pinned' THEN $pinned ELSE 0.0 END
       + $recency / (1.0 + (m.version - e.orderKey / 1000000) / $halfLife) AS score
  ORDER BY score DESC, e.memoryRank DESC, e.id
  LIMIT $limit
"""

_FUSED_TAIL: Final[LiteralString] = """}) AS ranked
}
RETURN coalesce(m.vecSeq, 0) AS seq, m.version AS version, fresh, ranked,
       size(dense) AS denseVisible, size(keyword) AS keywordVisible
"""

#: ``search``: the API's view of each entry (sources included, content as ciphertext).
_FUSED: Final[LiteralString] = (
    _FUSED_HEAD + SOURCES_OF_E + "  RETURN collect({score: score, entry: " + ENTRY_MAP + _FUSED_TAIL
)

#: ``context(query)``: of each entry only what choosing and presenting it needs.
_FUSED_CONTEXT: Final[LiteralString] = (
    _FUSED_HEAD
    + "  RETURN collect({score: score, entry: e {.id, .memoryRank, .contentLength, .content}"
    + _FUSED_TAIL
)


class RankedEntry(TypedDict):
    """One of SEARCH's ``ranked``."""

    score: float
    entry: EntryMap


class ContextEntry(TypedDict):
    """What SEARCH_CONTEXT returns of an entry."""

    id: str
    memoryRank: int
    contentLength: int
    content: Ciphertext


class RankedContext(TypedDict):
    """One of SEARCH_CONTEXT's ``ranked``."""

    score: float
    entry: ContextEntry


H = TypeVar("H", RankedEntry, RankedContext)


class SearchRow(TypedDict, Generic[H]):
    """SEARCH (``SearchRow[RankedEntry]``) and SEARCH_CONTEXT (``SearchRow[RankedContext]``).
    ``fresh``: the vectors the caller's index lacks, each a two-item list ``[id, ciphertext]``
    (typed as the pair it is unpacked into)."""

    seq: int
    version: int
    fresh: list[tuple[str, Ciphertext]]
    ranked: list[H]
    denseVisible: int
    keywordVisible: int


#: One search as one statement (an auto-commit transaction): the shared lock first (C1), the
#: vectors the caller's index lacks since ``$after``, the visible dense and keyword candidates
#: (and the memory-order fill), fused. A caller whose index lacked vectors catches up and asks again.
_CANDIDATES: Final[LiteralString] = (
    READ_LOCK + "WITH m, $readers AS readers, $org AS org\n" + _FRESH + _DENSE + _KEYWORD + _RECENT
)
SEARCH: Final[LiteralString] = _CANDIDATES + _FUSED

#: SEARCH for ``context(query)``: the same candidates and ranking, each entry as id, rank, stored
#: length and ciphertext.
SEARCH_CONTEXT: Final[LiteralString] = _CANDIDATES + _FUSED_CONTEXT

#: Up to ``$cap`` ids of the active entries visible to every reader, seeking ``entry_active`` per
#: key (the pre-filter of a reader who sees few entries: similarity then ranks only these).
VISIBLE_ACTIVE: Final[LiteralString] = (
    READ_LOCK
    + """WITH m, $readers AS readers, $org AS org
CALL (readers, org) {
  UNWIND $keys AS key
  CALL (key, readers, org) {
    MATCH (e:Entry)
    USING INDEX e:Entry(botId, activeKey, memoryRank, contentLength, id)
    WHERE """
    + ACTIVE_SEEK
    + "$top AND "
    + VISIBLE
    + """
    RETURN e.id AS id
    ORDER BY e.botId DESC, e.activeKey DESC, e.memoryRank DESC LIMIT $cap
  }
  RETURN collect(id) AS ids
}
RETURN coalesce(m.vecSeq, 0) AS seq, m.version AS version, ids
"""
)


class VisibleActiveRow(TypedDict):
    seq: int
    version: int
    ids: list[str]


async def vectors_since(
    tx: AsyncManagedTransaction, *, bot_id: str, model: str, after: int
) -> tuple[int | None, list[tuple[str, str | bytes]]]:
    """Under the shared lock, the Memory's vector sequence and every vector of ``model`` stamped
    after ``after`` (``-1``: all of them) as (entry id, ciphertext); sequence None: no such Bot."""
    locked = await single(tx, VECTOR_SEQ, SeqRow, botId=bot_id)
    if locked is None:
        return None, []
    # One record of two lists: the driver decodes it far faster than a record per vector.
    found = await single(tx, VECTORS_SINCE, VectorsRow, botId=bot_id, model=model, after=after)
    assert found is not None
    return locked["seq"], list(zip(found["ids"], found["vecs"], strict=True))


@overload
async def search(
    tx: QueryTarget,
    *,
    bot_id: str,
    org: str,
    readers: list[ReaderMap],
    dense: list[str],
    keywords: str,
    keyword_limit: int,
    model: str,
    after: int,
    limit: int,
    fill: int,
    k: float,
    pinned: float,
    recency: float,
    half_life: float,
    for_context: Literal[False] = False,
) -> SearchRow[RankedEntry] | None: ...
@overload
async def search(
    tx: QueryTarget,
    *,
    bot_id: str,
    org: str,
    readers: list[ReaderMap],
    dense: list[str],
    keywords: str,
    keyword_limit: int,
    model: str,
    after: int,
    limit: int,
    fill: int,
    k: float,
    pinned: float,
    recency: float,
    half_life: float,
    for_context: Literal[True],
) -> SearchRow[RankedContext] | None: ...
@overload
async def search(
    tx: QueryTarget,
    *,
    bot_id: str,
    org: str,
    readers: list[ReaderMap],
    dense: list[str],
    keywords: str,
    keyword_limit: int,
    model: str,
    after: int,
    limit: int,
    fill: int,
    k: float,
    pinned: float,
    recency: float,
    half_life: float,
    for_context: bool,
) -> SearchRow[RankedEntry] | SearchRow[RankedContext] | None: ...
async def search(
    tx: QueryTarget,
    *,
    bot_id: str,
    org: str,
    readers: list[ReaderMap],
    dense: list[str],
    keywords: str,
    keyword_limit: int,
    model: str,
    after: int,
    limit: int,
    fill: int,
    k: float,
    pinned: float,
    recency: float,
    half_life: float,
    for_context: bool = False,
) -> SearchRow[RankedEntry] | SearchRow[RankedContext] | None:
    """SEARCH (SEARCH_CONTEXT with ``for_context``); None when the Bot does not exist."""
    params = dict(
        botId=bot_id,
        org=org,
        readers=readers,
        dense=dense,
        keywords=keywords,
        keywordLimit=keyword_limit,
        model=model,
        after=after,
        limit=limit,
        fill=fill,
        keys=reader_keys(readers),
        top=TOP_RANK,
        k=k,
        pinned=pinned,
        recency=recency,
        halfLife=half_life,
    )
    if for_context:
        return await single(tx, SEARCH_CONTEXT, SearchRow[RankedContext], **params)
    return await single(tx, SEARCH, SearchRow[RankedEntry], **params)


async def visible_active(
    tx: QueryTarget, *, bot_id: str, org: str, readers: list[ReaderMap], cap: int
) -> tuple[int, int, list[str]] | None:
    """VISIBLE_ACTIVE: the vector sequence, the memory version and up to ``cap`` visible active
    ids per key."""
    record = await single(
        tx,
        VISIBLE_ACTIVE,
        VisibleActiveRow,
        botId=bot_id,
        org=org,
        readers=readers,
        keys=reader_keys(readers),
        top=TOP_RANK,
        cap=cap,
    )
    if record is None:
        return None
    return record["seq"], record["version"], list(dict.fromkeys(record["ids"]))

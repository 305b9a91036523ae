"""Retrieval by meaning (design §10, D9.29): the statements behind ``search`` and ``context(query)``.

Similarity proposes, the one visibility check decides: the process's index of the Bot
(:mod:`services.vectorindex`) ranks dense and keyword candidates by itself, from the vectors
(stored encrypted, ``Entry.vec``, with the embedder that made them, ``vecModel``) and the blind
keyword tokens (keyed hashes, never words, ``kwBlind``, E1); the statement takes the shared lock
and walks those candidates in that order, keeping the first that pass VISIBLE for every reader
(C1, V10). Every write of keywords or vectors stamps them with the Memory's derived-data
sequence (``vecSeq``, counted under the exclusive lock), so each process's index catches up from
its last stamp, in the same statement.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Final, Generic, LiteralString, TypedDict, TypeVar, cast

from graph.access import HELD_KEYS, VISIBLE, ReaderMap, readers_now
from graph.context import ACTIVE_SEEK
from graph.driver import Ciphertext, QueryTarget, single
from graph.memory import ENTRY_MAP, READ_LOCK, SOURCES_OF_E, TOP_RANK, EntryMap, reader_keys

#: What a process's index holds of the entries ``e`` stamped after ``$after`` (aggregated over
#: them): each one's node id, its blind keywords ("" for none), its vector when ``$model`` made it
#: ("" otherwise), whether it is pinned, its order key, its audience key while active
#: (``activeKey``, "" for none) and when it was said (D9.31) — as parallel lists (one record of
#: lists decodes far faster than a record per entry).
_DERIVED_OF_E: Final[LiteralString] = """{ids: collect(e.id), nodes: collect(elementId(e)),
          keywords: collect(coalesce(e.kwBlind, '')),
          vecs: collect(CASE WHEN e.vecModel = $model THEN e.vec ELSE '' END),
          pinned: collect(e.layer = 'pinned'), orderKeys: collect(e.orderKey),
          keys: collect(coalesce(e.activeKey, '')), saidAt: collect(coalesce(e.saidAt, e.createdAt))}"""

#: Entries per record of DERIVED_SINCE. The driver decodes one huge record far slower than many
#: of a moderate size: the bench's 100k entries (~60 MB, mostly sealed vectors) read in 1.4–1.6 s
#: as one record, 0.44–0.50 s as 100 of 1,000 (10 of 10,000: 0.49–0.56 s).
DERIVED_PAGE: Final = 1_000

#: Everything stamped after ``$after`` (an index seek on ``entry_vec_seq``; ``-1``: every entry
#: with derived data), in records of ``$page`` entries (none when nothing is), each with how many
#: there are in all (``total``).
DERIVED_SINCE: Final[LiteralString] = (
    """
MATCH (e:Entry)
USING INDEX e:Entry(botId, vecSeq)
WHERE e.botId = $botId AND e.vecSeq > $after
WITH collect(e) AS stamped
UNWIND range(0, size(stamped) - 1) AS at
WITH size(stamped) AS total, at / $page AS page, stamped[at] AS e
WITH total, page, """
    + _DERIVED_OF_E
    + """ AS fresh
RETURN fresh, total
"""
)


class Derived(TypedDict):
    """DERIVED_SINCE's ``fresh`` (and the search statement's)."""

    ids: list[str]
    nodes: list[str]
    keywords: list[str]
    vecs: list[Ciphertext]
    pinned: list[bool]
    orderKeys: list[int]
    keys: list[str]
    saidAt: list[int]


class DerivedRow(TypedDict):
    fresh: Derived
    total: int


#: The Memory's derived-data sequence, read with no lock (no row: no such Bot). A cold load reads
#: it first, then every entry's derived data (DERIVED_SINCE) in a transaction of its own that takes
#: no lock either, so that no writer of the Bot waits on a load (the bench's 100k entries take
#: ~0.5 s to read). What a write stamps while the pages are read — a page may show an entry as it
#: was before the write or after it — is stamped after that sequence, so the index reads it again
#: at its first catch-up (under the shared lock, in the search statement) before it proposes
#: anything: the index then holds every entry as of the catch-up's sequence. An entry purged
#: meanwhile may be held although gone: the purge's record, stamped after that sequence, drops it
#: at the same catch-up.
DERIVED_SEQ: Final[LiteralString] = "MATCH (m:Memory {id: $botId}) RETURN coalesce(m.vecSeq, 0) AS seq\n"


class SeqRow(TypedDict):
    seq: int


#: What a process's index lacks, as the head of the search statement (empty lists when current):
#: a range seek on ``entry_vec_seq``, pinned. Left to the planner, once that index had been
#: dropped and made again (the migration test does; an operator may) it read every entry of the
#: Bot through ``entry_bot`` and filtered: ~24 ms a search at 10k entries against ~0.1. Then the
#: node ids of the entries purged since (``graph.purge.COUNT_PURGE``'s ``Purged`` nodes, by
#: ``purged_bot_seq``), which the index drops.
_FRESH: Final[LiteralString] = (
    """
CALL (m) {
  MATCH (e:Entry)
  USING INDEX e:Entry(botId, vecSeq)
  WHERE e.botId = $botId AND e.vecSeq > $after
  RETURN """
    + _DERIVED_OF_E
    + """ AS fresh
}
CALL () {
  OPTIONAL MATCH (p:Purged)
  USING INDEX p:Purged(botId, vecSeq)
  WHERE p.botId = $botId AND p.vecSeq > $after
  RETURN reduce(held = [], nodes IN collect(p.nodes) | held + nodes) AS purged
}
"""
)

#: The first ``$limit`` of the candidates ``$cands`` (best first) that are active and visible to
#: every reader, in that order, with their scores (``$scores``, parallel to ``$cands``), and how
#: far down the list the walk went. Each candidate is found by the node id the process's index
#: holds for it (``$nodes``, parallel: a direct seek, several times cheaper than the id index) and
#: counts only when that node is the entry (its id and Bot); ``lost`` are the places of those it
#: did not find so (the entry was purged, or its node id is unknown or stale: the caller looks
#: them up by id and asks again). The walk is lazy: the runtime pulls one candidate at a time
#: and stops at the ``$limit``-th that passes or is lost, so candidates past it cost only their
#: place in the parameters.
_HITS: Final[LiteralString] = (
    """
CALL (readers, org, keys) {
  CALL (readers, org, keys) {
    UNWIND CASE WHEN size(keys) = 0 THEN [] ELSE range(0, size($cands) - 1) END AS i
    OPTIONAL MATCH (x:Entry) WHERE elementId(x) = $nodes[i]
    WITH readers, org, i, CASE WHEN x.id = $cands[i] AND x.botId = $botId THEN x END AS e
    WHERE e IS NULL OR (e.activeKey IS NOT NULL AND """
    + VISIBLE
    + """)
    RETURN i, e
    LIMIT $limit
  }
  WITH i, e ORDER BY i
  WITH collect(CASE WHEN e IS NULL THEN i END) AS lost, collect(CASE WHEN e IS NOT NULL THEN [i, e] END) AS passing,
       count(*) AS taken, max(i) AS last
  RETURN lost, [p IN passing | p[1]] AS hits, [p IN passing | $scores[p[0]]] AS hitScores,
         CASE WHEN taken >= $limit THEN last + 1 ELSE size($cands) END AS walked
}
"""
)

#: The node ids of the entries ``$ids`` of the Bot (``[id, node id]``; an id without an entry is
#: left out): what a process's index learns after a walk lost candidates.
LOCATE: Final[LiteralString] = """
UNWIND $ids AS id
MATCH (e:Entry {id: id}) USING INDEX e:Entry(id)
WHERE e.botId = $botId
RETURN collect([id, elementId(e)]) AS found
"""


class LocateRow(TypedDict):
    """LOCATE's ``found``: two-item lists, typed as the pair they are unpacked into."""

    found: list[tuple[str, str]]


#: Up to ``$fill`` visible active entries per key in memory order, only when the hits are fewer
#: than ``$fill`` (never when it is 0): what fills a context that relevance leaves room in
#: (entries without derived data yet, a small memory).
_RECENT: Final[LiteralString] = (
    """
CALL (readers, org, hits, keys) {
  WITH readers, org, keys WHERE $fill > size(hits)
  UNWIND keys AS key
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

#: The hits with their scores, then the memory-order fill (score 0) after every hit: the
#: ``$limit`` first, ``ranked`` as ``{score, entry}``; the entry map follows.
_RANKED_HEAD: Final[LiteralString] = """
WITH m, fresh, purged, hits, walked, lost, size(keys) = 0 AS blind,
     [i IN range(0, size(hits) - 1) | [hits[i], hitScores[i]]]
     + [e IN recent WHERE NOT e IN hits | [e, 0.0]] AS parts
CALL (parts) {
  UNWIND parts AS part
  WITH part[0] AS e, part[1] AS score
  ORDER BY score DESC, e.memoryRank DESC, e.id
  LIMIT $limit
"""

_RANKED_TAIL: Final[LiteralString] = """}) AS ranked
}
RETURN coalesce(m.vecSeq, 0) AS seq, m.version AS version, fresh, purged, ranked, size(hits) AS visible,
       walked, lost, blind
"""

#: ``search``: the API's view of each entry (sources included, content as ciphertext).
_RANKED: Final[LiteralString] = (
    _RANKED_HEAD + SOURCES_OF_E + "  RETURN collect({score: score, entry: " + ENTRY_MAP + _RANKED_TAIL
)

#: ``context(query)``: of each entry only what choosing and presenting it needs.
_RANKED_CONTEXT: Final[LiteralString] = (
    _RANKED_HEAD
    + "  RETURN collect({score: score, entry: e {.id, .memoryRank, .contentLength, .content,"
    + " saidAt: coalesce(e.saidAt, e.createdAt)}"
    + _RANKED_TAIL
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
    saidAt: int


class RankedContext(TypedDict):
    """One of SEARCH_CONTEXT's ``ranked``."""

    score: float
    entry: ContextEntry


H = TypeVar("H", RankedEntry, RankedContext)


class SearchRow(TypedDict, Generic[H]):
    """SEARCH (``SearchRow[RankedEntry]``) and SEARCH_CONTEXT (``SearchRow[RankedContext]``).
    ``fresh``: what the caller's index lacks; ``visible``: how many candidates passed, of the
    first ``walked``; ``lost``: the places of the candidates not found by their node id;
    ``blind``: the readers hold none of the keys (HELD_KEYS), so nothing was walked (``walked``
    then counts every candidate) and nothing can pass."""

    seq: int
    version: int
    fresh: Derived
    #: The node ids of the entries purged since ``$after`` (COUNT_PURGE's ``Purged`` nodes).
    purged: list[str]
    ranked: list[H]
    visible: int
    walked: int
    lost: list[int]
    blind: bool


#: One search as one statement (an auto-commit transaction): the shared lock first (C1), what the
#: caller's index lacks since ``$after``, the candidates that pass (and the memory-order fill),
#: ranked. A caller whose index lacked anything catches up and asks again.
_CANDIDATES: Final[LiteralString] = (
    READ_LOCK
    + "WITH m\n"
    + readers_now("m, ")
    + "WITH m, readers, org, "
    + HELD_KEYS
    + " AS keys\n"
    + _FRESH
    + _HITS
    + _RECENT
)
SEARCH: Final[LiteralString] = _CANDIDATES + _RANKED

#: SEARCH for ``context(query)``: the same candidates and ranking, each entry as id, rank, stored
#: length and ciphertext.
SEARCH_CONTEXT: Final[LiteralString] = _CANDIDATES + _RANKED_CONTEXT


async def derived_seq(tx: QueryTarget, *, bot_id: str) -> int | None:
    """DERIVED_SEQ: the Memory's derived-data sequence (None: no such Bot)."""
    found = await single(tx, DERIVED_SEQ, SeqRow, botId=bot_id)
    return None if found is None else found["seq"]


async def derived_pages(
    tx: QueryTarget, *, bot_id: str, model: str, after: int
) -> AsyncIterator[tuple[Derived, int]]:
    """DERIVED_SINCE: what was stamped after ``after``, a page at a time as the driver fetches
    the records, each with how many entries there are in all."""
    result = await tx.run(DERIVED_SINCE, botId=bot_id, model=model, after=after, page=DERIVED_PAGE)
    async for record in result:
        row = cast(DerivedRow, dict(record))
        yield row["fresh"], row["total"]


@dataclass(frozen=True, slots=True)
class Walk:
    """One walk of the search statement: the Bot, who reads (``org``, ``readers``), the candidates
    best first (``cands``, their node ids ``nodes`` and scores ``scores``, parallel), what the
    caller's index holds (the embedder ``model``, stamped through ``after``), and how many to keep
    (``limit``)."""

    bot_id: str
    org: str
    readers: list[ReaderMap]
    cands: list[str]
    nodes: list[str]
    scores: list[float]
    model: str
    after: int
    limit: int

    def params(self, *, fill: int) -> dict[str, object]:
        return {
            "botId": self.bot_id,
            "org": self.org,
            "readers": self.readers,
            "cands": self.cands,
            "nodes": self.nodes,
            "scores": self.scores,
            "model": self.model,
            "after": self.after,
            "limit": self.limit,
            "fill": fill,
            "keys": reader_keys(self.readers),
            "top": TOP_RANK,
        }


async def search_entries(tx: QueryTarget, walk: Walk) -> SearchRow[RankedEntry] | None:
    """SEARCH: the first ``limit`` candidates that pass, as the API's entries; None when the Bot
    does not exist."""
    return await single(tx, SEARCH, SearchRow[RankedEntry], **walk.params(fill=0))


async def search_context(tx: QueryTarget, walk: Walk) -> SearchRow[RankedContext] | None:
    """SEARCH_CONTEXT: the first ``limit`` candidates that pass, filled up to ``limit`` with the
    newest visible entries when fewer pass; None when the Bot does not exist."""
    return await single(tx, SEARCH_CONTEXT, SearchRow[RankedContext], **walk.params(fill=walk.limit))


async def locate(tx: QueryTarget, *, bot_id: str, ids: list[str]) -> list[tuple[str, str]]:
    """LOCATE: ``(entry id, node id)`` of those of ``ids`` that are entries of the Bot."""
    found = await single(tx, LOCATE, LocateRow, botId=bot_id, ids=ids)
    return [] if found is None else [(i, n) for i, n in found["found"]]

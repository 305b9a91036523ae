"""Retrieval by meaning (design §10): ``search`` and ``context(query)``.

Relevance is hybrid: the query's embedding against the Bot's vectors (cosine, the per-process
index of :mod:`services.vectorindex`) fused by reciprocal rank with BM25 over the blind keyword
index, plus a small prior for pinned and recent entries. Similarity only proposes: the one
visibility check decides, under the shared lock, inside the statement that ranks (C1, V10), and
only what is returned is decrypted (E2).

A reader who sees most entries gets the nearest vectors of the whole pool, checked (post-filter);
one who sees few gets their visible active ids first and similarity ranks only those (pre-filter).
Which one a set of reader keys needs is learnt in this process: a post-filter that leaves too few
visible candidates switches those keys to the pre-filter, and a pre-filter that finds many
switches them back.
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass
from typing import Any, Final, Literal, overload

from neo4j import AsyncManagedTransaction

from graph import search as search_q
from graph.driver import autocommit, read
from graph.memory import reader_keys
from services import retrieval
from services.crypto import Cipher, Kind
from services.domain import Principal
from services.embedding import Embedder, EmbedderUnavailable, decode_vectors
from services.errors import BadInput, NotFound
from services.keywords import blind_query
from services.memory import Entry, Reader, cipher_of, decrypt_entry, open_read
from services.runtime import Runtime
from services.validation import check_id
from services.vectorindex import F32, BotVectors, ReaderKey, VisibleIds

log = logging.getLogger("botmemory.search")

MAX_QUERY_CHARS: Final = 2_000
MAX_LIMIT: Final = 100
#: Reciprocal-rank fusion constant, and the prior in units of a first rank's share.
RRF_K: Final = 60.0
PINNED_PRIOR: Final = 0.3 / (RRF_K + 1)
RECENCY_PRIOR: Final = 0.2 / (RRF_K + 1)
#: Memory versions after which the recency prior is halved.
RECENCY_HALF_LIFE: Final = 1_000.0
#: Nearest vectors proposed per wanted result (at least DENSE_MIN), keyword hits asked for.
DENSE_FACTOR: Final = 2
DENSE_MIN: Final = 50
KEYWORD_LIMIT: Final = 100
#: The pre-filter reads at most this many visible ids per key; a reader who sees more than
#: SPARSE_SHARE of the pool is served by the post-filter next time.
PRE_CAP: Final = 5_000
SPARSE_SHARE: Final = 0.1
#: ``after`` for a search without vectors: no vector is ever newer.
_NO_VECTORS: Final = 2**62
#: Attempts of a search whose index had to catch up in between.
_ATTEMPTS: Final = 3


@dataclass(frozen=True, slots=True)
class Hit:
    entry: Entry
    score: float


def check_query(query: str) -> str:
    query = query.strip()
    if not query:
        raise BadInput("query is empty", field="query")
    if len(query) > MAX_QUERY_CHARS:
        raise BadInput(f"query is at most {MAX_QUERY_CHARS} characters", field="query")
    return query


def check_limit(limit: int) -> int:
    if not 1 <= limit <= MAX_LIMIT:
        raise BadInput(f"limit is between 1 and {MAX_LIMIT}", field="limit")
    return limit


async def person_search(
    rt: Runtime, embedder: Embedder | None, principal: Principal, bot_id: str, query: str, limit: int
) -> list[Hit]:
    """``search`` for a person: their own visibility, in their organization (needs read, D9.5)."""
    check_id(bot_id, "botId")
    query, limit = check_query(query), check_limit(limit)

    async def work(tx: AsyncManagedTransaction) -> Reader:
        _, reader, _ = await open_read(rt, tx, principal, bot_id)
        return reader

    return await search(rt, embedder, bot_id, await read(rt.driver, work), query, limit)


async def search(
    rt: Runtime, embedder: Embedder | None, bot_id: str, reader: Reader, query: str, limit: int
) -> list[Hit]:
    """The ``limit`` visible active entries most relevant to ``query``, best first, with scores."""
    ranked, cipher = await _ranked(rt, embedder, bot_id, reader, query, limit, fill=False)
    return [Hit(decrypt_entry(cipher, r["entry"]), float(r["score"])) for r in ranked[:limit]]


async def context(
    rt: Runtime, embedder: Embedder | None, bot_id: str, reader: Reader, limit: int, query: str | None
) -> retrieval.Context:
    """``context(limit, query)``: relevance chooses the entries that fill ``limit`` characters,
    then they are presented in memory order (N3's rule then holds: every chosen line fits).
    When relevance leaves room, the newest visible entries fill it. Without a query it is
    ``context`` in memory order."""
    query = (query or "").strip()[:MAX_QUERY_CHARS]
    if not query:
        return await retrieval.context(rt, bot_id, reader, limit)
    mean = rt.line_lengths.mean(bot_id) or 100.0
    wanted = max(8, min(MAX_LIMIT, math.ceil(limit / mean * 1.5)))
    ranked, cipher = await _ranked(rt, embedder, bot_id, reader, query, wanted, fill=True)
    chosen: list[search_q.ContextEntry] = []
    size = 0
    for r in ranked:
        line = int(r["entry"]["contentLength"]) + 2 + (1 if chosen else 0)
        if size + line <= limit:
            chosen.append(r["entry"])
            size += line
    chosen.sort(key=lambda e: (-int(e["memoryRank"]), str(e["id"])))
    contents = cipher.decrypt_all(Kind.ENTRY, [(e["id"], e["content"]) for e in chosen])
    text = "\n".join("- " + c for c in contents)
    if contents:
        rt.line_lengths.observe(bot_id, len(text) + 1, len(contents))
    return retrieval.Context(text, tuple(e["id"] for e in chosen), tuple(contents))


async def _embed(embedder: Embedder | None, query: str) -> F32 | None:
    if embedder is None:
        return None
    try:
        return (await embedder.embed([query]))[0]
    except EmbedderUnavailable as exc:  # keywords alone still find it
        log.warning("query embedding failed (%s); searching by keywords only", exc.code)
        return None


#: What a search finds: SEARCH's rows, or SEARCH_CONTEXT's for ``context(query)``.
_Found = search_q.SearchRow[search_q.RankedEntry] | search_q.SearchRow[search_q.RankedContext]


@overload
async def _ranked(
    rt: Runtime,
    embedder: Embedder | None,
    bot_id: str,
    reader: Reader,
    query: str,
    wanted: int,
    *,
    fill: Literal[False],
) -> tuple[list[search_q.RankedEntry], Cipher]: ...
@overload
async def _ranked(
    rt: Runtime,
    embedder: Embedder | None,
    bot_id: str,
    reader: Reader,
    query: str,
    wanted: int,
    *,
    fill: Literal[True],
) -> tuple[list[search_q.RankedContext], Cipher]: ...
async def _ranked(
    rt: Runtime,
    embedder: Embedder | None,
    bot_id: str,
    reader: Reader,
    query: str,
    wanted: int,
    *,
    fill: bool,
) -> tuple[list[search_q.RankedEntry] | list[search_q.RankedContext], Cipher]:
    """The best ``wanted`` candidates as ``{score, entry}`` rows, best first; with ``fill``, the
    newest visible entries follow the relevant ones when there are fewer than ``wanted``."""
    cipher = await cipher_of(rt, bot_id)
    vector = await _embed(embedder, query)
    index = None
    if vector is not None and embedder is not None:
        index = rt.vectors.of(bot_id, embedder.id)
        await _load(rt, index, bot_id, cipher)
    keys = tuple(reader_keys(list(reader.readers)))
    dense_k = max(DENSE_MIN, DENSE_FACTOR * wanted)
    params: dict[str, Any] = {
        "bot_id": bot_id,
        "keywords": blind_query(cipher, query),
        "model": index.model if index is not None else "",
        "limit": max(wanted, 1),
        "fill": wanted if fill else 0,
        "k": RRF_K,
        "pinned": PINNED_PRIOR,
        "recency": RECENCY_PRIOR,
        "half_life": RECENCY_HALF_LIFE,
        **reader.params,
    }
    who = reader_key(bot_id, reader)
    found: _Found | None = None
    for _ in range(_ATTEMPTS):
        sparse = index is not None and vector is not None and rt.vectors.sparse(bot_id, keys)
        known = rt.vectors.visible(who) if sparse else None
        if index is not None and vector is not None and sparse and known is None:
            found = await read(
                rt.driver, lambda tx: _prefiltered(rt, tx, index, cipher, vector, dense_k, who, params, fill)
            )
            break
        if index is None or vector is None:
            dense: list[str] = []
        elif known is not None:
            dense = index.top_among(known.ids, vector, dense_k)
        else:
            dense = index.top(vector, dense_k)
        after = _NO_VECTORS if index is None else index.seq
        # A reader known to see nothing active needs no keyword query: the statement then only
        # confirms the memory version under the shared lock.
        asked: dict[str, Any] = params if known is None or known.ids else {**params, "keywords": ""}
        found = await autocommit(
            rt.driver,
            lambda s, dense=dense, after=after, sparse=sparse, asked=asked: search_q.search(
                s,
                dense=dense,
                keyword_limit=(2 if sparse else 1) * KEYWORD_LIMIT,
                after=after,
                for_context=fill,
                **asked,
            ),
        )
        if found is None:
            raise NotFound("bot not found")
        if index is not None and found["fresh"]:
            _absorb(index, cipher, [(i, v) for i, v in found["fresh"]], int(found["seq"]))
            continue  # the nearest vectors may have changed: ask again with the current index
        if index is not None:
            index.seq = max(index.seq, int(found["seq"]))
        if known is not None:
            if int(found["version"]) != known.version:
                rt.vectors.drop_visible(who)
                continue  # the memory changed since the visible ids were read: read them again
        elif (
            index is not None
            and len(dense) == dense_k
            and found["denseVisible"] < wanted
            and len(index) > dense_k
        ):
            rt.vectors.observe(bot_id, keys, sparse=True)
            continue  # too few of the nearest are visible: this reader needs the pre-filter
        break
    assert found is not None
    ranked = found["ranked"]
    ranked.sort(key=lambda r: (-float(r["score"]), -int(r["entry"]["memoryRank"])))
    return ranked, cipher


def reader_key(bot_id: str, reader: Reader) -> ReaderKey:
    """Who a search is for, as the visibility check reads it (the key of kept visible ids)."""
    return bot_id, reader.org, tuple((str(r["id"]), tuple(r["atoms"])) for r in reader.readers)


async def _prefiltered(
    rt: Runtime,
    tx: AsyncManagedTransaction,
    index: BotVectors,
    cipher: Cipher,
    vector: F32,
    dense_k: int,
    who: ReaderKey,
    params: dict[str, Any],
    for_context: bool,
) -> _Found:
    """One read (D9.8): the reader's visible active ids under the shared lock, the index caught up
    under the same lock, similarity among those ids only, then the ranking statement. The ids
    are kept with the memory version they were read at, for the next search of this reader."""
    bot_id = str(params["bot_id"])
    visible = await search_q.visible_active(
        tx, bot_id=bot_id, org=params["org"], readers=params["readers"], cap=PRE_CAP
    )
    if visible is None:
        raise NotFound("bot not found")
    seq, version, ids = visible
    rt.vectors.keep_visible(who, VisibleIds(version, ids))
    if not ids:  # nothing visible and active: no keyword hit either
        return {
            "seq": seq,
            "version": version,
            "fresh": [],
            "ranked": [],
            "denseVisible": 0,
            "keywordVisible": 0,
        }
    if seq > index.seq:
        _, fresh = await search_q.vectors_since(tx, bot_id=bot_id, model=index.model, after=index.seq)
        _absorb(index, cipher, fresh, seq)
    keys = tuple(reader_keys(list(params["readers"])))
    if len(ids) >= PRE_CAP or len(ids) > SPARSE_SHARE * len(index):
        rt.vectors.observe(bot_id, keys, sparse=False)
    dense = index.top_among(ids, vector, dense_k)
    found = await search_q.search(
        tx, dense=dense, keyword_limit=2 * KEYWORD_LIMIT, after=index.seq, for_context=for_context, **params
    )
    if found is None:
        raise NotFound("bot not found")
    return found


async def _load(rt: Runtime, index: BotVectors, bot_id: str, cipher: Cipher) -> None:
    """The first use of a Bot's index in this process reads every vector of its embedder."""
    if index.seq >= 0:
        return
    async with index.lock:
        if index.seq >= 0:
            return
        seq, rows = await read(
            rt.driver, lambda tx: search_q.vectors_since(tx, bot_id=bot_id, model=index.model, after=-1)
        )
        if seq is None:
            raise NotFound("bot not found")
        # Decrypting and decoding every vector takes a while on a large Bot: off the event loop
        # (searches of this Bot wait on the index's lock meanwhile; others go on).
        await asyncio.to_thread(_absorb, index, cipher, rows, seq)


def _absorb(index: BotVectors, cipher: Cipher, rows: list[tuple[str, str | bytes]], seq: int) -> None:
    """Vectors read from the graph into the index, which then holds everything through ``seq``."""
    if rows:
        raws = cipher.decrypt_bytes_all(Kind.ENTRY_VECTOR, rows)
        dims = len(raws[0]) - 4
        q, scales = decode_vectors(raws, dims)
        index.upsert([r[0] for r in rows], q, scales)
    index.seq = max(index.seq, seq)

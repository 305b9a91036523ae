"""Retrieval by meaning (design §10, D9.29): ``search`` and ``context(query)``.

Relevance is hybrid: the query's embedding against the Bot's vectors (cosine) fused by reciprocal
rank with BM25 over the blind keyword tokens, plus a small prior for pinned and recent entries —
all ranked by the Bot's index in this process (:mod:`services.vectorindex`). Similarity only
proposes: the statement takes the shared lock and walks the candidates best first, keeping the
first that pass the one visibility check (C1, V10); only what is returned is decrypted (E2).

The index proposes only entries whose audience key (``activeKey``) is one of the reader's keys —
a necessary condition of VISIBLE, as for ``context``'s seek — so a reader who sees 1 % of the
entries is ranked among that 1 % (the pre-filter, in the process) and one who sees most by the
whole pool's pass with the others left out; nearly every candidate passes either way. The index
is never staler than the graph: a change of an entry's key is stamped like a new vector, and the
statement hands back what was stamped after the index before it is trusted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal, overload

from graph import search as search_q
from graph.driver import QueryTarget, autocommit
from graph.memory import reader_keys
from services import metrics, retrieval
from services.crypto import Cipher, Kind
from services.datewords import blind_days, blind_query
from services.domain import Principal
from services.embedding import Embedder, EmbedderUnavailable, decode_vectors, embed_within
from services.errors import BadInput, NotFound
from services.keywords import blind_tokens
from services.memory import Entry, Reader, cipher_of, decrypt_entry, open_read
from services.retrieval import reader_scope
from services.runtime import Runtime, now_ms
from services.validation import MAX_QUERY_CHARS, check_id
from services.vectorindex import EXACT_MAX, F32, BotIndex, Parts, Ranking, fuse_shown

log = logging.getLogger("botmemory.search")

MAX_LIMIT: Final = 100
#: The most entries ``context(limit, query)`` asks for (a server caller's 100,000 characters at
#: ~60 a line): beyond ``search``'s limit, so that short lines fill the budget too.
MAX_CONTEXT_WANTED: Final = 2000
#: Reciprocal-rank fusion constant, and the prior in units of a first rank's share.
#: 20 rather than the usual 60 (a first rank counts a little more against the rest): candidate
#: recall of an offline simulation of context(4000, query) on the LoCoMo observations, dev split
#: (conv-41…44) 79.0 → 80.1 % (k = 10–20 alike, 30: 79.9); held out (conv-47…50) 81.4 → 82.4 %.
RRF_K: Final = 20.0
#: The prior breaks near ties and no more: together under the gap between a list's first two
#: places (1 - 21/22 of a first share), so a pinned or newer entry never passes one the query is
#: nearer to in every list. (At 0.3 and 0.2 a pinned entry would pass up to seven places at the
#: top: "Ann prefers answers in French", remembered, first in a search for "boats" above "Loves
#: sailing on Lake Geneva".) Candidate recall of the simulation is the same with the recency prior
#: at 0 to 0.4 (its entries are learned within a few hundred versions); it has no pinned entries.
PINNED_PRIOR: Final = 0.03 / (RRF_K + 1)
RECENCY_PRIOR: Final = 0.01 / (RRF_K + 1)
#: Memory versions after which the recency prior is halved.
RECENCY_HALF_LIFE: Final = 1_000.0
#: Nearest vectors proposed per wanted result (at least DENSE_MIN), keyword hits (at least
#: KEYWORD_LIMIT).
DENSE_FACTOR: Final = 2
DENSE_MIN: Final = 50
KEYWORD_LIMIT: Final = 100
#: Candidates handed to the statement at first: the wanted ones divided by the share that passed
#: for these reader keys before (at least MIN_PASSING), a WALK_MARGIN more and MARGIN_MIN more.
#: The index proposes only entries whose audience key the reader holds, so nearly all pass (those
#: that do not: a key shared with an audience the reader is not all of, an exclusion); it proposes
#: at least as many as the walk may take. The statement walks them lazily and stops at the
#: wanted-th that passes, so those past it cost only their place in the parameters (~1 µs each;
#: each one checked costs ~6 µs). A walk that falls short goes as far as its share says, at most
#: WALK_GROWTH times as far (:func:`further`).
MIN_PASSING: Final = 0.02
WALK_MARGIN: Final = 0.3
MARGIN_MIN: Final = 2
WALK_GROWTH: Final = 4
#: How many more entries ``context(query)`` asks for than the budget holds at the Bot's mean line
#: length (the best that do not fit are skipped, smaller ones after them still may).
CONTEXT_OVERASK: Final = 1.25
#: Entries put into an index at once: a cold load of a large Bot goes in parts, so that what
#: decrypting, decoding and building postings make on the way stays small (the bench's 100k
#: entries at once peaked at ~500 MB of Python memory for an index that holds ~94 MB). More than
#: EXACT_MAX: the first part of a large Bot fits the principal components at once.
ABSORB_PART: Final = 2 * EXACT_MAX
#: Attempts of a search whose index had to catch up (or walk further) in between, and rounds
#: after a walk lost candidates (each drops every gone one it walked: at most a walk's worth).
_ATTEMPTS: Final = 6
_LOST_ROUNDS: Final = 64
#: The counters of every search, their labels looked up once (``labels`` costs more than ``inc``).
_STATEMENTS: Final = {
    o: metrics.SEARCH_STATEMENTS.labels(o) for o in ("answered", "caught_up", "lost", "further")
}
_PASSED: Final = metrics.SEARCH_CANDIDATES.labels("passed")
_REFUSED: Final = metrics.SEARCH_CANDIDATES.labels("refused")


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

    async def work(session: QueryTarget) -> Reader:  # the search's statement takes the lock again
        _, reader, _ = await open_read(rt, session, principal, bot_id)
        return reader

    return await search(rt, embedder, bot_id, await autocommit(rt.driver, work), query, limit)


async def search(
    rt: Runtime, embedder: Embedder | None, bot_id: str, reader: Reader, query: str, limit: int
) -> list[Hit]:
    """The ``limit`` visible active entries most relevant to ``query``, best first, with scores
    (the dates it names read in the time zone of a person reading for themselves, D9.32)."""
    ranked, cipher = await _ranked(
        rt, embedder, bot_id, reader, query, limit, fill=False, said=(None, reader.time_zone)
    )
    return [Hit(decrypt_entry(cipher, r["entry"]), float(r["score"])) for r in ranked[:limit]]


async def context(
    rt: Runtime,
    embedder: Embedder | None,
    bot_id: str,
    reader: Reader,
    limit: int,
    query: str | None,
    *,
    said_at: int | None = None,
    zone: str | None = None,
) -> retrieval.Context:
    """``context(limit, query)``: relevance chooses the entries that fill ``limit`` characters,
    then they are presented in memory order (N3's rule then holds: every chosen line fits).
    When relevance leaves room, the newest visible entries fill it. Without a query it is
    ``context`` in memory order. ``said_at``: when the query was said ("yesterday" is the day
    before it; D9.31), else now; ``zone``: the IANA time zone it was said in (D9.32), else UTC."""
    query = query_text(query)
    if not query:
        return await retrieval.context(rt, bot_id, reader, limit)
    scope = reader_scope(bot_id, reader)
    wanted = context_wanted(rt, scope, limit)
    said = (said_at, zone)
    ranked, cipher = await _ranked(rt, embedder, bot_id, reader, query, wanted, fill=True, said=said)
    chosen, size = _fitting(ranked, limit)
    if chosen and len(ranked) == wanted < MAX_CONTEXT_WANTED and limit - size > size / len(chosen):
        # As many entries as asked for came, and room for more is left: the lines were shorter
        # than the Bot's mean said (none known yet, or shorter entries now), or some did not fit
        # (one longer than the budget left it all but empty). Ask again for what the room holds
        # at the mean of those that fit.
        more = min(MAX_CONTEXT_WANTED, math.ceil(limit * len(chosen) / size * CONTEXT_OVERASK))
        ranked, cipher = await _ranked(rt, embedder, bot_id, reader, query, more, fill=True, said=said)
        chosen, size = _fitting(ranked, limit)
    chosen.sort(key=lambda e: (-int(e["memoryRank"]), str(e["id"])))
    contents = cipher.decrypt_all(Kind.ENTRY, [(e["id"], e["content"]) for e in chosen])
    text = "\n".join("- " + c for c in contents)
    if contents:
        rt.line_lengths.observe(scope, len(text) + 1, len(contents))
    return retrieval.Context(
        text, tuple(e["id"] for e in chosen), tuple(contents), tuple(e["saidAt"] for e in chosen)
    )


def _fitting(ranked: list[search_q.RankedContext], limit: int) -> tuple[list[search_q.ContextEntry], int]:
    """The best entries that fit ``limit`` characters as lines (one that does not fit is skipped,
    a smaller one after it still may), and the characters they take."""
    chosen: list[search_q.ContextEntry] = []
    size = 0
    for r in ranked:
        line = int(r["entry"]["contentLength"]) + 2 + (1 if chosen else 0)
        if size + line <= limit:
            chosen.append(r["entry"])
            size += line
    return chosen, size


def context_wanted(rt: Runtime, scope: str, limit: int) -> int:
    """How many entries ``context(limit, query)`` asks the statement for: CONTEXT_OVERASK times
    what ``limit`` characters hold at the mean length of the lines it gave this reader of the Bot
    (``scope``: :func:`reader_scope`; 100 before any is known)."""
    mean = rt.line_lengths.mean(scope) or 100.0
    return max(8, min(MAX_CONTEXT_WANTED, math.ceil(limit / mean * CONTEXT_OVERASK)))


def query_text(query: str | None) -> str:
    """The text ``context(query)`` ranks for (and embeds): stripped, at most MAX_QUERY_CHARS."""
    return (query or "").strip()[:MAX_QUERY_CHARS]


def show_scores(
    ranked: Sequence[search_q.RankedEntry | search_q.RankedContext], cands: list[str], parts: list[Parts]
) -> None:
    """Sets the scores ``search`` shows on ``ranked`` (walked from ``cands``, made of ``parts``):
    fused as the index fuses them, with the ranks counted among the shown only, so that no entry
    the reader cannot see counts (:func:`services.vectorindex.fuse_shown`). The walk chose them by
    their ranks in the whole pool; a score from those would tell how many hidden entries match the
    query better (§10)."""
    made = dict(zip(cands, parts, strict=True))
    scores = fuse_shown(
        [made[r["entry"]["id"]] for r in ranked],
        rrf_k=RRF_K,
        pinned_prior=PINNED_PRIOR,
        recency_prior=RECENCY_PRIOR,
        half_life=RECENCY_HALF_LIFE,
    )
    for r, score in zip(ranked, scores, strict=True):
        r["score"] = score


class EarlyQuery:
    """A query's embedding started before its search: an :class:`Embedder` that answers that one
    text from it (once :meth:`start` started it) and anything else from ``embedder``.
    ``startTurn`` starts one beside writing the Turn, once the caller may write the Chat, so the
    query's embedding (~5 ms on one core) overlaps the write instead of following it. ``aclose``
    drops an embedding nobody asked for (it never closes ``embedder``)."""

    def __init__(self, embedder: Embedder, query: str) -> None:
        self._embedder = embedder
        self._text = query_text(query)
        self._early: asyncio.Task[F32] | None = None
        self._started = False

    def start(self) -> None:
        """Start the embedding (once: a retried write calls it again)."""
        if not self._started and self._text:
            self._started = True
            self._early = asyncio.ensure_future(self._embedder.embed([self._text]))

    @property
    def id(self) -> str:
        return self._embedder.id

    @property
    def dims(self) -> int:
        return self._embedder.dims

    async def embed(self, texts: Sequence[str]) -> F32:
        early = self._early
        if early is not None and list(texts) == [self._text]:
            self._early = None
            return await early
        return await self._embedder.embed(texts)

    async def aclose(self) -> None:
        early, self._early = self._early, None
        if early is None:
            return
        early.cancel()  # the thread it waits on finishes its one text, and is not waited for
        with contextlib.suppress(asyncio.CancelledError, EmbedderUnavailable):
            await early


async def _embed(rt: Runtime, embedder: Embedder | None, scope: str, query: str) -> F32 | None:
    """The query's vector (this process's, when the same reader of the same Bot, ``scope``, asked
    the same text lately), or None (keywords alone still find it) when the embedder fails or
    takes longer than ``query_embedding_timeout_seconds``."""
    if embedder is None:
        return None
    kept = rt.query_vectors.get(scope, embedder.id, query)
    if kept is not None:
        return kept
    try:
        vector = (await embed_within(embedder, [query], rt.settings.query_embedding_timeout_seconds))[0]
    except EmbedderUnavailable as exc:
        log.warning("query embedding failed (%s); searching by keywords only", exc.code)
        metrics.QUERY_EMBEDDING_FAILURES.labels(exc.code).inc()
        return None
    rt.query_vectors.put(scope, embedder.id, query, vector)
    return vector


#: What a search finds: SEARCH's rows, or SEARCH_CONTEXT's for ``context(query)``.
_Found = search_q.SearchRow[search_q.RankedEntry] | search_q.SearchRow[search_q.RankedContext]


@dataclass(frozen=True, slots=True)
class _Query:
    """One search as the index and the statement take it."""

    bot_id: str
    reader: Reader
    vector: F32 | None
    blind: list[str]
    wanted: int
    fill: bool

    async def run(
        self, tx: QueryTarget, index: BotIndex, cands: list[str], scores: list[float], after: int
    ) -> _Found:
        """The statement: the first ``wanted`` of ``cands`` that pass (filled in memory order for
        ``context``), and what was stamped after ``after`` — the index's sequence when it ranked
        them, so that a statement tried again after a transient error still reads everything the
        ranking lacked, though another search caught the index up meanwhile."""
        params = self.reader.params
        walk = search_q.Walk(
            bot_id=self.bot_id,
            org=params["org"],
            readers=params["readers"],
            cands=cands,
            nodes=index.nodes_of(cands),
            scores=scores,
            model=index.model,
            after=after,
            limit=self.wanted,
        )
        found = await (search_q.search_context if self.fill else search_q.search_entries)(tx, walk)
        if found is None:
            raise NotFound("bot not found")
        return found


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
    said: tuple[int | None, str | None] = (None, None),
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
    said: tuple[int | None, str | None] = (None, None),
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
    said: tuple[int | None, str | None] = (None, None),
) -> tuple[list[search_q.RankedEntry] | list[search_q.RankedContext], Cipher]:
    """The best ``wanted`` visible active entries as ``{score, entry}`` rows, best first; with
    ``fill``, the newest visible entries follow the relevant ones when there are fewer. ``said``:
    when and in which time zone the query was said (None: now, UTC)."""
    cipher = await cipher_of(rt, bot_id)
    keys = tuple(reader_keys(list(reader.readers)))
    scope = reader_scope(bot_id, reader)
    vector = await _embed(rt, embedder, scope, query)
    # The query's words and the dates it names (D9.31: entries hold the terms of the day they
    # were said on).
    said_at, zone = said
    blind = blind_tokens(cipher, query, scope=scope) + blind_query(
        cipher, query, now_ms() if said_at is None else said_at, zone
    )
    q = _Query(bot_id, reader, vector, blind, wanted, fill)
    index = await _loaded(rt, bot_id, "" if embedder is None else embedder.id, cipher)
    walk = first_walk(rt, bot_id, keys, wanted)
    found: _Found | None = None
    cands: list[str] = []
    parts: list[Parts] = []  # what the walked candidates are made of (their shown scores)
    attempts = lost_rounds = 0
    while lost_rounds < _LOST_ROUNDS:
        after = index.seq
        ranking = candidates(index, q.vector, q.blind, keys, wanted, walk)
        total = len(ranking.ids)
        walked = min(walk, total)
        cands, scores = ranking.ids[:walked], ranking.scores[:walked]
        parts = [] if fill else index.parts(ranking, walked, q.vector)
        found = await autocommit(rt.driver, lambda s, c=cands, sc=scores, a=after: q.run(s, index, c, sc, a))
        if found["fresh"]["ids"] or found["purged"]:
            _STATEMENTS["caught_up"].inc()
            catch_up(index, cipher, found)
            if attempts < _ATTEMPTS:
                attempts += 1
                continue  # the candidates may have changed: ask again with the current index
            # Writes came during every attempt: this walk's answer stands, ranked with all but
            # what was stamped while its own statement ran (as concurrent as the search itself),
            # not the one before it, ranked before its catch-up (without the newest entries).
        else:
            index.seq = max(index.seq, int(found["seq"]))
        if found["blind"]:
            # The readers as they stand now hold none of the keys (a group chat one of whose
            # members does not use the Bot): nothing was walked and nothing would pass.
            _STATEMENTS["answered"].inc()
            break
        if found["lost"]:
            # Some candidates were not where the index had them (purged before the index caught
            # up with the purge's record, or a node id unknown): each lost one counts towards the
            # walk's limit. Every walked candidate is looked up at once (those gone leave the
            # index) and the search asks again, on a round of its own (D9.29: a stale node id
            # costs a lookup, never a result).
            _STATEMENTS["lost"].inc()
            lost_rounds += 1
            await _locate(rt, index, bot_id, cands)
            continue
        visible = int(found["visible"])
        if found["walked"]:
            rt.vectors.observe_passing(bot_id, keys, visible / int(found["walked"]))
            _PASSED.inc(visible)
            _REFUSED.inc(int(found["walked"]) - visible)
        if visible >= wanted or (walked == total and ranking.complete) or attempts >= _ATTEMPTS:
            _STATEMENTS["answered"].inc()
            break
        _STATEMENTS["further"].inc()
        attempts += 1
        walk = further(walked, visible, wanted)  # some were hidden or inactive (the index proposes more)
    assert found is not None
    rt.vectors.account(bot_id, index)  # what catching up and ranking took in counts
    ranked = found["ranked"]
    if not fill:
        show_scores(ranked, cands, parts)
    ranked.sort(key=lambda r: (-float(r["score"]), -int(r["entry"]["memoryRank"])))
    return ranked, cipher


def candidates(
    index: BotIndex, vector: F32 | None, blind: list[str], keys: Sequence[str], wanted: int, walk: int
) -> Ranking:
    """The index's candidates for ``wanted`` results, best first, of the entries whose audience key
    is one of the reader's ``keys``: enough for a walk of ``walk``."""
    return index.rank(
        vector,
        blind,
        keys,
        dense_k=max(DENSE_MIN, DENSE_FACTOR * wanted, walk),
        keyword_k=max(KEYWORD_LIMIT, DENSE_FACTOR * wanted, walk),
        rrf_k=RRF_K,
        pinned_prior=PINNED_PRIOR,
        recency_prior=RECENCY_PRIOR,
        half_life=RECENCY_HALF_LIFE,
    )


def first_walk(rt: Runtime, bot_id: str, keys: tuple[str, ...], wanted: int) -> int:
    """How many candidates a search of ``wanted`` results hands the statement at first: as many as
    the share that passed for these reader keys before says, with WALK_MARGIN to spare."""
    passing = max(MIN_PASSING, rt.vectors.passing(bot_id, keys))
    return math.ceil(wanted / passing * (1 + WALK_MARGIN)) + MARGIN_MIN


def further(walked: int, visible: int, wanted: int) -> int:
    """How far the next walk goes after one of ``walked`` candidates found ``visible`` of the
    ``wanted``: as far as the share that passed says the rest lies, with WALK_MARGIN to spare, and
    at most WALK_GROWTH times as far (the walk starts again from the first candidate, and the
    index ranks anew for it: a walk that found 45 of 50 goes ~1.4 times as far, not 4)."""
    needed = math.ceil(walked * wanted / visible * (1 + WALK_MARGIN)) if visible else walked * WALK_GROWTH
    return max(walked + MARGIN_MIN, min(walked * WALK_GROWTH, needed))


async def _locate(rt: Runtime, index: BotIndex, bot_id: str, ids: list[str]) -> None:
    """The node ids of candidates a walk lost, looked up by id (those gone are dropped)."""
    found = await autocommit(rt.driver, lambda s: search_q.locate(s, bot_id=bot_id, ids=ids))
    index.locate(ids, found)


async def _loaded(rt: Runtime, bot_id: str, model: str, cipher: Cipher) -> BotIndex:
    """The Bot's index of ``model`` in this process, loaded (:func:`_load`)."""
    while True:
        index = rt.vectors.of(bot_id, model)
        if index.seq < 0:
            async with index.lock:
                if index.discarded:
                    continue  # its load failed while this search waited: the held one now
                await _load(rt, index, bot_id, cipher)
        return index


async def _load(rt: Runtime, index: BotIndex, bot_id: str, cipher: Cipher) -> None:
    """The first use of a Bot's index in this process reads everything derived of its entries
    (under its lock, which the caller holds): the derived-data sequence first, then the pages,
    with no lock of the memory (``graph.search.DERIVED_SEQ``: what a write stamps meanwhile the
    first catch-up reads again), ABSORB_PART entries taken into the index at a time as the driver
    fetches them, so that only a part's lists are held at once. A load that fails part-way (an
    error, or the search cancelled while a part is absorbed on its thread) discards the index."""
    if index.seq >= 0:
        return
    started = time.perf_counter()
    seq = await autocommit(rt.driver, lambda s: search_q.derived_seq(s, bot_id=bot_id))
    if seq is None:
        raise NotFound("bot not found")

    async def take(session: QueryTarget) -> None:
        part, reserved = _empty(), False
        pages = search_q.derived_pages(session, bot_id=bot_id, model=index.model, after=-1)
        async for page, total in pages:
            if not reserved:
                index.reserve(len(index) + total)  # the arrays grow once
                reserved = True
            if len(part["ids"]) + len(page["ids"]) > ABSORB_PART:
                # Decrypting and decoding vectors takes a while on a large Bot: off the event
                # loop (searches of this Bot wait on the index's lock meanwhile; others go on).
                await asyncio.to_thread(_absorb, index, cipher, part)
                part = _empty()
            for name, values in page.items():
                part[name].extend(values)
        if part["ids"]:
            await asyncio.to_thread(_absorb, index, cipher, part)

    try:
        await autocommit(rt.driver, take, fetch_size=max(1, ABSORB_PART // search_q.DERIVED_PAGE))
    except BaseException:
        rt.vectors.discard(bot_id, index)
        raise
    index.seq = max(index.seq, seq)
    rt.vectors.account(bot_id, index)
    metrics.SEARCH_INDEX_LOAD_SECONDS.observe(time.perf_counter() - started)


def catch_up(index: BotIndex, cipher: Cipher, found: _Found) -> None:
    """What a search statement read of the entries stamped since the index's sequence, taken in
    only when it is newer than what the index holds: two searches of one Bot run at once, and
    the answer of the one that read earlier may arrive later — taken in then, it would put back
    an entry as it was (its audience key, its vector) under a sequence that says it is current,
    and no later catch-up would read it again."""
    seq = int(found["seq"])
    if seq <= index.seq:
        return
    metrics.SEARCH_INDEX_CAUGHT_UP.inc(len(found["fresh"]["ids"]))
    # Purged first: an entry stamped after the purge may have a node id a purged one had.
    index.drop_nodes(found["purged"])
    _absorb(index, cipher, found["fresh"])
    index.seq = seq


def _empty() -> search_q.Derived:
    return search_q.Derived(
        ids=[], nodes=[], keywords=[], vecs=[], pinned=[], orderKeys=[], keys=[], saidAt=[]
    )


def _absorb(index: BotIndex, cipher: Cipher, fresh: search_q.Derived) -> None:
    """Entries read from the graph into the index, ABSORB_PART at a time (a catch-up after a large
    backfill reads many), in arrays grown once; each entry's keywords with the terms of the day it
    was said on (D9.31, held here only)."""
    ids = fresh["ids"]
    if len(ids) > ABSORB_PART:
        index.reserve(len(index) + len(ids))
    for start in range(0, len(ids), ABSORB_PART):
        part = slice(start, start + ABSORB_PART)
        part_ids, vecs = ids[part], fresh["vecs"][part]
        at = [i for i, v in enumerate(vecs) if v]
        vectors = None
        if at:
            raws = cipher.decrypt_bytes_all(Kind.ENTRY_VECTOR, [(part_ids[i], vecs[i]) for i in at])
            q, scales = decode_vectors(raws, len(raws[0]) - 4)
            vectors = (at, q, scales)
        days = blind_days(cipher, fresh["saidAt"][part])
        keywords = [f"{k} {d}" if k else d for k, d in zip(fresh["keywords"][part], days, strict=True)]
        index.upsert(
            part_ids,
            fresh["nodes"][part],
            keywords,
            fresh["pinned"][part],
            fresh["orderKeys"][part],
            fresh["keys"][part],
            vectors,
        )

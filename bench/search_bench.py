"""Retrieval by meaning in the memory benchmark (design §10): ``services.search.search`` and
``services.search.context(…, query)`` in process, on the pools of ``bench.memory_bench``.

The pools' entries are written through the real write path (``apply_changes`` with an embedder),
so their blind keywords (``kwBlind``) and sealed vectors (``vec``, ``vecModel``, ``vecSeq``)
are exactly what production writes. Embedding 100k entries with the real model would take
minutes, so the pools' embedder (:class:`PoolEmbedder`) answers from a :class:`Corpus`: a few
thousand generated sentences embedded once per run with the real ``LocalMiniLM``; an entry's
text is a run of those sentences, and its vector is the real vector of its first sentence plus a
little of another's and some noise, normalised. The same embedder id as ``LocalMiniLM``, so the
real embedder's query vectors rank against them (the enrichment row).

The ``search`` and ``context(query)`` rows exclude the query embedding: :class:`QueryEmbedder`
hands back query vectors computed beforehand with ``LocalMiniLM``. The embedding is measured on
its own (query latency, write throughput, ``apply_changes`` with the real embedder, and the
memory part of an enriched Turn).
"""

from __future__ import annotations

import dataclasses
import gc
import itertools
import math
import os
import random
import time
import tracemalloc
import zlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Generic, Literal, Protocol, TypedDict, overload

import numpy as np
import numpy.typing as npt

from bench.embedding_bench import batch_throughput, query_latency
from bench.measure import (
    BenchSettings,
    Row,
    find,
    fmt_ms,
    fmt_ratio,
    log,
    measure_pair,
    pct,
    probing,
    verdict,
)
from graph import search as search_q
from graph.context import ACTIVE_SEEK
from graph.driver import Ciphertext, QueryTarget, autocommit, single
from graph.memory import ENTRY_MAP, SOURCES_OF_E, TOP_RANK, reader_keys
from learning.embedders import LocalMiniLM
from services import conversation, memory, retrieval, search, turns
from services.crypto import Cipher, Kind
from services.domain import Principal
from services.embedding import Embedder, QueryVectors, decode_vectors
from services.keywords import blind_tokens
from services.memory import Reader, cipher_of, decrypt_entry
from services.runtime import Runtime
from services.vectorindex import BotIndex, VectorIndexes

F32 = npt.NDArray[np.float32]

READER_KINDS: Final = ("most", "1%", "none")
SEARCH_LIMIT: Final = 10
CONTEXT_LIMIT: Final = 4000
OP_SEARCH: Final = f"search({SEARCH_LIMIT})"
OP_QCONTEXT: Final = f"context({CONTEXT_LIMIT}, query)"
OP_ENRICH: Final = "enrichment: context(4000, query) incl. LocalMiniLM"
#: What startTurn does before its model call (learning.enrichment.start_turn): the Turn written
#: while the query is embedded, then context(query); against the Turn written, then context.
OP_TURN: Final = "startTurn: Turn written + context(4000, query) incl. LocalMiniLM"
#: contextPack of the reader's own Chat (services.conversation): the Chat and its last 10
#: messages, its route and summary, its audience, the preferences, and context(query) for the
#: latest person message (whose vector is made beforehand, as the other rows' are).
OP_PACK: Final = "contextPack: last 10 messages, summary, preferences + context(4000, query)"
#: Queries of the quality check (overlap@10 of the coarse index with exact cosine).
QUALITY_QUERIES: Final = 50

# Targets from the issue (milliseconds unless noted).
T_SEARCH_MEDIAN: Final = 3.0
T_SEARCH_P95: Final = 10.0
T_SEARCH_SCALE: Final = 1.5
T_RATIO: Final = 2.0
T_INDEX_MB: Final = 100.0
T_ENRICH_DELTA: Final = 10.0

# --- the corpus ---------------------------------------------------------------------------------

# fmt: off
_NAMES = (
    "Caroline", "Melanie", "Jon", "Gina", "Maria", "John", "Audrey", "Andrew", "Nate", "Joanna",
    "Priya", "Tomasz", "Aiko", "Lena", "Omar", "Sofia", "Ravi", "Hannah", "Diego", "Mei", "Lukas",
    "Fatima", "Noah", "Chloe", "Yusuf", "Elena", "Marco", "Ingrid", "Kwame", "Zoe", "Pablo",
    "Anya", "Felix", "Nadia", "Hugo", "Leila", "Oscar", "Greta", "Samir", "Ivy",
)
_THINGS = (
    "a pottery class", "the quarterly budget review", "a charity race", "an adoption agency",
    "a dance studio", "a camping trip", "a support group", "a new puppy", "a job interview",
    "the database migration", "the release of version two", "an on-call shift", "a dentist appointment",
    "a vegetarian cooking course", "the hiring committee", "a conference talk", "the team offsite",
    "a flight delay", "a broken laptop", "the VPN outage", "a birthday party", "a piano recital",
    "a marathon", "the roadmap meeting", "a customer escalation", "a security audit",
    "a hotel booking", "a train strike", "the onboarding of two engineers", "a photography workshop",
    "a book club", "a climbing gym", "a wedding", "a garden project", "a kitchen renovation",
    "a language exchange", "a tax return", "a car repair", "a volunteer shift", "a chess tournament",
    "the incident review", "a performance review", "a sailing lesson", "a museum visit",
    "a farmers market", "a yoga retreat", "a hackathon", "the invoice backlog", "a board game night",
    "a job offer",
)
_PLACES = (
    "Berlin", "London", "Lisbon", "the lake house", "the office", "Kyoto", "Toronto", "the library",
    "the community centre", "Madrid", "the beach", "Oslo", "the city park", "Nairobi", "Vienna",
    "the old harbour", "Seoul", "the mountains", "Dublin", "the coffee shop",
)
_WHEN = (
    "last week", "on Friday", "next month", "every morning", "in March", "over the summer",
    "two days ago", "this weekend", "after lunch", "before the holidays", "on Monday evening",
    "in the spring",
)
_FEELINGS = (
    "calm", "grateful", "exhausted", "proud", "nervous", "excited", "frustrated", "relieved",
    "curious", "overwhelmed", "happy", "anxious",
)
_LIKES = (
    "green tea", "early standups", "remote work", "spicy food", "quiet mornings", "long walks",
    "written feedback", "dark chocolate", "jazz records", "short meetings", "trains over flights",
    "oat milk", "paper notebooks", "cold showers", "late dinners", "sci-fi novels",
)
_TEMPLATES = (
    "{n} went to {t} in {p} {w} and said it made them feel {f}.",
    "{n} told {m} that {t} {w} was the best part of the month.",
    "{n} is planning {t} {w} because {m} recommended it.",
    "{n} prefers {l} and asked the team to keep that in mind.",
    "{n} cannot stand {l2} and avoids it whenever possible.",
    "{n} asked for help with {t} before the deadline {w}.",
    "After {t}, {n} decided to spend more time in {p}.",
    "{n} moved {t} to {w} after a talk with {m}.",
    "{n} felt {f} about {t} and wants to talk about it again.",
    "{m} and {n} met at {t} in {p} {w}.",
    "{n} recommends {l} to anyone who is {f} about {t}.",
    "{n} will miss {t} {w} because of a trip to {p}.",
)
_QUESTIONS = (
    "What did {n} think about {t}?",
    "When is {n} going to {p}?",
    "Who went to {t} with {n}?",
    "What does {n} prefer in the morning?",
    "How did {n} feel after {t}?",
    "Is {n} planning {t} {w}?",
    "Why did {n} move {t}?",
    "What happened at {t} in {p}?",
)
# fmt: on

#: How much of a second sentence's vector an entry's vector carries, and its noise per dimension.
_MIX: Final = 0.35
_NOISE: Final = 0.02


def _fill(template: str, rng: random.Random) -> str:
    n, m = rng.sample(_NAMES, 2)
    l1, l2 = rng.sample(_LIKES, 2)
    return template.format(
        n=n, m=m, t=rng.choice(_THINGS), p=rng.choice(_PLACES), w=rng.choice(_WHEN),
        f=rng.choice(_FEELINGS), l=l1, l2=l2,
    )  # fmt: skip


class Corpus:
    """The sentences entries are made of, their real vectors (after :meth:`embed`), the queries
    and theirs. Deterministic for a seed."""

    def __init__(self, seed: int, sentences: int, queries: int) -> None:
        rng = random.Random(seed)
        found: dict[str, None] = {}
        while len(found) < sentences:
            found[_fill(rng.choice(_TEMPLATES), rng)] = None
        self.sentences = list(found)
        asked: dict[str, None] = {}
        while len(asked) < queries:
            asked[_fill(rng.choice(_QUESTIONS), rng)] = None
        self.questions = list(asked)
        self.base: F32 | None = None
        self.queries: dict[str, F32] = {}
        #: Each text handed out: (its first sentence, the sentence its vector carries some of).
        self._made: dict[str, tuple[int, int]] = {}

    def content(self, rng: random.Random, target: int) -> str:
        """An entry's text of about ``target`` characters: sentences of the corpus in a row."""
        n = len(self.sentences)
        first, second = rng.randrange(n), rng.randrange(n)
        parts, size, k = [self.sentences[first]], len(self.sentences[first]), second
        while size < target:
            parts.append(self.sentences[k])
            size += len(self.sentences[k]) + 1
            k = rng.randrange(n)
        text = " ".join(parts)[:target].rstrip() or self.sentences[first]
        self._made.setdefault(text, (first, second))
        return text

    async def embed(self, embedder: Embedder) -> float:
        """Embed the sentences and the queries with the real embedder; entries/s of the sentences."""
        rate, self.base = await batch_throughput(embedder, self.sentences)
        vectors = await embedder.embed(self.questions)
        self.queries = {q: vectors[i] for i, q in enumerate(self.questions)}
        return rate

    def vectors(self, texts: Sequence[str]) -> F32:
        assert self.base is not None, "Corpus.embed first"
        n, dims = int(self.base.shape[0]), int(self.base.shape[1])
        out = np.empty((len(texts), dims), np.float32)
        for row, text in enumerate(texts):
            crc = zlib.crc32(text.encode())
            first, second = self._made.get(text, (crc % n, (crc // n) % n))
            noise = np.random.default_rng(crc).standard_normal(dims, dtype=np.float32)
            v = self.base[first] + _MIX * self.base[second] + _NOISE * noise
            out[row] = v / np.linalg.norm(v)
        return out


class PoolEmbedder:
    """The pools' embedder: corpus vectors under ``LocalMiniLM``'s id (what the write path stores)."""

    def __init__(self, corpus: Corpus, model: str) -> None:
        self._corpus, self._model = corpus, model

    @property
    def id(self) -> str:
        return self._model

    @property
    def dims(self) -> int:
        assert self._corpus.base is not None
        return int(self._corpus.base.shape[1])

    async def embed(self, texts: Sequence[str]) -> F32:
        return self._corpus.vectors(texts)

    async def aclose(self) -> None:
        return None


class QueryEmbedder(PoolEmbedder):
    """Query vectors made beforehand with ``LocalMiniLM``: search timed without the embedding."""

    async def embed(self, texts: Sequence[str]) -> F32:
        return np.stack([self._corpus.queries[t] for t in texts])


# --- the unchecked retrieval -----------------------------------------------------------------------

#: ``graph.search.SEARCH`` without the shared lock, the catch-up seek and VISIBLE: the same walk
#: of the candidates by node id (the first ``$limit`` active ones, lazily), the same memory-order fill seek per
#: key of the reader (unchecked) and the same ranking, one auto-commit statement.
_RAW_HEAD: Final = (
    """
MATCH (m:Memory {id: $botId})
CALL () {
  CALL () {
    UNWIND range(0, size($cands) - 1) AS i
    MATCH (e:Entry) WHERE elementId(e) = $nodes[i]
    WITH e, i WHERE e.id = $cands[i] AND e.botId = $botId AND e.activeKey IS NOT NULL
    RETURN e, i
    LIMIT $limit
  }
  WITH e, i ORDER BY i
  RETURN collect(e) AS hits, collect($scores[i]) AS hitScores
}
CALL (hits) {
  WITH 1 AS go WHERE $fill > size(hits)
  UNWIND $keys AS key
  CALL (key) {
    MATCH (e:Entry)
    USING INDEX e:Entry(botId, activeKey, memoryRank, contentLength, id)
    WHERE """
    + ACTIVE_SEEK
    + """$top
    RETURN e ORDER BY e.botId DESC, e.activeKey DESC, e.memoryRank DESC LIMIT $fill
  }
  RETURN collect(e) AS recent
}
WITH m, hits,
     [i IN range(0, size(hits) - 1) | [hits[i], hitScores[i]]]
     + [e IN recent WHERE NOT e IN hits | [e, 0.0]] AS parts
CALL (parts) {
  UNWIND parts AS part
  WITH part[0] AS e, part[1] AS score
  ORDER BY score DESC, e.memoryRank DESC, e.id
  LIMIT $limit
"""
)
_RAW_TAIL: Final = """}) AS ranked
}
RETURN ranked
"""
RAW_SEARCH: Final = (
    _RAW_HEAD + SOURCES_OF_E + "  RETURN collect({score: score, entry: " + ENTRY_MAP + _RAW_TAIL
)
#: RAW_SEARCH as ``context(query)`` reads it (``graph.search.SEARCH_CONTEXT``): id, rank, length, ciphertext.
RAW_SEARCH_CONTEXT: Final = (
    _RAW_HEAD
    + "  RETURN collect({score: score, entry: e {.id, .memoryRank, .contentLength, .content}"
    + _RAW_TAIL
)


class _RawRanked(TypedDict, Generic[search_q.H]):
    """RAW_SEARCH (``_RawRanked[RankedEntry]``) and RAW_SEARCH_CONTEXT (``[RankedContext]``)."""

    ranked: list[search_q.H]


@overload
async def raw_ranked(
    rt: Runtime,
    cipher: Cipher,
    index: BotIndex,
    bot_id: str,
    keys: list[str],
    vector: F32,
    query: str,
    wanted: int,
    *,
    fill: Literal[False],
) -> list[search_q.RankedEntry]: ...
@overload
async def raw_ranked(
    rt: Runtime,
    cipher: Cipher,
    index: BotIndex,
    bot_id: str,
    keys: list[str],
    vector: F32,
    query: str,
    wanted: int,
    *,
    fill: Literal[True],
) -> list[search_q.RankedContext]: ...
async def raw_ranked(
    rt: Runtime,
    cipher: Cipher,
    index: BotIndex,
    bot_id: str,
    keys: list[str],
    vector: F32,
    query: str,
    wanted: int,
    *,
    fill: bool,
) -> list[search_q.RankedEntry] | list[search_q.RankedContext]:
    """``search._ranked`` without the visibility check: the index's candidates of the reader's
    keys, walked as far as the search walks them at first (by the share that passed for them in
    the service's searches); best first."""
    walk = search.first_walk(rt, bot_id, tuple(keys), wanted)
    ranking = search.candidates(index, vector, blind_tokens(cipher, query, scope="bench"), keys, wanted, walk)
    cands, scores = ranking.ids[:walk], ranking.scores[:walk]
    parts = [] if fill else index.parts(ranking, walk, vector)
    params: dict[str, Any] = {
        "botId": bot_id,
        "cands": cands,
        "nodes": index.nodes_of(cands),
        "scores": scores,
        "limit": max(wanted, 1),
        "fill": wanted if fill else 0,
        "keys": keys,
        "top": TOP_RANK,
    }
    found: list[search_q.RankedEntry] | list[search_q.RankedContext]
    if fill:
        ctx = await autocommit(
            rt.driver, lambda s: single(s, RAW_SEARCH_CONTEXT, _RawRanked[search_q.RankedContext], **params)
        )
        found = [] if ctx is None else ctx["ranked"]
    else:
        hits = await autocommit(
            rt.driver, lambda s: single(s, RAW_SEARCH, _RawRanked[search_q.RankedEntry], **params)
        )
        found = [] if hits is None else hits["ranked"]
        search.show_scores(found, cands, parts)
    found.sort(key=lambda r: (-float(r["score"]), -int(r["entry"]["memoryRank"])))
    return found


# --- measurements --------------------------------------------------------------------------------


class PoolLike(Protocol):
    """What the search phase needs of a ``bench.memory_bench.Pool``."""

    @property
    def size(self) -> int: ...
    @property
    def bot(self) -> str: ...
    @property
    def org(self) -> str: ...
    def person_of(self, kind: str) -> str: ...
    def turn_spot(self, kind: str) -> tuple[Principal, str] | None:
        """The reader's person and a Chat of theirs to start Turns in (None: they have none)."""
        ...


@dataclass
class Profile:
    """Where one call's time goes (median call of a few)."""

    total_ms: float
    server_ms: float
    decrypt_ms: float
    top_ms: float  # BotIndex.rank (numpy: nearest vectors, BM25, fusion)
    keywords_ms: float  # blind_tokens (stems and HMACs)
    load_ms: float  # BotIndex.upsert (cold load: dequantise, project, PCA fit)
    statements: int
    transactions: int

    @property
    def rest_ms(self) -> float:
        parts = self.server_ms + self.decrypt_ms + self.top_ms + self.keywords_ms + self.load_ms
        return max(0.0, self.total_ms - parts)


@dataclass
class IndexStats:
    """A Bot's vector index in this process, per pool."""

    size: int
    vectors: int = 0
    nbytes: int = 0
    held: int = 0  # BotIndex.held_bytes: what index_memory_mb's bound counts of it
    rss_delta: int = 0  # RSS after - before the first cold load (the index kept alive)
    traced: int = 0  # tracemalloc: held after a cold load (arrays, ids, the id map)
    traced_peak: int = 0  # tracemalloc: peak during it
    cold_ms: list[float] = field(default_factory=list[float])  # first search on a fresh index
    cold_profile: Profile | None = None
    overlap10: list[float] = field(default_factory=list[float])  # top(q, 10) vs exact top 10
    recall10_in_50: list[float] = field(default_factory=list[float])  # exact top 10 in top(q, 50)
    profiles: dict[tuple[str, str], Profile] = field(default_factory=dict[tuple[str, str], Profile])

    def per_100k_mb(self, held: int) -> float:
        return held / max(self.vectors, 1) * 100_000 / 1e6


@dataclass
class Embedding:
    """The real embedder on its own (once per run)."""

    query_ms: list[float] = field(default_factory=list[float])
    throughput: float = 0.0
    texts: int = 0
    mean_chars: float = 0.0
    corpus_rate: float = 0.0
    corpus_seconds: float = 0.0


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def measure_embedding(corpus: Corpus, minilm: LocalMiniLM, texts: list[str], queries: int) -> Embedding:
    """LocalMiniLM (one thread): load, embed the corpus, query latency, write-side throughput."""
    out = Embedding()
    started = time.perf_counter()
    out.corpus_rate = await corpus.embed(minilm)
    out.corpus_seconds = time.perf_counter() - started
    questions = list(itertools.islice(itertools.cycle(corpus.questions), queries))
    out.query_ms = [t * 1000 for t in await query_latency(minilm, questions)]
    out.throughput, _ = await batch_throughput(minilm, texts)
    out.texts, out.mean_chars = len(texts), sum(len(t) for t in texts) / max(len(texts), 1)
    log(
        f"  LocalMiniLM: corpus of {len(corpus.sentences):,} sentences in {out.corpus_seconds:.1f} s; "
        f"query p50 {fmt_ms(pct(out.query_ms, 0.5))} ms p95 {fmt_ms(pct(out.query_ms, 0.95))} ms; "
        f"write {out.throughput:,.0f} entries/s ({len(texts)} texts of {out.mean_chars:.0f} chars)"
    )
    return out


async def profile(call: Callable[[], Awaitable[Any]], times: int) -> Profile:
    """``call`` under the round-trip probe, with BotIndex.rank/upsert and blind_tokens timed too;
    the median call of ``times``."""
    spent = {"top": 0.0, "keywords": 0.0, "load": 0.0}
    vectors: Any = BotIndex
    module: Any = search
    originals = {"rank": vectors.rank, "upsert": vectors.upsert, "blind": module.blind_tokens}

    def timed(orig: Callable[..., Any], part: str) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                return orig(*args, **kwargs)
            finally:
                spent[part] += time.perf_counter() - t

        return wrapper

    vectors.rank = timed(originals["rank"], "top")
    vectors.upsert = timed(originals["upsert"], "load")
    module.blind_tokens = timed(originals["blind"], "keywords")
    found: list[Profile] = []
    try:
        for _ in range(times):
            spent.update(top=0.0, keywords=0.0, load=0.0)
            with probing() as probe:
                t = time.perf_counter()
                await call()
                total = (time.perf_counter() - t) * 1000
            found.append(
                Profile(
                    total,
                    probe.server_ms(),
                    probe.decrypt_seconds * 1000,
                    spent["top"] * 1000,
                    spent["keywords"] * 1000,
                    spent["load"] * 1000,
                    len(probe.results),
                    probe.transactions,
                )
            )
    finally:
        vectors.rank = originals["rank"]
        vectors.upsert = originals["upsert"]
        module.blind_tokens = originals["blind"]
    return sorted(found, key=lambda p: p.total_ms)[len(found) // 2]


async def _readers(rt: Runtime, pool: PoolLike) -> dict[str, Reader]:
    found: dict[str, Reader] = {}
    for kind in READER_KINDS:
        reader = await memory.person_reader_of(rt, pool.bot, pool.person_of(kind), pool.org)
        assert reader is not None, f"no reader for {kind}"
        found[kind] = reader
    return found


async def measure_cold(
    rt: Runtime, pool: PoolLike, corpus: Corpus, reader: Reader, runs: int, stats: IndexStats
) -> None:
    """The first search of a Bot in a process loads its index (every vector read, decrypted and
    decoded): ``runs`` first searches, each on a fresh index; the memory of the loaded index by
    RSS (the first) and by tracemalloc (one more, untimed)."""
    qe = QueryEmbedder(corpus, LocalMiniLM().id)
    query = corpus.questions[0]

    async def first_search(fresh: Runtime) -> None:
        await search.search(fresh, qe, pool.bot, reader, query, SEARCH_LIMIT)

    fresh = rt  # each fresh runtime's index stays alive until the next one replaces it
    for k in range(runs):
        fresh = dataclasses.replace(rt, vectors=VectorIndexes())
        gc.collect()
        before = rss_bytes()
        if k == runs - 1 > 0:  # the last one profiled (the probe's wrappers cost microseconds)
            stats.cold_profile = await profile(lambda fresh=fresh: first_search(fresh), 1)
            stats.cold_ms.append(stats.cold_profile.total_ms)
        else:
            t = time.perf_counter()
            await first_search(fresh)
            stats.cold_ms.append((time.perf_counter() - t) * 1000)
        if k == 0:
            gc.collect()
            stats.rss_delta = rss_bytes() - before
            index = fresh.vectors.of(pool.bot, qe.id)
            stats.vectors, stats.nbytes, stats.held = len(index), index.nbytes, index.held_bytes
    fresh = rt
    gc.collect()
    tracemalloc.start()
    try:
        fresh = dataclasses.replace(rt, vectors=VectorIndexes())
        held_before = tracemalloc.get_traced_memory()[0]
        await first_search(fresh)
        gc.collect()
        held, peak = tracemalloc.get_traced_memory()
        stats.traced, stats.traced_peak = held - held_before, peak - held_before
    finally:
        tracemalloc.stop()
    log(
        f"  {pool.size:>7,} cold index: first search {fmt_ms(pct(stats.cold_ms, 0.5))} ms "
        f"(n={len(stats.cold_ms)}), {stats.vectors:,} vectors, nbytes {stats.nbytes / 1e6:.1f} MB, "
        f"RSS +{stats.rss_delta / 1e6:.1f} MB, tracemalloc held {stats.traced / 1e6:.1f} MB "
        f"(peak {stats.traced_peak / 1e6:.1f} MB)"
    )


async def measure_quality(rt: Runtime, pool: PoolLike, corpus: Corpus, stats: IndexStats) -> None:
    """overlap@10 of ``BotIndex.top`` (coarse + rescore above 16k vectors) with exact cosine over
    every stored vector (dequantised as the index holds them), for QUALITY_QUERIES queries."""
    model = LocalMiniLM().id
    index = rt.vectors.of(pool.bot, model)
    cipher = await cipher_of(rt, pool.bot)
    stored: list[tuple[str, Ciphertext]] = []

    async def take(session: QueryTarget) -> None:
        stored.clear()  # a retried read starts again
        async for page, _ in search_q.derived_pages(session, bot_id=pool.bot, model=model, after=-1):
            stored.extend((i, v) for i, v in zip(page["ids"], page["vecs"], strict=True) if v)

    await autocommit(rt.driver, take)
    if not stored:
        return
    raws = cipher.decrypt_bytes_all(Kind.ENTRY_VECTOR, stored)
    q, scales = decode_vectors(raws, len(raws[0]) - 4)
    exact_vectors = q.astype(np.float32) * scales[:, None]
    ids = [r[0] for r in stored]
    for text in corpus.questions[:QUALITY_QUERIES]:
        v = corpus.queries[text]
        exact = exact_vectors @ v
        best = {ids[int(i)] for i in np.argpartition(-exact, 10)[:10]}
        stats.overlap10.append(len(best & set(index.top(v, 10))) / 10)
        stats.recall10_in_50.append(len(best & set(index.top(v, 50))) / 10)
    log(
        f"  {pool.size:>7,} quality: overlap@10 {np.mean(stats.overlap10):.3f}, exact top 10 in top 50 "
        f"{np.mean(stats.recall10_in_50):.3f} ({len(stats.overlap10)} queries, {len(ids):,} vectors)"
    )


def _cycle(questions: list[str]) -> Callable[[], str]:
    it = itertools.cycle(questions)
    return lambda: next(it)


async def _measure_reader(
    rt: Runtime,
    pool: PoolLike,
    s: BenchSettings,
    corpus: Corpus,
    minilm: LocalMiniLM,
    kind: str,
    reader: Reader,
    stats: IndexStats,
    out: list[Row],
) -> None:
    qe = QueryEmbedder(corpus, minilm.id)
    cipher = await cipher_of(rt, pool.bot)
    keys = reader_keys(list(reader.readers))
    for _ in range(3):  # load the index, learn the reader's filter (post or pre), warm the plans
        await search.search(rt, qe, pool.bot, reader, corpus.questions[0], SEARCH_LIMIT)
        await search.context(rt, qe, pool.bot, reader, CONTEXT_LIMIT, corpus.questions[0])
    index = rt.vectors.of(pool.bot, qe.id)
    # Each function walks the same sequence of queries (the loop calls each as often).
    q_search, q_raw_search, q_context, q_raw_context, q_enriched = (
        _cycle(corpus.questions) for _ in range(5)
    )

    async def checked_search() -> int:
        return len(await search.search(rt, qe, pool.bot, reader, q_search(), SEARCH_LIMIT))

    async def raw_search() -> int:
        text = q_raw_search()
        ranked = await raw_ranked(
            rt, cipher, index, pool.bot, keys, corpus.queries[text], text, SEARCH_LIMIT, fill=False
        )
        return len([decrypt_entry(cipher, r["entry"]) for r in ranked[:SEARCH_LIMIT]])

    async def checked_context() -> int:
        return len((await search.context(rt, qe, pool.bot, reader, CONTEXT_LIMIT, q_context())).ids)

    async def raw_context() -> int:
        text = q_raw_context()
        wanted = search.context_wanted(rt, search.reader_scope(pool.bot, reader), CONTEXT_LIMIT)
        ranked = await raw_ranked(
            rt, cipher, index, pool.bot, keys, corpus.queries[text], text, wanted, fill=True
        )
        chosen: list[search_q.ContextEntry] = []
        size = 0
        for r in ranked:
            line = int(r["entry"]["contentLength"]) + 2 + (1 if chosen else 0)
            if size + line <= CONTEXT_LIMIT:
                chosen.append(r["entry"])
                size += line
        chosen.sort(key=lambda e: (-int(e["memoryRank"]), str(e["id"])))
        texts = cipher.decrypt_all(Kind.ENTRY, [(e["id"], e["content"]) for e in chosen])
        assert len("\n".join("- " + c for c in texts)) <= CONTEXT_LIMIT
        return len(texts)

    for op, checked, unchecked in (
        (OP_SEARCH, checked_search, raw_search),
        (OP_QCONTEXT, checked_context, raw_context),
    ):
        row = await measure_pair(pool.size, op, kind, checked, unchecked, s)
        stats.profiles[op, kind] = await profile(checked, max(3, s.profile_calls))
        out.append(row)
        log(
            f"  {pool.size:>7,} {op:<22} {kind:<5} n={row.n:<3} median {fmt_ms(row.median)} ms "
            f"p95 {fmt_ms(row.p95)} ms returned {row.returned[0] if row.returned else '-'} "
            f"checked/unchecked {fmt_ratio(row.ratio)}"
        )

    # The memory part of an enriched Turn (learning.enrichment._rewrite): context(query) with the
    # real embedder vs context in memory order, alternating in one loop. Every query embedded anew,
    # as a new person's message is (the questions come round again; the process keeps the vectors
    # of queries it embedded lately).
    anew = dataclasses.replace(rt, query_vectors=QueryVectors(0))

    async def enriched() -> int:
        return len((await search.context(anew, minilm, pool.bot, reader, CONTEXT_LIMIT, q_enriched())).ids)

    async def plain() -> int:
        return len((await retrieval.context(rt, pool.bot, reader, CONTEXT_LIMIT)).ids)

    await _measure_delta(pool.size, OP_ENRICH, kind, enriched, plain, s, "context(4000) without a query", out)
    spot = pool.turn_spot(kind)
    if spot is None:
        return
    # startTurn as it runs before its model call: the query embedded beside the Turn's write.
    person, chat_id = spot
    q_turn = _cycle(corpus.questions)

    async def turn_with_query() -> int:
        text = q_turn()
        early = search.EarlyQuery(minilm, text)
        try:
            await turns.start_turn(
                rt, person, chat_id, text, actor_id=None, notice=False, allowed=early.start
            )
            return len((await search.context(anew, early, pool.bot, reader, CONTEXT_LIMIT, text)).ids)
        finally:
            await early.aclose()

    async def turn_plain() -> int:
        await turns.start_turn(rt, person, chat_id, q_turn(), actor_id=None, notice=False)
        return len((await retrieval.context(rt, pool.bot, reader, CONTEXT_LIMIT)).ids)

    without = "the Turn written, then context(4000) without a query"
    await _measure_delta(pool.size, OP_TURN, kind, turn_with_query, turn_plain, s, without, out)

    said = corpus.questions[0]  # the Chat's latest person message from here on
    await turns.start_turn(rt, person, chat_id, said, actor_id=None, notice=False)

    async def pack() -> int:  # what it returns decrypted: the preferences and the memory's entries
        got = await conversation.context_pack(rt, person, chat_id, qe)
        return len(got.preferences) + len(got.memory.ids)

    async def context_alone() -> int:
        return len((await search.context(rt, qe, pool.bot, reader, CONTEXT_LIMIT, said)).ids)

    row = await measure_pair(pool.size, OP_PACK, kind, pack, context_alone, s)
    row.note = "unchecked column = context(4000, query) for the same message alone"
    out.append(row)
    log(
        f"  {pool.size:>7,} contextPack {kind:<5} median {fmt_ms(row.median)} ms "
        f"(context(query) alone {fmt_ms(pct(row.unchecked, 0.5))} ms)"
    )


async def _measure_delta(
    size: int,
    op: str,
    kind: str,
    with_query: Callable[[], Awaitable[int]],
    without: Callable[[], Awaitable[int]],
    s: BenchSettings,
    what: str,
    out: list[Row],
) -> None:
    """``with_query`` against ``without`` (``what`` it is), alternating in one loop; the
    difference of their medians is what the ≤ +T_ENRICH_DELTA target reads."""
    row = await measure_pair(size, op, kind, with_query, without, s)
    delta = row.median - pct(row.unchecked, 0.5)
    row.note = f"unchecked column = {what}; Δ median {fmt_ms(delta)} ms (target ≤ +{T_ENRICH_DELTA:g} ms)"
    out.append(row)
    log(f"  {size:>7,} {op.split(':')[0]} {kind:<5} with query {fmt_ms(row.median)} ms, Δ {fmt_ms(delta)} ms")


async def measure_search(
    rt: Runtime,
    pool: PoolLike,
    s: BenchSettings,
    corpus: Corpus,
    minilm: LocalMiniLM,
    cold_runs: int,
    out: list[Row],
) -> IndexStats:
    """Per pool: the cold index, ``search`` and ``context(query)`` beside their unchecked reads
    for each reader kind, where their time goes, the memory part of an enriched Turn with the
    real embedder (``context(query)`` vs ``context``), and the quality of the index."""
    stats = IndexStats(pool.size)
    readers = await _readers(rt, pool)
    await measure_cold(rt, pool, corpus, readers["most"], cold_runs, stats)
    for kind, reader in readers.items():
        await _measure_reader(rt, pool, s, corpus, minilm, kind, reader, stats, out)
    await measure_quality(rt, pool, corpus, stats)
    return stats


#: Separate runs of the interleaved loop: its targets are the medians of the runs' medians, its
#: ratios the medians of the runs' ratios (each ratio within one run).
INTERLEAVED_RUNS: Final = 3


async def measure_interleaved(
    rt: Runtime,
    pools: Sequence[PoolLike],
    s: BenchSettings,
    corpus: Corpus,
    out: list[Row],
    runs: int = INTERLEAVED_RUNS,
) -> None:
    """``search`` and ``context(query)`` for each reader kind on every pool in one loop (a new
    random order each round), for the 100k/1k ratio under the same machine conditions; the loop
    runs ``runs`` times, each with its own warm-up and medians."""
    qe = QueryEmbedder(corpus, LocalMiniLM().id)
    readers = {(p.size, k): r for p in pools for k, r in (await _readers(rt, p)).items()}
    bots = {p.size: p.bot for p in pools}
    keys = [(size, kind, op) for size, kind in readers for op in (OP_SEARCH, OP_QCONTEXT)]
    rows_ = {key: Row(key[0], "interleaved " + key[2], key[1], []) for key in keys}
    questions = itertools.cycle(corpus.questions)
    rng = random.Random(11)
    for run in range(runs):
        samples: dict[tuple[int, str, str], list[float]] = {key: [] for key in keys}
        for round_ in range(s.warmup + s.runs):
            rng.shuffle(keys)
            query = next(questions)
            for size, kind, op in keys:
                t = time.perf_counter()
                if op == OP_SEARCH:
                    got = len(
                        await search.search(rt, qe, bots[size], readers[size, kind], query, SEARCH_LIMIT)
                    )
                else:
                    ctx = await search.context(rt, qe, bots[size], readers[size, kind], CONTEXT_LIMIT, query)
                    got = len(ctx.ids)
                if round_ >= s.warmup:
                    samples[size, kind, op].append((time.perf_counter() - t) * 1000)
                    rows_[size, kind, op].returned.append(got)
        for key, taken in samples.items():
            rows_[key].samples.extend(taken)
            rows_[key].run_medians.append(pct(taken, 0.5))
        log(f"  interleaved run {run + 1} of {runs} done")
    for row in rows_.values():
        out.append(row)
        medians = " / ".join(fmt_ms(m) for m in row.run_medians)
        log(f"  {row.size:>7,} {row.op} {row.reader:<5} n={row.n} run medians {medians} ms")


def run_ratios(hi: Row, lo: Row) -> list[float]:
    """``hi``'s median ÷ ``lo``'s median in each run (none when they were not repeated alike)."""
    if not hi.run_medians or len(hi.run_medians) != len(lo.run_medians):
        return []
    return [h / lo_ for h, lo_ in zip(hi.run_medians, lo.run_medians, strict=True)]


def ratio_of_runs(hi: Row, lo: Row) -> float:
    """The median of :func:`run_ratios` (of all samples' medians when not repeated alike)."""
    ratios = run_ratios(hi, lo)
    return pct(ratios, 0.5) if ratios else hi.median / lo.median


# --- report --------------------------------------------------------------------------------------


def _of_runs(r: Row | None) -> str:
    """A target's figure: the median of the runs' medians, and each run's."""
    if r is None:
        return "not run"
    if len(r.run_medians) < 2:
        return f"{fmt_ms(r.median)} ms"
    return f"{fmt_ms(r.median_of_runs)} ms (runs {' / '.join(fmt_ms(m) for m in r.run_medians)})"


def target_lines(
    rows_: list[Row], stats: dict[int, IndexStats], sizes: list[int], emb: Embedding | None
) -> list[str]:
    """The rows of the targets table for retrieval by meaning."""
    lines: list[str] = []
    add = lines.append
    big = 100_000 if 100_000 in stats else None
    small = 1000 if 1000 in stats else None
    interleaved = big is not None and find(rows_, big, "interleaved " + OP_SEARCH) is not None
    how = " (interleaved)" if interleaved else ""
    for op in (OP_SEARCH, OP_QCONTEXT):
        name = ("interleaved " if interleaved else "") + op
        for kind in READER_KINDS:
            r = find(rows_, big, name, kind) if big else None
            add(
                f"| `{op}` median ≤ {T_SEARCH_MEDIAN:g} ms (query embedding excluded){how} | 100k | {kind} | "
                f"{_of_runs(r)} | {verdict(r.median_of_runs <= T_SEARCH_MEDIAN if r else None)} |"
            )
        for kind in READER_KINDS:
            r = find(rows_, big, name, kind) if big else None
            add(
                f"| `{op}` p95 ≤ {T_SEARCH_P95:g} ms (query embedding excluded){how} | 100k | {kind} | "
                f"{fmt_ms(r.p95) + ' ms' if r else 'not run'} | {verdict(r.p95 <= T_SEARCH_P95 if r else None)} |"
            )
        for kind in READER_KINDS:
            hi = find(rows_, big, name, kind) if big else None
            lo = find(rows_, small, name, kind) if small else None
            ratio = ratio_of_runs(hi, lo) if hi and lo else None
            each = run_ratios(hi, lo) if hi and lo else []
            runs = f"; runs {' / '.join(fmt_ratio(r) for r in each)}" if len(each) > 1 else ""
            measured = (
                f"{fmt_ratio(ratio)} ({fmt_ms(hi.median_of_runs)} / {fmt_ms(lo.median_of_runs)} ms{runs})"
                if ratio and hi and lo
                else "not run"
            )
            add(
                f"| `{op}` median 100k ≤ {T_SEARCH_SCALE:g}× 1k{how} | 100k/1k | {kind} | {measured} | "
                f"{verdict(ratio <= T_SEARCH_SCALE if ratio else None)} |"
            )
    for size in sizes:
        for op in (OP_SEARCH, OP_QCONTEXT):
            cands = [r for r in rows_ if r.size == size and r.op == op and r.ratio is not None]
            if cands:
                worst = max(cands, key=lambda r: r.ratio or 0)
                add(
                    f"| `{op}` checked/unchecked ≤ {T_RATIO:g}× (worst reader) | {size:,} | {worst.reader} | "
                    f"{fmt_ratio(worst.ratio)} | {verdict((worst.ratio or 0) <= T_RATIO)} |"
                )
    if big is not None:
        st = stats[big]
        held = max(st.traced, st.nbytes)
        add(
            f"| resident memory of a Bot's index per 100k entries ≤ {T_INDEX_MB:g} MB (tracemalloc: arrays, "
            f"ids, id map) | 100k | – | {st.per_100k_mb(held):.1f} MB (arrays alone, `nbytes`: "
            f"{st.per_100k_mb(st.nbytes):.1f} MB; RSS delta {st.per_100k_mb(st.rss_delta):.1f} MB) | "
            f"{verdict(st.per_100k_mb(held) <= T_INDEX_MB)} |"
        )
    deltas = (
        (
            OP_ENRICH,
            "enriched Turn's memory part: `context(query)` incl. LocalMiniLM − `context` median (no overlap)",
            False,
        ),
        (
            OP_TURN,
            "`startTurn` with enrichment, query vs none (the Turn written, then `context(query)` incl. "
            f"LocalMiniLM, embedded beside the write, vs `context`) median ≤ +{T_ENRICH_DELTA:g} ms",
            True,
        ),
    )
    for size in sizes:
        for kind in READER_KINDS:
            for op, label, targeted in deltas:
                r = find(rows_, size, op, kind)
                if r is None:
                    continue
                delta = r.median - pct(r.unchecked, 0.5)
                result = verdict(delta <= T_ENRICH_DELTA) if targeted else "info"
                add(
                    f"| {label} | {size:,} | {kind} | +{fmt_ms(delta)} ms ({fmt_ms(r.median)} vs "
                    f"{fmt_ms(pct(r.unchecked, 0.5))} ms) | {result} |"
                )
    for size in sizes:
        st = stats.get(size)
        if st is not None and st.cold_ms:
            add(
                f"| cold load of a Bot's index (first search), median (no target) | {size:,} | most | "
                f"{fmt_ms(pct(st.cold_ms, 0.5))} ms (n={len(st.cold_ms)}, {st.vectors:,} vectors) | info |"
            )
    if big is not None and stats[big].overlap10:
        st = stats[big]
        add(
            f"| overlap@10 of the coarse+rescore index with exact cosine, mean (no target) | 100k | – | "
            f"{np.mean(st.overlap10):.3f} ({len(st.overlap10)} queries; exact top 10 within the top 50 "
            f"search asks for: {np.mean(st.recall10_in_50):.3f}) | info |"
        )
    if emb is not None and emb.query_ms:
        add(
            f"| query embedding, LocalMiniLM 1 thread, p50 / p95 (no target) | – | – | "
            f"{fmt_ms(pct(emb.query_ms, 0.5))} / {fmt_ms(pct(emb.query_ms, 0.95))} ms (n={len(emb.query_ms)}) | info |"
        )
        add(
            f"| write-side embedding, LocalMiniLM 1 thread, batch 64 (no target) | – | – | "
            f"{emb.throughput:,.0f} entries/s ({emb.texts} texts of {emb.mean_chars:.0f} characters on average) | info |"
        )
    for size in sizes:
        r = find(rows_, size, "apply_changes(10), embedding included")
        if r is not None:
            add(
                f"| `apply_changes` of 10 entries with LocalMiniLM, embedding included (not under the 10 ms "
                f"target) | {size:,} | memory_bot | {fmt_ms(r.median)} ms (p95 {fmt_ms(r.p95)} ms) | info |"
            )
    return lines


def section(stats: dict[int, IndexStats], emb: Embedding | None, corpus: Corpus | None) -> list[str]:
    """The retrieval section of the results: the index per pool and where a search's time goes."""
    if not stats:
        return []
    lines = ["### Retrieval by meaning: the index and where the time goes", ""]
    add = lines.append
    if corpus is not None:
        add(
            f"Vectors: {len(corpus.sentences):,} generated sentences embedded with LocalMiniLM once per run"
            + (f" ({emb.corpus_seconds:.1f} s, {emb.corpus_rate:,.0f}/s)" if emb else "")
            + f"; an entry's text is a run of them, its vector the first one's + {_MIX:g} × another's + "
            f"N(0, {_NOISE:g}²) noise per dimension, normalised, written by `apply_changes` with that embedder "
            f"(sealed by `seal_vector`, keywords by `blind_text`). Queries: {len(corpus.questions)} generated "
            "questions, embedded beforehand (search and context(query) rows exclude the embedding)."
        )
        add("")
    add(
        "Cold load = the first search of the Bot in a process on a fresh index (`VectorIndexes`): "
        "every vector and every entry's blind keywords read under the shared lock, vectors decrypted, "
        "decoded, and above 16,384 vectors projected on 48 principal components, keywords put in BM25 "
        "postings. Memory of the loaded index: `BotIndex.nbytes` (the arrays and postings), `held_bytes` "
        "(what the process's bound on its indexes, `index_memory_mb`, counts: the arrays, 10 bytes a "
        "posting, 180 a row for its id), "
        "tracemalloc (everything allocated by the load and still held: arrays, the id list and id map), "
        "and the process's RSS before/after the first cold load (not used: freed memory stays in the "
        "allocator). Below 16,384 vectors the index ranks exactly over a float32 copy, so the per-100k "
        "figure of a small pool (~2 KB a vector) says nothing about a large one."
    )
    add("")
    add(
        "| pool | vectors | cold first search median (n) | of which Neo4j | decrypt | upsert (decode, PCA) | "
        "nbytes | held_bytes | tracemalloc held (peak) | RSS delta | per 100k (tracemalloc) | overlap@10 | top 10 in top 50 |"
    )
    add("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for size, st in sorted(stats.items()):
        cp = st.cold_profile
        add(
            f"| {size:,} | {st.vectors:,} | {fmt_ms(pct(st.cold_ms, 0.5))} ms ({len(st.cold_ms)}) | "
            f"{fmt_ms(cp.server_ms) if cp else '–'} | {fmt_ms(cp.decrypt_ms) if cp else '–'} | "
            f"{fmt_ms(cp.load_ms) if cp else '–'} | {st.nbytes / 1e6:.1f} MB | {st.held / 1e6:.1f} MB | "
            f"{st.traced / 1e6:.1f} MB ({st.traced_peak / 1e6:.1f}) | {st.rss_delta / 1e6:.1f} MB | "
            f"{st.per_100k_mb(st.traced):.1f} MB | "
            f"{np.mean(st.overlap10) if st.overlap10 else math.nan:.3f} | "
            f"{np.mean(st.recall10_in_50) if st.recall10_in_50 else math.nan:.3f} |"
        )
    add("")
    add(
        "Where a call's time goes (median of a few profiled calls, query embedding excluded): `Neo4j` = the "
        "server's own time of each statement (`result_available_after + result_consumed_after`, whole ms "
        "per statement); `decrypt` = AES-GCM; `top` = `BotIndex.rank` (numpy: nearest vectors, BM25 over "
        "the blind tokens, fusion); `keywords` = `blind_tokens` (stemming, HMAC); `rest` = Bolt round "
        "trips, driver decoding and Python."
    )
    add("")
    add("| pool | operation | reader | statements | tx | total | Neo4j | decrypt | top | keywords | rest |")
    add("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for size, st in sorted(stats.items()):
        for (op, kind), p in st.profiles.items():
            add(
                f"| {size:,} | {op} | {kind} | {p.statements} | {p.transactions} | {fmt_ms(p.total_ms)} | "
                f"{fmt_ms(p.server_ms)} | {fmt_ms(p.decrypt_ms)} | {fmt_ms(p.top_ms)} | "
                f"{fmt_ms(p.keywords_ms)} | {fmt_ms(p.rest_ms)} |"
            )
    add("")
    return lines

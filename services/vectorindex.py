"""A Bot's index in this process: what proposes dense and keyword candidates (design §10, D9.29).

It only proposes: every id it returns is checked by the one visibility check under the shared
lock before anything is ranked or shown (C1, V10), so an id of an entry that was since hidden or
purged costs a lookup and nothing else. What it must never be is incomplete: it records the
last stamp of the Memory's derived-data sequence (``vecSeq``; every write of keywords or vectors
counts it under the exclusive lock and stamps what it wrote, and so does every relabel that
changes an entry's audience key) through which it holds every entry's keywords, audience key and
vector of its embedder (``seq``), and search catches it up from what was stamped after it before
trusting it (no staleness across a memory version, in every API process alike). It proposes only
entries whose audience key (``activeKey``) the reader holds: a necessary condition of VISIBLE.

Vectors are held quantised (int8 with one scale per vector, as stored). A small pool is ranked
exactly against its dequantised vectors. A large one keeps a coarse copy projected on its
principal components: the coarse scores pick a few hundred candidates, which are then ranked
exactly. Keywords are scored by BM25 over the blind tokens (:mod:`services.keywordindex`). The
two lists are fused by reciprocal rank with the prior, in the process: the statement that checks
the candidates then only walks them in that order.
"""

from __future__ import annotations

import asyncio
import math
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Final, NamedTuple, TypeVar

import numpy as np
import numpy.typing as npt

from services import metrics
from services.kept import keep_newest
from services.keywordindex import Among, Places, Postings, best, largest, places

#: Below this many vectors the ranking is exact over dequantised float32 vectors.
EXACT_MAX: Final = 16_384
#: Dimensions of the coarse copy of a large pool.
COARSE_DIMS: Final = 48
#: Candidates of the coarse pass per wanted result (and at least RESCORE_MIN) ranked exactly; for
#: the results past the first RESCORE_DEEP (a deep walk's: a reader who sees few of a large
#: pool's entries), twice as many. A walk of 800 candidates had 6,400 rows rescored: 3.0 ms of
#: ranking at 100k; 1,600 rows: ~1 ms.
RESCORE_FACTOR: Final = 8
RESCORE_MIN: Final = 800
RESCORE_DEEP: Final = 200
#: A reader whose keys hold at most this many rows (and at most AMONG_SHARE of the pool) is ranked
#: among those rows only (their vectors dequantised and kept while the reader searches again);
#: one who holds more, by the whole pool's pass with the other rows left out.
AMONG_MAX: Final = 8_192
AMONG_SHARE: Final = 0.25
#: Readers (sets of keys) of which an index keeps what it made of their keys (rows, masks, a few
#: rows' vectors): readers take turns (the bench's three in one loop: made anew on every call,
#: 1.1 -> 1.8 ms of ranking at 100k for the dense reader), ~1.7 MB each at most at 100k.
KEPT_READERS: Final = 8
#: What a pinned entry adds to its order key in memory order (``graph.memory``'s memoryRank).
PINNED_RANK: Final = 1_125_899_906_842_624
#: What an entry's id and its place in the id map hold (tracemalloc around a cold load of 100k
#: entries: 92.3 MB in all, of which the arrays and postings 74.7 MB).
ROW_BYTES: Final = 180
#: Rows fitted for the principal components; rows projected per step.
_FIT_ROWS: Final = 16_384
_CHUNK: Final = 8_192

F32 = npt.NDArray[np.float32]

#: A coarse scan over at least this many rows is split in two: one half on the scan thread, the
#: other on the caller's (numpy leaves the GIL meanwhile). A thread that waits on a queue, not
#: BLAS's own workers, which spin after each call on the cores Neo4j needs (``index_threads``).
#: At 100k rows: 1.2 -> 0.85 ms.
SPLIT_MIN: Final = 32_768
_SCAN_POOL: Final = ThreadPoolExecutor(max_workers=1, thread_name_prefix="botmemory-scan")


def _split_node(node: str) -> tuple[str, int] | None:
    """A Neo4j 5 node id ``<kind>:<database>:<number>`` as its prefix (with the last colon) and its
    number; None for a node id of another shape."""
    prefix, _, number = node.rpartition(":")
    if not prefix or not number.isdigit():
        return None
    return prefix + ":", int(number)


def rescored(k: int) -> int:
    """How many of the coarse pass's best rows are ranked exactly for the ``k`` nearest."""
    return max(RESCORE_MIN, RESCORE_FACTOR * min(k, RESCORE_DEEP), 2 * k)


def _shares(n: int, rrf_k: float) -> npt.NDArray[np.float64]:
    """What the first ``n`` places of a ranked list add to a fused score (reciprocal rank)."""
    return 1.0 / (rrf_k + 1.0 + np.arange(n, dtype=np.float64))


P = TypeVar("P", float, npt.NDArray[np.float64])


def prior(
    pinned: P, versions: P, newest: float, pinned_prior: float, recency_prior: float, half_life: float
) -> P:
    """The prior of entries (of one, or of an array of them): ``pinned_prior`` for a pinned one
    (``pinned`` 1.0), at most ``recency_prior`` for one of version ``newest``, halved every
    ``half_life`` versions before it."""
    return pinned_prior * pinned + recency_prior / (1.0 + (newest - versions) / half_life)


class Parts(NamedTuple):
    """What a candidate's fused score is made of: its cosine to the query (NaN: no vector of the
    index's embedder), its BM25 score (0: no keyword of the query), pinned, its version."""

    cosine: float
    bm25: float
    pinned: bool
    version: float


@dataclass(frozen=True, slots=True)
class Ranking:
    """:meth:`BotIndex.rank`'s candidates, best first, and their fused scores; for
    :meth:`BotIndex.parts`, their rows, BM25 scores, pinned flags and versions (parallel).
    ``complete``: neither list was cut short, so a deeper ranking would propose nothing more."""

    ids: list[str]
    scores: list[float]
    complete: bool = True
    rows: npt.NDArray[np.int64] = field(default_factory=lambda: np.empty(0, np.int64))
    bm25: npt.NDArray[np.float64] = field(default_factory=lambda: np.empty(0, np.float64))
    pinned: npt.NDArray[np.bool_] = field(default_factory=lambda: np.empty(0, np.bool_))
    versions: npt.NDArray[np.float64] = field(default_factory=lambda: np.empty(0, np.float64))


def fuse_shown(
    shown: Sequence[Parts], *, rrf_k: float, pinned_prior: float, recency_prior: float, half_life: float
) -> list[float]:
    """The scores of entries a search shows, fused as :meth:`BotIndex.rank` fuses but with each
    list's ranks counted among them only: the cosine order of those with a vector and the BM25
    order of those with a keyword, plus the prior, its recency counted from the newest of them.
    :meth:`BotIndex.rank`'s scores count ranks in the whole pool, so each entry the reader cannot
    see above theirs would lower theirs (how many hidden entries match a query, read off a
    score); these count none. (The BM25 order among them rests on idf over the rows of the
    reader's audience keys — :meth:`services.keywordindex.Postings.sums` — and the Bot's mean
    length: of the entries the reader cannot see, only those under a key they hold count, such as
    an observation that also needs a channel they are not in.)"""
    if not shown:
        return []
    newest = max(p.version for p in shown)
    score = [prior(float(p.pinned), p.version, newest, pinned_prior, recency_prior, half_life) for p in shown]
    near = sorted(
        (i for i, p in enumerate(shown) if not math.isnan(p.cosine)), key=lambda i: -shown[i].cosine
    )
    matched = sorted((i for i, p in enumerate(shown) if p.bm25 > 0), key=lambda i: -shown[i].bm25)
    for ranked in (near, matched):
        for place, i in enumerate(ranked):
            score[i] += 1.0 / (rrf_k + 1.0 + place)
    return score


@dataclass(slots=True)
class _KeyRows:
    """What a :class:`BotIndex` made of a reader's keys (kept while that reader searches again and
    the rows do not change): the rows of those keys, which rows they are (a mask over the pool)
    and whether they are few (ranked among themselves) or many (by the whole pool's pass with the
    others left out); made when first needed: for many, the mask as 0 or -inf per row (added to
    the pass's scores, which then never choose another row), and the same for the rows with a
    vector; for few, their vectors dequantised, each row's place among them and their postings."""

    rows: npt.NDArray[np.int64]
    allowed: npt.NDArray[np.bool_]
    few: bool
    vectors: F32 | None = None
    places: Places | None = None
    documents: int | None = None
    among: Among | None = None
    _left_out: F32 | None = None
    _usable: tuple[npt.NDArray[np.bool_], F32] | None = None

    def left_out(self) -> F32:
        """0 for the rows of the keys, -inf for the others."""
        if self._left_out is None:
            self._left_out = np.where(self.allowed, np.float32(0), np.float32(-np.inf))
        return self._left_out

    def usable(self, has_vec: npt.NDArray[np.bool_]) -> tuple[npt.NDArray[np.bool_], F32]:
        """The rows of the keys with a vector (``has_vec``: the pool's), and 0 for those, -inf for
        the others (shared with :meth:`left_out` when every row of the keys has a vector)."""
        if self._usable is None:
            usable = self.allowed & has_vec
            if np.array_equal(usable, self.allowed):
                self._usable = self.allowed, self.left_out()
            else:
                self._usable = usable, np.where(usable, np.float32(0), np.float32(-np.inf))
        return self._usable

    def documents_in(self, keywords: Postings) -> int:
        """How many of :attr:`rows` hold keywords (their idf's documents)."""
        if self.documents is None:
            self.documents = keywords.documents_of(self.rows)
        return self.documents

    def among_in(self, keywords: Postings) -> Among:
        """The postings of :attr:`rows` (BM25 among few rows walks these alone)."""
        if self.among is None:
            self.among = keywords.among(self.rows)
        return self.among

    def places_in(self, capacity: int) -> Places:
        """Each row's place among :attr:`rows` (of ``capacity`` rows)."""
        if self.places is None:
            self.places = places(self.rows, capacity)
        return self.places

    @property
    def nbytes(self) -> int:
        made = [self.vectors, self.places, self._left_out]
        if self._usable is not None and self._usable[0] is not self.allowed:
            made += list(self._usable)
        held = self.rows.nbytes + self.allowed.nbytes + sum(0 if m is None else m.nbytes for m in made)
        return held + (0 if self.among is None else self.among.nbytes)


class BotIndex:
    """What proposes a Bot's candidates in this process: every entry with derived data (blind
    keywords, and a vector of this index's embedder when it has one), with what the prior needs
    (pinned, order key). Not thread-safe; used from the event loop."""

    def __init__(self, model: str) -> None:
        #: The embedder whose vectors it holds ("" for none: keywords only).
        self.model = model
        #: Everything stamped at or before this derived-data sequence is held (-1: none loaded yet).
        self.seq = -1
        #: Serialises loading and catching up.
        self.lock = asyncio.Lock()
        #: Dropped by a load that failed part-way (:meth:`VectorIndexes.discard`): searches that
        #: waited on its lock take the index held now.
        self.discarded = False
        self.keywords = Postings()
        self._ids: list[str] = []
        self._pos: dict[str, int] = {}
        self._q: npt.NDArray[np.int8] = np.empty((0, 0), np.int8)
        self._scale: F32 = np.empty(0, np.float32)
        #: The coarse copy, one row per dimension and a column per entry (a scan reads it as a
        #: matrix–vector product over contiguous rows: faster than a row per entry).
        self._coarse: F32 = np.empty((0, 0), np.float32)
        self._basis: F32 | None = None
        #: How many vectors the principal components were fitted on: fitted again whenever twice
        #: as many are held, up to _FIT_ROWS (vectors that come after their rows — a new
        #: embedder's backfill, 64 at a time — fitted them on the first 64 for good: recall@10
        #: 0.49 instead of 0.71 on 40k uneven vectors).
        self._fitted_on = 0
        self._has_vec = np.zeros(0, np.bool_)
        self._pinned = np.zeros(0, np.bool_)
        self._order = np.zeros(0, np.int64)
        #: Node ids, as the number after ``_node_prefix`` (-1: unknown; ``_odd_nodes`` holds any
        #: of another shape): how the search statement seeks a candidate.
        self._node = np.zeros(0, np.int64)
        self._node_prefix = ""
        self._odd_nodes: dict[int, str] = {}
        #: Rows without a vector of the embedder (left out of the dense ranking).
        self._unembedded = 0
        #: The version of the newest entry held (what the recency prior counts from).
        self._newest = 0.0
        #: Each row's audience key while active (``activeKey``: a code of ``_codes``, -1 for none):
        #: a reader can see an entry only if they hold its key (VISIBLE requires every atom of its
        #: label, the key among them), so only rows of the reader's keys are ranked.
        self._key = np.zeros(0, np.int32)
        self._codes: dict[str, int] = {}
        #: What was made of the keys of the readers who searched last (a reader searches again
        #: with the same keys; readers take turns), the least recently used first.
        self._kept: OrderedDict[tuple[int, ...], _KeyRows] = OrderedDict()

    def __len__(self) -> int:
        return len(self._ids)

    @property
    def nbytes(self) -> int:
        """Memory held by the arrays and postings (ids and the id map not counted)."""
        return self._arrays_nbytes + self.keywords.nbytes

    @property
    def held_bytes(self) -> int:
        """About everything the index holds, counted in constant time (what a process's bound on
        its indexes compares, :class:`VectorIndexes`): the arrays (with what was made of a
        reader's keys), the postings (with what queries made of them) and ~``ROW_BYTES`` a row for
        its id and its place in the id map."""
        arrays = self._arrays_nbytes
        arrays += sum(kept.nbytes for kept in self._kept.values())  # what was made of readers' keys
        return arrays + self.keywords.approx_nbytes + ROW_BYTES * len(self._ids)

    @property
    def _arrays_nbytes(self) -> int:
        rows = (
            self._has_vec.nbytes
            + self._pinned.nbytes
            + self._order.nbytes
            + self._node.nbytes
            + self._key.nbytes
        )
        return self._q.nbytes + self._scale.nbytes + self._coarse.nbytes + rows

    def upsert(
        self,
        ids: list[str],
        nodes: list[str],
        keywords: list[str],
        pinned: list[bool],
        order_keys: list[int],
        keys: list[str],
        vectors: tuple[list[int], npt.NDArray[np.int8], F32] | None,
    ) -> None:
        """Add entries, replacing what is held of ids already held (a revised, re-embedded or
        relabelled entry): their node ids, blind keywords, pinned flags, order keys, audience keys
        while active ("" for none) and, for the positions in ``vectors`` (positions into ``ids``,
        int8 rows, scales), their vectors. An entry without a vector in this update has none
        afterwards."""
        if not ids:
            return
        self._forget_readers()
        rows = self._rows_for(ids)
        codes = self._codes
        self._key[rows] = [-1 if not k else codes.setdefault(k, len(codes)) for k in keys]
        self.keywords.set_many(rows.tolist(), keywords)
        self._set_nodes(rows, nodes)
        self._pinned[rows] = pinned
        self._order[rows] = order_keys
        self._newest = max(self._newest, max(order_keys) / 1_000_000)
        self._has_vec[rows] = False
        if vectors is not None and vectors[0]:
            at, q, scales = vectors
            if self._q.shape[1] == 0:
                self._q = np.zeros((self._has_vec.shape[0], q.shape[1]), np.int8)
                if len(self._ids) <= EXACT_MAX:  # else the principal components' copy (_fit, below)
                    self._coarse = np.zeros((q.shape[1], self._has_vec.shape[0]), np.float32)
            with_vec = rows[np.array(at, np.int64)]
            self._q[with_vec] = q
            self._scale[with_vec] = scales
            self._has_vec[with_vec] = True
            if len(self._ids) > EXACT_MAX and (
                self._basis is None or self._fitted_on < min(_FIT_ROWS, self._vectors() // 2)
            ):
                self._fit()
            else:
                self._coarse[:, with_vec] = self._project(q, scales).T
        self._unembedded = len(self._ids) - self._vectors()

    def rank(
        self,
        vector: F32 | None,
        blind: list[str],
        keys: Sequence[str] | None,
        *,
        dense_k: int,
        keyword_k: int,
        rrf_k: float,
        pinned_prior: float,
        recency_prior: float,
        half_life: float,
    ) -> Ranking:
        """The candidates for a query, best first, with their scores: the ``dense_k`` nearest
        vectors and the ``keyword_k`` best BM25 rows (of the rows whose audience key is one of
        ``keys`` only, when given: a reader's keys) fused by reciprocal rank (``rrf_k``), plus the
        prior (``pinned_prior`` for a pinned entry, at most ``recency_prior`` for the newest,
        halved every ``half_life`` versions); and, for :meth:`parts`, each candidate's row, BM25
        sum, pinned flag and version. Complete when each list held fewer than its ``k``: every
        row of those keys with a vector or a keyword of the query (of its MAX_QUERY_TOKENS rarest,
        ``services.keywordindex``) is among the candidates.

        A reader whose keys hold few rows is ranked among those rows alone (their vectors kept
        dequantised for the next search); one who holds many, by the whole pool's pass with the
        other rows left out."""
        keyed = None if keys is None else self._rows_with(keys)
        if keyed is not None and keyed.rows.size == 0:
            return Ranking([], [])
        few = keyed is not None and keyed.few
        among = keyed.rows if keyed is not None and few else None  # ranked among a reader's few rows
        dense = np.empty(0, np.int64)
        if vector is not None and self._q.shape[1] == vector.shape[0]:
            dense = self._top_rows(vector, dense_k, keyed)
        place = keyed.places_in(self.keywords.capacity) if keyed is not None and few else None
        pool = None if keyed is None or few else (keyed.allowed, keyed.documents_in(self.keywords))
        local = keyed.among_in(self.keywords) if keyed is not None and few else None
        summed = self.keywords.sums(blind, among, pool, local)
        if summed is not None and keyed is not None and not few:  # the others left out
            held_rows = min(summed.shape[0], keyed.allowed.shape[0])
            summed[:held_rows] += keyed.left_out()[:held_rows]  # -inf: never among the best
            summed[keyed.allowed.shape[0] :] = 0.0
        keyword = np.empty(0, np.int64) if summed is None else best(summed, keyword_k, among)[0]
        complete = dense.size < dense_k and keyword.size < keyword_k
        if dense.size + keyword.size == 0:
            return Ranking([], [], complete)
        proposed = np.concatenate([dense, keyword])
        shares = np.concatenate([_shares(dense.size, rrf_k), _shares(keyword.size, rrf_k)])
        found, inverse = np.unique(proposed, return_inverse=True)
        versions = self._order[found] / 1_000_000
        pinned = self._pinned[found]
        score = np.bincount(inverse, weights=shares) + prior(
            pinned.astype(np.float64), versions, self._newest, pinned_prior, recency_prior, half_life
        )
        memory_rank = self._order[found] + pinned.astype(np.int64) * PINNED_RANK
        order = np.lexsort((-memory_rank, -score))
        found = found[order]
        if summed is None:
            bm25 = np.zeros(found.size)
        else:
            bm25 = summed[found] if place is None else summed[place[found]]
        held = self._ids
        return Ranking(
            [held[r] for r in found.tolist()],
            score[order].tolist(),
            complete,
            found,
            bm25,
            pinned[order],
            versions[order],
        )

    def parts(self, ranking: Ranking, n: int, vector: F32 | None) -> list[Parts]:
        """What the first ``n`` candidates of ``ranking`` (made by this index for ``vector``) are
        made of, for :func:`fuse_shown`: asked right after the ranking, while the caches hold it."""
        rows = ranking.rows[:n]
        cosine = np.full(rows.size, np.nan)
        if vector is not None and self._q.shape[1] == vector.shape[0]:
            with_vec = np.flatnonzero(self._has_vec[rows])
            cosine[with_vec] = self._exact(rows[with_vec], vector)
        made = zip(
            cosine.tolist(), ranking.bm25[:n].tolist(), ranking.pinned[:n].tolist(), ranking.versions[:n].tolist(),
            strict=True,
        )  # fmt: skip
        return [Parts(*m) for m in made]

    def nodes_of(self, ids: list[str]) -> list[str]:
        """The node ids of ``ids`` ("" where unknown: the statement then loses the candidate)."""
        rows = [self._pos.get(entry_id, -1) for entry_id in ids]
        numbers: list[int] = self._node[np.array(rows, np.int64)].tolist() if rows else []
        prefix, odd = self._node_prefix, self._odd_nodes
        return [
            prefix + str(number) if row >= 0 and number >= 0 else odd.get(row, "")
            for row, number in zip(rows, numbers, strict=True)
        ]

    def locate(self, ids: list[str], found: list[tuple[str, str]]) -> None:
        """What a lookup by id found for candidates a walk lost: the node ids of those that are
        entries; the others no longer exist (purged), and are never proposed again."""
        located = dict(found)
        held = [i for i in ids if i in self._pos]
        rows = np.array([self._pos[i] for i in held if i in located], np.int64)
        self._set_nodes(rows, [located[i] for i in held if i in located])
        self._drop([self._pos[i] for i in held if i not in located])

    def drop_nodes(self, nodes: list[str]) -> None:
        """Entries purged (D9.20), named by the node ids they had: never proposed again, their
        keywords out of BM25's counts. Rows of other node ids are left as they are."""
        numbers, odd = set[int](), set[str]()
        for node in nodes:
            split = _split_node(node)
            if split is not None and split[0] == self._node_prefix:
                numbers.add(split[1])
            else:
                odd.add(node)
        n = len(self._ids)
        rows = np.flatnonzero(np.isin(self._node[:n], np.fromiter(numbers, np.int64, len(numbers))))
        self._drop(rows.tolist() + [row for row, node in self._odd_nodes.items() if node in odd])

    def _drop(self, rows: list[int]) -> None:
        """Rows of entries that no longer exist: held by id still, with nothing to propose them."""
        if not rows:
            return
        self.keywords.set_many(rows, [""] * len(rows))
        at = np.array(rows, np.int64)
        self._has_vec[at] = False
        self._node[at] = -1
        self._key[at] = -1
        for row in rows:
            self._odd_nodes.pop(row, None)
        self._unembedded = len(self._ids) - self._vectors()
        self._forget_readers()

    def top(self, query: F32, k: int) -> list[str]:
        """The ids of the ``k`` vectors most similar to ``query`` (cosine), best first."""
        return [self._ids[int(r)] for r in self._top_rows(query, k, None)]

    def _top_rows(
        self,
        query: F32,
        k: int,
        keyed: _KeyRows | None = None,
    ) -> npt.NDArray[np.int64]:
        """The rows of the ``k`` vectors most similar to ``query`` (of the rows of the keys
        ``keyed`` was made of, when given: among them when they are few, by the whole pool's pass
        with the others left out when they are many), best first."""
        n = len(self._ids)
        if n == 0 or k <= 0 or self._q.shape[1] == 0:
            return np.empty(0, np.int64)
        if keyed is not None and keyed.few:
            rows = keyed.rows[self._has_vec[keyed.rows]]
            if keyed.vectors is None:
                keyed.vectors = self._q[rows].astype(np.float32) * self._scale[rows, None]
            return self._best(keyed.vectors @ query, rows, k)
        coarse = self._scan(query if self._basis is None else query @ self._basis, n)
        usable: npt.NDArray[np.bool_] | None = None  # the rows that may be ranked, when not all
        if keyed is not None:
            usable, penalty = keyed.usable(self._has_vec[:n])
            coarse += penalty  # -inf for the others: far cheaper than a masked assignment
        elif self._unembedded:
            usable = self._has_vec[:n]
            coarse[~usable] = -np.inf
        if self._basis is None:
            rows = np.arange(n) if usable is None else np.flatnonzero(usable)
            return self._best(coarse[rows], rows, k)
        candidates = largest(coarse, rescored(k))
        if usable is not None:
            candidates = candidates[usable[candidates]]
        return self._best(self._exact(candidates, query), candidates, k)

    def _scan(self, query: F32, n: int) -> F32:
        """The coarse scores of the first ``n`` rows: a large pool's scan split in two, the second
        half on the scan thread while this one does the first."""
        if n < SPLIT_MIN:
            return query @ self._coarse[:, :n]
        out = np.empty(n, np.float32)
        half = n // 2
        other = _SCAN_POOL.submit(np.matmul, query, self._coarse[:, half:n], out=out[half:])
        np.matmul(query, self._coarse[:, :half], out=out[:half])
        other.result()
        return out

    def _set_nodes(self, rows: npt.NDArray[np.int64], nodes: list[str]) -> None:
        """Node ids of Neo4j 5 read ``<kind>:<database>:<number>``: one prefix for the Bot, a number
        per row. A new prefix (another database) makes every other row's number unknown."""
        for row, node in zip(rows.tolist(), nodes, strict=True):
            split = _split_node(node)
            if split is None:
                self._odd_nodes[row] = node
                self._node[row] = -1
                continue
            prefix, number = split
            if prefix != self._node_prefix:
                self._node_prefix = prefix
                self._node[:] = -1
            self._node[row] = number
            self._odd_nodes.pop(row, None)

    def _rows_for(self, ids: list[str]) -> npt.NDArray[np.int64]:
        """The rows of ``ids``, new rows for ids not held yet (the arrays grow to hold them)."""
        rows = np.empty(len(ids), np.int64)
        for i, entry_id in enumerate(ids):
            at = self._pos.get(entry_id)
            if at is None:
                at = self._pos[entry_id] = len(self._ids)
                self._ids.append(entry_id)
            rows[i] = at
        n = len(self._ids)
        if n > self._has_vec.shape[0]:
            self.reserve(max(n, self._has_vec.shape[0] * 5 // 4, 1024))
        return rows

    def reserve(self, size: int) -> None:
        """Room for ``size`` rows (a load of many entries in parts grows the arrays once)."""
        if size > self._has_vec.shape[0]:
            grow = size - self._has_vec.shape[0]
            self._has_vec = np.concatenate([self._has_vec, np.zeros(grow, np.bool_)])
            self._pinned = np.concatenate([self._pinned, np.zeros(grow, np.bool_)])
            self._order = np.concatenate([self._order, np.zeros(grow, np.int64)])
            self._node = np.concatenate([self._node, np.full(grow, -1, np.int64)])
            self._key = np.concatenate([self._key, np.full(grow, -1, np.int32)])
            self._scale = np.concatenate([self._scale, np.zeros(grow, np.float32)])
            if self._q.shape[1]:
                self._q = np.concatenate([self._q, np.zeros((grow, self._q.shape[1]), np.int8)])
                self._coarse = np.concatenate(
                    [self._coarse, np.zeros((self._coarse.shape[0], grow), np.float32)], axis=1
                )

    def _rows_with(self, keys: Sequence[str]) -> _KeyRows:
        """The rows whose audience key is one of ``keys``. A reader searches again with the same
        keys: what was made of them is kept (for the KEPT_READERS readers who searched last) until
        the rows change."""
        codes = tuple(sorted(c for c in (self._codes.get(k) for k in keys) if c is not None))
        kept = self._kept.get(codes)
        if kept is not None:
            self._kept.move_to_end(codes)
            return kept
        n = len(self._ids)
        allowed = np.isin(self._key[:n], codes) if codes else np.zeros(n, np.bool_)
        rows = np.flatnonzero(allowed)
        made = self._kept[codes] = _KeyRows(rows, allowed, rows.size <= min(AMONG_MAX, AMONG_SHARE * n))
        while len(self._kept) > KEPT_READERS:
            self._kept.popitem(last=False)
        return made

    def _forget_readers(self) -> None:
        """The rows changed: what was made of readers' keys goes."""
        self._kept.clear()

    def _vectors(self) -> int:
        """How many rows hold a vector."""
        return int(np.count_nonzero(self._has_vec[: len(self._ids)]))

    def _exact(self, rows: npt.NDArray[np.int64], query: F32) -> F32:
        return (self._q[rows].astype(np.float32) @ query) * self._scale[rows]

    def _best(self, scores: F32, rows: npt.NDArray[np.int64], k: int) -> npt.NDArray[np.int64]:
        keep = largest(scores, k)
        return rows[keep][np.argsort(-scores[keep], kind="stable")]

    def _project(self, q: npt.NDArray[np.int8], scales: F32) -> F32:
        dequantised = q.astype(np.float32) * scales[:, None]
        return dequantised if self._basis is None else dequantised @ self._basis

    def _fit(self) -> None:
        """Principal components of the pool (a sample of it) become the coarse copy's axes."""
        held = np.flatnonzero(self._has_vec[: len(self._ids)])
        sample = np.random.default_rng(0).choice(held, size=min(held.size, _FIT_ROWS), replace=False)
        self._fitted_on = int(sample.size)
        x = self._q[sample].astype(np.float32) * self._scale[sample, None]
        x -= x.mean(axis=0)
        # The leading eigenvectors of the covariance (dims × dims) are the principal axes: far
        # cheaper than an SVD of the sample itself.
        _, axes = np.linalg.eigh(x.T @ x)
        self._basis = np.ascontiguousarray(axes[:, ::-1][:, :COARSE_DIMS].astype(np.float32))
        n = len(self._ids)
        coarse = np.zeros((COARSE_DIMS, self._q.shape[0]), np.float32)
        for start in range(0, n, _CHUNK):
            stop = min(n, start + _CHUNK)
            coarse[:, start:stop] = self._project(self._q[start:stop], self._scale[start:stop]).T
        self._coarse = coarse


#: Sets of reader keys of which a process keeps the share of candidates that passed, the least
#: recently learnt dropped first (each a few hundred bytes).
LEARNT_KEPT: Final = 65_536


@dataclass(slots=True)
class VectorIndexes:
    """The vector indexes of this process, one per (Bot, embedder), and the share of candidates
    that passed the visibility check for each set of reader keys (how far a walk goes, design §10).

    The indexes together hold at most about ``max_bytes`` (None: no bound; the API's is
    ``index_memory_mb``): when one grows past it, the least recently searched others are dropped
    with what was learnt of their Bots, and the next search of such a Bot loads it again (a cold
    load: ~25 ms a thousand entries). Dropping never costs a result: every search catches its
    index up from the graph before trusting it, and an index still in use by a search that
    began before is kept by that search until it ends."""

    max_bytes: int | None = None
    _bots: OrderedDict[tuple[str, str], BotIndex] = field(
        default_factory=OrderedDict[tuple[str, str], BotIndex]
    )
    #: What each index held when it was last accounted for, and their sum.
    _held: dict[tuple[str, str], int] = field(default_factory=dict[tuple[str, str], int])
    _total: int = 0
    _passing: dict[tuple[str, tuple[str, ...]], float] = field(
        default_factory=dict[tuple[str, tuple[str, ...]], float]
    )

    def of(self, bot_id: str, model: str) -> BotIndex:
        """The index of a Bot's vectors of ``model`` (made empty when not held), now the most
        recently used."""
        key = (bot_id, model)
        found = self._bots.get(key)
        if found is None:
            found = self._bots[key] = BotIndex(model)
        else:
            self._bots.move_to_end(key)
        return found

    def held(self) -> list[tuple[str, str]]:
        """The (Bot, embedder) keys of the indexes held, least recently used first."""
        return list(self._bots)

    def account(self, bot_id: str, index: BotIndex) -> None:
        """``index`` (of ``bot_id``) has taken in rows or ranked: counts what it holds now and,
        past ``max_bytes``, drops the least recently used other indexes until the rest fit."""
        key = (bot_id, index.model)
        if self._bots.get(key) is not index:
            return  # dropped meanwhile: whoever still uses it lets it go when done
        size = index.held_bytes
        self._total += size - self._held.get(key, 0)
        self._held[key] = size
        if self.max_bytes is not None and self._total > self.max_bytes:
            for other in [k for k in self._bots if k != key]:  # least recently used first
                self._drop(other)
                if self._total <= self.max_bytes:
                    break
        metrics.SEARCH_INDEX_BYTES.set(self._total)

    def discard(self, bot_id: str, index: BotIndex) -> None:
        """``index`` (of ``bot_id``) is no longer used: a load into it failed part-way, and the
        rows it took in are ones no catch-up would drop (an entry purged before the next load
        stays, proposed and counted by BM25, until a walk loses it). Its reading may still go on
        in a thread, into it alone; the next search makes a new one."""
        index.discarded = True
        key = (bot_id, index.model)
        if self._bots.get(key) is index:
            del self._bots[key]
            self._total -= self._held.pop(key, 0)

    def _drop(self, key: tuple[str, str]) -> None:
        del self._bots[key]
        self._total -= self._held.pop(key, 0)
        metrics.SEARCH_INDEX_EVICTIONS.inc()
        bot_id = key[0]
        if any(k[0] == bot_id for k in self._bots):
            return  # the Bot's index of another embedder is still held: so is what was learnt
        for k in [k for k in self._passing if k[0] == bot_id]:
            del self._passing[k]

    def passing(self, bot_id: str, keys: tuple[str, ...]) -> float:
        """The share of walked candidates that passed for readers with these keys (default 1)."""
        return self._passing.get((bot_id, keys), 1.0)

    def observe_passing(self, bot_id: str, keys: tuple[str, ...], share: float) -> None:
        """A walk's share of candidates that passed, averaged with the earlier ones (the first
        one as it is)."""
        before = self._passing.get((bot_id, keys))
        if before is not None:
            share = 0.5 * before + 0.5 * share
        keep_newest(self._passing, (bot_id, keys), share, LEARNT_KEPT)

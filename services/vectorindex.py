"""The vectors of a Bot's entries in this process: what proposes dense candidates (design §10).

It only proposes: every id it returns is checked by the one visibility check under the shared
lock before anything is ranked or shown (C1, V10), so an id of an entry that was since hidden or
purged costs a lookup and nothing else. What it must never be is incomplete: it records the
last stamp of the Memory's vector sequence through which it holds every vector of its embedder
(``seq``; every write of vectors counts the sequence under the exclusive lock), and search
catches it up from the vectors stamped after it before trusting it (no staleness across a
memory version, in every API process alike).

Vectors are held quantised (int8 with one scale per vector, as stored). A small pool is ranked
exactly against its dequantised vectors. A large one keeps a coarse copy projected on its
principal components: the coarse scores pick a few hundred candidates, which are then ranked
exactly — about half the memory of float32 vectors and a fraction of the arithmetic.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Final

import numpy as np
import numpy.typing as npt

#: Below this many vectors the ranking is exact over dequantised float32 vectors.
EXACT_MAX: Final = 16_384
#: Dimensions of the coarse copy of a large pool.
COARSE_DIMS: Final = 64
#: Candidates of the coarse pass per wanted result (and at least RESCORE_MIN) ranked exactly.
RESCORE_FACTOR: Final = 8
RESCORE_MIN: Final = 400
#: Rows fitted for the principal components; rows projected per step.
_FIT_ROWS: Final = 16_384
_CHUNK: Final = 8_192

F32 = npt.NDArray[np.float32]


class BotVectors:
    """The vectors of one embedder for one Bot. Not thread-safe; used from the event loop."""

    def __init__(self, model: str) -> None:
        self.model = model
        #: Every vector stamped at or before this vector sequence is held (-1: none loaded yet).
        self.seq = -1
        #: Serialises loading and catching up.
        self.lock = asyncio.Lock()
        self._ids: list[str] = []
        self._pos: dict[str, int] = {}
        self._q: npt.NDArray[np.int8] = np.empty((0, 0), np.int8)
        self._scale: F32 = np.empty(0, np.float32)
        self._coarse: F32 = np.empty((0, 0), np.float32)
        self._basis: F32 | None = None

    def __len__(self) -> int:
        return len(self._ids)

    @property
    def nbytes(self) -> int:
        """Memory held by the vectors (the arrays; ids not counted)."""
        return self._q.nbytes + self._scale.nbytes + self._coarse.nbytes

    def upsert(self, ids: list[str], q: npt.NDArray[np.int8], scales: F32) -> None:
        """Add vectors, replacing those of ids already held (a revised or re-embedded entry)."""
        if not ids:
            return
        if self._q.shape[1] == 0:
            dims = q.shape[1]
            self._q = np.empty((0, dims), np.int8)
            self._coarse = np.empty((0, dims), np.float32)
        new_rows: list[int] = []
        rows = np.empty(len(ids), np.int64)
        for i, entry_id in enumerate(ids):
            at = self._pos.get(entry_id)
            if at is None:
                at = len(self._ids)
                self._pos[entry_id] = at
                self._ids.append(entry_id)
                new_rows.append(i)
            rows[i] = at
        n = len(self._ids)
        if n > self._q.shape[0]:
            grow = max(n, self._q.shape[0] * 5 // 4, 1024) - self._q.shape[0]
            self._q = np.concatenate([self._q, np.zeros((grow, self._q.shape[1]), np.int8)])
            self._scale = np.concatenate([self._scale, np.zeros(grow, np.float32)])
            self._coarse = np.concatenate([self._coarse, np.zeros((grow, self._coarse.shape[1]), np.float32)])
        self._q[rows] = q
        self._scale[rows] = scales
        if self._basis is None and n > EXACT_MAX:
            self._fit()
        else:
            self._coarse[rows] = self._project(q, scales)

    def top(self, query: F32, k: int) -> list[str]:
        """The ids of the ``k`` vectors most similar to ``query`` (cosine), best first."""
        n = len(self._ids)
        if n == 0 or k <= 0:
            return []
        coarse = self._coarse[:n] @ (query if self._basis is None else query @ self._basis)
        if self._basis is None:
            return self._best(coarse, np.arange(n), k)
        pick = min(n, max(RESCORE_MIN, RESCORE_FACTOR * k))
        candidates = np.argpartition(-coarse, pick - 1)[:pick]
        return self._best(self._exact(candidates, query), candidates, k)

    def top_among(self, ids: list[str], query: F32, k: int) -> list[str]:
        """``top`` restricted to ``ids`` (ids without a vector are left out)."""
        rows = np.array([p for p in (self._pos.get(i) for i in ids) if p is not None], np.int64)
        if rows.size == 0 or k <= 0:
            return []
        return self._best(self._exact(rows, query), rows, k)

    def _exact(self, rows: npt.NDArray[np.int64], query: F32) -> F32:
        return (self._q[rows].astype(np.float32) @ query) * self._scale[rows]

    def _best(self, scores: F32, rows: npt.NDArray[np.int64], k: int) -> list[str]:
        if scores.size > k:
            keep = np.argpartition(-scores, k - 1)[:k]
            scores, rows = scores[keep], rows[keep]
        order = np.argsort(-scores, kind="stable")
        return [self._ids[int(r)] for r in rows[order]]

    def _project(self, q: npt.NDArray[np.int8], scales: F32) -> F32:
        dequantised = q.astype(np.float32) * scales[:, None]
        return dequantised if self._basis is None else dequantised @ self._basis

    def _fit(self) -> None:
        """Principal components of the pool (a sample of it) become the coarse copy's axes."""
        n = len(self._ids)
        sample = np.random.default_rng(0).choice(n, size=min(n, _FIT_ROWS), replace=False)
        x = self._q[sample].astype(np.float32) * self._scale[sample, None]
        x -= x.mean(axis=0)
        # The leading eigenvectors of the covariance (dims × dims) are the principal axes: far
        # cheaper than an SVD of the sample itself.
        _, axes = np.linalg.eigh(x.T @ x)
        self._basis = np.ascontiguousarray(axes[:, ::-1][:, :COARSE_DIMS].astype(np.float32))
        coarse = np.zeros((self._q.shape[0], COARSE_DIMS), np.float32)
        for start in range(0, n, _CHUNK):
            stop = min(n, start + _CHUNK)
            coarse[start:stop] = self._project(self._q[start:stop], self._scale[start:stop])
        self._coarse = coarse


#: Readers whose visible ids a process keeps (the oldest kept is dropped first).
VISIBLE_KEPT: Final = 1_024


@dataclass(frozen=True, slots=True)
class VisibleIds:
    """The visible active ids of a reader as read at one memory version (the pre-filter's input)."""

    version: int
    ids: list[str]


#: Who a visibility check is for: the Bot, the request's organization and each reader as VISIBLE
#: reads them (id and atoms).
ReaderKey = tuple[str, str, tuple[tuple[str, tuple[str, ...]], ...]]


@dataclass(slots=True)
class VectorIndexes:
    """The vector indexes of this process, one per (Bot, embedder), how sparse each set of
    reader keys has proven (which decides between post- and pre-filtering, design §10), and the
    visible ids of the readers served by the pre-filter, by memory version.

    Visible ids are only a proposal too: a search that uses them still checks every candidate
    under the shared lock, and uses its result only when the memory version it ran at is the one
    the ids were read at (what a reader may see changes only with the memory version, or with
    the reader's atoms, which are part of the key); otherwise it reads them again."""

    _bots: dict[tuple[str, str], BotVectors] = field(default_factory=dict[tuple[str, str], BotVectors])
    _sparse: dict[tuple[str, tuple[str, ...]], bool] = field(
        default_factory=dict[tuple[str, tuple[str, ...]], bool]
    )
    _visible: dict[ReaderKey, VisibleIds] = field(default_factory=dict[ReaderKey, VisibleIds])

    def of(self, bot_id: str, model: str) -> BotVectors:
        found = self._bots.get((bot_id, model))
        if found is None:
            found = self._bots[(bot_id, model)] = BotVectors(model)
        return found

    def sparse(self, bot_id: str, keys: tuple[str, ...]) -> bool:
        """Whether readers with these keys saw few of the Bot's entries last time (default: no)."""
        return self._sparse.get((bot_id, keys), False)

    def observe(self, bot_id: str, keys: tuple[str, ...], sparse: bool) -> None:
        self._sparse[(bot_id, keys)] = sparse

    def visible(self, key: ReaderKey) -> VisibleIds | None:
        """The visible active ids last read for this reader (any memory version), if kept."""
        return self._visible.get(key)

    def keep_visible(self, key: ReaderKey, found: VisibleIds) -> None:
        self._visible.pop(key, None)
        self._visible[key] = found
        while len(self._visible) > VISIBLE_KEPT:
            del self._visible[next(iter(self._visible))]

    def drop_visible(self, key: ReaderKey) -> None:
        self._visible.pop(key, None)

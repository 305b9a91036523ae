"""The coarse pass over a large pool of vectors (design §10): an inverted file.

Spherical k-means centroids of a sample of the pool (in the embedder's own dimensions) split it
into lists; each list holds its rows and their coarse copy — their projections on the pool's leading
principal axes, a row per dimension, contiguous. A query scores the centroids, scans the lists
whose centroids are nearest until a share of the pool is covered, and proposes the rows of the
best coarse scores; :class:`services.vectorindex.BotIndex` then ranks those exactly.

Why: scanning the whole coarse copy reads 19 MB per query at 100k vectors (0.85–1.8 ms with cold
caches); a tenth of it, list by list, ~0.65 ms (1,024 lists: ~1.5 µs per list of call overhead
alone). What it costs: a vector whose list is not probed is not proposed (overlap@10 with exact
cosine 0.96–0.98 by the k-means seed, against 0.99 for the whole scan, on the bench's pool,
whose vectors are mixtures of two sentences' on purpose: hard to cluster; with 512 lists,
0.94–0.96).
"""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt

from services.keywordindex import largest

F32 = npt.NDArray[np.float32]
Rows = npt.NDArray[np.int64]

#: Dimensions of the coarse copy.
COARSE_DIMS: Final = 48
#: Lists, the rows of the sample they are fitted on, and the k-means rounds.
LISTS: Final = 1024
FIT_ROWS: Final = 16_384
FIT_ROUNDS: Final = 6
#: Share of the pool a query scans (at least PROBE_MIN rows).
PROBE_SHARE: Final = 0.1
PROBE_MIN: Final = 4_096
#: Rows placed per step (bounds the temporary arrays).
_CHUNK: Final = 8_192


class InvertedFile:
    """The lists of a pool's vectors, by the row each vector has in its :class:`BotIndex`. Not
    thread-safe."""

    def __init__(self, basis: F32, centroids: F32) -> None:
        #: Principal axes (dims × COARSE_DIMS) and centroids (lists × dims).
        self.basis = basis
        self.centroids = centroids
        lists = centroids.shape[0]
        self._rows: list[Rows] = [np.empty(0, np.int64) for _ in range(lists)]
        self._coarse: list[F32] = [np.empty((basis.shape[1], 0), np.float32) for _ in range(lists)]
        self._len = np.zeros(lists, np.int64)
        #: The list of each row (-1: none).
        self._list_of = np.empty(0, np.int32)

    @classmethod
    def fit(cls, sample: F32, seed: int = 0) -> InvertedFile:
        """Axes and centroids fitted on ``sample`` (dequantised vectors, a row each)."""
        rng = np.random.default_rng(seed)
        if sample.shape[0] > FIT_ROWS:
            sample = sample[rng.choice(sample.shape[0], size=FIT_ROWS, replace=False)]
        centred = sample - sample.mean(axis=0)
        # The leading eigenvectors of the covariance (dims × dims) are the principal axes: far
        # cheaper than an SVD of the sample itself.
        _, axes = np.linalg.eigh(centred.T @ centred)
        basis = np.ascontiguousarray(axes[:, ::-1][:, :COARSE_DIMS].astype(np.float32))
        lists = max(1, min(LISTS, sample.shape[0] // 8))
        centroids = sample[rng.choice(sample.shape[0], size=lists, replace=False)].copy()
        for _ in range(FIT_ROUNDS):
            nearest = _nearest(sample, centroids)
            sums = np.zeros_like(centroids)
            np.add.at(sums, nearest, sample)
            held = np.bincount(nearest, minlength=lists) > 0  # an empty list keeps its centroid
            centroids[held] = _unit(sums[held])
        return cls(basis, np.ascontiguousarray(centroids, np.float32))

    def __len__(self) -> int:
        return int(self._len.sum())

    @property
    def nbytes(self) -> int:
        held = sum(r.nbytes for r in self._rows) + sum(c.nbytes for c in self._coarse)
        return held + self._list_of.nbytes + self.basis.nbytes + self.centroids.nbytes

    def place(self, rows: Rows, vectors: F32) -> None:
        """Put ``rows`` (taken out of their lists first, if in one) in the lists of their nearest
        centroids, with the coarse copy of their ``vectors`` (dequantised, a row each)."""
        self.drop(rows)
        if rows.size == 0:
            return
        if int(rows.max()) >= self._list_of.shape[0]:
            size = max(int(rows.max()) + 1, self._list_of.shape[0] * 5 // 4, 1024)
            grown = np.full(size, -1, np.int32)
            grown[: self._list_of.shape[0]] = self._list_of
            self._list_of = grown
        for start in range(0, rows.size, _CHUNK):
            part, held = rows[start : start + _CHUNK], vectors[start : start + _CHUNK]
            nearest = _nearest(held, self.centroids)
            coarse = (held @ self.basis).T
            order = np.argsort(nearest, kind="stable")
            bounds = np.concatenate([[0], np.cumsum(np.bincount(nearest, minlength=self.centroids.shape[0]))])
            filled: list[int] = np.flatnonzero(np.diff(bounds)).tolist()
            for c in filled:
                at = order[bounds[c] : bounds[c + 1]]
                self._append(c, part[at], coarse[:, at])
            self._list_of[part] = nearest

    def drop(self, rows: Rows) -> None:
        """Take ``rows`` out of their lists (rows in none are left as they are)."""
        rows = rows[rows < self._list_of.shape[0]]
        placed = rows[self._list_of[rows] >= 0]
        if placed.size == 0:
            return
        of = self._list_of[placed]
        touched: list[int] = np.unique(of).tolist()
        for c in touched:
            n = int(self._len[c])
            keep = np.flatnonzero(~np.isin(self._rows[c][:n], placed[of == c]))
            self._rows[c][: keep.size] = self._rows[c][keep]
            self._coarse[c][:, : keep.size] = self._coarse[c][:, keep]
            self._len[c] = keep.size
        self._list_of[placed] = -1

    def candidates(self, query: F32, k: int) -> Rows:
        """The rows of the ``k`` best coarse scores for ``query`` in the lists of the centroids
        nearest to it, scanned until PROBE_SHARE of the rows (at least PROBE_MIN) are covered."""
        total = int(self._len.sum())
        if total == 0:
            return np.empty(0, np.int64)
        nearest = np.argsort(-(self.centroids @ query))
        covered = np.cumsum(self._len[nearest])
        probe = nearest[: int(np.searchsorted(covered, min(total, max(PROBE_MIN, PROBE_SHARE * total)))) + 1]
        coarse_query = query @ self.basis
        probed: list[int] = probe.tolist()
        lengths: list[int] = self._len[probe].tolist()
        lists = [(c, n) for c, n in zip(probed, lengths, strict=True) if n]
        scores = np.concatenate([coarse_query @ self._coarse[c][:, :n] for c, n in lists], dtype=np.float32)
        rows: Rows = np.concatenate([self._rows[c][:n] for c, n in lists])
        return rows[largest(scores, k)]

    def _append(self, c: int, rows: Rows, coarse: F32) -> None:
        n, more = int(self._len[c]), rows.size
        if n + more > self._rows[c].shape[0]:
            size = max(n + more, self._rows[c].shape[0] * 5 // 4 + 16)
            grown_rows = np.empty(size, np.int64)
            grown_rows[:n] = self._rows[c][:n]
            grown = np.empty((coarse.shape[0], size), np.float32)
            grown[:, :n] = self._coarse[c][:, :n]
            self._rows[c], self._coarse[c] = grown_rows, grown
        self._rows[c][n : n + more] = rows
        self._coarse[c][:, n : n + more] = coarse
        self._len[c] = n + more


def _nearest(vectors: F32, centroids: F32) -> npt.NDArray[np.int64]:
    """The centroid of each vector's list: the most similar (cosine: the centroids are unit)."""
    return np.argmax(vectors @ centroids.T, axis=1)


def _unit(x: F32) -> F32:
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)

"""BM25 over a Bot's blind keyword tokens in this process (design §10, D9.29): what proposes
keyword candidates.

An entry's keywords are stored only as blind tokens (``kwBlind``: keyed hashes, never words, E1);
the index holds those tokens, never a word, and scores token equality exactly as BM25 scores
words (Lucene's formula: ``k1`` 1.2, ``b`` 0.75, ``idf = ln(1 + (N - df + 0.5) / (df + 0.5))``).
Rows are the rows of the Bot's :class:`services.vectorindex.BotIndex`; a row's tokens are
replaced when its entry is revised. Scoring walks only the postings of the query's tokens, so a
rare word costs little however large the Bot. Like the vectors, it only proposes: every
candidate passes the one visibility check before anything is shown.
"""

from __future__ import annotations

import math
from array import array
from collections import Counter
from dataclasses import dataclass
from typing import Final, cast

import numpy as np
import numpy.typing as npt

K1: Final = 1.2
B: Final = 0.75
#: Distinct query tokens scored at most: the rarest (fewest postings, the highest idf) of a longer
#: query. Scoring walks every posting of every token, so a query of 2,000 characters (~250 English
#: words, or ~2,000 pairs of Han characters) over a large Bot could walk millions of postings in
#: the event loop (250 common words over the bench's 100k entries: 3.3 ms, 11 ms at first); the
#: common tokens left out add little to any score, as Lucene's common-terms query reasons.
MAX_QUERY_TOKENS: Final = 64

Rows = npt.NDArray[np.int64]
Scores = npt.NDArray[np.float64]
#: Per row, its position in a list of rows (-1: not in it).
Places = npt.NDArray[np.int32]
#: A stored blind token and the space after it: ``k`` and 12 hex digits (``Cipher.blind``).
_CELL: Final = 14
#: The value of each lowercase hex digit's byte (-1 for any other byte).
_HEX: Final = np.full(256, -1, np.int8)
_HEX[np.frombuffer(b"0123456789abcdef", np.uint8)] = np.arange(16, dtype=np.int8)


def places(rows: Rows, size: int) -> Places:
    """Each of ``size`` rows' position in ``rows`` (-1 for a row not in it)."""
    found = np.full(size, -1, np.int32)
    found[rows] = np.arange(rows.shape[0], dtype=np.int32)
    return found


def largest(scores: npt.NDArray[np.float32] | npt.NDArray[np.float64], k: int) -> Rows:
    """The positions of the ``k`` largest of ``scores`` (all of them when there are fewer), in no
    order. On a large array a threshold from a strided sample first keeps a little more than
    ``k`` (one comparison pass instead of a selection over everything); the selection then runs
    on those only."""
    n = int(scores.shape[0])
    if n <= k:
        return np.arange(n, dtype=np.int64)
    step = n // (16 * k)
    if step >= 2:
        sample = scores[::step]
        rank = sample.shape[0] - min(sample.shape[0], 2 * k // step + 2)
        kept = np.flatnonzero(scores >= np.partition(sample, rank)[rank])
        if kept.shape[0] >= k:
            if kept.shape[0] == k:
                return kept
            return kept[np.argpartition(-scores[kept], k - 1)[:k]]
    return np.argpartition(-scores, k - 1)[:k]


def _rarest(counts: dict[str, int]) -> list[str]:
    """The MAX_QUERY_TOKENS of ``counts``' tokens held by the fewest of the reader's rows, ties by
    the token (nothing of what the reader cannot see decides which are kept)."""
    if len(counts) <= MAX_QUERY_TOKENS:
        return list(counts)
    return sorted(counts, key=lambda b: (counts[b], b))[:MAX_QUERY_TOKENS]


def best(summed: Scores, k: int, among: Rows | None = None) -> tuple[Rows, Scores]:
    """The ``k`` rows with the highest BM25 score in :meth:`Postings.sums` (``among``'s rows, when
    it summed by position among them), best first, with their scores; rows that scored nothing
    are left out."""
    if k <= 0:
        return np.empty(0, np.int64), np.empty(0, np.float64)
    at = largest(summed, k)
    scores = summed[at]
    hit = at if among is None else among[at]
    hit, scores = hit[scores > 0], scores[scores > 0]
    order = np.argsort(-scores, kind="stable")
    return hit[order], scores[order]


@dataclass(frozen=True, slots=True)
class Among:
    """The postings of a few rows (a reader's) gathered from the rows' own token lists, by token:
    what BM25 among those rows walks instead of every posting of the query's tokens, which a large
    Bot's common words hold by the ten thousand (a reader who sees 1 % of the bench's 100k
    entries: BotIndex.rank 0.43-0.45 -> 0.35-0.37 ms). 16 bytes a posting, kept with the reader's
    rows; valid while the postings do not change."""

    #: Per posting, sorted: its token, its row's place among the rows, its tf, its row's length.
    tokens: npt.NDArray[np.int32]
    at: npt.NDArray[np.int32]
    tfs: npt.NDArray[np.float32]
    lengths: npt.NDArray[np.float32]
    #: How many of the rows hold tokens (their idf's documents).
    documents: int

    @property
    def nbytes(self) -> int:
        return self.tokens.nbytes + self.at.nbytes + self.tfs.nbytes + self.lengths.nbytes


#: What a distinct token holds beside its postings (measured with tracemalloc: ~305 bytes — its
#: key in the vocabulary, its two arrays' headers and list slots), and an empty Postings (~1.7 KB).
TOKEN_BYTES: Final = 320
EMPTY_BYTES: Final = 2_048


def _idf(documents: int, df: int) -> np.float32:
    """BM25's idf (Lucene's) of a token ``df`` of ``documents`` hold."""
    return np.float32(math.log(1.0 + (documents - df + 0.5) / (df + 0.5)))


class Postings:
    """Per token, the rows that contain it and how often (counted up to 255); per row, its length
    in tokens."""

    def __init__(self) -> None:
        self._vocab: dict[str, int] = {}
        self._rows: list[array[int]] = []
        self._tfs: list[array[int]] = []
        #: Postings of a token as arrays, made when a query first needs them after a change.
        self._arrays: dict[int, tuple[Rows, npt.NDArray[np.float32]]] = {}
        #: Per token, each posting's saturated tf (``tf / (tf + norm)``, the BM25 weight but for
        #: the reader's idf) as of ``_counted`` (documents, tokens): they change with any row added
        #: or taken out, or with the token's postings. Made when a query first needs them (at 100k
        #: entries, ~0.15 of BM25's 0.4 ms).
        self._saturated: dict[int, npt.NDArray[np.float32]] = {}
        #: What ``_arrays`` and ``_saturated`` hold, in bytes.
        self._arrays_bytes = 0
        self._saturated_bytes = 0
        self._counted = (0, 0)
        #: Per row: where its distinct token ids and their counts start in ``_flat_ids`` and
        #: ``_flat_tfs`` and how many there are (to replace them when it is revised), its length.
        self._flat_ids: array[int] = array("i")
        self._flat_tfs: array[int] = array("B")
        self._start = np.zeros(0, np.int64)
        self._count = np.zeros(0, np.int32)
        self._length = np.zeros(0, np.float32)
        self._docs = 0
        self._total = 0

    @property
    def capacity(self) -> int:
        """Rows the postings have room for: every row they hold is below it."""
        return int(self._length.shape[0])

    @property
    def nbytes(self) -> int:
        postings = sum(
            len(r) * r.itemsize + len(t) * t.itemsize for r, t in zip(self._rows, self._tfs, strict=True)
        )
        flat = len(self._flat_ids) * self._flat_ids.itemsize + len(self._flat_tfs) * self._flat_tfs.itemsize
        return postings + flat + self._start.nbytes + self._count.nbytes + self._length.nbytes

    @property
    def approx_nbytes(self) -> int:
        """About what the postings hold, in constant time: each posting twice (in its token's arrays
        and in its row's flat copy), 10 bytes in all; each distinct token its place in the
        vocabulary and its two arrays (``TOKEN_BYTES``: names and CJK pairs make hundreds of
        thousands — 20k rows of 300k tokens held 94 MB where the postings alone counted 8); the
        arrays and saturated tfs made for queries; and ``EMPTY_BYTES`` for the structure itself."""
        flat = len(self._flat_ids)
        rows = self._start.nbytes + self._count.nbytes + self._length.nbytes
        vocabulary = TOKEN_BYTES * len(self._vocab) + EMPTY_BYTES
        return 10 * flat + rows + vocabulary + self._arrays_bytes + self._saturated_bytes

    def set(self, row: int, blind: str) -> None:
        """Row ``row`` holds the blind tokens ``blind`` (space separated; empty: none)."""
        self.set_many([row], [blind])

    def set_many(self, rows: list[int], blinds: list[str]) -> None:
        """Each row holds its blind tokens (the last given for a row named twice). A row whose
        tokens are unchanged is left as it is (a re-embedded entry is stamped again with the same
        keywords); a changed one leaves the postings of its old tokens; then the new ones go in
        together, in a few numpy passes (a cold load of 100k entries: 1.15 s row by row, 0.77 s)."""
        latest = dict(zip(rows, blinds, strict=True))
        if latest and max(latest) >= self._length.shape[0]:
            self._grow(max(latest) + 1)
        fresh: list[tuple[int, str]] = []
        for row, blind in latest.items():
            count = int(self._count[row])
            if count:
                start = int(self._start[row])
                ids, tfs = self._flat_ids[start : start + count], self._flat_tfs[start : start + count]
                held = sorted(zip(ids, tfs, strict=True))
                counts = Counter(blind.split())
                if held == sorted((self._token(t), min(c, 255)) for t, c in counts.items()):
                    continue
                self._remove(row, ids)
            fresh.append((row, blind))
        self._add_fresh(fresh)

    def _add_fresh(self, fresh: list[tuple[int, str]]) -> None:
        """Rows that hold no tokens (now), each named once, into the postings in bulk."""
        lengths, tokens = self._tokens_of([blind for _, blind in fresh])
        if not lengths.sum():
            return
        vocab = len(self._rows)
        row_of = np.repeat(np.fromiter((row for row, _ in fresh), np.int64, len(fresh)), lengths)
        # One key per (row, token): sorted, they group by row, then by token; their counts are tfs.
        keys, counts = np.unique(row_of * vocab + tokens, return_counts=True)
        key_rows, key_tokens = keys // vocab, keys % vocab
        tfs = np.minimum(counts, 255).astype(np.uint8)
        held = np.flatnonzero(lengths)
        held_rows = row_of[np.cumsum(lengths)[held] - 1]  # the rows with tokens, as fresh lists them
        ordered = np.sort(held_rows)  # the order of their blocks among the keys
        per_row = np.bincount(np.searchsorted(ordered, key_rows), minlength=held.size)
        start = len(self._flat_ids)
        self._start[ordered] = start + np.concatenate([[0], np.cumsum(per_row)[:-1]])
        self._count[ordered] = per_row
        self._length[held_rows] = lengths[held]
        self._flat_ids.frombytes(key_tokens.astype(np.int32).tobytes())
        self._flat_tfs.frombytes(tfs.tobytes())
        self._docs += int(held.size)
        self._total += int(lengths.sum())
        # Per token, its new rows in row order.
        by_token = np.argsort(key_tokens, kind="stable")
        sorted_tokens = key_tokens[by_token]
        edges = np.flatnonzero(np.diff(sorted_tokens)) + 1
        for part in np.split(by_token, edges):
            t = int(key_tokens[part[0]])
            self._rows[t].frombytes(key_rows[part].astype(np.int32).tobytes())
            self._tfs[t].frombytes(tfs[part].tobytes())
            self._changed(t)

    def documents_of(self, rows: Rows) -> int:
        """How many of ``rows`` hold tokens (a reader's documents, for their idf)."""
        held = rows[rows < self._length.shape[0]]
        return int(np.count_nonzero(self._length[held] > 0))

    def among(self, rows: Rows) -> Among:
        """The postings of ``rows`` (:class:`Among`), gathered from each row's token list."""
        counts = np.zeros(rows.shape[0], np.int64)
        starts = np.zeros(rows.shape[0], np.int64)
        held = rows < self._length.shape[0]
        counts[held] = self._count[rows[held]]
        starts[held] = self._start[rows[held]]
        total = int(counts.sum())
        documents = int(np.count_nonzero(counts))
        if total == 0:
            empty = np.empty(0, np.float32)
            return Among(np.empty(0, np.int32), np.empty(0, np.int32), empty, empty, documents)
        at = np.repeat(np.arange(rows.shape[0], dtype=np.int32), counts)
        flat = np.repeat(starts - (np.cumsum(counts) - counts), counts) + np.arange(total, dtype=np.int64)
        tokens = np.frombuffer(self._flat_ids, np.int32)[flat]
        order = np.argsort(tokens, kind="stable")
        tfs = np.frombuffer(self._flat_tfs, np.uint8)[flat].astype(np.float32)
        lengths = self._length[rows[at]]
        return Among(tokens[order], at[order], tfs[order], lengths[order], documents)

    def sums(
        self,
        blind: list[str],
        among: Rows | None = None,
        pool: tuple[npt.NDArray[np.bool_], int] | None = None,
        local: Among | None = None,
    ) -> Scores | None:
        """The BM25 score of every row for the query's distinct blind tokens (the MAX_QUERY_TOKENS
        rarest of a longer query), by row; with ``among``, of its rows only, by position in it
        (None: no row has any of them). Among a few rows, only their own postings are walked
        (``local``: :meth:`among` of those rows, which the caller keeps; made here otherwise).

        A token's idf counts the documents of the reader's rows only — ``among``'s, or those of
        ``pool`` (a mask by row, and how many of its rows hold tokens) — never the Bot's: counted
        over every entry, a reader who wrote entries holding chosen words could read off the order
        of their own results how many entries they cannot see hold a word (one query per guess).
        So does the choice of a long query's rarest tokens, ties broken by the token itself: chosen
        by the Bot's counts, a token held only by entries the reader cannot see displaced one of
        theirs, and their scores told that some entry holds it. The length normalisation keeps
        the Bot's mean length (one number over the whole Bot)."""
        ids = {b: t for b in dict.fromkeys(blind) if (t := self._vocab.get(b)) is not None}
        if not ids or self._docs == 0:
            return None
        if self._counted != (self._docs, self._total):
            self._saturated.clear()
            self._saturated_bytes = 0
            self._counted = (self._docs, self._total)
        if among is not None:
            local = self.among(among) if local is None else local
            found = {b: np.searchsorted(local.tokens, (t, t + 1)) for b, t in ids.items()}
            spans = {b: (int(lo), int(hi)) for b, (lo, hi) in found.items()}
            held = {b: hi - lo for b, (lo, hi) in spans.items() if hi > lo}
            return self._sums_among([spans[b] for b in _rarest(held)], local, among.shape[0])
        documents = self._docs if pool is None else pool[1]
        mask = None
        if pool is not None:  # as long as the postings' rows reach: one gather a token, no bounds
            mask = pool[0][: self.capacity]
            if mask.shape[0] < self.capacity:
                mask = np.concatenate([mask, np.zeros(self.capacity - mask.shape[0], np.bool_)])
        counts: dict[str, int] = {}
        for b, token in ids.items():
            rows, _ = self._postings(token)
            df = rows.size if mask is None else int(np.count_nonzero(mask[rows]))
            if df:
                counts[b] = df
        rows_parts: list[Rows] = []
        weights: list[npt.NDArray[np.float32]] = []
        for b in _rarest(counts):
            token = ids[b]
            rows, tf = self._postings(token)
            saturated = self._saturated.get(token)
            if saturated is None:
                saturated = self._saturated[token] = self._saturation(tf, self._length[rows])
                self._saturated_bytes += saturated.nbytes
            rows_parts.append(rows)
            weights.append(saturated * _idf(documents, counts[b]))
        if not rows_parts:
            return None
        # With weights, bincount sums in float64 (its stubs say intp).
        return cast(
            Scores,
            np.bincount(np.concatenate(rows_parts), weights=np.concatenate(weights), minlength=self.capacity),
        )

    def _sums_among(self, spans: list[tuple[int, int]], local: Among, size: int) -> Scores | None:
        """:meth:`sums` over the postings of a few rows only (``local``, each token's ``spans`` of
        them), by place among them."""
        summed = np.zeros(size, np.float64)
        found = False
        for lo, hi in spans:
            saturated = self._saturation(local.tfs[lo:hi], local.lengths[lo:hi])
            summed[local.at[lo:hi]] += saturated * _idf(local.documents, hi - lo)
            found = True
        return summed if found else None

    def _saturation(
        self, tf: npt.NDArray[np.float32], lengths: npt.NDArray[np.float32]
    ) -> npt.NDArray[np.float32]:
        """Each posting's saturated tf (its BM25 weight but for the idf), against the Bot's mean
        length."""
        norm = K1 * (1.0 - B + B * lengths / (self._total / self._docs))
        return (tf / (tf + norm)).astype(np.float32)

    def _tokens_of(self, blinds: list[str]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Per text its number of tokens, and the ids of all its tokens, text after text (new
        tokens join the vocabulary). Stored keywords are ``k`` and 12 hex digits each, one space
        apart: read as such, in a few numpy passes over all the texts at once, when every text has
        that shape (the bench's 100k entries, 1.4M tokens: ~0.55 s split and looked up one by one,
        0.16 s); any other text, one token at a time."""
        lengths = np.fromiter(((len(b) + 1) // _CELL for b in blinds), np.int64, len(blinds))
        shaped = all(len(b) % _CELL == _CELL - 1 for b in blinds if b)
        held = [b for b in blinds if b]
        if shaped and held:
            cells = np.frombuffer((" ".join(held) + " ").encode("ascii", "replace"), np.uint8).reshape(
                -1, _CELL
            )
            digits = _HEX[cells[:, 1:-1]]
            if (cells[:, 0] == ord("k")).all() and (cells[:, -1] == ord(" ")).all() and (digits >= 0).all():
                number = np.zeros(cells.shape[0], np.int64)
                for column in range(_CELL - 2):
                    number = (number << 4) | digits[:, column]
                distinct, inverse = np.unique(number, return_inverse=True)
                ids = np.fromiter(
                    (self._token(f"k{d:012x}") for d in distinct.tolist()), np.int64, distinct.size
                )
                return lengths, ids[inverse]
        split = [blind.split() for blind in blinds]
        lengths = np.fromiter(map(len, split), np.int64, len(split))
        token = self._token
        return lengths, np.fromiter(
            (token(t) for words in split for t in words), np.int64, int(lengths.sum())
        )

    def _token(self, blind: str) -> int:
        found = self._vocab.get(blind)
        if found is None:
            found = self._vocab[blind] = len(self._rows)
            self._rows.append(array("i"))
            self._tfs.append(array("B"))
        return found

    def _changed(self, token: int) -> None:
        """The token's postings changed: what was made of them for queries goes."""
        arrays = self._arrays.pop(token, None)
        if arrays is not None:
            self._arrays_bytes -= arrays[0].nbytes + arrays[1].nbytes
        saturated = self._saturated.pop(token, None)
        if saturated is not None:
            self._saturated_bytes -= saturated.nbytes

    def _postings(self, token: int) -> tuple[Rows, npt.NDArray[np.float32]]:
        found = self._arrays.get(token)
        if found is None:
            rows = np.array(self._rows[token], np.int64)
            tfs = np.array(self._tfs[token], np.float32)
            found = self._arrays[token] = (rows, tfs)
            self._arrays_bytes += rows.nbytes + tfs.nbytes
        return found

    def _grow(self, rows: int) -> None:
        size = max(rows, self._length.shape[0] * 5 // 4, 1024)
        for name, dtype in (("_start", np.int64), ("_count", np.int32), ("_length", np.float32)):
            old = getattr(self, name)
            grown = np.zeros(size, dtype)
            grown[: old.shape[0]] = old
            setattr(self, name, grown)

    def _remove(self, row: int, tokens: array[int]) -> None:
        """Take ``row`` out of the postings of ``tokens`` (a revised entry: rare)."""
        for token in tokens:
            keep = [i for i, r in enumerate(self._rows[token]) if r != row]
            self._rows[token] = array("i", (self._rows[token][i] for i in keep))
            self._tfs[token] = array("B", (self._tfs[token][i] for i in keep))
            self._changed(token)
        self._count[row] = 0
        self._docs -= 1
        self._total -= int(self._length[row])
        self._length[row] = 0

"""The Bot's index in a process (services/vectorindex.py, services/keywordindex.py; design §10,
D9.29) against independent reference computations: BM25 over blind tokens, the selection of the
largest scores, the nearest vectors and the fused ranking with its prior."""

from __future__ import annotations

import math
import random
import tracemalloc
from collections import Counter
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from services import search, vectorindex
from services.keywordindex import (
    K1,
    MAX_QUERY_TOKENS,
    Among,
    B,
    Postings,
    Rows,
    Scores,
    best,
    largest,
)
from services.runtime import LineLengths
from services.vectorindex import (
    EXACT_MAX,
    PINNED_RANK,
    ROW_BYTES,
    SPLIT_MIN,
    BotIndex,
    Parts,
    VectorIndexes,
    fuse_shown,
)

TOKENS = [f"k{i:012x}" for i in range(12)]
docs_st = st.lists(st.lists(st.sampled_from(TOKENS), max_size=8), min_size=1, max_size=40)
query_st = st.lists(st.sampled_from(TOKENS), min_size=1, max_size=4)


def reference_bm25(
    docs: dict[int, list[str]], query: list[str], reader: set[int] | None = None
) -> dict[int, float]:
    """BM25 (Lucene's idf, k1 1.2, b 0.75) written out plainly over the documents that have tokens;
    with ``reader``, of those rows only, their idf counting only their documents (the mean length
    is every document's)."""
    held = {row: words for row, words in docs.items() if words}
    if not held:
        return {}
    average = sum(len(w) for w in held.values()) / len(held)
    if reader is not None:
        held = {row: words for row, words in held.items() if row in reader}
    scores: dict[int, float] = {}
    for token in dict.fromkeys(query):
        df = sum(1 for words in held.values() if token in words)
        if df == 0:
            continue
        idf = math.log(1 + (len(held) - df + 0.5) / (df + 0.5))
        for row, words in held.items():
            tf = Counter(words)[token]
            if tf:
                norm = K1 * (1 - B + B * len(words) / average)
                scores[row] = scores.get(row, 0.0) + idf * tf / (tf + norm)
    return scores


def top(
    postings: Postings, query: list[str], k: int, among: Rows | None = None, local: Among | None = None
) -> tuple[Rows, Scores]:
    """The ``k`` best rows for ``query`` as a ranking chooses its keyword candidates."""
    summed = postings.sums(query, among, local=local)
    return (np.empty(0, np.int64), np.empty(0, np.float64)) if summed is None else best(summed, k, among)


def blind(words: list[str]) -> str:
    return " ".join(words)


@settings(max_examples=150, deadline=None)
@given(
    docs=docs_st, revised=docs_st, query=query_st, k=st.integers(1, 10), bulk=st.booleans(), data=st.data()
)
def test_postings_rank_as_reference_bm25(
    docs: list[list[str]],
    revised: list[list[str]],
    query: list[str],
    k: int,
    bulk: bool,
    data: st.DataObject,
) -> None:
    """Built row by row or in bulk (in two batches, the second touching rows of the first), then
    revised row by row: BM25 as the reference computes it."""
    postings = Postings()
    held = dict(enumerate(docs))
    if bulk:
        cut = data.draw(st.integers(0, len(docs)))
        postings.set_many(list(range(cut)), [blind(w) for w in docs[:cut]])
        again = data.draw(st.lists(st.integers(0, len(docs) - 1), max_size=5))
        rows = list(range(cut, len(docs))) + again
        postings.set_many(rows, [blind(held[r]) for r in rows])
    else:
        for row, words in held.items():
            postings.set(row, blind(words))
    top(postings, query, k)  # weights kept from here must not outlive the revisions
    # Some rows are revised (their old tokens must stop counting), some twice with the same text.
    for row, words in enumerate(revised[: len(docs)]):
        postings.set(row, blind(words))
        postings.set(row, blind(words))
        held[row] = words
    expected = reference_bm25(held, query)
    assert_best(top(postings, query, k), expected, k)
    # Among some rows: the same scores, summed over those rows' postings only (gathered here, or
    # kept by the caller).
    among = np.array(sorted(data.draw(st.sets(st.sampled_from(sorted(held))))), np.int64)
    within = reference_bm25(held, query, set(among.tolist()))
    for local in (None, postings.among(among)):
        assert_best(top(postings, query, k, among, local), within, k)
    # Every row's sum (by row; among some rows, by position among them): what a ranking reads
    # its candidates' BM25 scores from.
    summed = postings.sums(query)
    if summed is not None:
        assert summed[: len(docs)].tolist() == pytest.approx([expected.get(r, 0.0) for r in range(len(docs))])
        within_sums = postings.sums(query, among)  # None: none of those rows holds a query token
        assert within_sums is not None or not within
        if within_sums is not None:
            assert within_sums.tolist() == pytest.approx([within.get(r, 0.0) for r in among.tolist()])
        # The same rows as a reader's mask over the pool: their scores by row, nobody else's —
        # over every posting of the query's tokens, the same to the bit as over those rows' own.
        mask = np.zeros(postings.capacity, np.bool_)
        mask[among] = True
        pooled = postings.sums(query, pool=(mask, postings.documents_of(among)))
        if pooled is None:
            assert not within
        else:
            assert pooled[among].tolist() == pytest.approx([within.get(r, 0.0) for r in among.tolist()])
            assert within_sums is not None and np.array_equal(pooled[among], within_sums)
    else:
        assert not expected


def assert_best(
    found: tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]], expected: dict[int, float], k: int
) -> None:
    """``found`` holds the ``k`` best of ``expected`` (row: score), best first, with their scores."""
    rows, scores = found
    assert list(scores) == sorted(scores, reverse=True)
    assert len(rows) == min(k, len(expected))
    for row, score in zip(rows.tolist(), scores.tolist(), strict=True):
        assert math.isclose(score, expected[row], rel_tol=1e-5)
    if len(expected) > len(rows) and len(rows):
        # Nothing left out scores above the last one taken.
        assert max(v for r, v in expected.items() if r not in set(rows.tolist())) <= scores[-1] + 1e-6


#: Tokens not of the stored shape (``k`` and 12 lowercase hex digits): read one by one.
ODD_TOKENS = ["k00000000000G", "kabc", "alpha", "K000000000001", "k0000000000012"]


@settings(max_examples=150, deadline=None)
@given(
    batches=st.lists(
        st.lists(st.lists(st.sampled_from(TOKENS[:6] + ODD_TOKENS), max_size=6), max_size=12),
        min_size=1,
        max_size=3,
    ),
    query=st.lists(st.sampled_from(TOKENS[:6] + ODD_TOKENS), min_size=1, max_size=4),
)
def test_postings_read_texts_of_any_token_shape_alike(
    batches: list[list[list[str]]], query: list[str]
) -> None:
    """Batches of texts, each read in bulk as stored tokens when every text has their shape and
    one token at a time otherwise (a batch with an odd token), into one vocabulary: BM25 as the
    reference computes it."""
    postings = Postings()
    held: dict[int, list[str]] = {}
    for batch in batches:
        rows = list(range(len(held), len(held) + len(batch)))
        postings.set_many(rows, [blind(w) for w in batch])
        held.update(zip(rows, batch, strict=True))
    expected = reference_bm25(held, query)
    summed = postings.sums(query)
    if summed is None:
        assert not expected
    else:
        assert summed[: len(held)].tolist() == pytest.approx([expected.get(r, 0.0) for r in range(len(held))])


def test_a_revision_that_keeps_the_counts_still_changes_the_scores() -> None:
    """A row revised to tokens of the same number leaves the counts of rows and tokens as they
    were: the weights kept for its tokens must go all the same."""
    postings = Postings()
    docs = {0: [TOKENS[0], TOKENS[1]], 1: [TOKENS[1], TOKENS[2]], 2: [TOKENS[2]]}
    postings.set_many(list(docs), [blind(w) for w in docs.values()])
    top(postings, [TOKENS[1]], 5)
    docs[0] = [TOKENS[1], TOKENS[1]]  # k1 twice: row 0 now outscores row 1
    postings.set(0, blind(docs[0]))
    rows, scores = top(postings, [TOKENS[1]], 5)
    expected = reference_bm25(docs, [TOKENS[1]])
    assert rows.tolist() == [0, 1]
    assert all(
        math.isclose(v, expected[r], rel_tol=1e-5)
        for r, v in zip(rows.tolist(), scores.tolist(), strict=True)
    )


def test_a_rare_word_is_found_among_many_common_ones() -> None:
    postings = Postings()
    for row in range(5_000):
        postings.set(row, blind([TOKENS[0], TOKENS[1]] * 3))
    postings.set(5_000, blind([TOKENS[1], TOKENS[2]]))
    rows, _ = top(postings, [TOKENS[0], TOKENS[2]], 10)
    assert rows[0] == 5_000


def test_a_long_query_is_scored_by_its_rarest_tokens() -> None:
    """A query of more than MAX_QUERY_TOKENS distinct tokens is scored by the rarest of them, as
    the reference scores those alone; the rare word it ends with still finds its row first."""
    postings = Postings()
    common = [f"k{i:012x}" for i in range(100, 100 + MAX_QUERY_TOKENS + 36)]
    docs = {row: [common[row % len(common)]] * (1 + row % 3) for row in range(3_000)}
    docs[3_000] = ["kfeed00000000", common[0]]
    postings.set_many(list(docs), [blind(w) for w in docs.values()])
    query = [*common, "kfeed00000000"]
    df = Counter(t for words in docs.values() for t in set(words))
    rarest = sorted(dict.fromkeys(query), key=lambda t: df[t])[:MAX_QUERY_TOKENS]
    assert len(dict.fromkeys(query)) > MAX_QUERY_TOKENS > len(set(rarest) & set(common))
    summed = postings.sums(query)
    assert summed is not None
    expected = reference_bm25(docs, rarest)
    assert summed[:3_001].tolist() == pytest.approx([expected.get(r, 0.0) for r in range(3_001)])
    assert top(postings, query, 1)[0].tolist() == [3_000]


def test_which_tokens_of_a_long_query_count_tells_nothing_of_hidden_rows() -> None:
    """A long query is scored by its rarest MAX_QUERY_TOKENS tokens. Chosen by the Bot's counts, a
    token held only by rows the reader cannot see (one word the reader guessed) displaced one of
    the reader's own words, and the reader's scores told that some entry holds the guess. Chosen
    by the reader's rows, the guess changes nothing, among few rows or many."""
    postings = Postings()
    own = [f"k{i:012x}" for i in range(1, MAX_QUERY_TOKENS + 1)]  # the last one in three rows
    docs = {row: [own[row]] for row in range(MAX_QUERY_TOKENS - 1)}
    docs |= {MAX_QUERY_TOKENS - 1 + n: [own[-1]] for n in range(3)}
    guess, hidden_row = "kbad000000000", MAX_QUERY_TOKENS + 10
    docs[hidden_row] = [guess]
    postings.set_many(list(docs), [blind(w) for w in docs.values()])
    mine = np.array(sorted(r for r in docs if r != hidden_row), np.int64)
    mask = np.zeros(postings.capacity, np.bool_)
    mask[mine] = True
    pool = (mask, postings.documents_of(mine))
    # Many rows (a mask over the pool) and few (by place among them): the guess changes nothing,
    # and the word of three rows, which the guess displaced, counts.
    control, guessed = postings.sums(own, pool=pool), postings.sums([*own, guess], pool=pool)
    assert control is not None and guessed is not None
    assert guessed.tolist() == control.tolist() and float(control[mine[-1]]) > 0
    control, guessed = postings.sums(own, mine), postings.sums([*own, guess], mine)
    assert control is not None and guessed is not None
    assert guessed.tolist() == control.tolist() and float(control[mine.shape[0] - 1]) > 0


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(st.floats(-1e6, 1e6, allow_nan=False, width=32), min_size=1, max_size=3_000),
    k=st.integers(1, 60),
)
def test_largest_is_the_k_largest(values: list[float], k: int) -> None:
    scores = np.array(values, np.float32)
    picked = largest(scores, k)
    assert len(set(picked.tolist())) == len(picked) == min(k, len(values))
    assert sorted(scores[picked].tolist()) == sorted(values)[-min(k, len(values)) :]


def test_largest_on_a_large_array_uses_the_sample_and_stays_exact() -> None:
    rng = np.random.default_rng(7)
    for k in (1, 10, 50, 400):
        scores = rng.standard_normal(100_000).astype(np.float32)
        scores[rng.integers(0, 100_000, 200)] = 5.0  # ties at the top
        picked = largest(scores, k)
        assert sorted(scores[picked].tolist()) == sorted(scores.tolist())[-k:]


def unit(rng: np.random.Generator, n: int, dims: int) -> npt.NDArray[np.float32]:
    v = rng.standard_normal((n, dims)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def quantise(v: npt.NDArray[np.float32]) -> tuple[npt.NDArray[np.int8], npt.NDArray[np.float32]]:
    scales: npt.NDArray[np.float32] = (np.abs(v).max(axis=1) / 127).astype(np.float32)
    q: npt.NDArray[np.int8] = np.round(v / scales[:, None]).astype(np.int8)
    return q, scales


def ranked(index: BotIndex, *args: Any, **kwargs: Any) -> tuple[list[str], list[float]]:
    """``index.rank``'s candidates and their scores."""
    ranking = index.rank(*args, **kwargs)
    return ranking.ids, ranking.scores


def test_rank_fuses_by_reciprocal_rank_with_the_prior() -> None:
    rng = np.random.default_rng(3)
    n, dims = 300, 16
    vectors = unit(rng, n, dims)
    q, scales = quantise(vectors)
    ids = [f"e{i}" for i in range(n)]
    # Every entry a different length: no two BM25 scores tie, so the reference's order is the one.
    words = [
        [TOKENS[3] if i % 4 == 0 else TOKENS[5], TOKENS[(i * 5) % 11]] + [TOKENS[10]] * i for i in range(n)
    ]
    pinned = [i % 13 == 0 for i in range(n)]
    orders = [(i + 1) * 1_000_000 + 1 for i in range(n)]
    embedded = [i for i in range(n) if i % 10 != 3]  # some entries have no vector yet
    index = BotIndex("m")
    # Audience keys: a third of the entries are person:a's, one in 15 person:b's (few: ranked
    # among their rows alone), the rest channel:c's; one has none (inactive).
    keys = ["person:a" if i % 3 == 0 else "person:b" if i % 15 == 1 else "channel:c" for i in range(n)]
    keys[6] = ""
    index.upsert(
        ids,
        [f"4:db:{i}" for i in range(n)],
        [blind(w) for w in words],
        pinned,
        orders,
        keys,
        (embedded, q[embedded], scales[embedded]),
    )
    query = unit(rng, 1, dims)[0]
    got, scores = ranked(
        index,
        query,
        [TOKENS[3]],
        None,
        dense_k=20,
        keyword_k=15,
        rrf_k=60.0,
        pinned_prior=0.01,
        recency_prior=0.005,
        half_life=100.0,
    )
    # The reference: exact cosine over the dequantised vectors of embedded entries, BM25 of the
    # keyword, reciprocal ranks summed, the prior added, best first.
    exact = (q.astype(np.float32) * scales[:, None]) @ query
    dense = sorted(embedded, key=lambda i: -exact[i])[:20]
    bm25 = reference_bm25(dict(enumerate(words)), [TOKENS[3]])
    keyword = sorted(bm25, key=lambda i: -bm25[i])[:15]
    newest = n
    expected: dict[int, float] = {}
    for place, i in enumerate(dense):
        expected[i] = expected.get(i, 0.0) + 1 / (60 + place + 1)
    for place, i in enumerate(keyword):
        expected[i] = expected.get(i, 0.0) + 1 / (60 + place + 1)
    for i in expected:
        expected[i] += 0.01 * pinned[i] + 0.005 / (1 + (newest - orders[i] / 1e6) / 100.0)
    assert set(got) == {ids[i] for i in expected}
    for entry_id, score in zip(got, scores, strict=True):
        assert math.isclose(score, expected[int(entry_id[1:])], rel_tol=1e-6)
    assert scores == sorted(scores, reverse=True)
    assert not any(int(e[1:]) % 10 == 3 for e in got if int(e[1:]) in dense)
    # A reader's keys: the same fusion over the entries of those keys only, and nothing else
    # proposed — among their rows alone (person:b, few) or by the whole pool's pass with the
    # others left out (person:a, a third). Asked again with the same keys, the readers taking turns
    # (their rows, vectors and places kept), then after a new entry (what was kept goes), the
    # answer is the reference's.

    def among_reference(rows: list[int]) -> dict[int, float]:
        shares: dict[int, float] = {}
        near = sorted((i for i in rows if i in set(embedded)), key=lambda i: -exact[i])[:20]
        hits = reference_bm25(dict(enumerate(words)), [TOKENS[3]])
        best = sorted((i for i in rows if i in hits), key=lambda i: -hits[i])[:15]
        for ranked in (near, best):
            for place, i in enumerate(ranked):
                shares[i] = shares.get(i, 0.0) + 1 / (60 + place + 1)
        return {
            i: v + 0.01 * pinned[i] + 0.005 / (1 + (newest - orders[i] / 1e6) / 100.0)
            for i, v in shares.items()
        }

    for _ in range(2):  # readers take turns: the second time from what was kept of their keys
        for asked in (["person:a"], ["person:b"], ["person:b", "person:a", "channel:none"], ["channel:none"]):
            got_among, among_scores = ranked(
                index, query, [TOKENS[3]], asked, dense_k=20, keyword_k=15, rrf_k=60.0,
                pinned_prior=0.01, recency_prior=0.005, half_life=100.0,
            )  # fmt: skip
            reference = among_reference([i for i in range(n) if keys[i] in asked])
            assert set(got_among) == {ids[i] for i in reference}
            for entry_id, score in zip(got_among, among_scores, strict=True):
                assert math.isclose(score, reference[int(entry_id[1:])], rel_tol=1e-6)
    # What search shows: the same fusion with the ranks counted among the shown only, and the
    # recency from the newest of them, from what the ranking says each candidate is made of.
    everything = index.rank(
        query, [TOKENS[3]], None, dense_k=n, keyword_k=n, rrf_k=60.0,
        pinned_prior=0.01, recency_prior=0.005, half_life=100.0,
    )  # fmt: skip
    made = dict(zip(everything.ids, index.parts(everything, len(everything.ids), query), strict=True))
    assert all(math.isnan(made[ids[i]].cosine) for i in range(n) if i not in embedded and ids[i] in made)
    shown = [8, 5, 17, 40, 100, 12]  # 8, 40, 100 and 12 have the keyword
    hits = reference_bm25(dict(enumerate(words)), [TOKENS[3]])
    near = sorted((i for i in shown if i in set(embedded)), key=lambda i: -exact[i])
    best = sorted((i for i in shown if i in hits), key=lambda i: -hits[i])
    top = max(orders[i] for i in shown) / 1e6
    expected_shown = [
        (1 / (60 + near.index(i) + 1) if i in near else 0.0)
        + (1 / (60 + best.index(i) + 1) if i in best else 0.0)
        + 0.01 * pinned[i]
        + 0.005 / (1 + (top - orders[i] / 1e6) / 100.0)
        for i in shown
    ]
    got_shown = fuse_shown(
        [made[ids[i]] for i in shown], rrf_k=60.0, pinned_prior=0.01, recency_prior=0.005, half_life=100.0
    )
    assert got_shown == pytest.approx(expected_shown, rel=1e-6)
    words.append([TOKENS[3]])  # the shortest row with the keyword: BM25's best
    index.upsert([f"e{n}"], [f"4:db:{n}"], [blind(words[n])], [False], [orders[-1]], ["person:a"], None)
    pinned.append(False)
    orders.append(orders[-1])
    keys.append("person:a")
    got_among, _ = ranked(
        index, query, [TOKENS[3]], ["person:a"], dense_k=20, keyword_k=15, rrf_k=60.0,
        pinned_prior=0.01, recency_prior=0.005, half_life=100.0,
    )  # fmt: skip
    assert f"e{n}" in got_among
    assert set(got_among) == {
        f"e{i}" for i in among_reference([i for i in range(n + 1) if keys[i] == "person:a"])
    }


def test_ties_follow_memory_order() -> None:
    index = BotIndex("")
    index.upsert(
        ["a", "b", "c"],
        ["4:db:1", "4:db:2", "4:db:3"],
        [TOKENS[0]] * 3,
        [False, True, False],
        [5_000_001, 5_000_002, 5_000_003],
        ["bot"] * 3,
        None,
    )
    got, _ = ranked(
        index, None, [TOKENS[0]], None, dense_k=5, keyword_k=5, rrf_k=60.0,
        pinned_prior=0.0, recency_prior=0.0, half_life=100.0,
    )  # fmt: skip
    # Equal BM25 scores: Lucene-like order is by row; with the prior off the fused scores differ by
    # place only, so the first keyword hit leads. Every id is proposed once.
    assert sorted(got) == ["a", "b", "c"]
    assert PINNED_RANK > 2**49


def test_a_revised_entry_loses_its_old_words_and_vector() -> None:
    rng = np.random.default_rng(5)
    vectors = unit(rng, 2, 8)
    q, scales = quantise(vectors)
    index = BotIndex("m")
    index.upsert(
        ["a", "b"],
        ["4:db:1", "4:db:2"],
        [TOKENS[0], TOKENS[1]],
        [False, False],
        [1_000_001, 1_000_002],
        ["bot", "bot"],
        ([0, 1], q, scales),
    )
    index.upsert(
        ["a"], ["4:db:1"], [TOKENS[2]], [False], [2_000_001], ["bot"], None
    )  # revised, embedder down
    found, _ = ranked(
        index, vectors[0], [TOKENS[0]], None, dense_k=5, keyword_k=5, rrf_k=60.0,
        pinned_prior=0.0, recency_prior=0.0, half_life=100.0,
    )  # fmt: skip
    assert found == ["b"]  # a's old word and old vector are gone; b is the only vector left
    found, _ = ranked(
        index, None, [TOKENS[2]], None, dense_k=5, keyword_k=5, rrf_k=60.0,
        pinned_prior=0.0, recency_prior=0.0, half_life=100.0,
    )  # fmt: skip
    assert found == ["a"]


@pytest.mark.parametrize(
    ("n", "part", "reserved"), [(20_000, 5_000, False), (40_000, 5_000, False), (40_000, 2 * EXACT_MAX, True)]
)
def test_a_large_index_finds_the_exact_nearest_through_the_coarse_pass(
    n: int, part: int, reserved: bool
) -> None:
    """Above EXACT_MAX principal components pick the candidates; above SPLIT_MIN the coarse scan
    is split between two threads (each half must count). Filled in parts, as a cold load fills it
    (``services.search.ABSORB_PART``): grown part by part, or with room made first and a first
    part already past EXACT_MAX (the principal components fitted at once)."""
    assert EXACT_MAX < 20_000 < SPLIT_MIN < 40_000
    rng = np.random.default_rng(11)
    dims = 64
    centres = unit(rng, 50, dims)
    vectors = centres[rng.integers(0, 50, n)] + 0.3 * unit(rng, n, dims)
    vectors = (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)
    q, scales = quantise(vectors)
    ids = [f"e{i}" for i in range(n)]
    index = BotIndex("m")
    if reserved:
        index.reserve(n)
    for start in range(0, n, part):
        stop = min(n, start + part)
        index.upsert(
            ids[start:stop],
            [f"4:db:{i}" for i in range(start, stop)],
            [""] * (stop - start),
            [False] * (stop - start),
            [1_000_001] * (stop - start),
            ["person:a" if i % 3 == 0 else "channel:b" for i in range(start, stop)],
            (list(range(stop - start)), q[start:stop], scales[start:stop]),
        )
    exact: npt.NDArray[np.float64] = ((q.astype(np.float32) * scales[:, None]) @ centres.T).astype(np.float64)
    found = 0
    for c in range(20):
        best = {ids[int(i)] for i in np.argsort(-exact[:, c])[:10].tolist()}
        found += len(best & set(index.top(centres[c], 50)))
    assert found >= 0.98 * 200
    # A reader of a third of the rows (too many to rank among): the same pass with the other rows
    # left out — only their rows come back, and the nearest of them.
    assert n // 3 > min(vectorindex.AMONG_MAX, vectorindex.AMONG_SHARE * n)
    found = 0
    for c in range(20):
        mine: list[int] = [int(i) for i in np.argsort(-exact[:, c]) if int(i) % 3 == 0][:10]
        ranking = index.rank(
            centres[c], [], ["person:a"], dense_k=50, keyword_k=50, rrf_k=60.0,
            pinned_prior=0.0, recency_prior=0.0, half_life=100.0,
        )  # fmt: skip
        assert ranking.ids and all(int(i[1:]) % 3 == 0 for i in ranking.ids)
        found += len({ids[i] for i in mine} & set(ranking.ids))
    assert found >= 0.98 * 200


def test_a_large_index_whose_vectors_come_after_its_rows_fits_its_coarse_pass_on_them() -> None:
    """Vectors that come after their rows — a new embedder's index loads with keywords only, then
    the backfill's vectors come 64 at a time — fitted the coarse pass's principal components on
    the first 64 for good: recall@10 0.51 against 0.77 for the same vectors present at load.
    The components are fitted again whenever twice as many vectors are held (up to _FIT_ROWS)."""
    n, dims, batch = 20_000, 384, 64
    assert n > EXACT_MAX
    rng = np.random.default_rng(7)
    # Like sentence embeddings: many topics, variance falling off across the dimensions.
    centres = (rng.normal(size=(n, dims)) * np.linspace(3, 0.2, dims)).astype(np.float32)
    vectors = centres[rng.integers(0, n, n)] + rng.normal(size=(n, dims)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    q, scales = quantise(vectors)
    ids = [f"e{i}" for i in range(n)]
    nodes, keywords, pinned, orders, keys = (
        [f"4:db:{i}" for i in range(n)], [""] * n, [False] * n, [1] * n, ["person:a"] * n
    )  # fmt: skip

    def filled(at_load: bool) -> BotIndex:
        index = BotIndex("m")
        if at_load:
            index.upsert(ids, nodes, keywords, pinned, orders, keys, (list(range(n)), q, scales))
            return index
        index.upsert(ids, nodes, keywords, pinned, orders, keys, None)
        for start in range(0, n, batch):
            p = slice(start, min(n, start + batch))
            index.upsert(
                ids[p], nodes[p], keywords[p], pinned[p], orders[p], keys[p],
                (list(range(p.stop - p.start)), q[p], scales[p]),
            )  # fmt: skip
        return index

    dequantised = q.astype(np.float32) * scales[:, None]
    queries = centres[rng.integers(0, n, 100)] + rng.normal(size=(100, dims)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)

    def recall(index: BotIndex) -> float:
        found = 0
        for query in queries:
            best = {ids[int(i)] for i in np.argsort(-(dequantised @ query))[:10]}
            found += len(best & set(index.top(query, 10)))
        return found / (10 * len(queries))

    at_load, afterwards = recall(filled(True)), recall(filled(False))
    assert afterwards >= at_load - 0.05, (afterwards, at_load)


def test_node_ids_are_kept_compactly_and_relearnt() -> None:
    index = BotIndex("")
    index.upsert(
        ["a", "b", "c"],
        ["4:db-1:10", "4:db-1:11", "odd"],
        [TOKENS[0]] * 3,
        [False] * 3,
        [1, 2, 3],
        [""] * 3,
        None,
    )
    assert index.nodes_of(["a", "b", "c", "zz"]) == ["4:db-1:10", "4:db-1:11", "odd", ""]
    # Another database (a store copy): every node id learnt before is unknown until located.
    index.upsert(["d"], ["4:db-2:5"], [TOKENS[0]], [False], [4], [""], None)
    assert index.nodes_of(["a", "d"]) == ["", "4:db-2:5"]
    # A lost candidate found again by id gets its node id; one that is gone is never proposed.
    index.locate(["a", "b"], [("a", "4:db-2:77")])
    assert index.nodes_of(["a"]) == ["4:db-2:77"]
    found, _ = ranked(
        index, None, [TOKENS[0]], None, dense_k=5, keyword_k=5, rrf_k=60.0,
        pinned_prior=0.0, recency_prior=0.0, half_life=100.0,
    )  # fmt: skip
    assert sorted(found) == ["a", "c", "d"]


def test_purged_node_ids_drop_their_rows_and_no_other() -> None:
    """A purge's record names the node ids its entries had (D9.20): those rows are never
    proposed again and leave BM25's counts; a node id of another database, or one no row holds,
    drops nothing; an odd node id drops the row that holds it."""
    index = BotIndex("")
    index.upsert(
        ["a", "b", "c", "d"],
        ["4:db-1:10", "4:db-1:11", "odd", "4:db-1:0"],
        [TOKENS[0]] * 4,
        [False] * 4,
        [1, 2, 3, 4],
        [""] * 4,
        None,
    )
    index.drop_nodes(["4:db-1:10", "4:db-2:11", "4:db-1:99", "odd"])
    assert index.nodes_of(["a", "b", "c", "d"]) == ["", "4:db-1:11", "", "4:db-1:0"]
    found, _ = ranked(
        index, None, [TOKENS[0]], None, dense_k=5, keyword_k=5, rrf_k=60.0,
        pinned_prior=0.0, recency_prior=0.0, half_life=100.0,
    )  # fmt: skip
    assert sorted(found) == ["b", "d"]
    assert index.keywords.documents_of(np.arange(4, dtype=np.int64)) == 2


def test_a_row_stamped_again_with_the_same_tokens_keeps_its_postings() -> None:
    """A re-embedded entry is stamped again with its keywords: in any order, they are the same
    tokens, and nothing is taken out and put back (which costs a pass over each token's rows)."""
    postings = Postings()
    postings.set_many([0, 1], [blind([TOKENS[0], TOKENS[1], TOKENS[1]]), blind([TOKENS[2]])])
    held = postings.nbytes
    postings.set_many([0], [blind([TOKENS[1], TOKENS[0], TOKENS[1]])])
    postings.set(0, blind([TOKENS[1], TOKENS[1], TOKENS[0]]))
    assert postings.nbytes == held
    postings.set(0, blind([TOKENS[0]]))  # changed: its old postings go, the new ones come
    rows, _ = top(postings, [TOKENS[1]], 5)
    assert rows.tolist() == []


def _filled(indexes: VectorIndexes, bot: str, rows: int) -> BotIndex:
    """The index of ``bot`` in ``indexes``, with ``rows`` entries of one token and a vector each."""
    index = indexes.of(bot, "m")
    ids = [f"{bot}-{i}" for i in range(rows)]
    vectors = np.ones((rows, 8), np.int8)
    index.upsert(ids, [f"4:db:{i}" for i in range(rows)], ["k1"] * rows, [False] * rows,
                 list(range(rows)), ["bot"] * rows, (list(range(rows)), vectors, np.ones(rows, np.float32)))  # fmt: skip
    indexes.account(bot, index)
    return index


def test_held_bytes_follow_what_the_index_holds() -> None:
    """``held_bytes`` (constant time) grows with the rows, and is never below the arrays' and
    postings' own size (``nbytes``) nor far above it with the ids counted."""
    indexes = VectorIndexes()
    small, large = _filled(indexes, "a", 100).held_bytes, _filled(indexes, "b", 5_000).held_bytes
    assert 0 < small < large
    index = indexes.of("b", "m")
    assert index.nbytes <= index.held_bytes <= index.nbytes + (ROW_BYTES + 16) * len(index)


def test_indexes_past_their_bound_drop_the_least_recently_searched() -> None:
    """A process's indexes stay within ``max_bytes``: the one that grows is kept, the least
    recently used others are dropped with what was learnt of their Bots (the pass share), and a
    Bot searched again starts from an empty index (loaded anew)."""
    one = _filled(VectorIndexes(), "x", 1_000).held_bytes
    indexes = VectorIndexes(max_bytes=int(2.5 * one))
    _filled(indexes, "a", 1_000)
    _filled(indexes, "b", 1_000)
    indexes.observe_passing("a", ("k",), 0.5)
    indexes.of("a", "m")  # a searched again: b is now the least recently used
    evicted = REGISTRY.get_sample_value("botmemory_search_index_evictions_total") or 0.0
    _filled(indexes, "c", 1_000)
    assert indexes.held() == [("a", "m"), ("c", "m")]
    assert REGISTRY.get_sample_value("botmemory_search_index_evictions_total") == evicted + 1
    assert REGISTRY.get_sample_value("botmemory_search_index_bytes") == pytest.approx(2 * one)
    _filled(indexes, "d", 1_000)  # a is the oldest now: dropped, and what was learnt of it
    assert indexes.held() == [("c", "m"), ("d", "m")]
    assert indexes.passing("a", ("k",)) == 1.0
    assert len(indexes.of("a", "m")) == 0  # searched again: loaded anew
    # One index larger than the bound alone is kept (its search needs it); the others go.
    _filled(indexes, "e", 3_000)
    assert indexes.held() == [("e", "m")]


def test_an_index_dropped_while_in_use_is_not_counted_again() -> None:
    """A search that began before its index was dropped finishes with it; what it takes in then is
    not counted among the held indexes."""
    one = _filled(VectorIndexes(), "x", 1_000).held_bytes
    indexes = VectorIndexes(max_bytes=int(1.5 * one))
    in_use = _filled(indexes, "a", 1_000)
    _filled(indexes, "b", 1_000)
    assert indexes.held() == [("b", "m")]
    in_use.upsert(["a-new"], ["4:db:9999"], ["k2"], [False], [9_999], ["bot"], None)
    indexes.account("a", in_use)
    assert indexes.held() == [("b", "m")]
    assert REGISTRY.get_sample_value("botmemory_search_index_bytes") == pytest.approx(one)


def test_what_queries_make_of_the_postings_is_counted() -> None:
    """``approx_nbytes`` counts the arrays and weights a query makes of a token's postings (16
    bytes a posting) until the token's postings change, besides 10 bytes a posting."""
    postings = Postings()
    postings.set_many(list(range(100)), ["ka kb"] * 100)
    before = postings.approx_nbytes
    top(postings, ["ka"], 5)
    assert postings.approx_nbytes == before + 100 * (8 + 4 + 4)
    postings.set(100, "ka")  # ka's postings change: what was made of them goes
    assert postings.approx_nbytes == before + 10


def test_a_large_vocabulary_is_counted() -> None:
    """``approx_nbytes`` counts each distinct token, not only its postings: rows of many distinct
    tokens (names, CJK pairs) held several times what 10 bytes a posting counts, so a process's
    bound on its indexes was passed unseen."""
    rng = random.Random(7)
    vocabulary = [f"t{i:06x}" for i in range(50_000)]
    blinds = [" ".join(rng.choice(vocabulary) for _ in range(20)) for _ in range(3_000)]
    rows = list(range(len(blinds)))
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        postings = Postings()
        postings.set_many(rows, blinds)
        held = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    assert 0.8 * held <= postings.approx_nbytes <= 1.5 * held
    assert Postings().approx_nbytes > 0  # an empty one holds something too


def test_what_was_learnt_of_reader_keys_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pass share of a set of reader keys is kept for the LEARNT_KEPT most recently learnt
    sets; an older one is learnt again (the default: 1)."""
    monkeypatch.setattr(vectorindex, "LEARNT_KEPT", 2)
    indexes = VectorIndexes()
    for keys, share in ((("a",), 0.5), (("b",), 0.5), (("a",), 0.25), (("c",), 0.5)):  # b is the oldest
        indexes.observe_passing("bot", keys, share)
    assert [indexes.passing("bot", k) for k in (("a",), ("b",), ("c",))] == [0.375, 1.0, 0.5]


def test_line_lengths_are_kept_for_the_most_recently_observed_bots(monkeypatch: pytest.MonkeyPatch) -> None:
    """``context``'s mean line length per Bot (what sizes its first page) is a moving mean kept for
    the KEPT most recently observed Bots; answers of fewer than MIN_LINES lines are not counted."""
    monkeypatch.setattr(LineLengths, "KEPT", 2)
    lengths = LineLengths()
    lengths.observe("a", 400, 4)  # 100 a line
    lengths.observe("a", 200, 1)  # too few lines: not counted
    lengths.observe("b", 800, 4)
    lengths.observe("a", 800, 4)  # 100 + (200 - 100) / 4; a is the newest now
    lengths.observe("c", 400, 4)  # b is the oldest: dropped
    assert (lengths.mean("a"), lengths.mean("b"), lengths.mean("c")) == (125.0, None, 100.0)


@given(walked=st.integers(1, 5_000), wanted=st.integers(1, 100), share=st.floats(0.0, 1.0))
def test_a_walk_that_falls_short_goes_as_far_as_its_share_says(
    walked: int, wanted: int, share: float
) -> None:
    """After a walk of ``walked`` candidates found ``visible`` < ``wanted`` (design §10), the next
    goes further, far enough for the wanted ones at the share that passed (with the margin), and
    at most WALK_GROWTH times as far; one that found none goes WALK_GROWTH times as far."""
    visible = min(wanted - 1, math.floor(walked * share))
    if visible < 0:
        return
    nxt = search.further(walked, visible, wanted)
    assert walked < nxt <= max(walked * search.WALK_GROWTH, walked + search.MARGIN_MIN)
    if visible == 0:
        assert nxt == max(walked * search.WALK_GROWTH, walked + search.MARGIN_MIN)
    else:
        # at the share that passed, the next walk holds the wanted ones (or is as far as it may go)
        assert nxt * visible / walked >= wanted or nxt == walked * search.WALK_GROWTH
    assert search.further(900, 45, 50) < 900 * 1.5  # nearly there: not four times as far


def test_a_deep_ranking_rescores_twice_its_depth_not_eight_times() -> None:
    """The coarse pass's best rows ranked exactly: RESCORE_MIN at least, RESCORE_FACTOR per result
    up to RESCORE_DEEP results (what search and context(query) ask of a dense reader), then twice
    the depth (a deep walk's: 6,400 rows rescored for 800 took ~3 ms of ranking at 100k)."""
    assert [vectorindex.rescored(k) for k in (10, 100, 154, 200, 808)] == [800, 800, 1_232, 1_600, 1_616]


def test_the_prior_breaks_near_ties_only() -> None:
    """A pinned entry, newest in the memory, second nearest to the query, no keyword of it in
    either: the nearest entry stays first, in the ranking and in the scores a search shows (the
    prior passed up to seven places at the top before: a remembered preference came first in a
    search for "boats", above the entry about sailing)."""
    near, second = np.array([1.0, 0.0, 0.0, 0.0], np.float32), np.array([0.9, 0.436, 0.0, 0.0], np.float32)
    vectors = np.stack([near, second / np.linalg.norm(second), near]).astype(np.float32)
    q, scales = quantise(vectors)
    index = BotIndex("m")
    index.upsert(
        ["sailing", "french", "twin"],
        ["4:db:1", "4:db:2", "4:db:3"],
        [blind(["lake"]), blind(["french"]), blind(["lake"])],
        [False, True, True],
        [1_000_001, 9_000_001, 1_000_001],
        ["person:a"] * 3,
        ([0, 1, 2], q, scales),
    )
    priors = {
        "rrf_k": search.RRF_K,
        "pinned_prior": search.PINNED_PRIOR,
        "recency_prior": search.RECENCY_PRIOR,
        "half_life": search.RECENCY_HALF_LIFE,
    }
    query = np.array([1.0, 0.0, 0.0, 0.0], np.float32)
    ranking = index.rank(query, [], ["person:a"], dense_k=10, keyword_k=10, **priors)
    assert ranking.ids[-1] == "french"  # the nearer two first, whatever the prior
    assert set(ranking.ids[:2]) == {"sailing", "twin"}
    shown = fuse_shown(
        [Parts(1.0, 0.0, False, 1.0), Parts(0.9, 0.0, True, 9.0), Parts(1.0, 0.0, True, 1.0)], **priors
    )
    assert shown[0] > shown[1] and shown[2] > shown[1]

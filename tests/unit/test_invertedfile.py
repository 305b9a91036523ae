"""The inverted file of a large pool (services/invertedfile.py, design §10) against a plain
reference: after any sequence of placing, moving and dropping rows, every held row is in the list
of its nearest centroid with its coarse copy, and a query scans the nearest lists until its share
of the pool is covered, proposing the best coarse scores among them."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from hypothesis import given, settings
from hypothesis import strategies as st

from services import invertedfile
from services.invertedfile import COARSE_DIMS, InvertedFile

DIMS = 64
ROWS = 300

# A step: place some rows (with new vectors) or drop some rows.
steps_st = st.lists(
    st.tuples(st.booleans(), st.lists(st.integers(0, ROWS - 1), min_size=1, max_size=40, unique=True)),
    min_size=1,
    max_size=12,
)


def unit(rng: np.random.Generator, n: int) -> npt.NDArray[np.float32]:
    v = rng.normal(size=(n, DIMS)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def fitted(seed: int) -> InvertedFile:
    return InvertedFile.fit(unit(np.random.default_rng(seed), 400), seed=seed)


def probed(
    lists: InvertedFile, held: dict[int, npt.NDArray[np.float32]], query: npt.NDArray[np.float32]
) -> set[int]:
    """The rows a query scans, written out: the lists by their centroid's score, best first, until
    PROBE_SHARE of the held rows (at least PROBE_MIN, at most all) are in the lists taken."""
    of = {row: int(np.argmin(((lists.centroids - v) ** 2).sum(axis=1))) for row, v in held.items()}
    want = min(len(held), max(invertedfile.PROBE_MIN, invertedfile.PROBE_SHARE * len(held)))
    taken: set[int] = set()
    for c in np.argsort(-(lists.centroids @ query)).tolist():
        if len(taken) >= want:
            break
        taken |= {row for row, at in of.items() if at == c}
    return taken


@settings(max_examples=40, deadline=None)
@given(steps=steps_st, seed=st.integers(0, 1_000), probe_min=st.sampled_from([10, 4_096]))
def test_lists_hold_each_row_once_where_it_belongs_and_queries_scan_the_nearest(
    steps: list[tuple[bool, list[int]]], seed: int, probe_min: int
) -> None:
    rng = np.random.default_rng(seed)
    lists = fitted(seed)
    held: dict[int, npt.NDArray[np.float32]] = {}
    old = invertedfile.PROBE_MIN
    invertedfile.PROBE_MIN = probe_min
    try:
        for place, rows in steps:
            at = np.array(rows, np.int64)
            if place:
                vectors = unit(rng, len(rows))
                lists.place(at, vectors)
                held.update(zip(rows, vectors, strict=True))
            else:
                lists.drop(at)
                for row in rows:
                    held.pop(row, None)
        assert len(lists) == len(held)
        query = unit(rng, 1)[0]
        scan = probed(lists, held, query)
        for k in (1, 5, ROWS):
            found = lists.candidates(query, k).tolist()
            assert len(found) == len(set(found)) == min(k, len(scan))
            assert set(found) <= scan
            # The best coarse scores among the rows scanned (ties aside).
            score = {row: float(held[row] @ lists.basis @ (query @ lists.basis)) for row in scan}
            if found and len(found) < len(scan):
                worst_in = min(score[r] for r in found)
                best_out = max(score[r] for r in scan - set(found))
                assert worst_in >= best_out - 1e-5
    finally:
        invertedfile.PROBE_MIN = old


def test_a_moved_row_leaves_its_old_list_and_takes_its_new_coarse_copy() -> None:
    rng = np.random.default_rng(3)
    lists = fitted(3)
    vectors = unit(rng, 50)
    lists.place(np.arange(50), vectors)
    # Row 7 moves onto row 8's vector (the same list, the same coarse copy): its old copy is gone.
    lists.place(np.array([7]), vectors[8:9])
    assert len(lists) == 50
    found = lists.candidates(vectors[8], 2).tolist()
    assert sorted(found) == [7, 8]
    lists.drop(np.array([7, 8, 7_000]))  # a row never placed is left alone
    assert len(lists) == 48
    assert not {7, 8} & set(lists.candidates(vectors[8], 50).tolist())
    assert lists.basis.shape == (DIMS, COARSE_DIMS)

"""Cross-modal figures over layer pairs, held to independent computations written here."""

from __future__ import annotations

import numpy as np
import pytest
from knn_reference import mutual_knn, relative_retrieval

from layerscope.metrics.crossmodal import crossmodal


def _linear_cka(x: np.ndarray, y: np.ndarray) -> float:
    """Kornblith et al.'s linear CKA from centred Gram matrices."""
    n = len(x)
    h = np.eye(n) - 1.0 / n
    kx, ky = h @ x @ x.T @ h, h @ y @ y.T @ h
    return float((kx * ky).sum() / np.sqrt((kx * kx).sum() * (ky * ky).sum()))


def test_mutual_knn_and_cka_match_the_definitions():
    """Catches: self counted as a neighbour, the overlap divided by the wrong k, layers of one side paired
    with the wrong layers of the other, CKA of the wrong pair."""
    rng = np.random.default_rng(3)
    n = 40
    base = rng.normal(size=(n, 6))
    a = np.stack([base @ rng.normal(size=(6, 12)) + 0.3 * rng.normal(size=(n, 12)) for _ in range(3)])
    b = np.stack([base @ rng.normal(size=(6, 8)) + s * rng.normal(size=(n, 8)) for s in (0.1, 2.0)])
    res = crossmodal(a, b, k=5, permutations=0, bootstrap=0)
    for i in range(3):
        for j in range(2):
            assert res.figures["mutual_knn"].value[i, j] == pytest.approx(mutual_knn(a[i], b[j], 5))
            assert res.figures["cka"].value[i, j] == pytest.approx(_linear_cka(a[i], b[j]), rel=1e-9)


def test_retrieval_both_ways_equals_a_count_query_by_query():
    """acc@k of every layer pair, each way, against relative_retrieval (tests/knn_reference.py), on pairs whose
    two spaces share a signal under noise, so a pair is found about half the time, and not equally often each
    way. Catches: a rank counted on the wrong axis (b -> a read from a's row), a pair that is both an anchor and a
    query, the two directions swapped, a layer pair's figure filed under another pair."""
    rng = np.random.default_rng(0)
    n, seed = 40, 3
    base = rng.normal(size=(n, 6))
    a = np.stack([base @ rng.normal(size=(6, 10)) + s * rng.normal(size=(n, 10)) for s in (1.0, 0.7)])
    b = np.stack([base @ rng.normal(size=(6, 7)) + s * rng.normal(size=(n, 7)) for s in (1.5, 1.0, 3.0)])
    res = crossmodal(a, b, k=5, acc_k=2, permutations=0, bootstrap=0, seed=seed)
    both = []
    for i in range(2):
        for j in range(3):
            want = relative_retrieval(a[i], b[j], acc_k=2, seed=seed)
            got = (res.figures["a_to_b"].value[i, j], res.figures["b_to_a"].value[i, j])
            assert got == pytest.approx(want, abs=1e-12), (i, j)
            both.append(want)
    values = np.array(both)
    assert 0.05 < values.min() and values.max() < 0.9  # moderate: neither found always nor never
    assert (values[:, 0] != values[:, 1]).sum() >= 3  # the two ways differ: swapping them shows


def test_aligned_pair_wins_beyond_its_null_and_unrelated_ones_do_not():
    """Catches: a null that keeps the pairing (p never small), a null that ignores it (p always small),
    retrieval that cannot find the pair across spaces of other widths, the best pair's interval missing
    the selection (its share of resamples), a best pair taken from the wrong axis."""
    rng = np.random.default_rng(0)
    n = 60
    a = rng.normal(size=(2, n, 10))
    q, _ = np.linalg.qr(rng.normal(size=(12, 10)))  # orthonormal columns: cosines kept, in 12 dimensions
    related = a[1] @ q.T + 0.05 * rng.normal(size=(n, 12))  # b's layer 0 is a's layer 1, rotated, plus noise
    b = np.stack([related, rng.normal(size=(n, 12)), rng.normal(size=(n, 12))])
    res = crossmodal(a, b, k=5, acc_k=1, permutations=50, bootstrap=100, seed=1)
    knn = res.figures["mutual_knn"]
    assert res.best.layer_a == 1 and res.best.layer_b == 0
    assert res.best.value == knn.value[1, 0] > 0.5
    assert knn.p[1, 0] == pytest.approx(1 / 51)  # above every shuffled pairing
    assert knn.p[0, 1] > 0.05 and knn.p[1, 2] > 0.05  # unrelated spaces: a shuffled pairing does as well
    assert knn.ci_low[1, 0] <= knn.value[1, 0] <= knn.ci_high[1, 0]
    assert res.best.ci_low <= res.best.value <= res.best.ci_high and res.best.chosen_share == 1.0
    for way in ("a_to_b", "b_to_a"):
        fig = res.figures[way]
        assert fig.value[1, 0] > 0.9 and fig.p[1, 0] == pytest.approx(1 / 51)
        assert fig.value[0, 2] < 0.3
    assert res.figures["cka"].null_mean[1, 0] < res.figures["cka"].value[1, 0]


def test_a_layer_without_distinct_rows_has_no_neighbour_figures():
    """Catches: neighbours read off the tie order of identical rows (a perfect, 'significant' mutual k-NN
    between a constant layer and anything), CKA of a constant layer reported as a number."""
    rng = np.random.default_rng(2)
    a = rng.normal(size=(1, 20, 4))
    b = np.stack([np.ones((20, 3)), rng.normal(size=(20, 3))])
    res = crossmodal(a, b, k=3, permutations=10, bootstrap=10)
    for f in ("mutual_knn", "a_to_b", "b_to_a", "cka"):
        assert np.isnan(res.figures[f].value[0, 0]) and np.isnan(res.figures[f].p[0, 0]), f
        assert not np.isnan(res.figures[f].value[0, 1]), f
    assert res.best.layer_b == 1

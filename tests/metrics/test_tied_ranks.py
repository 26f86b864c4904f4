"""Ranks with ties held to scipy: the mean rank of a tied block is scipy.stats.rankdata's "average" rank of the
right item, and its hit at k and reciprocal rank are the means over every place the tie may put it."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import rankdata

from layerscope.metrics.neighbors import (cosine_ranks, hamming_ranks, ranks_from_scores, retrieval_metrics,
                                          tied_ranks_from_scores)
from layerscope.metrics.ties import TiedRanks


def _tied_scores(seed: int = 5, queries: int = 40, items: int = 12):
    """Scores on a coarse grid (four levels): most right items share their score with a few others."""
    rng = np.random.default_rng(seed)
    scores = rng.integers(0, 4, (queries, items)).astype(np.float64) / 4
    return scores, rng.integers(0, items, queries)


def _by_hand(scores, correct):
    """Per query: scipy's average rank of the right item (best first), and the rank's every possible place."""
    mean = np.array([rankdata(-s, method="average")[c] for s, c in zip(scores, correct)])
    places = [np.arange((s > s[c]).sum() + 1, (s >= s[c]).sum() + 1) for s, c in zip(scores, correct)]
    return mean, places


def test_a_tied_blocks_mean_rank_is_scipys_average_rank():
    """Catches: a mean rank half a rank (or a whole tie) low or high, the right item left out of its own tie."""
    scores, correct = _tied_scores()
    want, places = _by_hand(scores, correct)
    assert 1.5 < want.mean() < scores.shape[1] - 1  # moderate: neither all first nor all last
    assert sum(len(p) > 1 for p in places) > len(places) // 2  # ties are the rule here, not the exception
    np.testing.assert_array_equal(ranks_from_scores(scores, correct), want)
    np.testing.assert_array_equal(tied_ranks_from_scores(scores, correct).mean, want)
    above = np.array([p[0] - 1 for p in places], dtype=np.float64)
    tied = np.array([len(p) for p in places])
    np.testing.assert_array_equal(TiedRanks(above, tied).mean, want)


def test_hits_and_reciprocal_rank_are_their_means_over_the_ties_places():
    """Catches: a tie counted as a hit whole (or as a miss whole), a reciprocal rank of the block's mean
    rank instead of the mean of the reciprocals, an MRR or acc@k over the wrong axis."""
    scores, correct = _tied_scores(seed=9)
    _, places = _by_hand(scores, correct)
    ranks = tied_ranks_from_scores(scores, correct)
    for k in (1, 3, 6):
        np.testing.assert_allclose(ranks.hits(k), [np.mean(p <= k) for p in places], rtol=0, atol=1e-15)
    np.testing.assert_allclose(ranks.reciprocal(), [np.mean(1.0 / p) for p in places], rtol=1e-12)
    got = retrieval_metrics(ranks, ks=(1, 3))
    assert got["acc@1"] == pytest.approx(np.mean([np.mean(p <= 1) for p in places]), abs=1e-15)
    assert got["mrr"] == pytest.approx(np.mean([np.mean(1.0 / p) for p in places]), rel=1e-12)
    assert 0.05 < got["acc@1"] < got["acc@3"] < 0.95


def test_cosine_and_hamming_ranks_take_scipys_average_rank_of_a_tie():
    """Equal vectors tie exactly (cosine), equal codes tie exactly (Hamming): their mean rank is scipy's."""
    rng = np.random.default_rng(4)
    base = rng.normal(size=(6, 8))
    tgt = np.repeat(base, 3, axis=0)  # every target three times: each right item tied with two others
    src = tgt + 0.8 * rng.normal(size=tgt.shape)
    cos = (src / np.linalg.norm(src, axis=1, keepdims=True)) @ (tgt / np.linalg.norm(tgt, axis=1, keepdims=True)).T
    want = np.array([rankdata(-np.round(row, 12), method="average")[i] for i, row in enumerate(cos)])
    assert (want % 1 == 0).all() and 2 < want.mean() < 12  # each tie of three: whole mean ranks, not all first
    np.testing.assert_allclose(cosine_ranks(src, tgt, backend="numpy"), want, rtol=0, atol=1e-12)

    pytest.importorskip("faiss")
    docs = rng.integers(0, 256, (10, 2), dtype=np.uint8)
    docs[5] = docs[2]  # two documents with the same code
    queries = rng.integers(0, 256, (10, 2), dtype=np.uint8)
    correct = np.arange(10)
    bits = np.unpackbits(queries[:, None, :] ^ docs[None, :, :], axis=2).sum(axis=2)  # Hamming by hand
    want = np.array([rankdata(d, method="average")[c] for d, c in zip(bits, correct)])
    assert (want % 1 != 0).any()  # some right item ties with another at its distance
    np.testing.assert_array_equal(hamming_ranks(queries, docs, correct), want)

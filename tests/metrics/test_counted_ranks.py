"""Retrieval ranks counted inside the blocked product (no top-k, no sort) against an independent full argsort,
and the figures of exact retrieval against the top-``cutoff`` search they replace (CPU tensors here; the same
code runs on a CUDA GPU)."""

from __future__ import annotations

import numpy as np
import pytest

from layerscope.metrics import neighbors_torch

pytest.importorskip("torch")


def _grid_pairs(n=150, d=8, seed=0):
    """Entries on a grid of 1/8, so every inner product is exact in float32 and float64 and two different
    scores differ by at least 1/64 (far past the float32 screen): ties are exact and plentiful. Targets 3, 40
    and 77 are one vector, and sources 10 and 11."""
    rng = np.random.default_rng(seed)
    s = rng.integers(-8, 9, (n, d)).astype(np.float32) / 8
    t = np.where(rng.random((n, d)) < 0.3, rng.integers(-8, 9, (n, d)) / 8, s).astype(np.float32)
    t[[40, 77]] = t[3]
    s[11] = s[10]
    return s, t


def _ranks_by_argsort(q: np.ndarray, base: np.ndarray):
    """(above, tied) per query i for partner base[i]: sort each row of float64 scores, then find where the
    partner's score starts and ends in the sorted row."""
    scores = q.astype(np.float64) @ base.astype(np.float64).T
    above, tied = [], []
    for i, row in enumerate(scores):
        desc = row[np.argsort(-row, kind="stable")]
        first = int(np.searchsorted(-desc, -row[i], side="left"))
        last = int(np.searchsorted(-desc, -row[i], side="right"))
        above.append(first)
        tied.append(last - first)
    return np.array(above, dtype=np.float64), np.array(tied)


@pytest.mark.parametrize("blocks", [(None, None), (7, 13), (64, 5), (150, 150)])
def test_counted_ranks_equal_a_full_argsort_both_ways(blocks):
    s, t = _grid_pairs()
    fwd, back = neighbors_torch.paired_tied_ranks(s, t, device="cpu", query_block=blocks[0], db_block=blocks[1])
    for got, (q, base) in ((fwd, (s, t)), (back, (t, s))):
        above, tied = _ranks_by_argsort(q, base)
        np.testing.assert_array_equal(got.above, above)
        np.testing.assert_array_equal(got.tied, tied)
    assert fwd.tied[3] >= 3 and min(back.tied[10], back.tied[11]) >= 2  # the planted ties are there
    assert np.count_nonzero(fwd.tied > 1) > 10 and np.count_nonzero(back.tied > 1) > 10
    assert np.count_nonzero(fwd.above > 0) > 10  # and not every partner is first


def _exact_scores(q: np.ndarray, base: np.ndarray) -> np.ndarray:
    """Inner products rounded once from their exact value (float32 products are exact in float64; fsum adds
    them without error), so equal vectors score exactly equal whatever the order of the terms."""
    import math

    return np.array([[math.fsum(a * b) for b in base.astype(np.float64)] for a in q.astype(np.float64)])


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_counted_ranks_equal_a_full_argsort_on_random_unit_vectors(device):
    """Random unit vectors with planted duplicates: in float32 a duplicate's score and its partner's may
    differ in the last bits (the partner's is a row sum, the others' a matrix product), which the screen and
    the float64 recount must absorb."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    rng = np.random.default_rng(5)
    s = rng.standard_normal((120, 48)).astype(np.float32)
    t = (s + rng.standard_normal((120, 48)).astype(np.float32)).astype(np.float32)
    s /= np.linalg.norm(s, axis=1, keepdims=True)
    t /= np.linalg.norm(t, axis=1, keepdims=True)
    for dup in range(0, 120, 6):  # 20 blocks of three equal targets, 20 pairs of equal sources
        t[dup + 1] = t[dup + 2] = t[dup]
        s[dup + 4] = s[dup + 3]
    fwd, back = neighbors_torch.paired_tied_ranks(s, t, device=device, query_block=16, db_block=40)
    for got, (q, base) in ((fwd, (s, t)), (back, (t, s))):
        scores = _exact_scores(q, base)
        want_above, want_tied = [], []
        for i, row in enumerate(scores):
            desc = row[np.argsort(-row, kind="stable")]
            first = int(np.searchsorted(-desc, -row[i], side="left"))
            want_above.append(first)
            want_tied.append(int(np.searchsorted(-desc, -row[i], side="right")) - first)
        np.testing.assert_array_equal(got.above, want_above)
        np.testing.assert_array_equal(got.tied, want_tied)
    assert np.count_nonzero(fwd.tied == 3) == 60 and np.count_nonzero(back.tied == 2) == 40


@pytest.mark.parametrize("dense_share", [0, 16, 10**9])  # near ties pair by pair / by the share / all whole
def test_near_pairs_in_small_slabs_or_whole_rows_count_as_a_full_argsort(dense_share, monkeypatch):
    s, t = _grid_pairs(seed=1)
    monkeypatch.setattr(neighbors_torch, "DENSE_SHARE", dense_share)
    monkeypatch.setattr(neighbors_torch, "NEAR_BUDGET", 3 if dense_share == 0 else 40)
    monkeypatch.setattr(neighbors_torch, "GATHER_ELEMENTS", 5 * s.shape[1])
    got = neighbors_torch.paired_tied_ranks(s, t, device="cpu", query_block=20, db_block=30)
    for g, (q, base) in zip(got, ((s, t), (t, s))):
        above, tied = _ranks_by_argsort(q, base)
        np.testing.assert_array_equal(g.above, above)
        np.testing.assert_array_equal(g.tied, tied)


def test_every_vector_the_same_ties_every_candidate():
    """A layer where every text's vector is one vector (the raw embedding of a shared last token): every
    partner ties with all n rows, rank (1 + n) / 2 (each row scored again whole, not pair by pair)."""
    v = np.random.default_rng(2).standard_normal(16).astype(np.float32)
    s = np.tile(v / np.linalg.norm(v), (300, 1))
    t = s.copy()
    t[::2] = -t[::2]  # the even targets point the other way: for an odd query they are all below
    fwd, back = neighbors_torch.paired_tied_ranks(s, t, device="cpu", query_block=64, db_block=100)
    odd, even = np.arange(1, 300, 2), np.arange(0, 300, 2)
    assert (fwd.above[odd] == 0).all() and (fwd.tied[odd] == 150).all()
    assert (fwd.above[even] == 150).all() and (fwd.tied[even] == 150).all()
    assert (back.above == 0).all() and (back.tied == 300).all()  # every source is the same vector


def test_a_float32_tie_that_float64_breaks_is_no_tie_either_way():
    # both sources score 0.6 against both targets in float32; in float64 target 0 scores 0.8 * 2**-26 more
    q = np.array([1.0, 2.0 ** -26, 0.0], dtype=np.float32)
    s = np.stack([q, q])
    t = np.array([[0.6, 0.8, 0.0], [0.6, 0.0, 0.8]], dtype=np.float32)
    assert (s @ t.T == np.float32(0.6)).all()
    fwd, back = neighbors_torch.paired_tied_ranks(s, t, device="cpu")
    assert fwd.above.tolist() == [0.0, 1.0] and fwd.tied.tolist() == [1, 1]
    assert back.above.tolist() == [0.0, 0.0] and back.tied.tolist() == [2, 2]  # the two sources are one vector


def test_exact_retrieval_counts_as_the_top_cutoff_search_did(monkeypatch):
    pytest.importorskip("faiss")
    from layerscope.index import search
    from layerscope.index.vector_index import normalize

    rng = np.random.default_rng(3)
    s = rng.standard_normal((400, 16)).astype(np.float32)
    t = s + 1.5 * rng.standard_normal((400, 16)).astype(np.float32)
    t[[7, 8, 9]] = t[6]  # exact ties
    s[20] = t[6]
    S, T = normalize(s), normalize(t)
    for cutoff in (1000, 25, 1):
        counted = search.retrieval(S, T, kind="flat", device="cpu", mrr_cutoff=cutoff)
        assert counted["backend"].startswith("exact rank counting")
        with monkeypatch.context() as m:
            m.setattr(search, "counting_device", lambda device="auto": None)  # the FAISS top-cutoff search
            listed = search.retrieval(S, T, kind="flat", device="cpu", mrr_cutoff=cutoff)
        assert listed["backend"].startswith("FAISS")
        for d in ("src2tgt", "tgt2src"):
            for key in ("acc@1", "acc@5", "acc@10", "mrr", "ties"):
                assert counted[d][key] == pytest.approx(listed[d][key], abs=1e-12), (cutoff, d, key)
            np.testing.assert_array_equal(counted[d]["ranks"].above, listed[d]["ranks"].above)
            np.testing.assert_array_equal(counted[d]["ranks"].tied, listed[d]["ranks"].tied)
        if cutoff == 25:
            assert np.isinf(counted["src2tgt"]["ranks"].above).sum() > 20  # the cutoff really bites
    assert counted["src2tgt"]["ties"] >= 4


def test_counting_runs_where_the_flat_backend_is(monkeypatch):
    from layerscope.index import backend as backend_mod
    from layerscope.index import search
    from layerscope.index.backend import Backend

    monkeypatch.setattr(neighbors_torch, "cuda_device", lambda: "cuda")
    monkeypatch.setattr(backend_mod, "select_backend", lambda kind, prefer="auto": Backend("torch-cuda", 1))
    assert search.counting_device("auto") == "cuda"
    monkeypatch.setattr(backend_mod, "select_backend", lambda kind, prefer="auto": Backend("faiss-cpu"))
    assert search.counting_device("cpu") == "cpu"
    monkeypatch.setattr(backend_mod, "select_backend", lambda kind, prefer="auto": Backend("faiss-gpu", 1))
    monkeypatch.setattr(neighbors_torch, "cuda_device", lambda: None)
    assert search.counting_device("auto") is None  # FAISS on its GPU, as before

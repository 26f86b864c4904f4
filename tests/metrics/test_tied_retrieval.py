"""Retrieval where cosines tie exactly: every engine and index gives the expectation over a random order."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from layerscope.metrics import neighbors

pytest.importorskip("faiss")


def _tied_pairs(lopsided: bool = False):
    """Targets 2, 5 and 7 are one vector, as are 0 and 4; the other sources are near copies of their partners.
    Sources 2 and 0 are their partners themselves, so the tied block tops their lists. ``lopsided``: sources
    5, 7 and 4 are unrelated vectors, so their partners tie somewhere down their lists, and which of the
    tied rows comes first changes the figure."""
    rng = np.random.default_rng(7)
    t = rng.standard_normal((9, 6)).astype(np.float32)
    t[5] = t[7] = t[2]
    t[4] = t[0]
    s = t.copy()
    for i in (1, 3, 6, 8):  # untied pairs: a near copy, still first
        s[i] += 0.05 * rng.standard_normal(6).astype(np.float32)
    if lopsided:
        s[[5, 7, 4]] = rng.standard_normal((3, 6)).astype(np.float32)
    return s / np.linalg.norm(s, axis=1, keepdims=True), t / np.linalg.norm(t, axis=1, keepdims=True)


def _by_enumeration(s, t, ks=(1, 2, 5)):
    """acc@k and MRR averaged over every order of each query's tied block, by listing the orders."""
    out = {f"acc@{k}": 0.0 for k in ks} | {"mrr": 0.0}
    for i in range(len(s)):
        cos = t.astype(np.float64) @ s[i].astype(np.float64)
        above = int((cos > cos[i] + 1e-9).sum())
        block = [j for j in range(len(t)) if abs(cos[j] - cos[i]) <= 1e-9]
        orders = list(itertools.permutations(block))
        for order in orders:
            rank = above + order.index(i) + 1
            for k in ks:
                out[f"acc@{k}"] += (rank <= k) / len(orders) / len(s)
            out["mrr"] += 1 / rank / len(orders) / len(s)
    return out


def test_hand_made_ties_by_hand():
    s, t = _tied_pairs()
    r = neighbors.cosine_tied_ranks(s, t, backend="numpy")
    assert r.tied.tolist() == [2, 1, 3, 1, 2, 3, 1, 3, 1] and r.above.tolist() == [0] * 9
    # acc@1 = (4 untied + 2 * 1/2 + 3 * 1/3) / 9; MRR = (4 + 2 * 3/4 + 3 * 11/18) / 9
    got = neighbors.retrieval_metrics(r, ks=(1, 2, 5))
    assert got["acc@1"] == pytest.approx(6 / 9)
    assert got["acc@2"] == pytest.approx((4 + 2 + 3 * 2 / 3) / 9)
    assert got["mrr"] == pytest.approx((4 + 1.5 + 11 / 6) / 9)
    assert got == pytest.approx(_by_enumeration(s, t))


def test_every_engine_and_index_counts_ties_the_same():
    from layerscope.index.search import retrieval
    from layerscope.metrics import neighbors_torch

    s, t = _tied_pairs(lopsided=True)
    want = _by_enumeration(s, t, ks=(1, 5, 10))
    numpy_figs = neighbors.retrieval_metrics(neighbors.cosine_tied_ranks(s, t, backend="numpy"))
    torch_figs = neighbors.retrieval_metrics(neighbors_torch.cosine_tied_ranks(s, t, device="cpu", query_block=4,
                                                                               db_block=3))
    flat = retrieval(s, t, kind="flat", device="cpu")["src2tgt"]
    cut = retrieval(s, t, kind="flat", device="cpu", mrr_cutoff=2)["src2tgt"]  # a tie of 3 runs past the list
    ivf = retrieval(s, t, kind="ivf", device="cpu", index_params={"nlist": 2, "nprobe": 2})["src2tgt"]
    for name, figs in (("numpy", numpy_figs), ("torch", torch_figs), ("faiss flat", flat), ("faiss ivf", ivf)):
        for key in ("acc@1", "acc@5", "mrr"):
            assert figs[key] == pytest.approx(want[key], abs=1e-12), (name, key)
    assert cut["acc@1"] == pytest.approx(want["acc@1"], abs=1e-12)  # the block of 3 counted past the list of 2
    assert flat["ties"] == 5 and 0 < want["acc@5"] < 1


def test_faiss_order_alone_would_change_the_figure():
    """The partner's place in FAISS's own list is one arbitrary order: its acc@1 is not the expectation."""
    from layerscope.index.vector_index import VectorIndex

    s, t = _tied_pairs(lopsided=True)
    vi = VectorIndex.build(t, "flat", normalized=True, device="cpu")
    _, ids = vi.search(s, len(t), normalized=True)
    listed = np.array([list(ids[i]).index(i) + 1 for i in range(len(s))])
    want = _by_enumeration(s, t)
    assert np.mean(1 / listed) != pytest.approx(want["mrr"], abs=1e-6)


def test_near_ties_in_float32_are_resolved_in_float64():
    """Two different targets whose float32 cosines agree to 1e-7 but differ in float64 are not a tie."""
    q = np.array([[1.0, 2.0 ** -26, 0.0]], dtype=np.float32)
    t = np.array([[0.6, 0.8, 0.0], [0.6, 0.0, 0.8]], dtype=np.float32)
    s32 = q @ t.T
    assert s32[0, 0] == s32[0, 1]  # float32 cannot tell them apart
    r = neighbors.cosine_tie_counts(q, t, np.array([1]), scores=s32)
    exact = t.astype(np.float64) @ q[0].astype(np.float64)
    assert exact[0] > exact[1] and (r.above.tolist(), r.tied.tolist()) == ([1.0], [1])

"""FAISS indexes and retrieval through them, against brute-force numpy."""

from __future__ import annotations

import numpy as np
import pytest

from layerscope.errors import InputError
from layerscope.index.backend import select_backend
from layerscope.index.search import retrieval, self_knn
from layerscope.index.vector_index import VectorIndex, normalize
from layerscope.metrics import neighbors
from layerscope.metrics.neighbors import mutual_knn, recall_at_k, retrieval_metrics

pytest.importorskip("faiss")


def _pairs(n=300, d=24, noise=1.2, seed=0):
    rng = np.random.default_rng(seed)
    s = rng.standard_normal((n, d)).astype(np.float32)
    t = s + noise * rng.standard_normal((n, d)).astype(np.float32)
    return normalize(s), normalize(t)


def test_exact_retrieval_matches_numpy_ranks():
    S, T = _pairs()
    r = retrieval(S, T)
    assert r["index"] == "flat" and r["mrr_exact"]
    for name, (q, b) in (("src2tgt", (S, T)), ("tgt2src", (T, S))):
        expect = neighbors.retrieval_metrics(neighbors.cosine_ranks(q, b))
        for key in ("acc@1", "acc@5", "acc@10", "mrr"):
            assert r[name][key] == pytest.approx(expect[key], abs=1e-12), (name, key)
    assert 0.05 < r["src2tgt"]["acc@1"] < 0.95  # the test data is neither trivial nor hopeless


def test_mrr_cutoff_counts_misses_as_zero():
    ranks = np.array([1.0, 3.0, np.inf, 12.0])
    out = retrieval_metrics(ranks)
    assert out["acc@1"] == 0.25 and out["acc@5"] == 0.5 and out["acc@10"] == 0.5
    assert out["mrr"] == pytest.approx((1 + 1 / 3 + 0 + 1 / 12) / 4)


def test_ivf_retrieval_reports_recall_against_exact():
    S, T = _pairs(n=2000, d=16, noise=0.3)
    r = retrieval(S, T, ann_threshold=1000, index_params={"nlist": 20, "nprobe": 20})
    assert r["index"] == "ivf"
    rec = r["src2tgt"]["recall_vs_exact"]
    assert rec["recall@k"] == pytest.approx(1.0)  # every cell probed: exact
    exact = retrieval(S, T)
    assert r["src2tgt"]["acc@1"] == pytest.approx(exact["src2tgt"]["acc@1"])
    r2 = retrieval(S, T, ann_threshold=1000, index_params={"nlist": 20, "nprobe": 1})
    assert r2["src2tgt"]["recall_vs_exact"]["recall@k"] < 1.0


def test_self_knn_and_overlap_match_metrics():
    S, T = _pairs(n=200, d=12)
    a, b = self_knn(S, 5), self_knn(T, 5)
    np.testing.assert_array_equal(np.sort(a, 1), np.sort(neighbors.knn_indices(S, 5, backend="numpy"), 1))
    # the overlap by hand: a python set intersection per row
    by_hand = sum(len(set(r) & set(q)) for r, q in zip(a.tolist(), b.tolist())) / a.size
    assert mutual_knn(a, b) == pytest.approx(by_hand)
    assert mutual_knn(np.array([[1, -1]]), np.array([[-1, 1]])) == 0.5  # -1 (missing) never matches


@pytest.mark.parametrize("kind", ["flat", "hnsw", "binary", "ivf"])
def test_save_load_round_trip(tmp_path, kind):
    S, _ = _pairs(n=400, d=16)
    vi = VectorIndex.build(S, kind, normalized=True, nlist=8 if kind == "ivf" else None)
    s1, i1 = vi.search(S[:5], 3, normalized=True)
    vi.save(tmp_path / kind, layer="2")
    back = VectorIndex.load(tmp_path / kind)
    s2, i2 = back.search(S[:5], 3, normalized=True)
    np.testing.assert_array_equal(i1, i2)
    np.testing.assert_allclose(s1, s2)
    if kind != "binary":
        assert (i1[:, 0] == np.arange(5)).all() and np.allclose(s1[:, 0], 1.0, atol=1e-5)
    assert back.record.layer == "2" and back.record.kind == kind and back.record.n == 400


@pytest.mark.parametrize("field, value", [("max_length", "long"), ("store_identity", [1]), ("layer", {"x": 1}),
                                          ("seconds", {"build": "slow"})])
def test_an_index_json_field_of_the_wrong_type_is_one_line(tmp_path, field, value):
    """index.json is read once into a typed record: a wrong-typed field is refused on load, naming the file and
    saying to rebuild, not met later as a TypeError inside the query's embedding."""
    import json

    from layerscope.errors import StoreError

    S, _ = _pairs(n=50, d=8)
    VectorIndex.build(S, "flat", normalized=True).save(tmp_path / "i", layer="2", max_length=128)
    doc = json.loads((tmp_path / "i" / "index.json").read_text())
    assert VectorIndex.load(tmp_path / "i").record.max_length == doc["max_length"] == 128
    doc[field] = value
    (tmp_path / "i" / "index.json").write_text(json.dumps(doc))
    with pytest.raises(StoreError, match="rebuild the index") as exc:
        VectorIndex.load(tmp_path / "i")
    assert "\n" not in str(exc.value) and "index.json" in str(exc.value)


def test_recall_at_k_and_backend_choice():
    assert recall_at_k(np.array([[0, 1, -1]]), np.array([[1, 2, 0]])) == pytest.approx(2 / 3)
    assert select_backend("flat", "cpu").name == "faiss-cpu"
    b = select_backend("flat")
    assert b.name in ("faiss-cpu", "faiss-gpu", "torch-cuda") and b.describe()
    with pytest.raises(InputError, match="--kind"):
        VectorIndex.build(np.ones((3, 2), np.float32), "lsh")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_torch_topk_matches_faiss(device):
    torch = pytest.importorskip("torch")
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    from layerscope.metrics.neighbors_torch import topk_inner

    S, T = _pairs(n=3000, d=32)
    s, i = topk_inner(S[:50], T, 7, device=device, db_block=1000, query_block=16)
    exact = VectorIndex.build(T, "flat", normalized=True, device="cpu")
    es, ei = exact.search(S[:50], 7, normalized=True)
    np.testing.assert_array_equal(i, ei)
    np.testing.assert_allclose(s, es, atol=1e-5)


def test_exact_search_stays_exact_above_the_ann_threshold_only_on_a_gpu(monkeypatch):
    from layerscope.index import backend as backend_mod
    from layerscope.index.backend import Backend
    from layerscope.index.search import choose_kind

    assert choose_kind(10, "auto", 50) == "flat"
    monkeypatch.setattr(backend_mod, "select_backend", lambda kind, prefer="auto": Backend("faiss-cpu"))
    assert choose_kind(100, "auto", 50) == "ivf"
    monkeypatch.setattr(backend_mod, "select_backend", lambda kind, prefer="auto": Backend("torch-cuda", 1))
    assert choose_kind(100, "auto", 50) == "flat"
    assert choose_kind(100, "auto", 50, device="cpu") == "ivf"
    assert choose_kind(100, "hnsw", 50) == "hnsw"

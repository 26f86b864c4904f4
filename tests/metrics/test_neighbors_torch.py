"""Exact k-NN and retrieval ranks as blocked PyTorch products equal the numpy and FAISS paths, ties
included, whatever the block sizes (run on CPU tensors here; the same code runs on a CUDA GPU)."""

import numpy as np
import pytest

from layerscope.metrics import neighbors, neighbors_torch
from layerscope.metrics.vectors import l2_normalize

pytest.importorskip("torch")


def _tied(n=240, d=6, seed=0):
    """Signed basis vectors: every score is exactly -1, 0 or 1 (before and after normalisation), so
    every row has many exact ties and no rounding can break them."""
    rng = np.random.default_rng(seed)
    x = np.zeros((n, d), dtype=np.float32)
    x[np.arange(n), rng.integers(0, d, n)] = rng.choice([-1.0, 1.0], n)
    return x


@pytest.mark.parametrize("metric", ["dot", "cosine"])
@pytest.mark.parametrize("blocks", [(7, 13), (4096, 1 << 18)])
def test_knn_equals_numpy_with_ties(metric, blocks, monkeypatch):
    x = _tied()
    monkeypatch.setattr(neighbors_torch, "QUERY_BLOCK", blocks[0])
    monkeypatch.setattr(neighbors_torch, "DB_BLOCK", blocks[1])
    want = neighbors.knn_indices(x, 9, metric=metric, backend="numpy")
    xf = l2_normalize(x) if metric == "cosine" else x
    got = neighbors_torch.topk_inner(xf, xf, 9, device="cpu", exclude_self=True,
                                     query_block=blocks[0], db_block=blocks[1])[1]
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(neighbors.knn_indices(x, 9, metric=metric, backend="pytorch"), want)


def test_ties_go_to_the_lower_index_by_hand():
    x = np.array([[1, 0], [1, 0], [1, 0], [0, 1], [1, 0]], dtype=np.float32)
    # row 0's neighbours by dot: rows 1, 2, 4 score 1 (lower index first), row 3 scores 0
    s, i = neighbors_torch.topk_inner(x[:1], x, 3, device="cpu", exclude_self=True, db_block=2)
    assert i.tolist() == [[1, 2, 4]] and s.tolist() == [[1.0, 1.0, 1.0]]


def test_knn_equals_faiss_without_ties():
    pytest.importorskip("faiss")
    rng = np.random.default_rng(1)
    x = rng.normal(size=(500, 24)).astype(np.float32)
    for metric in ("cosine", "l2"):
        want = neighbors.knn_indices(x, 10, metric=metric, backend="faiss")
        np.testing.assert_array_equal(neighbors.knn_indices(x, 10, metric=metric, backend="pytorch"), want)


def test_cosine_ranks_equal_numpy_ties_as_half():
    src, tgt = _tied(seed=2), _tied(seed=3)
    want = neighbors.cosine_ranks(src, tgt, backend="numpy")
    assert np.any(want != np.round(want))  # ties really happen here
    got = neighbors_torch.cosine_ranks(l2_normalize(src), l2_normalize(tgt), device="cpu", query_block=17,
                                       db_block=50)
    np.testing.assert_array_equal(got, want)


def test_cosine_ranks_by_hand():
    src = np.array([[1, 0], [0, 1], [1, 1]], dtype=np.float32)
    tgt = np.array([[1, 0], [1, 0], [0, 1]], dtype=np.float32)
    # query 0: targets score 1, 1, 0; its own (0) ties with 1 -> rank 1.5
    # query 1: scores 0, 0, 1; its own (1) is 0, one higher, target 0 tied -> 1 + 1 + 1/2
    # query 2: scores .707, .707, .707; all tied -> 1 + 2/2 = 2
    got = neighbors_torch.cosine_ranks(l2_normalize(src), l2_normalize(tgt), device="cpu")
    assert got.tolist() == [1.5, 2.5, 2.0]
    np.testing.assert_array_equal(neighbors.cosine_ranks(src, tgt, backend="numpy"), got)


def test_auto_stays_off_torch_without_a_gpu(monkeypatch):
    monkeypatch.setattr(neighbors_torch, "cuda_device", lambda: None)
    assert neighbors._torch_device("auto") is None
    assert neighbors._torch_device("pytorch") == "cpu"
    monkeypatch.setattr(neighbors_torch, "cuda_device", lambda: "cuda")
    assert neighbors._torch_device("auto") == "cuda"
    with pytest.raises(ValueError, match="backend must be"):
        neighbors._torch_device("gpu")


def test_topk_takes_vectors_already_on_the_device():
    import torch

    rng = np.random.default_rng(4)
    x = l2_normalize(rng.standard_normal((300, 12)).astype(np.float32))
    want = neighbors_torch.topk_inner(x[:40], x, 6, device="cpu", db_block=70)
    on = neighbors_torch.resident(x, "cpu")
    assert torch.is_tensor(on) and on.data_ptr() == x.ctypes.data  # shared on the CPU, not copied
    got = neighbors_torch.topk_inner(x[:40], on, 6, device="cpu", db_block=70)
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[0], want[0])
    assert neighbors_torch.resident(x.astype(np.float16), "cpu") is None  # would be a copy: blocks instead


def test_a_torch_cuda_index_moves_its_vectors_once(monkeypatch):
    pytest.importorskip("faiss")
    from layerscope.index import vector_index
    from layerscope.index.backend import Backend

    x = l2_normalize(np.random.default_rng(5).standard_normal((50, 8)).astype(np.float32))
    monkeypatch.setattr(vector_index, "select_backend", lambda kind, prefer="auto": Backend("torch-cuda", 1))
    moved, bases = [], []
    monkeypatch.setattr(neighbors_torch, "resident", lambda v, device: moved.append(device) or ("on", device))
    monkeypatch.setattr(neighbors_torch, "topk_inner",
                        lambda q, base, k, device: bases.append(base) or (np.zeros((len(q), k), np.float32),
                                                                           np.zeros((len(q), k), np.int64)))
    vi = vector_index.VectorIndex.build(x, "flat", normalized=True)
    vi.search(x, 3, normalized=True, block=7)  # 8 query blocks
    assert moved == ["cuda"] and len(bases) == 8 and all(b == ("on", "cuda") for b in bases)

"""Nearest neighbours, in one place: exact k-NN, mutual k-NN, retrieval ranks and their figures.

The FAISS indexes (:mod:`layerscope.index`) build on these: they drop the
query from its own neighbour list with :func:`drop_self`, compare
neighbourhoods with :func:`mutual_knn` and summarise ranks with
:func:`retrieval_metrics`.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from layerscope.metrics.checks import BLOCK_ELEMENTS, as_matrix, as_vector, check_finite, float_dtype, row_blocks
from layerscope.metrics.ties import SCREEN, TiedRanks, float64_tie_counts
from layerscope.metrics.vectors import l2_normalize

def as_tied_ranks(ranks) -> TiedRanks:
    """``ranks`` as they are (a :class:`TiedRanks`), or whole 1-based ranks without ties (``inf``: beyond a
    cutoff). A fractional rank is refused: it hides how many candidates share it."""
    if isinstance(ranks, TiedRanks):
        r = ranks
        above = as_vector(r.above, "ranks.above").astype(np.float64)
        tied = as_vector(r.tied, "ranks.tied")
        if above.shape != tied.shape:
            raise ValueError(f"ranks.above and ranks.tied differ in length: {above.shape} and {tied.shape}")
        if np.any(above < 0) or np.any(tied < 1) or np.any(np.isnan(above)):
            raise ValueError("ranks.above must be >= 0 and ranks.tied >= 1")
        return TiedRanks(above, tied)
    r = as_vector(ranks, "ranks").astype(np.float64)
    check_finite(np.where(r == np.inf, 1.0, r), "ranks")
    if r.size and np.any(r < 1):
        raise ValueError(f"ranks are 1-based; got a minimum of {r.min():g}")
    if np.any(np.isfinite(r) & (r != np.floor(r))):
        raise ValueError("a fractional rank hides the size of its tie; pass TiedRanks (above, tied) instead")
    return TiedRanks(r - 1.0, np.ones(r.shape, dtype=np.int64))


def retrieval_metrics(ranks, ks: Sequence[int] = (1, 5, 10)) -> dict:
    """Accuracy@k and mean reciprocal rank of the correct item, ties counted as their expectation.

    ``ranks``: a :class:`TiedRanks`, or whole 1-based ranks (no ties). Where the item shares its score
    with others, its hit at k and reciprocal rank are their means over every order of the tied block, so
    the figures do not depend on the order an engine happens to list equal scores in. An item beyond a
    search cutoff (``inf``, see :func:`layerscope.index.search.partner_ranks`) is a miss at every k and
    counts 0 towards MRR. Returns ``{"acc@1": ..., "acc@5": ..., ..., "mrr": ...}``.
    """
    r = as_tied_ranks(ranks)
    if r.above.size == 0:
        raise ValueError("ranks is empty")
    out: dict = {}
    for k in ks:
        if int(k) != k or k < 1:
            raise ValueError(f"every k must be a positive integer, got {k}")
        out[f"acc@{int(k)}"] = float(np.mean(r.hits(int(k))))
    out["mrr"] = float(np.mean(r.reciprocal()))
    return out


def tied_ranks_from_scores(scores, correct) -> TiedRanks:
    """Per query, how many scores are strictly higher than the correct item's and how many equal it
    (itself included); ``scores`` ``[q, n]``, higher = better, compared exactly as given."""
    S = as_matrix(scores, "scores")
    c = as_vector(correct, "correct")
    if c.shape[0] != S.shape[0]:
        raise ValueError(f"scores has {S.shape[0]} queries but correct has {c.shape[0]}")
    if not np.issubdtype(c.dtype, np.integer):
        raise ValueError(f"correct must hold integer indices, got dtype {c.dtype}")
    if c.size and (c.min() < 0 or c.max() >= S.shape[1]):
        raise ValueError(f"correct indices must lie in [0, {S.shape[1]}), got {c.min()}..{c.max()}")
    check_finite(S, "scores")
    above = np.empty(S.shape[0], dtype=np.float64)
    tied = np.empty(S.shape[0], dtype=np.int64)
    for s in row_blocks(S.shape[0], S.shape[1]):
        block = S[s]
        target = block[np.arange(block.shape[0]), c[s]][:, None]
        above[s] = (block > target).sum(axis=1)
        tied[s] = (block == target).sum(axis=1)
    return TiedRanks(above, tied)


def cosine_tie_counts(queries: np.ndarray, base: np.ndarray, correct: np.ndarray,
                      scores: np.ndarray | None = None) -> TiedRanks:
    """Exact-tie counts of ``base[correct[i]]`` among all ``base`` rows for ``queries[i]`` (unit float rows).

    ``scores``: ``queries @ base.T`` (float32 or float64) where already computed. A row where another candidate
    scores within :data:`~layerscope.metrics.ties.SCREEN` of the correct one is scored again in float64 and counted
    there with :data:`~layerscope.metrics.ties.TIE_TOL`, so every engine counts the same ties for the same vectors.
    """
    q32, b32 = np.asarray(queries), np.asarray(base)
    c = np.asarray(correct, dtype=np.int64)
    s = q32 @ b32.T if scores is None else np.asarray(scores)
    target = np.einsum("ij,ij->i", q32, b32[c]).astype(s.dtype)[:, None]  # in the rows' own precision
    above = (s > target + SCREEN).sum(axis=1).astype(np.float64)
    near = np.abs(s - target) <= SCREEN
    near[np.arange(len(c)), c] = False
    tied = np.ones(len(c), dtype=np.int64)
    redo = np.flatnonzero(near.any(axis=1))
    if redo.size:
        a64, t64 = float64_tie_counts(q32[redo], b32, c[redo])
        above[redo], tied[redo] = a64, t64
    return TiedRanks(above, tied)


def ranks_from_scores(scores, correct) -> np.ndarray:
    """1-based rank of the correct item per query; higher score = better.

    ``scores`` is ``[q, n]``, ``correct`` holds the index of the right item
    for each query. Ties share the mean rank:
    ``rank = 1 + #(strictly higher) + #(equal, other than itself) / 2``,
    so a correct item tied with one other at the top gets 1.5. Returns float64
    (:func:`tied_ranks_from_scores` keeps the size of each tie for :func:`retrieval_metrics`).
    """
    return tied_ranks_from_scores(scores, correct).mean


def cosine_ranks(src, tgt, *, block_size: int = 1024, backend: str = "auto") -> np.ndarray:
    """The mean rank of each pair's tied block (:func:`cosine_tied_ranks`), float64."""
    return cosine_tied_ranks(src, tgt, block_size=block_size, backend=backend).mean


def cosine_tied_ranks(src, tgt, *, block_size: int = 1024, backend: str = "auto") -> TiedRanks:
    """Rank of ``tgt[i]`` among all targets for query ``src[i]`` by cosine.

    Blocked over queries, so it holds ``block_size x n`` scores, never
    ``n x n``. Ties are exact cosine ties (:func:`cosine_tie_counts`), the same on every backend.
    ``backend``: ``"numpy"``, ``"pytorch"`` (float32 blocked products on a CUDA GPU,
    :mod:`layerscope.metrics.neighbors_torch`) or ``"auto"`` (PyTorch where it sees a GPU).
    """
    S = as_matrix(src, "src")
    T = as_matrix(tgt, "tgt")
    if S.shape != T.shape:
        raise ValueError(f"src and tgt must have the same shape, got {S.shape} and {T.shape}")
    check_finite(S, "src")
    check_finite(T, "tgt")
    device = _torch_device(backend)
    dtype = np.float32 if device else float_dtype(S, T)
    Sn = l2_normalize(S.astype(dtype, copy=False))
    Tn = l2_normalize(T.astype(dtype, copy=False))
    if device:
        from layerscope.metrics import neighbors_torch

        return neighbors_torch.cosine_tied_ranks(Sn, Tn, device=device)
    n = S.shape[0]
    above = np.empty(n, dtype=np.float64)
    tied = np.empty(n, dtype=np.int64)
    for q0 in range(0, n, max(1, block_size)):
        q1 = min(n, q0 + max(1, block_size))
        r = cosine_tie_counts(Sn[q0:q1], Tn, np.arange(q0, q1), scores=Sn[q0:q1] @ Tn.T)
        above[q0:q1], tied[q0:q1] = r.above, r.tied
    return TiedRanks(above, tied)


def hamming_ranks(query_codes, doc_codes, correct) -> np.ndarray:
    """The mean rank of each query's tied block (:func:`hamming_tied_ranks`), float64."""
    return hamming_tied_ranks(query_codes, doc_codes, correct).mean


def hamming_tied_ranks(query_codes, doc_codes, correct) -> TiedRanks:
    """1-based rank of ``doc_codes[correct[i]]`` for ``query_codes[i]`` by Hamming distance, nearest first.

    Codes are packed sign bits (uint8 ``[n, bytes]``, :func:`layerscope.metrics.quantization.binary_quantize`).
    Distances come from a FAISS ``IndexBinaryFlat`` (every document, exact);
    equal distances are ties (:func:`tied_ranks_from_scores`).
    """
    import faiss

    Q = as_matrix(query_codes, "query_codes")
    D = as_matrix(doc_codes, "doc_codes")
    if Q.dtype != np.uint8 or D.dtype != np.uint8 or Q.shape[1] != D.shape[1]:
        raise ValueError(f"codes must be packed uint8 of one width, got {Q.dtype} {Q.shape} and {D.dtype} {D.shape}")
    index = faiss.IndexBinaryFlat(D.shape[1] * 8)
    index.add(np.ascontiguousarray(D))
    dist, ids = index.search(np.ascontiguousarray(Q), D.shape[0])
    scores = np.empty(dist.shape, dtype=np.float64)
    np.put_along_axis(scores, ids.astype(np.int64), -dist.astype(np.float64), axis=1)
    return tied_ranks_from_scores(scores, correct)


def mutual_knn(a_neighbors, b_neighbors) -> float:
    """Mean share of shared neighbours: ``mean_i |N_a(i) & N_b(i)| / k``.

    Both are ``[n, k]`` integer neighbour lists of the same n items in two
    spaces (self excluded, no repeats within a row). A negative entry is a
    neighbour an approximate index did not return: it never matches.
    """
    A = as_matrix(a_neighbors, "a_neighbors")
    B = as_matrix(b_neighbors, "b_neighbors")
    if A.shape != B.shape:
        raise ValueError(f"neighbour lists must have the same shape, got {A.shape} and {B.shape}")
    n, k = A.shape
    if n == 0 or k == 0:
        raise ValueError(f"neighbour lists must be non-empty, got shape {A.shape}")
    for arr, name in ((A, "a_neighbors"), (B, "b_neighbors")):
        if not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"{name} must hold integer indices, got dtype {arr.dtype}")
        srt = np.sort(arr, axis=1)
        if k > 1 and np.any((srt[:, 1:] == srt[:, :-1]) & (srt[:, 1:] >= 0)):
            raise ValueError(f"{name} repeats an index within a row")
    shared = 0
    for s in row_blocks(n, k * k):
        a = A[s][:, :, None]
        shared += int(((a == B[s][:, None, :]) & (a >= 0)).any(axis=2).sum())
    return shared / (n * k)


def recall_at_k(approx_ids, exact_ids) -> float:
    """Mean share of each query's exact top-k found in the approximate top-k.

    The same count as :func:`mutual_knn` of the two ``[q, k]`` id lists (an
    id of -1, a result the approximate index did not return, never counts).
    """
    return mutual_knn(approx_ids, exact_ids)


_KNN_METRICS = ("cosine", "dot", "l2")


def drop_self(idx: np.ndarray, rows: np.ndarray, k: int) -> np.ndarray:
    """From ``[b, k+1]`` neighbour lists remove the query itself (or the last one)."""
    is_self = idx == rows[:, None]
    no_self = ~is_self.any(axis=1)
    is_self[no_self, -1] = True
    return idx[~is_self].reshape(idx.shape[0], k)


def _knn_faiss(x: np.ndarray, k: int, metric: str, block_size: int) -> np.ndarray:
    import faiss

    d = x.shape[1]
    index = faiss.IndexFlatL2(d) if metric == "l2" else faiss.IndexFlatIP(d)
    index.add(x)
    n = x.shape[0]
    out = np.empty((n, k), dtype=np.int64)
    for q0 in range(0, n, block_size):
        q1 = min(n, q0 + block_size)
        _, idx = index.search(x[q0:q1], k + 1)
        out[q0:q1] = drop_self(idx.astype(np.int64), np.arange(q0, q1), k)
    return out


def _knn_numpy(x: np.ndarray, k: int, metric: str, block_size: int) -> np.ndarray:
    n = x.shape[0]
    sq = np.einsum("ij,ij->i", x, x) if metric == "l2" else None
    out = np.empty((n, k), dtype=np.int64)
    step = max(1, min(block_size, BLOCK_ELEMENTS // n))
    for q0 in range(0, n, step):
        q1 = min(n, q0 + step)
        scores = x[q0:q1] @ x.T  # higher = nearer
        if metric == "l2":
            scores = 2 * scores - sq[None, :]
        b = q1 - q0
        rows = np.arange(b)
        scores[rows, rows + q0] = -np.inf
        # k-th best score per row, then everything above it plus the
        # lowest-index ties at it: exactly k per row, deterministic under ties.
        kth = -np.partition(-scores, k - 1, axis=1)[:, k - 1:k]
        above = scores > kth
        at = scores == kth
        room = k - above.sum(axis=1, keepdims=True)
        chosen = above | (at & (np.cumsum(at, axis=1) <= room))
        part = np.nonzero(chosen)[1].reshape(b, k)
        part_scores = np.take_along_axis(scores, part, axis=1)
        order = np.lexsort((part, -part_scores), axis=1)
        out[q0:q1] = np.take_along_axis(part, order, axis=1)
    return out


def _torch_device(backend: str) -> str | None:
    """The device a ``"pytorch"``/``"auto"`` backend runs on (None: not PyTorch)."""
    if backend not in ("auto", "numpy", "faiss", "pytorch"):
        raise ValueError(f"backend must be 'auto', 'numpy', 'faiss' or 'pytorch', got {backend!r}")
    if backend in ("numpy", "faiss"):
        return None
    from layerscope.metrics.neighbors_torch import cuda_device

    device = cuda_device()
    if backend == "pytorch":
        return device or "cpu"
    return device


def knn_indices(
    x, k: int, *, metric: str = "cosine", block_size: int = 4096, backend: str = "auto"
) -> np.ndarray:
    """Exact k nearest neighbours of every row among the rows, self excluded.

    ``metric``: ``"cosine"`` (rows L2-normalised, inner product), ``"dot"``
    (raw inner product) or ``"l2"`` (Euclidean). Returns int64 ``[n, k]``,
    nearest first. Uses a faiss ``IndexFlatIP``/``IndexFlatL2`` on float32
    (``backend="faiss"``), blocked numpy matrix products (``backend="numpy"``), or
    blocked float32 products in PyTorch (``backend="pytorch"``, on a CUDA GPU where
    present); ``"auto"`` picks PyTorch where PyTorch sees a GPU, else faiss when it
    imports, else numpy.
    Queries go in blocks of ``block_size``, so no n x n array is ever held.
    Among exact ties the numpy and pytorch backends take and list lower indices
    first; faiss uses its own order.
    """
    X = as_matrix(x, "x")
    if metric not in _KNN_METRICS:
        raise ValueError(f"metric must be one of {_KNN_METRICS}, got {metric!r}")
    device = _torch_device(backend)
    n = X.shape[0]
    if int(k) != k or k < 1 or k > n - 1:
        raise ValueError(f"k must be an integer in [1, n-1] = [1, {n - 1}], got {k}")
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    check_finite(X, "x")
    k = int(k)
    xf = X.astype(np.float32)
    if metric == "cosine":
        xf = l2_normalize(xf)
    xf = np.ascontiguousarray(xf)
    if device:
        from layerscope.metrics import neighbors_torch

        return neighbors_torch.knn(xf, k, metric, device=device)
    if backend == "auto":
        try:
            import faiss  # noqa: F401

            backend = "faiss"
        except ImportError:
            backend = "numpy"
    if backend == "faiss":
        return _knn_faiss(xf, k, metric, block_size)
    return _knn_numpy(xf, k, metric, block_size)


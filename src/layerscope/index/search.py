"""Retrieval ranks and k-NN graphs through FAISS indexes, without an n x n matrix.

* :func:`retrieval` -- for each query row i, where does its partner row i of
  the base land when all base rows are ranked by cosine? Exact (``flat``)
  up to ``ann_threshold`` rows, an IVF or HNSW index above it, with its recall
  against exact search measured on a seeded sample of queries.
* :func:`self_knn` -- each row's k nearest other rows, for mutual k-NN
  (:func:`layerscope.metrics.neighbors.mutual_knn`).

Exact (``flat``) ranks are counted, not searched: one plus the rows scoring
strictly above the partner, inside the blocked product, both directions from
one product (:func:`layerscope.metrics.neighbors_torch.paired_tied_ranks`,
on a GPU where PyTorch sees one, else on the CPU). Approximate indexes rank
within their top ``mrr_cutoff`` results. Either way MRR stops at ``mrr_cutoff``
(default 1000, capped at n): when n <= cutoff it is the full MRR; above it a
partner with ``cutoff`` or more rows above it counts 0 towards MRR (it would
count < 1/cutoff) and misses at every k.
A partner that shares its cosine with other rows counts as its expectation
over a random order of the tied rows (:class:`layerscope.metrics.ties.TiedRanks`),
the same figure on every engine.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from layerscope.index.vector_index import VectorIndex, measure_recall
from layerscope.metrics.checks import BLOCK_ELEMENTS
from layerscope.metrics.neighbors import drop_self, retrieval_metrics
from layerscope.metrics.ties import SCREEN, TIE_TOL, TiedRanks, float64_tie_counts

DEFAULT_ANN_THRESHOLD = 50_000
DEFAULT_MRR_CUTOFF = 1000


def choose_kind(n: int, kind: str = "auto", ann_threshold: int = DEFAULT_ANN_THRESHOLD, device: str = "auto") -> str:
    """``kind`` as asked; under ``auto``, exact (``flat``) up to ``ann_threshold`` rows, IVF above it, except
    where exact search runs on a GPU (FAISS GPU or PyTorch), which stays exact at any size."""
    if kind != "auto":
        return kind
    if n <= ann_threshold:
        return "flat"
    from layerscope.index.backend import select_backend

    return "flat" if device != "cpu" and select_backend("flat", device).name != "faiss-cpu" else "ivf"


def partner_ranks(index: VectorIndex, queries: np.ndarray, cutoff: int, *, base: np.ndarray | None = None,
                  block: int = 4096) -> TiedRanks:
    """Where base row i lands for query row i within the top ``cutoff``, ties counted (``above = inf``: not
    there).

    With ``base`` (the index's unit float32 rows), exact ties are counted as on the numpy and PyTorch paths
    (:func:`layerscope.metrics.neighbors.cosine_tie_counts`): the returned rows within ``SCREEN`` of the
    partner's score are scored again in float64 and tie within ``TIE_TOL``, so the figure does not depend on
    the order FAISS lists equal scores in. Where the last returned row is that close too (a tie may run past
    the cutoff), an exact index counts over every base row in float64. An approximate index (IVF, HNSW)
    counts among the rows it returned. Without ``base`` (a binary index) the rank is the partner's place in
    the returned list.
    """
    n = queries.shape[0]
    k = int(min(cutoff, index.n))
    above = np.full(n, np.inf)
    tied = np.ones(n, dtype=np.int64)
    exact = index.kind == "flat"
    for q0 in range(0, n, block):
        q1 = min(n, q0 + block)
        scores, ids = index.search(queries[q0:q1], k, normalized=True, block=block)
        rows = np.arange(q0, q1)
        hit = ids == rows[:, None]
        found = hit.any(axis=1)
        if base is None:
            above[q0:q1][found] = hit[found].argmax(axis=1)
            continue
        q = queries[q0:q1]
        target = np.einsum("ij,ij->i", q, base[q0:q1])[:, None]
        valid = (ids >= 0) & ~hit
        near = (np.abs(scores - target) <= SCREEN) & valid & found[:, None]
        a_b = ((scores > target + SCREEN) & valid).sum(axis=1).astype(np.float64)
        a_near, t_near = _near_counts(q, base, ids, near, rows)
        a_b, t_b = np.where(found, a_b + a_near, np.inf), 1 + t_near
        full = (ids[:, -1] < 0) | (k == index.n)
        past = ~full & (scores[:, -1] >= target[:, 0] - SCREEN)  # the tie or the partner may run past the list
        redo = np.flatnonzero(past) if exact else np.empty(0, dtype=np.int64)
        if redo.size:
            a64, t64 = float64_tie_counts(q[redo], base, rows[redo])
            a_b[redo], t_b[redo] = np.where(a64 >= k, np.inf, a64), t64
        above[q0:q1], tied[q0:q1] = a_b, t_b
    return TiedRanks(above, tied)


def _near_counts(q: np.ndarray, base: np.ndarray, ids: np.ndarray, near: np.ndarray,
                 rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per query, the ``near`` returned rows that score above its partner, and that tie with it, in float64."""
    b = q.shape[0]
    r, c = np.nonzero(near)
    if r.size == 0:
        return np.zeros(b), np.zeros(b, dtype=np.int64)
    own = np.einsum("ij,ij->i", q.astype(np.float64), base[rows].astype(np.float64))
    diff = np.empty(r.size)
    step = max(1, BLOCK_ELEMENTS // max(1, q.shape[1]))
    for e0 in range(0, r.size, step):
        rr, cand = r[e0:e0 + step], ids[r[e0:e0 + step], c[e0:e0 + step]]
        s64 = np.einsum("ij,ij->i", q[rr].astype(np.float64), base[cand].astype(np.float64))
        diff[e0:e0 + step] = s64 - own[rr]
    return (np.bincount(r[diff > TIE_TOL], minlength=b).astype(np.float64),
            np.bincount(r[np.abs(diff) <= TIE_TOL], minlength=b))


def retrieval(src: np.ndarray, tgt: np.ndarray, *, ks=(1, 5, 10), kind: str = "auto",
              ann_threshold: int = DEFAULT_ANN_THRESHOLD, mrr_cutoff: int = DEFAULT_MRR_CUTOFF,
              recall_queries: int = 1000, seed: int = 0, device: str = "auto",
              index_params: dict | None = None) -> dict[str, Any]:
    """Retrieval both ways over unit-normalised float32 ``src``/``tgt`` (row i of each is a pair)."""
    n = src.shape[0]
    kind = choose_kind(n, kind, ann_threshold, device)
    cutoff = int(min(n, mrr_cutoff))
    out: dict[str, Any] = {"index": kind, "n": int(n), "mrr_cutoff": cutoff, "mrr_exact": cutoff >= n}
    where = counting_device(device) if kind == "flat" else None
    if where is not None:
        return _counted(src, tgt, ks, cutoff, where, out)
    for name, (q, base) in (("src2tgt", (src, tgt)), ("tgt2src", (tgt, src))):
        t0 = time.perf_counter()
        vi = VectorIndex.build(base, kind, normalized=True, seed=seed, device=device, **(index_params or {}))
        t1 = time.perf_counter()
        ranks = partner_ranks(vi, q, cutoff, base=None if vi.kind == "binary" else base)
        t2 = time.perf_counter()
        figs: dict[str, Any] = retrieval_metrics(ranks, ks)
        figs["ties"] = int(np.count_nonzero(ranks.tied > 1))  # queries whose partner shares its score
        figs["ranks"] = ranks  # per query, for intervals over the queries (not written to results files)
        figs["seconds_build"] = round(t1 - t0, 3)
        figs["seconds_search"] = round(t2 - t1, 3)
        if kind != "flat":
            rng = np.random.default_rng(seed)
            m = min(recall_queries, n)
            sample = q[np.sort(rng.choice(n, m, replace=False))]
            figs["recall_vs_exact"] = measure_recall(vi, base, sample, k=min(10, n))
            figs["params"] = vi.params
        out[name] = figs
        out["backend"] = vi.backend.describe()
    return out


def counting_device(device: str = "auto") -> str | None:
    """Where exact retrieval counts ranks (:func:`layerscope.metrics.neighbors_torch.paired_tied_ranks`):
    ``"cuda"`` where the flat backend is a GPU and PyTorch sees it, ``"cpu"`` where it is the CPU; None where
    a FAISS GPU index exists but PyTorch sees no GPU (the FAISS search then runs as it is)."""
    from layerscope.index.backend import select_backend
    from layerscope.metrics.neighbors_torch import cuda_device

    if select_backend("flat", device).name == "faiss-cpu":
        return "cpu"
    return cuda_device()


def _counted(src: np.ndarray, tgt: np.ndarray, ks, cutoff: int, where: str, out: dict[str, Any]) -> dict[str, Any]:
    """Exact retrieval both ways from one blocked product per block, ranks counted, no top-k: a partner
    with ``cutoff`` or more rows strictly above it is beyond the cutoff (``above = inf``), as a top-``cutoff``
    search that does not list it counts it; its tie is kept, as the float64 recount there keeps it."""
    from layerscope.metrics.neighbors_torch import paired_tied_ranks

    t0 = time.perf_counter()
    both = paired_tied_ranks(src, tgt, device=where)
    seconds = round(time.perf_counter() - t0, 3)
    for name, ranks in zip(("src2tgt", "tgt2src"), both):
        ranks = TiedRanks(np.where(ranks.above >= cutoff, np.inf, ranks.above), ranks.tied)
        figs: dict[str, Any] = retrieval_metrics(ranks, ks)
        figs["ties"] = int(np.count_nonzero(ranks.tied > 1))
        figs["ranks"] = ranks
        figs["seconds_build"] = 0.0
        figs["seconds_search"] = None  # one product serves both directions: see seconds_search_both
        out[name] = figs
    out["seconds_search_both"] = seconds
    out["backend"] = (f"exact rank counting (no top-k) in blocked float32 products with PyTorch on {where}, "
                      "both directions from one product")
    return out


def self_knn(x: np.ndarray, k: int, *, kind: str = "auto", ann_threshold: int = DEFAULT_ANN_THRESHOLD,
             seed: int = 0, device: str = "auto", block: int = 4096, index_params: dict | None = None) -> np.ndarray:
    """``[n, k]`` nearest other rows (cosine, rows unit-normalised), self removed.

    Missing neighbours (an approximate index can return fewer than asked) are
    -1. Where the query itself is not among its k + 1 results (ties, ANN), the
    last result is dropped instead (:func:`layerscope.metrics.neighbors.drop_self`).
    """
    n = x.shape[0]
    kind = choose_kind(n, kind, ann_threshold, device)
    vi = VectorIndex.build(x, kind, normalized=True, seed=seed, device=device, **(index_params or {}))
    out = np.empty((n, k), dtype=np.int64)
    for q0 in range(0, n, block):
        q1 = min(n, q0 + block)
        _, ids = vi.search(x[q0:q1], k + 1, normalized=True, block=block)
        out[q0:q1] = drop_self(ids, np.arange(q0, q1), k)
    return out

"""Retrieval ranks and k-NN graphs through FAISS indexes, without an n x n matrix.

* :func:`retrieval` -- for each query row i, where does its partner row i of
  the base land when all base rows are ranked by cosine? Exact (``flat``)
  up to ``ann_threshold`` rows, an IVF or HNSW index above it, with its recall
  against exact search measured on a seeded sample of queries.
* :func:`self_knn` -- each row's k nearest other rows, for mutual k-NN
  (:func:`layerscope.metrics.neighbors.mutual_knn`).

Ranks are found in the top ``mrr_cutoff`` results (default 1000, capped at n):
when n <= cutoff they are exact and MRR is the full MRR; above it a partner
ranked below the cutoff counts 0 towards MRR (it would count < 1/cutoff).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from layerscope.index.vector_index import VectorIndex, measure_recall
from layerscope.metrics.neighbors import drop_self, retrieval_metrics

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


def partner_ranks(index: VectorIndex, queries: np.ndarray, cutoff: int, *, block: int = 4096) -> np.ndarray:
    """1-based rank of base row i for query row i within the top ``cutoff``; ``inf`` when not there."""
    n = queries.shape[0]
    k = int(min(cutoff, index.n))
    ranks = np.full(n, np.inf)
    for q0 in range(0, n, block):
        q1 = min(n, q0 + block)
        _, ids = index.search(queries[q0:q1], k, normalized=True, block=block)
        hit = ids == np.arange(q0, q1)[:, None]
        found = hit.any(axis=1)
        ranks[q0:q1][found] = hit[found].argmax(axis=1) + 1
    return ranks


def retrieval(src: np.ndarray, tgt: np.ndarray, *, ks=(1, 5, 10), kind: str = "auto",
              ann_threshold: int = DEFAULT_ANN_THRESHOLD, mrr_cutoff: int = DEFAULT_MRR_CUTOFF,
              recall_queries: int = 1000, seed: int = 0, device: str = "auto",
              index_params: dict | None = None) -> dict[str, Any]:
    """Retrieval both ways over unit-normalised float32 ``src``/``tgt`` (row i of each is a pair)."""
    n = src.shape[0]
    kind = choose_kind(n, kind, ann_threshold, device)
    cutoff = int(min(n, mrr_cutoff))
    out: dict[str, Any] = {"index": kind, "n": int(n), "mrr_cutoff": cutoff, "mrr_exact": cutoff >= n}
    for name, (q, base) in (("src2tgt", (src, tgt)), ("tgt2src", (tgt, src))):
        t0 = time.perf_counter()
        vi = VectorIndex.build(base, kind, normalized=True, seed=seed, device=device, **(index_params or {}))
        t1 = time.perf_counter()
        ranks = partner_ranks(vi, q, cutoff)
        t2 = time.perf_counter()
        figs: dict[str, Any] = retrieval_metrics(ranks, ks)
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

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
A partner that shares its cosine with other rows counts as its expectation
over a random order of the tied rows (:class:`layerscope.metrics.neighbors.TiedRanks`),
the same figure on every engine.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from layerscope.index.vector_index import VectorIndex, measure_recall
from layerscope.metrics.neighbors import SCREEN, TIE_TOL, TiedRanks, _float64_counts, drop_self, retrieval_metrics

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
    (:func:`layerscope.metrics.neighbors.cosine_tie_counts`): a query whose partner scores within ``SCREEN``
    of another returned row, or of the last returned row (a tie may run past the cutoff), is counted again
    from float64 cosines over every base row, so the figure does not depend on the order FAISS lists equal
    scores in. An approximate index (IVF, HNSW) counts only among the rows it returned. Without ``base``
    (a binary index) the rank is the partner's place in the returned list.
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
        target = np.einsum("ij,ij->i", queries[q0:q1], base[q0:q1])[:, None]
        valid = (ids >= 0) & ~hit
        above_b = np.where(found | exact, ((scores > target + SCREEN) & valid).sum(axis=1), np.inf)
        near = ((np.abs(scores - target) <= SCREEN) & valid).any(axis=1)
        full = (ids[:, -1] < 0) | (k == index.n)
        past = ~full & (scores[:, -1] >= target[:, 0] - SCREEN)  # the tie or the partner may run past the list
        if exact:
            above_b = np.where(~found & ~past, np.inf, above_b)
            redo = np.flatnonzero(near | past)
            if redo.size:
                a64, t64 = _float64_counts(queries[q0:q1][redo], base, rows[redo])
                above_b[redo], tied[q0:q1][redo] = np.where(a64 >= k, np.inf, a64), t64
        else:
            redo = np.flatnonzero(near & found)
            for r in redo:  # approximate: count among the returned rows only
                got = ids[r][ids[r] >= 0]
                s64 = base[got].astype(np.float64) @ queries[q0 + r].astype(np.float64)
                own = float(base[q0 + r].astype(np.float64) @ queries[q0 + r].astype(np.float64))
                above_b[r] = float((s64 > own + TIE_TOL).sum())
                tied[q0 + r] = int((np.abs(s64 - own) <= TIE_TOL).sum())
        above[q0:q1] = above_b
    return TiedRanks(above, tied)


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

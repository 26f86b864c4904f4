"""Alignment figures of two paired vector sets (``src[i]`` and ``tgt[i]`` are a pair), without an n x n matrix.

Matched vs scrambled cosine (the exact permutation z, and a Monte Carlo z with its standard error as a
check where asked),
retrieval both ways and mutual k-NN through FAISS indexes, and PCA over both
sides stacked. The alignment analysis reports them per layer; the FAISS
benchmark (:mod:`layerscope.index.bench`) times them at scale.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from layerscope.index.search import retrieval, self_knn
from layerscope.index.vector_index import normalize
from layerscope.metrics.neighbors import mutual_knn
from layerscope.metrics.pca import cohens_d, pca_summary
from layerscope.metrics.permutation import scrambled_z, scrambled_z_exact

PCA_KS = (2, 5, 10)


def _try(fn, *args, **kwargs):
    """(value, None) or (None, reason) for metrics that are undefined on some inputs."""
    try:
        return fn(*args, **kwargs), None
    except ValueError as exc:
        return None, str(exc)


def alignment_figures(src: np.ndarray, tgt: np.ndarray, *, n_perm: int = 0, seed: int = 0, knn_k: int = 10,
                      pca_ks=PCA_KS, ann_threshold: int = 50_000, index_kind: str = "auto", device: str = "auto",
                      index_params: dict | None = None, timings: dict | None = None,
                      cpu_timings: dict | None = None) -> dict[str, Any]:
    """Every alignment figure for one (layer, pooling): ``src[i]`` and ``tgt[i]`` are a pair.

    ``z`` and the z within the first k principal components are exact: the permutation distribution's mean
    and std in closed form (:func:`scrambled_z_exact`). ``n_perm > 0`` adds ``z_monte_carlo``, the same z
    from ``n_perm`` random permutations with its Monte Carlo standard error (``z_se``), as a check.
    """
    tick, cpu_tick = time.perf_counter(), time.process_time()
    timings = timings if timings is not None else {}
    cpu_timings = cpu_timings if cpu_timings is not None else {}

    def lap(name: str) -> None:  # wall seconds, and this process's CPU seconds (every thread's)
        nonlocal tick, cpu_tick
        now, cpu_now = time.perf_counter(), time.process_time()
        timings[name], cpu_timings[name] = round(now - tick, 3), round(cpu_now - cpu_tick, 3)
        tick, cpu_tick = now, cpu_now

    S = normalize(src)
    T = normalize(tgt)
    n = S.shape[0]
    lap("normalize")
    out: dict[str, Any] = {"n": int(n)}
    out["z"] = scrambled_z_exact(S, T)
    lap("scrambled_z_exact")
    if n_perm:
        out["z_monte_carlo"] = scrambled_z(S, T, n_perm=n_perm, seed=seed)
        lap("scrambled_z")
    nn = {"kind": index_kind, "ann_threshold": ann_threshold, "seed": seed, "device": device,
          "index_params": index_params}
    out["retrieval"] = retrieval(S, T, **nn)
    lap("retrieval")
    k = min(knn_k, n - 1)
    if bool(np.all(S == S[0])) or bool(np.all(T == T[0])):
        # every row the same (e.g. the [SEP] embedding at layer raw): neighbours are pure ties
        out["mutual_knn"] = {"k": int(k), "value": None, "chance": k / (n - 1),
                             "undefined": "all vectors on one side are identical, so neighbours are arbitrary"}
    else:
        a = self_knn(S, k, **nn)
        b = self_knn(T, k, **nn)
        out["mutual_knn"] = {"k": int(k), "value": mutual_knn(a, b), "chance": k / (n - 1)}
    lap("mutual_knn")
    stacked = np.concatenate([S, T], axis=0)
    pca, why = _try(pca_summary, stacked, n_components=max(pca_ks))
    if pca is None:
        out["pca"] = {"undefined": why}
        return out
    proj = pca["projections"]
    d, why_d = _try(cohens_d, proj[:n, 0], proj[n:, 0])
    pc = {"explained_variance_ratio": [float(v) for v in pca["explained_variance_ratio"]],
          "pc0_cohens_d": d, "pc0_abs_cohens_d": None if d is None else abs(d), "pc0_undefined": why_d,
          "z_within": {}}
    for kk in pca_ks:
        if kk > pca["n_components"]:
            continue
        zk, why_k = _try(scrambled_z_exact, proj[:n, :kk], proj[n:, :kk])
        pc["z_within"][str(kk)] = zk["z"] if zk else None
    out["pca"] = pc
    lap("pca")
    return out


def category_figures(src: np.ndarray, tgt: np.ndarray, *, seed: int) -> dict[str, Any]:
    """The headline figures of one category's pairs: exact z, retrieval within the category."""
    S, T = normalize(src), normalize(tgt)
    z = scrambled_z_exact(S, T)
    r = retrieval(S, T, kind="flat", seed=seed)
    return {"n": int(S.shape[0]), "matched": z["matched"], "scrambled_mean": z["scrambled_mean"], "z": z["z"],
            "acc@1_src2tgt": r["src2tgt"]["acc@1"], "acc@1_tgt2src": r["tgt2src"]["acc@1"],
            "mrr_src2tgt": r["src2tgt"]["mrr"], "mrr_tgt2src": r["tgt2src"]["mrr"]}

"""Where two models' representations of paired items meet: every layer of one against every layer of the other.

``a`` is ``[layers_a, n, dim_a]`` (say, an image tower's vectors of n images), ``b`` is ``[layers_b, n, dim_b]``
(a text model's vectors of their n captions), row i of both being one pair.  Per layer pair:

* ``mutual_knn``: the platonic-representation alignment (Huh et al. 2024): for each item, the share of its k
  nearest neighbours (cosine, self excluded) in ``a`` that are also among its k nearest in ``b``, averaged;
* ``cka``: linear CKA of the two layers (metrics/cka.py); NaN where a layer's rows are all the same;
  the neighbour and retrieval figures are NaN where a layer has k or fewer distinct rows (its neighbours would
  be whatever order ties are broken in);
* ``a_to_b`` / ``b_to_a``: retrieval acc@k across the two spaces, which have no shared axes, through relative
  representations: each item is described by its cosines to a seeded half of the pairs (the anchors, the same
  pairs on both sides), and the other half are the queries, retrieved by the cosine of their centred profiles.

Each figure comes with a permutation null (the pairing shuffled: b's rows permuted, ``permutations`` times;
its mean and a one-sided p, (1 + #null >= observed) / (1 + permutations)) and a 95% percentile bootstrap
interval over the pairs (for the neighbour and retrieval figures the items are resampled with their
neighbourhoods from the full sample; CKA is recomputed on each resample).  The best layer pair by
``select`` is reported with an interval for the maximum itself: each bootstrap resample takes the maximum
over every layer pair, so the interval pays for choosing the best pair of many (the share of resamples
in which the chosen pair is again the best is reported as well).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from layerscope.metrics.cka import linear_cka
from layerscope.metrics.neighbors import knn_indices

FIGURES = ("mutual_knn", "cka", "a_to_b", "b_to_a")


@dataclass(frozen=True)
class Figure:
    """One figure over every layer pair: ``value``, the null's mean, p, and the bootstrap interval, each
    ``[layers_a, layers_b]``."""

    value: np.ndarray
    null_mean: np.ndarray
    p: np.ndarray
    ci_low: np.ndarray
    ci_high: np.ndarray


@dataclass(frozen=True)
class BestPair:
    figure: str
    layer_a: int
    layer_b: int
    value: float
    ci_low: float  # the interval of the maximum over every layer pair (selection included)
    ci_high: float
    chosen_share: float  # share of bootstrap resamples in which this pair is the best again


@dataclass(frozen=True)
class CrossModal:
    figures: dict[str, Figure]
    best: BestPair
    k: int
    acc_k: int
    permutations: int
    bootstrap: int
    n: int


def _check(a: np.ndarray, b: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.ndim != 3 or b.ndim != 3 or a.shape[1] != b.shape[1]:
        raise ValueError(f"a and b must be [layers, n, dim] with the same n, got {a.shape} and {b.shape}")
    n = a.shape[1]
    if n < 4 or not 1 <= k <= n - 2:
        raise ValueError(f"need at least 4 pairs and 1 <= k <= n - 2, got n={n}, k={k}")
    return a, b


def _cka(x: np.ndarray, y: np.ndarray) -> float:
    """Linear CKA, NaN where it is undefined (a side whose rows are all the same: no variance)."""
    try:
        return linear_cka(x, y)
    except ValueError:
        return float("nan")


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-300)


def _overlap(na: np.ndarray, nb: np.ndarray) -> np.ndarray:
    """Per item, the share of its neighbours in ``na`` also in ``nb``."""
    return (na[:, :, None] == nb[:, None, :]).any(axis=2).mean(axis=1)


def _profiles(x: np.ndarray, anchors: np.ndarray, queries: np.ndarray) -> np.ndarray:
    u = _unit(x)
    p = u[queries] @ u[anchors].T
    return _unit(p - p.mean(axis=1, keepdims=True))


def _hits(pa: np.ndarray, pb: np.ndarray, acc_k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per query, 1 where its pair is among the top ``acc_k`` of the other side (a -> b, b -> a); ties count
    against the query (the pair must beat every other strictly to be above it)."""
    s = pa @ pb.T
    diag = np.diag(s)
    a_rank = (s > diag[:, None]).sum(axis=1)  # others scoring above the pair
    b_rank = (s > diag[None, :]).sum(axis=0)
    return (a_rank < acc_k).astype(float), (b_rank < acc_k).astype(float)


def crossmodal(a, b, *, k: int = 10, acc_k: int = 1, permutations: int = 100, bootstrap: int = 200,
               select: str = "mutual_knn", seed: int = 0) -> CrossModal:
    """Every figure over every layer pair (see the module doc)."""
    a, b = _check(a, b, k)
    if select not in FIGURES:
        raise ValueError(f"select must be one of {FIGURES}, got {select!r}")
    la, lb, n = a.shape[0], b.shape[0], a.shape[1]
    rng = np.random.default_rng(seed)
    order = rng.permutation(n)
    anchors, queries = np.sort(order[: n // 2]), np.sort(order[n // 2:])
    if not 1 <= acc_k < len(queries):
        raise ValueError(f"acc_k must be in [1, {len(queries) - 1}], got {acc_k}")
    perms = [rng.permutation(n) for _ in range(permutations)]
    boots = [rng.integers(0, n, n) for _ in range(bootstrap)]
    qboots = [rng.integers(0, len(queries), len(queries)) for _ in range(bootstrap)]
    nn_a = [knn_indices(a[i], k, metric="cosine", backend="numpy") for i in range(la)]
    nn_b = [knn_indices(b[j], k, metric="cosine", backend="numpy") for j in range(lb)]
    prof_a = [_profiles(a[i], anchors, queries) for i in range(la)]
    prof_b = [_profiles(b[j], anchors, queries) for j in range(lb)]
    distinct_a = [len(np.unique(a[i], axis=0)) > k for i in range(la)]
    distinct_b = [len(np.unique(b[j], axis=0)) > k for j in range(lb)]
    shape = (la, lb)
    out = {f: {key: np.zeros(shape) for key in ("value", "null", "p", "lo", "hi")} for f in FIGURES}
    boot_values = {f: np.zeros((bootstrap, la, lb)) for f in FIGURES}
    inverse = [np.argsort(p) for p in perms]
    for i in range(la):
        for j in range(lb):
            per_item = {"mutual_knn": _overlap(nn_a[i], nn_b[j])}
            per_item["a_to_b"], per_item["b_to_a"] = _hits(prof_a[i], prof_b[j], acc_k)
            if not (distinct_a[i] and distinct_b[j]):  # neighbours would be the tie order: undefined
                per_item = {f: np.full_like(v, np.nan) for f, v in per_item.items()}
            values = {f: per_item[f].mean() for f in per_item}
            values["cka"] = _cka(a[i], b[j])
            nulls: dict[str, list[float]] = {f: [] for f in FIGURES}
            for p, inv in zip(perms, inverse):
                nulls["cka"].append(_cka(a[i], b[j][p]))
                if not (distinct_a[i] and distinct_b[j]):
                    continue
                # item t of b now pairs with item p[t] of the original b: its neighbours, renumbered
                nulls["mutual_knn"].append(_overlap(nn_a[i], inv[nn_b[j][p]]).mean())
                pb = _profiles(b[j][p], anchors, queries)
                ab, ba = _hits(prof_a[i], pb, acc_k)
                nulls["a_to_b"].append(ab.mean())
                nulls["b_to_a"].append(ba.mean())
            for r, (rows, qrows) in enumerate(zip(boots, qboots)):
                boot_values["mutual_knn"][r, i, j] = per_item["mutual_knn"][rows].mean()
                boot_values["a_to_b"][r, i, j] = per_item["a_to_b"][qrows].mean()
                boot_values["b_to_a"][r, i, j] = per_item["b_to_a"][qrows].mean()
                boot_values["cka"][r, i, j] = _cka(a[i][rows], b[j][rows])
            for f in FIGURES:
                null = np.asarray(nulls[f])
                out[f]["value"][i, j] = values[f]
                out[f]["null"][i, j] = np.nanmean(null) if null.size and not np.isnan(null).all() else np.nan
                defined = not np.isnan(values[f])
                out[f]["p"][i, j] = (1 + (null >= values[f]).sum()) / (1 + null.size) if defined else np.nan
                boot = boot_values[f][:, i, j]
                if bootstrap and defined and not np.isnan(boot).all():
                    out[f]["lo"][i, j], out[f]["hi"][i, j] = np.nanpercentile(boot, [2.5, 97.5])
                else:
                    out[f]["lo"][i, j] = out[f]["hi"][i, j] = np.nan
    figures = {f: Figure(d["value"], d["null"], d["p"], d["lo"], d["hi"]) for f, d in out.items()}
    sel = figures[select].value
    if np.isnan(sel).all():
        raise ValueError(f"{select} is undefined on every layer pair (a side without variance)")
    bi, bj = np.unravel_index(int(np.nanargmax(sel)), sel.shape)
    if bootstrap:
        flat = np.where(np.isnan(boot_values[select]), -np.inf, boot_values[select]).reshape(bootstrap, -1)
        lo, hi = np.percentile(flat.max(axis=1), [2.5, 97.5])
        share = float((flat.argmax(axis=1) == bi * lb + bj).mean())
    else:
        lo = hi = share = float("nan")
    best = BestPair(select, int(bi), int(bj), float(sel[bi, bj]), float(lo), float(hi), share)
    return CrossModal(figures, best, k, acc_k, permutations, bootstrap, n)

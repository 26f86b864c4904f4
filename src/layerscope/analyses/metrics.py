"""Pure metric functions for the layer-wise analyses.

Numpy arrays in, plain Python numbers / numpy arrays / dicts out. No I/O, no
torch, no onnxruntime; faiss is imported lazily by :func:`knn_indices` only.

Conventions used throughout:

* Rows are items, columns are features (``[n, d]``).
* Sums that decide a result (dot products, Gram matrices, moments) are
  accumulated in float64, in row blocks, so float32 stores of any size never
  need a full float64 copy.
* A metric that is not defined for its input either raises ``ValueError``
  with the reason (functions that return a bare float) or reports the reason
  in an ``undefined`` field and leaves the value ``None`` (correlations,
  z-scores). Nothing returns NaN.

Statistics come from SciPy where it has them (``pearsonr``, ``spearmanr``,
``rankdata``, ``binomtest``); the rest is written here and tested against
hand-computed values in ``tests/analyses/test_metrics.py``.
"""

from __future__ import annotations

import itertools
import math
import warnings
from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np
from scipy import stats

__all__ = [
    "l2_normalize",
    "paired_cosine",
    "Correlation",
    "pearson",
    "spearman",
    "sign_test",
    "PairedDifference",
    "paired_difference",
    "compositionality_summary",
    "scrambled_z",
    "scrambled_z_exact",
    "retrieval_metrics",
    "ranks_from_scores",
    "cosine_ranks",
    "mutual_knn",
    "knn_indices",
    "linear_cka",
    "unbiased_cka",
    "LinearCKAAccumulator",
    "cohens_d",
    "pca_summary",
    "language_split_pc0",
    "retention",
    "binary_quantize",
    "hamming_similarity",
    "int8_quantize",
    "int8_dequantize",
    "truncate_dims",
]

# Row-block sizes: how many array elements one temporary may hold.
_BLOCK_ELEMENTS = 1 << 22  # ~4M elements (32 MiB in float64)
# scrambled_z uses an n x n cosine matrix only up to this n (32 MiB float64).
_GRAM_MAX_N = 2048
# linear_cka uses the n x n Gram form only when n is this small and below d.
_CKA_GRAM_MAX_N = 2048
# A scrambled std at or below this counts as zero (z undefined).
_STD_ZERO = 1e-12
_MAX_EXHAUSTIVE_N = 8


# --------------------------------------------------------------------------
# input checks


def _count_nonfinite(a: np.ndarray) -> tuple[int, int]:
    if not np.issubdtype(a.dtype, np.floating):
        return 0, 0
    n_nan = int(np.isnan(a).sum())
    n_inf = int(np.isinf(a).sum())
    return n_nan, n_inf


def _check_finite(a: np.ndarray, name: str) -> None:
    n_nan, n_inf = _count_nonfinite(a)
    if n_nan or n_inf:
        parts = []
        if n_nan:
            parts.append(f"{n_nan} NaN value{'s' if n_nan != 1 else ''}")
        if n_inf:
            parts.append(f"{n_inf} infinite value{'s' if n_inf != 1 else ''}")
        raise ValueError(
            f"{name} has {' and '.join(parts)} (of {a.size}); drop or fill them first"
        )


def _as_vector(a, name: str) -> np.ndarray:
    arr = np.asarray(a)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool):
        raise ValueError(f"{name} must be numeric, got dtype {arr.dtype}")
    return arr


def _as_matrix(a, name: str) -> np.ndarray:
    arr = np.asarray(a)
    if arr.ndim != 2:
        raise ValueError(f"{name} must be 2-D [n, d], got shape {arr.shape}")
    if not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool):
        raise ValueError(f"{name} must be numeric, got dtype {arr.dtype}")
    return arr


def _float_dtype(*arrays: np.ndarray) -> type:
    """float32 when every input is float32 (keep stores small), else float64."""
    if all(a.dtype == np.float32 for a in arrays):
        return np.float32
    return np.float64


def _row_blocks(n: int, width: int, budget: int = _BLOCK_ELEMENTS):
    step = max(1, budget // max(1, width))
    for start in range(0, n, step):
        yield slice(start, min(n, start + step))


# --------------------------------------------------------------------------
# vectors


def _row_norms(x: np.ndarray) -> np.ndarray:
    """float64 L2 norm of each row (last axis), accumulated blockwise."""
    x2 = x.reshape(1, -1) if x.ndim == 1 else x
    out = np.empty(x2.shape[0], dtype=np.float64)
    for s in _row_blocks(x2.shape[0], x2.shape[1]):
        b = x2[s].astype(np.float64, copy=False)
        out[s] = np.sqrt(np.einsum("ij,ij->i", b, b))
    return out


def l2_normalize(x: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    """Scale each row (or a single 1-D vector) to unit L2 norm.

    Rows whose norm is at most ``eps`` are returned unchanged, so zero rows
    stay zero. Float inputs keep their dtype; others become float64.
    """
    arr = np.asarray(x)
    if arr.ndim not in (1, 2):
        raise ValueError(f"x must be 1-D or 2-D, got shape {arr.shape}")
    dtype = arr.dtype if np.issubdtype(arr.dtype, np.floating) else np.float64
    norms = _row_norms(arr)
    norms = np.where(norms > eps, norms, 1.0)
    if arr.ndim == 1:
        return (arr / norms[0]).astype(dtype, copy=False)
    return (arr / norms[:, None]).astype(dtype, copy=False)


def paired_cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine of row i of ``a`` with row i of ``b``, float64, shape ``[n]``.

    Accumulated in float64; a pair with a zero vector gets 0.0.
    """
    A = _as_matrix(a, "a")
    B = _as_matrix(b, "b")
    if A.shape != B.shape:
        raise ValueError(f"a and b must have the same shape, got {A.shape} and {B.shape}")
    out = np.empty(A.shape[0], dtype=np.float64)
    for s in _row_blocks(A.shape[0], A.shape[1]):
        a64 = A[s].astype(np.float64, copy=False)
        b64 = B[s].astype(np.float64, copy=False)
        dot = np.einsum("ij,ij->i", a64, b64)
        den = np.sqrt(np.einsum("ij,ij->i", a64, a64) * np.einsum("ij,ij->i", b64, b64))
        safe = den > 0
        out[s] = np.where(safe, dot / np.where(safe, den, 1.0), 0.0)
    return np.clip(out, -1.0, 1.0)


# --------------------------------------------------------------------------
# correlations


@dataclass
class Correlation:
    """A correlation with its p-value and bootstrap percentile interval.

    ``undefined`` holds the reason when the correlation is not defined (for
    example constant input); ``value``, ``p_value`` and the interval are then
    ``None``. ``ci_low``/``ci_high`` are also ``None`` when no bootstrap was
    asked for (``n_boot=0``) or too few resamples were usable.
    """

    value: float | None
    p_value: float | None
    ci_low: float | None
    ci_high: float | None
    n: int
    undefined: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def _validate_pair(x, y, x_name: str, y_name: str) -> tuple[np.ndarray, np.ndarray]:
    X = _as_vector(x, x_name)
    Y = _as_vector(y, y_name)
    if X.shape[0] != Y.shape[0]:
        raise ValueError(
            f"{x_name} and {y_name} must have the same length, got {X.shape[0]} and {Y.shape[0]}"
        )
    _check_finite(X, x_name)
    _check_finite(Y, y_name)
    if X.shape[0] < 3:
        raise ValueError(f"a correlation needs at least 3 pairs, got {X.shape[0]}")
    return X.astype(np.float64), Y.astype(np.float64)


def _constant_reason(x: np.ndarray, y: np.ndarray, x_name: str, y_name: str) -> str | None:
    reasons = []
    for arr, name in ((x, x_name), (y, y_name)):
        if np.all(arr == arr[0]):
            reasons.append(f"constant input ({name}): all {arr.shape[0]} values equal {arr[0]:.6g}")
    if not reasons:
        return None
    return "; ".join(reasons) + ", so the correlation is undefined"


def _rowwise_pearson(xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    xc = xs - xs.mean(axis=1, keepdims=True)
    yc = ys - ys.mean(axis=1, keepdims=True)
    num = np.einsum("ij,ij->i", xc, yc)
    den = np.sqrt(np.einsum("ij,ij->i", xc, xc) * np.einsum("ij,ij->i", yc, yc))
    return np.clip(num / den, -1.0, 1.0)


def _rowwise_spearman(xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    return _rowwise_pearson(stats.rankdata(xs, axis=1), stats.rankdata(ys, axis=1))


def _bootstrap_interval(
    x: np.ndarray, y: np.ndarray, rowwise, n_boot: int, seed: int, ci: float
) -> tuple[float | None, float | None]:
    """Seeded percentile bootstrap over pairs; constant resamples are skipped."""
    if n_boot == 0:
        return None, None
    n = x.shape[0]
    rng = np.random.default_rng(seed)
    block = max(1, min(n_boot, _BLOCK_ELEMENTS // n))
    values = []
    done = 0
    while done < n_boot:
        b = min(block, n_boot - done)
        idx = rng.integers(0, n, size=(b, n))
        xs, ys = x[idx], y[idx]
        usable = (xs.max(axis=1) > xs.min(axis=1)) & (ys.max(axis=1) > ys.min(axis=1))
        if usable.any():
            values.append(rowwise(xs[usable], ys[usable]))
        done += b
    if not values:
        return None, None
    vals = np.concatenate(values)
    vals = vals[np.isfinite(vals)]
    if vals.size < 2:
        return None, None
    alpha = (1.0 - ci) / 2.0
    lo, hi = np.quantile(vals, [alpha, 1.0 - alpha])
    return float(lo), float(hi)


def _correlation(x, y, *, kind, n_boot, seed, ci, x_name, y_name) -> Correlation:
    if not 0.0 < ci < 1.0:
        raise ValueError(f"ci must be between 0 and 1 (exclusive), got {ci}")
    if n_boot < 0:
        raise ValueError(f"n_boot must be >= 0, got {n_boot}")
    X, Y = _validate_pair(x, y, x_name, y_name)
    n = X.shape[0]
    reason = _constant_reason(X, Y, x_name, y_name)
    if reason is not None:
        return Correlation(None, None, None, None, n, reason)
    scipy_fn, rowwise = (
        (stats.pearsonr, _rowwise_pearson) if kind == "pearson" else (stats.spearmanr, _rowwise_spearman)
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for name in ("ConstantInputWarning", "NearConstantInputWarning"):
            cls = getattr(stats, name, None)
            if cls is not None:
                warnings.simplefilter("ignore", cls)
        res = scipy_fn(X, Y)
    value, p_value = float(res[0]), float(res[1])
    if not math.isfinite(value):
        return Correlation(
            None, None, None, None, n,
            f"the {kind} correlation is not finite for this input (near-constant values)",
        )
    lo, hi = _bootstrap_interval(X, Y, rowwise, n_boot, seed, ci)
    return Correlation(
        float(np.clip(value, -1.0, 1.0)),
        p_value if math.isfinite(p_value) else None,
        lo,
        hi,
        n,
        None,
    )


def pearson(
    x, y, *, n_boot: int = 1000, seed: int = 0, ci: float = 0.95,
    x_name: str = "x", y_name: str = "y",
) -> Correlation:
    """Pearson r (``scipy.stats.pearsonr``) with a percentile bootstrap interval.

    Constant input gives ``undefined`` with the reason, never NaN. Fewer than
    3 pairs, mismatched lengths or NaN/inf values raise ``ValueError``. The
    bootstrap resamples pairs with ``np.random.default_rng(seed)`` and skips
    resamples in which either side is constant. ``x_name``/``y_name`` only
    label the messages.
    """
    return _correlation(x, y, kind="pearson", n_boot=n_boot, seed=seed, ci=ci,
                        x_name=x_name, y_name=y_name)


def spearman(
    x, y, *, n_boot: int = 1000, seed: int = 0, ci: float = 0.95,
    x_name: str = "x", y_name: str = "y",
) -> Correlation:
    """Spearman rho (``scipy.stats.spearmanr``, ties get average ranks); as :func:`pearson`."""
    return _correlation(x, y, kind="spearman", n_boot=n_boot, seed=seed, ci=ci,
                        x_name=x_name, y_name=y_name)


# --------------------------------------------------------------------------
# paired comparisons


def sign_test(wins: int, losses: int) -> float:
    """Two-sided exact binomial (sign) test p-value of ``wins`` vs ``losses``.

    Ties are excluded by the caller. With no decisive pair at all the test has
    no evidence either way and returns 1.0.
    """
    wins, losses = int(wins), int(losses)
    if wins < 0 or losses < 0:
        raise ValueError(f"wins and losses must be >= 0, got {wins} and {losses}")
    if wins + losses == 0:
        return 1.0
    return float(stats.binomtest(wins, wins + losses, 0.5, alternative="two-sided").pvalue)


@dataclass
class PairedDifference:
    """Summary of per-item differences (positive = the first condition wins).

    ``std`` is the sample standard deviation (ddof=1), ``None`` for one item.
    ``win_rate`` is the share of *all* items with a positive difference (ties
    count in the denominator); ``sign_p`` is :func:`sign_test` on wins vs
    losses (ties dropped).
    """

    n: int
    mean_diff: float
    std: float | None
    win_rate: float
    wins: int
    losses: int
    ties: int
    sign_p: float

    def to_dict(self) -> dict:
        return asdict(self)


def paired_difference(diffs) -> PairedDifference:
    """Summarise a 1-D array of per-item differences; a difference of exactly 0 is a tie."""
    d = _as_vector(diffs, "diffs").astype(np.float64)
    if d.size == 0:
        raise ValueError("diffs is empty")
    _check_finite(d, "diffs")
    wins = int((d > 0).sum())
    losses = int((d < 0).sum())
    ties = int(d.size - wins - losses)
    return PairedDifference(
        n=int(d.size),
        mean_diff=float(d.mean()),
        std=float(d.std(ddof=1)) if d.size > 1 else None,
        win_rate=wins / d.size,
        wins=wins,
        losses=losses,
        ties=ties,
        sign_p=sign_test(wins, losses),
    )


def _item_means(values, name: str) -> np.ndarray:
    """1-D array -> itself; 2-D array -> row means; list of 1-D arrays -> their means."""
    if isinstance(values, np.ndarray) and values.ndim in (1, 2):
        arr = values.astype(np.float64)
        if arr.ndim == 2 and arr.shape[1] == 0:
            raise ValueError(f"{name} has items with no values")
        _check_finite(arr, name)
        return arr if arr.ndim == 1 else arr.mean(axis=1)
    if isinstance(values, np.ndarray):
        raise ValueError(f"{name} must be 1-D, 2-D or a list of 1-D arrays, got shape {values.shape}")
    means = []
    for i, item in enumerate(values):
        a = np.asarray(item, dtype=np.float64).reshape(-1)
        if a.size == 0:
            raise ValueError(f"{name}: item {i} has no values")
        _check_finite(a, f"{name} item {i}")
        means.append(a.mean())
    return np.asarray(means, dtype=np.float64)


def compositionality_summary(paraphrase_cos, negative_cos) -> dict:
    """Paraphrase-vs-negative cosine gap per item, and its summary.

    ``paraphrase_cos``: per item, the cosines of the anchor with its
    paraphrases -- a list of 1-D arrays (any count per item), a 2-D array
    ``[n_items, n_paraphrases]`` or a 1-D array (one paraphrase each).
    ``negative_cos``: the anchor's cosine with its negative, ``[n_items]``
    (a 2-D array or list is averaged per item the same way).

    Per item ``diff = mean(paraphrase cosines) - negative cosine``. Returns
    ``n_items, mean_diff, std (ddof=1, None for one item), win_rate (share
    diff > 0), wins, losses, ties, sign_p, mean_paraphrase, mean_negative,
    per_item_diffs`` (a list of floats).
    """
    para = _item_means(paraphrase_cos, "paraphrase_cos")
    neg = _item_means(negative_cos, "negative_cos")
    if para.shape[0] != neg.shape[0]:
        raise ValueError(
            f"paraphrase_cos has {para.shape[0]} items but negative_cos has {neg.shape[0]}"
        )
    if para.shape[0] == 0:
        raise ValueError("no items")
    diffs = para - neg
    summary = paired_difference(diffs)
    return {
        "n_items": summary.n,
        "mean_diff": summary.mean_diff,
        "std": summary.std,
        "win_rate": summary.win_rate,
        "wins": summary.wins,
        "losses": summary.losses,
        "ties": summary.ties,
        "sign_p": summary.sign_p,
        "mean_paraphrase": float(para.mean()),
        "mean_negative": float(neg.mean()),
        "per_item_diffs": [float(v) for v in diffs],
    }


# --------------------------------------------------------------------------
# matched vs scrambled pairs


def _unit_pair(src, tgt) -> tuple[np.ndarray, np.ndarray]:
    S = _as_matrix(src, "src")
    T = _as_matrix(tgt, "tgt")
    if S.shape != T.shape:
        raise ValueError(f"src and tgt must have the same shape, got {S.shape} and {T.shape}")
    if S.shape[0] < 2:
        raise ValueError(f"scrambling needs at least 2 pairs, got {S.shape[0]}")
    _check_finite(S, "src")
    _check_finite(T, "tgt")
    dtype = _float_dtype(S, T)
    return l2_normalize(S.astype(dtype, copy=False)), l2_normalize(T.astype(dtype, copy=False))


def _scrambled_means_gram(G: np.ndarray, perms: np.ndarray) -> np.ndarray:
    """Mean of G[i, perm(i)] for each permutation row (G = S T^T, n small)."""
    n = G.shape[0]
    return G[np.arange(n)[None, :], perms].mean(axis=1)


def _scrambled_means_direct(S: np.ndarray, T: np.ndarray, perms: np.ndarray) -> np.ndarray:
    """Same as the Gram form without any n x n array: O(n*d) per permutation.

    Permutations are processed in blocks and rows in chunks so one gathered
    temporary holds at most ``_BLOCK_ELEMENTS`` elements.
    """
    n_perm, n = perms.shape
    d = S.shape[1]
    rows = min(n, max(1, _BLOCK_ELEMENTS // max(1, d)))
    pblock = max(1, _BLOCK_ELEMENTS // (rows * max(1, d)))
    sums = np.zeros(n_perm, dtype=np.float64)
    for p0 in range(0, n_perm, pblock):
        P = perms[p0:p0 + pblock]
        for r0 in range(0, n, rows):
            r1 = min(n, r0 + rows)
            gathered = T[P[:, r0:r1]]  # [b, rows, d]
            dots = np.einsum("brd,rd->br", gathered, S[r0:r1])
            sums[p0:p0 + P.shape[0]] += dots.sum(axis=1, dtype=np.float64)
    return sums / n


def _z_result(matched, mean, std, n, n_perm, method) -> dict:
    undefined = None
    z = None
    if std <= _STD_ZERO:
        undefined = (
            "every scrambling of the targets gives the same mean cosine "
            "(scrambled std is 0), so the z-score is undefined"
        )
    else:
        z = (matched - mean) / std
    return {
        "matched": float(matched),
        "scrambled_mean": float(mean),
        "scrambled_std": float(std),
        "z": None if z is None else float(z),
        "n_perm": n_perm,
        "n": int(n),
        "method": method,
        "undefined": undefined,
    }


def scrambled_z(src, tgt, *, n_perm: int = 1000, seed: int = 0, exhaustive: bool = False) -> dict:
    """How far the matched pairs' mean cosine stands above scrambled pairs.

    Rows of ``src`` and ``tgt`` (``[n, d]``, row i of each is a matched pair)
    are unit-normalised. ``matched`` is the mean paired cosine. A scrambling
    is a uniformly random permutation ``p`` of the targets (all ``n!``
    permutations equally likely, fixed points allowed); its score is
    ``mean_i cos(src_i, tgt_p(i))``. Returns ``matched, scrambled_mean,
    scrambled_std, z = (matched - scrambled_mean) / scrambled_std, n_perm, n,
    method, undefined`` (``z`` is ``None`` with the reason when the std is 0).

    * Monte Carlo (default): ``n_perm`` permutations from
      ``np.random.default_rng(seed)``; std with ddof=1.
    * ``exhaustive=True`` (n <= 8): every one of the ``n!`` permutations,
      population std (ddof=0) -- the exact permutation distribution.

    Never forms an n x n matrix for n > 2048: permuted paired cosines are
    computed directly, O(n*d) per permutation, vectorised over blocks of
    permutations. For the exact moments in O(n*d^2) use :func:`scrambled_z_exact`.
    """
    S, T = _unit_pair(src, tgt)
    n = S.shape[0]
    matched = float(paired_cosine(S, T).mean())
    use_gram = n <= _GRAM_MAX_N
    G = S.astype(np.float64) @ T.astype(np.float64).T if use_gram else None

    def means_of(perms: np.ndarray) -> np.ndarray:
        if use_gram:
            return _scrambled_means_gram(G, perms)
        return _scrambled_means_direct(S, T, perms)

    if exhaustive:
        if n > _MAX_EXHAUSTIVE_N:
            raise ValueError(
                f"exhaustive=True enumerates all n! permutations and allows n <= "
                f"{_MAX_EXHAUSTIVE_N}, got n={n}; use the Monte Carlo default"
            )
        perms = np.array(list(itertools.permutations(range(n))), dtype=np.intp)
        vals = means_of(perms)
        return _z_result(matched, vals.mean(), vals.std(ddof=0), n, int(perms.shape[0]), "exhaustive")

    if n_perm < 2:
        raise ValueError(f"n_perm must be >= 2, got {n_perm}")
    rng = np.random.default_rng(seed)
    pblock = max(1, min(n_perm, _BLOCK_ELEMENTS // n))
    vals = np.empty(n_perm, dtype=np.float64)
    base = np.arange(n, dtype=np.intp)
    for p0 in range(0, n_perm, pblock):
        b = min(pblock, n_perm - p0)
        perms = rng.permuted(np.tile(base, (b, 1)), axis=1)
        vals[p0:p0 + b] = means_of(perms)
    return _z_result(matched, vals.mean(), vals.std(ddof=1), n, int(n_perm), "monte-carlo")


def _centered_gram_features(X: np.ndarray, mean: np.ndarray) -> np.ndarray:
    """(X - mean)^T (X - mean) in float64, accumulated over row blocks."""
    d = X.shape[1]
    out = np.zeros((d, d), dtype=np.float64)
    for s in _row_blocks(X.shape[0], d):
        b = X[s].astype(np.float64) - mean
        out += b.T @ b
    return out


def _column_means(X: np.ndarray) -> np.ndarray:
    total = np.zeros(X.shape[1], dtype=np.float64)
    for s in _row_blocks(X.shape[0], X.shape[1]):
        total += X[s].sum(axis=0, dtype=np.float64)
    return total / X.shape[0]


def scrambled_z_exact(src, tgt) -> dict:
    """Exact mean and std of the scrambled mean cosine, without sampling.

    Same setting and return keys as :func:`scrambled_z` (``method="exact"``,
    ``n_perm=None``). For a uniform random permutation ``p`` and
    ``c_ij = s_i . t_j`` (unit rows):

    * ``E[mean_i c_i,p(i)] = (sum_i s_i) . (sum_j t_j) / n^2``
    * ``Var = sum_ij d_ij^2 / (n^2 (n - 1))`` (Hoeffding 1951), with
      ``d_ij = (s_i - s_bar) . (t_j - t_bar)``, and
      ``sum_ij d_ij^2 = <S_c^T S_c, T_c^T T_c>_F`` -- O(n d^2), no n x n matrix.
    """
    S, T = _unit_pair(src, tgt)
    n = S.shape[0]
    matched = float(paired_cosine(S, T).mean())
    ms = _column_means(S)
    mt = _column_means(T)
    mean = float(ms @ mt)  # (sum s)(sum t)/n^2
    ss = float(np.sum(_centered_gram_features(S, ms) * _centered_gram_features(T, mt)))
    var = max(ss, 0.0) / (n * n * (n - 1))
    return _z_result(matched, mean, math.sqrt(var), n, None, "exact")


# --------------------------------------------------------------------------
# retrieval and neighbours


def retrieval_metrics(ranks, ks: Sequence[int] = (1, 5, 10)) -> dict:
    """Accuracy@k and mean reciprocal rank from 1-based ranks of the correct item.

    ``ranks`` may be fractional (ties share the mean rank, see
    :func:`ranks_from_scores`); ``acc@k`` is the share of queries with
    ``rank <= k``. Returns ``{"acc@1": ..., "acc@5": ..., ..., "mrr": ...}``.
    """
    r = _as_vector(ranks, "ranks").astype(np.float64)
    if r.size == 0:
        raise ValueError("ranks is empty")
    _check_finite(r, "ranks")
    if np.any(r < 1):
        raise ValueError(f"ranks are 1-based; got a minimum of {r.min():g}")
    out: dict = {}
    for k in ks:
        if int(k) != k or k < 1:
            raise ValueError(f"every k must be a positive integer, got {k}")
        out[f"acc@{int(k)}"] = float(np.mean(r <= k))
    out["mrr"] = float(np.mean(1.0 / r))
    return out


def ranks_from_scores(scores, correct) -> np.ndarray:
    """1-based rank of the correct item per query; higher score = better.

    ``scores`` is ``[q, n]``, ``correct`` holds the index of the right item
    for each query. Ties share the mean rank:
    ``rank = 1 + #(strictly higher) + #(equal, other than itself) / 2``,
    so a correct item tied with one other at the top gets 1.5. Returns float64.
    """
    S = _as_matrix(scores, "scores")
    c = _as_vector(correct, "correct")
    if c.shape[0] != S.shape[0]:
        raise ValueError(f"scores has {S.shape[0]} queries but correct has {c.shape[0]}")
    if not np.issubdtype(c.dtype, np.integer):
        raise ValueError(f"correct must hold integer indices, got dtype {c.dtype}")
    if c.size and (c.min() < 0 or c.max() >= S.shape[1]):
        raise ValueError(f"correct indices must lie in [0, {S.shape[1]}), got {c.min()}..{c.max()}")
    _check_finite(S, "scores")
    out = np.empty(S.shape[0], dtype=np.float64)
    for s in _row_blocks(S.shape[0], S.shape[1]):
        block = S[s]
        target = block[np.arange(block.shape[0]), c[s]][:, None]
        greater = (block > target).sum(axis=1)
        equal = (block == target).sum(axis=1) - 1
        out[s] = 1.0 + greater + equal / 2.0
    return out


def cosine_ranks(src, tgt, *, block_size: int = 1024) -> np.ndarray:
    """Rank of ``tgt[i]`` among all targets for query ``src[i]`` by cosine.

    Blocked over queries, so it holds ``block_size x n`` scores, never
    ``n x n``. Ties share the mean rank as in :func:`ranks_from_scores`.
    """
    S = _as_matrix(src, "src")
    T = _as_matrix(tgt, "tgt")
    if S.shape != T.shape:
        raise ValueError(f"src and tgt must have the same shape, got {S.shape} and {T.shape}")
    _check_finite(S, "src")
    _check_finite(T, "tgt")
    dtype = _float_dtype(S, T)
    Sn = l2_normalize(S.astype(dtype, copy=False))
    Tn = l2_normalize(T.astype(dtype, copy=False))
    n = S.shape[0]
    out = np.empty(n, dtype=np.float64)
    for q0 in range(0, n, max(1, block_size)):
        q1 = min(n, q0 + max(1, block_size))
        scores = Sn[q0:q1] @ Tn.T
        out[q0:q1] = ranks_from_scores(scores, np.arange(q0, q1))
    return out


def mutual_knn(a_neighbors, b_neighbors) -> float:
    """Mean share of shared neighbours: ``mean_i |N_a(i) & N_b(i)| / k``.

    Both are ``[n, k]`` integer neighbour lists of the same n items in two
    spaces (self excluded, no repeats within a row).
    """
    A = _as_matrix(a_neighbors, "a_neighbors")
    B = _as_matrix(b_neighbors, "b_neighbors")
    if A.shape != B.shape:
        raise ValueError(f"neighbour lists must have the same shape, got {A.shape} and {B.shape}")
    n, k = A.shape
    if n == 0 or k == 0:
        raise ValueError(f"neighbour lists must be non-empty, got shape {A.shape}")
    for arr, name in ((A, "a_neighbors"), (B, "b_neighbors")):
        if not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"{name} must hold integer indices, got dtype {arr.dtype}")
        srt = np.sort(arr, axis=1)
        if k > 1 and np.any(srt[:, 1:] == srt[:, :-1]):
            raise ValueError(f"{name} repeats an index within a row")
    shared = 0
    for s in _row_blocks(n, k * k):
        shared += int((A[s][:, :, None] == B[s][:, None, :]).any(axis=2).sum())
    return shared / (n * k)


_KNN_METRICS = ("cosine", "dot", "l2")


def _drop_self(idx: np.ndarray, rows: np.ndarray, k: int) -> np.ndarray:
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
        out[q0:q1] = _drop_self(idx.astype(np.int64), np.arange(q0, q1), k)
    return out


def _knn_numpy(x: np.ndarray, k: int, metric: str, block_size: int) -> np.ndarray:
    n = x.shape[0]
    sq = np.einsum("ij,ij->i", x, x) if metric == "l2" else None
    out = np.empty((n, k), dtype=np.int64)
    step = max(1, min(block_size, _BLOCK_ELEMENTS // n))
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


def knn_indices(
    x, k: int, *, metric: str = "cosine", block_size: int = 4096, backend: str = "auto"
) -> np.ndarray:
    """Exact k nearest neighbours of every row among the rows, self excluded.

    ``metric``: ``"cosine"`` (rows L2-normalised, inner product), ``"dot"``
    (raw inner product) or ``"l2"`` (Euclidean). Returns int64 ``[n, k]``,
    nearest first. Uses a faiss ``IndexFlatIP``/``IndexFlatL2`` on float32
    (``backend="faiss"``), or blocked numpy matrix products where faiss is not
    installed (``backend="numpy"``; ``"auto"`` picks faiss when it imports).
    Queries go in blocks of ``block_size``, so no n x n array is ever held.
    Among exact ties the numpy backend takes and lists lower indices first;
    faiss uses its own order.
    """
    X = _as_matrix(x, "x")
    if metric not in _KNN_METRICS:
        raise ValueError(f"metric must be one of {_KNN_METRICS}, got {metric!r}")
    if backend not in ("auto", "faiss", "numpy"):
        raise ValueError(f"backend must be 'auto', 'faiss' or 'numpy', got {backend!r}")
    n = X.shape[0]
    if int(k) != k or k < 1 or k > n - 1:
        raise ValueError(f"k must be an integer in [1, n-1] = [1, {n - 1}], got {k}")
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    _check_finite(X, "x")
    k = int(k)
    xf = X.astype(np.float32)
    if metric == "cosine":
        xf = l2_normalize(xf)
    xf = np.ascontiguousarray(xf)
    if backend == "auto":
        try:
            import faiss  # noqa: F401

            backend = "faiss"
        except ImportError:
            backend = "numpy"
    if backend == "faiss":
        return _knn_faiss(xf, k, metric, block_size)
    return _knn_numpy(xf, k, metric, block_size)


# --------------------------------------------------------------------------
# CKA


def _cka_from_moments(cxx: np.ndarray, cyy: np.ndarray, cyx: np.ndarray) -> float:
    num = float(np.sum(cyx * cyx))
    den = float(np.linalg.norm(cxx) * np.linalg.norm(cyy))
    return float(np.clip(num / den, 0.0, 1.0))


def _no_variance_error(name: str, n: int) -> ValueError:
    return ValueError(
        f"{name} has no variance: all {n} rows are identical, so CKA is undefined"
    )


def _check_cka_pair(x, y) -> tuple[np.ndarray, np.ndarray]:
    X = _as_matrix(x, "x")
    Y = _as_matrix(y, "y")
    if X.shape[0] != Y.shape[0]:
        raise ValueError(f"x and y must have the same number of rows, got {X.shape[0]} and {Y.shape[0]}")
    _check_finite(X, "x")
    _check_finite(Y, "y")
    for arr, name in ((X, "x"), (Y, "y")):
        if arr.shape[0] >= 1 and np.all(arr == arr[0]):
            raise _no_variance_error(name, arr.shape[0])
    return X, Y


class LinearCKAAccumulator:
    """Linear CKA over row blocks, for stores that do not fit in memory.

    ``update(x_block, y_block)`` (rows are the same items in both spaces) any
    number of times, then ``result()``: equal to :func:`linear_cka` on the
    concatenated blocks. Keeps ``X^T X``, ``Y^T Y``, ``Y^T X``, column sums
    and n in float64, O(d^2) memory. For numerical stability the rows are
    shifted by the first block's column means before accumulating.
    """

    def __init__(self) -> None:
        self.n = 0
        self._shift_x: np.ndarray | None = None
        self._shift_y: np.ndarray | None = None
        self._first_x: np.ndarray | None = None
        self._first_y: np.ndarray | None = None
        self._x_varies = False
        self._y_varies = False

    def _start(self, shift_x: np.ndarray, shift_y: np.ndarray, first_x, first_y) -> None:
        dx, dy = shift_x.shape[0], shift_y.shape[0]
        self._shift_x, self._shift_y = shift_x, shift_y
        self._first_x, self._first_y = first_x, first_y
        self._sx = np.zeros(dx)
        self._sy = np.zeros(dy)
        self._xx = np.zeros((dx, dx))
        self._yy = np.zeros((dy, dy))
        self._yx = np.zeros((dy, dx))

    def update(self, x_block, y_block) -> "LinearCKAAccumulator":
        X = _as_matrix(x_block, "x_block")
        Y = _as_matrix(y_block, "y_block")
        if X.shape[0] != Y.shape[0]:
            raise ValueError(
                f"x_block and y_block must have the same number of rows, got {X.shape[0]} and {Y.shape[0]}"
            )
        if X.shape[0] == 0:
            return self
        _check_finite(X, "x_block")
        _check_finite(Y, "y_block")
        if self._shift_x is None:
            self._start(
                X.mean(axis=0, dtype=np.float64), Y.mean(axis=0, dtype=np.float64),
                X[0].copy(), Y[0].copy(),
            )
        elif X.shape[1] != self._shift_x.shape[0] or Y.shape[1] != self._shift_y.shape[0]:
            raise ValueError(
                f"block widths changed: expected x {self._shift_x.shape[0]} and y "
                f"{self._shift_y.shape[0]} columns, got {X.shape[1]} and {Y.shape[1]}"
            )
        self._x_varies = self._x_varies or bool(np.any(X != self._first_x))
        self._y_varies = self._y_varies or bool(np.any(Y != self._first_y))
        for s in _row_blocks(X.shape[0], max(X.shape[1], Y.shape[1])):
            xs = X[s].astype(np.float64) - self._shift_x
            ys = Y[s].astype(np.float64) - self._shift_y
            self._sx += xs.sum(axis=0)
            self._sy += ys.sum(axis=0)
            self._xx += xs.T @ xs
            self._yy += ys.T @ ys
            self._yx += ys.T @ xs
        self.n += X.shape[0]
        return self

    def result(self) -> float:
        if self.n < 2:
            raise ValueError(f"CKA needs at least 2 rows, got {self.n}")
        if not self._x_varies:
            raise _no_variance_error("x", self.n)
        if not self._y_varies:
            raise _no_variance_error("y", self.n)
        mx = self._sx / self.n
        my = self._sy / self.n
        cxx = self._xx - self.n * np.outer(mx, mx)
        cyy = self._yy - self.n * np.outer(my, my)
        cyx = self._yx - self.n * np.outer(my, mx)
        return _cka_from_moments(cxx, cyy, cyx)


def _linear_cka_features(X: np.ndarray, Y: np.ndarray) -> float:
    """Feature-space form ||Yc^T Xc||_F^2 / (||Xc^T Xc||_F ||Yc^T Yc||_F), O(n d^2)."""
    acc = LinearCKAAccumulator()
    # Shift by the exact column means: the accumulated moments are then centred.
    acc._start(_column_means(X), _column_means(Y), X[0].copy(), Y[0].copy())
    return acc.update(X, Y).result()


def _linear_cka_gram(X: np.ndarray, Y: np.ndarray) -> float:
    """Gram form <Kc, Lc>_F / (||Kc||_F ||Lc||_F) with Kc = Xc Xc^T, O(n^2 d)."""
    Xc = X.astype(np.float64) - _column_means(X)
    Yc = Y.astype(np.float64) - _column_means(Y)
    K = Xc @ Xc.T
    L = Yc @ Yc.T
    num = float(np.sum(K * L))
    den = float(np.linalg.norm(K) * np.linalg.norm(L))
    return float(np.clip(num / den, 0.0, 1.0))


def linear_cka(x, y) -> float:
    """Linear CKA (Kornblith et al. 2019) of two representations of the same n items.

    Features are centred; the value is
    ``||Y^T X||_F^2 / (||X^T X||_F ||Y^T Y||_F)``, computed in feature space,
    O(n d^2) time and O(d^2) memory (the equal n x n Gram form is used only
    when n <= 2048 and n is below the width). 1 for ``x`` vs ``x @ Q * c``
    (Q orthogonal); for one feature each it is Pearson r squared. Raises
    ``ValueError`` when a side has identical rows (no variance).
    """
    X, Y = _check_cka_pair(x, y)
    n = X.shape[0]
    if n < 2:
        raise ValueError(f"CKA needs at least 2 rows, got {n}")
    if n <= _CKA_GRAM_MAX_N and n < max(X.shape[1], Y.shape[1]):
        return _linear_cka_gram(X, Y)
    return _linear_cka_features(X, Y)


def _hsic_parts(X: np.ndarray, Y: np.ndarray):
    """Moments for the debiased HSIC of centred linear kernels, in row blocks."""
    mx, my = _column_means(X), _column_means(Y)
    dx, dy = X.shape[1], Y.shape[1]
    xx = np.zeros((dx, dx))
    yy = np.zeros((dy, dy))
    yx = np.zeros((dy, dx))
    kd_sum = ld_sum = kk_diag = ll_diag = kl_diag = 0.0
    for s in _row_blocks(X.shape[0], max(dx, dy)):
        xs = X[s].astype(np.float64) - mx
        ys = Y[s].astype(np.float64) - my
        xx += xs.T @ xs
        yy += ys.T @ ys
        yx += ys.T @ xs
        kd = np.einsum("ij,ij->i", xs, xs)  # K_ii
        ld = np.einsum("ij,ij->i", ys, ys)  # L_ii
        kd_sum += kd.sum()
        ld_sum += ld.sum()
        kk_diag += kd @ kd
        ll_diag += ld @ ld
        kl_diag += kd @ ld
    return xx, yy, yx, kd_sum, ld_sum, kk_diag, ll_diag, kl_diag


def _hsic1(tr_kl: float, diag_kl: float, k_sum_diag: float, l_sum_diag: float, n: int) -> float:
    """Song et al. (2012) unbiased HSIC for centred features (sum of rows = 0).

    With K~, L~ the Gram matrices with zeroed diagonals:
    ``tr(K~L~) = tr(KL) - sum_i K_ii L_ii``, ``1^T K~ 1 = -sum_i K_ii`` and
    ``1^T K~ L~ 1 = sum_i K_ii L_ii`` (since ``(K~ 1)_i = -K_ii``), and
    ``HSIC_1 = [tr(K~L~) + (1^T K~ 1)(1^T L~ 1)/((n-1)(n-2))
               - 2/(n-2) 1^T K~ L~ 1] / (n(n-3))``.
    """
    t = tr_kl - diag_kl
    return (t + k_sum_diag * l_sum_diag / ((n - 1) * (n - 2)) - 2.0 * diag_kl / (n - 2)) / (n * (n - 3))


def unbiased_cka(x, y) -> float:
    """Debiased linear CKA: the unbiased HSIC estimator of Song et al. (2012),
    as used for CKA by Nguyen et al. (2020), normalised like CKA.

    ``HSIC_1(K, L) / sqrt(HSIC_1(K, K) HSIC_1(L, L))`` with linear kernels on
    centred features (the estimator is unchanged by shifting the features).
    Written out directly it is O(n^2) in time and memory; here every term is
    reduced to feature-space moments, so it runs in O(n d^2) time and O(d^2)
    memory without an n x n matrix. Needs n > 3. Can be slightly negative
    for unrelated data. Raises ``ValueError`` when a self-HSIC is not
    positive (no usable variance).
    """
    X, Y = _check_cka_pair(x, y)
    n = X.shape[0]
    if n <= 3:
        raise ValueError(f"the unbiased CKA estimator needs n > 3 rows, got {n}")
    xx, yy, yx, kd, ld, kk, ll, kl = _hsic_parts(X, Y)
    h_xy = _hsic1(float(np.sum(yx * yx)), kl, -kd, -ld, n)
    h_xx = _hsic1(float(np.sum(xx * xx)), kk, -kd, -kd, n)
    h_yy = _hsic1(float(np.sum(yy * yy)), ll, -ld, -ld, n)
    if h_xx <= 0 or h_yy <= 0:
        raise ValueError(
            "the unbiased self-similarity (HSIC) of x or y is not positive for these "
            f"{n} rows, so unbiased CKA is undefined; use more rows or linear_cka"
        )
    return float(h_xy / math.sqrt(h_xx * h_yy))


# --------------------------------------------------------------------------
# effect sizes and PCA


def cohens_d(a, b) -> float:
    """Cohen's d = (mean(a) - mean(b)) / pooled std (sample variances, ddof=1).

    ``pooled = sqrt(((na-1) var_a + (nb-1) var_b) / (na + nb - 2))``; needs
    na + nb >= 3. Raises ``ValueError`` when the pooled std is 0.
    """
    A = _as_vector(a, "a").astype(np.float64)
    B = _as_vector(b, "b").astype(np.float64)
    if A.size < 1 or B.size < 1 or A.size + B.size < 3:
        raise ValueError(f"cohens_d needs both samples non-empty and >= 3 values in all, got {A.size} and {B.size}")
    _check_finite(A, "a")
    _check_finite(B, "b")
    ss = ((A - A.mean()) ** 2).sum() + ((B - B.mean()) ** 2).sum()
    pooled = math.sqrt(ss / (A.size + B.size - 2))
    if pooled == 0:
        raise ValueError("both samples are constant (pooled std is 0), so Cohen's d is undefined")
    return float((A.mean() - B.mean()) / pooled)


def pca_summary(x, *, n_components: int = 10) -> dict:
    """PCA by SVD of the column-centred data (float64).

    Returns ``mean [d]``, ``components [k, d]`` (unit rows; each flipped so
    its largest-magnitude loading is positive), ``explained_variance [k]``
    (ddof=1), ``explained_variance_ratio [k]`` (share of the total variance),
    ``singular_values [k]``, ``projections [n, k]``, ``n_components`` (k =
    min(n_components, n, d)) and ``total_variance``. Cost: one thin SVD of
    the ``[n, d]`` array; for tall data (n > 2d) the same decomposition is
    taken from the d x d scatter matrix ``Xc^T Xc`` (eigenvalues = squared
    singular values), which is several times faster.
    """
    X = _as_matrix(x, "x")
    n, d = X.shape
    if n < 2:
        raise ValueError(f"PCA needs at least 2 rows, got {n}")
    if n_components < 1:
        raise ValueError(f"n_components must be >= 1, got {n_components}")
    _check_finite(X, "x")
    mean = _column_means(X)
    if n > 2 * d:
        evals, evecs = np.linalg.eigh(_centered_gram_features(X, mean))
        evals, evecs = evals[::-1], evecs[:, ::-1]
        sv = np.sqrt(np.clip(evals, 0.0, None))
        vt = evecs.T
    else:
        _, sv, vt = np.linalg.svd(X.astype(np.float64) - mean, full_matrices=False)
    return _pca_result(X, mean, sv, vt, int(n_components))


def _pca_result(X: np.ndarray, mean: np.ndarray, sv: np.ndarray, vt: np.ndarray, n_components: int) -> dict:
    n = X.shape[0]
    k = min(n_components, sv.shape[0])
    comps = vt[:k]
    signs = np.sign(comps[np.arange(k), np.abs(comps).argmax(axis=1)])
    signs[signs == 0] = 1.0
    comps = comps * signs[:, None]
    var_all = sv ** 2 / (n - 1)
    total = float(var_all.sum())
    ratios = var_all[:k] / total if total > 0 else np.zeros(k)
    projections = np.vstack(
        [(X[b].astype(np.float64) - mean) @ comps.T for b in _row_blocks(n, X.shape[1])]
    )
    return {
        "mean": mean,
        "components": comps,
        "explained_variance": var_all[:k],
        "explained_variance_ratio": ratios,
        "singular_values": sv[:k],
        "projections": projections,
        "n_components": k,
        "total_variance": total,
    }


def language_split_pc0(src, tgt) -> dict:
    """Does the first principal component separate the two languages?

    PCA over the stacked rows of ``src`` and ``tgt`` (``[n_src, d]``,
    ``[n_tgt, d]``). Returns ``abs_cohens_d`` (|Cohen's d| between the src
    and tgt projections on PC0), ``cohens_d`` (signed, src minus tgt),
    ``pc0_variance_ratio``, ``src_mean_proj``, ``tgt_mean_proj``, ``n_src``,
    ``n_tgt``.
    """
    S = _as_matrix(src, "src")
    T = _as_matrix(tgt, "tgt")
    if S.shape[1] != T.shape[1]:
        raise ValueError(f"src and tgt must have the same width, got {S.shape[1]} and {T.shape[1]}")
    stacked = np.concatenate([S.astype(np.float64), T.astype(np.float64)], axis=0)
    pca = pca_summary(stacked, n_components=1)
    proj = pca["projections"][:, 0]
    ps, pt = proj[: S.shape[0]], proj[S.shape[0]:]
    d = cohens_d(ps, pt)
    return {
        "abs_cohens_d": abs(d),
        "cohens_d": d,
        "pc0_variance_ratio": float(pca["explained_variance_ratio"][0]),
        "src_mean_proj": float(ps.mean()),
        "tgt_mean_proj": float(pt.mean()),
        "n_src": int(S.shape[0]),
        "n_tgt": int(T.shape[0]),
    }


# --------------------------------------------------------------------------
# quantization


def retention(quantized_score: float, float_score: float) -> float | None:
    """Share of the float32 quality a quantized variant keeps: ``quantized / float``.

    ``None`` when ``float_score <= 0`` (a ratio to a non-positive baseline
    means nothing).
    """
    q, f = float(quantized_score), float(float_score)
    if not (math.isfinite(q) and math.isfinite(f)):
        raise ValueError(f"scores must be finite, got {quantized_score} and {float_score}")
    if f <= 0:
        return None
    return q / f


def binary_quantize(x) -> np.ndarray:
    """Sign bits (``value > 0`` -> 1), packed: uint8 ``[n, ceil(d / 8)]``."""
    X = _as_matrix(x, "x")
    _check_finite(X, "x")
    return np.packbits(X > 0, axis=1)


_POPCOUNT = np.array([bin(i).count("1") for i in range(256)], dtype=np.uint8)


def hamming_similarity(a_bits, b_bits, *, dim: int | None = None) -> np.ndarray:
    """Per pair ``1 - hamming(a_i, b_i) / dim`` of packed sign codes, float64 ``[n]``.

    ``dim`` is the original width; it defaults to ``8 * bytes per row`` (right
    whenever d is a multiple of 8; pass it otherwise). Padding bits are 0 on
    both sides and never count.
    """
    A = _as_matrix(a_bits, "a_bits")
    B = _as_matrix(b_bits, "b_bits")
    if A.dtype != np.uint8 or B.dtype != np.uint8:
        raise ValueError(f"packed codes must be uint8, got {A.dtype} and {B.dtype}")
    if A.shape != B.shape:
        raise ValueError(f"a_bits and b_bits must have the same shape, got {A.shape} and {B.shape}")
    nbits = 8 * A.shape[1]
    dim = nbits if dim is None else int(dim)
    if not nbits - 8 < dim <= nbits:
        raise ValueError(f"dim={dim} does not fit codes of {A.shape[1]} bytes per row")
    ham = _POPCOUNT[np.bitwise_xor(A, B)].sum(axis=1, dtype=np.int64)
    return 1.0 - ham / dim


def int8_quantize(x, *, calibration=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-dimension scalar int8 quantization from min/max of calibration rows.

    ``calibration`` defaults to ``x`` itself. For each dimension,
    ``scale = (max - min) / 255`` and ``offset = min + 128 * scale``, so
    ``min -> -128`` and ``max -> 127``; ``codes = clip(round((x - offset) /
    scale), -128, 127)``. A constant dimension gets ``scale = 1`` and
    ``offset = min`` (code 0). Returns ``(codes int8 [n, d], scale float64
    [d], offset float64 [d])``; :func:`int8_dequantize` inverts it to within
    ``scale / 2`` inside the calibration range.
    """
    X = _as_matrix(x, "x")
    C = X if calibration is None else _as_matrix(calibration, "calibration")
    if C.shape[1] != X.shape[1]:
        raise ValueError(f"calibration has {C.shape[1]} dims but x has {X.shape[1]}")
    if C.shape[0] == 0:
        raise ValueError("calibration has no rows")
    _check_finite(X, "x")
    if calibration is not None:
        _check_finite(C, "calibration")
    lo = C.min(axis=0).astype(np.float64)
    hi = C.max(axis=0).astype(np.float64)
    span = hi - lo
    scale = np.where(span > 0, span / 255.0, 1.0)
    offset = np.where(span > 0, lo + 128.0 * scale, lo)
    codes = np.empty(X.shape, dtype=np.int8)
    for s in _row_blocks(X.shape[0], X.shape[1]):
        q = np.rint((X[s].astype(np.float64) - offset) / scale)
        codes[s] = np.clip(q, -128, 127).astype(np.int8)
    return codes, scale, offset


def int8_dequantize(codes, scale, offset, *, dtype=np.float32) -> np.ndarray:
    """``codes * scale + offset`` per dimension (see :func:`int8_quantize`)."""
    C = _as_matrix(codes, "codes")
    sc = np.asarray(scale, dtype=np.float64)
    off = np.asarray(offset, dtype=np.float64)
    if sc.shape != (C.shape[1],) or off.shape != (C.shape[1],):
        raise ValueError(
            f"scale and offset must have shape ({C.shape[1]},), got {sc.shape} and {off.shape}"
        )
    return (C.astype(np.float64) * sc + off).astype(dtype)


def truncate_dims(x, k: int) -> np.ndarray:
    """The first ``k`` dimensions of every row (a view; Matryoshka-style truncation)."""
    X = _as_matrix(x, "x")
    if int(k) != k or not 1 <= k <= X.shape[1]:
        raise ValueError(f"k must be an integer in [1, {X.shape[1]}], got {k}")
    return X[:, : int(k)]

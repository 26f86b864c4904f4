"""Representational similarity beyond CKA, each with a permutation-calibrated score.

Two representations of the same n items (rows), ``X [n, dx]`` and ``Y [n, dy]``, columns centred:

* ``svcca`` (Raghu et al. 2017): each side reduced to its top singular directions that keep ``keep`` (99%)
  of its variance, then the mean canonical correlation between the reduced sides;
* ``pwcca`` (Morcos et al. 2018): the canonical correlations weighted by how much of the representation each
  canonical direction accounts for, ``w_i = sum_j |<h_i, x_j>|`` (h_i the i-th canonical variate, x_j the
  j-th column), on the side with fewer dimensions (the first on a tie), as Morcos et al.'s code does;
* ``procrustes`` (Ding et al. 2021): with each side scaled to Frobenius norm 1, the orthogonal Procrustes
  distance ``2 - 2 ||X^T Y||_*`` (0 for a rotation of each other, at most 2); its similarity
  ``||X^T Y||_*`` (in [0, 1]) is what is calibrated;
* ``rsa``: the Spearman correlation between the upper triangles of the two representational dissimilarity
  matrices (``correlation``: 1 - Pearson between rows, or ``euclidean``: squared distance / width), as
  rsatoolbox's ``calc_rdm`` and ``compare(method="spearman")`` compute them;
* linear CKA and debiased (unbiased-HSIC) CKA from the Gram matrices; mutual k-NN on neighbour lists.

Canonical correlations come from orthonormal bases of the centred sides (their left singular vectors, rank
kept where a singular value exceeds 1e-10 of the largest): the singular values of ``Ux^T Uy``. CCA fits
``min(rx, ry)`` directions to n items, so with n not far above the widths the correlations sit near 1 for any
two representations: that bias, and the width and depth that feed it, is what the calibration takes out.

Calibration (Groger et al. 2026): the rows of Y are permuted K times (the same permutations for every layer
pair, so a maximum over pairs is calibrated too), each index computed again on the unmatched rows; with
``tau`` the ``ceil((1 - alpha)(K + 1))``-th smallest of the observed score and the K null scores, the
calibrated score is ``clip((s - tau) / (smax - tau), 0, 1)`` (0 unless the score beats the null at level
alpha) and ``p = (1 + #{null >= s}) / (K + 1)``. ``Prepared`` holds what one layer needs for every index,
computed once, so a permutation costs only the products and small SVDs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from layerscope.metrics.checks import as_matrix, check_finite

INDICES = ("linear_cka", "debiased_cka", "svcca", "pwcca", "procrustes", "rsa")
RDM_METHODS = ("correlation", "euclidean")
_RANK_TOL = 1e-10


def _centred(x, name: str) -> np.ndarray:
    X = as_matrix(x, name).astype(np.float64)
    check_finite(X, name)
    if len(X) < 4:
        raise ValueError(f"{name} has {len(X)} rows; these indices need at least 4")
    return X - X.mean(axis=0)


def rdm_vector(x, method: str = "correlation") -> np.ndarray:
    """The upper triangle (row by row, above the diagonal) of the dissimilarity matrix of ``x``'s rows."""
    X = as_matrix(x, "x").astype(np.float64)
    check_finite(X, "x")
    if method == "correlation":
        c = X - X.mean(axis=1, keepdims=True)
        norms = np.linalg.norm(c, axis=1)
        if np.any(norms == 0):
            raise ValueError("a row is constant: its correlation distance is undefined; use method='euclidean'")
        c = c / norms[:, None]
        d = 1.0 - c @ c.T
    elif method == "euclidean":
        sq = np.einsum("ij,ij->i", X, X)
        d = (sq[:, None] + sq[None, :] - 2.0 * X @ X.T) / X.shape[1]
    else:
        raise ValueError(f"RDM method {method!r}: choose from {', '.join(RDM_METHODS)}")
    return d[np.triu_indices(len(X), 1)]


@dataclass(frozen=True)
class Prepared:
    """One representation, ready for every index and for row permutations."""

    n: int
    u: np.ndarray  # [n, r] left singular vectors of the centred matrix (its rank r)
    s: np.ndarray  # [r] singular values, descending
    vt: np.ndarray  # [r, d]
    svcca_rank: int  # directions keeping ``keep`` of the variance
    gram: np.ndarray  # [n, n] centred linear Gram matrix
    rdm_ranks: np.ndarray  # [n, n] symmetric: the rank of each pair's dissimilarity among all pairs
    rdm_method: str


def prepare(x, *, keep: float = 0.99, rdm: str = "correlation") -> Prepared:
    """What every index needs of ``x`` (rows are items), computed once."""
    from scipy.stats import rankdata

    if not 0.0 < keep <= 1.0:
        raise ValueError(f"keep must be in (0, 1], got {keep}")
    X = _centred(x, "x")
    u, s, vt = np.linalg.svd(X, full_matrices=False)
    if s.size == 0 or s[0] <= 0:
        raise ValueError("x has no variance: every row is the same")
    r = int(np.sum(s > _RANK_TOL * s[0]))
    u, s, vt = u[:, :r], s[:r], vt[:r]
    share = np.cumsum(s ** 2) / np.sum(s ** 2)
    k = int(min(r, np.searchsorted(share, keep - 1e-12) + 1))
    n = len(X)
    ranks = np.zeros((n, n))
    iu = np.triu_indices(n, 1)
    ranks[iu] = rankdata(rdm_vector(x, rdm))
    ranks = ranks + ranks.T
    return Prepared(n, u, s, vt, k, X @ X.T, ranks, rdm)


def _perm(p: np.ndarray | None, n: int) -> np.ndarray:
    return np.arange(n) if p is None else np.asarray(p, dtype=np.int64)


def _singular(m: np.ndarray, vectors: str = "") -> tuple[np.ndarray, np.ndarray | None]:
    """The singular values of ``m`` (descending) from the eigenvalues of its smaller Gram matrix (a third of an
    SVD's time: each permutation of each layer pair needs them); ``vectors="left"``/``"right"``: that side's
    singular vectors too, as columns."""
    left = m.shape[0] <= m.shape[1] if not vectors else vectors == "left"
    g = m @ m.T if left else m.T @ m
    if not vectors:
        w = np.linalg.eigvalsh(g)[::-1]
        return np.sqrt(np.clip(w, 0.0, None))[:min(m.shape)], None
    w, v = np.linalg.eigh(g)
    return np.sqrt(np.clip(w[::-1], 0.0, None))[:min(m.shape)], v[:, ::-1][:, :min(m.shape)]


def canonical_correlations(a: Prepared, b: Prepared, perm=None, *, reduced: bool = False) -> np.ndarray:
    """The canonical correlations of X and Y (Y's rows in ``perm`` order), descending; ``reduced``: between
    the SVCCA-reduced sides."""
    ua = a.u[:, :a.svcca_rank] if reduced else a.u
    ub = (b.u[:, :b.svcca_rank] if reduced else b.u)[_perm(perm, b.n)]
    return np.clip(_singular(ua.T @ ub)[0], 0.0, 1.0)


def shared_scores(a: Prepared, b: Prepared, perm=None, names=("svcca", "pwcca", "procrustes")) -> dict[str, float]:
    """SVCCA, PWCCA and the Procrustes similarity from one product ``Ua^T Ub`` (the costly step when every
    permutation of every layer pair needs all three)."""
    m = a.u.T @ b.u[_perm(perm, b.n)]
    out = {}
    if "svcca" in names:
        out["svcca"] = float(np.mean(np.clip(_singular(m[:a.svcca_rank, :b.svcca_rank])[0], 0.0, 1.0)))
    if "pwcca" in names:
        out["pwcca"] = _pwcca_from(a, b, m)
    if "procrustes" in names:
        n = (a.s[:, None] * m) * b.s[None, :]
        out["procrustes"] = float(np.clip(_singular(n)[0].sum() / (np.linalg.norm(a.s) * np.linalg.norm(b.s)),
                                          0.0, 1.0))
    return out


def svcca(a: Prepared, b: Prepared, perm=None) -> float:
    return float(np.mean(canonical_correlations(a, b, perm, reduced=True)))


def pwcca(a: Prepared, b: Prepared, perm=None) -> float:
    return _pwcca_from(a, b, a.u.T @ b.u[_perm(perm, b.n)])


def _pwcca_from(a: Prepared, b: Prepared, m: np.ndarray) -> float:
    mine = len(a.s) <= len(b.s)  # the variates of the side with fewer dimensions
    rho, vec = _singular(m, "left" if mine else "right")
    rho = np.clip(rho, 0.0, 1.0)
    s, vt = (a.s, a.vt) if mine else (b.s, b.vt)
    w = np.abs(vec.T @ (s[:, None] * vt)).sum(axis=1)  # variates h = U v; <h_i, x_j> = (v^T S V^T)_ij
    return float(np.sum(w * rho) / np.sum(w))


def procrustes_similarity(a: Prepared, b: Prepared, perm=None) -> float:
    """``||X^T Y||_*`` with both sides at Frobenius norm 1 (``1 - distance / 2``)."""
    ub = b.u[_perm(perm, b.n)]
    m = (a.s[:, None] * (a.u.T @ ub)) * b.s[None, :]
    return float(np.clip(_singular(m)[0].sum() / (np.linalg.norm(a.s) * np.linalg.norm(b.s)), 0.0, 1.0))


def procrustes_distance(a: Prepared, b: Prepared, perm=None) -> float:
    return 2.0 - 2.0 * procrustes_similarity(a, b, perm)


def rsa(a: Prepared, b: Prepared, perm=None) -> float:
    """Spearman correlation of the two RDMs' upper triangles."""
    if a.rdm_method != b.rdm_method:
        raise ValueError(f"the two sides' RDMs differ in method ({a.rdm_method} vs {b.rdm_method})")
    p = _perm(perm, b.n)
    iu = np.triu_indices(a.n, 1)
    ra = a.rdm_ranks[iu]
    rb = b.rdm_ranks[p][:, p][iu]
    ra, rb = ra - ra.mean(), rb - rb.mean()
    den = math.sqrt(float(ra @ ra) * float(rb @ rb))
    if den == 0:
        raise ValueError("an RDM is constant: RSA is undefined")
    return float(ra @ rb) / den


def gram_cka(a: Prepared, b: Prepared, perm=None) -> float:
    """Linear CKA from the centred Gram matrices."""
    p = _perm(perm, b.n)
    kb = b.gram[p][:, p]
    return float(np.sum(a.gram * kb) / (np.linalg.norm(a.gram) * np.linalg.norm(b.gram)))


def _hsic1(k: np.ndarray, l: np.ndarray) -> float:
    n = len(k)
    kt, lt = k.copy(), l.copy()
    np.fill_diagonal(kt, 0.0)
    np.fill_diagonal(lt, 0.0)
    return ((np.sum(kt * lt) + kt.sum() * lt.sum() / ((n - 1) * (n - 2))
             - 2.0 / (n - 2) * float(kt.sum(0) @ lt.sum(1))) / (n * (n - 3)))


def gram_debiased_cka(a: Prepared, b: Prepared, perm=None) -> float:
    """Debiased linear CKA (Song et al.'s unbiased HSIC, Nguyen et al. 2020) from the Gram matrices."""
    p = _perm(perm, b.n)
    kb = b.gram[p][:, p]
    hx, hy = _hsic1(a.gram, a.gram), _hsic1(b.gram, b.gram)
    if hx <= 0 or hy <= 0:
        raise ValueError("a self-HSIC is not positive: debiased CKA is undefined for these rows")
    return float(_hsic1(a.gram, kb) / math.sqrt(hx * hy))


SCORES = {"linear_cka": gram_cka, "debiased_cka": gram_debiased_cka, "svcca": svcca, "pwcca": pwcca,
          "procrustes": procrustes_similarity, "rsa": rsa}


# ---------------------------------------------------------------- calibration

@dataclass(frozen=True)
class Calibrated:
    score: float  # the observed score
    calibrated: float  # clip((score - tau) / (smax - tau), 0, 1)
    p_value: float  # (1 + #{null >= score}) / (K + 1)
    tau: float  # the (1 - alpha) critical value
    null_mean: float
    permutations: int


def calibrate(score: float, null, *, alpha: float = 0.05, smax: float = 1.0) -> Calibrated:
    """The null-calibrated score of ``score`` against K null scores (see the module text)."""
    null = np.asarray(null, dtype=np.float64).reshape(-1)
    k = len(null)
    if k < 1:
        raise ValueError("calibration needs at least one permutation")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    combined = np.sort(np.concatenate([[score], null]))
    idx = min(max(int(math.ceil((1.0 - alpha) * (k + 1))) - 1, 0), k)
    tau = float(combined[idx])
    cal = float(np.clip((score - tau) / max(smax - tau, 1e-12), 0.0, 1.0))
    p = (1.0 + float(np.sum(null >= score))) / (k + 1)
    return Calibrated(float(score), cal, p, tau, float(null.mean()), k)


def permutations(n: int, k: int, seed: int) -> np.ndarray:
    """``[k, n]``: k seeded permutations of n rows (one set for every layer pair of a run)."""
    rng = np.random.default_rng(seed)
    return np.stack([rng.permutation(n) for _ in range(k)]) if k else np.zeros((0, n), np.int64)


def permuted_neighbors(nbrs: np.ndarray, perm: np.ndarray) -> np.ndarray:
    """The k-NN lists of Y's rows taken in ``perm`` order, relabelled to the new positions."""
    inverse = np.empty_like(perm)
    inverse[perm] = np.arange(len(perm))
    return inverse[np.asarray(nbrs)[perm]]

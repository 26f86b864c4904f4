"""SVCCA, PWCCA, Procrustes, RSA, linear and debiased CKA, and their permutation calibration, each against an
independent computation: the papers' definitions written here with numpy/scipy, rsatoolbox, and the
calibrated-similarity package of Groger et al."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.linalg import orthogonal_procrustes, sqrtm

from layerscope.metrics import representation as rep


def _pair(seed=0, n=60, dx=7, dy=5):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, dx))
    y = x[:, :dy] @ rng.normal(size=(dy, dy)) + 0.8 * rng.normal(size=(n, dy))
    return x, y


def _inv_sqrt(c):
    return np.real(np.linalg.inv(sqrtm(c)))


def _hand_cca(x, y):
    """Canonical correlations from the covariance definition: singular values of Sxx^-1/2 Sxy Syy^-1/2."""
    x, y = x - x.mean(0), y - y.mean(0)
    sxx, syy, sxy = x.T @ x, y.T @ y, x.T @ y
    t = _inv_sqrt(sxx) @ sxy @ _inv_sqrt(syy)
    u, rho, vt = np.linalg.svd(t, full_matrices=False)
    return rho, _inv_sqrt(sxx) @ u, _inv_sqrt(syy) @ vt.T  # correlations, X's and Y's canonical weights


def _hand_svcca(x, y, keep=0.99):
    def reduce(a):
        a = a - a.mean(0)
        u, s, vt = np.linalg.svd(a, full_matrices=False)
        k = int(np.argmax(np.cumsum(s ** 2) / np.sum(s ** 2) >= keep - 1e-12)) + 1
        return a @ vt[:k].T

    return float(np.mean(_hand_cca(reduce(x), reduce(y))[0]))


def _hand_pwcca(x, y):
    # Morcos et al. 2018: alpha_i = sum_j |<h_i, z_j>| over the columns z_j, h_i the unit canonical variates
    rho, wx, wy = _hand_cca(x, y)
    side, w = (x, wx) if x.shape[1] <= y.shape[1] else (y, wy)
    side = side - side.mean(0)
    h = side @ w
    h = h / np.linalg.norm(h, axis=0)
    alpha = np.abs(h.T @ side).sum(axis=1)[:len(rho)]
    return float(np.sum(alpha * rho) / alpha.sum())


def _hand_procrustes(x, y):
    # Ding et al. 2021: min_R ||X R - Y||_F^2 over orthogonal R, with X, Y centred and at Frobenius norm 1
    x, y = x - x.mean(0), y - y.mean(0)
    x, y = x / np.linalg.norm(x), y / np.linalg.norm(y)
    d = max(x.shape[1], y.shape[1])
    xp = np.pad(x, ((0, 0), (0, d - x.shape[1])))
    yp = np.pad(y, ((0, 0), (0, d - y.shape[1])))
    r, _ = orthogonal_procrustes(xp, yp)
    return float(np.linalg.norm(xp @ r - yp) ** 2)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_svcca_pwcca_and_procrustes_equal_the_papers_definitions(seed):
    x, y = _pair(seed)
    a, b = rep.prepare(x), rep.prepare(y)
    assert rep.svcca(a, b) == pytest.approx(_hand_svcca(x, y), abs=1e-9)
    assert rep.pwcca(a, b) == pytest.approx(_hand_pwcca(x, y), abs=1e-9)
    assert rep.pwcca(b, a) == pytest.approx(_hand_pwcca(y, x), abs=1e-9)
    assert rep.procrustes_distance(a, b) == pytest.approx(_hand_procrustes(x, y), abs=1e-9)
    # a row permutation of Y is the same as Y's rows given in that order
    p = np.random.default_rng(seed).permutation(len(y))
    bp = rep.prepare(y[p])
    for name, fn in rep.SCORES.items():
        assert fn(a, b, p) == pytest.approx(fn(a, bp), abs=1e-9), name
    for name, value in rep.shared_scores(a, b, p).items():  # one product for the three
        assert value == pytest.approx(rep.SCORES[name](a, b, p), abs=1e-12), name


def test_indices_are_one_for_a_rotated_scaled_copy():
    x, _ = _pair(3)
    q, _ = np.linalg.qr(np.random.default_rng(3).normal(size=(7, 7)))
    a, b = rep.prepare(x), rep.prepare(2.5 * x @ q + 4.0)
    for fn in (rep.svcca, rep.pwcca, rep.procrustes_similarity, rep.gram_cka):
        assert fn(a, b) == pytest.approx(1.0, abs=1e-9)
    assert rep.procrustes_distance(a, b) == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize("method", ["correlation", "euclidean"])
def test_rsa_equals_rsatoolbox(method):
    rsatoolbox = pytest.importorskip("rsatoolbox")
    x, y = _pair(4, n=25)
    rdms = [rsatoolbox.rdm.calc_rdm(rsatoolbox.data.Dataset(v), method=method) for v in (x, y)]
    want = float(rsatoolbox.rdm.compare(rdms[0], rdms[1], method="spearman")[0, 0])
    assert rep.rdm_vector(x, method) == pytest.approx(rdms[0].get_vectors()[0], abs=1e-12)
    assert rep.rsa(rep.prepare(x, rdm=method), rep.prepare(y, rdm=method)) == pytest.approx(want, abs=1e-12)


def test_cka_and_debiased_cka_from_grams_equal_the_definitions():
    x, y = _pair(5, n=30)
    xc, yc = x - x.mean(0), y - y.mean(0)
    k, l = xc @ xc.T, yc @ yc.T
    assert rep.gram_cka(rep.prepare(x), rep.prepare(y)) == pytest.approx(
        np.sum(k * l) / (np.linalg.norm(k) * np.linalg.norm(l)), abs=1e-12)

    def hsic1(k, l):  # Song et al. 2012, written out with n x n matrices
        n = len(k)
        kt, lt = k - np.diag(np.diag(k)), l - np.diag(np.diag(l))
        one = np.ones(n)
        return (np.trace(kt @ lt) + (one @ kt @ one) * (one @ lt @ one) / ((n - 1) * (n - 2))
                - 2 / (n - 2) * one @ kt @ lt @ one) / (n * (n - 3))

    want = hsic1(k, l) / math.sqrt(hsic1(k, k) * hsic1(l, l))
    assert rep.gram_debiased_cka(rep.prepare(x), rep.prepare(y)) == pytest.approx(want, abs=1e-12)


def test_calibration_equals_groger_et_al_calibrated_similarity():
    torch = pytest.importorskip("torch")
    cs = pytest.importorskip("calibrated_similarity")
    x, y = _pair(6, n=40)
    a, b = rep.prepare(x), rep.prepare(y)
    perms = rep.permutations(len(y), 30, seed=9)
    for name, fn in rep.SCORES.items():
        null = [fn(a, b, p) for p in perms]
        ours = rep.calibrate(fn(a, b), null, alpha=0.05, smax=1.0)
        queue = iter(perms)

        def sim(xt, yt, fn=fn):
            return fn(rep.prepare(xt.double().numpy()), rep.prepare(yt.double().numpy()))

        score, p, tau = cs.calibrate(torch.as_tensor(x), torch.as_tensor(y), sim, K=30, alpha=0.05, smax=1.0,
                                     perm_fn=lambda n, device: torch.as_tensor(next(queue)))
        assert ours.calibrated == pytest.approx(float(score), abs=1e-5), name  # theirs is float32
        assert ours.p_value == pytest.approx(float(p), abs=1e-6), name
        assert ours.tau == pytest.approx(float(tau), abs=1e-5), name


def test_calibration_is_zero_for_unrelated_sides_and_high_for_related():
    rng = np.random.default_rng(8)
    x = rng.normal(size=(50, 30))
    a = rep.prepare(x)
    unrelated = rep.prepare(rng.normal(size=(50, 30)))
    related = rep.prepare(x @ rng.normal(size=(30, 30)))
    perms = rep.permutations(50, 49, seed=1)
    raw = rep.svcca(a, unrelated)
    assert raw > 0.5  # CCA of 30 + 30 dims on 50 items: high for anything, the bias calibration removes
    assert rep.calibrate(raw, [rep.svcca(a, unrelated, p) for p in perms]).calibrated < 0.5
    cal = rep.calibrate(rep.svcca(a, related), [rep.svcca(a, related, p) for p in perms])
    assert cal.calibrated > 0.9 and cal.p_value == pytest.approx(1 / 50)  # beats every permutation


def test_permuted_neighbours_are_the_neighbours_of_the_permuted_rows():
    from layerscope.metrics.neighbors import knn_indices

    rng = np.random.default_rng(2)
    y = rng.normal(size=(20, 4))
    p = rng.permutation(20)
    nb = knn_indices(y, 3)
    assert np.array_equal(np.sort(rep.permuted_neighbors(nb, p), 1), np.sort(knn_indices(y[p], 3), 1))

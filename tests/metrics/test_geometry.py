"""Intrinsic dimension, anisotropy, effective rank and matrix entropy against their reference libraries
(scikit-dimension, DADApy through its committed reference values) and hand computations."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from layerscope.metrics import geometry

REFERENCE = Path(__file__).parent / "data" / "gride_dadapy.json"


def _sets():
    return json.loads(REFERENCE.read_text(encoding="utf-8"))["sets"]


@pytest.mark.parametrize("name", ["plane", "gauss", "roll"])
def test_gride_equals_dadapy_at_every_scale(name):
    # tests/metrics/data/gride_dadapy.json: DADApy 0.3.4's return_id_scaling_gride on these very points
    # (scripts/gride_reference.py regenerates it in a throwaway environment: DADApy pins numpy<2)
    ref = _sets()[name]
    x = np.asarray(ref["points"])
    for n2, want, err in zip(ref["n2"], ref["gride"], ref["gride_error"]):
        got = geometry.gride(x, n1=n2 // 2)
        assert got.dimension == pytest.approx(want, abs=2e-6)  # DADApy bisects to 1e-7
        assert got.error == pytest.approx(err, rel=1e-4)
        assert (got.n1, got.n2) == (n2 // 2, n2)


@pytest.mark.parametrize("name", ["plane", "gauss", "roll"])
def test_gride_equals_scikit_dimension(name):
    skdim = pytest.importorskip("skdim")
    x = np.asarray(_sets()[name]["points"])
    for n1 in (1, 2, 4):
        ref = skdim.id.GRIDE(n1=n1).fit(x)
        got = geometry.gride(x, n1=n1)
        assert got.dimension == pytest.approx(ref.dimension_, rel=1e-9)
        assert got.error == pytest.approx(ref.error_, rel=1e-9)
    # at n1 = 1 GRIDE is TwoNN's maximum likelihood (N - 1) / sum(log mu): DADApy's 2NN "ml" too
    assert geometry.gride(x, 1).dimension == pytest.approx(_sets()[name]["twonn_ml"], abs=2e-6)


@pytest.mark.parametrize("seed,shape", [(0, (200, 3)), (1, (150, 40)), (2, (90, 8))])
def test_twonn_equals_scikit_dimension(seed, shape):
    skdim = pytest.importorskip("skdim")
    rng = np.random.default_rng(seed)
    x = rng.normal(size=shape) @ rng.normal(size=(shape[1], shape[1] + 2))
    for discard in (0.1, 0.25, 0.5):
        ref = skdim.id.TwoNN(discard_fraction=discard).fit(x).dimension_
        assert geometry.twonn(x, discard_fraction=discard) == pytest.approx(ref, rel=1e-9)


def test_twonn_drops_duplicates_as_scikit_dimension_does():
    skdim = pytest.importorskip("skdim")
    rng = np.random.default_rng(4)
    x = rng.normal(size=(80, 3))
    x = np.vstack([x, x[:5]])  # five points twice: r1 = 0 for ten of them
    with pytest.warns(UserWarning):
        ref = skdim.id.TwoNN().fit(x).dimension_
    assert geometry.twonn(x) == pytest.approx(ref, rel=1e-9)


def test_estimators_refuse_too_few_points_in_one_line():
    with pytest.raises(ValueError, match="at least"):
        geometry.gride(np.random.default_rng(0).normal(size=(4, 3)), n1=2)
    with pytest.raises(ValueError, match="at least"):
        geometry.twonn(np.zeros((2, 3)) + [[0, 0, 0], [1, 1, 1]])


def test_anisotropy_is_the_mean_cosine_over_pairs_from_different_texts():
    rng = np.random.default_rng(7)
    x = rng.normal(size=(23, 5)) + [2.0, 0, 0, 0, 0]
    groups = np.repeat(np.arange(5), [3, 6, 4, 2, 8])
    for center in (False, True):
        v = x - x.mean(0) if center else x
        u = v / np.linalg.norm(v, axis=1, keepdims=True)
        cos = [u[i] @ u[j] for i in range(len(x)) for j in range(len(x)) if groups[i] != groups[j]]
        assert geometry.anisotropy(x, groups, center=center) == pytest.approx(np.mean(cos), abs=1e-12)
    # a resample that counts a text w times: each pair of texts counts w_g w_h times, copies never pair
    sums, counts = geometry.unit_sums(x, groups)
    w = np.array([2, 0, 1, 3, 0])
    u = x / np.linalg.norm(x, axis=1, keepdims=True)
    num = den = 0.0
    for i in range(len(x)):
        for j in range(len(x)):
            if groups[i] != groups[j]:
                num += w[groups[i]] * w[groups[j]] * (u[i] @ u[j])
                den += w[groups[i]] * w[groups[j]]
    assert geometry.cross_group_cosine(sums, counts, w) == pytest.approx(num / den, abs=1e-12)
    with pytest.raises(ValueError, match="two groups"):
        geometry.anisotropy(x[:3], groups[:3])


def test_matrix_entropy_and_effective_rank_by_hand():
    # Z = diag(3, 1, 0) padded: Gram eigenvalues 9, 1 -> p = (0.9, 0.1);
    # S_1 = -(0.9 ln 0.9 + 0.1 ln 0.1); S_2 = -ln(0.81 + 0.01); singular values 3, 1 -> p = (0.75, 0.25),
    # erank = exp(-(0.75 ln 0.75 + 0.25 ln 0.25))
    z = np.array([[3.0, 0, 0, 0], [0, 1.0, 0, 0], [0, 0, 0, 0]])
    assert geometry.matrix_entropy(z) == pytest.approx(-(0.9 * math.log(0.9) + 0.1 * math.log(0.1)))
    assert geometry.matrix_entropy(z, alpha=2) == pytest.approx(-math.log(0.82))
    assert geometry.effective_rank(z) == pytest.approx(math.exp(-(0.75 * math.log(0.75) + 0.25 * math.log(0.25))))
    # rotation-invariant, and the Gram matrix's own eigenvalues give the same entropy
    rng = np.random.default_rng(3)
    a = rng.normal(size=(7, 12))
    q, _ = np.linalg.qr(rng.normal(size=(12, 12)))
    lam = np.clip(np.linalg.eigvalsh(a @ a.T), 0, None)
    p = lam[lam > 1e-12] / lam.sum()
    assert geometry.matrix_entropy(a) == pytest.approx(-np.sum(p * np.log(p)), rel=1e-9)
    assert geometry.matrix_entropy(a @ q) == pytest.approx(geometry.matrix_entropy(a), rel=1e-9)
    assert geometry.effective_rank(a @ q) == pytest.approx(geometry.effective_rank(a), rel=1e-9)
    assert 1.0 <= geometry.effective_rank(a) <= 7.0

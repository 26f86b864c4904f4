"""Pure helpers of the sts / pooling / probe analyses, against hand-computed values."""

from __future__ import annotations

import numpy as np
import pytest

from layerscope.analyses.common import similarity_correlations
from layerscope.analyses.pooling import RetrievalSet, _retrieval_binary, _retrieval_float, truncation_sizes
from layerscope.analyses.probe import PairSplit, ProbeConfig, train_probe
from layerscope.metrics.vectors import layer_cosines
from layerscope.data.pairs import Pairs
from layerscope.errors import InputError


def test_similarity_correlations_hand_values():
    # ranks of sims 1,2,3,4 vs scores 1,3,2,4: d = 0,1,1,0 -> rho = 1 - 6*2/(4*15) = 0.8
    # pearson: x-mean = -1.5,-.5,.5,1.5; y-mean same set reordered -1.5,.5,-.5,1.5 -> 4/5 = 0.8
    row = similarity_correlations(np.array([0.1, 0.2, 0.3, 0.4]), np.array([1.0, 3.0, 2.0, 4.0]), n_boot=0, seed=0)
    assert row["spearman"] == pytest.approx(0.8)
    assert row["pearson"] == pytest.approx(0.8)
    assert row["spearman_ci_low"] is None and row["undefined"] is None
    assert row["mean_similarity"] == pytest.approx(0.25)


def test_similarity_correlations_constant_is_undefined_not_nan():
    sims = np.array([1.0, 1.0 - 1e-9, 1.0, 1.0])  # float noise around one value
    row = similarity_correlations(sims, np.array([1.0, 2.0, 3.0, 4.0]), n_boot=100, seed=0)
    assert row["spearman"] is None and row["pearson"] is None
    assert "constant" in row["undefined"]


def test_truncation_sizes():
    assert truncation_sizes(384) == [32, 64, 128, 256, 384]
    assert truncation_sizes(32) == [32]
    assert truncation_sizes(20) == [20]
    assert truncation_sizes(768) == [32, 64, 128, 256, 512, 768]


def test_layer_cosines_hand_values():
    a = np.array([[[1.0, 0.0], [0.0, 2.0]], [[1.0, 1.0], [3.0, 0.0]]])  # [layers=2, n=2, h=2]
    b = np.array([[[1.0, 1.0], [0.0, 5.0]], [[-1.0, -1.0], [0.0, 1.0]]])
    got = layer_cosines(a, b)
    np.testing.assert_allclose(got, [[1 / np.sqrt(2), -1.0], [1.0, 0.0]])


def _pairs(s1, s2, scores):
    return Pairs(list(s1), list(s2), np.asarray(scores, float), "mem", "mem")


def test_retrieval_float_and_binary_ranks_by_hand():
    # texts: q0, q1 (side 1), d0, d1 (side 2); pairs (q0,d0), (q1,d1)
    pairs = _pairs(["q0", "q1"], ["d0", "d1"], [1, 2])
    rs = RetrievalSet(pairs, min_score=0)  # the rank arithmetic; the relevance threshold is tested on its own
    assert rs.texts == ["q0", "q1", "d0", "d1"]
    v = np.array([[1.0, 0.2], [1.0, -0.1], [0.9, 0.3], [0.0, 1.0]])
    # q0 -> d0 cos .99 vs d1 .196: rank 1; q1 -> d1 cos -.1 vs d0 .85: rank 2
    # d0 -> q0 rank 1 (.99 > .85); d1 -> q1 -.1 vs q0 .196: rank 2  => ranks 1,2,1,2
    m = _retrieval_float(v, rs)
    assert m["acc@1"] == pytest.approx(0.5) and m["mrr"] == pytest.approx(0.75)
    # sign bits: q0 11, q1 10, d0 11, d1 01 (0.0 -> 0). Hamming: q0-d0 0, q0-d1 1 -> rank 1;
    # q1-d1 2 vs q1-d0 1 -> rank 2; d0-q0 0 vs d0-q1 1 -> 1; d1-q1 2 vs d1-q0 1 -> 2
    from layerscope.metrics.quantization import binary_quantize

    m = _retrieval_binary(binary_quantize(v), 2, rs)
    assert m["acc@1"] == pytest.approx(0.5) and m["mrr"] == pytest.approx(0.75)
    # ties: the rank is uniform over the tied block (first or second of two: hit@1 1/2, reciprocal rank 3/4).
    # texts q0 q1 q2 d0 d1 d2; bits q0 11, q1 10, q2 00, d0 11, d1 11, d2 01
    rs = RetrievalSet(_pairs(["q0", "q1", "q2"], ["d0", "d1", "d2"], [1, 2, 3]), min_score=0)
    v = np.array([[1, 1], [1, -1], [-1, -1], [1, 1], [1, 1], [-1, 1]], float)
    # q->d: q0 d0/d1 tie at 0 -> 1 or 2; q1 d0/d1 tie at 1 -> 1 or 2; q2 d2 at 1 beats 2,2 -> 1
    # d->q: d0 q0 at 0 -> 1; d1 q1 at 1 behind q0 at 0 -> 2; d2 q2 at 1 tied with q0 at 1 -> 1 or 2
    m = _retrieval_binary(binary_quantize(v), 2, rs)
    assert m["acc@1"] == pytest.approx((0.5 + 0.5 + 1 + 1 + 0 + 0.5) / 6)
    assert m["mrr"] == pytest.approx((0.75 * 3 + 1 + 1 + 0.5) / 6)


def _synthetic(seed, n=200, layers=3, h=8):
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(layers, n, h)).astype(np.float32)
    noise = rng.normal(size=(layers, n, h)).astype(np.float32)
    mix = rng.uniform(0, 1, size=n).astype(np.float32)
    b = (mix[None, :, None] * a + (1 - mix[None, :, None]) * noise).astype(np.float32)
    y = 5 * mix + rng.normal(scale=0.2, size=n)
    return PairSplit(a, b, y)


@pytest.mark.parametrize("kind, loss, pretrain", [("cosine-mlp", "mse", False), ("siamese", "logvar", True)])
def test_probe_learns_and_reruns_identically(kind, loss, pretrain):
    train, dev, test = _synthetic(1), _synthetic(2, n=100), _synthetic(3, n=100)
    cfg = dict(kind=kind, loss=loss, epochs=15, patience=5, pretrain=pretrain, pretrain_epochs=3, seed=7,
               proj_dim=8, hidden=16)
    unl = np.concatenate([train.a, train.b], axis=1) if pretrain else None
    r1 = train_probe(train, test, ProbeConfig(**cfg), dev=dev, unlabeled=unl)
    r2 = train_probe(train, test, ProbeConfig(**cfg), dev=dev, unlabeled=unl)
    np.testing.assert_array_equal(r1["test_predictions"], r2["test_predictions"])
    from scipy.stats import pearsonr

    assert pearsonr(r1["test_predictions"], test.y)[0] > 0.7
    assert 1 <= r1["best_epoch"] <= r1["epochs_run"] <= 15
    if pretrain:
        assert r1["pretrain"]["last_loss"] < r1["pretrain"]["first_loss"]
    with pytest.raises(InputError, match="--probe-loss"):
        train_probe(train, test, ProbeConfig(kind=kind, loss="l1"))

"""Where layerscope.metrics uses a library instead of its own code, and where it keeps its own (and why).

Every expected number is derived by hand in the comment next to it.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from scipy import stats

from layerscope.metrics import correlation, neighbors, quantization


# ---------------------------------------------------------------- bootstrap (scipy.stats.bootstrap)


def test_bootstrap_interval_is_scipys_percentile_interval():
    # No resample can be constant here (continuous data, n = 40), so our interval must be exactly
    # scipy.stats.bootstrap(paired, percentile) with the same generator and batch.
    rng = np.random.default_rng(5)
    x = rng.normal(size=40)
    y = x + rng.normal(size=40)
    ours = correlation.pearson(x, y, n_boot=300, seed=11, ci=0.9)
    ref = stats.bootstrap((x, y), lambda a, b, axis=-1: np.array([stats.pearsonr(r, s)[0] for r, s in zip(a, b)]),
                          n_resamples=300, batch=300, vectorized=True, paired=True, confidence_level=0.9,
                          method="percentile", rng=np.random.default_rng(11))
    assert ours.ci_low == pytest.approx(ref.confidence_interval.low, abs=1e-12)
    assert ours.ci_high == pytest.approx(ref.confidence_interval.high, abs=1e-12)


def test_bootstrap_keeps_the_skip_of_constant_resamples_scipy_alone_gives_nan():
    # x = [0, 0, 1], y = [0, 1, 3]. Of the 27 equally likely resamples of 3 indices, 9 are constant in x
    # (8 miss index 2, 1 is {2, 2, 2}) and are skipped. The other 18:
    #   the 6 orderings of {0, 1, 2} are the data itself: xc = [-1/3, -1/3, 2/3], yc = [-4/3, -1/3, 5/3],
    #   sum xc*yc = 15/9, |xc|^2 = 6/9, |yc|^2 = 42/9 -> r = 15 / sqrt(6 * 42) = 15 / sqrt(252);
    #   the 12 others ({0,0,2}, {1,1,2}, {0,2,2}, {1,2,2} in 3 orders each) have two distinct points -> r = 1.
    # So a third of the usable mass sits at 15/sqrt(252) and two thirds at 1: the 2.5% point is
    # 15/sqrt(252) and the 97.5% point is 1.
    x, y = np.array([0.0, 0.0, 1.0]), np.array([0.0, 1.0, 3.0])
    c = correlation.pearson(x, y, n_boot=400, seed=0)
    assert c.ci_low == pytest.approx(15 / math.sqrt(252), abs=1e-12)
    assert c.ci_high == pytest.approx(1.0, abs=1e-12)
    # scipy.stats.bootstrap on its own has no way to leave a resample out: one NaN statistic makes the
    # whole interval NaN. That is why the skip stays ours (the resampling and percentiles are scipy's).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        alone = stats.bootstrap((x, y), lambda a, b, axis=-1: correlation._rowwise_pearson(a, b), n_resamples=400,
                                vectorized=True, paired=True, method="percentile", rng=np.random.default_rng(0))
    assert math.isnan(alone.confidence_interval.low)


# ---------------------------------------------------------------- Hamming (np.bitwise_count)


def test_hamming_similarity_counts_bits_across_bytes():
    # 16 dims in two bytes: a = 0xFF 0x0F, b = 0x00 0x0F -> 8 bits differ in byte 0, 0 in byte 1
    # -> 1 - 8/16 = 0.5. a vs a: 1. With dim = 12 the padding is the 4 low bits of byte 1 (0 on both
    # sides after packing a 12-wide row), and 0xF0 vs 0x00 in byte 1 alone is 4 of 12 -> 1 - 4/12.
    a = np.array([[0xFF, 0x0F]], dtype=np.uint8)
    b = np.array([[0x00, 0x0F]], dtype=np.uint8)
    assert quantization.hamming_similarity(a, b)[0] == pytest.approx(0.5)
    assert quantization.hamming_similarity(a, a)[0] == 1.0
    c = np.array([[0x00, 0xF0]], dtype=np.uint8)
    z = np.array([[0x00, 0x00]], dtype=np.uint8)
    assert quantization.hamming_similarity(c, z, dim=12)[0] == pytest.approx(1 - 4 / 12)


def test_faiss_binary_index_scores_are_our_hamming_similarities():
    # The binary index packs little-endian (FAISS's order), the metrics default is big-endian: the
    # Hamming distance must not depend on it, as long as build and search use the same order.
    pytest.importorskip("faiss")
    from layerscope.index.vector_index import VectorIndex, normalize

    rng = np.random.default_rng(2)
    x = normalize(rng.normal(size=(50, 20)))
    vi = VectorIndex.build(x, "binary", normalized=True, device="cpu")
    scores, ids = vi.search(x[:7], 50, normalized=True)
    codes = quantization.binary_quantize(x)
    for q in range(7):
        expect = quantization.hamming_similarity(np.repeat(codes[q:q + 1], 50, axis=0), codes[ids[q]], dim=20)
        np.testing.assert_allclose(scores[q], expect, atol=1e-6)
    # by hand for one pair: the number of sign disagreements over 20 dims
    h = int(np.sum((x[0] > 0) != (x[ids[0, -1]] > 0)))
    assert scores[0, -1] == pytest.approx(1 - h / 20, abs=1e-6)


# ---------------------------------------------------------------- sentence-transformers' quantize_embeddings


def test_binary_codes_are_sentence_transformers_ubinary():
    quantize_embeddings = pytest.importorskip("sentence_transformers.util.quantization").quantize_embeddings
    rng = np.random.default_rng(4)
    x = rng.normal(size=(9, 13)).astype(np.float32)
    x[0, :3] = 0.0  # zero is a 0 bit in both
    np.testing.assert_array_equal(quantization.binary_quantize(x), quantize_embeddings(x, "ubinary"))


def test_int8_rounds_where_sentence_transformers_floors():
    # One dimension calibrated on [0, 255]: step (scale) 1, offset min + 128 * scale = 128.
    # x = 0.9: ours rint(0.9 - 128) = rint(-127.1) = -127, dequantised -127 + 128 = 1.0 (error 0.1 <= 1/2);
    # sentence-transformers floor((0.9 - 0) / 1) - 128 = -128, which dequantises to 0.0 (error 0.9 > 1/2).
    # Our round trip promises an error of at most scale / 2 inside the calibration range; theirs has no
    # dequantisation and its codes would break that bound, so int8 stays ours.
    quantize_embeddings = pytest.importorskip("sentence_transformers.util.quantization").quantize_embeddings
    calib = np.array([[0.0], [255.0]])
    x = np.array([[0.9]])
    codes, scale, offset = quantization.int8_quantize(x, calibration=calib)
    assert codes[0, 0] == -127 and scale[0] == 1.0 and offset[0] == 128.0
    assert quantization.int8_dequantize(codes, scale, offset, dtype=np.float64)[0, 0] == pytest.approx(1.0)
    theirs = quantize_embeddings(x, "int8", calibration_embeddings=calib)
    assert theirs[0, 0] == -128
    assert quantization.int8_dequantize(theirs, scale, offset, dtype=np.float64)[0, 0] == pytest.approx(0.0)


# ---------------------------------------------------------------- neighbours shared with the FAISS indexes


def test_retrieval_metrics_takes_ranks_beyond_a_cutoff():
    # ranks 2 and +inf (not in the searched top-k): acc@1 = 0, acc@5 = 1/2, mrr = (1/2 + 0) / 2 = 1/4
    r = neighbors.retrieval_metrics(np.array([2.0, np.inf]), ks=(1, 5))
    assert r == pytest.approx({"acc@1": 0.0, "acc@5": 0.5, "mrr": 0.25})
    for bad in (np.nan, -np.inf):
        with pytest.raises(ValueError):
            neighbors.retrieval_metrics(np.array([1.0, bad]))


def test_mutual_knn_and_recall_treat_minus_one_as_missing():
    # row 0: {3, -1} vs {3, -1}: only 3 is shared (-1 never matches) -> 1; row 1: {0, 2} vs {2, -1} -> 1
    # -> 2 / (2 rows * 2) = 0.5; two -1 in one row are not a repeated index
    a = np.array([[3, -1], [0, 2]])
    b = np.array([[3, -1], [2, -1]])
    assert neighbors.mutual_knn(a, b) == pytest.approx(0.5)
    assert neighbors.mutual_knn(np.array([[-1, -1]]), np.array([[-1, -1]])) == 0.0
    # recall@k: approximate [5, -1, 7] vs exact [7, 5, 6] -> 2 of 3 found
    assert neighbors.recall_at_k(np.array([[5, -1, 7]]), np.array([[7, 5, 6]])) == pytest.approx(2 / 3)


def test_drop_self_removes_the_query_or_the_last_result():
    # query 0 found at position 1 -> [4, 9]; query 1 not found (ties/ANN) -> drop the last -> [3, 8]
    idx = np.array([[4, 0, 9], [3, 8, 5]])
    np.testing.assert_array_equal(neighbors.drop_self(idx, np.array([0, 1]), 2), [[4, 9], [3, 8]])


def test_hamming_ranks_hand_example():
    # one byte codes (8 dims). docs: 0b11110000, 0b11000000, 0b00001111
    # query 0b11100000: distances 1, 1, 7 -> doc 0 ties doc 1 at the top: rank 1 + 0 + 1/2 = 1.5
    # query 0b00000111: distances 7, 5, 1 -> doc 1 has one nearer (doc 2): rank 2
    pytest.importorskip("faiss")
    docs = np.array([[0b11110000], [0b11000000], [0b00001111]], dtype=np.uint8)
    queries = np.array([[0b11100000], [0b00000111]], dtype=np.uint8)
    np.testing.assert_array_equal(neighbors.hamming_ranks(queries, docs, np.array([0, 1])), [1.5, 2.0])

"""Quantization: binary and int8 codes, Hamming similarity, dimension truncation, retention."""

from __future__ import annotations

import math

import numpy as np

from layerscope.metrics.checks import as_matrix, check_finite, row_blocks



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


def binary_quantize(x, *, bitorder: str = "big") -> np.ndarray:
    """Sign bits (``value > 0`` -> 1), packed: uint8 ``[n, ceil(d / 8)]``.

    The same codes as sentence-transformers' ``quantize_embeddings(x,
    "ubinary")`` (a test pins that), without importing it: it is an optional
    extra that loads torch. ``bitorder="little"`` packs the first dimension
    into the lowest bit, as the FAISS binary indexes store them; Hamming
    distances do not depend on the order as long as both sides use the same.
    """
    X = as_matrix(x, "x")
    check_finite(X, "x")
    return np.packbits(X > 0, axis=1, bitorder=bitorder)


def hamming_similarity(a_bits, b_bits, *, dim: int | None = None) -> np.ndarray:
    """Per pair ``1 - hamming(a_i, b_i) / dim`` of packed sign codes, float64 ``[n]``.

    ``dim`` is the original width; it defaults to ``8 * bytes per row`` (right
    whenever d is a multiple of 8; pass it otherwise). Padding bits are 0 on
    both sides and never count.
    """
    A = as_matrix(a_bits, "a_bits")
    B = as_matrix(b_bits, "b_bits")
    if A.dtype != np.uint8 or B.dtype != np.uint8:
        raise ValueError(f"packed codes must be uint8, got {A.dtype} and {B.dtype}")
    if A.shape != B.shape:
        raise ValueError(f"a_bits and b_bits must have the same shape, got {A.shape} and {B.shape}")
    nbits = 8 * A.shape[1]
    dim = nbits if dim is None else int(dim)
    if not nbits - 8 < dim <= nbits:
        raise ValueError(f"dim={dim} does not fit codes of {A.shape[1]} bytes per row")
    ham = np.bitwise_count(np.bitwise_xor(A, B)).sum(axis=1, dtype=np.int64)
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
    X = as_matrix(x, "x")
    C = X if calibration is None else as_matrix(calibration, "calibration")
    if C.shape[1] != X.shape[1]:
        raise ValueError(f"calibration has {C.shape[1]} dims but x has {X.shape[1]}")
    if C.shape[0] == 0:
        raise ValueError("calibration has no rows")
    check_finite(X, "x")
    if calibration is not None:
        check_finite(C, "calibration")
    lo = C.min(axis=0).astype(np.float64)
    hi = C.max(axis=0).astype(np.float64)
    span = hi - lo
    scale = np.where(span > 0, span / 255.0, 1.0)
    offset = np.where(span > 0, lo + 128.0 * scale, lo)
    codes = np.empty(X.shape, dtype=np.int8)
    for s in row_blocks(X.shape[0], X.shape[1]):
        q = np.rint((X[s].astype(np.float64) - offset) / scale)
        codes[s] = np.clip(q, -128, 127).astype(np.int8)
    return codes, scale, offset


def int8_dequantize(codes, scale, offset, *, dtype=np.float32) -> np.ndarray:
    """``codes * scale + offset`` per dimension (see :func:`int8_quantize`)."""
    C = as_matrix(codes, "codes")
    sc = np.asarray(scale, dtype=np.float64)
    off = np.asarray(offset, dtype=np.float64)
    if sc.shape != (C.shape[1],) or off.shape != (C.shape[1],):
        raise ValueError(
            f"scale and offset must have shape ({C.shape[1]},), got {sc.shape} and {off.shape}"
        )
    return (C.astype(np.float64) * sc + off).astype(dtype)


def truncate_dims(x, k: int) -> np.ndarray:
    """The first ``k`` dimensions of every row (a view; Matryoshka-style truncation)."""
    X = as_matrix(x, "x")
    if int(k) != k or not 1 <= k <= X.shape[1]:
        raise ValueError(f"k must be an integer in [1, {X.shape[1]}], got {k}")
    return X[:, : int(k)]

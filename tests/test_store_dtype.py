"""Storage types of a store: float32, float16 and bfloat16 round trips, checked by hand-made bit patterns."""

import numpy as np
import pytest

from layerscope.errors import InputError
from layerscope.store import store_dtype as sd


def test_bfloat16_is_upper_half_rounded_to_nearest_even():
    # 1.0 is 0x3F800000: exact. 1 + 2**-8 lies halfway between bf16 1.0 and 1 + 2**-7: ties go to even (1.0).
    # 1 + 3 * 2**-9 is above halfway: rounds up to 1 + 2**-7 (0x3F81).
    x = np.array([[1.0, 1 + 2**-8, 1 + 3 * 2**-9, -2.0]], dtype=np.float32)
    bits = sd.encode(x, "bfloat16")
    assert bits.dtype == np.uint16
    assert bits.tolist() == [[0x3F80, 0x3F80, 0x3F81, 0xC000]]
    back = sd.decode(bits, "bfloat16")
    assert back.dtype == np.float32
    assert back.tolist() == [[1.0, 1.0, 1 + 2**-7, -2.0]]


@pytest.mark.parametrize("name,size", [("float32", 4), ("float16", 2), ("bfloat16", 2)])
def test_disk_sizes(name, size):
    assert sd.itemsize(name) == size
    x = np.linspace(-3, 3, 12, dtype=np.float32).reshape(3, 4)
    assert sd.decode(sd.encode(x, name), name).dtype == np.float32


def test_error_stats_by_hand():
    x = np.array([[1.0, 1 + 3 * 2**-9], [0.0, 0.0]], dtype=np.float32)
    err, cos = sd.error_stats(x, "bfloat16")
    assert err == pytest.approx(2**-7 - 3 * 2**-9)  # 1 + 3*2^-9 became 1 + 2^-7
    a, b = np.array([1.0, 1 + 3 * 2**-9]), np.array([1.0, 1 + 2**-7])
    assert cos == pytest.approx(a @ b / np.linalg.norm(a) / np.linalg.norm(b), abs=1e-15)
    assert sd.error_stats(x, "float32") == (0.0, 1.0)


def test_unknown_storage_type_is_one_line():
    with pytest.raises(InputError, match="--store-dtype must be one of float32, float16, bfloat16"):
        sd.encode(np.zeros((1, 1)), "int8")


def _min_cosine(x: np.ndarray, y: np.ndarray) -> float:
    x, y = x.astype(np.float64), y.astype(np.float64)
    return float(((x * y).sum(1) / (np.linalg.norm(x, axis=1) * np.linalg.norm(y, axis=1))).min())


def _bf16_by_hand(x: np.ndarray) -> np.ndarray:
    """float32 rounded to bfloat16 (nearest, ties to even) with integer arithmetic on the bits."""
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    kept = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return kept.astype(np.uint32).view(np.float32)


@pytest.mark.parametrize("name,rounded,refused", [("float16", lambda x: x.astype(np.float16), 0.9999),
                                                  ("bfloat16", _bf16_by_hand, 0.999)])
def test_the_shipped_bars_keep_rounding_and_refuse_more(name, rounded, refused):
    """The half-size bars as shipped: what rounding alone costs (1e-7 of cosine for float16, 3e-6 for bfloat16,
    computed here on random 384-wide rows) passes; a loss of 1e-4 (float16) or 1e-3 (bfloat16), far beyond
    any rounding, is refused."""
    from layerscope.errors import StoreError
    from layerscope.store.store_record import HalfError

    x = np.random.default_rng(5).standard_normal((500, 384)).astype(np.float32)
    got = _min_cosine(x, rounded(x))
    assert 1 - got < (3e-7 if name == "float16" else 1e-5)
    sd.check_error_bar("s", name, {"mean/1": HalfError(0.01, got)})
    with pytest.raises(StoreError, match=f"{name} keeps the vectors of mean/1 only to cosine"):
        sd.check_error_bar("s", name, {"mean/1": HalfError(0.01, refused), "mean/2": HalfError(0.001, got)})

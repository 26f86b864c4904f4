"""Storage types of a store: float32, float16 and bfloat16 round trips, checked by hand-made bit patterns."""

import numpy as np
import pytest

from layerscope.errors import InputError
from layerscope.runtime import store_dtype as sd


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

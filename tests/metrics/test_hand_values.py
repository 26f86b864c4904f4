"""Hand-derived values for the metrics whose other tests compare forms of the same formula."""

from __future__ import annotations

import math

import numpy as np
import pytest

from layerscope.metrics import cka


def test_unbiased_cka_hand_example_n4():
    # One centred feature per side, n = 4, so n(n-3) = 4, (n-1)(n-2) = 6, 2/(n-2) = 1. For centred
    # linear kernels HSIC_1 = [(sum xy)^2 - sum x^2 y^2 + (sum x^2)(sum y^2)/6 - sum x^2 y^2] / 4.
    # x = [-3, -1, 1, 3]: sum x^2 = 20, sum x^4 = 164 -> HSIC(x, x) = [400 - 164 + 400/6 - 164] / 4 = 104/3
    # y = [1, -1, -1, 1]: sum y^2 = 4,  sum y^4 = 4   -> HSIC(y, y) = [16 - 4 + 16/6 - 4] / 4 = 8/3
    # sum xy = 0, sum x^2 y^2 = 20                    -> HSIC(x, y) = [0 - 20 + 80/6 - 20] / 4 = -20/3
    # unbiased CKA = (-20/3) / sqrt(104/3 * 8/3) = -20 / sqrt(832); shifting x by 5 changes nothing.
    x = np.array([[-3.0], [-1.0], [1.0], [3.0]])
    y = np.array([[1.0], [-1.0], [-1.0], [1.0]])
    assert cka.unbiased_cka(x, y) == pytest.approx(-20 / math.sqrt(832), abs=1e-12)
    assert cka.unbiased_cka(x + 5.0, y) == pytest.approx(-20 / math.sqrt(832), abs=1e-12)
    assert cka.unbiased_cka(x, x) == pytest.approx(1.0, abs=1e-12)
    # the biased (linear) CKA of the same data: Y^T X = 0 -> 0
    assert cka.linear_cka(x, y) == pytest.approx(0.0, abs=1e-12)

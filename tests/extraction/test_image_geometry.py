"""An image's token layout on a patch grid that is neither square nor tiny, and the image mean pooling's float64
sums: each against what is written out here by hand."""

from __future__ import annotations

import numpy as np
import pytest

from layerscope.extraction.image_tokens import image_layout
from layerscope.model.manifest_type import ImageInfo


@pytest.mark.parametrize("height, width, prefix, registers", [(48, 80, 1, 0), (112, 64, 3, 2)])
def test_a_patch_knows_its_row_and_column_on_a_grid_wider_or_taller_than_high(height, width, prefix, registers):
    """Catches: the grid's rows and columns swapped, a patch's row and column taken with the wrong divisor
    (a square grid cannot tell them apart), register tokens counted as patches."""
    patch = 16
    rows, cols = height // patch, width // patch
    image = ImageInfo(height, width, patch, prefix_tokens=prefix, register_tokens=registers,
                      tokens=prefix + rows * cols)
    ids, special, grid = image_layout(image)
    want = [(-1, -1)] * prefix + [(r, c) for r in range(rows) for c in range(cols)]  # row by row, as a ViT reads
    assert grid.tolist() == [list(p) for p in want]
    assert ids.tolist() == [0] * (prefix - registers) + [1] * registers + [2] * (rows * cols)
    assert special.tolist() == [1] * prefix + [0] * (rows * cols)


def test_image_mean_pooling_sums_in_float64():
    """The mean over the patches (never CLS or register tokens) is float64's, rounded once to float32. Catches:
    float32 sums (on these vectors, 1,000 plus small differences over 197 tokens, they round otherwise)."""
    from layerscope.vocab.image_pooling import pool_image

    rng = np.random.default_rng(0)
    states = (1000 + rng.normal(size=(2, 3, 197, 64)) * 1e-2).astype(np.float32)  # [layers, images, tokens, hidden]
    states[..., :3, :] = -5e4  # CLS and two registers: far from the patches, so counting them shows at once
    want = states[..., 3:, :].astype(np.float64).sum(axis=-2) / 194
    got = pool_image(states, "mean", prefix=3)
    assert got.dtype == np.float32 and got.shape == (2, 3, 64)
    np.testing.assert_array_equal(got, want.astype(np.float32))
    in_float32 = states[..., 3:, :].mean(axis=-2, dtype=np.float32)
    assert (in_float32 != want.astype(np.float32)).mean() > 0.05  # float32 sums differ here: the test can tell
    np.testing.assert_array_equal(pool_image(states, "cls", prefix=3), states[..., 0, :])

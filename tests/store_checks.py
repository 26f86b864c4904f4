"""Comparing two stores written by different paths (plain, ``--shard``, Ray): equal row for row."""

from __future__ import annotations

import numpy as np

from layerscope.store.store import LayerStore


def assert_same_store(a: LayerStore, b: LayerStore, atol: float = 1e-6) -> None:
    """``b`` is complete, holds ``a``'s ids, texts, layers and poolings, each float32 array within ``atol`` of
    ``a``'s, every row marked done, and passes ``LayerStore.verify``."""
    assert a.complete and b.complete
    assert a.ids() == b.ids() and a.texts() == b.texts()
    assert a.layers == b.layers and a.poolings == b.poolings and a.n == b.n
    for p in a.poolings:
        for layer in a.layers:
            x, y = np.asarray(a[p, layer]), np.asarray(b[p, layer])
            assert x.shape == y.shape and x.dtype == y.dtype == np.float32
            assert np.abs(x.astype(np.float64) - y).max() <= atol, (p, layer)
    assert bool(np.asarray(b.done_mask()).all())
    assert LayerStore.verify(b.path)[1] == []

"""Attention rollout and flow (Abnar & Zuidema 2020) against values worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from layerscope.errors import InputError
from layerscope.metrics.attention import flow, rollout


def test_rollout_three_tokens_by_hand():
    # layer 1: two heads whose mean is [[1,0,0],[.5,.5,0],[.2,.3,.5]]; layer 2: one pattern given twice
    h0 = [[1, 0, 0], [1, 0, 0], [0.4, 0.6, 0]]
    h1 = [[1, 0, 0], [0, 1, 0], [0, 0, 1]]
    a2 = [[1, 0, 0], [1, 0, 0], [0, 0.5, 0.5]]
    patterns = np.array([[h0, h1], [a2, a2]], dtype=float)  # [L=2, H=2, 3, 3]
    # with the residual: Â1 = [[1,0,0],[.25,.75,0],[.1,.15,.75]], Â2 = [[1,0,0],[.5,.5,0],[0,.25,.75]]
    got = rollout(patterns)
    np.testing.assert_allclose(got[0], [[1, 0, 0], [0.25, 0.75, 0], [0.1, 0.15, 0.75]], atol=1e-12)
    # Â2 @ Â1: row 1 = .5*[1,0,0] + .5*[.25,.75,0]; row 2 = .25*[.25,.75,0] + .75*[.1,.15,.75]
    np.testing.assert_allclose(got[1], [[1, 0, 0], [0.625, 0.375, 0], [0.1375, 0.3, 0.5625]], atol=1e-12)


def test_flow_two_layers_by_hand():
    # Â1 = [[1,0],[.25,.75]], Â2 = [[.5,.5],[.25,.75]]
    patterns = np.array([[[[1, 0], [0.5, 0.5]]], [[[0, 1], [0.5, 0.5]]]], dtype=float)
    # to input 0: path via (1,0) carries min(.5, 1) = .5, via (1,1) min(.5, .25) = .25; to input 1: only via
    # (1,1), min(.5, .75) = .5 (Â1[0,1] = 0: no edge)
    np.testing.assert_allclose(flow(patterns, 0), [0.75, 0.5], atol=1e-9)
    # rollout of the same token differs: it multiplies where flow takes bottlenecks
    np.testing.assert_allclose(rollout(patterns)[-1][0], [0.625, 0.375], atol=1e-12)


def test_bad_shapes_are_one_line():
    with pytest.raises(InputError, match="layers, heads, tokens, tokens"):
        rollout(np.ones((2, 3, 3)))
    with pytest.raises(InputError, match="outside"):
        flow(np.ones((1, 1, 2, 2)) / 2, 5)

"""Every pooling mode against values computed by hand, on right- and left-padded batches, for both
implementations: the numpy reference (vocab/pooling.py) and the in-graph pooling (vocab/pooling.py via export/graph.py,
run by ONNX Runtime on a graph whose inputs are the hidden states themselves).

Padding positions hold huge values, so a pooling that reads one is off by orders of magnitude.
"""

from __future__ import annotations

import numpy as np
import pytest

from layerscope.vocab.pooling import pool

MODES = ("mean", "cls", "last", "max", "mean-nobos")
L, B, S, H = 2, 4, 5, 3
PAD_VALUE = 1000.0

# one row per text: 1 = real token. Same texts (same number of real tokens), padded on either side.
RIGHT = np.array([[1, 1, 1, 1, 1],
                  [1, 1, 1, 0, 0],
                  [1, 1, 0, 0, 0],
                  [1, 0, 0, 0, 0]], dtype=np.int64)
LEFT = np.array([[1, 1, 1, 1, 1],
                 [0, 0, 1, 1, 1],
                 [0, 0, 0, 1, 1],
                 [0, 0, 0, 0, 1]], dtype=np.int64)


def _states(mask: np.ndarray) -> np.ndarray:
    """Small integers (exact in float32) at real tokens, PAD_VALUE at padding."""
    rng = np.random.default_rng(7)
    states = rng.integers(-9, 10, size=(L, B, S, H)).astype(np.float32)
    states[:, mask == 0, :] = PAD_VALUE
    return states


def by_hand(states: np.ndarray, mask: np.ndarray, mode: str) -> np.ndarray:
    """Plain loops over the real positions of each text; nothing shared with the code under test."""
    out = np.zeros((L, B, H), dtype=np.float64)
    for layer in range(L):
        for b in range(B):
            real = [s for s in range(S) if mask[b, s] == 1]
            vecs = [states[layer, b, s].astype(np.float64) for s in real]
            if mode == "cls":  # the first real token ([CLS] / BOS), wherever the padding is
                out[layer, b] = vecs[0]
            elif mode == "last":  # the last real token
                out[layer, b] = vecs[-1]
            elif mode == "mean":
                out[layer, b] = sum(vecs) / len(vecs)
            elif mode == "max":
                out[layer, b] = [max(v[h] for v in vecs) for h in range(H)]
            elif mode == "mean-nobos":  # mean of every real token after the first; a one-token text: zeros
                rest = vecs[1:]
                out[layer, b] = sum(rest) / len(rest) if rest else 0.0
    return out


def _pooling_graph(modes):
    """An ONNX graph whose inputs are the hidden states, with layerscope's pooled outputs added."""
    import onnx
    from onnx import TensorProto, helper

    from layerscope.export.graph import add_pooled_outputs

    inputs = [helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"]),
              helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])]
    inputs += [helper.make_tensor_value_info(f"h{i}", TensorProto.FLOAT, ["batch", "seq", H]) for i in range(L)]
    graph = helper.make_graph([], "pool", inputs, [])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    add_pooled_outputs(model, list(modes), [f"h{i}" for i in range(L)], H)
    onnx.checker.check_model(model)
    return model


@pytest.fixture(scope="module")
def graph_session():
    from layerscope.engines.ort_session import make_session

    import tempfile
    from pathlib import Path

    model = _pooling_graph(MODES)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "pool.onnx"
        path.write_bytes(model.SerializeToString())
        yield make_session(path, "CPUExecutionProvider")


def test_the_reference_is_not_trivial():
    """The cases differ between modes and paddings, so agreeing with them means something."""
    for mask in (RIGHT, LEFT):
        states = _states(mask)
        got = {m: by_hand(states, mask, m) for m in MODES}
        for a in MODES:
            for b in MODES:
                if a < b:
                    assert not np.allclose(got[a], got[b]), (a, b)
    # left and right padding put the real tokens at other positions: the same text pools the same
    for m in MODES:
        np.testing.assert_array_equal(by_hand(_states(RIGHT), RIGHT, m)[:, 0], by_hand(_states(LEFT), LEFT, m)[:, 0])


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("mode", MODES)
def test_numpy_pooling_equals_hand_computation(mode, side):
    """Catches, in vocab/pooling.py: ``cls`` reading position 0 instead of the first real token (left
    padding), ``last_index`` as ``mask.sum(1) - 1`` (right padding only), ``max`` without the mask,
    ``mean-nobos`` dropping position 0 instead of the first real token, ``mean`` dividing by the padded
    length."""
    mask = RIGHT if side == "right" else LEFT
    states = _states(mask)
    np.testing.assert_allclose(pool(states, mask, mode), by_hand(states, mask, mode), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("mode", MODES)
def test_in_graph_pooling_equals_hand_computation(graph_session, mode, side):
    """Catches, in the in-graph rendering (vocab/pooling.py): ``cls`` as a Gather of position 0 (left padding), ``last_idx`` from the
    mask's sum (right padding only), ``max`` without the Where on the mask, ``mean`` without the mask."""
    mask = RIGHT if side == "right" else LEFT
    states = _states(mask)
    feed = {"attention_mask": mask, "input_ids": np.ones_like(mask)}
    feed.update({f"h{i}": states[i] for i in range(L)})
    (got,) = graph_session.run([f"pooled.{mode}"], feed)
    assert got.shape == (L, B, H)
    np.testing.assert_allclose(got, by_hand(states, mask, mode), rtol=1e-6, atol=1e-5)

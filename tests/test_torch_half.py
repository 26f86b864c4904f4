"""PyTorch in half precision (torch-fp16, torch-bf16): scaled-dot-product attention where the family has it,
poolings on the device in fp32, and each layer's accuracy against fp32 measured at start.

Run on the CPU here; the same code runs on CUDA (tests/test_gpu_parity.py)."""

import numpy as np
import pytest

from layerscope.engines.base import create_engine
from layerscope.engines.torch import half_parity
from layerscope.model.handle import ModelHandle
from layerscope.model.tokenize import Encoder  # noqa: F401  (the engine's encoder type)

TEXTS = ["A man is playing a guitar.", "Hi", "Two dogs play in the snow near the frozen lake."]


def test_half_parity_by_hand():
    ref = [[np.array([[[3.0, 4.0], [9.0, 9.0]]], dtype=np.float32)]]  # one batch, one layer, 2 tokens
    got = [[np.array([[[4.0, 3.0], [0.0, 0.0]]], dtype=np.float32)]]
    mask = [np.array([[1, 0]])]  # the second token is padding: never compared
    out = half_parity(ref, got, mask, ["0"])
    assert out == {"0": {"max_abs": 1.0, "min_cos": pytest.approx(24 / 25)}}


@pytest.mark.parametrize("family", ["bert", "qwen2"])
@pytest.mark.parametrize("name,precision,bar", [("torch-bf16", "bf16", 0.9998), ("torch-fp16", "fp16", 0.99999)])
def test_half_engine_matches_fp32_within_its_recorded_accuracy(tiny_model, family, name, precision, bar):
    handle = ModelHandle.resolve(str(tiny_model(family)))
    ref = create_engine("torch", handle, device="cpu")
    half = create_engine(name, handle, device="cpu")
    assert half.info.precision == precision
    assert half.attention == "sdpa"  # both families implement it in transformers
    assert next(half.net.parameters()).dtype.is_floating_point and str(next(half.net.parameters()).dtype) == \
        {"bf16": "torch.bfloat16", "fp16": "torch.float16"}[precision]
    layers = ref.layer_names
    assert set(half.parity) == set(layers)
    worst = min(v["min_cos"] for v in half.parity.values())
    assert bar < worst < 1.0  # measured, and not a copy of fp32
    assert any(precision in n and "min cosine" in n for n in half.info.notes)

    batch = ref.encoder()(TEXTS)
    want = ref.run(batch, layers, ["mean", "last", "cls"])
    got = half.run(batch, layers, ["mean", "last", "cls"])
    for mode in want:
        assert got[mode].dtype == np.float32 and got[mode].shape == want[mode].shape
        a, b = want[mode].reshape(-1, want[mode].shape[-1]), got[mode].reshape(-1, got[mode].shape[-1])
        cos = np.sum(a * b, 1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
        assert cos.min() > bar


def test_fp32_torch_pooled_on_device_equals_numpy_pooling(tiny_model):
    """The device-side pooling path (used off the CPU and in half precision) equals the numpy reference."""
    handle = ModelHandle.resolve(str(tiny_model("gpt2")))
    eng = create_engine("torch", handle, device="cpu")
    batch = eng.encoder()(TEXTS)
    layers = eng.layer_names
    want = eng.run(batch, layers, ["mean", "last", "max", "mean-nobos"])
    got = eng._pool_on_device(batch, layers, ["mean", "last", "max", "mean-nobos"])
    for mode in want:
        np.testing.assert_allclose(got[mode], want[mode], rtol=0, atol=2e-6)

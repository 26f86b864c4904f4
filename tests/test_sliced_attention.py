"""Attention in slices on the torch engine: with ``attention=sdpa`` (and under ``auto`` once max_seq passes
``SLICE_FROM``) no op of a long text's forward pass makes a ``[heads, T, T]`` tensor, the vectors equal eager
attention's, and the memory check charges that engine nothing for the attention matrix."""

from __future__ import annotations

import numpy as np
import pytest

from layerscope.engines.base import create_engine
from layerscope.engines.memory import text_cost
from layerscope.engines.torch import SLICE_FROM
from layerscope.errors import InputError
from layerscope.model.handle import ModelHandle

HEADS = 4  # the tiny models' attention heads (tests/tiny_models.py)
LONG = " ".join(["the quick brown fox jumps over the lazy dog while a cat sat on the mat"] * 6)
TEXTS = ["a cat sat on the mat", "hi", "Water boils at 100 degrees Celsius."]


def square_attention_seen(eng, batch) -> list[tuple[int, ...]]:
    """The shapes of every tensor an op makes during ``eng``'s forward pass of ``batch`` that holds a whole
    ``[heads, T, T]`` attention matrix (T: the batch's padded length)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    t = batch.input_ids.shape[1]
    seen: list[tuple[int, ...]] = []

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for o in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(o, torch.Tensor) and o.dim() >= 3 and tuple(o.shape[-3:]) == (HEADS, t, t):
                    seen.append(tuple(o.shape))
            return out

    with Watch():
        eng.forward(batch)
    return seen


@pytest.mark.parametrize("family", ["bert", "qwen2"])
def test_sliced_attention_holds_no_whole_matrix_and_gives_the_eager_vectors(tiny_model, family):
    handle = ModelHandle.resolve(str(tiny_model(family)))
    eager = create_engine("torch", handle, device="cpu")
    sliced = create_engine("torch", handle, device="cpu", attention="sdpa")
    assert (eager.attention, sliced.attention) == ("eager", "sdpa")
    long_batch = eager.encoder()([LONG])
    t = long_batch.input_ids.shape[1]
    assert t > 64  # a text long enough that its attention dwarfs its hidden states (4 * T * T vs T * 32)
    # eager attention makes the whole matrix in every layer; the sliced engine never does
    assert len(square_attention_seen(eager, long_batch)) >= 2
    assert square_attention_seen(sliced, long_batch) == []
    layers = eager.layer_names
    for batch in (long_batch, eager.encoder()(TEXTS + [LONG])):  # alone, and padded among short texts
        want = eager.run(batch, layers, ["mean", "cls"])
        got = sliced.run(batch, layers, ["mean", "cls"])
        for mode in want:
            np.testing.assert_allclose(got[mode], want[mode], atol=1e-5, rtol=0, err_msg=f"{family} {mode}")
    # what it saves, by hand: the scores and their softmax of one layer, 2 * heads * T * T fp32 floats
    saved = text_cost(t, hidden_size=32, heads=HEADS, depth=2, layer_at_a_time=False).bytes - text_cost(
        t, hidden_size=32, heads=HEADS, depth=2, layer_at_a_time=False, attention_scores=False).bytes
    assert saved == 2 * HEADS * t * t * 4
    assert (eager.attention_scores, sliced.attention_scores) == (True, False)


def test_the_memory_check_charges_sliced_attention_nothing(tiny_model):
    from layerscope.engines.memory import check_longest_text

    handle = ModelHandle.resolve(str(tiny_model("bert")))
    eager = create_engine("torch", handle, device="cpu")
    sliced = create_engine("torch", handle, device="cpu", attention="sdpa")
    t = 120
    # by hand for the tiny BERT (4 heads, 32 wide, 2 layers; a run of token states: torch hands back raw and
    # layers 0..2): states (2 + 2) * T * 32, feed-forward 4 * T * 32, attention 2 * 4 * T * T, fp32
    without = (4 * t * 32 + 4 * t * 32) * 4
    assert check_longest_text(sliced, t, tokens=True, available=without).bytes == without
    with pytest.raises(InputError, match=f"the longest text has {t} tokens"):
        check_longest_text(eager, t, tokens=True, available=without)
    # the Qwen3-0.6B shape (16 heads) at 32k tokens: eager attention alone needs 128 GiB, sliced none
    big = dict(hidden_size=1024, heads=16, depth=28, layer_at_a_time=True)
    assert text_cost(32768, **big).bytes - text_cost(32768, attention_scores=False, **big).bytes == 128 * 2 ** 30


def test_auto_slices_from_the_long_text_threshold(tiny_model):
    handle = ModelHandle.resolve(str(tiny_model("bert")))
    assert create_engine("torch", handle, device="cpu").attention == "eager"  # the reference by default
    assert create_engine("torch", handle, device="cpu", max_seq=SLICE_FROM).attention == "eager"
    eng = create_engine("torch", handle, device="cpu", max_seq=SLICE_FROM + 1)
    assert eng.attention == "sdpa" and any("in slices" in n for n in eng.info.notes)
    assert create_engine("torch", handle, device="cpu", max_seq=8192, attention="eager").attention == "eager"
    with pytest.raises(InputError, match="attention='flash'"):
        create_engine("torch", handle, device="cpu", attention="flash")

"""Pooled-only runs of the torch engine pool each layer as its block produces it: the vectors equal pooling
Hugging Face's ``output_hidden_states`` layer by layer (left and right padding, every text family of the tiny
zoo, the truncated stack of an early exit too), and no layer outlives its pooling."""

from __future__ import annotations

import weakref

import numpy as np
import pytest

from layerscope.engines.base import create_engine
from layerscope.vocab.pooling import pool

TEXTS = ["a dog plays in the snow", "Hi", "the weather is sunny and warm today, so we walk to the lake",
         "she bought 3 apples and 12 oranges"]
POOLINGS = ["mean", "last", "cls", "max"]


# in every run; the zoo's other types are marked slow (the whole zoo: about a minute of CPU)
CORE = ("bert", "albert", "deberta-v2", "modernbert", "t5", "clip_text_model", "gpt2", "opt", "bloom", "llama",
        "qwen3", "gemma2")


def _zoo_types():
    import tiny_zoo

    return [t if t in CORE else pytest.param(t, marks=pytest.mark.slow) for t in tiny_zoo.MODEL_TYPES]


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    import tiny_zoo

    built: dict[str, str] = {}

    def get(model_type: str, layers: int | None = None) -> str:
        key = f"{model_type}-{layers}"
        if key not in built:
            saved = dict(tiny_zoo.SHAPES[model_type])
            if layers:
                tiny_zoo.SHAPES[model_type]["num_hidden_layers"] = layers
            try:
                built[key] = str(tiny_zoo.build_zoo_model(model_type, tmp_path_factory.mktemp(key), seed=3))
            finally:
                tiny_zoo.SHAPES[model_type] = saved
        return built[key]

    return get


def _left_padded(batch):
    """The same texts with their padding moved to the left (position ids counted from the first real token)."""
    from dataclasses import replace

    mask = batch.mask
    width = mask.shape[1]
    shift = width - mask.sum(1)
    inputs = {k: np.stack([np.roll(row, int(s)) for row, s in zip(v, shift)]) for k, v in batch.inputs.items()}
    if "position_ids" in inputs:
        inputs["position_ids"] = np.clip(np.cumsum(inputs["attention_mask"], axis=1) - 1, 0, None)
    return replace(batch, inputs=inputs)


def _by_hand(states: np.ndarray, mask: np.ndarray, mode: str) -> np.ndarray:
    """One layer ``[batch, seq, hidden]`` pooled with plain loops over the real tokens (float64)."""
    out = []
    for row, m in zip(states.astype(np.float64), mask.astype(bool)):
        real = row[m]
        out.append({"mean": real.mean(0), "last": real[-1], "cls": real[0], "max": real.max(0)}[mode])
    return np.stack(out)


def _check(model_type, eng, full, batch, depth):
    """The hooked pooled vectors of ``eng`` against pooling the whole model's hidden states, layer by layer."""
    raw, hidden, _ = full.forward(batch)  # Hugging Face: net(..., output_hidden_states=True)
    assert len(hidden) == full.manifest.num_layers + 1
    layers = [str(i) for i in range(depth + 1)]
    got = eng.run(batch, layers, POOLINGS)
    # raw alone: ALBERT's word embeddings are narrower than its layers, so the two cannot stack
    got_raw = eng.run(batch, ["raw"], POOLINGS)
    for li, name in [(0, "raw")] + list(enumerate(layers)):
        ref = (raw if name == "raw" else hidden[int(name)]).float().numpy()
        for mode in POOLINGS:
            vec = (got_raw if name == "raw" else got)[mode][li]
            where = f"{model_type} depth {depth} layer {name} {mode}"
            # the CPU fp32 reference pools with numpy's pool: the hooked path gives the same bits
            np.testing.assert_array_equal(vec, pool(ref, batch.mask, mode), err_msg=where)
            np.testing.assert_allclose(vec, _by_hand(ref, batch.mask, mode), rtol=0, atol=1e-5, err_msg=where)


@pytest.mark.parametrize("model_type", _zoo_types())
def test_hooked_pooling_equals_pooling_every_hidden_state(model_type, zoo):
    """Every zoo family, right and left padding, the whole model and each early exit."""
    path = zoo(model_type)
    full = create_engine("torch", path)
    num_layers = full.manifest.num_layers
    hooked = full.block_slot is not None
    if model_type != "albert":  # ALBERT shares one block across its layers: no list of L blocks to hook
        assert hooked, full.info.notes
    else:
        assert not hooked and any("keep every hidden state" in n for n in full.info.notes)
    right = full.encoder()(TEXTS)
    for batch in (right, _left_padded(right)):
        _check(model_type, full, full, batch, num_layers)
    for depth in range(0, num_layers):
        eng = create_engine("torch", path, depth=depth)
        assert eng.depth == (depth if hooked else None)  # no block list: early exit is off too
        for batch in (right, _left_padded(right)):
            _check(model_type, eng, full, batch, depth)
    assert full.block_slot is not None or not hooked  # no hook missed a layer on the way


@pytest.mark.parametrize("model_type", ["bert", "qwen3", "t5"])
def test_a_pooled_run_keeps_no_layer_after_pooling_it(model_type, zoo):
    """Five blocks: when block k starts, at most one hidden state older than its own input is alive (the
    embeddings the model's forward holds), and the model is never asked for its hidden states (which keeps
    every one of them to the end of the forward)."""
    eng = create_engine("torch", zoo(model_type, layers=5))
    blocks = getattr(*eng.block_slot)
    assert len(blocks) == 5
    refs: list[weakref.ref] = []
    alive_at_start: list[int] = []
    asked: list[object] = []

    def before(_m, args, kwargs):
        states = args[0] if args else kwargs["hidden_states"]
        if not refs:
            refs.append(weakref.ref(states))  # layer 0
        alive_at_start.append(sum(r() is not None for r in refs[:-1]))

    def after(_m, _a, out):
        refs.append(weakref.ref(out[0] if isinstance(out, tuple) else out))

    handles = [eng.net.register_forward_pre_hook(lambda _m, _a, kw: asked.append(kw.get("output_hidden_states")),
                                                 with_kwargs=True)]
    for block in blocks:
        handles.append(block.register_forward_pre_hook(before, with_kwargs=True))
        handles.append(block.register_forward_hook(after))
    try:
        got = eng.run(eng.encoder()(TEXTS), [str(i) for i in range(6)], ["mean"])
    finally:
        for h in handles:
            h.remove()
    assert got["mean"].shape == (6, len(TEXTS), 32)
    assert len(alive_at_start) == 5 and len(refs) == 6
    # the model's own code may hold its embedding output (layer 0) to the end; nothing else stays
    assert max(alive_at_start) <= 1, alive_at_start
    assert asked == [False]
    assert all(r() is None for r in refs)


@pytest.mark.parametrize("model_type", ["qwen3", "t5"])
def test_half_precision_pools_each_layer_on_the_device_in_fp32(model_type, zoo):
    """torch-bf16 (pool_torch per layer, as off the CPU) against its own token states pooled by hand."""
    eng = create_engine("torch-bf16", zoo(model_type))
    assert eng.block_slot is not None
    right = eng.encoder()(TEXTS)
    layers = [str(i) for i in range(eng.manifest.num_layers + 1)]
    for batch in (right, _left_padded(right)):
        got = eng.run(batch, layers, POOLINGS)
        states = eng.run_tokens(batch, layers)
        for li, layer in enumerate(layers):
            for mode in POOLINGS:
                np.testing.assert_allclose(got[mode][li], _by_hand(states[li], batch.mask, mode), rtol=0,
                                           atol=1e-5, err_msg=f"{model_type} layer {layer} {mode}")

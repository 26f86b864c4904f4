"""Token runs of the torch engine take each layer from the block hooks as it is produced: the token vectors
kept and the pooled vectors equal Hugging Face's ``output_hidden_states`` (left and right padding, a decoder
and an encoder), the model is never asked for every hidden state, and a store made with ``--tokens`` holds
exactly those vectors."""

from __future__ import annotations

import numpy as np
import pytest

from layerscope.engines.base import create_engine
from layerscope.vocab.pooling import pool

TEXTS = ["a dog plays in the snow", "Hi", "the weather is sunny and warm today, so we walk to the lake",
         "she bought 3 apples and 12 oranges"]
POOLINGS = ["mean", "last", "max"]


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    import tiny_zoo

    built: dict[str, str] = {}

    def get(model_type: str) -> str:
        if model_type not in built:
            built[model_type] = str(tiny_zoo.build_zoo_model(model_type, tmp_path_factory.mktemp(model_type), seed=5))
        return built[model_type]

    return get


def _left_padded(batch):
    from dataclasses import replace

    shift = batch.mask.shape[1] - batch.mask.sum(1)
    inputs = {k: np.stack([np.roll(row, int(s)) for row, s in zip(v, shift)]) for k, v in batch.inputs.items()}
    if "position_ids" in inputs:
        inputs["position_ids"] = np.clip(np.cumsum(inputs["attention_mask"], axis=1) - 1, 0, None)
    return replace(batch, inputs=inputs)


def _no_full_forward(monkeypatch):
    """Count the engine's calls of the forward that asks the model for every hidden state."""
    import layerscope.engines.torch as torch_engine

    calls: list[int] = []
    real = torch_engine.torch_forward
    monkeypatch.setattr(torch_engine, "torch_forward", lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


@pytest.mark.parametrize("model_type", ["qwen3", "bert"])
def test_kept_token_vectors_and_pooled_vectors_equal_every_hidden_state(model_type, zoo, monkeypatch):
    eng = create_engine("torch", zoo(model_type))
    assert eng.block_slot is not None, eng.info.notes
    top = eng.manifest.num_layers
    layers = ["raw"] + [str(i) for i in range(top + 1)]
    token_layers = ["0", str(top), "raw"]  # a subset, in another order than the run's layers
    right = eng.encoder()(TEXTS)
    for batch in (right, _left_padded(right)):
        raw, hidden, _ = eng.forward(batch)  # Hugging Face: net(..., output_hidden_states=True)
        ref = {n: (raw if n == "raw" else hidden[int(n)]).float().numpy().copy() for n in layers}
        seen: list[str] = []
        calls = _no_full_forward(monkeypatch)
        pooled, kept = eng.run_keeping_tokens(batch, layers, POOLINGS, token_layers,
                                              lambda layer, states: seen.append(layer) or states.copy())
        monkeypatch.undo()
        assert calls == [], "the model was asked for every hidden state"
        assert sorted(seen) == sorted(token_layers)  # the layers not stored are never handed over
        for layer, got in zip(token_layers, kept):
            assert got.dtype == np.float32
            np.testing.assert_array_equal(got, ref[layer], err_msg=f"{model_type} tokens of layer {layer}")
        for li, layer in enumerate(layers):
            for mode in POOLINGS:
                np.testing.assert_array_equal(pooled[mode][li], pool(ref[layer], batch.mask, mode),
                                              err_msg=f"{model_type} layer {layer} {mode}")


def test_a_token_store_made_on_torch_holds_hugging_face_hidden_states(zoo, tmp_path, monkeypatch):
    from layerscope.extraction.pipeline import extract

    path = zoo("qwen3")
    calls = _no_full_forward(monkeypatch)
    store = extract(path, TEXTS, tmp_path / "s", engine="torch", layers="all", poolings=["mean"], tokens=True,
                    store_dtype="float16").store
    assert calls == [], "the model was asked for every hidden state"
    monkeypatch.undo()
    eng = create_engine("torch", path)
    batch = eng.encoder()(TEXTS)
    raw, hidden, _ = eng.forward(batch)
    mask = batch.mask.astype(bool)
    for layer in store.token_layers:
        ref = (raw if layer == "raw" else hidden[int(layer)]).float().numpy()
        tokens = store.tokens(layer)
        for i in range(len(TEXTS)):
            # float16 on disk: the reference rounded the same way (another batch shape: a few fp32 ulps apart)
            np.testing.assert_allclose(tokens.text(i), ref[i][mask[i]].astype(np.float16).astype(np.float32),
                                       rtol=2e-3, atol=1e-3, err_msg=f"text {i} layer {layer}")
        np.testing.assert_allclose(store["mean", layer], pool(ref, batch.mask, "mean"), rtol=2e-3, atol=1e-3)


@pytest.mark.parametrize("model_type", ["qwen3", "gpt2"])
def test_every_hidden_state_forward_builds_no_key_value_cache(model_type, zoo):
    """The forward that asks for every hidden state (token runs without hooks, analyses) leaves no cache of
    every block's keys and values alive beside them."""
    eng = create_engine("torch", zoo(model_type))
    _, hidden, out = eng.forward(eng.encoder()(TEXTS))
    assert len(hidden) == eng.manifest.num_layers + 1
    assert getattr(out, "past_key_values", None) is None

"""Plain Hugging Face references for parity tests, and the one comparison every parity test uses.

The reference never goes through layerscope: the checkpoint is loaded with transformers' own classes,
tokenized by its own tokenizer (right padding, as layerscope pads), and run with
``output_hidden_states=True``. The CPU parity tests (export, variants) and the GPU ones (cuda, trt,
fp16 on cuda) all call :func:`assert_layers_match`, so they hold every engine to the same checks:
a max-abs bound over the real tokens of every layer, and each layer nearer to its own reference layer
than to any other (a bound on cosine alone cannot tell neighbouring layers apart).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

TEXTS = ["a cat sat on the mat", "hi", "the quick brown fox jumps over the lazy dog twice today",
         "一只猫坐在垫子上", "Water boils at 100 degrees Celsius at sea level."]

DECODERS = ("gpt2", "qwen2", "qwen3")


@dataclass
class Reference:
    layers: dict[str, np.ndarray]  # "raw", "0".."L" -> float64 [batch, seq, hidden]
    input_ids: np.ndarray
    mask: np.ndarray  # [batch, seq], 1 = real token

    def pooled_mean(self, layer: str) -> np.ndarray:
        m = self.mask[..., None].astype(np.float64)
        return (self.layers[layer] * m).sum(1) / m.sum(1)


def load_plain(model_dir: str | Path, family: str):
    """(tokenizer, model) with transformers' own classes for the family's text model."""
    from transformers import AutoModel, AutoTokenizer, CLIPTextModel, T5EncoderModel

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    tok.padding_side = "right"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    cls = {"clip-text": CLIPTextModel, "t5-encoder": T5EncoderModel}.get(family, AutoModel)
    return tok, cls.from_pretrained(str(model_dir)).eval()


def hf_reference(model_dir: str | Path, family: str, texts: list[str] = TEXTS) -> Reference:
    import torch

    tok, net = load_plain(model_dir, family)
    enc = tok(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        out = net(**enc, output_hidden_states=True)
        raw = net.get_input_embeddings()(enc["input_ids"])
    layers = {"raw": raw.double().numpy()}
    layers.update({str(i): h.double().numpy() for i, h in enumerate(out.hidden_states)})
    return Reference(layers, enc["input_ids"].numpy(), enc["attention_mask"].numpy())


def layer_distances(got: dict[str, np.ndarray], ref: Reference, names: list[str]) -> np.ndarray:
    """RMS difference over real tokens between got layer i (rows) and reference layer j (columns)."""
    valid = ref.mask.astype(bool)
    d = np.zeros((len(names), len(names)))
    for i, a in enumerate(names):
        for j, b in enumerate(names):
            d[i, j] = np.sqrt(np.mean((np.asarray(got[a], np.float64)[valid] - ref.layers[b][valid]) ** 2))
    return d


def assert_layers_match(got: dict[str, np.ndarray], ref: Reference, max_abs: float, label: str) -> dict:
    """Every layer within ``max_abs`` of its reference over the real tokens, and nearest to its own layer.

    Returns the figures (worst max-abs, per layer) so callers can report them."""
    valid = ref.mask.astype(bool)
    names = [n for n in ref.layers if n in got]
    assert names == list(ref.layers), f"{label}: layers {list(got)} vs reference {list(ref.layers)}"
    worst = {}
    for name in names:
        arr = np.asarray(got[name], dtype=np.float64)
        assert arr.shape == ref.layers[name].shape, f"{label} layer {name}: {arr.shape} vs {ref.layers[name].shape}"
        assert np.isfinite(arr[valid]).all(), f"{label} layer {name}: non-finite values at real tokens"
        worst[name] = float(np.abs(arr[valid] - ref.layers[name][valid]).max())
    bad = {n: w for n, w in worst.items() if not w <= max_abs}
    assert not bad, f"{label}: max |diff| above {max_abs:g} at layers {bad}"
    # Each layer must be nearer its own reference than any other layer (raw and 0 of T5 are the same
    # tensor in Hugging Face, so they are compared as one).
    d = layer_distances(got, ref, names)
    for i, name in enumerate(names):
        same = [j for j, other in enumerate(names)
                if np.array_equal(ref.layers[other][valid], ref.layers[name][valid])]
        others = [j for j in range(len(names)) if j not in same]
        if others:
            assert d[i, i] < d[i, others].min(), (
                f"{label}: layer {name} is nearer reference layer {names[others[int(d[i, others].argmin())]]} "
                f"({d[i, others].min():.3g}) than its own ({d[i, i]:.3g})")
    return worst


def check_engine(engine, ref: Reference, max_abs: float, label: str, texts: list[str] = TEXTS) -> dict:
    """One layerscope engine against the plain Hugging Face reference: layerscope's own tokenization
    must give Hugging Face's ids and padding, every token-level output (raw and every hidden state)
    must pass :func:`assert_layers_match`, and the engine's pooled mean (in-graph where the engine
    has it) must equal the mean of the reference states. Returns the worst max-abs per layer."""
    batch = engine.encoder()(texts)
    np.testing.assert_array_equal(batch.input_ids, ref.input_ids, err_msg=f"{label}: token ids")
    np.testing.assert_array_equal(batch.mask, ref.mask, err_msg=f"{label}: attention mask")
    layers = list(ref.layers)
    got = dict(zip(layers, engine.run_tokens(batch, layers)))
    worst = assert_layers_match(got, ref, max_abs, label)
    pooled = engine.run(batch, layers[1:], ["mean"])["mean"]
    for i, layer in enumerate(layers[1:]):
        np.testing.assert_allclose(pooled[i], ref.pooled_mean(layer), rtol=0, atol=max_abs,
                                   err_msg=f"{label}: pooled mean, layer {layer}")
    return worst

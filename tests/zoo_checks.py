"""The checks every model type of the zoo (tests/tiny_zoo.py) must pass, shared by
tests/export/test_export_zoo.py and scripts/coverage_table.py (which writes docs/FAMILIES.md from them).

References are plain Hugging Face: the checkpoint loaded with its own with-head class, tokenized by its own
tokenizer, run with ``output_hidden_states=True``; nothing of layerscope's is used to make them.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np

from tiny_zoo import ENCODERS, T5_TYPES, build_zoo_model

# no empty text (a tokenizer without BOS gives it no token at all); lengths past the 4-token windows
TEXTS = ["a cat sat on the mat", "hi", "the quick brown fox jumps over the lazy dog twice today",
         "一只猫坐在垫子上", "Water boils at 100 degrees Celsius at sea level."]
# positions numbered from the padding id by the model itself (pad-aware: nothing to pass)
PAD_AWARE_POSITIONS = ("roberta", "xlm-roberta", "camembert", "mpnet")
NO_HEAD = (*T5_TYPES, "clip_text_model")  # no LM head of their own: the tied embeddings decode
TOL = 1e-4  # the export's own fp32 bound (plus 1e-5 x scale, as recorded)


def export_zoo(model_type: str, root: Path) -> tuple[Path, Path]:
    """(checkpoint, export) of the tiny ``model_type`` under ``root``."""
    from layerscope.export.exporter import export_model
    from layerscope.model.source import resolve_source

    ckpt = build_zoo_model(model_type, Path(root) / "ckpt")
    out = Path(root) / "onnx"
    export_model(resolve_source(str(ckpt)), out, pooled=["mean", "last"])
    return ckpt, out


def expected_path(model_type: str) -> str:
    return "torch" if model_type in ("mixtral", "qwen2_moe") else "optimum"


def check_manifest(model_type: str, export: Path) -> float:
    """Every hidden state and the raw embeddings are outputs, each checked against torch; the worst
    max |diff| of the hidden states."""
    from layerscope.model.handle import ModelHandle

    m = ModelHandle.resolve(export).manifest
    num = m.num_layers
    assert num == 2 and m.raw["source"]["model_type"] == model_type
    wanted = ["raw_embeddings"] + [f"hidden_states.{i}" for i in range(num + 1)]
    assert all(name in m.outputs for name in wanted), (model_type, list(m.outputs))
    parity = m.raw["parity"]["outputs"]
    assert set(parity) == set(m.outputs), model_type  # every output was checked
    for name, fig in parity.items():
        assert fig["max_abs"] <= fig["tolerance"], (model_type, name, fig)
        assert fig["min_cos"] >= 0.9999, (model_type, name, fig)
    assert m.raw["export_path"] == expected_path(model_type)
    assert m.kind == ("encoder" if model_type in ENCODERS else "decoder")
    return max(fig["max_abs"] for name, fig in parity.items() if name.startswith("hidden_states."))


def _reference_model(ckpt: Path, model_type: str):
    """(tokenizer, base model, with-head model or None) through transformers' own classes."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(str(ckpt))
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    if model_type in T5_TYPES:
        cls = {"t5": transformers.T5EncoderModel, "mt5": transformers.MT5EncoderModel,
               "umt5": transformers.UMT5EncoderModel}[model_type]
        return tok, cls.from_pretrained(str(ckpt)).eval(), None
    if model_type == "clip_text_model":
        return tok, transformers.CLIPTextModel.from_pretrained(str(ckpt)).eval(), None
    auto = transformers.AutoModelForMaskedLM if model_type in ENCODERS else transformers.AutoModelForCausalLM
    full = auto.from_pretrained(str(ckpt), attn_implementation="eager").eval()
    base = getattr(full, full.base_model_prefix, None) or full.model  # Gemma-3's prefix names no attribute
    return tok, base, full


def hf_layers(ckpt: Path, model_type: str, texts: list[str], side: str) -> list[dict[str, np.ndarray]] | None:
    """Per text, ``{"raw", "0".."L": float64 [real tokens, hidden]}`` from one ``side``-padded batch; None
    where left padding cannot be given its positions (DistilBERT takes no position ids and numbers from 0)."""
    import torch

    tok, net, _ = _reference_model(ckpt, model_type)
    takes = inspect.signature(net.forward).parameters
    pass_positions = "position_ids" in takes and model_type not in PAD_AWARE_POSITIONS
    if side == "left" and not pass_positions and model_type not in PAD_AWARE_POSITIONS + ("bloom",) \
            and model_type not in (*T5_TYPES, "deberta-v2"):
        return None
    tok.padding_side = side
    enc = tok(texts, padding=True, return_tensors="pt")
    feed = {k: v for k, v in enc.items() if k in takes}
    mask = enc["attention_mask"]
    if pass_positions:
        feed["position_ids"] = (mask.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        out = net(**feed, output_hidden_states=True)
        raw = torch.nn.functional.embedding(enc["input_ids"], net.get_input_embeddings().weight)
    layers = {"raw": raw, **{str(i): h for i, h in enumerate(out.hidden_states)}}
    return [{k: v[b][mask[b].bool()].double().numpy() for k, v in layers.items()} for b in range(len(texts))]


def check_store_tokens(export: Path, ref: list[dict[str, np.ndarray]], out: Path) -> float:
    """``extract --tokens`` with ONNX Runtime; every stored layer of every text against ``ref``."""
    from layerscope.extraction.pipeline import extract

    store = extract(str(export), TEXTS, out, engine="ort", layers="all", poolings=["mean"], tokens=True,
                    batch_tokens=64).store
    worst = 0.0
    layers = list(ref[0])
    if ref[0]["raw"].shape[-1] != ref[0]["0"].shape[-1]:  # ALBERT, ELECTRA: narrower word embeddings
        layers.remove("raw")  # a store holds one width: 'all' is then 0..L
    assert list(store.layers) == layers, (list(store.layers), layers)
    for layer in layers:
        stored = store.tokens(layer)
        for i, want in enumerate(ref):
            got = np.asarray(stored.text(i), dtype=np.float64)
            assert got.shape == want[layer].shape, (layer, i, got.shape, want[layer].shape)
            worst = max(worst, float(np.abs(got - want[layer]).max()))
    means = np.stack([np.asarray(store.tokens(layers[-1]).text(i)).mean(0) for i in range(len(TEXTS))])
    np.testing.assert_allclose(store["mean", layers[-1]], means, atol=1e-5)
    return worst


def lens_expected(model_type: str) -> bool:
    return model_type not in NO_HEAD


def check_lens(ckpt: Path, export: Path, model_type: str, top: int = 5) -> str:
    """The head kept in the export, on Hugging Face's last hidden state, ranks the vocabulary as the model's
    own logits do (Gemma-2's soft-capping and Granite's logit scaling keep the order); returns its kind."""
    import torch

    from layerscope.decoding.heads import load_decoding_model
    from layerscope.model.handle import ModelHandle

    handle = ModelHandle.resolve(export)
    dm = load_decoding_model(handle)
    want_kind = "mlm-head" if model_type in ENCODERS else "causal-lm-head"
    assert dm.info.kind == want_kind, (model_type, dm.info.description)
    tok, _, full = _reference_model(ckpt, model_type)
    enc = tok(TEXTS[2], return_tensors="pt")
    takes = inspect.signature(full.forward).parameters
    with torch.no_grad():
        out = full(**{k: v for k, v in enc.items() if k in takes}, output_hidden_states=True)
        ours = dm.logits(out.hidden_states[-1], handle.manifest.num_layers)
    assert ours.shape == out.logits.shape
    a = torch.topk(ours[0], top, dim=-1).indices
    b = torch.topk(out.logits[0], top, dim=-1).indices
    assert torch.equal(a, b), (model_type, a[:3], b[:3])
    return dm.info.kind

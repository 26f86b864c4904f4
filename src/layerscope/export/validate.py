"""Parity of an exported graph against PyTorch: every output, on padded batches of several lengths."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from layerscope.model.manifest_type import Manifest

VALIDATION_TEXTS = [
    "A man is playing a guitar.",
    "Hi",
    "The quick brown fox jumps over the lazy dog, and then it runs back into the forest "
    "before anybody can see where it went or why it was there in the first place.",
    "一个人正在弹吉他。",
    "Numbers like 3.14159 and 2,718 appear here; so do symbols: #, @, & and %!",
    "Two dogs play in the snow while their owners watch from a bench near the frozen lake, "
    "drinking hot coffee from paper cups and talking about the weather, the news, the "
    "price of bread and whatever else comes to mind on a long, cold winter afternoon.",
]

# One text of a few hundred tokens, checked in a batch of its own: deep models drift with length.
LONG_TEXT = " ".join(
    f"In paragraph {i}, the committee reviewed section {i * 7 % 13} of the report, noted that the figures "
    f"for {1990 + i} were revised, and asked whether the {['northern', 'coastal', 'eastern'][i % 3]} "
    "office could confirm them before the next meeting." for i in range(10))
MAX_VALIDATION_TOKENS = 384
VALIDATION_TEXTS = VALIDATION_TEXTS + [LONG_TEXT]


def _max_abs_and_min_cos(ref: np.ndarray, got: np.ndarray, valid: np.ndarray | None) -> tuple[float, float]:
    """Max |ref-got| and min cosine over vectors (last axis), only where ``valid``."""
    ref = np.asarray(ref, dtype=np.float64)
    got = np.asarray(got, dtype=np.float64)
    if ref.shape != got.shape:
        return float("inf"), -1.0
    if valid is not None:
        ref, got = ref[valid], got[valid]
    ref = ref.reshape(-1, ref.shape[-1])
    got = got.reshape(-1, got.shape[-1])
    max_abs = float(np.max(np.abs(ref - got))) if ref.size else 0.0
    num = (ref * got).sum(-1)
    den = np.linalg.norm(ref, axis=-1) * np.linalg.norm(got, axis=-1)
    cos = np.where(den > 0, num / np.where(den > 0, den, 1.0), 1.0)
    if np.isnan(max_abs):
        return float("nan"), float("nan")
    return max_abs, float(cos.min()) if cos.size else 1.0


def validation_batches(texts: list[str]) -> list[list[str]]:
    """Padded mixed lengths, a single text, a pair; the long text alone (its length would pad every other)."""
    short = [t for t in texts if t != LONG_TEXT]
    batches = [short, short[:1], short[2:4]]
    if LONG_TEXT in texts:
        batches.append([LONG_TEXT])
    return batches


def compare_outputs(net, family, onnx_path: Path, info: Manifest, texts: list[str],
                    pooled_modes: list[str], pooled_layers: list[str], *, session=None,
                    trust_remote_code: bool = False) -> dict[str, Any]:
    """Run ONNX Runtime (CPU) and torch on the same batches; worst error and cosine per output.

    ``net`` is the torch model or a function that loads it: ONNX Runtime runs every batch first and
    its session is dropped before torch is asked for, so a big model is never in memory twice.
    ``session``: another runtime with ONNX Runtime's ``get_inputs/get_outputs/run`` (OpenVINO's).
    """
    import gc

    from layerscope.model.tokenize import Encoder
    from layerscope.engines.ort_session import make_session
    from layerscope.engines.torch import torch_forward
    from layerscope.model.source import ModelSource, load_tokenizer
    from layerscope.vocab.outputs import OWN_LAST, RAW_OUTPUT, hidden_output, layer_output, pooled_output
    from layerscope.vocab.pooling import pool

    export_dir = str(onnx_path.parent)  # the tokenizer as saved into the export, loaded the way engines load it
    tok = load_tokenizer(ModelSource(export_dir, export_dir, True), trust_remote_code=trust_remote_code)
    # no prepacking: the weights stay in ONNX Runtime's read-only map of the data file (page cache) instead
    # of a packed anonymous copy (a 3B fp32 export's 12 GB), and the session starts in seconds, not a minute
    session = session or make_session(onnx_path, "CPUExecutionProvider", extra={"session.disable_prepacking": "1"})
    output_names = [o.name for o in session.get_outputs()]
    encoder = Encoder(tok, [i.name for i in session.get_inputs()], min(info.max_length, MAX_VALIDATION_TOKENS))
    batches = validation_batches(texts)
    encoded = [encoder(group) for group in batches]
    outputs = []
    for batch in encoded:
        feed = {name: batch.inputs[name] for name in encoder.input_names}
        outputs.append(dict(zip(output_names, session.run(output_names, feed))))
    del session
    gc.collect()
    if callable(net) and not hasattr(net, "forward"):
        net = net()
    word_emb = net.get_input_embeddings()
    stats: dict[str, dict[str, float]] = {}
    tokens = 0
    for batch, got in zip(encoded, outputs):
        tokens = max(tokens, int(batch.mask.sum(1).max()))
        raw, hidden, out = torch_forward(net, word_emb, batch.inputs)
        ref: dict[str, np.ndarray] = {RAW_OUTPUT: raw.float().numpy()}
        for i, h in enumerate(hidden):
            ref[hidden_output(i)] = h.float().numpy()
        if family.pooled_output:
            ref[family.pooled_output] = getattr(out, family.pooled_output).float().numpy()
        if OWN_LAST in output_names:  # the model's own last hidden state, where it is not layer L
            ref[OWN_LAST] = out.last_hidden_state.float().numpy()
        layer_states = [ref[layer_output(n)] for n in pooled_layers]
        for mode in pooled_modes:
            ref[pooled_output(mode)] = np.stack([
                pool(s, batch.mask, mode, input_ids=batch.input_ids, eos_token_id=info.eos_token_id)
                for s in layer_states])
        token_valid = batch.mask.astype(bool)
        for name in output_names:
            if name not in ref:
                continue
            valid = token_valid if ref[name].ndim == 3 and ref[name].shape[:2] == token_valid.shape else None
            max_abs, min_cos = _max_abs_and_min_cos(ref[name], got[name], valid)
            scale = float(np.abs(ref[name][valid] if valid is not None else ref[name]).max(initial=0.0))
            prev = stats.get(name, {"max_abs": 0.0, "min_cos": 1.0, "ref_max_abs": 0.0})
            stats[name] = {"max_abs": max(prev["max_abs"], max_abs) if not np.isnan(max_abs) else float("nan"),
                           "min_cos": min(prev["min_cos"], min_cos),
                           "ref_max_abs": max(prev["ref_max_abs"], scale)}  # the output's scale, for fp32 tolerance
    missing = [n for n in output_names if n not in stats]
    for name in missing:
        stats[name] = {"max_abs": float("nan"), "min_cos": float("nan")}
    return {"texts": len(texts), "batches": len(batches), "longest_tokens": tokens, "outputs": stats}

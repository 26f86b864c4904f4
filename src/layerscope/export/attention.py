"""The attention variant (``model.attn.onnx``): every layer's attention probabilities and their summaries.

PyTorch's fused attention returns no probabilities, so the graph is traced from the model loaded with eager
attention and ``output_attentions=True`` (plain ``torch.onnx.export``, as export/torch_export.py does for
architectures without an Optimum config). It is a graph of its own, recorded in the manifest as the variant
``attn``: the default export keeps its outputs and its speed.

Outputs, for a batch of ``B`` texts padded to ``T`` tokens, ``L`` layers and ``H`` heads:

- ``attentions.1`` .. ``attentions.L``: ``[B, H, T, T]``, query x key, each row sums to one over the keys
  the model may attend to (its padding and, in a decoder, the later tokens get zero);
- ``attention.<summary>`` for each of :data:`SUMMARIES`: ``[B, L, H]``, a mean over the text's real query
  tokens (padding rows never count; see :func:`summaries`).

The summaries are computed inside the graph (and, for the torch engine, by the same function in torch), so a
corpus run fetches ``B x L x H`` numbers per summary instead of the patterns.  Nothing here is specific to an
architecture: any model whose transformers class returns ``attentions`` with eager attention traces.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np

from layerscope.errors import ExportError

KIND = "attn"
FILE = "model.attn.onnx"
SUMMARIES = ("entropy", "first", "special", "distance", "previous")
SUMMARY_HELP = {
    "entropy": "entropy of a query's attention over keys (nats)",
    "first": "share of attention on the text's first token",
    "special": "share of attention on special tokens (CLS, SEP, BOS, EOS...)",
    "distance": "mean |query - key| position distance, weighted by attention",
    "previous": "share of attention on the previous token (queries after the first)",
}
PATTERN_PREFIX = "attentions."
SUMMARY_PREFIX = "attention."
ATOL = 1e-5  # probabilities in [0, 1]: fp32 in another order differs by ~1e-7


def pattern_output(layer: int) -> str:
    return f"{PATTERN_PREFIX}{layer}"


def summary_output(name: str) -> str:
    return f"{SUMMARY_PREFIX}{name}"


def summaries(probs, mask, input_ids, special_ids):
    """The per-layer x head summaries of ``probs`` ``[B, L, H, T, T]`` (torch), each ``[B, L, H]``.

    Each is a per-query figure averaged over the text's real query tokens (``mask`` 1), so padding rows,
    whatever a model puts there, never count. ``first`` is the first real token (left padding included),
    ``special`` the tokens whose id is in ``special_ids``, ``distance`` is measured in positions (padding
    sits at one end, so it equals the distance between real tokens), and ``previous`` averages over the
    queries that have a previous real token (a one-token text gives NaN: undefined, never 0)."""
    import torch

    t = probs.shape[-1]
    if mask is None:  # a graph without a mask input (an image tower's patches): every position is real
        mask = torch.ones(probs.shape[0], t, dtype=torch.int64, device=probs.device)
    m = mask.to(probs.dtype)  # [B, T]
    first = ((torch.cumsum(mask, 1) == 1) & (mask > 0)).to(probs.dtype)  # [B, T] one-hot
    if input_ids is None:  # no token ids: no special tokens (the first position is still counted by 'first')
        special = torch.zeros_like(m)
    else:
        ids = input_ids.unsqueeze(-1) == special_ids.to(input_ids.dtype).view(1, 1, -1)
        special = (ids.any(-1) & (mask > 0)).to(probs.dtype)  # [B, T]
    pos = torch.arange(t, dtype=probs.dtype, device=probs.device)
    dist = (pos.view(-1, 1) - pos.view(1, -1)).abs()  # [T, T] query x key
    prev = (pos.view(1, -1) == pos.view(-1, 1) - 1).to(probs.dtype)  # key = query - 1
    logp = torch.log(torch.where(probs > 0, probs, torch.ones_like(probs)))
    per_query = {
        "entropy": -(probs * logp).sum(-1),
        "first": (probs * first[:, None, None, None, :]).sum(-1),
        "special": (probs * special[:, None, None, None, :]).sum(-1),
        "distance": (probs * dist).sum(-1),
        "previous": (probs * prev).sum(-1),
    }  # each [B, L, H, T]
    rows = m[:, None, None, :]
    after = (m - first)[:, None, None, :]  # queries with a real token before them
    out = []
    for name in SUMMARIES:
        w = after if name == "previous" else rows
        out.append((per_query[name] * w).sum(-1) / w.sum(-1))
    return out


def attention_module(net, input_names: list[str], special_ids: list[int], *, decoder: bool):
    """A torch module: the model's inputs in -> patterns per layer, then the summaries (the graph's outputs)."""
    import torch

    names = list(input_names)
    extra = {"use_cache": False} if decoder else {}

    class AttentionOutputs(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.net = model
            self.register_buffer("special_ids", torch.tensor(sorted(set(special_ids)) or [-1], dtype=torch.int64),
                                 persistent=False)

        def forward(self, *args):
            feed = dict(zip(names, args))
            out = self.net(**feed, output_attentions=True, return_dict=True, **extra)
            probs = [a.float() for a in out.attentions]
            if not probs or any(a is None for a in probs):
                raise ExportError("the model returned no attention probabilities with eager attention")
            stats = summaries(torch.stack(probs, 1), feed.get("attention_mask"), feed.get("input_ids"),
                              self.special_ids)
            return (*probs, *stats)

    return AttentionOutputs(net).eval()


def output_names(num_layers: int) -> list[str]:
    return [pattern_output(i) for i in range(1, num_layers + 1)] + [summary_output(s) for s in SUMMARIES]


def special_token_ids(tokenizer) -> list[int]:
    """The ids counted as special (sinks): every special token of the tokenizer but an unknown-word token that
    is nothing else (GPT-2's ``<|endoftext|>`` is its unknown, BOS and EOS token at once, and counts)."""
    roles = {getattr(tokenizer, n, None) for n in ("bos_token_id", "eos_token_id", "cls_token_id", "sep_token_id")}
    unk = getattr(tokenizer, "unk_token_id", None)
    return sorted({int(i) for i in tokenizer.all_special_ids if i is not None and (i != unk or i in roles)})


def trace_attention(net, path: Path, *, input_names: list[str], num_layers: int, special_ids: list[int],
                    decoder: bool, vocab_size: int, opset: int) -> None:
    """Trace ``net`` (loaded with eager attention) into ``path`` with the attention outputs."""
    import torch

    from layerscope.export.torch_export import _dummy, dense_moe, traceable_masks

    names = list(input_names)
    wrapper = attention_module(net, names, special_ids, decoder=decoder)
    outs = output_names(num_layers)
    axes = {n: {0: "batch_size", 1: "sequence_length"} for n in names}
    axes.update({pattern_output(i): {0: "batch_size", 2: "sequence_length", 3: "sequence_length"}
                 for i in range(1, num_layers + 1)})
    axes.update({summary_output(s): {0: "batch_size"} for s in SUMMARIES})
    try:
        with warnings.catch_warnings(), dense_moe(net), traceable_masks(), torch.inference_mode(False), torch.no_grad():
            warnings.simplefilter("ignore")
            torch.onnx.export(wrapper, _dummy(names, vocab_size), str(path), input_names=names, output_names=outs,
                              dynamic_axes=axes, opset_version=opset, do_constant_folding=True, dynamo=False)
    except ExportError:
        raise
    except Exception as exc:  # torch.onnx raises many untyped errors
        raise ExportError(f"torch.onnx could not trace the attention graph: {str(exc).splitlines()[0][:300]}") from exc


def padded_batches(encoder, texts: list[str]) -> list[dict[str, np.ndarray]]:
    """The validation feeds: the texts right-padded (as the encoder pads), and the same rows left-padded."""
    batch = encoder(texts)
    right = {k: v.copy() for k, v in batch.inputs.items()}
    return [right, left_padded(right, pad_id=encoder.fallback_token_id)]


def left_padded(feed: dict[str, np.ndarray], *, pad_id: int) -> dict[str, np.ndarray]:
    """A right-padded feed moved to the right end of each row (padding first), positions recounted."""
    mask = feed["attention_mask"]
    out = {}
    for name, value in feed.items():
        moved = np.zeros_like(value) + (pad_id if name == "input_ids" else 0)
        for r, n in enumerate(mask.sum(1)):
            moved[r, value.shape[1] - n:] = value[r, :n]
        out[name] = moved
    if "position_ids" in out:
        out["position_ids"] = np.clip(np.cumsum(out["attention_mask"], 1) - 1, 0, None).astype(np.int64)
    return out

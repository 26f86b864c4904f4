"""The plain ``torch.onnx.export`` path: for architectures Optimum has no ONNX config for.

A wrapper module calls the Hugging Face model with ``output_hidden_states=True`` and returns every hidden
state, named ``hidden_states.0`` .. ``hidden_states.L`` as the Optimum path names them; the raw word
embeddings are the embedding lookup marked as an output afterwards (export/graph.py), as on that path.
The model is traced on a padded batch (one row shorter than the other), so the attention mask is a real
input of the graph, never folded away.

Mixture-of-experts blocks route each token to its top-k experts with a data-dependent loop over the
experts that were hit; traced, that loop would keep only the experts the dummy batch happened to use.  For
the export they compute every expert on every token and weight each by its routing weight (zero for the
experts not chosen): the same sum in another order (:func:`dense_moe`).

``streamed=True`` (weights over ``lean.STREAM_BYTES``) traces without the weights and writes each from the
model's own tensor afterwards (export/lean.py), as the Optimum path does: torch.onnx never holds a copy.
"""

from __future__ import annotations

import types
import warnings
from contextlib import contextmanager
from pathlib import Path

from layerscope.errors import ExportError
from layerscope.vocab.outputs import OWN_LAST, hidden_outputs


def _dense_moe_forward(self, hidden_states):
    import torch
    import torch.nn.functional as F

    batch, seq, dim = hidden_states.shape
    x = hidden_states.reshape(-1, dim)
    router_logits = self.gate(x)
    probs = F.softmax(router_logits, dim=1, dtype=torch.float)
    top, chosen = torch.topk(probs, self.top_k, dim=-1)
    if getattr(self, "norm_topk_prob", True):  # Mixtral always renormalizes the chosen weights
        top = top / top.sum(dim=-1, keepdim=True)
    weights = torch.zeros_like(probs).scatter(1, chosen, top).to(x.dtype)  # [tokens, experts]
    out = torch.zeros_like(x)
    for e, expert in enumerate(self.experts):
        out = out + expert(x) * weights[:, e:e + 1]
    if getattr(self, "shared_expert", None) is not None:
        out = out + F.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
    return out.reshape(batch, seq, dim), router_logits


def moe_blocks(model) -> list:
    """The sparse mixture-of-experts blocks of ``model`` (a router ``gate``, ``experts`` and ``top_k``)."""
    return [m for m in model.modules()
            if hasattr(m, "gate") and hasattr(m, "experts") and hasattr(m, "top_k") and type(m).__name__.endswith("MoeBlock")]


@contextmanager
def dense_moe(model):
    """Every mixture-of-experts block of ``model`` computes all experts while inside (see the module doc)."""
    blocks = moe_blocks(model)
    for block in blocks:
        block.forward = types.MethodType(_dense_moe_forward, block)
    try:
        yield len(blocks)
    finally:
        for block in blocks:
            del block.forward


@contextmanager
def traceable_masks():
    """transformers builds attention masks with ``torch.vmap``, which TorchScript tracing cannot follow;
    while inside, the mask functions are Optimum's vectorized ones (what its own exports use)."""
    import transformers.masking_utils as mu
    from optimum.exporters.onnx import model_patcher as mp

    registry = mu.ALL_MASK_ATTENTION_FUNCTIONS
    saved = {name: registry[name] for name in ("sdpa", "eager")}
    packed = mu.find_packed_sequence_indices
    registry.register("sdpa", mp.sdpa_mask_without_vmap)
    registry.register("eager", mp.eager_mask_without_vmap)
    mu.find_packed_sequence_indices = mp.find_packed_sequence_indices_patched
    try:
        yield
    finally:
        for name, fn in saved.items():
            registry.register(name, fn)
        mu.find_packed_sequence_indices = packed


def _dummy(names: list[str], vocab: int):
    import torch

    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, max(vocab, 2), (2, 9), generator=gen)
    mask = torch.ones(2, 9, dtype=torch.int64)
    mask[1, 6:] = 0  # a padded row: the mask must stay an input the graph reads
    feed = {"input_ids": ids, "attention_mask": mask,
            "position_ids": (mask.cumsum(1) - 1).clamp(min=0), "token_type_ids": torch.zeros_like(ids)}
    return tuple(feed[n] for n in names)


def torch_export(model, path: Path, *, input_names: list[str], num_layers: int, opset: int, decoder: bool,
                 vocab_size: int, streamed: bool = False, own_last: bool = False) -> None:
    """Trace ``model`` into ``path`` with every hidden state as an output (weights inside the file, or streamed
    into external data); ``own_last``: the model's own last hidden state first (``OWN_LAST``)."""
    import torch

    names = list(input_names)
    extra = {"use_cache": False} if decoder else {}

    class AllHiddenStates(torch.nn.Module):
        def __init__(self, net):
            super().__init__()
            self.net = net

        def forward(self, *args):
            out = self.net(**dict(zip(names, args)), output_hidden_states=True, return_dict=True, **extra)
            states = getattr(out, "hidden_states", None) if not isinstance(out, tuple) else None
            if not isinstance(states, (tuple, list)) or len(states) != num_layers + 1:
                got = len(states) if isinstance(states, (tuple, list)) else "no"
                raise ExportError(f"{type(self.net).__name__} returned {got} hidden states for output_hidden_states="
                                  f"True where its config has {num_layers} layers (expected {num_layers + 1}: the "
                                  "embeddings and every layer's output); layerscope cannot read its layers")
            return (out.last_hidden_state, *states) if own_last else tuple(states)

    outputs = ([OWN_LAST] if own_last else []) + hidden_outputs(num_layers)
    axes = {n: {0: "batch_size", 1: "sequence_length"} for n in names + outputs}
    wrapper = AllHiddenStates(model).eval()
    try:
        with warnings.catch_warnings(), dense_moe(model), traceable_masks(), torch.inference_mode(False), torch.no_grad():
            warnings.simplefilter("ignore")
            torch.onnx.export(wrapper, _dummy(names, vocab_size), str(path), input_names=names,
                              output_names=outputs, dynamic_axes=axes, opset_version=opset,
                              do_constant_folding=not streamed, export_params=not streamed, dynamo=False)
    except ExportError:
        raise
    except Exception as exc:  # torch.onnx raises many untyped errors
        raise ExportError(f"torch.onnx could not export this model: {str(exc).splitlines()[0][:300]}") from exc
    if streamed:
        from layerscope.export import lean

        lean.attach_weights(path, wrapper, opset=opset)  # parameters are graph inputs named as the wrapper's

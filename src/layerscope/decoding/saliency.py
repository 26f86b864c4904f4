"""Token saliency: decoded layer saliency (Hou and Castanon, ICML 2023) and its baselines.

For one text with tokens ``t_1..t_n`` and a scalar objective ``y`` (a probe's class logit, or the
cosine to a reference text):

* ``alpha_l = dy/dh_l * h_l`` (gradient times activation, ``[n, features]``) at layer ``l``;
* ``P = f_lm(h_l)``: every position decoded onto the vocabulary (softmax of the decoding head's
  logits, ``[n, vocab]``; ``decode="logits"`` keeps the raw logits);
* ``D[j, i] = P[i, t_j]``: the columns of ``P`` that belong to the input's own token ids, arranged
  input token x position, so that position ``i``'s decoded state, read as a weighted combination
  of the input tokens, hands its saliency to token ``j`` with weight ``P[i, t_j]``;
* ``score_j = ReLU(sum_features (D @ alpha_l)[j, :])``: one non-negative score per input token.

Baselines are scored per token the same way, without the decoding: ``grad-x-input`` (gradient
times the word embeddings, summed over features), ``integrated-gradients`` (Riemann midpoint sum
from a baseline where every non-special token is replaced by the mask token), ``gxa@l``
(the plain layer-``l`` gradient x activation per position, i.e. ``alpha_l`` summed over features,
no decoding: what the decoding adds is the difference) and ``random``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from layerscope.errors import InputError
from layerscope.vocab.pooling import MASK_POOLINGS, pool_torch


def objective_pooling(h, mask, mode: str):
    """The pooled final state an objective reads: vocab's torch rendering (differentiable), for the
    poolings that need only the states and the mask."""
    if mode not in MASK_POOLINGS:
        raise InputError(f"pooling '{mode}' cannot be used for a saliency objective; choose from "
                         f"{', '.join(MASK_POOLINGS)}")
    return pool_torch(h, mask, mode)


@dataclass
class Objective:
    """``y`` as a function of the last hidden state: a probe class logit, or cosine to a reference."""

    kind: str  # "probe" or "similarity"
    pooling: str
    weight: Any = None  # probe: [C, H] torch
    bias: Any = None  # probe: [C]
    reference: Any = None  # similarity: [H] torch (no grad)
    labels: list[str] = field(default_factory=list)

    def all_values(self, last_hidden, mask):
        """Probe: all class logits [N, C]; similarity: cosine [N, 1]."""
        import torch

        v = objective_pooling(last_hidden, mask, self.pooling)
        if self.kind == "probe":
            return v @ self.weight.t() + self.bias
        return torch.nn.functional.cosine_similarity(v, self.reference.unsqueeze(0), dim=-1).unsqueeze(-1)

    def value(self, last_hidden, mask, target: int = 0):
        return self.all_values(last_hidden, mask)[:, target]


def forward_inputs(inputs: dict[str, Any], ids=None) -> dict[str, Any]:
    """The model's inputs with ``input_ids`` replaced by ``ids`` (broadcast over a batch)."""
    out = {}
    n = 1 if ids is None else ids.shape[0]
    for k, v in inputs.items():
        if k == "input_ids":
            out[k] = v if ids is None else ids
        else:
            out[k] = v.expand(n, -1) if v.shape[0] == 1 else v
    return out


def run_embeds(model, inputs: dict[str, Any], embeds):
    """Forward from word embeddings (so gradients reach them); all hidden states."""
    feed = {k: v for k, v in inputs.items() if k != "input_ids"}
    feed = {k: (v.expand(embeds.shape[0], -1) if v.shape[0] == 1 else v) for k, v in feed.items()}
    return model.base(inputs_embeds=embeds, **feed, output_hidden_states=True, return_dict=True)


@dataclass
class Gradients:
    y: float
    hidden: list  # per layer 0..L: [S, H] torch (detached)
    grads: list  # per layer 0..L: [S, H]
    embeds: Any  # [S, H] word embeddings
    embeds_grad: Any


def gradients(model, inputs: dict[str, Any], objective: Objective, target: int = 0) -> Gradients:
    """One forward and one backward pass: dy/dh_l for every layer and dy/d(word embeddings)."""
    import torch

    with torch.enable_grad():
        e = model.word_embeddings(inputs["input_ids"]).detach().requires_grad_(True)
        out = run_embeds(model, inputs, e)
        hs = list(out.hidden_states)
        for h in hs:
            if h.requires_grad:
                h.retain_grad()
        y = objective.value(hs[-1], inputs["attention_mask"], target)[0]
        y.backward()
    grads = [(h.grad if h.grad is not None else torch.zeros_like(h))[0].detach() for h in hs]
    return Gradients(float(y.detach()), [h[0].detach() for h in hs], grads, e[0].detach(), e.grad[0].detach())


def decoded_saliency(model, h, grad, ids, layer: int, decode: str = "probs"):
    """Decoded layer saliency of one text at ``layer``: ``ReLU(sum_features D @ alpha)``, one per token."""
    import torch

    with torch.no_grad():
        alpha = grad * h  # [S, H]
        logits = model.head(h, layer)  # [S, V]
        p = torch.softmax(logits, dim=-1) if decode == "probs" else logits
        d = p[:, ids].t()  # D[j, i] = P[i, t_j]
        return torch.relu((d @ alpha).sum(-1))


def layer_gxa(h, grad):
    """Plain gradient x activation at a layer, summed over features (signed), one per position."""
    return (grad * h).sum(-1)


def grad_x_input(g: Gradients):
    return (g.embeds_grad * g.embeds).sum(-1)


def integrated_gradients(model, inputs: dict[str, Any], objective: Objective, baseline_ids, target: int = 0,
                         steps: int = 20, chunk: int = 32):
    """IG over the word embeddings from ``baseline_ids``' embeddings; Riemann midpoint rule, ``steps`` points.

    Returns (attributions per token [S], y(input) - y(baseline)) so completeness can be checked.
    """
    import torch

    x = model.word_embeddings(inputs["input_ids"]).detach()[0]
    b = model.word_embeddings(baseline_ids.view(1, -1)).detach()[0]
    alphas = (torch.arange(steps, dtype=x.dtype) + 0.5) / steps
    total = torch.zeros_like(x)
    for start in range(0, steps, chunk):
        a = alphas[start:start + chunk].view(-1, 1, 1)
        with torch.enable_grad():
            path = (b + a * (x - b)).requires_grad_(True)
            out = run_embeds(model, inputs, path)
            y = objective.value(out.hidden_states[-1], inputs["attention_mask"].expand(path.shape[0], -1),
                                target).sum()
            (grad,) = torch.autograd.grad(y, path)
        total += grad.sum(0)
    attr = ((x - b) * total / steps).sum(-1)
    with torch.no_grad():
        ends = run_embeds(model, inputs, torch.stack([x, b]))
        yy = objective.value(ends.hidden_states[-1], inputs["attention_mask"].expand(2, -1), target)
    return attr.detach(), float(yy[0] - yy[1])


def evaluate_ids(model, inputs: dict[str, Any], ids_batch, objective: Objective, chunk: int = 256):
    """All objective values ``[N, C]`` for a batch of token-id variants of one text (no grad)."""
    import torch

    outs = []
    with torch.inference_mode():
        for s in range(0, ids_batch.shape[0], chunk):
            part = ids_batch[s:s + chunk]
            feed = forward_inputs(inputs, part)
            out = model.base(**feed, output_hidden_states=True, return_dict=True)
            outs.append(objective.all_values(out.hidden_states[-1], feed["attention_mask"]))
    return torch.cat(outs).float().numpy()


def replacement_token(tokenizer) -> tuple[int, str]:
    """The token that hides a word: the mask token, else unk, else pad (id, its string)."""
    for attr in ("mask_token", "unk_token", "pad_token"):
        tok = getattr(tokenizer, attr, None)
        if tok is not None:
            return int(tokenizer.convert_tokens_to_ids(tok)), tok
    raise InputError("this tokenizer has no mask, unk or pad token to hide words with")


def content_positions(ids: np.ndarray, special_ids: set[int]) -> np.ndarray:
    return np.array([i for i, t in enumerate(ids.tolist()) if t not in special_ids], dtype=np.int64)


def text_scores(model, inputs, objective: Objective, layers: list[int], *, target: int, baseline_ids,
                decode: str = "probs", ig_steps: int = 20) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Every method's per-token scores for one text (``inputs`` holds a batch of one, no padding)."""
    g = gradients(model, inputs, objective, target)
    ids = inputs["input_ids"][0]
    scores: dict[str, np.ndarray] = {}
    for layer in layers:
        scores[f"decoded@{layer}"] = decoded_saliency(model, g.hidden[layer], g.grads[layer], ids, layer,
                                                      decode).numpy()
        scores[f"gxa@{layer}"] = layer_gxa(g.hidden[layer], g.grads[layer]).numpy()
    scores["grad-x-input"] = grad_x_input(g).numpy()
    ig, delta = integrated_gradients(model, inputs, objective, baseline_ids, target, steps=ig_steps)
    scores["integrated-gradients"] = ig.numpy()
    extra = {"y": g.y, "ig_sum": float(ig.sum()), "ig_delta": delta}
    return scores, extra


Scorer = Callable[..., tuple[dict[str, np.ndarray], dict[str, Any]]]

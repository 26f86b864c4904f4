"""The logit lens: decode every layer's hidden states and read off ranks and top-k tokens.

One function, :func:`lens_outputs`, does the arithmetic on torch tensors; the torch path calls
it directly and the ONNX export (``lens_onnx.py``) traces the very same function into the graph.

Targets: for encoders the input token itself (does layer ``l`` still "see" its token?); for
decoders the actual next token (what does layer ``l`` already predict?).  Rank 1 is the top;
rank 0 marks a position with no target (padding; a decoder's last real token).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


def lens_targets(input_ids, attention_mask, decoder: bool):
    """(target ids, valid mask) per position, as torch tensors."""
    import torch

    if not decoder:
        return input_ids, attention_mask > 0
    nxt = torch.cat([input_ids[:, 1:], torch.zeros_like(input_ids[:, :1])], dim=1)
    nxt_valid = torch.cat([attention_mask[:, 1:], torch.zeros_like(attention_mask[:, :1])], dim=1)
    return nxt, (attention_mask > 0) & (nxt_valid > 0)


def lens_outputs(head, hidden: list, layers: list[int], input_ids, attention_mask, k: int, decoder: bool, *,
                 divergence: bool = False):
    """Per layer: rank of the target [B, S] (int64, 0 = no target), top-k ids and probabilities [B, S, k]
    (float64: the softmax's normaliser summed in float64; a float32 softmax over tens of thousands of entries is
    off by about 2e-5 near probability 1).

    Returns three tensors stacked over ``layers``: ``[n_layers, B, S]``, ``[n_layers, B, S, k]`` x2.
    The rank is 1 + the number of vocabulary entries with a strictly larger logit than the target's.
    ``divergence``: two more, ``[n_layers, B, S]`` float64 each: the KL divergence from the last of ``layers``
    (the model's own output distribution) to each layer's, ``KL(final || layer)`` in nats
    (:func:`kl_from_final`), and the log-probability of the target (0 where there is none).
    """
    import torch

    target, valid = lens_targets(input_ids, attention_mask, decoder)
    ranks, ids, probs, kls, logps = [], [], [], [], []
    final = None
    if divergence:  # the final distribution first: every layer is compared with it
        final_logits = head(hidden[-1], layers[-1])
        final = final_distribution(final_logits)
    for h, layer in zip(hidden, layers):
        logits = final_logits if divergence and layer == layers[-1] else head(h, layer)
        tgt = torch.gather(logits, -1, target.unsqueeze(-1))
        rank = (logits > tgt).sum(-1).to(torch.int64) + 1
        ranks.append(torch.where(valid, rank, torch.zeros_like(rank)))
        top_l, top_i = torch.topk(logits, k, dim=-1)  # the softmax keeps the order of the logits
        ids.append(top_i.to(torch.int64))
        norm = torch.logsumexp(logits.to(torch.float64), dim=-1, keepdim=True)
        probs.append(torch.exp(top_l.to(torch.float64) - norm))
        if divergence:  # the final layer against itself: 0 exactly, not the float32 dot product's rounding
            kl = kl_from_final(final, logits, norm)
            kls.append(torch.zeros_like(kl) if layer == layers[-1] else kl)
            logp = tgt.to(torch.float64)[..., 0] - norm[..., 0]
            logps.append(torch.where(valid, logp, torch.zeros_like(logp)))
    out = (torch.stack(ranks), torch.stack(ids), torch.stack(probs))
    return (*out, torch.stack(kls), torch.stack(logps)) if divergence else out


def final_distribution(final_logits):
    """``(p, sum p log p, sum p)`` of the final logits (``p`` float32, the sums float64: what
    :func:`kl_from_final` compares with)."""
    import torch

    logp = torch.log_softmax(final_logits.to(torch.float64), dim=-1)
    p = torch.exp(logp)
    return p.to(torch.float32), (p * logp).sum(-1), p.sum(-1)


def kl_from_final(final, logits, norm):
    """``KL(final || softmax(z))`` in nats: ``sum p log p - p . z + logsumexp(z) sum p`` with
    ``final = (p, sum p log p, sum p)`` and ``norm`` = logsumexp(z) (keepdim, float64). The dot product is one
    float32 matrix product of ``p`` and the layer's float32 logits, so a layer adds no vocabulary-wide tensor to
    what the lens holds anyway (its logits: a lens graph's memory); the rest is float64. Its rounding is about
    1e-7 of ``|p . z|`` (a few 1e-6 nats for logits of tens), far below any divergence a table shows; never
    below 0."""
    import torch

    p, neg_entropy, mass = final
    dot = torch.matmul(p.unsqueeze(-2), logits.unsqueeze(-1))[..., 0, 0].to(torch.float64)
    return torch.clamp(neg_entropy - dot + norm[..., 0] * mass, min=0.0)  # the final layer's own: 0 up to rounding


def base_hidden_states(model, inputs: dict[str, Any]):
    """Every hidden state of the torch base model on one batch (no grad)."""
    import torch

    with torch.inference_mode():
        return model.base(**inputs, output_hidden_states=True, return_dict=True).hidden_states


def rank_bands(model, inputs: dict[str, Any], layers: list[int], rel_tol: float,
               hidden=None, *, head=None) -> tuple[np.ndarray, np.ndarray]:
    """Per layer, the lowest and highest rank the target can take when logits within ``rel_tol``
    (relative to the target's logit, at least absolute ``rel_tol``) count as ties: ``[n_layers, B, S]`` each.

    Two correct implementations may order near-equal logits differently; a rank outside this band
    is a real disagreement.  ``hidden``: the hidden states to decode (default: the torch base model's); ``head``:
    what decodes them (default: the model's own head).
    """
    import torch

    decoder = model.family.kind == "decoder"
    lo, hi = [], []
    if hidden is None:
        hidden = base_hidden_states(model, inputs)
    with torch.inference_mode():
        target, valid = lens_targets(inputs["input_ids"], inputs["attention_mask"], decoder)
        for layer in layers:
            logits = (model.head if head is None else head)(hidden[layer], layer).float()
            tgt = torch.gather(logits, -1, target.unsqueeze(-1))
            eps = rel_tol * torch.clamp(tgt.abs(), min=1.0)
            low = (logits > tgt + eps).sum(-1) + 1
            high = (logits >= tgt - eps).sum(-1)
            zero = torch.zeros_like(low)
            lo.append(torch.where(valid, low, zero))
            hi.append(torch.where(valid, high, zero))
    return torch.stack(lo).numpy(), torch.stack(hi).numpy()


@dataclass
class LensBatch:
    rank: np.ndarray  # [n_layers, B, S] int64
    topk_ids: np.ndarray  # [n_layers, B, S, k]
    topk_probs: np.ndarray  # [n_layers, B, S, k] float64
    input_ids: np.ndarray  # [B, S]
    mask: np.ndarray  # [B, S]
    kl: np.ndarray | None = None  # [n_layers, B, S] float64: KL(final || layer), nats (0 at padding)
    logprob: np.ndarray | None = None  # [n_layers, B, S] float64: log-probability of the target (0: none)

    def layers(self, idx: list[int]) -> LensBatch:
        """The figures of layers ``idx`` (positions into the layer axis) only."""
        pick = (lambda a: None if a is None else a[idx])
        return LensBatch(self.rank[idx], self.topk_ids[idx], self.topk_probs[idx], self.input_ids, self.mask,
                         pick(self.kl), pick(self.logprob))


def torch_lens(model, inputs: dict[str, Any], layers: list[int], k: int, hidden_states=None, *,
               positions: int | None = None, bar=None, head=None, divergence: bool = False) -> LensBatch:
    """Run the base model (or take ``hidden_states``, every layer's) and its decoding head on one batch.

    The head decodes the real tokens only, ``positions`` at a time (None: all at once), so the logits held at
    once are positions x vocabulary, not the batch's; padding gets rank 0, ids 0 and probabilities 0, as on the
    ONNX engines. ``bar``: a progress count advanced by the positions of each run. ``head``: what decodes
    (default the model's own head; a tuned lens's ``translated_head``); ``divergence``: also each layer's KL from
    the last of ``layers`` and the target's log-probability (``lens_outputs``)."""
    import torch

    decoder = model.family.kind == "decoder"
    head = model.head if head is None else head
    if hidden_states is None:
        hidden_states = base_hidden_states(model, inputs)
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    target, valid = lens_targets(ids, mask, decoder)
    rows, cols = torch.nonzero(mask > 0, as_tuple=True)
    (b, s), n = ids.shape, len(layers)
    rank, top_ids, top_p = np.zeros((n, b, s), np.int64), np.zeros((n, b, s, k), np.int64), np.zeros((n, b, s, k))
    kl, logprob = (np.zeros((n, b, s)), np.zeros((n, b, s))) if divergence else (None, None)
    step = max(1, len(rows) if positions is None else int(positions))
    with torch.inference_mode():
        for a in range(0, len(rows), step):
            r, c = rows[a:a + step], cols[a:a + step]
            hidden = [hidden_states[i][r, c][None] for i in layers]
            # targets go in already shifted: the input-token rule of lens_outputs applies, as in the ONNX head
            outs = lens_outputs(head, hidden, layers, target[r, c][None], valid[r, c][None].to(torch.int64), k,
                                False, divergence=divergence)
            rn, cn = r.numpy(), c.numpy()
            rank[:, rn, cn], top_ids[:, rn, cn] = outs[0][:, 0].numpy(), outs[1][:, 0].numpy()
            top_p[:, rn, cn] = outs[2][:, 0].to(torch.float64).numpy()
            if divergence:
                kl[:, rn, cn], logprob[:, rn, cn] = outs[3][:, 0].numpy(), outs[4][:, 0].numpy()
            if bar is not None:
                bar.advance(len(r))
    return LensBatch(rank, top_ids, top_p, ids.numpy(), mask.numpy(), kl, logprob)


class LensAccumulator:
    """Corpus figures by layer: mean/median rank, top-1 = target, top-1 agreement with the last layer, and (from
    batches that carry them) the mean KL to the final distribution and the perplexity of the target.

    Positions whose target is a special token (``[CLS]``, ``[SEP]``, ``<|endoftext|>``) are left out, of every
    figure alike.
    """

    def __init__(self, layers: list[int], special_ids: set[int], decoder: bool):
        self.layers = layers
        self.special = np.array(sorted(special_ids), dtype=np.int64)
        self.decoder = decoder
        self.ranks: list[list[np.ndarray]] = [[] for _ in layers]
        self.agree = np.zeros(len(layers))
        self.n = 0
        # per text, for intervals over texts: positions counted, and per layer agreements and top-1 hits
        self.text_positions: list[int] = []
        self.text_agree: list[np.ndarray] = []
        self.text_top1: list[np.ndarray] = []
        self.text_log10: list[np.ndarray] = []  # per text, per layer: the sum of log10 rank over its positions
        self.text_kl: list[np.ndarray] = []  # per text, per layer: KL summed over its counted positions
        self.text_nll: list[np.ndarray] = []  # ... the target's negative log-probability summed

    def add(self, b: LensBatch) -> np.ndarray:
        """Add a batch; returns the [B, S] mask of positions counted."""
        target = b.input_ids if not self.decoder else np.concatenate(
            [b.input_ids[:, 1:], np.zeros_like(b.input_ids[:, :1])], axis=1)
        keep = (b.rank[0] > 0) & ~np.isin(target, self.special)
        last_top1 = b.topk_ids[-1, :, :, 0]
        agrees = (b.topk_ids[:, :, :, 0] == last_top1[None]) & keep[None]  # [L, B, S]
        hits = (b.rank == 1) & keep[None]
        for li in range(len(self.layers)):
            self.ranks[li].append(b.rank[li][keep])
            self.agree[li] += float(agrees[li].sum())
        self.n += int(keep.sum())
        self.text_positions += [int(v) for v in keep.sum(axis=1)]
        self.text_agree += list(agrees.sum(axis=2).T.astype(np.int64))
        self.text_top1 += list(hits.sum(axis=2).T.astype(np.int64))
        logs = np.where(keep[None], np.log10(np.maximum(b.rank, 1)), 0.0)  # [L, B, S]
        self.text_log10 += list(logs.sum(axis=2).T)
        if b.kl is not None and b.logprob is not None:
            self.text_kl += list(np.where(keep[None], b.kl, 0.0).sum(axis=2).T)
            self.text_nll += list(np.where(keep[None], -b.logprob, 0.0).sum(axis=2).T)
        return keep

    def divergence(self) -> tuple[np.ndarray, np.ndarray] | None:
        """Per text and layer ``[n, layers]``: KL to the final distribution and the target's negative
        log-probability, each summed over the text's counted positions; None where the batches carried neither."""
        if not self.text_kl or len(self.text_kl) != len(self.text_positions):
            return None
        n = len(self.text_kl)
        return (np.asarray(self.text_kl, dtype=np.float64).reshape(n, len(self.layers)),
                np.asarray(self.text_nll, dtype=np.float64).reshape(n, len(self.layers)))

    def per_text_log10(self) -> np.ndarray:
        """Per text and layer, the sum of log10 rank over its counted positions ``[n, layers]`` (with the
        positions of ``per_text``: the mean log10 rank's interval over texts)."""
        return np.asarray(self.text_log10, dtype=np.float64).reshape(len(self.text_positions), len(self.layers))

    def per_text(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per text: positions counted ``[n]``, and per layer top-1 agreements with the last layer and top-1
        hits of the target ``[n, layers]`` (for intervals over texts, whose positions resample together)."""
        n = len(self.text_positions)
        return (np.asarray(self.text_positions, dtype=np.int64),
                np.asarray(self.text_agree, dtype=np.int64).reshape(n, len(self.layers)),
                np.asarray(self.text_top1, dtype=np.int64).reshape(n, len(self.layers)))

    def table(self, names: list[str]) -> list[dict[str, Any]]:
        rows = []
        for li, name in enumerate(names):
            r = np.concatenate(self.ranks[li]) if self.ranks[li] else np.zeros(0, dtype=np.int64)
            rows.append({
                "layer": name,
                "positions": int(r.size),
                "mean_rank": float(r.mean()) if r.size else None,
                "median_rank": float(np.median(r)) if r.size else None,
                "mean_log10_rank": float(np.log10(r).mean()) if r.size else None,
                "top1_is_target": float((r == 1).mean()) if r.size else None,
                "top1_agrees_with_last": float(self.agree[li] / self.n) if self.n else None,
            })
        got = self.divergence()
        if got is not None:
            kl, nll = got
            for li, row in enumerate(rows):
                row["kl_to_final"] = float(kl[:, li].sum() / self.n) if self.n else None
                row["perplexity"] = float(np.exp(nll[:, li].sum() / self.n)) if self.n else None
        return rows


FORWARD_MACS = 2**36  # multiply-adds of one model forward of the lens (padded tokens x ~12 hidden^2 x layers)


def forward_macs_per_token(hidden: int, layers: int) -> int:
    """A transformer block's multiply-adds per token, ~12 hidden^2 (attention 4 h^2, an MLP 4h wide 8 h^2), times
    the layers: the budget's measure of a forward, not an exact count."""
    return max(1, 12 * int(hidden) ** 2 * max(int(layers), 1))


def forward_runs(lengths, batch: int, tokens: int) -> list[tuple[int, int]]:
    """Consecutive ``(start, stop)`` runs of texts for one forward each: at most ``batch`` texts, and their padded
    tokens (texts x the longest length) at most ``tokens`` (a text longer than that alone), so a forward, and the
    silence before the positions it yields are counted, stays seconds long at real size."""
    runs, start, longest = [], 0, 0
    for i, n in enumerate(int(x) for x in lengths):
        if i > start and (i - start >= batch or (i - start + 1) * max(longest, n) > tokens):
            runs.append((start, i))
            start, longest = i, 0
        longest = max(longest, n)
    if len(lengths):
        runs.append((start, len(lengths)))
    return runs

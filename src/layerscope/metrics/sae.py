"""A sparse autoencoder as SAELens runs it, in numpy (no torch, no SAELens); its files are read by
metrics/sae_files.py.

A folder holds ``cfg.json`` (``architecture``: standard, jumprelu or topk; ``d_in``, ``d_sae``,
``apply_b_dec_to_input``, ``normalize_activations``; the hook in ``metadata.hook_name``, or ``hook_name`` /
``hook_point`` in configs from before SAELens 6) and ``sae_weights.safetensors`` (``W_enc [d_in, d_sae]``,
``b_enc [d_sae]``, ``W_dec [d_sae, d_in]``, ``b_dec [d_in]``; jumprelu's ``threshold`` or ``log_threshold``).

SAELens's ``encode``, written out:

* input normalisation: ``constant_norm_rescale`` scales each vector to norm ``sqrt(d_in)``; ``layer_norm``
  centres it and divides by its (unbiased) standard deviation + 1e-5; ``none`` leaves it;
* ``x - b_dec`` where ``apply_b_dec_to_input``; pre-activations ``(x - b_dec) W_enc + b_enc``;
* standard: ReLU; jumprelu: ReLU where the pre-activation exceeds the feature's threshold, else 0;
  topk: the k largest pre-activations (each times its decoder row's norm where ``rescale_acts_by_decoder_norm``)
  through ReLU, the rest 0.

``decode``: ``acts W_dec + b_dec`` (topk with the rescale: acts divided by the decoder norms first), then
the normalisation undone. ``expected_average_only_in`` (a dataset-wide factor SAELens folds in only for its
published releases) and ``covariance_whitening`` are refused: what the folder holds does not say them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

ARCHITECTURES = ("standard", "jumprelu", "topk")
NORMALISATIONS = ("none", "constant_norm_rescale", "layer_norm")


class BadSAE(ValueError):
    """The folder is not an SAE this reader runs (the message says why)."""


@dataclass(frozen=True)
class SAE:
    architecture: str
    d_in: int
    d_sae: int
    hook: str
    normalize: str
    apply_b_dec: bool
    w_enc: np.ndarray
    b_enc: np.ndarray
    w_dec: np.ndarray
    b_dec: np.ndarray
    threshold: np.ndarray | None = None
    k: int | None = None
    rescale_by_decoder_norm: bool = False
    model_name: str | None = None

    def _norm_in(self, x: np.ndarray):
        if self.normalize == "constant_norm_rescale":
            coeff = math.sqrt(self.d_in) / np.linalg.norm(x, axis=-1, keepdims=True)
            return x * coeff, ("scale", coeff)
        if self.normalize == "layer_norm":
            mu = x.mean(-1, keepdims=True)
            c = x - mu
            std = c.std(-1, ddof=1, keepdims=True)
            return c / (std + 1e-5), ("ln", mu, std)
        return x, None

    def encode(self, x) -> np.ndarray:
        """Feature activations ``[n, d_sae]`` of ``x`` ``[n, d_in]`` (float64)."""
        return self._encode(np.asarray(x, np.float64))[0]

    def _encode(self, x: np.ndarray):
        z, undo = self._norm_in(x)
        if self.apply_b_dec:
            z = z - self.b_dec
        pre = z @ self.w_enc + self.b_enc
        if self.architecture == "standard":
            return np.maximum(pre, 0.0), undo
        if self.architecture == "jumprelu":
            return np.where(pre > self.threshold, np.maximum(pre, 0.0), 0.0), undo
        if self.rescale_by_decoder_norm:
            pre = pre * np.linalg.norm(self.w_dec, axis=1)
        k = min(int(self.k), self.d_sae)
        top = np.argpartition(-pre, k - 1, axis=1)[:, :k]
        acts = np.zeros_like(pre)
        rows = np.arange(len(pre))[:, None]
        acts[rows, top] = np.maximum(pre[rows, top], 0.0)
        return acts, undo

    def reconstruct(self, x) -> tuple[np.ndarray, np.ndarray]:
        """``(activations, reconstruction)`` of ``x``: SAELens's ``decode(encode(x))``."""
        x = np.asarray(x, np.float64)
        acts, undo = self._encode(x)
        a = acts / np.linalg.norm(self.w_dec, axis=1) if self.rescale_by_decoder_norm else acts
        out = a @ self.w_dec + self.b_dec
        if undo is not None and undo[0] == "scale":
            out = out / undo[1]
        elif undo is not None:
            out = out * undo[2] + undo[1]
        return acts, out


def resid_layer(hook: str, num_layers: int, *, final_norm_in_last: bool) -> str:
    """Our layer name for a TransformerLens residual-stream hook: ``blocks.l.hook_resid_pre`` is layer l (the
    input of block l; l = 0: the embeddings' output), ``blocks.l.hook_resid_post`` layer l + 1. Where our last
    layer already holds the final norm (decoders), no hook is it: ``blocks.{L-1}.hook_resid_post`` is the state
    before that norm."""
    import re

    m = re.fullmatch(r"blocks\.(\d+)\.hook_resid_(pre|post)", hook)
    if not m:
        raise BadSAE(f"its hook {hook!r} is not a residual-stream state (blocks.l.hook_resid_pre or _post), "
                     "the only states a store holds")
    block, where = int(m.group(1)), m.group(2)
    layer = block + (1 if where == "post" else 0)
    if block >= num_layers:
        raise BadSAE(f"its hook {hook!r} is in block {block}; this model has blocks 0-{num_layers - 1}")
    if layer == num_layers and final_norm_in_last:
        raise BadSAE(f"its hook {hook!r} is the last block's output before the final norm, but this model's last "
                     "layer is stored after it: no stored layer matches")
    return str(layer)


class Stats:
    """Streamed figures of an SAE over token vectors: FVU, L0, feature frequencies, each feature's top tokens."""

    def __init__(self, d_sae: int, top: int):
        self.n = 0
        self.err = 0.0
        self.sum = None
        self.sq = 0.0
        self.l0 = 0.0
        self.active = np.zeros(d_sae, np.int64)
        self.top = top
        self.best_val = np.full((top, d_sae), -np.inf)
        self.best_pos = np.full((top, d_sae), -1, np.int64)

    def update(self, x: np.ndarray, acts: np.ndarray, recon: np.ndarray, positions: np.ndarray) -> None:
        x = np.asarray(x, np.float64)
        self.n += len(x)
        self.err += float(np.sum((x - recon) ** 2))
        self.sum = x.sum(0) if self.sum is None else self.sum + x.sum(0)
        self.sq += float(np.sum(x * x))
        on = acts > 0
        self.l0 += float(on.sum())
        self.active += on.sum(0)
        m = min(self.top, len(x))
        idx = np.argpartition(-acts, m - 1, axis=0)[:m] if m < len(x) else np.argsort(-acts, axis=0)
        vals = np.take_along_axis(acts, idx, axis=0)
        vals = np.where(vals > 0, vals, -np.inf)
        allv = np.concatenate([self.best_val, vals])
        allp = np.concatenate([self.best_pos, np.asarray(positions)[idx]])
        order = np.argsort(-allv, axis=0, kind="stable")[:self.top]
        self.best_val = np.take_along_axis(allv, order, axis=0)
        self.best_pos = np.take_along_axis(allp, order, axis=0)

    def fvu(self) -> float:
        """Fraction of variance unexplained: sum |x - x^|^2 over sum |x - mean|^2."""
        total = self.sq - float(self.sum @ self.sum) / self.n
        return self.err / total if total > 0 else float("nan")

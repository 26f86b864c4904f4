"""A linear probe (multinomial logistic regression) on frozen pooled vectors, trained with torch.

Seeded, full-batch L-BFGS with a small L2 penalty; features are used as they are (no scaling),
so the probe is a plain ``W v + b`` that gradients flow through unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from layerscope.errors import InputError


@dataclass
class Probe:
    weight: np.ndarray  # [C, H]
    bias: np.ndarray  # [C]
    labels: list[str]
    train_accuracy: float

    def logits(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(x, dtype=np.float64) @ self.weight.T.astype(np.float64) + self.bias

    def predict(self, x: np.ndarray) -> np.ndarray:
        return self.logits(x).argmax(1)


def train_probe(x: np.ndarray, y: np.ndarray, labels: list[str], *, seed: int = 0, l2: float = 1e-3,
                iters: int = 200) -> Probe:
    import torch

    if len(set(y.tolist())) < 2:
        raise InputError("the probe needs at least two classes among its training texts")
    g = torch.Generator().manual_seed(seed)
    xt = torch.from_numpy(np.asarray(x, dtype=np.float32))
    yt = torch.from_numpy(np.asarray(y, dtype=np.int64))
    c = len(labels)
    w = (0.01 * torch.randn(c, xt.shape[1], generator=g)).requires_grad_(True)
    b = torch.zeros(c, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], lr=1.0, max_iter=iters, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(xt @ w.t() + b, yt) + l2 * (w * w).sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        opt.step(closure)
    wn, bn = w.detach().numpy(), b.detach().numpy()
    acc = float(((x @ wn.T + bn).argmax(1) == y).mean())
    return Probe(wn, bn, list(labels), acc)


def stratified_split(y: np.ndarray, eval_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices (train, eval): every class has at least one text on each side."""
    rng = np.random.default_rng(seed)
    train, held = [], []
    for cls in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == cls))
        n_eval = int(round(len(idx) * eval_fraction))
        n_eval = min(max(n_eval, 1), len(idx) - 1)
        held.extend(idx[:n_eval].tolist())
        train.extend(idx[n_eval:].tolist())
    return np.array(sorted(train)), np.array(sorted(held))

"""Learned similarity probes over frozen per-layer sentence vectors (PyTorch, CPU, seeded).

Two probes, both trained on a train split, early-stopped on a dev split when one
is given, and scored on a test split:

* ``cosine-mlp``: an MLP over the per-layer cosines of a pair (one feature per layer);
* ``siamese``: per layer, a small encoder (linear + tanh) shared by both sentences;
  the per-layer cosines of the encoded pair feed the same kind of MLP. The encoders
  can first be pretrained as per-layer autoencoders on unlabeled sentences.

Losses: ``mse`` (against scores rescaled to [0, 1] with the train range) or
``logvar`` (log of the variance of the residuals; blind to a constant offset, so it
fits the shape of the scores rather than their level). Every random choice comes
from ``seed``; deterministic algorithms are switched on while a probe trains, so a
rerun on the same machine gives the same numbers.
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from layerscope.errors import InputError
from layerscope.metrics.vectors import layer_cosines
from layerscope.progress import track

KINDS = ("cosine-mlp", "siamese")
LOSSES = ("mse", "logvar")


@dataclass
class ProbeConfig:
    kind: str = "cosine-mlp"
    loss: str = "mse"
    hidden: int = 64  # MLP hidden units
    proj_dim: int = 64  # siamese encoder width
    epochs: int | None = None  # default: 200 for cosine-mlp, 30 for siamese
    batch_size: int = 256
    lr: float = 2e-3
    weight_decay: float = 1e-4
    patience: int | None = None  # epochs without a better dev Pearson before stopping (15 / 5)
    pretrain: bool = False  # siamese only: per-layer autoencoders first
    pretrain_epochs: int = 5
    seed: int = 0

    def __post_init__(self) -> None:
        if self.epochs is None:
            self.epochs = 200 if self.kind == "cosine-mlp" else 30
        if self.patience is None:
            self.patience = 15 if self.kind == "cosine-mlp" else 5

    def check(self) -> None:
        if self.kind not in KINDS:
            raise InputError(f"--probe-kind {self.kind}: choose from {', '.join(KINDS)}")
        if self.loss not in LOSSES:
            raise InputError(f"--probe-loss {self.loss}: choose from {', '.join(LOSSES)}")
        for name in ("hidden", "proj_dim", "epochs", "batch_size"):
            if getattr(self, name) < 1:
                raise InputError(f"probe setting {name} must be >= 1, got {getattr(self, name)}")


@dataclass
class PairSplit:
    """Frozen vectors of a split: ``a``/``b`` are float32 ``[layers, n, hidden]``; ``y`` the scores."""

    a: np.ndarray
    b: np.ndarray
    y: np.ndarray


@contextlib.contextmanager
def _deterministic(seed: int):
    import torch

    was = torch.are_deterministic_algorithms_enabled()
    threads = torch.get_num_threads()
    torch.use_deterministic_algorithms(True)
    # One thread: the same sums in the same order on any machine, and for models this small it is also
    # the fastest (several threads on a busy 2-core machine made training ~5x slower).
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was)
        torch.set_num_threads(threads)


def _loss(pred, target, kind: str):
    import torch

    if kind == "mse":
        return torch.mean((pred - target) ** 2)
    resid = pred - target
    return torch.log(resid.var(unbiased=False) + 1e-8)


def _make_head(n_in: int, hidden: int):
    import torch.nn as nn

    return nn.Sequential(nn.Linear(n_in, hidden), nn.ReLU(), nn.Linear(hidden, 1))


def _build(kind: str, n_layers: int, hidden_size: int, cfg: ProbeConfig, feat_mean, feat_std, vec_mean, vec_std):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class CosineMLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("mu", torch.as_tensor(feat_mean, dtype=torch.float32))
            self.register_buffer("sd", torch.as_tensor(feat_std, dtype=torch.float32))
            self.head = _make_head(n_layers, cfg.hidden)

        def forward(self, feats):
            return self.head((feats - self.mu) / self.sd).squeeze(-1)

    class Siamese(nn.Module):
        def __init__(self):
            super().__init__()
            d = cfg.proj_dim
            self.register_buffer("vmu", torch.as_tensor(vec_mean, dtype=torch.float32))  # [L, 1, H]
            self.register_buffer("vsd", torch.as_tensor(vec_std, dtype=torch.float32))  # [L, 1, 1]
            self.w = nn.Parameter(torch.randn(n_layers, hidden_size, d) / hidden_size ** 0.5)
            self.b = nn.Parameter(torch.zeros(n_layers, 1, d))
            self.dec_w = nn.Parameter(torch.randn(n_layers, d, hidden_size) / d ** 0.5)
            self.dec_b = nn.Parameter(torch.zeros(n_layers, 1, hidden_size))
            self.head = _make_head(n_layers, cfg.hidden)

        def encode(self, x):  # x [L, B, H] -> [L, B, d]
            return torch.tanh(torch.einsum("lbh,lhd->lbd", (x - self.vmu) / self.vsd, self.w) + self.b)

        def reconstruct(self, x):
            z = self.encode(x)
            return torch.einsum("lbd,ldh->lbh", z, self.dec_w) + self.dec_b, (x - self.vmu) / self.vsd

        def cosines(self, a, b):  # -> [B, L]
            return F.cosine_similarity(self.encode(a), self.encode(b), dim=-1).transpose(0, 1)

        def forward(self, a, b):
            return self.head(self.cosines(a, b)).squeeze(-1)

    return CosineMLP() if kind == "cosine-mlp" else Siamese()


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        return -1.0
    return float(np.corrcoef(x, y)[0, 1])


def train_probe(train: PairSplit, test: PairSplit, cfg: ProbeConfig, *, dev: PairSplit | None = None,
                unlabeled: np.ndarray | None = None, say=lambda m: None) -> dict[str, Any]:
    """Train one probe; return its test predictions and a record of the training.

    ``unlabeled`` (``[layers, m, hidden]``) feeds the siamese autoencoder pretraining.
    """
    import torch

    cfg.check()
    n_layers, _, hidden_size = train.a.shape
    lo, hi = float(train.y.min()), float(train.y.max())
    if hi <= lo:
        raise InputError("the train split's scores are all equal; a probe cannot learn from them")

    def scaled(y):
        return torch.as_tensor((y - lo) / (hi - lo), dtype=torch.float32)

    feats_train = layer_cosines(train.a, train.b)
    feat_mean = feats_train.mean(0)
    feat_std = np.where(feats_train.std(0) > 1e-8, feats_train.std(0), 1.0)
    both = np.concatenate([train.a, train.b], axis=1)
    vec_mean = both.mean(axis=1, keepdims=True)
    vec_std = np.maximum(both.std(axis=(1, 2), keepdims=True), 1e-8)
    del both

    def inputs(split: PairSplit):
        if cfg.kind == "cosine-mlp":
            return (torch.as_tensor(layer_cosines(split.a, split.b), dtype=torch.float32),)
        return torch.as_tensor(split.a), torch.as_tensor(split.b)

    record: dict[str, Any] = {"config": asdict(cfg), "train_pairs": int(train.y.shape[0]),
                              "dev_pairs": int(dev.y.shape[0]) if dev is not None else 0,
                              "layers": n_layers}
    with _deterministic(cfg.seed):
        gen = torch.Generator().manual_seed(cfg.seed)
        model = _build(cfg.kind, n_layers, hidden_size, cfg, feat_mean, feat_std, vec_mean, vec_std)
        if cfg.kind == "siamese" and cfg.pretrain:
            if unlabeled is None or unlabeled.shape[1] == 0:
                raise InputError("--pretrain needs unlabeled sentences (the train sentences are used)")
            record["pretrain"] = _pretrain(model, torch.as_tensor(unlabeled), cfg, gen)
            say(f"probe {cfg.kind}: autoencoders pretrained, reconstruction loss "
                f"{record['pretrain']['first_loss']:.4f} -> {record['pretrain']['last_loss']:.4f}")
        opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        x_train = inputs(train)
        y_train = scaled(train.y)
        x_dev = inputs(dev) if dev is not None else None
        n = y_train.shape[0]
        best = (-2.0, None, 0)
        history = []
        for epoch in track(range(1, cfg.epochs + 1), f"probe {cfg.kind}: epochs (at most)"):
            model.train()
            order = torch.randperm(n, generator=gen)
            total = 0.0
            for s in range(0, n, cfg.batch_size):
                idx = order[s:s + cfg.batch_size]
                if idx.numel() < 2:
                    continue
                batch = [x[idx] if x.dim() == 2 else x[:, idx] for x in x_train]
                loss = _loss(model(*batch), y_train[idx], cfg.loss)
                opt.zero_grad()
                loss.backward()
                opt.step()
                total += loss.item() * idx.numel()
            entry = {"epoch": epoch, "train_loss": total / n}
            if x_dev is not None:
                model.eval()
                with torch.no_grad():
                    dev_pred = model(*x_dev).numpy()
                r = _pearson(dev_pred, dev.y)
                entry["dev_pearson"] = r
                if r > best[0]:
                    best = (r, {k: v.detach().clone() for k, v in model.state_dict().items()}, epoch)
                elif epoch - best[2] >= cfg.patience:
                    history.append(entry)
                    break
            history.append(entry)
        if x_dev is not None and best[1] is not None:
            model.load_state_dict(best[1])
            record["best_epoch"] = best[2]
            record["best_dev_pearson"] = best[0]
        else:
            record["best_epoch"] = history[-1]["epoch"]
        record["epochs_run"] = history[-1]["epoch"]
        record["history"] = history
        model.eval()
        with torch.no_grad():
            pred = model(*inputs(test)).numpy().astype(np.float64)
    record["test_predictions"] = pred
    return record


def _pretrain(model, unlabeled, cfg: ProbeConfig, gen) -> dict[str, float]:
    import torch

    params = [model.w, model.b, model.dec_w, model.dec_b]
    opt = torch.optim.Adam(params, lr=cfg.lr)
    m = unlabeled.shape[1]
    losses = []
    for _ in track(range(cfg.pretrain_epochs), "probe siamese: autoencoder pretraining epochs"):
        order = torch.randperm(m, generator=gen)
        total = 0.0
        for s in range(0, m, cfg.batch_size):
            idx = order[s:s + cfg.batch_size]
            recon, target = model.reconstruct(unlabeled[:, idx])
            loss = torch.mean((recon - target) ** 2)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item() * idx.numel()
        losses.append(total / m)
    return {"epochs": cfg.pretrain_epochs, "first_loss": losses[0], "last_loss": losses[-1],
            "sentences": int(m)}

"""Steering vectors: a direction estimated at each layer from contrastive pairs, added at that layer to held-out
texts on any engine that writes states (engines/resume.py), its effect read off the end.

* estimate (``pooled_by_layer``, ``estimate``): each training pair's positive and negative text pooled at every
  layer (the run's pooling); the vector at layer j is the mean of positive - negative (``mean_diff``) or the
  first principal component of those differences (``pca``, metrics/intervention.py), or one given (``--vector``:
  ``[hidden]`` for every layer, ``[L+1, hidden]`` one per layer).
* apply (``steer``): the held-out texts' state at layer j plus ``scale x vector`` at every real token; layers
  j+1..L run from there; for each scale and for a random direction of the same norm (the null: one direction per
  layer and held-out text, drawn from the run's seed, so the null's interval over the texts spans the directions
  too, not one draw's luck), copies of a batch run together.
* read (``Readout``): the final embedding (the run's pooling of layer L) moved along the final layer's
  positive-minus-negative direction, as a share of the distance between the two classes' means there
  (``projection``: 1 = moved as far as from the negative mean to the positive one); the change of its cosine
  margin to the training texts (``probe``: mean cosine to the positives minus to the negatives); for a decoder,
  the next token's distribution at the last token moved away from the unsteered one (``kl``, nats).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from layerscope.decoding.readout import cosines, last_positions, pooled, tiled
from layerscope.errors import InputError

METHODS = ("mean_diff", "pca")
KINDS = ("steer", "random")


def pooled_by_layer(engine, texts: list[str], pooling: str, rows: int = 32) -> np.ndarray:
    """Every layer's pooled vector of ``texts``: float64 ``[L+1, n, hidden]``."""
    names = [str(i) for i in range(engine.manifest.num_layers + 1)]
    enc = engine.encoder()
    out = []
    for start in range(0, len(texts), rows):
        batch = enc(texts[start:start + rows])
        states = engine.run_tokens(batch, names)
        out.append(np.stack([pooled(engine.manifest, batch, s, pooling) for s in states]))
    return np.concatenate(out, axis=1)


def estimate(positive: np.ndarray, negative: np.ndarray, method: str) -> np.ndarray:
    """The steering vector of each layer from paired pooled vectors (``[L+1, n, hidden]`` each): ``[L+1, hidden]``."""
    from layerscope.metrics.intervention import mean_difference, pca_direction

    pick = mean_difference if method == "mean_diff" else pca_direction
    return np.stack([pick(p, n) for p, n in zip(positive, negative)])


def read_vector(path, num_layers: int, hidden_size: int) -> np.ndarray:
    """A steering vector from a ``.npy`` file (no pickle): ``[hidden]`` (every layer) or ``[L+1, hidden]``; one line
    for another width or shape, before any model runs it."""
    from pathlib import Path

    path = Path(path)
    if not path.is_file():
        raise InputError(f"--vector {path}: no such file")
    try:
        v = np.load(path, allow_pickle=False)
    except (ValueError, OSError) as exc:
        raise InputError(f"--vector {path}: not a .npy array ({str(exc).splitlines()[0][:120]})") from None
    if v.dtype.kind not in "fiu" or not np.all(np.isfinite(v)):
        raise InputError(f"--vector {path}: holds {v.dtype} values or non-finite ones; give finite numbers")
    if v.ndim == 1 and v.shape[0] == hidden_size:
        return np.tile(v.astype(np.float64), (num_layers + 1, 1))
    if v.ndim == 2 and v.shape == (num_layers + 1, hidden_size):
        return v.astype(np.float64)
    raise InputError(f"--vector {path}: a vector of shape {v.shape} cannot be added to this model's states: give "
                     f"[{hidden_size}] (every layer) or [{num_layers + 1}, {hidden_size}] (layers 0..{num_layers})")


@dataclass
class Readout:
    """What the end of a steered run is judged by (see the module docstring)."""

    manifest: object
    pooling: str
    direction: np.ndarray  # unit: the final layer's positive-minus-negative direction
    gap: float  # the distance between the classes' final means along it
    positives: np.ndarray  # the training texts' final embeddings, [n, hidden]
    negatives: np.ndarray
    head: object = None  # a decoder's head (decoding/head_graph.py): the next token's distribution

    def embeddings(self, batch, final: np.ndarray) -> np.ndarray:
        return pooled(self.manifest, batch, final, self.pooling)

    def margin(self, emb: np.ndarray) -> np.ndarray:
        pos = np.mean([cosines(emb, p) for p in self.positives], axis=0)
        neg = np.mean([cosines(emb, n) for n in self.negatives], axis=0)
        return pos - neg

    def logits(self, batch, final: np.ndarray) -> np.ndarray | None:
        if self.head is None:
            return None
        last = last_positions(batch.mask)
        return self.head.logits(final[np.arange(len(final)), last], self.head.num_layers)


def readout_of(manifest, pooling: str, final_pos: np.ndarray, final_neg: np.ndarray, head=None) -> Readout:
    """The readout from the training pairs' final embeddings (``[n, hidden]`` each)."""
    gap_vec = final_pos.mean(axis=0) - final_neg.mean(axis=0)
    gap = float(np.linalg.norm(gap_vec))
    if gap == 0:
        raise InputError("the positive and negative texts have the same mean final embedding; there is no "
                         "direction between them to measure steering along")
    return Readout(manifest, pooling, gap_vec / gap, gap, final_pos, final_neg, head)


@dataclass
class SteerResult:
    """Per kind (steer, random), layer, scale and held-out text: each figure's change from the unsteered run."""

    layers: list[int]
    scales: list[float]
    norms: np.ndarray  # ||vector|| per layer (the random directions' too)
    nulls: np.ndarray  # the random direction added to each held-out text at each layer: [L+1, texts, hidden]
    projection: np.ndarray  # [kinds, layers, scales, texts]
    probe: np.ndarray
    kl: np.ndarray | None  # decoders
    runs: int = 0
    rows: int = 0
    base_projection: np.ndarray = field(default_factory=lambda: np.zeros(0))  # per text, unsteered


def steer(engine, texts: list[str], vectors: np.ndarray, layers: list[int], scales: list[float], readout: Readout, *,
          seed: int, rows: int = 64, bar: Callable[[int], None] | None = None) -> SteerResult:
    """Add ``scale x vectors[j]`` (and a random direction of the same norm, its own for each text) at each layer j
    of ``texts``."""
    from layerscope.metrics.intervention import kl_divergence, random_direction

    num_layers = engine.manifest.num_layers
    hidden = engine.manifest.hidden_size
    rng = np.random.default_rng(seed)
    norms = np.linalg.norm(vectors, axis=1)
    n, s = len(texts), len(scales)
    # drawn per (layer, text) in that order whatever the batch size, so --batch never changes a figure
    nulls = np.stack([[random_direction(hidden, norm, rng) for _ in range(n)] for norm in norms])
    shape = (len(KINDS), len(layers), s, n)
    projection, probe = np.zeros(shape), np.zeros(shape)
    kl = np.zeros(shape) if readout.head is not None else None
    result = SteerResult(list(layers), list(scales), norms, nulls, projection, probe, kl)
    enc = engine.encoder()
    names = [str(i) for i in range(num_layers + 1)]
    per_batch = max(1, int(rows) // (len(KINDS) * s))
    base_proj = []
    for start in range(0, n, per_batch):
        batch = enc(texts[start:start + per_batch])
        b = batch.size
        states = engine.run_tokens(batch, names)
        base = readout.embeddings(batch, states[num_layers])
        base_logits = readout.logits(batch, states[num_layers])
        base_proj.append(base @ readout.direction)
        copies = tiled(batch, np.tile(np.arange(b), len(KINDS) * s))
        mask = np.asarray(copies.mask, dtype=np.float32)[..., None]
        for li, layer in enumerate(layers):
            # one row per copy, in the copies' order (kind, scale, text): the vector, or each text's own null
            own = (np.broadcast_to(vectors[layer], (b, hidden)), nulls[layer, start:start + b])
            adds = np.concatenate([scale * d for d in own for scale in scales]).astype(np.float32)
            state = np.tile(states[layer], (len(KINDS) * s, 1, 1)) + adds[:, None, :] * mask
            final = engine.resume(copies, layer, state, [num_layers])[0]
            emb = readout.embeddings(copies, final).reshape(len(KINDS), s, b, -1)
            moved = (emb - base[None, None]) @ readout.direction / readout.gap
            projection[:, li, :, start:start + b] = moved
            probe[:, li, :, start:start + b] = (readout.margin(emb.reshape(-1, emb.shape[-1])).reshape(len(KINDS), s, b)
                                                - readout.margin(base)[None, None])
            if kl is not None:
                logits = readout.logits(copies, final).reshape(len(KINDS), s, b, -1)
                kl[:, li, :, start:start + b] = kl_divergence(base_logits[None, None], logits)
            result.runs += int(layer < num_layers)
            result.rows += len(copies.mask)
            if bar is not None:
                bar(b * len(KINDS) * s)
    result.base_projection = np.concatenate(base_proj)
    return result

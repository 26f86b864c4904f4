"""similarity's indices beyond CKA (SVCCA, PWCCA, Procrustes, RSA) and every index's permutation-calibrated
score, between every layer of A and every layer of B (metrics/representation.py defines them).

They read one seeded sample of at most ``max_rows`` rows (all of them when fewer; the same rows on both
sides), each layer prepared once; the same K row permutations serve every layer pair, so the best pair (the
maximum over pairs) is calibrated against the maximum of the null over pairs (Groger et al.'s aggregation)
as well as each pair on its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from layerscope.errors import InputError
from layerscope.progress import track

EXTRA = ("svcca", "pwcca", "procrustes", "rsa")  # computed here only (CKA and k-NN have their own raw matrices)
CALIBRATED = ("linear_cka", "debiased_cka", "mutual_knn", *EXTRA)
ALPHA = 0.05


def parse_indices(text: str) -> tuple[str, ...]:
    """``--indices``: a comma list of EXTRA names, ``all`` or ``none``."""
    if text.strip() in ("all", ""):
        return EXTRA
    if text.strip() == "none":
        return ()
    asked = tuple(t.strip() for t in text.split(",") if t.strip())
    bad = [t for t in asked if t not in EXTRA]
    if bad:
        from layerscope.errors import unknown_name

        raise unknown_name("--indices", bad[0], EXTRA + ("all", "none"))
    return asked


def sample_rows(n: int, max_rows: int, seed: int) -> np.ndarray:
    rows = np.arange(n)
    if n > max_rows:
        rows = np.sort(np.random.default_rng(seed).choice(n, max_rows, replace=False))
    return rows


@dataclass
class Side:
    """One model's layers as the indices read them: each layer prepared, and its k-NN lists."""

    prepared: dict[str, Any]
    neighbors: dict[str, np.ndarray]


def prepare_side(get, layers: list[str], rows: np.ndarray, *, k: int, rdm: str, what: str) -> Side:
    from layerscope.metrics.neighbors import knn_indices
    from layerscope.metrics.representation import prepare

    prepared, nbrs = {}, {}
    for layer in track(layers, f"similarity indices: preparing the layers of {what}"):
        x = np.asarray(get(layer)[rows], dtype=np.float64)
        try:
            prepared[layer] = prepare(x, rdm=rdm)
        except ValueError:  # a layer without variance (a constant raw lookup): every index undefined there
            prepared[layer] = None
        if k:
            nbrs[layer] = knn_indices(x, k)
    return Side(prepared, nbrs)


SHARED = ("svcca", "pwcca", "procrustes")  # computed together from one product per permutation


def _scores(names, a, b, na, nb, perm) -> dict[str, float]:
    """Every asked index of one layer pair, Y's rows in ``perm`` order (None: as they are); an index undefined
    there is left out."""
    from layerscope.metrics.neighbors import mutual_knn
    from layerscope.metrics.representation import SCORES, permuted_neighbors, shared_scores

    out: dict[str, float] = {}
    if "mutual_knn" in names and na is not None and nb is not None:
        out["mutual_knn"] = mutual_knn(na, nb if perm is None else permuted_neighbors(nb, perm))
    if a is None or b is None:
        return out
    shared = [k for k in names if k in SHARED]
    if shared:
        out.update(shared_scores(a, b, perm, shared))
    for name in names:
        if name not in out and name != "mutual_knn":
            try:
                out[name] = SCORES[name](a, b, perm)
            except ValueError:  # undefined here (e.g. a self-HSIC that is not positive)
                pass
    return out


def index_matrices(side_a: Side, layers_a: list[str], side_b: Side, layers_b: list[str], *, names: tuple[str, ...],
                   perms: np.ndarray, same: bool) -> dict[str, Any]:
    """Per index: the raw matrix (Procrustes as its distance), the calibrated one and the p-values, and the
    best pair calibrated against the null of the maximum over pairs."""
    from layerscope.metrics.representation import calibrate

    shape = (len(layers_a), len(layers_b))
    raw = {k: np.full(shape, np.nan) for k in names}
    cal = {k: np.full(shape, np.nan) for k in names}
    pv = {k: np.full(shape, np.nan) for k in names}
    nulls = {k: np.full(shape + (len(perms),), np.nan) for k in names}
    pairs = [(i, j) for i in range(shape[0]) for j in range(shape[1]) if not same or j >= i]
    for i, j in track(pairs, "similarity indices: layer pairs and their permutation nulls"):
        la, lb = layers_a[i], layers_b[j]
        args = (side_a.prepared[la], side_b.prepared[lb], side_a.neighbors.get(la), side_b.neighbors.get(lb))
        observed = _scores(names, *args, None)
        null = [_scores(list(observed), *args, p) for p in perms]
        for name, score in observed.items():
            spots = [(i, j), (j, i)] if same else [(i, j)]
            values = [row.get(name, np.nan) for row in null]
            c = calibrate(score, values, alpha=ALPHA) if len(perms) else None
            for spot in spots:
                raw[name][spot] = 2.0 - 2.0 * score if name == "procrustes" else score
                nulls[name][spot] = values
                if c is not None:
                    cal[name][spot], pv[name][spot] = c.calibrated, c.p_value
    out: dict[str, Any] = {}
    for name in names:
        out[name] = raw[name]
        out[f"{name}_calibrated"] = cal[name] if len(perms) else None
        out[f"{name}_p"] = pv[name] if len(perms) else None
        out[f"{name}_best"] = _best(name, raw[name], nulls[name], layers_a, layers_b, same) if len(perms) else None
    return out


def _best(name: str, raw: np.ndarray, nulls: np.ndarray, layers_a, layers_b, same: bool) -> dict[str, Any] | None:
    """The best layer pair (off the diagonal when one model is compared with itself) and its score
    calibrated against the maximum over the same pairs under each permutation."""
    from layerscope.metrics.representation import calibrate

    score = 1.0 - raw / 2.0 if name == "procrustes" else raw
    mask = np.isfinite(score)
    if same:
        mask &= ~np.eye(len(layers_a), dtype=bool)
    if not mask.any():
        return None
    i, j = np.unravel_index(np.argmax(np.where(mask, score, -np.inf)), score.shape)
    null_max = np.nanmax(np.where(mask[..., None], nulls, -np.inf), axis=(0, 1))
    c = calibrate(float(score[i, j]), null_max, alpha=ALPHA)
    return {"layer_a": layers_a[i], "layer_b": layers_b[j], "score": float(score[i, j]),
            "calibrated": c.calibrated, "p": c.p_value, "tau": c.tau}


def check_rows(o, n: int) -> None:
    if o.permutations < 0:
        raise InputError(f"--permutations must be >= 0, got {o.permutations}")
    if o.max_rows < 4:
        raise InputError(f"--max-rows must be at least 4, got {o.max_rows}")


def as_rows(figs: dict[str, Any], names: tuple[str, ...], layers_a, layers_b) -> list[dict[str, Any]]:
    """One row per layer pair: each index's raw score, calibrated score and p-value."""
    rows = []
    for i, la in enumerate(layers_a):
        for j, lb in enumerate(layers_b):
            row: dict[str, Any] = {"layer_a": la, "layer_b": lb}
            for name in names:
                for key in (name, f"{name}_calibrated", f"{name}_p"):
                    m = figs.get(key)
                    row[key] = None if m is None or not np.isfinite(m[i, j]) else float(m[i, j])
            rows.append(row)
    return rows


def check_same_tokens(a_label: str, a_offsets, a_ids, b_label: str, b_offsets, b_ids) -> None:
    """Token rows correspond only where both sides cut every text into the same tokens: one line naming the
    first text where they differ."""
    a_off, b_off = np.asarray(a_offsets), np.asarray(b_offsets)
    if np.array_equal(a_off, b_off) and np.array_equal(np.asarray(a_ids), np.asarray(b_ids)):
        return
    counts_a, counts_b = np.diff(a_off), np.diff(b_off)
    text = next((i for i in range(min(len(counts_a), len(counts_b)))
                 if counts_a[i] != counts_b[i] or not np.array_equal(a_ids[a_off[i]:a_off[i + 1]],
                                                                    b_ids[b_off[i]:b_off[i + 1]])), 0)
    raise InputError(f"{a_label} and {b_label} cut text {text} into different tokens, so their token rows do not "
                     "correspond; compare token vectors of models that share a tokenizer, or pooled vectors")

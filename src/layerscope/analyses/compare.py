"""Several models in one run: a side-by-side table of the main score and paired model-vs-model tests.

An analysis hands over, per model, the rows of its main per-layer score (:func:`model_rows`, returned by
``compute`` in its ``ModelOutput``) with the score as a function of the items it was computed on; its
``combine`` then calls :func:`compare_models` with the models' outputs, which

* lines the models up, one row per layer when they have the same depth, else one row per relative depth
  (the shallower model's layers ``k / L_min``; a deeper model takes its layer nearest that depth), with each
  model's layer, score and 95% interval in its own columns (table ``side_by_side``);
* for every pair of models, scores both on the *same* resampled items (``metrics.paired``): each model's best
  layer (among its layers with a defined score; ties are named in the notes) against the other's, and every
  matched row of the side-by-side table; the difference, its 95% interval and the two-sided p-value read from
  the same bootstrap distribution, and the p-value adjusted by Holm over every test of the run
  (table ``model_comparison``).

The figures are computed here, at run time, and saved in ``results.json``; reports only render them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any, Callable

import numpy as np

_INDEX_BUDGET = 4_000_000  # resampled item indices (times what a scorer builds from them) held at once


@dataclass
class ScoreRow:
    group: str  # what else the row is split by: a pooling, a task and pooling, ...
    layer: str  # a layer name ("raw", "0" ... "L") or a named choice ("last4")
    value: float | None  # the main score as the analysis's own table reports it
    ci: tuple[float | None, float | None] | None = None  # its 95% interval, where the analysis made one
    scorer: Callable[[np.ndarray], np.ndarray] | None = None  # the score on given item indices
    cost: int = 1  # elements a scorer builds per resampled item (n for a Gram matrix): bounds the batch
    bootstrap_ci: bool = False  # no interval from the analysis: bootstrap one from the scorer for the table


@dataclass
class ModelRows:
    num_layers: int
    n_items: int
    rows: list[ScoreRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def model_rows(num_layers: int, n_items: int, rows: list[ScoreRow], notes: list[str] | None = None) -> ModelRows:
    """One model's score rows, for ``compute`` to return in its ``ModelOutput.compare``."""
    return ModelRows(int(num_layers), int(n_items), rows, list(notes or []))


def correlation_rows(num_layers: int, rows: list[dict], sims: dict, targets, *, n_items=None,
                     value: str = "spearman", group: str = "pooling") -> ModelRows:
    """Rows of a similarity-vs-human-score table (sts, pooling): ``sims[group, layer]`` are the per-pair
    similarities the row's ``value`` correlates with ``targets``."""
    from layerscope.metrics.paired import correlation_scorer

    kept = []
    for r in rows:
        key = (r[group], r["layer"])
        ci = (r.get(f"{value}_ci_low"), r.get(f"{value}_ci_high"))
        scorer = correlation_scorer(sims[key], targets, value) if r.get(value) is not None else None
        kept.append(ScoreRow(str(r[group]), str(r["layer"]), r.get(value), ci, scorer))
    return model_rows(num_layers, len(targets) if n_items is None else n_items, kept)


GRAM_MAX_PAIRS = 500  # above this, a z resample costs too much (n x n per resample): z is shown, not tested


def z_rows_for_comparison(num_layers: int, rows: list[dict], vecs, pooling: str, n: int) -> ModelRows:
    """Alignment rows of one pooling: z with exact permutation moments, resampled through the pairs' Gram matrix."""
    from layerscope.metrics.paired import gram_z_scorer

    kept, notes = [], []
    for r in rows:
        scorer = None
        if n <= GRAM_MAX_PAIRS and r.get("z_exact") is not None:
            v = np.asarray(vecs[pooling, r["layer"]], dtype=np.float64)
            unit = v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)
            scorer = gram_z_scorer(unit[:n] @ unit[n:].T)
        kept.append(ScoreRow(pooling, str(r["layer"]), r.get("z_exact"), None, scorer, cost=n, bootstrap_ci=True))
    if n > GRAM_MAX_PAIRS:
        notes.append(f"z is compared across models only up to {GRAM_MAX_PAIRS} pairs (each resample needs the "
                     f"pairs' n x n cosines); this run has {n}, so the table shows z without intervals or tests")
    return model_rows(num_layers, n, kept, notes)


def _depth_layer(k: int, l_min: int, num_layers: int) -> str:
    return str(int(math.floor(k * num_layers / l_min + 0.5)))


def _aligned(models: dict[str, ModelRows]) -> tuple[str, list[dict[str, Any]]]:
    """Rows of the side-by-side table: ``{"group", "depth", model: ScoreRow | None}``."""
    names = list(models)
    depths = {m.num_layers for m in models.values()}
    if not any(r.layer.lstrip("-").isdigit() for m in models.values() for r in m.rows):
        depths = {0}  # only named choices (final, last4, ...): matched by name whatever the depths
    index = {name: {(r.group, r.layer): r for r in m.rows} for name, m in models.items()}
    first = models[names[0]]
    groups = list(dict.fromkeys(r.group for r in first.rows))
    out: list[dict[str, Any]] = []
    if len(depths) == 1:
        for r in first.rows:
            out.append({"group": r.group, "depth": r.layer, **{n: index[n].get((r.group, r.layer)) for n in names}})
        return "layer", out
    l_min = min(depths)
    for g in groups:
        layers = [r.layer for r in first.rows if r.group == g]
        named = [x for x in layers if not x.lstrip("-").isdigit()]
        for x in named:  # raw, last4, ...: the same choice in every model
            out.append({"group": g, "depth": x, **{n: index[n].get((g, x)) for n in names}})
        for k in range(l_min + 1):
            row = {"group": g, "depth": f"{k / l_min:.2f}"}
            for n, m in models.items():
                row[n] = index[n].get((g, _depth_layer(k, l_min, m.num_layers)))
            if any(row[n] is not None for n in names):
                out.append(row)
    return "relative depth", out


def _needs_interval(r: ScoreRow | None) -> bool:
    return bool(r and r.bootstrap_ci and r.scorer and r.ci is None and r.value is not None)


def _is_layer(r: ScoreRow) -> bool:
    return r.layer.isdigit()


def best_rows(rows: list[ScoreRow]) -> tuple[ScoreRow | None, list[ScoreRow], int]:
    """The best row among the model's layers (``0``..``L``, not the raw embeddings nor a named choice) whose
    score is defined, the rows that tie it, and how many rows were candidates. With several tied, the
    shallowest stands for them and the others are listed."""
    defined = [r for r in rows if _is_layer(r) and r.scorer is not None and r.value is not None
               and math.isfinite(r.value)]
    if not defined:
        return None, [], 0
    top = max(r.value for r in defined)
    tied = [r for r in defined if r.value == top]
    return tied[0], tied[1:], len(defined)


def _tie_note(name: str, best: ScoreRow, others: list[ScoreRow], candidates: int) -> str | None:
    if not others:
        return None
    layers = ", ".join(f"{r.group} {r.layer}" for r in [best, *others])
    every = " (every layer)" if len(others) + 1 == candidates else ""
    return (f"{name}: {len(others) + 1} layers tie for best{every} at {best.value:.4f} ({layers}); "
            f"'best of each' uses {best.group} {best.layer}")


def compare_models(per_model: dict[str, Any], *, score: str, score_label: str, group_label: str = "pooling",
                   n_resamples: int = 1000, seed: int = 0, say=None) -> dict[str, Any]:
    """The ``combined`` part for several models: ``{"comparison": meta, "tables": {side_by_side, model_comparison}}``.

    Empty for one model (or when the analysis kept no rows for every model). ``per_model``: the ``PerModel``
    that ``combine`` is handed (each model's figures, with the ``ModelOutput`` that holds its rows).
    """
    from layerscope.metrics.paired import holm, one_sample_interval, paired_bootstrap
    from layerscope.progress import steps, track

    names = list(per_model)
    outputs = getattr(per_model, "outputs", {})
    kept = [outputs[n].compare for n in names if n in outputs and outputs[n].compare is not None]
    if len(names) < 2 or len(kept) != len(names):
        return {}
    models = dict(zip(names, kept))
    n_items = {m.n_items for m in models.values()}
    if len(n_items) != 1:  # cannot happen within one run (every model sees the same data); say so if it does
        return {"comparison": {"skipped": f"the models were scored on different numbers of items ({sorted(n_items)})"}}
    n = n_items.pop()
    by, aligned = _aligned(models)
    side = []
    todo = [a[name] for a in aligned for name in names if n_resamples and _needs_interval(a[name])]
    for r in track(todo, "intervals of the side-by-side table"):
        r.ci = one_sample_interval(r.scorer, n, n_resamples=n_resamples, seed=seed,
                                   batch=max(1, _INDEX_BUDGET // max(1, n * r.cost)))
    for a in aligned:
        row: dict[str, Any] = {group_label: a["group"], by: a["depth"]}
        for name in names:
            r = a[name]
            row[f"{name} layer"] = r.layer if r else None
            row[f"{name} {score}"] = r.value if r else None
            row[f"{name} ci_low"] = r.ci[0] if r and r.ci else None
            row[f"{name} ci_high"] = r.ci[1] if r and r.ci else None
        side.append(row)
    jobs: list[tuple[str, str, str, ScoreRow, ScoreRow]] = []
    best = {name: best_rows(models[name].rows) for name in names}
    tie_notes = [t for name in names if best[name][0] for t in [_tie_note(name, *best[name])] if t]
    for a_name, b_name in combinations(names, 2):
        ba, bb = best[a_name][0], best[b_name][0]
        if ba and bb:
            jobs.append(("best of each", a_name, b_name, ba, bb))
        for a in aligned:
            ra, rb = a[a_name], a[b_name]
            if ra and rb and ra.scorer and rb.scorer and ra.value is not None and rb.value is not None:
                what = ("same layer" if by == "layer" else f"depth {a['depth']}"
                        if a["depth"].replace(".", "").isdigit() else f"same layer ({a['depth']})")
                jobs.append((what, a_name, b_name, ra, rb))
    pairs = []
    with steps("comparing models (paired bootstrap)", len(jobs)) as bar:
        for what, a_name, b_name, ra, rb in jobs:
            cost = max(ra.cost, rb.cost)
            batch = max(1, min(n_resamples, _INDEX_BUDGET // max(1, n * cost))) if n_resamples else None
            row = {"comparison": what, "model_a": a_name, f"{group_label}_a": ra.group, "layer_a": ra.layer,
                   "model_b": b_name, f"{group_label}_b": rb.group, "layer_b": rb.layer}
            if what == "best of each":
                row["tied_a"] = ", ".join(r.layer for r in best[a_name][1]) or None  # layers tying the best
                row["tied_b"] = ", ".join(r.layer for r in best[b_name][1]) or None
            if n_resamples:
                res = paired_bootstrap(ra.scorer, rb.scorer, n, n_resamples=n_resamples, seed=seed, batch=batch)
                row.update({f"{score}_a": res.score_a, f"{score}_b": res.score_b, "difference": res.difference,
                            "ci_low": res.ci_low, "ci_high": res.ci_high, "p_value": res.p_value,
                            "resamples_dropped": res.dropped})
            else:
                row.update({f"{score}_a": ra.value, f"{score}_b": rb.value, "difference": ra.value - rb.value,
                            "ci_low": None, "ci_high": None, "p_value": None})
            pairs.append(row)
            bar.advance()
    for row, adjusted in zip(pairs, holm([r.get("p_value") for r in pairs])):
        row["p_holm"] = adjusted
    tested = sum(1 for r in pairs if r.get("p_value") is not None)
    notes = list(dict.fromkeys(note for m in models.values() for note in m.notes)) + tie_notes
    meta = {"notes": notes, "models": names, "score": score, "score_label": score_label, "group_label": group_label,
            "by": by, "num_layers": {k: m.num_layers for k, m in models.items()}, "n_items": n,
            "n_resamples": n_resamples,
            "seed": seed, "confidence_level": 0.95,
            "method": "paired percentile bootstrap (scipy.stats.bootstrap, paired=True): both models scored on the "
            "same resampled items; the 95% interval and the two-sided p are read from the same bootstrap "
            "differences, so the interval excludes 0 exactly when p < 0.05",
            "correction": f"Holm over the {tested} tests of this run" if tested else None}
    if say:
        say(f"compared {len(names)} models: {len(pairs)} paired bootstrap test(s) over {n} items")
    return {"comparison": meta, "tables": {"side_by_side": side, "model_comparison": pairs}}


def merge_combined(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``base`` (an analysis's own combined figures) with the comparison's keys and tables added."""
    if not extra:
        return base
    out = {**base, **{k: v for k, v in extra.items() if k != "tables"}}
    if extra.get("tables"):
        out["tables"] = {**(base.get("tables") or {}), **extra["tables"]}
    return out

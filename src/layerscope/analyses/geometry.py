"""geometry: the shape of each layer's vectors, beside the same texts with their tokens shuffled.

Per layer (metrics/geometry.py defines each figure and its known biases):

* intrinsic dimension of the texts' pooled vectors (one point per text): TwoNN (as scikit-dimension fits it)
  and GRIDE at neighbours ``(n1, 2 n1)`` (as DADApy computes it);
* anisotropy: the mean cosine between tokens of different texts, raw and after removing the tokens' mean
  (on a seeded sample of at most ``--max-tokens`` non-special tokens);
* per prompt (a text's non-special tokens): effective rank and the matrix entropy of its token Gram matrix
  (Skean et al. 2025), averaged over texts.

The control: every text again with its non-special tokens in a seeded random order (the same tokens, the same
count, so the same bounds), through the same model. What a figure keeps under shuffling is a property of the
bag of tokens; what it loses needed their order. Every figure is drawn beside its control, never alone.

Intervals: 95% percentile bootstrap over texts (``scipy.stats.bootstrap``, 1000 resamples, seeded). For the
intrinsic dimension the texts' distance ratios are resampled (each text's ratio from its neighbours among all
the texts) and the estimator fitted again on them: a resample of the points themselves would repeat points
(no nearest-neighbour distance) or thin them (another scale), which biases the estimators.

Texts: ``--data``, else the English side of the built-in zh-en problems. The model runs twice over them (texts,
shuffled), a chunk at a time (extraction/token_embed.py), so what is held is one chunk's token vectors, the
pooled vectors and the token sample.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from layerscope.analyses.base import Analysis, AnalysisMetadata, Context, ModelRun, Option, register
from layerscope.errors import InputError
from layerscope.report.figures import Curve, Figures, Line, Table

TABLE = "geometry_layers"
CONDITIONS = ("", "_shuffled")  # the texts, and the control
ID_BOOT = "bootstrap-percentile of the estimator over the texts' distance ratios"

_ID_BIAS = ("Biases: underestimates a dimension large against log(texts); overestimates under noise at the scale "
            "it reads; the usual estimators misread data with several scales (Schulte & Rugamer 2026).")
_CURVES = (
    ("twonn", "intrinsic dimension (TwoNN)", "TwoNN",
     "TwoNN (Facco et al. 2017) of the texts' pooled vectors (the run's pooling), one point per text: the slope of "
     "-log(1 - F) against log(r2 / r1), 10% largest ratios left out, as scikit-dimension fits it. It reads the "
     "smallest scale, where noise inflates it. " + _ID_BIAS),
    ("gride", "intrinsic dimension (GRIDE)", "GRIDE",
     "GRIDE (Denti et al. 2022) at neighbours (n1, 2 n1) (--gride-n1) of the texts' pooled vectors, the "
     "maximum likelihood of r_n2 / r_n1 with DADApy's conventions; a larger scale than TwoNN's, less moved by "
     "noise, more by curvature. " + _ID_BIAS),
    ("anisotropy", "anisotropy (mean cosine)", "mean cosine",
     "Mean cosine between tokens of different texts (Ethayarajh 2019), exact over every pair of a seeded sample "
     "of tokens (--max-tokens, special tokens left out): near 1 when every vector shares one direction, which a few large dimensions can set "
     "alone (Timkey & van Schijndel 2021)."),
    ("anisotropy_centered", "anisotropy after removing the mean", "mean cosine",
     "The same mean cosine after subtracting the tokens' mean vector: what is left once the common direction is "
     "gone (about 0 for isotropic vectors)."),
    ("effective_rank", "effective rank per prompt", "effective rank",
     "Effective rank (Roy & Vetterli 2007) of each text's token matrix, exp of the entropy of its L1-normalised "
     "singular values, averaged over texts; at most the text's token count, so it grows with length; "
     "uncentred, a common direction lowers it."),
    ("entropy", "matrix entropy per prompt", "entropy (nats)",
     "Matrix entropy of order alpha (--alpha; 1: Shannon) of each text's token Gram matrix (Skean et al. 2025), eigenvalues over the "
     "trace, averaged over texts; at most log(tokens), so it grows with length; uncentred, anisotropy lowers it."),
)


def _curve(key: str, title: str, ylabel: str, caption: str) -> Curve:
    return Curve(TABLE, (Line(key, "texts"), Line(f"{key}_shuffled", "shuffled tokens (control)")), file=key,
                 title=f"{title}, texts vs shuffled tokens ({{about}})", ylabel=ylabel,
                 caption=caption + " The control: the same texts, their tokens in a random order. Intervals: "
                                   "bootstrap over the texts.", layers_only=True, band="95% bootstrap interval")


_COLUMNS = tuple(f"{k}{c}" for k, *_ in _CURVES for c in CONDITIONS)

FIGURES = Figures(
    sentence="{n:,} texts, {tokens:,} sampled tokens; last layer: TwoNN {twonn:.3g} (shuffled {twonn_shuffled:.3g}), "
             "GRIDE {gride:.3g} ({gride_shuffled:.3g}), anisotropy {anisotropy:.3f} ({anisotropy_shuffled:.3f}), "
             "effective rank {effective_rank:.3g} ({effective_rank_shuffled:.3g}).",
    summary_numbers=("n", "tokens", *_COLUMNS),
    curves=tuple(_curve(*c) for c in _CURVES),
    tables=(Table(TABLE, ("layer", *_COLUMNS), digits=3,
                  console=("layer", "gride", "gride_shuffled", "anisotropy", "anisotropy_shuffled")),),
    about=lambda r: f"{', '.join(r.per_model)}; {r.data.label}, {r.data.pooling} pooling",
)


@register
class Geometry(Analysis):
    metadata = AnalysisMetadata(
        name="geometry",
        description="The shape of each layer: intrinsic dimension (TwoNN, GRIDE), anisotropy, effective rank and "
                    "matrix entropy, beside the same texts with shuffled tokens",
        inputs=("texts",),
        main_score="gride",
        default_data="generated English problems (the English side of zh-en)",
        options=(
            Option("n", int, 200, "built-in problems (English side) used as texts when no --data is given"),
            Option("max_tokens", int, 4000, "anisotropy's seeded sample of tokens (non-special ones)"),
            Option("gride_n1", int, 4, "GRIDE's scale: the n1-th and 2*n1-th neighbours"),
            Option("alpha", float, 1.0, "order of the matrix entropy (1: Shannon)"),
        ),
        figures=FIGURES,
    )

    def prepare(self, ctx: Context):
        o = self.options(ctx)
        for name in ("n", "max_tokens", "gride_n1"):
            if getattr(o, name) < 1:
                raise InputError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(o, name)}")
        if o.alpha <= 0:
            raise InputError(f"--alpha must be > 0, got {o.alpha}")
        if ctx.spec.poolings and len(ctx.spec.poolings) > 1:
            raise InputError("geometry reads one pooling for the intrinsic dimension; give one --pooling")
        from layerscope.vocab.pooling import MASK_POOLINGS

        if ctx.spec.poolings and ctx.spec.poolings[0] not in MASK_POOLINGS:
            raise InputError(f"geometry pools each text's token vectors itself: --pooling is one of "
                             f"{', '.join(MASK_POOLINGS)}, not {ctx.spec.poolings[0]}")
        if ctx.spec.data:
            from layerscope.data.corpus import read_corpus

            records, stats = read_corpus(ctx.spec.data)
            texts, origin = [r.text for r in records], ctx.spec.data
            for w in stats.warnings():
                ctx.say(w)
        else:
            from layerscope.data.bilingual import generate_pairs

            texts = [p.target for p in generate_pairs(o.n, ctx.spec.seed)]
            origin = f"generated zh-en problems, English side (n={len(texts)}, seed={ctx.spec.seed})"
        need = max(20, 4 * 2 * o.gride_n1)
        if len(texts) < need:
            raise InputError(f"{origin}: {len(texts)} texts; GRIDE at neighbours ({o.gride_n1}, {2 * o.gride_n1}) "
                             f"needs at least {need} texts (4 x n2, and TwoNN's fit at least 20), give more texts "
                             "or a smaller --gride-n1")
        label = Path(str(ctx.spec.data)).name if ctx.spec.data else f"generated English ({len(texts)} texts)"
        return {"texts": texts, "origin": origin, "label": label}

    def combine(self, ctx: Context, per_model, data) -> dict[str, Any]:
        pooling = next((f["summary"].get("pooling") for f in per_model.values()), None)
        return {"data": {"origin": data["origin"], "label": data["label"], "n": len(data["texts"]),
                         "pooling": pooling}}

    def compute(self, ctx: Context, run: ModelRun, data) -> dict[str, Any]:
        from layerscope.analyses.common import layers_for, poolings_for

        o = self.options(ctx)
        layers = layers_for(ctx, run)
        pooling = poolings_for(ctx, run)[0]
        texts = data["texts"]
        passes = {cond: _pass(ctx, run, texts, layers, pooling, shuffle=bool(cond)) for cond in CONDITIONS}
        tokens = len(passes[""]["groups"])
        if tokens < 2 or len(set(passes[""]["groups"].tolist())) < 2:
            raise InputError(f"{tokens} non-special tokens sampled from under two texts: anisotropy needs tokens "
                             "of at least two texts; give longer texts or a larger --max-tokens")
        rows = []
        from layerscope.progress import track

        for layer in track(layers, "geometry: figures and intervals per layer"):
            row: dict[str, Any] = {"layer": layer}
            for cond, got in passes.items():
                row.update(_layer_figures(got, layer, cond, o, ctx.spec.seed))
            rows.append(row)
        last = rows[-1]
        summary = {"n": len(texts), "tokens": tokens, "pooling": pooling, "gride_n1": o.gride_n1,
                   "gride_n2": 2 * o.gride_n1, "alpha": o.alpha, "layer": last["layer"],
                   **{c: last.get(c) for c in _COLUMNS}}
        return {"summary": summary, "layers": layers, "tables": {TABLE: rows}}


def _shuffler(seed: int, rows: np.ndarray):
    """Shuffle each text's non-special tokens in place, seeded by its corpus row (the same order whatever the
    batches)."""

    def edit(batch) -> None:
        ids, mask, special = batch.inputs["input_ids"], np.asarray(batch.mask) > 0, np.asarray(batch.special) > 0
        for i, local in enumerate(batch.index):
            where = np.nonzero(mask[i] & ~special[i])[0]
            order = np.random.default_rng([seed, int(rows[int(local)])]).permutation(len(where))
            ids[i, where] = ids[i, where[order]]

    return edit


def _pass(ctx: Context, run: ModelRun, texts: list[str], layers: list[str], pooling: str, *, shuffle: bool):
    """One pass over the texts: per layer the pooled vectors, the per-prompt figures and the token sample."""
    from layerscope.extraction.token_embed import embed_tokens, token_chunks, token_lengths
    from layerscope.metrics.geometry import effective_rank, matrix_entropy
    from layerscope.progress import steps
    from layerscope.vocab.pooling import pool

    o = ctx.opts
    spec = ctx.spec
    lengths, fed = token_lengths(run.engine, texts, max_length=spec.max_length)
    total = int(fed.sum())
    rng = np.random.default_rng(spec.seed)
    sample = np.sort(rng.choice(total, min(o.max_tokens, total), replace=False))
    starts = np.concatenate([[0], np.cumsum(fed)])
    hidden = int(run.engine.manifest.hidden_size)
    chunks = token_chunks(fed, [np.array([i]) for i in range(len(texts))], row_bytes=4 * hidden * len(layers))
    n = len(texts)
    pooled = {la: np.zeros((n, hidden), np.float32) for la in layers}
    erank = {la: np.full(n, np.nan) for la in layers}
    entropy = {la: np.full(n, np.nan) for la in layers}
    kept: dict[str, list[np.ndarray]] = {la: [] for la in layers}
    groups: list[np.ndarray] = []
    what = "shuffled tokens (control)" if shuffle else "texts"
    with steps(f"geometry: {n:,} {what} through the model", n) as bar:
        for chunk in chunks:
            edit = _shuffler(spec.seed, chunk) if shuffle else None
            tv = embed_tokens(run.engine, [texts[i] for i in chunk], layers, batch_tokens=spec.batch_tokens,
                              max_length=spec.max_length, lengths=lengths[chunk], bar=bar, edit=edit)
            for r, text in enumerate(chunk):
                a, b = int(tv.offsets[r]), int(tv.offsets[r + 1])
                plain = np.asarray(tv.special[a:b]) == 0
                lo, hi = starts[text], starts[text + 1]
                picked = sample[(sample >= lo) & (sample < hi)] - lo
                picked = picked[plain[picked]] + a
                groups.append(np.full(len(picked), text, np.int64))
                for la in layers:
                    states = tv.layers[la][a:b]
                    pooled[la][text] = pool(states[None], np.ones((1, b - a), np.int64), pooling,
                                            input_ids=np.asarray(tv.ids[a:b])[None])[0]
                    own = states[plain]
                    if len(own) >= 2 and np.any(own):
                        erank[la][text] = effective_rank(own)
                        entropy[la][text] = matrix_entropy(own, o.alpha)
                    kept[la].append(tv.layers[la][picked])
    return {"pooled": pooled, "erank": erank, "entropy": entropy,
            "tokens": {la: np.concatenate(v) if v else np.zeros((0, hidden)) for la, v in kept.items()},
            "groups": np.concatenate(groups) if groups else np.zeros(0, np.int64)}


def _layer_figures(got, layer: str, cond: str, o, seed: int) -> dict[str, Any]:
    from layerscope.analyses.intervals import BOOTSTRAP, add_interval
    from layerscope.metrics.geometry import (cross_group_cosine, gride_from_neighbors, neighbor_distances,
                                             twonn_from_neighbors, unit_sums)

    row: dict[str, Any] = {}
    n1, n2 = o.gride_n1, 2 * o.gride_n1
    try:
        nn = neighbor_distances(got["pooled"][layer], n2)
    except ValueError:
        nn = None
    estimators = {"twonn": lambda i: twonn_from_neighbors(nn[i, 0], nn[i, 1]),
                  "gride": lambda i: gride_from_neighbors(nn[i, n1 - 1], nn[i, n2 - 1], n1, n2).dimension}
    for key, fn in estimators.items():
        name = f"{key}{cond}"
        try:
            row[name] = float(fn(np.arange(len(nn)))) if nn is not None else None
        except ValueError:  # every text the same vector here (a layer that ignores its input): no dimension
            row[name] = None

        def scorer(idx, fn=fn):
            flat = np.atleast_2d(idx)
            out = np.empty(len(flat))
            for r, resample in enumerate(flat):
                try:
                    out[r] = fn(resample)
                except ValueError:
                    out[r] = np.nan
            return out.reshape(np.shape(idx)[:-1])

        add_interval(row, name, scorer, len(nn) if nn is not None else 0, seed=seed, cost=8,
                     ci_method=ID_BOOT)
    tokens, groups = got["tokens"][layer], got["groups"]
    texts = np.unique(groups)
    local = np.searchsorted(texts, groups)
    for key, center in (("anisotropy", False), ("anisotropy_centered", True)):
        name = f"{key}{cond}"
        sums, counts = unit_sums(tokens, local, center=center)
        try:
            row[name] = cross_group_cosine(sums, counts)
        except ValueError:
            row[name] = None

        def scorer(idx, sums=sums, counts=counts):
            flat = np.atleast_2d(idx)
            out = np.empty(len(flat))
            for r, resample in enumerate(flat):
                w = np.bincount(resample, minlength=len(counts))
                try:
                    out[r] = cross_group_cosine(sums, counts, w)
                except ValueError:
                    out[r] = np.nan
            return out.reshape(np.shape(idx)[:-1])

        add_interval(row, name, scorer, len(counts), seed=seed, cost=len(counts), ci_method=BOOTSTRAP)
    for key, values in (("effective_rank", got["erank"][layer]), ("entropy", got["entropy"][layer])):
        name = f"{key}{cond}"
        v = values[np.isfinite(values)]
        row[name] = float(v.mean()) if len(v) else None
        if len(v) >= 2:
            from layerscope.metrics.paired import mean_scorer

            add_interval(row, name, mean_scorer(v), len(v), seed=seed, ci_method=BOOTSTRAP)
        else:
            row[f"{name}_ci_low"] = row[f"{name}_ci_high"] = None
            row[f"{name}_ci_method"] = BOOTSTRAP
    return row

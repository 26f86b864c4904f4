"""``layerscope run steer``: does adding a direction at layer j move what the model outputs?

Steering vectors are estimated per layer from contrastive pairs (positive minus negative: their mean, or the first
principal component of the differences; or given with ``--vector``), on a share of the pairs; each is added at its
layer, at every token, to the held-out pairs' negative texts at each ``--scales`` multiple, and the layers after it
run (the engine's resume graphs, engines/resume.py). The effect is read off the end (decoding/steering.py): how
far the final embedding moved toward the positive texts (projection on the final layer's class direction, as a
share of the distance between the class means), its cosine margin to the training texts, and for a decoder how
far the next-token distribution moved (KL). The null is a random direction of the same norm, drawn for each layer
and held-out text, so its interval spans the draws. Means over the held-out texts with 95% percentile-bootstrap
intervals over them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from layerscope.analyses.base import Analysis, AnalysisMetadata, Context, ModelRun, Option, register
from layerscope.analyses.common import models_on_data
from layerscope.decoding.steering import KINDS, METHODS
from layerscope.errors import InputError
from layerscope.report.figures import Curve, Figures, HeatMap, Line, Table

FIGURES = Figures(
    sentence="{method} vectors from {n_train} training pairs, added to the negative texts of {n_held_out} held-out "
             "pairs at scales {scales_text} ({pooling} pooling). At scale {top_scale:g} the largest move toward the "
             "positive texts below the last layer is at layer {best_layer}: {best_projection:.3f} of the way between "
             "the class means (a random direction of the same norm: {best_random:.3f}); at the last layer a "
             "mean-difference vector moves it by the scale itself. Computed by {computed_by}. "
             "Intervals: {intervals}.",
    summary_numbers=("n_train", "n_held_out", "top_scale", "best_projection", "best_random"),
    heatmaps=(HeatMap("grids.projection", "steer_projection",
                      title="steering ({method}): projection, {model} on {data_name}",
                      zlabel="share of the way to the positive mean", rows="layers", cols="scales", xlabel="scale",
                      ylabel="layer", caption="Mean over held-out texts of the final embedding's move along the "
                                              "final layer's positive-minus-negative direction, as a share of the "
                                              "distance between the class means (0 = unsteered).",
                      scale=(0.0, 1.0), markdown=True),
              HeatMap("grids.projection_random", "steer_projection_random",
                      title="random direction of the same norm: projection, {model} on {data_name}",
                      zlabel="share of the way to the positive mean", rows="layers", cols="scales", xlabel="scale",
                      ylabel="layer", caption="The null: a random direction per layer and held-out text, as "
                                              "long as the steering vector, added the same way.", scale=(0.0, 1.0))),
    curves=(Curve("steer_layers", (Line("projection", "steering vector"), Line("random_projection", "random direction")),
                  file="steer_projection_by_layer", title="steering at the largest scale, by layer: {about}",
                  ylabel="share of the way to the positive mean", level=0.0, level_label="unsteered (0)",
                  caption="Final embedding's move toward the positive texts when the vector is added at each layer "
                          "(largest scale); band: 95% interval over held-out texts."),
            Curve("steer_layers", (Line("probe", "steering vector"), Line("random_probe", "random direction")),
                  file="steer_probe_by_layer", title="steering, cosine margin to the training texts: {about}",
                  ylabel="change of cosine margin (positive - negative)", level=0.0, level_label="unsteered (0)",
                  caption="Change of the final embedding's mean cosine to the positive training texts minus to "
                          "the negative ones (largest scale); band: 95% interval over held-out texts."),
            Curve("steer_next_token", (Line("kl", "steering vector"), Line("random_kl", "random direction")),
                  file="steer_kl_by_layer", title="steering, next-token distribution moved (KL): {about}",
                  ylabel="KL(unsteered || steered), nats", level=0.0, level_label="unsteered (0)",
                  caption="How far the next-token distribution at the last token moved (decoders; largest scale); "
                          "band: 95% interval over held-out texts.")),
    tables=(Table("steer_layers", ("layer", "norm", "projection", "random_projection", "probe", "random_probe")),
            Table("steer_next_token", ("layer", "kl", "random_kl"))),
    about=lambda results: models_on_data(results, "the built-in steering pairs"),
)


@dataclass(frozen=True)
class Data:
    pairs: tuple  # SteerPair
    scales: tuple[float, ...]


def _scales(text: str) -> tuple[float, ...]:
    try:
        scales = tuple(float(x) for x in str(text).split(",") if x.strip())
    except ValueError:
        raise InputError(f"--scales {text}: give numbers separated by commas (1,2,4,8)") from None
    if not scales or any(not np.isfinite(s) or s == 0 for s in scales):
        raise InputError(f"--scales {text}: give non-zero finite numbers separated by commas (1,2,4,8)")
    return scales


@register
class Steer(Analysis):
    metadata = AnalysisMetadata(
        name="steer",
        description="Steering vectors per layer from contrastive pairs (mean difference or PCA), added to held-out "
                    "texts with a scale sweep; the final embedding's move (and a decoder's next token) against a "
                    "random direction of the same norm, with intervals",
        inputs=("steer_pairs", "engine"),
        reads="model",  # every block to the last layer, and the head there
        main_score="best_projection",
        default_data="steer_pairs.jsonl (built in: 30 positive/negative sentence pairs)",
        options=(
            Option("method", str, "mean_diff", "how a layer's vector is estimated from the pairs", choices=METHODS),
            Option("scales", str, "1,2,4,8", "multiples of the vector added (comma-separated)"),
            Option("held_out", float, 0.5, "share of the pairs held out: their negative texts are steered"),
            Option("vector", str, None, "a .npy steering vector instead of estimating one: [hidden] or "
                                        "[layers+1, hidden]"),
            Option("batch", int, 64, "copies run through a layer's suffix at once"),
        ),
        figures=FIGURES,
    )

    def default_poolings(self, handle) -> list[str]:
        return [handle.manifest.default_pooling]

    def prepare(self, ctx: Context) -> Data:
        from layerscope.data.contrast import read_steer_pairs

        o = self.options(ctx)
        if not 0 < float(o.held_out) < 1:
            raise InputError(f"--held-out must be between 0 and 1 (a share of the pairs), not {o.held_out}")
        if int(o.batch) < 1:
            raise InputError(f"--batch must be at least 1, not {o.batch}")
        pairs = read_steer_pairs(ctx.spec.data)
        if len(pairs) < 2:
            raise InputError(f"{len(pairs)} pair: steering needs at least 2 (some to estimate, some held out)")
        return Data(tuple(pairs), _scales(o.scales))

    def compute(self, ctx: Context, run: ModelRun, data: Data) -> dict[str, Any]:
        from layerscope.analyses.common import poolings_for
        from layerscope.analyses.intervals import headline, method
        from layerscope.analyses.patch import data_name, write_layers
        from layerscope.decoding.readout import poolable
        from layerscope.decoding.steering import estimate, pooled_by_layer, read_vector, readout_of, steer
        from layerscope.progress import steps

        o = self.options(ctx)
        manifest = run.handle.manifest
        num_layers = manifest.num_layers
        layers = write_layers(ctx, run)
        given = read_vector(o.vector, num_layers, manifest.hidden_size) if o.vector else None
        pooling = poolable(poolings_for(ctx, run)[0])
        order = np.random.default_rng(ctx.spec.seed).permutation(len(data.pairs))
        n_test = min(len(order) - 1, max(1, int(round(float(o.held_out) * len(order)))))
        test = [data.pairs[i] for i in sorted(order[:n_test])]
        train = [data.pairs[i] for i in sorted(order[n_test:])]
        engine = run.engine
        ctx.say(f"steer: {len(train)} training pairs, {len(test)} held-out texts, {len(layers)} layers x "
                f"{len(data.scales)} scales x 2 directions on {engine.info.name}")
        pos = pooled_by_layer(engine, [p.positive for p in train], pooling)
        neg = pooled_by_layer(engine, [p.negative for p in train], pooling)
        vectors = given if given is not None else estimate(pos, neg, o.method)
        head, computed_by = None, engine.info.name
        if manifest.kind == "decoder":
            from layerscope.decoding.head_graph import head_reader

            head = head_reader(engine, ctx.say)
            computed_by += f", the head: {head.computed_by}"
        readout = readout_of(manifest, pooling, pos[num_layers], neg[num_layers], head)
        texts = [p.negative for p in test]
        with steps("steer: steered copies run", len(texts) * len(layers) * len(data.scales) * len(KINDS)) as bar:
            result = steer(engine, texts, vectors, layers, list(data.scales), readout, seed=ctx.spec.seed,
                           rows=int(o.batch), bar=bar.advance)
        cells, layer_rows, grids = _tables(result, seed=ctx.spec.seed)
        top = float(max(data.scales, key=abs))
        # at the last layer the mean-difference vector is the gap between the class means itself: its move there is
        # the scale by construction, so the headline is the best layer that the vector has to pass blocks from
        below = [r for r in layer_rows if int(r["layer"]) < num_layers] or layer_rows
        best = max(below, key=lambda r: r["projection"])
        summary = {
            "headline": [headline("steered toward the positive mean", best, "projection",
                                  f"layer {best['layer']}, scale {top:g}"),
                         headline("random direction of the same norm", best, "random_projection",
                                  f"layer {best['layer']}, scale {top:g}")],
            "intervals": method(len(texts), "held-out texts", ctx.spec.seed),
            "method": "given vector" if given is not None else o.method, "n_train": len(train),
            "n_held_out": len(test), "scales_text": ", ".join(f"{s:g}" for s in data.scales), "top_scale": top,
            "pooling": pooling, "best_layer": best["layer"], "best_projection": best["projection"],
            "best_random": best["random_projection"], "computed_by": computed_by, "resume_runs": result.runs,
            "data_name": data_name(ctx, "the built-in steering pairs"), "class_gap": readout.gap,
        }
        tables = {"steer_layers": layer_rows, "steer_cells": cells}
        if result.kl is not None:  # a decoder's next token: the KL columns, apart
            keys = [k for k in layer_rows[0] if k.startswith(("kl", "random_kl"))]
            tables["steer_next_token"] = [{"layer": r["layer"], **{k: r.pop(k) for k in keys}} for r in layer_rows]
        return {"summary": summary, "layers": [str(x) for x in layers], "scales": [f"{s:g}" for s in data.scales],
                "grids": grids, "tables": tables, "held_out": [p.line for p in test]}


def _tables(result, *, seed: int) -> tuple[list[dict], list[dict], dict[str, list]]:
    """Rows per (direction, layer, scale) and per layer at the largest scale, each mean with its 95% interval over
    the held-out texts; the projection heat maps (layer x scale) of both directions."""
    from layerscope.analyses.intervals import BOOTSTRAP, mean_interval

    figures = {"projection": result.projection, "probe": result.probe}
    if result.kl is not None:
        figures["kl"] = result.kl
    top = int(np.argmax(np.abs(result.scales)))

    def stat(values: np.ndarray, row: dict, key: str) -> None:
        row[key] = float(values.mean())
        lo, hi = mean_interval(values, seed=seed) if values.size >= 2 else (None, None)
        row.update({f"{key}_ci_low": lo, f"{key}_ci_high": hi, f"{key}_ci_method": BOOTSTRAP})

    cells, layer_rows = [], []
    grids = {"projection": [], "projection_random": []}
    for li, layer in enumerate(result.layers):
        lrow: dict[str, Any] = {"layer": str(layer), "norm": float(result.norms[layer])}
        for ki, kind in enumerate(KINDS):
            prefix = "" if kind == "steer" else "random_"
            for name, values in figures.items():
                stat(values[ki, li, top], lrow, prefix + name)
            for si, scale in enumerate(result.scales):
                row = {"direction": kind, "layer": str(layer), "scale": scale}
                for name, values in figures.items():
                    stat(values[ki, li, si], row, name)
                cells.append(row)
            grids["projection" if kind == "steer" else "projection_random"].append(
                [float(result.projection[ki, li, si].mean()) for si in range(len(result.scales))])
        layer_rows.append(lrow)
    return cells, layer_rows, grids

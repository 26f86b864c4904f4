"""``layerscope run patch``: activation patching, which layer and position carry what separates two inputs.

Each pair is a clean and a corrupted text that tokenize to the same length. At each layer and each position (or
group of positions: ``--by group``) the corrupted run's state is replaced by the clean run's and the layers after
it run (the engine's resume graphs, engines/resume.py); the metric (``--metric``: ``similarity`` for encoders,
``logit_diff`` or ``prob`` for decoders) is read off the end and normalised between the corrupted run (0) and
the clean run (1), over the pairs (a ratio of means), with a 95% percentile-bootstrap interval over the pairs.
The work (decoding/patching.py) runs each layer's suffix once per position batch; the summary says how many runs
that took against one whole-model run per (layer, position).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from layerscope.analyses.base import Analysis, AnalysisMetadata, Context, ModelRun, Option, register
from layerscope.analyses.common import models_on_data
from layerscope.decoding.patching import BY, GROUPS, METRICS
from layerscope.errors import InputError
from layerscope.report.figures import Curve, Figures, HeatMap, Line, Table

SHOW = 3  # pairs at most with a heat map of their own

FIGURES = Figures(
    sentence="{n_pairs} pairs; metric: {metric_reads} (clean runs {clean_mean:.3f}, corrupted {corrupted_mean:.3f} "
             "on average); columns: {alignment}. Effect 0 = the corrupted run, 1 = the clean run. Computed by "
             "{computed_by}: {suffix_runs:,} suffix runs of {suffix_rows:,} copies, where one whole-model run per "
             "(pair, layer, column) takes {naive_runs:,}. Intervals: {intervals}.",
    summary_numbers=("n_pairs", "clean_mean", "corrupted_mean", "peak_effect", "suffix_runs", "suffix_rows",
                     "naive_runs", "block_rows", "naive_block_rows"),
    heatmaps=(HeatMap("grids.effect", "patch_effect", title="activation patching ({metric}): {model} on {data_name}",
                      zlabel="normalised effect", rows="layers", cols="columns", xlabel="position or token group",
                      ylabel="layer",
                      caption="The corrupted run with the clean run's state written at one layer and column: "
                              "sum over pairs of (patched - corrupted) / sum of (clean - corrupted).",
                      scale=(0.0, 1.0), markdown=True),)
    + tuple(HeatMap(f"grids.pair_{i}", f"patch_pair_{i}", title=f"pair {i} ({{metric}}, {{model}}): {{pair_{i}}}",
                    zlabel="normalised effect", rows="layers", cols=f"pair_{i}_columns",
                    xlabel="position or token group",
                    ylabel="layer", caption="This pair alone: (patched - corrupted) / (clean - corrupted).",
                    scale=(0.0, 1.0)) for i in range(1, SHOW + 1)),
    curves=(Curve("patch_layers", (Line("last", "last token"), Line("best", "best column")), file="patch_by_layer",
                  title="activation patching by layer: {about}", ylabel="normalised effect", level=0.0,
                  level_label="the corrupted run (0)",
                  caption="Per layer: the effect of patching the last token, and the largest over the columns; "
                          "band: 95% interval over pairs."),
            Curve("patch_cells", (Line("effect", "effect"),), file="patch_groups", group=("column",),
                  where=lambda r: r.get("column") in GROUPS, label="{column}",
                  title="activation patching by token group: {about}", ylabel="normalised effect",
                  level=0.0, level_label="the corrupted run (0)",
                  caption="Each token group patched at once; band: 95% interval over pairs.")),
    tables=(Table("patch_layers", ("layer", "last", "best", "best_column"), numbers=("last", "best")),),
    about=lambda results: models_on_data(results, "the built-in patch pairs"),
)


@dataclass(frozen=True)
class Pairs:
    pairs: tuple  # PatchPair
    builtin: bool


@register
class Patch(Analysis):
    metadata = AnalysisMetadata(
        name="patch",
        description="Activation patching: the clean run's state written into the corrupted run at every layer x "
                    "position (or token group), the metric normalised between the two runs, with intervals",
        inputs=("patch_pairs", "engine"),
        reads="model",  # every block to the last layer, and the head there
        main_score="peak_effect",
        default_data="patch_pairs.jsonl (built in: 16 prompts, one country swapped)",
        options=(
            Option("metric", str, None, "what the end of a run is judged by: similarity (encoders; default there), "
                                        "logit_diff (decoders; default there) or prob", choices=METRICS),
            Option("by", str, "position", "columns: every position, or token groups (before, changed, after, "
                                          "last)", choices=BY),
            Option("batch", int, 64, "copies of a pair run through a layer's suffix at once (a position batch)"),
            Option("show", int, SHOW, f"pairs (at most {SHOW}) with a heat map of their own"),
        ),
        figures=FIGURES,
    )

    def default_poolings(self, handle) -> list[str]:
        return [handle.manifest.default_pooling]

    def prepare(self, ctx: Context) -> Pairs:
        from layerscope.data.contrast import read_patch_pairs

        o = self.options(ctx)
        if int(o.batch) < 1:
            raise InputError(f"--batch must be at least 1, not {o.batch}")
        if not 0 <= int(o.show) <= SHOW:
            raise InputError(f"--show must be 0..{SHOW}, not {o.show}")
        return Pairs(tuple(read_patch_pairs(ctx.spec.data)), ctx.spec.data is None)

    def compute(self, ctx: Context, run: ModelRun, data: Pairs) -> dict[str, Any]:
        from layerscope.analyses.common import poolings_for
        from layerscope.analyses.intervals import headline, method
        from layerscope.decoding.patching import (HeadMetric, Similarity, columns, pair_grid, patch, run_pairs,
                                                  tokenize_pairs)
        from layerscope.decoding.readout import poolable
        from layerscope.progress import steps

        o = self.options(ctx)
        manifest = run.handle.manifest
        decoder = manifest.kind == "decoder"
        metric = o.metric or ("logit_diff" if decoder else "similarity")
        if metric != "similarity" and not decoder:
            raise InputError(f"--metric {metric} reads a next-token distribution: decoders only; an encoder's "
                             "patching reads --metric similarity")
        layers = write_layers(ctx, run)
        runs = tokenize_pairs(run.engine, data.pairs, metric=metric, drop_uneven=data.builtin, say=ctx.say)
        cols = columns(runs, o.by)  # every check above: bad input is one line before any layer runs
        engine = run.engine
        if metric == "similarity":
            pooling = poolable(poolings_for(ctx, run)[0])
            references, reads = self._references(engine, runs, data, pooling)
            judge = Similarity(manifest, pooling, references, reads)
            computed_by = engine.info.name
        else:
            from layerscope.decoding.head_graph import head_reader

            head = head_reader(engine, ctx.say)
            judge = HeadMetric(head, metric)
            computed_by = f"{engine.info.name}, the head: {head.computed_by}"
        ctx.say(f"patch: {len(runs)} pairs x {len(layers)} layers x {len(cols.labels)} columns on {engine.info.name}")
        run_pairs(engine, runs)
        cells = sum(len([k for k in range(len(cols.labels)) if cols.positions[r.index][k]]) for r in runs)
        with steps("patch: patched copies run", cells * len(layers)) as bar:
            result = patch(engine, runs, judge, layers, cols, rows=int(o.batch), bar=bar)
        grid, cell_rows = cell_effects(result, seed=ctx.spec.seed)
        layer_rows = by_layer(result, cell_rows)
        peak = max((r for r in cell_rows if r["effect"] is not None), key=lambda r: r["effect"], default=None)
        summary = {
            "headline": [headline("largest normalised effect", peak, "effect",
                                  f"layer {peak['layer']}, column {peak['column']}" if peak else "")],
            "intervals": method(len(runs), "pairs", ctx.spec.seed),
            "n_pairs": len(runs), "data_name": data_name(ctx, "the built-in patch pairs"), "metric": metric, "metric_reads": judge.reads, "by": o.by,
            "alignment": cols.alignment, "clean_mean": float(np.mean(result.clean)),
            "corrupted_mean": float(np.mean(result.corrupted)), "peak_effect": peak["effect"] if peak else None,
            "peak_layer": peak["layer"] if peak else None, "peak_column": peak["column"] if peak else None,
            "computed_by": computed_by, "suffix_runs": result.suffix_runs, "suffix_rows": result.suffix_rows,
            "naive_runs": result.naive_runs, "block_rows": result.block_rows,
            "naive_block_rows": result.naive_block_rows,
        }
        figures: dict[str, Any] = {"summary": summary, "layers": [str(x) for x in layers],
                                   "columns": list(cols.labels), "grids": {"effect": grid},
                                   "tables": {"patch_layers": layer_rows, "patch_cells": cell_rows},
                                   "pairs": [{"line": r.line, "clean": p.clean, "corrupted": p.corrupted,
                                              "clean_metric": float(c), "corrupted_metric": float(d)}
                                             for r, p, c, d in zip(runs, _kept(data.pairs, runs), result.clean,
                                                                   result.corrupted)]}
        for i, r in enumerate(runs[:int(o.show)], 1):
            pair = next(p for p in data.pairs if p.line == r.line)
            summary[f"pair_{i}"] = f"{pair.clean} / {pair.corrupted}"
            figures["grids"][f"pair_{i}"] = pair_grid(result, r.index)
            figures[f"pair_{i}_columns"] = _pair_columns(r, cols)
        return figures

    @staticmethod
    def _references(engine, runs, data: Pairs, pooling: str):
        """Per pair the embedding the similarity is taken with: its ``other`` text's, else the clean run's."""
        from layerscope.decoding.readout import pooled

        num_layers = engine.manifest.num_layers
        kept = _kept(data.pairs, runs)
        if kept[0].other is None:
            names = [str(num_layers)]
            refs = [pooled(engine.manifest, r.clean, engine.run_tokens(r.clean, names)[0], pooling)[0] for r in runs]
            return np.stack(refs), f"cosine of the {pooling}-pooled final embedding with the clean run's"
        enc = engine.encoder()
        refs = []
        for pair in kept:
            batch = enc([pair.other])
            refs.append(pooled(engine.manifest, batch, engine.run_tokens(batch, [str(num_layers)])[0], pooling)[0])
        return np.stack(refs), f"cosine of the {pooling}-pooled final embedding with the pair's other text's"


def data_name(ctx: Context, builtin: str) -> str:
    """The data file's name for titles (``builtin`` where the run reads its built-in data)."""
    from pathlib import Path

    return Path(ctx.spec.data).name if ctx.spec.data else builtin


def write_layers(ctx: Context, run: ModelRun) -> list[int]:
    """The run's layers a state is written at (``raw`` left out, said)."""
    from layerscope.analyses.common import layers_for

    layers = layers_for(ctx, run)
    if "raw" in layers:
        layers = [x for x in layers if x != "raw"]
        if ctx.spec.layers not in (None, "all"):
            ctx.say("layer 'raw' (the word-embedding lookup) is not a state the blocks read; left out")
    if not layers:
        raise InputError("--layers selected only 'raw'; states are written at layers 0..L")
    return [int(x) for x in layers]


def _kept(pairs, runs) -> list:
    by_line = {p.line: p for p in pairs}
    return [by_line[r.line] for r in runs]


def _pair_columns(run, cols) -> list[str]:
    if cols.labels == GROUPS:
        return list(GROUPS)
    tokens = [a if a == b else f"{a}/{b}" for a, b in zip(run.clean_tokens, run.corrupted_tokens)]
    out = []
    for k in range(len(cols.labels)):
        where = cols.positions[run.index][k]
        out.append(f"{where[0]} {tokens[where[0]]}" if where else f"({cols.labels[k]})")
    return out


def cell_effects(result, *, seed: int) -> tuple[list[list[float | None]], list[dict[str, Any]]]:
    """The effect of each (layer, column) over the pairs that have it, as a matrix and as rows with its 95%
    percentile-bootstrap interval over those pairs."""
    from layerscope.analyses.intervals import BOOTSTRAP, interval
    from layerscope.metrics.intervention import effect_scorer, normalised_effect

    grid, rows = [], []
    for li, layer in enumerate(result.layers):
        line = []
        for k, label in enumerate(result.columns.labels):
            have = np.isfinite(result.patched[:, li, k])
            p, c, r = result.patched[have, li, k], result.clean[have], result.corrupted[have]
            effect = normalised_effect(p, c, r) if have.any() else None
            lo, hi = interval(effect_scorer(p, c, r), int(have.sum()), seed=seed) if effect is not None else (None, None)
            line.append(effect)
            rows.append({"layer": str(layer), "column": label, "effect": effect, "effect_ci_low": lo,
                         "effect_ci_high": hi, "effect_ci_method": BOOTSTRAP, "pairs": int(have.sum())})
        grid.append(line)
    return grid, rows


def by_layer(result, cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per layer: the effect at the last token (its column: ``last``) and the largest over the columns, each with
    its interval."""
    last_label = "last" if "last" in result.columns.labels else result.columns.labels[-1]
    rows = []
    for layer in result.layers:
        mine = [r for r in cells if r["layer"] == str(layer)]
        last = next(r for r in mine if r["column"] == last_label)
        best = max((r for r in mine if r["effect"] is not None), key=lambda r: r["effect"], default=None)
        row = {"layer": str(layer)}
        for key, cell in (("last", last), ("best", best)):
            cell = cell or {}
            row.update({key: cell.get("effect"), f"{key}_ci_low": cell.get("effect_ci_low"),
                        f"{key}_ci_high": cell.get("effect_ci_high"), f"{key}_ci_method": cell.get("effect_ci_method")})
        row["best_column"] = best["column"] if best else None
        rows.append(row)
    return rows

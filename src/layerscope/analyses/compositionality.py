"""``compositionality``: does a layer's sentence vector follow word order, or only the words?

Each item has a positive sentence, a negative with the same words and another
meaning ("an old person kisses a young person" / "a young person kisses an old
person") and paraphrases of the positive. Per layer and pooling (and the model's
own pooled output where it has one), per item: the cosine of the positive to each
paraphrase and to the negative, and the difference (mean paraphrase minus
negative). Over items: mean difference, win rate (share of items whose paraphrases
are closer than the negative), a sign test, and breakdowns by category and by
complexity.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from layerscope.analyses.base import Analysis, AnalysisMetadata, Context, ModelOutput, ModelRun, register
from layerscope.analyses.common import layers_for, poolings_for
from layerscope.report.figures import Bars, Curve, Figures, Line, Listing, Table

OWN = "own"  # pooling label of the model's own pooled output
OWN_LAYER = "pooled"


def own_pooled_vectors(run: ModelRun, texts: list[str], batch_size: int = 64) -> np.ndarray | None:
    """The model's own pooled output for every text (CLIP's pooler_output), or None where it has none."""
    if not run.handle.manifest.pooled_output:
        return None
    encoder = run.engine.encoder()
    parts = []
    for s in range(0, len(texts), batch_size):
        v = run.engine.pooled_output(encoder(texts[s:s + batch_size]))
        if v is None:
            return None
        parts.append(np.asarray(v, dtype=np.float32))
    return np.concatenate(parts)


def all_ties(row: dict) -> bool:
    """Every item a tie: the positive, its paraphrases and its negative get one vector, so the row says nothing."""
    return row.get("ties") == row.get("n_items")


TIED = ("every item is a tie (the positive, its paraphrases and its negative get the same vector, e.g. a "
        "constant CLS vector)")


def _by_layer(column: str, name: str, level: float, caption: str, band: str) -> Curve:
    # a layer where every item is a tie (one vector for every text) tells nothing: left out, not drawn at 0
    return Curve("layers", (Line(column, name),), file=f"compositionality_{column}_by_layer", per_model=False,
                 group=("pooling",), joiner=" / ", level=level, title=f"Compositionality: {name}, by layer",
                 ylabel=name, where=lambda row: row.get("pooling") != OWN and not all_ties(row),
                 caption=caption + " Layers where every item is a tie are left out (they tell nothing).", band=band)


_DIFF = ("Per item: mean cosine of the sentence to its paraphrases minus its cosine to the same words in another "
         "order, averaged over the items (interval: percentile bootstrap over the items); 0 is no preference.")
_WINS = ("Share of items whose paraphrases are closer to the sentence than the same words in another order "
         "(interval: Wilson, over the items); chance is 0.5.")


_LAYER_COLUMNS = ("pooling", "layer", "win_rate", "win_rate_ci_low", "win_rate_ci_high", "wins", "losses", "ties",
                  "mean_diff", "mean_diff_ci_low", "mean_diff_ci_high", "mean_paraphrase", "mean_negative", "sign_p")
_GROUP_COLUMNS = ("pooling", "layer", "group", "value", "n_items", "win_rate", "mean_diff", "sign_p")

# What the reports show: PNG, report.md, report.html and the console all draw this one declaration.
FIGURES = Figures(
    sentence="{items} items. Per item, diff = mean cos(positive, paraphrase) - cos(positive, negative); a win is "
             "diff > 0 (chance: win rate 0.5, diff 0). The sign test is two-sided, ties dropped. Best: layer "
             "{best.layer} with {best.pooling} pooling, win rate {best.win_rate:.3g} [{best.win_rate_ci_low:.3g}, "
             "{best.win_rate_ci_high:.3g}], mean diff {best.mean_diff:.3g} [{best.mean_diff_ci_low:.3g}, "
             "{best.mean_diff_ci_high:.3g}] (sign test p = {best.sign_p:.2g}). The model's own pooled output ({own_pooled_output}) is the row "
             f"pooling={OWN}, layer={OWN_LAYER}.",
    summary_numbers=("items", "best_win_rate"),
    curves=(_by_layer("mean_diff", "mean cos(paraphrase) - cos(same-words negative)", 0.0, _DIFF,
                      "95% bootstrap interval"),
            _by_layer("win_rate", "win rate (paraphrases closer than negative)", 0.5, _WINS, "95% Wilson interval")),
    bars=(Bars("groups", "value", (Line("win_rate", "win rate"),), split="pooling", final_layer=True,
               where=lambda row: row.get("group") == "category", file="compositionality_categories_final_layer",
               title="Win rate by category at the final layer", ylabel="win rate",
               caption="Share of items whose paraphrases are closer than their same-words negative.",
               band="95% Wilson interval", level=0.5),),
    tables=(Table("layers", _LAYER_COLUMNS, digits=4, p_values=("sign_p",), numbers=_LAYER_COLUMNS[2:],
                  pivot="pooling", cell="{win_rate:.3f} ({mean_diff:+.4f})", cell_label="win rate (diff)"),
            Table("groups", _GROUP_COLUMNS, digits=4, p_values=("sign_p",), numbers=_GROUP_COLUMNS[4:],
                  final_layer=True)),
    listings=(Listing("layers", "Layers that say nothing", item="undefined at layer {layer}, {pooling}: " + TIED +
                      ", so the layer says nothing here", where=all_ties, limit=1000, html_limit=1000),),
)


def _undefined_if_tied(summ: dict) -> dict:
    """Win rate, mean diff and sign test are undefined where every item ties (as a correlation of constant
    cosines is in sts): None, with the reason, instead of a 0 that reads as a measured figure."""
    if summ.get("ties") == summ.get("n_items"):
        summ.update({"win_rate": None, "mean_diff": None, "sign_p": None, "undefined": TIED})
    return summ


def _summary_row(items, idx_pos, idx_neg, idx_para, vectors) -> tuple[dict, np.ndarray, np.ndarray, np.ndarray]:
    from layerscope.metrics.comparison import compositionality_summary
    from layerscope.metrics.vectors import paired_cosine

    neg = paired_cosine(vectors[idx_pos], vectors[idx_neg])
    flat_pos = np.concatenate([np.full(len(p), i) for i, p in zip(idx_pos, idx_para)])
    flat_para = np.concatenate(idx_para)
    flat = paired_cosine(vectors[flat_pos], vectors[flat_para])
    bounds = np.cumsum([0] + [len(p) for p in idx_para])
    para = [flat[bounds[k]:bounds[k + 1]] for k in range(len(items))]
    summ = compositionality_summary(para, neg)
    para_mean = np.array([p.mean() for p in para])
    diffs = np.asarray(summ.pop("per_item_diffs"))
    return _undefined_if_tied(summ), neg, para_mean, diffs


@register
class Compositionality(Analysis):
    metadata = AnalysisMetadata(
        name="compositionality",
        reads="vectors",
        description="Word order vs meaning: is a paraphrase closer than a same-words negative, per layer",
        inputs=("items",),
        main_score="best_win_rate",
        default_poolings=("mean", "cls"),
        default_data="layerscope/data/compositionality.jsonl (shipped)",
        figures=FIGURES,
    )

    def default_data_file(self) -> str:
        from layerscope.data.items import default_items_path

        return str(default_items_path())

    def prepare(self, ctx: Context):
        from layerscope.data.items import read_items

        items = read_items(ctx.spec.data)
        cats = sorted({it.category for it in items})
        ctx.say(f"{len(items)} items from {ctx.spec.data} (categories: {', '.join(cats)})")
        return items

    def default_poolings(self, handle) -> list[str]:
        """The family's own when it has them (decoders: last and mean; CLIP: eos), else mean and cls."""
        from layerscope.vocab.pooling import family_poolings

        return family_poolings(handle.manifest, self.metadata.default_poolings)

    def engine_reads(self, handle, layers: list[str], poolings: list[str]):
        """The asked layers' pooled vectors, and the model's own pooled output where it has one (made after the
        last block, so that model's engine runs every block)."""
        if handle.manifest.pooled_output:
            from layerscope.extraction.engine_plan import EngineReads

            return EngineReads.of(None)
        return super().engine_reads(handle, layers, poolings)

    def compute(self, ctx: Context, run: ModelRun, items) -> ModelOutput:
        from layerscope.metrics.comparison import compositionality_summary

        layers = layers_for(ctx, run)
        poolings = poolings_for(ctx, run)
        pos: dict[str, int] = {}
        for it in items:
            for t in it.texts():
                pos.setdefault(t, len(pos))
        texts = list(pos)
        idx_pos = np.array([pos[it.positive] for it in items])
        idx_neg = np.array([pos[it.negative] for it in items])
        idx_para = [np.array([pos[p] for p in it.paraphrases]) for it in items]
        vecs = ctx.vectors(run, texts, layers=layers, poolings=poolings, tag="compositionality")
        variants = [(p, layer, vecs[p, layer]) for p in poolings for layer in layers]
        own = own_pooled_vectors(run, texts)
        if own is not None:
            variants.append((OWN, OWN_LAYER, own))
        from layerscope.analyses.compare import ScoreRow, model_rows
        from layerscope.analyses.intervals import add_interval, add_share_interval, headline, method
        from layerscope.metrics.paired import mean_scorer, win_rate_scorer

        rows, group_rows, item_rows, kept = [], [], [], []
        for p, layer, v in variants:
            summ, neg, para_mean, diffs = _summary_row(items, idx_pos, idx_neg, idx_para, v)
            row = {"pooling": p, "layer": layer, **summ}
            add_share_interval(row, "win_rate", summ["wins"], len(items))
            add_interval(row, "mean_diff", mean_scorer(diffs), len(items), seed=ctx.spec.seed)
            rows.append(row)
            kept.append(ScoreRow(p, layer, summ["win_rate"], None, win_rate_scorer(diffs), bootstrap_ci=True))
            for it, n_c, p_c, d in zip(items, neg, para_mean, diffs):
                item_rows.append({"pooling": p, "layer": layer, "id": it.id, "category": it.category,
                                  "complexity": it.complexity, "cos_paraphrases": float(p_c),
                                  "cos_negative": float(n_c), "diff": float(d)})
            for group in ("category", "complexity"):
                values = sorted({getattr(it, group) for it in items if getattr(it, group)})
                for value in values:
                    sel = [k for k, it in enumerate(items) if getattr(it, group) == value]
                    g = compositionality_summary(para_mean[sel], neg[sel])
                    g.pop("per_item_diffs")
                    _undefined_if_tied(g)
                    g_row = {"pooling": p, "layer": layer, "group": group, "value": value, **g}
                    add_share_interval(g_row, "win_rate", g["wins"], len(sel))
                    group_rows.append(g_row)
        compare = model_rows(run.num_layers, len(items), kept)  # for model vs model
        told = [r for r in rows if not all_ties(r)]  # an all-tie row tells nothing: never the best
        best = max(told, key=lambda r: (r["win_rate"], r["mean_diff"])) if told else rows[0]
        final = str(run.num_layers)
        ci_keys = ("win_rate_ci_low", "win_rate_ci_high", "win_rate_ci_method", "mean_diff_ci_low",
                   "mean_diff_ci_high", "mean_diff_ci_method")
        where = f"layer {best['layer']}, {best['pooling']} pooling"
        heads = [headline("best win rate", best, "win_rate", where, chance=0.5),
                 headline("its mean diff", best, "mean_diff", where, chance=0.0)]
        for r in rows:
            if r["layer"] in (final, OWN_LAYER):
                at = f"final layer {final}" if r["layer"] == final else "the model's own pooled output"
                heads.append(headline("win rate", r, "win_rate", f"{at}, {r['pooling']} pooling", chance=0.5))
        summary = {
            "items": len(items),
            "best_win_rate": best["win_rate"],
            "best": {k: best[k] for k in ("pooling", "layer", "win_rate", "mean_diff", "sign_p", *ci_keys)},
            "final": {r["pooling"]: {k: r[k] for k in ("win_rate", "mean_diff", "sign_p", "ties", *ci_keys)}
                      for r in rows if r["layer"] in (final, OWN_LAYER)},
            "headline": heads,
            "intervals": method(len(items), "items", ctx.spec.seed, shares="win rates (wins over all items)"),
            "own_pooled_output": run.handle.manifest.pooled_output if own is not None else None,
        }
        return ModelOutput({"summary": summary, "tables": {"layers": rows, "groups": group_rows, "items": item_rows}},
                           compare=compare)

    def combine(self, ctx: Context, per_model, data) -> dict[str, Any]:
        from layerscope.analyses.compare import compare_models

        return compare_models(per_model, score="win_rate", score_label="win rate", seed=ctx.spec.seed, say=ctx.say)

"""``layerscope run patchscope``: a one-token Patchscope, what a layer's state says when placed in another prompt.

Each source text's state at its last (non-special) token, from each layer i, is placed in the target prompt
(``--prompt``, default the identity prompt ``cat -> cat; 1135 -> 1135; hello -> hello; ?``) at its placeholder,
at each layer j; the layers after j run and the model's head reads the distribution there (decoding/patchscope.py).
Per (i, j): how often the top token is the reference (a decoder's own next-token prediction at the source
position; an encoder's source token), with a Wilson interval over the sources, and the reference's mean
probability with a bootstrap interval. Target layer L is the logit lens of layer i; the report shows it beside
the Patchscope's same-layer diagonal and its best target layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from layerscope.analyses.base import Analysis, AnalysisMetadata, Context, ModelRun, Option, register
from layerscope.analyses.common import models_on_data
from layerscope.decoding.patchscope import IDENTITY_PROMPT
from layerscope.errors import InputError
from layerscope.report.figures import Curve, Figures, HeatMap, Line, Listing, Table

FIGURES = Figures(
    sentence="{n_sources} source texts, each's last token placed in the target prompt '{prompt}' at its "
             "placeholder; reference token: {reference}. Head: {head}. Computed by {computed_by}: "
             "{resume_runs:,} suffix runs of {resume_rows:,} copies. Intervals: {intervals}.",
    summary_numbers=("n_sources", "lens_top1_mid", "diagonal_top1_mid", "resume_runs", "resume_rows"),
    heatmaps=(HeatMap("grids.top1", "patchscope_top1", title="Patchscope: top-1 = reference, {model} on {data_name}",
                      zlabel="share of sources", rows="source_layers", cols="target_layers", xlabel="target layer j "
                      "(L: the logit lens)", ylabel="source layer i", scale=(0.0, 1.0), markdown=True,
                      caption="Layer i's state of each source placed in the target prompt at layer j; the share whose "
                              "top decoded token is the reference. The last column (target layer L) is the logit "
                              "lens of layer i."),
              HeatMap("grids.prob", "patchscope_prob", title="Patchscope: probability of the reference, {model} on "
                      "{data_name}", zlabel="mean probability", rows="source_layers", cols="target_layers",
                      xlabel="target layer j (L: the logit lens)", ylabel="source layer i", scale=(0.0, 1.0),
                      caption="Mean probability of the reference token at the placeholder.")),
    curves=(Curve("patchscope_layers", (Line("lens", "logit lens (target layer L)"),
                                        Line("diagonal", "Patchscope, target layer j = i"),
                                        Line("best", "Patchscope, best target layer j < L")),
                  file="patchscope_by_layer", title="Patchscope and logit lens by source layer: {about}",
                  xlabel="source layer i", ylabel="top-1 = reference (share of sources)", from_zero=True,
                  band="95% Wilson interval",
                  caption="Side by side: the logit lens (the head reading layer i's state) and the Patchscope "
                          "(the state placed in the target prompt). Intervals over the sources."),),
    tables=(Table("patchscope_layers", ("layer", "lens", "diagonal", "best", "best_target", "lens_prob",
                                        "diagonal_prob"), numbers=("lens", "diagonal", "best", "lens_prob",
                                                                   "diagonal_prob")),),
    listings=(Listing("examples", "What each source's last token decodes to", item="\"{text}\" (reference "
                      "{reference}): logit lens by layer {lens}; Patchscope at j = i {diagonal}", limit=5),),
    about=lambda results: models_on_data(results, "the built-in lens texts"),
)


@dataclass(frozen=True)
class Sources:
    texts: tuple[str, ...]


@register
class Patchscope(Analysis):
    metadata = AnalysisMetadata(
        name="patchscope",
        description="One-token Patchscope: each layer's last-token state placed in a target prompt at each layer, "
                    "decoded by the head, per layer pair; the logit lens beside it",
        inputs=("texts", "engine"),
        reads="model",  # every block to the last layer, and the head there
        main_score="diagonal_top1_mid",
        default_data="lens_texts.jsonl (built in)",
        options=(
            Option("prompt", str, IDENTITY_PROMPT, "the target prompt; the state is placed at its last token that "
                                                   "is not a special token"),
            Option("batch", int, 64, "copies of the prompt run through a layer's suffix at once"),
            Option("show", int, 5, "source texts whose decoded tokens are listed"),
        ),
        figures=FIGURES,
    )

    def prepare(self, ctx: Context) -> Sources:
        from layerscope.data.examples import LENS_TEXTS, read_texts

        o = self.options(ctx)
        if int(o.batch) < 1:
            raise InputError(f"--batch must be at least 1, not {o.batch}")
        if not str(o.prompt).strip():
            raise InputError("--prompt is empty; give a target prompt whose last token is the placeholder")
        return Sources(tuple(read_texts(ctx.spec.data or LENS_TEXTS)))

    def compute(self, ctx: Context, run: ModelRun, data: Sources) -> dict[str, Any]:
        from layerscope.analyses.intervals import headline, method
        from layerscope.analyses.patch import data_name
        from layerscope.decoding.head_graph import head_reader
        from layerscope.decoding.patchscope import patchscope
        from layerscope.progress import steps

        o = self.options(ctx)
        engine = run.engine
        manifest = run.handle.manifest
        num_layers = manifest.num_layers
        if ctx.spec.layers not in (None, "all"):
            ctx.say("--layers is not read: the Patchscope places every layer's state at every layer")
        head = head_reader(engine, ctx.say)
        texts = list(data.texts)
        ctx.say(f"patchscope: {len(texts)} sources x {num_layers + 1} source layers x {num_layers + 1} target layers "
                f"on {engine.info.name}")
        with steps("patchscope: prompt copies run", len(texts) * (num_layers + 1) * num_layers) as bar:
            result = patchscope(engine, head, texts, o.prompt, rows=int(o.batch), bar=bar)
        rows, grids = _tables(result, seed=ctx.spec.seed)
        mid = rows[len(rows) // 2]
        tok = run.handle.tokenizer()
        decoder = manifest.kind == "decoder"
        summary = {
            "headline": [headline("logit lens: top-1 = reference", mid, "lens", f"layer {mid['layer']} (middle)"),
                         headline("Patchscope (j = i): top-1 = reference", mid, "diagonal",
                                  f"layer {mid['layer']} (middle)")],
            "intervals": method(len(texts), "source texts", ctx.spec.seed, shares="top-1 shares"),
            "n_sources": len(texts), "prompt": o.prompt, "head": f"{head.info['kind']}: {head.info['description']}",
            "reference": "the model's own next-token prediction at the source position" if decoder
                         else "the source token itself",
            "lens_top1_mid": mid["lens"], "diagonal_top1_mid": mid["diagonal"], "mid_layer": mid["layer"],
            "computed_by": f"{engine.info.name}, the head: {head.computed_by}", "resume_runs": result.runs,
            "resume_rows": result.rows, "data_name": data_name(ctx, "the built-in lens texts"),
        }
        examples = []
        for s, text in enumerate(texts[:max(0, int(o.show))]):
            def word(i: int, j: int) -> str:
                return tok.convert_ids_to_tokens(int(result.top_ids[s, i, j]))

            examples.append({"text": text, "reference": tok.convert_ids_to_tokens(int(result.reference[s])),
                             "lens": " | ".join(word(i, num_layers) for i in result.source_layers),
                             "diagonal": " | ".join(word(i, i) for i in result.source_layers[:-1]) + " | (L: lens)"})
        return {"summary": summary, "source_layers": [str(i) for i in result.source_layers],
                "target_layers": [str(j) for j in result.target_layers[:-1]] + [f"{num_layers} (lens)"],
                "grids": grids, "tables": {"patchscope_layers": rows}, "examples": examples}


def _tables(result, *, seed: int) -> tuple[list[dict[str, Any]], dict[str, list]]:
    """Per source layer: the lens, the diagonal and the best target layer below L (shares with Wilson intervals,
    probabilities with bootstrap ones); the (i, j) grids of both figures."""
    from layerscope.analyses.intervals import add_share_interval, mean_interval, BOOTSTRAP

    n = result.top1.shape[0]
    last = len(result.target_layers) - 1
    share = result.top1.mean(axis=0)
    prob = result.prob.mean(axis=0)
    rows = []
    for i in result.source_layers:
        row: dict[str, Any] = {"layer": str(i)}
        best_j = int(np.argmax(share[i, :last])) if last else None
        for key, j in (("lens", last), ("diagonal", i if i < last else last), ("best", best_j)):
            if j is None:
                row[key] = None
                continue
            row[key] = float(share[i, j])
            add_share_interval(row, key, float(result.top1[:, i, j].sum()), n)
        row["best_target"] = str(best_j) if best_j is not None else None
        for key, j in (("lens_prob", last), ("diagonal_prob", i if i < last else last)):
            row[key] = float(prob[i, j])
            lo, hi = mean_interval(result.prob[:, i, j], seed=seed) if n >= 2 else (None, None)
            row.update({f"{key}_ci_low": lo, f"{key}_ci_high": hi, f"{key}_ci_method": BOOTSTRAP})
        rows.append(row)
    grids = {"top1": [[float(v) for v in r] for r in share], "prob": [[float(v) for v in r] for r in prob]}
    return rows, grids

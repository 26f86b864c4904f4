"""``layerscope run explain``: which token pairs make two texts similar (integrated Jacobians).

For each pair of texts (a file of pairs, or ``--pair A B``), the token x token attribution matrix of their
similarity (cosine, or dot) at the input embeddings and/or chosen layers (``--at``), with the model's
pooling; its completeness error (matrix sum vs the similarity minus the reference terms) and how that falls
with the number of steps; the one-sided token attributions (its row and column sums); and the hiding game on
pairs (delete the tokens of the top pairs: the similarity should fall more than for as many random tokens).
The method: ``layerscope.decoding.pair_attribution``. Needs gradients: the torch engine only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from layerscope.analyses.base import Analysis, AnalysisMetadata, Context, ModelRun, Option, register
from layerscope.errors import InputError
from layerscope.progress import track
from layerscope.report.explain_figs import PAIRS, ExplainPair
from layerscope.report.figures import Bars, Curve, Figures, Line, Table


def _steps_list(text: str, flag: str) -> list[int]:
    try:
        values = sorted({int(x) for x in str(text).split(",") if x.strip()})
    except ValueError:
        raise InputError(f"{flag} takes whole numbers separated by commas, e.g. 5,10,20,50; not {text!r}") from None
    if not values or values[0] < 1:
        raise InputError(f"{flag} needs numbers of steps of at least 1, not {text!r}")
    return values


@dataclass(frozen=True)
class Pairs:
    """What ``prepare`` hands each model: the pairs, where they came from (a file, or --pair) and the step counts
    of the completeness curve."""

    pairs: tuple[tuple[str, str], ...]
    source: str
    curve: tuple[int, ...]


def _load_net(run: ModelRun):
    """The fp32 PyTorch model on the CPU: the torch engine's own when it holds every block there, else loaded."""
    net, engine = getattr(run.engine, "net", None), run.engine
    if (net is not None and getattr(engine, "precision", "") == "fp32" and getattr(engine, "depth", 1) is None
            and str(getattr(engine, "device", "")) == "cpu"):
        return net.eval()
    from layerscope.model.source import load_torch_model

    handle = run.handle
    return load_torch_model(handle.source(), handle.family(),
                            trust_remote_code=getattr(handle, "trust_remote_code", False)).eval()


_SENTENCE = (
    "{n_pairs} pair(s) from {data}; {similarity} of {pooling}-pooled embeddings, attributed at {at} by integrated "
    "Jacobians, {steps} steps; baseline: {baseline_text}. Each matrix sums to s(a, b) - [s(r_a, b) + s(a, r_b) - "
    "s(r_a, r_b)] (r: the baseline input); relative completeness error: mean {completeness_relative_error_mean:.3%}, "
    "largest {completeness_relative_error_max:.3%}. Hiding game: the tokens of the top-k pairs deleted, one side at a "
    "time (the controls delete as many tokens per side); AOPC = mean drop over k = 1..{k_max}; {intervals}.")
_HIDING = ("layer", "method", "hide_aopc", "hide_aopc_ci_low", "hide_aopc_ci_high")
_TESTS = ("difference", "ci_low", "ci_high", "p_value")
_PAIRS = ("similarity", "reference_similarity", "target", "matrix_sum", "completeness_error", "relative_error")

# What the reports show: PNG, report.md, report.html and the console all draw this one declaration; each pair
# shown is a typed record, drawn by report/explain_figs.py (its heat map and token attributions).
FIGURES = Figures(
    sentence=_SENTENCE,
    summary_numbers=("pairs_hide_aopc", "random_hide_aopc", "one_sided_hide_aopc", "n_pairs", "steps", "k_max",
                     "completeness_relative_error_mean", "completeness_relative_error_max"),
    curves=(Curve("explain_completeness", (Line("relative_error", "relative error"),), file="completeness_{slug}",
                  x="steps", xlabel="steps", logx=True, group=("pair", "layer"), label="pair {pair} at {layer}",
                  most=12, title="completeness error over steps", ylabel="|matrix sum - target| / |target|",
                  caption="|matrix sum - (similarity - reference terms)| / |similarity - reference terms|, by the "
                          "number of integration steps (the first 12 pairs and points)."),),
    bars=(Bars("explain_hiding", "at {layer}", (Line("hide_aopc", "AOPC"),), split="method", file="hiding",
               title="hiding game: drop when the top pairs' tokens are deleted", ylabel="mean drop of similarity",
               caption="Mean drop of the similarity when the tokens of the top 1..K token pairs are deleted, one "
                       "side at a time (pairs), vs as many tokens per side by one-sided sums or at random; whiskers: "
                       "95% intervals over pairs."),),
    tables=(Table("explain_hiding", _HIDING, numbers=_HIDING[2:], digits=4),
            Table("explain_tests", ("layer", "method_a", "method_b", *_TESTS), numbers=_TESTS, p_values=("p_value",),
                  digits=4),
            Table("explain_pairs", ("pair", "layer", *_PAIRS), key="pair", numbers=_PAIRS, digits=4)),
    page=("explain pairs",),
    records=(PAIRS,),
)


@register
class Explain(Analysis):
    metadata = AnalysisMetadata(
        name="explain",
        reads="model",
        description="Which token pairs make two texts similar: integrated Jacobians (Möller, Nikolaev and Padó "
                    "2023), a token x token matrix that sums to the similarity minus its reference terms",
        inputs=("text_pairs", "engine"),
        main_score="pairs_hide_aopc",
        default_data="none: give a file of pairs, or --pair A B",
        needs_gradients=True,
        figures=FIGURES,
        options=(
            Option("pair", tuple[str, str], None, "one pair to explain: --pair \"text A\" \"text B\" (instead of "
                   "--data, a file of pairs: STS Benchmark, JSONL with sentence1/sentence2, or 'A<TAB>B' lines)"),
            Option("at", str, "raw", "where to attribute: raw (the input word embeddings) and/or layers 0..L "
                   "(the states entering that block; L: the last states), comma-separated, e.g. raw,3"),
            Option("steps", int, 50, "integration points (Riemann midpoint rule) from the baseline to the text"),
            Option("baseline", str, "pad", "the reference input: pad (content tokens' embeddings replaced by the "
                   "pad token's), zero (set to zero) or mask (the mask token's, else unk); special tokens kept",
                   choices=("pad", "zero", "mask")),
            Option("similarity", str, "cosine", "what is explained: cosine, or dot of the pooled embeddings",
                   choices=("cosine", "dot")),
            Option("curve", str, "2,5,10,20,50,100", "numbers of steps at which the completeness error is shown"),
            Option("k", int, 3, "hiding game: the top 1..K token pairs' tokens are deleted"),
            Option("random_draws", int, 5, "hiding game: random deletions averaged per k"),
            Option("max_pairs", int, 0, "explain at most this many pairs of the file (0 = all)"),
            Option("show", int, 12, "pairs kept with their matrices for the heat maps"),
        ),
    )

    def default_poolings(self, handle) -> list[str]:
        return [handle.manifest.default_pooling]

    # ------------------------------------------------------------------ data
    def prepare(self, ctx: Context) -> Pairs:
        from layerscope.data.text_pairs import check_text, read_text_pairs
        from layerscope.vocab.pooling import MASK_POOLINGS

        o = self.options(ctx)
        for name, low in (("steps", 1), ("k", 1), ("random_draws", 1), ("max_pairs", 0), ("show", 0)):
            if int(getattr(o, name)) < low:
                raise InputError(f"--{name.replace('_', '-')} must be at least {low}, not {getattr(o, name)}")
        curve = _steps_list(o.curve, "--curve")
        for p in ctx.spec.poolings or []:
            if p not in MASK_POOLINGS:
                raise InputError(f"--pooling {p}: explain pools inside the gradient; choose from "
                                 f"{', '.join(MASK_POOLINGS)}")
        if o.pair is not None and ctx.spec.data is not None:
            raise InputError("give --pair A B or --data FILE of pairs, not both")
        if o.pair is not None:
            pairs = [(check_text(o.pair[0], "--pair: the first text"), check_text(o.pair[1], "--pair: the second text"))]
            source = "--pair"
        elif ctx.spec.data is not None:
            pairs, source = read_text_pairs(ctx.spec.data), str(ctx.spec.data)
        else:
            raise InputError("give --pair \"text A\" \"text B\", or --data FILE of pairs (STS Benchmark, JSONL with "
                             "sentence1/sentence2, or 'A<TAB>B' lines)")
        if int(o.max_pairs) and len(pairs) > int(o.max_pairs):
            ctx.say(f"explaining the first {o.max_pairs} of {len(pairs)} pairs (--max-pairs)")
            pairs = pairs[:int(o.max_pairs)]
        return Pairs(tuple(pairs), source, tuple(curve))

    # ------------------------------------------------------------------ compute
    def compute(self, ctx: Context, run: ModelRun, data: Pairs) -> dict[str, Any]:
        import torch

        from layerscope.analyses.common import poolings_for
        from layerscope.decoding.heads import model_inputs
        from layerscope.decoding.pair_attribution import (BASELINES, RAW, PairEncoder, attribute_pair, baseline_token,
                                                          completeness_curve)
        from layerscope.decoding.pair_games import play_pair
        from layerscope.decoding.saliency import content_positions
        from layerscope.vocab.pooling import MASK_POOLINGS
        from layerscope.vocab.layers import resolve_layers

        o = self.options(ctx)
        handle = run.handle
        num_layers = run.num_layers
        try:
            at = resolve_layers(o.at, num_layers)
        except InputError as exc:
            raise InputError(f"--at {o.at}: {exc}") from None
        pooling = poolings_for(ctx, run)[0]
        if pooling not in MASK_POOLINGS:
            raise InputError(f"pooling '{pooling}' cannot be differentiated here; give --pooling one of "
                             f"{', '.join(MASK_POOLINGS)}")
        tok = handle.tokenizer()
        special = set(int(i) for i in tok.all_special_ids)
        base_id = baseline_token(tok, o.baseline)
        max_len = ctx.spec.max_length or handle.manifest.max_length
        pairs = data.pairs
        encoded = []
        for n, (ta, tb) in enumerate(pairs, 1):
            a, b = model_inputs(handle, tok, [ta], max_len), model_inputs(handle, tok, [tb], max_len)
            for side, inp, text in (("first", a, ta), ("second", b, tb)):
                if len(content_positions(inp["input_ids"][0].numpy(), special)) == 0:
                    raise InputError(f"pair {n}: the {side} text {text[:40]!r} has no tokens besides special tokens")
            encoded.append((a, b))
        torch.manual_seed(ctx.spec.seed)
        enc = PairEncoder(_load_net(run), num_layers, pooling, o.similarity, frozenset(special), base_id)
        ctx.say(f"explain: {len(pairs)} pair(s) x {len(at)} attribution point(s) x {o.steps} steps; per pair about "
                f"{o.steps} x (tokens of both texts) forward-mode passes per point")
        rng = np.random.default_rng(ctx.spec.seed)
        k_max = int(o.k)

        def sim(x: dict, y: dict) -> float:
            with torch.no_grad():
                gx = enc.embed(x, RAW, enc.word_embeddings(x["input_ids"]))
                gy = enc.embed(y, RAW, enc.word_embeddings(y["input_ids"]))
            return float((gx.double() @ gy.double().t())[0, 0])

        pair_rows, curve_rows, shown = [], [], []
        drops: dict[str, dict[str, list[list[float]]]] = {layer: {} for layer in at}
        for n, (a, b) in enumerate(track(encoded, "explain: pairs")):
            ids_a, ids_b = a["input_ids"][0].numpy(), b["input_ids"][0].numpy()
            ca, cb = content_positions(ids_a, special), content_positions(ids_b, special)
            k_here = min(k_max, len(ca) * len(cb))
            for layer in at:
                res = attribute_pair(enc, a, b, layer, int(o.steps))
                pair_rows.append({"pair": n + 1, "layer": layer, "similarity": res.similarity,
                                  "reference_similarity": res.reference_similarity, "target": res.target,
                                  "matrix_sum": res.total, "completeness_error": res.error,
                                  "relative_error": res.relative_error})
                for row in completeness_curve(enc, a, b, layer, list(data.curve)):
                    curve_rows.append({"pair": n + 1, "layer": layer, **row})
                for method, got in play_pair(sim, a, b, res.matrix, ca, cb, k_here, int(o.random_draws),
                                             rng).items():
                    drops[layer].setdefault(method, []).append(got + [got[-1]] * (k_max - k_here))
                if len(shown) < int(o.show) * len(at):
                    shown.append(ExplainPair(
                        pair=n + 1, layer=layer, text_a=pairs[n][0], text_b=pairs[n][1],
                        tokens_a=tuple(tok.convert_ids_to_tokens(ids_a.tolist())),
                        tokens_b=tuple(tok.convert_ids_to_tokens(ids_b.tolist())),
                        special_a=tuple(int(t) in special for t in ids_a.tolist()),
                        special_b=tuple(int(t) in special for t in ids_b.tolist()),
                        matrix=tuple(map(tuple, np.round(res.matrix, 6).tolist())),
                        rows=tuple(np.round(res.rows, 6).tolist()), cols=tuple(np.round(res.cols, 6).tolist()),
                        similarity=res.similarity, target=res.target, matrix_sum=res.total).to_json())
        hiding, tests = _hiding_tables(drops, k_max, ctx.spec.seed)
        rel = [r["relative_error"] for r in pair_rows if r["relative_error"] is not None]
        from layerscope.analyses.intervals import headline, method as interval_method

        first = {r["method"]: r for r in hiding if r["layer"] == at[0]}
        summary = {
            "pairs_hide_aopc": first["pairs"]["hide_aopc"], "random_hide_aopc": first["random"]["hide_aopc"],
            "one_sided_hide_aopc": first["one-sided"]["hide_aopc"],
            "headline": [headline("token-pair hiding AOPC", first["pairs"], "hide_aopc", f"at {at[0]}"),
                         headline("random hiding AOPC", first["random"], "hide_aopc", "same token counts")],
            "intervals": interval_method(len(pairs), "pairs", ctx.spec.seed),
            "n_pairs": len(pairs), "at": at, "steps": int(o.steps), "pooling": pooling, "similarity": o.similarity,
            "baseline": o.baseline, "baseline_text": BASELINES[o.baseline], "k_max": k_max,
            "completeness_relative_error_mean": float(np.mean(rel)) if rel else None,
            "completeness_relative_error_max": float(np.max(rel)) if rel else None,
            "data": data.source,
        }
        return {"summary": summary, "pairs": shown,
                "tables": {"explain_pairs": pair_rows, "explain_completeness": curve_rows,
                           "explain_hiding": hiding, "explain_tests": tests}}

    def combine(self, ctx: Context, per_model, data: Pairs) -> dict[str, Any]:
        """Where the pairs came from when no file was given (the page header names it)."""
        return {"data": {"origin": "one pair given with --pair", "n": len(data.pairs)}} \
            if data.source == "--pair" else {}

    # ------------------------------------------------------------------ rendering
    def plots(self, results, out_dir: Path) -> list[str]:
        """The declared figures, and a heat map per pair shown (a matrix of its own token labels each)."""
        from layerscope.report.explain_figs import pair_plots
        from layerscope.report.results import as_results

        return super().plots(results, out_dir) + pair_plots(as_results(results, self.metadata.name), Path(out_dir))


def _hiding_tables(drops: dict[str, dict[str, list[list[float]]]], k_max: int, seed: int):
    """Per attribution point and method: the mean drop over k (AOPC) with its 95% interval over pairs, and the
    paired tests of the pair ranking against each control."""
    from layerscope.analyses.intervals import add_interval
    from layerscope.metrics.paired import mean_scorer, paired_bootstrap

    rows, tests = [], []
    for layer, by in drops.items():
        aopc = {m: np.asarray(v, dtype=np.float64).mean(axis=1) for m, v in by.items()}
        n = len(next(iter(aopc.values())))
        for m, v in by.items():
            curve = np.asarray(v, dtype=np.float64).mean(axis=0)
            row = {"layer": layer, "method": m, "pairs": n, "hide_aopc": float(aopc[m].mean()),
                   **{f"drop_k{k + 1}": float(curve[k]) for k in range(k_max)}}
            add_interval(row, "hide_aopc", mean_scorer(aopc[m]) if n >= 2 else None, n, seed=seed)
            rows.append(row)
        for other in ("random", "one-sided"):
            row: dict[str, Any] = {"layer": layer, "method_a": "pairs", "method_b": other, "pairs": n}
            if n >= 2:
                res = paired_bootstrap(mean_scorer(aopc["pairs"]), mean_scorer(aopc[other]), n, seed=seed)
                row.update({"difference": res.difference, "ci_low": res.ci_low, "ci_high": res.ci_high,
                            "ci_method": "paired-bootstrap-percentile", "p_value": res.p_value})
            else:
                row["undefined"] = "a paired test needs at least 2 pairs"
            tests.append(row)
    return rows, tests

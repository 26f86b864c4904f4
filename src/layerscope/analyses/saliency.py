"""``layerscope run saliency``: which input tokens the objective rests on, decoded from each layer.

Objective ``y``: the class logit of a linear probe trained here on frozen final-layer pooled
vectors of a labeled file (``--objective probe``, the default), or the cosine between a text
and ``--reference`` (``--objective similarity``: why are these two close?).

Methods (see ``layerscope.decoding.saliency``): decoded layer saliency ``decoded@l`` at every
chosen layer, plain layer gradient x activation ``gxa@l``, ``grad-x-input`` at the embeddings,
``integrated-gradients`` (from a baseline of mask tokens, not captum's default all-zero embeddings:
the two differ by up to 0.034 and can reorder tokens) and ``random``.  Evaluation: the hiding game (mask the top-k tokens,
the objective should drop) and the revealing game (keep only the top-k, the objective should
recover), k = 1..K.  Needs gradients, so it runs on the torch engine only.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from layerscope.analyses.base import Analysis, AnalysisMetadata, Context, ModelRun, Option, register
from layerscope.errors import InputError
from layerscope.progress import track
from layerscope.report.figures import Bars, Curve, Figures, Line, Listing, Table

BASELINES = ("grad-x-input", "integrated-gradients", "random")


def _family(name: str):
    """Rows of one method family (its layers) and the baselines, which do not depend on the layer."""
    return lambda row: str(row.get("method")).startswith(name + "@") or row.get("method") in BASELINES


def _game(game: str, family: str, column: str, ylabel: str) -> Curve:
    return Curve("saliency_curves", (Line(column, game),), file=f"{game}_{family}_{{slug}}", x="k",
                 xlabel="k (tokens)", group=("method",), where=_family(family), ylabel=ylabel,
                 title=f"{game} game, {family} by layer vs baselines",
                 caption=f"The {game} game: tokens ranked by each method, k = 1..K.")


_METHOD_NUMBERS = ("hide_aopc", "hide_aopc_ci_low", "hide_aopc_ci_high", "reveal_aopc", "reveal_aopc_ci_low",
                   "reveal_aopc_ci_high")

# What the reports show: PNG, report.md, report.html and the console all draw this one declaration.
FIGURES = Figures(
    preface="Token highlights per method: saliency.html, beside this report, and on report.html.",
    sentence="Objective: {objective_text}. Hidden tokens are replaced by {replacement_token}; special tokens are "
             "never hidden. {n_explained} texts explained; mean y full {mean_full:.4f}, with every token hidden "
             "{mean_all_masked:.4f}. Integrated gradients: {ig_steps} steps, mean |sum of attributions - (y - "
             "y_baseline)| = {ig_completeness_gap_mean:.4g}. Best decoded layer {best_decoded_layer}: hiding AOPC "
             "{best_decoded_hide_aopc:.4f} (random {random_hide_aopc:.4f}).",
    summary_numbers=("best_decoded_hide_aopc", "random_hide_aopc", "grad_x_input_hide_aopc",
                     "integrated_gradients_hide_aopc", "k_max", "n_explained", "ig_completeness_gap_mean"),
    curves=(
        Curve("saliency_methods", (Line("hide_aopc", "hide AOPC"),), file="aopc_by_layer_{slug}", group=("kind",),
              where=lambda row: row.get("kind") in ("decoded", "gxa") or row.get("layer") is None, refs="method",
              title="hiding game AOPC by layer", ylabel="mean drop of y over k = 1..K", from_zero=True,
              caption="Mean drop of the objective y when the k most salient tokens are hidden, averaged over "
                      "k = 1..K; higher = the method found the tokens y rests on. Dashed: methods that do not "
                      "depend on the layer."),
        _game("hiding", "decoded", "hide_drop", "mean drop of y (higher = better)"),
        _game("revealing", "decoded", "reveal_value", "mean y with only top-k kept (higher = better)"),
        _game("hiding", "gxa", "hide_drop", "mean drop of y (higher = better)"),
        _game("revealing", "gxa", "reveal_value", "mean y with only top-k kept (higher = better)"),
    ),
    bars=(Bars("saliency_tests", "{method_a} − {method_b}", (Line("difference", "hide AOPC difference",
                                                                   ci=("ci_low", "ci_high")),),
               file="saliency_tests", title="Paired tests between methods: hiding AOPC differences",
               ylabel="difference of hiding AOPC",
               caption="Paired percentile bootstrap on the same texts. The best decoded layer was picked on these "
                       "texts, so its p-values are optimistic."),),
    tables=(Table("saliency_methods", ("method", *_METHOD_NUMBERS), key="method", digits=4,
                  prefixes=("hide_drop_k", "reveal_k", "hide_acc_k", "reveal_acc_k"),
                  numbers=_METHOD_NUMBERS,
                  console=("method", "hide_aopc", "hide_drop_k1", "hide_drop_k3", "hide_drop_k5", "reveal_k1",
                           "reveal_k3", "reveal_k5")),
            Table("saliency_tests", ("method_a", "method_b", "difference", "ci_low", "ci_high", "p_value"),
                  key="method_a", digits=4, p_values=("p_value",),
                  numbers=("difference", "ci_low", "ci_high", "p_value"))),
    listings=(Listing("head", "Decoding head", item="{kind}: {description}", limit=1),
              Listing("probe", "Probe", item="{train_texts} training texts, train accuracy {train_accuracy:.3f}, "
                                             "held-out accuracy {eval_accuracy:.3f}", limit=1)),
    page=("tokens",),
    files=("saliency.html",),
)


def method_tests(per_text: dict[str, dict[str, list[float]]], best: str, seed: int) -> list[dict[str, Any]]:
    """Paired bootstrap of the hiding AOPC between methods on the same texts: the best decoded layer against
    every baseline, and each gradient baseline against random (difference, 95% interval, two-sided p)."""
    from layerscope.metrics.paired import mean_scorer, paired_bootstrap

    pairs = [(best, b) for b in BASELINES] + [(b, "random") for b in BASELINES if b != "random"]
    rows = []
    for a, b in pairs:
        n = len(per_text[a]["hide"])
        row: dict[str, Any] = {"method_a": a, "method_b": b, "texts": n}
        if n >= 2:
            res = paired_bootstrap(mean_scorer(per_text[a]["hide"]), mean_scorer(per_text[b]["hide"]), n, seed=seed)
            row.update({"hide_aopc_a": res.score_a, "hide_aopc_b": res.score_b, "difference": res.difference,
                        "ci_low": res.ci_low, "ci_high": res.ci_high, "ci_method": "paired-bootstrap-percentile",
                        "p_value": res.p_value})
        else:
            row["undefined"] = "a paired test needs at least 2 texts"
        rows.append(row)
    return rows


QUICK = {"max_texts": 10, "ig_steps": 5}  # the small run the cost line offers


def saliency_cost(texts: int, layers: int, *, gxa: bool, ig_steps: int, k: int, random_draws: int) -> str:
    """What a saliency run costs, said before it starts: texts x methods x integrated-gradient steps, the
    model passes per text, and the small run to try first when this one is larger."""
    methods = layers * (2 if gxa else 1) + 2  # decoded (and gxa) per layer, gradient x input, integrated gradients
    rankings = methods + random_draws
    games = 2 * k * rankings + 2  # each ranking's k hidden and k revealed variants, the full and all-hidden text
    line = (f"saliency costs {texts:,} texts x {methods} methods x {ig_steps} integrated-gradient steps: per text "
            f"{1 + ig_steps} forward+backward passes, {layers} layers decoded through the head and up to {games:,} "
            f"masked forward passes for the games; {texts * (1 + ig_steps):,} backward passes in all")
    if texts > QUICK["max_texts"] or ig_steps > QUICK["ig_steps"]:
        line += (f". A quick look first: --max-texts {min(texts, QUICK['max_texts'])} "
                 f"--ig-steps {min(ig_steps, QUICK['ig_steps'])}")
    return line


@register
class Saliency(Analysis):
    metadata = AnalysisMetadata(
        name="saliency",
        reads="model",
        description="Decoded layer saliency (Hou & Castanon 2023) vs gradient baselines, scored by the hiding "
                    "and revealing games",
        inputs=("labeled", "engine"),
        main_score="best_decoded_hide_aopc",
        default_data="sentiment_small.jsonl (built in, 60 pos/neg sentences)",
        needs_gradients=True,
        options=(
            Option("objective", str, "probe", "probe (class logit of a probe on a labeled file) or similarity",
                   choices=("probe", "similarity")),
            Option("reference", str, None, "reference text for --objective similarity"),
            Option("target", str, "predicted", "probe class explained: 'predicted' or a label of the file"),
            Option("k", int, 10, "largest number of tokens hidden / revealed (k = 1..K)"),
            Option("decode", str, "probs", "decoded matrix P: probs (softmax of the head) or logits",
                   choices=("probs", "logits")),
            Option("ig_steps", int, 20, "integrated-gradients steps (Riemann midpoint) from a mask baseline: every "
                   "non-special token replaced by the mask token ([MASK]; else unk, else pad), the one that hides words, not "
                   "captum's default all-zero embeddings, whose attributions differ (by up to 0.034 on minilm) "
                   "and can order tokens differently"),
            Option("random_draws", int, 3, "random rankings averaged for the random baseline"),
            Option("gxa", bool, False, "also play the games with undecoded layer gradient x activation (gxa@l)"),
            Option("eval_fraction", float, 0.5, "share of the labeled texts held out from the probe and explained"),
            Option("max_texts", int, 0, "explain at most this many texts (0 = all)"),
            Option("show", int, 40, "texts kept with their token scores for the HTML page"),
        ),
        figures=FIGURES,
    )

    def default_poolings(self, handle) -> list[str]:
        return [handle.manifest.default_pooling]

    # ------------------------------------------------------------------ data
    def prepare(self, ctx: Context) -> Any:
        from layerscope.data.examples import SENTIMENT, read_labeled, read_texts_field

        o = self.options(ctx)
        objective = o.objective
        if objective not in ("probe", "similarity"):
            raise InputError(f"--objective must be 'probe' or 'similarity', not {objective!r}")
        if o.decode not in ("probs", "logits"):
            raise InputError(f"--decode must be 'probs' or 'logits', not {o.decode!r}")
        for name, low in (("k", 1), ("ig_steps", 1), ("random_draws", 1)):
            if int(getattr(o, name) or 0) < low:
                raise InputError(f"--{name.replace('_', '-')} must be at least {low}, not {getattr(o, name)}")
        if not 0.0 < float(o.eval_fraction) < 1.0:
            raise InputError("--eval-fraction must be between 0 and 1 (exclusive)")
        path = ctx.spec.data or SENTIMENT
        if objective == "similarity":
            ref = o.reference
            if ref is None:
                raise InputError("--objective similarity needs --reference \"a text to compare with\"")
            if not str(ref).strip():
                raise InputError("--reference is empty; give a text to compare with")
            return {"objective": "similarity", "texts": read_texts_field(path, "text"), "labels": None,
                    "reference": str(ref), "path": str(path)}
        if o.reference is not None:
            raise InputError("--reference is for --objective similarity; the probe objective does not use it")
        texts, labels = read_labeled(path)
        classes = sorted(set(labels))
        if len(classes) < 2:
            raise InputError(f"{path}: every text has the label {classes[0]!r}; a probe needs at least two "
                             "classes")
        counts = {c: labels.count(c) for c in classes}
        lonely = [c for c, n in counts.items() if n < 2]
        if lonely:
            raise InputError(f"{path}: label(s) {', '.join(map(repr, lonely))} have a single text; the probe "
                             "needs at least 2 texts per class (one to train on, one to explain)")
        target = o.target
        if target != "predicted" and target not in classes:
            raise InputError(f"--target {target!r} is not a label of the probe; its labels: "
                             f"{', '.join(classes)} (or 'predicted')")
        return {"objective": "probe", "texts": texts, "labels": labels, "classes": classes, "path": str(path)}

    # ------------------------------------------------------------------ compute
    def compute(self, ctx: Context, run: ModelRun, data: Any) -> dict[str, Any]:
        import torch

        from layerscope.analyses.lens import lens_layers
        from layerscope.decoding.games import GameAccumulator, play, ranking
        from layerscope.decoding.heads import load_decoding_model, model_inputs
        from layerscope.decoding.saliency import (Objective, content_positions, evaluate_ids, objective_pooling,
                                                  replacement_token, text_scores)

        o = self.options(ctx)
        k_max = int(o.k)
        names = lens_layers(ctx, run)
        layers = [int(x) for x in names]
        from layerscope.analyses.common import poolings_for

        pooling = poolings_for(ctx, run)[0]
        handle = run.handle
        tok = handle.tokenizer()
        special = set(int(i) for i in tok.all_special_ids)
        repl, repl_str = replacement_token(tok)
        torch.manual_seed(ctx.spec.seed)
        model = load_decoding_model(handle)
        max_len = handle.manifest.max_length

        texts: list[str] = data["texts"]
        encoded = [model_inputs(handle, tok, [t], max_len) for t in texts]
        for i, inp in enumerate(encoded):
            n_content = len(content_positions(inp["input_ids"][0].numpy(), special))
            if n_content == 0:
                raise InputError(f"text {i + 1} ({texts[i][:40]!r}) has no tokens besides special tokens")
            if k_max > n_content:
                raise InputError(f"--k {k_max} is larger than text {i + 1} ({texts[i][:40]!r}), which has "
                                 f"{n_content} tokens besides special tokens; use --k {n_content} or leave that "
                                 "text out")

        def final_pooled(inputs_list):
            out = []
            with torch.inference_mode():
                for inp in inputs_list:
                    h = model.base(**inp, output_hidden_states=True, return_dict=True).hidden_states[-1]
                    out.append(objective_pooling(h, inp["attention_mask"], pooling)[0].float().numpy())
            return np.stack(out)

        extra: dict[str, Any] = {}
        if data["objective"] == "probe":
            from layerscope.decoding.probe import stratified_split, train_probe

            classes = data["classes"]
            y_all = np.array([classes.index(label) for label in data["labels"]])
            train, held = stratified_split(y_all, float(o.eval_fraction), ctx.spec.seed)
            ctx.say(f"training a probe on {len(train)} texts (final layer, {pooling} pooling); explaining "
                    f"{len(held)} held-out texts")
            feats = final_pooled(encoded)
            probe = train_probe(feats[train], y_all[train], classes, seed=ctx.spec.seed)
            eval_acc = float((probe.predict(feats[held]) == y_all[held]).mean())
            objective = Objective("probe", pooling, torch.from_numpy(probe.weight), torch.from_numpy(probe.bias),
                                  labels=classes)
            explain = held.tolist()
            gold = {i: int(y_all[i]) for i in explain}
            fixed = None if o.target == "predicted" else classes.index(o.target)
            extra["probe"] = {"labels": classes, "train_texts": len(train), "eval_texts": len(held),
                              "train_accuracy": probe.train_accuracy, "eval_accuracy": eval_acc,
                              "features": f"final layer, {pooling} pooling", "l2": 1e-3}
            obj_text = (f"probe logit of the {'predicted class' if fixed is None else repr(o.target)} "
                        f"(linear probe on final-layer {pooling} vectors; held-out accuracy {eval_acc:.3f})")
        else:
            ref_inp = model_inputs(handle, tok, [data["reference"]], max_len)
            if len(content_positions(ref_inp["input_ids"][0].numpy(), special)) == 0:
                raise InputError(f"--reference {data['reference']!r} tokenizes to nothing but special tokens; "
                                 "give a text with words in it")
            ref_vec = torch.from_numpy(final_pooled([ref_inp])[0])
            objective = Objective("similarity", pooling, reference=ref_vec)
            explain = list(range(len(texts)))
            gold, fixed = {}, 0
            obj_text = f"cosine to the reference {data['reference']!r} (final layer, {pooling} pooling)"
        max_texts = int(o.max_texts or 0)
        if max_texts > 0 and len(explain) > max_texts:
            ctx.say(f"explaining the first {max_texts} of {len(explain)} texts (--max-texts)")
            explain = explain[:max_texts]

        ctx.say(saliency_cost(len(explain), len(layers), gxa=bool(o.gxa), ig_steps=int(o.ig_steps), k=k_max,
                              random_draws=int(o.random_draws)))
        rng = np.random.default_rng(ctx.spec.seed)
        acc = GameAccumulator(k_max)
        shown, ig_gaps = [], []
        show = int(o.show)
        methods: list[str] = []
        for n_done, i in enumerate(track(explain, "saliency: texts explained")):
            inp = encoded[i]
            ids = inp["input_ids"][0].numpy()
            content = content_positions(ids, special)
            if fixed is None:
                target = int(evaluate_ids(model, inp, inp["input_ids"], objective)[0].argmax())
            else:
                target = fixed
            base_ids = ids.copy()
            base_ids[content] = repl
            scores, info = text_scores(model, inp, objective, layers, target=target,
                                       baseline_ids=torch.from_numpy(base_ids), decode=o.decode,
                                       ig_steps=int(o.ig_steps))
            ig_gaps.append(abs(info["ig_sum"] - info["ig_delta"]))
            if not methods:
                methods = [f"decoded@{x}" for x in layers] + \
                          ([f"gxa@{x}" for x in layers] if o.gxa else []) + ["grad-x-input",
                                                                                    "integrated-gradients"]
            rankings = {m: [ranking(scores[m], content, rng)] for m in methods}
            rankings["random"] = [rng.permutation(content) for _ in range(int(o.random_draws))]

            def evaluate(batch_ids):
                return evaluate_ids(model, inp, torch.from_numpy(batch_ids), objective)

            played = play(evaluate, ids, content, rankings, k_max, repl, target)
            acc.add(played, gold.get(i))
            if len(shown) < show:
                shown.append({
                    "text": texts[i], "tokens": tok.convert_ids_to_tokens(ids.tolist()),
                    "special": [int(t) in special for t in ids.tolist()], "y": info["y"],
                    "label": data["labels"][i] if data["labels"] else None,
                    "target": objective.labels[target] if objective.kind == "probe" else None,
                    "scores": {m: [round(float(v), 6) for v in scores[m]] for m in methods},
                })
            if (n_done + 1) % 10 == 0:
                ctx.say(f"explained {n_done + 1}/{len(explain)} texts")
        curves = acc.curves()
        ref = acc.reference()
        all_methods = methods + ["random"]
        summary_rows, curve_rows = [], []
        from layerscope.analyses.intervals import add_interval, headline, method as interval_method
        from layerscope.metrics.paired import mean_scorer

        per_text = {m: acc.per_text_aopc(m) for m in all_methods}
        for m in all_methods:
            c = curves[m]
            kind, _, layer = m.partition("@")
            row = {"method": m, "kind": kind, "layer": layer or None,
                   "hide_aopc": float(np.mean(c["hide_drop"])), "reveal_aopc": float(np.mean(c["reveal_value"]))}
            for game in ("hide", "reveal"):
                add_interval(row, f"{game}_aopc", mean_scorer(per_text[m][game]), len(explain), seed=ctx.spec.seed)
            for kk in (1, 3, 5):
                if kk <= k_max:
                    row[f"hide_drop_k{kk}"] = c["hide_drop"][kk - 1]
                    row[f"reveal_k{kk}"] = c["reveal_value"][kk - 1]
            if "hide_accuracy" in c:
                row["hide_acc_k3"] = c["hide_accuracy"][min(3, k_max) - 1]
                row["reveal_acc_k3"] = c["reveal_accuracy"][min(3, k_max) - 1]
            summary_rows.append(row)
            for kk in range(1, k_max + 1):
                curve_rows.append({"method": m, "k": kk, **{key: vals[kk - 1] for key, vals in c.items()}})
        decoded = [r for r in summary_rows if r["kind"] == "decoded"]
        best = max(decoded, key=lambda r: r["hide_aopc"])
        by = {r["method"]: r for r in summary_rows}
        tests = method_tests(per_text, best["method"], ctx.spec.seed)
        summary = {
            "headline": [headline("best decoded hiding AOPC", best, "hide_aopc", f"decoded@{best['layer']}"),
                         *(headline(f"{b} hiding AOPC", by[b], "hide_aopc", "no layer") for b in BASELINES)],
            "intervals": interval_method(len(explain), "texts explained", ctx.spec.seed),
            "best_decoded_hide_aopc": best["hide_aopc"], "best_decoded_layer": best["layer"],
            "random_hide_aopc": by["random"]["hide_aopc"],
            "grad_x_input_hide_aopc": by["grad-x-input"]["hide_aopc"],
            "integrated_gradients_hide_aopc": by["integrated-gradients"]["hide_aopc"],
            "objective": data["objective"], "objective_text": obj_text, "pooling": pooling,
            "replacement_token": f"{repl_str} (id {repl})", "k_max": k_max, "decode": o.decode,
            "n_explained": len(explain), "ig_steps": int(o.ig_steps),
            "ig_completeness_gap_mean": float(np.mean(ig_gaps)), **ref,
        }
        return {"summary": summary, "head": model.info.to_dict(), "layers": names, "methods": all_methods,
                "curves": curves, "texts": shown, **extra,
                "tables": {"saliency_methods": summary_rows, "saliency_tests": tests, "saliency_curves": curve_rows}}

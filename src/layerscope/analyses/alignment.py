"""alignment: do two versions of the same texts (two languages, say) line up, at which layer, beyond chance?

Per layer and pooling, over unit-normalised vectors of the paired texts:

* matched mean cosine vs scrambled pairs (the targets under a uniformly random
  permutation): the scrambled mean and std are the permutation distribution's
  exact moments (closed form), z = (matched - scrambled mean) / scrambled std,
  and the effect = matched - scrambled mean in cosine units; ``--permutations N``
  adds a Monte Carlo z from N permutations with its standard error, as a check;
* retrieval both ways (source -> target, target -> source): acc@1/5/10 and
  MRR through FAISS (exact inner-product index; IVF above ``--ann-threshold``
  pairs, with its recall against exact search), exact ties counted as their
  expectation over a random order;
* mutual k-NN: the share of each item's k nearest neighbours shared between
  the source-side and the target-side neighbourhoods;
* PCA over both sides stacked: variance explained by the first components,
  Cohen's d of the source/target split on PC0, and the alignment z within
  the first k = 2, 5, 10 components (centred projections; exact moments);
* per category, the headline figures again;
* for the browser in report.html: the nearest targets of a sample of source texts
  (``--examples`` of them, exact cosine), per layer and pooling.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from layerscope.analyses.base import Analysis, AnalysisMetadata, Context, ModelOutput, ModelRun, Option, register
from layerscope.errors import InputError
from layerscope.index.alignment import PCA_KS, alignment_figures, category_figures
from layerscope.report.figures import Curve, Figures, Line, Table

GENERATORS = ("zh-en",)
# Where aligned pairs come from: shared by every analysis that reads source/target pairs
ALIGNED_DATA_OPTIONS = (
    Option("generate", str, None, "built-in pairs instead of --data: zh-en (math word problems)", choices=GENERATORS),
    Option("n", int, 200, "pairs to generate with --generate"),
    Option("source_file", str, None, "line-aligned source texts (with --target-file)"),
    Option("target_file", str, None, "line-aligned target texts (with --source-file)"),
    Option("source_column", str, "source", "column/field of the source text in --data"),
    Option("target_column", str, "target", "column/field of the target text in --data"),
    Option("category_column", str, "category", "column/field of the category in --data (optional)"),
)
INDEX_KINDS = ("auto", "flat", "ivf", "hnsw")  # retrieval: auto picks exact or IVF by size


LAYERS_TABLE = "alignment_layers"
_SHOWN = ("pooling", "layer", "matched", "scrambled_mean", "z", "z_ci_low", "z_ci_high", "effect", "effect_ci_low",
          "effect_ci_high", "acc@1_src2tgt", "acc@1_src2tgt_ci_low", "acc@1_src2tgt_ci_high", "acc@1_tgt2src",
          "mrr_src2tgt", "ties_src2tgt", "mutual_knn", "pc0_abs_d", "z_pc2", "z_pc10", "index")


def _one_in(n) -> float | None:
    """acc@1's chance level: 1/n for n pairs (None where the summary gives no count)."""
    return 1 / n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None


def _curve(column: str, file: str, title: str, ylabel: str, caption: str, **kw) -> Curve:
    """One figure by layer, a line per model and pooling, in one chart."""
    return Curve(LAYERS_TABLE, (Line(column, column),), file=file, title=title, ylabel=ylabel, caption=caption,
                 per_model=False, group=("pooling",), joiner=" / ", **kw)


# What the reports show: PNG, report.md, report.html and the console all draw this one declaration.
FIGURES = Figures(
    preface="Data: {data.n} pairs from {data.origin}; {data.duplicates} duplicate pairs (kept). {data.notes}",
    sentence="Last layer ({pooling} pooling, layer {layer}): z = {z:.3g} [{headline.0.ci_low:.3g}, "
             "{headline.0.ci_high:.3g}] (effect {headline.1.value:.3g} [{headline.1.ci_low:.3g}, "
             "{headline.1.ci_high:.3g}] in cosine units), acc@1 {acc@1_src2tgt:.3g} [{headline.3.ci_low:.3g}, "
             "{headline.3.ci_high:.3g}] (source -> target), {acc@1_tgt2src:.3g} (target -> source); best z {best_z:.3g} at layer {best_z_layer}. Chance: "
             "z = 0, acc@1 = 1/n = {chance.acc@1:.3g}, MRR = {chance.mrr:.3g}. z: {z_method}. "
             "Nearest neighbours: {faiss}.",
    summary_numbers=("z", "acc@1_src2tgt", "acc@1_tgt2src", "best_z", "n_pairs"),
    curves=(
        _curve("z", "z_by_layer", "matched vs scrambled pairs: z-score by layer", "z (matched - scrambled) / std",
               "z above ~3 means the pairs line up beyond chance.", level=0.0),
        _curve("effect", "effect_by_layer", "matched minus scrambled mean cosine (the size-free effect) by layer",
               "effect (cosine)", "", level=0.0),
        _curve("acc@1_src2tgt", "acc1_by_layer", "retrieval source -> target: accuracy@1 by layer", "accuracy@1", "",
               chance=lambda summary: _one_in(summary.get("n_pairs"))),
        _curve("acc@1_tgt2src", "acc1_tgt2src_by_layer", "retrieval target -> source: accuracy@1 by layer",
               "accuracy@1", "", chance=lambda summary: _one_in(summary.get("n_pairs")), png=False),
        _curve("mrr_src2tgt", "mrr_by_layer", "retrieval source -> target: MRR by layer", "MRR", "",
               chance="chance.mrr", png=False),
        _curve("mutual_knn", "mutual_knn_by_layer", "mutual k-NN overlap of the two sides by layer",
               "share of shared neighbours", "", png=False),
        _curve("pc0_abs_d", "pc0_separation_by_layer", "language split on PC0: |Cohen's d| by layer", "|d| on PC0",
               ""),
    ),
    tables=(Table(LAYERS_TABLE, _SHOWN, prefixes=("z_monte_carlo",),
                  numbers=tuple(c for c in _SHOWN if c not in ("pooling", "layer", "index")),
                  console=("layer", "pooling", "matched", "scrambled_mean", "z", "acc@1_src2tgt", "acc@1_tgt2src",
                           "mutual_knn", "pc0_abs_d")),),
    page=("neighbours",),
)


def nearest_targets(src: np.ndarray, tgt: np.ndarray, queries: np.ndarray, k: int, *,
                    block: int = 65536) -> dict[str, list]:
    """The ``k`` nearest targets (exact cosine; ties to the lower row) of the sources at ``queries``, with
    the targets read in row blocks so that no second copy of them is held."""
    from layerscope.index.vector_index import normalize

    q = normalize(src[queries])
    ids = np.empty((len(q), 0), dtype=np.int64)
    scores = np.empty((len(q), 0), dtype=np.float32)
    for r0 in range(0, tgt.shape[0], block):
        s = q @ normalize(tgt[r0:r0 + block]).T
        ids = np.concatenate([ids, np.broadcast_to(np.arange(r0, r0 + s.shape[1]), s.shape)], axis=1)
        scores = np.concatenate([scores, s], axis=1)
        order = np.lexsort((ids, -scores), axis=1)[:, :k]
        ids, scores = np.take_along_axis(ids, order, 1), np.take_along_axis(scores, order, 1)
    return {"ids": ids.tolist(), "scores": np.round(scores.astype(float), 4).tolist()}


def example_queries(n: int, count: int, seed: int) -> np.ndarray:
    """A fixed sample of ``count`` source rows (all of them when there are fewer), in corpus order."""
    if count >= n:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).choice(n, count, replace=False))


def layer_row(pooling: str, layer: str, f: dict[str, Any]) -> dict[str, Any]:
    """Flatten one layer's figures into a table row."""
    z, r = f["z"], f["retrieval"]
    mc = f.get("z_monte_carlo") or {}
    row: dict[str, Any] = {
        "pooling": pooling, "layer": layer, "n": f["n"], "matched": z["matched"],
        "scrambled_mean": z["scrambled_mean"], "scrambled_std": z["scrambled_std"], "z": z["z"],
        "z_method": Z_METHOD, "effect": z["matched"] - z["scrambled_mean"],
        "z_exact": z["z"],  # the same exact z, under the name model-vs-model comparison reads
        "z_monte_carlo": mc.get("z"), "z_monte_carlo_se": mc.get("z_se"), "n_perm": mc.get("n_perm"),
    }
    for d in ("src2tgt", "tgt2src"):
        for key in ("acc@1", "acc@5", "acc@10", "mrr"):
            row[f"{key}_{d}"] = r[d][key]
        row[f"ties_{d}"] = r[d].get("ties")
        rec = r[d].get("recall_vs_exact")
        row[f"index_recall@10_{d}"] = rec["recall@k"] if rec else None
    row["index"] = r["index"]
    row["mutual_knn"] = f["mutual_knn"]["value"]
    row["mutual_knn_k"] = f["mutual_knn"]["k"]
    pc = f.get("pca", {})
    ratios = pc.get("explained_variance_ratio") or []
    for i in range(3):
        row[f"pc{i}_var"] = ratios[i] if i < len(ratios) else None
    row["pc0_10_var"] = float(sum(ratios)) if ratios else None
    row["pc0_abs_d"] = pc.get("pc0_abs_cohens_d")
    for k in PCA_KS:
        row[f"z_pc{k}"] = (pc.get("z_within") or {}).get(str(k))
    return row


def mrr_chance(n: int) -> float:
    """The MRR of a random ranking of ``n`` candidates: the mean of 1/r over r = 1..n."""
    return float(np.mean(1.0 / np.arange(1, n + 1)))


Z_METHOD = "exact permutation moments"
Z_CI_METHOD = "bootstrap-percentile-pair-terms"
Z_INTERVAL = ("z and effect: percentile bootstrap over the pairs of per-pair terms whose mean is the exact z "
              "(each pair's doubly centred matched cosine, over the exact scrambled std held fixed; the effect "
              "is the same terms in cosine units) -- the spread of this sample's effect in units of its own null "
              "spread, not an interval for a population z (z grows like the square root of n) and without the "
              "error of the scrambled std")


def with_intervals(row: dict[str, Any], f: dict[str, Any], src: np.ndarray, tgt: np.ndarray,
                   seed: int) -> dict[str, Any]:
    """The row with 95% intervals of z, the effect, acc@k and MRR both ways (see analyses/intervals.py).

    z's interval resamples per-pair terms whose mean is the row's exact z: each pair's matched cosine with
    its source's and its target's mean cosine to every text taken out (the doubly centred diagonal of the
    n x n cosines, computed from column sums, never the matrix), over the exact scrambled std held fixed. A
    source close to every target is then no evidence of alignment, as in the permutation z itself.
    (Rescrambling each resample instead would count a pair drawn twice as its own scrambled partner and pull
    every resampled z down.) The same terms in cosine units (times the std) give the effect's interval.
    acc@k are shares of the queries (a tie counts as its expected hit): Wilson intervals. MRR: percentile
    bootstrap of the per-query expected reciprocal ranks.
    """
    from layerscope.analyses.intervals import add_interval, add_share_interval
    from layerscope.index.vector_index import normalize
    from layerscope.metrics.paired import mean_scorer

    n = len(src)
    moments = f["z"]  # the row's exact z: the interval is about the z it reports
    z_scorer = effect_scorer = None
    if moments.get("z") is not None:
        S, T = normalize(src).astype(np.float64), normalize(tgt).astype(np.float64)
        s_sum, t_sum = S.sum(axis=0), T.sum(axis=0)
        grand = float(s_sum @ t_sum) / (n * n)
        centred = np.einsum("ij,ij->i", S, T) - S @ t_sum / n - T @ s_sum / n + grand  # mean: matched - grand
        effect = centred + grand - moments["scrambled_mean"]
        z_scorer = mean_scorer(effect / moments["scrambled_std"])
        effect_scorer = mean_scorer(effect)
    add_interval(row, "z", z_scorer, n, seed=seed, ci_method=Z_CI_METHOD)
    add_interval(row, "effect", effect_scorer, n, seed=seed, ci_method=Z_CI_METHOD)
    for d in ("src2tgt", "tgt2src"):
        ranks = f["retrieval"][d]["ranks"]
        for k in (1, 5, 10):
            add_share_interval(row, f"acc@{k}_{d}", float(ranks.hits(k).sum()), n)
        add_interval(row, f"mrr_{d}", mean_scorer(ranks.reciprocal()), n, seed=seed)
    return row


@register
class Alignment(Analysis):
    metadata = AnalysisMetadata(
        name="alignment",
        reads="vectors",
        description="Do paired texts (two languages, two phrasings) line up layer by layer, beyond chance?",
        inputs=("aligned",),
        main_score="z",
        default_poolings=("last", "mean", "mean-nobos"),
        default_data="zh-en",
        options=(
            *ALIGNED_DATA_OPTIONS,
            Option("permutations", int, 0, "also a Monte Carlo z from this many random permutations, with its "
                   "standard error, as a check on the exact z (0: none)"),
            Option("knn", int, 10, "k for mutual k-NN"),
            Option("ann_threshold", int, 50000, "pairs above which retrieval uses an IVF index, not exact"),
            Option("index", str, "auto", "retrieval index: auto, flat, ivf or hnsw", choices=INDEX_KINDS),
            Option("device", str, "auto", "where FAISS runs: auto, cpu or gpu", choices=("auto", "cpu", "gpu")),
            Option("examples", int, 50, "source texts whose nearest targets per layer are kept for report.html"),
        ),
        figures=FIGURES,
    )

    def default_poolings(self, handle) -> list[str]:
        return list(self.metadata.default_poolings)

    # -- data --------------------------------------------------------------
    def prepare(self, ctx: Context):
        from layerscope.data.aligned import PairSet, read_line_pairs, read_pairs

        o = self.options(ctx)
        for name in ("permutations", "knn", "n", "examples"):
            least = {"permutations": 0, "examples": 0}.get(name, 1)
            if getattr(o, name) is not None and getattr(o, name) < least:
                raise InputError(f"--{name} must be at least {least}, got {getattr(o, name)}")
        if o.permutations == 1:
            raise InputError("--permutations must be 0 (no Monte Carlo check) or at least 2, got 1")
        if o.index not in INDEX_KINDS:
            raise InputError(f"--index must be auto, flat, ivf or hnsw, not {o.index!r}")
        given = [s for s, v in (("--data", ctx.spec.data), ("--generate", o.generate),
                                ("--source-file/--target-file", o.source_file or o.target_file))
                 if v]
        if len(given) > 1:
            raise InputError(f"give one source of pairs, not {' and '.join(given)}")
        if o.source_file or o.target_file:
            if not (o.source_file and o.target_file):
                raise InputError("--source-file and --target-file go together; give both")
            pairs = read_line_pairs(o.source_file, o.target_file)
        elif ctx.spec.data:
            pairs = read_pairs(ctx.spec.data, source=o.source_column, target=o.target_column,
                               category=o.category_column)
        else:
            gen = o.generate or self.metadata.default_data
            if gen not in GENERATORS:
                raise InputError(f"--generate {gen!r} is not a built-in pair set; available: {', '.join(GENERATORS)}")
            from layerscope.data.bilingual import generate_pairs
            from layerscope.data.aligned import pairs_from_records

            gp = generate_pairs(o.n, ctx.spec.seed)
            pairs: PairSet = pairs_from_records(
                [(i + 1, p.source, p.target, p.category, p.id) for i, p in enumerate(gp)],
                f"generated {gen} (n={len(gp)}, seed={ctx.spec.seed})", where="pair")
            pairs.answers = [p.answer for p in gp]
        for note in pairs.notes:
            ctx.say(note)
        ctx.say(f"{len(pairs):,} pairs from {pairs.origin}")
        return pairs

    # -- figures -----------------------------------------------------------
    def compute(self, ctx: Context, run: ModelRun, data) -> ModelOutput:
        from layerscope.analyses.common import layers_for

        from layerscope.analyses.common import poolings_for

        o = self.options(ctx)
        layers = layers_for(ctx, run)
        poolings = poolings_for(ctx, run)
        n = len(data)
        vecs = ctx.vectors(run, data.sources + data.targets, layers=layers, poolings=poolings, tag="alignment")
        cats = sorted(set(data.categories)) if data.categories else []
        cat_idx = {c: np.array([i for i, x in enumerate(data.categories) if x == c]) for c in cats}
        from layerscope.analyses.compare import z_rows_for_comparison
        from layerscope.analyses.intervals import headline, method
        from layerscope.progress import track

        layer_rows, cat_rows, backend = [], [], None
        queries = example_queries(n, o.examples, ctx.spec.seed)
        k_shown = min(5, n)
        shown: dict[str, dict[str, Any]] = {}
        for pooling in poolings:
            for layer in track(layers, f"alignment, {pooling} pooling: layers"):
                v = vecs[pooling, layer]
                src, tgt = v[:n], v[n:]
                f = alignment_figures(src, tgt, n_perm=o.permutations, seed=ctx.spec.seed, knn_k=o.knn,
                                      ann_threshold=o.ann_threshold, index_kind=o.index, device=o.device)
                backend = f["retrieval"].get("backend")
                layer_rows.append(with_intervals(layer_row(pooling, layer, f), f, src, tgt, ctx.spec.seed))
                if len(queries):
                    shown.setdefault(pooling, {})[layer] = nearest_targets(src, tgt, queries, k_shown)
                for c in cats:
                    idx = cat_idx[c]
                    if len(idx) < 2:
                        cat_rows.append({"pooling": pooling, "layer": layer, "category": c, "n": int(len(idx)),
                                         "z": None, "undefined": "fewer than 2 pairs"})
                        continue
                    cf = category_figures(src[idx], tgt[idx], seed=ctx.spec.seed)
                    cat_rows.append({"pooling": pooling, "layer": layer, "category": c, **cf})
        # the headline follows the model's own pooling (a decoder's is 'last'), when it was run
        own = run.handle.manifest.default_pooling
        main = own if own in poolings else "mean" if "mean" in poolings else poolings[0]

        def figures_of(pooling: str) -> dict[str, Any]:
            rows = [r for r in layer_rows if r["pooling"] == pooling]
            ok = [r for r in rows if r["z"] is not None]
            top = max(ok, key=lambda r: r["z"]) if ok else None
            top_acc = max(rows, key=lambda r: r["acc@1_src2tgt"])
            return {"z": rows[-1]["z"], "layer": rows[-1]["layer"],
                    "acc@1_src2tgt": rows[-1]["acc@1_src2tgt"], "acc@1_tgt2src": rows[-1]["acc@1_tgt2src"],
                    "best_z": top["z"] if top else None, "best_z_layer": top["layer"] if top else None,
                    "best_acc@1_src2tgt": top_acc["acc@1_src2tgt"], "best_acc@1_layer": top_acc["layer"]}

        compare = z_rows_for_comparison(run.num_layers, [r for r in layer_rows if r["pooling"] == main], vecs, main, n)
        mine = [r for r in layer_rows if r["pooling"] == main]
        defined = [r for r in mine if r["z"] is not None]
        best = max(defined, key=lambda r: r["z"]) if defined else None
        best_acc = max(mine, key=lambda r: r["acc@1_src2tgt"])
        last = mine[-1]
        summary = {
            "headline": [
                headline("z, last layer", last, "z", f"layer {last['layer']}, {main} pooling", chance=0.0),
                headline("effect (matched - scrambled cosine), last layer", last, "effect",
                         f"layer {last['layer']}, {main} pooling", chance=0.0),
                headline("best z", best, "z", f"layer {best['layer']}, {main} pooling" if best else "", chance=0.0),
                headline("acc@1 source → target, last layer", last, "acc@1_src2tgt",
                         f"layer {last['layer']}, {main} pooling", chance=1 / n),
                headline("best acc@1 source → target", best_acc, "acc@1_src2tgt",
                         f"layer {best_acc['layer']}, {main} pooling", chance=1 / n),
                headline("MRR source → target, last layer", last, "mrr_src2tgt",
                         f"layer {last['layer']}, {main} pooling", chance=mrr_chance(n))],
            "intervals": method(n, "pairs", ctx.spec.seed, shares="acc@k (a tied partner counts its expected hit)")
                         + "; " + Z_INTERVAL,
            "z_method": Z_METHOD + (f"; a Monte Carlo z from {o.permutations} permutations, with its standard "
                                    "error, beside it as a check" if o.permutations else ""),
            "chance": {"z": 0.0, "acc@1": 1 / n, "acc@5": min(1.0, 5 / n), "acc@10": min(1.0, 10 / n),
                       "mrr": mrr_chance(n)},
            "pooling": main,
            "z": mine[-1]["z"], "layer": mine[-1]["layer"],
            "acc@1_src2tgt": mine[-1]["acc@1_src2tgt"], "acc@1_tgt2src": mine[-1]["acc@1_tgt2src"],
            "best_z": best["z"] if best else None, "best_z_layer": best["layer"] if best else None,
            "best_acc@1_src2tgt": best_acc["acc@1_src2tgt"], "best_acc@1_layer": best_acc["layer"],
            "n_pairs": n, "duplicates": data.duplicates, "faiss": backend,
            "by_pooling": {p: figures_of(p) for p in poolings},
        }
        hit = sorted({j for by_layer in shown.values() for got in by_layer.values() for row in got["ids"] for j in row
                      if j >= 0} | {int(q) for q in queries})
        neighbours = {"k": k_shown, "direction": "source -> target", "queries": [int(q) for q in queries],
                      "by": shown, "sources": {str(int(q)): data.sources[q] for q in queries},
                      "targets": {str(j): data.targets[j] for j in hit}}
        return ModelOutput({"summary": summary, "layers": layers, "poolings": poolings, "neighbours": neighbours,
                            "tables": {"alignment_layers": layer_rows, "alignment_categories": cat_rows}},
                           compare=compare)

    def combine(self, ctx: Context, per_model, data) -> dict[str, Any]:
        from layerscope.analyses.compare import compare_models, merge_combined

        info = {"origin": data.origin, "n": len(data), "duplicates": data.duplicates, "notes": data.notes,
                "categories": sorted(set(data.categories)) if data.categories else []}
        several = compare_models(per_model, score="z_exact", score_label="z (exact permutation moments)",
                                 seed=ctx.spec.seed, say=ctx.say)
        if data.answers is not None:
            rows = [{"id": i, "category": c, "source": s, "target": t, "answer": a}
                    for i, c, s, t, a in zip(data.ids, data.categories, data.sources, data.targets, data.answers)]
            return merge_combined({"data": info, "tables": {"pairs": rows}}, several)
        return merge_combined({"data": info}, several)

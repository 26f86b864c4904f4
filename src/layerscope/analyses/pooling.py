"""``pooling``: which vector to take, and how far it can be squeezed.

On an STS set (cosine vs human score, Spearman) and on a retrieval set made from
it (each pair's first sentence is a query whose relevant document is its partner,
and the other way round; documents are the distinct sentences of the other side),
compare the vector choices: cls, mean, last, max and eos (where the model has its
own pooled output) at the final layer, the mean of the last four layers' mean
vectors, and the second-to-last layer's mean vector.

Then squeeze every choice: binary sign bits scored by Hamming similarity (retrieval
through a FAISS binary index), int8 scalar quantization (per-dimension min/max
calibrated on the set's own sentences), and truncation to the first k dimensions
(k = 32, 64, 128, ..., full); each reported as the share of float32 quality it keeps.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from layerscope.analyses.base import Analysis, AnalysisMetadata, Context, ModelOutput, ModelRun, Option, register
from layerscope.analyses.common import PAIR_COLUMN_OPTIONS, poolings_for, similarity_correlations
from layerscope.analyses.sts import data_on
from layerscope.errors import InputError
from layerscope.report.figures import Bars, Curve, Figures, Line, Table


def _choice_bars(metric: str, name: str) -> Bars:
    return Bars("variants", "variant", (Line(metric, name),), file=f"pooling_{metric}",
                title=f"{name}{{about}} by vector choice (float32)", ylabel=f"{name}{{about}}",
                caption="Each bar is one pooling@layer choice; retrieval queries are both sides of every pair, the "
                        "relevant document the partner.")


def _kept(metric: str, name: str) -> Curve:
    return Curve("truncation", (Line(metric, name),), file=f"pooling_truncation_{metric}", x="dims", logx=True,
                 xlabel="dimensions kept", group=("variant",), per_model=False, level=1.0,
                 title=f"Truncation to the first k dimensions: {name}", ylabel=name,
                 caption="Vectors cut to their first k dimensions; 1 = the full float32 vector's score.")


_VARIANTS = ("variant", "spearman", "spearman_ci_low", "spearman_ci_high", "pearson", "acc@1", "acc@10", "mrr")
_QUANTIZED = ("variant", "method", "bytes_per_vector", "spearman", "retention_spearman", "mrr", "retention_mrr")
_TRUNCATED = ("variant", "dims", "spearman", "retention_spearman", "mrr", "retention_mrr")

# What the reports show: PNG, report.md, report.html and the console all draw this one declaration.
FIGURES = Figures(
    preface="Quantized embeddings: binary is sign bits, Hamming similarity, retrieval through a FAISS binary flat "
            "index; int8 is per-dimension min/max scalar quantization calibrated on a held-out half of the texts.",
    sentence="STS: {pairs} pairs, cosine vs human score (Spearman). Retrieval: {retrieval.queries} queries (both "
             "sides of every pair) against the distinct sentences of the other side ({retrieval.documents} "
             "documents); the relevant document is the pair partner; exact ties count as their expectation over a "
             "random order of the tied documents. Best for STS: {best_variant} (Spearman {best_spearman:.4f}). Best "
             "for retrieval: {best_retrieval_variant} (MRR {best_mrr:.4f}). Notes: {notes}.",
    summary_numbers=("pairs", "best_spearman", "best_mrr"),
    curves=(_kept("retention_spearman", "share of float32 STS Spearman kept"),
            _kept("retention_mrr", "share of float32 retrieval MRR kept")),
    bars=(_choice_bars("spearman", "STS Spearman"), _choice_bars("mrr", "retrieval MRR"),
          Bars("quantization", "variant", (Line("retention_spearman", "Spearman"), Line("retention_mrr", "MRR")),
               split="method", where=lambda row: row.get("method") != "float32",
               file="pooling_quantization_retention", title="Quantized embeddings: share of float32 quality kept",
               ylabel="retention", caption="binary (1 bit per dimension) and int8 embeddings, as a share of the "
                                           "float32 score.")),
    tables=(Table("variants", _VARIANTS, key="variant", digits=4, numbers=_VARIANTS[1:],
                  console=("variant", "spearman", "mrr", "acc@1")),
            Table("quantization", _QUANTIZED, key="variant", digits=4, numbers=_QUANTIZED[2:],
                  console=("variant", "method", "retention_spearman", "retention_mrr")),
            Table("truncation", _TRUNCATED, key="variant", digits=4, numbers=_TRUNCATED[1:])),
    about=data_on,
)

KS = (1, 10)


def truncation_sizes(hidden: int) -> list[int]:
    """32, 64, 128, ... below ``hidden``, then ``hidden`` itself."""
    ks, k = [], 32
    while k < hidden:
        ks.append(k)
        k *= 2
    return ks + [hidden]


RELEVANT_SCORE = 4.0  # STS 0-5: "mostly equivalent" and above


class RetrievalSet:
    """Queries (pair sides) against the distinct sentences of the other side, both directions.

    Only pairs whose human score is at least ``min_score`` are queries: an unrelated pair (scored 0) is no
    match to find.  Every distinct sentence of the other side stays a document (a distractor)."""

    def __init__(self, pairs, min_score: float = RELEVANT_SCORE):
        texts, i1, i2 = pairs.unique_texts()
        self.texts = texts
        self.min_score = float(min_score)
        relevant = np.asarray(pairs.scores, dtype=np.float64) >= self.min_score
        self.relevant_pairs = int(relevant.sum())
        self.directions = []
        for q_idx, d_idx in ((i1, i2), (i2, i1)):
            docs, correct = np.unique(d_idx, return_inverse=True)
            self.directions.append((np.asarray(q_idx)[relevant], docs, correct.astype(np.int64)[relevant]))

    def describe(self) -> dict:
        return {"queries": int(sum(len(q) for q, _, _ in self.directions)),
                "documents": [int(len(d)) for _, d, _ in self.directions],
                "relevant_score": self.min_score, "relevant_pairs": self.relevant_pairs}


def int8_held_out(v: np.ndarray, seed: int) -> np.ndarray:
    """int8 round trip of every row with per-dimension ranges calibrated on the other half of the rows (two
    folds, seeded): no vector is encoded with ranges made from itself, as in use, where the ranges come from
    a sample before the corpus is indexed."""
    from layerscope.metrics.quantization import int8_dequantize, int8_quantize

    if len(v) < 2:
        raise InputError("int8 calibration on a held-out half needs at least 2 texts")
    order = np.random.default_rng(seed).permutation(len(v))
    halves = (order[: len(v) // 2], order[len(v) // 2:])
    out = np.empty_like(v, dtype=np.float32)
    for rows, calibration in ((halves[0], halves[1]), (halves[1], halves[0])):
        q, scale, offset = int8_quantize(v[rows], calibration=v[calibration])
        out[rows] = int8_dequantize(q, scale, offset)
    return out


def _retrieval_float(vectors: np.ndarray, rs: RetrievalSet) -> dict:
    from layerscope.metrics.neighbors import TiedRanks, cosine_tie_counts, retrieval_metrics
    from layerscope.metrics.vectors import l2_normalize

    unit = l2_normalize(vectors.astype(np.float64))
    ranks = [cosine_tie_counts(unit[q], unit[d], c) for q, d, c in rs.directions]
    return retrieval_metrics(TiedRanks(np.concatenate([r.above for r in ranks]),
                                       np.concatenate([r.tied for r in ranks])), ks=KS)


def _retrieval_binary(codes: np.ndarray, dim: int, rs: RetrievalSet) -> dict:
    """Hamming-distance retrieval over packed sign codes; ties count as their expectation over a random order."""
    from layerscope.metrics.neighbors import TiedRanks, hamming_tied_ranks, retrieval_metrics

    ranks = [hamming_tied_ranks(codes[q], codes[d], c) for q, d, c in rs.directions]
    return retrieval_metrics(TiedRanks(np.concatenate([r.above for r in ranks]),
                                       np.concatenate([r.tied for r in ranks])), ks=KS)


@register
class Pooling(Analysis):
    metadata = AnalysisMetadata(
        name="pooling",
        reads="vectors",
        description="Which vector to take (pooling, layers) and how far it can be squeezed (binary, int8, truncation)",
        inputs=("pairs",),
        main_score="best_spearman",
        default_poolings=("cls", "mean", "last", "max"),
        default_data="../shared/data/stsbenchmark/sts-test.csv",
        options=(
            *PAIR_COLUMN_OPTIONS,
            Option("n_boot", int, 1000, "bootstrap resamples for the float32 Spearman intervals (0: none)"),
            Option("relevant_score", float, RELEVANT_SCORE, "retrieval counts a pair as a match to find only when "
                   "its human score is at least this (STS scores run 0-5)"),
        ),
        figures=FIGURES,
    )

    def default_data_file(self) -> str:
        from layerscope.data.pairs import default_sts_file

        return str(default_sts_file("test"))

    def prepare(self, ctx: Context):
        from layerscope.data.pairs import read_pairs

        if ctx.spec.layers not in (None, "all"):
            raise InputError("--layers: the pooling analysis compares fixed layer choices (final, second-to-last, "
                             "mean of the last four); drop --layers")
        if self.options(ctx).n_boot < 0:
            raise InputError("--n-boot must be >= 0")
        data = ctx.spec.data
        o = self.options(ctx)
        pairs = read_pairs(data, sentence1=o.sentence1, sentence2=o.sentence2, score=o.score)
        ctx.say(f"{data}: {len(pairs)} pairs")
        least = RELEVANT_SCORE if o.relevant_score is None else o.relevant_score
        if not (np.asarray(pairs.scores, dtype=np.float64) >= least).any():
            raise InputError(f"no pair in {data} has a score of at least {least} (--relevant-score), so retrieval "
                             f"has nothing to find; scores run {min(pairs.scores)} to {max(pairs.scores)}")
        return pairs

    def compute(self, ctx: Context, run: ModelRun, pairs) -> ModelOutput:
        from layerscope.metrics.quantization import binary_quantize, hamming_similarity, retention, truncate_dims
        from layerscope.metrics.vectors import paired_cosine

        L = run.num_layers
        poolings = poolings_for(ctx, run)
        notes = []
        if run.handle.manifest.pooled_output:
            if "eos" not in poolings:
                poolings.append("eos")
        else:
            notes.append(f"eos: {run.handle.manifest.family} has no pooled output of its own, so there is "
                         "no eos vector (its last token is 'last')")
        last4 = [str(i) for i in range(max(1, L - 3), L + 1)]
        layers = list(dict.fromkeys(last4 + ([str(L - 1)] if L >= 2 else [])))
        need_pool = list(dict.fromkeys(poolings + ["mean"]))
        least = self.options(ctx).relevant_score
        rs = RetrievalSet(pairs, RELEVANT_SCORE if least is None else least)
        notes.append(f"retrieval: {rs.relevant_pairs} of {len(pairs)} pairs have a score of at least {rs.min_score:g} "
                     "and are the matches to find; int8 ranges are calibrated on a held-out half of the texts "
                     "(two folds), never on the vectors they encode")
        vecs = ctx.vectors(run, rs.texts, layers=layers, poolings=need_pool, tag="pooling")
        _, i1, i2 = pairs.unique_texts()
        variants: list[tuple[str, str, str, np.ndarray]] = [(f"{p}@{L}", p, str(L), vecs[p, str(L)]) for p in poolings]
        if len(last4) > 1:
            variants.append(("mean@last4", "mean", "+".join(last4),
                             np.mean([vecs["mean", layer] for layer in last4], axis=0).astype(np.float32)))
        if L >= 2:
            variants.append((f"mean@{L - 1}", "mean", str(L - 1), vecs["mean", str(L - 1)]))
        n_boot = self.options(ctx).n_boot
        hidden = run.handle.manifest.hidden_size
        var_rows, quant_rows, trunc_rows, sims_by = [], [], [], {}
        for name, pool, layer_desc, v in variants:
            sims = sims_by[pool, _choice(layer_desc, L)] = paired_cosine(v[i1], v[i2])
            corr = similarity_correlations(sims, pairs.scores, n_boot=n_boot, seed=ctx.spec.seed)
            ret = _retrieval_float(v, rs)
            var_rows.append({"variant": name, "pooling": pool, "layers": layer_desc, **corr, **ret})
            base = {"spearman": corr["spearman"], **ret}

            def quant(method: str, bits: int, sims_q: np.ndarray, ret_q: dict) -> None:
                c = similarity_correlations(sims_q, pairs.scores, n_boot=0, seed=ctx.spec.seed)
                row = {"variant": name, "method": method, "bits_per_dim": bits, "bytes_per_vector": hidden * bits // 8,
                       "spearman": c["spearman"], "mrr": ret_q["mrr"], "acc@1": ret_q["acc@1"],
                       "acc@10": ret_q["acc@10"], "undefined": c["undefined"]}
                for key in ("spearman", "mrr", "acc@1"):
                    ok = row[key] is not None and base[key] is not None
                    row[f"retention_{key}"] = retention(row[key], base[key]) if ok else None
                quant_rows.append(row)

            quant("float32", 32, sims, ret)
            codes = binary_quantize(v)
            quant("binary", 1, hamming_similarity(codes[i1], codes[i2], dim=hidden), _retrieval_binary(codes, hidden, rs))
            deq = int8_held_out(v, ctx.spec.seed)
            quant("int8", 8, paired_cosine(deq[i1], deq[i2]), _retrieval_float(deq, rs))
            for k in truncation_sizes(hidden):
                t = np.ascontiguousarray(truncate_dims(v, k))
                c = similarity_correlations(paired_cosine(t[i1], t[i2]), pairs.scores, n_boot=0, seed=ctx.spec.seed)
                rk = _retrieval_float(t, rs)
                trunc_rows.append({
                    "variant": name, "dims": k, "spearman": c["spearman"], "mrr": rk["mrr"], "acc@1": rk["acc@1"],
                    "retention_spearman": (retention(c["spearman"], base["spearman"])
                                           if c["spearman"] is not None and base["spearman"] is not None else None),
                    "retention_mrr": retention(rk["mrr"], base["mrr"]), "undefined": c["undefined"]})
        from layerscope.analyses.compare import correlation_rows

        compare = correlation_rows(L, [{**r, "layer": _choice(r["layers"], L)} for r in var_rows], sims_by,
                                   pairs.scores)  # for model vs model, matched by choice (final, last4, ...)
        defined = [r for r in var_rows if r["spearman"] is not None]
        best = max(defined, key=lambda r: r["spearman"]) if defined else None
        best_ret = max(var_rows, key=lambda r: r["mrr"])
        default = f"{run.handle.manifest.default_pooling}@{L}"
        if default not in {r["variant"] for r in var_rows}:
            default = var_rows[0]["variant"]
        keep = {r["method"]: {k: r[k] for k in ("retention_spearman", "retention_mrr", "retention_acc@1")}
                for r in quant_rows if r["variant"] == default and r["method"] != "float32"}
        summary = {"pairs": len(pairs), "retrieval": rs.describe(),
                   "best_spearman": best["spearman"] if best else None,
                   "best_variant": best["variant"] if best else None,
                   "best_retrieval_variant": best_ret["variant"], "best_mrr": best_ret["mrr"],
                   "default_variant": default, "retention_default": keep, "notes": notes}
        return ModelOutput({"summary": summary,
                            "tables": {"variants": var_rows, "quantization": quant_rows, "truncation": trunc_rows}},
                           compare=compare)

    def combine(self, ctx: Context, per_model, data) -> dict[str, Any]:
        from layerscope.analyses.compare import compare_models

        return compare_models(per_model, score="spearman", score_label="STS Spearman (float32)",
                              n_resamples=self.options(ctx).n_boot, seed=ctx.spec.seed, say=ctx.say)


def _choice(layers: str, num_layers: int) -> str:
    """A variant's layers as a choice that means the same in a model of any depth."""
    if "+" in layers:
        return "last4"
    return "final" if layers == str(num_layers) else "second-to-last" if layers == str(num_layers - 1) else layers

"""``sts``: which layer knows semantic similarity?

Per layer (``raw`` and ``0`` included) and pooling: the cosine of each pair's two
sentence vectors against the human score, as Pearson and Spearman with p-values
and bootstrap 95% intervals. With ``--probe``, small learned similarity models over
the frozen per-layer vectors (see ``probe.py``) are trained on a train split and
scored on the test split next to the best single layer and the final layer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from layerscope.analyses.base import Analysis, AnalysisMetadata, Context, ModelOutput, ModelRun, Option, register
from layerscope.analyses.common import PAIR_COLUMN_OPTIONS, best_row, layers_for, poolings_for, similarity_correlations
from layerscope.analyses.probe import KINDS as PROBE_KINDS
from layerscope.analyses.probe import LOSSES as PROBE_LOSSES
from layerscope.errors import InputError
from layerscope.report.figures import Bars, Curve, Figures, Line, Listing, Table


def data_on(results) -> str:
    """`` (on FILE)`` for titles and axis labels: the data file of typed ``results``, as the run recorded it."""
    from pathlib import PurePath

    data = results.settings.data or next((s for s in (fig.summary.get("data") for fig in results.per_model.values())
                                          if isinstance(s, dict) and s.get("source")), {}).get("source")
    return f" (on {PurePath(str(data).replace(chr(92), '/')).name})" if data else ""


def _by_layer(column: str, name: str) -> Curve:
    return Curve("layers", (Line(column, name),), file=f"sts_{column}_by_layer", per_model=False, group=("pooling",),
                 joiner=" / ", title=f"STS: {name} correlation of cosine vs human score, by layer",
                 ylabel=f"{name}{{about}}",
                 caption=f"{name} correlation between the cosine of each pair's two sentence vectors and the human "
                         "similarity score. Band: 95% pair bootstrap interval.")


_PROBE_NOTE = ("Trained on {train_pairs} pairs (dev: {dev_pairs}), scored on {test_pairs} test pairs; {pooling} "
               "pooling, layers {layers}. The 'best layer on {layer_chosen_on}' baseline picks its layer without "
               "seeing the test scores; 'best layer on test' is the optimistic oracle.")

# What the reports show: PNG, report.md, report.html and the console all draw this one declaration.
FIGURES = Figures(
    sentence="{pairs:,} pairs. Cosine similarity of the two sentence vectors vs the human score; 95% intervals from "
             "a pair bootstrap. Best layer: {best.layer} with {best.pooling} pooling, Spearman {best.spearman:.4f} "
             "(Pearson {best.pearson:.4f}).",
    summary_numbers=("pairs", "best_spearman"),
    curves=(_by_layer("spearman", "Spearman"), _by_layer("pearson", "Pearson")),
    bars=(Bars("probe.rows", "name", (Line("spearman", "Spearman"),), file="sts_probe", by_model=True,
               title="STS Spearman{about}: learned probes vs single layers", ylabel="Spearman{about}",
               caption="Spearman correlation of each probe and of the best single layers on the test split."),),
    tables=(Table("layers", ("pooling", "layer", "spearman", "spearman_ci_low", "spearman_ci_high", "pearson",
                             "spearman_p", "mean_similarity"), digits=4, p_values=("spearman_p",),
                  numbers=("spearman", "spearman_ci_low", "spearman_ci_high", "pearson", "spearman_p",
                           "mean_similarity"),
                  console=("layer", "pooling", "spearman", "spearman_ci_low", "spearman_ci_high")),
            Table("probe.rows", ("name", "spearman", "pearson", "spearman_ci_low", "spearman_ci_high", "epochs"),
                  key="name", digits=4, numbers=("spearman", "pearson", "spearman_ci_low", "spearman_ci_high"),
                  console=("name", "spearman", "pearson"))),
    listings=(Listing("layers", "Undefined correlations", item="undefined at layer {layer}, {pooling}: {undefined}",
                      where="undefined", limit=1000, html_limit=1000),
              Listing("probe", "Learned probes", item=_PROBE_NOTE, limit=1)),
    about=data_on,
)


def _sibling(data: str, split: str, given: str | None, flag: str, required: bool) -> str | None:
    if given:
        if not Path(given).exists() and "/" not in given:
            raise InputError(f"{flag} {given}: no such file")
        return given
    guess = Path(data).parent / f"sts-{split}.csv"
    if Path(data).exists() and guess.exists():
        return str(guess)
    if required:
        raise InputError(f"--probe needs a train split: give {flag} FILE (there is no {guess.name} next to {data})")
    return None


def _best_layer(cosines: np.ndarray, y: np.ndarray) -> int:
    """The column (layer) of ``cosines [pairs, layers]`` whose Spearman with ``y`` is highest; a constant
    column (a collapsed layer) is never chosen."""
    from scipy.stats import spearmanr

    scores = [float(spearmanr(col, y)[0]) if np.ptp(col) > 1e-6 else -np.inf for col in cosines.T]
    return int(np.argmax(scores))


def sts_headline(rows: list[dict], best: dict | None, final: str) -> list[dict]:
    """The best Spearman and each pooling's final-layer Spearman, with their intervals, for the reports."""
    from layerscope.analyses.intervals import headline

    heads = [headline("best Spearman", best, "spearman",
                      f"layer {best['layer']}, {best['pooling']} pooling" if best else "")]
    heads += [headline("Spearman, final layer", r, "spearman", f"layer {final}, {r['pooling']} pooling")
              for r in rows if r["layer"] == final]
    return heads


@register
class STS(Analysis):
    metadata = AnalysisMetadata(
        name="sts",
        reads="vectors",
        description="Which layer knows semantic similarity: cosine of sentence pairs vs human scores, per layer",
        inputs=("pairs",),
        main_score="best_spearman",
        default_poolings=("mean", "cls"),
        default_data="../shared/data/stsbenchmark/sts-test.csv",
        options=(
            *PAIR_COLUMN_OPTIONS,
            Option("n_boot", int, 1000, "bootstrap resamples for the 95% intervals (0: none)"),
            Option("probe", bool, False, "also train learned similarity probes over the per-layer vectors"),
            Option("train", str, None, "probe train split (default: sts-train.csv next to --data)"),
            Option("dev", str, None, "probe dev split for early stopping (default: sts-dev.csv next to --data)"),
            Option("probe_kind", str, "all", "which probes: one kind, or all", choices=("all", *PROBE_KINDS)),
            Option("probe_loss", str, "mse", "probe training loss (logvar: log-variance of the residuals)",
                   choices=PROBE_LOSSES),
            Option("pretrain", bool, False, "pretrain the siamese encoders as per-layer autoencoders"),
            Option("probe_epochs", int, None, "most probe training epochs (default 200 cosine-mlp, 30 siamese; "
                   "early stopping on dev)"),
        ),
        figures=FIGURES,
    )

    # ------------------------------------------------------------ data
    def default_data_file(self) -> str:
        from layerscope.data.pairs import default_sts_file

        return str(default_sts_file("test"))

    def prepare(self, ctx: Context) -> dict[str, Any]:
        from layerscope.analyses.probe import KINDS, LOSSES
        from layerscope.data.pairs import read_pairs

        o = self.options(ctx)
        if o.n_boot < 0:
            raise InputError("--n-boot must be >= 0")
        data = ctx.spec.data
        cols = dict(sentence1=o.sentence1, sentence2=o.sentence2, score=o.score)
        out: dict[str, Any] = {"test": read_pairs(data, **cols)}
        if o.probe:
            if o.probe_kind != "all" and o.probe_kind not in KINDS:
                raise InputError(f"--probe-kind {o.probe_kind}: choose from {', '.join(KINDS)} or all")
            if o.probe_loss not in LOSSES:
                raise InputError(f"--probe-loss {o.probe_loss}: choose from {', '.join(LOSSES)}")
            if o.probe_epochs is not None and o.probe_epochs < 1:
                raise InputError("--probe-epochs must be >= 1")
            train = _sibling(data, "train", o.train, "--train", True)
            dev = _sibling(data, "dev", o.dev, "--dev", False)
            out["train"] = read_pairs(train, **cols)
            out["dev"] = read_pairs(dev, **cols) if dev else None
            ctx.say(f"probe data: train {train} ({len(out['train'])} pairs), "
                    f"dev {dev or '(none: fixed epochs, no early stopping)'}")
        ctx.say(f"{data}: {len(out['test'])} pairs ({out['test'].fmt} format)")
        return out

    # ------------------------------------------------------------ compute
    def default_poolings(self, handle) -> list[str]:
        """The family's own when it has them (decoders: last and mean; CLIP: eos), else mean and cls."""
        from layerscope.vocab.pooling import family_poolings

        return family_poolings(handle.manifest, self.metadata.default_poolings)

    def compute(self, ctx: Context, run: ModelRun, data: dict[str, Any]) -> ModelOutput:
        from layerscope.analyses.compare import correlation_rows
        from layerscope.metrics.vectors import paired_cosine

        pairs = data["test"]
        layers = layers_for(ctx, run)
        poolings = poolings_for(ctx, run)
        n_boot = self.options(ctx).n_boot
        texts, i1, i2 = pairs.unique_texts()
        vecs = ctx.vectors(run, texts, layers=layers, poolings=poolings, tag="sts")
        rows, sims_by = [], {}
        for p in poolings:
            for layer in layers:
                v = vecs[p, layer]
                sims = sims_by[p, layer] = paired_cosine(v[i1], v[i2])
                rows.append({"pooling": p, "layer": layer,
                             **similarity_correlations(sims, pairs.scores, n_boot=n_boot, seed=ctx.spec.seed)})
        compare = correlation_rows(run.num_layers, rows, sims_by, pairs.scores)  # for model vs model
        final = str(run.num_layers)
        by_pooling = {}
        for p in poolings:
            prow = [r for r in rows if r["pooling"] == p]
            b = best_row(prow, "spearman")
            f = next((r for r in prow if r["layer"] == final), None)
            by_pooling[p] = {"best_layer": b["layer"] if b else None, "best_spearman": b["spearman"] if b else None,
                             "final_layer": final if f else None,
                             "final_spearman": f["spearman"] if f else None,
                             "final_pearson": f["pearson"] if f else None}
        best = best_row(rows, "spearman")
        summary = {"pairs": len(pairs), "best_spearman": best["spearman"] if best else None,
                   "best": {k: best[k] for k in ("pooling", "layer", "spearman", "pearson")} if best else None,
                   "by_pooling": by_pooling, "data": pairs.describe(),
                   "headline": sts_headline(rows, best, final),
                   "intervals": f"95% percentile bootstrap over the {len(pairs):,} pairs ({n_boot} resamples, "
                                f"scipy.stats.bootstrap, seed {ctx.spec.seed})" if n_boot else None}
        figures: dict[str, Any] = {"summary": summary, "tables": {"layers": rows}}
        if self.options(ctx).probe:
            # each split's texts pass through the model once, for every pooling at once
            splits = {"train": self._split_vectors(ctx, run, data["train"], layers, poolings, "sts-train"),
                      "dev": self._split_vectors(ctx, run, data["dev"], layers, poolings, "sts-dev")
                      if data.get("dev") else None}
            figures["probe"] = _every_pooling([self._probe(ctx, run, data, layers, p, vecs, i1, i2, n_boot, splits)
                                               for p in poolings])
            figures["tables"]["probe"] = figures["probe"]["rows"]
            summary["probe_spearman"] = {r["name"]: r["spearman"] for r in figures["probe"]["rows"]}
        return ModelOutput(figures, compare=compare)

    def combine(self, ctx: Context, per_model, data) -> dict[str, Any]:
        from layerscope.analyses.compare import compare_models

        return compare_models(per_model, score="spearman", score_label="Spearman",
                              n_resamples=self.options(ctx).n_boot, seed=ctx.spec.seed, say=ctx.say)

    @staticmethod
    def _split_vectors(ctx, run, pairs, layers, poolings, tag):
        """``(vectors by (pooling, layer), i1, i2)`` of a split's distinct texts, every pooling in one pass."""
        texts, i1, i2 = pairs.unique_texts()
        return ctx.vectors(run, texts, layers=layers, poolings=poolings, tag=tag), i1, i2

    @staticmethod
    def _split(pairs, layers, pooling, vecs, idx):
        from layerscope.analyses.probe import PairSplit

        i1, i2 = idx
        a = np.stack([vecs[pooling, layer][i1] for layer in layers])
        b = np.stack([vecs[pooling, layer][i2] for layer in layers])
        return PairSplit(a, b, pairs.scores), vecs

    def _probe(self, ctx, run, data, layers, pooling, test_vecs, i1, i2, n_boot, splits) -> dict[str, Any]:
        from layerscope.metrics.vectors import paired_cosine
        from layerscope.analyses.probe import KINDS, ProbeConfig, train_probe
        from layerscope.metrics.vectors import layer_cosines

        o = self.options(ctx)
        test, _ = self._split(data["test"], layers, pooling, test_vecs, (i1, i2))
        train_vecs, *train_idx = splits["train"]
        train, _ = self._split(data["train"], layers, pooling, train_vecs, train_idx)
        dev = self._split(data["dev"], layers, pooling, splits["dev"][0], splits["dev"][1:])[0] \
            if splits["dev"] is not None else None
        kinds = list(KINDS) if o.probe_kind == "all" else [o.probe_kind]
        rows: list[dict[str, Any]] = []
        records = {}

        def score(name: str, sims: np.ndarray, extra: dict) -> None:
            rows.append({"name": name, **extra,
                         **similarity_correlations(sims, test.y, n_boot=n_boot, seed=ctx.spec.seed)})

        for kind in kinds:
            cfg = ProbeConfig(kind=kind, loss=o.probe_loss, epochs=o.probe_epochs,
                              pretrain=o.pretrain and kind == "siamese", seed=ctx.spec.seed)
            unlabeled = None
            if cfg.pretrain:  # the train split's sentences, without their scores
                unlabeled = np.stack([train_vecs[pooling, layer] for layer in layers])
            ctx.say(f"training probe {kind} (loss {cfg.loss}{', autoencoder pretraining' if cfg.pretrain else ''})")
            rec = train_probe(train, test, cfg, dev=dev, unlabeled=unlabeled, say=ctx.say)
            pred = rec.pop("test_predictions")
            name = f"probe {kind}" + (" +pretrain" if cfg.pretrain else "")
            score(name, pred, {"kind": "probe", "layer": "all", "epochs": rec["epochs_run"],
                               "best_epoch": rec["best_epoch"]})
            records[name] = rec
        # Baselines: single-layer cosines on the test split.
        chooser, chooser_name = (dev, "dev") if dev is not None else (train, "train")
        j_sel = _best_layer(layer_cosines(chooser.a, chooser.b), chooser.y)
        score(f"best layer on {chooser_name} ({layers[j_sel]})",
              paired_cosine(test.a[j_sel], test.b[j_sel]), {"kind": "layer", "layer": layers[j_sel]})
        test_cos = layer_cosines(test.a, test.b)
        j_or = _best_layer(test_cos, test.y)
        score(f"best layer on test ({layers[j_or]})", test_cos[:, j_or], {"kind": "layer", "layer": layers[j_or]})
        final = str(run.num_layers)
        if final in layers:
            jf = layers.index(final)
            score(f"final layer ({final})", test_cos[:, jf], {"kind": "layer", "layer": final})
        return {"pooling": pooling, "layers": layers, "rows": rows, "training": records,
                "train_pairs": len(data["train"]), "dev_pairs": len(data["dev"]) if data.get("dev") else 0,
                "test_pairs": len(data["test"]), "layer_chosen_on": chooser_name}


def _every_pooling(probes: list[dict[str, Any]]) -> dict[str, Any]:
    """One probe record over every pooling asked for: each row and training record names its pooling (in the
    row's name too when there are several), so probes are compared with the layers of their own pooling."""
    several = len(probes) > 1
    rows, training = [], {}
    for probe in probes:
        p = probe["pooling"]
        label = (lambda name: f"{p}: {name}") if several else (lambda name: name)
        rows += [{**r, "pooling": p, "name": label(r["name"])} for r in probe["rows"]]
        training.update({label(name): rec for name, rec in probe["training"].items()})
    return {**probes[0], "poolings": [p["pooling"] for p in probes], "rows": rows, "training": training}

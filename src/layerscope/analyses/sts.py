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
from layerscope.analyses.common import (PAIR_COLUMN_OPTIONS, best_row, data_label, layers_for, model_layer_series,
                                        poolings_for, similarity_correlations)
from layerscope.analyses.probe import KINDS as PROBE_KINDS
from layerscope.analyses.probe import LOSSES as PROBE_LOSSES
from layerscope.errors import InputError


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
    )

    # ------------------------------------------------------------ data
    def prepare(self, ctx: Context) -> dict[str, Any]:
        from layerscope.analyses.probe import KINDS, LOSSES
        from layerscope.data.pairs import default_sts_file, read_pairs

        o = self.options(ctx)
        if o.n_boot < 0:
            raise InputError("--n-boot must be >= 0")
        data = ctx.data or str(default_sts_file("test"))
        ctx.data = data
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
                             **similarity_correlations(sims, pairs.scores, n_boot=n_boot, seed=ctx.seed)})
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
                                f"scipy.stats.bootstrap, seed {ctx.seed})" if n_boot else None}
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
                              n_resamples=self.options(ctx).n_boot, seed=ctx.seed, say=ctx.say)

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
                         **similarity_correlations(sims, test.y, n_boot=n_boot, seed=ctx.seed)})

        for kind in kinds:
            cfg = ProbeConfig(kind=kind, loss=o.probe_loss, epochs=o.probe_epochs,
                              pretrain=o.pretrain and kind == "siamese", seed=ctx.seed)
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

    # ------------------------------------------------------------ rendering (saved results only)
    def plots(self, results: dict[str, Any], out_dir: Path) -> list[str]:
        from layerscope.report.plots import bars, layer_lines

        names = list(results.get("per_model", {}))
        on = data_label(results)
        made = []
        for value in ("spearman", "pearson"):
            series = model_layer_series(results, "layers", value)
            if series:
                lows = model_layer_series(results, "layers", f"{value}_ci_low")
                highs = model_layer_series(results, "layers", f"{value}_ci_high")
                bands = {k: (lows[k][1], highs[k][1]) for k in series
                         if k in lows and any(v is not None for v in lows[k][1])}
                made.append(layer_lines(out_dir / f"sts_{value}_by_layer.png", series,
                                        title=f"STS: {value.capitalize()} of cosine vs human score by layer"
                                              + (f" ({names[0].split('/')[-1]})" if len(names) == 1 else ""),
                                        ylabel=f"{value.capitalize()}{on}", bands=bands))
        groups, errors = {}, {}
        for model, fig in results.get("per_model", {}).items():
            if fig.get("probe"):
                groups[model] = {r["name"]: r.get("spearman") for r in fig["probe"]["rows"]}
                errors[model] = {r["name"]: (r.get("spearman_ci_low"), r.get("spearman_ci_high"))
                                 for r in fig["probe"]["rows"]}
        if groups:
            made.append(bars(out_dir / "sts_probe.png", groups, title=f"STS Spearman{on}: probes vs single layers",
                             ylabel=f"Spearman{on}", errors=errors))
        return made

    def report(self, results: dict[str, Any]) -> str:
        from layerscope.report.writer import fmt, md_table

        lines = []
        data = results.get("settings", {}).get("data")
        for model, fig in results.get("per_model", {}).items():
            s = fig["summary"]
            lines += [f"## {model}", "", f"{s['pairs']} pairs from `{data}`. Cosine similarity of the two "
                      "sentence vectors vs the human score; 95% intervals from a pair bootstrap.", ""]
            if s.get("best"):
                b = s["best"]
                lines.append(f"**Best layer:** {b['layer']} with {b['pooling']} pooling, Spearman "
                             f"{fmt(b['spearman'])} (Pearson {fmt(b['pearson'])}).")
            for p, bp in s["by_pooling"].items():
                lines.append(f"- {p}: best layer {bp['best_layer']} ({fmt(bp['best_spearman'])}); final layer "
                             f"{bp['final_layer']} Spearman {fmt(bp['final_spearman'])}")
            lines.append("")
            rows = []
            for r in fig["tables"]["layers"]:
                ci = (f"[{r['spearman_ci_low']:.4f}, {r['spearman_ci_high']:.4f}]"
                      if r.get("spearman_ci_low") is not None else "")
                rows.append({"pooling": r["pooling"], "layer": r["layer"], "Spearman": r["spearman"],
                             "95% CI": ci, "Pearson": r["pearson"], "p (Spearman)": _p(r.get("spearman_p")),
                             "mean cos": r["mean_similarity"]})
            lines.append(md_table(rows))
            undefined = [r for r in fig["tables"]["layers"] if r.get("undefined")]
            for r in undefined:
                lines.append(f"- undefined at layer {r['layer']}, {r['pooling']}: {r['undefined']}")
            if undefined:
                lines.append("")
            pr = fig.get("probe")
            if pr:
                lines += ["### Learned probes", "",
                          f"Trained on {pr['train_pairs']} pairs, "
                          + (f"early-stopped on {pr['dev_pairs']} dev pairs, " if pr["dev_pairs"] else
                             "fixed epochs (no dev split), ")
                          + f"scored on {pr['test_pairs']} test pairs; {pr['pooling']} pooling, layers "
                          f"{', '.join(pr['layers'])}. The 'best layer on {pr['layer_chosen_on']}' baseline "
                          "picks its layer without seeing the test scores; 'best layer on test' is the "
                          "optimistic oracle.", ""]
                lines.append(md_table([{"model": r["name"], "Spearman": r["spearman"], "Pearson": r["pearson"],
                                        "Spearman 95% CI": (f"[{r['spearman_ci_low']:.4f}, {r['spearman_ci_high']:.4f}]"
                                                            if r.get("spearman_ci_low") is not None else ""),
                                        "epochs": r.get("epochs") if r.get("epochs") is not None else "-"}
                                       for r in pr["rows"]]))
                for name, rec in pr["training"].items():
                    c = rec["config"]
                    extra = f", best dev Pearson {rec['best_dev_pearson']:.4f}" if "best_dev_pearson" in rec else ""
                    lines.append(f"- {name}: loss {c['loss']}, {rec['epochs_run']} epochs run, kept epoch "
                                 f"{rec['best_epoch']}{extra}, seed {c['seed']}")
                lines.append("")
        return "\n".join(lines)

    def console_summary(self, results: dict[str, Any], console) -> None:
        from rich.table import Table

        from layerscope.report.console import esc, layer_by_pooling_table

        def spearman_cell(r):
            if r["spearman"] is None:
                return "undefined"
            ci = (f" [{r['spearman_ci_low']:.3f}, {r['spearman_ci_high']:.3f}]"
                  if r.get("spearman_ci_low") is not None else "")
            return f"{r['spearman']:.4f}{ci}"

        for model, fig in results.get("per_model", {}).items():
            table = layer_by_pooling_table(
                f"{model}: Spearman of cosine vs score per layer ({fig['summary']['pairs']} pairs)",
                fig["tables"]["layers"], "Spearman [95% CI]", spearman_cell)
            console.print(table)
            b = fig["summary"].get("best")
            if b:
                console.print(f"best: layer {b['layer']} ({b['pooling']}) Spearman {b['spearman']:.4f}")
            if fig.get("probe"):
                pt = Table(title=f"{esc(model)}: probes vs single layers (test)")
                for c in ("model", "Spearman", "Pearson"):
                    pt.add_column(c, justify="right" if c != "model" else "left")
                for r in fig["probe"]["rows"]:
                    pt.add_row(esc(r["name"]), _f(r["spearman"]), _f(r["pearson"]))
                console.print(pt)


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


def _f(v) -> str:
    from layerscope.report.writer import num

    return num(v, 4)


def _p(v) -> str:
    if v is None:
        return "undefined"
    if v == 0.0:
        return "< 1e-300"  # below the smallest double: the correlation is far beyond chance
    return f"{v:.1e}" if v < 1e-3 else f"{v:.4f}"

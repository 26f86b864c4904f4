"""The tuned lens beside the logit lens in ``run lens --tuned``: the declared figures of ``tuned_vs_logit``, its rows
(each lens's KL to the final distribution, top-1 agreement and perplexity with intervals over texts, and the KL the
translators remove with a paired interval) and what results.json says of the lens. analyses/lens.py runs both
lenses and calls these; the translators themselves are decoding/tuned_lens.py's.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from layerscope.errors import InputError
from layerscope.report.figures import Curve, Line, Table


def about(results) -> str:
    """The model(s) and the data of a run, for titles: ``gpt2 on lens_texts.jsonl``."""
    from pathlib import PurePath

    data = results.settings.data or "lens_texts.jsonl (built in)"
    return f"{', '.join(results.per_model)} on {PurePath(str(data).replace(chr(92), '/')).name}"


_BAND = "95% bootstrap interval over texts"
TUNED_CURVES = (
    Curve("tuned_vs_logit", (Line("kl_to_final", "KL to the final layer"),), file="tuned_kl", group=("lens",),
          title="logit vs tuned lens, KL to the final distribution: {about}", ylabel="KL(final || layer), nats",
          from_zero=True, band=_BAND,
          caption="Mean over positions of the KL divergence from the model's output distribution to each layer's "
                  "decoded one (0 at the last layer)."),
    Curve("tuned_vs_logit", (Line("top1_agrees_with_last", "top-1 = final top-1"),), file="tuned_agreement",
          group=("lens",), title="logit vs tuned lens, top-1 agreement with the final layer: {about}",
          ylabel="fraction of positions", from_zero=True, band=_BAND,
          caption="Share of positions whose top-1 decoded token is the model's own top-1 (at a share of exactly 0 "
                  "or 1 the interval is Wilson's, with the texts as trials)."),
    Curve("tuned_vs_logit", (Line("cross_entropy", "cross-entropy"),), file="tuned_cross_entropy",
          group=("lens",), title="logit vs tuned lens, cross-entropy of the target: {about}",
          ylabel="nats per token (ln perplexity)", chance="uniform_cross_entropy", band=_BAND,
          caption="Mean negative log-probability of the target (next token for decoders, the input token for "
                  "encoders) on these texts; perplexity is its exponential. Dashed: a uniform distribution over "
                  "the vocabulary (ln V)."),
)
TUNED_TABLE = Table("tuned_vs_logit", ("layer", "lens", "kl_to_final", "top1_agrees_with_last", "perplexity",
                                       "kl_removed"), digits=4,
                    console=("layer", "lens", "kl_to_final", "top1_agrees_with_last", "perplexity"),
                    numbers=("kl_to_final", "top1_agrees_with_last", "perplexity", "cross_entropy", "kl_removed"))


def add_divergence_intervals(rows: list[dict[str, Any]], acc, *, seed: int) -> None:
    """Each layer's ``kl_to_final`` and ``perplexity`` (with ``cross_entropy``, its logarithm) with 95% percentile
    bootstrap intervals over the texts (a text's positions resample together; the perplexity's interval is the
    exponential of the cross-entropy's)."""
    from layerscope.analyses.intervals import add_interval
    from layerscope.metrics.paired import ratio_scorer

    got = acc.divergence()
    if got is None:
        return
    kl, nll = got
    positions = acc.per_text()[0]
    n = len(positions)
    for li, row in enumerate(rows):
        add_interval(row, "kl_to_final", ratio_scorer(kl[:, li], positions), n, seed=seed)
        perplexity = row.get("perplexity")
        row["cross_entropy"] = None if perplexity is None else float(np.log(perplexity))
        add_interval(row, "cross_entropy", ratio_scorer(nll[:, li], positions), n, seed=seed)
        lo, hi = row["cross_entropy_ci_low"], row["cross_entropy_ci_high"]
        row["perplexity_ci_low"] = None if lo is None else float(np.exp(lo))
        row["perplexity_ci_high"] = None if hi is None else float(np.exp(hi))
        row["perplexity_ci_method"] = row["cross_entropy_ci_method"]


def compare_rows(logit_rows: list[dict[str, Any]], tuned_rows: list[dict[str, Any]], acc, tuned_acc, *,
                 seed: int) -> list[dict[str, Any]]:
    """``tuned_vs_logit``: per layer a row for each lens (``lens`` "logit" or "tuned", each lens's own table with its
    intervals): KL to the final distribution, top-1 agreement with the final layer, perplexity and cross-entropy;
    the tuned rows also hold ``kl_removed`` (logit KL - tuned KL) with a paired bootstrap interval over the texts
    (``acc``, ``tuned_acc``: the two lenses' ``LensAccumulator``s)."""
    from layerscope.analyses.intervals import add_interval

    kl_logit, kl_tuned = acc.divergence()[0], tuned_acc.divergence()[0]
    positions = acc.per_text()[0].astype(np.float64)
    keys = ("kl_to_final", "top1_agrees_with_last", "perplexity", "cross_entropy")
    out = []
    for li, (logit, tuned) in enumerate(zip(logit_rows, tuned_rows)):
        for lens, row in (("logit", logit), ("tuned", tuned)):
            picked = {"layer": row["layer"], "lens": lens, "positions": row["positions"]}
            for key in keys:
                for part in ("", "_ci_low", "_ci_high", "_ci_method"):
                    picked[key + part] = row.get(key + part)
            out.append(picked)
        gained = out[-1]
        gained["kl_removed"] = (None if logit.get("kl_to_final") is None or tuned.get("kl_to_final") is None
                                else logit["kl_to_final"] - tuned["kl_to_final"])

        def removed(idx, li=li):
            den = positions[idx].sum(axis=-1)
            with np.errstate(invalid="ignore", divide="ignore"):
                return (kl_logit[idx, li].sum(axis=-1) - kl_tuned[idx, li].sum(axis=-1)) / den

        add_interval(gained, "kl_removed", removed, len(positions), seed=seed, ci_method="paired-bootstrap-texts")
        out[-2]["kl_removed"] = None
    return out


def tuned_about(tuned) -> dict[str, Any]:
    """What results.json says of the tuned lens: its folder, translators' sha256, and what trained it."""
    rec = tuned.record
    about = (f"trained by layerscope on {rec.tokens:,} tokens of {rec.store} ({rec.steps_done} steps of "
             f"{rec.settings.tokens_per_step:,} tokens)" if rec is not None else
             f"a tuned-lens lens for {tuned.config.base_model_name_or_path}")
    return {"folder": str(tuned.path), "params_sha256": tuned.params_sha256, "translators": tuned.translators.layers,
            "width": tuned.translators.width, "trained_by": "layerscope" if rec is not None else "tuned-lens",
            "about": about}


def say_if_trained_on(ctx, tuned) -> None:
    """A line where the run's texts are the very corpus the lens was trained on (its figures are then not
    held-out ones)."""
    rec = tuned.record
    if rec is None or rec.corpus_sha256 is None or not ctx.spec.data:
        return
    from layerscope.data.corpus import read_corpus
    from layerscope.extraction.spool import corpus_sha256

    try:
        same = corpus_sha256(read_corpus(ctx.spec.data)[0]) == rec.corpus_sha256
    except (InputError, OSError):  # a dataset spec or an unreadable path: read (and refused) by prepare already
        same = False
    if same:
        ctx.say("note: these texts are the corpus the tuned lens was trained on; its figures here are not "
                "held-out ones")

"""``layerscope run attention``: what each layer's heads attend to, over a corpus, and per text.

Reads the export's attention graph (``layerscope export MODEL --attentions``; export/attention.py) on the
engine asked (ort, ov or torch). Per layer x head, over the texts: the mean of each per-text summary
(entropy, share on the first token, share on special tokens, mean attended distance, share on the previous
token) with its 95% percentile-bootstrap interval over texts. For the first ``--patterns`` texts the full
patterns travel into results.json (their size is said before the run), with attention rollout after every
layer and attention flow from the pooled token (metrics/attention.py); report.html shows them in a viewer.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from layerscope.analyses.base import Analysis, AnalysisMetadata, Context, ModelOutput, ModelRun, Option, register
from layerscope.errors import InputError

from layerscope.export.attention import SUMMARIES, SUMMARY_HELP
from layerscope.report.attention_html import VIEWER, ViewerText
from layerscope.report.figures import Curve, Figures, HeatMap, Line, Table

BATCH_TEXTS = 16
PATTERN_BYTES = 256 << 20  # a batch's attention probabilities held by the graph at once (float32)
DIGITS = 4  # decimals kept of each probability shown in the viewer
FLOW_MAX_TOKENS = 64  # attention flow (one max-flow per input token) only for texts up to this length


# What the reports show: PNG, report.md, report.html and the console all draw this one declaration; the viewer is
# a page section over the typed texts (report/attention_html.py).
FIGURES = Figures(
    sentence="{texts} texts, {layers} layers x {heads} heads, engine {engine}; causal (decoder) attention: {causal}. "
             "Intervals: {intervals}.",
    summary_numbers=("first_share_last_layer", "texts", "layers", "heads"),
    curves=tuple(Curve("attention_layers", (Line(name, name),), file=f"attention_{name}_by_layer", png=False,
                       per_model=False, title=f"{name} by layer, heads averaged", ylabel=name,
                       caption=f"Per text, the {name} summary averaged over the layer's heads; band: 95% interval "
                               "over texts.") for name in SUMMARIES),
    heatmaps=tuple(HeatMap(f"grids.{name}", f"attention_{name}", title=f"{SUMMARY_HELP[name]} ({{model}})",
                           zlabel=name, rows=1, cols=0, xlabel="head", ylabel="layer",
                           caption="Mean over texts of each head's per-text summary.") for name in SUMMARIES),
    tables=(Table("attention_layers", ("layer", *SUMMARIES), digits=3),),
    page=("attention viewer",),
    records=(VIEWER,),
)


@dataclass(frozen=True)
class Texts:
    """What ``prepare`` hands each model: the texts and the file they came from."""

    texts: tuple[str, ...]
    path: str


def pattern_bytes(lengths, layers: int, heads: int) -> int:
    """About what the full patterns of texts of ``lengths`` tokens take in results.json: every probability and
    the rollout after each layer, at DIGITS decimals, about 28 bytes a value in its indented JSON (measured on
    all-MiniLM-L6-v2: 28.4)."""
    return int(sum(28 * (layers * heads + layers) * int(t) ** 2 for t in lengths))


def batches(order: np.ndarray, lengths: np.ndarray, maps: int) -> list[np.ndarray]:
    """Texts in ``order`` (by length) cut into batches of at most BATCH_TEXTS whose padded patterns (``maps``
    layer x head maps of tokens² floats per text) stay under PATTERN_BYTES: the graph holds them all."""
    out, start = [], 0
    while start < len(order):
        end = start + 1
        while end < len(order) and end - start < BATCH_TEXTS and \
                (end + 1 - start) * maps * 4 * int(lengths[order[end]]) ** 2 <= PATTERN_BYTES:
            end += 1
        out.append(order[start:end])
        start = end
    return out


def _grid(values: np.ndarray) -> list[list[float | None]]:
    return [[None if not np.isfinite(v) else float(v) for v in row] for row in values]


def head_rows(stats: dict[str, np.ndarray], *, seed: int) -> tuple[list[dict], list[dict]]:
    """Rows per layer x head and per layer (heads averaged within each text), each summary with its 95%
    interval over the texts that define it (a one-token text has no previous token)."""
    from layerscope.analyses.intervals import BOOTSTRAP, mean_interval

    def row(values: np.ndarray, base: dict[str, Any], name: str) -> None:
        v = values[np.isfinite(values)]
        base[name] = float(v.mean()) if v.size else None
        lo, hi = mean_interval(v, seed=seed) if v.size >= 2 else (None, None)
        base.update({f"{name}_ci_low": lo, f"{name}_ci_high": hi, f"{name}_ci_method": BOOTSTRAP})

    n, layers, heads = next(iter(stats.values())).shape
    per_head, per_layer = [], []
    for layer in range(layers):
        lrow: dict[str, Any] = {"layer": str(layer + 1), "texts": n}
        for name, values in stats.items():
            with warnings.catch_warnings():  # a text whose every head is undefined (one token): NaN, left out
                warnings.simplefilter("ignore", RuntimeWarning)
                row(np.nanmean(values[:, layer, :], axis=1), lrow, name)
        per_layer.append(lrow)
        for head in range(heads):
            hrow: dict[str, Any] = {"layer": str(layer + 1), "head": head, "texts": n}
            for name, values in stats.items():
                row(values[:, layer, head], hrow, name)
            per_head.append(hrow)
    return per_head, per_layer


@register
class AttentionAnalysis(Analysis):
    metadata = AnalysisMetadata(
        name="attention",
        reads="model",
        description="Attention per layer and head (entropy, first-token and special-token sinks, distance, "
                    "previous token) with 95% intervals over texts; rollout, flow and a per-text viewer",
        inputs=("texts", "engine"),
        main_score="first_share_last_layer",
        figures=FIGURES,
        default_data="lens_texts.jsonl (built in, 20 plain sentences)",
        options=(
            Option("max_texts", int, 0, "summarise at most this many texts (0 = all)"),
            Option("patterns", int, 8, "texts whose full patterns, rollout and flow are kept for the viewer "
                                       "(layers x heads x tokens² numbers each; the size is said before the run)"),
            Option("no_flow", bool, False, "skip attention flow (one max-flow per input token, from the pooled "
                                           f"token; computed for viewer texts of up to {FLOW_MAX_TOKENS} tokens)"),
        ),
    )

    def default_poolings(self, handle) -> list[str]:
        return [handle.manifest.default_pooling]

    def prepare(self, ctx: Context) -> Texts:
        from layerscope.data.examples import LENS_TEXTS, read_texts
        from layerscope.engines.registry import (attention_default, attention_engine, attention_engines, engines,
                                                 names_text)

        o = self.options(ctx)
        if attention_engine(ctx.spec.engine) is None:
            pickers = "".join(f" (or {s.name}: {attention_default()})" for s in engines().values() if s.picks_engine)
            raise InputError(f"run attention reads the attention graph on {names_text(attention_engines())}"
                             f"{pickers}; not --engine {ctx.spec.engine}")
        for name in ("max_texts", "patterns"):
            if int(getattr(o, name)) < 0:
                raise InputError(f"--{name.replace('_', '-')} must be 0 or more, not {getattr(o, name)}")
        for spec in ctx.spec.given_models:  # an export without the attention graph: one line before any model runs
            folder = Path(spec)
            if (folder / "manifest.json").is_file():
                from layerscope.export.attention_run import require_attention_variant
                from layerscope.model.handle import ModelHandle

                require_attention_variant(ModelHandle.resolve(folder, verify=False))
        path = ctx.spec.data or LENS_TEXTS
        texts = read_texts(path)
        if o.max_texts:
            texts = texts[:o.max_texts]
        if not texts:
            raise InputError(f"{path} holds no texts")
        return Texts(tuple(texts), str(path))

    def compute(self, ctx: Context, run: ModelRun, data: Texts) -> ModelOutput:
        from layerscope.engines.registry import attention_engine
        from layerscope.export.attention_run import AttentionRunner, attention_export
        from layerscope.progress import steps

        o = self.options(ctx)
        handle = run.handle
        export_dir = attention_export(handle, ctx.say)
        spec = ctx.spec  # the run's spec: what it resolved (compute runs inside run_analysis only)
        encoder = run.engine.encoder(spec.max_length)
        runner = AttentionRunner(export_dir, attention_engine(spec.engine), trust_remote_code=handle.trust_remote_code)
        texts = list(data.texts)
        lengths = np.minimum(encoder.token_lengths(texts), encoder.max_length)
        shown = list(range(min(int(o.patterns), len(texts))))
        layers = run.num_layers
        heads = None
        order = np.argsort(lengths, kind="stable")
        heads_known = runner.heads
        if shown:  # said before anything runs: the patterns are the large part of the results
            ctx.say(f"attention: full patterns of {len(shown)} texts ({layers} layers x {heads_known} heads x "
                    f"tokens²) take about {pattern_bytes(lengths[shown], layers, heads_known or 1) / 1e6:.1f} MB of "
                    "results.json")
        stats: dict[str, np.ndarray] = {}
        with steps(f"attention: {len(texts):,} texts", len(texts)) as bar:
            for rows in batches(order, lengths, layers * (heads_known or 1)):
                got = runner.run(encoder([texts[i] for i in rows]).inputs)
                for name in SUMMARIES:
                    value = got.summaries[name]
                    if name not in stats:
                        heads = value.shape[2]
                        stats[name] = np.full((len(texts), layers, heads), np.nan, dtype=np.float64)
                    stats[name][rows] = value
                bar.advance(len(rows))
        viewer = [self._one_text(runner, encoder, texts[i], i, run, not o.no_flow) for i in shown]
        per_head, per_layer = head_rows(stats, seed=ctx.spec.seed)
        last = per_layer[-1]
        from layerscope.analyses.intervals import headline, method

        heads_line = [headline(f"{name} (last layer, heads averaged)", last, name, where=f"layer {last['layer']}")
                      for name in SUMMARIES]
        summary = {"first_share_last_layer": last["first"], "texts": len(texts), "layers": layers, "heads": heads,
                   "causal": handle.manifest.kind == "decoder", "engine": runner.engine,
                   "headline": heads_line, "intervals": method(len(texts), "texts", ctx.spec.seed)}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a head no text defines stays None
            grids = {name: _grid(np.nanmean(stats[name], axis=0)) for name in SUMMARIES}
        figures = {"summary": summary, "grids": grids, "viewer": viewer,
                   "tables": {"attention_heads": per_head, "attention_layers": per_layer}}
        return ModelOutput(figures, compare=self._compare_rows(stats["first"], per_layer))

    @staticmethod
    def _compare_rows(first: np.ndarray, per_layer: list[dict]):
        """Per layer, the first-token share (heads averaged within each text) as a function of the texts: what
        a model-vs-model comparison resamples, the same texts for every model."""
        from layerscope.analyses.compare import ScoreRow, model_rows
        from layerscope.metrics.paired import mean_scorer

        per_text = first.mean(axis=2)  # [texts, layers]; every text has a first token
        rows = [ScoreRow("first", r["layer"], r["first"], (r["first_ci_low"], r["first_ci_high"]),
                         mean_scorer(per_text[:, i])) for i, r in enumerate(per_layer)]
        return model_rows(len(per_layer), per_text.shape[0], rows)

    def combine(self, ctx: Context, per_model, data) -> dict[str, Any]:
        from layerscope.analyses.compare import compare_models

        return compare_models(per_model, score="first", score_label="first-token share", group_label="summary",
                              seed=ctx.spec.seed, say=ctx.say)

    @staticmethod
    def _one_text(runner, encoder, text: str, index: int, run: ModelRun, with_flow: bool) -> dict[str, Any]:
        """One text alone (no padding): its tokens, every pattern, rollout per layer and flow."""
        from layerscope.metrics.attention import flow, rollout

        batch = encoder([text], details=True)
        got = runner.run(batch.inputs, patterns=True)
        pats = got.patterns[0].astype(np.float64)  # [L, H, T, T]
        tokens = token_texts(encoder.tokenizer, text, batch.input_ids[0], batch.special[0], batch.spans[0])
        decoder = run.handle.manifest.kind == "decoder"
        query = len(tokens) - 1 if decoder else 0  # the token a decoder's last pooling or an encoder's CLS reads
        shown = with_flow and len(tokens) <= FLOW_MAX_TOKENS
        return ViewerText(index=index, text=text, tokens=tuple(str(t) for t in tokens),
                          special=tuple(bool(s) for s in batch.special[0]), causal=decoder,
                          patterns=np.round(pats, DIGITS).tolist(), rollout=np.round(rollout(pats), DIGITS).tolist(),
                          flow_query=query,
                          flow=np.round(flow(pats, query), DIGITS).tolist() if shown else None).to_json()


def token_texts(tokenizer, text: str, ids, special, spans) -> list[str]:
    """Each token as the characters of the text it covers; a special token as its own name ([CLS], <s>)."""
    out = []
    for token_id, is_special, (start, end) in zip(ids, special, spans):
        if is_special or end <= start:
            inner = getattr(tokenizer, "tokenizer", None)  # the tokenizers-only fast path keeps its Tokenizer here
            name = (inner.id_to_token(int(token_id)) if inner is not None and hasattr(inner, "id_to_token")
                    else tokenizer.convert_ids_to_tokens(int(token_id)))
            out.append(str(name))
        else:
            out.append(text[int(start):int(end)])
    return out


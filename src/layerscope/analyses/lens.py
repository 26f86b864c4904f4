"""``layerscope run lens``: the logit lens, what token each layer already points at.

Per text, layer and position: the top-k decoded tokens with probabilities and the rank of the
input token (encoders) or of the actual next token (decoders).  Over the corpus, by layer: mean
and median rank, how often the top-1 token is that target, and how often it agrees with the
last layer's top-1.  The head used (the model's own MLM/causal head, or the tied word
embeddings for checkpoints without one) is said plainly in results.json and the report.

On the torch engine the head runs in PyTorch; on ort/cuda/trt/auto the head is appended to the
ONNX graph (``lens-k{k}.onnx``, exported once, checked against torch) so only ranks and top-k ids
leave the graph.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from layerscope.analyses.base import Analysis, AnalysisMetadata, Context, ModelRun, Option, register
from layerscope.errors import InputError
from layerscope.report.figures import Curve, Figures, Line, Listing, Table

# What the reports show: PNG, report.md, report.html and the console all draw this one declaration.
FIGURES = Figures(
    sentence="Target: the {target}. Computed by {computed_by}. {n_texts} texts, {n_positions} positions "
             "(special-token targets left out).",
    summary_numbers=("n_texts", "n_positions", "top1_agrees_with_last_mid_layer"),
    curves=(Curve("lens_by_layer", (Line("mean_log10_rank", "mean log10 rank"),), file="lens_rank", per_model=False,
                  title="logit lens: rank of the target token by layer", ylabel="mean log10 rank (0 = top)",
                  caption="Each layer decoded through the model's LM head; rank of the target token among the "
                          "vocabulary, averaged over positions (log10 of rank 1 is 0; interval: percentile "
                          "bootstrap over the texts); chance: a rank drawn at random from the vocabulary.",
                  chance="chance_log10_rank", from_zero=True, band="95% bootstrap interval over texts"),
            Curve("lens_by_layer", (Line("top1_agrees_with_last", "top-1 = last layer's top-1"),
                                    Line("top1_is_target", "top-1 = target")), file="lens_agreement",
                  per_model=False, from_zero=True, title="logit lens: top-1 agreement by layer",
                  ylabel="fraction of positions",
                  caption="Share of positions whose top-1 decoded token equals the last layer's, or the target "
                          "(interval: percentile bootstrap over the texts; at a share of 0 or 1, Wilson with the "
                          "texts as trials).",
                  band="95% interval over texts (bootstrap; Wilson at 0 or 1)")),
    tables=(Table("lens_by_layer", ("layer", "mean_rank", "median_rank", "mean_log10_rank", "top1_is_target",
                                    "top1_agrees_with_last"), digits=3,
                  console=("layer", "mean_rank", "median_rank", "top1_is_target", "top1_agrees_with_last")),),
    listings=(Listing("head", "Decoding head", item="{kind}: {description}", limit=1),),
    page=("lens tokens",),
)


def lens_layers(ctx, run) -> list[str]:
    """The run's layers without ``raw`` (the lens decodes layers 0..L)."""
    from layerscope.analyses.common import layers_for

    layers = layers_for(ctx, run)
    if "raw" in layers:
        layers = [x for x in layers if x != "raw"]
        if ctx.spec.layers not in (None, "all"):
            ctx.say("layer 'raw' (word-embedding lookup, before positions) is not decoded; left out")
    if not layers:
        raise InputError("--layers selected only 'raw'; the lens decodes layers 0..L")
    return layers


EDGE_CI_METHOD = "wilson-texts"


def add_text_intervals(rows: list[dict[str, Any]], positions, agree, top1, *, seed: int) -> None:
    """Each layer's top-1 shares with 95% intervals over the texts: ``top1_agrees_with_last_ci_*`` and
    ``top1_is_target_ci_*``.

    The positions of one text are not independent, so the interval is a percentile bootstrap over the texts
    (the share is counted positions over all counted positions of the resample). A share of exactly 0 or 1
    leaves the bootstrap no spread; there the interval is the Wilson interval with the texts as the trials
    (each text all hits, or all misses), ``ci_method`` ``"wilson-texts"``.
    """
    from layerscope.analyses.intervals import add_interval, add_share_interval
    from layerscope.metrics.paired import ratio_scorer

    n = len(positions)
    counted = int(np.count_nonzero(np.asarray(positions) > 0))
    for li, row in enumerate(rows):
        for key, hits in (("top1_agrees_with_last", agree), ("top1_is_target", top1)):
            share = row.get(key)
            if share in (0.0, 1.0) and counted:
                add_share_interval(row, key, share * counted, counted)
                row[f"{key}_ci_method"] = EDGE_CI_METHOD
            else:
                add_interval(row, key, ratio_scorer(hits[:, li], positions), n, seed=seed)


def add_rank_intervals(rows: list[dict[str, Any]], positions, log10_sums, *, seed: int) -> None:
    """Each layer's mean log10 rank with its 95% percentile bootstrap interval over the texts (a text's positions
    resample together): ``mean_log10_rank_ci_*``."""
    from layerscope.analyses.intervals import add_interval
    from layerscope.metrics.paired import ratio_scorer

    for li, row in enumerate(rows):
        add_interval(row, "mean_log10_rank", ratio_scorer(log10_sums[:, li], positions), len(positions), seed=seed)


def chance_log10_rank(vocab: int) -> float:
    """The mean log10 rank of a target ranked at random among ``vocab`` tokens: ``log10(vocab!) / vocab``."""
    import math

    return math.lgamma(int(vocab) + 1) / (int(vocab) * math.log(10))


@register
class Lens(Analysis):
    metadata = AnalysisMetadata(
        name="lens",
        reads="model",
        description="Logit lens: decode every layer through the LM head (or tied embeddings) and rank the "
                    "input / next token",
        inputs=("texts",),
        main_score="top1_agrees_with_last_mid_layer",
        default_data="lens_texts.jsonl (built in)",
        options=(
            Option("top_k", int, 5, "decoded tokens kept per layer and position"),
            Option("show", int, 20, "texts whose per-position tokens are kept in results.json"),
            Option("batch", int, 32, "texts per batch (at most; fewer where their tokens would make a long "
                                     "forward)"),
        ),
        figures=FIGURES,
    )

    def prepare(self, ctx: Context) -> Any:
        from layerscope.data.examples import LENS_TEXTS, read_texts

        o = self.options(ctx)
        k = int(o.top_k)
        if k < 1:
            raise InputError(f"--top-k must be at least 1, not {k}")
        if int(o.batch) < 1:
            raise InputError("--batch must be at least 1")
        return read_texts(ctx.spec.data or LENS_TEXTS)

    def compute(self, ctx: Context, run: ModelRun, data: Any) -> dict[str, Any]:
        from layerscope.decoding.lens import (FORWARD_MACS, LensAccumulator, LensBatch, forward_macs_per_token,
                                              forward_runs)
        from layerscope.progress import steps

        texts: list[str] = data
        o = self.options(ctx)
        k = int(o.top_k)
        show = max(0, int(o.show))
        bs = int(o.batch)
        names = lens_layers(ctx, run)
        idx = [int(x) for x in names]
        handle = run.handle
        tok = handle.tokenizer()
        vocab = int(handle.manifest.vocab_size)
        if k > vocab:
            raise InputError(f"--top-k {k} is larger than the vocabulary ({vocab})")
        decoder = handle.manifest.kind == "decoder"
        special = set(int(i) for i in tok.all_special_ids)
        runner, head_info, path = self._runner(ctx, run, k)
        acc = LensAccumulator(idx, special, decoder)
        shown: list[dict[str, Any]] = []
        truncated = 0
        enc = run.engine.encoder()  # positions to decode, from the tokenizer alone: the count a long batch advances
        lengths = np.minimum(np.maximum(enc.token_lengths(texts), 1), enc.max_length)
        bar = steps("lens: tokens decoded at every layer", int(lengths.sum()))
        per_token = forward_macs_per_token(handle.manifest.hidden_size, handle.manifest.num_layers)
        for start, stop in forward_runs(lengths, bs, FORWARD_MACS // per_token):  # a forward stays seconds long
            chunk = texts[start:stop]
            full: LensBatch = runner(chunk, bar)
            truncated += int(full.truncated)
            b = LensBatch(full.rank[idx], full.topk_ids[idx], full.topk_probs[idx], full.input_ids, full.mask)
            keep = acc.add(b)
            for j in range(len(chunk)):
                if len(shown) >= show:
                    break
                shown.append(_text_detail(chunk[j], b, j, keep[j], names, tok, decoder))
        bar.close()
        if truncated:
            ctx.say(f"warning: {truncated} text(s) were longer than the model's max length and were truncated")
        table = acc.table(names)
        add_text_intervals(table, *acc.per_text(), seed=ctx.spec.seed)
        add_rank_intervals(table, acc.per_text()[0], acc.per_text_log10(), seed=ctx.spec.seed)
        mid = table[len(table) // 2]
        from layerscope.analyses.intervals import headline, method

        summary = {
            "headline": [headline("top-1 = last layer's top-1", mid, "top1_agrees_with_last", f"layer {mid['layer']} "
                                  "(middle)"),
                         headline("top-1 = target", mid, "top1_is_target", f"layer {mid['layer']} (middle)")],
            "intervals": method(len(texts), "texts (a text's positions resample together)", ctx.spec.seed)
                         + "; a share of exactly 0 or 1: Wilson interval with the texts as trials",
            "top1_agrees_with_last_mid_layer": mid["top1_agrees_with_last"], "mid_layer": mid["layer"],
            "n_texts": len(texts), "n_positions": acc.n, "head": head_info["kind"],
            "target": "next token" if decoder else "input token", "computed_by": path,
            "chance_log10_rank": chance_log10_rank(vocab),
            "truncated_texts": truncated,
        }
        return {"summary": summary, "head": head_info, "layers": names, "top_k": k, "texts": shown,
                "tables": {"lens_by_layer": table}}

    # ------------------------------------------------------------------ engines
    def _runner(self, ctx: Context, run: ModelRun, k: int):
        """A function texts -> LensBatch over layers 0..L, the head info, and how it is computed."""
        from layerscope.decoding.lens import LensBatch
        from layerscope.engines.registry import engine_spec

        if engine_spec(run.engine.info.name).reference:  # the PyTorch reference: its own head, in PyTorch
            from layerscope.decoding.heads import load_decoding_model
            from layerscope.decoding.lens import torch_lens

            from layerscope.decoding.lens_onnx import positions_per_run

            ctx.say(f"loading {run.handle.manifest.source.path_or_id} and its decoding head in PyTorch")
            model = load_decoding_model(run.handle)
            enc = run.engine.encoder()
            all_layers = list(range(run.num_layers + 1))
            step = positions_per_run(int(run.handle.manifest.vocab_size), layers=len(all_layers),
                                     hidden=int(run.handle.manifest.hidden_size))  # the ONNX head's budgets

            def go(texts, bar):
                batch = enc(texts)
                import torch

                inputs = {n: torch.from_numpy(v) for n, v in batch.inputs.items()}
                out = torch_lens(model, inputs, all_layers, k, positions=step, bar=bar)
                out.truncated = int(batch.truncated.sum())
                return out

            return go, model.info.to_dict(), "torch (PyTorch head)"

        from layerscope.decoding.lens_onnx import export_lens, lens_file, onnx_lens, read_sidecar
        from layerscope.engines.ort_session import make_session
        from layerscope.export.open import ensure_export
        from layerscope.vocab.outputs import hidden_outputs

        handle = ensure_export(run.handle)
        meta = read_sidecar(handle, k)
        if meta is None:
            ctx.say(f"exporting the lens head into {handle.export_dir / lens_file(k)} (once)")
            meta = export_lens(handle.export_dir, k, say=ctx.say)
        # the engine runs the export for every layer's hidden states; the head graph alone decodes them
        engine = run.engine
        session = make_session(handle.export_dir / lens_file(k), "CPUExecutionProvider")
        enc = engine.encoder()
        names = hidden_outputs(run.num_layers)
        decoder = handle.manifest.kind == "decoder"
        vocab = int(handle.manifest.vocab_size)

        def go(texts, bar):
            batch = enc(texts)
            hidden = engine.run_outputs(batch, names)
            r, ids, p = onnx_lens(session, hidden, batch.input_ids, batch.mask, decoder, k, vocab, bar=bar)
            del hidden
            out = LensBatch(r, ids, p.astype(np.float64), batch.input_ids, batch.mask)
            out.truncated = int(batch.truncated.sum())
            return out

        return go, meta.head.to_dict(), (f"{engine.info.name} ({engine.info.provider}) for the hidden states, "
                                  f"{lens_file(k)} (ONNX Runtime CPU) for the head")


def _text_detail(text: str, b, j: int, keep_row: np.ndarray, names: list[str], tok, decoder: bool) -> dict:
    n = int(b.mask[j].sum())
    ids = b.input_ids[j, :n].tolist()
    tokens = tok.convert_ids_to_tokens(ids)
    layers = {}
    for li, name in enumerate(names):
        top = [[[tok.convert_ids_to_tokens(int(t)), round(float(p), 5)]
                for t, p in zip(b.topk_ids[li, j, i], b.topk_probs[li, j, i])] for i in range(n)]
        layers[name] = {"top": top, "rank": [int(r) for r in b.rank[li, j, :n]]}
    return {"text": text, "tokens": tokens, "counted": [bool(x) for x in keep_row[:n]], "layers": layers}

"""``layerscope run lens``: the logit lens, what token each layer already points at.

Per text, layer and position: the top-k decoded tokens with probabilities and the rank of the
input token (encoders) or of the actual next token (decoders).  Over the corpus, by layer: mean
and median rank, how often the top-1 token is that target, and how often it agrees with the
last layer's top-1.  The head used (the model's own MLM/causal head, or the tied word
embeddings for checkpoints without one) is said plainly in results.json and the report.

On the torch engine the head runs in PyTorch; on ort/cuda/trt/auto the head is appended to the
ONNX graph (``lens-k{k}.onnx``, exported once, checked against torch) so only ranks and top-k ids
leave the graph.

Every layer also gets its KL divergence to the final distribution (the model's own output) and the perplexity
of the target. ``--tuned DIR`` (a tuned lens: layerscope train-lens, or tuned-lens's own folder) decodes every
layer a second time, through that layer's translator, from the same hidden states (its own graph,
``lens-tuned-{id}-k{k}.onnx``, on the ONNX engines), and reports logit vs tuned per layer: KL to the final
distribution, top-1 agreement with the final layer and perplexity, each with a 95% bootstrap interval over the
texts, and the KL the translators take off with a paired interval. The texts should be held out from the lens's
training store: a run on the very corpus it was trained on is said so.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from layerscope.analyses.base import Analysis, AnalysisMetadata, Context, ModelRun, Option, register
from layerscope.errors import InputError
from layerscope.analyses.lens_tuned import (TUNED_CURVES, TUNED_TABLE, about, add_divergence_intervals, compare_rows,
                                            say_if_trained_on, tuned_about)
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
                                    "top1_agrees_with_last", "kl_to_final", "perplexity"), digits=3,
                  console=("layer", "mean_rank", "median_rank", "top1_is_target", "top1_agrees_with_last")),),
    listings=(Listing("head", "Decoding head", item="{kind}: {description}", limit=1),
              Listing("tuned_lens", "Tuned lens", item="{folder}: {about}", limit=1)),
    page=("lens tokens",),
)


FIGURES = Figures(sentence=FIGURES.sentence, summary_numbers=FIGURES.summary_numbers,
                  curves=FIGURES.curves + TUNED_CURVES,
                  tables=FIGURES.tables + (TUNED_TABLE,), listings=FIGURES.listings, page=FIGURES.page,
                  about=about)


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
            Option("tuned", str, None, "a tuned lens folder (layerscope train-lens, or tuned-lens's own "
                                       "config.json + params.pt): decode every layer through its translators too "
                                       "and compare with the logit lens", content=True),
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
        tuned = None
        if o.tuned is not None:
            from layerscope.decoding.tuned_lens import read_lens

            tuned = read_lens(o.tuned)  # every file checked, one line, before any model is read
        return read_texts(ctx.spec.data or LENS_TEXTS), tuned

    def check_model(self, ctx: Context, given: str, handle) -> None:
        """A tuned lens of another width or layer count, or of other weights, and a model without an LM head to
        decode through: one line, from the lens's config.json (prepare checked every file of it)."""
        tuned = self.options(ctx).tuned
        if tuned is None:
            return
        from layerscope.decoding.tuned_lens import check_fits, read_header

        config, record = read_header(tuned)
        check_fits(tuned, config, record, handle.manifest)
        anatomy = handle.manifest.anatomy
        if anatomy is not None and not anatomy.head:
            raise InputError(f"--tuned decodes through the model's LM head, and {given} has none")

    def compute(self, ctx: Context, run: ModelRun, data: Any) -> dict[str, Any]:
        from layerscope.decoding.lens import FORWARD_MACS, LensAccumulator, forward_macs_per_token, forward_runs
        from layerscope.progress import steps

        texts, tuned = data
        o = self.options(ctx)
        k = int(o.top_k)
        show = max(0, int(o.show))
        bs = int(o.batch)
        names = lens_layers(ctx, run)
        idx = [int(x) for x in names]
        handle = run.handle
        if tuned is not None:
            say_if_trained_on(ctx, tuned)
        tok = handle.tokenizer()
        vocab = int(handle.manifest.vocab_size)
        if k > vocab:
            raise InputError(f"--top-k {k} is larger than the vocabulary ({vocab})")
        decoder = handle.manifest.kind == "decoder"
        special = set(int(i) for i in tok.all_special_ids)
        runner, head_info, path = self._runner(ctx, run, k, tuned)
        acc = LensAccumulator(idx, special, decoder)
        tuned_acc = LensAccumulator(idx, special, decoder) if tuned is not None else None
        shown: list[dict[str, Any]] = []
        truncated = 0
        enc = run.engine.encoder()  # positions to decode, from the tokenizer alone: the count a long batch advances
        lengths = np.minimum(np.maximum(enc.token_lengths(texts), 1), enc.max_length)
        passes = 2 if tuned is not None else 1
        bar = steps("lens: tokens decoded at every layer", passes * int(lengths.sum()))
        per_token = forward_macs_per_token(handle.manifest.hidden_size, handle.manifest.num_layers)
        for start, stop in forward_runs(lengths, bs, FORWARD_MACS // per_token):  # a forward stays seconds long
            chunk = texts[start:stop]
            full, full_tuned, cut = runner(chunk, bar)
            truncated += cut
            b = full.layers(idx)
            keep = acc.add(b)
            if tuned_acc is not None:
                tuned_acc.add(full_tuned.layers(idx))
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
        add_divergence_intervals(table, acc, seed=ctx.spec.seed)
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
            "truncated_texts": truncated, "uniform_cross_entropy": float(np.log(vocab)),
        }
        out = {"summary": summary, "head": head_info, "layers": names, "top_k": k, "texts": shown,
               "tables": {"lens_by_layer": table}}
        if tuned_acc is not None:
            tuned_rows = tuned_acc.table(names)
            add_text_intervals(tuned_rows, *tuned_acc.per_text(), seed=ctx.spec.seed)
            add_divergence_intervals(tuned_rows, tuned_acc, seed=ctx.spec.seed)
            rows = compare_rows(table, tuned_rows, acc, tuned_acc, seed=ctx.spec.seed)
            out["tables"]["tuned_vs_logit"] = rows
            mid_tuned = next(r for r in rows if r["lens"] == "tuned" and r["layer"] == mid["layer"])
            summary["headline"].append(headline("KL to the final layer, tuned lens", mid_tuned, "kl_to_final",
                                                f"layer {mid['layer']} (middle; logit lens "
                                                f"{mid.get('kl_to_final', float('nan')):.4g} nats)"))
            summary["tuned_kl_mid_layer"] = mid_tuned["kl_to_final"]
            out["tuned_lens"] = tuned_about(tuned)
        return out

    # ------------------------------------------------------------------ engines
    def _runner(self, ctx: Context, run: ModelRun, k: int, tuned=None):
        """A function ``(texts, bar) -> (LensBatch, tuned LensBatch or None, texts truncated)`` over layers 0..L,
        the head info, and how it is computed. Both lenses decode the same hidden states."""
        from layerscope.decoding.lens import LensBatch
        from layerscope.engines.registry import engine_spec

        if engine_spec(run.engine.info.name).reference:  # the PyTorch reference: its own head, in PyTorch
            from layerscope.decoding.heads import load_decoding_model
            from layerscope.decoding.lens import base_hidden_states, torch_lens
            from layerscope.decoding.lens_onnx import positions_per_run

            ctx.say(f"loading {run.handle.manifest.source.path_or_id} and its decoding head in PyTorch")
            model = load_decoding_model(run.handle)
            tuned_head = None
            if tuned is not None:
                from layerscope.decoding.tuned_lens import head_unembedding, translated_head, unembedding_hash

                weight = head_unembedding(model)
                tuned.check_fits(run.handle.manifest,
                                 unembedding_hash=unembedding_hash(weight) if weight is not None else None)
                tuned_head = translated_head(model.head, tuned.translators)
            enc = run.engine.encoder()
            all_layers = list(range(run.num_layers + 1))
            step = positions_per_run(int(run.handle.manifest.vocab_size), layers=len(all_layers),
                                     hidden=int(run.handle.manifest.hidden_size))  # the ONNX head's budgets

            def go(texts, bar):
                batch = enc(texts)
                import torch

                inputs = {n: torch.from_numpy(v) for n, v in batch.inputs.items()}
                hidden = base_hidden_states(model, inputs)
                out = torch_lens(model, inputs, all_layers, k, hidden, positions=step, bar=bar, divergence=True)
                other = None if tuned_head is None else torch_lens(model, inputs, all_layers, k, hidden,
                                                                   positions=step, bar=bar, head=tuned_head,
                                                                   divergence=True)
                return out, other, int(batch.truncated.sum())

            return go, model.info.to_dict(), "torch (PyTorch head)"

        from layerscope.decoding.lens_onnx import export_lens, lens_file, onnx_lens, read_sidecar
        from layerscope.engines.ort_session import make_session
        from layerscope.export.open import ensure_export
        from layerscope.vocab.outputs import hidden_outputs

        handle = ensure_export(run.handle)
        sessions = []
        for lens in ((None, tuned) if tuned is not None else (None,)):
            meta = read_sidecar(handle, k, lens)
            if meta is None:
                ctx.say(f"exporting the {'tuned ' if lens else ''}lens head into "
                        f"{handle.export_dir / lens_file(k, lens)} (once)")
                meta = export_lens(handle.export_dir, k, tuned=lens, say=ctx.say)
            sessions.append((meta, make_session(handle.export_dir / lens_file(k, lens), "CPUExecutionProvider")))
        # the engine runs the export for every layer's hidden states; the head graphs alone decode them
        engine = run.engine
        enc = engine.encoder()
        names = hidden_outputs(run.num_layers)
        decoder = handle.manifest.kind == "decoder"
        vocab = int(handle.manifest.vocab_size)

        def go(texts, bar):
            batch = enc(texts)
            hidden = engine.run_outputs(batch, names)
            outs = []
            for _, session in sessions:
                r, ids, p, kl, logprob = onnx_lens(session, hidden, batch.input_ids, batch.mask, decoder, k, vocab,
                                                   bar=bar, divergence=True)
                outs.append(LensBatch(r, ids, p.astype(np.float64), batch.input_ids, batch.mask, kl, logprob))
            del hidden
            return outs[0], outs[1] if len(outs) > 1 else None, int(batch.truncated.sum())

        graphs = " and ".join(lens_file(k, tuned if m.tuned else None) for m, _ in sessions)
        return go, sessions[0][0].head.to_dict(), (f"{engine.info.name} ({engine.info.provider}) for the hidden "
                                                   f"states, {graphs} (ONNX Runtime CPU) for the head")


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

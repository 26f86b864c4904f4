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

from pathlib import Path
from typing import Any

import numpy as np

from layerscope.analyses.base import Analysis, AnalysisMetadata, Context, ModelRun, Option, register
from layerscope.errors import InputError


def lens_layers(ctx, run) -> list[str]:
    """The run's layers without ``raw`` (the lens decodes layers 0..L)."""
    from layerscope.analyses.common import layers_for

    layers = layers_for(ctx, run)
    if "raw" in layers:
        layers = [x for x in layers if x != "raw"]
        if ctx.layers not in (None, "all"):
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


@register
class Lens(Analysis):
    metadata = AnalysisMetadata(
        name="lens",
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
    )

    def prepare(self, ctx: Context) -> Any:
        from layerscope.data.examples import LENS_TEXTS, read_texts

        o = self.options(ctx)
        k = int(o.top_k)
        if k < 1:
            raise InputError(f"--top-k must be at least 1, not {k}")
        if int(o.batch) < 1:
            raise InputError("--batch must be at least 1")
        return read_texts(ctx.data or LENS_TEXTS)

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
        add_text_intervals(table, *acc.per_text(), seed=ctx.seed)
        mid = table[len(table) // 2]
        from layerscope.analyses.intervals import headline, method

        summary = {
            "headline": [headline("top-1 = last layer's top-1", mid, "top1_agrees_with_last", f"layer {mid['layer']} "
                                  "(middle)"),
                         headline("top-1 = target", mid, "top1_is_target", f"layer {mid['layer']} (middle)")],
            "intervals": method(len(texts), "texts (a text's positions resample together)", ctx.seed)
                         + "; a share of exactly 0 or 1: Wilson interval with the texts as trials",
            "top1_agrees_with_last_mid_layer": mid["top1_agrees_with_last"], "mid_layer": mid["layer"],
            "n_texts": len(texts), "n_positions": acc.n, "head": head_info["kind"],
            "target": "next token" if decoder else "input token", "computed_by": path,
            "truncated_texts": truncated,
        }
        return {"summary": summary, "head": head_info, "layers": names, "top_k": k, "texts": shown,
                "tables": {"lens_by_layer": table}}

    # ------------------------------------------------------------------ engines
    def _runner(self, ctx: Context, run: ModelRun, k: int):
        """A function texts -> LensBatch over layers 0..L, the head info, and how it is computed."""
        from layerscope.decoding.lens import LensBatch

        if run.engine.info.name == "torch":
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

        return go, meta["head"], (f"{engine.info.name} ({engine.info.provider}) for the hidden states, "
                                  f"{lens_file(k)} (ONNX Runtime CPU) for the head")

    # ------------------------------------------------------------------ rendering
    def plots(self, results: dict[str, Any], out_dir: Path) -> list[str]:
        from layerscope.report.plots import layer_lines

        rank, agree, bands = {}, {}, {}
        names = list(results["per_model"])
        for model, fig in results["per_model"].items():
            rows = fig["tables"]["lens_by_layer"]
            layers = [r["layer"] for r in rows]
            pre = f"{model}: " if len(names) > 1 else ""  # one model: its name is in the title, not every entry
            rank[f"{pre}mean log10 rank"] = (layers, [r["mean_log10_rank"] for r in rows])
            for key, label in (("top1_agrees_with_last", "top-1 = last layer's top-1"),
                               ("top1_is_target", f"top-1 = {fig['summary']['target']}")):
                agree[pre + label] = (layers, [r[key] for r in rows])
                if any(r.get(f"{key}_ci_low") is not None for r in rows):
                    bands[pre + label] = ([r.get(f"{key}_ci_low") for r in rows],
                                          [r.get(f"{key}_ci_high") for r in rows])
        suffix = f" ({names[0].split('/')[-1]})" if len(names) == 1 else ""
        return [
            layer_lines(Path(out_dir) / "lens_rank.png", rank, title=f"logit lens: rank of the target token{suffix}",
                        ylabel="mean log10 rank (0 = top)"),
            layer_lines(Path(out_dir) / "lens_agreement.png", agree, title=f"logit lens: top-1 agreement{suffix}",
                        ylabel="fraction of positions", bands=bands, from_zero=True),
        ]

    def report(self, results: dict[str, Any]) -> str:
        from layerscope.report.writer import md_table

        lines = []
        for model, fig in results["per_model"].items():
            s = fig["summary"]
            lines += [f"## {model}", "",
                      f"**Decoding head: {fig['head']['kind']}.** {fig['head']['description']}.", "",
                      f"Target: the {s['target']}. Computed by {s['computed_by']}. {s['n_texts']} texts, "
                      f"{s['n_positions']} positions (special-token targets left out).", "",
                      md_table(fig["tables"]["lens_by_layer"]), ""]
            for t in fig["texts"][:3]:
                lines += [f"Top-1 token per layer for: _{t['text']}_", ""]
                rows = [{"layer": layer, **{f"{i}:{tokn}": t["layers"][layer]["top"][i][0][0]
                                           for i, tokn in enumerate(t["tokens"])}} for layer in fig["layers"]]
                lines += [md_table(rows), ""]
        return "\n".join(lines)

    def console_summary(self, results: dict[str, Any], console) -> None:
        from rich.table import Table

        from layerscope.report.console import esc

        for model, fig in results["per_model"].items():
            console.print(f"[bold]{esc(model)}[/bold]: head = {esc(fig['head']['kind'])} ({esc(fig['summary']['computed_by'])})")
            table = Table(title=f"logit lens by layer (target: {esc(fig['summary']['target'])})")
            for col in ("layer", "mean rank", "median rank", "top-1 = target", "top-1 = last layer"):
                table.add_column(col, justify="right")
            for r in fig["tables"]["lens_by_layer"]:
                table.add_row(r["layer"], f"{r['mean_rank']:.1f}", f"{r['median_rank']:.0f}",
                              f"{r['top1_is_target']:.3f}", f"{r['top1_agrees_with_last']:.3f}")
            console.print(table)


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

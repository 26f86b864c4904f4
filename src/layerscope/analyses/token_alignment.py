"""token_alignment: where the alignment of paired texts comes from, token by token, layer by layer.

The decomposition the cross-lingual study did by hand, per layer (figures from metrics/tokens.py):

* cosine of tokens shared by both sides (same id, e.g. digits, operators, names), of the language-specific
  tokens (the ids only one side has), of the special tokens (BOS/CLS/SEP) and of the two first tokens;
* the alignment z of mean-pooled vectors (matched vs scrambled pairs, exact permutation moments) against the
  same z with the shared tokens removed from the pooled vectors: how much of the alignment the shared
  tokens carry;
* cosine by relative position (``--bins`` equal bins of ``(p + 0.5) / len``): is alignment uniform across
  the text?

Token vectors come from one forward pass per batch (extraction/token_embed.py), as ``extract --tokens`` stores them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from layerscope.analyses.alignment import ALIGNED_DATA_OPTIONS
from layerscope.analyses.base import Analysis, AnalysisMetadata, Context, ModelRun, Option, register
from layerscope.errors import InputError
from layerscope.report.figures import Curve, Figures, Line, Table

LAYERS_TABLE = "token_alignment_layers"

# What the reports show: PNG, report.md, report.html and the console all draw this one declaration.
FIGURES = Figures(
    sentence="{n_pairs:,} pairs, {tokens:,} tokens; {shared_token_share:.1%} of the non-special tokens have an id "
             "the other side shares. Last layer ({layer}): z = {z:.2f}, without shared tokens {z_without_shared:.2f}.",
    summary_numbers=("z", "z_without_shared", "shared_cosine", "specific_cosine", "special_cosine",
                     "shared_token_share", "n_pairs", "tokens"),
    curves=(
        Curve(LAYERS_TABLE, (Line("shared_cosine", "shared"), Line("specific_cosine", "specific"),
                             Line("special_cosine", "special"), Line("first_token_cosine", "first token")),
              file="token_cosines", title="paired texts: cosine of shared, language-specific and special tokens",
              ylabel="mean cosine",
              caption="Mean cosine of a pair's token vectors: tokens whose id both sides hold (shared), tokens only "
                      "one side holds (specific), special tokens, and the two first tokens."),
        Curve(LAYERS_TABLE, (Line("z", "all tokens"), Line("z_without_shared", "shared tokens removed")),
              file="z_without_shared", title="alignment z of mean-pooled vectors, with and without shared tokens",
              ylabel="z", caption="Matched vs scrambled pairs (exact permutation moments) of mean-pooled vectors, "
                                  "and the same with the shared tokens left out of the pooling."),
    ),
    tables=(Table(LAYERS_TABLE, ("layer", "shared_cosine", "specific_cosine", "special_cosine", "first_token_cosine",
                                 "z", "z_without_shared"), prefixes=("pos",),
                  console=("layer", "shared_cosine", "specific_cosine", "special_cosine", "first_token_cosine", "z",
                           "z_without_shared")),),
)


PAIR_OPTIONS = ("generate", "n", "source_file", "target_file", "source_column", "target_column", "category_column")


class LayerSums:
    """One layer's figures gathered chunk by chunk of pairs: the decomposition's and the position bins' items,
    and each text's pooled vectors (with and without its shared tokens; averaged in float64, kept in float32)
    for the alignment z: per pair, 4 vectors, whatever the texts' lengths."""

    def __init__(self, n: int, hidden: int, bins: int):
        self.items: dict | None = None
        self.bins: list[list[float]] = [[] for _ in range(bins)]
        self.pooled = {k: np.zeros((n, hidden), np.float32) for k in ("s", "t", "ws", "wt")}

    def add(self, pairs: np.ndarray, src, tgt) -> None:
        """The figures of the pairs ``pairs`` (their sides ``src`` and ``tgt``, in that order)."""
        from layerscope.metrics.tokens import decomposition_items, join_items, pooled_without_shared, position_items

        self.items = join_items(self.items, decomposition_items(src, tgt))
        for b, values in enumerate(position_items(src, tgt, len(self.bins))):
            self.bins[b] += values
        self.pooled["s"][pairs] = [src.text(i)[0].mean(0) for i in range(len(src))]
        self.pooled["t"][pairs] = [tgt.text(i)[0].mean(0) for i in range(len(tgt))]
        self.pooled["ws"][pairs], self.pooled["wt"][pairs] = pooled_without_shared(src, tgt)

    def row(self) -> dict[str, Any]:
        from layerscope.metrics.permutation import scrambled_z_exact
        from layerscope.metrics.tokens import decomposition_summary

        row: dict[str, Any] = dict(decomposition_summary(self.items))
        row["z"] = scrambled_z_exact(self.pooled["s"], self.pooled["t"])["z"]
        row["z_without_shared"] = scrambled_z_exact(self.pooled["ws"], self.pooled["wt"])["z"]
        for b, values in enumerate(self.bins):
            row[f"pos{b}"] = float(np.mean(values)) if values else None
        return row


@register
class TokenAlignment(Analysis):
    metadata = AnalysisMetadata(
        name="token_alignment",
        description="Token-level decomposition of paired-text alignment: shared, language-specific and "
                    "special tokens, z without shared tokens, alignment by relative position",
        inputs=("aligned",),
        main_score="z_without_shared",
        default_data="zh-en",
        options=(
            *ALIGNED_DATA_OPTIONS,
            Option("bins", int, 10, "relative-position bins"),
        ),
        figures=FIGURES,
    )

    def prepare(self, ctx: Context):
        from dataclasses import replace

        from layerscope.analyses.alignment import Alignment
        from layerscope.analyses.spec import make_options

        o = self.options(ctx)
        if o.bins < 1:
            raise InputError(f"--bins must be at least 1, got {o.bins}")
        # the same pair sources and checks as alignment: its prepare, given this run's pair options
        pair_options = make_options(Alignment.metadata, {k: getattr(o, k) for k in PAIR_OPTIONS})
        return Alignment().prepare(replace(ctx, opts=pair_options))

    def compute(self, ctx: Context, run: ModelRun, data) -> dict[str, Any]:
        from layerscope.analyses.common import layers_for
        from layerscope.metrics.tokens import Side
        from layerscope.progress import steps
        from layerscope.extraction.token_embed import embed_tokens, token_chunks, token_lengths

        layers = layers_for(ctx, run)
        bins = self.options(ctx).bins
        n = len(data)
        if n < 2:
            raise InputError("token_alignment needs at least 2 pairs")
        spec = ctx.spec
        texts = data.sources + data.targets
        lengths, fed = token_lengths(run.engine, texts, max_length=spec.max_length)
        hidden = int(run.engine.manifest.hidden_size)
        # pairs read a chunk at a time: the token vectors held are one chunk's, not the corpus's
        chunks = token_chunks(fed, [np.array([i, n + i]) for i in range(n)], row_bytes=4 * hidden * len(layers))
        sums = {layer: LayerSums(n, hidden, bins) for layer in layers}
        with steps("token_alignment: texts through the model", 2 * n) as bar:
            for chunk in chunks:
                tv = embed_tokens(run.engine, [texts[j] for j in chunk], layers, batch_tokens=spec.batch_tokens,
                                  max_length=spec.max_length, lengths=lengths[chunk], bar=bar)
                src_tv, tgt_tv = tv.select(np.arange(0, len(chunk), 2)), tv.select(np.arange(1, len(chunk), 2))
                del tv
                for layer in layers:
                    sums[layer].add(chunk[0::2],
                                    Side(src_tv.layers[layer], src_tv.ids, src_tv.special, src_tv.offsets),
                                    Side(tgt_tv.layers[layer], tgt_tv.ids, tgt_tv.special, tgt_tv.offsets))
        rows = [{"layer": layer, **sums[layer].row()} for layer in layers]
        last = rows[-1]
        summary = {"layer": last["layer"], "z": last["z"], "z_without_shared": last["z_without_shared"],
                   "shared_cosine": last["shared_cosine"], "specific_cosine": last["specific_cosine"],
                   "special_cosine": last["special_cosine"], "shared_token_share": last["shared_token_share"],
                   "n_pairs": n, "tokens": int(fed.sum())}
        return {"summary": summary, "layers": layers, "bins": bins, "tables": {LAYERS_TABLE: rows}}

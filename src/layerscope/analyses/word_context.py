"""word_context: word embeddings in context, and whether the same word finds itself across contexts.

A word's vector in one context is the mean of the tokens covering it (its sub-word pieces, found by their
character spans) at one layer, or averaged over the last ``--last-k`` layers (the recipe of the BERT
notes: the last four). Per layer (and for the last-k average) the figure is the same-word share: for each
occurrence of the chosen words, the share of its ``--knn`` nearest other occurrences (cosine) that are the
same word. A nearest-neighbour view of a sample of occurrences (with their texts) goes to the results.

Words: ``--words a,b,c``, else the most frequent words (letters only, at least 4 of them) that occur in at
least 3 texts. Texts: ``--data``, else the English side of the built-in zh-en problems.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import numpy as np

from layerscope.analyses.base import Analysis, AnalysisMetadata, Context, ModelRun, Option, register
from layerscope.errors import InputError
from layerscope.report.figures import Curve, Figures, Line, Listing, Table

LAYERS_TABLE = "word_context_layers"

# What the reports show: PNG, report.md, report.html and the console all draw this one declaration.
FIGURES = Figures(
    sentence="{occurrences:,} occurrences of {words}; same-word share among {knn} nearest neighbours with the "
             "{vectors} vectors: {same_word_share:.3f} (chance {chance:.3f}).",
    summary_numbers=("same_word_share", "chance", "knn", "occurrences"),
    curves=(Curve(LAYERS_TABLE, (Line("same_word_share", "same-word share"),), file="same_word_share",
                  title="same word among an occurrence's nearest neighbours (line: chance)", ylabel="same-word share",
                  caption="For each occurrence of the chosen words, the share of its nearest other occurrences "
                          "(cosine of the word's vector in context) that are the same word.",
                  chance="chance", per_model=False, layers_only=True),),
    tables=(Table(LAYERS_TABLE, ("layer", "same_word_share")),),
    listings=(Listing("neighbours", "Nearest neighbours of a sample of occurrences",
                      item="{word} in text {text}: {neighbours}", sub="neighbours", each="{word} (text {text})"),),
)

WORD = re.compile(r"[^\W\d_]{4,}")


def find_occurrences(texts: list[str], words: list[str], most: int) -> list[tuple[str, int, int, int]]:
    """``(word, text, start, end)`` of each whole-word, case-insensitive occurrence, at most ``most`` per word
    (the first ones in corpus order)."""
    out, count = [], Counter()
    patterns = {w: re.compile(rf"(?<!\w){re.escape(w)}(?!\w)", re.IGNORECASE) for w in words}
    for t, text in enumerate(texts):
        for w, pat in patterns.items():
            for m in pat.finditer(text):
                if count[w] < most:
                    out.append((w, t, m.start(), m.end()))
                    count[w] += 1
    return out


def frequent_words(texts: list[str], top: int) -> list[str]:
    """The ``top`` words (lower-cased, letters only, 4+) found in the most texts, at least 3 of them."""
    in_texts = Counter(w for text in texts for w in {m.group().lower() for m in WORD.finditer(text)})
    return [w for w, c in sorted(in_texts.items(), key=lambda x: (-x[1], x[0])) if c >= 3][:top]


@register
class WordContext(Analysis):
    metadata = AnalysisMetadata(
        name="word_context",
        reads="model",
        description="Word embeddings in context (one layer or the last k averaged): does the same word find "
                    "itself across contexts? Same-word nearest-neighbour share per layer",
        inputs=("texts",),
        main_score="same_word_share",
        default_data="zh-en",
        options=(
            Option("words", str, None, "comma list of words (default: the most frequent words in 3+ texts)"),
            Option("top_words", int, 8, "how many frequent words when --words is not given"),
            Option("last_k", int, 4, "layers averaged for the last-k vectors"),
            Option("knn", int, 5, "neighbours per occurrence"),
            Option("max_per_word", int, 40, "occurrences kept per word"),
            Option("n", int, 100, "built-in zh-en problems (English side) used as texts when no --data"),
            Option("examples", int, 12, "occurrences whose nearest neighbours are kept for the report"),
        ),
        figures=FIGURES,
    )

    def prepare(self, ctx: Context):
        o = self.options(ctx)
        for name in ("top_words", "last_k", "knn", "max_per_word", "n"):
            if getattr(o, name) < 1:
                raise InputError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(o, name)}")
        if ctx.spec.data:
            from layerscope.data.corpus import read_corpus

            records, stats = read_corpus(ctx.spec.data)
            texts, origin = [r.text for r in records], ctx.spec.data
        else:
            from layerscope.data.bilingual import generate_pairs

            texts = [p.target for p in generate_pairs(o.n, ctx.spec.seed)]
            origin = f"generated zh-en problems, English side (n={len(texts)}, seed={ctx.spec.seed})"
        words = [w.strip() for w in o.words.split(",") if w.strip()] if o.words else frequent_words(texts, o.top_words)
        occ = find_occurrences(texts, words, o.max_per_word)
        found = sorted({w for w, *_ in occ})
        missing = [w for w in words if w not in found]
        if missing:
            ctx.say(f"not found in the texts: {', '.join(missing)}")
        if len(found) < 2 or len(occ) < 3:
            raise InputError(f"{origin}: the words {', '.join(words) or '(none)'} occur {len(occ)} times "
                             f"({len(found)} distinct); give --words that occur in several texts")
        ctx.say(f"{len(occ):,} occurrences of {len(found)} words in {len(texts):,} texts from {origin}")
        return {"texts": texts, "origin": origin, "words": found, "occurrences": occ}

    def compute(self, ctx: Context, run: ModelRun, data) -> dict[str, Any]:
        from layerscope.analyses.common import layers_for
        from layerscope.metrics.tokens import same_word_share

        o = self.options(ctx)
        layers = layers_for(ctx, run)
        k_last = min(o.last_k, run.num_layers)
        last = [str(i) for i in range(run.num_layers - k_last + 1, run.num_layers + 1)]
        needed = layers + [x for x in last if x not in layers]
        spec = ctx.spec
        occ = data["occurrences"]
        labels = [w for w, *_ in occ]
        vectors = self._occurrence_vectors(ctx, run, data["texts"], occ, layers, last, needed, spec)
        knn = min(o.knn, len(occ) - 1)
        rows = []
        for layer in layers:
            share, _ = same_word_share(vectors[layer], labels, knn)
            rows.append({"layer": layer, "same_word_share": share})
        name = f"last{k_last}"
        share, nbrs = same_word_share(vectors[None], labels, knn)
        rows.append({"layer": name, "same_word_share": share})
        chance = float(np.mean([(labels.count(w) - 1) / (len(labels) - 1) for w in labels]))
        shown = np.linspace(0, len(occ) - 1, min(o.examples, len(occ))).astype(int)
        texts = data["texts"]
        view = [{"word": labels[i], "text": int(occ[i][1]), "context": texts[occ[i][1]],
                 "neighbours": [{"word": labels[j], "text": int(occ[j][1]), "context": texts[occ[j][1]]}
                                for j in nbrs[i]]} for i in shown]
        return {"summary": {"same_word_share": share, "vectors": name, "chance": chance, "knn": knn,
                            "occurrences": len(occ), "words": data["words"]},
                "layers": layers, "neighbours": view, "tables": {LAYERS_TABLE: rows}}

    @staticmethod
    def _occurrence_vectors(ctx, run, texts, occ, layers, last, needed, spec) -> dict[Any, np.ndarray]:
        """Each occurrence's vector per layer (and under None, averaged over the ``last`` layers). Only the texts
        that hold an occurrence pass through the model, a chunk at a time: what is held is one chunk's token
        vectors and the occurrences' vectors, whatever the size of the corpus."""
        from layerscope.metrics.tokens import span_vectors
        from layerscope.progress import steps
        from layerscope.extraction.token_embed import embed_tokens, token_chunks, token_lengths

        holding = np.array(sorted({t for _, t, _, _ in occ}), np.int64)
        chosen = [texts[t] for t in holding]
        lengths, fed = token_lengths(run.engine, chosen, max_length=spec.max_length)
        hidden = int(run.engine.manifest.hidden_size)
        chunks = token_chunks(fed, [np.array([i]) for i in range(len(holding))], row_bytes=4 * hidden * len(needed))
        local = {int(t): i for i, t in enumerate(holding)}
        out: dict[Any, np.ndarray] = {key: np.zeros((len(occ), hidden)) for key in [*layers, None]}
        with steps(f"word_context: {len(holding):,} texts with the words, through the model", len(holding)) as bar:
            for chunk in chunks:
                tv = embed_tokens(run.engine, [chosen[i] for i in chunk], needed, batch_tokens=spec.batch_tokens,
                                  max_length=spec.max_length, lengths=lengths[chunk], bar=bar)
                row_of = {int(i): r for r, i in enumerate(chunk)}
                mine = [j for j, (_, t, _, _) in enumerate(occ) if local[t] in row_of]
                where = [(row_of[local[occ[j][1]]], occ[j][2], occ[j][3]) for j in mine]
                for layer in layers:
                    out[layer][mine] = span_vectors([tv.layers[layer]], tv.spans, tv.offsets, where)
                out[None][mine] = span_vectors([tv.layers[x] for x in last], tv.spans, tv.offsets, where)
        return out

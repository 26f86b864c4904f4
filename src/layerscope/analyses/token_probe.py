"""token_probe: does a layer's token vector hold a word's label (part of speech, ...), beyond what a probe could
memorise of the word types? Linear probes with control tasks (Hewitt & Liang 2019).

Per layer: a linear probe (multinomial logistic regression, metrics/probes.py) trained on the words of a
seeded share of the sentences and scored on the rest; the same probe on the control task (each word type
mapped to one random label drawn from the labels' distribution), on the same words and split. Selectivity =
accuracy - control accuracy: high where the layer holds the property, not just the word's identity.

Words come from a CoNLL-U file (a column, ``upos`` by default) or JSON lines (words and labels); a sentence's
text is its words joined by spaces, and each word's vector is its first piece, last piece or the mean of its
pieces (``--pieces``) among the model's tokens whose character spans lie inside the word's. Words and tokens
are aligned from the tokenizer alone, before the model runs: a word without a token (cut at the max length)
or a token across two words is one line naming the sentence.

Intervals: 95% percentile bootstrap over the test sentences (the three figures from the same resamples).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from layerscope.analyses.base import Analysis, AnalysisMetadata, Context, ModelRun, Option, register
from layerscope.errors import InputError
from layerscope.report.figures import Curve, Figures, Line, Table

TABLE = "token_probe_layers"

FIGURES = Figures(
    sentence="{train_words:,} training and {test_words:,} test words ({labels} labels, {label_column}, "
             "{pieces} piece); best selectivity {selectivity:.3f} at layer {layer} (accuracy {accuracy:.3f}, "
             "control {control_accuracy:.3f}; majority label {chance:.3f}).",
    summary_numbers=("selectivity", "accuracy", "control_accuracy", "chance", "train_words", "test_words"),
    curves=(
        Curve(TABLE, (Line("accuracy", "probe"), Line("control_accuracy", "control task")), file="accuracy",
              title="linear probe accuracy, probe vs control task (line: majority label; {about})",
              ylabel="test accuracy", chance="chance", layers_only=True,
              caption="A linear probe per layer on each word's vector, trained on the words of most sentences and "
                      "tested on the words of the others; the control task gives each word type "
                      "one fixed random label (Hewitt & Liang 2019). Bands: 95% bootstrap over test sentences."),
        Curve(TABLE, (Line("selectivity", "selectivity"),), file="selectivity",
              title="probe selectivity, accuracy - control accuracy ({about})", ylabel="selectivity", level=0.0,
              layers_only=True, caption="What the layer holds of the label beyond what a probe can memorise of the "
                                        "word types; 0: no more than the control."),
    ),
    tables=(Table(TABLE, ("layer", "accuracy", "control_accuracy", "selectivity")),),
    about=lambda r: f"{', '.join(r.per_model)}; {r.data.label}",
)


@register
class TokenProbe(Analysis):
    metadata = AnalysisMetadata(
        name="token_probe",
        description="Linear probes per layer on token vectors for word labels (CoNLL-U or JSONL), with control "
                    "tasks: accuracy, control accuracy and selectivity",
        inputs=("tagged",),
        main_score="selectivity",
        options=(
            Option("label_column", str, "upos", "CoNLL-U column holding the label",
                   choices=("upos", "xpos", "deprel", "feats", "lemma")),
            Option("words_field", str, "words", "JSONL field holding the words"),
            Option("labels_field", str, "labels", "JSONL field holding the labels"),
            Option("pieces", str, "first", "a word's vector from its tokens", choices=("first", "mean", "last")),
            Option("c", float, 1.0, "inverse L2 strength of the probe (scikit-learn's C)"),
            Option("test_share", float, 0.2, "share of the sentences held out for testing"),
            Option("max_sentences", int, 1000, "a seeded sample of at most this many sentences"),
        ),
        figures=FIGURES,
    )

    def prepare(self, ctx: Context):
        from layerscope.data.tagged import read_tagged

        o = self.options(ctx)
        if not ctx.spec.data:
            raise InputError("token_probe needs --data: a .conllu file, or a .jsonl file of words and labels")
        if not 0.0 < o.test_share < 1.0:
            raise InputError(f"--test-share must be between 0 and 1, got {o.test_share}")
        if o.c <= 0 or o.max_sentences < 2:
            raise InputError("--c must be > 0 and --max-sentences at least 2")
        sentences = read_tagged(ctx.spec.data, column=o.label_column, words=o.words_field, labels=o.labels_field)
        rng = np.random.default_rng(ctx.spec.seed)
        if len(sentences) > o.max_sentences:
            keep = np.sort(rng.choice(len(sentences), o.max_sentences, replace=False))
            sentences = [sentences[i] for i in keep]
        n_test = int(round(len(sentences) * o.test_share))
        if len(sentences) < 10 or n_test < 2 or len(sentences) - n_test < 2:
            raise InputError(f"{ctx.spec.data}: {len(sentences)} sentences; a probe needs at least 10 (some to "
                             "train on, some to test on)")
        test = np.zeros(len(sentences), bool)
        test[rng.choice(len(sentences), n_test, replace=False)] = True
        labels = sorted({lab for s in sentences for lab in s.labels})
        if len(labels) < 2:
            raise InputError(f"{ctx.spec.data}: every word has the label {labels[0]!r}; a probe needs two or more")
        return {"sentences": sentences, "test": test}

    def combine(self, ctx: Context, per_model, data) -> dict[str, Any]:
        from pathlib import Path

        o = self.options(ctx)
        what = o.label_column if str(ctx.spec.data).endswith(".conllu") else o.labels_field
        return {"data": {"origin": str(ctx.spec.data), "n": len(data["sentences"]),
                         "label": f"{Path(str(ctx.spec.data)).name}, {what}, {o.pieces} piece"}}

    def compute(self, ctx: Context, run: ModelRun, data) -> dict[str, Any]:
        from layerscope.analyses.common import layers_for
        from layerscope.metrics.probes import LinearProbe, control_labels

        o = self.options(ctx)
        layers = layers_for(ctx, run)
        sentences, test = data["sentences"], data["test"]
        pieces = _align(run, sentences, ctx.spec.max_length)  # before the model: labels must align
        vectors = _word_vectors(ctx, run, sentences, pieces, layers, o.pieces)
        words = [w for s in sentences for w in s.words]
        gold = np.array([lab for s in sentences for lab in s.labels], dtype=object)
        sent = np.repeat(np.arange(len(sentences)), [len(s.words) for s in sentences])
        on_test = test[sent]
        control_map = control_labels([w for w, t in zip(words, on_test) if not t],
                                     list(gold[~on_test]), ctx.spec.seed)
        spare = control_labels(words, list(gold[~on_test]), ctx.spec.seed + 1)  # types seen only in testing
        control = np.array([control_map.get(w, spare[w]) for w in words], dtype=object)
        chance_label = max(set(gold[~on_test]), key=list(gold[~on_test]).count)
        chance = float(np.mean(gold[on_test] == chance_label))
        test_sent = sent[on_test]
        rows = []
        from layerscope.progress import track

        for layer in track(layers, "token_probe: a probe and its control per layer"):
            x = vectors[layer]
            hits = {}
            for key, y in (("accuracy", gold), ("control_accuracy", control)):
                probe = LinearProbe.fit(x[~on_test], y[~on_test], c=o.c)
                hits[key] = (probe.predict(x[on_test]) == y[on_test]).astype(np.float64)
            rows.append(_row(layer, hits, test_sent, ctx.spec.seed))
        best = max(rows, key=lambda r: r["selectivity"])
        summary = {"selectivity": best["selectivity"], "accuracy": best["accuracy"],
                   "control_accuracy": best["control_accuracy"], "layer": best["layer"], "chance": chance,
                   "train_words": int((~on_test).sum()), "test_words": int(on_test.sum()),
                   "labels": len(set(gold)), "label_column": o.label_column if str(ctx.spec.data).endswith(
                       ".conllu") else o.labels_field, "pieces": o.pieces}
        return {"summary": summary, "layers": layers, "tables": {TABLE: rows}}


def _row(layer: str, hits: dict[str, np.ndarray], test_sent: np.ndarray, seed: int) -> dict[str, Any]:
    """Accuracy, control accuracy and selectivity with percentile bootstrap intervals over test sentences."""
    from layerscope.analyses.intervals import BOOTSTRAP, interval

    groups, local = np.unique(test_sent, return_inverse=True)
    words = np.bincount(local).astype(np.float64)
    correct = {k: np.bincount(local, weights=v, minlength=len(groups)) for k, v in hits.items()}
    row: dict[str, Any] = {"layer": layer, "accuracy": float(hits["accuracy"].mean()),
                           "control_accuracy": float(hits["control_accuracy"].mean())}
    row["selectivity"] = row["accuracy"] - row["control_accuracy"]

    def share(key):
        def scorer(idx):
            idx = np.asarray(idx)
            return correct[key][idx].sum(-1) / words[idx].sum(-1)
        return scorer

    scorers = {"accuracy": share("accuracy"), "control_accuracy": share("control_accuracy"),
               "selectivity": lambda idx: share("accuracy")(idx) - share("control_accuracy")(idx)}
    for key, scorer in scorers.items():
        lo, hi = interval(scorer, len(groups), seed=seed)
        row[f"{key}_ci_low"], row[f"{key}_ci_high"], row[f"{key}_ci_method"] = lo, hi, BOOTSTRAP
    return row


def _align(run: ModelRun, sentences, max_length) -> list[list[np.ndarray]]:
    """Each sentence's words as token positions, from the tokenizer alone; a misalignment is one line."""
    from layerscope.metrics.probes import Misaligned, word_tokens

    encoder = run.engine.encoder(max_length, "")
    out = []
    for start in range(0, len(sentences), 256):
        part = sentences[start:start + 256]
        batch = encoder([s.text for s in part], details=True)
        mask = np.asarray(batch.mask) > 0
        for i, s in enumerate(part):
            try:
                out.append(word_tokens(batch.spans[i][mask[i]], batch.special[i][mask[i]], s.spans))
            except Misaligned as exc:
                raise InputError(f"{s.where}: the labels do not align with {run.name}'s tokens: {exc} (the text "
                                 f"is the words joined by spaces: {s.text[:80]!r})") from None
    return out


def _word_vectors(ctx: Context, run: ModelRun, sentences, pieces, layers, how: str) -> dict[str, np.ndarray]:
    """``{layer: float32 [words, hidden]}``, the model run over the sentences a chunk at a time."""
    from layerscope.extraction.token_embed import embed_tokens, token_chunks, token_lengths
    from layerscope.metrics.probes import word_vectors
    from layerscope.progress import steps

    spec = ctx.spec
    texts = [s.text for s in sentences]
    lengths, fed = token_lengths(run.engine, texts, max_length=spec.max_length)
    hidden = int(run.engine.manifest.hidden_size)
    starts = np.concatenate([[0], np.cumsum([len(s.words) for s in sentences])])
    out = {la: np.zeros((int(starts[-1]), hidden), np.float32) for la in layers}
    chunks = token_chunks(fed, [np.array([i]) for i in range(len(texts))], row_bytes=4 * hidden * len(layers))
    with steps(f"token_probe: {len(texts):,} sentences through the model", len(texts)) as bar:
        for chunk in chunks:
            tv = embed_tokens(run.engine, [texts[i] for i in chunk], layers, batch_tokens=spec.batch_tokens,
                              max_length=spec.max_length, lengths=lengths[chunk], bar=bar)
            for r, i in enumerate(chunk):
                a, b = int(tv.offsets[r]), int(tv.offsets[r + 1])
                for la in layers:
                    out[la][starts[i]:starts[i + 1]] = word_vectors(tv.layers[la][a:b], pieces[i], how)
    return out

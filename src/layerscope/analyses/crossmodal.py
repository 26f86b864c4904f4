"""crossmodal: where an image model and a text model meet, layer pair by layer pair, beyond chance.

``layerscope run crossmodal --model VISION_EXPORT --model TEXT_MODEL --data pairs.jsonl``: the images through
the vision tower (an export made with ``layerscope export``; ``--tower vision`` for CLIP/SigLIP), their
captions through the text model (the same CLIP checkpoint reads its text tower), each model's first pooling
on every layer; then for every (image layer, text layer) pair, metrics/crossmodal.py's mutual k-NN (the
platonic-representation definition), linear CKA and retrieval acc@k both ways, each with a shuffled-pairing
null and a 95% bootstrap interval, and the best layer pair with an interval that pays for choosing it.

``--data`` is JSONL, one pair a line: ``{"image": "path", "caption": "text"}`` (paths relative to the file);
without it, the first ``--n`` of scikit-learn's bundled handwritten digits, each captioned "a photo of the
digit three" (offline, 1,797 at most).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from layerscope.analyses.base import Analysis, AnalysisMetadata, Context, ModelOutput, ModelRun, Option, register
from layerscope.errors import InputError, MissingExtraError
from layerscope.report.crossmodal_plot import TITLES
from layerscope.report.figures import Figures, HeatMap
from layerscope.report.image_records import PAIRS

SELECT = ("mutual_knn", "cka", "a_to_b", "b_to_a")
THUMBNAILS = 24  # images shown small in report.html

# What the reports show, declared once: the best pair in words (report.md, report.html, the console), a heat map
# per figure over (image layer, text layer) on report.html, the pairs shown small (their typed records); the PNG
# with every figure side by side and the best pair marked is drawn by ``plots`` from the typed combined figures.
FIGURES = Figures(
    preface="{n} image-caption pairs: {image_model} (images) and {text_model} (captions), every layer pair. "
            "Best pair: image layer {best.image_layer}, text layer {best.text_layer}: {best.value:.4f} by "
            "{best.figure} (95% interval of the maximum over all layer pairs {best.ci_low:.4f} to {best.ci_high:.4f}; "
            "best again in {best.chosen_share:.0%} of resamples; shuffled-pairing p = {best.p:.3g}).",
    console_preface=True,
    heatmaps=tuple(HeatMap(f"figures.{name}.value", f"crossmodal_{name}", title=f"{title}: {{image_model}} vs "
                           "{text_model}", zlabel=title, rows="image_layers", cols="text_layers",
                           xlabel="text layer", ylabel="image layer", block="", png=False,
                           caption="{n} image-caption pairs; empty cells are undefined (a layer whose rows are not "
                                   "distinct).") for name, title in TITLES.items()),
    page=("crossmodal pairs",),
    records=(PAIRS,),
)


WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def load_digits():
    """scikit-learn's bundled digits, or one line naming the extra that installs it (and ``--data``)."""
    try:
        from sklearn.datasets import load_digits as load
    except ImportError:
        raise MissingExtraError("scikit-learn", "images", "the built-in digits (used without --data)") from None
    return load()


def digit_pairs(n: int) -> list[tuple[str, bytes, str]]:
    """``(id, PNG bytes, caption)`` of the first ``n`` of scikit-learn's digits (8x8, 16 grey levels, scaled to
    0..255 and enlarged to 64x64 pixels)."""
    import io

    from PIL import Image

    digits = load_digits()
    if not 4 <= n <= len(digits.images):
        raise InputError(f"--n must be between 4 and {len(digits.images)} digits, got {n}")
    pairs = []
    for i in range(n):
        im = Image.fromarray((digits.images[i] * 255 / 16).astype(np.uint8), "L").resize((64, 64), Image.NEAREST)
        buf = io.BytesIO()
        im.save(buf, format="PNG")
        pairs.append((f"digit-{i}", buf.getvalue(), f"a photo of the digit {WORDS[int(digits.target[i])]}"))
    return pairs


def read_pairs(path: str, image_key: str, caption_key: str) -> list[tuple[str, str, str]]:
    """``(id, image file, caption)`` per line of a JSONL file, every image checked to exist."""
    data = Path(path)
    if not data.is_file():
        raise InputError(f"--data {path}: no such file (JSONL pairs: {{\"{image_key}\": ..., \"{caption_key}\": ...}})")
    pairs = []
    for number, line in enumerate(data.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            raise InputError(f"{path} line {number} is not JSON") from None
        if not isinstance(row, dict) or not isinstance(row.get(image_key), str) or not isinstance(row.get(caption_key), str):
            raise InputError(f"{path} line {number} needs a string \"{image_key}\" and a string \"{caption_key}\"")
        file = Path(row[image_key]) if Path(row[image_key]).is_absolute() else data.parent / row[image_key]
        if not file.is_file():
            raise InputError(f"{path} line {number}: image {row[image_key]} is not a file")
        from layerscope.data.images import image_size

        image_size(str(file), f"{path} line {number}: {file}")  # a header that cannot be read: one line, now
        pairs.append((str(row.get("id", number)), str(file), row[caption_key]))
    if len(pairs) < 4:
        raise InputError(f"{path} holds {len(pairs)} pairs; crossmodal needs at least 4")
    return pairs


@dataclass(frozen=True)
class Side:
    """One model's side of the pairs, handed from ``compute`` to ``combine``: ``[layers, pairs, hidden]`` vectors
    of its first pooling, the layers' names and whether it read the images or the captions."""

    vectors: np.ndarray
    layers: tuple[str, ...]
    modality: str


@register
class CrossModalAnalysis(Analysis):
    metadata = AnalysisMetadata(
        name="crossmodal",
        description="image-caption pairs through a vision model and a text model: mutual k-NN, CKA and "
                    "retrieval over every layer pair, with shuffled-pairing nulls and bootstrap intervals",
        inputs=("engine",),
        main_score="best_value",
        default_poolings=(),
        default_data="scikit-learn's digits (built in, --n of them)",
        figures=FIGURES,
        options=(
            Option("n", int, 200, "digits to pair with their captions when --data is not given"),
            Option("image_column", str, "image", "field of the image path in --data"),
            Option("caption_column", str, "caption", "field of the caption in --data"),
            Option("k", int, 10, "neighbours per item for mutual k-NN"),
            Option("acc_k", int, 1, "retrieval: the pair counts as found within the top acc_k"),
            Option("permutations", int, 100, "shuffled pairings for each figure's null"),
            Option("bootstrap", int, 200, "bootstrap resamples of the pairs for the intervals"),
            Option("select", str, "mutual_knn", "the figure the best layer pair is chosen by", choices=SELECT),
            Option("batch_size", int, 16, "images per batch"),
        ),
    )

    def default_poolings(self, handle) -> list[str]:
        m = handle.manifest
        if m.modality == "image":
            return ["cls" if m.image.prefix_tokens else "mean"]
        from layerscope.vocab.pooling import family_poolings

        return family_poolings(m, ("mean",))[:1]

    def prepare(self, ctx: Context) -> Any:
        o = self.options(ctx)
        if len(ctx.spec.given_models) != 2:
            raise InputError("crossmodal compares two models: --model VISION_EXPORT --model TEXT_MODEL")
        if o.k < 1 or o.acc_k < 1 or o.permutations < 0 or o.bootstrap < 0 or o.batch_size < 1:
            raise InputError("--k, --acc-k and --batch-size must be 1 or more, --permutations and --bootstrap 0 or more")
        pairs = read_pairs(ctx.spec.data, o.image_column, o.caption_column) if ctx.spec.data else digit_pairs(o.n)
        if o.k > len(pairs) - 2:
            raise InputError(f"--k {o.k} needs more than {o.k + 1} pairs; --data has {len(pairs)}")
        distinct = len({caption for _, _, caption in pairs})
        if distinct <= o.k:  # equal captions are equal text vectors: no k nearest neighbours to tell apart
            where = "--data" if ctx.spec.data else "the built-in digits (one caption per class)"
            raise InputError(f"{where}: {len(pairs)} pairs hold {distinct} distinct captions; mutual k-NN needs more "
                             f"than --k {o.k}: give --data with a caption of its own per image")
        return pairs

    def compute(self, ctx: Context, run: ModelRun, data: Any) -> ModelOutput:
        manifest = run.handle.manifest
        layers = [x for x in (run.layers or []) if x != "raw"]
        pooling = (run.poolings or self.default_poolings(run.handle))[0]
        if manifest.modality == "image":
            vectors = _image_vectors(run, [file for _, file, _ in data], layers, pooling, self.options(ctx).batch_size)
        else:
            got = ctx.vectors(run, [caption for _, _, caption in data], layers=layers, poolings=[pooling])
            vectors = np.stack([got[(pooling, layer)] for layer in layers])
        figures = {"summary": {"modality": manifest.modality, "pooling": pooling, "layers": layers}, "tables": {}}
        return ModelOutput(figures, kept=Side(vectors, tuple(layers), manifest.modality))

    def combine(self, ctx: Context, per_model, data) -> dict[str, Any]:
        from layerscope.metrics.crossmodal import crossmodal

        o = self.options(ctx)
        names = list(per_model.outputs)
        kept = [per_model.outputs[n].kept for n in names]
        images = [i for i, k in enumerate(kept) if k.modality == "image"]
        if len(images) != 1:
            raise InputError("crossmodal needs one vision export and one text model among the two --model")
        a, b = kept[images[0]], kept[1 - images[0]]
        try:
            res = crossmodal(a.vectors, b.vectors, k=o.k, acc_k=o.acc_k, permutations=o.permutations,
                             bootstrap=o.bootstrap, select=o.select, seed=ctx.spec.seed)
        except ValueError as exc:  # a figure undefined on every layer pair: the vectors of a side coincide
            raise InputError(f"crossmodal: {exc}; the images or the captions give too few distinct vectors: "
                             f"lower --k or choose another --select than {o.select}") from None
        figures = {f: {"value": fig.value, "null_mean": fig.null_mean, "p": fig.p, "ci_low": fig.ci_low,
                       "ci_high": fig.ci_high} for f, fig in res.figures.items()}
        best = res.best
        for name in names:  # the headline belongs to the pair of models: each model's summary shows it
            per_model.outputs[name].figures["summary"].update(
                best_value=best.value, best_ci_low=best.ci_low, best_ci_high=best.ci_high,
                best_pair=f"image layer {a.layers[best.layer_a]}, text layer {b.layers[best.layer_b]}")
        return {"image_model": names[images[0]], "text_model": names[1 - images[0]],
                "image_layers": list(a.layers), "text_layers": list(b.layers), "n": res.n, "k": res.k,
                "acc_k": res.acc_k, "permutations": res.permutations, "bootstrap": res.bootstrap,
                "pairs": _shown_pairs(data),
                "figures": figures,
                "best": {"figure": best.figure, "image_layer": a.layers[best.layer_a],
                         "text_layer": b.layers[best.layer_b], "value": best.value,
                         "ci_low": best.ci_low, "ci_high": best.ci_high, "chosen_share": best.chosen_share,
                         "p": float(res.figures[best.figure].p[best.layer_a, best.layer_b]),
                         "interval": "percentile bootstrap of the maximum over every layer pair"}}

    def plots(self, results, out_dir: Path) -> list[str]:
        """The declared figures, then every figure's heat map side by side with the best pair marked (one PNG)."""
        from layerscope.report.crossmodal_plot import heatmap
        from layerscope.report.crossmodal_results import CrossmodalResult
        from layerscope.report.results import as_results

        typed = as_results(results, self.metadata.name)
        combined = CrossmodalResult.read(typed.combined.extra)
        return super().plots(typed, out_dir) + ([] if combined is None else heatmap(combined, Path(out_dir)))


def _shown_pairs(data) -> list[dict[str, Any]]:
    """Each pair's id, image file name and caption; the first ``THUMBNAILS`` with a small copy of the image
    (base64 PNG, for report.html)."""
    from layerscope.data.images import thumbnail_png

    return [{"id": i, "image": Path(f).name if isinstance(f, str) else None, "caption": caption,
             **({"thumbnail": thumbnail_png(f)} if n < THUMBNAILS else {})}
            for n, (i, f, caption) in enumerate(data)]


def _image_vectors(run: ModelRun, files: list[str], layers: list[str], pooling: str, batch_size: int) -> np.ndarray:
    """``[layers, images, hidden]`` of one pooling, the images (paths or encoded bytes) read and processed here."""
    from layerscope.data.images import decode

    encoder = run.engine.image_encoder()
    parts = []
    for start in range(0, len(files), batch_size):
        idx = np.arange(start, min(start + batch_size, len(files)))
        batch = encoder([decode(files[i], bound=encoder.bound) for i in idx], idx)
        parts.append(run.engine.run(batch, layers, [pooling])[pooling])
    return np.concatenate(parts, axis=1)

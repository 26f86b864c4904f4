"""vision_lens: zero-shot classification from every layer of a CLIP or SigLIP image tower (the vision logit lens).

Each layer's states (from the vision export, any engine) go the way the last layer's go into the joint
space: CLIP's CLS through the tower's final norm (``post_layernorm``) and projection (``visual_projection``);
SigLIP's tokens (it has no CLS) through its final norm and attention-pooling head.  Each image is scored by
cosine against the text tower's embeddings of one prompt per class ("a photo of the digit three"); the
accuracy of the best-scoring class per layer, with its Wilson 95% interval.  The head and the text tower are
read from the checkpoint the export was made from (a two-tower CLIP or SigLIP).  Without ``--data``: the first ``--n`` of
scikit-learn's digits with the prompt template ``--template``; with it, JSONL ``{"image": path, "label": name}``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from layerscope.analyses.base import Analysis, AnalysisMetadata, Context, ModelOutput, ModelRun, Option, register
from layerscope.errors import InputError
from layerscope.report.figures import Curve, Figures, Line, Table
from layerscope.report.image_records import LENS_IMAGES

# What the reports show, declared once: accuracy by layer with its Wilson interval and chance, the table, and
# each shown image with the class its best and its last layer pick (a page section over the typed images).
FIGURES = Figures(
    sentence="{n_images} images, chance {chance:.2f}; best layer {best_layer} ({best_accuracy:.3f}), last layer "
             "{last_layer}.",
    summary_numbers=("best_accuracy", "n_images", "chance"),
    curves=(Curve("layers", (Line("accuracy", "zero-shot accuracy"),), file="vision_lens_accuracy", per_model=False,
                  title="Vision lens: zero-shot accuracy by layer", ylabel="zero-shot accuracy", chance="chance",
                  caption="Each layer's CLS through the tower's final norm and projection, scored against the text "
                          "prompts of every class; band: Wilson 95% interval; chance = 1 / classes.",
                  band="95% Wilson interval", from_zero=True),),
    tables=(Table("layers", ("layer", "accuracy", "accuracy_ci_low", "accuracy_ci_high")),),
    page=("vision lens images",),
    records=(LENS_IMAGES,),
)


def labelled_images(path: str | None, n: int) -> tuple[list, list[str]]:
    """(payloads, labels): JSONL image/label rows, else the first ``n`` digits with their number words."""
    if path is None:
        from layerscope.analyses.crossmodal import digit_pairs

        pairs = digit_pairs(n)
        return [p for _, p, _ in pairs], [c.rsplit(" ", 1)[-1] for _, _, c in pairs]
    data = Path(path)
    if not data.is_file():
        raise InputError(f"--data {path}: no such file (JSONL: {{\"image\": ..., \"label\": ...}})")
    payloads, labels = [], []
    for number, line in enumerate(data.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            raise InputError(f"{path} line {number} is not JSON") from None
        file = data.parent / str(row.get("image", "")) if isinstance(row, dict) else None
        if file is None or not file.is_file() or not isinstance(row.get("label"), str):
            raise InputError(f"{path} line {number} needs an existing \"image\" file and a string \"label\"")
        from layerscope.data.images import image_size

        image_size(str(file), f"{path} line {number}: {file}")  # a header that cannot be read: one line, now
        payloads.append(str(file))
        labels.append(row["label"])
    if len(set(labels)) < 2:
        raise InputError(f"{path}: zero-shot classification needs at least two labels")
    return payloads, labels


class JointHead:
    """The way of a two-tower checkpoint's image tower into the joint space, applied to any layer's states: the
    tower's final norm, then its head as the export's anatomy records them (model/anatomy.py; CLIP: the
    projection of the normed CLS; SigLIP, which has no CLS: the attention-pooling head over every normed token).
    ``reads``: ``cls`` (one vector per image) or ``tokens``."""

    def __init__(self, tower, anatomy, reads: str):
        import torch

        self.norm = tower.get_submodule(anatomy.head_norm) if anatomy.head_norm else torch.nn.Identity()
        mods = [tower.get_submodule(path) for path in anatomy.head]
        self.head = mods[0] if len(mods) == 1 else torch.nn.Sequential(*mods)
        self.reads = reads

    def __call__(self, states: np.ndarray) -> np.ndarray:
        """``[..., hidden]`` CLS states (``reads == "cls"``) or ``[..., tokens, hidden]`` token states into
        ``[..., dim]`` joint embeddings."""
        import torch

        x = torch.from_numpy(np.ascontiguousarray(states, dtype=np.float32))
        with torch.no_grad():
            if self.reads == "cls":
                return self.head(self.norm(x)).numpy()
            lead = x.shape[:-2]
            out = self.head(self.norm(x.reshape(-1, *x.shape[-2:])))
            return out.reshape(*lead, out.shape[-1]).numpy()


def head_and_prompts(manifest, classes: list[str], template: str) -> tuple[JointHead, np.ndarray]:
    """(the image tower's ``JointHead``, prompt embeddings ``[classes, dim]`` from its text tower) of the two-tower
    checkpoint the vision export ``manifest`` was made from.  Where the image tower's joint embedding is its own
    pooling head (SigLIP), the text tower pools its last position and was trained on prompts padded to its text
    length without a mask: its prompts are read so."""
    import torch
    import transformers

    from layerscope.model.families import family_of
    from layerscope.model.source import load_tokenizer
    from layerscope.model.vision import _tower_class

    if manifest.source.own_code:  # the built-in classes only: never under an export that ran the model's own code
        raise InputError(f"{manifest.source.spec} was exported with the model's own code "
                         f"({', '.join(manifest.source.own_code)}); the vision lens reads the built-in classes only")
    source = manifest.source.model_source()
    model = transformers.AutoModel.from_pretrained(source.path_or_id, use_safetensors=True).eval()
    if not callable(getattr(model, "get_text_features", None)):
        raise InputError(f"the vision lens reads a two-tower checkpoint (text prompts need its text tower); "
                         f"{source.spec} is {model.config.model_type}")
    family = family_of(manifest)
    tower = _tower_class()(model, family)
    tok = load_tokenizer(source)
    prompts = [template.format(c) for c in classes]
    reads = "cls" if family.joint_embedding == "projection" else "tokens"
    if reads == "tokens":
        enc = tok(prompts, padding="max_length", truncation=True,
                  max_length=model.config.text_config.max_position_embeddings, return_tensors="pt")
        enc = {"input_ids": enc["input_ids"]}  # no mask: the text tower pools the last position
    else:
        enc = tok(prompts, padding=True, return_tensors="pt")
    with torch.no_grad():
        text = model.get_text_features(**enc)
    return JointHead(tower, manifest.anatomy, reads), text.numpy()


def zero_shot_by_layer(joint: np.ndarray, prompts: np.ndarray) -> np.ndarray:
    """Predicted class per layer and image, ``[layers, images]``, from joint embeddings ``[layers, images, dim]``:
    the prompt of highest cosine (SigLIP's sigmoid of a scaled, shifted cosine orders the classes alike)."""
    joint = joint / np.linalg.norm(joint, axis=-1, keepdims=True)
    text = prompts / np.linalg.norm(prompts, axis=-1, keepdims=True)
    return np.argmax(joint @ text.T, axis=-1)


def joint_by_layer(run: ModelRun, payloads: list, layers: list[str], head: JointHead,
                   batch_size: int) -> np.ndarray:
    """``[layers, images, dim]``: every layer's states of the images through ``head``, batch by batch (token
    states are never held for the whole set)."""
    from layerscope.analyses.crossmodal import _image_vectors
    from layerscope.data.images import decode

    if head.reads == "cls":
        return head(_image_vectors(run, payloads, layers, "cls", batch_size))
    encoder = run.engine.image_encoder()
    parts = []
    for start in range(0, len(payloads), batch_size):
        idx = np.arange(start, min(start + batch_size, len(payloads)))
        states = run.engine.run_tokens(encoder([decode(payloads[i], bound=encoder.bound) for i in idx], idx), layers)
        parts.append(head(np.stack(states)))
    return np.concatenate(parts, axis=1)


def _shown_images(payloads, labels: list[str], predictions: dict[str, list[str]]) -> list[dict[str, Any]]:
    """The first ``THUMBNAILS`` images, small (base64 PNG, for report.html), with their label and the class
    each layer picks."""
    from layerscope.analyses.crossmodal import THUMBNAILS
    from layerscope.data.images import thumbnail_png

    return [{"id": i, "label": labels[i], "thumbnail": thumbnail_png(payloads[i]),
             "predicted": {layer: picked[i] for layer, picked in predictions.items()}}
            for i in range(min(THUMBNAILS, len(payloads)))]


@register
class VisionLens(Analysis):
    metadata = AnalysisMetadata(
        name="vision_lens",
        description="zero-shot accuracy of every layer of a CLIP or SigLIP image tower: the layer through the "
                    "final norm and the projection (CLIP's CLS) or pooling head (SigLIP) against text prompts",
        inputs=("engine",),
        main_score="best_accuracy",
        default_poolings=("cls",),
        default_data="scikit-learn's digits (built in, --n of them)",
        images=True,
        figures=FIGURES,
        options=(
            Option("n", int, 200, "digits to classify when --data is not given"),
            Option("template", str, "a photo of the digit {}", "the prompt of a class ({} is its label)"),
            Option("batch_size", int, 16, "images per batch"),
        ),
    )

    def default_poolings(self, handle) -> list[str]:
        image = handle.manifest.image
        return ["mean"] if image is not None and not image.prefix_tokens else ["cls"]  # SigLIP has no CLS

    def prepare(self, ctx: Context) -> Any:
        o = self.options(ctx)
        if "{}" not in o.template:
            raise InputError("--template needs {} where the label goes")
        return labelled_images(ctx.spec.data, o.n)

    def check_model(self, ctx: Context, given: str, handle) -> None:
        """A CLIP or SigLIP image tower whose checkpoint also holds the text tower (the prompts' embeddings),
        with its tokenizer: decided from the manifest or config.json, before any export."""
        from layerscope.model.source import TOKENIZER_FILES

        from layerscope.model.families import VISION_TOWERS, family_of

        manifest = handle.manifest
        if manifest.modality != "image" or family_of(manifest).joint_embedding is None:
            what = "reads text" if manifest.modality != "image" else f"is a {manifest.family} tower"
            raise InputError(f"{given} {what}; the vision lens reads the image tower of a CLIP or SigLIP checkpoint "
                             "(the checkpoint with --tower vision, or its export)")
        source = manifest.source
        if source.model_type not in VISION_TOWERS:  # the two-tower checkpoints, whose text tower embeds the prompts
            raise InputError(f"{given} is an image tower alone ({source.model_type}); the vision lens embeds its "
                             "prompts with the text tower: give the two-tower checkpoint with --tower vision")
        if source.is_local and not any((Path(source.path_or_id) / f).is_file() for f in TOKENIZER_FILES):
            raise InputError(f"{source.path_or_id} has no tokenizer files: the vision lens embeds its prompts "
                             "with the checkpoint's text tower and tokenizer")

    def compute(self, ctx: Context, run: ModelRun, data: Any) -> ModelOutput:
        from layerscope.metrics.proportion import wilson_interval

        manifest = run.handle.manifest
        self.check_model(ctx, run.spec, run.handle)
        anatomy = manifest.anatomy
        if anatomy is None or not anatomy.head:
            raise InputError(f"{run.spec}: the vision lens reads the export of an image tower with a way into a joint "
                             "image-text space (a CLIP or SigLIP image tower: --tower vision)")
        if anatomy.derived_on_load:
            ctx.say(anatomy.note)
        payloads, labels = data
        classes = sorted(set(labels))
        layers = [x for x in (run.layers or []) if x != "raw"]
        head, prompts = head_and_prompts(manifest, classes, self.options(ctx).template)
        predicted = zero_shot_by_layer(joint_by_layer(run, payloads, layers, head, self.options(ctx).batch_size),
                                       prompts)
        truth = np.array([classes.index(lab) for lab in labels])
        rows = []
        for layer, pred in zip(layers, predicted):
            hits = int((pred == truth).sum())
            low, high = wilson_interval(hits, len(truth))
            rows.append({"layer": layer, "accuracy": hits / len(truth), "accuracy_ci_low": low,
                         "accuracy_ci_high": high, "accuracy_ci_method": "wilson"})
        best = max(rows, key=lambda r: r["accuracy"])
        summary = {"best_accuracy": best["accuracy"], "best_layer": best["layer"], "last_layer": layers[-1],
                   "n_images": len(truth), "classes": classes, "chance": 1 / len(classes)}
        predictions = {layer: [classes[int(c)] for c in pred] for layer, pred in zip(layers, predicted)}
        return ModelOutput({"summary": summary, "tables": {"layers": rows}, "predictions": predictions,
                            "images": _shown_images(payloads, labels, predictions)})

"""cls_attention: where a vision tower's CLS token looks in the image, layer by layer (DINO-style maps).

For each image, the attention of the CLS token (query 0) over the patch tokens, averaged over the heads of
a layer, laid out on the patch grid and drawn over the image in report.html.  The probabilities come from
the export's attention graph (``model.attn.onnx``: export/vision_attention.py, checked against transformers'
eager attention when made), run on ONNX Runtime, OpenVINO or PyTorch.  Per layer, the table gives the share
of CLS attention that reaches the patches (the rest stays on CLS and register tokens) with a 95% bootstrap
interval over the images, and the entropy of its spread over the patches.  Without ``--data``: the first
``--n`` of scikit-learn's digits; with it, JSONL ``{"image": path, "label": name}``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from layerscope.analyses.base import Analysis, AnalysisMetadata, Context, ModelOutput, ModelRun, Option, register
from layerscope.errors import InputError
from layerscope.report.figures import Curve, Figures, Line, Table
from layerscope.report.image_records import CLS_MAPS

SHOWN = 24  # images drawn with their map in report.html

# What the reports show, declared once: the share of CLS attention on the patches by layer (bootstrap band), the
# table with the entropy of its spread, and each shown image with its map drawn over it (typed maps).
FIGURES = Figures(
    sentence="{n_images} images on a {grid.0}x{grid.1} patch grid; CLS attention on the patches at the last layer "
             "{last_share_on_patches:.3f}; attention run on {engine} ({attention_precision}).",
    summary_numbers=("last_share_on_patches", "n_images"),
    curves=(Curve("layers", (Line("share_on_patches", "share on patches"),), file="cls_attention_share",
                  per_model=False, title="CLS attention on the patches, by layer",
                  ylabel="share of CLS attention on patches",
                  caption="Mean over images of the CLS token's attention (mean over heads) that reaches the patch "
                          "tokens; the rest stays on CLS and register tokens (interval: percentile bootstrap over the "
                          "images); chance: the share of uniform attention over every token.",
                  chance="uniform_share", band="95% bootstrap interval over images", from_zero=True),),
    tables=(Table("layers", ("layer", "share_on_patches", "share_on_patches_ci_low", "share_on_patches_ci_high",
                             "entropy_over_patches")),),
    page=("cls maps",),
    records=(CLS_MAPS,),
)


def cls_maps(patterns: np.ndarray, prefix: int) -> np.ndarray:
    """``[images, layers, patches]``: the CLS row of ``patterns`` ``[images, layers, heads, tokens, tokens]``
    over the patch keys, averaged over the heads."""
    return np.asarray(patterns, dtype=np.float64)[:, :, :, 0, prefix:].mean(axis=2)


def overlay_png(payload, grid: np.ndarray, size: int = 64) -> str:
    """The image (``payload``) at ``size`` pixels a side with ``grid`` (its rows x cols of attention) drawn over
    it in red, from none at the map's own minimum to the most at its maximum; base64 PNG."""
    import base64
    import io

    from PIL import Image

    from layerscope.data.images import decode

    base = np.asarray(decode(payload).convert("RGB").resize((size, size)), dtype=np.float64)
    low, top = float(grid.min()), float(grid.max())
    heat = (grid - low) / (top - low) if top > low else np.zeros_like(grid)
    heat = np.asarray(Image.fromarray((heat * 255).astype(np.uint8), "L").resize((size, size), Image.NEAREST),
                      dtype=np.float64)[..., None] / 255.0
    red = np.array([255.0, 0.0, 0.0])
    mixed = base * (1 - 0.6 * heat) + red * 0.6 * heat
    buf = io.BytesIO()
    Image.fromarray(mixed.clip(0, 255).astype(np.uint8), "RGB").save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _attention_runner(ctx: Context, run: ModelRun):
    """The runner of the export's attention graph: an export you made has it (``--attentions``); a checkpoint's
    cached export gets it on first use."""
    from layerscope.engines.registry import attention_default, attention_engine
    from layerscope.export.attention_run import AttentionRunner, attention_export

    folder = attention_export(run.handle, ctx.say)
    return AttentionRunner(folder, attention_engine(run.engine.name) or attention_default(),
                           trust_remote_code=run.handle.trust_remote_code)


@register
class ClsAttention(Analysis):
    metadata = AnalysisMetadata(
        name="cls_attention",
        reads="model",
        description="where a vision tower's CLS token looks, layer by layer: its attention over the patch grid "
                    "(mean over heads), drawn over each image; share on the patches with bootstrap intervals",
        inputs=("engine",),
        main_score="last_share_on_patches",
        default_poolings=("cls",),
        default_data="scikit-learn's digits (built in, --n of them)",
        images=True,
        figures=FIGURES,
        options=(
            Option("n", int, 24, "digits to look at when --data is not given"),
            Option("batch_size", int, 8, "images per batch"),
            Option("bootstrap", int, 1000, "bootstrap resamples of the images for the intervals"),
        ),
    )

    def prepare(self, ctx: Context) -> Any:
        from layerscope.analyses.vision_lens import labelled_images

        return labelled_images(ctx.spec.data, self.options(ctx).n)

    def check_model(self, ctx: Context, given: str, handle) -> None:
        """A vision tower with a CLS token; an export you made holds its attention graph (a checkpoint's cached
        export gets one on first use): decided from the manifest or config.json, before any export."""
        from layerscope.export.attention_run import require_attention_variant
        from layerscope.model.home import cache_root

        manifest = handle.manifest
        image = manifest.image
        if manifest.modality != "image" or image is None or image.prefix_tokens - image.register_tokens < 1:
            what = "reads text" if manifest.modality != "image" else f"is a {manifest.family} tower without a CLS token"
            raise InputError(f"{given} {what}; cls_attention reads a vision tower with a CLS token (ViT, DINOv2, "
                             "CLIP's with --tower vision)")
        if handle.is_export and (cache_root() / "exports").resolve() not in handle.export_dir.resolve().parents:
            require_attention_variant(handle)

    def compute(self, ctx: Context, run: ModelRun, data: Any) -> ModelOutput:
        from layerscope.data.images import decode

        manifest = run.handle.manifest
        image = manifest.image
        self.check_model(ctx, run.spec, run.handle)
        o = self.options(ctx)
        payloads, labels = data
        runner = _attention_runner(ctx, run)
        encoder = run.engine.image_encoder()
        parts = []
        for start in range(0, len(payloads), o.batch_size):
            idx = np.arange(start, min(start + o.batch_size, len(payloads)))
            pixels = encoder([decode(payloads[i], bound=encoder.bound) for i in idx], idx).inputs["pixel_values"]
            parts.append(cls_maps(runner.run({"pixel_values": pixels}, patterns=True).patterns, image.prefix_tokens))
        maps = np.concatenate(parts)  # [images, layers, patches]
        rows, cols = image.height // image.patch_size, image.width // image.patch_size
        share = maps.sum(-1)  # [images, layers]
        spread = maps / np.where(share > 0, share, 1.0)[..., None]
        entropy = -(spread * np.log(np.where(spread > 0, spread, 1.0))).sum(-1)
        rng = np.random.default_rng(ctx.spec.seed)
        draws = rng.integers(0, len(maps), (o.bootstrap, len(maps))) if o.bootstrap else None
        table = []
        for li in range(maps.shape[1]):
            row = {"layer": str(li + 1), "share_on_patches": float(share[:, li].mean()),
                   "entropy_over_patches": float(entropy[:, li].mean())}
            if draws is not None:
                means = share[draws, li].mean(axis=1)
                row.update(share_on_patches_ci_low=float(np.percentile(means, 2.5)),
                           share_on_patches_ci_high=float(np.percentile(means, 97.5)))
            table.append(row)
        last = maps.shape[1]
        shown = [{"id": i, "label": labels[i], "layer": str(last),
                  "map": np.round(maps[i, -1].reshape(rows, cols), 6).tolist(),
                  "thumbnail": overlay_png(payloads[i], maps[i, -1].reshape(rows, cols))}
                 for i in range(min(SHOWN, len(payloads)))]
        summary = {"last_share_on_patches": table[-1]["share_on_patches"], "layers": last, "grid": [rows, cols],
                   "uniform_share": rows * cols / (rows * cols + image.prefix_tokens),
                   "n_images": len(payloads), "engine": runner.engine,
                   "attention_precision": runner.precision}
        return ModelOutput({"summary": summary, "tables": {"layers": table}, "maps": shown})

"""report.html's image thumbnails: the images an image analysis read, small, beside their text.

Results carry each shown image as a base64 PNG of a downscaled copy (data/images.py ``thumbnail_png``).
Nothing of it reaches the page as it was read: the bytes are decoded, opened as a PNG, shrunk again to
at most ``MAX_PIXELS`` a side and re-encoded here, so the page holds only a data URI of an image made
here (base64 characters, no quote or markup can pass), and every caption is escaped.  A thumbnail that
is not a PNG is left out with a note.  Never a path: the page loads nothing from the disk.
"""

from __future__ import annotations

import html
from typing import Any

MAX_PIXELS = 64
MAX_SHOWN = 48

CSS = """
.thumbs { display: flex; flex-wrap: wrap; gap: 8px; margin: 8px 0; }
.thumbs figure { margin: 0; width: 96px; text-align: center; font-size: 11px; color: #333; }
.thumbs img { width: 64px; height: 64px; object-fit: contain; image-rendering: pixelated; border: 1px solid #ddd;
              background: #fafafa; }
.thumbs figcaption { word-break: break-word; white-space: pre-wrap; }
.thumbs .miss { color: #a33; }
"""


def png_data_uri(b64: Any) -> str | None:
    """A ``data:image/png`` URI of the PNG ``b64`` holds, re-encoded here at most ``MAX_PIXELS`` a side;
    None when it is not a readable PNG."""
    import base64
    import binascii
    import io

    from PIL import Image, UnidentifiedImageError

    if not isinstance(b64, str) or len(b64) > 400_000:
        return None
    try:
        raw = base64.b64decode(b64, validate=True)
        with Image.open(io.BytesIO(raw), formats=["PNG"]) as im:
            im.load()
            clean = im.convert("RGB")
    except (binascii.Error, ValueError, UnidentifiedImageError, OSError, Image.DecompressionBombError):
        return None
    clean.thumbnail((MAX_PIXELS, MAX_PIXELS))
    buf = io.BytesIO()
    clean.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def thumbnail_strip(items: list[dict[str, Any]], lines) -> str:
    """HTML of the thumbnails of ``items`` (dicts with ``thumbnail``), each captioned by ``lines(item)``
    (text, escaped here); at most ``MAX_SHOWN``."""
    parts = []
    for item in items[:MAX_SHOWN]:
        if not isinstance(item, dict) or "thumbnail" not in item:
            continue
        caption = "<br>".join(html.escape(str(line)) for line in lines(item))
        uri = png_data_uri(item.get("thumbnail"))
        picture = (f"<img src='{uri}' alt='{html.escape(str(item.get('id', '')), quote=True)}'>" if uri else
                   "<div class='miss'>(not a PNG: left out)</div>")
        parts.append(f"<figure>{picture}<figcaption>{caption}</figcaption></figure>")
    if not parts:
        return ""
    more = len([i for i in items if isinstance(i, dict) and "thumbnail" in i]) - len(parts)
    tail = f"<p class='note'>{more:,} more not shown.</p>" if more > 0 else ""
    return f"<div class='thumbs'>{''.join(parts)}</div>{tail}"


def crossmodal_thumbnails(combined: dict[str, Any]) -> str:
    """The image-caption pairs a crossmodal run shows (its first ones), each with its caption."""
    pairs = [p for p in combined.get("pairs") or [] if isinstance(p, dict)]
    strip = thumbnail_strip(pairs, lambda p: [p.get("caption", "")])
    if not strip:
        return ""
    return f"<h3>Pairs (the first {min(len([p for p in pairs if 'thumbnail' in p]), MAX_SHOWN)})</h3>{strip}"


def vision_lens_views(results: dict[str, Any], section, curves, table_series) -> list:
    """report.html of the vision lens: zero-shot accuracy by layer (band: Wilson interval), then each shown
    image with its label and the class its best and its last layer pick."""
    sections = []
    charts = curves(results, table_series(results, "layers", "accuracy", group="pooling"),
                    title="Vision lens: zero-shot accuracy by layer", ylabel="zero-shot accuracy",
                    caption="Each layer's CLS through the tower's final norm and projection, scored against the "
                            "text prompts of every class; band: Wilson 95% interval; chance = 1 / classes.",
                    band="95% Wilson interval")
    from layerscope.report.vision_results import VisionLensFigures, per_model

    parts = []
    for model, fig in per_model(results, VisionLensFigures).items():
        best, last = fig.best_layer, fig.last_layer

        def lines(item, best=best, last=last):
            picked = item.get("predicted") or {}
            if not isinstance(picked, dict):
                picked = {}
            return [f"label: {item.get('label', '')}", f"layer {best}: {picked.get(best, '')}",
                    f"layer {last}: {picked.get(last, '')}"]

        strip = thumbnail_strip(list(fig.images), lines)
        if strip:
            parts.append(f"<h3>{html.escape(str(model))}: images and what the best and the last layer "
                         f"pick</h3>{strip}")
    sections.append(section("figures", "Zero-shot accuracy and images", charts, html="".join(parts), css=CSS))
    return sections


def cls_attention_views(results: dict[str, Any], section, curves, table_series) -> list:
    """report.html of cls_attention: the share of CLS attention on the patches by layer, then each shown image
    with the last layer's CLS attention drawn over it in red."""
    charts = curves(results, table_series(results, "layers", "share_on_patches"),
                    title="CLS attention on the patches, by layer", ylabel="share of CLS attention on patches",
                    caption="Mean over images of the CLS token's attention (mean over heads) that reaches the patch "
                            "tokens; the rest stays on CLS and register tokens.")
    from layerscope.report.vision_results import ClsAttentionFigures, per_model

    parts = []
    for model, fig in per_model(results, ClsAttentionFigures).items():
        strip = thumbnail_strip(list(fig.maps),
                                lambda item: [f"label: {item.get('label', '')}", f"layer {item.get('layer', '')}"])
        if strip:
            parts.append(f"<h3>{html.escape(str(model))}: where the CLS token looks (red: more attention, from "
                         f"none at each map's minimum to the most at its maximum)</h3>{strip}")
    return [section("figures", "CLS attention", charts, html="".join(parts), css=CSS)]
